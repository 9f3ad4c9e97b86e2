//! The relay loop: one task owns the layer stack and handles frames and events strictly in arrival
//! order. Small reader and writer tasks do the I/O, joined by bounded channels, so a slow peer applies
//! backpressure instead of growing memory, and the two directions never wait on each other.

use std::collections::{HashMap, VecDeque};
use std::process::ExitStatus;
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::child::{self, Agent};
use crate::frame::{self, Frame, Id, Invalid, Kind};
use crate::json;
use crate::layer::{Event, Exits, Stack};
use crate::lines::{self, Line};
use crate::trace::{Dir, Trace};

/// Frames, and bytes, queued per direction before the loop stops reading that direction's source. With
/// the channels on either side this bounds what the shim holds: a slow peer applies backpressure.
const HIGH_WATER: usize = 64;
const HIGH_WATER_BYTES: usize = 1 << 20;
/// How long to wait for the child's last output once it has exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// One item read from a peer.
enum Input {
    Frame(Frame),
    /// The line, without its `\n`.
    Invalid {
        line: Bytes,
        err: Invalid,
    },
    /// Refused for its size or its nesting (not for what it says): its id and whether it has a method,
    /// read cheaply, and why, for the warning and the error answer.
    Refused {
        id: Option<Id>,
        has_method: bool,
        why: String,
    },
}

pub struct Options {
    pub max_line: usize,
    pub trace: Option<Trace>,
}

fn to_input(line: Line) -> Input {
    match line {
        Line::Text(wire) => match Frame::parse_wire(wire) {
            Ok(frame) => Input::Frame(frame),
            Err((line, err)) if err.too_deep => {
                let why = format!("of {} bytes nested deeper than {} levels", line.len() - 1, json::MAX_DEPTH);
                Input::Refused { id: err.id, has_method: err.has_method, why }
            }
            Err((line, err)) => Input::Invalid { line: line.slice(..line.len() - 1), err },
        },
        Line::TooLong { head, len } => {
            let (id, has_method) = frame::sniff(&head);
            Input::Refused { id, has_method, why: format!("of {len} bytes, over the size limit") }
        }
    }
}

/// What a reader hands the relay loop: every frame it could read without waiting, or why it stopped.
type Inputs = std::io::Result<Vec<Input>>;

/// Most frames, and about the most bytes, in one batch.
const BATCH: usize = 256;
const BATCH_BYTES: usize = 256 << 10;
/// Batches waiting in a channel between a reader or writer and the loop.
const CHANNEL: usize = 4;

/// Turns what one reader has buffered into batches: every whole line it holds, so that a burst costs
/// one wake-up of the loop rather than one per frame. `send` returns false once nobody listens.
fn drain(lines: &mut lines::Lines, mut send: impl FnMut(Inputs) -> bool) -> bool {
    // Sized once: grown push by push, a full batch would be reallocated (and copied) nine times.
    let (mut batch, mut bytes) = (Vec::with_capacity(BATCH), 0);
    while let Some(line) = lines.next_line() {
        bytes += line.len();
        batch.push(to_input(line));
        if batch.len() == BATCH || bytes >= BATCH_BYTES {
            if !send(Ok(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))) {
                return false;
            }
            bytes = 0;
        }
    }
    batch.is_empty() || send(Ok(batch))
}

/// What a reader does at the end of its stream or on an error: the last line, then why it stopped.
fn last(lines: &mut lines::Lines, read: std::io::Result<usize>) -> Option<Inputs> {
    match read {
        Ok(0) => lines.finish().map(|line| Ok(vec![to_input(line)])),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Reads and parses frames on a task: parsing runs beside the relay loop, not in it.
fn spawn_reader<R: AsyncRead + Unpin + Send + 'static>(mut r: R, max: usize) -> mpsc::Receiver<Inputs> {
    let (tx, rx) = mpsc::channel(CHANNEL);
    tokio::spawn(async move {
        let mut lines = lines::Lines::new(max);
        loop {
            let read = lines.fill(&mut r).await;
            let mut batches = Vec::new();
            let _ = drain(&mut lines, |b| {
                batches.push(b);
                true
            });
            let stop = !matches!(read, Ok(n) if n > 0);
            batches.extend(last(&mut lines, read));
            for batch in batches {
                if tx.send(batch).await.is_err() {
                    return;
                }
            }
            if stop {
                return;
            }
        }
    });
    rx
}

/// The client's side of the relay: frames read from it, frames to write to it, and a signal once
/// everything handed to the writer has been written (or the client stopped reading).
struct ClientIo {
    input: mpsc::Receiver<Inputs>,
    output: mpsc::Sender<lines::Batch>,
    written: tokio::sync::oneshot::Receiver<()>,
}

/// The shim's own stdin and stdout, each on a thread of its own with blocking I/O: tokio's stdio
/// hands every read and write to its blocking pool, which costs more than the relay itself.
fn stdio(max: usize) -> std::io::Result<ClientIo> {
    use std::os::fd::AsFd;
    let stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let (in_tx, input) = mpsc::channel(CHANNEL);
    std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let mut stdin = stdin;
        let mut lines = lines::Lines::new(max);
        loop {
            let read = lines.fill_blocking(&mut stdin);
            if !drain(&mut lines, |b| in_tx.blocking_send(b).is_ok()) {
                return;
            }
            let stop = !matches!(read, Ok(n) if n > 0);
            if let Some(item) = last(&mut lines, read)
                && in_tx.blocking_send(item).is_err()
            {
                return;
            }
            if stop {
                return;
            }
        }
    })?;
    let (output, out_rx) = mpsc::channel(CHANNEL);
    let (done, written) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("stdout".into()).spawn(move || {
        if let Err(e) = lines::write_frames_blocking(stdout, out_rx) {
            tracing::debug!("stdout closed: {e}");
        }
        let _ = done.send(());
    })?;
    Ok(ClientIo { input, output, written })
}

/// A client on any byte streams, with tasks doing the I/O.
fn streams<R, W>(reader: R, writer: W, max: usize) -> ClientIo
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let input = spawn_reader(reader, max);
    let (output, out_rx) = mpsc::channel(CHANNEL);
    let (done, written) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = lines::write_frames(writer, out_rx).await;
        let _ = done.send(());
    });
    ClientIo { input, output, written }
}

/// The state of stopping the child after the client went away (or a signal came).
enum Ladder {
    Running,
    /// Stdin closed (or about to be); SIGTERM at the deadline.
    StdinClosed(Instant),
    /// SIGTERM sent; SIGKILL at the deadline.
    Termed(Instant),
    Killed,
}

struct Loop {
    stack: Stack,
    trace: Option<Trace>,
    to_client: Queue,
    to_agent: Queue,
    /// Client requests the agent has not answered yet, with their order of arrival.
    in_flight: HashMap<Id, u64>,
    next_seq: u64,
    /// Reused between inputs, so routing a frame allocates nothing.
    exits: Exits,
}

impl Loop {
    fn route(&mut self, mut exits: Exits) {
        for f in exits.to_agent.drain(..) {
            if let Kind::Request { id, .. } = f.kind()
                && !self.stack.is_own(id)
            {
                self.next_seq += 1;
                self.in_flight.insert(id.clone(), self.next_seq);
            }
            if let Some(t) = &mut self.trace {
                t.frame(Dir::ShimToAgent, f.bytes(), f.is_shim());
            }
            self.to_agent.push(f);
        }
        for f in exits.to_client.drain(..) {
            self.send_client(f);
        }
        self.exits = exits;
    }

    fn send_client(&mut self, f: Frame) {
        if let Some(t) = &mut self.trace {
            t.frame(Dir::ShimToClient, f.bytes(), f.is_shim());
        }
        self.to_client.push(f);
    }

    fn from_client(&mut self, input: Input) {
        let mut exits = std::mem::take(&mut self.exits);
        match input {
            Input::Frame(f) => {
                if let Some(t) = &mut self.trace {
                    t.frame(Dir::ClientToShim, f.bytes(), false);
                }
                self.stack.from_client(f, &mut exits);
            }
            Input::Invalid { line, err } => {
                if let Some(t) = &mut self.trace {
                    t.line(Dir::ClientToShim, &line);
                }
                tracing::warn!("client sent an invalid frame: {}", err.message);
                let id = err.id.clone().unwrap_or_else(Id::null);
                self.send_client(frame::error_response(&id, err.code, &err.message, None));
            }
            Input::Refused { id, has_method, why } => {
                tracing::warn!("client sent a frame {why}; dropped");
                if let (Some(id), true) = (id, has_method) {
                    let msg = format!("invalid request: message {why}");
                    self.send_client(frame::error_response(&id, -32600, &msg, None));
                }
            }
        }
        self.route(exits);
    }

    fn from_agent(&mut self, input: Input) {
        let mut exits = std::mem::take(&mut self.exits);
        match input {
            Input::Frame(f) => {
                if let Some(t) = &mut self.trace {
                    t.frame(Dir::AgentToShim, f.bytes(), false);
                }
                if let Kind::Response { id } = f.kind() {
                    self.in_flight.remove(id);
                }
                self.stack.from_agent(f, &mut exits);
            }
            Input::Invalid { line, err } => {
                if let Some(t) = &mut self.trace {
                    t.line(Dir::AgentToShim, &line);
                }
                // Where and how long at the default level; what it said (it may be user data) at debug.
                tracing::warn!(
                    "agent wrote a line of {} bytes that is not JSON-RPC ({}); dropped (its start is logged at debug)",
                    line.len(),
                    err.message
                );
                tracing::debug!("the line the agent wrote: {}", excerpt(&line));
            }
            Input::Refused { id, has_method, why } => {
                let msg = format!("message {why}");
                tracing::warn!("agent sent a frame {why}; dropped");
                match (id, has_method) {
                    (Some(id), true) => {
                        let f = frame::error_response(&id, -32600, &format!("invalid request: {msg}"), None);
                        if let Some(t) = &mut self.trace {
                            t.frame(Dir::ShimToAgent, f.bytes(), true);
                        }
                        self.to_agent.push(f);
                    }
                    (Some(id), false) if self.in_flight.remove(&id).is_some() => {
                        let msg = format!("the agent's answer was dropped: {msg}");
                        self.stack.from_agent(frame::error_response(&id, -32603, &msg, None), &mut exits);
                    }
                    _ => {}
                }
            }
        }
        self.route(exits);
    }

    fn event(&mut self, layer: usize, event: Event) {
        let mut exits = std::mem::take(&mut self.exits);
        self.stack.event(layer, event, &mut exits);
        self.route(exits);
    }

    /// Hands the layers the time of this wake-up of the loop: read once per wake-up, not per frame.
    fn set_time(&mut self) {
        self.stack.set_time(Instant::now().into_std(), std::time::SystemTime::now());
    }

    /// Runs the layers' wake-ups that are due.
    fn wake_due(&mut self) {
        let mut exits = std::mem::take(&mut self.exits);
        self.stack.wake_due(&mut exits);
        self.route(exits);
    }

    /// The child is gone: every request it still owed gets an error carrying its stderr tail.
    fn fail_in_flight(&mut self, status: ExitStatus, stderr_tail: Vec<String>) {
        let message = format!("agent process exited with status {}", child::describe(status));
        let data = json!({ "stderr": stderr_tail.join("\n") });
        let mut owed: Vec<(Id, u64)> = self.in_flight.drain().collect();
        owed.sort_by_key(|(_, seq)| *seq);
        for (id, _) in owed {
            let mut exits = std::mem::take(&mut self.exits);
            self.stack.from_agent(frame::error_response(&id, -32603, &message, Some(data.clone())), &mut exits);
            self.route(exits);
        }
    }
}

/// Runs the relay until the session ends; returns the exit code for the shim.
pub async fn run(stack: Stack, agent: Agent, events: mpsc::UnboundedReceiver<(usize, Event)>, options: Options) -> i32 {
    let client = match stdio(options.max_line) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("cannot set up stdin/stdout: {e}");
            agent.group().signal(Signal::SIGKILL);
            return 1;
        }
    };
    run_io(stack, agent, events, options, client, true).await
}

/// Like [`run`], with the client on the given byte streams instead of stdin/stdout: an in-process client
/// such as prompt mode (`--prompt`). The client leaving is the reader reaching EOF. Signals are left to
/// the caller, which stops the agent by closing its end of the streams (and signalling the agent's group).
pub async fn run_with_client<R, W>(
    stack: Stack,
    agent: Agent,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    options: Options,
    client_reader: R,
    client_writer: W,
) -> i32
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let client = streams(client_reader, client_writer, options.max_line);
    run_io(stack, agent, events, options, client, false).await
}

async fn run_io(
    stack: Stack,
    mut agent: Agent,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    options: Options,
    client: ClientIo,
    handle_signals: bool,
) -> i32 {
    let mut events = events;
    let group = agent.group();
    let mut watchdog = agent.take_watchdog();
    let ClientIo { input: mut client_in, output: client_tx, written: client_written } = client;
    let mut agent_in = spawn_reader(agent.stdout, options.max_line);
    let (agent_tx, agent_rx) = mpsc::channel::<lines::Batch>(CHANNEL);
    tokio::spawn(lines::write_frames(agent.stdin, agent_rx));
    let mut agent_tx = Some(agent_tx);
    let mut client_tx = Some(client_tx);

    let (mut sigint, mut sigterm, mut sighup) = (None, None, None);
    if handle_signals {
        let (Ok(int), Ok(term), Ok(hup)) =
            (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup()))
        else {
            tracing::error!("cannot install signal handlers");
            group.signal(Signal::SIGKILL);
            return 1;
        };
        (sigint, sigterm, sighup) = (Some(int), Some(term), Some(hup));
    }

    let mut st = Loop {
        stack,
        trace: options.trace,
        to_client: Queue::default(),
        to_agent: Queue::default(),
        in_flight: HashMap::new(),
        next_seq: 0,
        exits: Exits::default(),
    };
    let mut client_open = true;
    let mut agent_open = true;
    let mut ladder = Ladder::Running;
    let mut exited: Option<ExitStatus> = None;
    let mut drain_deadline: Option<Instant> = None;

    loop {
        // Once the client is gone and everything for the agent is handed to its writer, close its stdin.
        if !client_open && st.to_agent.is_empty() && agent_tx.is_some() {
            tracing::debug!("client closed its stdin; closing the agent's");
            // What the agent started (also in sessions of its own) is recorded while the agent still runs,
            // so that what it leaves behind when it exits goes too.
            if let Some(w) = &mut watchdog {
                w.session_ends();
            }
            agent_tx = None;
        }
        if agent_tx.is_none() && matches!(ladder, Ladder::Running) && exited.is_none() {
            ladder = Ladder::StdinClosed(Instant::now() + child::STDIN_GRACE);
        }
        if exited.is_some() && !agent_open {
            break;
        }
        let (mut client_gone, mut agent_gone) = (false, false);
        let ladder_deadline = match ladder {
            Ladder::StdinClosed(at) | Ladder::Termed(at) => Some(at),
            _ => None,
        };
        let wake = st.stack.next_wake().map(Instant::from_std);
        tokio::select! {
            biased;
            permit = reserve(&client_tx), if !st.to_client.is_empty() => match permit {
                Some(p) => p.send(st.to_client.take_batch()),
                None => {
                    // Nobody reads our stdout any more: nothing we write can arrive. Treat as the client leaving.
                    tracing::debug!("client stopped reading; shutting down");
                    st.to_client.clear();
                    client_gone = true;
                    client_open = false;
                }
            },
            permit = reserve(&agent_tx), if !st.to_agent.is_empty() => match permit {
                Some(p) => p.send(st.to_agent.take_batch()),
                None => {
                    st.to_agent.clear();
                    agent_gone = true;
                }
            },
            _ = recv_signal(&mut sigint) => shutdown_on_signal("SIGINT", &mut client_open),
            _ = recv_signal(&mut sigterm) => shutdown_on_signal("SIGTERM", &mut client_open),
            _ = recv_signal(&mut sighup) => shutdown_on_signal("SIGHUP", &mut client_open),
            Some((layer, event)) = events.recv(), if !st.to_client.full() && !st.to_agent.full() => {
                st.set_time();
                st.event(layer, event);
            }
            _ = sleep_until(wake), if wake.is_some() && !st.to_client.full() && !st.to_agent.full() => {
                st.set_time();
                st.wake_due();
            }
            input = client_in.recv(), if client_open && !st.to_agent.full() && !st.to_client.full() => match input {
                Some(Ok(batch)) => {
                    st.set_time();
                    batch.into_iter().for_each(|input| st.from_client(input));
                }
                Some(Err(e)) => {
                    tracing::warn!("cannot read stdin: {e}");
                    client_open = false;
                }
                None => client_open = false,
            },
            input = agent_in.recv(), if agent_open && !st.to_client.full() => match input {
                Some(Ok(batch)) => {
                    st.set_time();
                    batch.into_iter().for_each(|input| st.from_agent(input));
                }
                Some(Err(e)) => {
                    tracing::warn!("cannot read the agent's stdout: {e}");
                    agent_open = false;
                }
                None => agent_open = false,
            },
            status = agent.child.wait(), if exited.is_none() => {
                let status = match status {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!("cannot wait for the agent: {e}");
                        std::os::unix::process::ExitStatusExt::from_raw(1 << 8)
                    }
                };
                // Whatever the child left in its group (a grandchild holding the pipes), and what it started
                // elsewhere and was marked when the session ended, goes with it.
                if let Some(w) = &mut watchdog {
                    w.exited();
                }
                child::kill_all(group, &mut watchdog);
                exited = Some(status);
                drain_deadline = Some(Instant::now() + DRAIN_AFTER_EXIT);
                ladder = Ladder::Killed;
            }
            _ = sleep_until(drain_deadline), if exited.is_some() && agent_open => {
                tracing::warn!("the agent's stdout stayed open after it exited; giving up on its last output");
                agent_open = false;
            }
            _ = sleep_until(ladder_deadline), if ladder_deadline.is_some() => {
                ladder = match ladder {
                    Ladder::StdinClosed(_) => {
                        tracing::info!("agent still running {:?} after its stdin closed; sending SIGTERM", child::STDIN_GRACE);
                        group.signal(Signal::SIGTERM);
                        Ladder::Termed(Instant::now() + child::TERM_GRACE)
                    }
                    _ => {
                        tracing::warn!("agent ignored SIGTERM for {:?}; sending SIGKILL", child::TERM_GRACE);
                        child::kill_all(group, &mut watchdog);
                        Ladder::Killed
                    }
                };
            }
        }
        if client_gone {
            client_tx = None;
        }
        if agent_gone {
            agent_tx = None;
        }
    }

    let status = exited.unwrap_or_else(|| std::os::unix::process::ExitStatusExt::from_raw(1 << 8));
    let _ = tokio::time::timeout(Duration::from_millis(500), agent.stderr_done).await;
    if !st.in_flight.is_empty() {
        st.set_time();
        st.fail_in_flight(status, agent.stderr_tail.lines());
    }
    tracing::info!("agent exited with status {}", child::describe(status));
    // Hand everything left to the client's writer and let it flush.
    if let Some(tx) = client_tx.take() {
        while !st.to_client.is_empty() {
            if tx.send(st.to_client.take_batch()).await.is_err() {
                break;
            }
        }
    }
    // A client that stopped reading must not keep the shim alive.
    let _ = tokio::time::timeout(Duration::from_secs(5), client_written).await;
    child::exit_code(status)
}

fn shutdown_on_signal(name: &str, client_open: &mut bool) {
    tracing::info!("{name} received; stopping the agent");
    *client_open = false;
}

/// A signal's next delivery; never, when the relay does not handle signals.
async fn recv_signal(sig: &mut Option<tokio::signal::unix::Signal>) {
    match sig {
        Some(sig) => {
            sig.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Frames on their way to one peer, and their size.
#[derive(Default)]
struct Queue {
    frames: VecDeque<Frame>,
    bytes: usize,
}

impl Queue {
    fn push(&mut self, f: Frame) {
        self.bytes += f.bytes().len();
        self.frames.push_back(f);
    }

    fn full(&self) -> bool {
        self.frames.len() >= HIGH_WATER || self.bytes >= HIGH_WATER_BYTES
    }

    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    fn clear(&mut self) {
        self.frames.clear();
        self.bytes = 0;
    }

    /// Up to [`BATCH`] frames (or about [`BATCH_BYTES`]) from the front, for one writer hand-off.
    fn take_batch(&mut self) -> lines::Batch {
        let mut bytes = 0;
        let mut batch = Vec::with_capacity(self.frames.len().min(BATCH));
        while let Some(f) = self.frames.pop_front() {
            bytes += f.bytes().len();
            batch.push(f.into_wire());
            if batch.len() == BATCH || bytes >= BATCH_BYTES {
                break;
            }
        }
        self.bytes -= bytes;
        batch
    }
}

async fn reserve(tx: &Option<mpsc::Sender<lines::Batch>>) -> Option<mpsc::Permit<'_, lines::Batch>> {
    tx.as_ref()?.reserve().await.ok()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The start of a line, for a warning.
fn excerpt(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(120)]);
    if line.len() > 120 { format!("{text:?}...") } else { format!("{text:?}") }
}

//! The relay loop: one task owns the layer stack and hands it frames, events and wake-ups in arrival order.
//!
//! Readers and writers ([`crate::transport`]) do the I/O, joined to the loop by bounded channels, so a slow
//! peer applies backpressure instead of growing memory, and the two directions never wait on each other.
//! The loop reads the clock once per wake-up and hands that time to the layers ([`Stack::set_time`]); it
//! sleeps until the layers' next wake-up ([`Stack::next_wake`]) beside its other waits. The agent's side is
//! an [`AgentSide`]: a child process, or any byte streams (in-memory pipes in tests). When the client
//! leaves (its stdin ends or hangs up, a signal comes, or it stops reading), the child is stopped with a
//! ladder that runs whatever the queues hold: its stdin closed once what is queued for it is taken (or
//! dropped, with a warning, after a grace), SIGTERM, then SIGKILL of all it started. That lifecycle (which
//! peer is still read, the ladder, the drain deadline after the child exits) is a sans-IO state machine,
//! [`lifecycle::Lifecycle`]; the loop feeds it what happened and does what it says.

#[cfg(test)]
mod behaviour;
pub mod lifecycle;
pub mod testing;

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::child::{self, Agent, Group, StderrTail};
use crate::frame::{self, Frame};
use crate::layer::{Done, Event, Exits, Pool, Stack};
use crate::maybe;
use crate::trace::{Dir, Trace};
use crate::transport::{self, BATCH, BATCH_BYTES, Batch, Link, Received};
use crate::watchdog::Watchdog;
use lifecycle::{Action, DRAIN_AFTER_EXIT, Lifecycle};

/// Frames, and bytes, queued per direction before the loop stops reading that direction's source. With
/// the channels on either side this bounds what the shim holds: a slow peer applies backpressure.
const HIGH_WATER: usize = 64;
const HIGH_WATER_BYTES: usize = 1 << 20;

pub struct Options {
    pub max_line: usize,
    pub trace: Option<Trace>,
}

/// The agent's side of the relay: the streams it is read from and written to, and the process behind them
/// when there is one. A process is waited for, stopped with the ladder and its stderr tail reported; an
/// agent without one (in-memory pipes, as tests use) has ended once its output ends.
pub struct AgentSide {
    reader: Box<dyn AsyncRead + Unpin + Send>,
    writer: Box<dyn AsyncWrite + Unpin + Send>,
    process: Option<Process>,
}

/// The child behind an agent's pipes.
struct Process {
    child: tokio::process::Child,
    group: Group,
    watchdog: Option<Watchdog>,
    stderr_tail: StderrTail,
    stderr_done: tokio::task::JoinHandle<()>,
}

impl AgentSide {
    /// An agent on any byte streams, with no process behind them.
    pub fn streams<R, W>(reader: R, writer: W) -> AgentSide
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        AgentSide { reader: Box::new(reader), writer: Box::new(writer), process: None }
    }

    /// An agent on in-memory pipes: the other end is the agent (read what the relay sends it, write what it
    /// answers; shutting down its write side ends it), as lsp-server's `Connection::memory()` does.
    pub fn memory() -> (AgentSide, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        let (reader, writer) = tokio::io::split(ours);
        (AgentSide::streams(reader, writer), theirs)
    }

    fn group(&self) -> Group {
        self.process.as_ref().map(|p| p.group).unwrap_or_default()
    }
}

impl From<Agent> for AgentSide {
    fn from(mut agent: Agent) -> AgentSide {
        let (group, watchdog) = (agent.group(), agent.take_watchdog());
        let Agent { child, stdin, stdout, stderr_tail, stderr_done, .. } = agent;
        let process = Process { child, group, watchdog, stderr_tail, stderr_done };
        AgentSide { reader: Box::new(stdout), writer: Box::new(stdin), process: Some(process) }
    }
}

/// The process's exit; never, without a process.
async fn exit(process: &mut Option<Process>) -> std::io::Result<ExitStatus> {
    match process {
        Some(p) => p.child.wait().await,
        None => std::future::pending().await,
    }
}

struct Loop {
    stack: Stack,
    trace: Option<Trace>,
    to_client: Queue,
    to_agent: Queue,
    /// Reused between inputs, so routing a frame allocates nothing.
    exits: Exits,
    /// Runs the jobs layers ask for off the loop; their results come back on the loop's `done` queue.
    pool: Pool,
    /// Jobs handed to the pool whose results have not come back.
    working: usize,
    /// Where the layers' wall clock starts, when it is virtual ([`Work::Inline`]): the loop's start, and the
    /// wall time that stands for it.
    virtual_wall: Option<(Instant, std::time::SystemTime)>,
}

impl Loop {
    fn route(&mut self, mut exits: Exits) {
        for job in self.stack.take_work() {
            self.working += 1;
            self.pool.run(job);
        }
        for f in exits.to_agent.drain(..) {
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

    fn from_client(&mut self, input: Received) {
        let mut exits = std::mem::take(&mut self.exits);
        match input {
            Received::Frame(f) => {
                if let Some(t) = &mut self.trace {
                    t.frame(Dir::ClientToShim, f.bytes(), false);
                }
                self.stack.from_client(f, &mut exits);
            }
            bad => {
                match &bad {
                    Received::Invalid { line, err } => {
                        if let Some(t) = &mut self.trace {
                            t.line(Dir::ClientToShim, line);
                        }
                        tracing::warn!("client sent an invalid frame: {}", err.message);
                    }
                    Received::Refused { why, .. } => tracing::warn!("client sent a frame {why}; dropped"),
                    Received::Frame(_) => {}
                }
                if let Some(answer) = bad.answer() {
                    self.send_client(answer);
                }
            }
        }
        self.route(exits);
    }

    fn from_agent(&mut self, input: Received) {
        let mut exits = std::mem::take(&mut self.exits);
        match input {
            Received::Frame(f) => {
                if let Some(t) = &mut self.trace {
                    t.frame(Dir::AgentToShim, f.bytes(), false);
                }
                self.stack.from_agent(f, &mut exits);
            }
            Received::Invalid { line, err } => {
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
            Received::Refused { ref id, has_method, ref why } => {
                tracing::warn!("agent sent a frame {why}; dropped");
                match (id, has_method) {
                    // A request is answered as a client's is; a line that names neither is not (the agent's
                    // stray output, as for a line that is not JSON).
                    (Some(_), true) => {
                        if let Some(f) = input.answer() {
                            if let Some(t) = &mut self.trace {
                                t.frame(Dir::ShimToAgent, f.bytes(), true);
                            }
                            self.to_agent.push(f);
                        }
                    }
                    (Some(id), false) if self.stack.owes(id) => {
                        let msg = format!("the agent's answer was dropped: message {why}");
                        self.stack.from_agent(frame::error_response(id, -32603, &msg, None), &mut exits);
                    }
                    _ => {}
                }
            }
        }
        self.route(exits);
    }

    /// What the agent's reader handed over at once: the frames go through the stack one by one and what
    /// comes out is routed once (most frames of a burst only pass). With a trace, each frame is routed
    /// before the next is read, so the trace keeps the order the shim handled them in.
    fn from_agent_batch(&mut self, batch: Vec<Received>) {
        if self.trace.is_some() {
            return batch.into_iter().for_each(|input| self.from_agent(input));
        }
        let mut exits = std::mem::take(&mut self.exits);
        for input in batch {
            match input {
                Received::Frame(f) => self.stack.from_agent(f, &mut exits),
                other => {
                    self.route(exits);
                    self.from_agent(other);
                    exits = std::mem::take(&mut self.exits);
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

    /// A layer's job is done: its result is the layer's next input.
    fn done(&mut self, done: Done) {
        self.working = self.working.saturating_sub(1);
        let mut exits = std::mem::take(&mut self.exits);
        self.stack.done(done, &mut exits);
        self.route(exits);
    }

    /// Hands the layers the time of this wake-up of the loop: read once per wake-up, not per frame.
    fn set_time(&mut self) {
        let now = Instant::now();
        let wall = match self.virtual_wall {
            Some((start, wall)) => wall + now.saturating_duration_since(start),
            None => std::time::SystemTime::now(),
        };
        self.stack.set_time(now.into_std(), wall);
    }

    /// Runs the layers' wake-ups that are due.
    fn wake_due(&mut self) {
        let mut exits = std::mem::take(&mut self.exits);
        self.stack.wake_due(&mut exits);
        self.route(exits);
    }

    /// The child is gone: every request it still owed, and every one a layer still held for it (a prompt behind a
    /// compaction, a compaction of the shim's), gets an error carrying its stderr tail, through the layers.
    fn fail_in_flight(&mut self, status: ExitStatus, stderr_tail: Vec<String>) {
        let message = format!("agent process exited with status {}", child::describe(status));
        let data = json!({ "stderr": stderr_tail.join("\n") });
        // The stack's request table says which, in their order of arrival; the layers hold nothing more for it.
        self.stack.agent_gone();
        for id in self.stack.unanswered() {
            // Answered meanwhile by a layer (with the answer to another one).
            if self.stack.requests().get(&id).is_none_or(|r| r.is_answered()) {
                continue;
            }
            let mut exits = std::mem::take(&mut self.exits);
            self.stack.from_agent(frame::error_response(&id, -32603, &message, Some(data.clone())), &mut exits);
            self.route(exits);
        }
    }
}

/// Runs the relay until the session ends; returns the exit code for the shim.
pub async fn run(
    stack: Stack,
    agent: impl Into<AgentSide>,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    options: Options,
) -> i32 {
    let agent = agent.into();
    let client = match transport::stdio(options.max_line) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("cannot set up stdin/stdout: {e}");
            agent.group().signal(Signal::SIGKILL);
            return 1;
        }
    };
    run_io(stack, agent, events, options, client, true, Work::Pool).await
}

/// Like [`run`], with the client on the given byte streams instead of stdin/stdout: an in-process client
/// such as prompt mode (`--prompt`). The client leaving is the reader reaching EOF. Signals are left to
/// the caller, which stops the agent by closing its end of the streams (and signalling the agent's group).
pub async fn run_with_client<R, W>(
    stack: Stack,
    agent: impl Into<AgentSide>,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    options: Options,
    client_reader: R,
    client_writer: W,
) -> i32
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let client = transport::streams(client_reader, client_writer, options.max_line);
    run_io(stack, agent.into(), events, options, client, false, Work::Pool).await
}

/// Where the loop runs layers' jobs.
#[derive(Clone, Copy)]
enum Work {
    /// On the engine's worker threads ([`Pool::from_env`]).
    Pool,
    /// On the loop itself, at once ([`Pool::inline`]): [`testing::Pair`], whose virtual clock must not move
    /// on while a job runs on a thread it does not see. The layers' wall clock is virtual too: it starts at
    /// [`testing::wall_start`] and moves with the virtual clock, so what a session writes (a usage fact's
    /// time) is a function of its inputs.
    Inline,
}

async fn run_io(
    stack: Stack,
    agent: AgentSide,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    options: Options,
    client: Link,
    handle_signals: bool,
    work: Work,
) -> i32 {
    let mut events = events;
    let group = agent.group();
    let AgentSide { reader, writer, mut process } = agent;
    let mut watchdog = process.as_mut().and_then(|p| p.watchdog.take());
    let Link { input: mut client_in, output: client_tx, written: client_written, hangup: mut client_hangup } = client;
    // Nothing waits for the agent's writer to finish: once the agent's output ends, the session has.
    let Link { input: mut agent_in, output: agent_tx, .. } = transport::streams(reader, writer, options.max_line);
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

    // Layers' jobs run on the pool's threads; the loop never waits for one.
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut stack = stack;
    stack.keep_work();
    let mut st = Loop {
        stack,
        trace: options.trace,
        to_client: Queue::default(),
        to_agent: Queue::default(),
        exits: Exits::default(),
        pool: match work {
            Work::Pool => Pool::from_env(done_tx),
            Work::Inline => Pool::inline(done_tx),
        },
        working: 0,
        virtual_wall: match work {
            Work::Pool => None,
            Work::Inline => Some((Instant::now(), testing::wall_start())),
        },
    };
    let mut lc = Lifecycle::new(process.is_some());
    // One timer for the layers' wake-ups, moved only when the earliest one changes: a loop wake-up with a
    // wake-up pending registers no timer anew.
    let mut layer_timer = Box::pin(tokio::time::sleep_until(Instant::now()));
    let mut layer_timer_at: Option<Instant> = None;

    let status = loop {
        lc.before_wait(Instant::now().into_std(), st.to_agent.is_empty());
        apply(&mut lc, &mut st.to_agent, &mut agent_tx, &mut watchdog, group);
        if let Some(status) = lc.finished() {
            break status;
        }
        let (mut client_gone, mut agent_gone) = (false, false);
        let lifecycle_deadline = lc.poll_timeout().map(Instant::from_std);
        let wake = st.stack.next_wake().map(Instant::from_std);
        if let Some(at) = wake
            && layer_timer_at != wake
        {
            layer_timer.as_mut().reset(at);
        }
        layer_timer_at = wake;
        tokio::select! {
            biased;
            permit = reserve(&client_tx), if !st.to_client.is_empty() => match permit {
                Some(p) => p.send(st.to_client.take_batch()),
                None => {
                    // Nobody reads our stdout any more: nothing we write can arrive. Treat as the client leaving.
                    st.to_client.clear();
                    client_gone = true;
                    lc.client_stopped_reading(Instant::now().into_std());
                }
            },
            permit = reserve(&agent_tx), if !st.to_agent.is_empty() => match permit {
                Some(p) => p.send(st.to_agent.take_batch()),
                None => {
                    st.to_agent.clear();
                    agent_gone = true;
                    lc.agent_stopped_reading(Instant::now().into_std());
                }
            },
            _ = maybe::signal(&mut sigint) => lc.signal("SIGINT", Instant::now().into_std()),
            _ = maybe::signal(&mut sigterm) => lc.signal("SIGTERM", Instant::now().into_std()),
            _ = maybe::signal(&mut sighup) => lc.signal("SIGHUP", Instant::now().into_std()),
            () = maybe::recv(&mut client_hangup), if lc.reads_client() => lc.client_hung_up(Instant::now().into_std()),
            Some((layer, event)) = events.recv(), if !st.to_client.full() && !st.to_agent.full() => {
                st.set_time();
                st.event(layer, event);
            }
            Some(done) = done_rx.recv(), if !st.to_client.full() && !st.to_agent.full() => {
                st.set_time();
                st.done(done);
            }
            _ = &mut layer_timer, if wake.is_some() && !st.to_client.full() && !st.to_agent.full() => {
                st.set_time();
                st.wake_due();
            }
            input = client_in.recv(), if lc.reads_client() && !st.to_agent.full() && !st.to_client.full() =>
                match input {
                    Some(Ok(batch)) => {
                        st.set_time();
                        // Coda kills the shim's group 30 s after a cancelled turn that has not ended: the
                        // watchdog records what the CLI started while it can still be found.
                        let cancel =
                            |i: &Received| matches!(i, Received::Frame(f) if f.is_notification("session/cancel"));
                        if let Some(w) = watchdog.as_mut().filter(|_| batch.iter().any(cancel)) {
                            w.turn_cancelled();
                        }
                        batch.into_iter().for_each(|input| st.from_client(input));
                    }
                    Some(Err(e)) => {
                        tracing::warn!("cannot read stdin: {e}");
                        lc.client_input_ended(Instant::now().into_std());
                    }
                    None => lc.client_input_ended(Instant::now().into_std()),
                },
            input = agent_in.recv(), if lc.reads_agent() && !st.to_client.full() => match input {
                Some(Ok(batch)) => {
                    st.set_time();
                    st.from_agent_batch(batch);
                }
                Some(Err(e)) => {
                    tracing::warn!("cannot read the agent's stdout: {e}");
                    lc.agent_output_ended(Instant::now().into_std());
                }
                None => lc.agent_output_ended(Instant::now().into_std()),
            },
            status = exit(&mut process), if lc.awaits_exit() => {
                let status = match status {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!("cannot wait for the agent: {e}");
                        ExitStatus::from_raw(1 << 8)
                    }
                };
                lc.process_exited(status, Instant::now().into_std());
            }
            _ = maybe::sleep_until(lifecycle_deadline), if lifecycle_deadline.is_some() => {
                lc.handle_timeout(Instant::now().into_std());
            }
        }
        if client_gone {
            client_tx = None;
        }
        if agent_gone {
            agent_tx = None;
        }
        apply(&mut lc, &mut st.to_agent, &mut agent_tx, &mut watchdog, group);
    };

    // Frames a layer holds for a job (a file being read) go out once it is done: waited for a little.
    let jobs_deadline = Instant::now() + DRAIN_AFTER_EXIT;
    while st.working > 0 {
        match tokio::time::timeout_at(jobs_deadline, done_rx.recv()).await {
            Ok(Some(done)) => {
                st.set_time();
                st.done(done);
            }
            Ok(None) => break,
            Err(_) => {
                tracing::warn!(
                    "{} layer jobs were not done within {DRAIN_AFTER_EXIT:?} of the end; not waited for",
                    st.working
                );
                break;
            }
        }
    }
    let mut stderr_tail = Vec::new();
    if let Some(p) = process {
        let _ = tokio::time::timeout(Duration::from_millis(500), p.stderr_done).await;
        stderr_tail = p.stderr_tail.lines();
    }
    if !st.stack.unanswered().is_empty() {
        st.set_time();
        st.fail_in_flight(status, stderr_tail);
    }
    // What a layer still holds until a deadline goes out now: nothing it waits for comes any more.
    st.set_time();
    let mut exits = std::mem::take(&mut st.exits);
    st.stack.wake_all(&mut exits);
    // The agent reads nothing any more.
    exits.to_agent.clear();
    st.route(exits);
    tracing::info!("agent exited with status {}", child::describe(status));
    // Hand everything left to the client's writer and let it flush. A client that stopped reading must not
    // keep the shim alive: this waits 5 s at most.
    let flushed = async {
        if let Some(tx) = client_tx.take() {
            while !st.to_client.is_empty() {
                if tx.send(st.to_client.take_batch()).await.is_err() {
                    break;
                }
            }
        }
        let _ = client_written.await;
    };
    if tokio::time::timeout(Duration::from_secs(5), flushed).await.is_err() {
        tracing::warn!("the client did not read the shim's last output within 5 s; not written");
    }
    child::exit_code(status)
}

/// Closes the agent's stdin (once its writer has written what it holds). What the agent started (also in
/// sessions of its own) is recorded while the agent still runs, so that what it leaves behind when it exits
/// goes too.
fn close_agent_stdin(agent_tx: &mut Option<mpsc::Sender<Batch>>, watchdog: &mut Option<Watchdog>) {
    if let Some(w) = watchdog {
        w.session_ends();
    }
    *agent_tx = None;
}

/// Does what the lifecycle asks, in its order.
fn apply(
    lc: &mut Lifecycle,
    to_agent: &mut Queue,
    agent_tx: &mut Option<mpsc::Sender<Batch>>,
    watchdog: &mut Option<Watchdog>,
    group: Group,
) {
    while let Some(action) = lc.poll_action() {
        match action {
            Action::CloseAgentStdin => close_agent_stdin(agent_tx, watchdog),
            Action::DropAgentQueue => {
                if !to_agent.is_empty() {
                    tracing::warn!(
                        "the agent did not read its last {} frames ({} bytes) within {:?} of the client leaving; dropped",
                        to_agent.frames.len(),
                        to_agent.bytes,
                        child::STDIN_GRACE
                    );
                    to_agent.clear();
                }
            }
            Action::Terminate => group.signal(Signal::SIGTERM),
            Action::KillAll => child::kill_all(group, watchdog),
            Action::KillLeftovers => {
                if let Some(w) = watchdog {
                    w.exited();
                }
                child::kill_all(group, watchdog);
            }
        }
    }
}

/// Frames on their way to one peer (each its line with its `\n`: all a writer needs), and their size.
#[derive(Default)]
struct Queue {
    frames: VecDeque<bytes::Bytes>,
    bytes: usize,
}

impl Queue {
    fn push(&mut self, f: Frame) {
        let wire = f.into_wire();
        self.bytes += wire.len();
        self.frames.push_back(wire);
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
    fn take_batch(&mut self) -> Batch {
        let mut bytes = 0;
        let mut batch = Vec::with_capacity(self.frames.len().min(BATCH));
        while let Some(wire) = self.frames.pop_front() {
            bytes += wire.len();
            batch.push(wire);
            if batch.len() == BATCH || bytes >= BATCH_BYTES {
                break;
            }
        }
        self.bytes -= bytes;
        batch
    }
}

async fn reserve(tx: &Option<mpsc::Sender<Batch>>) -> Option<mpsc::Permit<'_, Batch>> {
    tx.as_ref()?.reserve().await.ok()
}

/// The start of a line, for a warning.
fn excerpt(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(120)]);
    if line.len() > 120 { format!("{text:?}...") } else { format!("{text:?}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::{AnyLayer, Cx, Layer};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    /// Passes frames on; on the client's `later` asks for a wake-up, and then tells the client.
    struct Later;
    impl Layer for Later {
        type Timer = u64;
        type Event = std::convert::Infallible;
        type Reply = std::convert::Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if f.is_notification("later") {
                cx.after(Duration::from_millis(5), 7u64);
            } else {
                cx.to_agent(f);
            }
        }
        fn on_timer(&mut self, token: u64, cx: &mut Cx) {
            cx.to_client(frame::notification("woke", json!({ "token": token })));
        }
    }

    #[tokio::test]
    async fn relays_both_ways_over_in_memory_pipes_and_runs_wake_ups() {
        let (agent, agent_end) = AgentSide::memory();
        let (client, client_end) = tokio::io::duplex(64 << 10);
        let (client_read, client_write) = tokio::io::split(client);
        let (_events_tx, events) = mpsc::unbounded_channel();
        let stack = Stack::new(vec![Box::new(Later)]);
        let options = Options { max_line: crate::lines::DEFAULT_MAX_LINE, trace: None };
        let relay = tokio::spawn(run_with_client(stack, agent, events, options, client_read, client_write));
        let (from_relay, mut to_relay) = tokio::io::split(client_end);
        let mut client_reads = BufReader::new(from_relay).lines();
        let (agent_read, mut agent_write) = tokio::io::split(agent_end);
        let mut agent_reads = BufReader::new(agent_read).lines();

        // A multi-line prompt with CJK text and emoji, as Coda sends: byte for byte to the agent.
        let prompt = r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"第一行\n第二行 🎉\n- item"}]}}"#;
        to_relay.write_all(format!("{prompt}\n").as_bytes()).await.unwrap();
        assert_eq!(agent_reads.next_line().await.unwrap().as_deref(), Some(prompt));

        // The agent's update and answer reach the client byte for byte, in order.
        let update = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"好 1e400"}}}}"#;
        let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#;
        agent_write.write_all(format!("{update}\n{answer}\n").as_bytes()).await.unwrap();
        assert_eq!(client_reads.next_line().await.unwrap().as_deref(), Some(update));
        assert_eq!(client_reads.next_line().await.unwrap().as_deref(), Some(answer));

        // A layer's wake-up runs in the relay loop and what it emits reaches the client; so does a later one.
        for _ in 0..2 {
            to_relay.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"later\"}\n").await.unwrap();
            let woke = client_reads.next_line().await.unwrap().unwrap();
            assert_eq!(crate::json::from_str::<serde_json::Value>(&woke).unwrap()["params"]["token"], 7);
        }

        // The client leaving closes the agent's input; the agent ending its output ends the session.
        to_relay.shutdown().await.unwrap();
        assert_eq!(agent_reads.next_line().await.unwrap(), None);
        agent_write.shutdown().await.unwrap();
        assert_eq!(relay.await.unwrap(), 0);
        assert_eq!(client_reads.next_line().await.unwrap(), None);
    }

    /// On the client's `slow`, asks for a job that waits until the test lets it go (10 s at most), then tells
    /// the client whether it was let go and on which thread it ran.
    struct Slow {
        gate: Option<std::sync::mpsc::Receiver<()>>,
    }
    impl Slow {
        fn finished(&mut self, (released, thread): (bool, Option<String>), cx: &mut Cx) {
            cx.to_client(frame::notification("finished", json!({ "released": released, "thread": thread })));
        }
    }
    impl Layer for Slow {
        type Timer = std::convert::Infallible;
        type Event = std::convert::Infallible;
        type Reply = std::convert::Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if !f.is_notification("slow") {
                return cx.to_agent(f);
            }
            let gate = self.gate.take().expect("one slow job");
            cx.work(
                move || {
                    let released = gate.recv_timeout(Duration::from_secs(10)).is_ok();
                    (released, std::thread::current().name().map(str::to_owned))
                },
                Slow::finished,
            );
        }
    }

    #[tokio::test]
    async fn a_layers_job_runs_off_the_loop_while_frames_go_on() {
        let (release, gate) = std::sync::mpsc::channel();
        let (mut client_reads, mut to_relay, mut agent_reads, mut agent_write, relay) =
            relay_on_memory(vec![Box::new(Slow { gate: Some(gate) })], 1 << 20);
        to_relay.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"slow\"}\n").await.unwrap();
        // While the job waits, a request goes to the agent and its answer comes back to the client: the loop
        // did not wait for the job (run on the loop, the job would keep both until its 10 s are up).
        // Each wait has a deadline shorter than the job's 10 s, so a loop held by the job fails here, at once.
        let within = |what: &'static str| move |r: Result<_, tokio::time::error::Elapsed>| r.expect(what);
        let deadline = Duration::from_secs(5);
        let request = r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{}}"#;
        to_relay.write_all(format!("{request}\n").as_bytes()).await.unwrap();
        let forwarded = tokio::time::timeout(deadline, agent_reads.next_line()).await;
        assert_eq!(within("the request reached the agent within 5 s")(forwarded).unwrap().as_deref(), Some(request));
        agent_write.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n").await.unwrap();
        let answered = tokio::time::timeout(deadline, client_reads.next_line()).await;
        assert_eq!(
            within("the answer reached the client within 5 s")(answered).unwrap().as_deref(),
            Some(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#)
        );
        release.send(()).unwrap();
        let finished = tokio::time::timeout(deadline, client_reads.next_line()).await;
        let finished = within("the job's frame reached the client within 5 s")(finished).unwrap().unwrap();
        let v: serde_json::Value = crate::json::from_str(&finished).unwrap();
        assert_eq!(v["method"], "finished");
        assert_eq!(v["params"]["released"], true, "the job was let go after the round trip: {finished}");
        assert!(v["params"]["thread"].as_str().is_some_and(|t| t.starts_with("coda-work-")), "{finished}");
        to_relay.shutdown().await.unwrap();
        assert_eq!(agent_reads.next_line().await.unwrap(), None);
        agent_write.shutdown().await.unwrap();
        assert_eq!(relay.await.unwrap(), 0);
    }

    /// A relay on in-memory pipes with the given layers, and both peers' ends: (client reads, client writes,
    /// agent reads, agent writes), and the relay's task.
    #[allow(clippy::type_complexity)]
    fn relay_on_memory(
        layers: Vec<Box<dyn AnyLayer>>,
        max_line: usize,
    ) -> (
        tokio::io::Lines<BufReader<tokio::io::ReadHalf<DuplexStream>>>,
        tokio::io::WriteHalf<DuplexStream>,
        tokio::io::Lines<BufReader<tokio::io::ReadHalf<DuplexStream>>>,
        tokio::io::WriteHalf<DuplexStream>,
        tokio::task::JoinHandle<i32>,
    ) {
        let (agent, agent_end) = AgentSide::memory();
        let (client, client_end) = tokio::io::duplex(64 << 10);
        let (client_read, client_write) = tokio::io::split(client);
        let (_events_tx, events) = mpsc::unbounded_channel();
        let options = Options { max_line, trace: None };
        let relay =
            tokio::spawn(run_with_client(Stack::new(layers), agent, events, options, client_read, client_write));
        let (from_relay, to_relay) = tokio::io::split(client_end);
        let (agent_read, agent_write) = tokio::io::split(agent_end);
        (BufReader::new(from_relay).lines(), to_relay, BufReader::new(agent_read).lines(), agent_write, relay)
    }

    #[tokio::test(start_paused = true)]
    async fn every_client_line_that_is_not_json_rpc_gets_one_answer_with_a_null_id() {
        let (stack, events) = (Stack::new(vec![]), mpsc::unbounded_channel().1);
        let mut s = testing::Pair::with(stack, events, 1 << 20, testing::TestAgent::default());
        let deep = |open: &str, close: &str| format!("{}{}", open.repeat(100_000), close.repeat(100_000));
        // (line, the code it gets, words its message has); each answered with id null.
        let bad = [
            ("[".repeat(100_000), -32700, "left open"),
            ("{\"a\":".repeat(100_000), -32700, "left open"),
            (
                format!("{{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":\"{}", "[".repeat(5000)),
                -32700,
                "parse error",
            ),
            (deep("[", "]"), -32600, "deeper than 1000"),
            (format!("{{\"x\":{}}}", deep("[", "]")), -32600, "deeper than 1000"),
            (format!("[{}1]", "1,".repeat(600_000)), -32600, "over the size limit"),
            ("not json".to_owned(), -32700, "parse error"),
            (r#"{"jsonrpc":"2.0","method":"m","params":"\u00"}"#.to_owned(), -32700, "parse error"),
            ("[]".to_owned(), -32600, "empty batch"),
            (r#"{"jsonrpc":"1.0","method":"m"}"#.to_owned(), -32600, "2.0"),
        ];
        for (line, _, _) in &bad {
            s.send(line);
        }
        // Refused but not answered: a notification over the limits (JSON-RPC answers no notification).
        s.send(&format!(r#"{{"jsonrpc":"2.0","method":"_x/note","params":{}}}"#, deep("{\"a\":", "}")));
        let request = r#"{"jsonrpc":"2.0","id":7,"method":"_test/echo","params":{}}"#;
        s.send(request);
        let got = s.drive().await;
        let answers = got.client_json();
        assert_eq!(answers.len(), bad.len() + 1, "one answer a bad line, then the request's: {:.600?}", got.to_client);
        for ((line, code, words), v) in bad.iter().zip(&answers) {
            assert_eq!((&v["id"], &v["error"]["code"]), (&json!(null), &json!(code)), "for {:.60}: {v}", line);
            assert!(v["error"]["message"].as_str().unwrap().contains(words), "for {:.60}: {v}", line);
        }
        // The shim goes on: the next request reaches the agent, and its answer is the next line the client
        // gets (no second answer to any bad line, none to the notification).
        assert_eq!(got.to_agent, [request]);
        assert_eq!(answers[bad.len()]["id"], 7);
        assert_eq!(answers[bad.len()]["result"]["line"], request);
        assert_eq!(s.close().await, 0);
    }
}

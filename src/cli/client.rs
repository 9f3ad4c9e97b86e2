//! The in-process ACP client that prompt mode and doctor play Coda with.
//!
//! The relay runs with one end of a byte pipe as its client side (see [`relay::run_with_client`]) and the same
//! layers as under Coda; this side sends requests, waits for their answers, hands the agent's notifications
//! to `coda_view.rs` and its requests to `questions.rs`, and handles Ctrl-C and shutting down.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::child::{self, Group};
use crate::cli::adapter::{self, Adapter};
use crate::cli::coda_view::CodaView;
use crate::cli::program::Found;
use crate::cli::questions::Questions;
use crate::cli::render::{Renderer, Tone};
use crate::lines::{self, Line};
use crate::relay;
use crate::trace::Trace;

/// How long the agent may stay silent before the spinner shows.
const SPIN_AFTER: Duration = Duration::from_millis(400);

/// Coda's `clientCapabilities` (section ACP 部分, `initialize`; 能力协商; 远端入口).
pub fn coda_client_capabilities() -> Value {
    json!({
        "elicitation": {"form": {}, "url": {}},
        "session": {"compaction": {}, "configOptions": {"boolean": {}}},
        "_meta": {"coda": {"waits": {}, "remote": {}}}
    })
}

/// A JSON-RPC error answer.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    fn from_value(error: &Value) -> RpcError {
        RpcError {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
            data: error.get("data").cloned(),
        }
    }

    /// The relay's answer for a request the agent never answered because it exited (`relay.rs`).
    pub(crate) fn agent_exited(&self) -> bool {
        self.message.starts_with("agent process exited")
    }
}

/// Why the client stopped before an answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Ctrl-C twice (or once before a session existed).
    Interrupted,
    /// The relay ended: the agent exited.
    AgentGone,
    /// A deadline passed.
    Deadline,
}

/// An answer to one of our requests: its id and its result or error.
pub(crate) type Answer = (Value, Result<Value, RpcError>);

/// The in-process ACP client.
pub(crate) struct Client {
    out: Option<WriteHalf<DuplexStream>>,
    frames: mpsc::Receiver<Value>,
    relay: tokio::task::JoinHandle<i32>,
    group: Group,
    sigint: Option<tokio::signal::unix::Signal>,
    interrupts: u32,
    next_id: i64,
    pub(crate) r: Renderer<std::io::Stdout>,
    /// What Coda would show; holds the session.
    pub(crate) view: CodaView,
    pub(crate) questions: Questions,
    last_output: Instant,
    /// The exit status of the relay once it ended.
    relay_code: Option<i32>,
}

impl Client {
    /// Starts the agent under the adapter's layers, with this client on the relay's client side.
    pub(crate) async fn start(
        adapter: &Adapter,
        found: &Found,
        max_line: usize,
        trace: Option<Trace>,
        r: Renderer<std::io::Stdout>,
    ) -> std::io::Result<Client> {
        let adapter::Started { agent, stack, events } = adapter::start(adapter, found)?;
        let group = agent.group();
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let (their_read, their_write) = tokio::io::split(theirs);
        let relay = tokio::spawn(relay::run_with_client(
            stack,
            agent,
            events,
            relay::Options { max_line, trace },
            their_read,
            their_write,
        ));
        let (our_read, our_write) = tokio::io::split(ours);
        let frames = spawn_reader(our_read, max_line);
        Ok(Client {
            out: Some(our_write),
            frames,
            relay,
            group,
            sigint: signal(SignalKind::interrupt()).ok(),
            interrupts: 0,
            next_id: 0,
            r,
            view: CodaView::default(),
            questions: Questions::default(),
            last_output: Instant::now(),
            relay_code: None,
        })
    }

    async fn send(&mut self, frame: &Value) {
        let Some(out) = &mut self.out else { return };
        let mut line = frame.to_string().into_bytes();
        line.push(b'\n');
        if out.write_all(&line).await.is_err() {
            // The relay has ended; the reader will see the end too.
            self.out = None;
        }
    }

    async fn send_all(&mut self, frames: Vec<Value>) {
        for frame in frames {
            self.send(&frame).await;
        }
    }

    /// Sends a request and handles everything else that arrives until its answer.
    pub(crate) async fn call(
        &mut self,
        method: &str,
        params: Value,
        deadline: Option<Instant>,
    ) -> Result<Result<Value, RpcError>, Stop> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        loop {
            if let Some((got, answer)) = self.pump(deadline, true).await? {
                if got == id {
                    return Ok(answer);
                }
                tracing::warn!("an answer to a request prompt mode did not send; ignored");
                tracing::debug!("its id: {got}");
            }
        }
    }

    /// Handles one thing: a frame, Ctrl-C, an answer typed by the person, a spinner tick, or the deadline.
    /// Returns the answers to our own requests.
    pub(crate) async fn pump(&mut self, deadline: Option<Instant>, busy: bool) -> Result<Option<Answer>, Stop> {
        let tick = tokio::time::sleep(Duration::from_millis(120));
        let asking = self.questions.asking();
        tokio::select! {
            biased;
            frame = self.frames.recv() => match frame {
                Some(frame) => {
                    self.last_output = Instant::now();
                    Ok(self.handle(frame).await)
                }
                None => Err(Stop::AgentGone),
            },
            _ = recv_signal(&mut self.sigint) => self.interrupt().await.map(|()| None),
            answer = self.questions.next_line(), if asking => {
                let answers = self.questions.answered(&mut self.r, answer);
                self.send_all(answers).await;
                Ok(None)
            }
            _ = sleep_until(deadline) => Err(Stop::Deadline),
            _ = tick => {
                if busy && !self.questions.asking() && self.last_output.elapsed() >= SPIN_AFTER {
                    self.r.spin();
                }
                Ok(None)
            }
        }
    }

    /// Ctrl-C: first `session/cancel`, then shut the agent down.
    async fn interrupt(&mut self) -> Result<(), Stop> {
        self.interrupts += 1;
        match (&self.view.session, self.interrupts) {
            (Some(session), 1) => {
                let session = session.clone();
                self.send(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}))
                    .await;
                let answers = self.questions.cancel_all(&mut self.r, "cancelled by Ctrl-C");
                self.send_all(answers).await;
                self.r.row(Tone::Yellow, "^C sent session/cancel; press Ctrl-C again to stop the agent");
                Ok(())
            }
            _ => {
                self.r.row(Tone::Yellow, "^C stopping the agent");
                Err(Stop::Interrupted)
            }
        }
    }

    /// Handles a frame from the relay; returns it when it is an answer to one of our requests.
    async fn handle(&mut self, frame: Value) -> Option<Answer> {
        let method = frame.get("method").and_then(Value::as_str).map(str::to_owned);
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        match (method, frame.get("id").cloned()) {
            (Some(method), Some(id)) => {
                let answers = self.questions.request(&mut self.r, &method, id, params);
                self.send_all(answers).await;
                None
            }
            (Some(method), None) => {
                self.view.notification(&mut self.r, &method, &params);
                None
            }
            (None, Some(id)) => {
                let answer = match frame.get("error") {
                    Some(error) => Err(RpcError::from_value(error)),
                    None => Ok(frame.get("result").cloned().unwrap_or(Value::Null)),
                };
                Some((id, answer))
            }
            (None, None) => {
                self.r.row(Tone::Dim, &format!("(a frame that is neither request, notification nor answer: {frame})"));
                None
            }
        }
    }

    /// initialize with Coda's capabilities.
    pub(crate) async fn initialize(&mut self, deadline: Option<Instant>) -> Result<Result<Value, RpcError>, Stop> {
        let params = json!({
            "protocolVersion": 1,
            "clientCapabilities": coda_client_capabilities(),
            "clientInfo": {"name": "coda-shim-prompt-mode", "version": env!("CARGO_PKG_VERSION")}
        });
        self.call("initialize", params, deadline).await
    }

    /// The relay's exit status, once it ended (waits up to 10 s for it; 1 when it does not end).
    pub(crate) async fn relay_code(&mut self) -> i32 {
        if let Some(code) = self.relay_code {
            return code;
        }
        let code = match tokio::time::timeout(Duration::from_secs(10), &mut self.relay).await {
            Ok(Ok(code)) => code,
            _ => 1,
        };
        self.relay_code = Some(code);
        code
    }

    /// Closes the client side (the relay closes the agent's stdin and runs its stop ladder) and waits for
    /// the relay to end. `hurry`: SIGTERM the agent's group at once (second Ctrl-C).
    pub(crate) async fn shut_down(&mut self, hurry: bool) {
        self.r.finish();
        if let Some(mut out) = self.out.take() {
            let _ = out.shutdown().await;
        }
        if hurry {
            self.group.signal(Signal::SIGTERM);
        }
        if self.relay_code.is_some() {
            return;
        }
        let wait =
            if hurry { child::TERM_GRACE } else { child::STDIN_GRACE + child::TERM_GRACE + Duration::from_secs(1) };
        match tokio::time::timeout(wait, &mut self.relay).await {
            Ok(Ok(code)) => self.relay_code = Some(code),
            _ => {
                self.group.signal(Signal::SIGKILL);
                if let Ok(Ok(code)) = tokio::time::timeout(Duration::from_secs(3), &mut self.relay).await {
                    self.relay_code = Some(code);
                }
            }
        }
    }
}

/// Reads the relay's client-side output as JSON values.
fn spawn_reader(r: ReadHalf<DuplexStream>, max: usize) -> mpsc::Receiver<Value> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut r = r;
        let mut split = lines::Lines::new(max);
        loop {
            match lines::read_line(&mut r, &mut split).await {
                Ok(Some(Line::Text(bytes))) => match crate::json::from_slice::<Value>(&bytes) {
                    Ok(v) => {
                        if tx.send(v).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => tracing::warn!("the shim wrote a line that is not JSON ({e}); skipped"),
                },
                Ok(Some(Line::TooLong { len, .. })) => {
                    tracing::warn!("a frame of {len} bytes is over the limit; skipped")
                }
                Ok(None) | Err(_) => break,
            }
        }
    });
    rx
}

async fn recv_signal(sig: &mut Option<tokio::signal::unix::Signal>) {
    match sig {
        Some(sig) => {
            sig.recv().await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

//! The relay on in-memory pipes and virtual time, for behaviour tests that need no process: a [`Pair`].
//!
//! A [`Pair`] is the real relay loop (the one [`super::run_with_client`] runs) with a given [`Stack`] (an
//! adapter's own, from [`crate::Adapter::stack`], or any layers), a client the test writes for, and an
//! in-process [`Agent`] that answers each line the relay hands it ([`TestAgent`] is the scripted one the
//! binary tests run as a process, for the methods that need no process). It runs on tokio's paused clock
//! (`#[tokio::test(start_paused = true)]`): timers are virtual, and [`Pair::drive`] runs both sides until
//! the session is idle, the way quinn's `Pair::drive` does, then returns what each side received. With
//! every peer in the process, "idle" is seen, not guessed: when no task can go on, tokio moves the clock to
//! the next timer at once, so [`Pair::drive`] waits [`QUIET`] of virtual time (no real time) and calls the
//! session idle once a whole [`QUIET`] passed in which neither side received a line. Layers' jobs run on
//! the loop ([`crate::layer::work::Pool::inline`]), so the clock cannot move on while one runs elsewhere, and a
//! stack driven here is handed its CLI's version (a probe on a thread of its own would hand its event in at
//! whatever virtual time that thread got the CPU: on a loaded machine, a session that stalls).
//! What the relay logs goes to [`Pair::logs`] (from `DEBUG` up), not to stderr. The relay's trace is kept
//! in memory and every frame the shim made or changed is checked against ACP's schema and Coda's shapes
//! ([`crate::replay::validate`]) as each drive ends: a break of the shim's own fails the test there; the
//! peers' (a test's hostile client or agent) are kept in [`Pair::schema_findings`].
//!
//! ```
//! use coda_shim::relay::testing::{Pair, TestAgent};
//! use coda_shim::layer::Stack;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
//! let mut pair = Pair::new(Stack::new(vec![]), TestAgent::default());
//! pair.send(r#"{"jsonrpc":"2.0","id":1,"method":"_test/seen"}"#);
//! let got = pair.drive().await;
//! assert_eq!(got.to_agent, [r#"{"jsonrpc":"2.0","id":1,"method":"_test/seen"}"#]);
//! assert_eq!(got.to_client, [r#"{"id":1,"jsonrpc":"2.0","result":{"methods":["_test/seen"]}}"#]);
//! assert_eq!(pair.close().await, 0);
//! # });
//! ```

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{AgentSide, Options, Work};
use crate::layer::{Event, Stack};
use crate::replay::validate::{Checker, Finding};
use crate::replay::view::read::{Line, Reader};

/// How long, in virtual time, neither side may receive a line before [`Pair::drive`] calls the session idle.
/// Longer than any layer's wake-up that a test waits for (a longer one: [`Pair::drive_for`]).
pub const QUIET: Duration = Duration::from_secs(60);

/// The layers' wall time ([`crate::layer::Cx::wall`]) when a [`Pair`]'s relay starts: 2027-01-15T08:00:00Z. It
/// moves with the virtual clock, so a session's timestamps (a usage fact's `lastRequestAt`) are the same in
/// every run of it.
pub fn wall_start() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// How long, in virtual time, [`Pair::drive`] drives a session that never goes idle before it panics.
pub const BUSY_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// An answer line that is no line: the agent writes the lines before it, then ends its output and reads no
/// more, as a CLI that dies (an agent without a process has exited once its output ends).
pub const HANG_UP: &str = "\u{0}hang up";

/// The agent's side of a [`Pair`]: what it writes for each line the relay hands it (each a line without
/// its `\n`; [`HANG_UP`] ends it). A closure `FnMut(&str) -> Vec<String>` is one.
pub trait Agent: Send + 'static {
    fn answer(&mut self, line: &str) -> Vec<String>;
}

impl<F: FnMut(&str) -> Vec<String> + Send + 'static> Agent for F {
    fn answer(&mut self, line: &str) -> Vec<String> {
        self(line)
    }
}

/// What each side received while a [`Pair`] was driven (since the drive before), in order, each line as
/// its bytes came, without the `\n`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Driven {
    pub to_client: Vec<String>,
    pub to_agent: Vec<String>,
}

impl Driven {
    /// The client's lines as JSON (a lone surrogate escape read as U+FFFD, as the shim reads it).
    pub fn client_json(&self) -> Vec<Value> {
        self.to_client.iter().map(|l| read(l)).collect()
    }

    /// The agent's lines as JSON, with each line.
    pub fn agent_json(&self) -> Vec<(&str, Value)> {
        self.to_agent.iter().map(|l| (l.as_str(), read(l))).collect()
    }
}

/// A line the relay wrote, as JSON.
fn read(line: &str) -> Value {
    crate::json::from_slice(&crate::json::mend_surrogates(line.as_bytes()))
        .unwrap_or_else(|e| panic!("the relay wrote a line that is not JSON ({e}): {line:.300}"))
}

/// Lines received by one side, and the count of lines received by either side (what [`Pair::drive`] watches).
#[derive(Clone, Default)]
struct Received {
    lines: Arc<Mutex<Vec<String>>>,
    progress: Arc<AtomicUsize>,
}

impl Received {
    fn push(&self, line: String) {
        self.lines.lock().expect("lock").push(line);
        self.progress.fetch_add(1, Ordering::SeqCst);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.lines.lock().expect("lock"))
    }
}

/// Log output kept in memory.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A relay between a test's client and an in-process agent, on in-memory pipes (see the module's docs).
pub struct Pair {
    /// What the client writes, in order, to its writer task (which writes it once the session is driven).
    to_relay: Option<mpsc::UnboundedSender<Vec<u8>>>,
    client: Received,
    agent: Received,
    /// Lines received by either side so far.
    progress: Arc<AtomicUsize>,
    relay: Option<JoinHandle<i32>>,
    logs: LogBuffer,
    _log_guard: tracing::subscriber::DefaultGuard,
    /// The relay's trace (`--trace-file` records), checked as it grows.
    trace: LogBuffer,
    /// Records of the trace read so far.
    traced: usize,
    checker: Checker,
    peers: Vec<Finding>,
}

impl Pair {
    /// The relay loop over `stack`, with no events from outside the stack and the shim's default line limit.
    /// Call inside a current-thread tokio runtime (the relay's tasks run on it), with its clock paused.
    pub fn new(stack: Stack, agent: impl Agent) -> Pair {
        Pair::with(stack, mpsc::unbounded_channel().1, crate::lines::DEFAULT_MAX_LINE, agent)
    }

    /// [`Pair::new`] with the receiver of the stack's events (from [`crate::Adapter::stack`] or
    /// [`crate::layer::Layers::new`]) and a line limit (`--max-frame-bytes`).
    pub fn with(
        stack: Stack,
        events: mpsc::UnboundedReceiver<(usize, Event)>,
        max_line: usize,
        mut agent: impl Agent,
    ) -> Pair {
        let (pair, agent_end) = Pair::with_agent_end(stack, events, max_line);
        let (agent_read, mut agent_write) = tokio::io::split(agent_end);
        let got = pair.agent.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(agent_read).split(b'\n');
            while let Ok(Some(line)) = lines.next_segment().await {
                let line = String::from_utf8_lossy(&line).into_owned();
                let answers = agent.answer(&line);
                got.push(line);
                for answer in answers {
                    if answer == HANG_UP {
                        let _ = agent_write.shutdown().await;
                        return;
                    }
                    if agent_write.write_all(format!("{answer}\n").as_bytes()).await.is_err() {
                        return;
                    }
                }
            }
            // The relay closed the agent's input: the agent ends its output, which ends the session.
            let _ = agent_write.shutdown().await;
        });
        pair
    }

    /// [`Pair::with`] for a test that plays the agent itself, with its own timing (the simulator,
    /// `tests/sim`): the agent's end of the in-memory pipe. What the relay writes to the agent is read from
    /// it, what the test writes to it reaches the relay, and shutting its write half down ends the agent's
    /// output (an agent that dies). [`Driven::to_agent`] stays empty: what the agent receives is the test's.
    pub fn with_agent_end(
        stack: Stack,
        events: mpsc::UnboundedReceiver<(usize, Event)>,
        max_line: usize,
    ) -> (Pair, DuplexStream) {
        let logs = LogBuffer::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        // The relay's tasks run on this thread (a current-thread runtime), so they log here.
        let log_guard = tracing::subscriber::set_default(subscriber);

        let (agent_side, agent_end) = AgentSide::memory();
        let (client, client_end) = tokio::io::duplex(64 << 10);
        let (client_read, client_write) = tokio::io::split(client);
        let trace = LogBuffer::default();
        let options = Options { max_line, trace: Some(crate::trace::Trace::to_writer(trace.clone())) };
        let link = crate::transport::streams(client_read, client_write, max_line);
        let relay = tokio::spawn(super::run_io(stack, agent_side, events, options, link, false, Work::Inline));

        let progress = Arc::new(AtomicUsize::new(0));
        let client_got = Received { lines: Arc::default(), progress: progress.clone() };
        let agent_got = Received { lines: Arc::default(), progress: progress.clone() };
        let (from_relay, mut client_write) = tokio::io::split(client_end);
        let (to_relay, mut writes) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(bytes) = writes.recv().await {
                if client_write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let _ = client_write.shutdown().await;
        });
        let got = client_got.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(from_relay).split(b'\n');
            while let Ok(Some(line)) = lines.next_segment().await {
                got.push(String::from_utf8_lossy(&line).into_owned());
            }
        });
        let pair = Pair {
            to_relay: Some(to_relay),
            client: client_got,
            agent: agent_got,
            progress,
            relay: Some(relay),
            logs,
            _log_guard: log_guard,
            trace,
            traced: 0,
            checker: Checker::new(),
            peers: Vec::new(),
        };
        (pair, agent_end)
    }

    /// Writes `line` and a `\n` to the relay as the client (handed over once the session is driven).
    pub fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\n").into_bytes());
    }

    /// Writes `v` as one line.
    pub fn send_json(&mut self, v: &Value) {
        self.send(&v.to_string());
    }

    /// Writes bytes as they are (no `\n` added).
    pub fn send_raw(&mut self, bytes: Vec<u8>) {
        let to_relay = self.to_relay.as_ref().expect("the client's side is open");
        to_relay.send(bytes).expect("the client's writer runs");
    }

    /// Writes `line` and a `\n` as the client, unless the relay no longer reads the client (it ended): false then.
    pub fn try_send(&mut self, line: &str) -> bool {
        self.to_relay.as_ref().is_some_and(|to| to.send(format!("{line}\n").into_bytes()).is_ok())
    }

    /// Runs both sides until the session is idle (see the module's docs) and returns what each received.
    pub async fn drive(&mut self) -> Driven {
        let real = std::time::Instant::now();
        let start = tokio::time::Instant::now();
        loop {
            let before = self.progress.load(Ordering::SeqCst);
            tokio::time::sleep(QUIET).await;
            assert!(
                real.elapsed() < QUIET,
                "Pair::drive waited in real time: run the test on a paused clock (start_paused = true)"
            );
            if self.progress.load(Ordering::SeqCst) == before {
                break;
            }
            assert!(start.elapsed() < BUSY_LIMIT, "the session was never idle in {BUSY_LIMIT:?} of virtual time");
        }
        self.taken()
    }

    /// Runs both sides for `d` of virtual time, idle or not, and returns what each received.
    pub async fn drive_for(&mut self, d: Duration) -> Driven {
        tokio::time::sleep(d).await;
        self.taken()
    }

    /// [`Pair::drive_for`], with a frame of the shim's that breaks ACP's schema or Coda's shapes as an error (what
    /// it broke) rather than a panic: for a test that reports it (the simulator).
    pub async fn try_drive_for(&mut self, d: Duration) -> Result<Driven, String> {
        tokio::time::sleep(d).await;
        self.schema_breaks()?;
        Ok(Driven { to_client: self.client.take(), to_agent: self.agent.take() })
    }

    /// Sends a request and drives the session; returns the answer to `id` and the client's frames before it.
    /// Panics if no answer came.
    pub async fn request(&mut self, id: i64, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let (answer, before, _) = self.answer_to(&json!(id)).await;
        (answer, before)
    }

    /// Drives the session; returns the answer to `id`, the client's frames before it, and the lines the
    /// agent received. What the client got after the answer is the next drive's. Panics if no answer came.
    pub async fn answer_to(&mut self, id: &Value) -> (Value, Vec<Value>, Vec<String>) {
        let mut got = self.drive().await;
        let mut before = got.client_json();
        let at = before.iter().position(|v| v.get("id") == Some(id) && v.get("method").is_none());
        let at = at.unwrap_or_else(|| panic!("no answer to {id}: the client got {before:?}"));
        let after = got.to_client.split_off(at + 1);
        self.client.lines.lock().expect("lock").splice(0..0, after);
        before.truncate(at + 1);
        let answer = before.pop().expect("the answer");
        (answer, before, got.to_agent)
    }

    /// What the relay logged so far, a line each.
    pub fn logs(&self) -> Vec<String> {
        let bytes = self.logs.0.lock().expect("lock").clone();
        String::from_utf8_lossy(&bytes).lines().map(str::to_owned).collect()
    }

    /// The client leaves (closes its output); the session ends as the relay's lifecycle says, driven on
    /// virtual time. Returns the relay's exit code.
    pub async fn close(&mut self) -> i32 {
        // Its writer task writes what is queued, then shuts the pipe.
        self.to_relay = None;
        let relay = self.relay.take().expect("the relay runs");
        let code =
            tokio::time::timeout(BUSY_LIMIT, relay).await.expect("the session ended").expect("the relay did not panic");
        self.check_schema();
        code
    }

    /// Whether the relay has ended (the agent's output ended, or the client left and the session is over).
    pub fn relay_ended(&self) -> bool {
        self.relay.as_ref().is_none_or(|r| r.is_finished())
    }

    /// [`Pair::close`], with a panic of the relay as an error (its message) rather than a panic here: for a
    /// test that reports it (the simulator).
    pub async fn end(&mut self) -> Result<i32, String> {
        self.to_relay = None;
        let Some(relay) = self.relay.take() else { return Err("the relay was already ended".into()) };
        match tokio::time::timeout(BUSY_LIMIT, relay).await {
            Err(_) => Err(format!("the session did not end within {BUSY_LIMIT:?} of virtual time")),
            Ok(Ok(code)) => self.schema_breaks().map(|()| code),
            Ok(Err(e)) if e.is_panic() => {
                let panic = e.into_panic();
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic without a message".into());
                Err(format!("the relay panicked: {text}"))
            }
            Ok(Err(e)) => Err(format!("the relay's task failed: {e}")),
        }
    }

    fn taken(&mut self) -> Driven {
        self.check_schema();
        Driven { to_client: self.client.take(), to_agent: self.agent.take() }
    }

    /// The rules of ACP's schema and Coda's shapes that frames of the client or the agent broke so far (the
    /// shim passed them on, or edited them without adding a break of its own).
    pub fn schema_findings(&self) -> &[Finding] {
        &self.peers
    }

    /// Checks the records the relay traced since the last check; panics on a break of the shim's own.
    fn check_schema(&mut self) {
        if let Err(e) = self.schema_breaks() {
            panic!("{e}");
        }
    }

    /// Checks the records the relay traced since the last check: the shim's own breaks as the error.
    fn schema_breaks(&mut self) -> Result<(), String> {
        let bytes = {
            let mut buf = self.trace.0.lock().expect("lock");
            let end = buf.iter().rposition(|&b| b == b'\n').map_or(0, |at| at + 1);
            buf.drain(..end).collect::<Vec<u8>>()
        };
        let mut shims = Vec::new();
        let mut records = 0;
        for line in Reader::new(bytes.as_slice()) {
            let Line::Record(mut rec) = line else { continue };
            records += 1;
            rec.line += self.traced;
            for f in self.checker.push(&rec) {
                if f.is_shims() {
                    shims.push(format!("{f}\n    {}", rec.raw));
                } else {
                    self.peers.push(f);
                }
            }
        }
        self.traced += records;
        if shims.is_empty() {
            return Ok(());
        }
        Err(format!(
            "the shim wrote frames that break ACP's schema or Coda's shapes (line: record of the relay's trace):\n{}",
            shims.join("\n")
        ))
    }
}

/// The scripted agent of the binary tests (`examples/test_agent.rs`), for what needs no process: the same
/// answers to `initialize` ([`TestAgent::with_init`], else a plain v1 answer), `session/new` (`sess-N`, then an
/// `available_commands_update` naming `init` and `review`), `session/prompt` (one `agent_message_chunk`
/// whose text is the prompt array it received, `<` written `&lt;`, then `end_turn`; `!stray` writes a line
/// that is not JSON first, `!flood N SIZE` N updates of SIZE bytes; [`TestAgent::with_prompt_result`] another
/// answer), `_test/echo` (`{"line": <the exact
/// line>}`), `_test/emit` (writes `params.line` verbatim, then `{}`), `_test/seen` (the methods received so
/// far; a batch as `batch of N`), `_test/nest` (a result of `params.depth` nested arrays, objects with
/// `params.object`); other requests get -32601.
#[derive(Debug, Default)]
pub struct TestAgent {
    init: Option<String>,
    prompt_result: Option<String>,
    seen: Vec<String>,
    sessions: usize,
}

impl TestAgent {
    /// `initialize` gets `result`, as its exact text (the process agent's `TEST_AGENT_INIT`).
    pub fn with_init(mut self, result: &str) -> TestAgent {
        self.init = Some(result.to_owned());
        self
    }

    /// Every `session/prompt` gets `result`, as its exact text (`TEST_AGENT_PROMPT_RESULT`).
    pub fn with_prompt_result(mut self, result: &str) -> TestAgent {
        self.prompt_result = Some(result.to_owned());
        self
    }
}

impl Agent for TestAgent {
    fn answer(&mut self, line: &str) -> Vec<String> {
        let Ok(msg) = crate::json::from_str::<Value>(line) else { return Vec::new() };
        if let Some(batch) = msg.as_array() {
            self.seen.push(format!("batch of {}", batch.len()));
            return Vec::new();
        }
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("").to_owned();
        let Some(id) = msg.get("id").cloned() else {
            self.seen.push(method);
            return Vec::new();
        };
        if method.is_empty() {
            return Vec::new(); // a response to something it never asked
        }
        self.seen.push(method.clone());
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let sid = params.get("sessionId").and_then(Value::as_str).unwrap_or("").to_owned();
        let result = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        let update = |sid: &str, u: Value| {
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": u}}).to_string()
        };
        match method.as_str() {
            "initialize" => match &self.init {
                Some(init) => vec![format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{init}}}"#)],
                None => vec![result(json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true}}))],
            },
            "session/new" => {
                self.sessions += 1;
                let new = format!("sess-{}", self.sessions);
                let commands: Vec<Value> = ["init", "review"]
                    .iter()
                    .map(|c| json!({"name": c, "description": format!("the {c} command")}))
                    .collect();
                let commands = json!({"sessionUpdate": "available_commands_update", "availableCommands": commands});
                vec![result(json!({"sessionId": new})), update(&new, commands)]
            }
            "session/prompt" => {
                let prompt = params.get("prompt").cloned().unwrap_or(Value::Null);
                let text: Vec<&str> = prompt
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect();
                let text = text.join(" ");
                let words: Vec<&str> = text.split_whitespace().collect();
                let after =
                    |w: &str, n: usize| words.iter().position(|x| *x == w).and_then(|i| words.get(i + n)).copied();
                let mut out = Vec::new();
                if words.contains(&"!stray") {
                    out.push("npm WARN this is a stray log line".to_owned());
                }
                if let (Some(n), Some(size)) = (after("!flood", 1), after("!flood", 2)) {
                    let chunk = "x".repeat(size.parse().unwrap_or(10));
                    for _ in 0..n.parse::<usize>().unwrap_or(0) {
                        let content = json!({"type": "text", "text": chunk});
                        out.push(update(&sid, json!({"sessionUpdate": "agent_message_chunk", "content": content})));
                    }
                }
                let report = json!({"type": "text", "text": prompt.to_string().replace('<', "&lt;")});
                out.push(update(&sid, json!({"sessionUpdate": "agent_message_chunk", "content": report})));
                out.push(match &self.prompt_result {
                    Some(text) => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{text}}}"#),
                    None => result(json!({"stopReason": "end_turn"})),
                });
                out
            }
            "_test/nest" => {
                let depth = params.get("depth").and_then(Value::as_u64).unwrap_or(1) as usize;
                let (open, close) = if params.get("object").is_some() { ("{\"a\":", "}") } else { ("[", "]") };
                vec![format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{}1{}}}"#,
                    open.repeat(depth),
                    close.repeat(depth)
                )]
            }
            "_test/echo" => vec![result(json!({"line": line}))],
            "_test/emit" => {
                vec![params.get("line").and_then(Value::as_str).unwrap_or("").to_owned(), result(json!({}))]
            }
            "_test/seen" => vec![result(json!({"methods": self.seen}))],
            _ => {
                let error = json!({"code": -32601, "message": format!("Method not found: {method}")});
                vec![json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string()]
            }
        }
    }
}

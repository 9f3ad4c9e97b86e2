//! Prompt mode (`coda-<agent> --prompt TEXT`): the binary plays Coda itself, so a person can run a wrapped
//! agent by hand and watch what Coda would see.
//!
//! The client is in-process: the relay runs with one end of a byte pipe as its client (see
//! [`relay::run_with_client`]), the same layers as under Coda. This side initializes with Coda's client
//! capabilities (section ACP 部分), opens or loads a session with the instruction, sends the prompt, and prints
//! a transcript of the turn ([`crate::cli::render`]); afterwards it keeps watching while `_coda/wait` items are open.

use std::collections::{BTreeMap, HashSet, VecDeque};

use lexopt::ValueExt;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::child::{self, Group};
use crate::cli::adapter::{self, Adapter, Found};
use crate::cli::render::{Renderer, Tone};
use crate::lines::{self, Line};
use crate::relay;
use crate::trace::Trace;

/// Exit status of prompt mode (listed in `--help`).
pub mod exit {
    pub const END_TURN: i32 = 0;
    pub const PROMPT_ERROR: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const MAX_TOKENS: i32 = 3;
    pub const MAX_TURN_REQUESTS: i32 = 4;
    pub const REFUSAL: i32 = 5;
    pub const CANCELLED: i32 = 6;
    pub const UNKNOWN_STOP: i32 = 7;
    pub const NEEDS_LOGIN: i32 = 8;
    pub const AGENT_FAILED: i32 = 9;
    pub const WAITS_OPEN: i32 = 10;
    pub const NOT_FOUND: i32 = 127;
    pub const INTERRUPTED: i32 = 130;
}

pub const HELP: &str = "
Prompt mode (run one turn by hand; the binary plays Coda and prints a transcript):
  --prompt <TEXT>               initialize, open a session, send TEXT as the prompt
  --cwd <DIR>                   the session's working directory [default: the current directory]
  --system-prompt <TEXT|@FILE>  the session instruction (systemPrompt, append); @FILE reads it from FILE
  --load <SESSION_ID>           load this session (session/load) instead of opening a new one
  --json                        print every frame as JSONL (the --trace-file format) instead of a transcript
  --wait-timeout <DURATION>     how long to watch open _coda/wait items after the turn [default: 10m]
  Permission requests are asked y/n on a terminal and refused (outcome cancelled) otherwise.
  Ctrl-C sends session/cancel; a second Ctrl-C shuts the agent down.

Doctor:
  doctor, --doctor              find the wrapped CLI as the shim would and check its version, data
                                directory and login; prints a table with a fix for each problem

Prompt mode exit status:
  0 the turn ended with end_turn     1 the prompt was answered with an error other than -32000
  2 usage error                      3 stop reason max_tokens
  4 stop reason max_turn_requests    5 stop reason refusal
  6 stop reason cancelled            7 a stop reason ACP does not define
  8 the agent needs a login (-32000) 9 initialize or the session failed, or the agent exited
  10 _coda/wait items still open at --wait-timeout
  127 the CLI cannot be found or started   130 stopped by a second Ctrl-C
";

/// Default for `--wait-timeout`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the agent may stay silent before the spinner shows.
const SPIN_AFTER: Duration = Duration::from_millis(400);

/// Prompt mode's options as given on the command line.
#[derive(Default)]
pub struct Args {
    prompt: Option<String>,
    cwd: Option<PathBuf>,
    system_prompt: Option<String>,
    load: Option<String>,
    json: bool,
    wait_timeout: Option<Duration>,
}

/// What prompt mode runs with.
#[derive(Debug, Clone)]
pub struct Options {
    pub prompt: String,
    pub cwd: Option<PathBuf>,
    /// The instruction text, or `@FILE`.
    pub system_prompt: Option<String>,
    pub load: Option<String>,
    pub json: bool,
    pub wait_timeout: Duration,
}

impl Args {
    /// Whether `--name` is one of prompt mode's options.
    pub(crate) fn takes(name: &str) -> bool {
        matches!(name, "prompt" | "cwd" | "system-prompt" | "load" | "json" | "wait-timeout")
    }

    pub(crate) fn set(&mut self, name: &str, parser: &mut lexopt::Parser) -> Result<(), lexopt::Error> {
        match name {
            "prompt" => self.prompt = Some(parser.value()?.string()?),
            "cwd" => self.cwd = Some(parser.value()?.into()),
            "system-prompt" => self.system_prompt = Some(parser.value()?.string()?),
            "load" => self.load = Some(parser.value()?.string()?),
            "json" => self.json = true,
            "wait-timeout" => {
                let text = parser.value()?.string()?;
                self.wait_timeout = Some(parse_duration(&text).ok_or_else(|| {
                    lexopt::Error::from(format!("--wait-timeout {text:?} is not a duration (like 90s, 10m, 1h)"))
                })?);
            }
            other => return Err(lexopt::Error::from(format!("--{other} is not an option of prompt mode"))),
        }
        Ok(())
    }

    /// `Some` when `--prompt` was given; an error for prompt options without it.
    pub(crate) fn finish(self) -> Result<Option<Options>, lexopt::Error> {
        let Some(prompt) = self.prompt else {
            let stray = [
                (self.cwd.is_some(), "--cwd"),
                (self.system_prompt.is_some(), "--system-prompt"),
                (self.load.is_some(), "--load"),
                (self.json, "--json"),
                (self.wait_timeout.is_some(), "--wait-timeout"),
            ];
            return match stray.iter().find(|(given, _)| *given) {
                Some((_, name)) => Err(lexopt::Error::from(format!("{name} needs --prompt"))),
                None => Ok(None),
            };
        };
        Ok(Some(Options {
            prompt,
            cwd: self.cwd,
            system_prompt: self.system_prompt,
            load: self.load,
            json: self.json,
            wait_timeout: self.wait_timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT),
        }))
    }
}

/// `90s`, `10m`, `1h 30m` (humantime), or a bare number of seconds.
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    humantime::parse_duration(text).ok()
}

/// Coda's `clientCapabilities` (section ACP 部分, `initialize`; 能力协商; 远端入口).
pub fn coda_client_capabilities() -> Value {
    json!({
        "elicitation": {"form": {}, "url": {}},
        "session": {"compaction": {}, "configOptions": {"boolean": {}}},
        "_meta": {"coda": {"waits": {}, "remote": {}}}
    })
}

/// The whole of prompt mode; returns the exit status.
pub fn main(
    adapter: &Adapter,
    agent_command: Option<String>,
    trace_file: Option<PathBuf>,
    max_line: usize,
    options: Options,
) -> i32 {
    let bin = adapter.binary();
    let instruction = match &options.system_prompt {
        None => None,
        Some(text) => match read_instruction(text) {
            Ok(text) => Some(text),
            Err(why) => {
                eprintln!("{bin}: {why}");
                return exit::USAGE;
            }
        },
    };
    let cwd = match options.cwd.clone().map_or_else(std::env::current_dir, Ok).and_then(std::fs::canonicalize) {
        Ok(dir) if dir.is_dir() => dir,
        Ok(dir) => {
            eprintln!("{bin}: --cwd {} is not a directory", dir.display());
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("{bin}: cannot use the working directory: {e}");
            return exit::USAGE;
        }
    };
    let trace = match (options.json, &trace_file) {
        (true, Some(_)) => {
            eprintln!("{bin}: --json prints what --trace-file records; give one of them");
            return exit::USAGE;
        }
        // The trace records go to our own stdout (a new descriptor on the same file, pipe or terminal).
        (true, None) => match Trace::stdout() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("{bin}: cannot write frames to stdout: {e}");
                return 1;
            }
        },
        (false, Some(path)) => match Trace::open(path) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("{bin}: cannot open trace file {}: {e}", path.display());
                return exit::USAGE;
            }
        },
        (false, None) => None,
    };
    let found = match adapter.resolve(agent_command) {
        Ok(found) => found,
        Err(why) => {
            eprintln!("{bin}: {why}");
            return exit::NOT_FOUND;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{bin}: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let color = !options.json
        && std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::env::var("TERM").map_or(true, |t| t != "dumb");
    let renderer = Renderer::new(std::io::stdout(), color, !options.json);
    let code = runtime.block_on(async {
        let mut client = match Client::start(adapter, &found, max_line, trace, renderer).await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("{bin}: cannot start {}: {e}", found.command.display());
                return exit::NOT_FOUND;
            }
        };
        client.stdin_tty = std::io::stdin().is_terminal();
        client.json = options.json;
        let code = client.prompt_mode(&options, &cwd, instruction.as_deref()).await;
        client.shut_down(code == exit::INTERRUPTED).await;
        code
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// `--system-prompt TEXT` or `@FILE`.
fn read_instruction(given: &str) -> Result<String, String> {
    let text = match given.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the instruction file {path:?} (from --system-prompt @{path}): {e}"))?,
        None => given.to_owned(),
    };
    if text.trim().is_empty() {
        return Err("--system-prompt is empty".into());
    }
    Ok(text)
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

    /// The relay's answer for a request the agent never answered because it exited (src/relay.rs).
    fn agent_exited(&self) -> bool {
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

/// A question put to the person at the terminal.
struct Question {
    id: Value,
    kind: QuestionKind,
}

enum QuestionKind {
    Permission { options: Vec<Value> },
    Url,
}

/// One `_coda/wait` item as Coda would hold it.
struct Wait {
    state: String,
}

const TERMINAL: [&str; 3] = ["done", "failed", "cancelled"];

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
    pub(crate) session: Option<String>,
    /// Sessions announced as `childSessionId` of a wait.
    children: HashSet<String>,
    /// `(sessionId, waitId)` -> the item.
    waits: BTreeMap<(String, String), Wait>,
    stdin_tty: bool,
    json: bool,
    questions: VecDeque<Question>,
    asking: Option<Question>,
    answers: Option<mpsc::UnboundedReceiver<String>>,
    last_output: Instant,
    /// The exit status of the relay once it ended.
    relay_code: Option<i32>,
    /// Notification methods already shown once.
    seen_methods: HashSet<String>,
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
            session: None,
            children: HashSet::new(),
            waits: BTreeMap::new(),
            stdin_tty: false,
            json: false,
            questions: VecDeque::new(),
            asking: None,
            answers: None,
            last_output: Instant::now(),
            relay_code: None,
            seen_methods: HashSet::new(),
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
    async fn pump(
        &mut self,
        deadline: Option<Instant>,
        busy: bool,
    ) -> Result<Option<(Value, Result<Value, RpcError>)>, Stop> {
        let tick = tokio::time::sleep(Duration::from_millis(120));
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
            answer = recv_answer(&mut self.answers), if self.asking.is_some() => {
                self.answered(answer).await;
                Ok(None)
            }
            _ = sleep_until(deadline) => Err(Stop::Deadline),
            _ = tick => {
                if busy && self.asking.is_none() && self.last_output.elapsed() >= SPIN_AFTER {
                    self.r.spin();
                }
                Ok(None)
            }
        }
    }

    /// Ctrl-C: first `session/cancel`, then shut the agent down.
    async fn interrupt(&mut self) -> Result<(), Stop> {
        self.interrupts += 1;
        match (&self.session, self.interrupts) {
            (Some(session), 1) => {
                let session = session.clone();
                self.send(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}))
                    .await;
                // ACP (prompt turn, cancellation): the client answers pending permission requests with cancelled.
                let pending: Vec<Question> = self.asking.take().into_iter().chain(self.questions.drain(..)).collect();
                for q in pending {
                    self.answer_cancelled(q, "cancelled by Ctrl-C").await;
                }
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
    async fn handle(&mut self, frame: Value) -> Option<(Value, Result<Value, RpcError>)> {
        let method = frame.get("method").and_then(Value::as_str).map(str::to_owned);
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        match (method, frame.get("id").cloned()) {
            (Some(method), Some(id)) => {
                self.request(&method, id, params).await;
                None
            }
            (Some(method), None) => {
                self.notification(&method, &params);
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

    /// The prefix for output of `session`, or `None` when Coda would drop it.
    fn session_prefix(&self, session: &str) -> Option<String> {
        match &self.session {
            None => Some(String::new()),
            Some(ours) if ours == session => Some(String::new()),
            _ if self.children.contains(session) => Some(format!("[{session}] ")),
            _ => None,
        }
    }

    fn notification(&mut self, method: &str, params: &Value) {
        let session = params.get("sessionId").and_then(Value::as_str).unwrap_or("");
        match method {
            "session/update" => {
                let Some(prefix) = self.session_prefix(session) else {
                    self.r.row(
                        Tone::Dim,
                        &format!("(session/update for session {session:?}, which Coda does not know: dropped)"),
                    );
                    return;
                };
                if let Some(update) = params.get("update") {
                    self.r.update(&prefix, update);
                }
            }
            "_coda/wait" => self.wait(params),
            // Coda ignores notifications it does not know; one row per method is enough to see them.
            other if self.seen_methods.insert(other.to_owned()) => {
                self.r.row(Tone::Dim, &format!("notification {other} (not Coda's; further ones not shown)"));
            }
            _ => {}
        }
    }

    /// A `_coda/wait` report, checked by Coda's rules (section Agent 活动, `_coda/wait`).
    fn wait(&mut self, p: &Value) {
        let field = |k: &str| p.get(k).and_then(Value::as_str);
        let (Some(session), Some(wait_id), Some(state)) = (field("sessionId"), field("waitId"), field("state")) else {
            self.r.row(Tone::Red, &format!("wait dropped by Coda: sessionId, waitId and state are required: {p}"));
            return;
        };
        let too_long = |k: &str, max: usize| field(k).is_some_and(|s| s.chars().count() > max);
        let problem = if !["waiting", "handling", "done", "failed", "cancelled"].contains(&state) {
            Some(format!("state {state:?} is not one Coda knows"))
        } else if wait_id.chars().count() > 200 {
            Some("waitId is over 200 characters".into())
        } else if too_long("title", 500) {
            Some("title is over 500 characters".into())
        } else if too_long("detail", 4000) {
            Some("detail is over 4000 characters".into())
        } else if field("at").is_some_and(|at| humantime::parse_rfc3339_weak(at).is_err()) {
            Some("at is not an ISO 8601 time".into())
        } else {
            None
        };
        if let Some(problem) = problem {
            self.r.row(Tone::Red, &format!("wait {wait_id} dropped by Coda: {problem}"));
            return;
        }
        let Some(prefix) = self.session_prefix(session) else {
            self.r.row(
                Tone::Red,
                &format!("wait {wait_id} dropped by Coda: session {session:?} is not this session or a known child"),
            );
            return;
        };
        let key = (session.to_owned(), wait_id.to_owned());
        let terminal = TERMINAL.contains(&state);
        let tone = match state {
            "failed" => Tone::Red,
            "cancelled" => Tone::Yellow,
            "done" => Tone::Green,
            _ => Tone::Cyan,
        };
        match self.waits.get_mut(&key) {
            None if terminal => {
                self.r.row(
                    Tone::Red,
                    &format!("{prefix}wait {wait_id} {state}: not registered (a first report must not be terminal)"),
                );
            }
            None => {
                let kind = field("kind").unwrap_or("task");
                let mut row = format!("{prefix}wait {wait_id} started ({kind}, {state})");
                if let Some(title) = field("title") {
                    row += &format!(": {title}");
                }
                if let Some(detail) = field("detail") {
                    row += &format!(" - {detail}");
                }
                if let Some(child) = field("childSessionId") {
                    row += &format!(" [child session {child}]");
                    self.children.insert(child.to_owned());
                }
                if p.get("stoppable").and_then(Value::as_bool) == Some(true) {
                    row += " [stoppable]";
                }
                self.r.row(tone, &row);
                self.waits.insert(key, Wait { state: state.to_owned() });
            }
            Some(w) if TERMINAL.contains(&w.state.as_str()) => {
                self.r.row(
                    Tone::Dim,
                    &format!("{prefix}wait {wait_id} {state}: ignored, it already ended ({})", w.state),
                );
            }
            Some(w) => {
                w.state = state.to_owned();
                let mut row = format!("{prefix}wait {wait_id} {state}");
                if let Some(title) = field("title") {
                    row += &format!(": {title}");
                }
                if let Some(child) = field("childSessionId") {
                    self.children.insert(child.to_owned());
                }
                self.r.row(tone, &row);
            }
        }
    }

    /// Items still open (not in a terminal state).
    fn open_waits(&self) -> usize {
        self.waits.values().filter(|w| !TERMINAL.contains(&w.state.as_str())).count()
    }

    async fn respond(&mut self, id: Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result})).await;
    }

    async fn respond_error(&mut self, id: Value, code: i64, message: &str) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})).await;
    }

    /// A request from the agent.
    async fn request(&mut self, method: &str, id: Value, params: Value) {
        match method {
            "session/request_permission" => {
                let title = params.pointer("/toolCall/title").and_then(Value::as_str).unwrap_or("a tool call");
                let options: Vec<Value> = params.get("options").and_then(Value::as_array).cloned().unwrap_or_default();
                let names: Vec<String> = options
                    .iter()
                    .map(|o| {
                        let name = o.get("name").and_then(Value::as_str).unwrap_or("?");
                        let kind = o.get("kind").and_then(Value::as_str).unwrap_or("?");
                        format!("{name} ({kind})")
                    })
                    .collect();
                self.r.row(Tone::Yellow, &format!("permission: {title}; options: {}", names.join(", ")));
                let q = Question { id, kind: QuestionKind::Permission { options } };
                if !self.stdin_tty {
                    return self.answer_cancelled(q, "refused: stdin is not a terminal").await;
                }
                self.questions.push_back(q);
                self.next_question();
            }
            "elicitation/create" => {
                let message = params.get("message").and_then(Value::as_str).unwrap_or("");
                match params.get("mode").and_then(Value::as_str) {
                    Some("url") => {
                        let url = params.get("url").and_then(Value::as_str).unwrap_or("?");
                        self.r.row(Tone::Yellow, &format!("question (link): {message} {url}"));
                        let q = Question { id, kind: QuestionKind::Url };
                        if !self.stdin_tty {
                            return self.answer_cancelled(q, "refused: stdin is not a terminal").await;
                        }
                        self.questions.push_back(q);
                        self.next_question();
                    }
                    _ => {
                        self.r.row(Tone::Yellow, &format!("question (form): {message}"));
                        self.r.row(Tone::Yellow, "  -> cancel: prompt mode does not fill in forms");
                        self.respond(id, json!({"action": "cancel"})).await;
                    }
                }
            }
            "_coda/remote/code" => {
                self.r.row(Tone::Dim, "the agent asked for a remote binding code: not available in prompt mode");
                self.respond_error(id, -32603, "prompt mode has no remote entry").await;
            }
            other => {
                self.r.row(Tone::Dim, &format!("the agent called {other}: not offered by Coda (method not found)"));
                self.respond_error(id, -32601, &format!("Method not found: {other}")).await;
            }
        }
    }

    /// Puts the next queued question to the person.
    fn next_question(&mut self) {
        if self.asking.is_some() {
            return;
        }
        let Some(q) = self.questions.pop_front() else { return };
        if self.answers.is_none() {
            self.answers = Some(spawn_stdin_lines());
        }
        let text = match q.kind {
            QuestionKind::Permission { .. } => "  allow? [y/N] ",
            QuestionKind::Url => "  opened it and done? [y/N] ",
        };
        if self.json {
            eprint!("{text}");
        } else {
            self.r.ask(text);
        }
        self.asking = Some(q);
    }

    async fn answered(&mut self, line: Option<String>) {
        let Some(q) = self.asking.take() else { return };
        let yes = line.as_deref().is_some_and(|l| matches!(l.trim().to_ascii_lowercase().as_str(), "y" | "yes"));
        if line.is_none() {
            self.answer_cancelled(q, "refused: stdin closed").await;
            self.next_question();
            return;
        }
        match q.kind {
            QuestionKind::Permission { options } => {
                let pick = |kinds: &[&str]| {
                    kinds.iter().find_map(|k| options.iter().find(|o| o.get("kind").and_then(Value::as_str) == Some(k)))
                };
                let chosen =
                    if yes { pick(&["allow_once", "allow_always"]) } else { pick(&["reject_once", "reject_always"]) };
                match chosen.and_then(|o| Some((o.get("optionId")?.clone(), o.get("name").cloned()))) {
                    Some((option, name)) => {
                        let name = name.as_ref().and_then(Value::as_str).unwrap_or("?").to_owned();
                        let tone = if yes { Tone::Green } else { Tone::Yellow };
                        self.r.row(tone, &format!("  -> {}: {name}", if yes { "allowed" } else { "rejected" }));
                        self.respond(q.id, json!({"outcome": {"outcome": "selected", "optionId": option}})).await;
                    }
                    None => {
                        self.answer_cancelled(Question { id: q.id, kind: QuestionKind::Url }, "no matching option")
                            .await
                    }
                }
            }
            QuestionKind::Url => {
                let action = if yes { "accept" } else { "decline" };
                self.r.row(Tone::Plain, &format!("  -> {action}"));
                self.respond(q.id, json!({"action": action})).await;
            }
        }
        self.next_question();
    }

    /// Refuses a question: the ACP `cancelled` outcome for a permission, `cancel` for a link.
    async fn answer_cancelled(&mut self, q: Question, why: &str) {
        self.r.row(Tone::Yellow, &format!("  -> {why} (outcome cancelled)"));
        let result = match q.kind {
            QuestionKind::Permission { .. } => json!({"outcome": {"outcome": "cancelled"}}),
            QuestionKind::Url => json!({"action": "cancel"}),
        };
        self.respond(q.id, result).await;
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

    /// The whole of prompt mode after start; returns the exit status.
    async fn prompt_mode(&mut self, options: &Options, cwd: &std::path::Path, instruction: Option<&str>) -> i32 {
        match self.turn(options, cwd, instruction).await {
            Ok(code) => code,
            Err(Stop::Interrupted) => exit::INTERRUPTED,
            Err(Stop::Deadline) => exit::WAITS_OPEN,
            Err(Stop::AgentGone) => {
                let code = self.relay_code().await;
                self.r.row(Tone::Red, &format!("the agent exited (the shim's exit status {code}) before answering"));
                exit::AGENT_FAILED
            }
        }
    }

    async fn turn(&mut self, options: &Options, cwd: &std::path::Path, instruction: Option<&str>) -> Result<i32, Stop> {
        let init = match self.initialize(None).await? {
            Ok(init) => init,
            Err(e) => return Ok(self.setup_failed("initialize", &e)),
        };
        self.r.row(Tone::Bold, &describe_agent(&init));
        let caps = init.get("agentCapabilities").cloned().unwrap_or(Value::Null);
        let declares_instruction = caps.pointer("/sessionCapabilities/systemPrompt").is_some_and(Value::is_object);
        let mut params = json!({"cwd": cwd.to_string_lossy(), "mcpServers": []});
        if let Some(text) = instruction {
            if declares_instruction {
                params["systemPrompt"] = json!({"mode": "append", "content": [{"type": "text", "text": text}]});
            } else {
                self.r.row(
                    Tone::Yellow,
                    "the agent does not declare sessionCapabilities.systemPrompt: the instruction is not sent (as Coda does)",
                );
            }
        }
        let (session, answer) = match &options.load {
            Some(id) => {
                if caps.get("loadSession").and_then(Value::as_bool) != Some(true) {
                    self.r.row(
                        Tone::Red,
                        "the agent does not declare loadSession: Coda would not ask it to load a session",
                    );
                    return Ok(exit::AGENT_FAILED);
                }
                params["sessionId"] = json!(id);
                self.session = Some(id.clone());
                self.r
                    .row(Tone::Dim, &format!("session/load {id}: the history the agent replays (Coda keeps its own):"));
                match self.call("session/load", params, None).await? {
                    Ok(answer) => (id.clone(), answer),
                    Err(e) => return Ok(self.setup_failed("session/load", &e)),
                }
            }
            None => match self.call("session/new", params, None).await? {
                Ok(answer) => match answer.get("sessionId").and_then(Value::as_str) {
                    Some(id) => (id.to_owned(), answer),
                    None => {
                        self.r.row(Tone::Red, &format!("session/new answered without a sessionId: {answer}"));
                        return Ok(exit::AGENT_FAILED);
                    }
                },
                Err(e) => return Ok(self.setup_failed("session/new", &e)),
            },
        };
        self.session = Some(session.clone());
        let model = current_model(&answer);
        let how = if options.load.is_some() { "loaded" } else { "new" };
        self.r.row(
            Tone::Bold,
            &format!(
                "session {session} ({how}) in {}; model {}",
                cwd.display(),
                model.as_deref().unwrap_or("not reported")
            ),
        );
        if model.is_none() {
            self.r.row(Tone::Yellow, "no current model reported: Coda would refuse the turn (适配器未报告实际模型)");
        }
        self.r.row(Tone::Bold, &format!("> {}", options.prompt));
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": options.prompt}]});
        let code = match self.call("session/prompt", params, None).await? {
            Ok(result) => self.stopped(&result),
            Err(e) => self.prompt_failed(&e),
        };
        let open = self.open_waits();
        if open == 0 {
            return Ok(code);
        }
        self.r.row(
            Tone::Dim,
            &format!(
                "{open} wait(s) still open; watching them settle (up to {}; Ctrl-C to stop)",
                humantime::format_duration(options.wait_timeout)
            ),
        );
        let deadline = Instant::now() + options.wait_timeout;
        while self.open_waits() > 0 {
            match self.pump(Some(deadline), true).await {
                Ok(Some((id, _))) => {
                    tracing::warn!("an answer to a request prompt mode did not send; ignored");
                    tracing::debug!("its id: {id}");
                }
                Ok(None) => {}
                Err(Stop::Deadline) => {
                    let open = self.open_waits();
                    self.r.row(Tone::Red, &format!("{open} wait(s) still open after --wait-timeout; giving up"));
                    return Ok(exit::WAITS_OPEN);
                }
                Err(stop) => return Err(stop),
            }
        }
        self.r.row(Tone::Dim, "every wait settled");
        Ok(code)
    }

    /// The end of the turn: its stop reason (and usage, where the agent reports it in the result).
    fn stopped(&mut self, result: &Value) -> i32 {
        if let Some(usage) = result.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| usage.get(k).map(Value::to_string).unwrap_or_else(|| "?".into());
            self.r.row(
                Tone::Dim,
                &format!(
                    "usage: {} in, {} out, {} total tokens",
                    n("inputTokens"),
                    n("outputTokens"),
                    n("totalTokens")
                ),
            );
        }
        let reason = result.get("stopReason").and_then(Value::as_str).unwrap_or("(none)");
        let (tone, code) = match reason {
            "end_turn" => (Tone::Green, exit::END_TURN),
            "max_tokens" => (Tone::Yellow, exit::MAX_TOKENS),
            "max_turn_requests" => (Tone::Yellow, exit::MAX_TURN_REQUESTS),
            "refusal" => (Tone::Red, exit::REFUSAL),
            "cancelled" => (Tone::Yellow, exit::CANCELLED),
            _ => (Tone::Red, exit::UNKNOWN_STOP),
        };
        self.r.row(tone, &format!("stop: {reason}"));
        code
    }

    fn prompt_failed(&mut self, e: &RpcError) -> i32 {
        if let Some(code) = self.needs_login("session/prompt", e) {
            return code;
        }
        self.r.row(Tone::Red, &format!("error {}: {}", e.code, e.message));
        if let Some(failure) = e.data.as_ref().and_then(|d| d.pointer("/_meta/coda/failure")) {
            self.r.row(Tone::Red, &format!("  failure: {failure}"));
        }
        self.stderr_tail(e);
        if e.agent_exited() { exit::AGENT_FAILED } else { exit::PROMPT_ERROR }
    }

    /// ACP's auth_required (-32000), on any request: its own exit status, whatever else the error says.
    fn needs_login(&mut self, method: &str, e: &RpcError) -> Option<i32> {
        if e.code != -32000 {
            return None;
        }
        self.r.row(Tone::Red, &format!("{method}: the agent needs a login (error -32000: {})", e.message));
        Some(exit::NEEDS_LOGIN)
    }

    fn setup_failed(&mut self, method: &str, e: &RpcError) -> i32 {
        if let Some(code) = self.needs_login(method, e) {
            return code;
        }
        self.r.row(Tone::Red, &format!("{method} failed: error {}: {}", e.code, e.message));
        self.stderr_tail(e);
        exit::AGENT_FAILED
    }

    fn stderr_tail(&mut self, e: &RpcError) {
        let Some(tail) = e.data.as_ref().and_then(|d| d.get("stderr")).and_then(Value::as_str) else { return };
        for line in tail.lines().filter(|l| !l.trim().is_empty()) {
            self.r.row(Tone::Dim, &format!("  stderr: {line}"));
        }
    }

    async fn relay_code(&mut self) -> i32 {
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

/// "agent: OpenCode 1.18.33 (protocol 1); declares: loadSession, systemPrompt, waits".
pub(crate) fn describe_agent(init: &Value) -> String {
    let info = init.get("agentInfo");
    let name = info.and_then(|i| i.get("name")).and_then(Value::as_str).unwrap_or("(no agentInfo)");
    let version = info.and_then(|i| i.get("version")).and_then(Value::as_str).unwrap_or("");
    let protocol = init.get("protocolVersion").map(Value::to_string).unwrap_or_else(|| "?".into());
    let caps = init.get("agentCapabilities").cloned().unwrap_or(Value::Null);
    let mut declares = Vec::new();
    if caps.get("loadSession").and_then(Value::as_bool) == Some(true) {
        declares.push("loadSession");
    }
    if caps.pointer("/sessionCapabilities/systemPrompt").is_some() {
        declares.push("systemPrompt");
    }
    if caps.pointer("/_meta/coda/waits").is_some() {
        declares.push("waits");
    }
    if caps.pointer("/_meta/coda/compact").is_some() {
        declares.push("compact");
    }
    if init.pointer("/_meta/steering/supported").and_then(Value::as_bool) == Some(true) {
        declares.push("steering");
    }
    let declares = if declares.is_empty() { "nothing of Coda's".to_owned() } else { declares.join(", ") };
    format!("agent: {name} {version} (protocol {protocol}); declares: {declares}").replace("  ", " ")
}

/// The session's current model (section ACP 部分, 当前模型): the `category: model` config option's value, or
/// `models.currentModelId`.
pub fn current_model(answer: &Value) -> Option<String> {
    let from_options = answer.get("configOptions").and_then(Value::as_array).and_then(|options| {
        options
            .iter()
            .find(|o| o.get("category").and_then(Value::as_str) == Some("model"))
            .and_then(|o| o.get("currentValue"))
            .and_then(Value::as_str)
    });
    from_options.or_else(|| answer.pointer("/models/currentModelId").and_then(Value::as_str)).map(str::to_owned)
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

/// Lines typed on stdin, read on a thread of their own (a blocking read cannot be cancelled).
fn spawn_stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(line.clone()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot read answers from stdin: {e}");
    }
    rx
}

async fn recv_answer(rx: &mut Option<mpsc::UnboundedReceiver<String>>) -> Option<String> {
    match rx {
        Some(rx) => rx.recv().await,
        None => None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_seconds() {
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn current_model_comes_from_the_model_option_or_models() {
        let options = json!({"configOptions": [{"id": "mode", "category": "mode", "currentValue": "build"},
            {"id": "model", "category": "model", "currentValue": "fake/fake-model"}]});
        assert_eq!(current_model(&options).as_deref(), Some("fake/fake-model"));
        assert_eq!(current_model(&json!({"models": {"currentModelId": "m1"}})).as_deref(), Some("m1"));
        assert_eq!(current_model(&json!({"sessionId": "s"})), None);
    }

    #[test]
    fn the_agent_line_names_what_it_declares() {
        let init = json!({"protocolVersion": 1, "agentInfo": {"name": "grok", "version": "1.0.41"},
            "agentCapabilities": {"loadSession": true, "sessionCapabilities": {"systemPrompt": {}}}});
        assert_eq!(describe_agent(&init), "agent: grok 1.0.41 (protocol 1); declares: loadSession, systemPrompt");
    }
}

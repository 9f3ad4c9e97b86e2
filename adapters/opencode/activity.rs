//! OpenCode's subagents (the `task` tool) as Coda's `_coda/wait` (section "Agent 活动").
//!
//! OpenCode 1.18.33 has no activity messages over ACP; what it shows (seen live):
//! - The `task` tool is a `tool_call` / `tool_call_update` of the parent session with `rawInput`
//!   `{description, prompt, subagent_type, background?, task_id?}` (`task_id` = a follow-up of that child);
//!   its completed update carries `rawOutput.metadata {sessionId: <child ses_…>, parentSessionId, background?}`.
//!   Over ACP that is the first time the child is named, and OpenCode forwards nothing of a session it has
//!   not been told about: a permission request inside a foreground child never reaches Coda, and the turn
//!   hangs until Coda cancels it.
//! - OpenCode's own HTTP server (`server.rs`) names the child as soon as it exists. The shim then announces
//!   it (`childSessionId` on the wait, still `waiting`) and resumes it (`session/resume`, no replay): from
//!   then on OpenCode forwards the child's output and its permission requests on the child session itself.
//!   A request the child raised before the resume took effect is not forwarded by OpenCode; if it is still
//!   unanswered [`ASK_GRACE`] after the resume, the shim asks Coda itself and answers it on OpenCode's server.
//! - A background task (`OPENCODE_EXPERIMENTAL_BACKGROUND_SUBAGENTS=true`) completes at once; the wait stays
//!   `waiting`. When the child finishes, OpenCode prompts the parent itself: its output streams on the
//!   parent outside any Coda turn. The first such output makes a background wait `handling` (the one whose
//!   child finished first, else the oldest); it is `done` when OpenCode's server says the parent is idle
//!   again (plus [`IDLE_GRACE`] for frames still on their way), or, without the server, after [`QUIET`] of
//!   quiet (OpenCode does not say whether the child failed). A child that ends while a Coda turn runs is
//!   folded into that turn by OpenCode and is not seen; its wait stays `waiting` until the process ends.
//! - Without the server (an agent command without `--port`) children are named and resumed when the task
//!   call completes, as before: foreground children's permission requests then still hang.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::coda::wait::{self, Register, State, Wait};
use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Event, EventSender, Layer};
use serde_json::{Value, json};

use crate::adapters::opencode::failure::Failures;
use crate::adapters::opencode::server::{self, FromServer, Server, ServerEvent};

/// Without OpenCode's server: how long the parent must stay quiet before its own turn counts as over.
pub const QUIET: Duration = Duration::from_secs(10);
/// After OpenCode's server says the parent is idle: its last frames may still be on their way over ACP.
pub const IDLE_GRACE: Duration = Duration::from_millis(300);
/// How long a child's permission request may stay unforwarded after the child was resumed before the shim
/// asks Coda itself (OpenCode forwards one raised after the resume within milliseconds).
pub const ASK_GRACE: Duration = Duration::from_secs(1);

/// Env: read OpenCode's server events from this file instead of its server (replays).
pub const EVENTS_ENV: &str = "CODA_OPENCODE_EVENTS";
/// Env: log the server events the layer handled to this file, as `acp-replay record --files` takes them.
pub const RECORD_ENV: &str = "CODA_OPENCODE_RECORD";
/// Env, for live tests only: send the `session/resume` of a child this many milliseconds late, so that the
/// child asks for permission before OpenCode knows it (the race [`ASK_GRACE`] is there for).
pub const RESUME_DELAY_ENV: &str = "CODA_OPENCODE_RESUME_DELAY_MS";
/// Where a recording says the events were read from (relative to `$TMPDIR`, like the replay puts them).
pub const EVENTS_FILE: &str = "coda-opencode-events.jsonl";

/// Timers the layer asks for, with the count of parent frames (or asks) at the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// [`QUIET`] passed: settle the handled waits if nothing came since.
    Quiet(u64),
    /// [`IDLE_GRACE`] after OpenCode said a handled parent is idle.
    Idle(u64),
    /// [`ASK_GRACE`] after a child's permission request became due.
    Asks(u64),
    /// [`RESUME_DELAY_ENV`]: time to send the delayed `session/resume` with this tag.
    Resume(u64),
    /// [`crate::adapters::opencode::failure::ANSWER_HOLD`] after an error answer to a prompt was held for OpenCode's `session.error`.
    Failure(u64),
}

/// Asks for a [`Tick`] after a delay; tests hand ticks in themselves.
pub type Timer = Box<dyn FnMut(Tick, Duration) + Send>;

/// Answers a permission request on OpenCode's server: (directory, request id, `once`|`always`|`reject`).
pub type Replier = Box<dyn FnMut(&str, &str, &str) + Send>;

#[derive(Debug)]
struct Task {
    session: String,
    call: String,
    child: Option<String>,
    background: bool,
    open: bool,
    /// OpenCode's server said the child went idle (its run ended).
    finished: bool,
    /// Order of registration, for picking the oldest.
    seq: u64,
}

/// A child's permission request seen on OpenCode's server.
#[derive(Debug)]
struct Ask {
    session: String,
    permission: String,
    /// OpenCode's `toolCallId` for it (the tool call, else the request id).
    call: String,
    metadata: Value,
    directory: String,
    /// The [`Tick::Asks`] from which on it counts as not forwarded; `None` while its child is not resumed.
    due: Option<u64>,
    /// The id of the shim's own request to Coda, once asked.
    asked: Option<String>,
}

pub struct OpenCodeActivity {
    timer: Timer,
    replier: Replier,
    /// Starts reading OpenCode's server once `initialize` is answered (its server is up by then; a
    /// connection made while it starts may hang).
    start_reader: Option<Box<dyn FnOnce() + Send>>,
    record: Option<(std::fs::File, String)>,
    waits: bool,
    initialize: HashSet<Id>,
    register: Register,
    /// Client prompts in flight -> session.
    prompts: HashMap<Id, String>,
    /// session/new|load|resume in flight -> cwd asked for.
    setup: HashMap<Id, (Option<String>, String)>,
    /// `session/load` in flight -> session: its replayed history is not activity.
    loading: HashMap<Id, String>,
    /// Session -> its cwd (for resuming its children).
    cwd: HashMap<String, String>,
    /// By (session, toolCallId) = (session, waitId).
    tasks: HashMap<(String, String), Task>,
    /// Children named by OpenCode's server before their task call was seen over ACP.
    early: HashMap<(String, String), String>,
    /// Children the shim has resumed (or tried to).
    resumed: HashSet<String>,
    /// `session/resume` in flight: tag -> child.
    resuming: HashMap<u64, String>,
    /// [`RESUME_DELAY_ENV`] (zero unless a test sets it), and the resumes it holds back: tag -> cwd.
    resume_delay: Duration,
    /// Failed Coda turns, answered as Coda's failure kinds.
    failures: Failures,
    delayed: HashMap<u64, String>,
    /// Children OpenCode knows now (resumed), and children it never will (the resume failed).
    known_to_opencode: HashSet<String>,
    unreachable: HashSet<String>,
    /// OpenCode's server: whether a session is running.
    busy: HashMap<String, bool>,
    /// Runs OpenCode's server saw start on a session outside Coda's turns (its own turns) since the last
    /// Coda turn or settle: an idle ends a handled wait only after such a run.
    own_runs: HashMap<String, u32>,
    /// Sessions whose Coda turn's run has not ended on OpenCode's server yet (true once it started). OpenCode
    /// may start its own turn before Coda's `session/prompt` answer is through (seen live).
    coda_run: HashMap<String, bool>,
    /// Children's permission requests by OpenCode's request id.
    asks: HashMap<String, Ask>,
    /// (session, toolCallId) of permission requests OpenCode forwarded itself.
    forwarded: HashSet<(String, String)>,
    /// OpenCode's own request for an ask the shim had already put to Coda: answered with Coda's answer.
    held: HashMap<(String, String), Id>,
    /// Coda's answers to the shim's own requests, for a copy OpenCode forwards late.
    answered: HashMap<(String, String), Value>,
    next_ask_tick: u64,
    next_asked: u64,
    next_tag: u64,
    /// The wait being handled in OpenCode's own turn, per parent session.
    handling: HashMap<String, (String, String)>,
    /// Parent frames seen while handling (compared by [`Tick`]).
    seen: u64,
    quiet_pending: bool,
    idle_pending: bool,
    next_seq: u64,
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Updates that are output of a turn (what OpenCode's own follow-up turn streams).
fn is_turn_output(kind: &str) -> bool {
    matches!(kind, "agent_message_chunk" | "agent_thought_chunk" | "tool_call" | "tool_call_update" | "plan")
}

/// Ids of the shim's own permission requests to Coda.
const ASK_ID: &str = "coda-opencode-ask-";

/// OpenCode's options for a permission request (its ids are what it expects back).
fn ask_options() -> Value {
    json!([
        {"optionId": "once", "kind": "allow_once", "name": "Allow once"},
        {"optionId": "always", "kind": "allow_always", "name": "Always allow"},
        {"optionId": "reject", "kind": "reject_once", "name": "Reject"}
    ])
}

/// The tool-call kind OpenCode gives a permission's tool.
fn tool_kind(permission: &str) -> &'static str {
    match permission.to_ascii_lowercase().as_str() {
        "bash" | "shell" => "execute",
        "webfetch" => "fetch",
        "edit" | "write" | "patch" | "apply_patch" => "edit",
        "grep" | "glob" => "search",
        "read" => "read",
        "task" => "think",
        _ => "other",
    }
}

/// A line people can read for a permission request: the command, file, pattern or address it is about.
fn ask_title(ask: &Ask) -> String {
    ["command", "cmd", "filePath", "filepath", "path", "pattern", "url", "query", "description"]
        .iter()
        .find_map(|k| str_at(&ask.metadata, k))
        .unwrap_or(&ask.permission)
        .to_owned()
}

impl OpenCodeActivity {
    /// The real layer: reads OpenCode's server (or, for replays, [`EVENTS_ENV`]'s file); timers are sleeping
    /// threads that report through the layer's event sender.
    pub fn new(events: EventSender, server: Option<Server>) -> OpenCodeActivity {
        let source = std::env::var_os(EVENTS_ENV).filter(|p| !p.is_empty()).map(PathBuf::from);
        let send = {
            let events = events.clone();
            move |e: FromServer| events.send(e)
        };
        let mut start_reader: Option<Box<dyn FnOnce() + Send>> = None;
        match (&source, &server) {
            (Some(path), _) => {
                let path = path.clone();
                start_reader = Some(Box::new(move || server::tail(path, send)));
            }
            (None, Some(s)) => {
                let s = s.clone();
                start_reader = Some(Box::new(move || server::follow(s, send)));
            }
            (None, None) => tracing::warn!(
                "OpenCode's server port is unknown (no --port in the agent command): a permission request inside a \
                 foreground subagent cannot reach Coda, and OpenCode's own turns count as over after {}s of quiet",
                QUIET.as_secs()
            ),
        }
        let timer: Timer = Box::new(move |tick, after| {
            let events = events.clone();
            let spawned = std::thread::Builder::new().name("opencode-timer".into()).spawn(move || {
                std::thread::sleep(after);
                events.send(tick);
            });
            if let Err(e) = spawned {
                tracing::warn!("cannot start a timer: {e}");
            }
        });
        let replier: Replier = match server {
            Some(s) => Box::new(move |directory, id, reply| {
                let (s, directory, id, reply) = (s.clone(), directory.to_owned(), id.to_owned(), reply.to_owned());
                let spawned = std::thread::Builder::new().name("opencode-reply".into()).spawn(move || {
                    if let Err(e) = s.reply_permission(&directory, &id, &reply) {
                        tracing::warn!("OpenCode did not take the answer to permission request {id}: {e}");
                    }
                });
                if let Err(e) = spawned {
                    tracing::warn!("cannot answer permission request: {e}");
                }
            }),
            None => Box::new(|_, id, reply| {
                tracing::warn!("cannot pass the answer to OpenCode's permission request {id}: its server is unknown");
                tracing::debug!("the answer: {reply:?}");
            }),
        };
        let mut layer = OpenCodeActivity::with_io(timer, replier);
        layer.start_reader = start_reader;
        if let Some(ms) = std::env::var(RESUME_DELAY_ENV).ok().and_then(|v| v.parse::<u64>().ok()) {
            layer.resume_delay = Duration::from_millis(ms);
        }
        if let Some(log) = std::env::var_os(RECORD_ENV).filter(|p| !p.is_empty()) {
            let events_path = source.unwrap_or_else(|| std::env::temp_dir().join(EVENTS_FILE));
            match crate::private_file::open(Path::new(&log), crate::private_file::Write::Append) {
                Ok(f) => layer.record = Some((f, events_path.display().to_string())),
                Err(e) => tracing::warn!("cannot open {RECORD_ENV} {}: {e}", PathBuf::from(log).display()),
            }
        }
        layer
    }

    pub fn with_io(timer: Timer, replier: Replier) -> OpenCodeActivity {
        OpenCodeActivity {
            timer,
            replier,
            start_reader: None,
            record: None,
            waits: false,
            initialize: HashSet::new(),
            register: Register::new(),
            prompts: HashMap::new(),
            setup: HashMap::new(),
            loading: HashMap::new(),
            cwd: HashMap::new(),
            tasks: HashMap::new(),
            early: HashMap::new(),
            resumed: HashSet::new(),
            resuming: HashMap::new(),
            resume_delay: Duration::ZERO,
            failures: Failures::new(crate::coda::failure::retry_patience()),
            delayed: HashMap::new(),
            known_to_opencode: HashSet::new(),
            unreachable: HashSet::new(),
            busy: HashMap::new(),
            own_runs: HashMap::new(),
            coda_run: HashMap::new(),
            asks: HashMap::new(),
            forwarded: HashSet::new(),
            held: HashMap::new(),
            answered: HashMap::new(),
            next_ask_tick: 0,
            next_asked: 0,
            next_tag: 0,
            handling: HashMap::new(),
            seen: 0,
            quiet_pending: false,
            idle_pending: false,
            next_seq: 0,
        }
    }

    fn report(&mut self, w: &Wait, cx: &mut Cx) {
        if self.waits
            && let Some(f) = self.register.report(w)
        {
            cx.to_client(f);
        }
    }

    fn in_turn(&self, session: &str) -> bool {
        self.prompts.values().any(|s| s == session)
    }

    /// A `task` tool update of `session`.
    fn task_update(&mut self, session: &str, u: &Value, cx: &mut Cx) {
        let Some(call) = str_at(u, "toolCallId") else { return };
        let key = (session.to_owned(), call.to_owned());
        let input = u.get("rawInput").filter(|i| i.get("subagent_type").is_some() && i.get("prompt").is_some());
        if !self.tasks.contains_key(&key) {
            let Some(input) = input else { return };
            self.next_seq += 1;
            let early = self.early.remove(&key);
            let child = str_at(input, "task_id").map(str::to_owned).or(early);
            let mut w = Wait::new(session, call, State::Waiting);
            w.kind = Some("subagent".into());
            w.title = str_at(input, "description").map(str::to_owned);
            w.detail = str_at(input, "prompt").map(str::to_owned);
            w.tool_call_id = Some(call.to_owned());
            w.child_session_id.clone_from(&child);
            let task = Task {
                session: session.to_owned(),
                call: call.to_owned(),
                child: child.clone(),
                background: input.get("background").and_then(Value::as_bool) == Some(true),
                open: true,
                finished: false,
                seq: self.next_seq,
            };
            self.tasks.insert(key.clone(), task);
            self.report(&w, cx);
            if let Some(child) = child {
                // Announced first: Coda takes the child's frames only from then on.
                self.follow(session, &child, cx);
            }
        }
        let state = match str_at(u, "status") {
            Some("completed") => State::Done,
            Some("failed") => State::Failed,
            _ => return,
        };
        let meta = u.pointer("/rawOutput/metadata");
        let child = meta.and_then(|m| str_at(m, "sessionId")).map(str::to_owned);
        let background = meta.and_then(|m| m.get("background")).and_then(Value::as_bool) == Some(true);
        let Some(task) = self.tasks.get_mut(&key) else { return };
        if !task.open {
            return;
        }
        if child.is_some() {
            task.child.clone_from(&child);
        }
        let mut w = Wait::new(session, call, State::Waiting);
        w.child_session_id = task.child.clone();
        if background && state == State::Done {
            // Runs on after the call: wait for OpenCode's own turn on its result.
            task.background = true;
            self.report(&w, cx);
            if let Some(child) = child {
                self.follow(session, &child, cx);
            }
        } else {
            task.open = false;
            w.state = Some(state);
            self.report(&w, cx);
        }
    }

    /// Resumes a child so that OpenCode forwards its output and permission requests.
    fn follow(&mut self, parent: &str, child: &str, cx: &mut Cx) {
        if !self.resumed.insert(child.to_owned()) {
            return;
        }
        let Some(cwd) = self.cwd.get(parent).cloned() else {
            tracing::warn!("no cwd known for session {parent}; its subagent {child} is not followed");
            self.unreachable.insert(child.to_owned());
            return self.asks_due(child);
        };
        self.next_tag += 1;
        self.resuming.insert(self.next_tag, child.to_owned());
        if self.resume_delay.is_zero() {
            self.send_resume(self.next_tag, &cwd, cx);
        } else {
            self.delayed.insert(self.next_tag, cwd);
            (self.timer)(Tick::Resume(self.next_tag), self.resume_delay);
        }
    }

    fn send_resume(&mut self, tag: u64, cwd: &str, cx: &mut Cx) {
        let Some(child) = self.resuming.get(&tag) else { return };
        cx.request("session/resume", json!({"sessionId": child, "cwd": cwd, "mcpServers": []}), tag);
    }

    /// The child of a `task` call, named by OpenCode's server.
    fn task_child(&mut self, session: String, call: String, child: String, cx: &mut Cx) {
        let key = (session, call);
        let Some(task) = self.tasks.get_mut(&key) else {
            // The call's own ACP update comes a moment later: announce the child with it.
            self.early.insert(key, child);
            return;
        };
        if !task.open || task.child.as_deref().is_some_and(|c| c != child) {
            return;
        }
        task.child = Some(child.clone());
        let mut w = Wait::new(&key.0, &key.1, State::Waiting);
        w.child_session_id = Some(child.clone());
        self.report(&w, cx);
        self.follow(&key.0, &child, cx);
    }

    fn is_child(&self, session: &str) -> bool {
        self.resumed.contains(session) || self.tasks.values().any(|t| t.child.as_deref() == Some(session))
    }

    /// The child's pending asks start counting: OpenCode forwards any it still can within [`ASK_GRACE`].
    fn asks_due(&mut self, child: &str) {
        let ready = self.known_to_opencode.contains(child) || self.unreachable.contains(child);
        if !ready {
            return;
        }
        let mut any = false;
        for a in self.asks.values_mut().filter(|a| a.session == child && a.due.is_none()) {
            a.due = Some(self.next_ask_tick + 1);
            any = true;
        }
        if any {
            self.next_ask_tick += 1;
            (self.timer)(Tick::Asks(self.next_ask_tick), ASK_GRACE);
        }
    }

    /// Puts to Coda the due asks OpenCode has not forwarded.
    fn ask_overdue(&mut self, tick: u64, cx: &mut Cx) {
        let mut overdue: Vec<String> = self
            .asks
            .iter()
            .filter(|(_, a)| a.asked.is_none() && a.due.is_some_and(|d| d <= tick))
            .filter(|(_, a)| !self.forwarded.contains(&(a.session.clone(), a.call.clone())))
            .map(|(id, _)| id.clone())
            .collect();
        overdue.sort();
        for id in overdue {
            let Some(ask) = self.asks.get_mut(&id) else { continue };
            self.next_asked += 1;
            let own = format!("{ASK_ID}{}", self.next_asked);
            ask.asked = Some(own.clone());
            tracing::info!("OpenCode did not forward permission request {id} of subagent {}: asking Coda", ask.session);
            let params = json!({
                "sessionId": ask.session,
                "toolCall": {"toolCallId": ask.call, "title": ask_title(ask), "kind": tool_kind(&ask.permission),
                    "status": "pending", "locations": [], "rawInput": ask.metadata},
                "options": ask_options(),
            });
            cx.to_client(Frame::from_value(
                &json!({"jsonrpc": "2.0", "id": own, "method": "session/request_permission", "params": params}),
            ));
        }
    }

    /// Coda's answer to one of the shim's own permission requests.
    fn asked_answered(&mut self, own: &str, answer: &Value, cx: &mut Cx) {
        let Some(id) = self.asks.iter().find(|(_, a)| a.asked.as_deref() == Some(own)).map(|(id, _)| id.clone()) else {
            return; // answered elsewhere meanwhile
        };
        let Some(ask) = self.asks.remove(&id) else { return };
        let result = answer.get("result").cloned().unwrap_or(json!({"outcome": {"outcome": "cancelled"}}));
        self.answered.insert((ask.session.clone(), ask.call.clone()), result.clone());
        if let Some(held) = self.held.remove(&(ask.session.clone(), ask.call.clone())) {
            // OpenCode forwarded it after all: its own request carries Coda's answer.
            return cx.to_agent(frame::result_response(&held, result));
        }
        let reply = match (result.pointer("/outcome/outcome"), result.pointer("/outcome/optionId")) {
            (Some(o), Some(Value::String(opt))) if o == "selected" && (opt == "once" || opt == "always") => {
                opt.as_str()
            }
            _ => "reject",
        };
        (self.replier)(&ask.directory, &id, reply);
    }

    fn server_event(&mut self, e: ServerEvent, cx: &mut Cx) {
        self.log_event(&e);
        match e {
            ServerEvent::TaskChild { session, call, child } => self.task_child(session, call, child, cx),
            ServerEvent::Retry { session, attempt, message, at_ms, wait_ms } => {
                if self.busy.get(&session) != Some(&true) {
                    self.server_event(ServerEvent::Status { session: session.clone(), busy: true }, cx);
                }
                if self.failures.retry(&session, at_ms, attempt, &message, wait_ms) {
                    tracing::info!("stopping OpenCode's turn in session {session}: its retries would outlast a minute");
                    cx.to_agent(frame::notification("session/cancel", json!({ "sessionId": session })));
                }
            }
            ServerEvent::Failed { session, name, message, status, code } => {
                let upstream = crate::adapters::opencode::failure::Upstream { name, message, status, code };
                if let Some(answer) = self.failures.failed(&session, upstream) {
                    cx.to_client(answer);
                }
            }
            ServerEvent::Status { session, busy } => {
                self.busy.insert(session.clone(), busy);
                if busy {
                    match self.coda_run.get_mut(&session) {
                        Some(started) => *started = true,
                        None => *self.own_runs.entry(session).or_default() += 1,
                    }
                    return;
                }
                if self.coda_run.get(&session) == Some(&true) {
                    self.coda_run.remove(&session);
                }
                if let Some(t) = self.tasks.values_mut().find(|t| t.open && t.child.as_deref() == Some(&session)) {
                    t.finished = true;
                }
                self.idle_check(&session);
            }
            ServerEvent::Asked { id, session, permission, call, metadata, directory } => {
                if !self.is_child(&session) || self.asks.contains_key(&id) {
                    return; // a parent's: OpenCode forwards those itself
                }
                let call = call.unwrap_or_else(|| id.clone());
                let ask =
                    Ask { session: session.clone(), permission, call, metadata, directory, due: None, asked: None };
                self.asks.insert(id, ask);
                self.asks_due(&session);
            }
            ServerEvent::Replied { id, .. } => {
                let Some(ask) = self.asks.remove(&id) else { return };
                if let Some(own) = ask.asked {
                    // Answered some other way (the turn was cancelled): Coda need not answer any more.
                    cx.to_client(frame::notification("$/cancel_request", json!({"requestId": own})));
                }
                if let Some(held) = self.held.remove(&(ask.session, ask.call)) {
                    cx.to_agent(frame::result_response(&held, json!({"outcome": {"outcome": "cancelled"}})));
                }
            }
        }
    }

    /// With [`RECORD_ENV`]: one file-log line per event, in the order the layer handled them.
    fn log_event(&mut self, e: &ServerEvent) {
        let Some((file, path)) = &mut self.record else { return };
        let data = serde_json::to_string(e).unwrap_or_default() + "\n";
        let ts = humantime::format_rfc3339_nanos(SystemTime::now()).to_string();
        let line = json!({"ts": ts, "op": "append", "path": path, "data": data}).to_string() + "\n";
        if let Err(err) = file.write_all(line.as_bytes()) {
            tracing::warn!("cannot write {RECORD_ENV}: {err}");
            self.record = None;
        }
    }

    /// OpenCode's server says `session` ran a turn of its own and is idle now: the handled wait ends once
    /// the turn's last frames (which may trail the server's word over ACP) are through.
    fn idle_check(&mut self, session: &str) {
        let own_turn_over =
            self.busy.get(session) == Some(&false) && self.own_runs.get(session).is_some_and(|n| *n > 0);
        if own_turn_over && self.handling.contains_key(session) && !self.idle_pending {
            self.idle_pending = true;
            (self.timer)(Tick::Idle(self.seen), IDLE_GRACE);
        }
    }

    /// Output on a parent session outside a Coda turn: OpenCode is working on a background result.
    fn own_turn_output(&mut self, session: &str, cx: &mut Cx) {
        let started = !self.handling.contains_key(session);
        if started {
            let pick = self
                .tasks
                .values()
                .filter(|t| t.session == session && t.open && t.background)
                .min_by_key(|t| (!t.finished, t.seq))
                .map(|t| (t.session.clone(), t.call.clone()));
            let Some(key) = pick else { return };
            self.handling.insert(session.to_owned(), key.clone());
            self.report(&Wait::new(&key.0, &key.1, State::Handling), cx);
        }
        self.seen += 1;
        if !self.quiet_pending {
            self.quiet_pending = true;
            (self.timer)(Tick::Quiet(self.seen), QUIET);
        }
        if started {
            // The server may have said the turn is over before its first frame arrived (seen live).
            self.idle_check(session);
        }
    }

    /// Ends the handling of `session`'s wait (idle, quiet, a new Coda turn, or a cancel).
    fn settle(&mut self, session: &str, cx: &mut Cx) {
        self.own_runs.remove(session);
        let Some(key) = self.handling.remove(session) else { return };
        if let Some(t) = self.tasks.get_mut(&key) {
            t.open = false;
        }
        self.report(&Wait::new(&key.0, &key.1, State::Done), cx);
    }

    fn tick(&mut self, tick: Tick, cx: &mut Cx) {
        match tick {
            Tick::Failure(tag) => {
                if let Some(answer) = self.failures.hold_over(tag) {
                    cx.to_client(answer);
                }
            }
            Tick::Asks(n) => self.ask_overdue(n, cx),
            Tick::Resume(tag) => {
                if let Some(cwd) = self.delayed.remove(&tag) {
                    self.send_resume(tag, &cwd, cx);
                }
            }
            Tick::Quiet(n) => {
                self.quiet_pending = false;
                if self.handling.is_empty() {
                    return;
                }
                // Quiet for QUIET, unless OpenCode's server says the parent still runs (a long tool call).
                let quiet: Vec<String> = self
                    .handling
                    .keys()
                    .filter(|s| n == self.seen && self.busy.get(*s) != Some(&true))
                    .cloned()
                    .collect();
                for s in quiet {
                    self.settle(&s, cx);
                }
                if !self.handling.is_empty() {
                    self.quiet_pending = true;
                    (self.timer)(Tick::Quiet(self.seen), QUIET);
                }
            }
            Tick::Idle(n) => {
                self.idle_pending = false;
                let idle: Vec<String> = self
                    .handling
                    .keys()
                    .filter(|s| self.busy.get(*s) == Some(&false) && self.own_runs.get(*s).is_some_and(|n| *n > 0))
                    .cloned()
                    .collect();
                if idle.is_empty() {
                    return;
                }
                if n != self.seen {
                    // Frames came after the idle: give them their grace again.
                    self.idle_pending = true;
                    return (self.timer)(Tick::Idle(self.seen), IDLE_GRACE);
                }
                for s in idle {
                    self.settle(&s, cx);
                }
            }
        }
    }
}

impl Layer for OpenCodeActivity {
    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind().clone() {
            Kind::Request { id, method } => {
                let acts = matches!(
                    method.as_str(),
                    "initialize" | "session/new" | "session/load" | "session/resume" | "session/prompt"
                );
                let v = match acts.then(|| frame.value()).transpose() {
                    Ok(v) => v,
                    Err(e) => return cx.unreadable(frame, &e, true),
                };
                let param = |k: &str| v.as_ref().and_then(|v| v.get("params")).and_then(|p| str_at(p, k));
                match method.as_str() {
                    "initialize" => {
                        self.waits = v.as_ref().and_then(|v| v.get("params")).is_some_and(wait::client_declares_waits);
                        self.initialize.insert(id);
                    }
                    "session/new" | "session/load" | "session/resume" => {
                        if method == "session/load"
                            && let Some(sid) = param("sessionId")
                        {
                            self.loading.insert(id.clone(), sid.to_owned());
                        }
                        if let Some(cwd) = param("cwd") {
                            self.setup.insert(id, (param("sessionId").map(str::to_owned), cwd.to_owned()));
                        }
                    }
                    "session/prompt" => {
                        if let Some(sid) = param("sessionId").map(str::to_owned) {
                            // A Coda turn starts: OpenCode folds whatever it was doing on its own into it.
                            self.settle(&sid, cx);
                            self.coda_run.insert(sid.clone(), false);
                            self.failures.prompt(&id, &sid);
                            self.prompts.insert(id, sid);
                        }
                    }
                    wait::STOP_METHOD => {
                        let msg = "OpenCode's subagents cannot be stopped on their own (none is declared stoppable)";
                        return cx.to_client(frame::error_response(&id, -32602, msg, None));
                    }
                    _ => {}
                }
            }
            Kind::Response { id } => {
                if let Some(own) = id.to_value().as_str().filter(|s| s.starts_with(ASK_ID)) {
                    let own = own.to_owned();
                    let answer = frame.value().unwrap_or_else(|e| {
                        tracing::warn!("cannot read the client's answer to a permission request ({e}); taken as none");
                        Value::Null
                    });
                    return self.asked_answered(&own, &answer, cx);
                }
            }
            Kind::Notification { method } if method == "session/cancel" => {
                let v = match frame.value() {
                    Ok(v) => v,
                    Err(e) => return cx.unreadable(frame, &e, true),
                };
                if let Some(sid) = v.pointer("/params/sessionId").and_then(Value::as_str) {
                    self.settle(sid, cx);
                }
            }
            _ => {}
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        // Borrowed: most frames are streamed updates, which need nothing of the kind kept.
        match frame.kind() {
            Kind::Response { id } => {
                let id = id.clone();
                if let Some(sid) = self.prompts.remove(&id)
                    && self.coda_run.get(&sid) == Some(&false)
                {
                    // A turn that never ran (a swallowed command): nothing of Coda's is left to end.
                    self.coda_run.remove(&sid);
                }
                self.loading.remove(&id);
                if let Some((asked, cwd)) = self.setup.remove(&id) {
                    let sid = match frame.value() {
                        Ok(v) => v.pointer("/result/sessionId").cloned(),
                        Err(e) => return cx.unreadable(frame, &e, false),
                    };
                    if let Some(sid) = sid.as_ref().and_then(Value::as_str).map(str::to_owned).or(asked) {
                        self.cwd.insert(sid, cwd);
                    }
                }
                if self.initialize.remove(&id) {
                    if let Some(start) = self.start_reader.take() {
                        start();
                    }
                    return wait::declare_waits_in(frame, cx);
                }
                match self.failures.answer(frame) {
                    Ok(frame) => cx.to_client(frame),
                    Err(tag) => (self.timer)(Tick::Failure(tag), crate::adapters::opencode::failure::ANSWER_HOLD),
                }
            }
            Kind::Request { id, method } if method == "session/request_permission" => {
                let id = id.clone();
                let v = match frame.value() {
                    Ok(v) => v,
                    Err(e) => return cx.unreadable(frame, &e, false),
                };
                let at = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
                if let (Some(session), Some(call)) = (at("/params/sessionId"), at("/params/toolCall/toolCallId")) {
                    let key = (session, call);
                    if let Some(result) = self.answered.get(&key) {
                        // Coda answered the shim's copy already (and OpenCode has that answer).
                        return cx.to_agent(frame::result_response(&id, result.clone()));
                    }
                    let mine =
                        self.asks.values().any(|a| a.asked.is_some() && (&a.session, &a.call) == (&key.0, &key.1));
                    if mine {
                        // Coda already has the shim's copy of this request: one question, one answer.
                        self.held.insert(key, id);
                        return;
                    }
                    self.forwarded.insert(key);
                }
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == "session/update" => {
                // Most updates are text chunks: parse only tool calls, or anything while a background
                // subagent may wake the parent (its follow-up turn is output outside a Coda turn).
                let watching = !self.handling.is_empty() || self.tasks.values().any(|t| t.open && t.background);
                if !watching && !matches!(frame.session_update(), Some("tool_call" | "tool_call_update")) {
                    return cx.to_client(frame);
                }
                let v = match frame.value() {
                    Ok(v) => v,
                    Err(e) => return cx.unreadable(frame, &e, false),
                };
                cx.to_client(frame);
                let (Some(sid), Some(u)) =
                    (v.pointer("/params/sessionId").and_then(Value::as_str), v.pointer("/params/update"))
                else {
                    return;
                };
                if self.resumed.contains(sid) || self.loading.values().any(|s| s == sid) {
                    return;
                }
                let kind = u.get("sessionUpdate").and_then(Value::as_str).unwrap_or("");
                if matches!(kind, "tool_call" | "tool_call_update") {
                    self.task_update(sid, u, cx);
                }
                if is_turn_output(kind) && !self.in_turn(sid) {
                    self.own_turn_output(sid, cx);
                }
            }
            _ => cx.to_client(frame),
        }
    }

    fn on_reply(&mut self, tag: u64, reply: Frame, _cx: &mut Cx) {
        let Some(child) = self.resuming.remove(&tag) else { return };
        if let Some(err) = reply.value().ok().and_then(|v| v.get("error").cloned()) {
            let code = err.get("code").and_then(Value::as_i64).unwrap_or_default();
            tracing::warn!("OpenCode did not resume subagent session {child} (error {code}); its output stays hidden");
            tracing::debug!("OpenCode's answer to the resume: {err}");
            self.unreachable.insert(child.clone());
        } else {
            self.known_to_opencode.insert(child.clone());
        }
        self.asks_due(&child);
    }

    fn on_event(&mut self, event: Event, cx: &mut Cx) {
        let event = match event.downcast::<Tick>() {
            Ok(tick) => return self.tick(*tick, cx),
            Err(other) => other,
        };
        match event.downcast::<FromServer>().map(|b| *b) {
            Ok(FromServer::Event(e)) => self.server_event(e, cx),
            Ok(FromServer::Lost) => self.busy.clear(),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::layer::{Exits, Stack};

    const P: &str = "ses_parent";
    const C: &str = "ses_child";

    fn parse(v: Value) -> Frame {
        Frame::from_value(&v)
    }

    fn values(frames: &[Frame]) -> Vec<Value> {
        frames.iter().map(|f| f.value().expect("json")).collect()
    }

    type Log<T> = Arc<Mutex<Vec<T>>>;
    type Ticks = Log<(Tick, Duration)>;
    type Replies = Log<(String, String, String)>;

    /// A stack with the layer, initialized with a session P in /w; the ticks asked for and the answers
    /// given on OpenCode's server are collected.
    fn started() -> (Stack, Ticks, Replies) {
        started_with(Duration::ZERO)
    }

    fn started_with(resume_delay: Duration) -> (Stack, Ticks, Replies) {
        let (ticks, replies): (Ticks, Replies) = Default::default();
        let (t, r) = (ticks.clone(), replies.clone());
        let mut layer = OpenCodeActivity::with_io(
            Box::new(move |tick, after| t.lock().expect("lock").push((tick, after))),
            Box::new(move |d, id, reply| r.lock().expect("lock").push((d.into(), id.into(), reply.into()))),
        );
        layer.resume_delay = resume_delay;
        let mut stack = Stack::new(vec![Box::new(layer)]);
        let mut exits = Exits::default();
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize",
            "params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"coda":{"waits":{}}}}}});
        stack.from_client(parse(init), &mut exits);
        stack.from_agent(parse(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}})), &mut exits);
        assert_eq!(values(&exits.to_client)[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}));
        stack.from_client(
            parse(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}})),
            &mut exits,
        );
        stack.from_agent(parse(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":P}})), &mut exits);
        (stack, ticks, replies)
    }

    fn prompt(stack: &mut Stack, id: u64) {
        let mut exits = Exits::default();
        let p = json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":P,"prompt":[]}});
        stack.from_client(parse(p), &mut exits);
    }

    /// What reaches each side for one agent frame; the frame itself goes on first, untouched.
    fn agent(stack: &mut Stack, v: Value) -> (Vec<Value>, Vec<Value>) {
        let mut exits = Exits::default();
        stack.from_agent(parse(v.clone()), &mut exits);
        let out = values(&exits.to_client);
        assert_eq!(out.first(), Some(&v));
        (out[1..].iter().map(|f| f["params"].clone()).collect(), values(&exits.to_agent))
    }

    /// What reaches each side for an event (a server event or a tick).
    fn event(stack: &mut Stack, e: impl std::any::Any + Send) -> (Vec<Value>, Vec<Value>) {
        let mut exits = Exits::default();
        stack.event(0, Box::new(e), &mut exits);
        (values(&exits.to_client), values(&exits.to_agent))
    }

    fn server(e: ServerEvent) -> FromServer {
        FromServer::Event(e)
    }

    fn client(stack: &mut Stack, v: Value) -> (Vec<Value>, Vec<Value>) {
        let mut exits = Exits::default();
        stack.from_client(parse(v), &mut exits);
        (values(&exits.to_client), values(&exits.to_agent))
    }

    fn update(session: &str, u: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":u}})
    }

    fn task_running(call: &str, background: bool, follow_up: Option<&str>) -> Value {
        let mut input = json!({"background":background,"description":"worker_1 task","prompt":"child work",
            "subagent_type":"general"});
        if let Some(t) = follow_up {
            input["task_id"] = json!(t);
        }
        update(
            P,
            json!({"sessionUpdate":"tool_call_update","toolCallId":call,"status":"in_progress","kind":"think",
            "title":"worker_1 task","rawInput":input}),
        )
    }

    fn task_done(call: &str, background: bool) -> Value {
        let mut meta = json!({"parentSessionId":P,"sessionId":C,"model":{"modelID":"m","providerID":"p"}});
        if background {
            meta["background"] = json!(true);
        }
        update(
            P,
            json!({"sessionUpdate":"tool_call_update","toolCallId":call,"status":"completed","title":"worker_1 task",
            "rawOutput":{"output":"<task …>","metadata":meta}}),
        )
    }

    fn chunk(session: &str) -> Value {
        update(session, json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}))
    }

    fn task_child(call: &str) -> FromServer {
        server(ServerEvent::TaskChild { session: P.into(), call: call.into(), child: C.into() })
    }

    fn status(session: &str, busy: bool) -> FromServer {
        server(ServerEvent::Status { session: session.into(), busy })
    }

    fn asked(id: &str, call: &str) -> FromServer {
        server(ServerEvent::Asked {
            id: id.into(),
            session: C.into(),
            permission: "bash".into(),
            call: Some(call.into()),
            metadata: json!({"command":"echo hi"}),
            directory: "/w".into(),
        })
    }

    /// OpenCode's own forward of a child's request (shape as seen live).
    fn forwarded(id: u64, call: &str) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/request_permission","params":{"sessionId":C,
            "toolCall":{"toolCallId":call,"title":"echo hi","kind":"execute","status":"pending","locations":[],
            "rawInput":{"command":"echo hi"}},"options":ask_options()}})
    }

    fn resumed(stack: &mut Stack, to_agent: &[Value]) {
        let resume = to_agent.iter().find(|f| f["method"] == "session/resume").expect("a session/resume");
        assert_eq!(resume["params"], json!({"sessionId":C,"cwd":"/w","mcpServers":[]}));
        let mut exits = Exits::default();
        stack.from_agent(parse(json!({"jsonrpc":"2.0","id":resume["id"],"result":{"configOptions":[]}})), &mut exits);
        assert!(exits.to_client.is_empty(), "the shim's own resume is not Coda's");
    }

    #[test]
    fn a_foreground_task_is_a_subagent_wait_settled_with_its_child_when_the_call_completes() {
        let (mut stack, _, _) = started();
        prompt(&mut stack, 2);
        let pending = update(
            P,
            json!({"sessionUpdate":"tool_call","toolCallId":"call_91","title":"task","kind":"think","status":"pending","rawInput":{}}),
        );
        assert!(agent(&mut stack, pending).0.is_empty());
        assert_eq!(
            agent(&mut stack, task_running("call_91", false, None)).0,
            vec![json!({"sessionId":P,"waitId":"call_91","state":"waiting","kind":"subagent","title":"worker_1 task",
                "detail":"child work","toolCallId":"call_91"})]
        );
        assert!(agent(&mut stack, task_running("call_91", false, None)).0.is_empty(), "a repeat says nothing");
        let (waits, to_agent) = agent(&mut stack, task_done("call_91", false));
        assert_eq!(waits, vec![json!({"sessionId":P,"waitId":"call_91","state":"done","childSessionId":C})]);
        assert!(to_agent.is_empty(), "a finished child is not followed");
    }

    /// As live: OpenCode's server names the child a moment before the call's running update arrives.
    #[test]
    fn a_child_named_by_opencodes_server_is_announced_with_the_wait_and_resumed_at_once() {
        let (mut stack, _, _) = started();
        prompt(&mut stack, 2);
        assert_eq!(event(&mut stack, task_child("call_26")), (vec![], vec![]), "kept until the call shows");
        let (waits, to_agent) = agent(&mut stack, task_running("call_26", false, None));
        assert_eq!(waits[0]["childSessionId"], C, "in the opening report");
        resumed(&mut stack, &to_agent);
        assert!(agent(&mut stack, task_running("call_26", false, None)).1.is_empty(), "resumed once");
        // From now on OpenCode forwards the child; its request passes untouched.
        assert!(agent(&mut stack, forwarded(0, "call_28")).0.is_empty());
        assert!(event(&mut stack, asked("per_1", "call_28")).0.is_empty());
        let (waits, to_agent) = agent(&mut stack, task_done("call_26", false));
        assert_eq!(waits, vec![json!({"sessionId":P,"waitId":"call_26","state":"done"})], "the child is known");
        assert!(to_agent.is_empty());
    }

    #[test]
    fn a_child_named_after_its_wait_opened_gets_a_waiting_report_then_the_resume() {
        let (mut stack, _, _) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_26", false, None));
        let (to_client, to_agent) = event(&mut stack, task_child("call_26"));
        assert_eq!(to_client.len(), 1);
        assert_eq!(to_client[0]["method"], "_coda/wait");
        assert_eq!(
            to_client[0]["params"],
            json!({"sessionId":P,"waitId":"call_26","state":"waiting","childSessionId":C})
        );
        resumed(&mut stack, &to_agent);
        assert_eq!(event(&mut stack, task_child("call_26")), (vec![], vec![]), "said once");
    }

    #[test]
    fn a_childs_request_opencode_never_forwarded_is_put_to_coda_and_answered_on_the_server() {
        let (mut stack, ticks, replies) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_26", false, None));
        let (_, to_agent) = event(&mut stack, task_child("call_26"));
        // The child asked before the resume took effect: OpenCode dropped it.
        assert_eq!(event(&mut stack, asked("per_1", "call_28")), (vec![], vec![]));
        assert!(ticks.lock().expect("lock").is_empty(), "not due before the child is resumed");
        resumed(&mut stack, &to_agent);
        assert_eq!(*ticks.lock().expect("lock"), vec![(Tick::Asks(1), ASK_GRACE)]);
        let (to_client, _) = event(&mut stack, Tick::Asks(1));
        assert_eq!(
            to_client,
            vec![json!({"jsonrpc":"2.0","id":"coda-opencode-ask-1","method":"session/request_permission",
                "params":{"sessionId":C,"toolCall":{"toolCallId":"call_28","title":"echo hi","kind":"execute",
                "status":"pending","locations":[],"rawInput":{"command":"echo hi"}},"options":ask_options()}})]
        );
        assert!(event(&mut stack, Tick::Asks(1)).0.is_empty(), "asked once");
        let answer = json!({"jsonrpc":"2.0","id":"coda-opencode-ask-1",
            "result":{"outcome":{"outcome":"selected","optionId":"once"}}});
        assert_eq!(client(&mut stack, answer), (vec![], vec![]), "Coda's answer is the shim's");
        assert_eq!(*replies.lock().expect("lock"), vec![("/w".into(), "per_1".into(), "once".into())]);
        // OpenCode's copy turning up after all gets the same answer, not a second question.
        let mut exits = Exits::default();
        stack.from_agent(parse(forwarded(5, "call_28")), &mut exits);
        assert!(exits.to_client.is_empty());
        assert_eq!(values(&exits.to_agent)[0]["result"]["outcome"]["optionId"], "once");
    }

    #[test]
    fn a_request_opencode_forwarded_is_not_asked_again_and_a_rejection_is_passed_as_reject() {
        let (mut stack, _, replies) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_26", false, None));
        let (_, to_agent) = event(&mut stack, task_child("call_26"));
        resumed(&mut stack, &to_agent);
        event(&mut stack, asked("per_1", "call_28"));
        event(&mut stack, asked("per_2", "call_29"));
        agent(&mut stack, forwarded(0, "call_28"));
        assert!(event(&mut stack, Tick::Asks(1)).0.is_empty(), "OpenCode forwarded the first");
        let (to_client, _) = event(&mut stack, Tick::Asks(2));
        assert_eq!(to_client.len(), 1);
        assert_eq!(to_client[0]["params"]["toolCall"]["toolCallId"], "call_29", "only the one not forwarded");
        let cancelled = json!({"jsonrpc":"2.0","id":to_client[0]["id"],"result":{"outcome":{"outcome":"cancelled"}}});
        client(&mut stack, cancelled);
        assert_eq!(*replies.lock().expect("lock"), vec![("/w".into(), "per_2".into(), "reject".into())]);
    }

    /// A foreground child asks (`per_1`, call_28) before OpenCode knows it; the shim's own copy goes to Coda.
    /// Returns the id of that copy.
    fn shims_own_request(stack: &mut Stack) -> Value {
        prompt(stack, 2);
        agent(stack, task_running("call_26", false, None));
        let (_, to_agent) = event(stack, task_child("call_26"));
        event(stack, asked("per_1", "call_28"));
        resumed(stack, &to_agent);
        event(stack, Tick::Asks(1)).0[0]["id"].clone()
    }

    #[test]
    fn opencode_forwarding_while_coda_has_the_shims_copy_gets_codas_answer() {
        let (mut stack, _, replies) = started();
        let own = shims_own_request(&mut stack);
        let mut exits = Exits::default();
        stack.from_agent(parse(forwarded(7, "call_28")), &mut exits);
        assert!(exits.to_client.is_empty(), "held: Coda is already asked");
        let answer = json!({"jsonrpc":"2.0","id":own,"result":{"outcome":{"outcome":"selected","optionId":"always"}}});
        let (_, to_agent) = client(&mut stack, answer);
        assert_eq!(
            to_agent,
            vec![json!({"jsonrpc":"2.0","id":7,"result":{"outcome":{"outcome":"selected","optionId":"always"}}})]
        );
        assert!(replies.lock().expect("lock").is_empty(), "OpenCode answers it itself");
    }

    #[test]
    fn a_request_answered_elsewhere_is_withdrawn_from_coda_and_parents_requests_are_opencodes() {
        let (mut stack, _, _) = started();
        let own = shims_own_request(&mut stack);
        let (to_client, _) = event(&mut stack, server(ServerEvent::Replied { session: C.into(), id: "per_1".into() }));
        assert_eq!(to_client, vec![json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":own}})]);
        let parents = server(ServerEvent::Asked {
            id: "per_9".into(),
            session: P.into(),
            permission: "bash".into(),
            call: None,
            metadata: json!({}),
            directory: "/w".into(),
        });
        event(&mut stack, parents);
        assert!(event(&mut stack, Tick::Asks(9)).0.is_empty(), "a parent's request is OpenCode's to forward");
    }

    #[test]
    fn a_delayed_resume_waits_for_its_tick() {
        let (mut stack, ticks, _) = started_with(Duration::from_millis(3000));
        prompt(&mut stack, 2);
        event(&mut stack, task_child("call_26"));
        let (waits, to_agent) = agent(&mut stack, task_running("call_26", false, None));
        assert_eq!(waits[0]["childSessionId"], C, "announced at once");
        assert!(to_agent.is_empty(), "the resume is held back");
        assert_eq!(*ticks.lock().expect("lock"), vec![(Tick::Resume(1), Duration::from_millis(3000))]);
        let (_, to_agent) = event(&mut stack, Tick::Resume(1));
        resumed(&mut stack, &to_agent);
    }

    #[test]
    fn a_child_that_cannot_be_resumed_has_its_requests_put_to_coda() {
        let (mut stack, ticks, _) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_26", false, None));
        let (_, to_agent) = event(&mut stack, task_child("call_26"));
        let resume = to_agent[0]["id"].clone();
        let mut exits = Exits::default();
        let refused = json!({"jsonrpc":"2.0","id":resume,"error":{"code":-32603,"message":"no"}});
        stack.from_agent(parse(refused), &mut exits);
        event(&mut stack, asked("per_1", "call_28"));
        assert_eq!(ticks.lock().expect("lock").last(), Some(&(Tick::Asks(1), ASK_GRACE)));
        assert_eq!(event(&mut stack, Tick::Asks(1)).0[0]["method"], "session/request_permission");
    }

    #[test]
    fn a_background_task_follows_its_child_and_is_handled_in_opencodes_own_turn() {
        let (mut stack, ticks, _) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_101", true, None));
        let (waits, to_agent) = agent(&mut stack, task_done("call_101", true));
        assert_eq!(waits, vec![json!({"sessionId":P,"waitId":"call_101","state":"waiting","childSessionId":C})]);
        assert_eq!(to_agent[0]["method"], "session/resume");
        assert_eq!(to_agent[0]["params"], json!({"sessionId":C,"cwd":"/w","mcpServers":[]}));
        // The turn's own closing text is in the Coda turn: nothing to handle yet.
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        // The child's output (its session was announced) is not the parent's turn.
        assert!(agent(&mut stack, chunk(C)).0.is_empty());
        assert_eq!(agent(&mut stack, chunk(P)).0, vec![json!({"sessionId":P,"waitId":"call_101","state":"handling"})]);
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
        assert_eq!(*ticks.lock().expect("lock"), vec![(Tick::Quiet(1), QUIET)]);
        // More output came after the first tick was asked for: not quiet yet, ask again.
        assert!(event(&mut stack, Tick::Quiet(1)).0.is_empty());
        assert_eq!(ticks.lock().expect("lock").last(), Some(&(Tick::Quiet(2), QUIET)));
        assert_eq!(
            event(&mut stack, Tick::Quiet(2)).0[0]["params"],
            json!({"sessionId":P,"waitId":"call_101","state":"done"})
        );
    }

    #[test]
    fn opencodes_own_turn_ends_when_its_server_says_the_parent_is_idle() {
        let (mut stack, ticks, _) = started();
        prompt(&mut stack, 2);
        event(&mut stack, server(ServerEvent::TaskChild { session: P.into(), call: "call_1".into(), child: C.into() }));
        agent(&mut stack, task_running("call_1", true, None));
        agent(&mut stack, task_done("call_1", true));
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        event(&mut stack, status(P, false));
        assert!(ticks.lock().expect("lock").is_empty(), "idle with nothing handled arms nothing");
        event(&mut stack, status(C, false));
        event(&mut stack, status(P, true));
        assert_eq!(agent(&mut stack, chunk(P)).0[0]["state"], "handling");
        // A long tool call of OpenCode's own turn: quiet, but still running.
        assert!(event(&mut stack, Tick::Quiet(1)).0.is_empty(), "busy: not over");
        event(&mut stack, status(P, false));
        assert_eq!(ticks.lock().expect("lock").last(), Some(&(Tick::Idle(1), IDLE_GRACE)));
        // A last frame still on its way after the idle.
        agent(&mut stack, chunk(P));
        assert!(event(&mut stack, Tick::Idle(1)).0.is_empty());
        assert_eq!(ticks.lock().expect("lock").last(), Some(&(Tick::Idle(2), IDLE_GRACE)));
        let (to_client, _) = event(&mut stack, Tick::Idle(2));
        assert_eq!(to_client[0]["params"], json!({"sessionId":P,"waitId":"call_1","state":"done"}));
        assert!(event(&mut stack, Tick::Quiet(2)).0.is_empty(), "the quiet fallback finds nothing left");
    }

    /// As live: the server's idle for OpenCode's own turn came before the turn's first frame over ACP.
    /// Coda's prompt 2 runs (the server says the parent is busy) and starts a background task.
    fn background_task_in_codas_turn(stack: &mut Stack) {
        prompt(stack, 2);
        event(stack, status(P, true));
        agent(stack, task_running("call_1", true, None));
        agent(stack, task_done("call_1", true));
    }

    #[test]
    fn an_own_turn_the_server_already_saw_end_is_settled_after_the_grace() {
        let (mut stack, ticks, _) = started();
        background_task_in_codas_turn(&mut stack);
        event(&mut stack, status(P, false));
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        event(&mut stack, status(C, false));
        event(&mut stack, status(P, true));
        event(&mut stack, status(P, false));
        assert_eq!(agent(&mut stack, chunk(P)).0[0]["state"], "handling");
        assert_eq!(
            *ticks.lock().expect("lock"),
            vec![(Tick::Quiet(1), QUIET), (Tick::Idle(1), IDLE_GRACE)],
            "idle already: only the grace for trailing frames"
        );
        assert_eq!(event(&mut stack, Tick::Idle(1)).0[0]["params"]["state"], "done");
    }

    #[test]
    fn the_idle_that_ends_codas_own_turn_does_not_end_a_wait_handled_after_it() {
        let (mut stack, ticks, _) = started();
        background_task_in_codas_turn(&mut stack);
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        event(&mut stack, status(P, false));
        // OpenCode's own turn streams before the server's word that it started.
        assert_eq!(agent(&mut stack, chunk(P)).0[0]["state"], "handling");
        assert_eq!(*ticks.lock().expect("lock"), vec![(Tick::Quiet(1), QUIET)], "no idle grace: not its idle");
        assert!(event(&mut stack, Tick::Idle(1)).0.is_empty());
        event(&mut stack, status(P, true));
        event(&mut stack, status(P, false));
        assert_eq!(ticks.lock().expect("lock").last(), Some(&(Tick::Idle(1), IDLE_GRACE)));
        assert_eq!(event(&mut stack, Tick::Idle(1)).0[0]["params"]["state"], "done");
    }

    /// As live (a follow-up that ended during Coda's turn): OpenCode ran its own turn on the result between
    /// the idle that ended Coda's run and the `session/prompt` answer.
    #[test]
    fn an_own_run_before_codas_answer_counts_as_opencodes_own_turn() {
        let (mut stack, ticks, _) = started();
        background_task_in_codas_turn(&mut stack);
        event(&mut stack, status(P, false));
        event(&mut stack, status(C, false));
        event(&mut stack, status(P, true));
        event(&mut stack, status(P, false));
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        assert_eq!(agent(&mut stack, chunk(P)).0[0]["state"], "handling");
        assert_eq!(ticks.lock().expect("lock").last(), Some(&(Tick::Idle(1), IDLE_GRACE)));
        assert_eq!(event(&mut stack, Tick::Idle(1)).0[0]["params"]["state"], "done");
    }

    #[test]
    fn the_wait_whose_child_finished_first_is_the_one_handled() {
        let (mut stack, _, _) = started();
        prompt(&mut stack, 2);
        for (call, child) in [("call_1", "ses_a"), ("call_2", "ses_b")] {
            event(
                &mut stack,
                server(ServerEvent::TaskChild { session: P.into(), call: call.into(), child: child.into() }),
            );
            agent(&mut stack, task_running(call, true, None));
        }
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        event(&mut stack, status("ses_b", false));
        assert_eq!(agent(&mut stack, chunk(P)).0[0], json!({"sessionId":P,"waitId":"call_2","state":"handling"}));
    }

    #[test]
    fn server_events_are_logged_for_replays_in_the_order_handled() {
        let dir = std::env::temp_dir().join(format!("coda-opencode-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("files.jsonl");
        let mut layer = OpenCodeActivity::with_io(Box::new(|_, _| {}), Box::new(|_, _, _| {}));
        layer.record = Some((std::fs::File::create(&log).expect("log"), "/t/coda-opencode-events.jsonl".into()));
        let mut stack = Stack::new(vec![Box::new(layer)]);
        event(&mut stack, status(P, true));
        event(&mut stack, task_child("call_1"));
        let text = std::fs::read_to_string(&log).expect("read");
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["op"], "append");
        assert_eq!(lines[0]["path"], "/t/coda-opencode-events.jsonl");
        assert_eq!(lines[0]["data"], "{\"type\":\"session.status\",\"session\":\"ses_parent\",\"busy\":true}\n");
        assert!(humantime::parse_rfc3339_weak(lines[1]["ts"].as_str().expect("ts")).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_coda_turn_or_a_cancel_ends_the_handling() {
        let (mut stack, _, _) = started();
        for (n, end) in ["prompt", "cancel"].into_iter().enumerate() {
            let call = format!("call_{n}");
            prompt(&mut stack, 10 + n as u64);
            agent(&mut stack, task_running(&call, true, None));
            agent(&mut stack, task_done(&call, true));
            agent(&mut stack, json!({"jsonrpc":"2.0","id":10 + n as u64,"result":{"stopReason":"end_turn"}}));
            assert_eq!(agent(&mut stack, chunk(P)).0[0]["state"], "handling");
            let mut exits = Exits::default();
            let frame = if end == "prompt" {
                json!({"jsonrpc":"2.0","id":20,"method":"session/prompt","params":{"sessionId":P,"prompt":[]}})
            } else {
                json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":P}})
            };
            stack.from_client(parse(frame), &mut exits);
            assert_eq!(values(&exits.to_client)[0]["params"]["state"], "done", "{end}");
            assert_eq!(exits.to_agent.len(), 1, "the client's frame goes on");
            agent(&mut stack, json!({"jsonrpc":"2.0","id":20,"result":{"stopReason":"end_turn"}}));
        }
    }

    #[test]
    fn a_follow_up_names_its_child_from_the_start() {
        let (mut stack, _, _) = started();
        prompt(&mut stack, 2);
        let (waits, to_agent) = agent(&mut stack, task_running("call_123", true, Some(C)));
        assert_eq!(waits[0]["childSessionId"], C);
        assert_eq!(waits[0]["waitId"], "call_123");
        assert_eq!(to_agent[0]["method"], "session/resume", "a child of an earlier process is followed too");
    }

    #[test]
    fn a_failed_task_fails_and_output_without_background_work_is_not_handling() {
        let (mut stack, _, _) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_1", false, None));
        let failed = update(P, json!({"sessionUpdate":"tool_call_update","toolCallId":"call_1","status":"failed"}));
        assert_eq!(agent(&mut stack, failed).0, vec![json!({"sessionId":P,"waitId":"call_1","state":"failed"})]);
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
    }

    #[test]
    fn task_calls_replayed_by_a_load_are_history() {
        let (mut stack, _, _) = started();
        let mut exits = Exits::default();
        let load =
            json!({"jsonrpc":"2.0","id":7,"method":"session/load","params":{"sessionId":P,"cwd":"/w","mcpServers":[]}});
        stack.from_client(parse(load), &mut exits);
        assert!(agent(&mut stack, task_running("call_1", true, None)).0.is_empty());
        let (waits, to_agent) = agent(&mut stack, task_done("call_1", true));
        assert!(waits.is_empty() && to_agent.is_empty(), "no wait, no resume of an old child");
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
        agent(&mut stack, json!({"jsonrpc":"2.0","id":7,"result":{}}));
        assert!(agent(&mut stack, chunk(P)).0.is_empty(), "nothing was registered to handle");
    }

    #[test]
    fn stop_is_refused_and_no_waits_without_the_capability() {
        let (mut stack, _, _) = started();
        let (to_client, to_agent) = client(
            &mut stack,
            json!({"jsonrpc":"2.0","id":3,"method":"_coda/wait/stop","params":{"sessionId":P,"waitId":"x"}}),
        );
        assert_eq!(to_client[0]["error"]["code"], -32602);
        assert!(to_agent.is_empty());

        let layer = OpenCodeActivity::with_io(Box::new(|_, _| {}), Box::new(|_, _, _| {}));
        let mut stack = Stack::new(vec![Box::new(layer)]);
        client(&mut stack, json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"clientCapabilities":{}}}));
        assert!(agent(&mut stack, task_running("call_1", false, None)).0.is_empty());
    }
}

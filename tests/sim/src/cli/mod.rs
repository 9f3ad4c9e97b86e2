//! The model of a CLI: what it answers to each frame the shim hands it, and when (virtual ms), from the scripts
//! the plan's Coda steps carry; its own turns, background work, restarts and death. It keeps what happened at
//! the CLI ([`Truth`]) for the checks, which cannot see inside the shim.
//!
//! Each model is built from its CLI's recordings (`fixtures/<agent>/`, shapes in `shapes.rs`, background work in
//! `work.rs`) and reference notes: a turn streams chunks (each text carries a marker `«n»`, so the checks can
//! follow it to Coda), may ask for permission and wait for the answer, may leave a background command or a
//! subagent running, and ends as its script says (answer, failure after the CLI's own retries, never, twice);
//! `session/cancel` ends the running turn `cancelled`; compaction is Codex's and Kimi's `/compact` prompt (Kimi's
//! runs in the background after answering), Grok's `_x.ai/compact_conversation`, OpenCode's `POST
//! /session/{id}/summarize` (`server.rs`); steering is Codex's `_session/steering`, Grok's `_x.ai/interject`,
//! OpenCode's `POST /session/{id}/message`. What the CLI keeps on disk (its sessions, their subagents) outlives
//! its process ([`Model::restart`]).

mod kimi;
pub mod shapes;
mod work;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde_json::{Value, json};

use crate::plan::{CompactOutcome, End, Failure, SteerAnswer, Turn, Work};
pub use shapes::Flavor;
use shapes::{error, notification, result, update};

/// What happened at the CLI: the checks' source of truth about the side the shim hides.
#[derive(Default, Debug)]
pub struct Truth {
    /// Coda's prompts (by marker) that reached the CLI, with the first time (ms).
    pub prompts: HashMap<u32, u64>,
    /// How many `session/cancel`s of each session reached the CLI.
    pub cancels: HashMap<String, u32>,
    /// For each of Coda's prompts (by marker) that reached the CLI: how many `session/cancel`s of its session the
    /// CLI had got before it.
    pub cancels_before: HashMap<u32, u32>,
    /// Requests that reached the CLI (id as JSON text), with their method.
    pub requests: HashMap<String, String>,
    /// Requests of this process the CLI has not answered (id as JSON text), with their method.
    pub owed: HashMap<String, String>,
    /// Ids of requests the CLI answered.
    pub answered: Vec<String>,
    /// Chunks the CLI wrote, in order: (marker, session as Coda knows it, whether Coda must get it, process, time).
    pub chunks: Vec<(u64, String, bool, u32, u64)>,
    /// The failure each of Coda's prompts (by id) ended with.
    pub failures: HashMap<String, Failure>,
    /// Broken rules the CLI saw: (rule, detail).
    pub broken: Vec<(&'static str, String)>,
    /// Answers to the CLI's permission requests (by id), counted.
    pub permission_answers: HashMap<String, u32>,
    /// Sessions the CLI runs for subagents (every id it gives them).
    pub children: HashSet<String>,
    /// Background work (a command, a subagent's run), by the id its `_coda/wait` carries.
    pub work: BTreeMap<String, WorkTruth>,
    /// Coda's prompts (by id) the CLI goes on retrying for over a minute, with the time its first retry showed.
    pub retrying: HashMap<String, u64>,
    /// The longest wait before a retry the CLI scheduled (and said so) for a prompt, by id: what a `retryAfterMs`
    /// may name (执行失败: the wait the upstream asked for or the agent really scheduled).
    pub scheduled_waits: HashMap<String, u64>,
}

/// A piece of background work at the CLI.
#[derive(Debug, Clone)]
pub struct WorkTruth {
    /// The session Coda files it under.
    pub session: String,
    /// How it ended, in Coda's words (`done`, `failed`, `cancelled`), or `None` while it runs.
    pub ended: Option<&'static str>,
    /// The process it ran in (a restart ends what was running).
    pub process: u32,
    /// How it ends once the CLI's turn on its result ends (Grok's wake turn).
    pub will_end: Option<&'static str>,
    /// When the CLI announced it (ms).
    pub started: u64,
}

/// A turn the CLI runs in a session.
#[derive(Debug)]
struct Run {
    id: Option<Value>,
    no: u64,
    kind: Kind,
    /// The rest of a Coda turn that waits for a permission answer: (permission id, chunks, ms, end, work).
    waiting: Option<(String, u8, u32, End, Work)>,
    /// A hung turn: it ignores Stop too.
    never: bool,
    /// Codex: the answer, held until the turn's subagents end; the turn itself is over (Stop does nothing).
    held: Option<Vec<String>>,
    /// Codex: this turn's subagents still running.
    children: Vec<String>,
    /// The turn retries its upstream failure: Stop ends it `cancelled`.
    retrying: bool,
    /// Grok's turn on the result of this work (by its wait id): the work is over for Coda when it ends.
    wake: Option<String>,
    /// Kimi: the turn's start is in its wire: work ending now ends inside it for the shim too.
    wire_started: bool,
    /// Kimi: the turn's end is in its wire (its answer may not be out yet): work ending now is no longer
    /// part of it, and Kimi takes its result in a turn of its own.
    wire_ended: bool,
    /// Kimi: work whose result was injected into this turn while the shim could not yet tell it from work
    /// ending outside a turn (a turn of Kimi's own, or a client turn whose start was not in the wire): it is
    /// over for Coda once this turn's end is in the wire.
    injected: Vec<String>,
    /// Kimi: results to inject right after the turn's start is written.
    to_inject: Vec<Value>,
    /// Grok: the prompt id its queue names the turn by (`runningPromptId`).
    prompt: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// Coda's prompt.
    Coda,
    /// The shim's `/compact`.
    Compact,
    /// A turn of the CLI's own.
    Own,
}

#[derive(Debug)]
enum Effect {
    /// The turn `no` of the session ends (its answer, if any, is this line).
    TurnEnded(String, u64),
    /// Kimi's background compaction of the session ended.
    CompactEnded(String),
    /// A background command or a subagent's run ended (by its wait id).
    WorkEnded(String),
    /// Codex gives up waiting for the subagents of turn `no` of the session (ten minutes).
    ChildrenTimeout(String, u64),
    /// Codex: the content of turn `no` of the session is over; its answers go out now, or once the turn's
    /// subagents end (codex-acp holds the answer for them).
    ContentEnded(String, u64, Vec<String>),
    /// Grok's turn on the result of a work item (its wait id) completed: the item is over for Coda.
    WakeDone(String),
    /// The first retry of Coda's prompt (its id) that the CLI goes on retrying past a minute shows now.
    RetryShown(String),
    /// The CLI answered the request that opened (or loaded) this session: it may work in it on its own now.
    SessionReady(String),
    /// Kimi wrote the start of turn `no` of the session to its wire.
    WireTurnStarted(String, u64),
    /// Kimi wrote the end of turn `no` of the session to its wire.
    WireTurnEnded(String, u64),
}

struct Out {
    line: String,
    /// A write of the CLI's session files instead of a line.
    file: Option<FileOp>,
    turn: Option<(String, u64)>,
    effect: Option<Effect>,
}

/// A write of one of the CLI's session files (Kimi's wire, a task file).
#[derive(Debug, Clone)]
pub struct FileOp {
    pub path: std::path::PathBuf,
    pub bytes: Vec<u8>,
    /// A whole new content (an atomic replace), else an append.
    pub replace: bool,
}

/// What the CLI does next: a line on its stdout, or a write of its session files.
#[derive(Debug)]
pub enum Output {
    Line(String),
    File(FileOp),
}

/// What a queued turn is.
#[derive(Debug)]
enum Queued {
    /// A prompt (Coda's, or the shim's `/compact`), with the turn number Grok's queue gave it.
    Prompt(Value, String, Kind, Option<u64>),
    /// Grok's turn of its own on a background result (`task-completed-<id>`).
    Wake(String),
}

pub struct Model {
    pub flavor: Flavor,
    pub truth: Truth,
    pub dead: bool,
    /// The time (ms) of the latest input, for what OpenCode's server is asked.
    pub now: u64,
    /// Processes started so far (1 for the first).
    pub process: u32,
    /// Codex: the client declared AIR's `asyncTasks` and `nativeSubagentSessions` (else codex-acp reports its
    /// background commands and subagents as plain tool calls, which the model leaves out).
    air: bool,
    /// Kimi: its data folder (`KIMI_CODE_HOME`), where the model writes its session files.
    kimi_root: Option<std::path::PathBuf>,
    out: BTreeMap<(u64, u64), Out>,
    /// What writing the entry being written writes right after it, before anything else due.
    after: VecDeque<Out>,
    seq: u64,
    /// The CLI's sessions, on disk.
    sessions: Vec<String>,
    /// Sessions whose `session/new` (or load) this process answered.
    ready: HashSet<String>,
    /// Subagent runs, on disk: their history and how each ended.
    subagents: Vec<work::Sub>,
    /// Background commands of this process.
    tasks: HashMap<String, work::Task>,
    running: HashMap<String, Run>,
    queued: HashMap<String, VecDeque<Queued>>,
    compacting: HashMap<String, u64>,
    turns: u64,
    chunk_no: u64,
    chunk_must: HashMap<u64, (String, bool)>,
    permission_no: u64,
    /// Ids handed out for commands and subagents.
    ids: u64,
    prompt_scripts: HashMap<u32, Turn>,
    steer_scripts: HashMap<u32, SteerAnswer>,
    compact_scripts: HashMap<String, VecDeque<CompactOutcome>>,
}

/// The marker `⟦p<n>⟧` the Coda player puts in each prompt and steering text.
pub fn marker_of(text: &str) -> Option<u32> {
    let start = text.find('⟦')? + '⟦'.len_utf8();
    let rest = text[start..].strip_prefix('p')?;
    rest[..rest.find('⟧')?].parse().ok()
}

fn text_of(params: &Value) -> String {
    let blocks = params.get("prompt").and_then(Value::as_array).cloned().unwrap_or_default();
    blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
}

/// What the CLI does for a prompt no step scripted (a hostile client's).
const PLAIN_TURN: Turn = Turn { chunks: 1, ms: 50, permission: false, end: End::EndTurn, work: Work::NoWork };

impl Model {
    pub fn new(flavor: Flavor) -> Model {
        Model {
            flavor,
            truth: Truth::default(),
            dead: false,
            now: 0,
            process: 1,
            air: false,
            kimi_root: None,
            out: BTreeMap::new(),
            after: VecDeque::new(),
            seq: 0,
            sessions: Vec::new(),
            ready: HashSet::new(),
            subagents: Vec::new(),
            tasks: HashMap::new(),
            running: HashMap::new(),
            queued: HashMap::new(),
            compacting: HashMap::new(),
            turns: 0,
            chunk_no: 0,
            chunk_must: HashMap::new(),
            permission_no: 0,
            ids: 0,
            prompt_scripts: HashMap::new(),
            steer_scripts: HashMap::new(),
            compact_scripts: HashMap::new(),
        }
    }

    /// Kimi's data folder: the model writes its session files there.
    pub fn set_kimi_root(&mut self, root: std::path::PathBuf) {
        self.kimi_root = Some(root);
    }

    pub fn expect_prompt(&mut self, marker: u32, turn: Turn) {
        self.prompt_scripts.insert(marker, turn);
    }

    pub fn expect_steer(&mut self, marker: u32, answer: SteerAnswer) {
        self.steer_scripts.insert(marker, answer);
    }

    pub fn expect_compact(&mut self, session: &str, how: CompactOutcome) {
        self.compact_scripts.entry(session.to_owned()).or_default().push_back(how);
    }

    /// When the next line is due.
    pub fn next_due(&self) -> Option<u64> {
        if self.dead { None } else { self.out.keys().next().map(|(at, _)| *at) }
    }

    fn at(&mut self, at: u64, v: Value, turn: Option<(String, u64)>, effect: Option<Effect>) {
        self.seq += 1;
        self.out.insert((at, self.seq), Out { line: v.to_string(), file: None, turn, effect });
    }

    /// A write of a session file at `at`.
    fn file_at(&mut self, at: u64, op: FileOp, turn: Option<(String, u64)>, effect: Option<Effect>) {
        self.seq += 1;
        self.out.insert((at, self.seq), Out { line: String::new(), file: Some(op), turn, effect });
    }

    /// An effect at `at`, with no line.
    fn effect_at(&mut self, at: u64, effect: Effect) {
        self.effect_in(at, effect, None);
    }

    /// An effect at `at`, with no line, of a turn (dropped when the turn is stopped).
    fn effect_in(&mut self, at: u64, effect: Effect, turn: Option<(String, u64)>) {
        self.seq += 1;
        self.out.insert((at, self.seq), Out { line: String::new(), file: None, turn, effect: Some(effect) });
    }

    /// The lines and file writes due by `now`, in order, with what writing them does.
    pub fn take_due(&mut self, now: u64) -> Vec<Output> {
        self.now = now;
        let mut lines = Vec::new();
        while !self.dead {
            let out = match self.after.pop_front() {
                Some(out) => out,
                None => match self.out.first_entry() {
                    Some(entry) if entry.key().0 <= now => entry.remove(),
                    _ => break,
                },
            };
            if let Some(op) = &out.file {
                self.file_chunks(op, now);
            }
            if let Ok(v) = serde_json::from_str::<Value>(&out.line) {
                if v.get("method").is_none()
                    && let Some(id) = v.get("id")
                {
                    self.truth.answered.push(id.to_string());
                    self.truth.owed.remove(&id.to_string());
                }
                if let Some(n) = v.pointer("/params/update/content/text").and_then(Value::as_str).and_then(chunk_marker)
                    && let Some((session, must)) = self.chunk_must.remove(&n)
                {
                    self.truth.chunks.push((n, session, must, self.process, now));
                }
            }
            match out.effect {
                Some(Effect::TurnEnded(session, no)) => self.turn_ended(&session, no, now),
                Some(Effect::CompactEnded(session)) => {
                    self.compacting.remove(&session);
                }
                Some(Effect::WorkEnded(id)) => self.work_ended(&id, now),
                Some(Effect::ChildrenTimeout(session, no)) => self.children_timeout(&session, no, now),
                Some(Effect::ContentEnded(session, no, answers)) => self.content_ended(&session, no, answers, now),
                Some(Effect::SessionReady(s)) => {
                    self.ready.insert(s);
                }
                Some(Effect::WireTurnStarted(session, no)) => {
                    if let Some(r) = self.running.get_mut(&session).filter(|r| r.no == no) {
                        r.wire_started = true;
                        let results = std::mem::take(&mut r.to_inject);
                        if !results.is_empty() {
                            self.wire_next(&session, results);
                        }
                    }
                }
                Some(Effect::WireTurnEnded(session, no)) => {
                    // What the turn handled (the result it woke on, results injected into it) is over.
                    let (mut settled, mut unheard) = (Vec::new(), Vec::new());
                    if let Some(r) = self.running.get_mut(&session).filter(|r| r.no == no) {
                        r.wire_ended = true;
                        settled = std::mem::take(&mut r.injected);
                        settled.extend(r.wake.clone());
                        if !r.wire_started {
                            // Stopped before its start was written: no turn took the results; Kimi wakes on them.
                            unheard = std::mem::take(&mut settled);
                        }
                    }
                    for id in unheard {
                        self.wake(&session, &format!("task-completed-{id}"), now);
                    }
                    for id in settled {
                        if let Some(w) = self.truth.work.get_mut(&id) {
                            w.ended = w.will_end.take().or(w.ended);
                        }
                    }
                }
                Some(Effect::RetryShown(id)) => {
                    self.truth.retrying.entry(id).or_insert(now);
                }
                Some(Effect::WakeDone(id)) => {
                    if let Some(w) = self.truth.work.get_mut(&id) {
                        w.ended = w.will_end.take().or(w.ended);
                    }
                }
                None => {}
            }
            if let Some(op) = out.file {
                lines.push(Output::File(op));
            } else if !out.line.is_empty() {
                lines.push(Output::Line(out.line));
            }
        }
        lines
    }

    fn turn_ended(&mut self, session: &str, no: u64, now: u64) {
        if self.running.get(session).is_some_and(|r| r.no == no) {
            self.running.remove(session);
            self.next_queued(session, now);
        }
    }

    /// Starts what waits for the session to be free.
    fn next_queued(&mut self, session: &str, now: u64) {
        if self.running.contains_key(session) {
            return;
        }
        match self.queued.get_mut(session).and_then(VecDeque::pop_front) {
            Some(Queued::Prompt(id, text, kind, no)) => self.start(session, Some(id), &text, kind, no, now),
            Some(Queued::Wake(prompt)) => self.own_turn_in(session, 1, now, &prompt),
            None => {}
        }
    }

    /// The CLI dies: nothing more is written.
    pub fn die(&mut self) {
        self.dead = true;
        self.out.clear();
        self.after.clear();
    }

    /// The process ended (its output closed, or it died) and a new one starts over the same disk: what ran ends
    /// with it, the sessions and subagent records stay.
    pub fn restart(&mut self) {
        self.dead = false;
        self.process += 1;
        self.out.clear();
        self.after.clear();
        self.running.clear();
        self.queued.clear();
        self.compacting.clear();
        self.tasks.clear();
        self.ready.clear();
        self.air = false;
        self.truth.owed.clear();
        self.chunk_must.clear();
        for s in &mut self.subagents {
            s.running = false;
        }
    }

    /// A line the shim wrote to the CLI, at `now`.
    pub fn on_line(&mut self, line: &str, now: u64) {
        self.now = now;
        if self.dead {
            return;
        }
        // Read as the shim reads: a lone surrogate escape as U+FFFD.
        let mended = coda_shim::json::mend_surrogates(line.as_bytes());
        let Ok(v) = coda_shim::json::from_slice::<Value>(&mended) else { return };
        let (Some(method), id) = (v.get("method").and_then(Value::as_str), v.get("id").cloned()) else {
            if let Some(id) = v.get("id") {
                self.permission_answered(&id.to_string(), now);
            }
            return;
        };
        let params = v.get("params").cloned().unwrap_or(Value::Null);
        let session = params.get("sessionId").and_then(Value::as_str).unwrap_or("").to_owned();
        if method == "session/cancel" {
            *self.truth.cancels.entry(session.clone()).or_default() += 1;
        }
        if let Some(id) = &id {
            let key = id.to_string();
            if let Some(open) = self.truth.owed.get(&key) {
                let detail = format!("a {method} {key} reached the CLI while its {open} {key} was unanswered");
                self.truth.broken.push(("id-in-use", detail));
            }
            self.truth.owed.insert(key.clone(), method.to_owned());
            self.truth.requests.insert(key, method.to_owned());
        }
        let soon = now + 3;
        match (method, id) {
            ("initialize", Some(id)) => {
                let air = params.pointer("/clientCapabilities/_meta/jetbrains/air/capabilities");
                let has = |name: &str| air.and_then(Value::as_array).is_some_and(|a| a.iter().any(|c| c == name));
                self.air = has("asyncTasks") && has("nativeSubagentSessions");
                self.at(now + 40, result(&id, self.flavor.init_result()), None, None)
            }
            ("session/new", Some(id)) => {
                self.ids += 1;
                let s = self.flavor.session_id(self.sessions.len() as u32 + 1);
                self.sessions.push(s.clone());
                if self.flavor == Flavor::Kimi {
                    self.kimi_create(&s, now);
                }
                for n in self.flavor.before_session(&s) {
                    self.at(soon, n, None, None);
                }
                let ready = Some(Effect::SessionReady(s.clone()));
                self.at(now + 60, result(&id, self.flavor.session_result(&s, false)), None, ready);
                for n in self.flavor.after_session(&s) {
                    self.at(now + 61, n, None, None);
                }
            }
            ("session/load", Some(id)) => self.load(id, &session, now),
            ("session/prompt", Some(id)) => self.prompt(id, &session, &params, now),
            ("session/cancel", None) => self.cancel(&session, now),
            ("_session/steering", Some(id)) if self.flavor == Flavor::Codex => {
                let text = text_of(&params);
                self.steering(&session, &text, Some(id), now)
            }
            ("_x.ai/interject", Some(id)) if self.flavor == Flavor::Grok => {
                let text = params.get("text").and_then(Value::as_str).unwrap_or("").to_owned();
                self.steering(&session, &text, Some(id), now)
            }
            ("_x.ai/compact_conversation", Some(id)) if self.flavor == Flavor::Grok => {
                if !self.sessions.contains(&session) {
                    return; // Grok does not answer for a session it does not have.
                }
                match self.compact_script(&session) {
                    CompactOutcome::CompactOk(ms) => {
                        let done = json!({"sessionUpdate": "auto_compact_completed", "tokens_before": 15,
                            "tokens_after": 8, "summary_preview": null});
                        let n =
                            notification("_x.ai/session_notification", json!({"sessionId": session, "update": done}));
                        self.at(now + ms as u64, n, None, None);
                        self.at(now + ms as u64 + 1, result(&id, json!({})), None, None);
                    }
                    CompactOutcome::CompactFail(ms) => {
                        let e = json!({"code": -32603, "message": "compaction failed",
                            "data": {"kind": "compact_failed", "message": "the summary was too short"}});
                        self.at(now + ms as u64, error(&id, e), None, None);
                    }
                    CompactOutcome::CompactNever => {}
                }
            }
            ("_session/async_task/stop", Some(id)) if self.flavor == Flavor::Codex => {
                let task = params.get("asyncTaskId").and_then(Value::as_str).unwrap_or("").to_owned();
                self.stop_task(&task, id, now)
            }
            ("_x.ai/task/kill", Some(id)) if self.flavor == Flavor::Grok => {
                let task = params.get("taskId").and_then(Value::as_str).unwrap_or("").to_owned();
                self.stop_task(&task, id, now)
            }
            ("_x.ai/subagent/cancel", Some(id)) if self.flavor == Flavor::Grok => {
                let sub = params.get("subagentId").and_then(Value::as_str).unwrap_or("").to_owned();
                self.cancel_subagent(&sub, id, now)
            }
            (m, Some(id)) if m.starts_with("session/set_") => self.at(soon, result(&id, json!({})), None, None),
            (m, Some(id)) => {
                let e = json!({"code": -32601, "message": format!("Method not found: {m}")});
                self.at(soon, error(&id, e), None, None)
            }
            _ => {}
        }
    }

    /// `session/load`: the history is replayed before the answer (Coda does not take it; Codex replays its
    /// subagents' runs and how they ended, a run that never ended as `disconnected`).
    fn load(&mut self, id: Value, session: &str, now: u64) {
        if !self.sessions.iter().any(|s| s == session) {
            let e = json!({"code": -32602, "message": format!("Session not found: {session}")});
            return self.at(now + 2, error(&id, e), None, None);
        }
        let old = json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "earlier"}});
        self.at(now + 3, update(session, old), None, None);
        if self.flavor == Flavor::Codex {
            for line in self.replay_subagents(session) {
                self.at(now + 4, line, None, None);
            }
        }
        let ready = Some(Effect::SessionReady(session.to_owned()));
        self.at(now + 50, result(&id, self.flavor.session_result(session, true)), None, ready);
    }

    fn compact_script(&mut self, session: &str) -> CompactOutcome {
        let next = self.compact_scripts.get_mut(session).and_then(VecDeque::pop_front);
        next.unwrap_or(CompactOutcome::CompactOk(100))
    }

    fn prompt(&mut self, id: Value, session: &str, params: &Value, now: u64) {
        let text = text_of(params);
        if !self.sessions.iter().any(|s| s == session) {
            let e = json!({"code": -32602, "message": format!("Session not found: {session}")});
            return self.at(now + 2, error(&id, e), None, None);
        }
        let compact = text.trim() == "/compact" && self.flavor.compacts_by_prompt();
        if let Some(m) = marker_of(&text) {
            self.truth.prompts.entry(m).or_insert(now);
            let cancels = self.truth.cancels.get(session).copied().unwrap_or(0);
            self.truth.cancels_before.entry(m).or_insert(cancels);
        }
        if compact && self.flavor == Flavor::Kimi {
            return self.kimi_compact(id, session, now);
        }
        if self.flavor == Flavor::Kimi && text.starts_with('/') {
            // Kimi runs a slash command itself, with no turn: a builtin's output, or for a name it does not know
            // `Unknown ACP command` (reference kimi.md; a skill's would be a turn, which no Coda text names).
            let name = text[1..].split_whitespace().next().unwrap_or("");
            let said = format!("Unknown ACP command: /{name}. Use /help to see available commands.");
            self.at(now + 2, update(session, text_update(&said)), None, None);
            let r = self.flavor.turn_result(session, 0, "end_turn");
            return self.at(now + 3, result(&id, r), None, None);
        }
        if self.flavor == Flavor::Kimi && self.compacting.contains_key(session) {
            // Kimi answers a prompt sent while it compacts at once, empty, and runs it unreported later.
            let r = self.flavor.turn_result(session, 0, "end_turn");
            return self.at(now + 2, result(&id, r), None, None);
        }
        let kind = if compact { Kind::Compact } else { Kind::Coda };
        if self.flavor == Flavor::Kimi && self.running.contains_key(session) {
            // Kimi refuses a prompt while a turn runs (reference kimi.md): it queues none.
            let busy = error(&id, json!({"code": -32600, "message": "turn.agent_busy"}));
            return self.at(now + 2, busy, None, None);
        }
        // Grok queues every prompt first (fixtures/grok: `_x.ai/queue/changed` lists it under `entries` with the
        // id it then runs under, behind whatever runs in the session: reference lifecycle.md, a prompt sent during
        // a turn is queued as its own later turn).
        let queued = (self.flavor == Flavor::Grok).then(|| {
            self.turns += 1;
            self.turns
        });
        if let Some(no) = queued {
            let mut q = json!({"sessionId": session, "entries": [{"id": format!("prompt-{no}"), "version": 0,
                "kind": "prompt", "text": text, "position": 0}]});
            if let Some(run) = self.running.get(session) {
                q["runningPromptId"] = json!(run.prompt);
                q["runningKind"] = json!("prompt");
            }
            self.at(now + 1, notification("_x.ai/queue/changed", q), None, None);
        }
        if self.running.contains_key(session) {
            self.queued.entry(session.to_owned()).or_default().push_back(Queued::Prompt(id, text, kind, queued));
            return;
        }
        self.start(session, Some(id), &text, kind, queued, now);
    }

    /// Starts a turn in `session` (none runs there); `queued`: the turn number Grok's queue gave the prompt.
    fn start(&mut self, session: &str, id: Option<Value>, text: &str, kind: Kind, queued: Option<u64>, now: u64) {
        let no = queued.unwrap_or_else(|| {
            self.turns += 1;
            self.turns
        });
        let tag = Some((session.to_owned(), no));
        for n in self.flavor.turn_start(session, &format!("prompt-{no}"), text) {
            self.at(now + 1, n, tag.clone(), None);
        }
        if self.flavor == Flavor::Kimi {
            let prompt = kimi::turn_prompt(no, text, json!({"kind": "user"}));
            let started = Some(Effect::WireTurnStarted(session.to_owned(), no));
            self.wire_with(session, now + 1, vec![prompt], tag.clone(), started);
        }
        let run = Run {
            id: id.clone(),
            no,
            kind: kind.clone(),
            waiting: None,
            never: false,
            held: None,
            children: Vec::new(),
            retrying: false,
            wake: None,
            wire_started: false,
            wire_ended: false,
            injected: Vec::new(),
            to_inject: Vec::new(),
            prompt: format!("prompt-{no}"),
        };
        self.running.insert(session.to_owned(), run);
        match kind {
            Kind::Coda => {
                let script = marker_of(text).and_then(|m| self.prompt_scripts.remove(&m));
                let turn = script.unwrap_or(PLAIN_TURN);
                if let Some(r) = self.running.get_mut(session) {
                    r.never = turn.end == End::EndNever;
                }
                if turn.permission {
                    let before = turn.chunks / 2;
                    let half = turn.ms / 2;
                    self.content(session, session, no, now, half, before, true);
                    self.permission_no += 1;
                    let pid = json!(self.permission_no);
                    let ask = json!({"jsonrpc": "2.0", "id": pid, "method": "session/request_permission", "params": {
                        "sessionId": session, "toolCall": {"toolCallId": format!("call_{no}"), "title": "touch made.txt"},
                        "options": [{"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
                            {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"}]}});
                    self.at(now + half as u64 + 1, ask, tag, None);
                    let rest = (pid.to_string(), turn.chunks - before, turn.ms - half, turn.end, turn.work);
                    if let Some(r) = self.running.get_mut(session) {
                        r.waiting = Some(rest);
                    }
                } else {
                    let end = self.content(session, session, no, now, turn.ms, turn.chunks, true);
                    self.begin_work(session, no, now, end, &turn.work);
                    self.finish(session, no, id, end, turn.end);
                }
            }
            Kind::Compact => {
                let how = self.compact_script(session);
                let progress = |status: &str| {
                    update(
                        session,
                        json!({"sessionUpdate": "compaction_update", "compactionId": format!("c{no}"),
                        "status": status}),
                    )
                };
                self.at(now + 2, progress("in_progress"), tag.clone(), None);
                if let Some(u) = self.flavor.usage(session, 13_498) {
                    self.at(now + 3, u, tag.clone(), None);
                }
                let (ms, ok) = match how {
                    CompactOutcome::CompactOk(ms) => (ms as u64, true),
                    CompactOutcome::CompactFail(ms) => (ms as u64, false),
                    CompactOutcome::CompactNever => return,
                };
                let Some(id) = id else { return };
                let status = if ok { "completed" } else { "failed" };
                self.at(now + ms + 4, progress(status), tag.clone(), None);
                for n in self.flavor.turn_end(session, &format!("prompt-{no}"), "end_turn") {
                    self.at(now + ms + 5, n, tag.clone(), None);
                }
                let answer = if ok {
                    result(&id, self.flavor.turn_result(session, no, "end_turn"))
                } else {
                    error(&id, json!({"code": -32603, "message": "compaction failed: the summary request failed"}))
                };
                self.at(now + ms + 6, answer, tag, Some(Effect::TurnEnded(session.to_owned(), no)));
            }
            Kind::Own => {}
        }
    }

    /// Schedules `chunks` chunks of turn `no` of `session` on the session `on` (a subagent's own) over `ms` from
    /// `now`; the time of the last.
    #[allow(clippy::too_many_arguments)]
    fn content(&mut self, session: &str, on: &str, no: u64, now: u64, ms: u32, chunks: u8, must: bool) -> u64 {
        let tag = Some((session.to_owned(), no));
        let seen_as = self.seen_as(on);
        for i in 0..chunks as u64 {
            self.chunk_no += 1;
            let n = self.chunk_no;
            self.chunk_must.insert(n, (seen_as.clone(), must));
            let at = now + 2 + ms as u64 * (i + 1) / (chunks as u64 + 1);
            if self.flavor == Flavor::Kimi {
                // Kimi writes each part to its wire; a turn of its own it reports nowhere else.
                let text = format!("第 {n} 段 «{n}»\n");
                self.wire_at(session, at, vec![kimi::content(no, &text)], tag.clone());
                if self.running.get(session).is_some_and(|r| r.kind == Kind::Own) {
                    continue;
                }
            }
            self.at(at, self.flavor.chunk(on, no, n), tag.clone(), None);
        }
        now + 2 + ms as u64
    }

    /// The end of Coda's turn `no` at `at`, as `end` says.
    fn finish(&mut self, session: &str, no: u64, id: Option<Value>, at: u64, end: End) {
        let tag = Some((session.to_owned(), no));
        let Some(id) = id else { return };
        let prompt = format!("prompt-{no}");
        if end == End::EndNever {
            return;
        }
        if let End::EndError(f) = end {
            self.truth.failures.insert(id.to_string(), f);
            if self.flavor == Flavor::Grok {
                return self.grok_failure(session, no, &id, at, f);
            }
            if self.flavor == Flavor::Kimi {
                return self.kimi_failure(session, no, &id, at, f);
            }
        }
        if self.flavor == Flavor::Kimi {
            // Kimi writes the turn's end before it answers (the shim holds the answer until it reads it).
            let ended = Some(Effect::WireTurnEnded(session.to_owned(), no));
            self.wire_with(session, at, kimi::completed(no, 10_331), tag.clone(), ended);
        }
        let mut lines: Vec<Value> = Vec::new();
        if self.flavor != Flavor::Kimi
            && !matches!(end, End::EndError(_))
            && let Some(u) = self.flavor.usage(session, 10_331)
        {
            lines.push(u);
        }
        if self.flavor == Flavor::Codex && matches!(end, End::EndError(_)) {
            lines.push(shapes::thread_status(session, "systemError"));
        }
        lines.extend(self.flavor.turn_end(session, &prompt, "end_turn"));
        let answer = match &end {
            End::EndError(f) => match self.flavor.failure(*f) {
                Ok(r) => result(&id, r),
                Err(e) => error(&id, e),
            },
            _ => result(&id, self.flavor.turn_result(session, no, "end_turn")),
        };
        for (i, line) in lines.into_iter().enumerate() {
            self.at(at + i as u64 / 2, line, tag.clone(), None);
        }
        let mut answers = vec![answer.to_string()];
        if end == End::EndTwice {
            answers.push(answer.to_string());
        }
        let children = self.running.get(session).is_some_and(|r| !r.children.is_empty());
        if self.flavor == Flavor::Codex && children {
            // Whether the turn's subagents still run is known once its content is over.
            self.seq += 1;
            let effect = Some(Effect::ContentEnded(session.to_owned(), no, answers));
            self.out.insert((at, self.seq), Out { line: String::new(), file: None, turn: tag, effect });
            return;
        }
        self.answer_lines(session, no, at + 2, answers);
        if self.flavor == Flavor::Kimi
            && let Some(u) = self.flavor.usage(session, 10_331)
        {
            // Right after the answer (reference kimi.md): part of the turn, so a Stop before the answer drops it
            // with the rest (a cancelled turn's update never comes seconds later, in the next turn).
            self.at(at + 3, u, tag, None);
        }
    }

    /// Codex: turn `no` of `session` has no more content: its `answers` go out now, or once every subagent of the
    /// turn ended (ten minutes at most), as codex-acp does.
    fn content_ended(&mut self, session: &str, no: u64, answers: Vec<String>, now: u64) {
        let Some(run) = self.running.get_mut(session).filter(|r| r.no == no) else { return };
        if run.children.is_empty() {
            return self.answer_lines(session, no, now + 2, answers);
        }
        run.held = Some(answers);
        self.effect_at(now + 600_000, Effect::ChildrenTimeout(session.to_owned(), no));
    }

    /// Writes a turn's answer (and a second one, for a CLI that answers twice) at `at`; the turn ends with it.
    fn answer_lines(&mut self, session: &str, no: u64, at: u64, answers: Vec<String>) {
        let tag = Some((session.to_owned(), no));
        for (i, a) in answers.into_iter().enumerate() {
            let v: Value = serde_json::from_str(&a).unwrap_or(Value::Null);
            let (turn, effect) =
                if i == 0 { (tag.clone(), Some(Effect::TurnEnded(session.to_owned(), no))) } else { (None, None) };
            self.at(at + i as u64, v, turn, effect);
        }
    }

    /// Grok's failed turn: its retries as `retry_state`, then its answer; one it retries past a minute is the
    /// shim's to stop.
    fn grok_failure(&mut self, session: &str, no: u64, id: &Value, at: u64, f: Failure) {
        let tag = Some((session.to_owned(), no));
        let prompt = format!("prompt-{no}");
        let plan = shapes::grok_retries(f);
        for (i, (delay, retry)) in plan.retries.iter().enumerate() {
            let n = notification("_x.ai/session_notification", json!({"sessionId": session, "update": retry}));
            let shown = (i == 0 && plan.answer_after > 60_000).then(|| Effect::RetryShown(id.to_string()));
            self.at(at + delay, n, tag.clone(), shown);
        }
        if let Some(r) = self.running.get_mut(session) {
            r.retrying = true;
        }
        let end = at + plan.answer_after;
        let mut lines = vec![shapes::grok_turn_completed(session, &prompt, plan.stop_reason)];
        lines.extend(self.flavor.turn_end(session, &prompt, plan.stop_reason));
        for line in lines {
            self.at(end, line, tag.clone(), None);
        }
        self.answer_lines(session, no, end + 1, vec![error(id, plan.error).to_string()]);
    }

    /// Kimi's failed turn: its retries in the wire (none for a failure it does not retry), then `end_turn` over
    /// ACP with the failure in the wire; one it retries past a minute is the shim's to stop.
    fn kimi_failure(&mut self, session: &str, no: u64, id: &Value, at: u64, f: Failure) {
        let tag = Some((session.to_owned(), no));
        let retries = kimi::retries(no, f);
        let mut end = at;
        for (i, (delay, record)) in retries.iter().enumerate() {
            let wait = record.get("delayMs").and_then(Value::as_u64).unwrap_or(0);
            let most = self.truth.scheduled_waits.entry(id.to_string()).or_default();
            *most = (*most).max(wait);
            self.wire_at(session, at + delay, vec![record.clone()], tag.clone());
            if i == 0 {
                self.effect_at(at + delay, Effect::RetryShown(id.to_string()));
            }
            end = at + delay + record.get("delayMs").and_then(Value::as_u64).unwrap_or(0) + 60;
        }
        if let Some(r) = self.running.get_mut(session) {
            r.retrying = !retries.is_empty();
        }
        // Kimi writes the turn's end before it answers.
        let ended = Some(Effect::WireTurnEnded(session.to_owned(), no));
        self.wire_with(session, end + 1, kimi::failed(no, f), tag, ended);
        let answer = result(id, self.flavor.turn_result(session, no, "end_turn")).to_string();
        self.answer_lines(session, no, end + 2, vec![answer]);
    }

    fn permission_answered(&mut self, id: &str, now: u64) {
        let n = self.truth.permission_answers.entry(id.to_owned()).or_default();
        *n += 1;
        if *n > 1 {
            self.truth.broken.push(("answer-once", format!("the CLI got the answer to its request {id} twice")));
        }
        let waiting = self.running.iter_mut().find(|(_, r)| r.waiting.as_ref().is_some_and(|w| w.0 == id));
        let Some((session, run)) = waiting else { return };
        let (session, (_, chunks, ms, end, work)) = (session.clone(), run.waiting.take().expect("found waiting"));
        let (no, rid) = (run.no, run.id.clone());
        let at = self.content(&session, &session, no, now, ms, chunks, true);
        self.begin_work(&session, no, now, at, &work);
        self.finish(&session, no, rid, at, end);
    }

    fn cancel(&mut self, session: &str, now: u64) {
        if self.flavor == Flavor::Kimi && self.compacting.contains_key(session) {
            // Kimi stops its compaction (`full_compaction.cancel`) and says so.
            self.out.retain(|_, o| !matches!(&o.effect, Some(Effect::CompactEnded(s)) if s == session));
            self.out.retain(|_, o| {
                !o.file.as_ref().is_some_and(|f| String::from_utf8_lossy(&f.bytes).contains("\"full_compaction."))
            });
            self.wire_at(session, now + 5, vec![json!({"type": "full_compaction.cancel"})], None);
            let end = Some(Effect::CompactEnded(session.to_owned()));
            self.at(now + 5, update(session, text_update(shapes::KIMI_CANCELLED)), None, end);
        }
        let Some(run) = self.running.get_mut(session) else { return };
        let no = run.no;
        if run.never || run.held.is_some() {
            // A hung turn ignores Stop; codex-acp's turn that only waits for its subagents does not stop them.
            return;
        }
        run.waiting = None;
        let (id, wake) = (run.id.clone(), run.wake.clone());
        let children = std::mem::take(&mut run.children);
        self.out.retain(|_, o| o.turn.as_ref().is_none_or(|(s, n)| s != session || *n != no));
        // Work the turn had not started yet never starts; codex-acp cancels the subagents of an interrupted turn.
        self.drop_unstarted_work(session, no, now);
        for child in children {
            self.end_subagent(&child, "cancelled", now + 3);
        }
        let prompt = match &wake {
            Some(w) if self.flavor == Flavor::Grok => {
                let kind = if self.tasks.contains_key(w) { "task" } else { "subagent" };
                format!("{kind}-completed-{w}")
            }
            _ => format!("prompt-{no}"),
        };
        if self.flavor == Flavor::Grok {
            let done = shapes::grok_turn_completed(session, &prompt, "cancelled");
            self.at(now + 4, done, None, wake.map(Effect::WakeDone));
        }
        let mut lines = Vec::new();
        lines.extend(self.flavor.turn_end(session, &prompt, "cancelled"));
        for n in lines {
            self.at(now + 4, n, None, None);
        }
        if self.flavor == Flavor::Kimi {
            // Before its answer, as every turn's end.
            // Its end settles what it handled.
            let ended = Some(Effect::WireTurnEnded(session.to_owned(), no));
            self.wire_with(session, now + 4, kimi::cancelled(no), None, ended);
        }
        let answer = id.map(|id| result(&id, self.flavor.turn_result(session, no, "cancelled")));
        // The turn ends once its end is written: what waits for the session (a wake on a result) starts after it.
        let ended = Effect::TurnEnded(session.to_owned(), no);
        match answer {
            Some(a) => self.at(now + 5, a, None, Some(ended)),
            None => self.effect_at(now + 5, ended),
        }
    }

    /// Whether Coda's own turn runs in `session` at the CLI.
    pub fn coda_turn_runs(&self, session: &str) -> bool {
        self.running.get(session).is_some_and(|r| r.kind == Kind::Coda && r.held.is_none())
    }

    /// A steering message reached the CLI (`id`: the request to answer, none for OpenCode's server).
    pub fn steering(&mut self, session: &str, text: &str, id: Option<Value>, now: u64) {
        let in_turn = self.coda_turn_runs(session);
        // codex-acp answers `promptRequired` by itself when no turn runs (the only CLI that does): handing it a
        // steering message then is harmless; during the shim's own `/compact` it is not.
        let harmless = self.flavor == Flavor::Codex && self.running.get(session).is_none_or(|r| r.held.is_some());
        if !in_turn && !harmless {
            let what = match self.running.get(session).map(|r| &r.kind) {
                Some(Kind::Compact) => "while the shim's compaction ran",
                Some(Kind::Own) => "while the CLI ran a turn of its own",
                Some(Kind::Coda) => "after Coda's turn was over (only its subagents ran)",
                None => "while no turn ran",
            };
            self.truth
                .broken
                .push(("steering-in-turn", format!("a steering message reached the CLI {what} (session {session})")));
        }
        let answer = marker_of(text).and_then(|m| self.steer_scripts.remove(&m)).unwrap_or(SteerAnswer::SteerTaken(5));
        let Some(id) = id else { return };
        match answer {
            SteerAnswer::SteerTaken(ms) => {
                let at = now + ms as u64;
                let taken = match self.flavor {
                    Flavor::Grok => json!({"result": {"status": "queued"}}),
                    _ if in_turn => json!({"outcome": "injected"}),
                    _ => json!({"outcome": "promptRequired", "reason": "noRunningTurn"}),
                };
                self.at(at, result(&id, taken), None, None);
                if self.flavor == Flavor::Grok {
                    let echo = notification("_x.ai/session/interjection", json!({"sessionId": session, "text": text}));
                    self.at(at, echo, None, None);
                    if !self.running.contains_key(session) {
                        self.turns += 1;
                        let prompt = format!("interject-fallback-{}", self.turns);
                        self.own_turn_in(session, 1, at, &prompt);
                    }
                }
            }
            SteerAnswer::SteerNever => {}
            SteerAnswer::SteerRefused => {
                self.at(now + 2, error(&id, json!({"code": -32603, "message": "cannot steer now"})), None, None)
            }
        }
    }

    /// Kimi's `/compact`: answered at once, the compaction runs after.
    fn kimi_compact(&mut self, id: Value, session: &str, now: u64) {
        let say = |t: &str| update(session, text_update(t));
        let refusal = if self.running.contains_key(session) {
            Some(shapes::KIMI_DURING_TURN)
        } else if self.compacting.contains_key(session) {
            Some(shapes::KIMI_BUSY)
        } else {
            None
        };
        let answer = result(&id, self.flavor.turn_result(session, 0, "end_turn"));
        if let Some(text) = refusal {
            self.at(now + 2, say(text), None, None);
            return self.at(now + 3, answer, None, None);
        }
        self.at(now + 2, say(shapes::KIMI_STARTED), None, None);
        self.wire_at(session, now + 2, vec![json!({"type": "full_compaction.begin", "source": "manual"})], None);
        self.at(now + 3, answer, None, None);
        self.compacting.insert(session.to_owned(), now);
        let end = Some(Effect::CompactEnded(session.to_owned()));
        match self.compact_script(session) {
            CompactOutcome::CompactOk(ms) => {
                let done = vec![
                    json!({"type": "context.apply_compaction", "summary": "Summary.", "tokensBefore": 32_720,
                        "tokensAfter": 22_290}),
                    json!({"type": "full_compaction.complete"}),
                ];
                self.wire_at(session, now + 4 + ms as u64, done, None);
                self.at(now + 4 + ms as u64, say(shapes::KIMI_DONE), None, end)
            }
            CompactOutcome::CompactFail(ms) => {
                self.wire_at(session, now + 4 + ms as u64, vec![json!({"type": "full_compaction.cancel"})], None);
                self.at(now + 4 + ms as u64, say(shapes::KIMI_CANCELLED), None, end)
            }
            CompactOutcome::CompactNever => {}
        }
    }

    /// The CLI runs a turn of its own in its `session`-th session (none runs there now).
    pub fn own_turn(&mut self, session: u8, chunks: u8, now: u64) {
        if self.dead || !self.flavor.has_own_turns() || self.sessions.is_empty() {
            return;
        }
        let s = self.sessions[session as usize % self.sessions.len()].clone();
        if self.running.contains_key(&s) || self.compacting.contains_key(&s) || !self.ready.contains(&s) {
            return;
        }
        self.turns += 1;
        let prompt = format!("own-{}", self.turns);
        self.own_turn_in(&s, chunks, now, &prompt);
    }

    /// A turn of the CLI's own in `session` (none runs there), for `prompt` (Grok's prompt id).
    fn own_turn_in(&mut self, session: &str, chunks: u8, now: u64, prompt: &str) {
        self.turns += 1;
        let no = self.turns;
        let tag = Some((session.to_owned(), no));
        for n in self.flavor.turn_start(session, prompt, "a background task finished") {
            self.at(now + 1, n, tag.clone(), None);
        }
        let wake =
            ["task-completed-", "subagent-completed-"].iter().find_map(|p| prompt.strip_prefix(p)).map(str::to_owned);
        let run = Run {
            id: None,
            no,
            kind: Kind::Own,
            waiting: None,
            never: false,
            held: None,
            children: Vec::new(),
            retrying: false,
            wake,
            wire_started: false,
            wire_ended: false,
            injected: Vec::new(),
            to_inject: Vec::new(),
            prompt: prompt.to_owned(),
        };
        self.running.insert(session.to_owned(), run);
        if self.flavor == Flavor::Kimi {
            let origin = match self.running.get(session).and_then(|r| r.wake.clone()) {
                Some(task) => json!({"kind": "task", "taskId": task}),
                None => json!({"kind": "system_trigger", "name": "timer"}),
            };
            let prompt = kimi::turn_prompt(no, "<notification>a background task finished</notification>", origin);
            let started = Some(Effect::WireTurnStarted(session.to_owned(), no));
            self.wire_with(session, now + 1, vec![prompt], tag.clone(), started);
            let end = self.content(session, session, no, now, 400, chunks, true);
            // Its end settles what it handled.
            let ended = Some(Effect::WireTurnEnded(session.to_owned(), no));
            self.wire_with(session, end + 1, kimi::completed(no, 11_000), tag.clone(), ended);
            // A Stop drops it with the rest of the turn and ends the turn itself.
            self.effect_in(end + 2, Effect::TurnEnded(session.to_owned(), no), tag);
            return;
        }
        let end = self.content(session, session, no, now, 400, chunks, true);
        let mut last: Vec<Value> = Vec::new();
        if self.flavor == Flavor::Grok {
            let done = shapes::grok_turn_completed(session, prompt, "end_turn");
            let wake = self.running.get(session).and_then(|r| r.wake.clone());
            self.at(end + 1, done, tag.clone(), wake.map(Effect::WakeDone));
        }
        last.extend(self.flavor.turn_end(session, prompt, "end_turn"));
        last.extend(self.flavor.usage(session, 11_000));
        let effect = last.pop();
        for n in last {
            self.at(end + 1, n, tag.clone(), None);
        }
        match effect {
            Some(n) => self.at(end + 2, n, tag, Some(Effect::TurnEnded(session.to_owned(), no))),
            None => self.turn_ended(session, no, end + 2),
        }
    }

    /// OpenCode's server: the sessions running a turn, in order.
    pub fn running_sessions(&self) -> Vec<String> {
        let mut s: Vec<String> = self.running.keys().cloned().collect();
        s.sort();
        s
    }

    /// OpenCode's server was asked to compact `session`: whether it did. The summary's text follows over ACP,
    /// outside any prompt (a chunk Coda is not to get).
    pub fn summarize(&mut self, session: &str) -> bool {
        if self.dead || !self.sessions.iter().any(|s| s == session) {
            return false;
        }
        match self.compact_script(session) {
            CompactOutcome::CompactOk(_) => {
                self.chunk_no += 1;
                let n = self.chunk_no;
                self.chunk_must.insert(n, (session.to_owned(), false));
                let summary = json!({"sessionUpdate": "agent_message_chunk", "messageId": format!("msg_summary{n}"),
                    "content": {"type": "text", "text": format!("Summary «{n}»")}});
                self.at(self.now + 5, update(session, summary), None, None);
                true
            }
            _ => false,
        }
    }
}

fn text_update(text: &str) -> Value {
    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})
}

/// The marker `«n»` of a chunk's text.
pub fn chunk_marker(text: &str) -> Option<u64> {
    let start = text.find('«')? + '«'.len_utf8();
    text[start..][..text[start..].find('»')?].parse().ok()
}

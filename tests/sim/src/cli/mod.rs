//! The model of a CLI: what it answers to each frame the shim hands it, and when (virtual ms), from the scripts
//! the plan's Coda steps carry; its own turns and its death. It keeps what happened at the CLI ([`Truth`]) for the
//! checks, which cannot see inside the shim.
//!
//! Each model is built from its CLI's recordings (`fixtures/<agent>/`, shapes in `shapes.rs`) and reference
//! notes: a turn streams chunks (each text carries a marker `«n»`, so the checks can follow it to Coda), may ask
//! for permission and wait for the answer, and ends as its script says (answer, failure, never, twice); `session/
//! cancel` ends the running turn `cancelled`; compaction is Codex's and Kimi's `/compact` prompt (Kimi's runs in
//! the background after answering), Grok's `_x.ai/compact_conversation`, OpenCode's `POST /session/{id}/summarize`
//! (`server.rs`); steering is Codex's `_session/steering`, Grok's `_x.ai/interject`, OpenCode's `POST
//! /session/{id}/message`.

pub mod shapes;

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::{Value, json};

use crate::plan::{CompactOutcome, End, Failure, SteerAnswer, Turn};
pub use shapes::Flavor;
use shapes::{error, notification, result, update};

/// What happened at the CLI: the checks' source of truth about the side the shim hides.
#[derive(Default, Debug)]
pub struct Truth {
    /// Coda's prompts (by marker) that reached the CLI, with the first time (ms).
    pub prompts: HashMap<u32, u64>,
    /// Requests that reached the CLI (id as JSON text), with their method.
    pub requests: HashMap<String, String>,
    /// Ids of requests the CLI answered.
    pub answered: Vec<String>,
    /// Chunks the CLI wrote, in order: (marker, session, whether Coda must get it).
    pub chunks: Vec<(u64, String, bool)>,
    /// The failure each of Coda's prompts (by id) ended with.
    pub failures: HashMap<String, Failure>,
    /// Broken rules the CLI saw: (rule, detail).
    pub broken: Vec<(&'static str, String)>,
    /// Answers to the CLI's permission requests (by id), counted.
    pub permission_answers: HashMap<String, u32>,
}

/// A turn the CLI runs in a session.
#[derive(Debug)]
struct Run {
    id: Option<Value>,
    no: u64,
    kind: Kind,
    /// The rest of a Coda turn that waits for a permission answer: (permission id, chunks, ms, end).
    waiting: Option<(String, u8, u32, End)>,
    /// A hung turn: it ignores Stop too.
    never: bool,
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
}

struct Out {
    line: String,
    turn: Option<(String, u64)>,
    effect: Option<Effect>,
}

pub struct Model {
    pub flavor: Flavor,
    pub truth: Truth,
    pub dead: bool,
    /// The time (ms) of the latest input, for what OpenCode's server is asked.
    pub now: u64,
    out: BTreeMap<(u64, u64), Out>,
    seq: u64,
    sessions: Vec<String>,
    running: HashMap<String, Run>,
    queued: HashMap<String, VecDeque<(Value, String, Kind)>>,
    compacting: HashMap<String, u64>,
    turns: u64,
    chunk_no: u64,
    chunk_must: HashMap<u64, (String, bool)>,
    permission_no: u64,
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

impl Model {
    pub fn new(flavor: Flavor) -> Model {
        Model {
            flavor,
            truth: Truth::default(),
            dead: false,
            now: 0,
            out: BTreeMap::new(),
            seq: 0,
            sessions: Vec::new(),
            running: HashMap::new(),
            queued: HashMap::new(),
            compacting: HashMap::new(),
            turns: 0,
            chunk_no: 0,
            chunk_must: HashMap::new(),
            permission_no: 0,
            prompt_scripts: HashMap::new(),
            steer_scripts: HashMap::new(),
            compact_scripts: HashMap::new(),
        }
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
        self.out.insert((at, self.seq), Out { line: v.to_string(), turn, effect });
    }

    /// The lines due by `now`, in order, with what writing them does.
    pub fn take_due(&mut self, now: u64) -> Vec<String> {
        self.now = now;
        let mut lines = Vec::new();
        while let Some(entry) = self.out.first_entry() {
            if entry.key().0 > now || self.dead {
                break;
            }
            let out = entry.remove();
            if let Ok(v) = serde_json::from_str::<Value>(&out.line) {
                if v.get("method").is_none()
                    && let Some(id) = v.get("id")
                {
                    self.truth.answered.push(id.to_string());
                }
                if let Some(n) = v.pointer("/params/update/content/text").and_then(Value::as_str).and_then(chunk_marker)
                    && let Some((session, must)) = self.chunk_must.remove(&n)
                {
                    self.truth.chunks.push((n, session, must));
                }
            }
            match out.effect {
                Some(Effect::TurnEnded(session, no)) => self.turn_ended(&session, no, now),
                Some(Effect::CompactEnded(session)) => {
                    self.compacting.remove(&session);
                }
                None => {}
            }
            lines.push(out.line);
        }
        lines
    }

    fn turn_ended(&mut self, session: &str, no: u64, now: u64) {
        if self.running.get(session).is_some_and(|r| r.no == no) {
            self.running.remove(session);
            if let Some((id, text, kind)) = self.queued.get_mut(session).and_then(VecDeque::pop_front) {
                self.start(session, Some(id), &text, kind, now);
            }
        }
    }

    /// The CLI dies: nothing more is written.
    pub fn die(&mut self) {
        self.dead = true;
        self.out.clear();
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
        if let Some(id) = &id {
            self.truth.requests.insert(id.to_string(), method.to_owned());
        }
        let soon = now + 3;
        match (method, id) {
            ("initialize", Some(id)) => self.at(now + 40, result(&id, self.flavor.init_result()), None, None),
            ("session/new", Some(id)) => {
                let s = self.flavor.session_id(self.sessions.len() as u32 + 1);
                self.sessions.push(s.clone());
                for n in self.flavor.before_session(&s) {
                    self.at(soon, n, None, None);
                }
                self.at(now + 60, result(&id, self.flavor.session_result(&s, false)), None, None);
                for n in self.flavor.after_session(&s) {
                    self.at(now + 61, n, None, None);
                }
            }
            ("session/load", Some(id)) => {
                if !self.sessions.contains(&session) {
                    self.sessions.push(session.clone());
                }
                // History is replayed before the answer (Coda does not take it).
                let old =
                    json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "earlier"}});
                self.at(soon, update(&session, old), None, None);
                self.at(now + 50, result(&id, self.flavor.session_result(&session, true)), None, None);
            }
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
            (m, Some(id)) if m.starts_with("session/set_") => self.at(soon, result(&id, json!({})), None, None),
            (m, Some(id)) => {
                let e = json!({"code": -32601, "message": format!("Method not found: {m}")});
                self.at(soon, error(&id, e), None, None)
            }
            _ => {}
        }
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
        }
        if compact && self.flavor == Flavor::Kimi {
            return self.kimi_compact(id, session, now);
        }
        if self.flavor == Flavor::Kimi && self.compacting.contains_key(session) {
            // Kimi answers a prompt sent while it compacts at once, empty, and runs it unreported later.
            let r = self.flavor.turn_result(session, 0, "end_turn");
            return self.at(now + 2, result(&id, r), None, None);
        }
        let kind = if compact { Kind::Compact } else { Kind::Coda };
        if self.running.contains_key(session) {
            self.queued.entry(session.to_owned()).or_default().push_back((id, text, kind));
            return;
        }
        self.start(session, Some(id), &text, kind, now);
    }

    /// Starts a turn in `session` (none runs there).
    fn start(&mut self, session: &str, id: Option<Value>, text: &str, kind: Kind, now: u64) {
        self.turns += 1;
        let no = self.turns;
        let tag = Some((session.to_owned(), no));
        for n in self.flavor.turn_start(session, no, text) {
            self.at(now + 1, n, tag.clone(), None);
        }
        self.running
            .insert(session.to_owned(), Run { id: id.clone(), no, kind: kind.clone(), waiting: None, never: false });
        match kind {
            Kind::Coda => {
                let script = marker_of(text).and_then(|m| self.prompt_scripts.remove(&m));
                let turn = script.unwrap_or(Turn { chunks: 1, ms: 50, permission: false, end: End::EndTurn });
                if let Some(r) = self.running.get_mut(session) {
                    r.never = turn.end == End::EndNever;
                }
                if turn.permission {
                    let before = turn.chunks / 2;
                    let half = turn.ms / 2;
                    self.content(session, no, now, half, before, true);
                    self.permission_no += 1;
                    let pid = json!(self.permission_no);
                    let ask = json!({"jsonrpc": "2.0", "id": pid, "method": "session/request_permission", "params": {
                        "sessionId": session, "toolCall": {"toolCallId": format!("call_{no}"), "title": "touch made.txt"},
                        "options": [{"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
                            {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"}]}});
                    self.at(now + half as u64 + 1, ask, tag, None);
                    let rest = (pid.to_string(), turn.chunks - before, turn.ms - half, turn.end);
                    if let Some(r) = self.running.get_mut(session) {
                        r.waiting = Some(rest);
                    }
                } else {
                    let end = self.content(session, no, now, turn.ms, turn.chunks, true);
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
                for n in self.flavor.turn_end(session, no, "end_turn") {
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

    /// Schedules `chunks` chunks of turn `no` over `ms` from `now`; the time of the last.
    fn content(&mut self, session: &str, no: u64, now: u64, ms: u32, chunks: u8, must: bool) -> u64 {
        let tag = Some((session.to_owned(), no));
        for i in 0..chunks as u64 {
            self.chunk_no += 1;
            let n = self.chunk_no;
            self.chunk_must.insert(n, (session.to_owned(), must));
            let at = now + 2 + ms as u64 * (i + 1) / (chunks as u64 + 1);
            self.at(at, self.flavor.chunk(session, no, n), tag.clone(), None);
        }
        now + 2 + ms as u64
    }

    /// The end of Coda's turn `no` at `at`, as `end` says.
    fn finish(&mut self, session: &str, no: u64, id: Option<Value>, at: u64, end: End) {
        let tag = Some((session.to_owned(), no));
        let Some(id) = id else { return };
        let reason = "end_turn";
        if end == End::EndNever {
            return;
        }
        if let Some(u) = self.flavor.usage(session, 10_331)
            && self.flavor != Flavor::Kimi
        {
            self.at(at, u, tag.clone(), None);
        }
        for n in self.flavor.turn_end(session, no, reason) {
            self.at(at + 1, n, tag.clone(), None);
        }
        let answer = match &end {
            End::EndError(f) => {
                self.truth.failures.insert(id.to_string(), *f);
                match self.flavor.failure(*f) {
                    Ok(r) => result(&id, r),
                    Err(e) => error(&id, e),
                }
            }
            _ => result(&id, self.flavor.turn_result(session, no, reason)),
        };
        self.at(at + 2, answer.clone(), tag.clone(), Some(Effect::TurnEnded(session.to_owned(), no)));
        if end == End::EndTwice {
            self.at(at + 3, answer, None, None);
        }
        if self.flavor == Flavor::Kimi
            && let Some(u) = self.flavor.usage(session, 10_331)
        {
            self.at(at + 3, u, None, None);
        }
    }

    fn permission_answered(&mut self, id: &str, now: u64) {
        let n = self.truth.permission_answers.entry(id.to_owned()).or_default();
        *n += 1;
        if *n > 1 {
            self.truth.broken.push(("answer-once", format!("the CLI got the answer to its request {id} twice")));
        }
        let waiting = self.running.iter_mut().find(|(_, r)| r.waiting.as_ref().is_some_and(|w| w.0 == id));
        let Some((session, run)) = waiting else { return };
        let (session, (_, chunks, ms, end)) = (session.clone(), run.waiting.take().expect("found waiting"));
        let (no, rid) = (run.no, run.id.clone());
        let at = self.content(&session, no, now, ms, chunks, true);
        self.finish(&session, no, rid, at, end);
    }

    fn cancel(&mut self, session: &str, now: u64) {
        if self.flavor == Flavor::Kimi && self.compacting.contains_key(session) {
            // Kimi stops its compaction (`full_compaction.cancel`) and says so.
            self.out.retain(|_, o| !matches!(&o.effect, Some(Effect::CompactEnded(s)) if s == session));
            let end = Some(Effect::CompactEnded(session.to_owned()));
            self.at(now + 5, update(session, text_update(shapes::KIMI_CANCELLED)), None, end);
        }
        let Some(run) = self.running.get_mut(session) else { return };
        let no = run.no;
        if run.never {
            return;
        }
        run.waiting = None;
        let id = run.id.clone();
        self.out.retain(|_, o| o.turn.as_ref().is_none_or(|(s, n)| s != session || *n != no));
        for n in self.flavor.turn_end(session, no, "cancelled") {
            self.at(now + 4, n, None, None);
        }
        let answer = id.map(|id| result(&id, self.flavor.turn_result(session, no, "cancelled")));
        match answer {
            Some(a) => self.at(now + 5, a, None, Some(Effect::TurnEnded(session.to_owned(), no))),
            None => self.turn_ended(session, no, now),
        }
    }

    /// Whether Coda's own turn runs in `session` at the CLI.
    pub fn coda_turn_runs(&self, session: &str) -> bool {
        self.running.get(session).is_some_and(|r| r.kind == Kind::Coda)
    }

    /// A steering message reached the CLI (`id`: the request to answer, none for OpenCode's server).
    pub fn steering(&mut self, session: &str, text: &str, id: Option<Value>, now: u64) {
        let in_turn = self.coda_turn_runs(session);
        // codex-acp answers `promptRequired` by itself when no turn runs (the only CLI that does): handing it a
        // steering message then is harmless; during the shim's own `/compact` it is not.
        let harmless = self.flavor == Flavor::Codex && !self.running.contains_key(session);
        if !in_turn && !harmless {
            let what = match self.running.get(session).map(|r| &r.kind) {
                Some(Kind::Compact) => "while the shim's compaction ran",
                Some(Kind::Own) => "while the CLI ran a turn of its own",
                _ => "while no turn ran",
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
                    if !in_turn {
                        self.own_turn_in(session, 1, at);
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
        self.at(now + 3, answer, None, None);
        self.compacting.insert(session.to_owned(), now);
        let end = Some(Effect::CompactEnded(session.to_owned()));
        match self.compact_script(session) {
            CompactOutcome::CompactOk(ms) => self.at(now + 4 + ms as u64, say(shapes::KIMI_DONE), None, end),
            CompactOutcome::CompactFail(ms) => self.at(now + 4 + ms as u64, say(shapes::KIMI_CANCELLED), None, end),
            CompactOutcome::CompactNever => {}
        }
    }

    /// The CLI runs a turn of its own in its `session`-th session (none runs there now).
    pub fn own_turn(&mut self, session: u8, chunks: u8, now: u64) {
        if self.dead || !self.flavor.has_own_turns() || self.sessions.is_empty() {
            return;
        }
        let s = self.sessions[session as usize % self.sessions.len()].clone();
        if self.running.contains_key(&s) || self.compacting.contains_key(&s) {
            return;
        }
        self.own_turn_in(&s, chunks, now);
    }

    fn own_turn_in(&mut self, session: &str, chunks: u8, now: u64) {
        self.turns += 1;
        let no = self.turns;
        let tag = Some((session.to_owned(), no));
        let text = "a background task finished";
        for n in self.flavor.turn_start(session, no, text) {
            self.at(now + 1, n, tag.clone(), None);
        }
        self.running.insert(session.to_owned(), Run { id: None, no, kind: Kind::Own, waiting: None, never: false });
        let end = self.content(session, no, now, 400, chunks, true);
        let mut last: Vec<Value> = self.flavor.turn_end(session, no, "end_turn");
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

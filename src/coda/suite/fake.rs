//! Scripted stand-ins for the four CLIs, for the feature suites: each answers what its real CLI answers for
//! what the suites do (sessions, turns, compaction, steering), in the frames the recordings in `fixtures/`
//! show, and can misbehave as a CLI does (never end a compaction, die in the middle of one, answer twice).
//!
//! A turn stays open while its prompt's text holds `[[open]]`, until the client's `_fake/end {sessionId}`
//! (passed on by every shim, as any method it does not know) ends it. `_fake/step {sessionId}` is a safe
//! point of the running turn: its running command ends, pending messages join (Grok's interjections,
//! OpenCode's stored ones) and the model is asked again. `_fake/final` is the turn's last model answer and
//! its last safe point: a message steered after it and before `_fake/end` is one Grok then runs as a turn of
//! its own. OpenCode's server side (its events, the summarize and steering calls) is played by [`State`] too
//! ([`State::summarize`], [`State::steer_call`], [`State::read_by`]).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::relay::testing::HANG_UP;

/// How the CLI's compaction goes. A compaction runs until the client's `_fake/compacted {sessionId}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compacts {
    /// It compacts and says so at `_fake/compacted`; a `session/cancel` stops it where the CLI stops one.
    Ends,
    /// It never ends (nor stops when cancelled).
    Never,
    /// It dies at `_fake/compacted`.
    Dies,
    /// It ends at `_fake/compacted`, and answers the shim's request for it twice.
    Twice,
}

/// Which CLI a [`Fake`] plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cli {
    Codex,
    Kimi,
    Grok,
    OpenCode,
    /// Any ACP agent under coda-acp: the standard methods only.
    Acp,
    /// Qwen Code under `coda-acp --profile qwen`.
    Qwen,
    /// Claude Agent ACP under `coda-acp --profile claude`.
    Claude,
}

impl Cli {
    pub fn by_agent(agent: &str) -> Cli {
        match agent {
            "codex" => Cli::Codex,
            "kimi" => Cli::Kimi,
            "grok" => Cli::Grok,
            "opencode" => Cli::OpenCode,
            "acp" => Cli::Acp,
            "acp-qwen" => Cli::Qwen,
            "acp-claude" => Cli::Claude,
            other => panic!("no fake for {other}"),
        }
    }
}

/// A running turn of a session.
#[derive(Debug)]
struct Turn {
    /// The prompt's id as JSON text (a Coda id or the shim's own).
    id: String,
    /// The shim's own `/compact` (Codex).
    compact: bool,
    /// Its last model answer came and its last safe point passed (`_fake/final`).
    last: bool,
}

/// Where OpenCode's server events go: the shim's reader of them, once it started.
pub type ServerSend = Box<dyn Fn(crate::adapters::opencode::server::FromServer) -> bool + Send>;

/// What a fake CLI keeps; shared with OpenCode's server side.
pub struct State {
    pub cli: Cli,
    pub compacts: Compacts,
    sessions: u32,
    turns: Vec<(String, Turn)>,
    /// Sessions compacting now (Kimi after its `/compact` answer, Grok and OpenCode while asked), with the
    /// request to answer at the end (Grok's).
    compacting: Vec<(String, Option<String>)>,
    /// Grok's interjections taken and not yet joined to a turn, by session.
    pending: Vec<(String, String)>,
    /// Texts that joined Coda's turns (Grok: drained; Codex: steered; OpenCode: taken by a step).
    pub joined: Vec<String>,
    /// Prompts (their text) that reached the CLI while it compacted their session.
    pub prompted_while_compacting: Vec<String>,
    /// Fallback turns Grok ran on its own for an interjection.
    pub fallbacks: u32,
    /// OpenCode: messages stored by the steering call, not yet taken, by session.
    stored: Vec<(String, String)>,
    next_message: u32,
    /// OpenCode's server events said before the shim's reader started.
    events: Vec<crate::adapters::opencode::server::FromServer>,
    /// The shim's reader of OpenCode's server events, once started.
    reader: Option<ServerSend>,
    /// OpenCode: the server says a session is busy only when told (`_fake/busy`).
    pub late_busy: bool,
    /// The CLI never answers a steering call (Codex's `_session/steering`, Grok's `_x.ai/interject`,
    /// OpenCode's post).
    pub steer_silent: bool,
    /// The CLI answers a steering call twice.
    pub steer_twice: bool,
    /// OpenCode: what its server keeps of each session, as `GET /session/{id}/message` answers.
    pub kept: Vec<(String, Value)>,
    /// The ids the CLI was asked to withdraw (`$/cancel_request`), as JSON text.
    pub withdrawn: Vec<String>,
    /// Sessions the CLI closed.
    pub closed: Vec<String>,
    /// The `initialize` result, instead of the CLI's own.
    pub init: Option<Value>,
    /// Qwen: its drain requests sent so far.
    drains: u32,
}

/// One CLI, scripted (see the module docs).
#[derive(Clone)]
pub struct Fake(pub Arc<Mutex<State>>);

fn result(id: &str, result: Value) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

fn update(session: &str, update: Value) -> String {
    json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":update}}).to_string()
}

fn chunk(session: &str, text: &str) -> String {
    update(session, json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":text}}))
}

fn notification(method: &str, params: Value) -> String {
    json!({"jsonrpc":"2.0","method":method,"params":params}).to_string()
}

/// A line the CLI read: its method (empty for an answer), id (as JSON text), params and `sessionId`.
pub struct Read {
    pub method: String,
    pub id: Option<String>,
    pub params: Value,
    pub session: String,
}

/// The line, if it is JSON.
pub fn read(line: &str) -> Option<Read> {
    // Read as a CLI in JavaScript reads it: a lone surrogate escape is a character.
    let msg = crate::json::from_slice::<Value>(&crate::json::mend_surrogates(line.as_bytes())).ok()?;
    let method = msg.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
    let id = msg.get("id").map(Value::to_string);
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let session = params.get("sessionId").and_then(Value::as_str).unwrap_or_default().to_owned();
    Some(Read { method, id, params, session })
}

/// The text blocks of a prompt, joined.
pub fn text_of(prompt: &Value) -> String {
    let blocks = prompt.as_array().into_iter().flatten();
    blocks.filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
}

impl Fake {
    pub fn new(cli: Cli, compacts: Compacts) -> Fake {
        Fake(Arc::new(Mutex::new(State {
            cli,
            compacts,
            sessions: 0,
            turns: Vec::new(),
            compacting: Vec::new(),
            pending: Vec::new(),
            joined: Vec::new(),
            prompted_while_compacting: Vec::new(),
            fallbacks: 0,
            stored: Vec::new(),
            next_message: 0,
            events: Vec::new(),
            reader: None,
            late_busy: false,
            steer_silent: false,
            steer_twice: false,
            kept: Vec::new(),
            withdrawn: Vec::new(),
            closed: Vec::new(),
            init: None,
            drains: 0,
        })))
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("lock")
    }

    /// What it writes for one line it reads.
    pub fn answer(&self, line: &str) -> Vec<String> {
        let Some(Read { method, id, params, session }) = read(line) else { return Vec::new() };
        let mut s = self.state();
        let Some(id) = id else {
            return match method.as_str() {
                "session/cancel" => s.cancel(&session),
                "$/cancel_request" => {
                    let withdrawn = params.get("requestId").map(Value::to_string).unwrap_or_default();
                    s.withdrawn.push(withdrawn);
                    Vec::new()
                }
                _ => Vec::new(),
            };
        };
        if method.is_empty() {
            // Qwen: the client's answer to its drain; what it carries joins the running turn.
            let msg = crate::json::from_str::<Value>(line).unwrap_or_default();
            if let Some(items) = msg.pointer("/result/items").and_then(Value::as_array) {
                let texts = items.iter().map(|i| text_of(i.get("content").unwrap_or(&Value::Null)));
                s.joined.extend(texts);
            }
            return Vec::new();
        }
        if s.cli == Cli::Codex
            && matches!(method.as_str(), "session/new" | "session/load" | "session/resume")
            && let Some(sp) = params.get("systemPrompt").filter(|sp| !sp.is_null())
        {
            // codex-acp 2.6.0, live: anything but append with text blocks is -32602, on new, load and resume (its
            // schema check: no object, no mode, a block without `text`; its own: override, non-text, empty).
            let text = |b: &Value| b["type"] == "text" && b["text"].is_string();
            let texts = sp["content"].as_array().is_some_and(|c| !c.is_empty() && c.iter().all(text));
            if sp["mode"] != "append" || !texts {
                let error = json!({"code": -32602, "message": "Invalid params: systemPrompt requires append mode and text content"});
                return vec![format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#)];
            }
        }
        match method.as_str() {
            "initialize" => vec![result(&id, s.initialized())],
            "session/new" => {
                s.sessions += 1;
                let new = format!("{:?}-{}", s.cli, s.sessions).to_lowercase();
                let mut answer = json!({"sessionId": new});
                if s.cli == Cli::OpenCode {
                    answer["configOptions"] = json!([{"id":"model","currentValue":"fake/fake-model"}]);
                }
                vec![result(&id, answer)]
            }
            "session/load" | "session/resume" => {
                let answer = match s.cli {
                    Cli::OpenCode => json!({"configOptions":[{"id":"model","currentValue":"fake/fake-model"}]}),
                    _ => json!({}),
                };
                vec![result(&id, answer)]
            }
            "session/prompt" => s.prompt(&id, &session, &text_of(params.get("prompt").unwrap_or(&Value::Null))),
            // ACP: the agent cancels the session's work as `session/cancel` does, then frees it.
            "session/close" => {
                let mut out = s.cancel(&session);
                s.compacting.retain(|(c, _)| *c != session);
                s.closed.push(session.clone());
                out.push(result(&id, json!({})));
                out
            }
            // Writes `params.line` as it is (a request of the CLI's, its withdrawal), then answers.
            "_fake/emit" => {
                vec![params.get("line").and_then(Value::as_str).unwrap_or_default().to_owned(), result(&id, json!({}))]
            }
            // A report of the CLI's own (an agent that speaks Coda's `_coda/wait`), for the engine's rules.
            "_fake/wait" => {
                let wait = params.get("wait").cloned().unwrap_or(Value::Null);
                vec![notification("_coda/wait", wait), result(&id, json!({}))]
            }
            "_x.ai/compact_conversation" if s.cli == Cli::Grok => s.grok_compact(&id, &session),
            "_x.ai/interject" if s.cli == Cli::Grok => {
                let text = params.get("text").and_then(Value::as_str).unwrap_or_default();
                s.interject(&id, &session, text)
            }
            "_session/steering" if matches!(s.cli, Cli::Codex | Cli::Claude) => {
                let running = s.turns.iter().any(|(t, _)| *t == session);
                let answer = if running {
                    let text = text_of(params.get("prompt").unwrap_or(&Value::Null));
                    s.joined.push(text);
                    result(&id, json!({"outcome":"injected"}))
                } else {
                    result(&id, json!({"outcome":"promptRequired","reason":"noRunningTurn"}))
                };
                match (s.steer_silent, s.steer_twice) {
                    (true, _) => Vec::new(),
                    (_, true) => vec![answer.clone(), answer],
                    _ => vec![answer],
                }
            }
            "_fake/end" => {
                let mut out = s.end(&session, true);
                out.push(result(&id, json!({})));
                out
            }
            "_fake/final" => {
                let mut out = s.last_answer(&session);
                out.push(result(&id, json!({})));
                out
            }
            "_fake/step" => {
                let mut out = s.step(&session);
                out.push(result(&id, json!({})));
                out
            }
            "_fake/compacted" => {
                let mut out = s.compacted(&session);
                out.push(result(&id, json!({})));
                out
            }
            "_fake/busy" => {
                s.busy(&session, true);
                if s.cli == Cli::OpenCode {
                    s.opencode_step(&session, None);
                }
                vec![result(&id, json!({}))]
            }
            _ => {
                let error = json!({"code": -32601, "message": format!("Method not found: {method}")});
                vec![format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#)]
            }
        }
    }
}

impl State {
    /// OpenCode's server says `event`.
    pub fn event(&mut self, event: crate::adapters::opencode::server::FromServer) {
        match &self.reader {
            Some(send) => {
                send(event);
            }
            None => self.events.push(event),
        }
    }

    /// The shim started reading OpenCode's server events: what was said so far, then each as it comes.
    /// OpenCode's server's answer to `GET /session/{id}/message`: the messages it keeps of `session`.
    pub fn messages(&self, session: &str) -> Value {
        let kept = self.kept.iter().find(|(s, _)| s == session);
        kept.map_or_else(|| json!([]), |(_, messages)| messages.clone())
    }

    pub fn read_by(&mut self, send: ServerSend) {
        for e in self.events.drain(..) {
            send(e);
        }
        self.reader = Some(send);
    }

    fn initialized(&self) -> Value {
        if let Some(init) = &self.init {
            return init.clone();
        }
        match self.cli {
            Cli::Codex => json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true,
                "sessionCapabilities":{"close":{},"resume":{},"systemPrompt":{}}},
                "agentInfo":{"name":"codex-acp","version":"2.6.0"},
                "_meta":{"steering":{"supported":true},
                    "jetbrains":{"air":{"version":1,"capabilities":["nativeSubagentSessions","asyncTasks"]}}}}),
            Cli::Kimi => json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true},
                "agentInfo":{"name":"Kimi Code CLI","version":"2.1.0"}}),
            Cli::Grok => json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true},
                "_meta":{"agentVersion":"1.0.41"}}),
            Cli::OpenCode => json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true},
                "agentInfo":{"name":"OpenCode","version":"1.18.33"}}),
            Cli::Acp => json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true,
                "sessionCapabilities":{"close":{}}},"agentInfo":{"name":"fake-acp","version":"1.0.0"}}),
            Cli::Qwen => json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true,
                "sessionCapabilities":{"list":{},"resume":{}}},
                "agentInfo":{"name":"qwen-code","title":"Qwen Code","version":"0.24.4"}}),
            Cli::Claude => json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true,
                "sessionCapabilities":{"close":{},"systemPrompt":{"mode":{"override":{}}}}},
                "agentInfo":{"name":"@agentclientprotocol/claude-agent-acp","version":"0.101.0"},
                "_meta":{"steering":{"supported":true}}}),
        }
    }

    fn running(&self, session: &str) -> Option<&Turn> {
        self.turns.iter().find(|(s, _)| s == session).map(|(_, t)| t)
    }

    fn compacting(&self, session: &str) -> bool {
        self.compacting.iter().any(|(s, _)| s == session) || self.running(session).is_some_and(|t| t.compact)
    }

    fn busy(&mut self, session: &str, busy: bool) {
        use crate::adapters::opencode::server::{FromServer, ServerEvent};
        if self.cli == Cli::OpenCode {
            self.event(FromServer::Event(ServerEvent::Status { session: session.to_owned(), busy }));
        }
    }

    /// A safe point of the running turn: its command ends, what waits joins, the model answers again.
    fn step(&mut self, session: &str) -> Vec<String> {
        if self.running(session).is_none_or(|t| t.last) {
            return Vec::new();
        }
        match self.cli {
            Cli::Grok => {
                let mut out = vec![update(
                    session,
                    json!({"sessionUpdate":"tool_call_update","toolCallId":"call_1","status":"completed"}),
                )];
                let (taken, rest): (Vec<_>, Vec<_>) = self.pending.drain(..).partition(|(s, _)| s == session);
                self.pending = rest;
                self.joined.extend(taken.into_iter().map(|(_, t)| t));
                out.extend(grok_response(session));
                out.push(update(
                    session,
                    json!({"sessionUpdate":"tool_call","toolCallId":"call_1","status":"in_progress"}),
                ));
                out
            }
            // Qwen asks for queued messages after a tool batch (unless told to stay silent).
            Cli::Qwen if !self.steer_silent => {
                self.drains += 1;
                let drain = json!({"jsonrpc":"2.0","id":format!("drain-{}", self.drains),
                    "method":"craft/drainMidTurnQueue","params":{"sessionId":session,"todoStopGuardWatchQueuedPrompt":true}});
                vec![drain.to_string()]
            }
            Cli::OpenCode => {
                let (taken, rest): (Vec<_>, Vec<_>) = self.stored.drain(..).partition(|(s, _)| s == session);
                self.stored = rest;
                for (_, message) in taken {
                    self.joined.push(message.clone());
                    self.opencode_step(session, Some(message));
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn opencode_step(&mut self, session: &str, parent: Option<String>) {
        use crate::adapters::opencode::server::{FromServer, ServerEvent};
        use crate::adapters::opencode::usage::Step;
        self.next_message += 1;
        let step = Step {
            session: session.to_owned(),
            message: format!("msg_a{}", self.next_message),
            created_ms: 1_796_188_357_505,
            completed_ms: None,
            tokens: None,
            output: None,
            summary: false,
            provider: Some("fake".into()),
            model: Some("fake-model".into()),
            parent,
            agent: Some("build".into()),
            variant: None,
        };
        self.event(FromServer::Event(ServerEvent::Step(Box::new(step))));
    }

    fn prompt(&mut self, id: &str, session: &str, text: &str) -> Vec<String> {
        if text == "/compact" || (text == "/compress" && self.cli == Cli::Qwen) {
            return self.slash_compact(id, session);
        }
        if self.compacting(session) {
            self.prompted_while_compacting.push(text.to_owned());
            if self.cli == Cli::Kimi {
                // Kimi answers a prompt sent while it compacts empty, at once (and runs it unreported later).
                return vec![result(id, json!({"stopReason":"end_turn"}))];
            }
        }
        let mut out = Vec::new();
        if self.cli == Cli::Grok {
            // Grok queues the prompt, then runs it under the same id (fixtures/grok).
            out.push(notification(
                "_x.ai/queue/changed",
                json!({"sessionId":session,"entries":[{"id":format!("p-{id}"),"version":0,"kind":"prompt",
                "text":text,"position":0}]}),
            ));
            out.push(notification(
                "_x.ai/queue/changed",
                json!({"sessionId":session,"entries":[],
                "runningPromptId":format!("p-{id}"),"runningText":text,"runningKind":"prompt"}),
            ));
        }
        // OpenCode's server says the session is busy, and names the turn's first step (a model request),
        // a moment after the prompt (`late_busy`: when the test says, `_fake/busy`).
        if !self.late_busy {
            self.busy(session, true);
            if self.cli == Cli::OpenCode {
                self.opencode_step(session, None);
            }
        }
        out.push(chunk(session, &format!("answer to {}", text.lines().next().unwrap_or_default())));
        if self.cli == Cli::Grok {
            // The turn runs a command.
            out.push(notification(
                "_x.ai/session_notification",
                json!({"sessionId":session,
                "update":{"sessionUpdate":"response_completed","usage":{"input_tokens":10,"output_tokens":5}}}),
            ));
            out.push(update(
                session,
                json!({"sessionUpdate":"tool_call","toolCallId":"call_1","status":"in_progress"}),
            ));
        }
        self.turns.push((session.to_owned(), Turn { id: id.to_owned(), compact: false, last: false }));
        if !text.contains("[[open]]") {
            out.extend(self.end(session, true));
        }
        out
    }

    /// The turn's last model answer and its last safe point.
    fn last_answer(&mut self, session: &str) -> Vec<String> {
        if self.running(session).is_none_or(|t| t.last || t.compact) {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.cli == Cli::Grok {
            out.push(update(
                session,
                json!({"sessionUpdate":"tool_call_update","toolCallId":"call_1","status":"completed"}),
            ));
            // The safe point after the command, the final answer, and the drain just before the turn completes.
            for _ in 0..2 {
                let (taken, rest): (Vec<_>, Vec<_>) = self.pending.drain(..).partition(|(s, _)| s == session);
                self.pending = rest;
                let joined = !taken.is_empty();
                self.joined.extend(taken.into_iter().map(|(_, t)| t));
                if joined || out.len() == 1 {
                    out.extend(grok_response(session));
                }
            }
        } else {
            out.extend(self.step(session));
        }
        if let Some((_, t)) = self.turns.iter_mut().find(|(s, t)| s == session && !t.compact) {
            t.last = true;
        }
        out
    }

    /// Ends the running turn of `session` (after its last answer, when `_fake/final` did not come first).
    fn end(&mut self, session: &str, drain: bool) -> Vec<String> {
        let mut out = Vec::new();
        if drain {
            out.extend(self.last_answer(session));
        }
        let Some(at) = self.turns.iter().position(|(s, t)| s == session && !t.compact) else { return out };
        let (_, turn) = self.turns.remove(at);
        if self.cli == Cli::Grok {
            out.push(notification("_x.ai/queue/changed", json!({"sessionId":session,"entries":[]})));
        }
        self.busy(session, false);
        out.push(result(&turn.id, json!({"stopReason":"end_turn"})));
        if self.cli == Cli::Grok {
            out.extend(self.fallback(session));
        }
        out
    }

    /// Grok runs the interjections of an idle session as a turn of its own.
    fn fallback(&mut self, session: &str) -> Vec<String> {
        let (taken, rest): (Vec<_>, Vec<_>) = self.pending.drain(..).partition(|(s, _)| s == session);
        self.pending = rest;
        let mut out = Vec::new();
        for (_, text) in taken {
            self.fallbacks += 1;
            let running = format!("interject-fallback-{}", self.fallbacks);
            out.push(notification(
                "_x.ai/queue/changed",
                json!({"sessionId":session,"entries":[],
                "runningPromptId":running,"runningText":text,"runningKind":"prompt"}),
            ));
            out.push(chunk(session, "a turn of Grok's own"));
            out.push(notification("_x.ai/queue/changed", json!({"sessionId":session,"entries":[]})));
        }
        out
    }

    fn cancel(&mut self, session: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.cli == Cli::Kimi && self.compacting(session) && self.compacts != Compacts::Never {
            self.compacting.retain(|(s, _)| s != session);
            out.push(chunk(session, "Compaction cancelled."));
        }
        if self.cli == Cli::Grok {
            self.pending.retain(|(s, _)| s != session);
        }
        let never = self.compacts == Compacts::Never;
        if let Some(at) = self.turns.iter().position(|(s, t)| s == session && !(t.compact && never)) {
            let (_, turn) = self.turns.remove(at);
            self.busy(session, false);
            if turn.compact && self.cli != Cli::Qwen {
                out.push(update(
                    session,
                    json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"failed",
                    "error":"interrupted"}),
                ));
            }
            out.push(result(&turn.id, json!({"stopReason":"cancelled"})));
        }
        out
    }

    /// The shim's `/compact` prompt (Codex, Kimi): the compaction starts.
    fn slash_compact(&mut self, id: &str, session: &str) -> Vec<String> {
        match self.cli {
            Cli::Codex => {
                self.turns.push((session.to_owned(), Turn { id: id.to_owned(), compact: true, last: false }));
                let status = json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"in_progress"});
                vec![codex_thread(session, "active"), update(session, status), codex_used(session, 13498)]
            }
            Cli::Claude => {
                self.turns.push((session.to_owned(), Turn { id: id.to_owned(), compact: true, last: false }));
                let status = json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"in_progress"});
                vec![update(session, status)]
            }
            Cli::Qwen => {
                self.turns.push((session.to_owned(), Turn { id: id.to_owned(), compact: true, last: false }));
                vec![qwen_compression(session, "Compressing context...", json!({"phase":"progress"}))]
            }
            Cli::Kimi => {
                self.compacting.push((session.to_owned(), None));
                let mut out = vec![chunk(session, "Context compaction started \u{2014} it runs in the background")];
                out.push(result(id, json!({"stopReason":"end_turn"})));
                if self.compacts == Compacts::Twice {
                    out.push(result(id, json!({"stopReason":"end_turn"})));
                }
                out
            }
            // Grok and OpenCode run `/compact` as a turn: not what the shims send.
            _ => vec![result(id, json!({"stopReason":"end_turn"}))],
        }
    }

    fn grok_compact(&mut self, id: &str, session: &str) -> Vec<String> {
        self.compacting.push((session.to_owned(), Some(id.to_owned())));
        Vec::new()
    }

    /// `_fake/compacted`: the session's compaction ends (or the CLI dies).
    fn compacted(&mut self, session: &str) -> Vec<String> {
        use crate::adapters::opencode::compact::Summarized;
        use crate::adapters::opencode::server::{FromServer, ServerEvent};
        match self.compacts {
            Compacts::Never => return Vec::new(),
            Compacts::Dies => return vec![HANG_UP.to_owned()],
            Compacts::Ends | Compacts::Twice => {}
        }
        let twice = self.compacts == Compacts::Twice;
        let mut out = Vec::new();
        match self.cli {
            Cli::Codex => {
                let Some(at) = self.turns.iter().position(|(s, t)| s == session && t.compact) else { return out };
                let (_, turn) = self.turns.remove(at);
                let status = json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"completed"});
                out.extend([codex_used(session, 7548), update(session, status), codex_thread(session, "idle")]);
                out.push(result(&turn.id, json!({"stopReason":"end_turn"})));
                if twice {
                    out.push(result(&turn.id, json!({"stopReason":"end_turn"})));
                }
            }
            Cli::Claude | Cli::Qwen => {
                let Some(at) = self.turns.iter().position(|(s, t)| s == session && t.compact) else { return out };
                let (_, turn) = self.turns.remove(at);
                out.push(match self.cli {
                    Cli::Qwen => qwen_compression(
                        session,
                        "Context compressed (20389 -> 18039).",
                        json!({"phase":"done","originalTokenCount":20389,"newTokenCount":18039}),
                    ),
                    _ => update(
                        session,
                        json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"completed"}),
                    ),
                });
                out.push(result(&turn.id, json!({"stopReason":"end_turn"})));
                if twice {
                    out.push(result(&turn.id, json!({"stopReason":"end_turn"})));
                }
            }
            Cli::Kimi => {
                self.compacting.retain(|(s, _)| s != session);
                out.push(chunk(
                    session,
                    "Compaction completed.\n- Messages compacted: 5\n- Tokens before: 32,720\n- Tokens after: 22,290",
                ));
            }
            Cli::Grok => {
                let Some(at) = self.compacting.iter().position(|(s, _)| s == session) else { return out };
                let (_, id) = self.compacting.remove(at);
                let id = id.unwrap_or_default();
                out.push(notification(
                    "_x.ai/session_notification",
                    json!({"sessionId":session,
                    "update":{"sessionUpdate":"auto_compact_completed","tokens_before":15,"tokens_after":8}}),
                ));
                out.push(result(&id, json!({})));
                if twice {
                    out.push(result(&id, json!({})));
                }
            }
            // It compacts nothing of its own.
            Cli::Acp => {}
            Cli::OpenCode => {
                if !self.compacting.iter().any(|(s, _)| s == session) {
                    return out;
                }
                self.compacting.retain(|(s, _)| s != session);
                self.event(summary_step(session, true));
                let done = ServerEvent::Summarized { session: session.to_owned(), result: Summarized::Done };
                self.event(FromServer::Event(done));
                let compacted = FromServer::Event(ServerEvent::Compacted { session: session.to_owned() });
                self.event(compacted.clone());
                if twice {
                    self.event(compacted);
                }
                self.busy(session, false);
            }
        }
        out
    }

    /// OpenCode's server: the summarize call (its answer comes as a server event).
    pub fn summarize(&mut self, session: &str) -> Option<crate::adapters::opencode::compact::Summarized> {
        use crate::adapters::opencode::compact::Summarized;
        if self.running(session).is_some() {
            return Some(Summarized::Busy);
        }
        self.compacting.push((session.to_owned(), None));
        self.busy(session, true);
        self.event(summary_step(session, false));
        None
    }

    fn interject(&mut self, id: &str, session: &str, text: &str) -> Vec<String> {
        let queued = result(id, json!({"result":{"status":"queued"}}));
        let mut out = match (self.steer_silent, self.steer_twice) {
            (true, _) => Vec::new(),
            (_, true) => vec![queued.clone(), queued],
            _ => vec![queued],
        };
        out.push(notification("_x.ai/session/interjection", json!({"sessionId":session,"text":text})));
        self.pending.push((session.to_owned(), text.to_owned()));
        if self.running(session).is_none() {
            out.extend(self.fallback(session));
        }
        out
    }

    /// OpenCode's server: a steering call.
    pub fn steer_call(
        &mut self,
        call: crate::adapters::opencode::steering::Call,
    ) -> Option<crate::adapters::opencode::server::ServerEvent> {
        use crate::adapters::opencode::server::{ServerEvent, SteerCallKind};
        use crate::adapters::opencode::steering::Call;
        match call {
            Call::Post { session, .. } => {
                if self.steer_silent {
                    return None;
                }
                self.next_message += 1;
                let message = format!("msg_u{}", self.next_message);
                self.stored.push((session.clone(), message.clone()));
                Some(ServerEvent::SteerCall { session, call: SteerCallKind::Post, message, error: None })
            }
            Call::Delete { session, message, .. } => {
                self.stored.retain(|(s, m)| !(*s == session && *m == message));
                Some(ServerEvent::SteerCall { session, call: SteerCallKind::Delete, message, error: None })
            }
        }
    }
}

/// Qwen's message about its `/compress`, with its `_meta.contextCompression`.
fn qwen_compression(session: &str, text: &str, compression: Value) -> String {
    update(
        session,
        json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":text},
        "_meta":{"contextCompression":compression}}),
    )
}

fn codex_thread(session: &str, status: &str) -> String {
    update(session, json!({"sessionUpdate":"session_info_update","_meta":{"codex":{"threadStatus":{"type":status}}}}))
}

fn codex_used(session: &str, used: u64) -> String {
    update(session, json!({"sessionUpdate":"usage_update","used":used,"size":258400}))
}

/// OpenCode's summary message, begun or completed.
fn summary_step(session: &str, completed: bool) -> crate::adapters::opencode::server::FromServer {
    use crate::adapters::opencode::server::{FromServer, ServerEvent};
    use crate::adapters::opencode::usage::Step;
    FromServer::Event(ServerEvent::Step(Box::new(Step {
        session: session.to_owned(),
        message: "msg_summary".into(),
        created_ms: 1_796_188_356_742,
        completed_ms: completed.then_some(1_796_188_357_059),
        tokens: completed.then_some(2143),
        output: completed.then_some(5),
        summary: true,
        provider: Some("fake".into()),
        model: Some("fake-model".into()),
        parent: None,
        agent: None,
        variant: None,
    })))
}

/// One model answer of Grok's: its text, then `response_completed`.
fn grok_response(session: &str) -> Vec<String> {
    vec![
        chunk(session, "Hello from the fake model."),
        notification(
            "_x.ai/session_notification",
            json!({"sessionId":session,
            "update":{"sessionUpdate":"response_completed","usage":{"input_tokens":10,"output_tokens":5}}}),
        ),
    ]
}

//! Coda's steering (section 插话) over OpenCode's own server: a message joins the turn Coda is running.
//!
//! What OpenCode 1.18.33 does (seen live against the fake model, `fixtures/opencode/steering`):
//! - Its run loop re-reads the session's messages before every step, and runs on while the latest user
//!   message has no finished answer. `POST /session/{id}/message` with `noReply: true` stores a user message
//!   and answers at once (`{info: {id, …}, parts}`) without starting a run: in a busy session the running loop
//!   takes it at its next step (after the running tool call or model request), its next assistant message has
//!   it as `parentID`, and Coda's `session/prompt` is answered after that; in an idle session it just stays
//!   stored (the next turn would carry it). `DELETE /session/{id}/message/{messageId}` removes it again (OpenCode
//!   refuses while the session is busy). OpenCode's ACP bridge forwards nothing of it (user parts are not
//!   sent live).
//! - A second ACP `session/prompt` during a turn merges the same way, but answers both prompts: not used.
//!
//! The rule this layer keeps:
//! - `initialize`: the answer declares `_meta.steering.supported: true` (top level, beside `agentCapabilities`),
//!   only when the layer can call OpenCode's server (else `_session/steering` goes to OpenCode, which does not
//!   know it).
//! - `_session/steering` while no `session/prompt` of Coda's runs in that session: `promptRequired`
//!   (`noRunningTurn`), and nothing goes to OpenCode.
//! - Otherwise the prompt's text is posted to the session with the running turn's agent and model; `injected`
//!   once the server says a step answers it ([`ServerEvent::Step`] whose `parent` is the message); when the
//!   session went idle first (the turn ended just as it was posted, or Coda cancelled it), the message is
//!   deleted again and the answer is `promptRequired`. Coda's answer to the turn is held while the steering
//!   answer is outstanding, so Coda always gets the steering answer first.
//! - One steering in flight per session: another one before the first is answered gets -32600.
//!
//! The layer does no I/O: it asks for each HTTP call through its [`Caller`] (a thread of the set-up's, see
//! `mod.rs`), whose outcome comes back as a [`ServerEvent::SteerCall`] through its event sender, in order
//! with the server's events (routed here by the set-up); it logs the events it handled to the [`Record`].

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent, SteerCallKind};
use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Layer};

const STEERING: &str = "_session/steering";

/// How long Coda's answer to a turn may wait for the steering answer once OpenCode has answered it (the
/// server's idle and the shim's own calls take milliseconds; each call gives up after 10 s).
pub const TURN_HOLD: Duration = Duration::from_secs(15);

/// A call on OpenCode's server the layer asks the set-up to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `POST /session/{session}/message?directory=…` with `body` (`noReply: true`).
    Post { session: String, directory: String, body: Value },
    /// `DELETE /session/{session}/message/{message}?directory=…`.
    Delete { session: String, directory: String, message: String },
}

/// Makes a [`Call`] off the relay thread; its outcome comes back as a [`ServerEvent::SteerCall`].
pub type Caller = Box<dyn FnMut(Call) + Send>;

/// Wake-ups: [`TURN_HOLD`] after Coda's answer to the turn of a steering message (by session) was held.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hold(String);

/// The agent and model a session's latest step ran with, for the message joining it.
#[derive(Debug, Clone, Default)]
struct RunsWith {
    agent: String,
    provider: String,
    model: String,
    variant: Option<String>,
}

/// A steering message on its way into a session's running turn.
#[derive(Debug)]
struct Steer {
    /// Coda's `_session/steering` request.
    id: Id,
    /// The `session/prompt` it joins.
    turn: Id,
    directory: String,
    /// OpenCode's id of the stored message, once the post came back.
    message: Option<String>,
    /// The user messages steps answered while the post was on its way.
    answered: Vec<String>,
    /// The session was seen idle since the post went out.
    idle: bool,
    /// The event stream was lost meanwhile: a step that took the message may have gone unseen.
    blind: bool,
    /// The delete is on its way.
    deleting: bool,
    /// OpenCode's answer to the turn, held until this one is answered.
    turn_end: Option<Frame>,
}

pub struct OpenCodeSteering {
    /// None: OpenCode's server is unknown; steering is not declared and goes to OpenCode as it is.
    caller: Option<Caller>,
    record: Record,
    /// session/new|load|resume in flight -> its cwd; session -> cwd.
    opening: HashMap<Id, String>,
    cwd: HashMap<String, String>,
    /// Session -> busy, as the server said since Coda's latest prompt in it (absent: not said yet).
    busy: HashMap<String, bool>,
    runs_with: HashMap<String, RunsWith>,
    in_flight: HashMap<String, Steer>,
}

fn params_of(v: &Value) -> &Value {
    v.get("params").unwrap_or(&Value::Null)
}

fn object_at<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let entry = map.entry(key).or_insert_with(|| json!({}));
    if !entry.is_object() {
        *entry = json!({});
    }
    entry.as_object_mut().expect("made an object above")
}

/// The text OpenCode gets for a steering `prompt`: its text blocks, and resource links as their URI, one
/// paragraph each. `Err` names what cannot be added this way.
fn steered_text(prompt: &Value) -> Result<String, String> {
    let Some(blocks) = prompt.as_array() else { return Err("`prompt` is not an array of content blocks".into()) };
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => match block.get("text").and_then(Value::as_str) {
                Some(t) => parts.push(t),
                None => return Err("a text block without `text`".into()),
            },
            Some("resource_link") => match block.get("uri").and_then(Value::as_str) {
                Some(uri) => parts.push(uri),
                None => return Err("a resource link without `uri`".into()),
            },
            Some(other) => return Err(format!("a `{other}` block cannot be added to a running OpenCode turn")),
            None => return Err("a content block without `type`".into()),
        }
    }
    let text = parts.join("\n\n");
    if text.trim().is_empty() {
        return Err("the steering message is empty".into());
    }
    Ok(text)
}

fn outcome(id: &Id, outcome: &str) -> Frame {
    let result = match outcome {
        "promptRequired" => json!({"outcome": outcome, "reason": "noRunningTurn"}),
        _ => json!({"outcome": outcome}),
    };
    frame::result_response(id, result)
}

impl OpenCodeSteering {
    /// `caller` makes the layer's calls on OpenCode's server (none: the server is unknown, steering is not
    /// declared); `record` logs the server events handled.
    pub fn new(caller: Option<Caller>, record: Record) -> OpenCodeSteering {
        OpenCodeSteering {
            caller,
            record,
            opening: HashMap::new(),
            cwd: HashMap::new(),
            busy: HashMap::new(),
            runs_with: HashMap::new(),
            in_flight: HashMap::new(),
        }
    }

    /// Coda's `session/prompt` of `session` that is with OpenCode and not answered by it.
    fn running(session: &str, cx: &Cx) -> Option<Id> {
        let prompt = cx.open_requests().find(|r| r.is("session/prompt") && r.is_sent() && r.session() == Some(session));
        prompt.map(|r| r.id.clone())
    }

    fn call(&mut self, call: Call) {
        if let Some(caller) = self.caller.as_mut() {
            caller(call);
        }
    }

    fn steer(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let v = match frame.value() {
            Ok(v) => v,
            Err(e) => return cx.unreadable(frame, &e, true),
        };
        let params = params_of(&v);
        let Some(session) = params.get("sessionId").and_then(Value::as_str) else {
            return cx.to_client(frame::error_response(&id, -32602, "`sessionId` must be a string", None));
        };
        let Some(turn) = OpenCodeSteering::running(session, cx) else {
            return cx.to_client(outcome(&id, "promptRequired"));
        };
        if self.in_flight.contains_key(session) {
            let msg = "a steering message for this session is still waiting for OpenCode";
            return cx.to_client(frame::error_response(&id, -32600, msg, None));
        }
        let text = match steered_text(params.get("prompt").unwrap_or(&Value::Null)) {
            Ok(text) => text,
            Err(why) => return cx.to_client(frame::error_response(&id, -32602, &why, None)),
        };
        let directory = self.cwd.get(session).cloned().unwrap_or_default();
        let mut body = json!({"noReply": true, "parts": [{"type": "text", "text": text}]});
        // The running turn's agent and model: a message without them would switch the rest of the turn to
        // OpenCode's default agent.
        if let Some(w) = self.runs_with.get(session).filter(|w| !w.agent.is_empty()) {
            body["agent"] = json!(w.agent);
            if !w.provider.is_empty() && !w.model.is_empty() {
                body["model"] = json!({"providerID": w.provider, "modelID": w.model});
            }
            if let Some(variant) = &w.variant {
                body["variant"] = json!(variant);
            }
        }
        let steer = Steer {
            id,
            turn,
            directory: directory.clone(),
            message: None,
            answered: Vec::new(),
            idle: false,
            blind: false,
            deleting: false,
            turn_end: None,
        };
        self.in_flight.insert(session.to_owned(), steer);
        self.call(Call::Post { session: session.to_owned(), directory, body });
    }

    /// Answers the steering message of `session` and lets the turn's answer follow it.
    fn settle(&mut self, session: &str, answer: impl FnOnce(&Id) -> Frame, cx: &mut Cx) {
        let Some(steer) = self.in_flight.remove(session) else { return };
        cx.cancel(&Hold(session.to_owned()));
        cx.to_client(answer(&steer.id));
        if let Some(end) = steer.turn_end {
            cx.to_client(end);
        }
    }

    /// What to do with a stored message nothing took yet, now that `session` is idle or its turn answered.
    fn not_taken(&mut self, session: &str, cx: &mut Cx) {
        let Some(steer) = self.in_flight.get_mut(session) else { return };
        let Some(message) = steer.message.clone() else { return };
        if steer.deleting {
            return;
        }
        if steer.blind {
            tracing::warn!(
                "OpenCode's event stream was lost while a steering message was on its way: whether its turn took it \
                 is unknown"
            );
            return self.settle(session, |id| outcome(id, "failed"), cx);
        }
        steer.deleting = true;
        let directory = steer.directory.clone();
        self.call(Call::Delete { session: session.to_owned(), directory, message });
    }

    fn step(&mut self, session: String, parent: String, runs_with: RunsWith, cx: &mut Cx) {
        self.runs_with.insert(session.clone(), runs_with);
        let Some(steer) = self.in_flight.get_mut(&session) else { return };
        match &steer.message {
            Some(m) if *m == parent && !steer.deleting => self.settle(&session, |id| outcome(id, "injected"), cx),
            Some(_) => {}
            None => steer.answered.push(parent),
        }
    }

    fn status(&mut self, session: String, busy: bool, cx: &mut Cx) {
        self.busy.insert(session.clone(), busy);
        if busy {
            return;
        }
        if let Some(steer) = self.in_flight.get_mut(&session) {
            steer.idle = true;
            self.not_taken(&session, cx);
        }
    }

    fn call_back(&mut self, session: String, call: SteerCallKind, message: String, error: Option<String>, cx: &mut Cx) {
        let Some(steer) = self.in_flight.get_mut(&session) else { return };
        match (call, error) {
            (SteerCallKind::Post, Some(e)) => {
                tracing::warn!("OpenCode did not take a steering message: {e}");
                let msg = format!("OpenCode did not take the steering message: {e}");
                self.settle(&session, |id| frame::error_response(id, -32603, &msg, None), cx);
            }
            (SteerCallKind::Post, None) => {
                if steer.message.is_some() {
                    return;
                }
                if steer.answered.contains(&message) {
                    return self.settle(&session, |id| outcome(id, "injected"), cx);
                }
                steer.message = Some(message);
                let idle = steer.idle || self.busy.get(&session) == Some(&false);
                if idle || steer.turn_end.is_some() {
                    self.not_taken(&session, cx);
                }
            }
            (SteerCallKind::Delete, None) => {
                if steer.deleting && steer.message.as_deref() == Some(message.as_str()) {
                    self.settle(&session, |id| outcome(id, "promptRequired"), cx);
                }
            }
            (SteerCallKind::Delete, Some(e)) => {
                tracing::warn!(
                    "OpenCode kept a steering message its turn did not take ({e}): the session's next turn carries it"
                );
                self.settle(&session, |id| outcome(id, "failed"), cx);
            }
        }
    }

    fn server_event(&mut self, e: ServerEvent, cx: &mut Cx) {
        if matches!(e, ServerEvent::Step { .. } | ServerEvent::SteerCall { .. }) {
            // Status events are the activity layer's to log.
            self.record.handled(&e, cx.wall());
        }
        match e {
            ServerEvent::Step { session, parent, agent, provider, model, variant, .. } => {
                self.step(session, parent, RunsWith { agent, provider, model, variant }, cx)
            }
            ServerEvent::SteerCall { session, call, message, error } => {
                self.call_back(session, call, message, error, cx)
            }
            ServerEvent::Status { session, busy } => self.status(session, busy, cx),
            _ => {}
        }
    }

    /// OpenCode's answer to a `session/prompt` of Coda's in `session`: held while a steering answer is
    /// outstanding.
    fn turn_ended(&mut self, id: &Id, session: &str, frame: Frame, cx: &mut Cx) {
        match self.in_flight.get_mut(session) {
            Some(steer) if steer.turn == *id && steer.turn_end.is_none() => {
                steer.turn_end = Some(frame);
                cx.after(TURN_HOLD, Hold(session.to_owned()));
                // The loop has ended: a message it did not take stays untaken.
                if steer.message.is_some() {
                    self.not_taken(session, cx);
                }
            }
            _ => cx.to_client(frame),
        }
    }

    fn initialized(&self, frame: Frame, cx: &mut Cx) {
        let mut v = match frame.value() {
            Ok(v) => v,
            Err(e) => return cx.unreadable(frame, &e, false),
        };
        let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) else { return cx.to_client(frame) };
        object_at(object_at(result, "_meta"), "steering").insert("supported".into(), json!(true));
        cx.to_client(frame.rewritten(&v));
    }

    /// A session's cwd, from the `session/new|load|resume` that opened it (OpenCode's server is asked in it).
    fn opened(&mut self, id: &Id, frame: &Frame, cx: &Cx) {
        let Some(cwd) = self.opening.remove(id) else { return };
        let session = match cx.request_of(id) {
            Some(r) if r.is("session/new") => frame
                .value()
                .ok()
                .and_then(|v| v.pointer("/result/sessionId").and_then(Value::as_str).map(str::to_owned)),
            Some(r) => r.session().map(str::to_owned),
            None => None,
        };
        if let Some(session) = session {
            self.cwd.insert(session, cwd);
        }
    }
}

impl Layer for OpenCodeSteering {
    type Timer = Hold;
    type Event = FromServer;
    type Reply = std::convert::Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Request { id, method } = frame.kind() else { return cx.to_agent(frame) };
        match method.as_str() {
            STEERING if self.caller.is_some() => {
                let id = id.clone();
                self.steer(id, frame, cx)
            }
            "session/prompt" => {
                if let Some(session) = cx.request_of(id).and_then(|r| r.session()) {
                    // What the server said before this turn says nothing about it.
                    self.busy.remove(session);
                }
                cx.to_agent(frame)
            }
            "session/new" | "session/load" | "session/resume" => {
                let cwd = frame.value().ok().and_then(|v| {
                    v.pointer("/params/cwd").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_owned)
                });
                if let Some(cwd) = cwd {
                    self.opening.insert(id.clone(), cwd);
                }
                cx.to_agent(frame)
            }
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Response { id } = frame.kind() else { return cx.to_client(frame) };
        let id = id.clone();
        match cx.answer_to(&frame) {
            Some(r) if r.is("initialize") && self.caller.is_some() => self.initialized(frame, cx),
            Some(r) if r.is("session/prompt") => match r.session().map(str::to_owned) {
                Some(session) => self.turn_ended(&id, &session, frame, cx),
                None => cx.to_client(frame),
            },
            Some(r) if r.is("session/new") || r.is("session/load") || r.is("session/resume") => {
                self.opened(&id, &frame, cx);
                cx.to_client(frame)
            }
            _ => cx.to_client(frame),
        }
    }

    fn on_event(&mut self, event: FromServer, cx: &mut Cx) {
        match event {
            FromServer::Event(e) => self.server_event(e, cx),
            FromServer::Lost => {
                self.busy.clear();
                for steer in self.in_flight.values_mut() {
                    steer.blind = true;
                }
            }
        }
    }

    fn on_timer(&mut self, Hold(session): Hold, cx: &mut Cx) {
        if self.in_flight.get(&session).is_some_and(|s| s.turn_end.is_some()) {
            tracing::warn!(
                "OpenCode answered a turn but did not say within {}s whether it took the steering message sent into it",
                TURN_HOLD.as_secs()
            );
            self.settle(&session, |id| outcome(id, "failed"), cx);
        }
    }
}

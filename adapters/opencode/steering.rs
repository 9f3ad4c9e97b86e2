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
//! The layer does no I/O: each HTTP call is a job ([`Cx::work`]) that runs its [`Caller`] (`calls.rs`) off the
//! relay loop; the call's outcome comes back to the layer as the job's result, a [`ServerEvent::SteerCall`]
//! handled like the server's events (routed here by the set-up). In a replay the outcome comes from the
//! recording's events file instead. The layer logs the events it handled to the [`Record`].

use std::collections::HashMap;
use std::sync::Arc;
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

/// Makes a [`Call`] on OpenCode's server and gives its outcome (a [`ServerEvent::SteerCall`]), or `None` when
/// the outcome comes another way (a replay's events file, `calls::Gate`). An HTTP request: the layer runs it
/// as a job ([`Cx::work`]), off the relay loop.
pub type Caller = Arc<dyn Fn(Call) -> Option<ServerEvent> + Send + Sync>;

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

    /// Asks the engine to make `call` off the relay loop ([`Cx::work`]); its outcome comes back to
    /// [`OpenCodeSteering::called`].
    fn call(&mut self, call: Call, cx: &mut Cx) {
        if let Some(caller) = self.caller.clone() {
            cx.work(move || caller(call), OpenCodeSteering::called);
        }
    }

    /// The outcome of a call, as the server's events are handled (none: a replay's file brings it).
    fn called(&mut self, outcome: Option<ServerEvent>, cx: &mut Cx) {
        if let Some(e) = outcome {
            self.server_event(e, cx);
        }
    }

    fn steer(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let v = frame.value();
        let params = params_of(v);
        let Some(session) = params.get("sessionId").and_then(Value::as_str) else {
            return cx.to_client(frame::error_response(&id, -32602, "`sessionId` must be a string", None));
        };
        let Some(turn) = OpenCodeSteering::running(session, cx) else {
            return cx.to_client(outcome(&id, "promptRequired"));
        };
        // Not running in OpenCode (not yet, or no more): a message stored now would sit before the turn's own
        // or after its end, seen by the model without a step answering it.
        if self.busy.get(session) != Some(&true) {
            tracing::debug!("a steering message while OpenCode's server does not say the session runs");
            return cx.to_client(outcome(&id, "promptRequired"));
        }
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
        self.call(Call::Post { session: session.to_owned(), directory, body }, cx);
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
        self.call(Call::Delete { session: session.to_owned(), directory, message }, cx);
    }

    /// A step of `session`: begun (said when created) or completed (said again), answering `parent`.
    fn step(&mut self, session: String, parent: Option<String>, begun: bool, runs_with: RunsWith, cx: &mut Cx) {
        self.runs_with.insert(session.clone(), runs_with);
        // A step begins only in a busy session (one busy since before Coda's prompt says so only this way);
        // its completion may be said after the session went idle.
        if begun {
            self.busy.insert(session.clone(), true);
        }
        let Some(parent) = parent else { return };
        let Some(steer) = self.in_flight.get_mut(&session) else { return };
        match &steer.message {
            Some(m) if *m == parent && !steer.deleting => self.settle(&session, |id| outcome(id, "injected"), cx),
            Some(_) => {}
            None if !steer.answered.contains(&parent) => steer.answered.push(parent),
            None => {}
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
        if matches!(e, ServerEvent::SteerCall { .. }) {
            // Status events are the activity layer's to log, steps the usage layer's.
            self.record.handled(&e, cx.wall());
        }
        match e {
            // A compaction's summary is no step of the turn's loop (and runs with no agent of the user's).
            ServerEvent::Step(s) if !s.summary => {
                let runs_with = RunsWith {
                    agent: s.agent.unwrap_or_default(),
                    provider: s.provider.unwrap_or_default(),
                    model: s.model.unwrap_or_default(),
                    variant: s.variant,
                };
                self.step(s.session, s.parent, s.completed_ms.is_none(), runs_with, cx)
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
        let mut v = frame.to_value();
        let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) else { return cx.to_client(frame) };
        object_at(object_at(result, "_meta"), "steering").insert("supported".into(), json!(true));
        cx.to_client(frame.rewritten(v));
    }

    /// A session's cwd, from the `session/new|load|resume` that opened it (OpenCode's server is asked in it).
    fn opened(&mut self, id: &Id, frame: &Frame, cx: &Cx) {
        let Some(cwd) = self.opening.remove(id) else { return };
        let session = match cx.request_of(id) {
            Some(r) if r.is("session/new") => {
                frame.value().pointer("/result/sessionId").and_then(Value::as_str).map(str::to_owned)
            }
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
                let cwd = frame.value().pointer("/params/cwd").and_then(Value::as_str);
                let cwd = cwd.filter(|c| !c.is_empty()).map(str::to_owned);
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

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Response { .. })
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
            FromServer::Read(_) => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::opencode::usage::Step;
    use crate::layer::testing::Harness;
    use std::sync::{Arc, Mutex};

    const S: &str = "ses_dcaf2a434ffepMPb2u2iYLaUB1";
    const M: &str = "msg_2350d73f1001wRZ2KVnte3BwHf";

    type Calls = Arc<Mutex<Vec<Call>>>;

    /// The layer with a caller that keeps the calls asked for, initialized, with session S opened in /w.
    fn started() -> (Harness, Calls) {
        let calls = Calls::default();
        let kept = calls.clone();
        let caller: Caller = Arc::new(move |c| {
            kept.lock().expect("lock").push(c);
            None
        });
        let mut h = Harness::of(OpenCodeSteering::new(Some(caller), Record::off()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w d","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.to_client();
        h.to_agent();
        (h, calls)
    }

    fn taken(calls: &Calls) -> Vec<Call> {
        std::mem::take(&mut *calls.lock().expect("lock"))
    }

    fn steer(h: &mut Harness, id: i64, text: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":STEERING,"params":{"sessionId":S,
            "prompt":[{"type":"text","text":text}],"_meta":{"steering":{"idleBehavior":"promptRequired"}}}}));
    }

    fn prompt(h: &mut Harness, id: i64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"run it"}]}}));
        assert_eq!(h.to_agent().len(), 1, "the prompt goes on");
    }

    fn end(id: i64, reason: &str) -> Value {
        json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":reason,"_meta":{}}})
    }

    fn event(h: &mut Harness, e: ServerEvent) {
        h.event(0, FromServer::Event(e));
    }

    fn status(h: &mut Harness, busy: bool) {
        event(h, ServerEvent::Status { session: S.into(), busy });
    }

    fn step(h: &mut Harness, message: &str, parent: &str) {
        event(h, ServerEvent::Step(Box::new(step_of(S, message, parent, "plan"))));
    }

    fn step_of(session: &str, message: &str, parent: &str, agent: &str) -> Step {
        Step {
            session: session.into(),
            message: message.into(),
            created_ms: 1,
            completed_ms: None,
            tokens: None,
            output: None,
            summary: false,
            provider: Some("fake".into()),
            model: Some("fake-model".into()),
            parent: Some(parent.into()),
            agent: (!agent.is_empty()).then(|| agent.into()),
            variant: None,
        }
    }

    fn posted(h: &mut Harness, message: &str) {
        let e = ServerEvent::SteerCall {
            session: S.into(),
            call: SteerCallKind::Post,
            message: message.into(),
            error: None,
        };
        event(h, e);
    }

    fn deleted(h: &mut Harness, message: &str, error: Option<&str>) {
        let error = error.map(str::to_owned);
        event(
            h,
            ServerEvent::SteerCall { session: S.into(), call: SteerCallKind::Delete, message: message.into(), error },
        );
    }

    /// A turn with a step running (the agent and model of the turn known) and a steering message posted.
    fn steered(h: &mut Harness, calls: &Calls) {
        prompt(h, 2);
        status(h, true);
        step(h, "msg_a1", "msg_u1");
        steer(h, 3, "Stop changing the tests.");
        assert!(h.to_agent().is_empty() && h.to_client().is_empty(), "no answer before the server's");
        assert_eq!(taken(calls).len(), 1);
    }

    fn required() -> Value {
        json!({"outcome":"promptRequired","reason":"noRunningTurn"})
    }

    #[test]
    fn initialize_declares_steering_only_with_a_server_to_call() {
        let (mut h, _) = started();
        h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"initialize","params":{}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":9,"result":{"agentCapabilities":{},"_meta":{"x":1}}}));
        assert_eq!(h.to_client()[0]["result"]["_meta"], json!({"x":1,"steering":{"supported":true}}));
        // OpenCode's numbers keep their spelling; a `_meta` that is no object is replaced; errors pass.
        h.from_client(json!({"jsonrpc":"2.0","id":10,"method":"initialize","params":{}}));
        h.agent_frame(Frame::parse(br#"{"jsonrpc":"2.0","id":10,"result":{"n":1e400,"_meta":7}}"#.to_vec()).unwrap());
        let text = String::from_utf8_lossy(h.take().to_client[0].bytes()).into_owned();
        assert!(text.contains(r#""n":1e400"#) && text.contains(r#""_meta":{"steering":{"supported":true}}"#), "{text}");
        h.from_client(json!({"jsonrpc":"2.0","id":11,"method":"initialize","params":{}}));
        let error = json!({"jsonrpc":"2.0","id":11,"error":{"code":-32000,"message":"auth"}});
        h.from_agent(error.clone());
        assert_eq!(h.to_client(), vec![error]);

        // Without OpenCode's server: nothing declared, and a steering request is OpenCode's to answer.
        let mut h = Harness::of(OpenCodeSteering::new(None, Record::off()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        h.to_agent();
        let plain = json!({"jsonrpc":"2.0","id":0,"result":{"agentCapabilities":{}}});
        h.from_agent(plain.clone());
        assert_eq!(h.to_client(), vec![plain]);
        prompt(&mut h, 2);
        steer(&mut h, 3, "x");
        assert_eq!(h.to_agent()[0]["method"], STEERING);
        assert!(h.to_client().is_empty());
    }

    #[test]
    fn between_turns_the_answer_is_prompt_required_and_opencode_sees_nothing() {
        let (mut h, calls) = started();
        steer(&mut h, 5, "先别改测试");
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":5,"result":required()})]);
        assert!(h.to_agent().is_empty() && taken(&calls).is_empty());
        // While OpenCode has not said the turn runs, or has said it is over.
        prompt(&mut h, 4);
        steer(&mut h, 5, "too early");
        assert_eq!(h.to_client()[0]["result"], required());
        status(&mut h, true);
        status(&mut h, false);
        steer(&mut h, 5, "too late");
        assert_eq!(h.to_client()[0]["result"], required());
        assert!(taken(&calls).is_empty());
        h.from_agent(end(4, "end_turn"));
        h.to_client();
        // OpenCode busy with a run of its own when Coda's prompt came: its step says the session runs.
        prompt(&mut h, 20);
        step(&mut h, "msg_a20", "msg_u20");
        steer(&mut h, 21, "now");
        assert!(matches!(&taken(&calls)[..], [Call::Post { .. }]));
        h.from_agent(end(20, "end_turn"));
        posted(&mut h, M);
        taken(&calls);
        deleted(&mut h, M, None);
        assert_eq!(h.to_client()[0]["result"], required());
        h.to_client();
        // After a turn ended too, and in another session's turn.
        prompt(&mut h, 6);
        h.from_agent(end(6, "end_turn"));
        h.to_client();
        steer(&mut h, 7, "again");
        assert_eq!(h.to_client()[0]["result"], required());
        h.from_client(json!({"jsonrpc":"2.0","id":8,"method":"session/prompt","params":{"sessionId":"ses_other",
            "prompt":[{"type":"text","text":"x"}]}}));
        steer(&mut h, 9, "not that one");
        assert_eq!(h.to_client()[0]["result"], required());
        assert!(taken(&calls).is_empty());
    }

    #[test]
    fn during_a_turn_the_message_is_posted_with_the_turns_agent_and_injected_once_a_step_answers_it() {
        let (mut h, calls) = started();
        prompt(&mut h, 2);
        status(&mut h, true);
        step(&mut h, "msg_a1", "msg_u1");
        let text = "Stop changing the tests.\n\n只看实现\n- keep `main` green";
        h.from_client(json!({"jsonrpc":"2.0","id":"steer-1","method":STEERING,"params":{"sessionId":S,
            "prompt":[{"type":"text","text":text},{"type":"resource_link","uri":"file:///p/a.rs","name":"a.rs"}]}}));
        assert!(h.to_agent().is_empty() && h.to_client().is_empty());
        let body = json!({"noReply":true,"parts":[{"type":"text","text":format!("{text}\n\nfile:///p/a.rs")}],
            "agent":"plan","model":{"providerID":"fake","modelID":"fake-model"}});
        assert_eq!(taken(&calls), vec![Call::Post { session: S.into(), directory: "/w d".into(), body }]);
        posted(&mut h, M);
        assert!(h.to_client().is_empty(), "stored, not taken yet");
        // A step answering another message is not it; the one answering it is.
        step(&mut h, "msg_a2", "msg_u1");
        assert!(h.to_client().is_empty());
        step(&mut h, "msg_a3", M);
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":"steer-1","result":{"outcome":"injected"}})]);
        status(&mut h, false);
        h.from_agent(end(2, "end_turn"));
        assert_eq!(h.to_client(), vec![end(2, "end_turn")], "the turn's one answer passes");
        assert!(taken(&calls).is_empty(), "nothing deleted");
    }

    #[test]
    fn a_step_seen_before_the_post_came_back_counts() {
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        step(&mut h, "msg_a2", M);
        assert!(h.to_client().is_empty());
        posted(&mut h, M);
        assert_eq!(h.to_client()[0]["result"], json!({"outcome":"injected"}));
    }

    #[test]
    fn stored_but_the_session_went_idle_first_is_deleted_and_prompt_required_before_the_turns_answer() {
        // The turn ends just as the message is posted: idle before the post came back.
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        status(&mut h, false);
        h.from_agent(end(2, "end_turn"));
        assert!(h.to_client().is_empty(), "the turn's answer waits for the steering answer");
        posted(&mut h, M);
        assert_eq!(
            taken(&calls),
            vec![Call::Delete { session: S.into(), directory: "/w d".into(), message: M.into() }]
        );
        deleted(&mut h, M, None);
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":3,"result":required()}), end(2, "end_turn")]);
        assert_eq!(h.next_wake(), None, "the hold is over");

        // Idle after the post came back.
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        posted(&mut h, M);
        assert!(taken(&calls).is_empty(), "busy: the loop takes it at its next step");
        status(&mut h, false);
        assert!(matches!(&taken(&calls)[..], [Call::Delete { .. }]));
        deleted(&mut h, M, None);
        assert_eq!(h.to_client()[0]["result"], required());
    }

    #[test]
    fn the_turns_answer_before_the_idle_asks_for_the_delete_too() {
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        posted(&mut h, M);
        h.from_agent(end(2, "end_turn"));
        assert!(h.to_client().is_empty());
        assert!(matches!(&taken(&calls)[..], [Call::Delete { .. }]));
        // The idle that follows asks nothing more.
        status(&mut h, false);
        assert!(taken(&calls).is_empty());
        deleted(&mut h, M, None);
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":3,"result":required()}), end(2, "end_turn")]);
    }

    #[test]
    fn a_cancelled_turn_takes_the_message_back() {
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        posted(&mut h, M);
        h.from_client(json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}}));
        assert_eq!(h.to_agent()[0]["method"], "session/cancel");
        status(&mut h, false);
        assert!(matches!(&taken(&calls)[..], [Call::Delete { .. }]));
        deleted(&mut h, M, None);
        assert_eq!(h.to_client()[0]["result"], required());
        h.from_agent(end(2, "cancelled"));
        assert_eq!(h.to_client(), vec![end(2, "cancelled")]);
    }

    #[test]
    fn failed_calls_are_errors_or_unknown_outcomes_never_injected() {
        // The post failed (the server went away): an error, and the held turn's answer follows.
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        h.from_agent(end(2, "end_turn"));
        let e = ServerEvent::SteerCall {
            session: S.into(),
            call: SteerCallKind::Post,
            message: String::new(),
            error: Some("Connection refused".into()),
        };
        event(&mut h, e);
        let out = h.to_client();
        assert_eq!(out[0]["id"], 3);
        assert_eq!(out[0]["error"]["code"], -32603);
        assert_eq!(out[1], end(2, "end_turn"));
        // The delete was refused: the message stays stored, its fate for Coda unknown.
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        posted(&mut h, M);
        status(&mut h, false);
        taken(&calls);
        deleted(&mut h, M, Some("HTTP 400"));
        assert_eq!(h.to_client()[0]["result"], json!({"outcome":"failed"}));
    }

    #[test]
    fn a_lost_event_stream_makes_the_outcome_unknown_and_nothing_is_deleted() {
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        posted(&mut h, M);
        h.event(0, FromServer::Lost);
        status(&mut h, true);
        status(&mut h, false);
        assert!(taken(&calls).is_empty(), "a step that took it may have gone unseen: no delete");
        assert_eq!(h.to_client()[0]["result"], json!({"outcome":"failed"}));
    }

    #[test]
    fn a_held_turn_answer_waits_no_longer_than_the_hold() {
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        h.from_agent(end(2, "end_turn"));
        h.advance(TURN_HOLD - Duration::from_millis(1));
        assert!(h.to_client().is_empty());
        h.advance(Duration::from_millis(1));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":3,"result":{"outcome":"failed"}}), end(2, "end_turn")]
        );
        // What comes late changes nothing.
        posted(&mut h, M);
        step(&mut h, "msg_a9", M);
        assert!(h.to_client().is_empty() && taken(&calls).is_empty());
    }

    #[test]
    fn one_steering_in_flight_per_session() {
        let (mut h, calls) = started();
        steered(&mut h, &calls);
        steer(&mut h, 4, "two");
        assert_eq!(h.to_client()[0]["error"]["code"], -32600);
        assert!(taken(&calls).is_empty());
        posted(&mut h, M);
        step(&mut h, "msg_a2", M);
        assert_eq!(h.to_client()[0]["result"]["outcome"], "injected");
        steer(&mut h, 5, "three");
        assert_eq!(taken(&calls).len(), 1, "the next one goes once the first is answered");
    }

    #[test]
    fn bad_steering_requests_get_clear_errors_and_reach_no_one() {
        let (mut h, calls) = started();
        prompt(&mut h, 2);
        status(&mut h, true);
        for (id, params) in [
            (10, json!({"prompt":[{"type":"text","text":"x"}]})),
            (11, json!({"sessionId":7,"prompt":[{"type":"text","text":"x"}]})),
            (12, json!({"sessionId":S,"prompt":"x"})),
            (13, json!({"sessionId":S,"prompt":[{"type":"image","data":"AAAA","mimeType":"image/png"}]})),
            (14, json!({"sessionId":S,"prompt":[{"type":"text","text":"  \n"}]})),
            (15, json!({"sessionId":S,"prompt":[{"text":"no type"}]})),
            (16, json!({"sessionId":S,"prompt":[{"type":"text","text":7}]})),
            (17, json!({"sessionId":S,"prompt":[{"type":"resource_link","name":"no uri"}]})),
        ] {
            h.from_client(json!({"jsonrpc":"2.0","id":id,"method":STEERING,"params":params}));
            assert!(h.to_agent().is_empty(), "{id}");
            assert_eq!(h.to_client()[0]["error"]["code"], -32602, "{id}");
        }
        assert!(taken(&calls).is_empty());
        // Odd numbers and a huge message are the server's to take, spelled as they came.
        let big = "x".repeat(1 << 20);
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":18,"method":"_session/steering","params":{{"sessionId":"{S}","n":1e400,"prompt":[{{"type":"text","text":"{big}"}}]}}}}"#
        );
        h.client_frame(Frame::parse(line.into_bytes()).unwrap());
        let [Call::Post { body, .. }] = &taken(&calls)[..] else { panic!("one post") };
        assert_eq!(body["parts"][0]["text"].as_str().map(str::len), Some(1 << 20));
        // Nesting too deep to read never reaches a layer: the engine answers it (src/relay/behaviour.rs).
        let n = crate::json::MAX_DEPTH + 5;
        let deep = format!("{}{}", "[".repeat(n), "]".repeat(n));
        let line = format!(r#"{{"jsonrpc":"2.0","id":19,"method":"_session/steering","params":{deep}}}"#);
        assert!(Frame::parse(line.into_bytes()).is_err());
    }

    #[test]
    fn events_of_other_sessions_and_strays_change_nothing() {
        let (mut h, calls) = started();
        // Outcomes and steps nobody waits for.
        posted(&mut h, M);
        deleted(&mut h, M, None);
        step(&mut h, "msg_a1", M);
        assert!(h.to_client().is_empty() && taken(&calls).is_empty());
        steered(&mut h, &calls);
        posted(&mut h, M);
        // Another session going idle, a step there answering the same id, a delete never asked for.
        event(&mut h, ServerEvent::Status { session: "ses_other".into(), busy: false });
        let other = ServerEvent::Step(Box::new(step_of("ses_other", "msg_b", M, "")));
        event(&mut h, other);
        deleted(&mut h, M, None);
        // A second post outcome for the same steer is not a new message.
        posted(&mut h, "msg_other");
        assert!(h.to_client().is_empty() && taken(&calls).is_empty());
        step(&mut h, "msg_a2", M);
        assert_eq!(h.to_client()[0]["result"]["outcome"], "injected");
    }
}

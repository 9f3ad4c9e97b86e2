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
//! So OpenCode's backend for the engine's steering machine ([`crate::coda::steering`], which keeps the rules):
//! - Declared only when the layer can call OpenCode's server (else `_session/steering` goes to OpenCode, which
//!   does not know it).
//! - OpenCode says when Coda's turn runs: its server's `session.status` busy, or a step beginning (both told to
//!   the session table). A message waits for that (the machine's rule); one steered once the server said the
//!   session is idle again is not posted (`promptRequired`).
//! - The prompt's text (text blocks, resource links as their URI) is posted to the session with the running
//!   turn's agent and model; `injected` once the server says a step answers it ([`ServerEvent::Step`] whose
//!   `parent` is the message); when the session went idle first, or Coda's turn ended (the loop will not take
//!   it), the message is deleted again and the answer is `promptRequired`; a failed delete, or an event stream
//!   lost meanwhile, leaves the outcome unknown.
//!
//! The backend does no I/O: each HTTP call is a job that runs its [`Caller`] (`calls.rs`) off the relay loop;
//! the call's outcome comes back as the job's result, a [`ServerEvent::SteerCall`] handled like the server's
//! events. In a replay the outcome comes from the recording's events file instead. The backend logs the steering
//! calls' outcomes to the [`Record`].

use crate::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent, SteerCallKind};
use crate::coda::steering::{Ctl, Outcome, Steerer};
use crate::frame::{Frame, Id, Kind};
use crate::layer::Cx;

/// A call on OpenCode's server the backend asks the set-up to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `POST /session/{session}/message?directory=…` with `body` (`noReply: true`).
    Post { session: String, directory: String, body: Value },
    /// `DELETE /session/{session}/message/{message}?directory=…`.
    Delete { session: String, directory: String, message: String },
}

/// Makes a [`Call`] on OpenCode's server and gives its outcome (a [`ServerEvent::SteerCall`]), or `None` when
/// the outcome comes another way (a replay's events file, `calls::Gate`). An HTTP request: the backend runs it
/// as a job, off the relay loop.
pub type Caller = Arc<dyn Fn(Call) -> Option<ServerEvent> + Send + Sync>;

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
    round: u64,
    directory: String,
    /// OpenCode's id of the stored message, once the post came back.
    message: Option<String>,
    /// The user messages steps answered while the post was on its way.
    answered: Vec<String>,
    /// The session was seen idle since the post went out.
    idle: bool,
    /// Coda's turn ended.
    turn_ended: bool,
    /// The event stream was lost meanwhile: a step that took the message may have gone unseen.
    blind: bool,
    /// The delete is on its way.
    deleting: bool,
}

/// OpenCode's steering (see the module docs).
pub struct OpenCodeSteering {
    /// None: OpenCode's server is unknown; steering is not declared and goes to OpenCode as it is.
    caller: Option<Caller>,
    record: Record,
    /// session/new|load|resume in flight -> its cwd; session -> cwd.
    opening: HashMap<Id, String>,
    cwd: HashMap<String, String>,
    runs_with: HashMap<String, RunsWith>,
    steers: HashMap<String, Steer>,
}

/// The text OpenCode gets for a steering `prompt`: its text blocks, and resource links as their URI, one
/// paragraph each. `Err` names what cannot be added this way.
fn steered_text(blocks: &[Value]) -> Result<String, String> {
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(block.get("text").and_then(Value::as_str).unwrap_or_default()),
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

fn busy(cx: &mut Cx, session: &str, busy: bool) {
    if let Some(s) = cx.session_mut(session) {
        s.set_busy(busy);
    }
}

impl OpenCodeSteering {
    /// `caller` makes the backend's calls on OpenCode's server (none: the server is unknown, steering is not
    /// declared); `record` logs the server events handled.
    pub fn new(caller: Option<Caller>, record: Record) -> OpenCodeSteering {
        OpenCodeSteering {
            caller,
            record,
            opening: HashMap::default(),
            cwd: HashMap::default(),
            runs_with: HashMap::default(),
            steers: HashMap::default(),
        }
    }

    /// Makes `call` off the relay loop; its outcome comes back to [`OpenCodeSteering::called`].
    fn call(&mut self, call: Call, ctl: &mut Ctl<Self>) {
        if let Some(caller) = self.caller.clone() {
            ctl.work(move || caller(call), OpenCodeSteering::called);
        }
    }

    /// The outcome of a call, as the server's events are handled (none: a replay's file brings it).
    fn called(&mut self, outcome: Option<ServerEvent>, ctl: &mut Ctl<Self>) {
        if let Some(e) = outcome {
            self.server_event(e, ctl);
        }
    }

    /// What to do with a stored message nothing took yet, now that `session` is idle or its turn answered.
    fn not_taken(&mut self, session: &str, ctl: &mut Ctl<Self>) {
        let Some(steer) = self.steers.get_mut(session) else { return };
        let Some(message) = steer.message.clone() else { return };
        if steer.deleting {
            return;
        }
        if steer.blind {
            tracing::warn!(
                "OpenCode's event stream was lost while a steering message was on its way: whether its turn took it \
                 is unknown"
            );
            return ctl.answer(session, steer.round, Outcome::Unknown);
        }
        steer.deleting = true;
        let directory = steer.directory.clone();
        self.call(Call::Delete { session: session.to_owned(), directory, message }, ctl);
    }

    /// A step of `session`: begun (said when created) or completed (said again), answering `parent`.
    fn step(&mut self, session: String, parent: Option<String>, begun: bool, runs_with: RunsWith, ctl: &mut Ctl<Self>) {
        self.runs_with.insert(session.clone(), runs_with);
        // A step begins only in a busy session (one busy since before Coda's prompt says so only this way);
        // its completion may be said after the session went idle.
        if begun {
            busy(ctl.cx, &session, true);
        }
        let Some(parent) = parent else { return };
        let Some(steer) = self.steers.get_mut(&session) else { return };
        match &steer.message {
            Some(m) if *m == parent && !steer.deleting => ctl.answer(&session, steer.round, Outcome::Injected),
            Some(_) => {}
            None if !steer.answered.contains(&parent) => steer.answered.push(parent),
            None => {}
        }
    }

    fn status(&mut self, session: String, is_busy: bool, ctl: &mut Ctl<Self>) {
        busy(ctl.cx, &session, is_busy);
        if is_busy {
            return;
        }
        if let Some(steer) = self.steers.get_mut(&session) {
            steer.idle = true;
            self.not_taken(&session, ctl);
        }
    }

    fn call_back(
        &mut self,
        session: String,
        call: SteerCallKind,
        message: String,
        error: Option<String>,
        ctl: &mut Ctl<Self>,
    ) {
        let Some(steer) = self.steers.get_mut(&session) else { return };
        let round = steer.round;
        match (call, error) {
            (SteerCallKind::Post, Some(e)) => {
                tracing::warn!("OpenCode did not take a steering message: {e}");
                let message = format!("OpenCode did not take the steering message: {e}");
                ctl.answer(&session, round, Outcome::Error { code: -32603, message });
            }
            (SteerCallKind::Post, None) => {
                if steer.message.is_some() {
                    return;
                }
                if steer.answered.contains(&message) {
                    return ctl.answer(&session, round, Outcome::Injected);
                }
                steer.message = Some(message);
                let idle = steer.idle || ctl.cx.session(&session).and_then(|s| s.busy()) == Some(false);
                if idle || steer.turn_ended {
                    self.not_taken(&session, ctl);
                }
            }
            (SteerCallKind::Delete, None) => {
                if steer.deleting && steer.message.as_deref() == Some(message.as_str()) {
                    ctl.answer(&session, round, Outcome::PromptRequired);
                }
            }
            (SteerCallKind::Delete, Some(e)) => {
                tracing::warn!(
                    "OpenCode kept a steering message its turn did not take ({e}): the session's next turn carries it"
                );
                ctl.answer(&session, round, Outcome::Unknown);
            }
        }
    }

    fn server_event(&mut self, e: ServerEvent, ctl: &mut Ctl<Self>) {
        if matches!(e, ServerEvent::SteerCall { .. }) {
            // Every layer hears every event; these are this one's to log.
            self.record.handled(&e, ctl.cx.wall());
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
                self.step(s.session, s.parent, s.completed_ms.is_none(), runs_with, ctl)
            }
            ServerEvent::SteerCall { session, call, message, error } => {
                self.call_back(session, call, message, error, ctl)
            }
            ServerEvent::Status { session, busy } => self.status(session, busy, ctl),
            _ => {}
        }
    }
}

impl Steerer for OpenCodeSteering {
    fn session_closed(&mut self, session: &str) {
        self.cwd.remove(session);
        self.runs_with.remove(session);
        self.steers.remove(session);
    }

    fn kept(&self) -> usize {
        self.opening.len() + self.cwd.len() + self.runs_with.len() + self.steers.len()
    }

    type Event = FromServer;
    type Reply = std::convert::Infallible;
    type Timer = std::convert::Infallible;

    const SAYS_STARTED: bool = true;

    fn declares(&self) -> bool {
        self.caller.is_some()
    }

    fn accepts(&self, prompt: &[Value]) -> Result<(), String> {
        steered_text(prompt).map(|_| ())
    }

    fn steer(&mut self, session: &str, round: u64, prompt: &[Value], ctl: &mut Ctl<Self>) {
        let Ok(text) = steered_text(prompt) else { return };
        // The server said the turn is over already: a message stored now would sit after its end.
        if ctl.cx.session(session).and_then(|s| s.busy()) == Some(false) {
            tracing::debug!("a steering message while OpenCode's server says the session is idle");
            return ctl.answer(session, round, Outcome::PromptRequired);
        }
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
            round,
            directory: directory.clone(),
            message: None,
            answered: Vec::new(),
            idle: false,
            turn_ended: false,
            blind: false,
            deleting: false,
        };
        self.steers.insert(session.to_owned(), steer);
        self.call(Call::Post { session: session.to_owned(), directory, body }, ctl);
    }

    fn turn_ended(&mut self, session: &str, _round: u64, ctl: &mut Ctl<Self>) {
        let Some(steer) = self.steers.get_mut(session) else { return };
        steer.turn_ended = true;
        // The loop has ended: a message it did not take stays untaken.
        if steer.message.is_some() {
            self.not_taken(session, ctl);
        }
    }

    fn finished(&mut self, session: &str, round: u64) {
        if self.steers.get(session).is_some_and(|s| s.round == round) {
            self.steers.remove(session);
        }
    }

    fn client_request(&mut self, frame: &Frame, _cx: &mut Cx) {
        let Kind::Request { id, method } = frame.kind() else { return };
        if matches!(method.as_str(), "session/new" | "session/load" | "session/resume") {
            let cwd = frame.value().pointer("/params/cwd").and_then(Value::as_str);
            if let Some(cwd) = cwd.filter(|c| !c.is_empty()) {
                self.opening.insert(id.clone(), cwd.to_owned());
            }
        }
    }

    fn from_agent(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        let Kind::Response { id } = frame.kind() else { return true };
        // A session's cwd, from the `session/new|load|resume` that opened it (OpenCode's server is asked in it).
        let Some(cwd) = self.opening.remove(id) else { return true };
        let session = match ctl.cx.request_of(id) {
            Some(r) if r.is("session/new") => {
                frame.value().pointer("/result/sessionId").and_then(Value::as_str).map(str::to_owned)
            }
            Some(r) => r.session().map(str::to_owned),
            None => None,
        };
        if let Some(session) = session {
            if self.cwd.len() >= crate::layer::sessions::MAX_ROOTS {
                self.cwd.clear();
                self.runs_with.clear();
            }
            self.cwd.insert(session, cwd);
        }
        true
    }

    fn ignores(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Response { .. })
    }

    fn on_event(&mut self, event: FromServer, ctl: &mut Ctl<Self>) {
        match event {
            FromServer::Event(e) => self.server_event(e, ctl),
            FromServer::Lost => {
                for steer in self.steers.values_mut() {
                    steer.blind = true;
                }
            }
            FromServer::Read(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::opencode::usage::Step;
    use crate::coda::steering::{METHOD as STEERING, START_WAIT, Steering, TURN_HOLD};
    use crate::layer::testing::Harness;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

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
        let mut h = Harness::of(Steering::new(OpenCodeSteering::new(Some(caller), Record::off())));
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
        let mut h = Harness::of(Steering::new(OpenCodeSteering::new(None, Record::off())));
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
        // While OpenCode has not said the turn runs the message waits for it, then goes nowhere.
        prompt(&mut h, 4);
        steer(&mut h, 5, "too early");
        assert!(h.to_client().is_empty(), "it waits for the server to say the turn runs");
        h.advance(START_WAIT);
        assert_eq!(h.to_client()[0]["result"], required());
        // Once it said it is over.
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

#[cfg(test)]
mod waits_for_the_server {
    use super::*;
    use crate::coda::steering::{METHOD, Steering};
    use crate::layer::testing::Harness;
    use std::sync::Mutex;

    #[test]
    fn a_message_before_the_server_said_the_turn_runs_is_posted_once_it_does() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let kept = calls.clone();
        let caller: Caller = Arc::new(move |c| {
            kept.lock().expect("lock").push(c);
            None
        });
        let mut h = Harness::of(Steering::new(OpenCodeSteering::new(Some(caller), Record::off())));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}));
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}));
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":METHOD,"params":{"sessionId":"s",
            "prompt":[{"type":"text","text":"early"}]}}));
        h.take();
        assert!(calls.lock().expect("lock").is_empty(), "not posted before the server said the turn runs");
        h.event(0, FromServer::Event(ServerEvent::Status { session: "s".into(), busy: true }));
        assert_eq!(calls.lock().expect("lock").len(), 1, "posted once it did");
        assert!(h.to_client().is_empty());
    }
}

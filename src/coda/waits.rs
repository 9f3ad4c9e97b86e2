//! The waits handshake, once for every binary: which `_coda/wait` reports reach the client, and `_coda/wait/stop`.
//!
//! Section "Agent 活动", 能力协商: Coda declares `clientCapabilities._meta.coda.waits` in `initialize`; a
//! client that does not is not sent `_coda/wait`. The agent declares `agentCapabilities._meta.coda.waits: {}`
//! in its answer. The engine puts [`Waits`] nearest the client in every stack, so the adapters' layers report
//! their waits unconditionally and this layer alone decides what the client gets:
//!
//! - the client's `initialize`: remembers whether the client declared waits;
//! - the agent's answer to it (the stack's request table says which answer that is, whatever the id's JSON
//!   type): declares waits, unless a layer below left the note [`crate::coda::wait::WithholdWaits`] on the
//!   request (the adapter found its CLI reports nothing);
//! - `_coda/wait` towards the client: passed on only to a client that declared waits. So are the
//!   `session/update`s of a child session that the client could only know from a report's `childSessionId`
//!   (field table, `childSessionId`); requests of such a session always pass, since they need an answer;
//! - `_coda/wait/stop` from the client: answered here when the reports seen say what to answer (invalid
//!   params, no such wait, not `stoppable`: -32602; already ended: `{}`); an open stoppable wait's stop goes
//!   on down, where the layer that reported the wait stops it and answers.
//!
//! Every report is read on its way (they are the shim's own or few).

use crate::HashMap;
use std::collections::VecDeque;
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::wait::{self, State, WithholdWaits};
use crate::frame::{self, Frame, Id, Kind};
use crate::json::str_of;
use crate::layer::{Cx, Layer};

/// Waits remembered at most (past that the oldest ended ones are forgotten first: a stop of one of those is
/// then answered as of a wait never reported).
pub const MAX_SEEN: usize = 4096;

/// What the reports so far said about one `(sessionId, waitId)`.
#[derive(Debug, Default)]
struct Seen {
    stoppable: bool,
    ended: bool,
}

/// Coda's waits handshake and stop routing (see the module docs).
#[derive(Default)]
pub struct Waits {
    /// The client declared `_meta.coda.waits` in its latest `initialize`.
    declared: bool,
    /// By `(sessionId, waitId)`, from the reports that went up; at most [`MAX_SEEN`].
    seen: HashMap<(String, String), Seen>,
    /// The keys of `seen`, oldest first.
    order: VecDeque<(String, String)>,
    /// A report named a child session (the stack's session table has it, [`Cx::add_child`]).
    children: bool,
}

impl Waits {
    pub fn new() -> Waits {
        Waits::default()
    }

    fn client_initialize(&mut self, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        self.declared = value.get("params").is_some_and(wait::client_declares_waits);
        cx.to_agent(frame)
    }

    /// The agent's `initialize` answer: declares waits unless withheld; anything but a result passes as it is.
    fn initialized(&mut self, frame: Frame, cx: &mut Cx) {
        let mut value = frame.to_value();
        let Some(result) = value.get_mut("result").filter(|r| r.is_object()) else { return cx.to_client(frame) };
        if cx.answer_to(&frame).is_some_and(|r| r.note::<WithholdWaits>().is_some()) {
            return cx.to_client(frame);
        }
        wait::declare_waits(result);
        cx.to_client(frame.rewritten(value))
    }

    /// A `_coda/wait` on its way to the client: remembered, then passed on if the client declared waits.
    fn report(&mut self, frame: Frame, cx: &mut Cx) {
        // Read where it lies (the register writes reports as bytes: no value of them is kept), its members gone
        // over once with the layers below that read it.
        let keys = ["sessionId", "waitId", "state", "stoppable", "childSessionId"];
        let [session, wait_id, state, stoppable, child] = frame.params_pick(keys);
        let (session, wait_id, state) = (str_of(session), str_of(wait_id), str_of(state));
        let stoppable = stoppable.and_then(|s| s.as_bool());
        if session.as_deref().is_some_and(|s| cx.sessions().is_some_and(|t| t.was_closed(s))) {
            // Its session was closed, and its waits ended with it.
            return tracing::debug!("an activity report of a closed session dropped");
        }
        if let (Some(session), Some(wait_id)) = (session, wait_id) {
            let terminal =
                [State::Done, State::Failed, State::Cancelled].iter().any(|s| Some(s.as_str()) == state.as_deref());
            let key = (session.as_ref().to_owned(), wait_id.into_owned());
            // Coda's rules: a first report that is terminal registers nothing; nothing counts after the end.
            match self.seen.get_mut(&key) {
                Some(seen) if seen.ended => {
                    return tracing::debug!(
                        "an activity report after its terminal state dropped (nothing counts after it)"
                    );
                }
                Some(seen) => {
                    seen.stoppable = stoppable.unwrap_or(seen.stoppable);
                    seen.ended = terminal;
                }
                None if terminal => {}
                None => {
                    self.seen.insert(key.clone(), Seen { stoppable: stoppable == Some(true), ended: false });
                    self.order.push_back(key);
                    self.bound();
                }
            }
            if let Some(child) = str_of(child).filter(|c| !c.is_empty()) {
                cx.add_child(&child, Some(&session));
                self.children = true;
            }
        }
        if self.declared {
            cx.to_client(frame)
        } else {
            tracing::debug!("an activity report withheld: the client did not declare _meta.coda.waits");
        }
    }

    /// The sessions `closed` are over: each of their waits still open ends `cancelled` (Coda's session ends its
    /// work), before Coda gets the answer to its `session/close`; what was remembered of them is forgotten.
    fn closed(&mut self, closed: &[String], cx: &mut Cx) {
        let of_closed = |key: &(String, String)| closed.contains(&key.0);
        for key in self.order.iter().filter(|k| of_closed(k)) {
            if self.seen.get(key).is_some_and(|s| !s.ended) && self.declared {
                let params = json!({"sessionId": key.0, "waitId": key.1, "state": State::Cancelled.as_str()});
                cx.to_client(frame::notification(wait::METHOD, params));
            }
        }
        self.seen.retain(|key, _| !of_closed(key));
        self.order.retain(|key| !of_closed(key));
    }

    /// Past [`MAX_SEEN`]: forgets the oldest ended wait, else the oldest.
    fn bound(&mut self) {
        if self.order.len() <= MAX_SEEN {
            return;
        }
        let at = self.order.iter().position(|k| self.seen.get(k).is_some_and(|s| s.ended)).unwrap_or(0);
        if let Some(key) = self.order.remove(at) {
            self.seen.remove(&key);
        }
    }

    /// Whether `frame` is a `session/update` of a child session (the session table says which are).
    fn child_update(&self, frame: &Frame, cx: &Cx) -> bool {
        if !frame.is_notification("session/update") {
            return false;
        }
        // The session from the frame check's pass: a child's chunk is not parsed.
        frame.session().is_some_and(|s| cx.sessions().is_some_and(|t| t.is_child(&s)))
    }

    fn stop(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        let params = value.get("params").unwrap_or(&Value::Null);
        let text = |key: &str| params.get(key).and_then(Value::as_str);
        let (Some(session), Some(wait_id)) = (text("sessionId"), text("waitId")) else {
            let msg = "Invalid params: _coda/wait/stop needs string sessionId and waitId";
            return cx.to_client(frame::error_response(&id, -32602, msg, None));
        };
        match self.seen.get(&(session.to_owned(), wait_id.to_owned())) {
            None => {
                let msg = format!("Invalid params: no wait {wait_id:?} in session {session:?}");
                cx.to_client(frame::error_response(&id, -32602, &msg, None))
            }
            Some(seen) if !seen.stoppable => {
                let msg = format!("Invalid params: wait {wait_id:?} cannot be stopped");
                cx.to_client(frame::error_response(&id, -32602, &msg, None))
            }
            // Already over (its final report went up); nothing left to stop.
            Some(seen) if seen.ended => cx.to_client(frame::result_response(&id, json!({}))),
            Some(_) => cx.to_agent(frame),
        }
    }
}

impl Layer for Waits {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Request { method, .. } if method == "initialize" => self.client_initialize(frame, cx),
            Kind::Request { id, method } if method == wait::STOP_METHOD => {
                let id = id.clone();
                self.stop(id, frame, cx)
            }
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } if cx.answer_to(&frame).is_some_and(|r| r.is("initialize")) => {
                self.initialized(frame, cx)
            }
            Kind::Notification { method } if method == wait::METHOD => self.report(frame, cx),
            Kind::Notification { .. } if !self.declared && self.children && self.child_update(&frame, cx) => {
                tracing::debug!("a child session's update withheld: the client did not declare _meta.coda.waits");
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        matches!(frame.kind(), Kind::Notification { method } if method != wait::METHOD)
            && (self.declared || !self.children)
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }

    fn session_closed(&mut self, closed: &[String], cx: &mut Cx) {
        self.closed(closed, cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    const CODA_CAPS: &str = r#"{"_meta":{"coda":{"waits":{}}},"fs":{"readTextFile":true}}"#;

    /// A frame holding a lone UTF-16 surrogate escape, which serde_json alone does not read: its value has
    /// U+FFFD there.
    fn lone(text: &str) -> Frame {
        assert!(crate::json::from_str::<Value>(text).is_err(), "serde_json refuses {text}");
        let frame = Frame::parse(text.as_bytes().to_vec()).expect("a frame");
        assert!(frame.value().to_string().contains('\u{FFFD}'));
        frame
    }

    /// `Waits` alone: what leaves it on each side.
    struct Rig {
        h: Harness,
    }

    impl Rig {
        fn new() -> Rig {
            Rig { h: Harness::of(Waits::new()) }
        }

        /// Coda's `initialize` with `caps` and id `id`, then the agent's answer `result`: what Coda gets.
        fn handshake(&mut self, id: Value, caps: Value, result: Value) -> Vec<Value> {
            let init = json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":caps}});
            let (to_agent, to_client) = self.client(init.clone());
            assert_eq!(to_agent, vec![init], "the request itself passes untouched");
            assert!(to_client.is_empty());
            self.agent(json!({"jsonrpc":"2.0","id":id,"result":result}))
        }

        fn client(&mut self, v: Value) -> (Vec<Value>, Vec<Value>) {
            self.client_frame(Frame::from_value(&v))
        }

        fn client_frame(&mut self, f: Frame) -> (Vec<Value>, Vec<Value>) {
            self.h.client_frame(f);
            (self.h.to_agent(), self.h.to_client())
        }

        fn agent(&mut self, v: Value) -> Vec<Value> {
            self.agent_frame(Frame::from_value(&v))
        }

        fn agent_frame(&mut self, f: Frame) -> Vec<Value> {
            self.h.agent_frame(f);
            assert!(self.h.to_agent().is_empty());
            self.h.to_client()
        }

        fn stop(&mut self, id: u64, params: Value) -> (Vec<Value>, Vec<Value>) {
            self.client(json!({"jsonrpc":"2.0","id":id,"method":"_coda/wait/stop","params":params}))
        }
    }

    fn declared() -> Rig {
        let mut rig = Rig::new();
        rig.handshake(json!(0), serde_json::from_str(CODA_CAPS).unwrap(), json!({"protocolVersion":1}));
        rig
    }

    fn report(params: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"_coda/wait","params":params})
    }

    #[test]
    fn a_declaring_client_gets_the_answer_with_waits_declared_and_everything_else_kept() {
        let mut rig = Rig::new();
        let result = json!({"protocolVersion":1,"agentInfo":{"name":"x","version":"1"},
            "agentCapabilities":{"loadSession":true,"_meta":{"x":1}},"_meta":{"steering":{"supported":true}}});
        let out = rig.handshake(json!(0), serde_json::from_str(CODA_CAPS).unwrap(), result);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["result"]["agentCapabilities"]["_meta"]["coda"], json!({"waits":{}}));
        assert_eq!(out[0]["result"]["agentCapabilities"]["loadSession"], true);
        assert_eq!(out[0]["result"]["agentInfo"], json!({"name":"x","version":"1"}));
        assert_eq!(out[0]["result"]["_meta"], json!({"steering":{"supported":true}}));
    }

    #[test]
    fn the_waits_remembered_are_bounded_and_the_ended_ones_go_first() {
        let mut rig = declared();
        let open = |w: &str| report(json!({"sessionId":"s","waitId":w,"state":"waiting","stoppable":true}));
        rig.agent(open("first"));
        rig.agent(open("ended"));
        rig.agent(report(json!({"sessionId":"s","waitId":"ended","state":"done"})));
        for n in 0..MAX_SEEN - 1 {
            rig.agent(open(&format!("w{n}")));
        }
        assert_eq!(rig.h.layer::<Waits>(0).seen.len(), MAX_SEEN);
        // The ended one was forgotten: its stop is answered as of a wait never reported.
        let (_, answer) = rig.stop(1, json!({"sessionId":"s","waitId":"ended"}));
        assert_eq!(answer[0]["error"]["code"], -32602);
        // The oldest open one is still known: its stop goes on to the layer that reported it.
        let (down, _) = rig.stop(2, json!({"sessionId":"s","waitId":"first"}));
        assert_eq!(down.len(), 1);
        rig.agent(open("one more"));
        let (_, answer) = rig.stop(3, json!({"sessionId":"s","waitId":"first"}));
        assert_eq!(answer[0]["error"]["code"], -32602, "then the oldest");
    }

    #[test]
    fn the_rewritten_answer_keeps_the_agents_spelling_of_numbers() {
        let mut rig = Rig::new();
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"clientCapabilities":{}}});
        rig.client(init);
        let answer = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"big":1e400}}"#;
        rig.h.agent_frame(Frame::parse(answer.as_bytes().to_vec()).unwrap());
        let text = String::from_utf8(rig.h.take().to_client[0].bytes().to_vec()).unwrap();
        assert!(text.contains("1e400"), "{text}");
        assert!(text.contains(r#""coda":{"waits":{}}"#), "{text}");
    }

    #[test]
    fn the_answer_declares_waits_even_to_a_client_that_did_not_ask() {
        // The declaration only says the agent reports (能力协商); it is not a report.
        let mut rig = Rig::new();
        let out = rig.handshake(json!(1), json!({}), json!({"protocolVersion":1}));
        assert_eq!(out[0]["result"]["agentCapabilities"], json!({"_meta":{"coda":{"waits":{}}}}));
    }

    #[test]
    fn a_declaration_withheld_below_is_not_made_and_the_mark_never_reaches_the_client() {
        /// Withholds waits as an adapter's layer does when its CLI reports nothing: a note on the request.
        struct Withholds;
        impl Layer for Withholds {
            type Timer = Infallible;
            type Event = Infallible;
            type Reply = Infallible;
            fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
                if let Some(id) = cx.answer_to(&frame).filter(|r| r.is("initialize")).map(|r| r.id.clone()) {
                    cx.note(&id, WithholdWaits);
                }
                cx.to_client(frame)
            }
        }
        let mut rig = Rig { h: Harness::new(vec![Box::new(Waits::new()), Box::new(Withholds)]) };
        let result = json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true}});
        let out = rig.handshake(json!(0), serde_json::from_str(CODA_CAPS).unwrap(), result);
        assert_eq!(out[0]["result"], json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true}}));
        // A key of the agent's own is not a message between layers: it passes, and waits are declared.
        let mut rig = Rig::new();
        let result = json!({"protocolVersion":1,"_codaShimWithholdsWaits":true});
        let out = rig.handshake(json!(0), serde_json::from_str(CODA_CAPS).unwrap(), result);
        assert_eq!(out[0]["result"]["_codaShimWithholdsWaits"], true);
        assert_eq!(out[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}));
    }

    #[test]
    fn ids_of_any_json_type_are_matched_exactly() {
        for id in [json!(0), json!(-7), json!("init"), json!(""), json!(1.5), json!(null), json!("日本語🙂")] {
            let mut rig = Rig::new();
            let out = rig.handshake(id.clone(), json!({}), json!({"protocolVersion":1}));
            assert_eq!(out[0]["id"], id);
            assert_eq!(out[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}), "id {id}");
        }
        // An answer to another id, even one that looks alike, is not the initialize answer.
        let mut rig = Rig::new();
        rig.client(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}));
        for other in [json!("1"), json!(2)] {
            rig.client(json!({"jsonrpc":"2.0","id":other,"method":"session/list","params":{}}));
            let answer = json!({"jsonrpc":"2.0","id":other,"result":{"protocolVersion":1}});
            assert_eq!(rig.agent(answer.clone()), vec![answer]);
        }
        // Answered once: a second answer with the same id is no answer of the client's (the engine drops it).
        assert!(rig.agent(json!({"jsonrpc":"2.0","id":1,"result":{}}))[0]["result"]["agentCapabilities"].is_object());
        assert!(rig.agent(json!({"jsonrpc":"2.0","id":1,"result":{}})).is_empty());
    }

    #[test]
    fn an_error_answer_to_initialize_passes_as_it_came() {
        let mut rig = Rig::new();
        rig.client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        let err = json!({"jsonrpc":"2.0","id":0,"error":{"code":-32000,"message":"auth"}});
        assert_eq!(rig.agent(err.clone()), vec![err]);
        let mut rig = Rig::new();
        rig.client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        let odd = json!({"jsonrpc":"2.0","id":0,"result":"not an object"});
        assert_eq!(rig.agent(odd.clone()), vec![odd]);
    }

    #[test]
    fn an_initialize_with_a_lone_surrogate_is_read_and_passed_on_byte_for_byte() {
        let mut rig = Rig::new();
        let text = r#"{"jsonrpc":"2.0","id":"i","method":"initialize","params":{"clientCapabilities":{"_meta":{"coda":{"waits":{}}}},"x":"\ud800"}}"#;
        rig.h.client_frame(lone(text));
        let exits = rig.h.take();
        assert!(exits.to_client.is_empty());
        assert_eq!(exits.to_agent.len(), 1);
        assert_eq!(exits.to_agent[0].bytes(), text.as_bytes(), "not rewritten: the peer's bytes go on");
        // Read, not refused: the client declared waits, so the agent's answer says so.
        let out = rig.agent(json!({"jsonrpc":"2.0","id":"i","result":{"protocolVersion":1}}));
        assert_eq!(out[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}), "{out:?}");
    }

    #[test]
    fn an_initialize_answer_with_a_lone_surrogate_is_rewritten_with_u_fffd() {
        let mut rig = Rig::new();
        rig.client(json!({"jsonrpc":"2.0","id":4,"method":"initialize","params":{}}));
        let out = rig.agent_frame(lone(r#"{"jsonrpc":"2.0","id":4,"result":{"x":"\ud800","y":"\ud83d\ude00"}}"#));
        assert_eq!(out[0]["id"], 4);
        assert_eq!(out[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}));
        assert_eq!(out[0]["result"]["x"], "\u{FFFD}");
        assert_eq!(out[0]["result"]["y"], "😀", "a pair is kept");
    }

    #[test]
    fn reports_reach_only_a_client_that_declared_waits() {
        let r = report(json!({"sessionId":"s","waitId":"w","state":"waiting","kind":"task","title":"构建 🙂"}));
        assert_eq!(declared().agent(r.clone()), vec![r.clone()]);
        for caps in [json!({}), json!({"_meta":{"coda":{"waits":null}}}), json!({"_meta":{"coda":{}}})] {
            let mut rig = Rig::new();
            rig.handshake(json!(0), caps, json!({}));
            assert!(rig.agent(r.clone()).is_empty());
            // Everything else passes.
            let other = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{}}});
            assert_eq!(rig.agent(other.clone()), vec![other]);
        }
        // Before any initialize nothing was declared.
        assert!(Rig::new().agent(r).is_empty());
    }

    #[test]
    fn the_latest_initialize_decides() {
        let mut rig = declared();
        rig.handshake(json!(1), json!({}), json!({}));
        let r = report(json!({"sessionId":"s","waitId":"w","state":"waiting"}));
        assert!(rig.agent(r.clone()).is_empty());
        rig.handshake(json!(2), serde_json::from_str(CODA_CAPS).unwrap(), json!({}));
        assert_eq!(rig.agent(r.clone()), vec![r]);
    }

    #[test]
    fn a_child_sessions_updates_reach_only_a_client_that_declared_waits() {
        let spawn = report(
            json!({"sessionId":"s","waitId":"a1","state":"waiting","kind":"subagent","childSessionId":"a1-child"}),
        );
        let child = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a1-child",
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}});
        let ask =
            json!({"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"a1-child"}});
        let parent = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s",
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a1-child"}}}});

        let mut rig = declared();
        rig.agent(spawn.clone());
        assert_eq!(rig.agent(child.clone()), vec![child.clone()]);

        let mut rig = Rig::new();
        rig.handshake(json!(0), json!({}), json!({}));
        assert!(rig.agent(spawn).is_empty());
        assert!(rig.agent(child).is_empty());
        assert_eq!(rig.agent(ask.clone()), vec![ask], "a request always passes: it needs an answer");
        assert_eq!(rig.agent(parent.clone()), vec![parent], "only the child's own session is withheld");
    }

    #[test]
    fn a_report_with_a_lone_surrogate_is_read_and_passed_on_byte_for_byte() {
        let mut rig = declared();
        let text = r#"{"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":"s","waitId":"\ud800","state":"waiting","stoppable":true}}"#;
        rig.h.agent_frame(lone(text));
        let exits = rig.h.take();
        assert_eq!(exits.to_client.len(), 1);
        assert_eq!(exits.to_client[0].bytes(), text.as_bytes());
        // Remembered under the name it reads as: its stop goes down to the layer that reported it.
        let (to_agent, to_client) = rig.stop(2, json!({"sessionId":"s","waitId":"\u{FFFD}"}));
        assert_eq!((to_agent.len(), to_client.len()), (1, 0));
    }

    #[test]
    fn an_open_stoppable_wait_is_stopped_by_the_layer_below_that_reported_it() {
        let mut rig = declared();
        rig.agent(report(json!({"sessionId":"s","waitId":"w","state":"waiting","stoppable":true})));
        rig.agent(report(json!({"sessionId":"s","waitId":"w","state":"handling"})));
        let stop =
            json!({"jsonrpc":"2.0","id":"st","method":"_coda/wait/stop","params":{"sessionId":"s","waitId":"w"}});
        let (to_agent, to_client) = rig.client(stop.clone());
        assert_eq!(to_agent, vec![stop], "the request goes down as it came");
        assert!(to_client.is_empty(), "answered by the layer that stops it");
    }

    #[test]
    fn stops_this_layer_can_answer_itself() {
        let mut rig = declared();
        rig.agent(report(json!({"sessionId":"s","waitId":"plain","state":"waiting"})));
        rig.agent(report(json!({"sessionId":"s","waitId":"off","state":"waiting","stoppable":true})));
        rig.agent(report(json!({"sessionId":"s","waitId":"off","stoppable":false})));
        rig.agent(report(json!({"sessionId":"s","waitId":"over","state":"waiting","stoppable":true})));
        rig.agent(report(json!({"sessionId":"s","waitId":"over","state":"cancelled"})));
        // A first report that is terminal registers nothing (state table).
        rig.agent(report(json!({"sessionId":"s","waitId":"ghost","state":"done","stoppable":true})));
        for (params, code) in [
            (json!({"sessionId":"s","waitId":"plain"}), -32602),
            (json!({"sessionId":"s","waitId":"off"}), -32602),
            (json!({"sessionId":"s","waitId":"ghost"}), -32602),
            (json!({"sessionId":"s","waitId":"nope"}), -32602),
            (json!({"sessionId":"other","waitId":"over"}), -32602),
            (json!({"sessionId":"s"}), -32602),
            (json!({"sessionId":"s","waitId":7}), -32602),
            (json!(null), -32602),
        ] {
            let (to_agent, to_client) = rig.stop(3, params.clone());
            assert!(to_agent.is_empty(), "{params}");
            assert_eq!(to_client[0]["id"], 3);
            assert_eq!(to_client[0]["error"]["code"], code, "{params}");
        }
        let (to_agent, to_client) = rig.stop(4, json!({"sessionId":"s","waitId":"over"}));
        assert!(to_agent.is_empty(), "nothing left to stop");
        assert_eq!(to_client, vec![json!({"jsonrpc":"2.0","id":4,"result":{}})]);
        // Nothing counts after the end: a late report does not reopen it.
        rig.agent(report(json!({"sessionId":"s","waitId":"over","state":"waiting","stoppable":true})));
        assert_eq!(rig.stop(5, json!({"sessionId":"s","waitId":"over"})).1[0]["result"], json!({}));
    }

    #[test]
    fn stops_are_routed_whether_or_not_the_client_declared_waits() {
        let mut rig = Rig::new();
        rig.handshake(json!(0), json!({}), json!({}));
        rig.agent(report(json!({"sessionId":"s","waitId":"w","state":"waiting","stoppable":true})));
        let (to_agent, _) = rig.stop(1, json!({"sessionId":"s","waitId":"w"}));
        assert_eq!(to_agent.len(), 1);
    }

    #[test]
    fn a_stop_with_a_lone_surrogate_is_read_and_answered_for_what_it_asks() {
        let mut rig = declared();
        let frame = lone(r#"{"jsonrpc":"2.0","id":5,"method":"_coda/wait/stop","params":{"sessionId":"\ud800"}}"#);
        let (to_agent, to_client) = rig.client_frame(frame);
        assert!(to_agent.is_empty());
        assert_eq!(to_client[0]["id"], 5);
        assert_eq!(to_client[0]["error"]["code"], -32602, "no waitId: invalid params, not an unreadable frame");
        let frame =
            lone(r#"{"jsonrpc":"2.0","id":6,"method":"_coda/wait/stop","params":{"sessionId":"s","waitId":"\udc00"}}"#);
        let (_, to_client) = rig.client_frame(frame);
        let message = to_client[0]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("no wait \"\u{FFFD}\""), "{message}");
    }
}

//! Coda's steering (section 插话) over Grok Build's `_x.ai/interject`: a message joins the turn Coda is running.
//!
//! What Grok 1.0.41 does (seen live against the fake model, `fixtures/grok/steering`):
//! - `_x.ai/interject {sessionId, text}` answers `{"result":{"status":"queued"}}` at once and echoes
//!   `_x.ai/session/interjection {sessionId, text}`. In a running turn the text joins it at its next safe point
//!   (after the running tool's result, and once more just before the turn completes): the model's next request
//!   ends with a user message "The user sent a message while you were working: <user_query>…</user_query>", and
//!   the original `session/prompt` is answered after that.
//! - With no turn running Grok starts a turn of its own for it (prompt id `interject-fallback-…` in
//!   `_x.ai/queue/changed`), as it does for one that arrives after the turn's last safe point.
//!
//! The rule this layer keeps:
//! - `initialize`: the answer declares `_meta.steering.supported: true` (top level, beside `agentCapabilities`).
//! - `_session/steering` while no `session/prompt` of Coda's runs in that session: `promptRequired`
//!   (`noRunningTurn`), and nothing goes to Grok.
//! - Otherwise the prompt's text goes to Grok as `_x.ai/interject`; `queued` is answered `injected`. Grok's
//!   answer to the turn is held while the steering answer is outstanding, so Coda always gets the steering
//!   answer first; when the turn's answer came before `queued`, Grok took the message after the turn had ended
//!   and runs it as its own turn: `startedNewTurn`.
//! - One steering in flight per session: another one before Grok answered gets -32600.
//! - The echo of a message steered through this layer is not passed on (Coda has the message).
//!
//! Which `session/prompt` runs in a session, and which answer answers `initialize` or a prompt, is the stack's
//! request table's to say ([`Cx::open_requests`], [`Cx::answer_to`]); the interjection's answer comes back to
//! [`Layer::on_reply`] with the steering request it was sent for ([`Interjection`]).

use std::collections::HashMap;
use std::convert::Infallible;

use serde_json::{Map, Value, json};

use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Layer};

const STEERING: &str = "_session/steering";
const INTERJECT: &str = "_x.ai/interject";
const ECHO: &str = "_x.ai/session/interjection";
const QUEUE_CHANGED: &str = "_x.ai/queue/changed";
const FALLBACK: &str = "interject-fallback-";
/// Echoes kept per session to recognise (a Grok that never echoes must not make this grow).
const ECHOES_KEPT: usize = 8;

/// A steering request sent to Grok and not answered yet.
struct InFlight {
    /// The `session/prompt` it was sent into.
    turn: Id,
    /// Grok's answer to that turn, when it came before Grok's answer to the interjection.
    turn_end: Option<Frame>,
}

/// What an `_x.ai/interject` of this layer's carries back with Grok's answer: the steering request it is for.
#[derive(Debug)]
pub struct Interjection {
    /// Coda's request id.
    id: Id,
    session: String,
}

#[derive(Default)]
pub struct GrokSteering {
    /// By session.
    in_flight: HashMap<String, InFlight>,
    /// Texts steered into a session whose echo has not come yet, oldest first.
    echoes: HashMap<String, Vec<String>>,
    /// Texts answered `injected` since the session's latest prompt began (to notice one Grok runs on its own).
    injected: HashMap<String, Vec<String>>,
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

/// The text Grok gets for a steering `prompt`: its text blocks, and resource links as their URI, one paragraph
/// each. `Err` names what Grok cannot take this way.
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
            Some(other) => return Err(format!("a `{other}` block cannot be added to a running Grok turn")),
            None => return Err("a content block without `type`".into()),
        }
    }
    let text = parts.join("\n\n");
    if text.trim().is_empty() {
        return Err("the steering message is empty".into());
    }
    Ok(text)
}

impl GrokSteering {
    pub fn new() -> GrokSteering {
        GrokSteering::default()
    }

    /// Coda's `session/prompt` of `session` that is with Grok and not answered by it (the request table says).
    fn running(session: &str, cx: &Cx) -> Option<Id> {
        let prompt = cx.open_requests().find(|r| r.is("session/prompt") && r.is_sent() && r.session() == Some(session));
        prompt.map(|r| r.id.clone())
    }

    fn steer(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let v = frame.value();
        let params = params_of(v);
        let Some(session) = params.get("sessionId").and_then(Value::as_str) else {
            return cx.to_client(frame::error_response(&id, -32602, "`sessionId` must be a string", None));
        };
        let Some(turn) = GrokSteering::running(session, cx) else {
            let answer = json!({"outcome": "promptRequired", "reason": "noRunningTurn"});
            return cx.to_client(frame::result_response(&id, answer));
        };
        if self.in_flight.contains_key(session) {
            let msg = "a steering message for this session is still waiting for Grok's answer";
            return cx.to_client(frame::error_response(&id, -32600, msg, None));
        }
        let text = match steered_text(params.get("prompt").unwrap_or(&Value::Null)) {
            Ok(text) => text,
            Err(why) => return cx.to_client(frame::error_response(&id, -32602, &why, None)),
        };
        let tag = Interjection { id, session: session.to_owned() };
        cx.request(INTERJECT, json!({"sessionId": session, "text": text}), tag);
        let echoes = self.echoes.entry(session.to_owned()).or_default();
        echoes.push(text);
        if echoes.len() > ECHOES_KEPT {
            echoes.remove(0);
        }
        self.in_flight.insert(session.to_owned(), InFlight { turn, turn_end: None });
    }

    /// Grok's answer to a `session/prompt` of Coda's in `session`: held while a steering answer is outstanding.
    fn turn_ended(&mut self, id: &Id, session: &str, frame: Frame, cx: &mut Cx) {
        match self.in_flight.get_mut(session) {
            Some(steer) if steer.turn == *id => steer.turn_end = Some(frame),
            _ => cx.to_client(frame),
        }
    }

    fn initialized(&self, frame: Frame, cx: &mut Cx) {
        let mut v = frame.to_value();
        let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) else { return cx.to_client(frame) };
        object_at(object_at(result, "_meta"), "steering").insert("supported".into(), json!(true));
        cx.to_client(frame.rewritten(v));
    }

    /// Grok's notifications this layer reads: the echo (dropped when it is of a message steered here), and the
    /// queue naming a turn Grok runs on its own for a message answered `injected` (the race at a turn's end).
    fn notification(&mut self, method: &str, frame: Frame, cx: &mut Cx) {
        let v = frame.value();
        let params = params_of(v);
        let session = params.get("sessionId").and_then(Value::as_str).unwrap_or_default();
        if method == ECHO {
            let text = params.get("text").and_then(Value::as_str);
            if let (Some(echoes), Some(text)) = (self.echoes.get_mut(session), text)
                && let Some(at) = echoes.iter().position(|e| e == text)
            {
                echoes.remove(at);
                return;
            }
            return cx.to_client(frame);
        }
        let running = params.get("runningPromptId").and_then(Value::as_str).unwrap_or_default();
        let text = params.get("runningText").and_then(Value::as_str);
        if running.starts_with(FALLBACK)
            && let (Some(injected), Some(text)) = (self.injected.get_mut(session), text)
            && let Some(at) = injected.iter().position(|t| t == text)
        {
            injected.remove(at);
            tracing::warn!(
                "a message answered `injected` reached Grok after its turn's last safe point; Grok runs it as a \
                 turn of its own"
            );
        }
        cx.to_client(frame)
    }
}

impl Layer for GrokSteering {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Interjection;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Request { id, method } = frame.kind() else { return cx.to_agent(frame) };
        match method.as_str() {
            STEERING => {
                let id = id.clone();
                self.steer(id, frame, cx)
            }
            "session/prompt" => {
                if let Some(session) = cx.request_of(id).and_then(|r| r.session()) {
                    self.injected.remove(session);
                }
                cx.to_agent(frame)
            }
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { id } => match cx.answer_to(&frame) {
                Some(r) if r.is("initialize") => self.initialized(frame, cx),
                Some(r) if r.is("session/prompt") => match r.session().map(str::to_owned) {
                    Some(session) => {
                        let id = id.clone();
                        self.turn_ended(&id, &session, frame, cx)
                    }
                    None => cx.to_client(frame),
                },
                _ => cx.to_client(frame),
            },
            Kind::Notification { method } if method == ECHO || method == QUEUE_CHANGED => {
                let method = method.clone();
                self.notification(&method, frame, cx)
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Notification { method } => method != ECHO && method != QUEUE_CHANGED,
            Kind::Response { .. } => false,
            _ => true,
        }
    }

    fn on_reply(&mut self, tag: Interjection, reply: Frame, cx: &mut Cx) {
        let Interjection { id, session } = tag;
        let turn_end = self.in_flight.remove(&session).and_then(|steer| steer.turn_end);
        let v = reply.value();
        let answer = if let Some(err) = v.get("error") {
            let code = err.get("code").and_then(Value::as_i64).unwrap_or(-32603);
            tracing::warn!("Grok refused a steering message (error {code}; its message is logged at debug)");
            tracing::debug!("Grok's answer to the interjection: {err}");
            let message = err.get("message").and_then(Value::as_str).unwrap_or("no message");
            let message = format!("Grok refused the steering message: {message}");
            self.echoes.get_mut(&session).map(Vec::pop);
            frame::error_response(&id, code, &message, None)
        } else {
            let result = v.get("result").unwrap_or(&Value::Null);
            let status = result.pointer("/result/status").or_else(|| result.get("status"));
            let outcome = match (status.and_then(Value::as_str), turn_end.is_some()) {
                (Some("queued"), false) => {
                    let text = self.echoes.get(&session).and_then(|e| e.last()).cloned();
                    self.injected.entry(session.clone()).or_default().extend(text);
                    "injected"
                }
                // Grok ended the turn before it took the message: it runs it as a turn of its own.
                (Some("queued"), true) => "startedNewTurn",
                _ => {
                    tracing::warn!("Grok answered a steering message with no `queued` status");
                    "failed"
                }
            };
            frame::result_response(&id, json!({"outcome": outcome}))
        };
        cx.to_client(answer);
        if let Some(end) = turn_end {
            cx.to_client(end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    const S: &str = "01a23362-d7f9-7dc1-8cb6-f3bc8dc3908f";

    fn steer(h: &mut Harness, id: i64, text: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":STEERING,"params":{"sessionId":S,
            "prompt":[{"type":"text","text":text}],"_meta":{"steering":{"idleBehavior":"promptRequired"}}}}));
    }

    fn prompt(h: &mut Harness, id: i64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"run it"}]}}));
        assert_eq!(h.to_agent().len(), 1, "the prompt goes on");
    }

    fn queued(h: &mut Harness, interject: &Value) {
        h.from_agent(json!({"jsonrpc":"2.0","id":interject["id"],"result":{"result":{"status":"queued"}}}));
    }

    /// JSON nested deeper than the shim reads.
    fn deep() -> String {
        let n = crate::json::MAX_DEPTH + 5;
        format!("{}{}", "[".repeat(n), "]".repeat(n))
    }

    fn end(id: i64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}})
    }

    #[test]
    fn initialize_declares_steering_at_the_top_of_meta() {
        let mut h = Harness::of(GrokSteering::new());
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        h.to_agent();
        h.from_agent(
            json!({"jsonrpc":"2.0","id":0,"result":{"agentCapabilities":{},"_meta":{"agentVersion":"1.0.41"}}}),
        );
        let out = h.to_client();
        assert_eq!(out[0]["result"]["_meta"], json!({"agentVersion":"1.0.41","steering":{"supported":true}}));
        assert_eq!(out[0]["result"]["agentCapabilities"], json!({}));
        // Grok's numbers keep their spelling.
        h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"initialize","params":{}}));
        h.agent_frame(Frame::parse(br#"{"jsonrpc":"2.0","id":9,"result":{"n":1e400}}"#.to_vec()).unwrap());
        let out = h.take().to_client;
        let text = String::from_utf8_lossy(out[0].bytes()).into_owned();
        assert!(text.contains(r#""n":1e400"#) && text.contains(r#""steering":{"supported":true}"#), "{text}");
        // A `_meta` that is no object is replaced; an error answer is passed on.
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"_meta":7}}));
        assert_eq!(h.to_client()[0]["result"]["_meta"], json!({"steering":{"supported":true}}));
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"initialize","params":{}}));
        let error = json!({"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"auth"}});
        h.from_agent(error.clone());
        assert_eq!(h.to_client(), vec![error]);
    }

    #[test]
    fn between_turns_the_answer_is_prompt_required_and_grok_sees_nothing() {
        let mut h = Harness::of(GrokSteering::new());
        steer(&mut h, 5, "先别改测试");
        assert!(h.to_agent().is_empty());
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":5,"result":{"outcome":"promptRequired","reason":"noRunningTurn"}})]
        );
        // After a turn ended too.
        prompt(&mut h, 6);
        h.from_agent(end(6));
        h.to_client();
        steer(&mut h, 7, "again");
        assert!(h.to_agent().is_empty());
        assert_eq!(h.to_client()[0]["result"]["outcome"], "promptRequired");
    }

    #[test]
    fn during_a_turn_the_text_is_interjected_once_and_answered_injected() {
        let mut h = Harness::of(GrokSteering::new());
        prompt(&mut h, 3);
        let text = "Stop changing the tests.\n\n只看实现\n- keep `main` green";
        h.from_client(json!({"jsonrpc":"2.0","id":"steer-1","method":STEERING,"params":{"sessionId":S,
            "prompt":[{"type":"text","text":text},{"type":"resource_link","uri":"file:///p/a.rs","name":"a.rs"}]}}));
        let sent = h.to_agent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["method"], INTERJECT);
        assert_eq!(sent[0]["params"], json!({"sessionId":S,"text":format!("{text}\n\nfile:///p/a.rs")}));
        assert!(h.to_client().is_empty(), "no answer before Grok's");
        queued(&mut h, &sent[0]);
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":"steer-1","result":{"outcome":"injected"}})]);
        // Grok's echo of it stays here; other echoes and the turn's end go on.
        let echo =
            json!({"jsonrpc":"2.0","method":ECHO,"params":{"sessionId":S,"text":format!("{text}\n\nfile:///p/a.rs")}});
        h.from_agent(echo.clone());
        assert!(h.to_client().is_empty());
        h.from_agent(echo.clone());
        assert_eq!(h.to_client(), vec![echo]);
        h.from_agent(end(3));
        assert_eq!(h.to_client(), vec![end(3)]);
    }

    #[test]
    fn the_turns_end_waits_for_the_steering_answer() {
        let mut h = Harness::of(GrokSteering::new());
        prompt(&mut h, 3);
        steer(&mut h, 4, "late");
        let sent = h.to_agent();
        h.from_agent(end(3));
        assert!(h.to_client().is_empty(), "held until Grok answered the interjection");
        queued(&mut h, &sent[0]);
        let out = h.to_client();
        assert_eq!(out[0], json!({"jsonrpc":"2.0","id":4,"result":{"outcome":"startedNewTurn"}}));
        assert_eq!(out[1], end(3));
        steer(&mut h, 8, "after");
        assert_eq!(h.to_client()[0]["result"]["outcome"], "promptRequired");
    }

    #[test]
    fn one_steering_in_flight_per_session() {
        let mut h = Harness::of(GrokSteering::new());
        prompt(&mut h, 3);
        steer(&mut h, 4, "one");
        let sent = h.to_agent();
        steer(&mut h, 5, "two");
        assert!(h.to_agent().is_empty());
        assert_eq!(h.to_client()[0]["error"]["code"], -32600);
        queued(&mut h, &sent[0]);
        assert_eq!(h.to_client()[0]["result"]["outcome"], "injected");
        steer(&mut h, 6, "three");
        assert_eq!(h.to_agent().len(), 1, "the next one goes once the first is answered");
    }

    #[test]
    fn grok_refusing_or_not_queueing_is_no_injection() {
        let mut h = Harness::of(GrokSteering::new());
        prompt(&mut h, 3);
        steer(&mut h, 4, "one");
        let sent = h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":sent[0]["id"],"error":{"code":-32602,"message":"unknown session"}}));
        let out = h.to_client();
        assert_eq!(out[0]["id"], 4);
        assert_eq!(out[0]["error"]["code"], -32602);
        steer(&mut h, 5, "two");
        let sent = h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":sent[0]["id"],"result":{"status":"dropped"}}));
        assert_eq!(h.to_client()[0]["result"], json!({"outcome":"failed"}));
        // Odd numbers are no status either.
        steer(&mut h, 6, "three");
        let sent = h.to_agent();
        let id = sent[0]["id"].as_str().unwrap();
        let line = format!(r#"{{"jsonrpc":"2.0","id":"{id}","result":{{"status":1e400}}}}"#);
        h.agent_frame(Frame::parse(line.into_bytes()).unwrap());
        assert_eq!(h.to_client()[0]["result"], json!({"outcome":"failed"}));
    }

    #[test]
    fn bad_steering_requests_get_clear_errors_and_reach_no_one() {
        let mut h = Harness::of(GrokSteering::new());
        prompt(&mut h, 3);
        for (id, params) in [
            (10, json!({"prompt":[{"type":"text","text":"x"}]})),
            (11, json!({"sessionId":S,"prompt":"x"})),
            (12, json!({"sessionId":S,"prompt":[{"type":"image","data":"AAAA","mimeType":"image/png"}]})),
            (13, json!({"sessionId":S,"prompt":[{"type":"text","text":"  \n"}]})),
            (14, json!({"sessionId":S,"prompt":[{"text":"no type"}]})),
        ] {
            h.from_client(json!({"jsonrpc":"2.0","id":id,"method":STEERING,"params":params}));
            assert!(h.to_agent().is_empty(), "{id}");
            assert_eq!(h.to_client()[0]["error"]["code"], -32602, "{id}");
        }
        let line = format!(r#"{{"jsonrpc":"2.0","id":15,"method":"_session/steering","params":{}}}"#, deep());
        // Nesting too deep to read never reaches a layer: the engine answers it (src/relay/behaviour.rs).
        assert!(Frame::parse(line.into_bytes()).is_err());
    }

    #[test]
    fn a_message_grok_runs_on_its_own_after_injected_is_passed_on() {
        let mut h = Harness::of(GrokSteering::new());
        prompt(&mut h, 3);
        steer(&mut h, 4, "edge");
        let sent = h.to_agent();
        queued(&mut h, &sent[0]);
        h.from_agent(end(3));
        h.to_client();
        let queue = json!({"jsonrpc":"2.0","method":QUEUE_CHANGED,"params":{"sessionId":S,"entries":[],
            "runningKind":"prompt","runningPromptId":"interject-fallback-1","runningText":"edge"}});
        h.from_agent(queue.clone());
        assert_eq!(h.to_client(), vec![queue]);
    }
}

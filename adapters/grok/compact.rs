//! Coda's `_coda/session/compact` (section 压缩上下文) over Grok Build's `_x.ai/compact_conversation`.
//!
//! What Grok 1.0.41 does (seen live against the fake model, `fixtures/grok/compact-*`):
//! - `_x.ai/compact_conversation {sessionId}` is not a turn: Grok asks the model for a summary (up to three
//!   tries), sends `_x.ai/session_notification` `auto_compact_completed {tokens_before, tokens_after}` and then
//!   answers `{}`. A summary it finds too short fails: -32603 with `data: {kind: "compact_failed", message}`.
//! - An empty session compacts too (one model call) and reports `tokens_before == tokens_after`.
//! - It compacts in the middle of a running turn without complaint, and a `session/prompt` sent meanwhile runs
//!   at once beside the compaction.
//! - A session it does not have got no answer at all (30 s and more).
//!
//! The rule this layer keeps:
//! - `initialize`: the answer declares `agentCapabilities._meta.coda.compact: {}`.
//! - A session this process never created, loaded or resumed: `compacted: false` ([`compact::NOT_RUNNING`]),
//!   nothing goes to Grok (it would not answer).
//! - A turn running in the session (Coda's `session/prompt`, or a turn Grok runs by itself, as its
//!   `_x.ai/queue/changed` names a `runningPromptId`): [`compact::TURN_RUNNING`]. One already compacting:
//!   [`compact::ALREADY`].
//! - Otherwise `_x.ai/compact_conversation` goes to Grok; `{}` is `compacted: true` with `before`/`after` from the
//!   `auto_compact_completed` that came with it (Grok's counts: its last response's tokens before, its estimate
//!   of the summary after). An empty session is compacted too (`before == after`): Grok did run a compaction,
//!   and the protocol answers `compacted: false` only when not running, a turn runs, or it failed.
//!   An error is `compacted: false` with Grok's message.
//! - While it compacts, the session's `session/prompt`s wait ([`compact::Gate`]) and go on after the answer.
//! - Grok gets [`compact::DEADLINE`]: after that Coda is answered [`compact::TIMED_OUT`], Grok is sent
//!   `session/cancel` for the session, and its late answer is dropped.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::compact::{self, Gate, Outcome};
use crate::frame::{Frame, Id, Kind};
use crate::layer::{Cx, Layer};

const COMPACT: &str = "_x.ai/compact_conversation";
const NOTIFICATION: &str = "_x.ai/session_notification";
const QUEUE_CHANGED: &str = "_x.ai/queue/changed";
const COMPLETED: &str = "auto_compact_completed";

/// The compaction of one session, while Grok has it.
struct Running {
    /// Coda's request.
    id: Id,
    /// Tells this compaction's answer and deadline from an earlier one's of the same session.
    round: u64,
    before: Option<u64>,
    after: Option<u64>,
}

/// What `_x.ai/compact_conversation` carries back with Grok's answer.
#[derive(Debug)]
pub struct Asked {
    session: String,
    round: u64,
}

/// A compaction's deadline.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Deadline {
    session: String,
    round: u64,
}

#[derive(Default)]
pub struct GrokCompact {
    gate: Gate,
    running: HashMap<String, Running>,
    /// Sessions this process created, loaded or resumed (Grok answered for them).
    known: HashSet<String>,
    /// Sessions where Grok runs a turn, as its queue says (its own turns included).
    busy: HashSet<String>,
    rounds: u64,
}

fn u64_at(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

impl GrokCompact {
    pub fn new() -> GrokCompact {
        GrokCompact::default()
    }

    fn compact(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let v = frame.value();
        let session = match compact::session_of(v, &id) {
            Ok(s) => s,
            Err(answer) => return cx.to_client(answer),
        };
        let refuse = if !self.known.contains(&session) {
            Some(compact::NOT_RUNNING)
        } else if self.running.contains_key(&session) {
            Some(compact::ALREADY)
        } else if self.busy.contains(&session)
            || cx.open_requests().any(|r| r.is("session/prompt") && r.session() == Some(session.as_str()))
        {
            Some(compact::TURN_RUNNING)
        } else {
            None
        };
        if let Some(reason) = refuse {
            return cx.to_client(Outcome::not(reason).answer(&id));
        }
        self.gate.close(&session);
        self.rounds += 1;
        let round = self.rounds;
        cx.request(COMPACT, json!({"sessionId": session}), Asked { session: session.clone(), round });
        cx.after(compact::DEADLINE, Deadline { session: session.clone(), round });
        self.running.insert(session, Running { id, round, before: None, after: None });
    }

    /// Ends `session`'s compaction with `outcome` and lets its held prompts go on.
    fn finish(&mut self, session: &str, outcome: Outcome, cx: &mut Cx) {
        let Some(run) = self.running.remove(session) else { return };
        cx.cancel(&Deadline { session: session.to_owned(), round: run.round });
        cx.to_client(outcome.answer(&run.id));
        for held in self.gate.open(session) {
            cx.to_agent(held);
        }
    }

    /// Grok's answer to a session's `session/new`, `session/load` or `session/resume`: Grok has it now.
    fn answered(&mut self, method: &str, request_session: Option<&str>, frame: &Frame) {
        let v = frame.value();
        if v.get("result").is_none() {
            return;
        }
        let session = match method {
            "session/new" => v.pointer("/result/sessionId").and_then(Value::as_str),
            _ => request_session,
        };
        if let Some(s) = session.filter(|s| !s.is_empty()) {
            self.known.insert(s.to_owned());
        }
    }

    fn notification(&mut self, method: &str, frame: &Frame) {
        let v = frame.value();
        let params = v.get("params").unwrap_or(&Value::Null);
        let Some(session) = params.get("sessionId").and_then(Value::as_str) else { return };
        if method == QUEUE_CHANGED {
            if params.get("runningPromptId").and_then(Value::as_str).is_some_and(|p| !p.is_empty()) {
                self.busy.insert(session.to_owned());
            } else {
                self.busy.remove(session);
            }
            return;
        }
        let update = params.get("update").unwrap_or(&Value::Null);
        if let Some(run) = self.running.get_mut(session) {
            run.before = u64_at(update, "tokens_before");
            run.after = u64_at(update, "tokens_after");
        }
    }
}

impl Layer for GrokCompact {
    type Timer = Deadline;
    type Event = Infallible;
    type Reply = Asked;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Request { id, method } = frame.kind() else { return cx.to_agent(frame) };
        match method.as_str() {
            compact::METHOD => {
                let id = id.clone();
                self.compact(id, frame, cx)
            }
            "session/prompt" => {
                let session = cx.request_of(id).and_then(|r| r.session()).map(str::to_owned);
                match session {
                    Some(s) => {
                        if let Some(frame) = self.gate.hold(&s, frame) {
                            cx.to_agent(frame);
                        }
                    }
                    None => cx.to_agent(frame),
                }
            }
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => {
                let asked = cx.answer_to(&frame).map(|r| (r.method.to_string(), r.session().map(str::to_owned)));
                match asked {
                    Some((m, _)) if m == "initialize" => return self.initialized(frame, cx),
                    Some((m, s)) if matches!(m.as_str(), "session/new" | "session/load" | "session/resume") => {
                        self.answered(&m, s.as_deref(), &frame)
                    }
                    _ => {}
                }
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == QUEUE_CHANGED => {
                let method = method.clone();
                self.notification(&method, &frame);
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == NOTIFICATION && frame.session_update() == Some(COMPLETED) => {
                let method = method.clone();
                self.notification(&method, &frame);
                cx.to_client(frame)
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Notification { method } => {
                method != QUEUE_CHANGED && !(method == NOTIFICATION && frame.session_update() == Some(COMPLETED))
            }
            Kind::Response { .. } => false,
            _ => true,
        }
    }

    fn on_reply(&mut self, tag: Asked, reply: Frame, cx: &mut Cx) {
        if self.running.get(&tag.session).is_none_or(|r| r.round != tag.round) {
            tracing::debug!("Grok answered a compaction that was already given up; dropped");
            return;
        }
        let outcome = match reply.value().get("error") {
            Some(err) => {
                let code = err.get("code").and_then(Value::as_i64).unwrap_or_default();
                tracing::warn!("Grok could not compact (error {code}; its message is logged at debug)");
                tracing::debug!("Grok's answer to the compaction: {err}");
                let message = err
                    .pointer("/data/message")
                    .or_else(|| err.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("no message");
                Outcome::not(format!("Grok could not compact: {}", crate::coda::wait::truncate_chars(message, 500)))
            }
            None => {
                let run = &self.running[&tag.session];
                Outcome::Compacted { before: run.before, after: run.after }
            }
        };
        self.finish(&tag.session, outcome, cx);
    }

    fn on_timer(&mut self, timer: Deadline, cx: &mut Cx) {
        if self.running.get(&timer.session).is_none_or(|r| r.round != timer.round) {
            return;
        }
        tracing::warn!("Grok did not finish compacting within {:?}; cancelling", compact::DEADLINE);
        cx.to_agent(crate::frame::notification("session/cancel", json!({"sessionId": timer.session})));
        self.finish(&timer.session, Outcome::not(compact::TIMED_OUT), cx);
    }
}

impl GrokCompact {
    fn initialized(&self, frame: Frame, cx: &mut Cx) {
        let mut v = frame.to_value();
        let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) else { return cx.to_client(frame) };
        compact::declare(result);
        cx.to_client(frame.rewritten(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;
    use std::time::Duration;

    const S: &str = "01a2350d-04b9-7631-977e-821743ed1d2a";

    fn started() -> Harness {
        let mut h = Harness::of(GrokCompact::new());
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"agentCapabilities":{"loadSession":true}}}));
        let init = h.to_client();
        assert_eq!(init[0]["result"]["agentCapabilities"]["_meta"]["coda"]["compact"], json!({}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.to_client();
        h
    }

    fn compact(h: &mut Harness, id: &str, session: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"_coda/session/compact","params":{"sessionId":session}}));
    }

    fn completed(before: u64, after: u64) -> Value {
        json!({"jsonrpc":"2.0","method":NOTIFICATION,"params":{"_meta":{"agentTimestampMs":1_796_186_078_044u64},
            "sessionId":S,"update":{"sessionUpdate":COMPLETED,"summary_preview":null,"tokens_before":before,
            "tokens_after":after}}})
    }

    fn prompt(h: &mut Harness, id: i64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"next"}]}}));
    }

    #[test]
    fn between_turns_it_compacts_with_groks_counts_and_holds_prompts_until_the_answer() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0]["method"], COMPACT);
        assert_eq!(asked[0]["params"], json!({"sessionId":S}));
        prompt(&mut h, 7);
        assert!(h.to_agent().is_empty(), "the prompt waits for the compaction");
        // Grok's notification passes on.
        h.from_agent(completed(15, 8));
        assert_eq!(h.to_client()[0]["params"]["update"]["sessionUpdate"], COMPLETED);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{}}));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":"c","result":{"compacted":true,"before":15,"after":8}})]
        );
        let sent = h.to_agent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["id"], 7);
        assert!(h.next_wake().is_none(), "the deadline is gone");
    }

    #[test]
    fn an_empty_session_is_compacted_with_equal_counts() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        h.from_agent(completed(2262, 2262));
        h.to_client();
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{}}));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":true,"before":2262,"after":2262}));
    }

    #[test]
    fn refusals_go_to_coda_and_nothing_to_grok() {
        let mut h = started();
        compact(&mut h, "u", "another");
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::NOT_RUNNING}));
        // Coda's turn.
        prompt(&mut h, 3);
        h.to_agent();
        compact(&mut h, "t", S);
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::TURN_RUNNING}));
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}));
        h.to_client();
        // Grok's own turn (a wake after a background task).
        h.from_agent(json!({"jsonrpc":"2.0","method":QUEUE_CHANGED,"params":{"sessionId":S,"entries":[],
            "runningPromptId":"task-completed-t1","runningKind":"prompt"}}));
        h.to_client();
        compact(&mut h, "g", S);
        assert_eq!(h.to_client()[0]["result"]["reason"], compact::TURN_RUNNING);
        h.from_agent(json!({"jsonrpc":"2.0","method":QUEUE_CHANGED,"params":{"sessionId":S,"entries":[]}}));
        h.to_client();
        assert!(h.to_agent().is_empty());
        compact(&mut h, "ok", S);
        assert_eq!(h.to_agent()[0]["method"], COMPACT, "idle again");
        compact(&mut h, "again", S);
        assert_eq!(h.to_client()[0]["result"]["reason"], compact::ALREADY);
    }

    #[test]
    fn a_failure_is_not_compacted_with_groks_message() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        prompt(&mut h, 4);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"error":{"code":-32603,"message":"Internal error",
            "data":{"kind":"compact_failed","message":"degenerate summary (26 chars for ~2276 input tokens)"}}}));
        assert_eq!(
            h.to_client()[0]["result"],
            json!({"compacted":false,"reason":"Grok could not compact: degenerate summary (26 chars for ~2276 input tokens)"})
        );
        assert_eq!(h.to_agent()[0]["id"], 4, "the held prompt goes on");
    }

    #[test]
    fn grok_that_never_answers_is_cancelled_at_the_deadline_and_its_late_answer_dropped() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        prompt(&mut h, 5);
        h.advance(compact::DEADLINE - Duration::from_secs(1));
        assert!(h.to_client().is_empty());
        h.advance(Duration::from_secs(1));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":"c","result":{"compacted":false,"reason":compact::TIMED_OUT}})]
        );
        let out = h.to_agent();
        assert_eq!(out[0], json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}}));
        assert_eq!(out[1]["id"], 5);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{}}));
        assert!(h.to_client().is_empty(), "a late answer is the shim's own, dropped");
    }

    #[test]
    fn hostile_requests_and_answers() {
        let mut h = started();
        for params in [json!({}), json!({"sessionId": 7}), json!({"sessionId": ""}), json!([[[[]]]])] {
            h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"_coda/session/compact","params":params}));
            assert_eq!(h.to_client()[0]["error"]["code"], -32602);
        }
        // A number too large for a float beside the session: read, answered by the shim, never passed on.
        let huge = r#"{"jsonrpc":"2.0","id":9,"method":"_coda/session/compact","params":{"sessionId":"s","n":1e400}}"#;
        h.client_frame(Frame::parse(huge.as_bytes().to_vec()).expect("a frame"));
        assert_eq!(h.to_client()[0]["result"]["reason"], compact::NOT_RUNNING);
        assert!(h.to_agent().is_empty());
        // Nesting too deep to read never reaches a layer: the engine answers it (src/relay/behaviour.rs).
        let n = crate::json::MAX_DEPTH + 5;
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"_coda/session/compact","params":{}{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        );
        assert!(Frame::parse(deep.into_bytes()).is_err());
        // A result with a huge message and an unreadable update do not panic.
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        let bad = format!(
            r#"{{"jsonrpc":"2.0","method":"{NOTIFICATION}","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"{COMPLETED}","tokens_before":1e400,"tokens_after":-3}}}}}}"#
        );
        h.agent_frame(Frame::parse(bad.into_bytes()).expect("a frame"));
        assert_eq!(h.to_client().len(), 1, "Grok's frame passes on");
        let long = "x".repeat(100_000);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"error":{"code":-32603,"message":long}}));
        let reason = h.to_client()[0]["result"]["reason"].as_str().unwrap().to_owned();
        assert!(reason.chars().count() < 600, "{}", reason.len());
    }
}

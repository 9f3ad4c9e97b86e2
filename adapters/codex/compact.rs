//! `_coda/session/compact` on Codex (section 压缩上下文): codex-acp compacts with its `/compact` slash command,
//! which the shim sends as a `session/prompt` of its own.
//!
//! - Declared (`agentCapabilities._meta.coda.compact`) in every `initialize` answer: every codex-acp has `/compact`.
//! - Answered at once, with nothing sent: `compacted: false` for a session not made or opened in this process,
//!   one with a `session/prompt` open (a turn runs), or one already compacting; `-32602` without a sessionId.
//! - Else the shim sends `/compact` and holds Coda's `session/prompt`s for that session until it ends.
//! - The shim's prompt is no turn of Coda's. Of the session's updates while it runs, `compaction_update` and
//!   `usage_update` pass on (Coda reads them between turns too), so do updates that are no turn's content
//!   (commands, config, titles); the turn's content is dropped: messages, thoughts, plans, tool calls (for a
//!   Coda that did not declare `session.compaction`, the compaction shows as the "Compact conversation" tool
//!   call) and the `threadStatus` active/idle of its start and end. Its answer is the shim's and never reaches Coda.
//! - The answer: `compacted: true` when Codex reported the compaction completed (`compaction_update`, or the
//!   tool call), with `before` = Codex's `used` when it started (the last response's tokens as the model reported
//!   them) and no `after`: Codex says the compacted context only as its own estimate, another measure (live
//!   against the fake model: 110 reported before, 7601 estimated after), and the next response's count comes
//!   after the answer; `compacted: false` with Codex's reason when it failed,
//!   was cancelled, or ended without saying it compacted.
//! - Past [`compact::DEADLINE`] the shim cancels the prompt (`session/cancel`) and answers `compacted: false`; the
//!   held prompts go on when Codex answers the cancel, or 30 s later.
//!
//! The shim declares nothing to codex-acp on Coda's behalf: Coda's `clientCapabilities` pass as they came.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{Value, json};

use super::roots::Roots;
use crate::coda::compact::{self, Gate, Outcome};
use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Layer};

/// How long held prompts wait after the cancel for Codex to answer the shim's prompt.
const GRACE: Duration = Duration::from_secs(30);
/// The longest part of Codex's own error text a reason quotes.
const REASON_MAX: usize = 300;

/// Updates that are a turn's content: the shim's prompt shows none of them to Coda.
const TURN_CONTENT: [&str; 7] = [
    "agent_message_chunk",
    "agent_thought_chunk",
    "user_message_chunk",
    "tool_call",
    "tool_call_update",
    "plan",
    "compaction_summary_chunk",
];

/// The shim's `/compact` prompt for a session.
pub struct Own(String);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tick {
    /// Give up on Codex: cancel, answer Coda.
    Deadline(String),
    /// Stop waiting for the cancelled prompt's answer: let the held prompts go.
    Grace(String),
}

#[derive(Debug, PartialEq)]
enum Progress {
    NotSeen,
    Started,
    Completed,
    Failed(String),
}

struct Running {
    /// Coda's request, until it is answered.
    coda: Option<Id>,
    before: Option<u64>,
    progress: Progress,
    timed_out: bool,
    /// The "Compact conversation" tool calls of this compaction.
    tools: HashSet<String>,
}

#[derive(Default)]
pub struct Compact {
    roots: Roots,
    gate: Gate,
    running: HashMap<String, Running>,
    /// Codex's last `used` of each root session.
    used: HashMap<String, u64>,
}

fn cut(s: &str) -> String {
    match s.char_indices().nth(REASON_MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

impl Compact {
    pub fn new() -> Compact {
        Compact::default()
    }

    /// Whether a turn of Coda's runs in `session`: a `session/prompt` of it is open.
    fn turn_running(cx: &Cx, session: &str) -> bool {
        cx.open_requests().any(|r| r.is("session/prompt") && r.session() == Some(session))
    }

    fn request(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(id) = frame.id().cloned() else { return cx.to_agent(frame) };
        let value = frame.value();
        let session = match compact::session_of(value, &id) {
            Ok(s) => s,
            Err(answer) => return cx.to_client(answer),
        };
        let refused = if !self.roots.contains(&session) {
            Some(compact::NOT_RUNNING)
        } else if self.running.contains_key(&session) {
            Some(compact::ALREADY)
        } else if Self::turn_running(cx, &session) {
            Some(compact::TURN_RUNNING)
        } else {
            None
        };
        if let Some(reason) = refused {
            return cx.to_client(Outcome::not(reason).answer(&id));
        }
        self.gate.close(&session);
        let before = self.used.get(&session).copied();
        self.running.insert(
            session.clone(),
            Running { coda: Some(id), before, progress: Progress::NotSeen, timed_out: false, tools: HashSet::new() },
        );
        let prompt = json!({"sessionId": session, "prompt": [{"type": "text", "text": "/compact"}]});
        cx.request("session/prompt", prompt, Own(session.clone()));
        cx.after(compact::DEADLINE, Tick::Deadline(session));
    }

    /// A `session/update` from codex-acp: what a running compaction learns from it, and whether it goes on.
    fn update(&mut self, frame: Frame, cx: &mut Cx) {
        let kind = frame.session_update().unwrap_or_default().to_owned();
        let compacting = !self.running.is_empty();
        if kind != "usage_update" && !compacting {
            return cx.to_client(frame);
        }
        let value = frame.value();
        let Some(session) = value.pointer("/params/sessionId").and_then(Value::as_str) else {
            return cx.to_client(frame);
        };
        let update = &value["params"]["update"];
        let used = update.get("used").and_then(Value::as_u64);
        if kind == "usage_update"
            && let Some(used) = used
            && self.roots.contains(session)
        {
            self.used.insert(session.to_owned(), used);
        }
        let Some(run) = self.running.get_mut(session) else { return cx.to_client(frame) };
        let status = update.get("status").and_then(Value::as_str);
        let tool = update.get("toolCallId").and_then(Value::as_str).unwrap_or_default();
        match kind.as_str() {
            "usage_update" => cx.to_client(frame),
            "compaction_update" => {
                run.progress = match status {
                    Some("in_progress") => Progress::Started,
                    Some("completed") => Progress::Completed,
                    Some("failed") => {
                        let error = update.get("error").map(|e| match e {
                            Value::String(s) => s.clone(),
                            e => e.get("message").and_then(Value::as_str).map_or_else(|| e.to_string(), str::to_owned),
                        });
                        Progress::Failed(error.unwrap_or_else(|| "no reason given".into()))
                    }
                    _ => std::mem::replace(&mut run.progress, Progress::NotSeen),
                };
                cx.to_client(frame)
            }
            "tool_call" if update.pointer("/_meta/jetbrains/air/contextCompaction").is_some() => {
                run.tools.insert(tool.to_owned());
                run.progress = Progress::Started;
                tracing::debug!("the shim's /compact: Codex's compaction tool call dropped");
            }
            "tool_call_update" if run.tools.contains(tool) => {
                match status {
                    Some("completed") => run.progress = Progress::Completed,
                    Some("failed") => run.progress = Progress::Failed("the compaction tool call failed".into()),
                    _ => {}
                }
                tracing::debug!("the shim's /compact: Codex's compaction tool call update dropped");
            }
            k if TURN_CONTENT.contains(&k) => tracing::debug!("the shim's /compact: a {k} dropped (no turn of Coda's)"),
            "session_info_update" if update.pointer("/_meta/codex/threadStatus").is_some() => {
                tracing::debug!("the shim's /compact: its thread status dropped (no turn of Coda's)");
            }
            _ => cx.to_client(frame),
        }
    }

    /// The compaction of `session` is over: answer Coda (unless it was already), let its prompts go.
    fn finish(&mut self, session: &str, outcome: Outcome, cx: &mut Cx) {
        let Some(run) = self.running.remove(session) else { return };
        if let Some(id) = run.coda {
            cx.to_client(outcome.answer(&id));
        }
        cx.cancel(&Tick::Deadline(session.to_owned()));
        cx.cancel(&Tick::Grace(session.to_owned()));
        for held in self.gate.open(session) {
            cx.to_agent(held);
        }
    }

    fn outcome(run: &Running, reply: &Frame) -> Outcome {
        let reply = reply.value();
        if let Some(error) = reply.get("error") {
            let message = error.get("message").and_then(Value::as_str).unwrap_or("no message");
            return Outcome::not(format!("Codex could not compact: {}", cut(message)));
        }
        let stop = reply.pointer("/result/stopReason").and_then(Value::as_str);
        match (&run.progress, stop) {
            _ if run.timed_out => Outcome::not(compact::TIMED_OUT),
            (Progress::Failed(why), _) => Outcome::not(format!("Codex could not compact: {}", cut(why))),
            (Progress::Completed, _) => Outcome::Compacted { before: run.before, after: None },
            (_, Some("cancelled")) => Outcome::not("the compaction was cancelled"),
            _ => Outcome::not("Codex ended /compact without reporting a compaction"),
        }
    }
}

impl Layer for Compact {
    type Timer = Tick;
    type Event = std::convert::Infallible;
    type Reply = Own;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if frame.is_request(compact::METHOD) {
            return self.request(frame, cx);
        }
        if frame.is_request("session/prompt")
            && let Some(session) = frame.id().and_then(|id| cx.request_of(id)).and_then(|r| r.session())
            && self.gate.is_closed(session)
        {
            let session = session.to_owned();
            tracing::debug!("a session/prompt waits for the session's compaction to end");
            if let Some(frame) = self.gate.hold(&session, frame) {
                cx.to_agent(frame);
            }
            return;
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => {
                self.roots.learn(&frame, cx);
                let initialize = cx.answer_to(&frame).is_some_and(|r| r.is("initialize"));
                if !initialize {
                    return cx.to_client(frame);
                }
                let mut value = frame.to_value();
                match value.get_mut("result").and_then(Value::as_object_mut) {
                    Some(result) => {
                        compact::declare(result);
                        cx.to_client(frame.rewritten(value))
                    }
                    None => cx.to_client(frame),
                }
            }
            Kind::Notification { method } if method == "session/update" => self.update(frame, cx),
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            // `update` reads usage figures always, the rest only while a compaction runs.
            Kind::Notification { method } if method == "session/update" => {
                self.running.is_empty() && frame.session_update() != Some("usage_update")
            }
            Kind::Response { .. } => false,
            _ => true,
        }
    }

    fn on_reply(&mut self, own: Own, reply: Frame, cx: &mut Cx) {
        let Own(session) = own;
        let Some(run) = self.running.get(&session) else {
            return tracing::debug!("Codex answered the shim's /compact after the shim stopped waiting");
        };
        let outcome = Self::outcome(run, &reply);
        if let Outcome::NotCompacted(why) = &outcome {
            tracing::info!("the session was not compacted: {why}");
        }
        self.finish(&session, outcome, cx);
    }

    fn on_timer(&mut self, tick: Tick, cx: &mut Cx) {
        match tick {
            Tick::Deadline(session) => {
                let Some(run) = self.running.get_mut(&session) else { return };
                tracing::warn!("Codex did not finish compacting in time; the shim cancels its /compact");
                run.timed_out = true;
                if let Some(id) = run.coda.take() {
                    cx.to_client(Outcome::not(compact::TIMED_OUT).answer(&id));
                }
                cx.to_agent(frame::notification("session/cancel", json!({"sessionId": session})));
                cx.after(GRACE, Tick::Grace(session));
            }
            Tick::Grace(session) => {
                tracing::warn!("Codex did not answer the cancelled /compact; the held prompts go on");
                self.finish(&session, Outcome::not(compact::TIMED_OUT), cx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    const S: &str = "root-1";

    fn started() -> Harness {
        let mut h = Harness::of(Compact::new());
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"agentCapabilities":{"loadSession":true}}}));
        let init = h.to_client();
        assert_eq!(init[0]["result"]["agentCapabilities"]["_meta"]["coda"], json!({"compact":{}}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.from_agent(usage(10471));
        h.to_client();
        h.to_agent();
        h
    }

    fn update(update: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":update}})
    }

    fn usage(used: u64) -> Value {
        update(json!({"sessionUpdate":"usage_update","used":used,"size":258400}))
    }

    fn compaction(status: &str) -> Value {
        update(json!({"sessionUpdate":"compaction_update","compactionId":"k","status":status}))
    }

    fn ask(h: &mut Harness, id: u64) -> Vec<Value> {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"_coda/session/compact","params":{"sessionId":S}}));
        h.to_agent()
    }

    fn prompt(id: u64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,"prompt":[{"type":"text","text":"hi"}]}})
    }

    #[test]
    fn between_turns_the_shim_compacts_with_its_own_prompt_and_answers_before_only_in_one_measure() {
        let mut h = started();
        let sent = ask(&mut h, 7);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["method"], "session/prompt");
        assert_eq!(sent[0]["params"], json!({"sessionId":S,"prompt":[{"type":"text","text":"/compact"}]}));
        assert!(h.to_client().is_empty(), "no answer yet");
        // Coda's prompt meanwhile waits.
        h.from_client(prompt(8));
        assert!(h.to_agent().is_empty());
        let thread = |t: &str| {
            update(json!({"sessionUpdate":"session_info_update","_meta":{"codex":{"threadStatus":{"type":t}}}}))
        };
        h.from_agent(thread("active"));
        h.from_agent(compaction("in_progress"));
        h.from_agent(usage(10471));
        h.from_agent(usage(7479));
        h.from_agent(update(json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}})));
        h.from_agent(usage(7547));
        h.from_agent(compaction("completed"));
        h.from_agent(thread("idle"));
        h.from_agent(update(json!({"sessionUpdate":"session_info_update","title":"kept"})));
        let passed: Vec<Value> = h.to_client();
        let kinds: Vec<&str> =
            passed.iter().map(|f| f["params"]["update"]["sessionUpdate"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "compaction_update",
                "usage_update",
                "usage_update",
                "usage_update",
                "compaction_update",
                "session_info_update"
            ]
        );
        assert_eq!(passed[5]["params"]["update"]["title"], "kept");
        let own = h.stack().requests().get(&Id::from_json("8")).map(|r| r.is_sent());
        assert_eq!(own, Some(false), "Coda's prompt is held, not sent");
        // The shim's prompt is answered: Coda gets the compaction's answer, then its prompt goes on.
        let own_id = sent[0]["id"].clone();
        h.from_agent(json!({"jsonrpc":"2.0","id":own_id,"result":{"stopReason":"end_turn","_meta":{"quota":{}}}}));
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":10471}})]);
        assert_eq!(h.to_agent(), vec![prompt(8)]);
        assert_eq!(h.next_wake(), None, "the deadline is forgotten");
    }

    #[test]
    fn refused_at_once_during_a_turn_for_an_unknown_session_twice_and_without_a_session() {
        let mut h = started();
        h.from_client(prompt(2));
        h.to_agent();
        assert!(ask(&mut h, 3).is_empty());
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::TURN_RUNNING}));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        h.to_client();
        h.from_client(json!({"jsonrpc":"2.0","id":4,"method":"_coda/session/compact","params":{"sessionId":"other"}}));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::NOT_RUNNING}));
        assert_eq!(ask(&mut h, 5).len(), 1);
        assert!(ask(&mut h, 6).is_empty());
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::ALREADY}));
        for params in [json!({}), json!({"sessionId":1e300}), json!([1])] {
            h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"_coda/session/compact","params":params}));
            assert_eq!(h.to_client()[0]["error"]["code"], -32602);
        }
        assert!(h.to_agent().is_empty());
    }

    #[test]
    fn a_failed_or_cancelled_compaction_is_not_compacted_with_the_reason() {
        let mut h = started();
        let own = ask(&mut h, 7)[0]["id"].clone();
        h.from_agent(compaction("in_progress"));
        let failed =
            json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"failed","error":"stream closed"});
        h.from_agent(update(failed));
        h.to_client();
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"result":{"stopReason":"end_turn"}}));
        assert_eq!(
            h.to_client()[0]["result"],
            json!({"compacted":false,"reason":"Codex could not compact: stream closed"})
        );
        let own = ask(&mut h, 8)[0]["id"].clone();
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"result":{"stopReason":"cancelled"}}));
        assert_eq!(h.to_client()[0]["result"]["reason"], "the compaction was cancelled");
        let own = ask(&mut h, 9)[0]["id"].clone();
        let huge = "e".repeat(100_000);
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"error":{"code":-32603,"message":huge}}));
        let reason = h.to_client()[0]["result"]["reason"].as_str().unwrap().to_owned();
        assert!(reason.starts_with("Codex could not compact: eee") && reason.len() < 400, "{}", reason.len());
    }

    #[test]
    fn without_session_compaction_the_compact_conversation_tool_call_tells_and_is_not_shown() {
        let mut h = started();
        let own = ask(&mut h, 7)[0]["id"].clone();
        h.from_agent(update(
            json!({"sessionUpdate":"tool_call","toolCallId":"t","kind":"think","title":"Compact conversation",
            "status":"in_progress","_meta":{"jetbrains":{"air":{"version":1,"contextCompaction":{"version":1}}}}}),
        ));
        h.from_agent(usage(8242));
        h.from_agent(update(json!({"sessionUpdate":"tool_call_update","toolCallId":"t","status":"completed"})));
        let shown = h.to_client();
        assert_eq!(shown.len(), 1, "only the usage update: {shown:?}");
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"result":{"stopReason":"end_turn"}}));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":true,"before":10471}));
    }

    #[test]
    fn a_codex_that_hangs_is_cancelled_before_codas_ten_minutes_and_held_prompts_go_on() {
        let mut h = started();
        ask(&mut h, 7);
        h.from_client(prompt(8));
        h.advance(compact::DEADLINE - Duration::from_millis(1));
        assert!(h.to_client().is_empty());
        h.advance(Duration::from_millis(1));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::TIMED_OUT}));
        assert_eq!(h.to_agent(), vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        h.advance(GRACE);
        assert_eq!(h.to_agent(), vec![prompt(8)]);
        assert!(h.to_client().is_empty(), "Coda was answered once");
        assert!(!h.layer::<Compact>(0).gate.is_closed(S));
    }

    #[test]
    fn a_request_naming_a_lone_surrogate_session_is_read_and_refused_and_other_sessions_prompts_pass() {
        let mut h = started();
        // Read as the session "\u{FFFD}", which Codex never opened: not compacted, and Codex is not asked.
        let bad = r#"{"jsonrpc":"2.0","id":5,"method":"_coda/session/compact","params":{"sessionId":"\ud800"}}"#;
        h.client_frame(Frame::parse(bad.as_bytes().to_vec()).unwrap());
        let answer = h.to_client();
        assert_eq!((&answer[0]["id"], &answer[0]["result"]["compacted"]), (&json!(5), &json!(false)), "{answer:?}");
        assert!(h.to_agent().is_empty());
        ask(&mut h, 6);
        let other = json!({"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"s2","prompt":[]}});
        h.from_client(other.clone());
        assert_eq!(h.to_agent(), vec![other]);
    }
}

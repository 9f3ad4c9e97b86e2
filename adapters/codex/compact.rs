//! How Codex compacts, for the engine's compaction machine ([`crate::coda::compact`], which keeps the rules of
//! section 压缩上下文): codex-acp compacts with its `/compact` slash command, which the shim sends as a
//! `session/prompt` of its own.
//!
//! - The shim's prompt is no turn of Coda's. Of the session's updates while it runs, `compaction_update` and
//!   `usage_update` pass on (Coda reads them between turns too), so do updates that are no turn's content
//!   (commands, config, titles); the turn's content is dropped: messages, thoughts, plans, tool calls (for a
//!   Coda that did not declare `session.compaction`, the compaction shows as the "Compact conversation" tool
//!   call) and the `threadStatus` active/idle of its start and end. Its answer is the shim's and never reaches Coda.
//! - The outcome: compacted when Codex reported the compaction completed (`compaction_update`, or the tool
//!   call), with `before` = Codex's `used` when it started and `after` = its last `used` before it ended (both
//!   Codex's own `used`, one measure); not compacted with Codex's own text when it failed (the failed update's
//!   `error`, an error answer's `data.message` before its generic `message`), was cancelled, or ended without
//!   saying it compacted.
//! - Stopped (past the deadline) with `session/cancel`, which ends the shim's prompt `cancelled`.
//!
//! The shim declares nothing to codex-acp on Coda's behalf: Coda's `clientCapabilities` pass as they came.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::compact::{Compactor, Ctl, Outcome};
use crate::frame::{Frame, Kind};

/// The longest part of Codex's own error text a reason quotes, in characters.
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

/// The shim's `/compact` prompt for a session, in a compaction round.
pub struct Own {
    session: String,
    round: u64,
}

#[derive(Debug, PartialEq)]
enum Progress {
    NotSeen,
    Started,
    Completed,
    Failed(String),
}

/// One compaction Codex runs.
struct Running {
    round: u64,
    before: Option<u64>,
    after: Option<u64>,
    progress: Progress,
    /// The "Compact conversation" tool calls of this compaction.
    tools: HashSet<String>,
}

/// Codex's compaction: its `/compact` prompt (see the module docs).
#[derive(Default)]
pub struct CodexCompact {
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

/// Codex's own text in an error: codex-acp answers `-32603 "Internal error"` with Codex's message in
/// `data.message`; a failed update's `error` is a string or `{message}`.
fn error_text(error: &Value) -> String {
    let text = error.pointer("/data/message").or_else(|| error.get("message")).and_then(Value::as_str);
    match (error, text) {
        (Value::String(s), _) => s.clone(),
        (_, Some(t)) => t.to_owned(),
        (e, None) => e.to_string(),
    }
}

impl CodexCompact {
    pub fn new() -> CodexCompact {
        CodexCompact::default()
    }

    /// A `session/update` from codex-acp: what a running compaction learns from it, and whether it goes on.
    fn update(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        let kind = frame.session_update().unwrap_or_default();
        if kind != "usage_update" && self.running.is_empty() {
            return true;
        }
        if self.running.is_empty() {
            // A `usage_update` while nothing compacts: its figure only, read where it lies.
            let Some(session) = frame.session() else { return true };
            let used = frame.update_value().and_then(|u| u.get("used")).and_then(|used| used.as_u64());
            if let Some(used) = used
                && ctl.cx.session(&session).is_some_and(|s| s.is_root())
            {
                self.used.insert(session.into_owned(), used);
            }
            return true;
        }
        let value = frame.value();
        let Some(session) = value.pointer("/params/sessionId").and_then(Value::as_str) else { return true };
        let update = &value["params"]["update"];
        let used = update.get("used").and_then(Value::as_u64);
        if kind == "usage_update"
            && let Some(used) = used
            && ctl.cx.session(session).is_some_and(|s| s.is_root())
        {
            self.used.insert(session.to_owned(), used);
        }
        let Some(run) = self.running.get_mut(session) else { return true };
        let status = update.get("status").and_then(Value::as_str);
        let tool = update.get("toolCallId").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "usage_update" => {
                if run.progress == Progress::NotSeen || run.progress == Progress::Started {
                    run.after = used.or(run.after);
                }
                true
            }
            "compaction_update" => {
                run.progress = match status {
                    Some("in_progress") => Progress::Started,
                    Some("completed") => Progress::Completed,
                    Some("failed") => {
                        let error = update.get("error").map(error_text);
                        Progress::Failed(error.unwrap_or_else(|| "no reason given".into()))
                    }
                    _ => std::mem::replace(&mut run.progress, Progress::NotSeen),
                };
                true
            }
            "tool_call" if update.pointer("/_meta/jetbrains/air/contextCompaction").is_some() => {
                run.tools.insert(tool.to_owned());
                run.progress = Progress::Started;
                tracing::debug!("the shim's /compact: Codex's compaction tool call dropped");
                false
            }
            "tool_call_update" if run.tools.contains(tool) => {
                match status {
                    Some("completed") => run.progress = Progress::Completed,
                    Some("failed") => run.progress = Progress::Failed("the compaction tool call failed".into()),
                    _ => {}
                }
                tracing::debug!("the shim's /compact: Codex's compaction tool call update dropped");
                false
            }
            k if TURN_CONTENT.contains(&k) => {
                tracing::debug!("the shim's /compact: a {k} dropped (no turn of Coda's)");
                false
            }
            "session_info_update" if update.pointer("/_meta/codex/threadStatus").is_some() => {
                tracing::debug!("the shim's /compact: its thread status dropped (no turn of Coda's)");
                false
            }
            _ => true,
        }
    }

    fn outcome(run: &Running, reply: &Frame) -> Outcome {
        if let Progress::Failed(why) = &run.progress {
            return Outcome::not(format!("Codex could not compact: {}", cut(why)));
        }
        let reply = reply.value();
        if let Some(error) = reply.get("error") {
            return Outcome::not(format!("Codex could not compact: {}", cut(&error_text(error))));
        }
        let stop = reply.pointer("/result/stopReason").and_then(Value::as_str);
        match (&run.progress, stop) {
            (Progress::Completed, _) => Outcome::Compacted { before: run.before, after: run.after },
            (_, Some("cancelled")) => Outcome::not("the compaction was cancelled"),
            _ => Outcome::not("Codex ended /compact without reporting a compaction"),
        }
    }
}

impl Compactor for CodexCompact {
    type Event = Infallible;
    type Reply = Own;
    type Timer = Infallible;

    fn start(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>) {
        let before = self.used.get(session).copied();
        let run = Running { round, before, after: None, progress: Progress::NotSeen, tools: HashSet::new() };
        self.running.insert(session.to_owned(), run);
        let prompt = json!({"sessionId": session, "prompt": [{"type": "text", "text": "/compact"}]});
        ctl.request("session/prompt", prompt, Own { session: session.to_owned(), round });
    }

    fn finished(&mut self, session: &str, round: u64, _ctl: &mut Ctl<Self>) {
        if self.running.get(session).is_some_and(|r| r.round == round) {
            self.running.remove(session);
        }
        if self.used.len() > crate::layer::sessions::MAX_ROOTS {
            self.used.clear();
        }
    }

    fn from_agent(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => self.update(frame, ctl),
            _ => true,
        }
    }

    fn ignores(&self, frame: &Frame) -> bool {
        // `update` reads usage figures always, the rest only while a compaction runs.
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => {
                self.running.is_empty() && frame.session_update() != Some("usage_update")
            }
            _ => true,
        }
    }

    fn on_reply(&mut self, own: Own, reply: Frame, ctl: &mut Ctl<Self>) {
        let Some(run) = self.running.get(&own.session).filter(|r| r.round == own.round) else {
            return tracing::debug!("Codex answered the shim's /compact after the shim stopped waiting");
        };
        let outcome = Self::outcome(run, &reply);
        ctl.ended(&own.session, own.round, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::compact::{self, Compaction};
    use crate::frame::Id;
    use crate::layer::testing::Harness;
    use std::time::Duration;

    const S: &str = "root-1";

    fn started() -> Harness {
        let mut h = Harness::of(Compaction::new(CodexCompact::new()));
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
    fn between_turns_the_shim_compacts_with_its_own_prompt_and_answers_before_and_after() {
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
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":10471,"after":7547}})]
        );
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
        // codex-acp's error carries Codex's own text in `data.message`: that is the reason, not "Internal error".
        let own = ask(&mut h, 10)[0]["id"].clone();
        let data = json!({"message":"stream disconnected before completion","codexErrorInfo":"other"});
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"error":{"code":-32603,"message":"Internal error","data":data}}));
        assert_eq!(
            h.to_client()[0]["result"]["reason"],
            "Codex could not compact: stream disconnected before completion"
        );
        // A failed update's text is kept when the answer is only an error.
        let own = ask(&mut h, 11)[0]["id"].clone();
        let failed = json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"failed",
            "error":{"message":"context window exceeded"}});
        h.from_agent(update(failed));
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"error":{"code":-32603,"message":"Internal error"}}));
        let out = h.to_client();
        assert_eq!(out.last().unwrap()["result"]["reason"], "Codex could not compact: context window exceeded");
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
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":true,"before":10471,"after":8242}));
    }

    #[test]
    fn a_codex_that_hangs_is_cancelled_before_codas_ten_minutes_and_held_prompts_go_once_it_stopped() {
        let mut h = started();
        let own = ask(&mut h, 7)[0]["id"].clone();
        h.from_client(prompt(8));
        h.advance(compact::DEADLINE - Duration::from_millis(1));
        assert!(h.to_client().is_empty());
        h.advance(Duration::from_millis(1));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::TIMED_OUT}));
        assert_eq!(h.to_agent(), vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        // Codex ends the cancelled /compact: the prompt goes on; Coda was answered once.
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"result":{"stopReason":"cancelled"}}));
        assert_eq!(h.to_agent(), vec![prompt(8)]);
        assert!(h.to_client().is_empty(), "Coda was answered once");
        assert!(h.stack().sessions().get(S).is_some_and(|s| s.compaction().is_none()));
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

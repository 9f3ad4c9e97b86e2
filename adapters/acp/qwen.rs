//! What Qwen Code 0.24.4 does natively that coda-acp gives Coda (read in its ACP agent, `acpAgent-*.js` and the
//! command chunks of `@qwen-code/qwen-code`, and seen live; docs/acp-agents.md):
//!
//! - **Steering** (its pull model): after each tool batch, and where its todo stop guard inspects a turn's end,
//!   Qwen asks the client `craft/drainMidTurnQueue {sessionId, promptId?, todoStopGuardWatchQueuedPrompt?}` (a
//!   request it waits 2 s for; -32601 makes it stop asking for the session) and adds the items of the answer,
//!   `{items: [{content: [<content blocks>]}], hasQueuedPrompt}`, to the running turn as the user's message.
//!   [`QwenSteering`] is its backend for the engine's steering machine: Coda's message waits for Qwen's next
//!   drain in Coda's turn and is `injected` when it went out in the answer; the turn ends before Qwen asked:
//!   `promptRequired` (Qwen never had it). Every drain is answered by coda-acp (with no items when nothing
//!   waits) and never reaches Coda, which does not know the method. `hasQueuedPrompt` is `false`: Coda keeps its
//!   next prompts itself.
//! - **Compaction**: `/compress` streams `agent_message_chunk`s with `_meta.contextCompression` (`{phase:
//!   "progress"}`, then `{phase: "done", originalTokenCount, newTokenCount, …}`); a failure is an error answer
//!   to the prompt (the command's error message). [`compression`] reads them for the engine's slash-command
//!   compaction.

use crate::HashMap;
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::slash_compact::Said;
use crate::coda::steering::{Ctl, Outcome, Steerer};
use crate::frame::{self, Frame, Kind};
use crate::layer::Turn;

/// Qwen's request for the messages queued for its running turn.
pub const DRAIN: &str = "craft/drainMidTurnQueue";

/// Qwen's compaction report in an `update` of the session that compacts.
pub fn compression(update: &Value) -> Option<Said> {
    let phase = update.pointer("/_meta/contextCompression/phase").and_then(Value::as_str)?;
    let count = |key: &str| update.pointer(&format!("/_meta/contextCompression/{key}")).and_then(Value::as_u64);
    Some(match phase {
        "progress" => Said::Started,
        "done" => Said::Completed { before: count("originalTokenCount"), after: count("newTokenCount") },
        "noop" => Said::Nothing,
        _ => return None,
    })
}

/// Qwen's steering (see the module docs): the message waiting for Qwen's next drain, by session.
#[derive(Debug, Default)]
pub struct QwenSteering {
    waiting: HashMap<String, (u64, Vec<Value>)>,
}

impl QwenSteering {
    pub fn new() -> QwenSteering {
        QwenSteering::default()
    }

    /// Qwen's drain: answered here with the message waiting for Coda's running turn in its session, if any.
    fn drain(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) {
        let Some(id) = frame.id() else { return };
        let value = frame.value();
        let session = value.pointer("/params/sessionId").and_then(Value::as_str).unwrap_or_default();
        // Only Coda's own running turn takes it (a turn of Qwen's own, for a background task, does not).
        let codas = matches!(ctl.cx.turn(session), Some(Turn::Coda { sent: true, .. }));
        let taken = if codas { self.waiting.remove(session) } else { None };
        let items = match &taken {
            Some((_, prompt)) => json!([{"content": prompt}]),
            None => json!([]),
        };
        ctl.cx.to_agent(frame::result_response(id, json!({"items": items, "hasQueuedPrompt": false})));
        if let Some((round, _)) = taken {
            tracing::debug!("Qwen drained Coda's steering message into its running turn");
            ctl.answer(session, round, Outcome::Injected);
        }
    }
}

impl Steerer for QwenSteering {
    fn session_closed(&mut self, session: &str) {
        self.waiting.remove(session);
    }

    fn kept(&self) -> usize {
        self.waiting.len()
    }

    type Event = Infallible;
    type Reply = Infallible;
    type Timer = Infallible;

    fn steer(&mut self, session: &str, round: u64, prompt: &[Value], _ctl: &mut Ctl<Self>) {
        self.waiting.insert(session.to_owned(), (round, prompt.to_vec()));
    }

    fn turn_ended(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>) {
        // Qwen asks for queued messages before it goes on, so its answer comes after any drain of the turn: a
        // message still here was never handed to it.
        if self.waiting.get(session).is_some_and(|(r, _)| *r == round) {
            self.waiting.remove(session);
            ctl.answer(session, round, Outcome::PromptRequired);
        }
    }

    fn finished(&mut self, session: &str, round: u64) {
        if self.waiting.get(session).is_some_and(|(r, _)| *r == round) {
            self.waiting.remove(session);
        }
    }

    fn from_agent(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        if frame.is_request(DRAIN) {
            self.drain(frame, ctl);
            return false;
        }
        true
    }

    fn ignores(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Request { method, .. } if method == DRAIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::steering::{self, Steering};
    use crate::layer::testing::Harness;

    const S: &str = "q1";

    fn rig() -> Harness {
        let mut h = Harness::of(Steering::new(QwenSteering::new()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"agentInfo":{"name":"qwen-code"}}}));
        assert_eq!(h.to_client()[0]["result"]["_meta"]["steering"], json!({"supported": true}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.take();
        h
    }

    fn prompt(h: &mut Harness, id: u64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"go"}]}}));
        h.take();
    }

    fn steer(h: &mut Harness, id: u64, text: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":steering::METHOD,"params":{"sessionId":S,
            "prompt":[{"type":"text","text":text}],"_meta":{"steering":{"idleBehavior":"promptRequired"}}}}));
    }

    fn drain(id: u64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":DRAIN,"params":{"sessionId":S,"todoStopGuardWatchQueuedPrompt":true}})
    }

    #[test]
    fn a_message_goes_out_in_qwens_next_drain_and_is_injected() {
        let mut h = rig();
        prompt(&mut h, 2);
        // A drain before any message: no items, and nothing reaches Coda.
        h.from_agent(drain(0));
        assert_eq!(h.to_agent(), [json!({"jsonrpc":"2.0","id":0,"result":{"items":[],"hasQueuedPrompt":false}})]);
        assert!(h.to_client().is_empty());
        steer(&mut h, 3, "先别改测试");
        assert!(h.take() == Default::default(), "it waits for Qwen's next drain");
        h.from_agent(drain(1));
        assert_eq!(
            h.to_agent(),
            [json!({"jsonrpc":"2.0","id":1,"result":{"items":[{"content":[{"type":"text","text":"先别改测试"}]}],
                "hasQueuedPrompt":false}})]
        );
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":3,"result":{"outcome":"injected"}})]);
        // The next drain has nothing.
        h.from_agent(drain(2));
        assert_eq!(h.to_agent()[0]["result"]["items"], json!([]));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        assert_eq!(h.to_client()[0]["id"], 2);
    }

    #[test]
    fn a_turn_that_ends_before_qwen_drains_answers_prompt_required_first() {
        let mut h = rig();
        prompt(&mut h, 2);
        steer(&mut h, 3, "and this");
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        let out = h.to_client();
        assert_eq!(
            out[0],
            json!({"jsonrpc":"2.0","id":3,"result":{"outcome":"promptRequired","reason":"noRunningTurn"}})
        );
        assert_eq!(out[1]["id"], 2, "the turn's answer after the steering answer");
        // A drain after that (a turn of Qwen's own) gets nothing.
        h.from_agent(drain(5));
        assert_eq!(h.to_agent()[0]["result"]["items"], json!([]));
        // Between turns: promptRequired at once, nothing waits.
        steer(&mut h, 4, "idle");
        assert_eq!(h.to_client()[0]["result"]["outcome"], "promptRequired");
    }

    #[test]
    fn hostile_drains_are_answered_and_never_reach_coda() {
        let mut h = rig();
        prompt(&mut h, 2);
        steer(&mut h, 3, "x");
        // Another session's drain, one without params, one with a huge number: none takes the message.
        for bad in [
            r#"{"jsonrpc":"2.0","id":7,"method":"craft/drainMidTurnQueue","params":{"sessionId":"other"}}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"craft/drainMidTurnQueue"}"#,
            r#"{"jsonrpc":"2.0","id":9,"method":"craft/drainMidTurnQueue","params":{"sessionId":7,"n":1e400}}"#,
        ] {
            h.agent_frame(Frame::parse(bad.as_bytes().to_vec()).expect("a frame"));
            let out = h.to_agent();
            assert_eq!(out[0]["result"]["items"], json!([]), "{bad}");
            assert!(h.to_client().is_empty());
        }
        h.from_agent(drain(10));
        assert_eq!(h.to_agent()[0]["result"]["items"][0]["content"][0]["text"], "x");
    }

    #[test]
    fn compression_reports_are_read() {
        let done = json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Context compressed"},
            "_meta":{"contextCompression":{"phase":"done","originalTokenCount":20389,"newTokenCount":18039,
            "originalTokenCountIsEstimated":false,"newTokenCountIsEstimated":true}}});
        assert_eq!(compression(&done), Some(Said::Completed { before: Some(20389), after: Some(18039) }));
        let progress = json!({"_meta":{"contextCompression":{"phase":"progress"}}});
        assert_eq!(compression(&progress), Some(Said::Started));
        assert_eq!(compression(&json!({"_meta":{"contextCompression":{"phase":"noop"}}})), Some(Said::Nothing));
        for none in [json!({}), json!({"_meta":{"contextCompression":{"phase":3}}}), json!({"_meta":"x"})] {
            assert_eq!(compression(&none), None);
        }
    }
}

//! How Codex compacts: codex-acp compacts with its `/compact` slash command, which the shim sends as a
//! `session/prompt` of its own and reads as the engine's slash-command compaction does
//! ([`crate::coda::slash_compact`]): ACP's `compaction_update`, or (for a Coda that did not declare
//! `session.compaction`) the "Compact conversation" tool call with AIR's `contextCompaction` meta, and its
//! `threadStatus` active/idle dropped. Seen live in `fixtures/codex/compact-*`.
//!
//! The shim declares nothing to codex-acp on Coda's behalf: Coda's `clientCapabilities` pass as they came.

use crate::coda::slash_compact::SlashCompact;

/// Codex's compaction: its `/compact` prompt.
pub fn codex_compact() -> SlashCompact {
    SlashCompact::new("Codex", "/compact", None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::compact::{self, Compaction};
    use crate::frame::Frame;
    use crate::frame::Id;
    use crate::layer::testing::Harness;
    use serde_json::{Value, json};
    use std::time::Duration;

    const S: &str = "root-1";

    /// The compaction layer over the usage facts layer, as in coda-codex's stack: that layer keeps the CLI's
    /// `used`, the compaction's `before`.
    fn started() -> Harness {
        let facts = crate::adapters::codex::usage::layer(None, None);
        let mut h = Harness::new(vec![Box::new(Compaction::new(codex_compact())), Box::new(facts)]);
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
                "usage_update",
                "session_info_update"
            ]
        );
        // (The usage facts layer's own update after the compaction: its time is a fact.)
        assert!(passed[5]["params"]["update"]["_meta"]["coda"]["compactedAt"].is_string(), "{}", passed[5]);
        assert_eq!(passed[6]["params"]["update"]["title"], "kept");
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
        assert_eq!(shown.len(), 2, "only the usage update and the shim's own after the compaction: {shown:?}");
        assert!(shown[1]["params"]["update"]["_meta"]["coda"]["compactedAt"].is_string(), "{}", shown[1]);
        h.from_agent(json!({"jsonrpc":"2.0","id":own,"result":{"stopReason":"end_turn"}}));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":true,"before":10471}));
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

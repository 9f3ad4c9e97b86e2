//! 压缩上下文 on every binary: `_coda/session/compact` between turns, the prompts that wait behind it, Stop
//! while they wait, the deadline, and a CLI that never ends, dies in the middle or answers twice.

use std::time::Duration;

use serde_json::json;

use super::fake::Compacts;
use super::{COMPACTING, Shim, answer, answers, every, methods, reached};
use crate::coda::compact::{ALREADY, DEADLINE, GRACE, METHOD, NOT_RUNNING, TIMED_OUT, TURN_RUNNING};

fn compact_params(shim: &Shim) -> serde_json::Value {
    json!({"sessionId": shim.session})
}

#[tokio::test(start_paused = true)]
async fn a_prompt_sent_while_the_session_compacts_waits_and_goes_on_after_the_answer() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let compact = shim.send(METHOD, compact_params(&shim));
        let prompt = shim.prompt("after the compaction");
        let got = shim.drive().await;
        assert_eq!(answers(&got, compact), 0, "no answer before the CLI ended it: {:?}", got.to_client);
        assert!(!reached(&got, prompt), "the prompt waits");
        let got = shim.fake("_fake/compacted").await;
        let answered = answer(&got, compact).expect("the compaction is answered");
        assert_eq!(answered["result"]["compacted"], true, "{answered}");
        assert!(reached(&got, prompt), "the prompt goes on after the answer");
        let order: Vec<i64> = got.client_json().iter().filter_map(|v| v["id"].as_i64()).collect();
        let at = |id| order.iter().position(|i| *i == id);
        assert!(at(compact) < at(prompt), "Coda gets the compaction's answer first: {order:?}");
        assert_eq!(answer(&got, prompt).expect("the prompt's answer")["result"]["stopReason"], "end_turn");
        assert!(shim.fake.state().prompted_while_compacting.is_empty(), "the CLI never got it while compacting");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn stop_while_a_prompt_waits_behind_the_compaction_ends_that_prompt_and_not_the_compaction() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let compact = shim.send(METHOD, compact_params(&shim));
        let prompt = shim.prompt("held, then stopped [[tool:run]]");
        shim.drive().await;
        shim.notify("session/cancel", json!({"sessionId": shim.session}));
        let got = shim.drive().await;
        let stopped = answer(&got, prompt).expect("the held prompt is answered");
        assert_eq!(stopped["result"], json!({"stopReason": "cancelled"}), "{stopped}");
        assert!(!got.to_agent.iter().any(|l| l.contains("session/cancel")), "the cancel is not the compaction's");
        assert_eq!(answers(&got, compact), 0, "the compaction goes on");
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answer(&got, compact).expect("answered")["result"]["compacted"], true);
        assert!(!reached(&got, prompt), "the stopped prompt never reaches the CLI");
        assert_eq!(answers(&got, prompt), 0, "answered once");
        assert!(shim.fake.state().prompted_while_compacting.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn at_the_deadline_held_prompts_never_go_into_a_cli_that_may_still_compact() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Never).await;
        let compact = shim.send(METHOD, compact_params(&shim));
        let prompt = shim.prompt("held behind a compaction that never ends");
        let got = shim.pair.drive_for(DEADLINE + Duration::from_secs(1)).await;
        let answered = answer(&got, compact).expect("Coda is answered within its 10 minutes");
        assert_eq!(answered["result"], json!({"compacted": false, "reason": TIMED_OUT}));
        assert!(!reached(&got, prompt), "not released at the deadline: {:?}", got.to_agent);
        let got = shim.pair.drive_for(GRACE).await;
        let ended = answer(&got, prompt).expect("answered past the grace");
        assert_eq!(ended["error"]["message"], crate::coda::compact::NOT_SENT, "{ended}");
        assert!(ended["error"].get("data").is_none(), "no failure kind: no upstream failed");
        assert!(!reached(&got, prompt), "never sent");
        assert!(shim.fake.state().prompted_while_compacting.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cli_that_ends_its_compaction_when_stopped_gets_the_held_prompts_then() {
    // Codex and Claude Agent ACP end their `/compact` turn on `session/cancel`, Qwen its `/compress`, Kimi its
    // compaction ("Compaction cancelled.").
    every(&["codex", "kimi", "acp-qwen", "acp-claude"], |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let compact = shim.send(METHOD, compact_params(&shim));
        let prompt = shim.prompt("held until the CLI stopped compacting");
        let got = shim.pair.drive_for(DEADLINE + Duration::from_secs(1)).await;
        assert_eq!(answer(&got, compact).expect("answered")["result"]["reason"], TIMED_OUT);
        assert!(got.to_agent.iter().any(|l| l.contains("session/cancel")), "the CLI is asked to stop");
        assert!(reached(&got, prompt), "released once the CLI said its compaction ended");
        assert_eq!(answers(&got, compact), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cli_that_dies_in_the_middle_leaves_no_request_unanswered() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Dies).await;
        let compact = shim.send(METHOD, compact_params(&shim));
        let prompt = shim.prompt("held when the CLI dies");
        shim.drive().await;
        let got = shim.fake("_fake/compacted").await;
        let compacted = answer(&got, compact).expect("the compaction is answered");
        assert!(
            compacted.get("error").is_some() || compacted["result"]["compacted"] == false,
            "not compacted: {compacted}"
        );
        assert!(answer(&got, prompt).expect("the held prompt is answered").get("error").is_some());
        assert!(!reached(&got, prompt));
        assert_eq!(shim.pair.close().await, 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cli_that_answers_twice_is_answered_once_and_sends_the_held_prompt_once() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Twice).await;
        let compact = shim.send(METHOD, compact_params(&shim));
        let prompt = shim.prompt("held once");
        shim.drive().await;
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answers(&got, compact), 1, "{:?}", got.to_client);
        assert_eq!(got.agent_json().iter().filter(|(_, v)| v["id"] == prompt && v.get("method").is_some()).count(), 1);
        let stray =
            got.client_json().into_iter().find(|v| v["id"].as_str().is_some_and(|i| i.starts_with("coda-shim")));
        assert!(stray.is_none(), "the shim's own answers never reach Coda: {stray:?}");
        // And a next compaction goes as the first.
        let again = shim.send(METHOD, compact_params(&shim));
        shim.drive().await;
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answer(&got, again).expect("answered")["result"]["compacted"], true);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn refusals_are_answered_at_once_and_ask_the_cli_nothing() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let unknown = shim.call(METHOD, json!({"sessionId": "not-a-session"})).await;
        assert_eq!(unknown["result"], json!({"compacted": false, "reason": NOT_RUNNING}));
        // During a turn.
        let turn = shim.prompt("a long turn [[open]]");
        shim.drive().await;
        let during = shim.call(METHOD, compact_params(&shim)).await;
        assert_eq!(during["result"], json!({"compacted": false, "reason": TURN_RUNNING}));
        let got = shim.fake("_fake/end").await;
        assert!(answer(&got, turn).is_some());
        // Hostile params.
        for params in [json!({}), json!({"sessionId": 1e300}), json!([1]), json!({"sessionId": ""}), json!(null)] {
            let bad = shim.call(METHOD, params.clone()).await;
            assert_eq!(bad["error"]["code"], -32602, "{params}: {bad}");
        }
        let lone = r#"{"jsonrpc":"2.0","id":"lone","method":"_coda/session/compact","params":{"sessionId":"\ud800"}}"#;
        shim.pair.send(lone);
        let got = shim.drive().await;
        let v = got.client_json().into_iter().find(|v| v["id"] == "lone").expect("answered");
        assert_eq!(v["result"]["compacted"], false, "{v}");
        // Twice at once (each drive is a minute of virtual time: well inside the deadline).
        let first = shim.send(METHOD, compact_params(&shim));
        let got = shim.drive().await;
        assert_eq!(answers(&got, first), 0);
        let second = shim.call(METHOD, compact_params(&shim)).await;
        assert_eq!(second["result"], json!({"compacted": false, "reason": ALREADY}));
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answer(&got, first).expect("answered")["result"]["compacted"], true);
        assert!(methods(&got).iter().all(|m| m != "session/cancel"));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_session_loaded_in_a_fresh_process_compacts() {
    every(&COMPACTING, |agent| async move {
        let session = format!("{agent}-made-elsewhere");
        let mut shim = Shim::loading(agent, Compacts::Ends, &session).await;
        // The CLI knows its model once a turn ran (OpenCode compacts with the session's model).
        let turn = shim.prompt("first turn after the load");
        let got = shim.drive().await;
        assert!(answer(&got, turn).is_some());
        let compact = shim.send(METHOD, json!({"sessionId": session}));
        shim.drive().await;
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answer(&got, compact).expect("answered")["result"]["compacted"], true, "{:?}", got.to_client);
    })
    .await;
}

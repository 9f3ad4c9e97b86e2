//! ACP's `$/cancel_request` on every binary: a withdrawn request still gets exactly one answer, and the
//! withdrawal reaches whoever holds the request. Coda's requests the CLI has (a prompt) are withdrawn as they
//! came; a prompt held behind a compaction and a steering message waiting for its turn are answered cancelled
//! and never sent; Coda's compaction is answered cancelled and the CLI asked to stop; a request the shim made
//! for one of Coda's (Grok's interjection, its compaction) is withdrawn by the shim's own id; a request of the
//! CLI's that Coda has is withdrawn from Coda as it came.

use std::time::Duration;

use serde_json::{Value, json};

use super::fake::Compacts;
use super::{COMPACTING, EVERY, Shim, answer, answers, every, reached};
use crate::coda::compact::{GRACE, METHOD as COMPACT};
use crate::coda::steering::{ANSWER_WAIT, METHOD as STEER};

/// Coda withdraws its request `id`.
fn withdraw(shim: &mut Shim, id: i64) {
    shim.notify("$/cancel_request", json!({"requestId": id}));
}

/// The ids the CLI was asked to withdraw, and whether one of them is a request of the shim's own.
fn withdrawn(shim: &Shim) -> (Vec<String>, bool) {
    let ids = shim.fake.state().withdrawn.clone();
    let own = ids.iter().any(|i| i.starts_with("\"coda-shim-"));
    (ids, own)
}

fn steering(shim: &mut Shim, text: &str) -> i64 {
    let params = json!({"sessionId": shim.session, "prompt": [{"type": "text", "text": text}],
        "_meta": {"steering": {"idleBehavior": "promptRequired"}}});
    shim.send(STEER, params)
}

fn code(v: &Value) -> Option<i64> {
    v.pointer("/error/code").and_then(Value::as_i64)
}

#[tokio::test(start_paused = true)]
async fn a_prompt_the_cli_has_is_withdrawn_from_it_as_it_came_and_answered_once() {
    every(&EVERY, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let turn = shim.prompt("a long turn [[open]]");
        shim.drive().await;
        withdraw(&mut shim, turn);
        let got = shim.drive().await;
        assert!(got.to_agent.iter().any(|l| l.contains("$/cancel_request")), "{agent}: {:?}", got.to_agent);
        assert_eq!(withdrawn(&shim).0, [turn.to_string()], "{agent}: the CLI's own id for it");
        let got = shim.fake("_fake/end").await;
        assert_eq!(answers(&got, turn), 1, "{agent}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_prompt_withdrawn_while_it_waits_behind_a_compaction_is_answered_cancelled_and_never_sent() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let compact = shim.send(COMPACT, json!({"sessionId": shim.session}));
        let prompt = shim.prompt("held, then withdrawn");
        shim.drive().await;
        withdraw(&mut shim, prompt);
        let got = shim.drive().await;
        let ended = answer(&got, prompt).expect("the withdrawn prompt is answered at once");
        assert_eq!(code(&ended), Some(-32800), "{agent}: {ended}");
        assert!(withdrawn(&shim).0.is_empty(), "{agent}: the CLI never saw that prompt, nor its withdrawal");
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answer(&got, compact).expect("answered")["result"]["compacted"], true, "{agent}");
        assert!(!reached(&got, prompt), "{agent}: a withdrawn prompt never reaches the CLI");
        assert_eq!(answers(&got, prompt), 0, "{agent}: answered once");
        assert!(shim.fake.state().prompted_while_compacting.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_compaction_is_answered_cancelled_once_and_the_cli_is_asked_to_stop() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let compact = shim.send(COMPACT, json!({"sessionId": shim.session}));
        let prompt = shim.prompt("held behind the withdrawn compaction");
        shim.drive().await;
        withdraw(&mut shim, compact);
        // A second, well inside the grace the held prompts wait for the CLI's end.
        let got = shim.pair.drive_for(Duration::from_secs(1)).await;
        let answered = answer(&got, compact).expect("answered at once");
        assert_eq!(code(&answered), Some(-32800), "{agent}: {answered}");
        // Asked to stop the CLI's way (`session/cancel`, OpenCode's abort) and, where the shim asked the CLI by
        // a request of its own that is still open, that request withdrawn by the shim's id.
        let (ids, own) = withdrawn(&shim);
        assert!(!ids.contains(&compact.to_string()), "{agent}: the CLI never saw Coda's id: {ids:?}");
        if agent == "grok" || agent == "codex" {
            assert!(own, "{agent}: the shim's own compaction request is withdrawn: {ids:?}");
        }
        // Codex and Kimi end their compaction when stopped, Grok and OpenCode once it is done: then the held
        // prompt goes on, in order.
        let mut went = reached(&got, prompt);
        shim.send("_fake/compacted", json!({"sessionId": shim.session}));
        let got = shim.pair.drive_for(Duration::from_secs(1)).await;
        assert_eq!(answers(&got, compact), 0, "{agent}: answered once");
        went |= reached(&got, prompt);
        assert!(went, "{agent}: the held prompt goes on once the CLI ended its compaction");
        assert!(GRACE > Duration::from_secs(2));
        assert!(shim.fake.state().prompted_while_compacting.is_empty(), "{agent}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_steering_message_the_cli_has_is_withdrawn_from_it_and_answered_once() {
    // Codex takes Coda's request itself (withdrawn as it came); Grok has the shim's `_x.ai/interject` (withdrawn
    // by the shim's id). OpenCode stores the message on its server, which cannot take it back while the turn runs.
    every(&["codex", "grok"], |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        shim.fake.state().steer_silent = true;
        let turn = shim.prompt("a long turn [[open]]");
        shim.drive().await;
        let steer = steering(&mut shim, "withdrawn while the CLI has it");
        shim.drive().await;
        withdraw(&mut shim, steer);
        shim.drive().await;
        let (ids, own) = withdrawn(&shim);
        match agent {
            "codex" => assert_eq!(ids, [steer.to_string()], "codex-acp has Coda's own request"),
            _ => assert!(own && !ids.contains(&steer.to_string()), "{agent}: withdrawn by the shim's id: {ids:?}"),
        }
        let mut got = shim.fake("_fake/end").await.client_json();
        got.extend(shim.pair.drive_for(ANSWER_WAIT).await.client_json());
        let steered: Vec<&Value> = got.iter().filter(|v| v["id"] == steer && v.get("method").is_none()).collect();
        assert_eq!(steered.len(), 1, "{agent}: exactly one answer: {got:?}");
        assert_eq!(got.iter().filter(|v| v["id"] == turn && v.get("method").is_none()).count(), 1, "{agent}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_steering_message_withdrawn_while_it_waits_for_its_turn_is_answered_cancelled_and_never_sent() {
    // OpenCode says when Coda's turn runs (its server): a message before that waits.
    every(&["opencode"], |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        shim.fake.state().late_busy = true;
        let turn = shim.prompt("a turn the server has not said runs [[open]]");
        shim.drive().await;
        let steer = steering(&mut shim, "withdrawn before it was sent");
        shim.pair.drive_for(Duration::from_secs(1)).await;
        withdraw(&mut shim, steer);
        let got = shim.drive().await;
        let ended = answer(&got, steer).expect("answered at once");
        assert_eq!(code(&ended), Some(-32800), "{ended}");
        shim.fake("_fake/busy").await;
        shim.fake("_fake/step").await;
        let got = shim.fake("_fake/end").await;
        assert_eq!(answers(&got, steer), 0, "answered once");
        assert!(answer(&got, turn).is_some());
        assert!(shim.fake.state().joined.is_empty(), "never posted");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn the_clis_withdrawal_of_its_request_reaches_coda_as_it_came() {
    every(&EVERY, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let ask = json!({"jsonrpc":"2.0","id":"ask-1","method":"session/request_permission","params":{
            "sessionId": shim.session,
            "toolCall":{"toolCallId":"call-1","title":"rm -rf build","kind":"execute","status":"pending"},
            "options":[{"optionId":"once","kind":"allow_once","name":"Allow once"}]}});
        let turn = shim.prompt("a turn that asks [[open]]");
        shim.drive().await;
        shim.send("_fake/emit", json!({"line": ask.to_string()}));
        let got = shim.drive().await.client_json();
        assert!(got.iter().any(|v| v["id"] == "ask-1" && v["method"] == "session/request_permission"), "{agent}");
        let withdrawal = json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"ask-1"}});
        shim.send("_fake/emit", json!({"line": withdrawal.to_string()}));
        let got = shim.drive().await.client_json();
        assert!(got.contains(&withdrawal), "{agent}: {got:?}");
        // Coda answers the withdrawn question `cancelled`, once; the CLI gets that answer.
        shim.pair.send_json(&json!({"jsonrpc":"2.0","id":"ask-1","result":{"outcome":{"outcome":"cancelled"}}}));
        let got = shim.drive().await;
        assert!(got.to_agent.iter().any(|l| l.contains("\"ask-1\"")), "{agent}: the CLI gets Coda's answer");
        let got = shim.fake("_fake/end").await;
        assert_eq!(answers(&got, turn), 1);
    })
    .await;
}

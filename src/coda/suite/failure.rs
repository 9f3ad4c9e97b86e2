//! 执行失败 on every binary: the kinds each CLI's explicit signals name, a failure that names none, the
//! one-minute rule on retries, a stopped run the CLI never answers or answers twice, a CLI that dies while it
//! retries, two prompts of one session, and hostile signals. Each CLI's signals as [`super::signals`] scripts
//! them.

use std::time::Duration;

use serde_json::{Value, json};

use super::signals::Scripted;
use super::{Shim, answer, answers, every};
use crate::coda::failure::{RETRY_PATIENCE, STOP_GRACE};

/// The four binaries: each reports failure kinds.
const FAILING: [&str; 4] = ["codex", "kimi", "grok", "opencode"];

/// Whether the CLI names the wait it planned before its next attempt (then a stopped run says it).
fn names_its_wait(agent: &str) -> bool {
    matches!(agent, "kimi" | "opencode")
}

fn failure(answer: &Value) -> Option<&Value> {
    answer.pointer("/error/data/_meta/coda/failure")
}

/// A run of `text` in the shim's session, driven; Coda's answer to it.
async fn run(shim: &mut Shim, text: &str) -> Value {
    let prompt = shim.prompt(text);
    let got = shim.drive().await;
    answer(&got, prompt).unwrap_or_else(|| panic!("{}: no answer to {text}: {:?}", shim.agent, got.to_client))
}

/// One retry report of the run held in the session, the CLI planning `wait_ms`.
fn retry(shim: &mut Shim, wait_ms: u64) {
    let session = shim.session.clone();
    shim.send("_fake/retry", json!({"sessionId": session, "waitMs": wait_ms}));
}

fn cancels(got: &crate::relay::testing::Driven) -> usize {
    got.agent_json().iter().filter(|(_, v)| v["method"] == "session/cancel").count()
}

#[tokio::test(start_paused = true)]
async fn a_quota_and_a_temporary_failure_of_the_service_reach_coda_as_their_kinds() {
    every(&FAILING, |agent| async move {
        let (mut shim, _cli): (Shim, Scripted) = Shim::scripted(agent).await;
        let quota = run(&mut shim, "[[fail:quota]]").await;
        assert_eq!(quota["error"]["code"], -32603, "{quota}");
        assert_eq!(failure(&quota), Some(&json!({"kind": "quota_exhausted"})), "{quota}");
        assert!(quota["error"]["message"].as_str().is_some_and(|m| !m.trim().is_empty()), "a reason: {quota}");
        let service = run(&mut shim, "[[fail:service]]").await;
        assert_eq!(service["error"]["code"], -32603, "{service}");
        assert_eq!(failure(&service), Some(&json!({"kind": "service_unavailable", "input": "accepted"})), "{service}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_names_no_temporary_failure_of_the_service_is_a_plain_error_coda_never_retries() {
    every(&FAILING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let unclear = run(&mut shim, "[[fail:unclear]]").await;
        assert!(unclear["error"]["code"].is_i64(), "an error: {unclear}");
        assert_eq!(failure(&unclear), None, "no kind without an explicit reason: {unclear}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn retries_that_would_hold_the_turn_past_a_minute_are_stopped_and_the_turn_ends_with_the_failure() {
    every(&FAILING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let prompt = shim.prompt("[[retry]]");
        // The CLI retries, and plans its next attempt 90 s away (where it says a wait at all).
        retry(&mut shim, 90_000);
        let got = shim.drive().await;
        assert_eq!(cancels(&got), 1, "the run is stopped once: {:?}", got.to_agent);
        let answered = answer(&got, prompt).unwrap_or_else(|| panic!("the turn ends: {:?}", got.to_client));
        assert_eq!(answered["error"]["code"], -32603, "{answered}");
        let message = answered["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("was retrying") && message.ends_with("stopped after over a minute of retries."),
            "{message}"
        );
        let retry_after = failure(&answered).and_then(|f| f.get("retryAfterMs"));
        if names_its_wait(agent) {
            assert_eq!(retry_after, Some(&json!(90_000)), "the wait the CLI planned: {answered}");
        } else {
            assert_eq!(retry_after, None, "a CLI that names no wait: {answered}");
        }
        assert_eq!(answers(&shim.drive().await, prompt), 0, "answered once");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stopped_run_the_cli_never_answers_is_answered_with_the_failure_after_the_grace() {
    every(&FAILING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let prompt = shim.prompt("[[retry]] [[deaf]]");
        retry(&mut shim, 90_000);
        // Stopped at once (a wait the CLI planned past the minute) or when the minute is over.
        let mut got = shim.pair.drive_for(Duration::from_millis(1)).await;
        if cancels(&got) == 0 {
            got = shim.pair.drive_for(RETRY_PATIENCE).await;
        }
        assert_eq!(cancels(&got), 1, "{:?}", got.to_agent);
        let got = shim.pair.drive_for(STOP_GRACE - Duration::from_millis(2)).await;
        assert_eq!(answers(&got, prompt), 0, "the CLI has its grace: {:?}", got.to_client);
        let got = shim.pair.drive_for(Duration::from_millis(2)).await;
        let answered = answer(&got, prompt).unwrap_or_else(|| panic!("Coda's turn ends: {:?}", got.to_client));
        assert!(answered["error"]["message"].as_str().is_some_and(|m| m.contains("was retrying")), "{answered}");
        assert_eq!(answers(&got, prompt), 1);
        // Coda can go on in the session: the next turn is answered as the CLI answers it.
        let next = run(&mut shim, "[[fail:quota]]").await;
        assert_eq!(failure(&next), Some(&json!({"kind": "quota_exhausted"})), "{next}");
    })
    .await;
}

/// A prompt that waited behind a compaction and was stopped there never reached the CLI: no turn of it will be
/// recorded, so it takes no record of the next turn (which ends with its own failure kind), and its answer does
/// not wait for one.
#[tokio::test(start_paused = true)]
async fn a_prompt_stopped_behind_a_compaction_takes_no_record_of_the_next_turn() {
    every(&FAILING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let compact = shim.send(crate::coda::compact::METHOD, json!({"sessionId": shim.session}));
        let held = shim.prompt("held behind the compaction, then stopped");
        shim.pair.drive_for(Duration::from_millis(1)).await;
        shim.notify("session/cancel", json!({"sessionId": shim.session}));
        let got = shim.pair.drive_for(Duration::from_millis(1)).await;
        let stopped = answer(&got, held).unwrap_or_else(|| panic!("answered at once: {:?}", got.to_client));
        assert_eq!(stopped["result"], json!({"stopReason": "cancelled"}), "{stopped}");
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answer(&got, compact).expect("the compaction is answered")["result"]["compacted"], true);
        let quota = run(&mut shim, "[[fail:quota]]").await;
        assert_eq!(failure(&quota), Some(&json!({"kind": "quota_exhausted"})), "{quota}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cli_that_answers_a_stopped_run_twice_gives_coda_one_answer() {
    every(&FAILING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let prompt = shim.prompt("[[retry]] [[twice]]");
        retry(&mut shim, 90_000);
        let got = shim.drive().await;
        assert_eq!(answers(&got, prompt), 1, "{:?}", got.to_client);
        assert!(answer(&got, prompt).is_some_and(|a| a.get("error").is_some()));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cli_that_dies_while_it_retries_leaves_no_turn_open() {
    every(&FAILING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let prompt = shim.prompt("[[retry]]");
        retry(&mut shim, 1_000);
        shim.send("_fake/die", json!({}));
        let got = shim.drive().await;
        assert_eq!(answers(&got, prompt), 1, "Coda's turn is answered: {:?}", got.to_client);
        assert!(answer(&got, prompt).is_some_and(|a| a.get("error").is_some()));
    })
    .await;
}

/// `coda-<agent>` whose session's records are read (a turn showed in them), with a prompt that failed on a quota
/// and whose answer waits for the CLI's record of that turn, which is late (Kimi's wire, OpenCode's server); the
/// prompt's id.
async fn quota_waiting_for_its_record(agent: &'static str) -> (Shim, Scripted, i64) {
    let (mut shim, cli) = Shim::scripted(agent).await;
    let first = run(&mut shim, "[[turn:5]]").await;
    assert!(first.get("result").is_some(), "{first}");
    cli.late_ends(true);
    let prompt = shim.prompt("[[fail:quota]]");
    let got = shim.pair.drive_for(Duration::from_millis(100)).await;
    assert_eq!(answers(&got, prompt), 0, "the answer waits for the record: {:?}", got.to_client);
    (shim, cli, prompt)
}

/// A failed turn whose answer waits for the CLI's record of it (Kimi's wire, OpenCode's server), when the CLI
/// dies before the record comes: Coda still gets the answer, as the CLI gave it.
#[tokio::test(start_paused = true)]
async fn an_answer_waiting_for_the_clis_record_reaches_coda_when_the_cli_dies() {
    every(&["kimi", "opencode"], |agent| async move {
        let (mut shim, _cli, prompt) = quota_waiting_for_its_record(agent).await;
        shim.send("_fake/die", json!({}));
        let got = shim.drive().await;
        assert_eq!(answers(&got, prompt), 1, "{:?}", got.to_client);
        let answered = answer(&got, prompt).expect("answered");
        assert_eq!(failure(&answered), None, "no record, no kind: {answered}");
    })
    .await;
}

/// A second prompt in a session while the first retries: Grok runs it as a turn of its own after the first, Kimi
/// refuses it (`turn.agent_busy`). Each prompt ends with its own outcome, never the other's record.
#[tokio::test(start_paused = true)]
async fn two_prompts_in_one_session_each_end_with_their_own_failure() {
    every(&["grok", "kimi"], |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let first = shim.prompt("[[retry]]");
        let second = shim.prompt("[[fail:quota]]");
        retry(&mut shim, 90_000);
        let got = shim.drive().await;
        let second = answer(&got, second).expect("the second prompt's answer");
        match agent {
            "kimi" => {
                assert_eq!(second["error"]["code"], -32600, "{second}");
                assert_eq!(failure(&second), None, "a refusal names no kind: {second}");
            }
            _ => assert_eq!(failure(&second), Some(&json!({"kind": "quota_exhausted"})), "{second}"),
        }
        let first = answer(&got, first).unwrap_or_else(|| panic!("the first turn ends: {:?}", got.to_client));
        assert!(first["error"]["message"].as_str().is_some_and(|m| m.contains("was retrying")), "{first}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn hostile_retry_reports_and_failures_pass_on_and_never_panic() {
    every(&["codex", "grok"], |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let session = shim.session.clone();
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        let hostile = [
            // Grok's retry report with numbers beyond any integer, a lone surrogate and deep nesting.
            format!(
                r#"{{"jsonrpc":"2.0","method":"_x.ai/session_notification","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"retry_state","type":"retrying","attempt":1e400,"max_retries":-1,"reason":"API error (status 503 \ud800): x","deep":{deep}}}}}}}"#
            ),
            // Codex's retry warning whose title is no string and whose id is huge.
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"session_info_update","_meta":{{"jetbrains":{{"air":{{"sessionFailure":{{"id":"t:error","severity":"warning","category":123456789012345678901234567890,"title":{{"x":1}},"actions":"no"}}}}}}}}}}}}}}"#
            ),
        ];
        let prompt = shim.prompt("[[retry]]");
        for line in &hostile {
            shim.send("_fake/emit", json!({"line": line}));
        }
        let got = shim.drive().await;
        for line in &hostile {
            let v: Value = crate::json::from_slice(&crate::json::mend_surrogates(line.as_bytes())).expect("json");
            assert!(got.client_json().contains(&v), "{agent}: passed on: {line:.120}");
        }
        // The run is still stopped, by the minute.
        assert_eq!(cancels(&got), 1, "{:?}", got.to_agent);
        assert!(answer(&got, prompt).is_some());
    })
    .await;
}

/// The CLI's frames in the order it wrote them, while an answer waits for the CLI's record of its turn (Kimi's
/// wire, OpenCode's server): what the CLI wrote after its answer reaches Coda after it, never inside the turn.
#[tokio::test(start_paused = true)]
async fn what_the_cli_writes_after_an_answer_waiting_for_its_record_reaches_coda_after_it() {
    every(&["kimi", "opencode"], |agent| async move {
        let (mut shim, cli, prompt) = quota_waiting_for_its_record(agent).await;
        let session = shim.session.clone();
        let after = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session,
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "after"}}}});
        shim.send("_fake/emit", json!({"line": after.to_string()}));
        let mut got = shim.pair.drive_for(Duration::from_millis(100)).await;
        if agent == "kimi" {
            // The wire shows the turn's end (the record comes).
            cli.end_turn(&session);
        }
        got.to_client.extend(shim.drive().await.to_client);
        let seen = got.client_json();
        let answered = seen.iter().position(|v| v["id"] == prompt && v.get("method").is_none());
        let later = seen.iter().position(|v| v == &after);
        assert!(answered.is_some() && later.is_some(), "{agent}: both reach Coda: {seen:?}");
        assert!(answered < later, "{agent}: in the order the CLI wrote them: {seen:?}");
        if agent == "kimi" {
            let answer = &seen[answered.unwrap_or_default()];
            assert_eq!(failure(answer), Some(&json!({"kind": "quota_exhausted"})), "the record was read: {answer}");
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_request_reusing_the_id_of_an_answered_prompt_gets_the_clis_answer_whatever_its_method() {
    // JSON-RPC lets a client reuse the id of an answered request. The machine remembers answered prompts to drop
    // a CLI's second answer; a new request under that id, of any method, is a new one.
    every(&FAILING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let prompt = shim.prompt("hello");
        assert!(answer(&shim.drive().await, prompt).is_some(), "{agent}: the prompt is answered");
        let again = json!({"jsonrpc": "2.0", "id": prompt, "method": "session/set_mode",
            "params": {"sessionId": shim.session, "modeId": "read-only"}});
        shim.pair.send_json(&again);
        let got = shim.drive().await;
        assert_eq!(
            answers(&got, prompt),
            1,
            "{agent}: the request under the reused id is answered: {:?}",
            got.to_client
        );
    })
    .await;
}

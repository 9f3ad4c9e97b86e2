//! 用量里的数据 on every binary: roots only, never an empty `_meta.coda`, the facts of a turn, one meaning per
//! fact across a compaction, a compaction's before and after in one measure, facts at load in a fresh process,
//! a hold that runs out for one session only, and hostile updates. Each CLI's facts as [`super::signals`]
//! scripts them.

use std::time::Duration;

use serde_json::{Value, json};

use super::signals::CLI_CLOCK;
use super::{Shim, answer, every};
use crate::coda::usage::HOLD;

/// The four binaries: each reports usage facts.
const REPORTING: [&str; 4] = ["codex", "kimi", "grok", "opencode"];

/// The usage updates of `session` Coda got, in order. None of any session carries an empty `_meta.coda`.
fn updates(got: &crate::relay::testing::Driven, session: &str) -> Vec<Value> {
    let all: Vec<Value> =
        got.client_json().into_iter().filter(|v| v["params"]["update"]["sessionUpdate"] == "usage_update").collect();
    for v in &all {
        assert_ne!(v.pointer("/params/update/_meta/coda"), Some(&json!({})), "never an empty object: {v}");
    }
    all.into_iter().filter(|v| v["params"]["sessionId"] == session).map(|v| v["params"]["update"].clone()).collect()
}

fn coda(update: &Value) -> Option<&Value> {
    update.pointer("/_meta/coda")
}

fn usage_line(session: &str, used: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"usage_update","used":{used},"size":32000}}}}}}"#
    )
}

/// Has the CLI write `line` as it is; what Coda got.
async fn emit(shim: &mut Shim, line: &str) -> crate::relay::testing::Driven {
    shim.send("_fake/emit", json!({"line": line}));
    shim.drive().await
}

/// A turn of one model request with `context` tokens; the facts of the last usage update Coda got for it.
async fn turn(shim: &mut Shim, context: u64) -> Value {
    let prompt = shim.prompt(&format!("a turn [[turn:{context}]]"));
    let got = shim.drive().await;
    assert!(answer(&got, prompt).is_some(), "{}: the turn ends: {:?}", shim.agent, got.to_client);
    let updates = updates(&got, &shim.session);
    let last = updates.last().unwrap_or_else(|| panic!("{}: a usage update: {:?}", shim.agent, got.to_client));
    coda(last).cloned().unwrap_or_else(|| panic!("{}: facts on {last}", shim.agent))
}

#[tokio::test(start_paused = true)]
async fn only_a_session_coda_opened_gets_facts() {
    every(&REPORTING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        turn(&mut shim, 1234).await;
        // A session nobody opened on this connection (a subagent's), and one whose load failed.
        let load = shim.send("session/load", json!({"sessionId": "gone", "cwd": "/work/app", "mcpServers": []}));
        let got = shim.drive().await;
        assert!(answer(&got, load).is_some_and(|a| a.get("error").is_some()), "{agent}: {:?}", got.to_client);
        for session in ["child-1", "gone"] {
            let line = usage_line(session, "300");
            let got = emit(&mut shim, &line).await;
            let passed = crate::json::from_str::<Value>(&line).expect("json");
            assert!(
                got.client_json().contains(&passed),
                "{agent}: {session}'s update passes as it came: {:?}",
                got.to_client
            );
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_update_with_no_fact_known_carries_no_empty_object() {
    every(&REPORTING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let session = shim.session.clone();
        // Before any request, with a `used` that is no count.
        let got = emit(&mut shim, &usage_line(&session, "-1")).await;
        let updates = updates(&got, &session);
        assert_eq!(updates.len(), 1, "{agent}: {:?}", got.to_client);
        assert_eq!(updates[0].get("_meta"), None, "{agent}: {}", updates[0]);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_turn_names_its_request_and_the_context_that_request_carried() {
    every(&REPORTING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let facts = turn(&mut shim, 1234).await;
        assert_eq!(facts["contextTokens"], 1234, "{agent}: {facts}");
        assert!(facts["lastRequestAt"].as_str().is_some_and(crate::replay::instants::is_instant), "{agent}: {facts}");
        assert_eq!(facts.get("compactedAt"), None);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn after_a_compaction_the_facts_still_name_the_last_request_of_the_main_thread() {
    every(&REPORTING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let before = turn(&mut shim, 1234).await;
        let session = shim.session.clone();
        // The CLI compacts by itself between turns: its summarising request (9999 tokens) is none of the main
        // thread's, its estimate after (50) no request's context.
        shim.send("_fake/compact_alone", json!({"sessionId": session}));
        let got = shim.drive().await;
        the_facts_after_a_compaction(&mut shim, &before, &got).await;
    })
    .await;
}

/// What Coda got while a compaction ran (`got`) says it, and still names the main thread's last request
/// (`before`'s): the summarising request (9999 tokens) is none of the main thread's, the estimate after it no
/// request's context. The next turn names its own request and keeps the compaction.
async fn the_facts_after_a_compaction(shim: &mut Shim, before: &Value, got: &crate::relay::testing::Driven) {
    let agent = shim.agent;
    let updates = updates(got, &shim.session);
    let compacted = updates
        .iter()
        .filter_map(coda)
        .find(|f| f.get("compactedAt").is_some())
        .unwrap_or_else(|| panic!("{agent}: an update with compactedAt: {:?}", got.to_client))
        .clone();
    assert_eq!(compacted["lastRequestAt"], before["lastRequestAt"], "{agent}: {compacted}");
    assert_eq!(compacted["contextTokens"], 1234, "{agent}: {compacted}");
    for f in updates.iter().filter_map(coda) {
        assert_ne!(f["contextTokens"], 9999, "{agent}: the summarising request is no context: {f}");
    }
    let after = turn(shim, 777).await;
    assert_eq!(after["contextTokens"], 777, "{agent}: {after}");
    assert_eq!(after["compactedAt"], compacted["compactedAt"], "{agent}: {after}");
    assert_ne!(after["lastRequestAt"], before["lastRequestAt"], "{agent}: {after}");
}

/// A compaction Coda asks for between turns: its summarising request is none of the main thread's, and the
/// facts after it say the compaction and still the last request of the main thread.
#[tokio::test(start_paused = true)]
async fn after_a_compaction_coda_asked_for_the_facts_still_name_the_last_request_of_the_main_thread() {
    every(&REPORTING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        let before = turn(&mut shim, 1234).await;
        let session = shim.session.clone();
        let compact = shim.send(crate::coda::compact::METHOD, json!({"sessionId": session}));
        let mut got = shim.drive().await;
        got.to_client.extend(shim.fake("_fake/compacted").await.to_client);
        let answered = answer(&got, compact).unwrap_or_else(|| panic!("{agent}: {:?}", got.to_client));
        assert_eq!(answered["result"]["compacted"], true, "{agent}: {answered}");
        the_facts_after_a_compaction(&mut shim, &before, &got).await;
    })
    .await;
}

/// Codex says its context before a compaction as the model reported it, and after it only as its own estimate:
/// the answer says before, in that measure, and no after.
#[tokio::test(start_paused = true)]
async fn a_compactions_before_and_after_come_from_one_measure() {
    every(&["codex"], |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        turn(&mut shim, 1234).await;
        let session = shim.session.clone();
        let compact = shim.send(crate::coda::compact::METHOD, json!({"sessionId": session}));
        shim.drive().await;
        let got = shim.fake("_fake/compacted").await;
        let answered = answer(&got, compact).expect("answered");
        assert_eq!(answered["result"], json!({"compacted": true, "before": 1234}), "{answered}");
    })
    .await;
}

/// What the CLI keeps of a session it compacted at `at` (ms, its clock) in an earlier process, in the shapes the
/// real CLIs write (their live runs): Codex's rollout file, Kimi's main wire, Grok's session folder under the data
/// folder `home`, OpenCode's messages on its server (`fake`). The session's id, in the CLI's own form.
fn keep(agent: &str, home: &std::path::Path, fake: &super::fake::Fake, at: u64) -> &'static str {
    let lines = |path: std::path::PathBuf, records: &[Value]| {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("the session folder");
        let text: String = records.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(path, text).expect("the record");
    };
    let iso = |ms: u64| crate::coda::usage::iso(std::time::UNIX_EPOCH + Duration::from_millis(ms)).expect("a time");
    match agent {
        "codex" => {
            let id = "01a23ee2-229d-7e22-ad36-a46ef6f094ad";
            lines(
                home.join(format!("sessions/2026/12/02/rollout-2026-12-02T03-39-00-{id}.jsonl")),
                &[
                    json!({"timestamp":iso(at - 60_000),"type":"session_meta","payload":{"id":id}}),
                    json!({"timestamp":iso(at - 50_000),"type":"event_msg","payload":{"type":"token_count"}}),
                    json!({"timestamp":iso(at),"type":"compacted","payload":{"message":"a summary"}}),
                    json!({"timestamp":iso(at + 40),"type":"event_msg","payload":{"type":"token_count"}}),
                ],
            );
            id
        }
        "kimi" => {
            let id = "session_7c0ffee0-0000-4000-8000-000000000001";
            lines(
                home.join("sessions/wd_app_0123456789ab").join(id).join("agents/main/wire.jsonl"),
                &[
                    json!({"type":"metadata","protocol_version":"1.5","created_at":1}),
                    json!({"type":"llm.request","agentId":"main","kind":"loop","maxTokens":32000,"time":at - 60_000}),
                    json!({"type":"usage.record","agentId":"main","usage":{"inputOther":4000,"output":5},"time":at - 59_990}),
                    json!({"type":"context.apply_compaction","agentId":"main","tokensBefore":4000,"tokensAfter":900,"time":at}),
                ],
            );
            id
        }
        "grok" => {
            let id = "019ae2f1-7c0f-7fee-8000-000000000001";
            let stamps = json!({"agentTimestampMs":at - 59_000,"streamStartMs":at - 59_900,"turnStartMs":at - 60_000});
            lines(
                home.join("sessions/%2Fwork%2Fapp").join(id).join("updates.jsonl"),
                &[
                    json!({"timestamp":(at - 59_000) / 1000,"method":"session/update","params":{"sessionId":id,
                    "_meta":stamps,"update":{"sessionUpdate":"agent_message_chunk"}}}),
                    json!({"timestamp":at / 1000,"method":"_x.ai/session/update","params":{"sessionId":id,
                    "_meta":{"agentTimestampMs":at},"update":{"sessionUpdate":"auto_compact_completed",
                    "tokens_before":4000,"tokens_after":900}}}),
                ],
            );
            id
        }
        _ => {
            let id = "ses_7c0ffee0000kept";
            let messages = json!([
                {"info":{"id":"msg_u1","sessionID":id,"role":"user","time":{"created":at - 61_000}}},
                {"info":{"id":"msg_a1","sessionID":id,"role":"assistant","time":{"created":at - 60_000,
                    "completed":at - 59_000},"tokens":{"input":4000,"output":5,"cache":{"read":0,"write":0}}}},
                {"info":{"id":"msg_s1","sessionID":id,"role":"assistant","summary":true,"time":{"created":at - 1000,
                    "completed":at},"tokens":{"input":4000,"output":40,"cache":{"read":0,"write":0}}}},
            ]);
            fake.state().kept.push((id.to_owned(), messages));
            id
        }
    }
}

/// A session the CLI compacted in an earlier process: the first facts after `session/load` in a fresh process
/// name that compaction, read from what the CLI keeps; the live turn's facts win over the kept ones.
#[tokio::test(start_paused = true)]
async fn facts_after_session_load_in_a_fresh_process_come_from_what_the_cli_kept() {
    every(&REPORTING, |agent| async move {
        let home = tempfile::tempdir().expect("a data folder");
        let (mut shim, cli) = Shim::scripted_with(agent, Some(home.path().to_path_buf())).await;
        let at = CLI_CLOCK - 3_600_000;
        let session = keep(agent, home.path(), &cli.fake, at);
        let params = json!({"sessionId": session, "cwd": "/work/app", "mcpServers": [],
            "systemPrompt": super::system_prompt()});
        let load = shim.call("session/load", params).await;
        assert!(load.get("result").is_some(), "{agent}: {load}");
        shim.session = session.to_owned();
        let facts = turn(&mut shim, 1234).await;
        let compacted_at = crate::coda::usage::iso(std::time::UNIX_EPOCH + Duration::from_millis(at));
        assert_eq!(facts["compactedAt"].as_str(), compacted_at.as_deref(), "{agent}: {facts}");
        assert_eq!(facts["contextTokens"], 1234, "{agent}: the live turn's, not the history's: {facts}");
        let kept = crate::coda::usage::iso(std::time::UNIX_EPOCH + Duration::from_millis(at - 60_000));
        assert_ne!(facts["lastRequestAt"].as_str(), kept.as_deref(), "{agent}: the live turn's request: {facts}");
    })
    .await;
}

/// Kimi's wire shows the first turn after a load a little after Kimi answers it: that turn's update waits for it
/// and names the turn's own request, never the one kept from before the load.
#[tokio::test(start_paused = true)]
async fn the_first_turn_after_a_load_names_its_own_request_when_the_records_come_late() {
    every(&["kimi"], |agent| async move {
        let home = tempfile::tempdir().expect("a data folder");
        let (mut shim, cli) = Shim::scripted_with(agent, Some(home.path().to_path_buf())).await;
        let at = CLI_CLOCK - 3_600_000;
        let session = keep(agent, home.path(), &cli.fake, at);
        let params = json!({"sessionId": session, "cwd": "/work/app", "mcpServers": []});
        let load = shim.call("session/load", params).await;
        assert!(load.get("result").is_some(), "{agent}: {load}");
        shim.session = session.to_owned();
        cli.late_ends(true);
        let prompt = shim.prompt("a turn [[turn:1234]]");
        let got = shim.pair.drive_for(Duration::from_millis(100)).await;
        assert!(updates(&got, session).is_empty(), "{agent}: the update waits for the wire: {:?}", got.to_client);
        cli.late_ends(false);
        cli.end_turn(session);
        let got = shim.drive().await;
        assert!(answer(&got, prompt).is_some(), "{agent}: {:?}", got.to_client);
        let updates = updates(&got, session);
        let facts = updates.first().and_then(coda).unwrap_or_else(|| panic!("{agent}: {:?}", got.to_client));
        assert_eq!(facts["contextTokens"], 1234, "{agent}: {facts}");
        let kept = crate::coda::usage::iso(std::time::UNIX_EPOCH + Duration::from_millis(at - 60_000));
        assert_ne!(facts["lastRequestAt"].as_str(), kept.as_deref(), "{agent}: {facts}");
    })
    .await;
}

/// A session the CLI keeps nothing of (a load in a fresh process): no fact is made up, and the live ones come.
#[tokio::test(start_paused = true)]
async fn a_loaded_session_the_cli_kept_nothing_of_gets_only_live_facts() {
    every(&REPORTING, |agent| async move {
        let home = tempfile::tempdir().expect("an empty data folder");
        let (mut shim, _cli) = Shim::scripted_with(agent, Some(home.path().to_path_buf())).await;
        let params = json!({"sessionId": "kept-nowhere", "cwd": "/work/app", "mcpServers": []});
        let load = shim.call("session/load", params).await;
        assert!(load.get("result").is_some(), "{agent}: {load}");
        shim.session = "kept-nowhere".to_owned();
        let facts = turn(&mut shim, 1234).await;
        assert_eq!(facts.get("compactedAt"), None, "{agent}: {facts}");
        assert_eq!(facts["contextTokens"], 1234, "{agent}: {facts}");
    })
    .await;
}

/// Kimi's update waits for its turn's end in the wire; when one session's never shows, the others still wait
/// for theirs.
#[tokio::test(start_paused = true)]
async fn a_hold_that_runs_out_gives_up_on_its_own_session_only() {
    every(&["kimi"], |agent| async move {
        let (mut shim, cli) = Shim::scripted(agent).await;
        let a = shim.session.clone();
        let new = shim.call("session/new", json!({"cwd": "/work/other", "mcpServers": []})).await;
        let b = new["result"]["sessionId"].as_str().expect("a second session").to_owned();
        // Both sessions' wires are read (a turn each shows in them).
        turn(&mut shim, 5).await;
        shim.session = b.clone();
        turn(&mut shim, 6).await;
        shim.session = a.clone();
        // Then both turns are answered before the wire shows them.
        cli.late_ends(true);
        let pa = shim.prompt("one [[turn:11]]");
        shim.session = b.clone();
        let pb = shim.prompt("two [[turn:22]]");
        let got = shim.pair.drive_for(HOLD + Duration::from_millis(500)).await;
        assert!(answer(&got, pa).is_some(), "{:?}", got.to_client);
        assert_eq!(updates(&got, &a).len(), 1, "a's hold ran out: sent with the facts known");
        assert!(updates(&got, &b).is_empty(), "b's update still waits for its turn's end: {:?}", got.to_client);
        cli.late_ends(false);
        cli.end_turn(&b);
        let got = shim.drive().await;
        assert!(answer(&got, pb).is_some(), "{:?}", got.to_client);
        let ub = updates(&got, &b);
        assert_eq!(ub.len(), 1, "{:?}", got.to_client);
        assert_eq!(coda(&ub[0]).map(|f| &f["contextTokens"]), Some(&json!(22)), "{}", ub[0]);
    })
    .await;
}

/// Kimi's update waits for its turn's end in the wire; when Kimi dies meanwhile, what was held still reaches Coda,
/// in the order Kimi wrote it.
#[tokio::test(start_paused = true)]
async fn a_cli_that_dies_while_an_update_waits_leaves_nothing_held() {
    every(&["kimi"], |agent| async move {
        let (mut shim, cli) = Shim::scripted(agent).await;
        turn(&mut shim, 5).await;
        cli.late_ends(true);
        let prompt = shim.prompt("one [[turn:11]]");
        shim.send("_fake/die", json!({}));
        let got = shim.drive().await;
        let session = shim.session.clone();
        let at = |f: &dyn Fn(&Value) -> bool| got.client_json().iter().position(f);
        let answered = at(&|v| v["id"] == prompt && v.get("method").is_none());
        let update = at(&|v| v["params"]["update"]["sessionUpdate"] == "usage_update");
        assert!(answered.is_some() && answered < update, "the answer, then the update: {:?}", got.to_client);
        assert_eq!(updates(&got, &session).len(), 1, "{:?}", got.to_client);
    })
    .await;
}

/// Loads of session ids that are paths out of the CLI's data folder to a session kept beside it, huge, or hold a
/// lone surrogate: what the CLI keeps is read inside its data folder only, and nothing is made of them.
#[tokio::test(start_paused = true)]
async fn hostile_session_ids_at_load_read_nothing_outside_and_never_panic() {
    every(&REPORTING, |agent| async move {
        let home = tempfile::tempdir().expect("a data folder");
        let (mut shim, cli) = Shim::scripted_with(agent, Some(home.path().join("data"))).await;
        std::fs::create_dir_all(home.path().join("data")).expect("a data folder");
        let kept = keep(agent, &home.path().join("data"), &cli.fake, CLI_CLOCK - 3_600_000);
        std::fs::rename(home.path().join("data"), home.path().join("outside")).expect("moved out");
        std::fs::create_dir_all(home.path().join("data/sessions/wd_app_0123456789ab")).expect("an empty data folder");
        let mut ids = vec!["s".repeat(100_000), r"\ud800".to_owned()];
        for dots in ["../", "../../", "../../../"] {
            for within in ["", "sessions/", "sessions/wd_app_0123456789ab/", "sessions/%2Fwork%2Fapp/"] {
                ids.push(format!("{dots}outside/{within}{kept}"));
            }
        }
        for id in ids {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":"load","method":"session/load","params":{{"sessionId":"{id}","cwd":"/work/app","mcpServers":[]}}}}"#
            );
            shim.pair.send(&line);
            let got = shim.drive().await;
            let answered = got.client_json().into_iter().find(|v| v["id"] == "load");
            assert!(answered.is_some_and(|a| a.get("result").is_some()), "{agent}: {id:.60}: {:?}", got.to_client);
            let got = emit(&mut shim, &usage_line(&id, "5")).await;
            let kept = got.client_json().into_iter().find_map(|v| v.pointer("/params/update/_meta/coda").cloned());
            let compacted = kept.as_ref().and_then(|f| f.get("compactedAt"));
            assert_eq!(compacted, None, "{agent}: {id:.60}: nothing read outside the data folder: {kept:?}");
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn hostile_updates_pass_on_and_never_panic() {
    every(&REPORTING, |agent| async move {
        let (mut shim, _cli) = Shim::scripted(agent).await;
        turn(&mut shim, 1234).await;
        let session = shim.session.clone();
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        for line in [
            usage_line(&session, "1e400"),
            usage_line(&session, "184467440737095516160"),
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"usage_update","used":5,"size":6,"x":"\ud800","deep":{deep},"_meta":"not an object"}}}}}}"#
            ),
        ] {
            let got = emit(&mut shim, &line).await;
            let updates = updates(&got, &session);
            assert_eq!(updates.len(), 1, "{agent}: {line:.100}: {:?}", got.to_client);
            let facts = coda(&updates[0]).unwrap_or_else(|| panic!("{agent}: stamped: {}", updates[0]));
            assert!(facts["lastRequestAt"].is_string(), "{agent}: {facts}");
            assert!(serde_json::to_string(facts).expect("json").len() < 4096);
        }
    })
    .await;
}

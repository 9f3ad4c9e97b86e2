//! `session/close` on every binary: the CLI cancels the session's work and frees it (ACP), and so does the shim.
//! The session's open `_coda/wait` items and those of its children end (`cancelled`) before Coda gets the close's
//! answer; prompts held behind its compaction are answered `cancelled` and never reach the CLI; Coda's
//! compaction and a steering message in flight are answered, once; what the shim kept of the session is gone
//! (its reports after the close reach no one, a compaction of it is refused as of no session).

use serde_json::{Value, json};

use super::fake::Compacts;
use super::{COMPACTING, EVERY, STEERING, Shim, answer, answers, every, reached};
use crate::coda::compact::{METHOD as COMPACT, NOT_RUNNING};
use crate::coda::steering::{ANSWER_WAIT, METHOD as STEER};

/// The CLI reports `wait` (a `_coda/wait`'s params).
async fn report(shim: &mut Shim, wait: Value) {
    shim.send("_fake/wait", json!({"wait": wait}));
    shim.drive().await;
}

/// The `_coda/wait` frames among `got`, as (sessionId, waitId, state).
fn waits(got: &[Value]) -> Vec<(String, String, String)> {
    let text = |v: &Value, k: &str| v["params"][k].as_str().unwrap_or_default().to_owned();
    got.iter()
        .filter(|v| v["method"] == "_coda/wait")
        .map(|v| (text(v, "sessionId"), text(v, "waitId"), text(v, "state")))
        .collect()
}

/// Where the answer to `id` is among `got`.
fn at(got: &[Value], id: i64) -> usize {
    got.iter().position(|v| v["id"] == id && v.get("method").is_none()).expect("answered")
}

#[tokio::test(start_paused = true)]
async fn closing_a_session_ends_its_waits_and_its_childrens_before_the_close_is_answered() {
    every(&EVERY, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let s = shim.session.clone();
        let child = format!("{s}-child");
        report(&mut shim, json!({"sessionId": s, "waitId": "build", "state": "waiting", "title": "构建"})).await;
        report(&mut shim, json!({"sessionId": s, "waitId": "done", "state": "waiting"})).await;
        report(&mut shim, json!({"sessionId": s, "waitId": "done", "state": "done"})).await;
        let sub = json!({"sessionId": s, "waitId": "review", "kind": "subagent", "state": "waiting",
            "childSessionId": child});
        report(&mut shim, sub).await;
        report(&mut shim, json!({"sessionId": child, "waitId": "lint", "state": "handling"})).await;
        // Another session's wait stays.
        let other = shim.call("session/new", json!({"cwd": "/work/app", "mcpServers": []})).await;
        let other = other["result"]["sessionId"].as_str().expect("a session").to_owned();
        report(&mut shim, json!({"sessionId": other, "waitId": "build", "state": "waiting"})).await;

        let close = shim.send("session/close", json!({"sessionId": s}));
        let got = shim.drive().await.client_json();
        assert!(answer_ok(&got, close), "{agent}: {got:?}");
        let ended = waits(&got[..at(&got, close)]);
        let want = |session: &str, wait: &str| (session.to_owned(), wait.to_owned(), "cancelled".to_owned());
        let mut sorted = ended.clone();
        sorted.sort();
        let mut expected = vec![want(&s, "build"), want(&s, "review"), want(&child, "lint")];
        expected.sort();
        assert_eq!(sorted, expected, "{agent}: every open wait of the session and its child ends, once: {got:?}");
        assert!(waits(&got[at(&got, close)..]).is_empty(), "{agent}: all before the close's answer");

        // What the CLI says of the closed session afterwards is about no session Coda has.
        shim.send("_fake/wait", json!({"wait": {"sessionId": s, "waitId": "late", "state": "waiting"}}));
        shim.send("_fake/wait", json!({"wait": {"sessionId": child, "waitId": "lint", "state": "done"}}));
        shim.send("_fake/wait", json!({"wait": {"sessionId": other, "waitId": "build", "state": "done"}}));
        let got = shim.drive().await.client_json();
        assert_eq!(waits(&got), [(other.clone(), "build".to_owned(), "done".to_owned())], "{agent}: {got:?}");
        // A compaction of it is one of no session here.
        if COMPACTING.contains(&agent) {
            let refused = shim.call(COMPACT, json!({"sessionId": s})).await;
            assert_eq!(refused["result"], json!({"compacted": false, "reason": NOT_RUNNING}), "{agent}");
        }
    })
    .await;
}

fn answer_ok(got: &[Value], id: i64) -> bool {
    got.iter().any(|v| v["id"] == id && v.get("result").is_some())
}

#[tokio::test(start_paused = true)]
async fn closing_a_compacting_session_answers_its_held_prompts_and_the_compaction_and_sends_them_nowhere() {
    every(&COMPACTING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let compact = shim.send(COMPACT, json!({"sessionId": shim.session}));
        let first = shim.prompt("held, then the session closes");
        let second = shim.prompt("held too");
        shim.drive().await;
        let close = shim.send("session/close", json!({"sessionId": shim.session}));
        let got = shim.drive().await;
        let json = got.client_json();
        for prompt in [first, second] {
            let ended = answer(&got, prompt).expect("a held prompt is answered");
            assert_eq!(ended["result"], json!({"stopReason": "cancelled"}), "{agent}: {ended}");
            assert!(at(&json, prompt) < at(&json, close), "{agent}: before the close's answer");
            assert!(!reached(&got, prompt), "{agent}: never sent into a closed session");
        }
        let compacted = answer(&got, compact).expect("the compaction is answered");
        assert_eq!(compacted["result"]["compacted"], false, "{agent}: {compacted}");
        assert!(answer_ok(&json, close), "{agent}");
        // Whatever the CLI says of that compaction now changes nothing.
        let got = shim.fake("_fake/compacted").await;
        for id in [compact, first, second] {
            assert_eq!(answers(&got, id), 0, "{agent}: answered once");
            assert!(!reached(&got, id));
        }
        assert!(shim.fake.state().prompted_while_compacting.is_empty(), "{agent}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn closing_a_session_answers_its_steering_message_once() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        shim.fake.state().steer_silent = true;
        let turn = shim.prompt("a long turn [[open]]");
        shim.drive().await;
        let params = json!({"sessionId": shim.session, "prompt": [{"type": "text", "text": "and then this"}],
            "_meta": {"steering": {"idleBehavior": "promptRequired"}}});
        let steer = shim.send(STEER, params);
        shim.drive().await;
        let close = shim.send("session/close", json!({"sessionId": shim.session}));
        let mut got = shim.drive().await.client_json();
        got.extend(shim.pair.drive_for(ANSWER_WAIT).await.client_json());
        for id in [steer, turn, close] {
            let n = got.iter().filter(|v| v["id"] == id && v.get("method").is_none()).count();
            assert_eq!(n, 1, "{agent}: request {id} answered once: {got:?}");
        }
        assert!(at(&got, steer) < at(&got, close), "{agent}: the steering answer comes before the close's");
    })
    .await;
}

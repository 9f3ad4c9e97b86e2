//! Replays of real OpenCode 1.18.33 subagent recordings (`fixtures/opencode/task-*`, made by
//! `tests/opencode_live.rs`) through coda-opencode, with `acp-replay` as the CLI. The replay proves the shim
//! still sends Coda exactly what it sent live (and OpenCode exactly what it received, including the shim's
//! own `session/resume` of a background child); the assertions spell out what Coda's rules ask of them.

#[path = "support/replay.rs"]
mod replay_support;

use coda_shim::replay::{self, Body, Edge};
use serde_json::Value;

/// Replays the fixture; returns what Coda received and what OpenCode received in the recording.
fn replayed(scenario: &str) -> (Vec<Value>, Vec<Value>) {
    let dir = replay_support::fixtures_root().join("opencode").join(scenario);
    replay_support::check("opencode", &dir).unwrap_or_else(|e| panic!("opencode/{scenario}: {e}"));
    let records = replay::load(&dir.join(replay::TRACE_FILE)).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    let frames = |edge: Edge| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r.edge == edge)
            .filter_map(|r| match &r.body {
                Body::Frame(text) => serde_json::from_str(text).ok(),
                _ => None,
            })
            .collect()
    };
    (frames(Edge::ShimToClient), frames(Edge::ShimToAgent))
}

fn waits(frames: &[Value]) -> Vec<Value> {
    frames.iter().filter(|f| f["method"] == "_coda/wait").map(|f| f["params"].clone()).collect()
}

fn states(waits: &[Value], wait_id: &Value) -> Vec<String> {
    waits.iter().filter(|w| w["waitId"] == *wait_id).filter_map(|w| w["state"].as_str().map(str::to_owned)).collect()
}

fn position(frames: &[Value], f: impl Fn(&Value) -> bool) -> usize {
    frames.iter().position(f).unwrap_or(usize::MAX)
}

#[test]
fn foreground_task_is_a_subagent_wait_settled_with_its_child_when_the_call_completes() {
    let (to_client, _) = replayed("task-foreground");
    let init = to_client.iter().find(|f| f.pointer("/result/protocolVersion").is_some()).expect("initialize answer");
    assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], serde_json::json!({}));
    let w = waits(&to_client);
    let open = &w[0];
    assert_eq!(open["kind"], "subagent");
    assert_eq!(open["toolCallId"], open["waitId"]);
    assert_eq!(states(&w, &open["waitId"]), ["waiting", "done"]);
    let completed = to_client
        .iter()
        .find(|f| {
            f["params"]["update"]["status"] == "completed" && f["params"]["update"]["toolCallId"] == open["waitId"]
        })
        .expect("the task call's completion");
    let done = w.iter().find(|p| p["state"] == "done").expect("done");
    assert_eq!(done["childSessionId"], completed["params"]["update"]["rawOutput"]["metadata"]["sessionId"]);
    let answer = position(&to_client, |f| f["result"]["stopReason"].is_string() && f["id"] != Value::Null);
    let settled = position(&to_client, |f| f["params"]["state"] == "done");
    assert!(settled < answer, "settled inside the turn");
}

#[test]
fn background_task_child_permission_reaches_coda_and_the_result_is_handled() {
    let (to_client, to_agent) = replayed("task-background-child-permission");
    let w = waits(&to_client);
    let id = &w[0]["waitId"];
    assert_eq!(states(&w, id), ["waiting", "waiting", "handling", "done"]);
    let child = w.iter().find_map(|p| p["childSessionId"].as_str()).expect("the child session");
    // The shim resumed the child so that OpenCode forwards it.
    assert!(to_agent.iter().any(|f| f["method"] == "session/resume" && f["params"]["sessionId"] == child));
    let announced = position(&to_client, |f| f["params"]["childSessionId"] == child);
    let asked =
        position(&to_client, |f| f["method"] == "session/request_permission" && f["params"]["sessionId"] == child);
    assert!(announced < asked && asked != usize::MAX, "the child's request comes after the child is announced");
    // The shim's own session/resume answer is not Coda's.
    assert!(!to_client.iter().any(|f| f["id"].as_str().is_some_and(|i| i.starts_with("coda-shim-"))));
    let turn_end = position(&to_client, |f| f["result"]["stopReason"].is_string());
    let handling = position(&to_client, |f| f["params"]["state"] == "handling");
    assert!(turn_end < handling, "handling is OpenCode's own turn after Coda's");
}

#[test]
fn follow_up_is_a_new_wait_on_the_same_child_session() {
    let (to_client, _) = replayed("task-follow-up");
    let w = waits(&to_client);
    let openings: Vec<&Value> = w.iter().filter(|p| p["kind"] == "subagent").collect();
    assert_eq!(openings.len(), 2);
    let first_child = w.iter().find(|p| p["waitId"] == openings[0]["waitId"] && p["childSessionId"].is_string());
    assert_eq!(openings[1]["childSessionId"], first_child.expect("the first child")["childSessionId"]);
    assert_eq!(states(&w, &openings[0]["waitId"]), ["waiting", "done"]);
    assert_eq!(states(&w, &openings[1]["waitId"]), ["waiting", "handling", "done"]);
}

//! Replays of the upstream failure recordings (`fixtures/<agent>/upstream-failures/`, made by
//! `tests/failure_live.rs` from the real CLIs) through each shim, with `acp-replay` as the CLI: the shim must
//! send Coda exactly what it sent live, and that answer must be what the "Upstream failures" table of docs/contract.md says
//! (section 执行失败: the kind only from an explicit upstream reason, a login problem -32000, retries the CLI
//! would keep up for over a minute stopped with the failure).

use crate::support;

use support::{failures, replay as replay_support};

use coda_shim::replay::Dir;
use serde_json::Value;

/// Replays the fixture and returns the frames Coda and the CLI received in the recording.
fn replayed(agent: &str) -> (Vec<Value>, Vec<Value>) {
    let dir = replay_support::fixtures_root().join(agent).join("upstream-failures");
    replay_support::check(agent, &dir).unwrap_or_else(|e| panic!("{agent}/upstream-failures: {e}"));
    (replay_support::recorded_frames(&dir, Dir::ShimToClient), replay_support::recorded_frames(&dir, Dir::ShimToAgent))
}

fn check(agent: &str) {
    let (to_client, to_agent) = replayed(agent);
    let mut wrong = Vec::new();
    for (case, _) in failures::cases(agent) {
        let id = failures::prompt_id(agent, case);
        let answer = to_client.iter().find(|f| f["id"] == id && f.get("method").is_none()).cloned().unwrap_or_default();
        if let Err(e) = failures::check(agent, case, &answer) {
            wrong.push(e);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every run the shim stopped was stopped with session/cancel, and nothing else was cancelled.
    let cancels = to_agent.iter().filter(|f| f["method"] == "session/cancel").count();
    let stopped = failures::cases(agent).iter().filter(|(c, _)| failures::stopped(agent, c)).count();
    assert_eq!(cancels, stopped, "{agent}: session/cancel sent {cancels} times for {stopped} stopped runs");
}

#[test]
fn kimi_upstream_failures_reach_coda_as_failure_kinds() {
    check("kimi");
}

#[test]
fn grok_upstream_failures_reach_coda_as_failure_kinds() {
    check("grok");
}

#[test]
fn codex_upstream_failures_reach_coda_as_failure_kinds() {
    check("codex");
}

#[test]
fn opencode_upstream_failures_reach_coda_as_failure_kinds() {
    check("opencode");
}

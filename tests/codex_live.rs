//! Live: Codex's automatic approval review through coda-codex (section 工具调用的审核), recorded as
//! `fixtures/codex/auto-review`.
//!
//! Opt-in: `CODA_LIVE=1 CODA_LIVE_AGENTS=codex cargo test --test all codex_live:: -- --nocapture` (after
//! `scripts/install-clis codex`); with `CODA_RECORD=1` the recording goes to `fixtures/codex/auto-review/`. The
//! session is switched to mode `agent` (reviewer `auto_review`); each turn runs one command that asks to leave the
//! sandbox, and the fake model, asked by Codex's reviewer, denies the first and approves the second
//! (`[[review:…]]`); a third turn runs two identical commands in parallel, both approved. Coda must get each
//! verdict on the command's own call and never the review's call, and the denied command must not have run.

use crate::support;

use support::{fake_model, live, recorder as rig, temp};

use std::time::Duration;

use rig::{Rec, keep};
use serde_json::{Value, json};

/// The `_meta.coda.review` values Coda got on call `id`, in order.
fn reviews_of(received: &[Value], id: &str) -> Vec<Value> {
    let updates = received.iter().filter(|f| f["method"] == "session/update").map(|f| &f["params"]["update"]);
    updates.filter(|u| u["toolCallId"] == id).filter_map(|u| u.pointer("/_meta/coda/review").cloned()).collect()
}

/// The id of the command call whose title starts with `title`, and its last status.
fn call_of(received: &[Value], title: &str) -> (String, String) {
    let updates: Vec<&Value> =
        received.iter().filter(|f| f["method"] == "session/update").map(|f| &f["params"]["update"]).collect();
    let start = updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call" && u["title"].as_str().is_some_and(|t| t.starts_with(title)))
        .unwrap_or_else(|| panic!("Coda got no tool call `{title}`"));
    let id = start["toolCallId"].as_str().expect("a toolCallId").to_owned();
    let status =
        updates.iter().filter(|u| u["toolCallId"] == id.as_str()).filter_map(|u| u["status"].as_str()).next_back();
    (id, status.unwrap_or_default().to_owned())
}

#[test]
fn live_codex_auto_review() {
    if !live::wanted("codex", "live Codex auto-review") {
        return;
    }
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new("coda-codex-review");
    let root = temp.path().to_path_buf();
    let lc = live::prepare("codex", &model.base_url(), &root).expect("prepare Codex");
    // Outside the workspace: what the denied command would delete.
    let victim = root.join("victim.txt");
    std::fs::write(&victim, "keep me\n").expect("the victim file");
    let made = lc.workdir.join("made.txt");

    let trace = root.join("traces").join("auto-review.jsonl");
    std::fs::create_dir_all(trace.parent().expect("dir")).expect("traces dir");
    let mut rec = Rec::start(&lc, "codex", &trace);
    let sid = rec.new_session(true);
    let answer = rec.call("session/set_mode", json!({"sessionId": sid, "modeId": "agent"}));
    assert!(answer.get("result").is_some(), "{answer}");
    rec.quiet(Duration::from_millis(1000));

    let deny = "clean up [[review:deny|high|Deletes a file outside the workspace that the user never named]] \
        [[tool:exec_command|{\"cmd\":\"rm -f ../victim.txt\",\"sandbox_permissions\":\"require_escalated\",\
        \"justification\":\"remove the old file\"}]]";
    let answer = rec.prompt(deny);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    rec.quiet(Duration::from_millis(1500));
    let allow = "make it [[review:allow|low|The user asked for this file in the workspace]] \
        [[tool:exec_command|{\"cmd\":\"touch made.txt\",\"sandbox_permissions\":\"require_escalated\",\
        \"justification\":\"create the file the user asked for\"}]]";
    let answer = rec.prompt(allow);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    rec.quiet(Duration::from_millis(1500));
    // Two identical commands called in parallel: each gets its own review.
    let twin = "[[tool:exec_command|{\"cmd\":\"touch twin.txt\",\"sandbox_permissions\":\"require_escalated\",\
        \"justification\":\"twin\"}]]";
    let answer =
        rec.prompt(&format!("twins [[review:allow|medium|Both create one file in the workspace]] {twin} {twin}"));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    rec.quiet(Duration::from_millis(1500));
    let received = rec.finish();

    let reviewer_requests = model.model_requests().iter().filter(|r| r.body.to_string().contains("\"deny\"")).count();
    eprintln!("the reviewer was asked {reviewer_requests} times");
    assert_eq!(reviewer_requests, 4, "one review per command");
    for f in &received {
        assert!(!f.to_string().contains("guardian_assessment"), "Coda got the review's own call: {f}");
    }
    let (denied, status) = call_of(&received, "rm -f ../victim.txt");
    assert_eq!(
        reviews_of(&received, &denied),
        [
            json!({"state": "reviewing"}),
            json!({"state": "denied", "risk": "high",
                "reason": "Deletes a file outside the workspace that the user never named"}),
        ]
    );
    assert_eq!(status, "failed");
    assert!(victim.exists(), "the denied command ran");
    let (approved, status) = call_of(&received, "touch made.txt");
    assert_eq!(
        reviews_of(&received, &approved),
        [
            json!({"state": "reviewing"}),
            json!({"state": "approved", "risk": "low", "reason": "The user asked for this file in the workspace"}),
        ]
    );
    assert_eq!(status, "completed");
    assert!(made.exists(), "the approved command did not run");
    let twins: Vec<&Value> = received
        .iter()
        .map(|f| &f["params"]["update"])
        .filter(|u| u["sessionUpdate"] == "tool_call" && u["title"] == "touch twin.txt")
        .collect();
    assert_eq!(twins.len(), 2, "two twin calls");
    for call in twins {
        let id = call["toolCallId"].as_str().expect("a toolCallId");
        let verdict = json!({"state": "approved", "risk": "medium", "reason": "Both create one file in the workspace"});
        assert_eq!(reviews_of(&received, id), [json!({"state": "reviewing"}), verdict], "{id}");
    }

    keep(
        "codex",
        "auto-review",
        &trace,
        &root,
        "mode agent (auto_review): a command escalated out of the sandbox, denied by the reviewer; then one approved; then two identical commands in parallel, both approved",
    );
}

//! Live: Grok Build's background commands and subagents through coda-grok, recorded as fixtures.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test grok_live` (after `scripts/install-clis grok`); with `CODA_RECORD=1`
//! the recordings go to `fixtures/grok/<scenario>/`. Each scenario asserts the `_coda/wait` sequence Coda got
//! from the real CLI, then replays its recording through the same shim.

mod support;

use support::{fake_model, live, recorder as rig, temp};

use std::path::Path;
use std::time::Duration;

use rig::{Rec, keep};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

fn state_of(waits: &[Value], wait_id: &str) -> Vec<String> {
    waits.iter().filter(|w| w["waitId"] == wait_id).map(|w| w["state"].as_str().unwrap_or("").to_owned()).collect()
}

fn scenario(root: &Path, lc: &live::LiveCommand, name: &str, notes: &str, run: impl FnOnce(&mut Rec)) {
    let trace = root.join("traces").join(format!("{name}.jsonl"));
    std::fs::create_dir_all(trace.parent().expect("dir")).expect("traces dir");
    let mut rec = Rec::start(lc, "grok", &trace);
    run(&mut rec);
    rec.finish();
    keep("grok", name, &trace, root, notes);
}

#[test]
fn record_grok_activity() {
    if !live::wanted("grok", "live Grok recordings") {
        return;
    }
    let model = fake_model::FakeModel::start();
    let temp = temp::TempDir::new("coda-grok-activity");
    let root = temp.path().to_path_buf();
    let lc = live::prepare("grok", &model.base_url(), &root).expect("prepare Grok");

    scenario(
        &root,
        &lc,
        "bg-task-wakes",
        "run_terminal_command in the background; Grok runs a turn of its own on the result (task-completed-<id>)",
        |rec| {
            rec.new_session(true);
            rec.prompt("build it [[bg:sleep 1; echo built]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "task");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            assert_eq!(open["state"], "waiting");
            assert_eq!(open["stoppable"], true);
            assert!(open["toolCallId"].is_string() && open["outputFile"].is_string(), "{open}");
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "handling", "done"]);
        },
    );

    scenario(
        &root,
        &lc,
        "bg-task-stopped",
        "a background command stopped with _coda/wait/stop (_x.ai/task/kill)",
        |rec| {
            rec.new_session(true);
            rec.prompt("wait long [[bg:sleep 30]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "task");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            let answer = rec.call("_coda/wait/stop", json!({"sessionId": rec.session, "waitId": id}));
            assert_eq!(answer["result"], json!({}));
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "cancelled");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "handling", "cancelled"]);
        },
    );

    scenario(
        &root,
        &lc,
        "subagent-background",
        "a background subagent: its output on its child session, then Grok's own turn on its result",
        |rec| {
            rec.new_session(true);
            rec.prompt("delegate [[subagent:helper|child work [[delay:800]][[text:child result]]]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "subagent");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            let child = open["childSessionId"].as_str().expect("childSessionId").to_owned();
            assert!(open["toolCallId"].is_string(), "{open}");
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "handling", "done"]);
            let child_said = rec.received.iter().any(|f| {
                f["method"] == "session/update"
                    && f["params"]["sessionId"] == child.as_str()
                    && f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
            });
            assert!(child_said, "the child's output reaches Coda on the child session");
        },
    );

    scenario(
        &root,
        &lc,
        "subagent-foreground-then-resumed",
        "a foreground subagent, then resume_from it: a new wait on the same child session",
        |rec| {
            rec.new_session(true);
            rec.prompt("ask [[subagent-fg:helper|first part [[text:first result]]]]");
            let first = rec.until_wait(LONG, |w| w["kind"] == "subagent");
            let first_id = first["waitId"].as_str().expect("waitId").to_owned();
            rec.until_wait(LONG, |w| w["waitId"] == first_id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1000));
            assert_eq!(state_of(&rec.waits(), &first_id), ["waiting", "done"]);
            rec.prompt("again [[resume:last|second part [[text:second result]]]]");
            let second = rec.until_wait(LONG, |w| w["kind"] == "subagent" && w["waitId"] != first_id.as_str());
            assert_eq!(second["childSessionId"], first["childSessionId"], "rule 5: same child session");
            let second_id = second["waitId"].as_str().expect("waitId").to_owned();
            rec.until_wait(LONG, |w| w["waitId"] == second_id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
        },
    );

    scenario(
        &root,
        &lc,
        "subagent-stopped",
        "a background subagent stopped with _coda/wait/stop (_x.ai/subagent/cancel)",
        |rec| {
            rec.new_session(true);
            rec.prompt("slow [[subagent:slow|child slow [[delay:20000]][[text:late]]]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "subagent");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            rec.quiet(Duration::from_millis(500));
            let answer = rec.call("_coda/wait/stop", json!({"sessionId": rec.session, "waitId": id}));
            assert_eq!(answer["result"], json!({}));
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "cancelled");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "cancelled"]);
        },
    );

    drop(model);
    drop(temp);
}

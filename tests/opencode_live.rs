//! Live: OpenCode's subagents (the `task` tool) through coda-opencode, recorded as fixtures.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test opencode_live` (after `scripts/install-clis opencode`); with
//! `CODA_RECORD=1` the recordings go to `fixtures/opencode/<scenario>/`. The hermetic config asks before every
//! `bash` call, so a subagent's shell command raises a permission request inside its child session.

#[path = "support/fake_model.rs"]
mod fake_model;
#[path = "support/live.rs"]
mod live;
#[path = "support/replay.rs"]
mod replay_support;
#[path = "grok_live/rig.rs"]
mod rig;
#[path = "support/shim.rs"]
mod shim;
#[path = "support/temp.rs"]
mod temp;

use std::path::Path;
use std::time::Duration;

use rig::{Rec, keep};
use serde_json::Value;

/// Longer than the shim's quiet period (10 s) plus OpenCode's own turn.
const LONG: Duration = Duration::from_secs(90);

fn states(waits: &[Value], wait_id: &Value) -> Vec<String> {
    waits.iter().filter(|w| w["waitId"] == *wait_id).filter_map(|w| w["state"].as_str().map(str::to_owned)).collect()
}

fn scenario(root: &Path, lc: &live::LiveCommand, name: &str, notes: &str, run: impl FnOnce(&mut Rec)) {
    let trace = root.join("traces").join(format!("{name}.jsonl"));
    std::fs::create_dir_all(trace.parent().expect("dir")).expect("traces dir");
    let mut rec = Rec::start(lc, "opencode", &trace);
    run(&mut rec);
    rec.finish();
    keep("opencode", name, &trace, root, notes);
}

/// The hermetic config with `permission.bash = "ask"`.
fn ask_before_bash(lc: &live::LiveCommand) {
    let path = lc.home.join(".config/opencode/opencode.json");
    let text = std::fs::read_to_string(&path).expect("the OpenCode config");
    let mut config: Value = serde_json::from_str(&text).expect("JSON config");
    config["permission"] = serde_json::json!({"bash": "ask"});
    std::fs::write(&path, config.to_string()).expect("write the config");
}

#[test]
fn record_opencode_activity() {
    if !rig::enabled("opencode") {
        return;
    }
    let model = fake_model::FakeModel::start();
    let temp = temp::TempDir::new("coda-opencode-activity");
    let root = temp.path().to_path_buf();
    let lc = live::prepare("opencode", &model.base_url(), &root).expect("prepare OpenCode");
    ask_before_bash(&lc);

    scenario(
        &root,
        &lc,
        "task-foreground",
        "the task tool in the foreground: a subagent wait from the call's start to its end",
        |rec| {
            rec.new_session(true);
            rec.prompt("delegate [[subagent-fg:child work [[text:child done]]]]");
            let waits = rec.waits();
            let open = waits.first().cloned().expect("a wait");
            assert_eq!(open["kind"], "subagent");
            assert_eq!(states(&waits, &open["waitId"]), ["waiting", "done"]);
            assert!(waits.iter().any(|w| w["state"] == "done" && w["childSessionId"].is_string()));
            rec.quiet(Duration::from_millis(1500));
        },
    );

    scenario(
        &root,
        &lc,
        "task-background-child-permission",
        "a background task whose child asks before running bash: the shim resumes the child, so the request reaches Coda on the child session; OpenCode's own turn on the result is handling",
        |rec| {
            rec.new_session(false);
            rec.prompt("delegate [[subagent:child runs [[delay:300]][[sh:echo hi]]]]");
            let open = rec.until_wait(LONG, |w| w["childSessionId"].is_string());
            let child = open["childSessionId"].clone();
            let id = open["waitId"].clone();
            rec.until_wait(LONG, |w| w["waitId"] == id && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(states(&rec.waits(), &id), ["waiting", "waiting", "handling", "done"]);
            let asked = rec
                .received
                .iter()
                .any(|f| f["method"] == "session/request_permission" && f["params"]["sessionId"] == child);
            assert!(asked, "the child's permission request reached Coda");
        },
    );

    scenario(
        &root,
        &lc,
        "task-follow-up",
        "a foreground task, then a follow-up of the same child (task_id): a new wait, same child session",
        |rec| {
            rec.new_session(false);
            rec.prompt("first [[subagent-fg:part one [[text:one done]]]]");
            let first = rec.waits().into_iter().find(|w| w["childSessionId"].is_string()).expect("the first child");
            rec.prompt("more [[resume:last|part two [[text:two done]]]]");
            let second = rec.until_wait(LONG, |w| w["kind"] == "subagent" && w["waitId"] != first["waitId"]);
            assert_eq!(second["childSessionId"], first["childSessionId"], "rule 5: same child session");
            let id = second["waitId"].clone();
            rec.until_wait(LONG, |w| w["waitId"] == id && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
        },
    );

    drop(model);
    drop(temp);
}

//! The integration tests, one binary: each file in `tests/` is a module of it (`autotests = false` in
//! Cargo.toml), so the tests link once instead of once a file. Run one file's tests with
//! `cargo test --test all <file>::`, one test with `cargo test --test all <file>::<test>`.
//!
//! The binary tests start the shims and the scripted test agent (`examples/test_agent.rs`) as processes; the
//! support code they share is [`support`].

mod support;

mod acp_live;
mod codex_compact_live;
mod codex_live;
mod codex_replay;
mod codex_version;
mod docs;
mod doctor;
mod facts_live;
mod failure_live;
mod failure_replay;
mod faults;
mod fixture_instruction;
mod grok_live;
mod grok_replay;
mod gui_path;
mod gui_path_live;
mod ids;
mod instruction;
mod kimi_activity;
mod kimi_live;
mod kimi_replay;
mod kimi_watch;
mod live_instruction;
mod live_record;
mod manifests;
mod model_requests_live;
mod opencode_live;
mod opencode_replay;
mod private_files;
mod process_group;
mod prompt_mode;
mod quiet_logs;
mod redact;
mod relay;
mod replay;
mod replay_diff;
mod sim;
mod validate;
mod view;
mod view_browser;

/// Every `tests/*.rs` is a module here: a file left out would silently never run.
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = include_str!("all.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("read tests/") {
        let path = entry.expect("an entry of tests/").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".rs")) else {
            continue;
        };
        if name != "all" && !this.lines().any(|l| l == format!("mod {name};")) {
            missing.push(name.to_owned());
        }
    }
    assert!(missing.is_empty(), "tests/ files not declared in tests/all.rs: {missing:?}");
}

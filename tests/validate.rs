//! `acp-replay validate` and `stats` on every fixture and on a hostile trace, and the schema check of a shim's
//! run (`tests/support/shim.rs`) on a trace where the shim broke the schema.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::replay::{fixtures, fixtures_root};
use crate::support::shim::check_trace;

fn acp_replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_acp-replay")).args(args).output().expect("run acp-replay")
}

fn every_fixture() -> Vec<PathBuf> {
    let all: Vec<PathBuf> = ["codex", "grok", "kimi", "opencode"].iter().flat_map(|a| fixtures(a)).collect();
    assert!(all.len() > 60, "the fixtures are found: {}", all.len());
    all
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn no_frame_a_shim_made_or_changed_in_any_fixture_breaks_the_schema() {
    let mut failures = Vec::new();
    let mut agents_breaking = Vec::new();
    for f in every_fixture() {
        let path = f.to_str().expect("a UTF-8 path");
        let own = acp_replay(&["validate", "--shim-only", path]);
        if own.status.code() != Some(0) {
            failures.push(format!("{path}: {:?}\n{}{}", own.status, text(&own.stdout), text(&own.stderr)));
        }
        // Without --shim-only, every frame is listed: the shim's (none) and the CLI's as they came.
        let all = acp_replay(&["validate", path]);
        let out = text(&all.stdout);
        assert!(matches!(all.status.code(), Some(0 | 1)), "{path}: {:?} {}", all.status, text(&all.stderr));
        assert_eq!(all.status.code() == Some(1), out.lines().any(|l| l.starts_with("line ")), "{path}: {out}");
        assert!(!out.contains("(the shim's)"), "{path}: {out}");
        if all.status.code() == Some(1) {
            agents_breaking.push(path.to_owned());
        }
        assert!(out.contains("frames checked against ACP schema 1.21.0"), "{out}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // What the real CLIs break is a fact of the recordings: Codex's own update kinds (the AIR extensions and
    // compaction updates, which schema 1.21.0 has as unstable).
    assert!(agents_breaking.iter().all(|p| p.contains("/codex/")), "{agents_breaking:?}");
}

#[test]
fn stats_counts_every_fixture_per_side_and_method() {
    for f in every_fixture() {
        let out = acp_replay(&["stats", f.to_str().expect("UTF-8")]);
        assert_eq!(out.status.code(), Some(0), "{}: {}", f.display(), text(&out.stderr));
        let s = text(&out.stdout);
        for section in ["client side (what Coda saw):", "agent side (what the CLI saw):", "what the shim added"] {
            assert!(s.contains(section), "{}: {s}", f.display());
        }
        // Every fixture opens with initialize, answered on both sides.
        let sides = s.split("what the shim added").next().unwrap_or_default();
        let init: Vec<&str> = sides.lines().filter(|l| l.trim_start().starts_with("initialize ")).collect();
        assert!(init.len() >= 2, "{}: {s}", f.display());
        assert!(init.iter().all(|l| l.split_whitespace().nth(4) == Some("1")), "one result each: {init:?}");
    }
}

#[test]
fn what_the_shim_adds_is_counted_by_method() {
    // coda-codex turns the AIR task updates into _coda/wait: frames it made.
    let out = acp_replay(&["stats", fixtures_root().join("codex/bg-fails").to_str().expect("UTF-8")]);
    let s = text(&out.stdout);
    let added = s.split("what the shim added").nth(1).unwrap_or_default();
    let wait = added.lines().find(|l| l.trim_start().starts_with("_coda/wait ")).unwrap_or_else(|| panic!("{s}"));
    let made: usize = wait.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a count");
    assert!(made >= 2, "{wait}");
}

fn hostile_trace(dir: &Path) -> PathBuf {
    let path = dir.join("hostile.jsonl");
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let mut t = Vec::new();
    t.extend_from_slice(b"{\"t\":0,\"dir\":\"client->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}}\n");
    t.extend_from_slice(b"{not json at all\n");
    t.extend_from_slice(b"{\"t\":1,\"dir\":\"agent->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"_x\",\"params\":{\"s\":\"\xc3\x28\"}}}\n");
    t.extend_from_slice(b"{\"t\":2,\"dir\":\"client->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}}\n");
    t.extend_from_slice(b"{\"t\":3,\"dir\":\"shim->client\",\"shim\":true,\"frame\":{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":1e400}}}\n");
    t.extend_from_slice(b"{\"t\":4,\"dir\":\"shim->client\",\"shim\":true,\"frame\":{\"jsonrpc\":\"2.0\",\"id\":\"nobody\",\"result\":{}}}\n");
    t.extend_from_slice(format!("{{\"t\":5,\"dir\":\"agent->shim\",\"frame\":{deep}}}\n").as_bytes());
    // A huge line (16 MiB) of one frame's text, read through.
    let big = "y".repeat(16 << 20);
    t.extend_from_slice(
        format!("{{\"t\":6,\"dir\":\"agent->shim\",\"frame\":{{\"jsonrpc\":\"2.0\",\"method\":\"_x/big\",\"params\":{{\"s\":\"{big}\"}}}}}}\n")
            .as_bytes(),
    );
    t.extend_from_slice(b"{\"t\":7,\"dir\":\"agent->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}}\n");
    std::fs::write(&path, t).expect("write the trace");
    path
}

#[test]
fn a_hostile_trace_is_validated_and_counted_without_a_panic() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = hostile_trace(dir.path());
    let path = trace.to_str().expect("UTF-8");
    let out = acp_replay(&["validate", path]);
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{s}{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    for want in [
        "line 4 client->shim (the client's) initialize /id: a request with id 1 while one with that id is still open",
        "line 5 shim->client (the shim's) initialize /result/protocolVersion",
        "line 6 shim->client (the shim's) /id: an answer to \"nobody\"",
        "line 9 agent->shim (the agent's) /id: an answer to 9",
        "line 2: unreadable",
        "line 3: unreadable: not valid UTF-8",
        "line 7: unreadable",
    ] {
        assert!(s.contains(want), "{want:?} in:\n{s}");
    }
    let shim_only = acp_replay(&["validate", "--shim-only", path]);
    assert_eq!(shim_only.status.code(), Some(1));
    assert!(!text(&shim_only.stdout).contains("(the client's)"));
    let stats = acp_replay(&["stats", path]);
    assert_eq!(stats.status.code(), Some(0), "{}", text(&stats.stderr));
    let s = text(&stats.stdout);
    assert!(s.contains("answers to no open request: 1"), "{s}");
    assert!(s.contains("3 unreadable lines"), "{s}");
}

#[test]
fn a_missing_trace_or_a_wrong_option_is_said_with_status_2() {
    let out = acp_replay(&["validate", "/nonexistent/trace.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/trace.jsonl"), "{}", text(&out.stderr));
    let out = acp_replay(&["stats", "--frobnicate", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--frobnicate"), "{}", text(&out.stderr));
    let out = acp_replay(&["validate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("usage: acp-replay validate"), "{}", text(&out.stderr));
}

#[test]
#[should_panic(expected = "the shim wrote frames that break ACP's schema")]
fn a_shim_run_whose_own_frame_breaks_the_schema_fails_its_test() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("trace.jsonl");
    let earlier = "{\"ts\":\"2026-12-01T00:00:00Z\",\"dir\":\"shim->client\",\"shim\":true,\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"_coda/wait\",\"params\":{}}}\n";
    let this_run = "{\"ts\":\"2026-12-01T00:00:01Z\",\"dir\":\"shim->client\",\"shim\":true,\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"_coda/wait\",\"params\":{\"sessionId\":\"s\",\"waitId\":\"w\",\"state\":\"later\"}}}\n";
    std::fs::write(&path, format!("{earlier}{this_run}")).expect("write");
    // What an earlier run appended is not this run's: from its length on, the break is this run's own.
    check_trace(&path, earlier.len() as u64);
}

#[test]
fn a_shim_run_whose_peers_break_the_schema_passes() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("trace.jsonl");
    let agents = "{\"ts\":\"2026-12-01T00:00:00Z\",\"dir\":\"agent->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{\"sessionId\":\"s\",\"update\":{\"sessionUpdate\":\"subagent_spawned\"}}}}\n";
    std::fs::write(&path, agents).expect("write");
    check_trace(&path, 0);
}

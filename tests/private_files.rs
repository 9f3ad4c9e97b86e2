//! Files the shim and its tools write hold prompts and the session instruction (issue 13, section 3):
//! created 0600, an existing file others can read is tightened, a symlink at the path is refused and its
//! target left alone. Every writer: `--trace-file` / `CODA_SHIM_TRACE`, `CODA_OPENCODE_RECORD`,
//! `CODA_KIMI_RECORD`, `acp-replay record`'s fixture and `ACP_REPLAY_REPORT`.

use crate::support;

use support::{shim, temp};

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use shim::{new_session_params, with_test_agent};

/// A session instruction as Coda sends it: Markdown with CJK text and emoji.
const INSTRUCTION: &str = "# 规则\n\n- 回答要简短 ✅\n- Never paste secrets 🔑\n";

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o777
}

/// A target file others may read, and a symlink to it at `link`.
fn planted_link(dir: &temp::TempDir, link: &str) -> (PathBuf, PathBuf) {
    let target = dir.join("elsewhere");
    std::fs::write(&target, "untouched").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = dir.join(link);
    symlink(&target, &link).unwrap();
    (target, link)
}

/// Runs one session with an instruction through `coda-<agent>` with `env`, then ends it; returns stderr.
fn one_session(agent: &str, args: &[&str], env: &[(&str, &Path)]) -> (Option<i32>, String) {
    let mut b = with_test_agent(agent);
    for a in args {
        b = b.arg(a);
    }
    for (k, v) in env {
        b = b.env(k, &v.display().to_string());
    }
    let mut s = b.start();
    // A shim that refused its trace file has exited already: the write then fails, and that is fine.
    let new = json!({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": new_session_params(INSTRUCTION)});
    let _ = writeln!(s.take_stdin(), "{new}");
    let status = s.wait(Duration::from_secs(15));
    let _ = s.rest();
    (status.code(), s.stderr_to_the_end().join("\n"))
}

#[test]
fn a_new_trace_file_is_private() {
    let dir = temp::TempDir::new("coda-private-trace");
    let path = dir.join("trace.jsonl");
    let (code, err) = one_session("opencode", &["--trace-file", &path.display().to_string()], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(std::fs::read_to_string(&path).unwrap().contains("回答要简短"), "the trace holds the instruction");
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn an_existing_trace_others_can_read_is_tightened_and_appended_to() {
    let dir = temp::TempDir::new("coda-private-trace-old");
    let path = dir.join("trace.jsonl");
    std::fs::write(&path, "{\"earlier\":true}\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, err) = one_session("grok", &[], &[("CODA_SHIM_TRACE", &path)]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(mode(&path), 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("{\"earlier\":true}\n") && text.contains("client->shim"), "{text}");
}

#[test]
fn a_symlink_at_the_trace_path_is_refused() {
    for how in ["flag", "env"] {
        let dir = temp::TempDir::new("coda-private-trace-link");
        let (target, link) = planted_link(&dir, "trace.jsonl");
        let (code, err) = match how {
            "flag" => one_session("kimi", &["--trace-file", &link.display().to_string()], &[]),
            _ => one_session("kimi", &[], &[("CODA_SHIM_TRACE", &link)]),
        };
        assert_eq!(code, Some(2), "{how}: {err}");
        assert!(err.contains("cannot open trace file") && err.contains("symbolic link"), "{how}: {err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched", "{how}");
        assert_eq!(mode(&target), 0o644, "{how}");
    }
}

#[test]
fn the_adapters_event_records_are_private_and_never_follow_a_symlink() {
    for (agent, var) in [
        ("opencode", "CODA_OPENCODE_RECORD"),
        ("kimi", "CODA_KIMI_RECORD"),
        ("codex", "CODA_CODEX_RECORD"),
        ("grok", "CODA_GROK_RECORD"),
    ] {
        let dir = temp::TempDir::new("coda-private-record");
        let path = dir.join("record.jsonl");
        let (code, err) = one_session(agent, &[], &[(var, &path)]);
        assert_eq!(code, Some(0), "{agent}: {err}");
        assert_eq!(mode(&path), 0o600, "{agent}");

        let (target, link) = planted_link(&dir, "linked.jsonl");
        let (code, err) = one_session(agent, &[], &[(var, &link)]);
        assert_eq!(code, Some(0), "{agent}: the session goes on without the record: {err}");
        assert!(err.contains(var) && err.contains("symbolic link"), "{agent}: {err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched", "{agent}");
    }
}

fn acp_replay() -> Command {
    Command::new(env!("CARGO_BIN_EXE_acp-replay"))
}

#[test]
fn acp_replay_writes_its_fixture_and_its_report_privately() {
    let dir = temp::TempDir::new("coda-private-replay");
    let trace = dir.join("trace-in.jsonl");
    let (code, err) = one_session("opencode", &["--trace-file", &trace.display().to_string()], &[]);
    assert_eq!(code, Some(0), "{err}");
    // An earlier fixture others could read is tightened when it is written again.
    let fixture = dir.join("fixture");
    std::fs::create_dir(&fixture).unwrap();
    std::fs::write(fixture.join("trace.jsonl"), "old").unwrap();
    std::fs::set_permissions(fixture.join("trace.jsonl"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let record = |out: &Path| {
        acp_replay().arg("record").arg(&trace).arg(out).arg("--allow-paths").output().expect("run acp-replay")
    };
    let out = record(&fixture);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&fixture.join("trace.jsonl")), 0o600);
    assert!(std::fs::read_to_string(fixture.join("trace.jsonl")).unwrap().contains("回答要简短"));

    let linked = dir.join("linked");
    std::fs::create_dir(&linked).unwrap();
    let (target, _) = planted_link(&dir, "linked/trace.jsonl");
    let out = record(&linked);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("symbolic link"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");

    // The player's failure report quotes the frame it did not expect: private too.
    let report = dir.join("report.txt");
    let mut player = acp_replay()
        .arg("play")
        .arg(&fixture)
        .env("ACP_REPLAY_REPORT", &report)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = player.stdin.take().unwrap();
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"not/recorded\"}\n").unwrap();
    drop(stdin);
    assert_eq!(player.wait().unwrap().code(), Some(3));
    assert!(std::fs::read_to_string(&report).unwrap().contains("not/recorded"));
    assert_eq!(mode(&report), 0o600);
}

//! Every committed fixture replayed through its shim binary, with `acp-replay` as the CLI; and the
//! record -> replay pipeline itself, on a trace of the scripted test agent.

use crate::support;

use support::{replay as replay_support, shim};

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use coda_shim::replay::{self, Body, Dir, Normaliser};
use serde_json::{Value, json};

use replay_support::{check, check_all, check_part, fixtures};

#[test]
fn grok_fixtures_replay() {
    assert!(check_all("grok") > 0, "no fixtures under fixtures/grok");
}

#[test]
fn opencode_fixtures_replay() {
    assert!(check_all("opencode") > 0, "no fixtures under fixtures/opencode");
}

// Kimi's 21 fixtures are the slowest replays (each waits for the shim's file watch): two tests, run side by side.
#[test]
fn kimi_fixtures_replay_first_of_two() {
    assert!(check_part("kimi", 0, 2) > 0, "no fixtures under fixtures/kimi");
}

#[test]
fn kimi_fixtures_replay_second_of_two() {
    assert!(check_part("kimi", 1, 2) > 0, "no second Kimi fixture under fixtures/kimi");
}

#[test]
fn codex_fixtures_replay() {
    assert!(check_all("codex") > 0, "no fixtures under fixtures/codex");
}

/// coda-acp's fixtures, one folder per built-in profile; each names `coda-acp --profile <name>` in its shim
/// record, which the check runs.
#[test]
fn acp_fixtures_replay() {
    let n: usize = ["acp-qwen", "acp-gemini", "acp-claude"].iter().map(|agent| check_all(agent)).sum();
    assert!(n > 0, "no fixtures under fixtures/acp-*");
}

#[test]
fn a_fixture_of_coda_acp_is_checked_with_coda_acp_only() {
    let fixture = fixtures("acp-qwen").into_iter().next().expect("a fixture of coda-acp's Qwen profile");
    let text = std::fs::read_to_string(fixture.join(replay::TRACE_FILE)).unwrap();
    assert!(text.lines().next().unwrap().contains(r#""dir":"shim","line":"coda-acp --profile qwen""#));
    let err = check("grok", &fixture).unwrap_err();
    assert!(err.contains("recorded with coda-acp"), "{err}");
}

#[test]
fn committed_fixtures_name_no_path_of_this_machine() {
    let n = Normaliser::default();
    for agent in ["grok", "opencode", "kimi", "codex", "acp-qwen", "acp-gemini", "acp-claude"] {
        for f in fixtures(agent) {
            let text = std::fs::read_to_string(f.join(replay::TRACE_FILE)).unwrap();
            assert!(n.leftovers(&text).is_empty(), "{} names {:?}", f.display(), n.leftovers(&text));
            replay::parse_records(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        }
    }
}

/// A temp dir laid out like a live run: home/, work/ (the cwd), tmp/.
struct Root(PathBuf);

impl Root {
    fn new(name: &str) -> Root {
        let dir = std::env::temp_dir().join(format!("coda-replay-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["home", "work", "tmp", "fixture"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        Root(dir)
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs coda-grok with the scripted test agent and `--trace-file`, as a live recording would, and turns the
/// trace into a fixture in `root/fixture`.
fn record_test_agent_session(root: &Path) -> PathBuf {
    let trace = root.join("trace.jsonl");
    let work = root.join("work");
    let mut child = Command::new(replay_support::shim_binary("grok"))
        .arg("--agent-command")
        .arg(shell_words::quote(&shim::test_agent().display().to_string()).into_owned())
        .arg("--trace-file")
        .arg(&trace)
        .env_remove("CODA_SHIM_TRACE")
        .env("HOME", root.join("home"))
        .current_dir(&work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut call = |id: i64, method: &str, params: Value| {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{frame}").unwrap();
        stdin.flush().unwrap();
        loop {
            let v: Value = serde_json::from_str(&out.next().unwrap().unwrap()).unwrap();
            if v.get("id") == Some(&json!(id)) && v.get("method").is_none() {
                return v;
            }
        }
    };
    call(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let instruction = json!({"mode": "append", "content": [{"type": "text", "text": "be brief"}]});
    let new = call(1, "session/new", json!({"cwd": work, "mcpServers": [], "systemPrompt": instruction}));
    let sid = new["result"]["sessionId"].clone();
    call(2, "session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": "/init now"}]}));
    call(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": format!("read {}", work.join("a.txt").display())}]}),
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());
    let fixture = root.join("fixture");
    let records =
        replay::record(&std::fs::read_to_string(&trace).unwrap(), None, &Normaliser::for_live_root(root)).unwrap();
    std::fs::write(fixture.join(replay::TRACE_FILE), replay::render(&records)).unwrap();
    fixture
}

fn edit_fixture(fixture: &Path, edit: impl Fn(&mut replay::Record) -> bool) {
    let path = fixture.join(replay::TRACE_FILE);
    let mut records = replay::load(&path).unwrap();
    let edited = records.iter_mut().filter_map(|r| edit(r).then_some(())).count();
    assert_eq!(edited, 1, "the edit applies to exactly one record");
    std::fs::write(&path, replay::render(&records)).unwrap();
}

#[test]
fn a_recorded_session_replays_through_the_shim() {
    let root = Root::new("roundtrip");
    let fixture = record_test_agent_session(&root.0);
    let text = std::fs::read_to_string(fixture.join(replay::TRACE_FILE)).unwrap();
    assert!(text.contains(r#""cwd":"{{CWD}}""#), "the cwd is a placeholder: {text}");
    assert!(text.contains("read {{CWD}}/a.txt"), "paths inside text too");
    assert!(!text.contains(&root.0.display().to_string()), "no trace of the recording's temp dir");
    let report = check("grok", &fixture).unwrap();
    assert_eq!(report.sent, 4);
    assert!(report.received >= 4, "{report:?}");
}

#[test]
fn a_client_frame_the_recording_does_not_have_is_reported_by_the_player() {
    let root = Root::new("client-edit");
    let fixture = record_test_agent_session(&root.0);
    // The test now sends another prompt than the recorded agent got: the player must stop and say where.
    edit_fixture(&fixture, |r| match (&r.edge, &mut r.body) {
        (Dir::ClientToShim, Body::Frame(f)) if f.contains("read {{CWD}}") => {
            *f = f.replace("read {{CWD}}", "write {{CWD}}");
            true
        }
        _ => false,
    });
    let err = check("grok", &fixture).unwrap_err();
    let report = err.split("--- player report ---").nth(1).unwrap_or_else(|| panic!("no player report: {err}"));
    assert!(report.contains("the agent received a frame the recording does not have here"), "{err}");
    // Which block holds the text depends on how the instruction layer delivers the instruction.
    assert!(report.contains("first difference at /params/prompt/"), "{err}");
    assert!(report.contains(r#"/text: expected "read {{CWD}}/a.txt""#), "{err}");
}

#[test]
fn a_client_side_difference_is_reported_with_its_place() {
    let root = Root::new("shim-edit");
    let fixture = record_test_agent_session(&root.0);
    // Pretend the shim used to answer session/new differently: the check must fail on that frame.
    edit_fixture(&fixture, |r| match (&r.edge, &mut r.body) {
        (Dir::ShimToClient, Body::Frame(f))
            if serde_json::from_str::<Value>(f).is_ok_and(|v| v["id"] == 1 && v["result"]["sessionId"].is_string()) =>
        {
            *f = f.replace(r#""sessionId":""#, r#""sessionId":"X"#);
            true
        }
        _ => false,
    });
    let err = check("grok", &fixture).unwrap_err();
    assert!(err.contains("the client received a frame the recording does not have here"), "{err}");
    assert!(err.contains("first difference at /result/sessionId"), "{err}");
}

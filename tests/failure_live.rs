//! Live: each upstream failure against the real CLIs, as Coda receives it through the shim (section 执行失败),
//! recorded as `fixtures/<agent>/upstream-failures/` and replayed at once.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test all failure_live:: -- --nocapture --test-threads 1` (after
//! `scripts/install-clis`). `CODA_RECORD=1` also writes the fixtures; `CODA_FAILURE_ONLY=503,reset` limits the
//! cases (then nothing is written). One shim process and one session per agent; each case is one prompt whose
//! marker makes the fake model answer with that failure in the OpenAI shape the CLI's provider speaks. Prints, per
//! case, what Coda received and how long the turn took (the measurements in the failure table of docs/contract.md).

use crate::support;

use support::{failures, fake_model, live, replay as replay_support, shim, temp};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coda_shim::replay::{self, Normaliser};
use serde_json::{Value, json};

/// How long the client listens after a turn for frames that trail its answer.
const TRAIL: Duration = Duration::from_millis(1500);
/// Longest silence within one failed turn (a CLI's own retries can take minutes).
const TURN: Duration = Duration::from_secs(600);

fn only() -> Option<Vec<String>> {
    std::env::var("CODA_FAILURE_ONLY").ok().map(|s| s.split(',').map(|c| c.trim().to_owned()).collect())
}

/// What one failure case gave Coda.
struct Outcome {
    case: &'static str,
    answer: Value,
    elapsed: Duration,
    /// The `sessionUpdate` kinds (and other methods) Coda received during the turn.
    updates: Vec<String>,
}

fn run_agent(agent: &str) -> Vec<Outcome> {
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new(&format!("coda-failure-{agent}"));
    let root = temp.path().to_path_buf();
    let mut lc = live::prepare(agent, &model.base_url(), &root).expect("prepare the CLI");
    if agent == "opencode" {
        // As coda-opencode runs it by default: with its server on a port the shim reads events from.
        let port = std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).expect("a port").port();
        lc.args.extend(["--hostname".into(), "127.0.0.1".into(), "--port".into(), port.to_string()]);
    }
    if agent == "kimi" {
        // Kimi's own retries are part of what is measured here: its default (ten attempts per step), not the
        // single attempt the other live suites configure.
        let config = lc.home.join(".kimi-code/config.toml");
        let text = std::fs::read_to_string(&config).expect("kimi config");
        let cut = text.find("# One attempt per step").unwrap_or(text.len());
        std::fs::write(&config, &text[..cut]).expect("kimi config");
    }
    let cwd = lc.workdir.display().to_string();
    let trace = root.join("upstream-errors.jsonl");
    let mut cmd = lc.shim_command(&replay_support::shim_binary(agent));
    // Kimi's session files and OpenCode's server events are part of what the shim reads: the player re-creates them.
    if agent == "kimi" {
        cmd.env("CODA_KIMI_RECORD", trace.with_extension("files.jsonl"));
    }
    if agent == "opencode" {
        cmd.env("CODA_OPENCODE_RECORD", trace.with_extension("files.jsonl"));
    }
    if agent == "codex" {
        // coda-codex learns Codex's version from `$CODEX_PATH -V` (the replays use fixtures/codex/codex-cli).
        cmd.env(
            "CODEX_PATH",
            live::live_root()
                .join("codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"),
        );
    }
    let mut shim = shim::Builder::from_command(cmd).arg("--trace-file").arg(&trace.display().to_string()).start();
    let mut next = 1;
    // A failed turn may stay silent for minutes while the CLI retries: wait longer than `Shim::request` does.
    let mut call = |shim: &mut shim::Shim, method: &str, params: Value| {
        next += 1;
        shim.send_json(&json!({"jsonrpc": "2.0", "id": next, "method": method, "params": params}));
        let mut before = Vec::new();
        loop {
            let line = shim.try_recv(TURN).unwrap_or_else(|| panic!("no answer to {method} within {TURN:?}"));
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v.get("id") == Some(&Value::from(next)) && v.get("method").is_none() {
                return (v, before);
            }
            before.push(v);
        }
    };
    let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
        "_meta": {"coda": {"waits": {}}}});
    let (init, _) = call(
        &mut shim,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
    );
    assert!(init.get("result").is_some(), "{init}");
    while shim.try_recv(TRAIL).is_some() {}
    let (new, _) = call(&mut shim, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().expect("a sessionId").to_owned();
    while shim.try_recv(TRAIL).is_some() {}

    let only = only();
    let mut outcomes = Vec::new();
    for (case, marker) in failures::cases(agent) {
        if only.as_ref().is_some_and(|o| !o.iter().any(|c| c == case)) {
            continue;
        }
        let text = format!("Failure case {case}.\nAnswer it: {marker}");
        let started = Instant::now();
        let (answer, before) =
            call(&mut shim, "session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}));
        let elapsed = started.elapsed();
        let mut updates: Vec<String> = before
            .iter()
            .filter_map(|f: &Value| {
                let kind = f["params"]["update"]["sessionUpdate"].as_str().or(f["method"].as_str())?;
                let text = f["params"]["update"]["content"]["text"].as_str().unwrap_or("");
                Some(if text.is_empty() { kind.to_owned() } else { format!("{kind} {text:?}") })
            })
            .collect();
        while let Some(line) = shim.try_recv(TRAIL) {
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            updates.push(format!(
                "after: {}",
                v["params"]["update"]["sessionUpdate"].as_str().or(v["method"].as_str()).unwrap_or("?")
            ));
        }
        eprintln!("== {agent} {case}: {:.1} s\n   answer: {answer}\n   updates: {updates:?}", elapsed.as_secs_f64());
        outcomes.push(Outcome { case, answer, elapsed, updates });
    }
    shim.close_stdin();
    let status = shim.wait(Duration::from_secs(30));
    assert!(status.success(), "the shim exited with {status}; stderr: {:?}", shim.drain_stderr());
    if only.is_none() {
        keep(agent, &trace, &root);
    }
    drop(model);
    drop(temp);
    outcomes
}

/// Normalises the trace, replays it, and with `CODA_RECORD=1` writes `fixtures/<agent>/upstream-failures/`.
fn keep(agent: &str, trace: &Path, root: &Path) {
    let text = std::fs::read_to_string(trace).expect("the trace file");
    let files = std::fs::read_to_string(trace.with_extension("files.jsonl")).ok();
    let mut n = Normaliser::for_live_root(root);
    n.add(&live::live_root().display().to_string(), "LIVE");
    let records = replay::record(&text, files.as_deref(), &n).expect("normalise the trace");
    let mut out = replay::render(&records);
    // A reset time Codex gives without a day gets the day the shim received it: `{{TODAY}}` on replay.
    let today = jiff::Timestamp::now().strftime("%Y-%m-%d").to_string();
    out = out.replace(&format!("<t:{today}T"), "<t:{{TODAY}}T");
    let left = n.leftovers(&out);
    assert!(left.is_empty(), "{agent}: the recording still names {left:?}");
    let scratch = root.join("fixture");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join(replay::TRACE_FILE), &out).unwrap();
    let report = replay_support::check(agent, &scratch).unwrap_or_else(|e| {
        let kept = std::env::temp_dir().join(format!("coda-failure-{agent}-unreplayable.jsonl"));
        let _ = std::fs::write(&kept, &out);
        panic!("{agent}: {e}\n(the recording is kept in {})", kept.display())
    });
    eprintln!("{agent}/upstream-failures: {} records; replayed: {report:?}", records.len());
    if std::env::var_os("CODA_RECORD").is_some() {
        let dir: PathBuf = replay_support::fixtures_root().join(agent).join("upstream-failures");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(replay::TRACE_FILE), &out).unwrap();
        let cli = match agent {
            "codex" => "@agentclientprotocol/codex-acp@2.6.0",
            "kimi" => "@moonshot-ai/kimi-code@2.1.0",
            "grok" => "@xai-official/grok@1.0.41",
            _ => "opencode-ai@1.18.33",
        };
        let meta = json!({"agent": agent, "scenario": "upstream-failures", "cli": cli, "recorded_by": "tests/failure_live.rs",
            "notes": format!("one prompt per upstream failure, in the order of failures::cases(\"{agent}\") in tests/support/failures.rs (prompt ids 4-{})", 3 + failures::cases(agent).len())});
        std::fs::write(dir.join("meta.json"), format!("{meta:#}\n")).unwrap();
        eprintln!("wrote {}", dir.display());
    }
}

/// Runs every case against `agent` and checks what Coda received (docs/contract.md, "Upstream failures").
fn live(agent: &str) {
    if !live::wanted(agent, "live failures") {
        return;
    }
    let outcomes = run_agent(agent);
    eprintln!("\n{agent}: case | seconds | Coda received");
    let mut wrong = Vec::new();
    for o in &outcomes {
        let failure = o.answer.pointer("/error/data/_meta/coda/failure").cloned().unwrap_or_default();
        let code = o.answer.pointer("/error/code").cloned().unwrap_or_default();
        eprintln!(
            "{agent}: {} | {:.1} | {code} {failure} ({} updates)",
            o.case,
            o.elapsed.as_secs_f64(),
            o.updates.len()
        );
        if let Err(e) = failures::check(agent, o.case, &o.answer) {
            wrong.push(e);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn live_failures_grok() {
    live("grok");
}

#[test]
fn live_failures_opencode() {
    live("opencode");
}

#[test]
fn live_failures_kimi() {
    live("kimi");
}

#[test]
fn live_failures_codex() {
    live("codex");
}

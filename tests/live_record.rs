//! Live: records the base fixtures from the real CLIs and proves each recording replays.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test all live_record::` (after `scripts/install-clis`). Each scenario runs the
//! shim with `--trace-file` against the pinned CLI (hermetic HOME, fake model), normalises the trace with
//! `acp-replay`'s recorder and replays it through the same shim at once. With `CODA_RECORD=1` the fixture is
//! also written to `fixtures/<agent>/<scenario>/` (review the diff before committing). `CODA_LIVE_AGENTS=grok,…`
//! limits the agents.

use crate::support;

use support::recorder::files_log;
use support::{coda_text, fake_model, live, replay as replay_support, shim, temp};

use std::path::{Path, PathBuf};
use std::time::Duration;

use coda_shim::replay::{self, Normaliser};
use serde_json::{Value, json};

/// How long the client listens after a turn for frames that trail its answer.
const TRAIL: Duration = Duration::from_millis(1500);

/// The slash command each CLI runs for the command-first turn (one it has, that needs no set-up).
fn command(agent: &str) -> &'static str {
    match agent {
        "grok" => "/context",
        "opencode" => "/init focus on tests",
        "kimi" => "/status",
        _ => "/compact",
    }
}

/// The Codex CLI binary that codex-acp runs, from the pinned install.
fn codex_binary() -> PathBuf {
    live::live_root().join("codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex")
}

/// The newer Codex CLI `scripts/install-clis codex-cli` installs, run by codex-acp through `CODEX_PATH`.
fn codex_cli_171() -> PathBuf {
    live::live_root().join("codex-cli/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex")
}

/// Coda's real-size session instruction (`fixtures/coda-instruction.md`).
fn system_prompt() -> Value {
    coda_text::system_prompt(coda_text::INSTRUCTION)
}

/// One shim process against the live CLI, tracing into `trace`.
struct Run {
    shim: shim::Shim,
    next_id: i64,
}

impl Run {
    fn start(lc: &live::LiveCommand, agent: &str, trace: &Path) -> Run {
        Run::start_with(lc, agent, trace, &codex_binary())
    }

    /// [`Run::start`] with `codex` as the Codex CLI codex-acp runs (coda-codex only).
    fn start_with(lc: &live::LiveCommand, agent: &str, trace: &Path, codex: &Path) -> Run {
        let mut lc = lc.clone();
        if agent == "opencode" {
            // As coda-opencode's default command runs OpenCode: its server on a port the shim knows (so the shim
            // reads it, and declares steering), the server events it handled logged for the replay, which writes
            // them back for the shim to read.
            let port = std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).expect("a port");
            lc.args.extend(["--hostname".into(), "127.0.0.1".into(), "--port".into(), port.port().to_string()]);
            lc.env.push(("CODA_OPENCODE_RECORD".into(), files_log(trace).display().to_string()));
        }
        let mut cmd = lc.shim_command(&replay_support::shim_binary(agent));
        if agent == "codex" {
            // coda-codex learns Codex's version from `$CODEX_PATH -V` (the replays use fixtures/codex/codex-cli).
            cmd.env("CODEX_PATH", codex);
            // The rollout file a load reads: the player re-creates it.
            cmd.env("CODA_CODEX_RECORD", files_log(trace));
        }
        if agent == "kimi" {
            // Kimi's session files are part of what the shim reads: the player re-creates them.
            cmd.env("CODA_KIMI_RECORD", files_log(trace));
        }
        if agent == "grok" {
            // The session folder's `updates.jsonl` a load reads: the player re-creates it.
            cmd.env("CODA_GROK_RECORD", files_log(trace));
        }
        let shim = shim::Builder::from_command(cmd).arg("--trace-file").arg(&trace.display().to_string()).start();
        Run { shim, next_id: 0 }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        // A real CLI on a loaded machine may take a while to start (OpenCode and Kimi: 10 s and more seen).
        let (answer, _) = self.shim.request_within(id, method, params, Duration::from_secs(60));
        assert!(answer.get("result").is_some(), "{method} failed: {answer}");
        answer
    }

    /// Lets frames that follow an answer (command lists, titles, usage) arrive before the next step.
    fn trail(&mut self) {
        while self.shim.try_recv(TRAIL).is_some() {}
    }

    fn initialize(&mut self) -> Value {
        let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
            "_meta": {"coda": {"waits": {}}}});
        let answer = self.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
        );
        self.trail();
        answer
    }

    fn prompt(&mut self, sid: &str, text: &str) -> Value {
        let answer = self.call("session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}));
        self.trail();
        answer
    }

    fn finish(mut self) {
        self.shim.close_stdin();
        let status = self.shim.wait(Duration::from_secs(20));
        assert!(status.success(), "the shim exited with {status}; stderr: {:?}", self.shim.drain_stderr());
    }
}

fn new_session(run: &mut Run, cwd: &str, instruction: bool) -> String {
    let mut params = json!({"cwd": cwd, "mcpServers": []});
    if instruction {
        params["systemPrompt"] = system_prompt();
    }
    let answer = run.call("session/new", params);
    run.trail();
    answer["result"]["sessionId"].as_str().expect("a sessionId").to_owned()
}

/// Normalises `trace`, replays it, and with `CODA_RECORD=1` writes it to `fixtures/<agent>/<scenario>/`.
fn keep(agent: &str, scenario: &str, trace: &Path, root: &Path) {
    let text = std::fs::read_to_string(trace).expect("the trace file");
    let files = std::fs::read_to_string(files_log(trace)).ok();
    let mut n = Normaliser::for_live_root(root);
    n.add(&live::live_root().display().to_string(), "LIVE");
    let records = replay::record(&text, files.as_deref(), &n).expect("normalise the trace");
    // What the client saw holds no part of the instruction.
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).expect("a trace line");
        if record["dir"] == "shim->client"
            && let Some(leak) = coda_text::leak(&record["frame"])
        {
            panic!("{agent}/{scenario}: the client saw part of the instruction: {leak}");
        }
    }
    let mut out = replay::render(&records);
    // A reset time Codex gives without a day gets the day the shim received it: `{{TODAY}}` on replay.
    let today = jiff::Timestamp::now().strftime("%Y-%m-%d").to_string();
    out = out.replace(&format!("<t:{today}T"), "<t:{{TODAY}}T");
    let left = n.leftovers(&out);
    assert!(left.is_empty(), "{agent}/{scenario}: the recording still names {left:?}");
    let scratch = root.join("fixture").join(scenario);
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join(replay::TRACE_FILE), &out).unwrap();
    let report = replay_support::check(agent, &scratch).unwrap_or_else(|e| panic!("{agent}/{scenario}: {e}"));
    eprintln!("{agent}/{scenario}: {} records; replayed: {report:?}", records.len());
    if std::env::var_os("CODA_RECORD").is_some() {
        let dir: PathBuf = replay_support::fixtures_root().join(agent).join(scenario);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(replay::TRACE_FILE), &out).unwrap();
        let meta = json!({"agent": agent, "scenario": scenario, "cli": live::pinned(agent),
            "recorded_by": "tests/live_record.rs"});
        std::fs::write(dir.join("meta.json"), format!("{:#}\n", meta)).unwrap();
        eprintln!("wrote {}", dir.display());
    }
}

fn record_all(agent: &str) {
    if !live::wanted(agent, "live recording") {
        return;
    }
    let model = fake_model::FakeModel::start();
    let temp = temp::TempDir::new(&format!("coda-record-{agent}"));
    let root = temp.path().to_path_buf();
    let lc = live::prepare(agent, &model.base_url(), &root).expect("prepare the CLI");
    let cwd = lc.workdir.display().to_string();
    let traces = root.join("traces");
    std::fs::create_dir_all(&traces).unwrap();

    // Start-up and a plain turn.
    let trace = traces.join("startup-plain-turn.jsonl");
    let mut run = Run::start(&lc, agent, &trace);
    run.initialize();
    let sid = new_session(&mut run, &cwd, false);
    let answer = run.prompt(&sid, "hello [[text:Hello from the recording.]]");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    run.finish();
    keep(agent, "startup-plain-turn", &trace, &root);

    // Session instruction, a slash command as the first turn, then a normal turn.
    let trace = traces.join("instruction-command-first.jsonl");
    let mut run = Run::start(&lc, agent, &trace);
    run.initialize();
    let sid = new_session(&mut run, &cwd, true);
    run.prompt(&sid, command(agent));
    let answer = run.prompt(&sid, &format!("{} [[text:hi there]]", coda_text::FIRST_PROMPT));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    run.finish();
    keep(agent, "instruction-command-first", &trace, &root);

    // session/load of that session in a fresh process, then one more turn.
    let trace = traces.join("session-load.jsonl");
    let mut run = Run::start(&lc, agent, &trace);
    run.initialize();
    run.call("session/load", json!({"sessionId": sid, "cwd": cwd, "mcpServers": [], "systemPrompt": system_prompt()}));
    run.trail();
    let answer = run.prompt(&sid, "again [[text:ok]]");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    run.finish();
    keep(agent, "session-load", &trace, &root);

    drop(model);
    drop(temp);
}

#[test]
fn record_grok() {
    record_all("grok");
}

#[test]
fn record_opencode() {
    record_all("opencode");
}

/// codex-acp 2.6.0 on Codex CLI 0.171.0 (through `CODEX_PATH`; codex-acp pins ^0.166.0): a plain turn with
/// Coda's instruction, then turns the upstream fails, as Coda gets them (identity, failure kinds).
#[test]
fn record_codex_171() {
    if !live::wanted("codex", "Codex 0.171 through CODEX_PATH") {
        return;
    }
    let codex = codex_cli_171();
    assert!(codex.is_file(), "run `scripts/install-clis codex-cli` first: {} is missing", codex.display());
    let model = fake_model::FakeModel::start();
    let temp = temp::TempDir::new("coda-record-codex-171");
    let root = temp.path().to_path_buf();
    let lc = live::prepare("codex", &model.base_url(), &root).expect("prepare the CLI");
    let cwd = lc.workdir.display().to_string();
    let traces = root.join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    let trace = traces.join("codex-0.171.jsonl");
    let mut run = Run::start_with(&lc, "codex", &trace, &codex);
    let init = run.initialize();
    assert_eq!(init["result"]["agentInfo"], json!({"name": "codex", "version": "0.171.0"}), "{init}");
    let sid = new_session(&mut run, &cwd, true);
    let answer = run.prompt(&sid, &format!("{} [[text:Hello from Codex 0.171.]]", coda_text::FIRST_PROMPT));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let mut failures = Vec::new();
    for kind in ["429-usage", "500", "401"] {
        let id = run.next_id;
        run.next_id += 1;
        let params = json!({"sessionId": sid, "prompt": [{"type": "text", "text": format!("fail [[error:{kind}]]")}]});
        let (answer, _) = run.shim.request_within(id, "session/prompt", params, Duration::from_secs(60));
        run.trail();
        eprintln!("codex 0.171, upstream {kind}: {answer}");
        failures.push((kind, answer));
    }
    let kind = |a: &Value| a.pointer("/error/data/_meta/coda/failure/kind").cloned().unwrap_or(Value::Null);
    assert_eq!(kind(&failures[0].1), "quota_exhausted", "{:?}", failures[0]);
    // A 500 says nothing explicit of the service (codex-acp gives adapter errors the same record): a plain
    // error, as `adapters/codex/failure.rs` says and the `upstream-errors` replay checks.
    assert_eq!(failures[1].1["error"]["code"], -32603, "{:?}", failures[1]);
    assert_eq!(kind(&failures[1].1), Value::Null, "{:?}", failures[1]);
    assert_eq!(failures[2].1["error"]["code"], -32000, "{:?}", failures[2]);
    run.finish();
    keep_with_cli(&trace, &root, "0.171.0");
    drop(model);
    drop(temp);
}

/// [`keep`] for a fixture recorded on Codex CLI `version`: the fixture holds its own `codex-cli` stand-in.
fn keep_with_cli(trace: &Path, root: &Path, version: &str) {
    let scenario = "codex-cli-0.171";
    let stand_in = format!(
        "#!/bin/sh\n# Stands in for the Codex CLI in this fixture's replay: coda-codex asks `$CODEX_PATH -V`.\necho \"codex-cli {version}\"\n"
    );
    let scratch = root.join("fixture").join(scenario);
    std::fs::create_dir_all(&scratch).unwrap();
    write_stand_in(&scratch.join("codex-cli"), &stand_in);
    keep("codex", scenario, trace, root);
    if std::env::var_os("CODA_RECORD").is_some() {
        let dir = replay_support::fixtures_root().join("codex").join(scenario);
        write_stand_in(&dir.join("codex-cli"), &stand_in);
        let meta = json!({"agent": "codex", "scenario": scenario,
            "cli": format!("{} (Codex CLI {version} through CODEX_PATH)", live::pinned("codex")),
            "recorded_by": "tests/live_record.rs record_codex_171"});
        std::fs::write(dir.join("meta.json"), format!("{:#}\n", meta)).unwrap();
    }
}

fn write_stand_in(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn record_kimi() {
    record_all("kimi");
}

#[test]
fn record_codex() {
    record_all("codex");
}

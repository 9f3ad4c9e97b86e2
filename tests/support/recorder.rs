//! Records activity scenarios of the real Grok Build and OpenCode through their shims as fixtures.
//!
//! Opt-in, like `tests/live_record.rs`: a client that plays Coda (answers permission requests with "allow once"), and
//! `keep`, which normalises a trace, replays it through the same shim at once and, with `CODA_RECORD=1`, writes
//! `fixtures/<agent>/<scenario>/`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coda_shim::replay::{self, Normaliser};
use serde_json::{Value, json};

use super::replay as replay_support;
use super::{coda_text, live, shim};

/// One shim process against the live CLI, tracing into a file; every frame Coda received is kept.
pub struct Rec {
    shim: shim::Shim,
    next_id: i64,
    pub received: Vec<Value>,
    pub session: String,
    pub cwd: String,
}

impl Rec {
    pub fn start(lc: &live::LiveCommand, agent: &str, trace: &Path) -> Rec {
        Rec::start_command(lc, lc.shim_command(&replay_support::shim_binary(agent)), trace)
    }

    /// `coda-acp --profile <agent>` over the live agent, initialized with the capabilities Coda declares (with
    /// `session.compaction`).
    pub fn start_acp(lc: &live::LiveCommand, trace: &Path) -> Rec {
        let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
            "session": {"compaction": {}}, "_meta": {"coda": {"waits": {}}}});
        Rec::start_with(lc, lc.acp_command(Path::new(env!("CARGO_BIN_EXE_coda-acp"))), trace, caps)
    }

    fn start_command(lc: &live::LiveCommand, cmd: std::process::Command, trace: &Path) -> Rec {
        let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
            "_meta": {"coda": {"waits": {}}}});
        Rec::start_with(lc, cmd, trace, caps)
    }

    fn start_with(lc: &live::LiveCommand, cmd: std::process::Command, trace: &Path, caps: Value) -> Rec {
        let shim = shim::Builder::from_command(cmd).arg("--trace-file").arg(&trace.display().to_string()).start();
        let cwd = lc.workdir.display().to_string();
        let mut rec = Rec { shim, next_id: 0, received: Vec::new(), session: String::new(), cwd };
        rec.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
        );
        rec.quiet(Duration::from_millis(1000));
        rec
    }

    /// `session/new` (with Coda's real-size instruction, `fixtures/coda-instruction.md`, when asked);
    /// remembers the session.
    pub fn new_session(&mut self, instruction: bool) -> String {
        let mut params = json!({"cwd": self.cwd, "mcpServers": []});
        if instruction {
            params["systemPrompt"] = coda_text::system_prompt(coda_text::INSTRUCTION);
        }
        let answer = self.call("session/new", params);
        self.session = answer["result"]["sessionId"].as_str().expect("a sessionId").to_owned();
        self.quiet(Duration::from_millis(1500));
        self.session.clone()
    }

    /// Reads one frame (answering permission requests); `None` after `wait` without one.
    fn read(&mut self, wait: Duration) -> Option<Value> {
        let line = self.shim.try_recv(wait)?;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["method"] == "session/request_permission"
            && let Some(id) = v.get("id")
        {
            let options = v.pointer("/params/options").and_then(Value::as_array).cloned().unwrap_or_default();
            let allow = options
                .iter()
                .find(|o| o["kind"] == "allow_once")
                .or(options.first())
                .and_then(|o| o["optionId"].as_str())
                .unwrap_or("allow")
                .to_owned();
            self.shim.send_json(
                &json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "selected", "optionId": allow}}}),
            );
        }
        self.received.push(v.clone());
        Some(v)
    }

    /// Sends a request and returns its answer.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.shim.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some(v) = self.read(Duration::from_millis(200))
                && v.get("id") == Some(&Value::from(id))
                && v.get("method").is_none()
            {
                return v;
            }
        }
        panic!("no answer to {method} within 120 s; stderr: {:?}", self.shim.drain_stderr());
    }

    /// Sends a request without waiting for its answer ([`Rec::answer`]); its id.
    pub fn send(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.shim.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// Sends a notification.
    pub fn notify(&mut self, method: &str, params: Value) {
        self.shim.send_json(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// The answer to request `id`, read now or already received.
    pub fn answer(&mut self, id: i64, within: Duration) -> Value {
        let is = |v: &Value| v.get("id") == Some(&Value::from(id)) && v.get("method").is_none();
        if let Some(v) = self.received.iter().find(|v| is(v)) {
            return v.clone();
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(v) = self.read(Duration::from_millis(200))
                && is(&v)
            {
                return v;
            }
        }
        panic!("no answer to request {id} within {within:?}; stderr: {:?}", self.shim.drain_stderr());
    }

    pub fn prompt(&mut self, text: &str) -> Value {
        let answer =
            self.call("session/prompt", json!({"sessionId": self.session, "prompt": [{"type": "text", "text": text}]}));
        assert!(answer.get("result").is_some(), "the prompt failed: {answer}");
        answer
    }

    /// Reads until a `_coda/wait` for which `want` holds has arrived; returns its params.
    pub fn until_wait(&mut self, within: Duration, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(p) = self.waits().into_iter().find(|p| want(p)) {
            return p;
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(v) = self.read(Duration::from_millis(200))
                && v["method"] == "_coda/wait"
                && want(&v["params"])
            {
                return v["params"].clone();
            }
        }
        panic!("no such _coda/wait within {within:?}; got {:?}", self.waits());
    }

    /// Reads until nothing arrived for `gap`.
    pub fn quiet(&mut self, gap: Duration) {
        while self.read(gap).is_some() {}
    }

    pub fn waits(&self) -> Vec<Value> {
        self.received.iter().filter(|f| f["method"] == "_coda/wait").map(|f| f["params"].clone()).collect()
    }

    pub fn finish(mut self) -> Vec<Value> {
        self.shim.close_stdin();
        let status = self.shim.wait(Duration::from_secs(30));
        assert!(status.success(), "the shim exited with {status}; stderr: {:?}", self.shim.drain_stderr());
        self.received
    }
}

/// The file log of what the shim read beside `trace` (`CODA_GROK_RECORD` and the like set to it), merged into
/// its recording by [`keep`].
pub fn files_log(trace: &Path) -> PathBuf {
    trace.with_extension("files.jsonl")
}

/// Normalises `trace` (with its [`files_log`], where there is one), replays it, and with `CODA_RECORD=1` writes it
/// to `fixtures/<agent>/<scenario>/`.
pub fn keep(agent: &str, scenario: &str, trace: &Path, root: &Path, notes: &str) {
    let by = format!("tests/{}_live.rs", agent.split('-').next().unwrap_or(agent));
    keep_by(agent, scenario, trace, root, notes, &by);
}

/// [`keep`] for a recording made by the test file `recorded_by` (named in its `meta.json`).
pub fn keep_by(agent: &str, scenario: &str, trace: &Path, root: &Path, notes: &str, recorded_by: &str) {
    let text = std::fs::read_to_string(trace).expect("the trace file");
    let files = std::fs::read_to_string(files_log(trace)).ok();
    let mut n = Normaliser::for_live_root(root);
    n.add(&live::live_root().display().to_string(), "LIVE");
    let records = replay::record(&text, files.as_deref(), &n).expect("normalise the trace");
    let out = replay::render(&records);
    let left = n.leftovers(&out);
    assert!(left.is_empty(), "{agent}/{scenario}: the recording still names {left:?}");
    let scratch = root.join("fixture").join(scenario);
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    // What the agent's fixtures keep beside them for the replays (coda-acp's Claude profile reads the Claude Agent
    // SDK's version there).
    let sdk = "node_modules/@anthropic-ai/claude-agent-sdk/package.json";
    let beside = replay_support::fixtures_root().join(agent).join(sdk);
    if beside.is_file() {
        let to = root.join("fixture").join(sdk);
        std::fs::create_dir_all(to.parent().expect("a folder")).expect("its folder");
        std::fs::copy(&beside, &to).expect("copy the SDK's manifest");
    }
    std::fs::write(scratch.join(replay::TRACE_FILE), &out).expect("write the scratch trace");
    let report = replay_support::check(agent, &scratch).unwrap_or_else(|e| panic!("{agent}/{scenario}: {e}"));
    eprintln!("{agent}/{scenario}: {} records; replayed: {report:?}", records.len());
    if std::env::var_os("CODA_RECORD").is_some() {
        let dir: PathBuf = replay_support::fixtures_root().join(agent).join(scenario);
        std::fs::create_dir_all(&dir).expect("fixture dir");
        std::fs::write(dir.join(replay::TRACE_FILE), &out).expect("write the fixture");
        let cli = live::pinned(agent.strip_prefix("acp-").unwrap_or(agent));
        let meta = json!({"agent": agent, "scenario": scenario, "cli": cli,
            "recorded_by": recorded_by, "notes": notes});
        std::fs::write(dir.join("meta.json"), format!("{meta:#}\n")).expect("write meta.json");
        eprintln!("wrote {}", dir.display());
    }
}

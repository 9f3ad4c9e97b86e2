//! Live: usage facts after `session/load` in a fresh process (section 用量里的数据), on each real CLI against the
//! fake model. One shim process makes a session, runs a turn and compacts it; a second loads it and runs a turn:
//! the first `_meta.coda` Coda gets from the second names the compaction the first made, read from what the CLI
//! keeps (Codex's rollout file, Kimi's wire, Grok's session folder, OpenCode's server), and the second turn's own
//! request.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test all facts_live:: -- --nocapture --test-threads 1` (after
//! `scripts/install-clis`); `CODA_LIVE_AGENTS` limits the agents.

use crate::support;

use support::{coda_text, fake_model, live, recorder, replay as replay_support, shim, temp};

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

/// Longest wait for one frame (a CLI starting, a compaction).
const FRAME: Duration = Duration::from_secs(120);

/// A shim process over the live CLI, driven as Coda drives it.
struct Coda {
    shim: shim::Shim,
    next: i64,
    /// The usage updates' `_meta.coda` of the session, in order.
    facts: Vec<Value>,
    session: String,
}

impl Coda {
    /// A shim over the live CLI; with `trace`, tracing into it, and what a load reads of the CLI's files logged
    /// beside it (Grok's, `CODA_GROK_RECORD`), for a recording.
    fn start(lc: &live::LiveCommand, agent: &str, trace: Option<&Path>) -> Coda {
        let mut lc = lc.clone();
        if agent == "opencode" {
            // As coda-opencode runs it by default: with its server on a port of its own.
            let port =
                std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).expect("a port").port();
            lc.args.extend(["--hostname".into(), "127.0.0.1".into(), "--port".into(), port.to_string()]);
        }
        let mut cmd = lc.shim_command(&replay_support::shim_binary(agent));
        if let Some(trace) = trace {
            cmd.arg("--trace-file").arg(trace).env("CODA_GROK_RECORD", recorder::files_log(trace));
        }
        let shim = shim::Builder::from_command(cmd).start();
        let mut coda = Coda { shim, next: 0, facts: Vec::new(), session: String::new() };
        let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
            "session": {"compaction": true}, "_meta": {"coda": {"waits": {}}}});
        let init = coda.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": caps,
            "clientInfo": {"name": "coda", "version": "1.0.0"}}),
        );
        assert!(init.get("result").is_some(), "{agent}: {init}");
        coda
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let (answer, before) = self.shim.request_within(self.next, method, params, FRAME);
        self.take(&before);
        answer
    }

    fn take(&mut self, frames: &[Value]) {
        for f in frames {
            if f["params"]["sessionId"] == self.session.as_str()
                && f["params"]["update"]["sessionUpdate"] == "usage_update"
                && let Some(coda) = f.pointer("/params/update/_meta/coda")
            {
                self.facts.push(coda.clone());
            }
        }
    }

    /// What comes within `gap` of quiet.
    fn quiet(&mut self, gap: Duration) {
        while let Some(line) = self.shim.try_recv(gap) {
            let v: Value = coda_shim::json::from_str(&line).expect("JSON");
            self.take(&[v]);
        }
    }

    fn prompt(&mut self, text: &str) {
        let answer = self.call("session/prompt", shim::prompt_params(&self.session, text));
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        self.quiet(Duration::from_millis(1500));
    }

    fn end(mut self) {
        self.shim.close_stdin();
        let status = self.shim.wait(Duration::from_secs(30));
        assert!(status.success(), "the shim exited with {status}");
    }
}

fn instant_ms(v: &Value) -> i64 {
    let t: jiff::Timestamp = v.as_str().expect("an instant").parse().expect("an instant");
    t.as_millisecond()
}

fn run(agent: &str) {
    if !live::wanted(agent, "live usage facts after a load") {
        return;
    }
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: false, dump_dir: None });
    let temp = temp::TempDir::new(&format!("coda-facts-load-{agent}"));
    let lc = live::prepare(agent, &model.base_url(), temp.path()).expect("prepare the CLI");
    let cwd = lc.workdir.display().to_string();
    let instruction = coda_text::system_prompt(coda_text::INSTRUCTION);

    // The first process: a turn, then a compaction between turns.
    let mut first = Coda::start(&lc, agent, None);
    let new = first.call("session/new", json!({"cwd": cwd, "mcpServers": [], "systemPrompt": instruction}));
    first.session = new["result"]["sessionId"].as_str().expect("a session").to_owned();
    first.quiet(Duration::from_millis(1500));
    first.prompt("hello [[text:hi]]");
    let compacted = first.call("_coda/session/compact", json!({"sessionId": first.session}));
    assert_eq!(compacted["result"]["compacted"], true, "{agent}: {compacted}");
    first.quiet(Duration::from_millis(2500));
    let live_at = first
        .facts
        .iter()
        .rev()
        .find_map(|f| f.get("compactedAt").cloned())
        .unwrap_or_else(|| panic!("{agent}: compactedAt in the first process: {:?}", first.facts));
    let session = first.session.clone();
    first.end();

    // A fresh process loads it and runs a turn: for Grok, recorded (what the load read of its session folder
    // gives the compaction's time).
    let trace = temp.path().join("load-after-compaction.jsonl");
    let mut second = Coda::start(&lc, agent, (agent == "grok").then_some(trace.as_path()));
    second.session = session.clone();
    let load = second.call(
        "session/load",
        json!({"sessionId": session, "cwd": cwd, "mcpServers": [],
        "systemPrompt": instruction}),
    );
    assert!(load.get("result").is_some(), "{agent}: {load}");
    second.quiet(Duration::from_millis(1500));
    second.prompt("again [[text:ok]]");
    let first_facts = second.facts.first().cloned().unwrap_or_else(|| panic!("{agent}: no usage facts after the load"));
    let loaded_at = first_facts.get("compactedAt").unwrap_or_else(|| panic!("{agent}: {first_facts}"));
    let off = instant_ms(loaded_at) - instant_ms(&live_at);
    eprintln!(
        "{agent}: compactedAt live {live_at}, after the load {loaded_at} ({off} ms apart); first facts {first_facts}"
    );
    assert!(off.abs() < 2000, "{agent}: the same compaction");
    // The turn after the load sent its own request, after the compaction: never the one kept from before it.
    let request = first_facts.get("lastRequestAt").unwrap_or_else(|| panic!("{agent}: {first_facts}"));
    assert!(instant_ms(request) > instant_ms(&live_at), "{agent}: the turn's own request: {first_facts}");
    second.end();
    if agent == "grok" {
        recorder::keep_by(
            agent,
            "load-after-compaction",
            &trace,
            temp.path(),
            "a session compacted by another process, loaded in a fresh one, and a turn: the first usage facts name \
             the compaction, read from the session folder's updates.jsonl (re-created by the player), and the \
             turn's own request",
            "tests/facts_live.rs",
        );
    }
}

#[test]
fn live_codex_facts_after_load() {
    run("codex");
}

#[test]
fn live_kimi_facts_after_load() {
    run("kimi");
}

#[test]
fn live_grok_facts_after_load() {
    run("grok");
}

#[test]
fn live_opencode_facts_after_load() {
    run("opencode");
}

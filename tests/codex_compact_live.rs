//! Live: coda-codex's `_coda/session/compact` and usage facts against the real codex-acp 2.6.0, offline (issue 24).
//!
//! Opt-in: `CODA_LIVE=1 CODA_LIVE_AGENTS=codex cargo test --test all codex_compact_live:: -- --nocapture` (after
//! `scripts/install-clis codex`; `scripts/live-test codex` runs it). Each scenario drives the shim as Coda does
//! (declaring `session.compaction`), checks what Coda got against the fake model's request log, prints the
//! error of `lastRequestAt`, and records its trace as a fixture (`CODA_RECORD=1` writes
//! `fixtures/codex/<scenario>/`), replayed at once through the same binary.

use crate::support;

use support::{fake_model, live, recorder, shim, temp};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use fake_model::{FakeModel, Origin, RecordedRequest};
use serde_json::{Value, json};

/// The output tokens the fake model reports for every response (its `USAGE_OUT`).
const OUTPUT_TOKENS: u64 = 5;
/// The longest `lastRequestAt` may come before the request it names (docs/codex.md gives what was measured).
const EARLY_AT_MOST: Duration = Duration::from_millis(500);

/// Coda, as far as these scenarios need it: requests without waiting, every frame kept with when it came.
struct Coda {
    shim: shim::Shim,
    next: i64,
    got: Vec<(SystemTime, Value)>,
    session: String,
}

impl Coda {
    fn start(lc: &live::LiveCommand, trace: &Path) -> Coda {
        let cmd = lc.shim_command(&shim::binary("codex"));
        let shim = shim::Builder::from_command(cmd).arg("--trace-file").arg(&trace.display().to_string()).start();
        let mut coda = Coda { shim, next: 0, got: Vec::new(), session: String::new() };
        // As Coda declares itself (section ACP 部分): session.compaction among the rest.
        let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
            "session": {"compaction": {}}, "_meta": {"coda": {"waits": {}}}});
        let init = coda.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
        );
        assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["compact"], json!({}), "{init}");
        let new = coda.call("session/new", json!({"cwd": lc.workdir.display().to_string(), "mcpServers": []}));
        coda.session = new["result"]["sessionId"].as_str().expect("a session").to_owned();
        coda.quiet(Duration::from_millis(1000));
        coda
    }

    fn send(&mut self, method: &str, params: Value) -> i64 {
        self.next += 1;
        self.shim.send_json(&json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}));
        self.next
    }

    fn read(&mut self, wait: Duration) -> Option<Value> {
        let line = self.shim.try_recv(wait)?;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        self.got.push((SystemTime::now(), v.clone()));
        Some(v)
    }

    /// Reads until the answer to `id` came.
    fn answer(&mut self, id: i64) -> Value {
        if let Some((_, v)) = self.got.iter().find(|(_, v)| v["id"] == id && v.get("method").is_none()) {
            return v.clone();
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some(v) = self.read(Duration::from_millis(200))
                && v["id"] == id
                && v.get("method").is_none()
            {
                return v;
            }
        }
        panic!("no answer to {id} within 120 s; stderr: {:?}", self.shim.drain_stderr());
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.answer(id)
    }

    fn prompt_params(&self, text: &str) -> Value {
        json!({"sessionId": self.session, "prompt": [{"type": "text", "text": text}]})
    }

    fn prompt(&mut self, text: &str) -> Value {
        let answer = self.call("session/prompt", self.prompt_params(text));
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        answer
    }

    fn compact(&mut self) -> i64 {
        self.send("_coda/session/compact", json!({"sessionId": self.session}))
    }

    fn quiet(&mut self, gap: Duration) {
        while self.read(gap).is_some() {}
    }

    /// Where in what Coda got the answer to `id` is.
    fn answer_at(&self, id: i64) -> usize {
        self.got.iter().position(|(_, v)| v["id"] == id && v.get("method").is_none()).expect("answered")
    }

    fn updates(&self, kind: &str) -> Vec<(usize, SystemTime, Value)> {
        let root = self.session.as_str();
        self.got
            .iter()
            .enumerate()
            .filter(|(_, (_, v))| v["params"]["sessionId"] == root && v["params"]["update"]["sessionUpdate"] == kind)
            .map(|(i, (at, v))| (i, *at, v["params"]["update"].clone()))
            .collect()
    }

    fn finish(mut self) -> Self {
        self.quiet(Duration::from_millis(1500));
        self.shim.close_stdin();
        let status = self.shim.wait(Duration::from_secs(30));
        assert!(status.success(), "the shim exited with {status}; stderr: {:?}", self.shim.drain_stderr());
        self
    }
}

fn instant(v: &Value) -> SystemTime {
    let ts: jiff::Timestamp = v.as_str().expect("an ISO time").parse().expect("an ISO time");
    SystemTime::from(ts)
}

/// Every root `usage_update` carries the facts; each outside a compaction names the main-thread request it
/// answers (the fake model's, of that context) within [`EARLY_AT_MOST`], and its context; those about a
/// compaction keep the last request's. Returns how early each `lastRequestAt` was, in ms.
fn check_usage(coda: &Coda, model: &FakeModel) -> Vec<u128> {
    let main: Vec<RecordedRequest> = model.model_requests().into_iter().filter(|r| r.origin == Origin::Main).collect();
    let compacting: Vec<(usize, usize)> = {
        let c = coda.updates("compaction_update");
        let starts = c.iter().filter(|(_, _, u)| u["status"] == "in_progress").map(|(i, _, _)| *i);
        let ends = c.iter().filter(|(_, _, u)| u["status"] != "in_progress").map(|(i, _, _)| *i);
        starts.zip(ends).collect()
    };
    let mut early = Vec::new();
    let updates = coda.updates("usage_update");
    assert!(!updates.is_empty());
    let mut last: Option<&Value> = None;
    for (i, came, u) in &updates {
        let facts = &u["_meta"]["coda"];
        // Updates about a compaction (the summarising request's, Codex's estimate after it) and the shim's own
        // after it name no request: the facts stay the last main-thread request's.
        let own_after = {
            let before = &coda.got[i - 1].1["params"]["update"];
            before["sessionUpdate"] == "compaction_update" && before["status"] == "completed"
        };
        if compacting.iter().any(|(s, e)| s < i && i <= e) || own_after {
            if let Some(last) = last {
                assert_eq!(facts["lastRequestAt"], last["lastRequestAt"], "{u}");
                assert_eq!(facts["contextTokens"], last["contextTokens"], "{u}");
            }
            continue;
        }
        assert_eq!(facts["contextTokens"], u["used"], "contextTokens is Codex's used: {u}");
        last = Some(facts);
        let at = instant(&facts["lastRequestAt"]);
        // The request this response answers: the latest main-thread one of that context (the next may already be
        // on its way when the update reaches Coda).
        let used = u["used"].as_u64().expect("used");
        let request = main
            .iter()
            .rfind(|r| r.at <= *came && r.input_tokens + OUTPUT_TOKENS == used)
            .unwrap_or_else(|| panic!("no main-thread request of context {used} before {u}"));
        let by = request
            .at
            .duration_since(at)
            .unwrap_or_else(|e| panic!("lastRequestAt after request #{}: {e:?}", request.seq));
        assert!(by <= EARLY_AT_MOST, "lastRequestAt {by:?} before request #{}", request.seq);
        early.push(by.as_millis());
    }
    early
}

struct Run {
    model: FakeModel,
    _temp: temp::TempDir,
    root: PathBuf,
    lc: live::LiveCommand,
    trace: PathBuf,
}

fn prepare(scenario: &str, auto_compact_limit: Option<u64>) -> Run {
    let model = FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new(&format!("coda-{scenario}"));
    let root = temp.path().to_path_buf();
    let lc = live::prepare("codex", &model.base_url(), &root).expect("prepare the CLI");
    if let Some(limit) = auto_compact_limit {
        // Codex compacts by itself once a response's total tokens pass this (its `model_auto_compact_token_limit`).
        let config = lc.home.join(".codex/config.toml");
        let text = std::fs::read_to_string(&config).expect("the rig's Codex config");
        std::fs::write(&config, format!("model_auto_compact_token_limit = {limit}\n{text}")).expect("write it");
    }
    std::fs::create_dir_all(root.join("traces")).unwrap();
    let trace = root.join("traces").join(format!("{scenario}.jsonl"));
    Run { model, _temp: temp, root, lc, trace }
}

fn report(scenario: &str, early: &[u128]) {
    let max = early.iter().max().copied().unwrap_or(0);
    eprintln!("{scenario}: lastRequestAt early by {early:?} ms (max {max} ms) against the fake model's log");
}

#[test]
fn live_codex_compact_between_turns() {
    if !live::wanted("codex", "live compaction") {
        return;
    }
    let run = prepare("compact-between-turns", None);
    let mut coda = Coda::start(&run.lc, &run.trace);
    coda.prompt("[[sh:seq 1 3000]]");
    coda.quiet(Duration::from_millis(1500));
    let before_compact = run.model.model_requests();
    let biggest = before_compact.iter().filter(|r| r.origin == Origin::Main).map(|r| r.input_tokens).max().unwrap();
    // Compaction asked for, and a prompt sent while it runs: it waits.
    let compact = coda.compact();
    let prompt = coda.send("session/prompt", coda.prompt_params("after [[text:done]]"));
    let answer = coda.answer(compact);
    let result = &answer["result"];
    assert_eq!(result["compacted"], true, "{answer}");
    let before = result["before"].as_u64().unwrap();
    // No after: Codex says the compacted context only as its own estimate, not in the measure of before.
    assert!(result.get("after").is_none(), "{answer}");
    assert_eq!(coda.answer(prompt)["result"]["stopReason"], "end_turn");
    assert!(coda.answer_at(compact) < coda.answer_at(prompt));
    // The fake model: the summarising request, then the prompt's, which is smaller than the last one before.
    let requests = run.model.model_requests();
    let new = &requests[before_compact.len()..];
    assert!(new[0].origin == Origin::Side && !new[0].body.to_string().contains("after [[text:done]]"), "{new:?}");
    let next = new.iter().find(|r| r.origin == Origin::Main).expect("the prompt's request");
    assert!(next.user_text().contains("after [[text:done]]"));
    eprintln!("compact-between-turns: before {before} tokens; next request {} < {biggest}", next.input_tokens);
    assert!(next.input_tokens < biggest, "the next request is smaller ({} vs {biggest})", next.input_tokens);
    // Coda saw the compaction (it declared session.compaction) and no turn of the shim's.
    let statuses: Vec<Value> = coda.updates("compaction_update").iter().map(|(_, _, u)| u["status"].clone()).collect();
    assert_eq!(statuses, [json!("in_progress"), json!("completed")]);
    let compacted = coda.updates("usage_update").last().unwrap().2["_meta"]["coda"]["compactedAt"].clone();
    assert!(compacted.is_string(), "after a compaction every update carries compactedAt");

    // During a turn (held at a permission request, so that the replay keeps the order): refused at once.
    let write = r#"[[tool:exec_command|{"cmd":"touch made.txt","sandbox_permissions":"require_escalated","justification":"needs to write"}]]"#;
    let turn = coda.send("session/prompt", coda.prompt_params(write));
    let asked = loop {
        let v = coda.read(Duration::from_secs(60)).expect("a permission request");
        if v["method"] == "session/request_permission" {
            break v;
        }
    };
    let refused = coda.compact();
    let answer = coda.answer(refused);
    assert_eq!(answer["result"]["compacted"], false, "{answer}");
    assert!(answer["result"]["reason"].as_str().unwrap().contains("turn is running"));
    coda.shim.send_json(&json!({"jsonrpc": "2.0", "id": asked["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}}));
    assert_eq!(coda.answer(turn)["result"]["stopReason"], "end_turn");
    assert!(coda.answer_at(refused) < coda.answer_at(turn));
    let coda = coda.finish();
    let early = check_usage(&coda, &run.model);
    report("compact-between-turns", &early);
    recorder::keep(
        "codex",
        "compact-between-turns",
        &run.trace,
        &run.root,
        "a turn with a long tool output; \
        _coda/session/compact between turns with a prompt sent during it; _coda/session/compact during a turn \
        (at its permission request)",
    );
}

#[test]
fn live_codex_compacts_by_itself_inside_a_turn() {
    if !live::wanted("codex", "live automatic compaction") {
        return;
    }
    let run = prepare("compact-automatic", Some(12_000));
    let mut coda = Coda::start(&run.lc, &run.trace);
    coda.prompt("hello [[text:hi]]");
    coda.prompt("[[sh:seq 1 3000]]");
    coda.prompt("again [[text:ok]]");
    let coda = coda.finish();
    let compactions = coda.updates("compaction_update");
    assert_eq!(compactions.len(), 2, "one automatic compaction: {compactions:?}");
    assert_eq!(compactions[1].2["status"], "completed");
    // The shim's own update right after it, and every later one, carry compactedAt.
    let at = compactions[1].0;
    let own = &coda.got[at + 1].1["params"]["update"];
    assert_eq!(own["sessionUpdate"], "usage_update");
    let compacted = own["_meta"]["coda"]["compactedAt"].clone();
    assert!(compacted.is_string());
    for (i, _, u) in coda.updates("usage_update") {
        if i > at {
            assert_eq!(u["_meta"]["coda"]["compactedAt"], compacted);
        }
    }
    let early = check_usage(&coda, &run.model);
    report("compact-automatic", &early);
    recorder::keep(
        "codex",
        "compact-automatic",
        &run.trace,
        &run.root,
        "model_auto_compact_token_limit = 12000: \
        Codex compacts by itself after a tool call, inside the turn",
    );
}

#[test]
fn live_codex_usage_facts_over_a_turn_with_tool_calls() {
    if !live::wanted("codex", "live usage facts") {
        return;
    }
    let run = prepare("usage-tool-calls", None);
    let mut coda = Coda::start(&run.lc, &run.trace);
    coda.prompt("[[sh:echo one]] [[sh:echo two]]");
    coda.prompt("[[sh:echo three]]");
    let coda = coda.finish();
    let early = check_usage(&coda, &run.model);
    assert!(early.len() >= 4, "an update per main-thread response: {early:?}");
    report("usage-tool-calls", &early);
    recorder::keep(
        "codex",
        "usage-tool-calls",
        &run.trace,
        &run.root,
        "two turns with tool calls (two in parallel, \
        then one): usage facts on every root usage_update",
    );
}

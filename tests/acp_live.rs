//! `coda-acp` with its built-in profiles over the real Qwen Code, Gemini CLI and Claude Agent ACP, offline against
//! the fake model server: the instruction, a plain turn, a tool call with permission, cancel; and for Claude Agent
//! ACP a foreground subagent and a background one stopped with `_coda/wait/stop`.
//!
//! Opt-in: `CODA_LIVE=1 CODA_LIVE_AGENTS=qwen cargo test --test all acp_live:: -- --nocapture` (after
//! `scripts/install-clis qwen gemini claude` and `cargo build --examples`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::recorder::Rec;
use super::support::{coda_text, live, temp};
use live_rig::fake_model;

/// What each agent's `agentInfo` says through coda-acp.
fn expected_info(agent: &str) -> Value {
    match agent {
        "qwen" => json!({"name": "qwen-code", "title": "Qwen Code", "version": "0.24.4"}),
        "gemini" => json!({"name": "gemini-cli", "title": "Gemini CLI", "version": "0.61.0"}),
        // The SDK's Claude Code, not the adapter's own package.
        "claude" => json!({"name": "claude-code", "version": "2.1.318"}),
        other => panic!("no expectation for {other}"),
    }
}

/// A live session of `coda-acp --profile <agent>` with Coda's instruction; the model, the folder, the client.
fn start(agent: &str, name: &str) -> (fake_model::FakeModel, temp::TempDir, live::LiveCommand, Rec) {
    start_env(agent, name, &[])
}

/// [`start`], with `env` added to the agent's environment.
fn start_env(
    agent: &str,
    name: &str,
    env: &[(&str, &str)],
) -> (fake_model::FakeModel, temp::TempDir, live::LiveCommand, Rec) {
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new(name);
    let root: PathBuf = temp.path().to_path_buf();
    let mut lc = live::prepare(agent, &model.base_url(), &root).unwrap_or_else(|e| panic!("prepare {agent}: {e}"));
    lc.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let rec = Rec::start_acp(&lc, &root.join("trace.jsonl"));
    (model, temp, lc, rec)
}

/// How often Coda's instruction (its marker) is in the text of `body`.
fn marks(body: &Value) -> usize {
    body.to_string().matches(coda_text::MARK).count()
}

fn check_basics(agent: &str) {
    let (model, _temp, lc, mut rec) = start(agent, &format!("coda-acp-{agent}"));
    let init = rec.received.iter().find(|v| v["id"] == 0).cloned().expect("the initialize answer");
    assert_eq!(init["result"]["agentInfo"], expected_info(agent), "{init}");
    let caps = &init["result"]["agentCapabilities"];
    assert!(caps.pointer("/sessionCapabilities/systemPrompt").is_some_and(Value::is_object), "{caps}");
    assert_eq!(caps.pointer("/_meta/coda/waits"), Some(&json!({})), "{caps}");

    // The instruction and a plain turn: the model gets the instruction once in each request of the session.
    rec.new_session(true);
    let asked = model.model_requests().len();
    let answer = rec.prompt(coda_text::FIRST_PROMPT);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let main: Vec<_> =
        model.model_requests()[asked..].iter().filter(|r| r.origin != fake_model::Origin::Side).cloned().collect();
    assert!(!main.is_empty(), "the prompt reached the model");
    for r in &main {
        assert_eq!(marks(&r.body), 1, "request #{} carries the instruction once", r.seq);
    }

    // A tool call the agent asks permission for (the client allows it once).
    let asked_permission = rec.received.iter().filter(|v| v["method"] == "session/request_permission").count();
    let answer = rec.prompt("Make the file. [[sh:touch made-by-agent.txt]]");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let permissions = rec.received.iter().filter(|v| v["method"] == "session/request_permission").count();
    assert_eq!(permissions, asked_permission + 1, "one permission request for the command");
    assert!(lc.workdir.join("made-by-agent.txt").is_file(), "the command ran");

    // Cancel: the turn ends `cancelled` at once, and the next one runs.
    let id = rec.send(
        "session/prompt",
        json!({"sessionId": rec.session, "prompt": [{"type": "text", "text": "Wait. [[delay:15000]]"}]}),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let delayed =
        |m: &fake_model::FakeModel| m.model_requests().iter().any(|r| r.user_text().contains("[[delay:15000]]"));
    while !delayed(&model) {
        assert!(Instant::now() < deadline, "the delayed request never reached the model");
        rec.quiet(Duration::from_millis(200));
    }
    let cancelled_at = Instant::now();
    rec.notify("session/cancel", json!({"sessionId": rec.session}));
    let answer = rec.answer(id, Duration::from_secs(10));
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    assert!(cancelled_at.elapsed() < Duration::from_secs(10));
    let answer = rec.prompt("And now?");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");

    // Qwen titles sessions by their first prompt: the list shows no part of the instruction.
    if init.pointer("/result/agentCapabilities/sessionCapabilities/list").is_some() {
        let list = rec.call("session/list", json!({"cwd": rec.cwd}));
        assert!(list.get("result").is_some(), "{list}");
    }
    rec.quiet(Duration::from_millis(1500));
    let received = rec.finish();
    for frame in &received {
        assert_eq!(coda_text::leak(frame), None, "a client frame shows the instruction: {frame}");
    }
}

#[test]
fn live_acp_qwen_basics() {
    if live::wanted("qwen", "coda-acp on Qwen Code") {
        check_basics("qwen");
    }
}

#[test]
fn live_acp_gemini_basics() {
    if live::wanted("gemini", "coda-acp on Gemini CLI") {
        check_basics("gemini");
    }
}

#[test]
fn live_acp_claude_basics() {
    if live::wanted("claude", "coda-acp on Claude Agent ACP") {
        check_basics("claude");
    }
}

#[test]
fn live_acp_claude_subagents() {
    if live::wanted("claude", "coda-acp subagents on Claude Agent ACP") {
        let notes = "a foreground subagent as a wait with its child's traffic; a background one stopped by Coda";
        recorded("claude", "subagents", notes, claude_subagents);
    }
}

fn claude_subagents(model: &fake_model::FakeModel, rec: &mut Rec) {
    let session = rec.new_session(true);

    // A foreground subagent: a wait with its child session, the child's task and output as the child's.
    let answer = rec.prompt("Delegate. [[subagent-fg:[[text:the child is done]]]]");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let started = rec.until_wait(Duration::from_secs(5), |w| w["state"] == "waiting");
    assert_eq!(started["sessionId"], session.as_str());
    assert_eq!(started["kind"], "subagent");
    let child = started["childSessionId"].as_str().expect("a child session").to_owned();
    assert_eq!(started["stoppable"], true, "Claude Agent ACP grants cancel");
    let wait_id = started["waitId"].as_str().expect("a waitId").to_owned();
    rec.until_wait(Duration::from_secs(10), |w| w["waitId"] == wait_id.as_str() && w["state"] == "done");
    let models: Vec<Value> = rec
        .waits()
        .iter()
        .filter(|w| w["waitId"] == wait_id.as_str())
        .filter_map(|w| w.get("model").cloned())
        .collect();
    assert_eq!(models, [json!(live::MODEL)], "the child's model, from its config_option_update");
    let of_child = |v: &Value, kind: &str| {
        v["method"] == "session/update"
            && v.pointer("/params/sessionId") == Some(&json!(child))
            && v.pointer("/params/update/sessionUpdate") == Some(&json!(kind))
    };
    let task = rec.received.iter().find(|v| of_child(v, "user_message_chunk")).expect("the child's task");
    assert_eq!(task.pointer("/params/update/content/text"), Some(&json!("[[text:the child is done]]")));
    let said = rec.received.iter().filter(|v| of_child(v, "agent_message_chunk"));
    assert!(said.clone().any(|v| v.pointer("/params/update/content/text") == Some(&json!("the child is done"))));
    let wait_at = rec.received.iter().position(|v| v["method"] == "_coda/wait").expect("the wait");
    let first_child = rec.received.iter().position(|v| v.pointer("/params/sessionId") == Some(&json!(child)));
    assert!(first_child.is_some_and(|at| at > wait_at), "the wait names the child before any of its traffic");
    assert!(!rec.received.iter().any(|v| v.pointer("/params/update/sessionUpdate") == Some(&json!("subagent_update"))));

    // A background subagent, stopped by Coda. Claude Agent ACP answers the turn only once its background
    // subagents ended (seen live with 0.101.0), so the prompt's answer is read after the stop.
    let turn = rec.send(
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text",
            "text": "In the background. [[subagent:[[delay:30000]][[text:never]]]]"}]}),
    );
    let bg = rec.until_wait(Duration::from_secs(20), |w| w["state"] == "waiting" && w["waitId"] != wait_id.as_str());
    let bg_id = bg["waitId"].as_str().expect("a waitId").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The child's own request (its task is the marker alone; the parent's prompt holds it too).
    while !model.model_requests().iter().any(|r| r.user_text().starts_with("[[delay:30000]]")) {
        assert!(Instant::now() < deadline, "the child never asked the model");
        rec.quiet(Duration::from_millis(200));
    }
    let stopped = rec.call("_coda/wait/stop", json!({"sessionId": session, "waitId": bg_id}));
    assert_eq!(stopped["result"], json!({}), "{stopped}");
    let end = rec.until_wait(Duration::from_secs(20), |w| {
        w["waitId"] == bg_id.as_str() && w.get("state").is_some_and(|s| s != "waiting")
    });
    assert_eq!(end["state"], "cancelled", "{end}; waits: {:?}", rec.waits());
    let answer = rec.answer(turn, Duration::from_secs(20));
    assert!(answer.get("result").is_some(), "{answer}");
}

/// Records one scenario of `coda-acp --profile <agent>` as `fixtures/acp-<agent>/<scenario>` (with
/// `CODA_RECORD=1`; always replayed through coda-acp at once): `run` drives the session.
fn recorded(agent: &str, scenario: &str, notes: &str, run: impl FnOnce(&fake_model::FakeModel, &mut Rec)) {
    recorded_env(agent, scenario, notes, &[], run)
}

/// [`recorded`], with `env` added to the agent's environment.
fn recorded_env(
    agent: &str,
    scenario: &str,
    notes: &str,
    env: &[(&str, &str)],
    run: impl FnOnce(&fake_model::FakeModel, &mut Rec),
) {
    let (model, temp, _lc, mut rec) = start_env(agent, &format!("coda-acp-{agent}-{scenario}"), env);
    run(&model, &mut rec);
    rec.quiet(Duration::from_millis(1500));
    for frame in rec.finish() {
        assert_eq!(coda_text::leak(&frame), None, "a client frame shows the instruction: {frame}");
    }
    let root = temp.path().to_path_buf();
    super::support::recorder::keep(&format!("acp-{agent}"), scenario, &root.join("trace.jsonl"), &root, notes);
}

/// The base scenarios of each agent: the instruction with a plain turn, a tool call with permission, cancel.
fn record_base(agent: &str) {
    recorded(agent, "instruction-plain-turn", "Coda's instruction, then a plain turn", |_, rec| {
        rec.new_session(true);
        let answer = rec.prompt(coda_text::FIRST_PROMPT);
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    });
    recorded(agent, "tool-permission", "a shell command the agent asks permission for, allowed once", |_, rec| {
        rec.new_session(true);
        let answer = rec.prompt("Make the file. [[sh:touch made-by-agent.txt]]");
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        assert!(rec.received.iter().any(|v| v["method"] == "session/request_permission"), "asked");
    });
    recorded(agent, "cancel", "a turn cancelled while the model answers, then the next turn", |model, rec| {
        rec.new_session(true);
        let id = rec.send(
            "session/prompt",
            json!({"sessionId": rec.session, "prompt": [{"type": "text", "text": "Wait. [[delay:15000]]"}]}),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while !model.model_requests().iter().any(|r| r.user_text().contains("[[delay:15000]]")) {
            assert!(Instant::now() < deadline, "the delayed request never reached the model");
            rec.quiet(Duration::from_millis(200));
        }
        rec.notify("session/cancel", json!({"sessionId": rec.session}));
        let answer = rec.answer(id, Duration::from_secs(10));
        assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
        let answer = rec.prompt("And now?");
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    });
}

#[test]
fn live_acp_qwen_record() {
    if live::wanted("qwen", "coda-acp fixtures of Qwen Code") {
        record_base("qwen");
    }
}

#[test]
fn live_acp_gemini_record() {
    if live::wanted("gemini", "coda-acp fixtures of Gemini CLI") {
        record_base("gemini");
    }
}

#[test]
fn live_acp_claude_record() {
    if live::wanted("claude", "coda-acp fixtures of Claude Agent ACP") {
        record_base("claude");
    }
}

#[test]
fn live_acp_gemini_quota() {
    if live::wanted("gemini", "coda-acp on Gemini CLI's exhausted daily quota") {
        let notes = "an upstream 429 RESOURCE_EXHAUSTED with a per-day quota: Gemini CLI answers at once";
        recorded("gemini", "upstream-quota", notes, |_, rec| {
            rec.new_session(true);
            let answer = rec.call(
                "session/prompt",
                json!({"sessionId": rec.session, "prompt": [{"type": "text", "text": "Go. [[error:429-usage]]"}]}),
            );
            assert_eq!(answer["error"]["code"], -32603, "{answer}");
            assert_eq!(answer["error"]["message"], "You have exhausted your daily quota on this model.", "{answer}");
            assert_eq!(answer["error"]["data"]["gemini"]["code"], 429, "{answer}");
            assert_eq!(failure_of(&answer), json!({"kind": "quota_exhausted"}), "{answer}");
        });
    }
}

/// `_meta.coda.failure` of an error answer.
fn failure_of(answer: &Value) -> Value {
    answer.pointer("/error/data/_meta/coda/failure").cloned().unwrap_or(Value::Null)
}

/// A prompt the fake model fails with `marker`; its answer and how long it took (within `within`).
fn failed_turn(rec: &mut Rec, marker: &str, within: Duration) -> (Value, Duration) {
    rec.new_session(true);
    let asked = Instant::now();
    let id = rec.send(
        "session/prompt",
        json!({"sessionId": rec.session, "prompt": [{"type": "text", "text": format!("Go. {marker}")}]}),
    );
    let answer = rec.answer(id, within);
    (answer, asked.elapsed())
}

/// Gemini CLI's 503: it retries by itself (not following `Retry-After`), then answers with the status. Takes
/// minutes: `CODA_LIVE_SLOW=1` too.
#[test]
fn live_acp_gemini_503() {
    if live::wanted("gemini", "coda-acp on Gemini CLI's 503") && std::env::var_os("CODA_LIVE_SLOW").is_some() {
        let (model, _temp, _lc, mut rec) = start("gemini", "coda-acp-gemini-503");
        let (answer, took) = failed_turn(&mut rec, "[[error:503~1]]", Duration::from_secs(600));
        let requests = model.model_requests().len();
        eprintln!("gemini 503: answered after {took:?}, {requests} model requests: {answer}");
        assert_eq!(answer["error"]["code"], -32603, "{answer}");
        assert_eq!(answer["error"]["data"]["gemini"]["code"], 503, "{answer}");
        assert_eq!(failure_of(&answer), json!({"kind": "service_unavailable", "input": "accepted"}), "{answer}");
        rec.finish();
    }
}

/// Claude Agent ACP answers a failed turn once Claude Code's retries are over, with the SDK's `errorKind`. Claude
/// Code retries 10 times by default (minutes); its profile sets `CLAUDE_CODE_MAX_RETRIES` (6 retries, back-off
/// doubling from 0.5 s): with nothing set here, the turn is answered within Coda's minute.
#[test]
fn live_acp_claude_upstream() {
    if live::wanted("claude", "coda-acp on Claude Agent ACP's upstream errors") {
        let env: [(&str, &str); 0] = [];
        // The SDK says `rate_limit` for a 429 (a usage limit too), `server_error` for a 503, whose status Claude
        // Code's message quotes: both `service_unavailable`.
        for (scenario, marker, kind, notes) in [
            ("upstream-quota", "[[error:429-usage]]", "rate_limit", "an upstream 429 rate_limit_error (a usage limit)"),
            ("upstream-503", "[[error:503~1]]", "server_error", "an upstream 503 api_error with Retry-After: 1"),
        ] {
            let notes = format!("{notes}, with Claude Code's retries bounded by its profile");
            recorded_env("claude", scenario, &notes, &env, |model, rec| {
                let (answer, took) = failed_turn(rec, marker, coda_shim::coda::failure::RETRY_PATIENCE);
                let failed = |r: &&fake_model::RecordedRequest| r.reply.starts_with("error");
                let requests = model.model_requests().iter().filter(failed).count();
                eprintln!("claude {marker}: answered after {took:?}, {requests} model requests: {answer}");
                assert_eq!(requests, 7, "the first request and the profile's 6 retries");
                assert_eq!(answer["error"]["code"], -32603, "{answer}");
                assert_eq!(answer["error"]["data"]["errorKind"], kind, "{answer}");
                assert_eq!(
                    failure_of(&answer),
                    json!({"kind": "service_unavailable", "input": "accepted"}),
                    "{answer}"
                );
            });
        }
    }
}

/// Qwen Code retries a 429 or a 503 itself, silently, as its settings say (`model.generationConfig`: 10 retries
/// waiting from 60 s up to 5 min by default); then it answers with the upstream's status. Its profile bounds them
/// in its system defaults layer (`defaults-file`): with the user's settings as the rig writes them (no retry
/// settings), the turn is answered within Coda's minute.
#[test]
fn live_acp_qwen_upstream() {
    if live::wanted("qwen", "coda-acp on Qwen Code's upstream errors") {
        let env: [(&str, &str); 0] = [];
        for (scenario, marker, notes) in [
            ("upstream-quota", "[[error:429-usage]]", "an upstream 429 insufficient_quota"),
            ("upstream-503", "[[error:503~1]]", "an upstream 503 with Retry-After: 1"),
        ] {
            let notes = format!("{notes}, with Qwen's retries bounded by its profile's defaults-file");
            recorded_env("qwen", scenario, &notes, &env, |model, rec| {
                let (answer, took) = failed_turn(rec, marker, coda_shim::coda::failure::RETRY_PATIENCE);
                let requests = model.model_requests().iter().filter(|r| r.user_text().contains(marker)).count();
                eprintln!("qwen {marker}: answered after {took:?}, {requests} model requests: {answer}");
                if marker.contains("429") {
                    assert_eq!(answer["error"]["code"], 429, "{answer}");
                    assert_eq!(failure_of(&answer), Value::Null, "a 429 says no kind: {answer}");
                } else {
                    assert_eq!(answer["error"]["code"], -32603, "{answer}");
                    assert_eq!(answer["error"]["data"]["qwen"]["status"], 503, "{answer}");
                    assert_eq!(
                        failure_of(&answer),
                        json!({"kind": "service_unavailable", "input": "accepted"}),
                        "{answer}"
                    );
                }
            });
        }
    }
}

/// Coda's compaction between turns through the agent's own command: compacted, with the agent's counts.
fn compacts(agent: &str) {
    recorded(agent, "compact-between-turns", "Coda's _coda/session/compact after a turn", |_, rec| {
        let init = rec.received.iter().find(|v| v["id"] == 0).cloned().expect("initialize");
        assert_eq!(init.pointer("/result/agentCapabilities/_meta/coda/compact"), Some(&json!({})), "{init}");
        rec.new_session(true);
        rec.prompt(coda_text::FIRST_PROMPT);
        let answer = rec.call("_coda/session/compact", json!({"sessionId": rec.session}));
        let result = &answer["result"];
        assert_eq!(result["compacted"], true, "{answer}");
        assert!(result["before"].as_u64().is_some(), "{answer}");
        rec.quiet(Duration::from_millis(1500));
        let compacted = facts(rec).last().cloned().unwrap_or(Value::Null);
        let at = compacted["compactedAt"].as_str().unwrap_or_else(|| panic!("compactedAt: {compacted}")).to_owned();
        // The shim's own prompt is no turn of Coda's: nothing of it reaches Coda but compaction and usage.
        let answer = rec.prompt("After the compaction.");
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        let after = facts(rec).last().cloned().unwrap_or(Value::Null);
        assert_eq!(after["compactedAt"], at.as_str(), "the same compaction: {after}");
    });
}

/// The `_meta.coda` of every `usage_update` of the session Coda got, in order; none is `{}`.
fn facts(rec: &Rec) -> Vec<Value> {
    let updates = rec.received.iter().filter(|v| {
        v.pointer("/params/update/sessionUpdate") == Some(&json!("usage_update"))
            && v.pointer("/params/sessionId") == Some(&json!(rec.session))
    });
    let facts: Vec<Value> = updates.filter_map(|v| v.pointer("/params/update/_meta/coda").cloned()).collect();
    assert!(!facts.contains(&json!({})), "never an empty object");
    facts
}

/// Qwen Code's facts of a plain turn: its request's context (its `used`), and when the request began.
#[test]
fn live_acp_qwen_usage() {
    if live::wanted("qwen", "coda-acp usage facts on Qwen Code") {
        recorded("qwen", "usage-facts", "two turns, the second with a command: the facts of each", |model, rec| {
            rec.new_session(true);
            for text in [coda_text::FIRST_PROMPT, "Run it. [[sh:echo hi]]"] {
                // A millisecond early: the fact is cut to milliseconds.
                let asked = std::time::SystemTime::now() - Duration::from_millis(1);
                let answer = rec.prompt(text);
                assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
                rec.quiet(Duration::from_millis(500));
                let last = rec
                    .received
                    .iter()
                    .rev()
                    .find(|v| v.pointer("/params/update/sessionUpdate") == Some(&json!("usage_update")))
                    .cloned()
                    .expect("a usage update");
                let coda = &last["params"]["update"]["_meta"]["coda"];
                assert_eq!(coda["contextTokens"], last["params"]["update"]["used"], "{last}");
                let at: jiff::Timestamp =
                    coda["lastRequestAt"].as_str().expect("lastRequestAt").parse().expect("a time");
                let asked = jiff::Timestamp::try_from(asked).expect("a time");
                let now = jiff::Timestamp::now();
                assert!(at >= asked && at <= now, "{at} between {asked} and {now}");
                eprintln!("qwen facts: {coda}; {} model requests", model.model_requests().len());
            }
        });
    }
}

#[test]
fn live_acp_qwen_compacts() {
    if live::wanted("qwen", "coda-acp compaction on Qwen Code") {
        compacts("qwen");
    }
}

#[test]
fn live_acp_claude_compacts() {
    if live::wanted("claude", "coda-acp compaction on Claude Agent ACP") {
        compacts("claude");
    }
}

/// Coda steers into its running turn: `injected`, the model's next request carries the message, the turn ends.
fn steers(agent: &str, prompt: &str, ready: fn(&fake_model::FakeModel, &Rec) -> bool) {
    recorded(agent, "steering", "a steering message during Coda's turn, then one between turns", |model, rec| {
        let init = rec.received.iter().find(|v| v["id"] == 0).cloned().expect("initialize");
        assert_eq!(init.pointer("/result/_meta/steering/supported"), Some(&json!(true)), "{init}");
        rec.new_session(true);
        let turn =
            rec.send("session/prompt", json!({"sessionId": rec.session, "prompt": [{"type": "text", "text": prompt}]}));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready(model, rec) {
            assert!(Instant::now() < deadline, "the turn never got to the point to steer at");
            rec.quiet(Duration::from_millis(100));
        }
        let text = "STEER-51: 先别改测试, look at the build only";
        let steer = rec.send(
            "_session/steering",
            json!({"sessionId": rec.session, "prompt": [{"type": "text", "text": text}],
                "_meta": {"steering": {"idleBehavior": "promptRequired"}}}),
        );
        let answer = rec.answer(steer, Duration::from_secs(60));
        assert_eq!(answer["result"], json!({"outcome": "injected"}), "{answer}");
        let done = rec.answer(turn, Duration::from_secs(60));
        assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
        let at = |id: i64| rec.received.iter().position(|v| v["id"] == id && v.get("method").is_none());
        assert!(at(steer) < at(turn), "the steering answer comes first");
        assert!(
            model.model_requests().iter().any(|r| r.body.to_string().contains("STEER-51")),
            "the model got the message in Coda's turn"
        );
        let idle = rec.call(
            "_session/steering",
            json!({"sessionId": rec.session, "prompt": [{"type": "text", "text": "between turns"}],
                "_meta": {"steering": {"idleBehavior": "promptRequired"}}}),
        );
        assert_eq!(idle["result"], json!({"outcome": "promptRequired", "reason": "noRunningTurn"}), "{idle}");
    });
}

#[test]
fn live_acp_qwen_steers() {
    if live::wanted("qwen", "coda-acp steering on Qwen Code") {
        // Qwen asks for queued messages after a tool batch: steer while the command runs.
        steers("qwen", "Wait for it. [[sh:for i in 1 2 3; do sleep 1; done; echo slept]]", |_, rec| {
            rec.received.iter().any(|v| v.pointer("/params/update/sessionUpdate") == Some(&json!("tool_call")))
        });
    }
}

#[test]
fn live_acp_claude_steers() {
    if live::wanted("claude", "coda-acp steering on Claude Agent ACP") {
        // Claude Code abandons the running model request and asks again with the message.
        steers("claude", "Take your time. [[delay:8000]]", |model, _| {
            model.model_requests().iter().any(|r| r.user_text().contains("[[delay:8000]]"))
        });
    }
}

/// Qwen Code's background shell command: a task `waiting`, `handling` in Qwen's own turn for it, then `done`.
#[test]
fn live_acp_qwen_background() {
    if live::wanted("qwen", "coda-acp on Qwen Code's background command") {
        let notes = "a background shell command: a task, handled in Qwen's own turn when it ends, then done";
        recorded("qwen", "background-task", notes, |model, rec| {
            rec.new_session(true);
            let answer = rec.prompt("Start it. [[bg:sleep 3; echo done]]");
            assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
            let waiting = rec.until_wait(Duration::from_secs(5), |w| w["state"] == "waiting");
            assert_eq!(waiting["kind"], "task", "{waiting}");
            assert_eq!(waiting["title"], "sleep 3; echo done", "{waiting}");
            assert_eq!(waiting["stoppable"], true, "{waiting}");
            assert!(waiting["outputFile"].as_str().is_some_and(|f| f.ends_with(".output")), "{waiting}");
            let id = waiting["waitId"].as_str().expect("a waitId").to_owned();
            let asked = model.model_requests().len();
            rec.until_wait(Duration::from_secs(30), |w| w["waitId"] == id.as_str() && w["state"] == "handling");
            let done = rec.until_wait(Duration::from_secs(30), |w| {
                w["waitId"] == id.as_str() && w.get("state").is_some_and(|s| s != "handling" && s != "waiting")
            });
            assert_eq!(done["state"], "done", "{done}");
            assert!(model.model_requests().len() > asked, "Qwen's own turn asked the model");
            assert!(!rec.received.iter().any(|v| v["method"] == "_qwencode/start_turn"), "answered by coda-acp");
            eprintln!("qwen background: waits {:?}", rec.waits());
        });
    }
}

/// A background `agent` call of Qwen Code's prompt: the model asks for it with these arguments.
fn qwen_agent(prompt: &str) -> String {
    let args = json!({"description": "helper task", "prompt": prompt, "subagent_type": "general-purpose",
        "run_in_background": true});
    format!("Delegate. [[tool:agent|{args}]]")
}

/// Qwen Code's background agents: a `subagent` wait, `handling` in Qwen's own turn for its result, then `done`;
/// another one and a background command stopped by Coda through Qwen's own cancel.
#[test]
fn live_acp_qwen_background_agent() {
    if live::wanted("qwen", "coda-acp on Qwen Code's background agents") {
        let notes = "a background agent: handled in Qwen's own turn, done; another, and a background command, stopped";
        recorded("qwen", "background-agent", notes, |model, rec| {
            rec.new_session(true);
            let started = Instant::now();
            let answer = rec.prompt(&qwen_agent("[[delay:3000]][[text:the helper found it]]"));
            assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
            let waiting = rec.until_wait(Duration::from_secs(5), |w| w["state"] == "waiting");
            assert_eq!(waiting["kind"], "subagent", "{waiting}");
            assert_eq!(waiting["title"], "helper task", "{waiting}");
            assert_eq!(waiting["stoppable"], true, "{waiting}");
            assert!(waiting["outputFile"].as_str().is_some_and(|f| f.ends_with(".jsonl")), "{waiting}");
            let id = waiting["waitId"].as_str().expect("a waitId").to_owned();
            rec.until_wait(Duration::from_secs(30), |w| w["waitId"] == id.as_str() && w["state"] == "handling");
            let done = rec.until_wait(Duration::from_secs(30), |w| {
                w["waitId"] == id.as_str() && w.get("state").is_some_and(|s| s != "handling" && s != "waiting")
            });
            assert_eq!(done["state"], "done", "{done}");
            assert!(!rec.received.iter().any(|v| v["method"] == "_qwencode/start_turn"), "answered by coda-acp");
            eprintln!("qwen background agent: done after {:?}", started.elapsed());

            // Stopped by Coda: an agent still waiting for the model, then a background command.
            for (prompt, kind) in [
                (qwen_agent("[[delay:60000]][[text:never]]"), "subagent"),
                ("Start it. [[bg:sleep 60]]".into(), "task"),
            ] {
                let before: Vec<String> =
                    rec.waits().iter().filter_map(|w| w["waitId"].as_str().map(str::to_owned)).collect();
                let answer = rec.prompt(&prompt);
                assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
                let waiting = rec.until_wait(Duration::from_secs(5), |w| {
                    w["state"] == "waiting" && !before.iter().any(|b| w["waitId"] == b.as_str())
                });
                assert_eq!(waiting["kind"], kind, "{waiting}");
                let id = waiting["waitId"].as_str().expect("a waitId").to_owned();
                let asked = Instant::now();
                let stopped = rec.call("_coda/wait/stop", json!({"sessionId": rec.session, "waitId": id}));
                assert_eq!(stopped["result"], json!({}), "{stopped}");
                // Qwen runs a turn of its own for a stopped one too: `handling`, then its end.
                rec.until_wait(Duration::from_secs(30), |w| w["waitId"] == id.as_str() && w["state"] == "handling");
                let end = rec.until_wait(Duration::from_secs(30), |w| {
                    w["waitId"] == id.as_str() && w.get("state").is_some_and(|s| s != "waiting" && s != "handling")
                });
                assert_eq!(end["state"], "cancelled", "{end}; waits: {:?}", rec.waits());
                eprintln!("qwen stop of a {kind}: cancelled after {:?}", asked.elapsed());
                assert!(!rec.received.iter().any(|v| v["method"] == "_qwencode/start_turn"), "answered by coda-acp");
            }
            eprintln!(
                "qwen background agents: {} model requests; waits {:?}",
                model.model_requests().len(),
                rec.waits()
            );
        });
    }
}

/// The facts of a session Coda loads in a fresh `coda-acp`, read from what the agent keeps (Qwen Code's chat file,
/// Claude Code's project file): equal to the facts Coda had before the restart. Qwen sends no `usage_update` at
/// load, so coda-acp sends the loaded facts in one of its own right after the load's answer; Claude Agent ACP's
/// next turn carries them.
fn facts_after_load(agent: &str) {
    let (_model, temp, lc, mut rec) = start(agent, &format!("coda-acp-{agent}-load"));
    rec.new_session(true);
    for text in [coda_text::FIRST_PROMPT, "Run it. [[sh:echo hi]]"] {
        let answer = rec.prompt(text);
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    }
    let compacted = rec.call("_coda/session/compact", json!({"sessionId": rec.session}));
    assert_eq!(compacted["result"]["compacted"], true, "{compacted}");
    rec.quiet(Duration::from_millis(2500));
    let before = facts(&rec).last().cloned().expect("facts before the restart");
    let session = rec.session.clone();
    rec.finish();

    let mut rec = Rec::start_acp(&lc, &temp.path().join("trace-load.jsonl"));
    rec.session = session.clone();
    let loaded_at = Instant::now();
    let load = rec.call(
        "session/load",
        json!({"sessionId": session, "cwd": rec.cwd, "mcpServers": [],
            "systemPrompt": coda_text::system_prompt(coda_text::INSTRUCTION)}),
    );
    assert!(load.get("result").is_some(), "{load}");
    rec.quiet(Duration::from_millis(1500));
    let at_load = facts(&rec).first().cloned();
    eprintln!("{agent} facts at the load: {at_load:?}");
    if agent == "qwen" {
        assert!(at_load.is_some(), "coda-acp sends the loaded facts after Qwen's answer");
    } else if at_load.is_none() {
        let answer = rec.prompt("again [[text:ok]]");
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        rec.quiet(Duration::from_millis(1500));
    }
    let after = facts(&rec).first().cloned().unwrap_or_else(|| panic!("{agent}: no facts after the load"));
    let ms = |v: &Value| v.as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()).map(|t| t.as_millisecond());
    eprintln!("{agent} facts before the restart {before}; after the load ({:?}) {after}", loaded_at.elapsed());
    for key in ["compactedAt", "lastRequestAt"] {
        if let (Some(a), Some(b)) = (ms(&before[key]), ms(&after[key])) {
            // The agent's file and coda-acp's clock tell the same moment, a few milliseconds apart.
            assert!((a - b).abs() < 1000, "{key}: {before} / {after}");
        } else {
            assert_eq!(before.get(key), after.get(key), "{key}: {before} / {after}");
        }
    }
    assert_eq!(before.get("contextTokens"), after.get("contextTokens"), "{before} / {after}");
    assert!(after.get("compactedAt").is_some(), "{after}");
    rec.finish();
}

#[test]
fn live_acp_qwen_facts_after_load() {
    if live::wanted("qwen", "coda-acp usage facts after a load on Qwen Code") {
        facts_after_load("qwen");
    }
}

#[test]
fn live_acp_claude_facts_after_load() {
    if live::wanted("claude", "coda-acp usage facts after a load on Claude Agent ACP") {
        facts_after_load("claude");
    }
}

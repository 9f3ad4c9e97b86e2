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
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new(name);
    let root: PathBuf = temp.path().to_path_buf();
    let lc = live::prepare(agent, &model.base_url(), &root).unwrap_or_else(|e| panic!("prepare {agent}: {e}"));
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
    let (model, temp, _lc, mut rec) = start(agent, &format!("coda-acp-{agent}-{scenario}"));
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
            assert_eq!(answer["error"]["code"], 429, "{answer}");
        });
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
        // The shim's own prompt is no turn of Coda's: nothing of it reaches Coda but compaction and usage.
        let answer = rec.prompt("After the compaction.");
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    });
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

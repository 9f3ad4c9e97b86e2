//! Live: the session instruction on the real CLIs, checked on both sides: what the client gets and
//! what the model receives. Opt-in (`CODA_LIVE=1`, after `scripts/install-clis`); skipped otherwise.

#[path = "support/fake_model.rs"]
mod fake_model;
#[path = "support/live.rs"]
mod live;
#[path = "support/shim.rs"]
mod shim;
#[path = "support/temp.rs"]
mod temp;

use std::time::Duration;

use serde_json::{Value, json};

const INSTRUCTION: &str = "Coda live check: answer briefly. Marker INSTR-7f3a.";
const MARK: &str = "INSTR-7f3a";

fn enabled(agent: &str) -> bool {
    if std::env::var_os("CODA_LIVE").is_none() {
        eprintln!("skipped live {agent}: set CODA_LIVE=1 (after scripts/install-clis) to run it");
        return false;
    }
    if let Err(why) = live::installed(agent) {
        eprintln!("skipped live {agent}: {why}");
        return false;
    }
    true
}

fn system_prompt() -> Value {
    json!({"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]})
}

fn start(lc: &live::LiveCommand, agent: &str) -> shim::Shim {
    let cmd = lc.shim_command(&shim::binary(agent));
    shim::Builder::from_command(cmd).start()
}

fn coda_initialize(s: &mut shim::Shim) -> Value {
    let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
        "elicitation": {"form": {}, "url": {}}, "_meta": {"coda": {"waits": {}, "remote": {}}}});
    let (answer, _) = s.request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
    );
    answer
}

/// Main-agent model requests that arrived after `skip` requests, and how often each holds the marker.
fn marks_since(model: &fake_model::FakeModel, skip: usize) -> Vec<usize> {
    model
        .model_requests()
        .iter()
        .skip(skip)
        .filter(|r| r.origin == fake_model::Origin::Main)
        .map(|r| r.body.to_string().matches(MARK).count())
        .collect()
}

/// The last user message of a chat-completions request, as JSON (for the record of what the model got).
fn last_user_message(body: &Value) -> String {
    let messages = body.get("messages").and_then(Value::as_array);
    let user = messages.and_then(|m| m.iter().rev().find(|m| m["role"] == "user"));
    user.map_or_else(|| "(no chat messages)".to_owned(), |m| m["content"].to_string())
}

/// initialize, new with systemPrompt, a slash-command first prompt, a normal prompt, then load in a
/// fresh process and one more prompt.
fn check(agent: &str, command: &str) {
    if !enabled(agent) {
        return;
    }
    let model = fake_model::FakeModel::start();
    let guard = temp::TempDir::new(&format!("coda-live-{agent}"));
    let temp = guard.path().to_path_buf();
    let lc = live::prepare(agent, &model.base_url(), &temp).expect("prepare the CLI");
    let cwd = lc.workdir.display().to_string();

    let mut s = start(&lc, agent);
    let init = coda_initialize(&mut s);
    eprintln!(
        "{agent} initialize: agentInfo {} sessionCapabilities {}",
        init["result"]["agentInfo"], init["result"]["agentCapabilities"]["sessionCapabilities"]
    );
    assert_eq!(init["result"]["agentCapabilities"]["sessionCapabilities"]["systemPrompt"], json!({}));
    let (new, _) = s.request(1, "session/new", json!({"cwd": cwd, "mcpServers": [], "systemPrompt": system_prompt()}));
    let sid = new["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("session/new failed: {new}")).to_owned();
    // Let the command list arrive (it follows the session/new answer).
    while s.try_recv(Duration::from_millis(1500)).is_some() {}

    let before = model.model_requests().len();
    let (answer, _) =
        s.request(2, "session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": command}]}));
    eprintln!("{agent} {command}: {answer}");
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(marks_since(&model, before).iter().all(|&n| n == 0), "the command turn carried no instruction");

    let before = model.model_requests().len();
    let (answer, updates) = s.request(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hello [[text:hi there]]"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let marks = marks_since(&model, before);
    eprintln!("{agent} first real prompt: marker counts per main model request {marks:?}");
    if let Some(first) = model.model_requests().iter().skip(before).find(|r| r.origin == fake_model::Origin::Main) {
        eprintln!("{agent} the model received as the last user message: {}", last_user_message(&first.body));
    }
    assert_eq!(marks.first(), Some(&1), "the instruction reached the model exactly once");
    let leaked: Vec<&Value> = updates.iter().filter(|u| u.to_string().contains(MARK)).collect();
    assert!(leaked.is_empty(), "the client never sees the instruction: {leaked:?}");
    drop(s);

    let mut s = start(&lc, agent);
    coda_initialize(&mut s);
    let (load, replay) = s.request(
        4,
        "session/load",
        json!({"sessionId": sid, "cwd": cwd, "mcpServers": [], "systemPrompt": system_prompt()}),
    );
    assert!(load.get("result").is_some(), "{load}");
    let user_texts: Vec<String> = replay
        .iter()
        .filter(|u| u.pointer("/params/update/sessionUpdate") == Some(&json!("user_message_chunk")))
        .filter_map(|u| u.pointer("/params/update/content/text").and_then(Value::as_str).map(str::to_owned))
        .collect();
    eprintln!("{agent} load replayed user text: {user_texts:?}");
    assert!(!replay.iter().any(|u| u.to_string().contains(MARK)), "the replay does not show the instruction");
    assert!(user_texts.iter().any(|t| t.contains("hello")));

    let before = model.model_requests().len();
    let (answer, _) = s.request(
        5,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "again [[text:ok]]"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let marks = marks_since(&model, before);
    eprintln!("{agent} after load: marker counts per main model request {marks:?}");
    assert_eq!(marks.first(), Some(&1), "only the history holds it: not injected again after load");
    drop(s);
    drop(guard);
}

#[test]
fn live_grok_instruction() {
    check("grok", "/context");
}

#[test]
fn live_opencode_instruction() {
    check("opencode", "/init focus on tests");
}

#[test]
fn live_kimi_instruction() {
    check("kimi", "/status");
}

//! Live: the session instruction on the real CLIs, checked on both sides: what the client gets and
//! what the model receives. Opt-in (`CODA_LIVE=1`, after `scripts/install-clis`); skipped otherwise.

use crate::support;

use support::{coda_text, fake_model, live, shim, temp, wait};

use std::time::Duration;

use serde_json::{Value, json};

fn start(lc: &live::LiveCommand, agent: &str) -> shim::Shim {
    let cmd = lc.shim_command(&shim::binary(agent));
    shim::Builder::from_command(cmd).start()
}

fn coda_initialize(s: &mut shim::Shim) -> Value {
    let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
        "elicitation": {"form": {}, "url": {}}, "_meta": {"coda": {"waits": {}, "remote": {}}}});
    // A real CLI on a loaded machine may take longer than the usual wait to start (Kimi: up to 10 s seen).
    let (answer, _) = s.request_within(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
        Duration::from_secs(60),
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
        .map(|r| r.body.to_string().matches(coda_text::MARK).count())
        .collect()
}

/// The last user message of a chat-completions request, as JSON (for the record of what the model got).
fn last_user_message(body: &Value) -> String {
    let messages = body.get("messages").and_then(Value::as_array);
    let user = messages.and_then(|m| m.iter().rev().find(|m| m["role"] == "user"));
    user.map_or_else(|| "(no chat messages)".to_owned(), |m| m["content"].to_string())
}

/// A request whose answer (or any frame before it) may take a while on a loaded machine.
fn req(s: &mut shim::Shim, id: i64, method: &str, params: Value) -> (Value, Vec<Value>) {
    s.request_within(id, method, params, Duration::from_secs(60))
}

/// Titles in `session_info_update`s for `sid` among `frames` (`null` when the update cleared it).
fn info_titles(frames: &[Value], sid: &str) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| f.pointer("/params/update/sessionUpdate") == Some(&json!("session_info_update")))
        .filter(|f| f.pointer("/params/sessionId") == Some(&json!(sid)))
        .filter_map(|f| f.pointer("/params/update/title").cloned())
        .collect()
}

/// The title `session/list` gives `sid`, if the agent lists sessions (`None` when it does not).
fn listed_title(s: &mut shim::Shim, id: i64, cwd: &str, sid: &str, seen: &mut Vec<Value>) -> Option<Value> {
    let (list, before) = req(s, id, "session/list", json!({"cwd": cwd}));
    seen.extend(before);
    seen.push(list.clone());
    let sessions = list.pointer("/result/sessions")?.as_array()?;
    let entry = sessions.iter().find(|e| e["sessionId"] == json!(sid));
    Some(entry.map_or(Value::Null, |e| e.get("title").cloned().unwrap_or(Value::Null)))
}

/// Ends a shim as Coda does (stdin closed) and waits for it and its CLI to exit, so that the next process
/// finds the session free.
fn finish(mut s: shim::Shim) {
    s.close_stdin();
    s.wait(Duration::from_secs(30));
}

/// Everything the shim sends within `quiet` of the last frame.
fn drain(s: &mut shim::Shim, quiet: Duration, seen: &mut Vec<Value>) {
    while let Some(line) = s.try_recv(quiet) {
        seen.push(serde_json::from_str(&line).unwrap_or(Value::String(line)));
    }
}

/// The titles the agent reports for `prompt` in a session without any instruction (after `command`), as
/// the titles a client must see for a session that got one: found from the agent itself.
fn own_titles(s: &mut shim::Shim, cwd: &str, command: &str, prompt: &str) -> Vec<Value> {
    let (new, _) = req(s, 20, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    let Some(sid) = new["result"]["sessionId"].as_str().map(str::to_owned) else { return Vec::new() };
    let mut seen = Vec::new();
    drain(s, Duration::from_millis(1500), &mut seen);
    let (_, before) =
        req(s, 21, "session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": command}]}));
    seen.extend(before);
    let (_, before) =
        req(s, 22, "session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}));
    seen.extend(before);
    drain(s, Duration::from_millis(1500), &mut seen);
    info_titles(&seen, &sid)
}

/// initialize, new with systemPrompt, a slash-command first prompt, a multi-line first real prompt, the
/// titles and the session list, then load and resume in fresh processes and one more prompt. Every frame
/// the client gets is searched for any part of the instruction.
fn check(agent: &str, command: &str, instruction: &str) {
    if !live::wanted(agent, "live instruction") {
        return;
    }
    let model = fake_model::FakeModel::start();
    let guard = temp::TempDir::new(&format!("coda-live-{agent}"));
    let temp = guard.path().to_path_buf();
    let lc = live::prepare(agent, &model.base_url(), &temp).expect("prepare the CLI");
    let cwd = lc.workdir.display().to_string();
    let sp = coda_text::system_prompt(instruction);
    let first = format!("{} [[text:hi there]]", coda_text::FIRST_PROMPT);
    let mut seen: Vec<Value> = Vec::new();

    let mut s = start(&lc, agent);
    let init = coda_initialize(&mut s);
    eprintln!(
        "{agent} initialize: agentInfo {} sessionCapabilities {}",
        init["result"]["agentInfo"], init["result"]["agentCapabilities"]["sessionCapabilities"]
    );
    assert_eq!(init["result"]["agentCapabilities"]["sessionCapabilities"]["systemPrompt"], json!({}));
    let lists = init["result"]["agentCapabilities"]["sessionCapabilities"].get("list").is_some();
    let (new, before) = req(&mut s, 1, "session/new", json!({"cwd": cwd, "mcpServers": [], "systemPrompt": sp}));
    seen.extend(before);
    seen.push(new.clone());
    let sid = new["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("session/new failed: {new}")).to_owned();
    // Let the command list arrive (it follows the session/new answer).
    drain(&mut s, Duration::from_millis(1500), &mut seen);

    let before = model.model_requests().len();
    let (answer, frames) =
        req(&mut s, 2, "session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": command}]}));
    seen.extend(frames);
    eprintln!("{agent} {command}: {answer}");
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(marks_since(&model, before).iter().all(|&n| n == 0), "the command turn carried no instruction");

    let before = model.model_requests().len();
    let (answer, frames) =
        req(&mut s, 3, "session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": first}]}));
    seen.extend(frames);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    // A title made after the turn (OpenCode's side request) arrives a little later.
    drain(&mut s, Duration::from_millis(2000), &mut seen);
    let marks = marks_since(&model, before);
    eprintln!("{agent} first real prompt: marker counts per main model request {marks:?}");
    if let Some(first) = model.model_requests().iter().skip(before).find(|r| r.origin == fake_model::Origin::Main) {
        eprintln!("{agent} the model received as the last user message: {}", last_user_message(&first.body));
    }
    assert_eq!(marks.first(), Some(&1), "the instruction reached the model exactly once");

    // The title the agent makes from the user's own prompt, from a session without an instruction.
    let own_all = own_titles(&mut s, &cwd, command, &first);
    let titles = info_titles(&seen, &sid);
    eprintln!("{agent} titles: with the instruction {titles:?}, the agent's own from the prompt {own_all:?}");
    assert_eq!(titles, own_all, "the titles are those the agent makes from the user's prompt");
    let own = own_all.last().cloned();
    if lists {
        let listed = listed_title(&mut s, 6, &cwd, &sid, &mut seen);
        eprintln!("{agent} session/list title in this process: {listed:?}");
        if let (Some(listed), Some(own)) = (&listed, &own) {
            assert_eq!(listed, own, "session/list in this process gives the title made from the user's prompt");
        }
    }
    finish(s);

    let mut s = start(&lc, agent);
    coda_initialize(&mut s);
    if lists {
        let listed = listed_title(&mut s, 7, &cwd, &sid, &mut seen);
        eprintln!("{agent} session/list title in a fresh process: {listed:?}");
        if let (Some(listed), Some(own)) = (&listed, &own) {
            // Kimi's title made in the earlier process: found from Kimi's record of the first prompt.
            assert_eq!(listed, own, "session/list in a fresh process gives the title made from the user's prompt");
        }
    }
    let (load, replay) =
        req(&mut s, 4, "session/load", json!({"sessionId": sid, "cwd": cwd, "mcpServers": [], "systemPrompt": sp}));
    assert!(load.get("result").is_some(), "{load}");
    let mut after = Vec::new();
    drain(&mut s, Duration::from_millis(1500), &mut after);
    let user_texts: Vec<String> = replay
        .iter()
        .filter(|u| u.pointer("/params/update/sessionUpdate") == Some(&json!("user_message_chunk")))
        .filter_map(|u| u.pointer("/params/update/content/text").and_then(Value::as_str).map(str::to_owned))
        .collect();
    eprintln!("{agent} load replayed user text: {user_texts:?}");
    assert!(user_texts.iter().any(|t| t.contains("failing build")));
    let load_titles = info_titles(&[replay.as_slice(), after.as_slice()].concat(), &sid);
    eprintln!("{agent} titles around session/load: {load_titles:?}");
    if let Some(own) = &own {
        assert!(load_titles.iter().all(|t| t == own || t.is_null()), "the user's title or none: {load_titles:?}");
    }
    seen.extend(replay);
    seen.push(load);
    seen.extend(after);

    let before = model.model_requests().len();
    let (answer, frames) = req(
        &mut s,
        5,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "again [[text:ok]]"}]}),
    );
    seen.extend(frames);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    drain(&mut s, Duration::from_millis(1500), &mut seen);
    let marks = marks_since(&model, before);
    eprintln!("{agent} after load: marker counts per main model request {marks:?}");
    assert_eq!(marks.first(), Some(&1), "only the history holds it: not injected again after load");
    finish(s);

    if init["result"]["agentCapabilities"]["sessionCapabilities"].get("resume").is_some() {
        let mut s = start(&lc, agent);
        coda_initialize(&mut s);
        let (resume, before) = req(
            &mut s,
            8,
            "session/resume",
            json!({"sessionId": sid, "cwd": cwd, "mcpServers": [], "systemPrompt": sp}),
        );
        assert!(resume.get("result").is_some(), "{resume}");
        let mut resumed = before;
        resumed.push(resume);
        drain(&mut s, Duration::from_millis(1500), &mut resumed);
        let resume_titles = info_titles(&resumed, &sid);
        eprintln!("{agent} titles around session/resume: {resume_titles:?}");
        if let Some(own) = &own {
            assert!(resume_titles.iter().all(|t| t == own || t.is_null()), "{resume_titles:?}");
        }
        seen.extend(resumed);
        finish(s);
    }
    let leaks: Vec<String> = seen.iter().filter_map(coda_text::leak).collect();
    assert!(leaks.is_empty(), "{agent}: the client saw parts of the instruction: {leaks:#?}");
    drop(guard);
}

#[test]
fn live_grok_instruction() {
    check("grok", "/context", coda_text::INSTRUCTION);
}

#[test]
fn live_opencode_instruction() {
    check("opencode", "/init focus on tests", coda_text::INSTRUCTION);
}

#[test]
fn live_kimi_instruction() {
    check("kimi", "/status", coda_text::INSTRUCTION);
}

/// Grok repeats queued prompts in `_x.ai/queue/changed`: a prompt sent while the first one (which carries
/// the instruction) runs makes Grok list its queue; no part of the instruction may show there.
#[test]
fn live_grok_queue_echo() {
    let agent = "grok";
    if !live::wanted(agent, "live instruction") {
        return;
    }
    let model = fake_model::FakeModel::start();
    let guard = temp::TempDir::new("coda-live-grok-queue");
    let lc = live::prepare(agent, &model.base_url(), guard.path()).expect("prepare the CLI");
    let cwd = lc.workdir.display().to_string();
    let mut s = start(&lc, agent);
    coda_initialize(&mut s);
    let sp = coda_text::system_prompt(coda_text::INSTRUCTION);
    let (new, _) = req(&mut s, 1, "session/new", json!({"cwd": cwd, "mcpServers": [], "systemPrompt": sp}));
    let sid = new["result"]["sessionId"].as_str().expect("a session").to_owned();
    let mut seen = Vec::new();
    drain(&mut s, Duration::from_millis(1500), &mut seen);
    let first = format!("{} [[delay:3000]] [[text:hi there]]", coda_text::FIRST_PROMPT);
    let prompt = |id: i64, text: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}})
    };
    s.send_json(&prompt(2, &first));
    // The second prompt comes while the first one's turn runs: once the model has been asked for it (it
    // answers 3 s later).
    let asked = || {
        model
            .model_requests()
            .iter()
            .any(|r| r.origin == fake_model::Origin::Main && r.body.to_string().contains("[[delay:3000]]"))
    };
    wait::until(
        Duration::from_secs(60),
        || asked().then_some(()),
        || "the model was never asked for the first prompt".into(),
    );
    s.send_json(&prompt(3, "and then this [[text:queued]]"));
    let mut answered = 0;
    while answered < 2 {
        let line = s.try_recv(Duration::from_secs(60)).expect("both prompts are answered");
        let v: Value = serde_json::from_str(&line).expect("JSON");
        if v.get("method").is_none() && (v["id"] == 2 || v["id"] == 3) {
            answered += 1;
        }
        seen.push(v);
    }
    drain(&mut s, Duration::from_millis(1500), &mut seen);
    let queue: Vec<&Value> = seen.iter().filter(|v| v["method"] == "_x.ai/queue/changed").collect();
    eprintln!("grok queue notifications: {}", queue.len());
    assert!(!queue.is_empty(), "Grok listed its queue");
    let marks: Vec<usize> = model
        .model_requests()
        .iter()
        .filter(|r| r.origin == fake_model::Origin::Main)
        .map(|r| r.body.to_string().matches(coda_text::MARK).count())
        .collect();
    eprintln!("grok marker counts per main model request {marks:?}");
    assert_eq!(marks.first(), Some(&1), "the model got the instruction with the first prompt, once");
    let leaks: Vec<String> = seen.iter().filter_map(coda_text::leak).collect();
    assert!(leaks.is_empty(), "grok: the client saw parts of the instruction: {leaks:#?}");
    finish(s);
    drop(guard);
}

/// codex-acp takes `systemPrompt` itself: nothing is injected, and the same checks hold.
#[test]
fn live_codex_instruction() {
    check("codex", "/compact", coda_text::INSTRUCTION);
}

/// The one scenario that keeps Coda's short form of the instruction.
#[test]
fn live_kimi_instruction_one_line() {
    check("kimi", "/status", coda_text::ONE_LINE);
}

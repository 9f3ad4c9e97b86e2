//! Live: a turn costs the user one model request (plus the title Codex asks for on the first turn), issue 25
//! section 3. codex-acp asks the model for a suggested next user message after every turn of an AIR client
//! (the shim is one); coda-codex turns that off unless the user set `CODEX_ACP_PROMPT_SUGGESTIONS` themselves.
//! Grok writes an "ultra-short dashboard line" about every turn (`last_turn_summary`, which Coda does not use);
//! coda-grok turns that off with `GROK_TURN_SUMMARY=0` unless the user set it.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test all model_requests_live:: -- --nocapture` (after `scripts/install-clis
//! codex`). Each run counts, per turn, the requests the fake model received, and prints them.

use crate::support;

use support::{coda_text, fake_model, live, shim, temp};

use std::time::Duration;

use serde_json::{Value, json};

/// How long the client listens after a turn's answer for what follows it (codex-acp starts its title and
/// suggestion requests as the turn ends; the run with suggestions on shows they arrive within this).
const TRAIL: Duration = Duration::from_millis(3000);

/// What one request was for, from its text: a title, Codex's next-message suggestion, Grok's turn summary, or
/// the turn's own.
fn what(r: &fake_model::RecordedRequest) -> &'static str {
    let body = r.body.to_string();
    if body.contains("suggested next user message") {
        "suggestion"
    } else if body.contains("generate a very short title") || body.contains("session_title") {
        "title"
    } else if body.contains("ultra-short dashboard line") {
        "summary"
    } else if r.origin == fake_model::Origin::Main {
        "turn"
    } else {
        "other"
    }
}

/// Runs two turns through coda-<agent> (with `extra` in its environment) and returns, per turn, what each model
/// request that arrived during it (up to [`TRAIL`] after its answer) was for.
fn turns(agent: &str, extra: &[(&str, &str)]) -> Vec<Vec<&'static str>> {
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new("coda-model-requests");
    let lc = live::prepare(agent, &model.base_url(), temp.path()).expect("prepare the CLI");
    let mut cmd = lc.shim_command(&shim::binary(agent));
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let mut s = shim::Builder::from_command(cmd).start();
    let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
        "_meta": {"coda": {"waits": {}}}});
    let wait = Duration::from_secs(120);
    let init =
        json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1"}});
    let (answer, _) = s.request_within(0, "initialize", init, wait);
    assert!(answer.get("result").is_some(), "{answer}");
    let new = json!({"cwd": lc.workdir.display().to_string(), "mcpServers": [],
        "systemPrompt": coda_text::system_prompt(coda_text::INSTRUCTION)});
    let (answer, _) = s.request_within(1, "session/new", new, wait);
    let sid = answer["result"]["sessionId"].as_str().expect("a session").to_owned();
    let mut per_turn = Vec::new();
    let mut seen: Vec<Value> = Vec::new();
    for (id, text) in [(2, coda_text::FIRST_PROMPT), (3, "And now the iPhone target, please.\n\n谢谢")] {
        let before = model.model_requests().len();
        let (answer, frames) = s.request_within(id, "session/prompt", shim::prompt_params(&sid, text), wait);
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        seen.extend(frames);
        while let Some(line) = s.try_recv(TRAIL) {
            seen.push(serde_json::from_str(&line).unwrap_or(Value::String(line)));
        }
        let requests = model.model_requests();
        for r in &requests[before..] {
            eprintln!("turn {}: {}", id - 1, fake_model::summary_line(r));
        }
        per_turn.push(requests[before..].iter().map(what).collect());
    }
    let suggested = seen.iter().any(|f| f.pointer("/params/update/_meta/promptSuggestions").is_some());
    eprintln!("promptSuggestions reached the client: {suggested}");
    s.close_stdin();
    s.wait(Duration::from_secs(30));
    per_turn
}

#[test]
fn live_codex_turns_cost_one_model_request() {
    if !live::wanted("codex", "live model requests") {
        return;
    }
    // What the user gets who asks for suggestions (codex-acp's default, so what coda-codex did before).
    let asked = turns("codex", &[("CODEX_ACP_PROMPT_SUGGESTIONS", "true")]);
    eprintln!("suggestions asked for: {asked:?}");
    let mut first = asked[0].clone();
    first.sort_unstable();
    assert_eq!(first, ["suggestion", "title", "turn"], "the user's own setting wins");
    assert_eq!(asked[1], ["turn", "suggestion"]);

    // coda-codex as Coda starts it: one request per turn, plus the title on the first.
    let plain = turns("codex", &[]);
    eprintln!("coda-codex by default: {plain:?}");
    let mut first = plain[0].clone();
    first.sort_unstable();
    assert_eq!(first, ["title", "turn"]);
    assert_eq!(plain[1], ["turn"]);
}

#[test]
fn live_grok_turns_cost_one_model_request() {
    if !live::wanted("grok", "live model requests") {
        return;
    }
    // Grok's turn summary on (its default, what coda-grok did before): one more request after every turn.
    let asked = turns("grok", &[("GROK_TURN_SUMMARY", "1")]);
    eprintln!("turn summaries asked for: {asked:?}");
    assert!(asked.iter().all(|t| t.contains(&"summary")), "{asked:?}");
    let plain = turns("grok", &[]);
    eprintln!("coda-grok by default: {plain:?}");
    let mut first = plain[0].clone();
    first.sort_unstable();
    assert_eq!(first, ["title", "turn"]);
    assert_eq!(plain[1], ["turn"]);
}

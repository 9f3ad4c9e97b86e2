//! `systemPrompt` as ACP now specifies it (`{mode, content}` on `session/new`, `load` and `resume`), on every
//! binary: each declares `sessionCapabilities.systemPrompt`, with `override` only where the agent honours it;
//! a mode or content the binary cannot honour gets -32602 and no session; a refused set-up changes nothing
//! (the instruction still goes with the first prompt of a session made here).

use serde_json::{Value, json};

use super::fake::Compacts;
use super::{EVERY, INSTRUCTION, Shim, answer, every, reached, system_prompt};
use crate::coda::instruction::OPEN;

/// What no binary honours, each with why.
fn refused() -> Vec<(Value, &'static str)> {
    let text = json!([{"type": "text", "text": INSTRUCTION}]);
    vec![
        (json!({"mode": "override", "content": text}), "override"),
        (json!({"mode": "_vendor.replace", "content": text}), "an unknown mode"),
        (json!({"content": text}), "no mode"),
        (json!({"mode": "append", "content": []}), "empty content"),
        (json!({"mode": "append", "content": [{"type": "image", "data": "AA", "mimeType": "image/png"}]}), "an image"),
        (json!({"mode": "append", "content": [{"type": "text"}]}), "a text block without text"),
        (json!("append: be brief"), "no object"),
    ]
}

#[tokio::test(start_paused = true)]
async fn a_mode_or_content_the_binary_cannot_honour_gets_invalid_params_and_no_session() {
    every(&EVERY, |agent| async move {
        let mut shim = Shim::bare(agent, Compacts::Ends).await;
        // A session the set-ups below try to load or resume.
        let made = shim.call("session/new", json!({"cwd": "/work/app", "mcpServers": []})).await;
        let made = made["result"]["sessionId"].as_str().expect("a session").to_owned();
        for (sp, why) in refused() {
            for method in ["session/new", "session/load", "session/resume"] {
                let mut params = json!({"cwd": "/work/app", "mcpServers": [], "systemPrompt": sp});
                if method != "session/new" {
                    params["sessionId"] = json!(made);
                }
                let id = shim.send(method, params);
                let got = shim.drive().await;
                let answered = answer(&got, id).unwrap_or_else(|| panic!("{agent}: {method} with {why} answered"));
                assert_eq!(answered["error"]["code"], -32602, "{agent}: {method} with {why}: {answered}");
                assert!(answered.get("result").is_none(), "{agent}: no session");
            }
        }
        // Nothing was made: the session set-ups the CLI answered made no session either.
        assert!(shim.fake.state().closed.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn every_binary_declares_append_and_no_override_for_these_clis() {
    every(&EVERY, |agent| async move {
        let shim = Shim::bare(agent, Compacts::Ends).await;
        let init = &shim.init;
        let declared = &init["result"]["agentCapabilities"]["sessionCapabilities"]["systemPrompt"];
        assert_eq!(declared, &json!({}), "{agent}: append only, none of these CLIs overrides: {init}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_load_or_resume_changes_nothing_and_the_instruction_still_goes_with_the_first_prompt() {
    // The binaries that deliver the instruction themselves (codex-acp takes it natively).
    every(&["kimi", "grok", "opencode", "acp"], |agent| async move {
        for method in ["session/load", "session/resume"] {
            let mut shim = Shim::start(agent, Compacts::Ends).await;
            let bad = json!({"mode": "override", "content": [{"type": "text", "text": "replace everything"}]});
            let params = json!({"sessionId": shim.session, "cwd": "/work/app", "mcpServers": [], "systemPrompt": bad});
            let refused = shim.call(method, params).await;
            assert_eq!(refused["error"]["code"], -32602, "{agent}: {refused}");
            let turn = shim.prompt("the first prompt\n\nof two lines");
            let got = shim.drive().await;
            assert!(answer(&got, turn).is_some());
            let sent = got.agent_json().into_iter().find(|(_, v)| v["id"] == turn).map(|(_, v)| v);
            let sent = sent.unwrap_or_else(|| panic!("{agent}: the prompt reached the CLI"));
            let first = sent["params"]["prompt"][0]["text"].as_str().unwrap_or_default();
            assert!(first.starts_with(OPEN), "{agent} after a refused {method}: the instruction goes first: {sent}");
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn override_is_passed_on_only_to_an_agent_that_declares_it_and_refused_otherwise() {
    let caps = |sp: Value| {
        Some(json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true,
            "sessionCapabilities": {"close": {}, "systemPrompt": sp}}, "agentInfo": {"name": "an-agent", "version": "1"}}))
    };
    // (the agent's declaration, what Coda reads it as, whether override reaches it)
    let cases = [
        (json!({"mode": {"override": {}}}), json!({"mode": {"override": {}}}), true),
        // ACP reads a malformed part as not declared at its level: append only; no declaration at all.
        (json!({"mode": {"override": true}}), json!({"mode": {"override": true}}), false),
        (json!("yes"), json!({}), false),
    ];
    for (declares, read, passes) in cases {
        let mut shim = Shim::bare_with("acp", Compacts::Ends, caps(declares.clone())).await;
        let init = shim.init.clone();
        assert_eq!(init["result"]["agentCapabilities"]["sessionCapabilities"]["systemPrompt"], read, "{declares}");
        let sp = json!({"mode": "override", "content": [{"type": "text", "text": INSTRUCTION}]});
        let id = shim.send("session/new", json!({"cwd": "/work/app", "mcpServers": [], "systemPrompt": sp}));
        let got = shim.drive().await;
        let answered = answer(&got, id).expect("answered");
        match passes {
            true => {
                assert!(answered.get("result").is_some(), "{declares}: {answered}");
                let sent = got.agent_json().into_iter().find(|(_, v)| v["id"] == id).map(|(_, v)| v);
                assert_eq!(sent.expect("sent")["params"]["systemPrompt"]["mode"], "override", "untouched");
            }
            false => {
                assert_eq!(answered["error"]["code"], -32602, "{declares}: {answered}");
                assert!(!reached(&got, id), "{declares}: the agent never gets what it did not declare");
            }
        }
        // Append is always taken.
        let ok =
            shim.call("session/new", json!({"cwd": "/work/app", "mcpServers": [], "systemPrompt": system_prompt()}));
        assert!(ok.await.get("result").is_some(), "{declares}");
    }
}

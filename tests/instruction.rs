//! Section 会话指令 of Coda's protocol, checked on the real binaries against the scripted test agent.

use crate::support;

use support::shim;

use serde_json::{Value, json};
use shim::{new_session_params, prompt_params, received_prompt, with_test_agent};

const INSTRUCTION: &str = "# Coda client\n\nReply in English.";

fn init(s: &mut shim::Shim) -> Value {
    let (answer, _) = s.request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {"_meta": {"coda": {"waits": {}}}}}),
    );
    answer
}

fn wrapped() -> String {
    format!("<coda-session-instruction>\n{INSTRUCTION}\n</coda-session-instruction>\n\n")
}

#[test]
fn declares_system_prompt_append_only() {
    let mut s = with_test_agent("opencode").start();
    let answer = init(&mut s);
    assert_eq!(answer["result"]["agentCapabilities"]["sessionCapabilities"], json!({"systemPrompt": {}}));
    assert_eq!(answer["result"]["agentCapabilities"]["loadSession"], json!(true));
}

#[test]
fn declares_system_prompt_on_the_v2_path() {
    let mut s = with_test_agent("opencode")
        .env("TEST_AGENT_INIT", r#"{"protocolVersion":2,"capabilities":{"session":{"list":{}}}}"#)
        .start();
    let answer = init(&mut s);
    assert_eq!(answer["result"]["capabilities"]["session"], json!({"list": {}, "systemPrompt": {}}));
}

#[test]
fn instruction_goes_before_the_first_prompt_once() {
    let mut s = with_test_agent("opencode").start();
    init(&mut s);
    let (new, after_new) = s.request(1, "session/new", new_session_params(INSTRUCTION));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    // The agent did not get the systemPrompt field (it does not accept it).
    let (seen, _) = s.request(90, "_test/echo", json!({}));
    assert!(seen["result"]["line"].as_str().unwrap().contains("_test/echo"));
    let _ = after_new;

    let (answer, before) = s.request(2, "session/prompt", prompt_params(&sid, "hello"));
    assert_eq!(answer["result"]["stopReason"], "end_turn");
    assert_eq!(
        received_prompt(&before),
        // coda-opencode marks the block for the assistant (OpenCode keeps it as a synthetic part).
        json!([
            {"type": "text", "text": wrapped(), "annotations": {"audience": ["assistant"]}},
            {"type": "text", "text": "hello"}
        ])
    );

    let (_, before) = s.request(3, "session/prompt", prompt_params(&sid, "again"));
    assert_eq!(received_prompt(&before), json!([{"type": "text", "text": "again"}]));
}

#[test]
fn system_prompt_is_removed_before_a_child_that_does_not_accept_it() {
    let mut s = with_test_agent("grok").start();
    init(&mut s);
    s.send(r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[],"systemPrompt":{"mode":"append","content":[{"type":"text","text":"x"}]},"_meta":{"keep":true}}}"#);
    let _ = s.recv_json();
    let (seen, _) = s.request(2, "_test/seen", json!({}));
    assert_eq!(seen["result"]["methods"], json!(["initialize", "session/new", "_test/seen"]));
    // What the agent got is checked through the load replay below: new kept cwd, mcpServers and _meta.
}

#[test]
fn invalid_system_prompt_is_rejected_with_32602_and_not_forwarded() {
    let bad = [
        json!("just a string"),
        json!({"mode": "override", "content": [{"type": "text", "text": "x"}]}),
        json!({"mode": "prepend", "content": [{"type": "text", "text": "x"}]}),
        json!({"mode": "append", "content": []}),
        json!({"mode": "append", "content": [{"type": "image", "data": "", "mimeType": "image/png"}]}),
        json!({"mode": "append", "content": [{"type": "text", "text": "x".repeat(256 * 1024 + 1)}]}),
        json!({"content": [{"type": "text", "text": "x"}]}),
    ];
    let mut s = with_test_agent("grok").start();
    init(&mut s);
    for (i, sp) in bad.iter().enumerate() {
        for method in ["session/new", "session/load", "session/resume", "session/fork"] {
            let id = (i * 10) as i64 + 100;
            let (answer, _) = s.request(
                id,
                method,
                json!({"cwd": "/w", "sessionId": "sess-1", "mcpServers": [], "systemPrompt": sp}),
            );
            assert_eq!(answer["error"]["code"], -32602, "{method} with {sp}");
            assert!(answer["error"]["message"].as_str().unwrap().contains("systemPrompt"), "{answer}");
        }
    }
    let (seen, _) = s.request(1, "_test/seen", json!({}));
    assert_eq!(seen["result"]["methods"], json!(["initialize", "_test/seen"]), "no rejected request reached the agent");
}

#[test]
fn slash_command_first_defers_the_instruction() {
    let mut s = with_test_agent("grok").start();
    init(&mut s);
    let (new, _) = s.request(1, "session/new", new_session_params(INSTRUCTION));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    // `init` was advertised in available_commands_update; `compact` is a Grok built-in.
    for (id, cmd) in [(2, "/init focus on tests"), (3, "  /compact")] {
        let (_, before) = s.request(id, "session/prompt", prompt_params(&sid, cmd));
        assert_eq!(received_prompt(&before), json!([{"type": "text", "text": cmd}]));
    }
    // Not a command the agent knows: the instruction goes in front.
    let (_, before) = s.request(4, "session/prompt", prompt_params(&sid, "/etc/hosts is odd"));
    assert_eq!(received_prompt(&before)[0]["text"], wrapped());
}

#[test]
fn instruction_is_injected_again_after_an_error_response() {
    let mut s = with_test_agent("opencode").start();
    init(&mut s);
    let (new, _) = s.request(1, "session/new", new_session_params(INSTRUCTION));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let (answer, _) = s.request(2, "session/prompt", prompt_params(&sid, "!fail"));
    assert_eq!(answer["error"]["code"], -32603);
    let (_, before) = s.request(3, "session/prompt", prompt_params(&sid, "now"));
    assert_eq!(received_prompt(&before)[0]["text"], wrapped());
}

#[test]
fn restored_sessions_get_no_instruction_and_replay_hides_it() {
    let mut s = with_test_agent("opencode").start();
    init(&mut s);
    let (new, _) = s.request(1, "session/new", new_session_params(INSTRUCTION));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    s.request(2, "session/prompt", prompt_params(&sid, "first"));

    let (load, replay) = s.request(3, "session/load", json!({"sessionId": sid, "cwd": "/w", "mcpServers": [], "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]}}));
    assert_eq!(load["result"], json!({}));
    let texts: Vec<&str> =
        replay.iter().filter_map(|v| v.pointer("/params/update/content/text").and_then(Value::as_str)).collect();
    assert_eq!(texts, ["first"], "the injected block is not replayed as user text");

    let (_, before) = s.request(4, "session/prompt", prompt_params(&sid, "after load"));
    assert_eq!(received_prompt(&before), json!([{"type": "text", "text": "after load"}]));

    // A resumed session, and a fork, are restored too.
    let (new2, _) = s.request(5, "session/new", new_session_params(INSTRUCTION));
    let sid2 = new2["result"]["sessionId"].as_str().unwrap().to_owned();
    s.request(6, "session/resume", json!({"sessionId": sid2, "cwd": "/w", "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]}}));
    let (_, before) = s.request(7, "session/prompt", prompt_params(&sid2, "after resume"));
    assert_eq!(received_prompt(&before), json!([{"type": "text", "text": "after resume"}]));
    let (fork, _) = s.request(8, "session/fork", json!({"sessionId": sid2, "cwd": "/w", "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]}}));
    let forked = fork["result"]["sessionId"].as_str().unwrap().to_owned();
    let (_, before) = s.request(9, "session/prompt", prompt_params(&forked, "in the fork"));
    assert_eq!(received_prompt(&before), json!([{"type": "text", "text": "in the fork"}]));
}

#[test]
fn echoes_of_the_prompt_never_show_the_wrapper() {
    let mut s = with_test_agent("grok").start();
    init(&mut s);
    let (new, _) = s.request(1, "session/new", new_session_params(INSTRUCTION));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let (_, before) = s.request(2, "session/prompt", prompt_params(&sid, "!echo-queue"));
    let queue = before.iter().find(|v| v["method"] == "_x.ai/queue/changed").expect("the echo came through");
    assert_eq!(
        queue["params"]["queue"][0]["prompt"],
        json!([{"type": "text", "text": ""}, {"type": "text", "text": "!echo-queue"}])
    );
    // ... while the agent itself did get the wrapper (its report carries the prompt as JSON text).
    assert_eq!(shim::received_prompt(&before)[0]["text"], wrapped());
}

#[test]
fn sessions_are_independent() {
    let mut s = with_test_agent("opencode").start();
    init(&mut s);
    let (a, _) = s.request(1, "session/new", new_session_params("for A"));
    let (b, _) = s.request(2, "session/new", new_session_params("for B"));
    let (a, b) =
        (a["result"]["sessionId"].as_str().unwrap().to_owned(), b["result"]["sessionId"].as_str().unwrap().to_owned());
    // Use a raw echo to see the agent's view without the stripping of reported text.
    let (_, before) = s.request(3, "session/prompt", prompt_params(&b, "b first"));
    let got = received_prompt(&before);
    assert_eq!(got[1]["text"], "b first");
    let (_, before) = s.request(4, "session/prompt", prompt_params(&a, "a first"));
    assert_eq!(received_prompt(&before)[1]["text"], "a first");
    let (_, before) = s.request(5, "session/prompt", prompt_params(&b, "b second"));
    assert_eq!(received_prompt(&before), json!([{"type": "text", "text": "b second"}]));
}

#[test]
fn a_child_that_declares_system_prompt_gets_it_untouched() {
    let init_answer = r#"{"protocolVersion":1,"agentCapabilities":{"sessionCapabilities":{"systemPrompt":{}}},"agentInfo":{"name":"@agentclientprotocol/codex-acp","version":"2.6.0"}}"#;
    let mut s = with_test_agent("codex").env("TEST_AGENT_INIT", init_answer).start();
    let answer = init(&mut s);
    assert_eq!(answer["result"]["agentCapabilities"]["sessionCapabilities"], json!({"systemPrompt": {}}));
    let line = r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[],"systemPrompt":{"mode":"append","content":[{"type":"text","text":"native"}]}}}"#;
    s.send(line);
    let new = s.recv_json();
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let _commands = s.recv_json();
    // Even an override (which this child would judge itself) is not the shim's to reject.
    let (_, before) = s.request(2, "session/prompt", prompt_params(&sid, "hi"));
    assert_eq!(received_prompt(&before), json!([{"type": "text", "text": "hi"}]));
}

#[test]
fn slash_command_before_the_command_list_arrives_defers_too() {
    let mut s = with_test_agent("opencode").env("TEST_AGENT_NO_COMMANDS", "1").start();
    init(&mut s);
    let (new, _) = s.request(1, "session/new", new_session_params(INSTRUCTION));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let (_, before) = s.request(2, "session/prompt", prompt_params(&sid, "/anything at all"));
    assert_eq!(received_prompt(&before), json!([{"type": "text", "text": "/anything at all"}]));
    let (_, before) = s.request(3, "session/prompt", prompt_params(&sid, "plain"));
    assert_eq!(received_prompt(&before)[0]["text"], wrapped());
}

//! coda-acp's whole stack (as the binary stacks it for a profile) on the real relay loop, in-memory pipes and
//! virtual time ([`crate::relay::testing::Pair`]), with scripted agents that answer the way the real agents were
//! seen to (docs/acp-agents.md): the instruction with Coda's real-size text, `agentInfo`, and the translation of
//! standard subagent sessions, with hostile frames beside them.

use serde_json::{Value, json};

use crate::child::AgentCommand;
use crate::relay::testing::Pair;

/// Coda's real instruction: several paragraphs of Markdown, CJK text, an emoji.
const INSTRUCTION: &str = include_str!("../../fixtures/coda-instruction.md");
/// A first prompt as Coda sends one: several lines.
const FIRST_PROMPT: &str =
    "Could you look at the failing build?\n\n- 测试都通过了\n- the iPhone target stops\n\nStart.";
const CODA_CAPS: &str =
    r#"{"_meta":{"coda":{"waits":{}}},"fs":{"readTextFile":false,"writeTextFile":false},"session":{"compaction":{}}}"#;

/// The stack of `coda-acp --profile <profile>` over `command`, with a scripted agent.
fn acp(profile: &str, command: AgentCommand, agent: impl FnMut(&str) -> Vec<String> + Send + 'static) -> Pair {
    let adapter = super::adapter(Some(super::profile::built_in(profile).expect("a built-in profile")));
    let (stack, events) = adapter.stack(&command, None);
    Pair::with(stack, events, crate::lines::DEFAULT_MAX_LINE, agent)
}

fn nowhere() -> AgentCommand {
    AgentCommand { program: "/nonexistent/agent".into(), args: Vec::new() }
}

fn read(line: &str) -> Value {
    crate::json::from_slice(&crate::json::mend_surrogates(line.as_bytes())).expect("JSON")
}

fn answer(id: &Value, result: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

fn update(session: &str, update: Value) -> String {
    json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}})
        .to_string()
}

/// An agent like Qwen Code 0.24.4: no `systemPrompt`, its own `agentInfo`, sessions listed with the first
/// prompt's first text block cut to 200 code points as title and preview, a load that replays each prompt part.
fn qwen_like() -> impl FnMut(&str) -> Vec<String> + Send + 'static {
    let mut first: Option<String> = None;
    move |line| {
        let msg = read(line);
        let Some(id) = msg.get("id").cloned() else { return Vec::new() };
        match msg["method"].as_str().unwrap_or("") {
            "initialize" => vec![answer(
                &id,
                json!({"protocolVersion": 1,
                "agentInfo": {"name": "qwen-code", "title": "Qwen Code", "version": "0.24.4"},
                "agentCapabilities": {"loadSession": true, "sessionCapabilities": {"list": {}, "resume": {}}}}),
            )],
            "session/new" => vec![answer(&id, json!({"sessionId": "q1"}))],
            "session/prompt" => {
                let text = msg.pointer("/params/prompt/0/text").and_then(Value::as_str).unwrap_or("").to_owned();
                first.get_or_insert(text);
                vec![answer(&id, json!({"stopReason": "end_turn"}))]
            }
            "session/list" => {
                let title: String = first.clone().unwrap_or_default().chars().take(200).collect::<String>() + "...";
                vec![answer(
                    &id,
                    json!({"sessions": [{"sessionId": "q1", "cwd": "/w", "title": title,
                    "_meta": {"preview": title, "startTime": "2026-12-04T00:00:00.000Z"}}]}),
                )]
            }
            "session/load" => {
                let parts = [first.clone().unwrap_or_default(), FIRST_PROMPT.to_owned()];
                let mut out: Vec<String> = parts
                    .iter()
                    .map(|t| {
                        update(
                            "q1",
                            json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": t}}),
                        )
                    })
                    .collect();
                out.push(answer(&id, json!({})));
                out
            }
            _ => vec![json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "nope"}}).to_string()],
        }
    }
}

#[tokio::test(start_paused = true)]
async fn qwen_gets_the_instruction_once_and_no_title_or_replay_shows_it() {
    let mut s = acp("qwen", nowhere(), qwen_like());
    let caps: Value = serde_json::from_str(CODA_CAPS).unwrap();
    let (init, _) = s.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": caps})).await;
    let result = &init["result"];
    assert_eq!(result["agentInfo"], json!({"name": "qwen-code", "title": "Qwen Code", "version": "0.24.4"}));
    assert_eq!(result.pointer("/agentCapabilities/sessionCapabilities/systemPrompt"), Some(&json!({})));
    assert_eq!(result.pointer("/agentCapabilities/_meta/coda/waits"), Some(&json!({})));
    let sp = json!({"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]});
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": [], "systemPrompt": sp})).await;
    assert_eq!(new["result"]["sessionId"], "q1");
    s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
        "params": {"sessionId": "q1", "prompt": [{"type": "text", "text": FIRST_PROMPT}]}}));
    let (done, _, to_agent) = s.answer_to(&json!(2)).await;
    assert_eq!(done["result"]["stopReason"], "end_turn");
    let sent = to_agent.iter().map(|l| read(l)).find(|v| v["method"] == "session/prompt").expect("the prompt");
    let blocks = sent["params"]["prompt"].as_array().expect("blocks");
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0]["text"], crate::coda::instruction::wrap(INSTRUCTION));
    assert_eq!(blocks[1]["text"], FIRST_PROMPT);
    let (second, _, to_agent) = {
        s.send_json(&json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
            "params": {"sessionId": "q1", "prompt": [{"type": "text", "text": "again"}]}}));
        s.answer_to(&json!(3)).await
    };
    assert_eq!(second["result"]["stopReason"], "end_turn");
    assert!(!to_agent.iter().any(|l| l.contains("coda-session-instruction")), "only the first prompt carries it");
    // The list: title and preview were cut from the instruction; they are blanked.
    let (list, _) = s.request(4, "session/list", json!({"cwd": "/w"})).await;
    assert_eq!(list["result"]["sessions"][0]["title"], "");
    assert_eq!(list["result"]["sessions"][0]["_meta"]["preview"], "");
    // A load replays the prompt's parts: the instruction part goes, the user's stays.
    let (loaded, before) = s
        .request(5, "session/load", json!({"sessionId": "q1", "cwd": "/w", "mcpServers": [], "systemPrompt": sp}))
        .await;
    assert_eq!(loaded["result"], json!({}));
    let texts: Vec<&Value> = before.iter().filter_map(|v| v.pointer("/params/update/content/text")).collect();
    assert_eq!(texts, [&json!(FIRST_PROMPT)]);
    assert_eq!(s.close().await, 0);
}

/// An agent like Claude Agent ACP 0.101.0: takes `systemPrompt` itself, names its adapter package in `agentInfo`,
/// and runs subagents as standard child sessions for a client that declared `subagents`.
fn claude_like(seen: std::sync::Arc<std::sync::Mutex<Vec<Value>>>) -> impl FnMut(&str) -> Vec<String> + Send + 'static {
    move |line| {
        let msg = read(line);
        seen.lock().expect("lock").push(msg.clone());
        let method = msg["method"].as_str().unwrap_or("").to_owned();
        let Some(id) = msg.get("id").cloned() else {
            // `session/cancel` of the child: it goes idle, cancelled.
            if method == "session/cancel" && msg["params"]["sessionId"] == "child" {
                return vec![update(
                    "root",
                    json!({"sessionUpdate": "subagent_update", "sessionId": "child",
                    "state": {"state": "idle", "stopReason": "cancelled"}}),
                )];
            }
            return Vec::new();
        };
        match method.as_str() {
            "initialize" => vec![answer(&id, json!({"protocolVersion": 1,
                "agentInfo": {"name": "@agentclientprotocol/claude-agent-acp", "title": "Claude Agent", "version": "0.101.0"},
                "agentCapabilities": {"loadSession": true, "sessionCapabilities": {"close": {}, "systemPrompt": {"mode": {"override": {}}}}},
                "_meta": {"steering": {"supported": true}}}))],
            "session/new" => vec![answer(&id, json!({"sessionId": "root"}))],
            "session/prompt" => vec![
                // With a number no f64 holds and some nesting in its `_meta`.
                r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"root","update":{"sessionUpdate":"subagent_update","sessionId":"child","title":"评审 🙂","description":"general-purpose","capabilities":{"cancel":{}},"state":{"state":"running"},"_meta":{"n":1e400,"deep":[[[[[[[[[[1]]]]]]]]]]}}}}"#.to_owned(),
                update("child", json!({"sessionUpdate": "session_message", "messageId": "toolu_1", "senderSessionId": "root",
                    "recipientSessionId": "child", "content": [{"type": "text", "text": "look at the tests"}]})),
                json!({"jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission", "params": {"sessionId": "child",
                    "toolCall": {"toolCallId": "t1"}, "options": [{"optionId": "a", "name": "Allow", "kind": "allow_once"}]}}).to_string(),
                // A lone surrogate escape, as a peer may send one.
                r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"child","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"\ud800?"}}}}"#.to_owned(),
                answer(&id, json!({"stopReason": "end_turn"})),
            ],
            _ => vec![json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "nope"}}).to_string()],
        }
    }
}

/// A folder where `command` finds the Claude Agent SDK beside the adapter's script, as npm installs it.
fn claude_install() -> (tempfile::TempDir, AgentCommand) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let modules = dir.path().join("node_modules");
    let script = modules.join("@agentclientprotocol/claude-agent-acp/dist/index.js");
    std::fs::create_dir_all(script.parent().expect("a folder")).expect("folders");
    std::fs::write(&script, "").expect("the script");
    let sdk = modules.join("@anthropic-ai/claude-agent-sdk");
    std::fs::create_dir_all(&sdk).expect("folders");
    std::fs::write(sdk.join("package.json"), r#"{"version":"0.3.318","claudeCodeVersion":"2.1.318"}"#)
        .expect("manifest");
    let command = AgentCommand { program: "/usr/bin/node".into(), args: vec![script.display().to_string()] };
    (dir, command)
}

#[tokio::test(start_paused = true)]
async fn claude_keeps_the_instruction_natively_names_claude_code_and_its_subagents_are_waits() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (_dir, command) = claude_install();
    let mut s = acp("claude", command, claude_like(seen.clone()));
    let caps: Value = serde_json::from_str(CODA_CAPS).unwrap();
    let (init, _) = s.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": caps})).await;
    assert_eq!(init["result"]["agentInfo"], json!({"name": "claude-code", "version": "2.1.318"}));
    assert_eq!(init["result"]["_meta"]["steering"], json!({"supported": true}), "kept as the agent said it");
    assert_eq!(
        init["result"].pointer("/agentCapabilities/sessionCapabilities/systemPrompt"),
        Some(&json!({"mode": {"override": {}}})),
        "the agent's own declaration"
    );
    let sent_init = seen.lock().unwrap()[0].clone();
    assert_eq!(sent_init.pointer("/params/clientCapabilities/subagents"), Some(&json!({})));
    assert_eq!(sent_init.pointer("/params/clientCapabilities/_meta/coda/waits"), Some(&json!({})));

    let sp = json!({"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]});
    s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": [], "systemPrompt": sp.clone()})).await;
    assert_eq!(seen.lock().unwrap()[1]["params"]["systemPrompt"], sp, "passed on untouched");

    s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
        "params": {"sessionId": "root", "prompt": [{"type": "text", "text": FIRST_PROMPT}]}}));
    let got = s.drive().await;
    let frames = got.client_json();
    assert!(!got.to_client.iter().any(|l| l.contains("subagent_update")), "never reaches Coda");
    let wait = &frames[0];
    assert_eq!(wait["method"], "_coda/wait");
    assert_eq!(wait["params"]["sessionId"], "root");
    assert_eq!(wait["params"]["childSessionId"], "child");
    assert_eq!(wait["params"]["kind"], "subagent");
    assert_eq!(wait["params"]["title"], "评审 🙂");
    assert_eq!(wait["params"]["stoppable"], true);
    assert_eq!(frames[1].pointer("/params/update/sessionUpdate"), Some(&json!("user_message_chunk")));
    assert_eq!(frames[1].pointer("/params/update/content/text"), Some(&json!("look at the tests")));
    assert_eq!(frames[2]["method"], "session/request_permission", "the child's request reaches Coda as the child's");
    assert_eq!(frames[2]["params"]["sessionId"], "child");
    assert!(got.to_client[3].contains(r"\ud800"), "the child's chunk byte for byte: {}", got.to_client[3]);
    assert_eq!(frames[4]["id"], 2);
    let prompt = seen.lock().unwrap().iter().find(|v| v["method"] == "session/prompt").cloned().expect("the prompt");
    assert_eq!(prompt["params"]["prompt"], json!([{"type": "text", "text": FIRST_PROMPT}]), "nothing injected");

    // Coda stops the child: the agent gets `session/cancel` of the child, Coda `{}` and then the end.
    let wait_id = wait["params"]["waitId"].clone();
    let (stopped, _) = s.request(3, "_coda/wait/stop", json!({"sessionId": "root", "waitId": wait_id})).await;
    assert_eq!(stopped["result"], json!({}));
    let got = s.drive().await.client_json();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["params"], json!({"sessionId": "root", "waitId": wait_id, "state": "cancelled"}));
    assert!(
        seen.lock().unwrap().iter().any(|v| v["method"] == "session/cancel" && v["params"]["sessionId"] == "child")
    );
    // A second stop of the ended wait: `{}` from the engine, nothing to the agent.
    let before = seen.lock().unwrap().len();
    let (again, _) = s.request(4, "_coda/wait/stop", json!({"sessionId": "root", "waitId": wait_id})).await;
    assert_eq!(again["result"], json!({}));
    assert_eq!(seen.lock().unwrap().len(), before);
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn without_coda_waits_the_agent_is_not_told_about_subagents_and_nothing_is_translated() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut s = acp("claude", nowhere(), claude_like(seen.clone()));
    let (init, _) = s.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})).await;
    assert!(
        init["result"].get("agentInfo").is_none(),
        "no version of Claude Code found: no agentInfo, not the adapter's"
    );
    assert!(seen.lock().unwrap()[0].pointer("/params/clientCapabilities/subagents").is_none());
    s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []})).await;
    s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
        "params": {"sessionId": "root", "prompt": [{"type": "text", "text": "hi"}]}}));
    let got = s.drive().await;
    assert!(got.to_client[0].contains("subagent_update"), "passed as it came: {}", got.to_client[0]);
    assert!(!got.to_client.iter().any(|l| l.contains("_coda/wait")));
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn hostile_subagent_updates_never_panic_and_answers_keep_their_order() {
    let mut s = acp("gemini", nowhere(), |line: &str| {
        let msg = read(line);
        let Some(id) = msg.get("id").cloned() else { return Vec::new() };
        match msg["method"].as_str().unwrap_or("") {
            "initialize" => vec![answer(&id, json!({"protocolVersion": 1}))],
            _ => vec![
                update("s", json!({"sessionUpdate": "subagent_update"})),
                update("s", json!({"sessionUpdate": "subagent_update", "sessionId": ["x"]})),
                update(
                    "s",
                    json!({"sessionUpdate": "subagent_update", "sessionId": "s", "state": {"state": "running"}}),
                ),
                format!(
                    r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"subagent_update","sessionId":"c","title":"{}","state":{{"state":"running","stopReason":1e400}}}}}}}}"#,
                    "t".repeat(5000)
                ),
                json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": "x"}})
                    .to_string(),
                answer(&id, json!({"stopReason": "end_turn"})),
            ],
        }
    });
    let caps: Value = serde_json::from_str(CODA_CAPS).unwrap();
    s.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": caps})).await;
    let (end, before) = s.request(1, "session/prompt", json!({"sessionId": "s", "prompt": []})).await;
    assert_eq!(end["result"]["stopReason"], "end_turn");
    assert_eq!(before.len(), 2, "one wait, and the malformed update passed on as it came: {before:?}");
    assert_eq!(before[0]["params"]["title"].as_str().map(|t| t.chars().count()), Some(crate::coda::wait::MAX_TITLE));
    assert_eq!(before[1]["params"]["update"], "x");
    assert_eq!(s.close().await, 0);
}

/// An agent that retries a failed model request by itself and says nothing of it over ACP (Gemini CLI's 503,
/// Claude Agent ACP's 429 and 503 with Claude Code's default retries, Qwen Code's for about 40 minutes): its prompt stays
/// unanswered until `_test/give_up` makes it answer with `error`.
fn retrying_silently(error: Value) -> impl FnMut(&str) -> Vec<String> + Send + 'static {
    let mut open: Option<Value> = None;
    move |line| {
        let msg = read(line);
        let method = msg["method"].as_str().unwrap_or("").to_owned();
        match (msg.get("id").cloned(), method.as_str()) {
            (Some(id), "initialize") => vec![answer(&id, json!({"protocolVersion": 1}))],
            (Some(id), "session/new") => vec![answer(&id, json!({"sessionId": "s"}))],
            (Some(id), "session/prompt") => {
                open = Some(id);
                Vec::new()
            }
            (None, "session/cancel") => {
                open.take().map(|id| answer(&id, json!({"stopReason": "cancelled"}))).into_iter().collect()
            }
            (None, "_test/give_up") => open
                .take()
                .map(|id| json!({"jsonrpc": "2.0", "id": id, "error": error.clone()}).to_string())
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The failure machine's one-minute rule counts retries the agent reports; these agents report none, so a
/// silent turn is never failed by the shim (no kind is guessed from silence): the turn stays Coda's to cancel,
/// and the agent's own error answer, when it comes, carries the kind its explicit signal names.
#[tokio::test(start_paused = true)]
async fn a_turn_the_agent_retries_silently_is_never_failed_by_the_shim_and_its_answer_carries_the_kind() {
    let gemini_503 = json!({"code": 503, "message": "The model is overloaded. Please try again later."});
    let claude_429 = json!({"code": -32603, "message": "Internal error: API Error: Request rejected (429) · This request would exceed your account's usage limit.",
        "data": {"errorKind": "rate_limit"}});
    for (profile, error) in [("gemini", gemini_503), ("claude", claude_429), ("qwen", Value::Null)] {
        let mut s = acp(profile, nowhere(), retrying_silently(error.clone()));
        s.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})).await;
        s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []})).await;
        s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
            "params": {"sessionId": "s", "prompt": [{"type": "text", "text": "go"}]}}));
        // Four minutes of virtual time (Gemini CLI's 503 took about that): nothing to Coda, nothing to the agent.
        let got = s.drive_for(std::time::Duration::from_secs(240)).await;
        assert!(got.client_json().is_empty(), "{profile}: {:?}", got.to_client);
        assert!(!got.agent_json().iter().any(|(_, v)| v["method"] == "session/cancel"), "{profile}: never stopped");
        if error.is_null() {
            // Qwen Code never gives up: Coda's cancel ends the turn.
            s.send_json(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}}));
            let (done, _, _) = s.answer_to(&json!(2)).await;
            assert_eq!(done["result"]["stopReason"], "cancelled", "{profile}");
        } else {
            s.send_json(&json!({"jsonrpc": "2.0", "method": "_test/give_up", "params": {}}));
            let (done, _, _) = s.answer_to(&json!(2)).await;
            assert_eq!(done["error"]["code"], -32603, "{profile}: {done}");
            assert_eq!(done["error"]["message"], error["message"], "{profile}: {done}");
            assert_eq!(
                done.pointer("/error/data/_meta/coda/failure"),
                Some(&json!({"kind": "service_unavailable", "input": "accepted"})),
                "{profile}: {done}"
            );
        }
        assert_eq!(s.close().await, 0, "{profile}");
    }
}

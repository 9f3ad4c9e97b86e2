//! Issue 13, sections 1 and 2, on the four binaries against the scripted test agent: a line nested far
//! too deep (20,000 levels, 20-140 KB) from either peer is refused like an over-size frame and the shim
//! lives on; a frame a layer must rewrite is read whatever the frame check accepted (a number beyond f64,
//! 200 levels of nesting, a lone UTF-16 surrogate escape), so it is rewritten, never passed on untouched.
//! Deep frames from either peer and a lone surrogate no layer rewrites are tested with each binary's stack on
//! the in-memory relay, `src/relay/behaviour.rs`.

use crate::support;

use support::{shim, temp};

use std::time::Duration;

use serde_json::{Value, json};
use shim::{prompt_params, received_prompt, with_test_agent};

const BINARIES: [&str; 4] = ["codex", "kimi", "grok", "opencode"];
/// The binaries that inject the session instruction themselves (codex-acp takes it natively).
const INJECTING: [&str; 3] = ["kimi", "grok", "opencode"];

/// Coda's session instruction as it really comes: paragraphs of Markdown with CJK text and emoji, > 2 KB.
fn instruction() -> String {
    let paragraph =
        "## 工作方式 🧭\n\n- 先读代码，再改代码；每一步都说明原因。✅\n- Keep answers short, cite files by path.\n\n";
    paragraph.repeat(16)
}

fn deep_object(levels: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
}

/// `_meta` that a layer cannot read with serde_json's defaults: a number beyond f64, an exact decimal
/// and 200 levels of objects.
fn hostile_meta() -> String {
    format!(r#"{{"n":1e400,"exact":1.50,"deep":{}}}"#, deep_object(200))
}

/// What `hostile_meta` must still say after a rewrite: each number exactly as the peer spelled it (serde_json
/// alone would write 1e400 as 1e+400).
fn assert_meta_kept(line: &str, meta: &Value) {
    let n_kept = [",", "}"].iter().any(|end| line.contains(&format!(r#""n":1e400{end}"#)));
    assert!(n_kept && line.contains(r#""exact":1.50"#), "numbers kept: {line:.300}");
    let deep: Value = coda_shim::json::from_str(&deep_object(200)).unwrap();
    assert_eq!(meta["deep"], deep, "the deep part is kept");
}

fn init_line(id: u64, params_meta: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{"_meta":{{"coda":{{"waits":{{}}}}}}}},"_meta":{params_meta}}}}}"#
    )
}

/// The lines the test agent received, read with the shim's bound.
fn received(log: &std::path::Path) -> Vec<(String, Value)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().map(|l| (l.to_owned(), coda_shim::json::from_str(l).expect("the agent got JSON"))).collect()
}

fn received_method(log: &std::path::Path, method: &str) -> Vec<(String, Value)> {
    received(log).into_iter().filter(|(_, v)| v["method"] == method).collect()
}

/// Closing stdin ends the session the normal way: the child is stopped and reaped, the shim exits 0.
fn ends_cleanly(mut s: shim::Shim) -> Vec<String> {
    s.close_stdin();
    let _ = s.rest();
    assert_eq!(s.wait(Duration::from_secs(15)).code(), Some(0), "the shim is alive and ends cleanly");
    s.stderr_to_the_end()
}

#[test]
fn session_instruction_is_checked_stripped_and_injected_whatever_else_the_params_hold() {
    let sp = json!({"mode": "append", "content": [{"type": "text", "text": instruction()}]});
    for bin in INJECTING {
        let dir = temp::TempDir::new("depth-instruction");
        let log = dir.join("received.jsonl");
        let mut s = with_test_agent(bin).env("TEST_AGENT_LOG", log.to_str().unwrap()).start();
        s.send(&init_line(0, "{}"));
        let _ = s.recv_json();
        let new = |id: u64, sp: &Value, meta: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"session/new","params":{{"cwd":"/w","mcpServers":[],"systemPrompt":{sp},"_meta":{meta}}}}}"#
            )
        };
        // An invalid systemPrompt is refused, not answered by the child.
        s.send(&new(1, &json!("NOT-AN-OBJECT"), &hostile_meta()));
        let e = s.recv_json();
        assert_eq!((&e["id"], &e["error"]["code"]), (&json!(1), &json!(-32602)), "{bin}: {e}");
        assert!(received_method(&log, "session/new").is_empty(), "{bin}: not forwarded");
        // A valid one is taken out of what the child gets, and the rest kept.
        s.send(&new(2, &sp, &hostile_meta()));
        let answer = s.recv_json();
        let sid = answer["result"]["sessionId"].as_str().expect("a session").to_owned();
        let got = received_method(&log, "session/new");
        let (line, v) = got.last().expect("the child got session/new");
        assert!(v["params"].get("systemPrompt").is_none(), "{bin}: stripped");
        assert_meta_kept(line, &v["params"]["_meta"]);
        // And injected into the first prompt.
        let (_, before) = s.request(3, "session/prompt", prompt_params(&sid, "hello"));
        let prompt = received_prompt(&before);
        let first = prompt[0]["text"].as_str().unwrap_or_default();
        assert!(first.starts_with("<coda-session-instruction>\n## 工作方式 🧭"), "{bin}: {prompt}");
        assert_eq!(prompt[1]["text"], "hello");
        ends_cleanly(s);
    }
}

/// The frames the shim writes until the answer to `id`, as JSON (a line with a lone surrogate escape read as
/// the shim reads it), and that answer.
fn until_answer(s: &mut shim::Shim, id: u64) -> (Value, Vec<Value>) {
    let mut before = Vec::new();
    loop {
        let line = s.recv();
        let v: Value = coda_shim::json::from_slice(&coda_shim::json::mend_surrogates(line.as_bytes()))
            .unwrap_or_else(|e| panic!("the shim wrote a line that is not JSON ({e}): {line:.300}"));
        if v["id"] == json!(id) && v.get("method").is_none() {
            return (v, before);
        }
        before.push(v);
    }
}

#[test]
fn a_lone_surrogate_is_read_as_u_fffd_and_the_frame_is_acted_on() {
    // A lone UTF-16 surrogate escape: valid for the frame check (`src/scan.rs`), refused by serde_json alone;
    // the shim reads it as U+FFFD, and a frame it rewrites carries U+FFFD (the test agent reads only that).
    let sp = json!({"mode": "append", "content": [{"type": "text", "text": instruction()}]});
    for bin in INJECTING {
        let dir = temp::TempDir::new("depth-lone-surrogate");
        let log = dir.join("received.jsonl");
        let mut s = with_test_agent(bin).env("TEST_AGENT_LOG", log.to_str().unwrap()).start();
        s.send(&init_line(0, "{}"));
        let _ = s.recv_json();
        // session/new: its systemPrompt is checked and stripped, the rest kept, the lone half as U+FFFD.
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"session/new","params":{{"cwd":"/w","mcpServers":[],"systemPrompt":{sp},"_meta":{{"s":"\ud800","pair":"\ud83d\ude00"}}}}}}"#
        ));
        let (answer, _) = until_answer(&mut s, 1);
        let sid = answer["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{bin}: a session: {answer}"));
        let sid = sid.to_owned();
        let got = received_method(&log, "session/new");
        let (line, v) = got.last().expect("the child got session/new");
        assert!(v["params"].get("systemPrompt").is_none(), "{bin}: stripped: {line:.300}");
        assert_eq!(v["params"]["_meta"], json!({"s": "\u{FFFD}", "pair": "😀"}), "{bin}: {line:.300}");
        // session/prompt: the lone half in the user's text, which a layer must rewrite to inject the instruction.
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"hello \udc00 there"}}]}}}}"#
        ));
        let (answer, before) = until_answer(&mut s, 3);
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{bin}: handled as any prompt: {answer}");
        let prompt = received_prompt(&before);
        let first = prompt[0]["text"].as_str().unwrap_or_default();
        assert!(first.starts_with("<coda-session-instruction>\n## 工作方式 🧭"), "{bin}: injected: {prompt}");
        assert_eq!(prompt[1]["text"], "hello \u{FFFD} there", "{bin}: {prompt}");
        ends_cleanly(s);
    }
}

#[test]
fn initialize_is_rewritten_both_ways_whatever_else_it_holds() {
    let answer = format!(
        r#"{{"protocolVersion":1,"agentCapabilities":{{"loadSession":true}},"agentInfo":{{"name":"@agentclientprotocol/codex-acp","version":"2.6.0"}},"_meta":{{"jetbrains":{{"air":{{"version":1,"capabilities":["nativeSubagentSessions","asyncTasks"]}}}},"n":1e400,"exact":1.50,"deep":{}}}}}"#,
        deep_object(200)
    );
    for bin in BINARIES {
        let dir = temp::TempDir::new("depth-initialize");
        let log = dir.join("received.jsonl");
        let mut s =
            with_test_agent(bin).env("TEST_AGENT_LOG", log.to_str().unwrap()).env("TEST_AGENT_INIT", &answer).start();
        s.send(&init_line(0, &hostile_meta()));
        let line = s.recv();
        let v: Value = coda_shim::json::from_str(&line).unwrap();
        // Every binary that reports activity declares it (Coda's 等待 handshake) in the rewritten answer.
        assert_eq!(v["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}), "{bin}: {line:.400}");
        assert_meta_kept(&line, &v["result"]["_meta"]);
        if bin == "codex" {
            // Codex's layer names the agent (or, with no Codex CLI found here, leaves the adapter's name out),
            // and asks codex-acp for AIR reports in the request it forwards.
            assert!(v["result"].get("agentInfo").is_none_or(|i| i["name"] == "codex"), "{line:.400}");
            let got = received_method(&log, "initialize");
            let (sent, request) = got.last().expect("the child got initialize");
            let air = &request["params"]["clientCapabilities"]["_meta"]["jetbrains"]["air"]["capabilities"];
            assert!(air.as_array().is_some_and(|c| !c.is_empty()), "{sent:.300}");
            assert_meta_kept(sent, &request["params"]["_meta"]);
        } else {
            assert_eq!(v["result"]["agentCapabilities"]["sessionCapabilities"]["systemPrompt"], json!({}), "{bin}");
        }
        ends_cleanly(s);
    }
}

#[test]
fn codex_failure_is_classified_whatever_else_the_answer_holds() {
    let failure = r#"{"actions":[],"category":"limit","id":"t:error","revision":1,"severity":"error","title":"You’ve hit your usage limit. Try again later."}"#;
    let result = format!(
        r#"{{"stopReason":"end_turn","usage":null,"_meta":{{"jetbrains":{{"air":{{"version":1,"sessionFailure":{failure}}}}},"n":1e400,"deep":{}}}}}"#,
        deep_object(200)
    );
    let mut s = with_test_agent("codex").env("TEST_AGENT_PROMPT_RESULT", &result).start();
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let (answer, _) = s.request(2, "session/prompt", prompt_params(&sid, "hello"));
    assert!(answer.get("result").is_none(), "the failure became an error: {answer:.300}");
    assert!(answer["error"].to_string().contains("quota_exhausted"), "{answer:.300}");
    ends_cleanly(s);
}

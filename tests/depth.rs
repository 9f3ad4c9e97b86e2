//! Issue 13, sections 1 and 2, on the four binaries against the scripted test agent: a line nested far
//! too deep (20,000 levels, 20-140 KB) from either peer is refused like an over-size frame and the shim
//! lives on; a frame a layer must rewrite is read whatever the frame check accepted (a number beyond f64,
//! 200 levels of nesting, a lone UTF-16 surrogate escape), so it is rewritten, never passed on untouched.

use crate::support;

use support::{shim, temp};

use std::time::Duration;

use serde_json::{Value, json};
use shim::{prompt_params, received_prompt, with_test_agent};

const BINARIES: [&str; 4] = ["codex", "kimi", "grok", "opencode"];
/// The binaries that inject the session instruction themselves (codex-acp takes it natively).
const INJECTING: [&str; 3] = ["kimi", "grok", "opencode"];
/// Far over the shim's limit (1,000): this deep used to overflow a thread's stack and abort the shim.
const DEEP: usize = 20_000;

/// Coda's session instruction as it really comes: paragraphs of Markdown with CJK text and emoji, > 2 KB.
fn instruction() -> String {
    let paragraph =
        "## 工作方式 🧭\n\n- 先读代码，再改代码；每一步都说明原因。✅\n- Keep answers short, cite files by path.\n\n";
    paragraph.repeat(16)
}

fn deep_array(levels: usize) -> String {
    format!("{}{}", "[".repeat(levels), "]".repeat(levels))
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
fn deep_frames_from_the_client_are_refused_like_over_size_ones_and_the_shim_lives_on() {
    for bin in BINARIES {
        let mut s = with_test_agent(bin).start();
        // A request: -32600 with its id (read cheaply before the deep part).
        s.send(&format!(r#"{{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{}}}"#, deep_array(DEEP)));
        let e = s.recv_json();
        assert_eq!((&e["id"], &e["error"]["code"]), (&json!(1), &json!(-32600)), "{bin}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().contains("deeper than 1000 levels"), "{bin}: {e}");
        // A valid notification whose params nest 20,000 objects: dropped (JSON-RPC answers no notification).
        s.send(&format!(r#"{{"jsonrpc":"2.0","method":"_x/note","params":{}}}"#, deep_object(DEEP)));
        // A bare line of `[`, never closed, is not JSON: -32700 with id null; 20,000 closed `[`, JSON but no
        // JSON-RPC message: -32600 with id null. Each once.
        s.send(&"[".repeat(DEEP));
        s.send(&deep_array(DEEP));
        let (seen, before) = s.request(2, "_test/seen", json!({}));
        let codes: Vec<_> = before.iter().map(|e| (e["id"].clone(), e["error"]["code"].clone())).collect();
        assert_eq!(codes, [(json!(null), json!(-32700)), (json!(null), json!(-32600))], "{bin}: {before:?}");
        // The next frame is relayed, and nothing deep reached the agent.
        let methods = seen["result"]["methods"].as_array().expect("the agent answered").clone();
        assert!(!methods.iter().any(|m| m == "_test/echo" || m == "_x/note"), "{bin}: {methods:?}");
        let stderr = ends_cleanly(s);
        let warnings = stderr.iter().filter(|l| l.contains("client sent a frame") && l.contains("deeper than 1000"));
        assert_eq!(warnings.count(), 3, "{bin}: one warning per deep frame: {stderr:?}");
        let unclosed = stderr.iter().filter(|l| l.contains("client sent an invalid frame") && l.contains("left open"));
        assert_eq!(unclosed.count(), 1, "{bin}: {stderr:?}");
    }
}

#[test]
fn deep_frames_from_the_agent_are_dropped_and_the_request_they_answer_gets_an_error() {
    for bin in BINARIES {
        let mut s = with_test_agent(bin).start();
        for (id, object) in [(3, false), (4, true)] {
            let mut params = json!({"depth": DEEP});
            if object {
                params["object"] = json!(true);
            }
            let (answer, _) = s.request(id, "_test/nest", params);
            assert_eq!(answer["error"]["code"], -32603, "{bin}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("dropped") && message.contains("deeper than 1000 levels"), "{bin}: {message}");
        }
        // A valid notification nesting 20,000 objects from the agent: dropped; the agent's answer after it comes.
        let update = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{}}}"#, deep_object(DEEP));
        let (answer, before) = s.request(5, "_test/emit", json!({ "line": update }));
        assert_eq!((answer["result"].clone(), before.len()), (json!({}), 0), "{bin}: {answer}");
        // Within the limit, a deep answer passes as it came.
        s.send_json(&json!({"jsonrpc": "2.0", "id": 6, "method": "_test/nest", "params": {"depth": 900}}));
        assert_eq!(s.recv(), format!(r#"{{"jsonrpc":"2.0","id":6,"result":{}1{}}}"#, "[".repeat(900), "]".repeat(900)));
        let stderr = ends_cleanly(s);
        assert!(stderr.iter().filter(|l| l.contains("agent sent a frame")).count() >= 3, "{bin}: {stderr:?}");
    }
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
fn a_frame_with_a_lone_surrogate_no_layer_rewrites_goes_on_byte_for_byte() {
    for bin in BINARIES {
        let dir = temp::TempDir::new("depth-lone-surrogate-kept");
        let log = dir.join("received.jsonl");
        let mut s = with_test_agent(bin).env("TEST_AGENT_LOG", log.to_str().unwrap()).start();
        // From the client: a notification no layer edits reaches the agent as it was sent, escapes and all.
        let note = r#"{"jsonrpc":"2.0","method":"_x/note","params":{"a":"x\ud800y","b":"\udc00\ud800","pair":"\uD83D\uDE00","text":"\\ud800"}}"#;
        s.send(note);
        // The agent (which cannot read the note) answers the next request: by then it logged the note.
        let (seen, _) = s.request(1, "_test/seen", json!({}));
        assert!(seen["result"]["methods"].is_array(), "{bin}: {seen}");
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(logged.lines().find(|l| l.contains("_x/note")), Some(note), "{bin}: byte for byte");
        // From the agent: a streamed chunk no layer edits reaches the client as the agent wrote it.
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-x","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"\udbff end \ud800"}}}}"#;
        s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "_test/emit", "params": {"line": chunk}}));
        assert_eq!(s.recv(), chunk, "{bin}: byte for byte");
        assert_eq!(s.recv_json(), json!({"jsonrpc": "2.0", "id": 2, "result": {}}), "{bin}");
        let stderr = ends_cleanly(s);
        assert!(!stderr.iter().any(|l| l.contains("cannot read")), "{bin}: no warning: {stderr:?}");
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

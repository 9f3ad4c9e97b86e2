//! The relay's behaviour with the binaries' own stacks (coda-opencode's, or each of the four), on in-memory
//! pipes and virtual time ([`super::testing::Pair`]): what frames do, which needs no process. What only a
//! process shows (signals, process groups, pipes, stderr, exit codes, memory) stays in `tests/relay.rs` and
//! `tests/faults.rs`. The frames that nest too deep, the lone surrogate escapes and the hostile `_meta` beside
//! frames the layers rewrite (issue 13, sections 1 and 2) run on each binary's stack.

use serde_json::{Value, json};

use super::testing::{Pair, TestAgent};
use crate::child::AgentCommand;

/// The four binaries, by agent.
const BINARIES: [&str; 4] = ["codex", "kimi", "grok", "opencode"];
/// Far over the shim's limit (1,000): this deep used to overflow a thread's stack and abort the shim.
const DEEP: usize = 20_000;

/// The stack of `coda-<agent>` (as its binary stacks it over the test agent) with the scripted agent.
fn shim(agent: &str) -> Pair {
    shim_with(agent, crate::lines::DEFAULT_MAX_LINE, TestAgent::default())
}

/// [`shim`] with `--max-frame-bytes` and an agent of the test's.
fn shim_with(agent: &str, max_line: usize, test_agent: impl super::testing::Agent) -> Pair {
    let command = AgentCommand { program: "test-agent".into(), args: Vec::new() };
    let adapter = crate::adapters::by_agent(agent).expect("an adapter");
    // The tested version, as the simulator hands it: no probe runs on a thread of its own (see `relay::testing`).
    let (stack, events) = adapter.stack(&command, Some(adapter.tested.version.to_owned()));
    Pair::with(stack, events, max_line, test_agent)
}

fn opencode() -> Pair {
    shim("opencode")
}

fn opencode_with(max_line: usize) -> Pair {
    shim_with("opencode", max_line, TestAgent::default())
}

fn deep_array(levels: usize) -> String {
    format!("{}{}", "[".repeat(levels), "]".repeat(levels))
}

fn deep_object(levels: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
}

fn json(line: &str) -> Value {
    crate::json::from_str(line).expect("JSON")
}

fn prompt_params(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

fn is_chunk(v: &Value) -> bool {
    v.pointer("/params/update/sessionUpdate") == Some(&json!("agent_message_chunk"))
}

async fn new_session(s: &mut Pair, id: i64) -> String {
    let (new, _) = s.request(id, "session/new", json!({"cwd": "/w", "mcpServers": []})).await;
    new["result"]["sessionId"].as_str().expect("a session").to_owned()
}

/// Drives the session: the client gets one frame, the answer to a `_test/seen` that is the first frame
/// the agent received.
async fn only_seen(s: &mut Pair, why: &str) {
    let got = s.drive().await.client_json();
    assert_eq!(got.len(), 1, "{why}: {got:?}");
    assert_eq!(got[0]["result"]["methods"], json!(["_test/seen"]), "{why}");
}

/// Frames the client got that are errors, as (id, code).
fn errors(got: &[Value]) -> Vec<(Value, Value)> {
    got.iter().map(|e| (e["id"].clone(), e["error"]["code"].clone())).collect()
}

#[tokio::test(start_paused = true)]
async fn unchanged_frames_pass_byte_for_byte_both_ways() {
    let mut s = opencode();
    // Odd number formats, key order, escapes and unicode, a null id: all kept.
    let odd = r#"{"jsonrpc":"2.0","id":1.0e0,"method":"_test/echo","params":{"z":1.50,"a":[-0.0,1E+2,123456789012345678901234],"s":"\u00e9\ud83d\ude00\/","_meta":{"x.ai/k":[]}}}"#;
    s.send(odd);
    let got = s.drive().await;
    assert_eq!(got.to_agent, [odd], "the agent got the exact bytes");
    assert_eq!(got.client_json().len(), 1);
    assert_eq!(got.client_json()[0]["result"]["line"], odd);

    let weird = r#"{"method":"_x.ai/session_notification","params":{"b":2,"a":"\u0041","n":10.000},"jsonrpc":"2.0"}"#;
    s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "_test/emit", "params": {"line": weird}}));
    let got = s.drive().await;
    assert_eq!(got.to_client.len(), 2, "{got:?}");
    assert_eq!(got.to_client[0], weird, "the client got the exact bytes");

    let null_id = r#"{"jsonrpc":"2.0","id":null,"method":"_test/echo"}"#;
    s.send(null_id);
    let got = s.drive().await;
    assert_eq!(got.to_agent, [null_id]);
    let answer = &got.client_json()[0];
    assert_eq!(answer["id"], Value::Null);
    assert_eq!(answer["result"]["line"], null_id);
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn batches_are_forwarded_whole() {
    let mut s = opencode();
    let batch = r#"[{"jsonrpc":"2.0","method":"_x/one"},{"jsonrpc":"2.0","method":"_x/two"}]"#;
    s.send(batch);
    let (seen, _) = s.request(1, "_test/seen", json!({})).await;
    assert_eq!(seen["result"]["methods"], json!(["batch of 2", "_test/seen"]), "the agent got the batch whole");
    let emitted = r#"[{"jsonrpc":"2.0","method":"_x/a"}]"#;
    s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "_test/emit", "params": {"line": emitted}}));
    assert_eq!(s.drive().await.to_client[0], emitted);
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn many_requests_in_flight_and_order_kept() {
    let mut s = opencode();
    for id in 0..200 {
        s.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": "_test/echo", "params": {"n": id}}));
    }
    let ids: Vec<Value> = s.drive().await.client_json().iter().map(|v| v["id"].clone()).collect();
    assert_eq!(ids, (0..200).map(Value::from).collect::<Vec<_>>());
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn updates_are_never_overtaken_by_the_response() {
    let mut s = opencode();
    let sid = new_session(&mut s, 1).await;
    let (_, before) = s.request(2, "session/prompt", prompt_params(&sid, "!flood 500 3000")).await;
    let chunks = before.iter().filter(|v| is_chunk(v)).count();
    assert_eq!(chunks, 501, "every update of the turn arrived before its response");
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn not_json_from_the_client_gets_a_parse_error_and_the_session_goes_on() {
    let mut s = opencode();
    s.send("this is not json");
    assert_eq!(errors(&s.drive().await.client_json()), [(Value::Null, json!(-32700))]);
    s.send(r#"{"id":7,"method":"x"}"#);
    assert_eq!(errors(&s.drive().await.client_json()), [(json!(7), json!(-32600))]);
    s.send("\r");
    s.send(r#"{"jsonrpc":"2.0","id":8,"method":"_test/seen"}"#);
    only_seen(&mut s, "invalid lines were not forwarded, and the line of only \\r gets no answer").await;
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_stray_line_from_the_agent_is_dropped_with_a_warning() {
    let mut s = opencode();
    let sid = new_session(&mut s, 1).await;
    let (answer, before) = s.request(2, "session/prompt", prompt_params(&sid, "!stray")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn");
    assert!(before.iter().all(|v| v["jsonrpc"] == "2.0"));
    // The warning, and its text at debug only (tests/quiet_logs.rs checks the default level of the binaries).
    let logs = s.logs();
    assert!(logs.iter().any(|l| l.contains("WARN") && l.contains("line of 33 bytes that is not JSON-RPC")), "{logs:?}");
    assert!(logs.iter().any(|l| l.contains("DEBUG") && l.contains("stray log line")), "{logs:?}");
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn over_size_request_gets_an_error_and_over_size_notification_a_warning() {
    let mut s = opencode_with(1000);
    let big = "x".repeat(2000);
    s.send_json(&json!({"jsonrpc": "2.0", "id": 5, "method": "_test/echo", "params": {"s": big}}));
    assert_eq!(errors(&s.drive().await.client_json()), [(json!(5), json!(-32600))]);
    s.send_json(&json!({"jsonrpc": "2.0", "method": "_x/note", "params": {"s": big}}));
    let (seen, before) = s.request(6, "_test/seen", json!({})).await;
    assert_eq!(seen["result"]["methods"], json!(["_test/seen"]), "neither over-size frame was forwarded");
    assert!(before.is_empty(), "the notification is not answered: {before:?}");
    // One warning per dropped frame, the notification's too.
    let logs = s.logs();
    let warnings = logs.iter().filter(|l| l.contains("client sent a frame of") && l.contains("over the size limit"));
    assert_eq!(warnings.count(), 2, "{logs:?}");
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn over_size_answer_from_the_agent_becomes_an_error_for_its_request() {
    let mut s = opencode_with(1000);
    // Each \" in the request (2 bytes) comes back as \\\" (4 bytes): the echo is over the limit.
    let quotes = "\"".repeat(300);
    let (answer, _) = s.request(7, "_test/echo", json!({ "s": quotes })).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("over the size limit"));
    // An over-size update from the agent is dropped; what follows still comes.
    let sid = new_session(&mut s, 1).await;
    let (done, before) = s.request(8, "session/prompt", prompt_params(&sid, "!flood 1 2000")).await;
    assert_eq!(done["result"]["stopReason"], "end_turn");
    let chunks = before.iter().filter(|v| is_chunk(v));
    assert_eq!(chunks.count(), 1, "only the agent's small report came; the 2000-byte chunk was dropped");
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn invalid_utf8_is_a_parse_error_not_a_panic() {
    let mut s = opencode();
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}\n".to_vec());
    assert_eq!(errors(&s.drive().await.client_json()), [(Value::Null, json!(-32700))]);
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"_test/seen\"}\r\n".to_vec());
    only_seen(&mut s, "CRLF is tolerated").await;
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn many_sessions_and_requests_interleaved_keep_order_per_direction() {
    let mut s = opencode();
    let mut sessions = Vec::new();
    for i in 0..5 {
        sessions.push(new_session(&mut s, 100 + i).await);
    }
    for (i, sid) in sessions.iter().enumerate() {
        let params = prompt_params(sid, &format!("!flood 50 100 n{i}"));
        s.send_json(&json!({"jsonrpc": "2.0", "id": i, "method": "session/prompt", "params": params}));
    }
    let mut got = s.drive().await.client_json().into_iter();
    // The agent handles prompts one after the other: each answer comes after its own 50 updates and report.
    for (i, sid) in sessions.iter().enumerate() {
        let mut updates = 0;
        for v in got.by_ref() {
            if v.get("id") == Some(&json!(i)) {
                break;
            }
            if is_chunk(&v) {
                assert_eq!(v["params"]["sessionId"], json!(sid));
                updates += 1;
            }
        }
        assert_eq!(updates, 51);
    }
    assert_eq!(got.next(), None, "nothing after the last answer");
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_layers_wake_up_runs_on_virtual_time_and_drive_waits_for_it() {
    // A plain layer's wake-up 10 minutes on: idle until then, and the frame it sends arrives in a drive
    // that takes no real time.
    use crate::frame::{self, Frame};
    use crate::layer::{Cx, Layer, Stack};
    struct Late;
    impl Layer for Late {
        type Timer = ();
        type Event = std::convert::Infallible;
        type Reply = std::convert::Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if f.is_notification("later") {
                cx.after(std::time::Duration::from_secs(600), ());
            } else {
                cx.to_agent(f);
            }
        }
        fn on_timer(&mut self, (): (), cx: &mut Cx) {
            cx.to_client(frame::notification("_test/woke", json!({})));
        }
    }
    // An agent of the test's own: a closure that answers nothing (it is handed nothing here).
    let mut s = Pair::new(Stack::new(vec![Box::new(Late)]), |_: &str| Vec::new());
    let real = std::time::Instant::now();
    let start = tokio::time::Instant::now();
    s.send(r#"{"jsonrpc":"2.0","method":"later"}"#);
    // Quiet for 60 s of virtual time: idle before the wake-up.
    assert_eq!(s.drive().await, Default::default());
    let got = s.drive_for(std::time::Duration::from_secs(600)).await;
    assert_eq!(got.to_client, [r#"{"jsonrpc":"2.0","method":"_test/woke","params":{}}"#]);
    assert!(start.elapsed() >= std::time::Duration::from_secs(600));
    assert!(real.elapsed() < std::time::Duration::from_secs(5), "virtual time: {:?}", real.elapsed());
    assert_eq!(json(&got.to_client[0])["method"], "_test/woke");
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn deep_frames_from_the_client_are_refused_like_over_size_ones_and_the_shim_lives_on() {
    for bin in BINARIES {
        let mut s = shim(bin);
        // A request: -32600 with its id (read cheaply before the deep part).
        s.send(&format!(r#"{{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{}}}"#, deep_array(DEEP)));
        let got = s.drive().await.client_json();
        assert_eq!(errors(&got), [(json!(1), json!(-32600))], "{bin}: {got:?}");
        assert!(got[0]["error"]["message"].as_str().unwrap().contains("deeper than 1000 levels"), "{bin}: {got:?}");
        // A valid notification whose params nest 20,000 objects: dropped (JSON-RPC answers no notification).
        s.send(&format!(r#"{{"jsonrpc":"2.0","method":"_x/note","params":{}}}"#, deep_object(DEEP)));
        // A bare line of `[`, never closed, is not JSON: -32700 with id null; 20,000 closed `[`, JSON but no
        // JSON-RPC message: -32600 with id null. Each once.
        s.send(&"[".repeat(DEEP));
        s.send(&deep_array(DEEP));
        let (seen, before) = s.request(2, "_test/seen", json!({})).await;
        assert_eq!(errors(&before), [(json!(null), json!(-32700)), (json!(null), json!(-32600))], "{bin}: {before:?}");
        // The next frame is relayed, and nothing deep reached the agent.
        let methods = seen["result"]["methods"].as_array().expect("the agent answered").clone();
        assert!(!methods.iter().any(|m| m == "_test/echo" || m == "_x/note"), "{bin}: {methods:?}");
        assert_eq!(s.close().await, 0, "{bin}: the shim is alive and ends cleanly");
        let logs = s.logs();
        let warnings = logs.iter().filter(|l| l.contains("client sent a frame") && l.contains("deeper than 1000"));
        assert_eq!(warnings.count(), 3, "{bin}: one warning per deep frame: {logs:?}");
        let unclosed = logs.iter().filter(|l| l.contains("client sent an invalid frame") && l.contains("left open"));
        assert_eq!(unclosed.count(), 1, "{bin}: {logs:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn deep_frames_from_the_agent_are_dropped_and_the_request_they_answer_gets_an_error() {
    for bin in BINARIES {
        let mut s = shim(bin);
        for (id, object) in [(3, false), (4, true)] {
            let mut params = json!({"depth": DEEP});
            if object {
                params["object"] = json!(true);
            }
            let (answer, _) = s.request(id, "_test/nest", params).await;
            assert_eq!(answer["error"]["code"], -32603, "{bin}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("dropped") && message.contains("deeper than 1000 levels"), "{bin}: {message}");
        }
        // A valid notification nesting 20,000 objects from the agent: dropped; the agent's answer after it comes.
        let update = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{}}}"#, deep_object(DEEP));
        let (answer, before) = s.request(5, "_test/emit", json!({ "line": update })).await;
        assert_eq!((answer["result"].clone(), before.len()), (json!({}), 0), "{bin}: {answer}");
        // Within the limit, a deep answer passes as it came.
        s.send_json(&json!({"jsonrpc": "2.0", "id": 6, "method": "_test/nest", "params": {"depth": 900}}));
        let got = s.drive().await.to_client;
        assert_eq!(got, [format!(r#"{{"jsonrpc":"2.0","id":6,"result":{}1{}}}"#, "[".repeat(900), "]".repeat(900))]);
        assert_eq!(s.close().await, 0, "{bin}: the shim is alive and ends cleanly");
        let logs = s.logs();
        assert!(logs.iter().filter(|l| l.contains("agent sent a frame")).count() >= 3, "{bin}: {logs:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_frame_with_a_lone_surrogate_no_layer_rewrites_goes_on_byte_for_byte() {
    for bin in BINARIES {
        let mut s = shim(bin);
        // From the client: a notification no layer edits reaches the agent as it was sent, escapes and all.
        let note = r#"{"jsonrpc":"2.0","method":"_x/note","params":{"a":"x\ud800y","b":"\udc00\ud800","pair":"\uD83D\uDE00","text":"\\ud800"}}"#;
        s.send(note);
        assert_eq!(s.drive().await.to_agent, [note], "{bin}: byte for byte");
        // From the agent: a streamed chunk no layer edits reaches the client as the agent wrote it.
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-x","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"\udbff end \ud800"}}}}"#;
        s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "_test/emit", "params": {"line": chunk}}));
        let got = s.drive().await.to_client;
        assert_eq!(got.len(), 2, "{bin}: {got:?}");
        assert_eq!(got[0], chunk, "{bin}: byte for byte");
        assert_eq!(json(&got[1]), json!({"jsonrpc": "2.0", "id": 2, "result": {}}), "{bin}");
        assert_eq!(s.close().await, 0, "{bin}");
        let logs = s.logs();
        assert!(!logs.iter().any(|l| l.contains("cannot read")), "{bin}: no warning: {logs:?}");
    }
}

/// The binaries that inject the session instruction themselves (codex-acp takes it natively).
const INJECTING: [&str; 3] = ["kimi", "grok", "opencode"];

/// Coda's session instruction as it really comes: paragraphs of Markdown with CJK text and emoji, > 2 KB.
fn instruction() -> String {
    let paragraph =
        "## 工作方式 🧭\n\n- 先读代码，再改代码；每一步都说明原因。✅\n- Keep answers short, cite files by path.\n\n";
    paragraph.repeat(16)
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
    assert_eq!(meta["deep"], json(&deep_object(200)), "the deep part is kept");
}

fn init_line(id: u64, params_meta: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{"_meta":{{"coda":{{"waits":{{}}}}}}}},"_meta":{params_meta}}}}}"#
    )
}

/// The lines among `lines` (what the agent received) of `method`, with each as JSON.
fn of_method(lines: &[String], method: &str) -> Vec<(String, Value)> {
    let read = lines.iter().map(|l| (l.clone(), json(l)));
    read.filter(|(_, v)| v["method"] == method).collect()
}

/// The prompt array the test agent reports it received (its agent_message_chunk).
fn received_prompt(before: &[Value]) -> Value {
    let chunk = before.iter().rev().find(|v| is_chunk(v)).expect("the agent reported the prompt it received");
    let report = chunk.pointer("/params/update/content/text").and_then(Value::as_str).expect("text");
    json(&report.replace("&lt;", "<"))
}

/// The first text block of a prompt starts with Coda's instruction, as the layers inject it.
fn assert_injected(bin: &str, prompt: &Value) {
    let first = prompt[0]["text"].as_str().unwrap_or_default();
    assert!(first.starts_with("<coda-session-instruction>\n## 工作方式 🧭"), "{bin}: injected: {prompt}");
}

#[tokio::test(start_paused = true)]
async fn session_instruction_is_checked_stripped_and_injected_whatever_else_the_params_hold() {
    let sp = json!({"mode": "append", "content": [{"type": "text", "text": instruction()}]});
    for bin in INJECTING {
        let mut s = shim(bin);
        s.send(&init_line(0, "{}"));
        s.answer_to(&json!(0)).await;
        let new = |id: u64, sp: &Value, meta: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"session/new","params":{{"cwd":"/w","mcpServers":[],"systemPrompt":{sp},"_meta":{meta}}}}}"#
            )
        };
        // An invalid systemPrompt is refused, not answered by the child.
        s.send(&new(1, &json!("NOT-AN-OBJECT"), &hostile_meta()));
        let (e, _, to_agent) = s.answer_to(&json!(1)).await;
        assert_eq!((&e["id"], &e["error"]["code"]), (&json!(1), &json!(-32602)), "{bin}: {e}");
        assert!(of_method(&to_agent, "session/new").is_empty(), "{bin}: not forwarded");
        // A valid one is taken out of what the child gets, and the rest kept.
        s.send(&new(2, &sp, &hostile_meta()));
        let (answer, _, to_agent) = s.answer_to(&json!(2)).await;
        let sid = answer["result"]["sessionId"].as_str().expect("a session").to_owned();
        let got = of_method(&to_agent, "session/new");
        let (line, v) = got.last().expect("the child got session/new");
        assert!(v["params"].get("systemPrompt").is_none(), "{bin}: stripped");
        assert_meta_kept(line, &v["params"]["_meta"]);
        // And injected into the first prompt.
        let (_, before) = s.request(3, "session/prompt", prompt_params(&sid, "hello")).await;
        let prompt = received_prompt(&before);
        assert_injected(bin, &prompt);
        assert_eq!(prompt[1]["text"], "hello");
        assert_eq!(s.close().await, 0, "{bin}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_lone_surrogate_is_read_as_u_fffd_and_the_frame_is_acted_on() {
    // A lone UTF-16 surrogate escape: valid for the frame check (`src/scan.rs`), refused by serde_json alone;
    // the shim reads it as U+FFFD, and a frame it rewrites carries U+FFFD (the test agent reads only that).
    let sp = json!({"mode": "append", "content": [{"type": "text", "text": instruction()}]});
    for bin in INJECTING {
        let mut s = shim(bin);
        s.send(&init_line(0, "{}"));
        s.answer_to(&json!(0)).await;
        // session/new: its systemPrompt is checked and stripped, the rest kept, the lone half as U+FFFD.
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"session/new","params":{{"cwd":"/w","mcpServers":[],"systemPrompt":{sp},"_meta":{{"s":"\ud800","pair":"\ud83d\ude00"}}}}}}"#
        ));
        let (answer, _, to_agent) = s.answer_to(&json!(1)).await;
        let sid = answer["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{bin}: a session: {answer}"));
        let sid = sid.to_owned();
        let got = of_method(&to_agent, "session/new");
        let (line, v) = got.last().expect("the child got session/new");
        assert!(v["params"].get("systemPrompt").is_none(), "{bin}: stripped: {line:.300}");
        assert_eq!(v["params"]["_meta"], json!({"s": "\u{FFFD}", "pair": "😀"}), "{bin}: {line:.300}");
        // session/prompt: the lone half in the user's text, which a layer must rewrite to inject the instruction.
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"hello \udc00 there"}}]}}}}"#
        ));
        let (answer, before, _) = s.answer_to(&json!(3)).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{bin}: handled as any prompt: {answer}");
        let prompt = received_prompt(&before);
        assert_injected(bin, &prompt);
        assert_eq!(prompt[1]["text"], "hello \u{FFFD} there", "{bin}: {prompt}");
        assert_eq!(s.close().await, 0, "{bin}");
    }
}

#[tokio::test(start_paused = true)]
async fn initialize_is_rewritten_both_ways_whatever_else_it_holds() {
    let answer = format!(
        r#"{{"protocolVersion":1,"agentCapabilities":{{"loadSession":true}},"agentInfo":{{"name":"@agentclientprotocol/codex-acp","version":"2.6.0"}},"_meta":{{"jetbrains":{{"air":{{"version":1,"capabilities":["nativeSubagentSessions","asyncTasks"]}}}},"n":1e400,"exact":1.50,"deep":{}}}}}"#,
        deep_object(200)
    );
    for bin in BINARIES {
        let mut s = shim_with(bin, crate::lines::DEFAULT_MAX_LINE, TestAgent::default().with_init(&answer));
        s.send(&init_line(0, &hostile_meta()));
        let got = s.drive().await;
        assert_eq!(got.to_client.len(), 1, "{bin}: {got:?}");
        let (line, v) = (&got.to_client[0], &got.client_json()[0]);
        // Every binary that reports activity declares it (Coda's 等待 handshake) in the rewritten answer.
        assert_eq!(v["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}), "{bin}: {line:.400}");
        assert_meta_kept(line, &v["result"]["_meta"]);
        if bin == "codex" {
            // Codex's layer names the agent (or, with no Codex CLI found here, leaves the adapter's name out),
            // and asks codex-acp for AIR reports in the request it forwards.
            assert!(v["result"].get("agentInfo").is_none_or(|i| i["name"] == "codex"), "{line:.400}");
            let sent = of_method(&got.to_agent, "initialize");
            let (sent, request) = sent.last().expect("the child got initialize");
            let air = &request["params"]["clientCapabilities"]["_meta"]["jetbrains"]["air"]["capabilities"];
            assert!(air.as_array().is_some_and(|c| !c.is_empty()), "{sent:.300}");
            assert_meta_kept(sent, &request["params"]["_meta"]);
        } else {
            assert_eq!(v["result"]["agentCapabilities"]["sessionCapabilities"]["systemPrompt"], json!({}), "{bin}");
        }
        assert_eq!(s.close().await, 0, "{bin}");
    }
}

#[tokio::test(start_paused = true)]
async fn codex_failure_is_classified_whatever_else_the_answer_holds() {
    let failure = r#"{"actions":[],"category":"limit","id":"t:error","revision":1,"severity":"error","title":"You’ve hit your usage limit. Try again later."}"#;
    let result = format!(
        r#"{{"stopReason":"end_turn","usage":null,"_meta":{{"jetbrains":{{"air":{{"version":1,"sessionFailure":{failure}}}}},"n":1e400,"deep":{}}}}}"#,
        deep_object(200)
    );
    let mut s = shim_with("codex", crate::lines::DEFAULT_MAX_LINE, TestAgent::default().with_prompt_result(&result));
    let sid = new_session(&mut s, 1).await;
    let (answer, _) = s.request(2, "session/prompt", prompt_params(&sid, "hello")).await;
    assert!(answer.get("result").is_none(), "the failure became an error: {answer:.300}");
    assert!(answer["error"].to_string().contains("quota_exhausted"), "{answer:.300}");
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn grok_agent_info_is_built_from_its_meta() {
    let init = r#"{"protocolVersion":1,"agentCapabilities":{},"_meta":{"grokShell":true,"agentVersion":"1.0.41"}}"#;
    let mut s = shim_with("grok", crate::lines::DEFAULT_MAX_LINE, TestAgent::default().with_init(init));
    let (answer, _) = s.request(0, "initialize", json!({"protocolVersion": 1})).await;
    assert_eq!(answer["result"]["agentInfo"], json!({"name": "grok", "version": "1.0.41"}));
    // Grok's own `_meta` is kept; coda-grok adds its steering declaration (adapters/grok/steering.rs).
    let meta = json!({"grokShell": true, "agentVersion": "1.0.41", "steering": {"supported": true}});
    assert_eq!(answer["result"]["_meta"], meta);
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn opencode_and_kimi_keep_their_own_agent_info() {
    for agent in ["opencode", "kimi"] {
        let init =
            r#"{"protocolVersion":1,"agentCapabilities":{},"agentInfo":{"name":"OpenCode","version":"1.18.33"}}"#;
        let mut s = shim_with(agent, crate::lines::DEFAULT_MAX_LINE, TestAgent::default().with_init(init));
        let (answer, _) = s.request(0, "initialize", json!({"protocolVersion": 1})).await;
        assert_eq!(answer["result"]["agentInfo"], json!({"name": "OpenCode", "version": "1.18.33"}), "{agent}");
        assert_eq!(s.close().await, 0, "{agent}");
    }
}

/// A CLI that answers each request twice (initialize, `session/new` with `dup-1`, a prompt with `end_turn`); with
/// `prompts: false` it never answers a prompt.
fn answering_twice(prompts: bool) -> impl FnMut(&str) -> Vec<String> + Send + 'static {
    move |line: &str| {
        let v = json(line);
        let (Some(id), Some(method)) = (v.get("id"), v.get("method").and_then(Value::as_str)) else {
            return Vec::new();
        };
        let result = match method {
            "initialize" => json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true}}),
            "session/new" => json!({"sessionId": "dup-1"}),
            "session/prompt" if !prompts => return Vec::new(),
            "session/prompt" => json!({"stopReason": "end_turn"}),
            _ => json!({}),
        };
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        vec![answer.clone(), answer]
    }
}

/// The answers among `got`, by id.
fn answers(got: &[Value]) -> Vec<Value> {
    got.iter().filter(|v| v.get("method").is_none()).map(|v| v["id"].clone()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_clis_second_answer_never_reaches_the_client_on_any_stack() {
    for agent in BINARIES {
        let mut s = shim_with(agent, crate::lines::DEFAULT_MAX_LINE, answering_twice(true));
        s.send_json(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}));
        s.send_json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}),
        );
        assert_eq!(answers(&s.drive().await.client_json()), [json!(0), json!(1)], "coda-{agent}");
        s.send_json(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt_params("dup-1", "hi")}),
        );
        s.send_json(&json!({"jsonrpc": "2.0", "id": "m", "method": "session/set_mode",
            "params": {"sessionId": "dup-1", "modeId": "x"}}));
        assert_eq!(answers(&s.drive().await.client_json()), [json!(2), json!("m")], "coda-{agent}: one answer each");
        let warned = |l: &String| l.contains("twice; dropped") || l.contains("answered already; dropped");
        assert!(s.logs().iter().any(warned), "coda-{agent}: warned");
        assert_eq!(s.close().await, 0, "coda-{agent}");
    }
}

/// A layer of the test's own that makes a `_coda/wait` without its `waitId` when the client says `_test/go`.
struct BrokenWait;

impl crate::layer::Layer for BrokenWait {
    type Timer = ();
    type Event = std::convert::Infallible;
    type Reply = std::convert::Infallible;
    fn from_client(&mut self, f: crate::frame::Frame, cx: &mut crate::layer::Cx) {
        if f.is_notification("_test/go") {
            let wait = json!({"sessionId": "s", "state": "waiting"});
            cx.to_client(crate::frame::notification("_coda/wait", wait));
        } else {
            cx.to_agent(f);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_reusing_the_id_of_an_open_one_is_refused_on_any_stack() {
    for agent in BINARIES {
        let mut s = shim_with(agent, crate::lines::DEFAULT_MAX_LINE, answering_twice(false));
        s.request(0, "initialize", json!({"protocolVersion": 1})).await;
        s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []})).await;
        s.send_json(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt_params("dup-1", "hi")}),
        );
        s.drive().await;
        // The prompt is open (the CLI never answers it): the same id again is refused, and the CLI never has it.
        let (answer, _, to_agent) = {
            s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/set_mode",
                "params": {"sessionId": "dup-1", "modeId": "x"}}));
            s.answer_to(&json!(2)).await
        };
        assert_eq!(answer["error"], json!({"code": -32600, "message": "invalid request: id in use"}), "coda-{agent}");
        assert!(to_agent.iter().all(|l| !l.contains("session/set_mode")), "coda-{agent}: {to_agent:?}");
        // Stop ends the prompt; the id is free again.
        s.send_json(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "dup-1"}}));
        s.drive().await;
        assert_eq!(s.close().await, 0, "coda-{agent}");
    }
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "coda#/$defs/CodaWaitNotification/required")]
async fn a_frame_the_shim_makes_that_breaks_codas_shapes_fails_the_drive() {
    let mut s = Pair::new(crate::layer::Stack::new(vec![Box::new(BrokenWait)]), TestAgent::default());
    s.send(r#"{"jsonrpc":"2.0","method":"_test/go"}"#);
    s.drive().await;
}

#[tokio::test(start_paused = true)]
async fn a_peers_frame_that_breaks_the_schema_is_passed_on_and_kept_as_a_fact() {
    // The agent's answer to a prompt has a stop reason ACP v1 does not know; the shim passes it on as it came.
    let agent = TestAgent::default().with_prompt_result(r#"{"stopReason":"paused"}"#);
    let mut s = Pair::new(crate::layer::Stack::new(vec![Box::new(BrokenWait)]), agent);
    s.request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
    let (answer, _) = s.request(2, "session/prompt", json!({"sessionId": "sess-1", "prompt": []})).await;
    assert_eq!(answer["result"]["stopReason"], "paused");
    let found: Vec<(&str, &str, &str)> =
        s.schema_findings().iter().map(|f| (f.whose.as_str(), f.dir.as_str(), f.at.as_str())).collect();
    assert_eq!(found, [("agent", "agent->shim", "/result/stopReason")], "{:?}", s.schema_findings());
    assert_eq!(s.close().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_stack_set_up_in_a_given_environment_reads_it_not_the_process() {
    // coda-kimi's data root and took log come from the environment handed in: it watches the session's folder
    // there (the took log's `watch` record names it).
    let dir = tempfile::tempdir().expect("dir");
    let session = dir.path().join("home/sessions/wd_w/sess-1");
    std::fs::create_dir_all(session.join("agents/main")).expect("folders");
    std::fs::write(session.join("agents/main/wire.jsonl"), "{\"type\":\"metadata\",\"protocol_version\":\"1.5\"}\n")
        .expect("wire");
    let (home, took) = (dir.path().join("home"), dir.path().join("took.jsonl"));
    let env = |name: &str| match name {
        "KIMI_CODE_HOME" => Some(home.clone().into_os_string()),
        "CODA_KIMI_TOOK" => Some(took.clone().into_os_string()),
        _ => None,
    };
    let command = AgentCommand { program: "test-agent".into(), args: Vec::new() };
    let adapter = crate::adapters::by_agent("kimi").expect("an adapter");
    let (stack, events) = adapter.stack_in(&command, None, &crate::cli::adapter::Given { env: &env, parts: &[] });
    let mut s = Pair::with(stack, events, crate::lines::DEFAULT_MAX_LINE, TestAgent::default());
    assert_eq!(new_session(&mut s, 1).await, "sess-1");
    assert_eq!(s.close().await, 0);
    let log = std::fs::read_to_string(&took).expect("the took log");
    let watched = std::fs::canonicalize(&session).expect("canonical");
    assert!(
        log.contains(&format!("{{\"watch\":\"{}\"", session.display())) || log.contains(&watched.display().to_string()),
        "{log}"
    );
}

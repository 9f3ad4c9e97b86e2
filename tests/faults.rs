//! Bad input and misbehaving peers (issue: hardening): the shim answers or warns, never panics, never
//! loses or reorders a frame, and keeps memory bounded under backpressure.

use crate::support;

use support::shim;

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shim::{prompt_params, with_test_agent};

/// Peak resident memory of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with("VmHWM")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

fn is_chunk(v: &Value) -> bool {
    v.pointer("/params/update/sessionUpdate") == Some(&json!("agent_message_chunk"))
}

fn new_session(s: &mut shim::Shim) -> String {
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    new["result"]["sessionId"].as_str().unwrap().to_owned()
}

#[test]
fn over_size_request_gets_an_error_and_over_size_notification_a_warning() {
    let mut s = with_test_agent("opencode").arg("--max-frame-bytes").arg("1000").start();
    let big = "x".repeat(2000);
    s.send_json(&json!({"jsonrpc": "2.0", "id": 5, "method": "_test/echo", "params": {"s": big}}));
    let e = s.recv_json();
    assert_eq!((e["id"].clone(), e["error"]["code"].clone()), (json!(5), json!(-32600)));
    s.send_json(&json!({"jsonrpc": "2.0", "method": "_x/note", "params": {"s": big}}));
    let (seen, _) = s.request(6, "_test/seen", json!({}));
    assert_eq!(seen["result"]["methods"], json!(["_test/seen"]), "neither over-size frame was forwarded");
    // One warning per dropped frame, the notification's too. Stderr is a pipe of its own: the warnings may come
    // after the answer above.
    s.stderr_until("two over-size warnings", |lines| {
        lines.iter().filter(|l| l.contains("client sent a frame of") && l.contains("over the size limit")).count() == 2
    });
}

#[test]
fn over_size_answer_from_the_agent_becomes_an_error_for_its_request() {
    let mut s = with_test_agent("opencode").arg("--max-frame-bytes").arg("1000").start();
    // Each \" in the request (2 bytes) comes back as \\\" (4 bytes): the echo is over the limit.
    let quotes = "\"".repeat(300);
    let (answer, _) = s.request(7, "_test/echo", json!({ "s": quotes }));
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("over the size limit"));
    // An over-size update from the agent is dropped; what follows still comes.
    let sid = new_session(&mut s);
    let (done, before) = s.request(8, "session/prompt", prompt_params(&sid, "!flood 1 2000"));
    assert_eq!(done["result"]["stopReason"], "end_turn");
    let chunks =
        before.iter().filter(|v| v.pointer("/params/update/sessionUpdate") == Some(&json!("agent_message_chunk")));
    assert_eq!(chunks.count(), 1, "only the agent's small report came; the 2000-byte chunk was dropped");
}

#[test]
fn invalid_utf8_is_a_parse_error_not_a_panic() {
    let mut s = with_test_agent("opencode").start();
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}\n");
    let e = s.recv_json();
    assert_eq!((e["id"].clone(), e["error"]["code"].clone()), (Value::Null, json!(-32700)));
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"_test/seen\"}\r\n");
    assert_eq!(s.recv_json()["result"]["methods"], json!(["_test/seen"]), "CRLF is tolerated");
}

#[test]
fn agent_not_reading_stdin_applies_backpressure_and_loses_nothing() {
    let mut s = with_test_agent("opencode").start();
    let sid = new_session(&mut s);
    // The agent sleeps 3 s in this prompt without reading its stdin.
    s.send_json(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt_params(&sid, "!sleep 3000")}),
    );
    let count = 3000;
    let blob = "z".repeat(20_000);
    let mut stdin = s.take_stdin();
    let writer = std::thread::spawn(move || {
        for i in 0..count {
            let frame = json!({"jsonrpc": "2.0", "method": "_test/blob", "params": {"i": i, "blob": blob}});
            writeln!(stdin, "{frame}").unwrap();
        }
        stdin.flush().unwrap();
        stdin
    });
    let stdin = writer.join().unwrap();
    s.give_stdin(stdin);
    let (seen, _) = s.request(3, "_test/seen", json!({}));
    // The high-water mark of the whole run, the 3 s the agent did not read included (read once everything has
    // gone through, so no sleep has to guess when the shim was stuck).
    let peak = peak_rss_kib(s.child.id());
    eprintln!("peak RSS of the shim: {peak} KiB");
    let blobs = seen["result"]["methods"].as_array().unwrap().iter().filter(|m| *m == "_test/blob").count();
    assert_eq!(blobs, count, "every notification reached the agent once it read again");
    // 60 MB were sent while the agent did not read; the shim held only a bounded part of it.
    assert!(peak < 40 * 1024, "peak RSS {peak} KiB: the shim held what the agent did not read");
}

#[test]
fn client_not_reading_applies_backpressure_and_loses_nothing() {
    let mut s = with_test_agent("opencode").start();
    let sid = new_session(&mut s);
    let (count, size) = (5000, 20_000);
    s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt_params(&sid, &format!("!flood {count} {size}"))}));
    // A client that reads nothing for 2 s (the scenario, not a wait for an event) while the agent floods 100 MB.
    std::thread::sleep(Duration::from_millis(2000));
    let mut chunks = 0;
    loop {
        let v = s.recv_json();
        if v["id"] == 2 {
            assert_eq!(v["result"]["stopReason"], "end_turn");
            break;
        }
        chunks += usize::from(is_chunk(&v));
    }
    // The high-water mark of the whole run, the 2 s the client did not read included.
    let peak = peak_rss_kib(s.child.id());
    eprintln!("peak RSS of the shim: {peak} KiB");
    assert_eq!(chunks, count + 1, "every update arrived, before the answer");
    assert!(peak < 40 * 1024, "peak RSS {peak} KiB: the shim held what the client did not read");
}

#[test]
fn client_closing_stdin_mid_turn_still_gets_the_answer_and_the_shim_exits() {
    let mut s = with_test_agent("opencode").start();
    let sid = new_session(&mut s);
    s.send_json(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt_params(&sid, "!sleep 500")}),
    );
    s.close_stdin();
    let started = Instant::now();
    let rest: Vec<Value> = s.rest().iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rest.last().unwrap()["result"]["stopReason"], "end_turn", "{rest:?}");
    assert_eq!(s.wait(Duration::from_secs(10)).code(), Some(0));
    assert!(started.elapsed() < Duration::from_secs(5), "the agent exits on EOF; no need to escalate");
}

#[test]
fn many_sessions_and_requests_interleaved_keep_order_per_direction() {
    let mut s = with_test_agent("opencode").start();
    let sessions: Vec<String> = (0..5)
        .map(|i| {
            let (new, _) = s.request(100 + i, "session/new", json!({"cwd": "/w", "mcpServers": []}));
            new["result"]["sessionId"].as_str().unwrap().to_owned()
        })
        .collect();
    for (i, sid) in sessions.iter().enumerate() {
        s.send_json(&json!({"jsonrpc": "2.0", "id": i, "method": "session/prompt", "params": prompt_params(sid, &format!("!flood 50 100 n{i}"))}));
    }
    // The agent handles prompts one after the other: each answer comes after its own 50 updates.
    for (i, sid) in sessions.iter().enumerate() {
        let mut updates = 0;
        loop {
            let v = s.recv_json();
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
}

//! Misbehaving peers (issue: hardening) where only a process shows it: the shim never loses a frame and keeps
//! its memory bounded under backpressure, and a client leaving mid-turn still ends the session. What bad
//! frames get (over-size, invalid UTF-8, order across sessions) is tested on the in-memory relay,
//! `src/relay/behaviour.rs`.

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

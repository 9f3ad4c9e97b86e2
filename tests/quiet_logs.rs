//! Logs at the default level quote nothing a peer sent (issue 13, section 6): a peer's text may be user
//! data. Every bad input here carries a marker; at the default level (and at info) stderr names where and
//! how long, never the marker. At debug the marker is there, so the test can see it.

use crate::support;

use support::{shim, temp};

use std::time::Duration;

use serde_json::json;
use shim::with_test_agent;

const MARKER: &str = "MARKER-7f3a-private";

/// Runs coda-opencode at `level` through bad input from both peers and from its events file; returns
/// its stderr.
fn stderr_after_bad_input(level: &str) -> String {
    let dir = temp::TempDir::new("coda-quiet-logs");
    let events = dir.join("events.jsonl");
    std::fs::write(&events, format!("not an event {MARKER}\n{{\"type\":\"{MARKER}\",\"properties\":7}}\n")).unwrap();
    let mut s = with_test_agent("opencode")
        .env("CODA_SHIM_LOG", level)
        .env("CODA_OPENCODE_EVENTS", &events.display().to_string())
        .arg("--max-frame-bytes")
        .arg("4000")
        .start();
    // The events file is read from the initialize answer on.
    s.request(0, "initialize", json!({"protocolVersion": 1}));
    // The client: not JSON, not JSON-RPC, over the size limit, an invalid session instruction.
    s.send(&format!("{MARKER} is not json"));
    s.send(&format!(r#"{{"jsonrpc":"1.0","id":1,"method":"{MARKER}"}}"#));
    s.send(&format!(r#"{{"jsonrpc":"2.0","id":2,"method":"{MARKER}","params":{{"s":"{}"}}}}"#, "x".repeat(5000)));
    let bad_mode = json!({"cwd": "/w", "mcpServers": [], "systemPrompt": {"mode": MARKER, "content": []}});
    s.send_json(&json!({"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": bad_mode}));
    let bad_block = json!({"mode": "append", "content": [{"type": MARKER}]});
    s.send_json(&json!({"jsonrpc": "2.0", "id": 4, "method": "session/new",
        "params": {"cwd": "/w", "mcpServers": [], "systemPrompt": bad_block}}));
    // The agent: a line that is not JSON-RPC.
    s.send_json(
        &json!({"jsonrpc": "2.0", "id": 5, "method": "_test/emit", "params": {"line": format!("npm WARN {MARKER}")}}),
    );
    let (seen, _) = s.request(7, "_test/seen", json!({}));
    assert!(seen["result"]["methods"].is_array(), "{seen}");
    // The events file's two lines are read on a thread of their own: wait for both reports.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.drain_stderr().iter().filter(|l| l.contains("OpenCode server event")).count() < 2 {
        assert!(std::time::Instant::now() < deadline, "no events warnings: {:?}", s.stderr_lines);
        std::thread::sleep(Duration::from_millis(10));
    }
    s.close_stdin();
    s.wait(Duration::from_secs(10));
    let _ = s.rest();
    s.stderr_to_the_end().join("\n")
}

#[test]
fn logs_at_the_default_level_quote_nothing_a_peer_sent() {
    for level in ["warn", "info"] {
        let err = stderr_after_bad_input(level);
        assert!(err.contains("not JSON-RPC") && err.contains("not an OpenCode server event"), "{level}: {err}");
        assert!(!err.contains(MARKER), "{level}: stderr quotes peer content:\n{err}");
    }
    let err = stderr_after_bad_input("debug");
    assert!(err.contains(MARKER), "at debug the excerpts are there: {err}");
}

//! The relay as a process: child exit and its status, the shutdown ladder and the process group,
//! signals, backpressure on real pipes, `--version` and the trace file. What frames do (byte for byte, batches,
//! order, errors for bad lines, stray agent output, agentInfo) is tested on the in-memory relay, `src/relay/behaviour.rs`.

use crate::support;

use support::{executable, shim, temp, wait};

use std::time::Duration;

use serde_json::{Value, json};
use shim::{command, prompt_params, with_test_agent};

#[test]
fn child_exit_answers_every_request_in_flight_and_passes_its_status_on() {
    let mut s = with_test_agent("opencode").start();
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    s.send_json(&json!({"jsonrpc": "2.0", "id": "slow", "method": "_never/answered", "params": {}}));
    let _not_found = s.recv_json();
    s.send_json(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt_params(&sid, "!sleep 200")}),
    );
    s.send_json(
        &json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt_params(&sid, "!exit 3")}),
    );
    let mut rest: Vec<Value> = s.rest().iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let last = rest.pop().unwrap();
    assert_eq!(last["id"], 3);
    assert_eq!(last["error"]["code"], -32603);
    assert_eq!(last["error"]["message"], "agent process exited with status 3");
    assert!(last["error"]["data"]["stderr"].as_str().unwrap().contains("exiting with 3 as asked"), "{last}");
    assert_eq!(s.wait(Duration::from_secs(5)).code(), Some(3));
}

#[test]
fn child_killed_by_a_signal_is_reported_as_such() {
    let mut s = with_test_agent("opencode").start();
    s.send_json(&json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": prompt_params("x", "!kill")}));
    let e = s.recv_json();
    assert_eq!(e["error"]["message"], "agent process exited with status 137 (killed by signal 9)");
    assert_eq!(s.wait(Duration::from_secs(5)).code(), Some(137));
}

#[test]
fn child_exiting_before_initialize_answers_it_with_an_error() {
    let mut s = command("opencode").arg("--agent-command").arg("sh -c 'echo no login >&2; exit 4'").start();
    s.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#);
    let lines = s.rest();
    let status = s.wait(Duration::from_secs(5));
    assert_eq!(status.code(), Some(4));
    // Either the request reached the child before it died (then it is answered), or it did not (then the
    // shim never took it in); in both cases stdout holds only valid frames.
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["error"]["code"], -32603);
        assert!(v["error"]["data"]["stderr"].as_str().unwrap().contains("no login"));
    }
}

#[test]
fn shutdown_ladder_leaves_no_process_of_the_group() {
    let dir = temp::TempDir::new("coda-shim-ladder");
    let pidfile = dir.join("grandchild.pid");
    // A child that ignores both its stdin closing and SIGTERM, with a grandchild holding the pipes.
    let mut s =
        with_test_agent("opencode").env("TEST_AGENT_IGNORE_EOF", "1").env("TEST_AGENT_IGNORE_TERM", "1").start();
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let prompt = format!("!grandchild {}", pidfile.display());
    s.request(2, "session/prompt", prompt_params(&sid, &prompt));
    let grandchild: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(wait::runs(grandchild));
    let started = std::time::Instant::now();
    s.close_stdin();
    let status = s.wait(Duration::from_secs(15));
    let took = started.elapsed();
    assert_eq!(status.code(), Some(128 + 9), "the child was killed with SIGKILL after ignoring SIGTERM");
    assert!(took >= Duration::from_secs(7), "5 s after stdin closed, then 2 s after SIGTERM: took {took:?}");
    // The group's SIGKILL is sent before the shim exits; the grandchild's end is not waited for by anyone.
    wait::gone(grandchild, Duration::from_secs(2));
}

#[test]
fn sigterm_to_the_shim_stops_a_cooperative_child_quickly() {
    let mut s = with_test_agent("opencode").start();
    s.request(1, "_test/echo", json!({}));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    // The child exits on stdin EOF, so the ladder ends at its first step with the child's own status.
    let status = s.wait(Duration::from_secs(4));
    assert_eq!(status.code(), Some(0));
}

/// `coda-grok` with an agent that never reads its stdin (`sleep`), its pid written to `pidfile`, fed
/// notifications until the shim applies backpressure (a write would block), up to 50 MB. Returns the shim
/// and the agent's pid.
fn shim_with_a_full_agent(pidfile: &std::path::Path) -> (shim::Shim, i32) {
    use std::io::Write;
    use std::os::fd::AsFd;
    let agent = format!("sh -c 'echo $$ > {}; exec sleep 1000'", pidfile.display());
    let mut s = command("grok").arg("--agent-command").arg(&agent).env("CODA_SHIM_LOG", "info").start();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(pidfile).ok().and_then(|p| p.trim().parse().ok()) {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "the agent did not start");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stdin = s.take_stdin();
    let flags = nix::fcntl::fcntl(stdin.as_fd(), nix::fcntl::FcntlArg::F_GETFL).unwrap();
    let nonblocking = nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(stdin.as_fd(), nix::fcntl::FcntlArg::F_SETFL(nonblocking)).unwrap();
    let frame = format!("{}\n", json!({"jsonrpc": "2.0", "method": "_x/fill", "params": {"t": "x".repeat(64 << 10)}}));
    let (mut written, mut pending) = (0usize, frame.as_bytes());
    // Written until a write would block for a while: everything between us and the agent is full.
    let mut blocked_since = None;
    while written < 50 << 20 {
        match stdin.write(pending) {
            Ok(n) => {
                written += n;
                pending = &pending[n..];
                if pending.is_empty() {
                    pending = frame.as_bytes();
                }
                blocked_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let since = *blocked_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("write to the shim: {e}"),
        }
    }
    assert!(written > 1 << 20 && written < 50 << 20, "the shim took {written} bytes before it pushed back");
    s.give_stdin(stdin);
    (s, pid)
}

#[test]
fn a_client_that_closes_while_the_agent_reads_nothing_still_ends_the_session() {
    let dir = temp::TempDir::new("coda-shim-backpressure-eof");
    let (mut s, agent) = shim_with_a_full_agent(&dir.join("agent.pid"));
    assert!(wait::runs(agent));
    s.close_stdin();
    // 5 s for the agent to take what is queued, then SIGTERM (which `sleep` obeys).
    let status = s.wait(Duration::from_secs(15));
    assert_eq!(status.code(), Some(128 + 15), "the agent was stopped with SIGTERM");
    wait::gone(agent, Duration::from_secs(5));
    let stderr = s.stderr_to_the_end();
    assert!(stderr.iter().any(|l| l.contains("did not read its last") && l.contains("dropped")), "{stderr:?}");
}

#[test]
fn sigterm_sigint_or_sighup_to_the_shim_stops_an_agent_that_reads_nothing() {
    use nix::sys::signal::Signal;
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        let dir = temp::TempDir::new("coda-shim-backpressure-signal");
        let (mut s, agent) = shim_with_a_full_agent(&dir.join("agent.pid"));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.child.id() as i32), signal).unwrap();
        let status = s.wait(Duration::from_secs(15));
        assert_eq!(status.code(), Some(128 + 15), "{signal}: the agent was stopped with SIGTERM");
        wait::gone(agent, Duration::from_secs(5));
        let stderr = s.stderr_to_the_end();
        assert!(stderr.iter().any(|l| l.contains("did not read its last") && l.contains("dropped")), "{stderr:?}");
    }
}

#[test]
fn missing_command_exits_with_one_clear_line() {
    let mut s = command("opencode").arg("--agent-command").arg("/nonexistent/opencode acp").start();
    let status = s.wait(Duration::from_secs(5));
    assert_eq!(status.code(), Some(127));
    let err = s.stderr_to_the_end();
    assert_eq!(err.len(), 1, "{err:?}");
    assert!(err[0].contains("/nonexistent/opencode") && err[0].contains("--agent-command"), "{err:?}");
}

#[test]
fn a_grok_on_path_that_is_not_grok_build_is_refused() {
    let dir = temp::TempDir::new("coda-shim-fakegrok");
    executable::write(&dir.join("grok"), "#!/bin/sh\necho 'Usage: grok [-d] -f configfile'\n");
    let mut s = command("grok")
        .env("PATH", &dir.path().display().to_string())
        .env("HOME", &dir.path().display().to_string())
        .env("GROK_HOME", &dir.join("nothing").display().to_string())
        .env_remove_command()
        .start();
    let status = s.wait(Duration::from_secs(5));
    assert_ne!(status.code(), Some(0));
    let err = s.stderr_to_the_end().join("\n");
    assert!(err.contains("is not Grok Build") && err.contains("@xai-official/grok"), "{err}");
}

#[test]
fn version_names_the_shim_and_the_wrapped_cli() {
    let mut s = with_test_agent("opencode").arg("--version").start();
    let out = s.rest();
    assert_eq!(out[0], format!("coda-opencode {}", env!("CARGO_PKG_VERSION")));
    assert!(out[1].starts_with("OpenCode 9.9.9 ("), "{out:?}");
}

#[test]
fn version_to_a_reader_that_has_gone_is_no_panic() {
    // `coda-kimi --version | head -n 1`, with the reader gone before the first line: no panic, status 0.
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    let out = std::process::Command::new(shim::binary("kimi"))
        .arg("--agent-command")
        .arg("/nonexistent/kimi")
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn trace_file_records_every_frame_both_ways() {
    let dir = temp::TempDir::new("coda-shim-trace");
    let path = dir.join("trace.jsonl");
    let mut s = with_test_agent("opencode").arg("--trace-file").arg(&path.display().to_string()).start();
    s.request(0, "initialize", json!({"protocolVersion": 1}));
    s.close_stdin();
    s.wait(Duration::from_secs(10));
    let records: Vec<Value> =
        std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let dirs: Vec<&str> = records.iter().map(|r| r["dir"].as_str().unwrap()).collect();
    assert_eq!(dirs, ["shim", "client->shim", "shim->agent", "agent->shim", "shim->client"]);
    assert_eq!(records[0]["line"], "coda-opencode", "the first record names the shim");
    assert_eq!(records[4]["shim"], true, "the initialize answer was edited by the shim");
    assert!(records[1].get("shim").is_none());
    assert!(records[1]["ts"].as_str().unwrap().ends_with('Z'));
}

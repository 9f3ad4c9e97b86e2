//! A scripted ACP agent for the shim's binary tests (run as the child through `--agent-command`).
//!
//! It keeps to ACP where the shim depends on it, and reports what it received so tests can assert it:
//! - `initialize`: answers `TEST_AGENT_INIT` (a JSON result) or a plain v1 answer without `systemPrompt`.
//! - `session/new`: `{"sessionId":"sess-N"}`, then an `available_commands_update` naming `TEST_AGENT_COMMANDS`
//!   (comma-separated, default `init,review`).
//! - `session/load`: replays every stored prompt block as `user_message_chunk`, then `{}`.
//!   `session/resume`: `{}`; `session/fork`: a new session id.
//! - `session/prompt`: one `agent_message_chunk` whose text is the prompt array it received (JSON, with
//!   `<` written `&lt;`), then
//!   `end_turn`. Words in the prompt change that: `!fail` (answer -32603), `!auth` (answer -32000, auth_required), `!exit N` (exit N without
//!   answering), `!kill` (SIGKILL itself), `!stray` (a non-JSON line on stdout first), `!echo-queue` (an
//!   extension notification repeating the prompt), `!sleep MS`, `!grandchild PATH` (start `sleep 300` in its
//!   process group and write its pid to PATH), `!detached PATH` (the same with `sleep 301` in a process group of
//!   its own, as the real CLIs run commands), `!detached-bare PATH` (`/bin/sleep 302` so, with an empty
//!   environment), `!flood N SIZE` (N updates of SIZE bytes first).
//!   For prompt mode: `!rich` (a thought, a tool call and its update, a plan, a usage update first),
//!   `!stop REASON` (answer with that stopReason), `!permission` (send `session/request_permission` and report
//!   the outcome it got as text), `!hang` (report "hanging until cancelled", then answer `cancelled` when
//!   `session/cancel` comes; with `!deaf` never answer), `!wait MS` (a `_coda/wait` item `build` opened in the
//!   turn, `handling` MS after it and `done` MS later), `!wait-open` (one that never ends), `!bad-wait` (reports
//!   Coda drops: a first report that is terminal, one without waitId, an unknown state).
//! - Env `TEST_AGENT_AUTH_REQUIRED=1`: `session/new` answers -32000 (ACP auth_required).
//! - `_test/echo`: `{"line": <the exact line received>}`; `_test/emit`: writes `params.line` verbatim,
//!   then `{}`; `_test/seen`: the methods received so far; `_test/nest`: a result of `params.depth` nested
//!   arrays (`params.object`: objects `{"a":…}`), written as text.
//! - Env `TEST_AGENT_LOG=PATH` appends every line received to PATH. `TEST_AGENT_INIT` and
//!   `TEST_AGENT_PROMPT_RESULT` (the result of every `session/prompt`) go out as their exact text.
//! - Lines are read with the shim's own nesting bound, so frames up to that deep are understood.
//! - Other requests: -32601. `--version` prints `test-agent 9.9.9`.
//! - Env `TEST_AGENT_NO_COMMANDS=1` sends no `available_commands_update`.
//! - Env `TEST_AGENT_IGNORE_EOF=1` keeps running after stdin closes; `TEST_AGENT_IGNORE_TERM=1` ignores SIGTERM.
//! - Env `TEST_AGENT_DIE_WITH_PARENT=1` exits within a millisecond of its parent's death, as Grok Build does.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;

use serde_json::{Value, json};

fn send(out: &mut impl Write, v: &Value) {
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn main() {
    if std::env::args().any(|a| a == "--version") {
        println!("test-agent 9.9.9");
        return;
    }
    if std::env::var_os("TEST_AGENT_IGNORE_TERM").is_some() {
        // SAFETY: installing SIG_IGN has no handler code to be unsafe about.
        unsafe {
            let _ = nix::sys::signal::signal(nix::sys::signal::Signal::SIGTERM, nix::sys::signal::SigHandler::SigIgn);
        }
    }
    if std::env::var_os("TEST_AGENT_DIE_WITH_PARENT").is_some() {
        // Polled, as a CLI on macOS (no parent-death signal) must: once the parent is gone, this process has
        // been re-parented and its parent id changes.
        let parent = nix::unistd::getppid();
        std::thread::spawn(move || {
            while nix::unistd::getppid() == parent {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            std::process::exit(0);
        });
    }
    let commands: Vec<Value> = std::env::var("TEST_AGENT_COMMANDS")
        .unwrap_or_else(|_| "init,review".into())
        .split(',')
        .filter(|c| !c.is_empty())
        .map(|c| json!({"name": c, "description": format!("the {c} command")}))
        .collect();
    let stdin = std::io::stdin();
    // Not locked for good: `!wait` reports from a thread of its own (each frame is one locked write).
    let mut out = std::io::stdout();
    let mut sessions: HashMap<String, Vec<Value>> = HashMap::new();
    let mut seen: Vec<String> = Vec::new();
    let mut next = 0;
    let mut lines = stdin.lock().lines();
    while let Some(line) = lines.next() {
        let Ok(line) = line else { break };
        if let Some(path) = std::env::var_os("TEST_AGENT_LOG") {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(path);
            let _ = log.and_then(|mut f| writeln!(f, "{line}"));
        }
        let Ok(msg) = coda_shim::json::from_str::<Value>(&line) else {
            eprintln!("test-agent: not JSON: {line}");
            continue;
        };
        if let Some(batch) = msg.as_array() {
            seen.push(format!("batch of {}", batch.len()));
            continue;
        }
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("").to_owned();
        let Some(id) = msg.get("id").cloned() else {
            seen.push(method);
            continue;
        };
        if method.is_empty() {
            continue; // a response to something we never asked
        }
        seen.push(method.clone());
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let sid = params.get("sessionId").and_then(Value::as_str).unwrap_or("").to_owned();
        let result = match method.as_str() {
            "initialize" => match std::env::var("TEST_AGENT_INIT") {
                Ok(init) => {
                    let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{init}}}"#);
                    let _ = out.flush();
                    continue;
                }
                Err(_) => json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true}}),
            },
            "session/new" if std::env::var_os("TEST_AGENT_AUTH_REQUIRED").is_some() => {
                let error = json!({"code": -32000, "message": "Authentication required"});
                send(&mut out, &json!({"jsonrpc": "2.0", "id": id, "error": error}));
                continue;
            }
            "session/new" | "session/fork" => {
                next += 1;
                let new = format!("sess-{next}");
                sessions.insert(new.clone(), Vec::new());
                send(&mut out, &json!({"jsonrpc": "2.0", "id": id, "result": {"sessionId": new}}));
                if std::env::var_os("TEST_AGENT_NO_COMMANDS").is_none() {
                    let update = json!({"sessionUpdate": "available_commands_update", "availableCommands": commands});
                    send(
                        &mut out,
                        &json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": new, "update": update}}),
                    );
                }
                continue;
            }
            "session/load" => {
                for block in sessions.get(&sid).into_iter().flatten() {
                    let update = json!({"sessionUpdate": "user_message_chunk", "content": block});
                    send(
                        &mut out,
                        &json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": update}}),
                    );
                }
                json!({})
            }
            "session/resume" => json!({}),
            "session/prompt" => {
                let prompt = params.get("prompt").cloned().unwrap_or(Value::Null);
                let text: String = prompt
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(" ");
                let words: Vec<&str> = text.split_whitespace().collect();
                let arg = |w: &str| words.iter().position(|x| *x == w).and_then(|i| words.get(i + 1)).copied();
                if let Some(code) = arg("!exit") {
                    eprintln!("test-agent: exiting with {code} as asked");
                    std::process::exit(code.parse().unwrap_or(1));
                }
                if words.contains(&"!kill") {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
                }
                if let Some(path) = arg("!grandchild") {
                    let child = std::process::Command::new("sleep").arg("300").spawn();
                    if let Ok(child) = child {
                        let _ = std::fs::write(path, child.id().to_string());
                    }
                }
                // As the real CLIs run their commands: out of the agent's process group; `!detached-bare`
                // with an empty environment (no tag from the shim).
                for (word, length, bare) in [("!detached", "301", false), ("!detached-bare", "302", true)] {
                    let Some(path) = arg(word) else { continue };
                    let mut command = std::process::Command::new("/bin/sleep");
                    command.arg(length).process_group(0);
                    if bare {
                        command.env_clear();
                    }
                    if let Ok(child) = command.spawn() {
                        let _ = std::fs::write(path, child.id().to_string());
                    }
                }
                if let Some(ms) = arg("!sleep") {
                    std::thread::sleep(std::time::Duration::from_millis(ms.parse().unwrap_or(0)));
                }
                if words.contains(&"!stray") {
                    let _ = writeln!(out, "npm WARN this is a stray log line");
                }
                if let (Some(n), Some(size)) =
                    (arg("!flood"), words.iter().position(|x| *x == "!flood").and_then(|i| words.get(i + 2)))
                {
                    let chunk = "x".repeat(size.parse().unwrap_or(10));
                    for _ in 0..n.parse::<usize>().unwrap_or(0) {
                        let update =
                            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": chunk}});
                        send(
                            &mut out,
                            &json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": update}}),
                        );
                    }
                }
                if words.contains(&"!echo-queue") {
                    send(
                        &mut out,
                        &json!({"jsonrpc": "2.0", "method": "_x.ai/queue/changed", "params": {"sessionId": sid, "queue": [{"prompt": prompt}]}}),
                    );
                }
                let update = |u: Value| json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": u}});
                if words.contains(&"!rich") {
                    for u in [
                        json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "thinking about it"}}),
                        json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Read README.md", "kind": "read", "status": "pending"}),
                        json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}),
                        json!({"sessionUpdate": "plan", "entries": [
                            {"content": "read", "priority": "high", "status": "completed"},
                            {"content": "fix", "priority": "high", "status": "pending"}]}),
                        json!({"sessionUpdate": "usage_update", "used": 1200, "size": 200000}),
                    ] {
                        send(&mut out, &update(u));
                    }
                }
                let wait = |w: Value| json!({"jsonrpc": "2.0", "method": "_coda/wait", "params": w});
                if words.contains(&"!bad-wait") {
                    send(&mut out, &wait(json!({"sessionId": sid, "waitId": "late", "state": "done"})));
                    send(&mut out, &wait(json!({"sessionId": sid, "state": "waiting"})));
                    send(&mut out, &wait(json!({"sessionId": sid, "waitId": "odd", "state": "finished"})));
                }
                if words.contains(&"!wait-open") {
                    send(
                        &mut out,
                        &wait(
                            json!({"sessionId": sid, "waitId": "forever", "kind": "timer", "state": "waiting", "title": "never ends"}),
                        ),
                    );
                }
                if let Some(ms) = arg("!wait") {
                    let ms = ms.parse().unwrap_or(100);
                    send(
                        &mut out,
                        &wait(json!({"sessionId": sid, "waitId": "build", "kind": "task", "state": "waiting",
                            "title": "build", "detail": "npm run build", "stoppable": true})),
                    );
                    let sid = sid.clone();
                    std::thread::spawn(move || {
                        let mut out = std::io::stdout();
                        for state in ["handling", "done"] {
                            std::thread::sleep(std::time::Duration::from_millis(ms));
                            let w = json!({"jsonrpc": "2.0", "method": "_coda/wait", "params": {"sessionId": sid, "waitId": "build", "state": state}});
                            send(&mut out, &w);
                        }
                    });
                }
                if words.contains(&"!permission") {
                    let request = json!({"jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission", "params": {
                        "sessionId": sid,
                        "toolCall": {"toolCallId": "call-1", "title": "Delete build/", "kind": "delete", "status": "pending"},
                        "options": [{"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
                                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}});
                    send(&mut out, &request);
                    let mut outcome = Value::Null;
                    for line in lines.by_ref() {
                        let Ok(line) = line else { break };
                        let reply: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                        if reply.get("id") == Some(&json!("perm-1")) {
                            outcome = reply.get("result").cloned().unwrap_or(reply);
                            break;
                        }
                    }
                    let text = format!("permission outcome: {outcome}");
                    send(
                        &mut out,
                        &update(
                            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}),
                        ),
                    );
                }
                if words.contains(&"!hang") {
                    send(
                        &mut out,
                        &update(
                            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hanging until cancelled\n"}}),
                        ),
                    );
                    let deaf = words.contains(&"!deaf");
                    let mut cancelled = false;
                    for line in lines.by_ref() {
                        let Ok(line) = line else { break };
                        let msg: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                        if msg.get("method").and_then(Value::as_str) == Some("session/cancel") && !deaf {
                            cancelled = true;
                            break;
                        }
                    }
                    if !cancelled {
                        return; // stdin closed while hanging
                    }
                    send(&mut out, &json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "cancelled"}}));
                    continue;
                }
                if words.contains(&"!auth") {
                    let error = json!({"code": -32000, "message": "Authentication required"});
                    send(&mut out, &json!({"jsonrpc": "2.0", "id": id, "error": error}));
                    continue;
                }
                if words.contains(&"!fail") {
                    send(
                        &mut out,
                        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "failed as asked"}}),
                    );
                    continue;
                }
                sessions.entry(sid.clone()).or_default().extend(prompt.as_array().cloned().unwrap_or_default());
                // `<` written as `&lt;`: the report is the agent's own text, which the shim must not edit.
                let report = prompt.to_string().replace('<', "&lt;");
                let update =
                    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": report}});
                send(
                    &mut out,
                    &json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": update}}),
                );
                if let Ok(result) = std::env::var("TEST_AGENT_PROMPT_RESULT") {
                    let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
                    let _ = out.flush();
                    continue;
                }
                json!({"stopReason": arg("!stop").unwrap_or("end_turn")})
            }
            "_test/nest" => {
                let depth = params.get("depth").and_then(Value::as_u64).unwrap_or(1) as usize;
                let (open, close) = if params.get("object").is_some() { ("{\"a\":", "}") } else { ("[", "]") };
                let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
                let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{nested}}}"#);
                let _ = out.flush();
                continue;
            }
            "_test/echo" => json!({"line": line}),
            "_test/emit" => {
                let _ = writeln!(out, "{}", params.get("line").and_then(Value::as_str).unwrap_or(""));
                json!({})
            }
            "_test/seen" => json!({"methods": seen}),
            _ => {
                let error = json!({"code": -32601, "message": format!("Method not found: {method}")});
                send(&mut out, &json!({"jsonrpc": "2.0", "id": id, "error": error}));
                continue;
            }
        };
        send(&mut out, &json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }
    if std::env::var_os("TEST_AGENT_IGNORE_EOF").is_some() {
        eprintln!("test-agent: stdin closed; staying up as asked");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
    }
}

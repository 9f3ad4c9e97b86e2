//! Prompt mode (`coda-<agent> --prompt TEXT`): one turn run by hand, the binary playing Coda.
//!
//! A person runs a wrapped agent and watches what Coda would see.
//! The client is in-process ([`crate::cli::client`]), under the same layers as under Coda. This side
//! initializes with Coda's client capabilities (section ACP 部分), opens or loads a session with the
//! instruction, sends the prompt, and prints a transcript of the turn ([`crate::cli::coda_view`],
//! [`crate::cli::render`]); afterwards it keeps watching while `_coda/wait` items are open, and with
//! `--compact` asks `_coda/session/compact` as Coda's `compact-session` does (section 压缩上下文).
//! The command line and exit statuses are in [`crate::cli::prompt_options`].

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cli::adapter::Adapter;
use crate::cli::client::{Client, RpcError, Stop};
use crate::cli::coda_view::{current_model, describe_agent};
use crate::cli::prompt_options::{Options, exit};
use crate::cli::render::{Renderer, Tone};
use crate::cli::setup;

/// The whole of prompt mode; returns the exit status.
pub fn main(
    adapter: &Adapter,
    agent_command: Option<String>,
    trace_file: Option<PathBuf>,
    max_line: usize,
    options: Options,
) -> i32 {
    let bin = adapter.binary();
    let instruction = match &options.system_prompt {
        None => None,
        Some(text) => match read_instruction(text) {
            Ok(text) => Some(text),
            Err(why) => {
                eprintln!("{bin}: {why}");
                return exit::USAGE;
            }
        },
    };
    let cwd = match options.cwd.clone().map_or_else(std::env::current_dir, Ok).and_then(std::fs::canonicalize) {
        Ok(dir) if dir.is_dir() => dir,
        Ok(dir) => {
            eprintln!("{bin}: --cwd {} is not a directory", dir.display());
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("{bin}: cannot use the working directory: {e}");
            return exit::USAGE;
        }
    };
    let trace = match (options.json, &trace_file) {
        (true, Some(_)) => {
            eprintln!("{bin}: --json prints what --trace-file records; give one of them");
            return exit::USAGE;
        }
        // The trace records go to our own stdout (a new descriptor on the same file, pipe or terminal).
        (true, None) => match crate::trace::Trace::stdout() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("{bin}: cannot write frames to stdout: {e}");
                return 1;
            }
        },
        (false, Some(path)) => match setup::open_trace(&bin, path) {
            Some(mut t) => {
                t.shim(&bin, adapter.manifest_args);
                Some(t)
            }
            None => return exit::USAGE,
        },
        (false, None) => None,
    };
    let found = match adapter.resolve(agent_command) {
        Ok(found) => found,
        Err(why) => {
            eprintln!("{bin}: {why}");
            return exit::NOT_FOUND;
        }
    };
    let color = !options.json
        && std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::env::var("TERM").map_or(true, |t| t != "dumb");
    let renderer = Renderer::new(std::io::stdout(), color, !options.json);
    let ran = setup::block_on(Duration::from_millis(100), async {
        let mut client = match Client::start(adapter, &found, max_line, trace, renderer).await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("{bin}: cannot start {}: {e}", found.command.display());
                return exit::NOT_FOUND;
            }
        };
        client.questions.stdin_tty = std::io::stdin().is_terminal();
        client.questions.json = options.json;
        let code = prompt_mode(&mut client, &options, &cwd, instruction.as_deref()).await;
        client.shut_down(code == exit::INTERRUPTED).await;
        code
    });
    ran.unwrap_or_else(|e| {
        setup::no_runtime(&bin, &e);
        1
    })
}

/// The whole of prompt mode after start; returns the exit status.
async fn prompt_mode(client: &mut Client, options: &Options, cwd: &std::path::Path, instruction: Option<&str>) -> i32 {
    let mut run = Turn { c: client };
    match run.turn(options, cwd, instruction).await {
        Ok(code) => code,
        Err(Stop::Interrupted) => exit::INTERRUPTED,
        Err(Stop::Deadline) => exit::WAITS_OPEN,
        Err(Stop::AgentGone) => {
            let code = run.c.relay_code().await;
            run.c.r.row(Tone::Red, &format!("the agent exited (the shim's exit status {code}) before answering"));
            exit::AGENT_FAILED
        }
    }
}

/// One turn as Coda runs it, on the client.
struct Turn<'a> {
    c: &'a mut Client,
}

impl Turn<'_> {
    async fn turn(&mut self, options: &Options, cwd: &std::path::Path, instruction: Option<&str>) -> Result<i32, Stop> {
        let init = match self.c.initialize(None).await? {
            Ok(init) => init,
            Err(e) => return Ok(self.setup_failed("initialize", &e)),
        };
        self.c.r.row(Tone::Bold, &describe_agent(&init));
        let caps = init.get("agentCapabilities").cloned().unwrap_or(Value::Null);
        let declares_instruction = caps.pointer("/sessionCapabilities/systemPrompt").is_some_and(Value::is_object);
        let mut params = json!({"cwd": cwd.to_string_lossy(), "mcpServers": []});
        if let Some(text) = instruction {
            if declares_instruction {
                params["systemPrompt"] = json!({"mode": "append", "content": [{"type": "text", "text": text}]});
            } else {
                self.c.r.row(
                    Tone::Yellow,
                    "the agent does not declare sessionCapabilities.systemPrompt: the instruction is not sent (as Coda does)",
                );
            }
        }
        let (session, answer) = match &options.load {
            Some(id) => {
                if caps.get("loadSession").and_then(Value::as_bool) != Some(true) {
                    self.c.r.row(
                        Tone::Red,
                        "the agent does not declare loadSession: Coda would not ask it to load a session",
                    );
                    return Ok(exit::AGENT_FAILED);
                }
                params["sessionId"] = json!(id);
                self.c.view.session = Some(id.clone());
                self.c
                    .r
                    .row(Tone::Dim, &format!("session/load {id}: the history the agent replays (Coda keeps its own):"));
                match self.c.call("session/load", params, None).await? {
                    Ok(answer) => (id.clone(), answer),
                    Err(e) => return Ok(self.setup_failed("session/load", &e)),
                }
            }
            None => match self.c.call("session/new", params, None).await? {
                Ok(answer) => match answer.get("sessionId").and_then(Value::as_str) {
                    Some(id) => (id.to_owned(), answer),
                    None => {
                        self.c.r.row(Tone::Red, &format!("session/new answered without a sessionId: {answer}"));
                        return Ok(exit::AGENT_FAILED);
                    }
                },
                Err(e) => return Ok(self.setup_failed("session/new", &e)),
            },
        };
        self.c.view.session = Some(session.clone());
        let model = current_model(&answer);
        let how = if options.load.is_some() { "loaded" } else { "new" };
        self.c.r.row(
            Tone::Bold,
            &format!(
                "session {session} ({how}) in {}; model {}",
                cwd.display(),
                model.as_deref().unwrap_or("not reported")
            ),
        );
        if model.is_none() {
            self.c.r.row(Tone::Yellow, "no current model reported: Coda would refuse the turn (适配器未报告实际模型)");
        }
        self.c.r.row(Tone::Bold, &format!("> {}", options.prompt));
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": options.prompt}]});
        let code = match self.c.call("session/prompt", params, None).await? {
            Ok(result) => self.stopped(&result),
            Err(e) => self.prompt_failed(&e),
        };
        let code = self.waits(options, code).await?;
        if options.compact {
            let compacted = self.compact(&caps, &session).await?;
            return Ok(if code == exit::END_TURN { compacted } else { code });
        }
        Ok(code)
    }

    /// `_coda/session/compact` of `session`, sent only when the agent declares it (as Coda does); prints the
    /// answer. `END_TURN` when compacted, else `NOT_COMPACTED`.
    async fn compact(&mut self, caps: &Value, session: &str) -> Result<i32, Stop> {
        if !caps.pointer("/_meta/coda/compact").is_some_and(Value::is_object) {
            self.c.r.row(
                Tone::Yellow,
                "the agent does not declare agentCapabilities._meta.coda.compact: Coda would not ask (not compacted)",
            );
            return Ok(exit::NOT_COMPACTED);
        }
        self.c.r.row(Tone::Bold, &format!("> _coda/session/compact {session}"));
        let answer = self.c.call("_coda/session/compact", json!({"sessionId": session}), None).await?;
        let result = match answer {
            Ok(result) => result,
            Err(e) => {
                self.c.r.row(Tone::Red, &format!("compact: error {}: {}", e.code, e.message));
                return Ok(exit::NOT_COMPACTED);
            }
        };
        let count = |k: &str| result.get(k).and_then(Value::as_u64);
        if result.get("compacted").and_then(Value::as_bool) == Some(true) {
            let counts = match (count("before"), count("after")) {
                (Some(b), Some(a)) => format!(": {b} -> {a} tokens of context"),
                (Some(b), None) => format!(": {b} tokens of context before"),
                (None, Some(a)) => format!(": {a} tokens of context after"),
                (None, None) => String::new(),
            };
            self.c.r.row(Tone::Green, &format!("compacted{counts}"));
            return Ok(exit::END_TURN);
        }
        let reason = result.get("reason").and_then(Value::as_str).unwrap_or("no reason given");
        self.c.r.row(Tone::Yellow, &format!("not compacted: {reason}"));
        Ok(exit::NOT_COMPACTED)
    }

    /// Watches open `_coda/wait` items after the turn until they settle or `--wait-timeout`.
    async fn waits(&mut self, options: &Options, code: i32) -> Result<i32, Stop> {
        let open = self.c.view.open_waits();
        if open == 0 {
            return Ok(code);
        }
        self.c.r.row(
            Tone::Dim,
            &format!(
                "{open} wait(s) still open; watching them settle (up to {}; Ctrl-C to stop)",
                humantime::format_duration(options.wait_timeout)
            ),
        );
        let deadline = Instant::now() + options.wait_timeout;
        while self.c.view.open_waits() > 0 {
            match self.c.pump(Some(deadline), true).await {
                Ok(Some((id, _))) => {
                    tracing::warn!("an answer to a request prompt mode did not send; ignored");
                    tracing::debug!("its id: {id}");
                }
                Ok(None) => {}
                Err(Stop::Deadline) => {
                    let open = self.c.view.open_waits();
                    self.c.r.row(Tone::Red, &format!("{open} wait(s) still open after --wait-timeout; giving up"));
                    return Ok(exit::WAITS_OPEN);
                }
                Err(stop) => return Err(stop),
            }
        }
        self.c.r.row(Tone::Dim, "every wait settled");
        Ok(code)
    }

    /// The end of the turn: its stop reason (and usage, where the agent reports it in the result).
    fn stopped(&mut self, result: &Value) -> i32 {
        if let Some(usage) = result.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| usage.get(k).map(Value::to_string).unwrap_or_else(|| "?".into());
            self.c.r.row(
                Tone::Dim,
                &format!(
                    "usage: {} in, {} out, {} total tokens",
                    n("inputTokens"),
                    n("outputTokens"),
                    n("totalTokens")
                ),
            );
        }
        let reason = result.get("stopReason").and_then(Value::as_str).unwrap_or("(none)");
        let (tone, code) = match reason {
            "end_turn" => (Tone::Green, exit::END_TURN),
            "max_tokens" => (Tone::Yellow, exit::MAX_TOKENS),
            "max_turn_requests" => (Tone::Yellow, exit::MAX_TURN_REQUESTS),
            "refusal" => (Tone::Red, exit::REFUSAL),
            "cancelled" => (Tone::Yellow, exit::CANCELLED),
            _ => (Tone::Red, exit::UNKNOWN_STOP),
        };
        self.c.r.row(tone, &format!("stop: {reason}"));
        code
    }

    fn prompt_failed(&mut self, e: &RpcError) -> i32 {
        if let Some(code) = self.needs_login("session/prompt", e) {
            return code;
        }
        self.c.r.row(Tone::Red, &format!("error {}: {}", e.code, e.message));
        if let Some(failure) = e.data.as_ref().and_then(|d| d.pointer("/_meta/coda/failure")) {
            self.c.r.row(Tone::Red, &format!("  failure: {failure}"));
        }
        self.stderr_tail(e);
        if e.agent_exited() { exit::AGENT_FAILED } else { exit::PROMPT_ERROR }
    }

    /// ACP's auth_required (-32000), on any request: its own exit status, whatever else the error says.
    fn needs_login(&mut self, method: &str, e: &RpcError) -> Option<i32> {
        if e.code != -32000 {
            return None;
        }
        self.c.r.row(Tone::Red, &format!("{method}: the agent needs a login (error -32000: {})", e.message));
        Some(exit::NEEDS_LOGIN)
    }

    fn setup_failed(&mut self, method: &str, e: &RpcError) -> i32 {
        if let Some(code) = self.needs_login(method, e) {
            return code;
        }
        self.c.r.row(Tone::Red, &format!("{method} failed: error {}: {}", e.code, e.message));
        self.stderr_tail(e);
        exit::AGENT_FAILED
    }

    fn stderr_tail(&mut self, e: &RpcError) {
        let Some(tail) = e.data.as_ref().and_then(|d| d.get("stderr")).and_then(Value::as_str) else { return };
        for line in tail.lines().filter(|l| !l.trim().is_empty()) {
            self.c.r.row(Tone::Dim, &format!("  stderr: {line}"));
        }
    }
}

/// `--system-prompt TEXT` or `@FILE`.
fn read_instruction(given: &str) -> Result<String, String> {
    let text = match given.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the instruction file {path:?} (from --system-prompt @{path}): {e}"))?,
        None => given.to_owned(),
    };
    if text.trim().is_empty() {
        return Err("--system-prompt is empty".into());
    }
    Ok(text)
}

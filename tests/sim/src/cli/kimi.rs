//! Kimi's session files, as Kimi Code 2.1.0 writes them (fixtures/kimi/*/files.jsonl, and the file records of
//! `fixtures/kimi/upstream-failures`): the folder `<KIMI_CODE_HOME>/sessions/<workspace>/<session>/` made with
//! the session, `agents/main/wire.jsonl` (a metadata line, then a record per event: a turn's prompt, its
//! content, its usage and end, a step's retries, a cancel, a compaction, a background task's start and end)
//! and `agents/main/tasks/<taskId>.json` (replaced whole on each change).
//!
//! What Kimi reports over ACP for a client turn is the model's lines as before; a turn of Kimi's own is only in
//! the wire (the shim reports it from there), and so are a turn's failure and retries (Kimi answers `end_turn`).

use std::path::PathBuf;

use serde_json::{Value, json};

use super::{FileOp, Model};
use crate::plan::Failure;

/// The workspace folder the sessions live in (Kimi names it after the working directory).
const WORKSPACE: &str = "wd_app_0123456789ab";

/// Kimi's retry schedule as recorded (backoff with jitter, ten attempts): the wait after each failed attempt.
const BACKOFF_MS: [u64; 9] = [593, 1_059, 2_383, 4_615, 8_440, 16_272, 34_591, 60_000, 60_000];

impl Model {
    /// The folder of `session`'s main agent, when the model writes Kimi's files.
    fn kimi_agent_dir(&self, session: &str) -> Option<PathBuf> {
        let root = self.kimi_root.as_ref()?;
        Some(root.join("sessions").join(WORKSPACE).join(session).join("agents/main"))
    }

    /// A record's `time`: the wall clock of the shim's layers (it starts at the Pair's and moves with virtual
    /// time), in ms.
    fn wall_ms(at: u64) -> u64 {
        let start = coda_shim::relay::testing::wall_start();
        start.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0) + at
    }

    /// Makes the session's folder with its wire's first lines, before Kimi answers `session/new` (as Kimi does:
    /// the shim looks for it once it has the answer).
    pub(super) fn kimi_create(&mut self, session: &str, now: u64) {
        let Some(dir) = self.kimi_agent_dir(session) else { return };
        if std::fs::create_dir_all(dir.join("tasks")).is_err() {
            return;
        }
        let head = format!(
            "{}\n{}\n",
            json!({"type": "metadata", "protocol_version": "1.5", "created_at": Self::wall_ms(now)}),
            json!({"type": "runtime.set_binding", "workspaceId": WORKSPACE, "runtimeId": "local",
                "agentId": "main", "time": Self::wall_ms(now)})
        );
        let _ = std::fs::write(dir.join("wire.jsonl"), head);
    }

    /// Appends `records` to the session's wire at `at` (each gets its `time`).
    pub(super) fn wire_at(&mut self, session: &str, at: u64, records: Vec<Value>, turn: Option<(String, u64)>) {
        self.wire_with(session, at, records, turn, None);
    }

    /// [`Model::wire_at`], with what writing it does.
    pub(super) fn wire_with(
        &mut self,
        session: &str,
        at: u64,
        records: Vec<Value>,
        turn: Option<(String, u64)>,
        effect: Option<super::Effect>,
    ) {
        let Some(op) = self.wire_append(session, at, records) else { return };
        self.file_at(at, op, turn, effect);
    }

    /// Appends `records` to the wire right after the entry being written, before anything else due.
    pub(super) fn wire_next(&mut self, session: &str, records: Vec<Value>) {
        let Some(op) = self.wire_append(session, self.now, records) else { return };
        self.after.push_back(super::Out { line: String::new(), file: Some(op), turn: None, effect: None });
    }

    fn wire_append(&self, session: &str, at: u64, records: Vec<Value>) -> Option<FileOp> {
        let dir = self.kimi_agent_dir(session)?;
        let mut bytes = Vec::new();
        for mut r in records {
            r["agentId"] = json!("main");
            r["time"] = json!(Self::wall_ms(at));
            bytes.extend_from_slice(r.to_string().as_bytes());
            bytes.push(b'\n');
        }
        Some(FileOp { path: dir.join("wire.jsonl"), bytes, replace: false })
    }

    /// Replaces a task file at `at`.
    pub(super) fn task_file_at(&mut self, session: &str, at: u64, info: Value, turn: Option<(String, u64)>) {
        let Some(dir) = self.kimi_agent_dir(session) else { return };
        let id = info.get("taskId").and_then(Value::as_str).unwrap_or("task").to_owned();
        let op = FileOp {
            path: dir.join("tasks").join(format!("{id}.json")),
            bytes: info.to_string().into_bytes(),
            replace: true,
        };
        self.file_at(at, op, turn, None);
    }

    /// The chunks a wire write carries (a turn of Kimi's own: the shim reports them) are written now.
    pub(super) fn file_chunks(&mut self, op: &FileOp, now: u64) {
        let text = String::from_utf8_lossy(&op.bytes);
        for n in text.split('«').skip(1).filter_map(|rest| rest.split('»').next()?.parse::<u64>().ok()) {
            if let Some((session, must)) = self.chunk_must.remove(&n) {
                self.truth.chunks.push((n, session, must, self.process, now));
            }
        }
    }
}

/// `turn.prompt` of turn `turn` (`origin`: Kimi's `{kind: user}`, `{kind: task, taskId}`, …).
pub fn turn_prompt(turn: u64, text: &str, origin: Value) -> Value {
    json!({"type": "turn.prompt", "input": [{"type": "text", "text": text}], "origin": origin, "turnId": turn})
}

/// A text part of turn `turn`'s content.
pub fn content(turn: u64, text: &str) -> Value {
    json!({"type": "context.append_loop_event", "event": {"type": "content.part", "turnId": turn.to_string(),
        "step": 1, "part": {"type": "text", "text": text}}})
}

/// What ends a completed turn: the last request's usage, Kimi's count of its context, the end.
pub fn completed(turn: u64, used: u64) -> Vec<Value> {
    vec![
        json!({"type": "llm.request", "kind": "loop", "provider": "openai", "model": "fake-model",
            "modelAlias": "fake", "maxTokens": 131_072, "turnStep": format!("{turn}.1")}),
        json!({"type": "usage.record", "model": "fake", "usage": {"inputOther": used - 5, "output": 5,
            "inputCacheRead": 0, "inputCacheCreation": 0}, "usageScope": "turn"}),
        json!({"type": "token_counting.measured", "length": 3, "tokens": used}),
        json!({"type": "turn.ended", "turnId": turn, "reason": "completed", "durationMs": 300}),
    ]
}

/// What ends a cancelled turn.
pub fn cancelled(turn: u64) -> Vec<Value> {
    vec![
        json!({"type": "turn.cancel", "turnId": turn, "target": "active", "reason": "user_cancelled"}),
        json!({"type": "turn.step.interrupted", "turnId": turn, "step": 1, "reason": "aborted"}),
        json!({"type": "turn.ended", "turnId": turn, "reason": "cancelled", "durationMs": 300}),
    ]
}

/// Kimi's error for a failure: (error name, message, HTTP status, whether Kimi retries it).
fn error_of(f: Failure) -> (&'static str, &'static str, Option<u64>, bool) {
    use Failure::*;
    match f {
        FailQuota | FailQuotaWait => (
            "APIProviderQuotaExhaustedError",
            "429 You exceeded your current quota, please check your plan and billing details.",
            Some(429),
            false,
        ),
        FailRate | FailRateWait => (
            "APIProviderRateLimitError",
            "429 Rate limit reached for requests. Please try again later.",
            Some(429),
            true,
        ),
        FailServer => ("APIStatusError", "500 The server had an error while processing your request.", Some(500), true),
        FailGateway => ("APIStatusError", "502 Bad Gateway", Some(502), true),
        FailService => {
            ("APIProviderOverloadedError", "503 The server is overloaded, please try again later.", Some(503), true)
        }
        FailOverloaded => ("APIProviderOverloadedError", "529 Overloaded", Some(529), true),
        FailReset => ("APIConnectionError", "Connection error.", None, true),
        FailAuth => ("APIStatusError", "401 Incorrect API key provided.", Some(401), false),
        FailGeneric | FailSandbox => ("Error", "something broke", None, false),
    }
}

/// What ends a failed turn: the interrupted step, and the end with Kimi's error.
pub fn failed(turn: u64, f: Failure) -> Vec<Value> {
    let (name, message, status, retryable) = error_of(f);
    let code = match f {
        Failure::FailAuth => "provider.auth_error",
        Failure::FailGeneric | Failure::FailSandbox => "internal",
        _ => "provider.api_error",
    };
    vec![
        json!({"type": "turn.step.interrupted", "turnId": turn, "step": 1, "reason": "error",
            "message": format!("[{code}] {message}")}),
        json!({"type": "turn.ended", "turnId": turn, "reason": "failed", "error": {"code": code, "message": message,
            "name": name, "details": {"statusCode": status, "requestId": null, "traceId": null},
            "retryable": retryable}, "durationMs": 300}),
    ]
}

/// Kimi's retries of a failure: each `turn.step.retrying` with its delay from the first failed attempt (none for
/// one Kimi does not retry). A `Retry-After` of 90 s is its first wait.
pub fn retries(turn: u64, f: Failure) -> Vec<(u64, Value)> {
    let (name, message, status, retryable) = error_of(f);
    if !retryable {
        return Vec::new();
    }
    let delays: Vec<u64> = if f == Failure::FailRateWait { vec![90_000; 9] } else { BACKOFF_MS.to_vec() };
    let mut at = 0;
    delays
        .into_iter()
        .enumerate()
        .map(|(i, delay)| {
            let attempt = i as u64 + 1;
            let record = json!({"type": "turn.step.retrying", "turnId": turn, "step": attempt,
                "failedAttempt": attempt, "nextAttempt": attempt + 1, "maxAttempts": 10, "delayMs": delay,
                "errorName": name, "errorMessage": message, "statusCode": status});
            let this = at;
            at += delay + 60;
            (this, record)
        })
        .collect()
}

/// A background command's task record (the wire's `info`, the task file's content).
pub fn task_info(id: &str, call: &str, status: &str, exit: Option<i64>) -> Value {
    json!({"taskId": id, "description": "run sleep 30", "status": status, "detached": true, "timeoutMs": 600_000,
        "kind": "process", "command": "sleep 30", "exitCode": exit, "parentToolCallId": call})
}

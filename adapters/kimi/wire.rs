//! Kimi Code's session-file records, parsed: one line of a wire or one task file at a time.
//!
//! The records of `agents/<agentId>/wire.jsonl` that matter for activity, and the task records of
//! `agents/<agentId>/tasks/<taskId>.json`, as Kimi Code 2.1.0 writes them. Splitting files into lines and
//! ordering records across files is [`crate::adapters::kimi::feed`]'s job.

use serde_json::Value;

/// The wire `protocol_version`s whose records we know how to read.
pub const KNOWN_PROTOCOLS: &[&str] = &["1.5"];

/// One record of a wire file, reduced to what the translation needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Metadata {
        protocol_version: String,
    },
    TurnPrompt {
        turn_id: i64,
        origin: Origin,
    },
    TurnEnded {
        turn_id: i64,
        reason: String,
        /// Why a `failed` turn failed: Kimi's error payload `{code, message, name, details, retryable}`.
        error: Option<Value>,
    },
    /// `turn.step.retrying`: Kimi waits `delay_ms` before its next attempt at a step that failed.
    StepRetrying(Retrying),
    /// A `content.part` of a step: text or thinking.
    Text {
        turn_id: Option<i64>,
        text: String,
        thought: bool,
    },
    ToolCall {
        turn_id: Option<i64>,
        call_id: String,
        name: String,
        args: Value,
    },
    ToolResult {
        call_id: String,
        output: String,
        is_error: bool,
    },
    TaskStarted(TaskInfo),
    TaskTerminated(TaskInfo),
    /// A message added to the running turn (`context.append_message`); with `origin.kind: task` it is a
    /// background task's notification injected into that turn (seen live on Kimi 2.1.0).
    Injected {
        origin: Origin,
    },
    /// `WaitFor` handed these tasks' results to the agent (their notifications are suppressed).
    WaitDelivered {
        task_ids: Vec<String>,
    },
    SubagentSpawned(Spawn),
    SubagentEnded {
        subagent_id: String,
        outcome: Outcome,
    },
    /// `llm.request`: the agent sent a request to the model. `kind` is `loop` for the agent's own steps and
    /// `compaction` for a summary; `max_tokens` is the model's context window (`maxTokens`).
    LlmRequest {
        kind: String,
        max_tokens: Option<u64>,
    },
    /// `usage.record`: the tokens of a model answer; `input` = inputOther + inputCacheRead +
    /// inputCacheCreation (the context of that request), `None` when one of them is not a token count.
    Usage {
        input: Option<u64>,
    },
    /// `token_counting.measured` / `.rebased` / `.turn_recorded`: Kimi's own count of its context, the `used`
    /// of its `usage_update`.
    TokenCount {
        tokens: u64,
    },
    /// `full_compaction.begin`: `source` `manual` (`/compact`) or `auto`.
    CompactionBegin {
        source: String,
    },
    /// `context.apply_compaction`: Kimi's estimates of the context before and after.
    CompactionApplied {
        before: Option<u64>,
        after: Option<u64>,
    },
    /// `full_compaction.complete` (true) or `full_compaction.cancel` (false).
    CompactionEnded {
        completed: bool,
    },
    /// Anything else (still carries its time for ordering).
    Other,
}

/// A `turn.step.retrying` record (seen live on Kimi 2.1.0 for HTTP 429 and 5xx answers).
#[derive(Debug, Clone, PartialEq)]
pub struct Retrying {
    pub turn_id: i64,
    pub failed_attempt: u64,
    pub max_attempts: u64,
    /// The wait Kimi scheduled; never negative or infinite (bad values read as 0).
    pub delay_ms: u64,
    /// Kimi's name for the error, e.g. `APIProviderRateLimitError`.
    pub error_name: String,
    pub message: String,
    pub status: Option<u64>,
}

/// What started a turn (`turn.prompt` `origin`).
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    pub kind: String,
    /// For `kind: task`: the task whose end the turn handles.
    pub task_id: Option<String>,
    /// For `system_trigger`: e.g. `subagent`.
    pub name: Option<String>,
}

impl Origin {
    /// A client prompt (the turns Kimi reports over ACP itself).
    pub fn is_user(&self) -> bool {
        self.kind == "user"
    }

    /// A turn a client's prompt started: a prompt's (`user`) or a skill's its slash command ran
    /// (`skill_activation`); Kimi answers that prompt, and sends its `usage_update`, when the turn ends.
    pub fn is_client(&self) -> bool {
        self.is_user() || self.kind == "skill_activation"
    }

    /// A run of a subagent requested by its parent.
    pub fn is_subagent_run(&self) -> bool {
        self.kind == "system_trigger" && self.name.as_deref() == Some("subagent")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Spawn {
    pub subagent_id: String,
    pub parent_agent_id: String,
    pub description: String,
    pub background: bool,
    pub model: Option<String>,
    pub task_id: Option<String>,
}

/// A task record, from the wire (`info`) or from its JSON file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskInfo {
    pub task_id: String,
    pub kind: String,
    pub status: String,
    pub description: String,
    pub command: Option<String>,
    /// For agent tasks: the subagent (`agent-N`).
    pub agent_id: Option<String>,
    /// Set by TaskStop (and shutdown): no notification reaches the agent.
    pub suppressed: bool,
}

impl TaskInfo {
    pub fn from_value(v: &Value) -> Option<TaskInfo> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        Some(TaskInfo {
            task_id: s("taskId").filter(|t| !t.is_empty())?,
            kind: s("kind").unwrap_or_default(),
            status: s("status").unwrap_or_default(),
            description: s("description").unwrap_or_default(),
            command: s("command"),
            agent_id: s("agentId"),
            suppressed: v.get("terminalNotificationSuppressed").and_then(Value::as_bool).unwrap_or(false),
        })
    }

    /// Parses a `tasks/<taskId>.json` file.
    pub fn parse_file(bytes: &[u8]) -> Option<TaskInfo> {
        TaskInfo::from_value(&crate::json::from_slice(bytes).ok()?)
    }
}

/// One parsed line of a wire file.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `time` in ms (0 when absent, e.g. the metadata line uses `created_at`).
    pub time: u64,
    pub record: Record,
}

fn turn_number(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Parses one line. `Err` says why it is not a wire record.
pub fn parse_line(line: &[u8]) -> Result<Entry, String> {
    let mut v: Value = crate::json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let Some(ty) = v.get("type").and_then(Value::as_str).map(str::to_owned) else {
        return Err("no \"type\"".into());
    };
    // Owned, so that parts of the record can be moved out of it below.
    let ty = ty.as_str();
    let time = v.get("time").or_else(|| v.get("created_at")).and_then(Value::as_u64).unwrap_or(0);
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    // Records with `kind: "event"` come from another layer with its own turn numbers.
    if v.get("kind").and_then(Value::as_str) == Some("event") {
        return Ok(Entry { time, record: Record::Other });
    }
    let record = match ty {
        "metadata" => Record::Metadata { protocol_version: s(&v, "protocol_version").unwrap_or_default() },
        "turn.prompt" => {
            let o = v.get("origin").cloned().unwrap_or(Value::Null);
            Record::TurnPrompt {
                turn_id: turn_number(v.get("turnId")).ok_or("turn.prompt without turnId")?,
                origin: Origin {
                    kind: s(&o, "kind").unwrap_or_default(),
                    task_id: s(&o, "taskId"),
                    name: s(&o, "name"),
                },
            }
        }
        "turn.ended" => Record::TurnEnded {
            turn_id: turn_number(v.get("turnId")).ok_or("turn.ended without turnId")?,
            reason: s(&v, "reason").unwrap_or_default(),
            error: v.get("error").filter(|e| e.is_object()).cloned(),
        },
        "turn.step.retrying" => {
            let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
            // `delayMs` is a float (backoff with jitter); anything not a finite non-negative number counts as 0.
            let delay = v.get("delayMs").and_then(Value::as_f64).filter(|d| d.is_finite() && *d >= 0.0);
            Record::StepRetrying(Retrying {
                turn_id: turn_number(v.get("turnId")).ok_or("turn.step.retrying without turnId")?,
                failed_attempt: n("failedAttempt"),
                max_attempts: n("maxAttempts"),
                delay_ms: delay.map_or(0, |d| d.min(u64::MAX as f64) as u64),
                error_name: s(&v, "errorName").unwrap_or_default(),
                message: s(&v, "errorMessage").unwrap_or_default(),
                status: v.get("statusCode").and_then(Value::as_u64),
            })
        }
        "context.append_message" => {
            let o = v.pointer("/message/origin").cloned().unwrap_or(Value::Null);
            Record::Injected {
                origin: Origin {
                    kind: s(&o, "kind").unwrap_or_default(),
                    task_id: s(&o, "taskId"),
                    name: s(&o, "name"),
                },
            }
        }
        "context.append_loop_event" => {
            // Moved out, not copied: a record can be megabytes (tool output).
            let mut e = v.get_mut("event").map(Value::take).unwrap_or(Value::Null);
            let turn_id = turn_number(e.get("turnId"));
            match e.get("type").and_then(Value::as_str) {
                Some("content.part") => {
                    let part = e.get_mut("part").map(Value::take).unwrap_or(Value::Null);
                    match part.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            Record::Text { turn_id, text: s(&part, "text").unwrap_or_default(), thought: false }
                        }
                        Some("think") => {
                            Record::Text { turn_id, text: s(&part, "think").unwrap_or_default(), thought: true }
                        }
                        _ => Record::Other,
                    }
                }
                Some("tool.call") => Record::ToolCall {
                    turn_id,
                    call_id: s(&e, "toolCallId").ok_or("tool.call without toolCallId")?,
                    name: s(&e, "name").unwrap_or_default(),
                    args: e.get_mut("args").map(Value::take).unwrap_or(Value::Null),
                },
                Some("tool.result") => {
                    let mut r = e.get_mut("result").map(Value::take).unwrap_or(Value::Null);
                    let output = match r.get_mut("output").map(Value::take) {
                        Some(Value::String(t)) => t,
                        Some(other) => other.to_string(),
                        None => String::new(),
                    };
                    Record::ToolResult {
                        call_id: s(&e, "toolCallId").ok_or("tool.result without toolCallId")?,
                        output,
                        is_error: r.get("isError").and_then(Value::as_bool).unwrap_or(false),
                    }
                }
                _ => Record::Other,
            }
        }
        "task.started" | "task.terminated" => {
            let info = v.get("info").and_then(TaskInfo::from_value).ok_or("task record without info.taskId")?;
            if ty == "task.started" { Record::TaskStarted(info) } else { Record::TaskTerminated(info) }
        }
        "task.waitDelivered" => {
            let keys = v.get("keys").and_then(Value::as_array).cloned().unwrap_or_default();
            // Each key is "<taskId>\0<status>\0<notificationId>".
            let task_ids = keys
                .iter()
                .filter_map(Value::as_str)
                .filter_map(|k| k.split('\0').next())
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect();
            Record::WaitDelivered { task_ids }
        }
        "subagent.spawned" => Record::SubagentSpawned(Spawn {
            subagent_id: s(&v, "subagentId").ok_or("subagent.spawned without subagentId")?,
            parent_agent_id: s(&v, "parentAgentId").unwrap_or_else(|| "main".into()),
            description: s(&v, "description").unwrap_or_default(),
            background: v.get("runInBackground").and_then(Value::as_bool).unwrap_or(false),
            model: s(&v, "model"),
            task_id: s(&v, "taskId"),
        }),
        "subagent.completed" | "subagent.failed" | "subagent.cancelled" => Record::SubagentEnded {
            subagent_id: s(&v, "subagentId").ok_or("subagent record without subagentId")?,
            outcome: match ty {
                "subagent.completed" => Outcome::Completed,
                "subagent.failed" => Outcome::Failed,
                _ => Outcome::Cancelled,
            },
        },
        "llm.request" => Record::LlmRequest {
            kind: s(&v, "kind").unwrap_or_default(),
            max_tokens: v.get("maxTokens").and_then(Value::as_u64),
        },
        "usage.record" => {
            let u = v.get("usage");
            let count = |k: &str| u.and_then(|u| u.get(k)).map_or(Some(0), Value::as_u64);
            let input = [count("inputOther"), count("inputCacheRead"), count("inputCacheCreation")]
                .into_iter()
                .try_fold(0u64, |sum, n| sum.checked_add(n?));
            Record::Usage { input: input.filter(|_| u.is_some_and(Value::is_object)) }
        }
        "token_counting.measured" | "token_counting.rebased" | "token_counting.turn_recorded" => {
            match v.get("tokens").and_then(Value::as_u64) {
                Some(tokens) => Record::TokenCount { tokens },
                None => Record::Other,
            }
        }
        "full_compaction.begin" => Record::CompactionBegin { source: s(&v, "source").unwrap_or_default() },
        "context.apply_compaction" => Record::CompactionApplied {
            before: v.get("tokensBefore").and_then(Value::as_u64),
            after: v.get("tokensAfter").and_then(Value::as_u64),
        },
        "full_compaction.complete" => Record::CompactionEnded { completed: true },
        "full_compaction.cancel" => Record::CompactionEnded { completed: false },
        _ => Record::Other,
    };
    Ok(Entry { time, record })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_records_that_matter() {
        let e = parse_line(br#"{"type":"turn.prompt","agentId":"main","turnId":1,"origin":{"kind":"task","taskId":"bash-l3uxg0a9","status":"failed"},"input":[],"time":5}"#).unwrap();
        assert_eq!(e.time, 5);
        let Record::TurnPrompt { turn_id: 1, origin } = e.record else { panic!("{e:?}") };
        assert_eq!(origin.task_id.as_deref(), Some("bash-l3uxg0a9"));
        assert!(!origin.is_user());

        let e = parse_line(br#"{"type":"context.append_loop_event","agentId":"agent-0","event":{"type":"content.part","turnId":"0","part":{"type":"think","think":"hm"}},"time":7}"#).unwrap();
        assert_eq!(e.record, Record::Text { turn_id: Some(0), text: "hm".into(), thought: true });

        let e = parse_line(b"{\"type\":\"task.waitDelivered\",\"agentId\":\"main\",\"keys\":[\"bash-929tv3jx\\u0000completed\\u0000task:bash-929tv3jx:completed\"],\"time\":1}").unwrap();
        assert_eq!(e.record, Record::WaitDelivered { task_ids: vec!["bash-929tv3jx".into()] });

        let e = parse_line(br#"{"type":"task.terminated","agentId":"main","info":{"taskId":"bash-3wlkpb7l","kind":"process","status":"killed","terminalNotificationSuppressed":true},"time":1}"#).unwrap();
        let Record::TaskTerminated(info) = e.record else { panic!() };
        assert!(info.suppressed);
        assert_eq!(info.status, "killed");
    }

    #[test]
    fn usage_and_compaction_records_and_bad_numbers_in_them() {
        let e = parse_line(br#"{"type":"llm.request","agentId":"main","kind":"loop","maxTokens":131072,"time":9}"#)
            .unwrap();
        assert_eq!((e.time, e.record), (9, Record::LlmRequest { kind: "loop".into(), max_tokens: Some(131072) }));
        let usage = |u: &str| {
            let line =
                format!(r#"{{"type":"usage.record","agentId":"main","usage":{u},"usageScope":"turn","time":1}}"#);
            parse_line(line.as_bytes()).unwrap().record
        };
        assert_eq!(
            usage(r#"{"inputOther":21864,"output":5,"inputCacheRead":100,"inputCacheCreation":7}"#),
            Record::Usage { input: Some(21971) }
        );
        // A count that is missing is none; one that is no count (negative, fractional, 1e400, text, a sum past
        // u64) makes the context unknown, never a wrong number.
        assert_eq!(usage(r#"{"inputOther":3}"#), Record::Usage { input: Some(3) });
        for bad in [
            r#"{"inputOther":-1}"#,
            r#"{"inputOther":1.5}"#,
            r#"{"inputOther":1e400}"#,
            r#"{"inputOther":"12"}"#,
            r#"{"inputOther":18446744073709551615,"inputCacheRead":1}"#,
            r#"[1,2]"#,
            r#"null"#,
        ] {
            assert_eq!(usage(bad), Record::Usage { input: None }, "{bad}");
        }
        let e = parse_line(br#"{"type":"context.apply_compaction","agentId":"main","tokensBefore":21196,"tokensAfter":1e400,"time":3}"#).unwrap();
        assert_eq!(e.record, Record::CompactionApplied { before: Some(21196), after: None });
        let e = parse_line(br#"{"type":"full_compaction.cancel","agentId":"main","time":4}"#).unwrap();
        assert_eq!(e.record, Record::CompactionEnded { completed: false });
        let e = parse_line(br#"{"type":"token_counting.rebased","agentId":"main","tokens":-5,"time":4}"#).unwrap();
        assert_eq!(e.record, Record::Other);
    }

    #[test]
    fn event_records_and_malformed_lines() {
        let e = parse_line(br#"{"turnId":4,"type":"agent.turn.ended","time":1,"kind":"event"}"#).unwrap();
        assert_eq!(e.record, Record::Other);
        assert!(parse_line(b"{not json").is_err());
        assert!(parse_line(br#"{"type":"turn.ended","agentId":"main"}"#).is_err());
    }

    #[test]
    fn nesting_is_bounded_like_a_frame() {
        // A tool's deep JSON output in a record: read up to the shim's limit, refused past it, never a crash.
        let deep = |n: usize| {
            format!(r#"{{"type":"x.other","agentId":"main","out":{}1{},"time":1}}"#, "[".repeat(n), "]".repeat(n))
        };
        assert!(parse_line(deep(900).as_bytes()).err().is_none_or(|e| !e.contains("deeper")));
        let err = parse_line(deep(20_000).as_bytes()).unwrap_err();
        assert!(err.contains("deeper than 1000 levels"), "{err}");
    }
}

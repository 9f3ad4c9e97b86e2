//! The frames each CLI writes, trimmed from its recordings (`fixtures/<agent>/`): what differs between the
//! models is here, what they share is in `mod.rs`.

use serde_json::{Value, json};

use crate::plan::Failure;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Codex,
    Grok,
    Kimi,
    OpenCode,
}

impl Flavor {
    pub fn of(agent: &str) -> Flavor {
        match agent {
            "codex" => Flavor::Codex,
            "grok" => Flavor::Grok,
            "kimi" => Flavor::Kimi,
            "opencode" => Flavor::OpenCode,
            other => panic!("no model of the CLI of {other:?}"),
        }
    }

    /// The CLI compacts with its `/compact` command sent as a prompt (the others: a request of their own, or
    /// OpenCode's server).
    pub fn compacts_by_prompt(self) -> bool {
        matches!(self, Flavor::Codex | Flavor::Kimi)
    }

    /// The CLI runs turns of its own (on background results); Codex has none.
    pub fn has_own_turns(self) -> bool {
        self != Flavor::Codex
    }

    pub fn session_id(self, n: u32) -> String {
        match self {
            Flavor::Codex => format!("019d-sim-{n:04}"),
            Flavor::Grok => format!("01a2-sim-{n:04}"),
            Flavor::Kimi => format!("session_sim{n:04}"),
            Flavor::OpenCode => format!("ses_sim{n:04}"),
        }
    }

    /// The `initialize` result.
    pub fn init_result(self) -> Value {
        match self {
            Flavor::Codex => json!({"protocolVersion": 1,
                "agentInfo": {"name": "@agentclientprotocol/codex-acp", "title": "Codex", "version": "2.6.0"},
                "agentCapabilities": {"loadSession": true, "promptCapabilities": {"embeddedContext": true, "image": true},
                    "sessionCapabilities": {"resume": {}, "list": {}, "close": {}, "systemPrompt": {}},
                    "_meta": {"authStatus": {}}},
                "authMethods": [{"id": "api-key", "name": "API Key"}],
                "_meta": {"steering": {"supported": true}, "jetbrains": {"air": {"version": 1,
                    "capabilities": ["sessionFailure", "nativeSubagentSessions", "asyncTasks"]}}}}),
            Flavor::Grok => json!({"protocolVersion": 1,
                "agentCapabilities": {"loadSession": true, "promptCapabilities": {"image": false, "audio": false,
                    "embeddedContext": true}, "mcpCapabilities": {"http": true, "sse": true}},
                "_meta": {"grokShell": true, "agentVersion": "1.0.41"}}),
            Flavor::Kimi => json!({"protocolVersion": 1,
                "agentCapabilities": {"loadSession": true, "promptCapabilities": {"image": true, "audio": false,
                    "embeddedContext": true}, "sessionCapabilities": {"list": {}, "resume": {}, "close": {}}},
                "agentInfo": {"name": "Kimi Code CLI", "version": "2.1.0"}}),
            Flavor::OpenCode => json!({"protocolVersion": 1,
                "agentCapabilities": {"loadSession": true, "mcpCapabilities": {"http": true, "sse": true},
                    "promptCapabilities": {"embeddedContext": true, "image": true},
                    "sessionCapabilities": {"close": {}, "fork": {}, "list": {}, "resume": {}}},
                "authMethods": [{"description": "Run `opencode auth login` in the terminal",
                    "name": "Login with opencode", "id": "opencode-login"}],
                "agentInfo": {"name": "OpenCode", "version": "1.18.33"}}),
        }
    }

    /// The `session/new` (or `load`) result for `session`.
    pub fn session_result(self, session: &str, load: bool) -> Value {
        let mut r = match self {
            Flavor::Codex => json!({"models": {"currentModelId": "gpt-6.1-sol[low]",
                "availableModels": [{"modelId": "gpt-6.1-sol[low]", "name": "6.1 Sol (low)"}]},
                "modes": {"currentModeId": "read-only", "availableModes": [{"id": "read-only", "name": "Read Only"}]}}),
            Flavor::Grok => json!({"models": {"currentModelId": "fake",
                "availableModels": [{"modelId": "fake", "name": "fake-model"}]}}),
            Flavor::Kimi => json!({"configOptions": [{"type": "select", "id": "model", "name": "Model",
                "category": "model", "currentValue": "fake", "options": [{"value": "fake", "name": "fake-model"}]}]}),
            Flavor::OpenCode => json!({"configOptions": [{"id": "model", "name": "Model", "category": "model",
                "type": "select", "currentValue": "fake/fake-model",
                "options": [{"value": "fake/fake-model", "name": "Fake/Fake model"}]}]}),
        };
        if !load {
            r["sessionId"] = json!(session);
        }
        r
    }

    /// Notifications before the answer to `session/new` (Grok reports the set-up's phases).
    pub fn before_session(self, session: &str) -> Vec<Value> {
        match self {
            Flavor::Grok => ["auth", "persistence_init", "spawn_session_actor"]
                .iter()
                .map(|phase| {
                    let s = if *phase == "auth" { Value::Null } else { json!(session) };
                    notification(
                        "_x.ai/session/setup",
                        json!({"method": "session/new", "phase": phase, "sessionId": s}),
                    )
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Notifications after the answer to `session/new`: the commands. Kimi's are its builtins and builtin skills
    /// (reference kimi.md: `review` is none of them, so `/review` is unknown to it); the others name a `review`.
    pub fn after_session(self, session: &str) -> Vec<Value> {
        let commands = match self {
            Flavor::Kimi => {
                let names =
                    ["compact", "status", "usage", "mcp", "tasks", "help", "check-kimi-code-docs", "write-goal"];
                Value::Array(names.iter().map(|n| json!({"name": n, "description": n})).collect())
            }
            _ => json!([{"name": "compact", "description": "Compress the conversation"},
                {"name": "review", "description": "Review the changes"}]),
        };
        vec![update(session, json!({"sessionUpdate": "available_commands_update", "availableCommands": commands}))]
    }

    /// What a turn starts with, before its content (`prompt`: Grok's prompt id).
    pub fn turn_start(self, session: &str, prompt: &str, text: &str) -> Vec<Value> {
        match self {
            Flavor::Codex => vec![thread_status(session, "active")],
            Flavor::Grok => vec![notification(
                "_x.ai/queue/changed",
                json!({"sessionId": session, "entries": [],
                "runningPromptId": prompt, "runningText": text, "runningKind": "prompt"}),
            )],
            _ => Vec::new(),
        }
    }

    /// A streamed chunk whose text carries the marker `«n»`.
    pub fn chunk(self, session: &str, turn: u64, n: u64) -> Value {
        let text = format!("第 {n} 段 «{n}»\n");
        let mut u = json!({"sessionUpdate": if n % 3 == 2 { "agent_thought_chunk" } else { "agent_message_chunk" },
            "content": {"type": "text", "text": text}});
        if matches!(self, Flavor::Codex | Flavor::OpenCode) {
            u["messageId"] = json!(format!("msg_sim{turn:04}"));
        }
        update(session, u)
    }

    /// The usage of a turn's last request.
    pub fn usage(self, session: &str, used: u64) -> Option<Value> {
        match self {
            Flavor::Grok => None,
            Flavor::OpenCode => Some(update(
                session,
                json!({"sessionUpdate": "usage_update", "used": used,
                "size": 32000, "cost": {"amount": 0, "currency": "USD"}}),
            )),
            _ => Some(update(session, json!({"sessionUpdate": "usage_update", "used": used, "size": 258400}))),
        }
    }

    /// What a turn ends with before its answer (Grok's `turn_completed` is [`grok_turn_completed`]).
    pub fn turn_end(self, session: &str, prompt: &str, reason: &str) -> Vec<Value> {
        match self {
            Flavor::Codex => vec![thread_status(session, "idle")],
            Flavor::Grok => vec![
                notification("_x.ai/queue/changed", json!({"sessionId": session, "entries": []})),
                notification(
                    "_x.ai/session/prompt_complete",
                    json!({"sessionId": session, "promptId": prompt, "stopReason": reason, "agentResult": null}),
                ),
            ],
            _ => Vec::new(),
        }
    }

    /// The answer's `result` for a turn that ended with `reason`.
    pub fn turn_result(self, session: &str, turn: u64, reason: &str) -> Value {
        match self {
            Flavor::Codex => json!({"stopReason": reason, "usage": {"totalTokens": 15, "inputTokens": 10,
                "outputTokens": 5}, "_meta": {"quota": {"token_count": null, "model_usage": []}}}),
            Flavor::Grok => json!({"stopReason": reason, "_meta": {"sessionId": session,
                "promptId": format!("prompt-{turn}"), "totalTokens": 15, "modelId": "fake-model"}}),
            Flavor::Kimi => json!({"stopReason": reason}),
            Flavor::OpenCode => json!({"stopReason": reason, "usage": {"inputTokens": 10, "outputTokens": 5,
                "totalTokens": 15}, "_meta": {}}),
        }
    }

    /// The answer to a prompt whose turn failed upstream: `Ok(result)` or `Err(error)` (Grok's:
    /// [`grok_retries`]). Codex: codex-acp's AIR `sessionFailure` by category (fixtures/codex/upstream-failures);
    /// Kimi answers `end_turn` (the failure is in its session files); OpenCode a `-32603` with the upstream's
    /// message (its code only on its server's event stream).
    pub fn failure(self, failure: Failure) -> Result<Value, Value> {
        use Failure::*;
        let air = |category: &str, actions: Value, title: &str| {
            Ok(json!({"stopReason": "end_turn", "usage": null, "_meta": {"quota": {"token_count": null,
                "model_usage": []}, "jetbrains": {"air": {"version": 1,
                "sessionFailure": {"id": "sim:error", "revision": 1, "category": category, "severity": "error",
                    "title": title, "actions": actions}}}}}))
        };
        let generic = Err(json!({"code": -32603, "message": "Internal error", "data": "something broke"}));
        match (self, failure) {
            (Flavor::Codex, FailQuota | FailQuotaWait) => air(
                "limit",
                json!([]),
                "You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/settings/usage to purchase more credits or try again at 12:13 PM.",
            ),
            (Flavor::Codex, FailRate | FailRateWait) => {
                air("limit", json!(["retry"]), "exceeded retry limit, last status: 429 Too Many Requests")
            }
            (Flavor::Codex, FailServer) => air(
                "service",
                json!(["retry", "new_session"]),
                "We’re currently experiencing high demand, which may cause temporary errors.",
            ),
            (Flavor::Codex, FailGateway) => air(
                "connection",
                json!(["retry", "new_session"]),
                "unexpected status 502 Bad Gateway: <html>\r\n<head><title>502 Bad Gateway</title></head></html>, url: http://127.0.0.1:41211/v1/responses",
            ),
            (Flavor::Codex, FailService) => {
                air("service", json!(["retry"]), "Selected model is at capacity. Please try a different model.")
            }
            (Flavor::Codex, FailOverloaded) => air(
                "connection",
                json!(["retry", "new_session"]),
                "unexpected status 529 <unknown status code>: Overloaded, url: http://127.0.0.1:41211/v1/responses",
            ),
            (Flavor::Codex, FailReset) => {
                air("service", json!(["retry"]), "stream disconnected before completion: error sending request")
            }
            (Flavor::Codex, FailSandbox) => {
                air("service", json!(["retry"]), "sandbox error: the command was denied by the sandbox")
            }
            (Flavor::Codex, FailAuth) => Err(json!({"code": -32000, "message": "Authentication required"})),
            (Flavor::Kimi, _) => Ok(json!({"stopReason": "end_turn"})),
            (Flavor::OpenCode, FailGeneric) => generic,
            (Flavor::OpenCode, f) => {
                let message = match f {
                    FailQuota | FailQuotaWait => {
                        "You exceeded your current quota, please check your plan and billing details."
                    }
                    FailRate | FailRateWait => "Rate limit reached for requests. Please try again later.",
                    FailServer => "The server had an error while processing your request.",
                    FailGateway => "Bad Gateway",
                    FailService => "The server is overloaded, please try again later.",
                    FailOverloaded => "Overloaded",
                    // OpenCode retries a dropped connection, then ends the turn as if nothing happened.
                    FailReset => {
                        return Ok(json!({"stopReason": "end_turn", "usage": {"inputTokens": 0,
                        "outputTokens": 0, "totalTokens": 0}, "_meta": {}}));
                    }
                    _ => "Incorrect API key provided.",
                };
                Err(json!({"code": -32603, "message": format!("Internal error: {message}"),
                    "data": {"service": "session", "errorName": "APIError"}}))
            }
            _ => generic,
        }
    }

    /// What the CLI says once a `/compact` it runs is done, for the prompt-compacting CLIs: the chunks of the
    /// prompt, whether the prompt is answered before the compaction ends (Kimi runs it in the background).
    pub fn compact_in_background(self) -> bool {
        self == Flavor::Kimi
    }
}

pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

pub fn update(session: &str, update: Value) -> Value {
    notification("session/update", json!({"sessionId": session, "update": update}))
}

pub fn thread_status(session: &str, status: &str) -> Value {
    update(
        session,
        json!({"sessionUpdate": "session_info_update", "_meta": {"codex": {"threadStatus": {"type": status}}}}),
    )
}

pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

pub fn error(id: &Value, error: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// Kimi's text for its `/compact` (prefixes as `adapters/kimi/compact.rs` reads them).
pub const KIMI_STARTED: &str =
    "Context compaction started — it runs in the background and the compacted context applies once it finishes.";
pub const KIMI_DONE: &str =
    "Compaction completed.\n- Messages compacted: 5\n- Tokens before: 32,720\n- Tokens after: 22,290";
pub const KIMI_CANCELLED: &str = "Compaction cancelled.";
pub const KIMI_BUSY: &str = "A context compaction is already running.";
pub const KIMI_DURING_TURN: &str = "/compact failed: Cannot compact while a turn is active.";

/// Grok's `turn_completed` (its usage, which the shim turns into usage facts, on a root session).
pub fn grok_turn_completed(session: &str, prompt: &str, stop_reason: &str) -> Value {
    let mut u = json!({"sessionUpdate": "turn_completed", "prompt_id": prompt, "stop_reason": stop_reason});
    if stop_reason != "cancelled" {
        u["usage"] = json!({"inputTokens": 20, "outputTokens": 10, "totalTokens": 30, "cachedReadTokens": 0,
            "cacheCreationTokens": 0, "reasoningTokens": 0, "modelCalls": 2});
    }
    notification("_x.ai/session_notification", json!({"sessionId": session, "update": u}))
}

/// How Grok goes on after an upstream failure: its `retry_state` reports (each after its delay from the turn's
/// end of content), when it answers, and the answer (fixtures/grok/upstream-failures; what Grok does after its
/// fifteenth retry of a 5xx, six minutes on, is not in the recordings: an error with the reason).
pub struct GrokRetries {
    pub retries: Vec<(u64, Value)>,
    pub answer_after: u64,
    pub stop_reason: &'static str,
    pub error: Value,
}

pub fn grok_retries(f: Failure) -> GrokRetries {
    use Failure::*;
    const QUOTA: &str = "API error (status 429 Too Many Requests): insufficient_quota: You exceeded your current quota, please check your plan and billing details.";
    const RATE: &str = "API error (status 429 Too Many Requests): rate_limit_exceeded: Rate limit reached for requests. Please try again later.";
    const AUTH: &str = "Unauthorized (401) from http://127.0.0.1:40251/v1/chat/completions: invalid_request_error: Incorrect API key provided.";
    let retrying = |attempt: u64, reason: &str, kind: &str| {
        json!({"sessionUpdate": "retry_state", "type": "retrying", "attempt": attempt, "max_retries": 15,
            "reason": reason, "error_type": kind})
    };
    let limited = |reason: &str| json!({"code": -32003, "message": "Rate limited", "data": reason});
    let internal = |reason: &str| json!({"code": -32603, "message": "Internal error", "data": reason});
    match f {
        FailQuota | FailRate => {
            let reason = if f == FailQuota { QUOTA } else { RATE };
            GrokRetries {
                retries: vec![
                    (27, retrying(1, reason, "rate_limited")),
                    (
                        41,
                        json!({"sessionUpdate": "retry_state", "type": "exhausted", "attempts": 0,
                        "reason": reason, "is_rate_limited": true}),
                    ),
                ],
                answer_after: 100,
                stop_reason: "rate_limit",
                error: limited(reason),
            }
        }
        // A `Retry-After` Grok honours, silently: two hours, or 90 s before each of its fifteen attempts.
        FailQuotaWait => GrokRetries {
            retries: vec![(27, retrying(1, QUOTA, "rate_limited"))],
            answer_after: 7_200_100,
            stop_reason: "rate_limit",
            error: limited(QUOTA),
        },
        FailRateWait => GrokRetries {
            retries: (0..15).map(|n| (27 + n * 90_000, retrying(n + 1, RATE, "rate_limited"))).collect(),
            answer_after: 15 * 90_000 + 100,
            stop_reason: "rate_limit",
            error: limited(RATE),
        },
        FailServer | FailGateway | FailService | FailOverloaded | FailReset => {
            let (reason, kind) = match f {
                FailServer => (
                    "API error (status 500 Internal Server Error): The server had an error while processing your request.",
                    "api",
                ),
                FailGateway => (
                    "API error (status 502 Bad Gateway): Grok is temporarily unavailable. Please try again in a moment. (HTTP 502).",
                    "api",
                ),
                FailService => (
                    "API error (status 503 Service Unavailable): server_is_overloaded: The server is overloaded, please try again later.",
                    "api",
                ),
                FailOverloaded => ("API error (status 529 <unknown status code>): overloaded_error: Overloaded", "api"),
                _ => (
                    "request error: error sending request for url (http://127.0.0.1:40251/v1/chat/completions): client error (SendRequest): connection closed before message completed",
                    "http",
                ),
            };
            // Backoff as recorded: 2 s, 3 s, 9 s, 18 s, then about 30 s.
            let mut at = 27;
            let mut retries = Vec::new();
            for (n, gap) in
                [0u64, 2_100, 3_300, 8_900, 18_500].into_iter().chain(std::iter::repeat_n(30_000, 10)).enumerate()
            {
                at += gap;
                retries.push((at, retrying(n as u64 + 1, reason, kind)));
            }
            GrokRetries { retries, answer_after: at + 30_000, stop_reason: "error", error: internal(reason) }
        }
        FailAuth => GrokRetries {
            retries: vec![(
                27,
                json!({"sessionUpdate": "retry_state", "type": "failed", "error_type": "auth",
                "message": AUTH}),
            )],
            answer_after: 230,
            stop_reason: "error",
            error: internal(AUTH),
        },
        FailGeneric | FailSandbox => GrokRetries {
            retries: Vec::new(),
            answer_after: 50,
            stop_reason: "error",
            error: internal("something broke"),
        },
    }
}

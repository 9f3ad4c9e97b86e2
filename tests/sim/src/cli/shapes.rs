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

    /// Notifications after the answer to `session/new`: the commands.
    pub fn after_session(self, session: &str) -> Vec<Value> {
        let commands = json!([{"name": "compact", "description": "Compress the conversation"},
            {"name": "review", "description": "Review the changes"}]);
        vec![update(session, json!({"sessionUpdate": "available_commands_update", "availableCommands": commands}))]
    }

    /// What a turn starts with, before its content.
    pub fn turn_start(self, session: &str, turn: u64, text: &str) -> Vec<Value> {
        match self {
            Flavor::Codex => vec![thread_status(session, "active")],
            Flavor::Grok => vec![notification(
                "_x.ai/queue/changed",
                json!({"sessionId": session, "entries": [],
                "runningPromptId": format!("prompt-{turn}"), "runningText": text, "runningKind": "prompt"}),
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

    /// What a turn ends with before its answer.
    pub fn turn_end(self, session: &str, turn: u64, reason: &str) -> Vec<Value> {
        match self {
            Flavor::Codex => vec![thread_status(session, "idle")],
            Flavor::Grok => vec![
                notification("_x.ai/queue/changed", json!({"sessionId": session, "entries": []})),
                notification(
                    "_x.ai/session/prompt_complete",
                    json!({"sessionId": session,
                    "promptId": format!("prompt-{turn}"), "stopReason": reason, "agentResult": null}),
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

    /// The answer to a prompt whose turn failed upstream: `Ok(result)` or `Err(error)`.
    pub fn failure(self, failure: Failure) -> Result<Value, Value> {
        let air = |category: &str, actions: Value, title: &str| {
            Ok(json!({"stopReason": "end_turn", "usage": null, "_meta": {"jetbrains": {"air": {"version": 1,
                "sessionFailure": {"id": "sim:error", "revision": 1, "category": category, "severity": "error",
                    "title": title, "actions": actions}}}}}))
        };
        match (self, failure) {
            (Flavor::Codex, Failure::FailQuota) => air("limit", json!([]), "You’ve hit your usage limit."),
            (Flavor::Codex, Failure::FailService) => {
                air("service", json!(["retry"]), "stream disconnected before completion: error sending request")
            }
            (Flavor::Codex, Failure::FailSandbox) => {
                air("service", json!(["retry"]), "sandbox error: the command was denied by the sandbox")
            }
            (Flavor::Grok, Failure::FailQuota) => Err(json!({"code": -32003, "message": "Rate limited",
                "data": "API error (status 429 Too Many Requests): insufficient_quota: You exceeded your current quota, please check your plan and billing details."})),
            (Flavor::Grok, Failure::FailService) => Err(json!({"code": -32603, "message": "Internal error",
                "data": "API error (status 503 Service Unavailable): Grok is temporarily unavailable. Please try again in a moment. (HTTP 503)."})),
            (Flavor::OpenCode, Failure::FailQuota) => Err(json!({"code": -32603,
                "message": "Internal error: You exceeded your current quota, please check your plan and billing details.",
                "data": {"service": "session", "errorName": "APIError"}})),
            (Flavor::OpenCode, Failure::FailService) => Err(json!({"code": -32603,
                "message": "Internal error: The server is overloaded, please try again later.",
                "data": {"service": "session", "errorName": "APIError"}})),
            (Flavor::Kimi, Failure::FailQuota) => Err(json!({"code": -32603,
                "message": "429 You exceeded your current quota, please check your plan and billing details."})),
            (Flavor::Kimi, Failure::FailService) => {
                Err(json!({"code": -32603, "message": "503 The server is overloaded, please try again later."}))
            }
            _ => Err(json!({"code": -32603, "message": "Internal error", "data": "something broke"})),
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

//! The scripted answers: what the fake model replies, from the markers, the origin and the tools offered.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::markers::{Marker, parse_markers};
use super::origin::Origin;
use super::request::{
    Api, Item, Tool, conversation, find_tool, forced_tool, latest_prompt, offered_tools, prompt_text,
};
use super::review;
use crate::cli;

/// Text of a plain answer when no marker asks for anything else.
pub const DEFAULT_TEXT: &str = "Hello from the fake model.";
/// Text answered after a tool result when the prompt has no `[[text:…]]` marker.
pub const AFTER_TOOL_TEXT: &str = "The tool call is done.";
/// Text answered to title and summary side requests.
pub const SIDE_TEXT: &str = "Fake title";
/// What a request for a summary of the whole conversation (Grok's compaction) starts with.
const COMPACTION_ASK: &str = "produce a faithful, concise summary of the conversation so far";
/// The summary answered to it: Grok refuses one far shorter than the conversation ("degenerate summary").
pub const COMPACTION_SUMMARY: &str = "<summary>\n1. Primary Request and Intent: the user ran shell commands through \
    the assistant to test it against a fake model; no other request.\n2. Key Technical Concepts: a shell tool, its \
    output, a fake model server.\n3. Files and Code Sections: None.\n4. Errors and Fixes: None.\n5. Problem Solving: \
    None.\n6. All User Messages: the prompts that asked for the commands.\n7. Pending Tasks: None.\n8. Current \
    Work: the last command finished and its output was read.\n9. Optional Next Step: wait for the user's next \
    message.\n</summary>";

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Reply {
    Text(String),
    Calls(Vec<Call>),
    /// `body` is JSON, or a `Value::String` sent as an HTML page (plain text when it does not start with `<`);
    /// `retry_after` in seconds (`~S`).
    Error {
        status: u16,
        body: Value,
        retry_after: Option<u64>,
    },
    /// The connection is closed without an answer (`reset`).
    Reset,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Call {
    pub(super) namespace: Option<String>,
    pub(super) name: String,
    pub(super) arguments: Value,
}

/// Picks the reply for a model request. `prompts` holds every prompt seen so far, with the number
/// of errors answered to it.
pub(super) fn decide(api: Api, origin: Origin, body: &Value, prompts: &mut HashMap<String, u32>) -> (Reply, Duration) {
    if review::is_review(body) {
        return (review::review_reply(api, body), Duration::ZERO);
    }
    if origin == Origin::Side {
        return (side_reply(body), Duration::ZERO);
    }
    let items = conversation(api, body);
    let prompt = latest_prompt(&prompt_text(&items).unwrap_or_default(), prompts);
    if prompt.contains(COMPACTION_ASK) {
        return (Reply::Text(COMPACTION_SUMMARY.into()), Duration::ZERO);
    }
    let markers = parse_markers(&prompt);
    let delay = markers
        .iter()
        .find_map(|m| match m {
            Marker::Delay(ms) => Some(Duration::from_millis(*ms)),
            _ => None,
        })
        .unwrap_or(Duration::ZERO);
    let closing = markers.iter().find_map(|m| match m {
        Marker::Text(t) => Some(t.clone()),
        _ => None,
    });

    if matches!(items.last(), Some(Item::ToolResult(_))) {
        return (Reply::Text(closing.unwrap_or_else(|| AFTER_TOOL_TEXT.into())), delay);
    }
    if let Some((kind, times)) = markers.iter().find_map(|m| match m {
        Marker::Error { kind, times } => Some((kind.as_str(), *times)),
        _ => None,
    }) {
        // `*N` fails only the first N attempts, so a CLI's retry then succeeds.
        let count = prompts.entry(prompt.clone()).or_insert(0);
        if times.is_none_or(|n| *count < n) {
            *count += 1;
            return (error_reply(api, kind), delay);
        }
    }
    let tools = offered_tools(body);
    let mut calls = Vec::new();
    for marker in &markers {
        match call_for(marker, &tools, &items, calls.len()) {
            Ok(Some(call)) => calls.push(call),
            Ok(None) => {}
            Err(why) => return (Reply::Text(format!("fake model: {why}")), delay),
        }
    }
    if !calls.is_empty() {
        return (Reply::Calls(calls), delay);
    }
    (Reply::Text(closing.unwrap_or_else(|| DEFAULT_TEXT.into())), delay)
}

/// The tool call a marker asks for, shaped for the tools this CLI offers.
fn call_for(marker: &Marker, tools: &[Tool], items: &[Item], index: usize) -> Result<Option<Call>, String> {
    let call =
        |tool: &Tool, arguments: Value| Call { namespace: tool.namespace.clone(), name: tool.name.clone(), arguments };
    let missing = |what: &str| format!("no {what} tool offered (tools: {})", tool_list(tools));
    Ok(Some(match marker {
        Marker::Bg(cmd) | Marker::Sh(cmd) => {
            let background = matches!(marker, Marker::Bg(_));
            let tool = find_tool(tools, &cli::shell_tools()).ok_or_else(|| missing("shell"))?;
            call(tool, shell_arguments(tool, cmd, background))
        }
        Marker::Subagent { name, prompt, background } => {
            let tool = find_tool(tools, &cli::spawn_tools()).ok_or_else(|| missing("subagent"))?;
            let name = name.clone().unwrap_or_else(|| format!("worker_{}", index + 1));
            call(tool, spawn_arguments(tool, &name, prompt, *background))
        }
        Marker::Resume { target, prompt } => {
            let last = (target == "last").then(|| last_subagent_id(items)).flatten();
            let target = last.as_deref().unwrap_or(target);
            if let Some(tool) = find_tool(tools, &cli::followup_tools()) {
                call(tool, followup_arguments(tool, target, prompt))
            } else {
                let tool = find_tool(tools, &cli::spawn_tools()).ok_or_else(|| missing("follow-up"))?;
                call(tool, resume_arguments(tool, target, prompt))
            }
        }
        Marker::Tool { name, arguments } => {
            let tool = tools
                .iter()
                .find(|t| t.name == *name || t.qualified() == *name)
                .ok_or_else(|| missing(&format!("`{name}`")))?;
            let arguments = if arguments.is_empty() {
                json!({})
            } else {
                let arguments = match last_task_id(items) {
                    Some(task) if arguments.contains(LAST_TASK) => arguments.replace(LAST_TASK, &task),
                    _ => arguments.clone(),
                };
                serde_json::from_str(&arguments).map_err(|e| format!("bad JSON for `{name}`: {e}"))?
            };
            call(tool, arguments)
        }
        Marker::Text(_) | Marker::Error { .. } | Marker::Delay(_) | Marker::Review { .. } => return Ok(None),
    }))
}

/// The id of the latest subagent named in a tool result, for `[[resume:last|…]]`:
/// Grok `subagent_id: X`, Kimi `agent_id: agent-N`, OpenCode `<task id="ses_…"`, Codex `{"task_name":"/root/x"}`.
fn last_subagent_id(items: &[Item]) -> Option<String> {
    items.iter().rev().find_map(|item| {
        let Item::ToolResult(text) = item else { return None };
        let task_name = serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|output| output.get("task_name").and_then(Value::as_str).map(str::to_string));
        if task_name.is_some() {
            return task_name;
        }
        text.lines().find_map(|line| {
            let line = line.trim();
            let value = line
                .strip_prefix("subagent_id:")
                .or_else(|| line.strip_prefix("agent_id:"))
                .or_else(|| line.strip_prefix("<task id=\"").and_then(|rest| rest.split('"').next()));
            value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
        })
    })
}

/// Stands for the latest task id in `[[tool:NAME|JSON]]` arguments.
const LAST_TASK: &str = "$last_task";

/// The latest `task_id: X` line of a tool result (Kimi's background Bash and Agent results), for `$last_task`.
fn last_task_id(items: &[Item]) -> Option<String> {
    items.iter().rev().find_map(|item| {
        let Item::ToolResult(text) = item else { return None };
        text.lines().find_map(|line| {
            let value = line.trim().strip_prefix("task_id:")?.trim();
            (!value.is_empty()).then(|| value.to_string())
        })
    })
}

fn tool_list(tools: &[Tool]) -> String {
    let names: Vec<String> = tools.iter().map(Tool::qualified).collect();
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

/// Arguments for a shell command, by the parameter names the tool declares.
fn shell_arguments(tool: &Tool, cmd: &str, background: bool) -> Value {
    let mut args = serde_json::Map::new();
    let command_key = ["cmd", "command"].into_iter().find(|k| tool.has_param(k)).unwrap_or("command");
    args.insert(command_key.into(), json!(cmd));
    if tool.has_param("description") {
        args.insert("description".into(), json!(format!("run {cmd}")));
    }
    if background {
        // Codex backgrounds a command that is still running after `yield_time_ms`.
        if tool.has_param("yield_time_ms") {
            args.insert("yield_time_ms".into(), json!(500));
        }
        for key in ["run_in_background", "background", "is_background"] {
            if tool.has_param(key) {
                args.insert(key.into(), json!(true));
            }
        }
    }
    Value::Object(args)
}

/// Arguments for a subagent spawn, by the parameter names the tool declares.
fn spawn_arguments(tool: &Tool, name: &str, prompt: &str, background: bool) -> Value {
    let mut args = serde_json::Map::new();
    for (key, value) in [
        ("task_name", json!(name)),
        ("name", json!(name)),
        ("message", json!(prompt)),
        ("prompt", json!(prompt)),
        ("task", json!(prompt)),
        ("description", json!(format!("{name} task"))),
        ("subagent_type", json!(subagent_type(tool))),
        ("run_in_background", json!(background)),
        ("background", json!(background)),
        // Codex children inherit the parent's history unless told not to; the task alone keeps markers apart.
        ("fork_turns", json!("none")),
    ] {
        if tool.has_param(key) {
            args.insert(key.into(), value);
        }
    }
    Value::Object(args)
}

/// A subagent type the tool accepts: the first enum value, else a common built-in.
fn subagent_type(tool: &Tool) -> Value {
    let schema = tool.parameters.get("properties").and_then(|p| p.get("subagent_type"));
    if let Some(first) = schema.and_then(|s| s.get("enum")).and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    // Claude Code's general agent is `general-purpose`; Kimi's default profile is `coder`; OpenCode's
    // general-purpose agent is `general`.
    let description = schema.and_then(|s| s.get("description")).and_then(Value::as_str).unwrap_or("");
    let tool_description = tool.description.as_str();
    if description.contains("general-purpose") || tool_description.contains("general-purpose") {
        json!("general-purpose")
    } else if description.contains("coder") || tool.name == "Agent" {
        json!("coder")
    } else {
        json!("general")
    }
}

fn followup_arguments(tool: &Tool, target: &str, prompt: &str) -> Value {
    let mut args = serde_json::Map::new();
    for (key, value) in
        [("target", json!(target)), ("id", json!(target)), ("message", json!(prompt)), ("prompt", json!(prompt))]
    {
        if tool.has_param(key) {
            args.insert(key.into(), value);
        }
    }
    Value::Object(args)
}

/// Resuming through the spawn tool (Kimi `resume`, Grok `resume_from`, OpenCode `task_id`).
fn resume_arguments(tool: &Tool, target: &str, prompt: &str) -> Value {
    let mut args = spawn_arguments(tool, "resumed", prompt, true);
    if let Some(map) = args.as_object_mut() {
        for key in ["resume", "resume_from", "task_id"] {
            if tool.has_param(key) {
                map.insert(key.into(), json!(target));
            }
        }
        // Kimi rejects a resume that also names the subagent type.
        if tool.has_param("resume") {
            map.remove("subagent_type");
        }
    }
    args
}

/// The body of `[[error:503-text]]` (sent as `text/plain`).
pub const OVERLOADED_TEXT: &str = "the engine is currently overloaded";

/// HTTP status and body for `[[error:KIND]]`, in the shape each API's clients classify.
fn error_reply(api: Api, kind: &str) -> Reply {
    let responses = api == Api::Responses;
    let (kind, retry_after) = match kind.split_once('~') {
        Some((kind, seconds)) => (kind.trim(), seconds.trim().parse().ok()),
        None => (kind, None),
    };
    let (status, error) = match kind {
        "reset" => return Reply::Reset,
        "502" => {
            let page = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n";
            return Reply::Error { status: 502, body: Value::String(page.into()), retry_after };
        }
        // A server that answers 503 with a line of text and no error object (no code to read).
        "503-text" => {
            return Reply::Error { status: 503, body: Value::String(OVERLOADED_TEXT.into()), retry_after };
        }
        // Anthropic's overload answer, as gateways in front of Claude models pass it on.
        "529" => {
            let body = json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
            return Reply::Error { status: 529, body, retry_after };
        }
        "429-usage" if responses => (
            429,
            json!({"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus",
                "resets_in_seconds":3600,"resets_at":unix_now() + 3600}),
        ),
        "429-usage" => (
            429,
            json!({"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","code":"insufficient_quota"}),
        ),
        "429-rate" => (
            429,
            json!({"message":"Rate limit reached for requests. Please try again later.","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}),
        ),
        "500" => (
            500,
            json!({"message":"The server had an error while processing your request.","type":"server_error","code":"server_error"}),
        ),
        "503" => (
            503,
            json!({"message":"The server is overloaded, please try again later.","type":"server_is_overloaded","code":"server_is_overloaded"}),
        ),
        "401" => (
            401,
            json!({"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}),
        ),
        other => (500, json!({"message":format!("fake model: unknown error kind {other:?}"),"type":"server_error"})),
    };
    let body = match api {
        Api::Gemini => gemini_error(status, kind),
        Api::Anthropic => anthropic_error(status, kind),
        _ => json!({ "error": error }),
    };
    Reply::Error { status, body, retry_after }
}

/// Google's error shape (`google.rpc.Status`): a per-day quota names its quota id in a `QuotaFailure`, which
/// is how Gemini CLI tells an exhausted daily quota from a rate limit.
fn gemini_error(status: u16, kind: &str) -> Value {
    let (message, state, details) = match kind {
        "429-usage" => (
            "You exceeded your current quota, please check your plan and billing details.",
            "RESOURCE_EXHAUSTED",
            json!([{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                "quotaDimensions": {"location": "global", "model": "fake-model"}, "quotaValue": "250"}]}]),
        ),
        "429-rate" => (
            "Resource has been exhausted (e.g. check quota).",
            "RESOURCE_EXHAUSTED",
            json!([{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}]),
        ),
        "503" => ("The model is overloaded. Please try again later.", "UNAVAILABLE", json!([])),
        "401" => ("API key not valid. Please pass a valid API key.", "UNAUTHENTICATED", json!([])),
        _ => ("Internal error encountered.", "INTERNAL", json!([])),
    };
    json!({"error": {"code": status, "message": message, "status": state, "details": details}})
}

/// Anthropic's error shape: `{type: "error", error: {type, message}}`.
fn anthropic_error(status: u16, kind: &str) -> Value {
    let (kind, message) = match (status, kind) {
        (_, "429-usage") => ("rate_limit_error", "This request would exceed your account's usage limit."),
        (429, _) => ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
        (401, _) => ("authentication_error", "invalid x-api-key"),
        (503, _) => ("api_error", "Service Unavailable"),
        _ => ("api_error", "Internal server error"),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

pub(super) fn describe(reply: &Reply) -> String {
    match reply {
        Reply::Text(t) => format!("text {:?}", t.chars().take(60).collect::<String>()),
        Reply::Error { status, body, .. } => {
            let kind = body.pointer("/error/type").and_then(Value::as_str).unwrap_or("");
            format!("error {status} {kind}")
        }
        Reply::Reset => "connection reset".into(),
        Reply::Calls(calls) => {
            let parts: Vec<String> = calls
                .iter()
                .map(|c| {
                    let name = c.namespace.as_ref().map_or(c.name.clone(), |ns| format!("{ns}.{}", c.name));
                    format!("{name}({})", c.arguments)
                })
                .collect();
            format!("call {}", parts.join(", "))
        }
    }
}

/// A title or summary: the forced tool called with sample arguments, JSON when a schema is asked
/// for, else short text.
fn side_reply(body: &Value) -> Reply {
    if let Some(name) = forced_tool(body) {
        let tools = offered_tools(body);
        if let Some(tool) = tools.iter().find(|t| t.name == name) {
            let call = Call { namespace: None, name: tool.name.clone(), arguments: sample(&tool.parameters) };
            return Reply::Calls(vec![call]);
        }
    }
    let schema = body
        .pointer("/text/format/schema")
        .or_else(|| body.pointer("/response_format/json_schema/schema"))
        .or_else(|| body.pointer("/generationConfig/responseJsonSchema"))
        .or_else(|| body.pointer("/generationConfig/responseSchema"));
    match schema {
        Some(schema) => Reply::Text(sample(schema).to_string()),
        None => Reply::Text(SIDE_TEXT.into()),
    }
}

/// A value that satisfies a simple JSON schema; strings say [`SIDE_TEXT`].
fn sample(schema: &Value) -> Value {
    let kind = match schema.get("type") {
        Some(Value::Array(kinds)) => kinds.first().and_then(Value::as_str).unwrap_or("string"),
        Some(kind) => kind.as_str().unwrap_or("string"),
        None if schema.get("properties").is_some() => "object",
        None => "string",
    };
    // Gemini's own schema type names are upper case (`OBJECT`).
    match kind.to_ascii_lowercase().as_str() {
        "object" => {
            let mut out = serde_json::Map::new();
            for (key, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
                out.insert(key.clone(), sample(property));
            }
            Value::Object(out)
        }
        "array" => json!([]),
        "boolean" => json!(false),
        "integer" | "number" => json!(0),
        "null" => Value::Null,
        _ => json!(SIDE_TEXT),
    }
}

/// Seconds since the epoch (the usage-limit body names when the limit resets).
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_result_is_answered_with_text() {
        let body = json!({"messages":[{"role":"user","content":"[[bg:sleep 1]]"},
            {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"bash","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c","content":"ok"}],
            "tools":[{"type":"function","function":{"name":"bash","parameters":{"properties":{"command":{}}}}}]});
        let (reply, _) = decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new());
        assert_eq!(reply, Reply::Text(AFTER_TOOL_TEXT.into()));
    }

    #[test]
    fn counted_errors_stop_after_n_attempts() {
        let body = json!({"messages":[{"role":"user","content":"go [[error:503*2]]"}],
            "tools":[{"type":"function","function":{"name":"bash","parameters":{}}}]});
        let mut prompts = HashMap::new();
        let statuses: Vec<Option<u16>> = (0..3)
            .map(|_| match decide(Api::ChatCompletions, Origin::Main, &body, &mut prompts).0 {
                Reply::Error { status, .. } => Some(status),
                _ => None,
            })
            .collect();
        assert_eq!(statuses, vec![Some(503), Some(503), None]);
    }

    #[test]
    fn error_kinds_carry_their_wait_and_shape() {
        let ask = |text: &str| {
            let body = json!({"messages":[{"role":"user","content":text}]});
            decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new()).0
        };
        assert_eq!(ask("[[error:reset]]"), Reply::Reset);
        assert!(
            matches!(ask("[[error:429-rate~90]]"), Reply::Error { status: 429, retry_after: Some(90), .. }),
            "{:?}",
            ask("[[error:429-rate~90]]")
        );
        assert!(matches!(
            ask("[[error:502]]"),
            Reply::Error { status: 502, body: Value::String(_), retry_after: None }
        ));
        match ask("[[error:529]]") {
            Reply::Error { status: 529, body, .. } => assert_eq!(body["error"]["type"], "overloaded_error"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            ask("[[error:503-text~90]]"),
            Reply::Error { status: 503, body: Value::String(OVERLOADED_TEXT.into()), retry_after: Some(90) }
        );
    }

    #[test]
    fn prompts_joined_after_failed_turns_use_the_latest_markers() {
        let mut prompts = HashMap::new();
        let ask = |text: &str, prompts: &mut HashMap<String, u32>| {
            let body = json!({"messages":[{"role":"user","content":text}],
                "tools":[{"type":"function","function":{"name":"bash","parameters":{}}}]});
            decide(Api::ChatCompletions, Origin::Main, &body, prompts).0
        };
        assert!(matches!(ask("a [[error:500]]", &mut prompts), Reply::Error { status: 500, .. }));
        assert!(matches!(ask("a [[error:500]]\n\nb [[error:503]]", &mut prompts), Reply::Error { status: 503, .. }));
        assert_eq!(ask("a [[error:500]]\n\nb [[error:503]]\n\nc", &mut prompts), Reply::Text(DEFAULT_TEXT.into()));
    }

    #[test]
    fn resume_last_finds_the_latest_subagent_id() {
        let items = vec![
            Item::ToolResult("task_id: agent-abcdefgh\nagent_id: agent-0".into()),
            Item::ToolResult("Subagent started in background.\nsubagent_id: 01a2".into()),
        ];
        assert_eq!(last_subagent_id(&items).as_deref(), Some("01a2"));
        let items = vec![Item::ToolResult(r#"<task id="ses_x" state="running">"#.into())];
        assert_eq!(last_subagent_id(&items).as_deref(), Some("ses_x"));
        let items = vec![Item::ToolResult(r#"{"task_name":"/root/worker_1"}"#.into())];
        assert_eq!(last_subagent_id(&items).as_deref(), Some("/root/worker_1"));
    }

    #[test]
    fn last_task_names_the_latest_task_id_of_a_tool_result() {
        let body = json!({"messages":[{"role":"user","content":"[[bg:sleep 30]]"},
            {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"Bash","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c","content":"task_id: bash-aaaa1111\npid: 7\nstatus: running"},
            {"role":"assistant","content":"ok"},
            {"role":"user","content":"stop it [[tool:TaskStop|{\"task_id\":\"$last_task\"}]]"}],
            "tools":[{"type":"function","function":{"name":"Bash","parameters":{"properties":{"command":{}}}}},
                {"type":"function","function":{"name":"TaskStop","parameters":{"properties":{"task_id":{}}}}}]});
        let (reply, _) = decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new());
        let Reply::Calls(calls) = reply else { panic!("{reply:?}") };
        assert_eq!(calls[0].name, "TaskStop");
        assert_eq!(calls[0].arguments, json!({"task_id": "bash-aaaa1111"}));
    }

    #[test]
    fn odd_bodies_get_text() {
        for body in [Value::Null, json!([]), json!({"messages": 3}), json!({"input": {"x": 1}, "tools": "no"})] {
            let (reply, _) = decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new());
            assert_eq!(reply, Reply::Text(DEFAULT_TEXT.into()));
            let (reply, _) = decide(Api::Responses, Origin::Main, &body, &mut HashMap::new());
            assert_eq!(reply, Reply::Text(DEFAULT_TEXT.into()));
        }
    }
}

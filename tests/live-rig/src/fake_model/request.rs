//! Each API's request read one way: which API, the conversation, the user's prompt, the tools offered.
//!
//! The conversation is a chat-completions `messages` array, a Responses API `input`, a Gemini `contents` array
//! (with `systemInstruction`) or an Anthropic Messages `messages` array (with `system`), flattened into items.

use std::collections::HashMap;

use hyper::Method;
use serde_json::{Value, json};

/// Which API a request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Responses,
    /// Gemini's `POST /v1beta/models/<model>:streamGenerateContent` (SSE) and `:generateContent` (JSON).
    Gemini,
    /// Anthropic's Messages API, `POST /v1/messages` (SSE when `stream` is true).
    Anthropic,
    /// A token count: Gemini's `:countTokens`, Anthropic's `/v1/messages/count_tokens`.
    CountTokens,
    Models,
    Other,
}

impl Api {
    /// Whether a request of this API asks the model for an answer.
    pub fn is_model(self) -> bool {
        matches!(self, Api::ChatCompletions | Api::Responses | Api::Gemini | Api::Anthropic)
    }
}

pub(super) fn parse_body(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes).unwrap_or_else(|_| json!({ "_raw": String::from_utf8_lossy(bytes) }))
}

pub(super) fn classify_api(method: &Method, path: &str) -> Api {
    let post = *method == Method::POST;
    if post && (path.ends_with(":countTokens") || path.ends_with("/messages/count_tokens")) {
        Api::CountTokens
    } else if post && (path.ends_with(":streamGenerateContent") || path.ends_with(":generateContent")) {
        Api::Gemini
    } else if post && path.ends_with("/messages") {
        Api::Anthropic
    } else if *method == Method::POST && path.ends_with("/chat/completions") {
        Api::ChatCompletions
    } else if *method == Method::POST && path.ends_with("/responses") {
        Api::Responses
    } else if *method == Method::GET && (path.ends_with("/models") || path.contains("/models/")) {
        Api::Models
    } else {
        Api::Other
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Item {
    System(String),
    User(String),
    Assistant,
    ToolCall,
    /// The text the tool returned.
    ToolResult(String),
}

/// Flattens a chat-completions `messages` array, a Responses API `input`, Gemini `contents` or Anthropic
/// `messages` into items.
pub(super) fn conversation(api: Api, body: &Value) -> Vec<Item> {
    let mut items = Vec::new();
    match api {
        Api::ChatCompletions => {
            for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
                let role = message.get("role").and_then(Value::as_str).unwrap_or("");
                let text = content_text(message.get("content"));
                match role {
                    "system" | "developer" => items.push(Item::System(text)),
                    // Qwen Code sends its reminders, the injected instruction and the prompt as parts of one
                    // user message: each part is a text of its own, so the prompt is the last one.
                    "user" if message.get("content").is_some_and(Value::is_array) => {
                        for part in message.get("content").and_then(Value::as_array).into_iter().flatten() {
                            if let Some(t) = part.get("text").and_then(Value::as_str) {
                                items.push(Item::User(t.to_string()));
                            }
                        }
                    }
                    "user" => items.push(Item::User(text)),
                    "assistant" => {
                        items.push(Item::Assistant);
                        if message.get("tool_calls").and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
                            items.push(Item::ToolCall);
                        }
                    }
                    "tool" | "function" => items.push(Item::ToolResult(text)),
                    _ => {}
                }
            }
        }
        Api::Responses => {
            if let Some(instructions) = body.get("instructions").and_then(Value::as_str) {
                items.push(Item::System(instructions.to_string()));
            }
            let input = body.get("input");
            if let Some(text) = input.and_then(Value::as_str) {
                items.push(Item::User(text.to_string()));
            }
            for item in input.and_then(Value::as_array).into_iter().flatten() {
                let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "message" => match role {
                        "system" | "developer" => items.push(Item::System(content_text(item.get("content")))),
                        "user" => items.push(Item::User(content_text(item.get("content")))),
                        _ => items.push(Item::Assistant),
                    },
                    // A message from another agent (Codex multi-agent v2): the child's task.
                    "agent_message" => items.push(Item::User(content_text(item.get("content")))),
                    k if k.ends_with("_output") => {
                        let output = item.get("output");
                        let text = output.and_then(Value::as_str).map_or_else(|| content_text(output), str::to_string);
                        items.push(Item::ToolResult(text))
                    }
                    k if k.ends_with("_call") => items.push(Item::ToolCall),
                    _ => {}
                }
            }
        }
        Api::Gemini => {
            if let Some(system) = body.get("systemInstruction") {
                items.push(Item::System(gemini_text(system.get("parts").unwrap_or(system))));
            }
            for content in body.get("contents").and_then(Value::as_array).into_iter().flatten() {
                let role = content.get("role").and_then(Value::as_str).unwrap_or("user");
                let parts = content.get("parts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                let results: Vec<String> = parts
                    .iter()
                    .filter_map(|p| p.get("functionResponse"))
                    .map(|r| {
                        r.get("response").map_or_else(String::new, |v| match v.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            _ => v.to_string(),
                        })
                    })
                    .collect();
                if !results.is_empty() {
                    items.extend(results.into_iter().map(Item::ToolResult));
                } else if role == "model" {
                    items.push(Item::Assistant);
                    if parts.iter().any(|p| p.get("functionCall").is_some()) {
                        items.push(Item::ToolCall);
                    }
                } else {
                    // Gemini CLI sends its session context and the prompt as parts of one user turn.
                    for part in parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)) {
                        items.push(Item::User(part.to_string()));
                    }
                }
            }
        }
        Api::Anthropic => {
            match body.get("system") {
                Some(Value::String(s)) => items.push(Item::System(s.clone())),
                Some(blocks @ Value::Array(_)) => items.push(Item::System(content_text(Some(blocks)))),
                _ => {}
            }
            for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
                let role = message.get("role").and_then(Value::as_str).unwrap_or("");
                let content = message.get("content");
                let blocks = content.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                let kind = |b: &Value, k: &str| b.get("type").and_then(Value::as_str) == Some(k);
                match role {
                    // Claude Code sends its environment as a message of role `system`.
                    "system" => items.push(Item::System(content.map_or_else(String::new, |c| content_text(Some(c))))),
                    "assistant" => {
                        items.push(Item::Assistant);
                        if blocks.iter().any(|b| kind(b, "tool_use")) {
                            items.push(Item::ToolCall);
                        }
                    }
                    _ if blocks.iter().any(|b| kind(b, "tool_result")) => {
                        for block in blocks.iter().filter(|b| kind(b, "tool_result")) {
                            let output = block.get("content");
                            let text =
                                output.and_then(Value::as_str).map_or_else(|| content_text(output), str::to_string);
                            items.push(Item::ToolResult(text));
                        }
                    }
                    _ => {
                        // Text blocks only: Claude Code adds `<system-reminder>` blocks of its own around the prompt.
                        let texts: Vec<&str> = match content {
                            Some(Value::String(s)) => vec![s.as_str()],
                            _ => blocks
                                .iter()
                                .filter(|b| kind(b, "text"))
                                .filter_map(|b| b.get("text").and_then(Value::as_str))
                                .collect(),
                        };
                        for text in texts {
                            items.push(Item::User(text.to_string()));
                        }
                    }
                }
            }
        }
        _ => {}
    }
    items
}

/// The text parts of a Gemini `parts` array, one a line.
fn gemini_text(parts: &Value) -> String {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Text of a message content: a string, or an array of parts with `text` (or `encrypted_content`).
pub(super) fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| {
                p.get("text").or_else(|| p.get("encrypted_content")).and_then(Value::as_str).or_else(|| p.as_str())
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Kimi joins the prompts of turns that got no answer (failed, cancelled) into one user message,
/// separated by blank lines; drop the ones seen before so old markers do not fire again.
pub(super) fn latest_prompt(text: &str, prompts: &mut HashMap<String, u32>) -> String {
    let mut rest = text;
    while let Some(seen) = prompts.keys().find(|p| {
        !p.is_empty() && rest.len() > p.len() && rest.starts_with(p.as_str()) && rest[p.len()..].starts_with("\n\n")
    }) {
        rest = rest[seen.len()..].trim_start_matches('\n');
    }
    let latest = rest.to_string();
    prompts.entry(latest.clone()).or_insert(0);
    latest
}

/// The user's prompt: the last user text after the last non-user item, skipping the context the
/// CLIs append after it (Kimi's date reminder, Codex's environment context).
pub(super) fn prompt_text(items: &[Item]) -> Option<String> {
    trailing_user_texts(items).into_iter().rev().find(|t| {
        let t = t.trim_start();
        !t.starts_with("<system-reminder>") && !t.starts_with("<environment_context>")
    })
}

/// Texts of the user messages after the last non-user item.
pub(super) fn trailing_user_texts(items: &[Item]) -> Vec<String> {
    let start = items.iter().rposition(|i| !matches!(i, Item::User(_) | Item::System(_))).map_or(0, |p| p + 1);
    items[start..]
        .iter()
        .filter_map(|i| match i {
            Item::User(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

#[derive(Clone, Debug)]
pub(super) struct Tool {
    pub(super) namespace: Option<String>,
    pub(super) name: String,
    pub(super) parameters: Value,
    pub(super) description: String,
}

impl Tool {
    pub(super) fn qualified(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}.{}", self.name),
            None => self.name.clone(),
        }
    }

    pub(super) fn has_param(&self, name: &str) -> bool {
        self.parameters.get("properties").and_then(|p| p.get(name)).is_some()
    }
}

/// Tools from chat-completions (`{type:function, function:{name, parameters}}`), Responses API
/// (`{type:function, name, parameters}`, or a namespace holding `tools`), Gemini (`{functionDeclarations:
/// [{name, parameters | parametersJsonSchema}]}`) or Anthropic (`{name, input_schema}`) shapes.
pub(super) fn offered_tools(body: &Value) -> Vec<Tool> {
    fn collect(tools: &Value, namespace: Option<&str>, out: &mut Vec<Tool>) {
        for tool in tools.as_array().into_iter().flatten() {
            let function = tool.get("function").unwrap_or(tool);
            if let Some(inner) = tool.get("tools") {
                let ns = tool.get("name").and_then(Value::as_str);
                collect(inner, ns.or(namespace), out);
                continue;
            }
            if let Some(declarations) = tool.get("functionDeclarations") {
                collect(declarations, namespace, out);
                continue;
            }
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                let parameters = ["parameters", "parametersJsonSchema", "input_schema"]
                    .iter()
                    .find_map(|key| function.get(*key))
                    .cloned()
                    .unwrap_or(Value::Null);
                out.push(Tool {
                    namespace: tool.get("namespace").and_then(Value::as_str).or(namespace).map(str::to_string),
                    name: name.to_string(),
                    parameters,
                    description: function.get("description").and_then(Value::as_str).unwrap_or_default().to_string(),
                });
            }
        }
    }
    let mut out = Vec::new();
    if let Some(tools) = body.get("tools") {
        collect(tools, None, &mut out);
    }
    out
}

pub(super) fn find_tool<'a>(tools: &'a [Tool], names: &[&str]) -> Option<&'a Tool> {
    names.iter().find_map(|n| tools.iter().find(|t| t.name == *n))
}

/// The function a request forces: chat `tool_choice.function.name` (Grok's session title does), Anthropic
/// `tool_choice {type: "tool", name}`.
pub(super) fn forced_tool(body: &Value) -> Option<&str> {
    let choice = body.get("tool_choice")?;
    match choice.get("function") {
        Some(function) => function.get("name")?.as_str(),
        None if choice.get("type").and_then(Value::as_str) == Some("tool") => choice.get("name")?.as_str(),
        None => None,
    }
}

/// A field of Codex's `client_metadata["x-codex-turn-metadata"]` (a JSON string).
pub(super) fn turn_metadata(body: &Value, field: &str) -> Option<String> {
    let raw = body.get("client_metadata")?.get("x-codex-turn-metadata")?.as_str()?;
    let meta: Value = serde_json::from_str(raw).ok()?;
    meta.get(field).and_then(Value::as_str).map(str::to_string)
}

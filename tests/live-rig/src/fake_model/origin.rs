//! Who a model request came from (the main agent, a subagent, a side request), told from the request alone.

use serde_json::Value;

use super::request::{
    Api, Item, conversation, find_tool, forced_tool, offered_tools, trailing_user_texts, turn_metadata,
};
use crate::cli;

/// Who a model request came from, as far as the request itself tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The main agent of a session.
    Main,
    /// A subagent (a child thread, task or agent).
    Subagent,
    /// A side request: session title, turn summary and the like.
    Side,
    /// Not a model request (model list, unknown path).
    None,
}

/// Tells main, subagent and side requests apart from the request body alone.
pub(super) fn classify_origin(api: Api, body: &Value) -> Origin {
    if !api.is_model() {
        return Origin::None;
    }
    let items = conversation(api, body);
    if is_side_request(body, &items) {
        return Origin::Side;
    }
    if is_subagent_request(api, body) {
        return Origin::Subagent;
    }
    Origin::Main
}

/// A title, a summary or a compaction: no tools to call, a forced tool, or a CLI's side-request phrase.
fn is_side_request(body: &Value, items: &[Item]) -> bool {
    // Without tools the model can only write text: titles, summaries, compaction.
    if offered_tools(body).is_empty() || forced_tool(body).is_some() {
        return true;
    }
    let mut texts: Vec<&str> = items
        .iter()
        .filter_map(|i| match i {
            Item::System(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let users = trailing_user_texts(items);
    texts.extend(users.iter().map(String::as_str));
    texts.iter().any(|t| {
        let lower = t.to_lowercase();
        cli::side_phrases().any(|p| lower.contains(p))
    })
}

/// A subagent's request: Codex names the agent in its turn metadata (or sends another agent's message);
/// the chat CLIs give a subagent shell tools but no spawn tool.
fn is_subagent_request(api: Api, body: &Value) -> bool {
    if api == Api::Responses {
        if let Some(agent) = turn_metadata(body, "agent_name") {
            return agent != "/root";
        }
        return body
            .get("input")
            .and_then(Value::as_array)
            .is_some_and(|input| input.iter().any(|i| i.get("type").and_then(Value::as_str) == Some("agent_message")));
    }
    // Chat CLIs give subagents a tool set without the spawn tool.
    let tools = offered_tools(body);
    let can_spawn = find_tool(&tools, &cli::spawn_tools()).is_some();
    let can_shell = find_tool(&tools, &cli::shell_tools()).is_some();
    can_shell && !can_spawn
}

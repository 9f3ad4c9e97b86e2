//! Coda's view of what the agent sends, for prompt mode: what Coda would keep and what it would drop.
//!
//! Which session's output Coda shows, which `_coda/wait` reports it accepts (section Agent 活动, `_coda/wait`),
//! and the summary of an `initialize` or `session/new` answer. Rows are written by [`Renderer`].

use crate::HashSet;
use std::collections::BTreeMap;

use serde_json::Value;

use crate::cli::render::{Renderer, Tone};
use crate::coda::wait::{MAX_DETAIL, MAX_TITLE, MAX_WAIT_ID, utf16_len};

const TERMINAL: [&str; 3] = ["done", "failed", "cancelled"];
const STATES: [&str; 5] = ["waiting", "handling", "done", "failed", "cancelled"];

/// One session and the waits reported in it, as Coda holds them.
#[derive(Default)]
pub(crate) struct CodaView {
    /// The session prompt mode opened or loaded; before that, output of any session is shown.
    pub session: Option<String>,
    /// Sessions announced as `childSessionId` of a wait.
    children: HashSet<String>,
    /// `(sessionId, waitId)` -> its last state.
    waits: BTreeMap<(String, String), String>,
    /// Notification methods already shown once.
    seen_methods: HashSet<String>,
}

impl CodaView {
    /// The prefix for output of `session`, or `None` when Coda would drop it.
    fn session_prefix(&self, session: &str) -> Option<String> {
        match &self.session {
            None => Some(String::new()),
            Some(ours) if ours == session => Some(String::new()),
            _ if self.children.contains(session) => Some(format!("[{session}] ")),
            _ => None,
        }
    }

    /// A notification from the agent.
    pub fn notification(&mut self, r: &mut Renderer<std::io::Stdout>, method: &str, params: &Value) {
        let session = params.get("sessionId").and_then(Value::as_str).unwrap_or("");
        match method {
            "session/update" => {
                let Some(prefix) = self.session_prefix(session) else {
                    r.row(
                        Tone::Dim,
                        &format!("(session/update for session {session:?}, which Coda does not know: dropped)"),
                    );
                    return;
                };
                if let Some(update) = params.get("update") {
                    r.update(&prefix, update);
                }
            }
            "_coda/wait" => self.wait(r, params),
            // Coda ignores notifications it does not know; one row per method is enough to see them.
            other if self.seen_methods.insert(other.to_owned()) => {
                r.row(Tone::Dim, &format!("notification {other} (not Coda's; further ones not shown)"));
            }
            _ => {}
        }
    }

    /// A `_coda/wait` report, checked by Coda's rules (section Agent 活动, `_coda/wait`).
    fn wait(&mut self, r: &mut Renderer<std::io::Stdout>, p: &Value) {
        let field = |k: &str| p.get(k).and_then(Value::as_str);
        let (Some(session), Some(wait_id), Some(state)) = (field("sessionId"), field("waitId"), field("state")) else {
            r.row(Tone::Red, &format!("wait dropped by Coda: sessionId, waitId and state are required: {p}"));
            return;
        };
        let too_long = |k: &str, max: usize| field(k).is_some_and(|s| utf16_len(s) > max);
        let problem = if !STATES.contains(&state) {
            Some(format!("state {state:?} is not one Coda knows"))
        } else if utf16_len(wait_id) > MAX_WAIT_ID {
            Some(format!("waitId is over {MAX_WAIT_ID} characters"))
        } else if too_long("title", MAX_TITLE) {
            Some(format!("title is over {MAX_TITLE} characters"))
        } else if too_long("detail", MAX_DETAIL) {
            Some(format!("detail is over {MAX_DETAIL} characters"))
        } else if field("at").is_some_and(|at| humantime::parse_rfc3339_weak(at).is_err()) {
            Some("at is not an ISO 8601 time".into())
        } else {
            None
        };
        if let Some(problem) = problem {
            r.row(Tone::Red, &format!("wait {wait_id} dropped by Coda: {problem}"));
            return;
        }
        let Some(prefix) = self.session_prefix(session) else {
            r.row(
                Tone::Red,
                &format!("wait {wait_id} dropped by Coda: session {session:?} is not this session or a known child"),
            );
            return;
        };
        let key = (session.to_owned(), wait_id.to_owned());
        let terminal = TERMINAL.contains(&state);
        let tone = match state {
            "failed" => Tone::Red,
            "cancelled" => Tone::Yellow,
            "done" => Tone::Green,
            _ => Tone::Cyan,
        };
        match self.waits.get_mut(&key) {
            None if terminal => {
                r.row(
                    Tone::Red,
                    &format!("{prefix}wait {wait_id} {state}: not registered (a first report must not be terminal)"),
                );
            }
            None => {
                let kind = field("kind").unwrap_or("task");
                let mut row = format!("{prefix}wait {wait_id} started ({kind}, {state})");
                if let Some(title) = field("title") {
                    row += &format!(": {title}");
                }
                if let Some(detail) = field("detail") {
                    row += &format!(" - {detail}");
                }
                if let Some(child) = field("childSessionId") {
                    row += &format!(" [child session {child}]");
                    self.children.insert(child.to_owned());
                }
                if p.get("stoppable").and_then(Value::as_bool) == Some(true) {
                    row += " [stoppable]";
                }
                r.row(tone, &row);
                self.waits.insert(key, state.to_owned());
            }
            Some(was) if TERMINAL.contains(&was.as_str()) => {
                r.row(Tone::Dim, &format!("{prefix}wait {wait_id} {state}: ignored, it already ended ({was})"));
            }
            Some(was) => {
                *was = state.to_owned();
                let mut row = format!("{prefix}wait {wait_id} {state}");
                if let Some(title) = field("title") {
                    row += &format!(": {title}");
                }
                if let Some(child) = field("childSessionId") {
                    self.children.insert(child.to_owned());
                }
                r.row(tone, &row);
            }
        }
    }

    /// Items still open (not in a terminal state).
    pub fn open_waits(&self) -> usize {
        self.waits.values().filter(|state| !TERMINAL.contains(&state.as_str())).count()
    }
}

/// "agent: <name> <version> (protocol 1); declares: loadSession, systemPrompt, waits".
pub(crate) fn describe_agent(init: &Value) -> String {
    let info = init.get("agentInfo");
    let name = info.and_then(|i| i.get("name")).and_then(Value::as_str).unwrap_or("(no agentInfo)");
    let version = info.and_then(|i| i.get("version")).and_then(Value::as_str).unwrap_or("");
    let protocol = init.get("protocolVersion").map(Value::to_string).unwrap_or_else(|| "?".into());
    let caps = init.get("agentCapabilities").cloned().unwrap_or(Value::Null);
    let mut declares = Vec::new();
    if caps.get("loadSession").and_then(Value::as_bool) == Some(true) {
        declares.push("loadSession");
    }
    if caps.pointer("/sessionCapabilities/systemPrompt").is_some() {
        declares.push("systemPrompt");
    }
    if caps.pointer("/_meta/coda/waits").is_some() {
        declares.push("waits");
    }
    if caps.pointer("/_meta/coda/compact").is_some() {
        declares.push("compact");
    }
    if init.pointer("/_meta/steering/supported").and_then(Value::as_bool) == Some(true) {
        declares.push("steering");
    }
    let declares = if declares.is_empty() { "nothing of Coda's".to_owned() } else { declares.join(", ") };
    format!("agent: {name} {version} (protocol {protocol}); declares: {declares}").replace("  ", " ")
}

/// The session's current model (section ACP 部分, 当前模型): the `category: model` config option's value, or
/// `models.currentModelId`.
pub fn current_model(answer: &Value) -> Option<String> {
    let from_options = answer.get("configOptions").and_then(Value::as_array).and_then(|options| {
        options
            .iter()
            .find(|o| o.get("category").and_then(Value::as_str) == Some("model"))
            .and_then(|o| o.get("currentValue"))
            .and_then(Value::as_str)
    });
    from_options.or_else(|| answer.pointer("/models/currentModelId").and_then(Value::as_str)).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn current_model_comes_from_the_model_option_or_models() {
        let options = json!({"configOptions": [{"id": "mode", "category": "mode", "currentValue": "build"},
            {"id": "model", "category": "model", "currentValue": "fake/fake-model"}]});
        assert_eq!(current_model(&options).as_deref(), Some("fake/fake-model"));
        assert_eq!(current_model(&json!({"models": {"currentModelId": "m1"}})).as_deref(), Some("m1"));
        assert_eq!(current_model(&json!({"sessionId": "s"})), None);
    }

    #[test]
    fn the_agent_line_names_what_it_declares() {
        let init = json!({"protocolVersion": 1, "agentInfo": {"name": "demo", "version": "1.0.41"},
            "agentCapabilities": {"loadSession": true, "sessionCapabilities": {"systemPrompt": {}}}});
        assert_eq!(describe_agent(&init), "agent: demo 1.0.41 (protocol 1); declares: loadSession, systemPrompt");
    }
}

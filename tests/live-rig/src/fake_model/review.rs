//! Codex's automatic approval reviewer (mode `agent`, reviewer `auto_review`): its request, and the verdict the
//! fake model answers it with.
//!
//! Codex asks the reviewer with a request of its own (developer text "You are judging one planned coding-agent
//! action", the session's transcript as user text) whose `text.format` is a JSON schema with `outcome` (`allow` |
//! `deny`), `risk_level`, `user_authorization` and `rationale`. The verdict is scripted by the last
//! `[[review:OUTCOME|RISK|RATIONALE]]` marker in that transcript (the user's prompt is part of it); without one
//! the action is allowed at risk `low`.

use serde_json::{Value, json};

use super::markers::{Marker, parse_markers};
use super::request::{Api, Item, conversation};
use super::script::Reply;

/// Whether `body` is a request of Codex's reviewer: its answer format asks for an `outcome` of allow or deny.
pub(super) fn is_review(body: &Value) -> bool {
    let outcome = body.pointer("/text/format/schema/properties/outcome/enum").and_then(Value::as_array);
    outcome.is_some_and(|values| values.iter().any(|v| v == "deny"))
}

/// The reviewer's verdict, as the JSON text its schema asks for.
pub(super) fn review_reply(api: Api, body: &Value) -> Reply {
    let verdict = conversation(api, body)
        .iter()
        .filter_map(|item| match item {
            Item::User(text) => Some(text),
            _ => None,
        })
        .flat_map(|text| parse_markers(text))
        .filter_map(|m| match m {
            Marker::Review { outcome, risk, rationale } => Some((outcome, risk, rationale)),
            _ => None,
        })
        .next_back();
    let (outcome, risk, rationale) =
        verdict.unwrap_or_else(|| ("allow".into(), "low".into(), "fake model: no review marker".into()));
    let answer = json!({"outcome": outcome, "risk_level": risk, "user_authorization": "high", "rationale": rationale});
    Reply::Text(answer.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review_body(transcript: &str) -> Value {
        json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": transcript}]}],
            "tools": [{"type": "function", "name": "exec_command", "parameters": {}}],
            "text": {"format": {"type": "json_schema", "name": "codex_output_schema", "schema": {"type": "object",
                "properties": {"outcome": {"type": "string", "enum": ["allow", "deny"]}}}}}})
    }

    #[test]
    fn the_last_review_marker_is_the_verdict() {
        let body = review_body(
            "user: a [[review:deny|high|deletes files]] [[sh:rm x]]\nuser: b [[review:allow|medium|only reads]]",
        );
        assert!(is_review(&body));
        let Reply::Text(text) = review_reply(Api::Responses, &body) else { panic!("a text verdict") };
        let verdict: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            verdict,
            json!({"outcome": "allow", "risk_level": "medium", "user_authorization": "high", "rationale": "only reads"})
        );
        assert!(!is_review(&json!({"text": {"format": {"schema": {"properties": {"title": {}}}}}})));
    }

    #[test]
    fn without_a_marker_the_action_is_allowed() {
        let Reply::Text(text) = review_reply(Api::Responses, &review_body("user: go")) else { panic!() };
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["outcome"], "allow");
    }
}

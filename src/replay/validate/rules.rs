//! The rules one frame is checked by: JSON-RPC 2.0's envelope, the ACP schema's definition of its method, and
//! Coda's shapes where its protocol text puts them inside ACP frames.
//!
//! Which request an answer answers is the caller's to know ([`super::Checker`] follows the conversation).
//! Extension methods (`_…`) are free in ACP: those of Coda's contract are checked by Coda's schema, the rest
//! only by the envelope. `_meta` is free everywhere ACP puts it, except the keys Coda's text defines.

use serde_json::Value;

use super::schema::{Break, Kind, Party, Schemas, short};
use crate::replay::rpc::{Shape, shape};

/// The envelope rules' names (JSON-RPC 2.0, "Request object", "Response object", "Batch").
pub const JSONRPC_VERSION: &str = "json-rpc#jsonrpc";
pub const JSONRPC_SHAPE: &str = "json-rpc#request-or-response";
pub const JSONRPC_PARAMS: &str = "json-rpc#params";
pub const JSONRPC_BATCH: &str = "json-rpc#batch";
pub const JSONRPC_PARSE: &str = "json-rpc#parse";
pub const ANSWERS_NOTHING: &str = "json-rpc#answers-nothing";
pub const DUPLICATE_ID: &str = "json-rpc#duplicate-id";
/// A method that is not `_`-prefixed and not in ACP's stable schema.
pub const UNKNOWN_METHOD: &str = "acp#method";

/// Methods an agent serves outside ACP's `_` namespace that a shim calls as the agent's own clients do: Qwen
/// Code's task cancel (its ACP agent routes any method it does not know to its own `extMethod`, by this name).
pub const AGENT_OWN_METHODS: &[&str] = &["qwen/control/session/task/cancel"];
/// `_meta.coda` of a `usage_update` over 4 KiB ("用量里的数据": Coda drops it).
pub const USAGE_SIZE: &str = "coda#usage-size";

/// Most bytes of a usage_update's `_meta.coda`, serialised.
pub const USAGE_MAX_BYTES: usize = 4096;

/// What an answer answers.
#[derive(Debug, Clone, Copy)]
pub enum Answering<'a> {
    /// A request of this method.
    Method(&'a str),
    /// No open request has its id.
    Nothing,
}

fn brk(at: impl Into<String>, rule: &str, message: impl Into<String>) -> Break {
    Break { at: at.into(), rule: rule.to_owned(), message: message.into() }
}

/// Checks `value` (found at `at` in the frame) against `def`, pointers made relative to the frame.
fn check_at(s: &Schemas, def: &str, at: &str, value: &Value, out: &mut Vec<Break>) {
    for mut b in s.check(def, value) {
        b.at = format!("{at}{}", b.at);
        out.push(b);
    }
}

/// Every rule `frame`, sent by `sender`, breaks. `answering` says what an answer answers (ignored for other
/// frames).
pub fn check(s: &Schemas, frame: &Value, sender: Party, answering: Option<Answering<'_>>) -> Vec<Break> {
    let mut out = Vec::new();
    let obj = match frame {
        Value::Object(obj) => obj,
        Value::Array(_) => {
            out.push(brk("", JSONRPC_BATCH, "a batch (an array of frames): ACP v1 has no batches"));
            return out;
        }
        other => {
            out.push(brk("", JSONRPC_SHAPE, format!("{} is not a JSON-RPC object", short(&other.to_string()))));
            return out;
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        let got = obj.get("jsonrpc").map(|v| short(&v.to_string())).unwrap_or_else(|| "missing".into());
        out.push(brk("/jsonrpc", JSONRPC_VERSION, format!("\"jsonrpc\" must be \"2.0\"; it is {got}")));
    }
    match shape(frame) {
        Shape::NotAnObject => {}
        Shape::Unclear(why) => out.push(brk("", JSONRPC_SHAPE, why)),
        Shape::Request { id, method } => {
            check_at(s, "RequestId", "/id", id, &mut out);
            params(s, frame, Kind::Request, sender, method, &mut out);
        }
        Shape::Notification { method } => params(s, frame, Kind::Notification, sender, method, &mut out),
        Shape::Answer { id, ok } => {
            check_at(s, "RequestId", "/id", id, &mut out);
            // JSON-RPC answers a request it could not read with an error: id null, or the id of a line the relay
            // refused whole (over the size or depth limit), which a trace does not record.
            let unreadable = !ok
                && (id.is_null()
                    || matches!(frame.pointer("/error/code").and_then(Value::as_i64), Some(-32700 | -32600)));
            match answering {
                Some(Answering::Nothing) | None if unreadable => error(s, frame, "", &mut out),
                Some(Answering::Nothing) | None => out.push(brk(
                    "/id",
                    ANSWERS_NOTHING,
                    format!("an answer to {}, which no open request of the other side has", short(&id.to_string())),
                )),
                Some(Answering::Method(method)) if ok => result(s, frame, sender, method, &mut out),
                Some(Answering::Method(method)) => error(s, frame, method, &mut out),
            }
        }
    }
    out
}

fn params(s: &Schemas, frame: &Value, kind: Kind, sender: Party, method: &str, out: &mut Vec<Break>) {
    let params = frame.get("params");
    if let Some(p) = params
        && !p.is_object()
        && !p.is_array()
    {
        out.push(brk("/params", JSONRPC_PARAMS, "\"params\" must be an object or an array"));
        return;
    }
    let empty = Value::Object(Default::default());
    let p = params.unwrap_or(&empty);
    match s.def_for(kind, sender, method) {
        Some(def) => check_at(s, def, "/params", p, out),
        None if method.starts_with('_') || AGENT_OWN_METHODS.contains(&method) => {}
        None => {
            let what = match kind {
                Kind::Notification => "notification",
                _ => "request",
            };
            let known = if s.knows(method) {
                format!("ACP has {method}, but not as a {what} the {} sends", sender.as_str())
            } else {
                format!("{method} is not a method of ACP's stable schema")
            };
            out.push(brk("/method", UNKNOWN_METHOD, known));
            return;
        }
    }
    // Coda's shapes inside ACP's frames.
    match (method, sender) {
        ("session/update", Party::Agent) => {
            let Some(update) = p.get("update") else { return };
            let kind = update.get("sessionUpdate").and_then(Value::as_str).unwrap_or("");
            let coda = update.pointer("/_meta/coda");
            match (kind, coda) {
                ("tool_call" | "tool_call_update", Some(coda)) => {
                    if let Some(review) = coda.get("review") {
                        check_at(s, "CodaReview", "/params/update/_meta/coda/review", review, out);
                    }
                }
                ("usage_update", Some(coda)) => {
                    check_at(s, "CodaUsage", "/params/update/_meta/coda", coda, out);
                    let size = coda.to_string().len();
                    if size > USAGE_MAX_BYTES {
                        out.push(brk(
                            "/params/update/_meta/coda",
                            USAGE_SIZE,
                            format!("{size} bytes serialised; Coda drops usage facts over {USAGE_MAX_BYTES}"),
                        ));
                    }
                }
                _ => {}
            }
        }
        ("session/new" | "session/load" | "session/resume", Party::Client) => {
            if let Some(sp) = p.get("systemPrompt") {
                check_at(s, "SystemPrompt", "/params/systemPrompt", sp, out);
            }
        }
        _ => {}
    }
}

fn result(s: &Schemas, frame: &Value, sender: Party, method: &str, out: &mut Vec<Break>) {
    let result = &frame["result"];
    if let Some(def) = s.def_for(Kind::Response, sender, method) {
        check_at(s, def, "/result", result, out);
    }
    if method == "initialize" && sender == Party::Agent {
        check_at(s, "CodaInitializeResponse", "/result", result, out);
    }
}

fn error(s: &Schemas, frame: &Value, method: &str, out: &mut Vec<Break>) {
    let error = &frame["error"];
    check_at(s, "Error", "/error", error, out);
    if method == "session/prompt"
        && let Some(failure) = error.pointer("/data/_meta/coda/failure")
    {
        check_at(s, "CodaFailure", "/error/data/_meta/coda/failure", failure, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::validate::schema::schemas;
    use serde_json::json;

    fn rules(frame: &Value, sender: Party, answering: Option<Answering<'_>>) -> Vec<(String, String)> {
        check(schemas(), frame, sender, answering).into_iter().map(|b| (b.at, b.rule)).collect()
    }

    #[test]
    fn the_envelope_is_json_rpc_2() {
        let ok = json!({"jsonrpc": "2.0", "id": 1, "method": "session/cancel"});
        assert_eq!(rules(&ok, Party::Client, None).len(), 1, "session/cancel is a notification");
        let no_version = json!({"id": 1, "method": "_x/y"});
        assert_eq!(rules(&no_version, Party::Client, None), [("/jsonrpc".into(), JSONRPC_VERSION.into())]);
        assert_eq!(rules(&json!([]), Party::Agent, None), [("".into(), JSONRPC_BATCH.into())]);
        let float_id = json!({"jsonrpc": "2.0", "id": 1.5, "method": "_x"});
        assert_eq!(rules(&float_id, Party::Client, None)[0].0, "/id");
        let params = json!({"jsonrpc": "2.0", "method": "_x", "params": 3});
        assert_eq!(rules(&params, Party::Client, None), [("/params".into(), JSONRPC_PARAMS.into())]);
    }

    #[test]
    fn answers_are_checked_by_the_method_they_answer() {
        let answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "later"}});
        let prompt = Some(Answering::Method("session/prompt"));
        assert_eq!(rules(&answer, Party::Agent, prompt)[0].0, "/result/stopReason");
        assert_eq!(rules(&answer, Party::Agent, Some(Answering::Nothing)), [("/id".into(), ANSWERS_NOTHING.into())]);
        // The answer to a line that could not be read as a request.
        let parse = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error"}});
        assert!(rules(&parse, Party::Agent, Some(Answering::Nothing)).is_empty());
        let refused = json!({"jsonrpc": "2.0", "id": 5, "error": {"code": -32600, "message": "over the size limit"}});
        assert!(rules(&refused, Party::Agent, Some(Answering::Nothing)).is_empty());
        let stray = json!({"jsonrpc": "2.0", "id": 5, "error": {"code": -32603, "message": "m"}});
        assert_eq!(rules(&stray, Party::Agent, Some(Answering::Nothing)), [("/id".into(), ANSWERS_NOTHING.into())]);
        // An extension's answer is free.
        assert!(rules(&answer, Party::Agent, Some(Answering::Method("_x/y"))).is_empty());
        let failure = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "m",
            "data": {"_meta": {"coda": {"failure": {"kind": "quota_exhausted", "retryAfterMs": -1}}}}}});
        assert_eq!(
            rules(&failure, Party::Agent, prompt),
            [(
                "/error/data/_meta/coda/failure/retryAfterMs".into(),
                "coda#/$defs/CodaFailure/properties/retryAfterMs/minimum".into()
            )]
        );
    }

    #[test]
    fn codas_keys_inside_acp_frames_are_checked() {
        let review = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {
            "sessionUpdate": "tool_call_update", "toolCallId": "t", "_meta": {"coda": {"review": {"state": "maybe"}}}}}});
        assert_eq!(rules(&review, Party::Agent, None)[0].0, "/params/update/_meta/coda/review/state");
        let big = "x".repeat(USAGE_MAX_BYTES);
        let usage = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {
            "sessionUpdate": "usage_update", "used": 1, "size": 2, "_meta": {"coda": {"note": big}}}}});
        assert_eq!(rules(&usage, Party::Agent, None), [("/params/update/_meta/coda".into(), USAGE_SIZE.into())]);
        let other_meta = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {
            "sessionUpdate": "usage_update", "used": 1, "size": 2, "_meta": {"traceparent": "00-x", "coda": {"a": 1}}}}});
        assert!(rules(&other_meta, Party::Agent, None).is_empty());
        let init = json!({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1,
            "agentCapabilities": {"_meta": {"coda": {"waits": true}}}, "_meta": {"steering": {"supported": "yes"}}}});
        let got = rules(&init, Party::Agent, Some(Answering::Method("initialize")));
        let mut at: Vec<&str> = got.iter().map(|(a, _)| a.as_str()).collect();
        at.sort();
        assert_eq!(at, ["/result/_meta/steering/supported", "/result/agentCapabilities/_meta/coda/waits"], "{got:?}");
    }

    #[test]
    fn unknown_methods_are_named_and_extensions_are_free() {
        let set_model = json!({"jsonrpc": "2.0", "id": 1, "method": "session/set_model", "params": {}});
        assert_eq!(rules(&set_model, Party::Client, None), [("/method".into(), UNKNOWN_METHOD.into())]);
        let wrong_way = json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {}});
        let got = check(schemas(), &wrong_way, Party::Agent, None);
        assert!(got[0].message.contains("not as a request the agent sends"), "{got:?}");
        let ext = json!({"jsonrpc": "2.0", "method": "_kimi/anything", "params": {"x": [1, 2]}});
        assert!(rules(&ext, Party::Agent, None).is_empty());
        let wait = json!({"jsonrpc": "2.0", "method": "_coda/wait", "params": {"sessionId": "s", "waitId": "w"}});
        assert_eq!(
            rules(&wait, Party::Agent, None),
            [("/params".into(), "coda#/$defs/CodaWaitNotification/required".into())]
        );
    }
}

//! The schemas frames are checked against: ACP's own (`fixtures/schema/acp-v1.21.0.json`, vendored as it was
//! published) and Coda's shapes (`fixtures/schema/coda.json`), read as one document.
//!
//! Each definition that is a method's params or result names it (`x-method`) and the side that handles it
//! (`x-side`): [`Schemas::def_for`] finds the definition a frame is checked against from its method, kind and
//! sender. A definition is compiled the first time a frame needs it, once per process.

use crate::HashMap;
use std::sync::OnceLock;

use jsonschema::error::ValidationErrorKind;
use jsonschema::{ValidationError, Validator};
use serde_json::{Map, Value, json};

/// The version of ACP's JSON Schema vendored (its tag `schema-v1.21.0`): `protocolVersion` 1, stable methods.
pub const ACP_SCHEMA_VERSION: &str = "1.21.0";

const ACP: &str = include_str!("../../../fixtures/schema/acp-v1.21.0.json");
const CODA: &str = include_str!("../../../fixtures/schema/coda.json");

/// Who sent a frame, as JSON-RPC sees it: the client (Coda, or the shim talking to its CLI) or the agent
/// (the CLI, or the shim talking to Coda).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Party {
    Client,
    Agent,
}

impl Party {
    pub fn other(self) -> Party {
        match self {
            Party::Client => Party::Agent,
            Party::Agent => Party::Client,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Party::Client => "client",
            Party::Agent => "agent",
        }
    }
}

/// What a definition describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A request's `params`.
    Request,
    /// A notification's `params`.
    Notification,
    /// A successful answer's `result`.
    Response,
}

/// One way a value breaks a definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    /// Where in the value checked (a JSON pointer, relative to it).
    pub at: String,
    /// The rule: the schema's keyword location, `acp#/$defs/...` or `coda#/$defs/...`.
    pub rule: String,
    pub message: String,
}

/// The two schemas, read once.
pub struct Schemas {
    /// ACP's document with Coda's definitions added to its `$defs`.
    doc: Value,
    /// Definitions that came from Coda's file (for naming the rule's source).
    coda: Vec<String>,
    /// (kind, sender, method) → definition.
    methods: HashMap<(Kind, Party, String), String>,
    compiled: HashMap<String, OnceLock<Result<Validator, String>>>,
}

/// The schemas, parsed on first use.
pub fn schemas() -> &'static Schemas {
    static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| Schemas::new(ACP, CODA).expect("the vendored schemas parse"))
}

impl Schemas {
    fn new(acp: &str, coda: &str) -> Result<Schemas, String> {
        let mut doc: Value = serde_json::from_str(acp).map_err(|e| format!("ACP's schema: {e}"))?;
        let own: Value = serde_json::from_str(coda).map_err(|e| format!("Coda's schema: {e}"))?;
        let defs = doc.get_mut("$defs").and_then(Value::as_object_mut).ok_or("ACP's schema has no $defs")?;
        let mut coda = Vec::new();
        for (name, def) in own.get("$defs").and_then(Value::as_object).into_iter().flatten() {
            if defs.insert(name.clone(), def.clone()).is_some() {
                return Err(format!("Coda's schema defines {name}, which ACP's already does"));
            }
            coda.push(name.clone());
        }
        let mut methods = HashMap::default();
        for (name, def) in defs.iter() {
            let (Some(side), Some(method)) =
                (def.get("x-side").and_then(Value::as_str), def.get("x-method").and_then(Value::as_str))
            else {
                continue;
            };
            let kind = if name.ends_with("Request") {
                Kind::Request
            } else if name.ends_with("Notification") {
                Kind::Notification
            } else if name.ends_with("Response") {
                Kind::Response
            } else {
                continue;
            };
            // `x-side` is the side that handles it: a request or notification is sent by the other one; an
            // answer by the side that handles the request.
            let senders: &[Party] = match (side, kind) {
                ("agent", Kind::Response) | ("client", Kind::Request | Kind::Notification) => &[Party::Agent],
                ("client", Kind::Response) | ("agent", Kind::Request | Kind::Notification) => &[Party::Client],
                ("protocol", _) => &[Party::Client, Party::Agent],
                _ => continue,
            };
            for &sender in senders {
                methods.insert((kind, sender, method.to_owned()), name.clone());
            }
        }
        let compiled = defs.keys().map(|k| (k.clone(), OnceLock::new())).collect();
        Ok(Schemas { doc, coda, methods, compiled })
    }

    /// The definition of `method`'s params (a request or notification `sender` sent) or result (an answer
    /// `sender` sent to it).
    pub fn def_for(&self, kind: Kind, sender: Party, method: &str) -> Option<&str> {
        self.methods.get(&(kind, sender, method.to_owned())).map(String::as_str)
    }

    /// Is `method` one the schemas know, sent by anyone in any form?
    pub fn knows(&self, method: &str) -> bool {
        self.methods.keys().any(|(_, _, m)| m == method)
    }

    /// The `const` values of a definition's `oneOf` branches at `key` (the kinds of `SessionUpdate`).
    pub fn kinds_of(&self, def: &str, key: &str) -> Vec<&str> {
        self.doc["$defs"][def]["oneOf"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b.pointer(&format!("/properties/{key}/const")).and_then(Value::as_str))
            .collect()
    }

    /// Checks `value` against definition `def`; every way it breaks it, most specific first.
    pub fn check(&self, def: &str, value: &Value) -> Vec<Break> {
        let Some(cell) = self.compiled.get(def) else {
            return vec![Break { at: String::new(), rule: def.to_owned(), message: format!("no definition {def}") }];
        };
        let validator = cell.get_or_init(|| {
            let mut root = Map::new();
            root.insert("$schema".into(), self.doc["$schema"].clone());
            root.insert("$ref".into(), json!(format!("#/$defs/{def}")));
            root.insert("$defs".into(), self.doc["$defs"].clone());
            jsonschema::validator_for(&Value::Object(root)).map_err(|e| e.to_string())
        });
        match validator {
            Ok(v) => {
                let mut out = Vec::new();
                for e in v.iter_errors(value) {
                    self.flatten(&e, &mut out);
                }
                out
            }
            Err(e) => vec![Break { at: String::new(), rule: def.to_owned(), message: format!("bad schema: {e}") }],
        }
    }

    /// The rule's name: which file it is in and where.
    fn rule(&self, schema_path: &str) -> String {
        let def = schema_path.strip_prefix("/$defs/").and_then(|p| p.split('/').next()).unwrap_or("");
        let file = if self.coda.iter().any(|c| c == def) { "coda" } else { "acp" };
        format!("{file}#{schema_path}")
    }

    /// An error as the breaks a person can act on: for a `oneOf`/`anyOf` that no branch fits, the branch the
    /// value meant (the one whose discriminating `const` it has), or, when it meant none, the values it could
    /// have had.
    fn flatten(&self, e: &ValidationError<'_>, out: &mut Vec<Break>) {
        let context = match e.kind() {
            ValidationErrorKind::OneOfNotValid { context } | ValidationErrorKind::AnyOf { context } => context,
            _ => {
                out.push(Break {
                    at: e.instance_path().as_str().to_owned(),
                    rule: self.rule(e.schema_path().as_str()),
                    message: e.to_string(),
                });
                return;
            }
        };
        let at = e.instance_path().as_str();
        // A branch the value does not mean: it fails a `const` or `enum`, or a `type` of the value itself.
        let misses = |branch: &Vec<ValidationError<'static>>| {
            branch.iter().any(|b| {
                matches!(b.kind(), ValidationErrorKind::Constant { .. } | ValidationErrorKind::Enum { .. })
                    || (b.instance_path().as_str() == at && matches!(b.kind(), ValidationErrorKind::Type { .. }))
            })
        };
        let meant: Vec<&Vec<ValidationError<'static>>> = context.iter().filter(|b| !misses(b)).collect();
        if let Some(best) = meant.iter().min_by_key(|b| b.len()) {
            for b in best.iter() {
                self.flatten(b, out);
            }
            return;
        }
        // Meant none: the values the branches take, where they differ.
        let mut expected: Vec<String> = Vec::new();
        let mut key_at = at.to_owned();
        for b in context.iter().flatten() {
            match b.kind() {
                ValidationErrorKind::Constant { expected_value } => {
                    key_at = b.instance_path().as_str().to_owned();
                    expected.push(expected_value.to_string());
                }
                ValidationErrorKind::Enum { options } => {
                    key_at = b.instance_path().as_str().to_owned();
                    expected.extend(options.as_array().into_iter().flatten().map(Value::to_string));
                }
                _ => {}
            }
        }
        expected.dedup();
        let message = if expected.is_empty() {
            e.to_string()
        } else {
            let got = pointer_value(e.instance(), at, &key_at).map(|v| short(&v.to_string())).unwrap_or_default();
            let list = match expected.len() {
                n if n > 6 => format!("{}, … ({n} in all)", expected[..4].join(", ")),
                _ => expected.join(", "),
            };
            format!("{got} is none of {list}")
        };
        out.push(Break { at: key_at, rule: self.rule(e.schema_path().as_str()), message });
    }
}

/// The value at `inner` (a pointer below `outer`) inside `v` (the value at `outer`).
fn pointer_value<'v>(v: &'v Value, outer: &str, inner: &str) -> Option<&'v Value> {
    v.pointer(inner.strip_prefix(outer).unwrap_or(""))
}

/// A value cut for a message.
pub fn short(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(MAX).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_found_by_kind_and_sender() {
        let s = schemas();
        assert_eq!(s.def_for(Kind::Request, Party::Client, "session/prompt"), Some("PromptRequest"));
        assert_eq!(s.def_for(Kind::Response, Party::Agent, "session/prompt"), Some("PromptResponse"));
        assert_eq!(s.def_for(Kind::Request, Party::Agent, "session/prompt"), None);
        assert_eq!(s.def_for(Kind::Notification, Party::Agent, "session/update"), Some("SessionNotification"));
        assert_eq!(
            s.def_for(Kind::Request, Party::Agent, "session/request_permission"),
            Some("RequestPermissionRequest")
        );
        assert_eq!(
            s.def_for(Kind::Response, Party::Client, "session/request_permission"),
            Some("RequestPermissionResponse")
        );
        for p in [Party::Client, Party::Agent] {
            assert_eq!(s.def_for(Kind::Notification, p, "$/cancel_request"), Some("CancelRequestNotification"));
        }
        assert_eq!(s.def_for(Kind::Notification, Party::Agent, "_coda/wait"), Some("CodaWaitNotification"));
        assert_eq!(s.def_for(Kind::Response, Party::Agent, "_coda/session/compact"), Some("CodaCompactResponse"));
        assert_eq!(s.def_for(Kind::Response, Party::Agent, "_session/steering"), Some("SteeringResponse"));
    }

    #[test]
    fn a_branch_the_value_means_is_the_one_reported() {
        let s = schemas();
        let update = json!({"sessionId": "s", "update": {"sessionUpdate": "tool_call", "toolCallId": "x", "title": 5}});
        let breaks = s.check("SessionNotification", &update);
        assert_eq!(breaks.len(), 1, "{breaks:?}");
        assert_eq!(breaks[0].at, "/update/title");
        assert_eq!(breaks[0].rule, "acp#/$defs/ToolCall/properties/title/type");
        let kind = json!({"sessionId": "s", "update": {"sessionUpdate": "compaction_update"}});
        let breaks = s.check("SessionNotification", &kind);
        assert_eq!(breaks.len(), 1, "{breaks:?}");
        assert_eq!(breaks[0].at, "/update/sessionUpdate");
        assert!(breaks[0].message.starts_with("\"compaction_update\" is none of \"user_message_chunk\""), "{breaks:?}");
        let stop = json!({"stopReason": "quota_exhausted"});
        let breaks = s.check("PromptResponse", &stop);
        assert_eq!(breaks[0].at, "/stopReason");
        assert!(breaks[0].message.contains("\"end_turn\""), "{breaks:?}");
        assert!(s.check("PromptResponse", &json!({"stopReason": "end_turn"})).is_empty());
    }

    #[test]
    fn codas_shapes_are_checked_and_named_as_codas() {
        let s = schemas();
        let wait = json!({"sessionId": "s", "waitId": "w", "state": "sleeping"});
        let breaks = s.check("CodaWaitNotification", &wait);
        assert_eq!(breaks.len(), 1, "{breaks:?}");
        assert_eq!(
            (breaks[0].at.as_str(), breaks[0].rule.as_str()),
            ("/state", "coda#/$defs/CodaWaitNotification/properties/state/enum")
        );
        let at = json!({"sessionId": "s", "waitId": "w", "state": "waiting", "at": "tomorrow"});
        assert_eq!(s.check("CodaWaitNotification", &at)[0].at, "/at");
        let ok =
            json!({"sessionId": "s", "waitId": "w", "state": "waiting", "kind": "timer", "at": "2026-10-12T10:00:00Z"});
        assert!(s.check("CodaWaitNotification", &ok).is_empty());
        assert_eq!(
            s.check("CodaCompactResponse", &json!({"compacted": true, "extra": 1}))[0].rule,
            "coda#/$defs/CodaCompactResponse/additionalProperties"
        );
        // A steering prompt is ACP's content.
        let steer = json!({"sessionId": "s", "prompt": [{"type": "text"}]});
        assert_eq!(s.check("SteeringRequest", &steer)[0].at, "/prompt/0");
    }

    #[test]
    fn numbers_beyond_f64_are_read_not_refused() {
        let s = schemas();
        let v: Value = crate::json::from_str(
            r#"{"sessionId":"s","update":{"sessionUpdate":"usage_update","used":1e400,"size":5}}"#,
        )
        .expect("parses");
        let breaks = s.check("SessionNotification", &v);
        assert!(breaks.iter().all(|b| b.at == "/update/used"), "{breaks:?}");
    }
}

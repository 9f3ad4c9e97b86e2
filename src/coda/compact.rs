//! Coda's `_coda/session/compact` (section 压缩上下文), the part every adapter shares: the declaration, the
//! request's one parameter, the answer's shape, and the gate that holds a session's prompts while it compacts.
//! How a CLI compacts is its adapter's (`adapters/<agent>/compact.rs`).
//!
//! - Declared as `agentCapabilities._meta.coda.compact: {}` in the `initialize` result, only by an adapter whose
//!   CLI can compact ([`declare`]).
//! - Not a turn: Coda opens none and the session's view does not change; `session/update`s during it pass on.
//! - A `session/prompt` that arrives while its session compacts waits until the compaction ended ([`Gate`]).
//! - The answer is `{compacted, reason?, before?, after?}`; nothing else ([`Outcome::answer`]). Coda waits at
//!   most 10 minutes, so an adapter gives up on its CLI before that ([`DEADLINE`]).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::frame::{self, Frame, Id};

/// Coda's request.
pub const METHOD: &str = "_coda/session/compact";

/// How long an adapter waits for its CLI's compaction before it cancels it and answers `compacted: false`:
/// inside Coda's 10 minutes, with room for the cancel and the answer.
pub const DEADLINE: Duration = Duration::from_secs(9 * 60);

/// Reasons shared by every adapter, for people to read.
pub const NOT_RUNNING: &str = "the session is not running in this agent process";
pub const TURN_RUNNING: &str = "a turn is running in this session; compact between turns";
pub const ALREADY: &str = "this session is already compacting";
pub const TIMED_OUT: &str = "the agent did not finish compacting within 9 minutes; it was cancelled";

/// Adds `agentCapabilities._meta.coda.compact: {}` to an `initialize` result object.
pub fn declare(result: &mut Map<String, Value>) {
    let capabilities = object_at(result, "agentCapabilities");
    let coda = object_at(object_at(capabilities, "_meta"), "coda");
    coda.insert("compact".into(), json!({}));
}

/// `map[key]` as an object, made one (replacing whatever was there) when it is not.
fn object_at<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = map.entry(key).or_insert_with(|| json!({}));
    if !slot.is_object() {
        *slot = json!({});
    }
    slot.as_object_mut().expect("made an object above")
}

/// The session a `_coda/session/compact` request names, or the error answer for it (-32602).
pub fn session_of(request: &Value, id: &Id) -> Result<String, Frame> {
    match request.get("params").and_then(|p| p.get("sessionId")).and_then(Value::as_str) {
        Some(s) if !s.is_empty() => Ok(s.to_owned()),
        _ => Err(frame::error_response(id, -32602, "`_coda/session/compact` needs params.sessionId (a string)", None)),
    }
}

/// How a compaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Compacted; the context's tokens before and after where the CLI lets them be known.
    Compacted { before: Option<u64>, after: Option<u64> },
    /// Not compacted, and why (for people; times as `<t:…>`).
    NotCompacted(String),
}

impl Outcome {
    pub fn not(reason: impl Into<String>) -> Outcome {
        Outcome::NotCompacted(reason.into())
    }

    /// The answer to Coda's request `id`: exactly the protocol's fields.
    pub fn answer(&self, id: &Id) -> Frame {
        let mut result = Map::new();
        match self {
            Outcome::Compacted { before, after } => {
                result.insert("compacted".into(), json!(true));
                if let Some(b) = before {
                    result.insert("before".into(), json!(b));
                }
                if let Some(a) = after {
                    result.insert("after".into(), json!(a));
                }
            }
            Outcome::NotCompacted(reason) => {
                result.insert("compacted".into(), json!(false));
                result.insert("reason".into(), json!(reason));
            }
        }
        frame::result_response(id, Value::Object(result))
    }
}

/// Sessions that compact now, and the `session/prompt`s Coda sent to them meanwhile (in arrival order).
#[derive(Default)]
pub struct Gate {
    held: HashMap<String, Vec<Frame>>,
}

impl Gate {
    /// `session` starts compacting; false when it already is.
    pub fn close(&mut self, session: &str) -> bool {
        if self.held.contains_key(session) {
            return false;
        }
        self.held.insert(session.to_owned(), Vec::new());
        true
    }

    pub fn is_closed(&self, session: &str) -> bool {
        self.held.contains_key(session)
    }

    /// A frame for `session`: kept when the session compacts (`None`), else given back.
    pub fn hold(&mut self, session: &str, frame: Frame) -> Option<Frame> {
        match self.held.get_mut(session) {
            Some(queue) => {
                queue.push(frame);
                None
            }
            None => Some(frame),
        }
    }

    /// `session`'s compaction ended: the frames held for it, to send on in this order.
    pub fn open(&mut self, session: &str) -> Vec<Frame> {
        self.held.remove(session).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(o: Outcome) -> Value {
        o.answer(&Id::from_json("7")).value().clone()
    }

    #[test]
    fn answers_carry_exactly_the_protocols_fields() {
        let v = answer(Outcome::Compacted { before: Some(120_000), after: Some(9_000) });
        assert_eq!(v, json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":120000,"after":9000}}));
        let v = answer(Outcome::Compacted { before: None, after: None });
        assert_eq!(v["result"], json!({"compacted":true}));
        let v = answer(Outcome::not(TURN_RUNNING));
        assert_eq!(v["result"], json!({"compacted":false,"reason":TURN_RUNNING}));
    }

    #[test]
    fn the_declaration_sits_under_agent_capabilities_meta_coda_and_keeps_what_was_there() {
        let mut r = json!({"agentCapabilities":{"loadSession":true,"_meta":{"coda":{"wait":{}}, "x":1}}});
        declare(r.as_object_mut().unwrap());
        assert_eq!(
            r,
            json!({"agentCapabilities":{"loadSession":true,"_meta":{"coda":{"wait":{},"compact":{}},"x":1}}})
        );
        let mut r = json!({"agentCapabilities":7});
        declare(r.as_object_mut().unwrap());
        assert_eq!(r, json!({"agentCapabilities":{"_meta":{"coda":{"compact":{}}}}}));
    }

    #[test]
    fn a_request_without_a_session_gets_invalid_params() {
        let id = Id::from_json("\"c\"");
        assert_eq!(session_of(&json!({"params":{"sessionId":"s1"}}), &id).ok().as_deref(), Some("s1"));
        for bad in
            [json!({}), json!({"params":[]}), json!({"params":{"sessionId":1e3}}), json!({"params":{"sessionId":""}})]
        {
            let err = session_of(&bad, &id).expect_err("refused").value().clone();
            assert_eq!(err["error"]["code"], -32602);
            assert_eq!(err["id"], "c");
        }
    }

    #[test]
    fn the_gate_holds_a_compacting_sessions_frames_in_order_and_no_other() {
        let mut g = Gate::default();
        let f = |n: u32| frame::notification("session/prompt", json!({"n": n}));
        assert!(g.close("a"));
        assert!(!g.close("a"));
        assert!(g.hold("a", f(1)).is_none());
        assert!(g.hold("b", f(2)).is_some());
        assert!(g.hold("a", f(3)).is_none());
        let out: Vec<Value> = g.open("a").iter().map(|f| f.value()["params"]["n"].clone()).collect();
        assert_eq!(out, [json!(1), json!(3)]);
        assert!(!g.is_closed("a"));
        assert!(g.open("a").is_empty());
    }
}

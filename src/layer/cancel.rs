//! ACP's request cancellation (`$/cancel_request`, stable since 2026-06-29), written once for every stack.
//!
//! Either peer may withdraw a request it sent and has no answer to: `$/cancel_request {requestId}`. The
//! receiver may stop the work, but the withdrawn request still gets exactly one answer: its result (a partial
//! one), or error -32800 "Request cancelled". Ids are per connection, so a withdrawal is hop-scoped: whoever
//! holds the request acts on it, and a relay that made a request of its own for it withdraws that one, by its
//! own id.
//!
//! In a stack:
//!
//! - A layer that holds a client request (a prompt behind a compaction, a steering message waiting for its
//!   turn, Kimi's prompts held while Kimi runs a turn of its own) answers it [`cancelled`] when Coda withdraws
//!   it, and never sends it.
//! - A layer that answers a client request with requests of its own to the agent makes them with
//!   [`crate::layer::Cx::request_for`]: the stack then turns Coda's withdrawal into one of each of those, by
//!   the shim's id ([`crate::layer::Stack`]), and the layer answers Coda's request from their answers as it
//!   would have.
//! - A withdrawal of a request the agent has (sent as it came) goes on as it came; one of a request the agent
//!   never saw and nobody made one for (held and answered here, or answered already) stops at the stack's
//!   bottom: the agent does not know that id.
//! - The agent's withdrawal of a request a layer holds (coda-opencode's permission bridge keeps OpenCode's
//!   copy of a question Coda has from the shim) is answered there as Coda would answer it; one the client has
//!   goes on to the client.

use serde_json::{Value, json};

use crate::frame::{self, Frame, Id};

/// The notification.
pub const METHOD: &str = "$/cancel_request";

/// JSON-RPC error code of a request that was cancelled (ACP's `RequestCancelled`).
pub const CANCELLED: i64 = -32800;

/// The id a `$/cancel_request` frame withdraws; `None` for any other frame, or one without a string or
/// number `requestId`.
pub fn target(frame: &Frame) -> Option<Id> {
    if !frame.is_notification(METHOD) {
        return None;
    }
    match frame.value().pointer("/params/requestId")? {
        id @ (Value::String(_) | Value::Number(_)) => Some(Id::from_json(&id.to_string())),
        _ => None,
    }
}

/// The answer to a withdrawn request `id` that was not carried out: error -32800.
pub fn cancelled(id: &Id) -> Frame {
    frame::error_response(id, CANCELLED, "Request cancelled", None)
}

/// A `$/cancel_request` of the request `id`.
pub fn withdraw(id: &Id) -> Frame {
    frame::notification(METHOD, json!({ "requestId": id.to_value() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_read_by_value_and_only_from_a_withdrawal() {
        let f = |text: &str| Frame::parse(text.as_bytes().to_vec()).expect("a frame");
        let w = f(r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":1e0}}"#);
        assert_eq!(target(&w), Some(Id::from_json("1")));
        let w = f(r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"a\u0062"}}"#);
        assert_eq!(target(&w), Some(Id::string("ab")));
        for other in [
            r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":null}}"#,
            r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"$/cancel_request"}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"$/cancel_request","params":{"requestId":1}}"#,
            r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"requestId":1}}"#,
        ] {
            assert_eq!(target(&f(other)), None, "{other}");
        }
        assert_eq!(cancelled(&Id::from_json("7")).value()["error"]["code"], -32800);
        assert_eq!(withdraw(&Id::string("x")).value()["params"], json!({"requestId": "x"}));
    }
}

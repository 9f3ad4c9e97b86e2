//! Coda's failure answer to a `session/prompt` (section 执行失败): a JSON-RPC error whose
//! `error.data._meta.coda.failure` names the kind, with the readable reason in `error.message`.
//!
//! Each adapter decides the kind from what its CLI says (only from an explicit upstream reason, never from a
//! status code alone but 503, which by definition says the server is temporarily unavailable; never for a login
//! problem); this module only writes the answer.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::frame::{self, Frame, Id};

/// How long a CLI's own retries may keep a turn open before the shim stops the run and reports the failure
/// (执行失败 / 服务暂不可用: a wait of over a minute is not waited out silently).
pub const RETRY_PATIENCE: Duration = Duration::from_secs(60);

/// [`RETRY_PATIENCE`], or `CODA_SHIM_RETRY_PATIENCE_MS` where set (replays of a stopped run use a shorter one,
/// so they need not wait a real minute). Set-up only (an adapter's `mod.rs`): it reads the environment.
pub fn retry_patience() -> Duration {
    std::env::var("CODA_SHIM_RETRY_PATIENCE_MS")
        .ok()
        .and_then(|ms| ms.trim().parse().ok())
        .map_or(RETRY_PATIENCE, Duration::from_millis)
}

/// Whether the input of a failed turn reached the native session (`input` of `service_unavailable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The input entered the native session and the native run has ended.
    Accepted,
    /// Explicitly refused before the native session took the input.
    NotAccepted,
}

/// A failure kind Coda knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `quota_exhausted`: the upstream said the quota or balance is used up.
    Quota,
    /// `service_unavailable`: the upstream said it cannot serve for now. `input` only where the evidence
    /// says; `retry_after_ms` only a wait the upstream asked for or the CLI really scheduled.
    Service { input: Option<Input>, retry_after_ms: Option<u64> },
}

impl Kind {
    /// The `_meta.coda.failure` object.
    pub fn to_value(&self) -> Value {
        match self {
            Kind::Quota => json!({"kind": "quota_exhausted"}),
            Kind::Service { input, retry_after_ms } => {
                let mut v = json!({"kind": "service_unavailable"});
                match input {
                    Some(Input::Accepted) => v["input"] = json!("accepted"),
                    Some(Input::NotAccepted) => v["input"] = json!("not_accepted"),
                    None => {}
                }
                if let Some(ms) = retry_after_ms {
                    v["retryAfterMs"] = json!(ms);
                }
                v
            }
        }
    }
}

/// The error answer for prompt `id`: code -32603, `message`, and `data` (an object is kept; anything else
/// is put under `data.upstream`) with `_meta.coda.failure` when `kind` is known.
pub fn answer(id: &Id, message: &str, kind: Option<&Kind>, data: Option<Value>) -> Frame {
    let Some(kind) = kind else {
        return frame::error_response(id, -32603, message, data);
    };
    let mut map = match data {
        Some(Value::Object(map)) => map,
        Some(other) => Map::from_iter([("upstream".to_owned(), other)]),
        None => Map::new(),
    };
    let meta = map.entry("_meta").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta["coda"] = json!({ "failure": kind.to_value() });
    frame::error_response(id, -32603, message, Some(Value::Object(map)))
}

/// `text` cut to at most `max` bytes at a character boundary, with `…` where it was cut (upstream messages may
/// quote whole response bodies).
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `<t:2026-10-24T18:10:00.000Z>`: a time inside text meant for people (文字里的时刻).
pub fn time_mark(at: jiff::Timestamp) -> String {
    format!("<t:{}>", at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(f: &Frame) -> Value {
        f.value().get("error").cloned().unwrap_or(Value::Null)
    }

    #[test]
    fn a_service_failure_carries_only_what_is_known() {
        let id = Id::from_json("7");
        let k = Kind::Service { input: Some(Input::Accepted), retry_after_ms: Some(90_000) };
        let e = error(&answer(&id, "busy", Some(&k), Some(json!({"agent": {"name": "X"}}))));
        assert_eq!(
            e,
            json!({"code": -32603, "message": "busy", "data": {"agent": {"name": "X"},
                "_meta": {"coda": {"failure": {"kind": "service_unavailable", "input": "accepted", "retryAfterMs": 90000}}}}})
        );
        let k = Kind::Service { input: None, retry_after_ms: None };
        let e = error(&answer(&id, "busy", Some(&k), Some(json!("text"))));
        assert_eq!(e["data"]["upstream"], "text");
        assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind": "service_unavailable"}));
    }

    #[test]
    fn without_a_kind_it_is_a_plain_error() {
        let e = error(&answer(&Id::from_json("1"), "no", None, Some(json!({"_meta": 3}))));
        assert_eq!(e, json!({"code": -32603, "message": "no", "data": {"_meta": 3}}));
        let e = error(&answer(&Id::from_json("1"), "quota", Some(&Kind::Quota), Some(json!({"_meta": 3}))));
        assert_eq!(e["data"]["_meta"], json!({"coda": {"failure": {"kind": "quota_exhausted"}}}));
    }

    #[test]
    fn long_text_is_clipped_at_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééé", 3), "é…");
        assert_eq!(clip(&"x".repeat(20_000), 2000).len(), 2000 + '…'.len_utf8());
    }

    #[test]
    fn times_are_marked_in_utc_to_the_millisecond() {
        let at: jiff::Timestamp = "2026-10-24T18:10:00Z".parse().expect("a time");
        assert_eq!(time_mark(at), "<t:2026-10-24T18:10:00.000Z>");
    }
}

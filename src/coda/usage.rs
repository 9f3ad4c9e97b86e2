//! Coda's usage facts (section 用量里的数据), the part every adapter shares: `_meta.coda` on a root session's
//! `usage_update`, for Coda's lifecycle workflows. Where each fact comes from is the adapter's
//! (`adapters/<agent>/usage.rs`); this file only writes them.
//!
//! - Only a root session's `usage_update` carries them, never a subagent's.
//! - `lastRequestAt`: when the main thread last sent a request to the model (ISO 8601, UTC, milliseconds);
//!   `contextTokens`: the context of that request; `compactedAt`: the last compaction, asked for or
//!   automatic; `cacheTtl`: only where the CLI or its provider says it (no CLI does today), never a guess.
//! - Coda drops a `_meta.coda` over 4 KiB: these facts are a few dozen bytes, and a `cacheTtl` that is not a
//!   short duration is left out.

use std::time::SystemTime;

use serde_json::{Map, Value, json};

use crate::frame::{self, Frame};

/// What Coda's workflows read of a session. `None` is a fact not known (left out, never guessed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub last_request_at: Option<SystemTime>,
    pub context_tokens: Option<u64>,
    pub compacted_at: Option<SystemTime>,
    /// An ISO 8601 duration (`PT1H`), as the CLI said it.
    pub cache_ttl: Option<String>,
}

/// The longest `cacheTtl` kept (an ISO 8601 duration is a handful of characters).
const CACHE_TTL_MAX: usize = 32;

/// `2026-10-28T01:06:12.418Z`: a time as Coda's facts carry it (UTC, milliseconds; what `toISOString()` writes).
pub fn iso(at: SystemTime) -> Option<String> {
    let at = jiff::Timestamp::try_from(at).ok()?;
    Some(at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

impl Facts {
    /// Nothing known yet.
    pub fn is_empty(&self) -> bool {
        self.last_request_at.is_none() && self.context_tokens.is_none() && self.compacted_at.is_none()
    }

    /// The `_meta.coda` object, holding what is known.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut coda = Map::new();
        if let Some(at) = self.last_request_at.and_then(iso) {
            coda.insert("lastRequestAt".into(), json!(at));
        }
        if let Some(n) = self.context_tokens {
            coda.insert("contextTokens".into(), json!(n));
        }
        if let Some(ttl) = self.cache_ttl.as_ref().filter(|t| t.len() <= CACHE_TTL_MAX && t.starts_with('P')) {
            coda.insert("cacheTtl".into(), json!(ttl));
        }
        if let Some(at) = self.compacted_at.and_then(iso) {
            coda.insert("compactedAt".into(), json!(at));
        }
        coda
    }

    /// Writes the facts into a `session/update` `usage_update` value (its `update._meta.coda`, keeping the
    /// `_meta` keys that were there, the facts replacing a `coda` the CLI wrote). False when `frame` is no
    /// usage update (left as it was).
    pub fn stamp(&self, frame: &mut Value) -> bool {
        let Some(update) = frame.pointer_mut("/params/update").and_then(Value::as_object_mut) else { return false };
        if update.get("sessionUpdate").and_then(Value::as_str) != Some("usage_update") {
            return false;
        }
        let meta = update.entry("_meta").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        meta.as_object_mut().expect("an object").insert("coda".into(), Value::Object(self.to_json()));
        true
    }

    /// A `usage_update` of the shim's for `session`, for a CLI that sends none when a fact changes. `used` and
    /// `size` are ACP's required fields: the CLI's own figures where it has them.
    pub fn update(&self, session: &str, used: u64, size: u64) -> Frame {
        let mut v = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
            "update":{"sessionUpdate":"usage_update","used":used,"size":size}}});
        self.stamp(&mut v);
        frame::Frame::from_value(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn times_are_utc_with_milliseconds_whatever_the_zone() {
        assert_eq!(iso(at(1_793_149_572_418)).as_deref(), Some("2026-10-28T01:06:12.418Z"));
        assert_eq!(iso(at(0)).as_deref(), Some("1970-01-01T00:00:00.000Z"));
    }

    #[test]
    fn facts_go_under_meta_coda_of_a_usage_update_and_keep_other_meta() {
        let facts = Facts {
            last_request_at: Some(at(1_793_149_572_418)),
            context_tokens: Some(53_000),
            compacted_at: Some(at(1_793_141_203_120)),
            cache_ttl: None,
        };
        let mut v = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{
            "sessionUpdate":"usage_update","used":53000,"size":200000,"_meta":{"x":1,"coda":{"old":true}}}}});
        assert!(facts.stamp(&mut v));
        assert_eq!(
            v["params"]["update"]["_meta"],
            json!({"x":1,"coda":{"lastRequestAt":"2026-10-28T01:06:12.418Z","contextTokens":53000,
                "compactedAt":"2026-10-27T22:46:43.120Z"}})
        );
        assert!(serde_json::to_string(&v["params"]["update"]["_meta"]["coda"]).unwrap().len() < 4096);
    }

    #[test]
    fn other_frames_are_not_touched_and_a_bad_meta_is_replaced() {
        let facts = Facts { context_tokens: Some(1), ..Facts::default() };
        let mut other = json!({"params":{"update":{"sessionUpdate":"agent_message_chunk"}}});
        let before = other.clone();
        assert!(!facts.stamp(&mut other));
        assert_eq!(other, before);
        assert!(!facts.stamp(&mut json!({"params":7})));
        let mut v = json!({"params":{"update":{"sessionUpdate":"usage_update","_meta":"no"}}});
        assert!(facts.stamp(&mut v));
        assert_eq!(v["params"]["update"]["_meta"], json!({"coda":{"contextTokens":1}}));
    }

    #[test]
    fn a_cache_ttl_is_written_only_when_it_looks_like_a_duration() {
        let mut f = Facts { cache_ttl: Some("PT1H".into()), ..Facts::default() };
        assert_eq!(f.to_json().get("cacheTtl"), Some(&json!("PT1H")));
        f.cache_ttl = Some("x".repeat(5000));
        assert!(f.to_json().get("cacheTtl").is_none());
    }

    #[test]
    fn the_shims_own_update_has_acps_fields_and_the_facts() {
        let f = Facts { context_tokens: Some(900), ..Facts::default() };
        let v = f.update("s9", 900, 128_000).value().clone();
        assert_eq!(v["params"]["sessionId"], "s9");
        assert_eq!(
            v["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":900,"size":128000,"_meta":{"coda":{"contextTokens":900}}})
        );
    }
}

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
use crate::json::View;

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
    // RFC 3339 in UTC with three digits of the second's fraction, always.
    Some(format!("{at:.3}"))
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

    /// [`Facts::to_json`] written as JSON text (its keys in the order a `Map` keeps them), without building it.
    fn write_json(&self, out: &mut Vec<u8>) {
        let mut first = true;
        let mut key = |out: &mut Vec<u8>, name: &str| {
            out.extend_from_slice(if first { b"{\"" } else { b",\"" });
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            first = false;
        };
        if let Some(ttl) = self.cache_ttl.as_ref().filter(|t| t.len() <= CACHE_TTL_MAX && t.starts_with('P')) {
            key(out, "cacheTtl");
            out.extend_from_slice(Value::from(ttl.as_str()).to_string().as_bytes());
        }
        if let Some(at) = self.compacted_at.and_then(iso) {
            key(out, "compactedAt");
            out.extend_from_slice(format!("\"{at}\"").as_bytes());
        }
        if let Some(n) = self.context_tokens {
            key(out, "contextTokens");
            out.extend_from_slice(n.to_string().as_bytes());
        }
        if let Some(at) = self.last_request_at.and_then(iso) {
            key(out, "lastRequestAt");
            out.extend_from_slice(format!("\"{at}\"").as_bytes());
        }
        if first {
            out.push(b'{');
        }
        out.push(b'}');
    }

    /// [`Facts::stamp`] on a frame: the `usage_update` with the facts written in, its bytes as they were
    /// around them (the CLI's key order and number spellings kept; nothing parsed but the `_meta` of its
    /// `update`). `None` for a frame that is no `usage_update`. A frame with a lone surrogate escape is
    /// parsed and written again, as every frame a layer edits (the escape written as U+FFFD).
    pub fn stamp_frame(&self, frame: &Frame) -> Option<Frame> {
        if frame.session_update() != Some("usage_update") {
            return None;
        }
        if frame.lone_surrogate() {
            return self.stamp_value(frame);
        }
        let line = frame.bytes();
        let update = frame.update_value()?;
        let mut facts = Vec::with_capacity(128);
        self.write_json(&mut facts);
        // What replaces `line[cut]`: `_meta` added to `update`, `coda` added to `_meta` or its value replaced,
        // or a `_meta` that is no object replaced. A key twice (which one a reader keeps is its own choice)
        // is left to the parsed value's rules.
        // The member `name` of `v`, and whether it is the only one of that name.
        fn only<'a>(v: View<'a>, name: &str) -> (Option<View<'a>>, bool) {
            let mut found = v.members().filter(|(k, _)| k.is(name)).map(|(_, v)| v);
            let first = found.next();
            (first, found.next().is_none())
        }
        let (cut, with): (std::ops::Range<usize>, Vec<u8>) = match only(update, "_meta") {
            (None, _) => {
                let end = update.range_in(line)?.end - 1;
                (end..end, [&b",\"_meta\":{\"coda\":"[..], &facts, b"}"].concat())
            }
            (Some(meta), true) if meta.text().first() == Some(&b'{') => match only(meta, "coda") {
                (None, _) => {
                    let end = meta.range_in(line)?.end - 1;
                    let comma: &[u8] = if meta.members().next().is_some() { b"," } else { b"" };
                    (end..end, [comma, b"\"coda\":", &facts].concat())
                }
                (Some(coda), true) => (coda.range_in(line)?, facts),
                (Some(_), false) => return self.stamp_value(frame),
            },
            (Some(meta), true) => (meta.range_in(line)?, [&b"{\"coda\":"[..], &facts, b"}"].concat()),
            (Some(_), false) => return self.stamp_value(frame),
        };
        Some(Frame::built([&line[..cut.start], &with, &line[cut.end..]].concat()))
    }

    /// [`Facts::stamp`] on the frame's parsed value, written out again.
    fn stamp_value(&self, frame: &Frame) -> Option<Frame> {
        let mut v = frame.to_value();
        self.stamp(&mut v).then(|| frame.rewritten(v))
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

    /// The facts written into a frame's bytes give the value [`Facts::stamp`] gives, whatever the update's
    /// `_meta` is (none, an object with or without `coda`, no object, a key twice or escaped), with space
    /// anywhere, lone surrogates and numbers beyond f64.
    #[test]
    fn a_frame_stamped_in_place_reads_as_the_stamped_value() {
        let all = Facts {
            last_request_at: Some(at(1_793_149_572_418)),
            context_tokens: Some(53_000),
            compacted_at: Some(at(0)),
            cache_ttl: Some("PT1H \"\\ \u{1}".into()),
        };
        let facts = [all, Facts { context_tokens: Some(7), ..Facts::default() }, Facts::default()];
        let updates = [
            r#"{"sessionUpdate":"usage_update","used":1,"size":2}"#,
            r#"{"sessionUpdate":"usage_update"}"#,
            r#" { "sessionUpdate" : "usage_update" , "used" : 1e400 , "_meta" : { "x" : [ 1 ] } } "#,
            r#"{"_meta":{},"sessionUpdate":"usage_update"}"#,
            r#"{"_meta":{ },"sessionUpdate":"usage_update"}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"coda":{"old":true},"y":"\ud800"}}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"coda":"no","z":{"coda":1}}}"#,
            r#"{"sessionUpdate":"usage_update","_meta":"no"}"#,
            r#"{"sessionUpdate":"usage_update","_meta":null}"#,
            r#"{"sessionUpdate":"usage_update","_meta":[{"coda":1}]}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"a":1},"_meta":{"b":2}}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"coda":1,"coda":2}}"#,
            r#"{"sessionUpdate":"usage_update","_m\u0065ta":{"c\u006fda":1,"k":"v"}}"#,
        ];
        let mut spliced = 0;
        for update in updates {
            for (before, after) in [("", ""), (r#""x":"\ud83d","#, r#","w":{"update":{}}"#)] {
                let line = format!(
                    r#"{{"jsonrpc":"2.0", "method":"session/update","params":{{{before}"sessionId":"s1","update":{update}{after}}}}}"#
                );
                let frame = Frame::parse(line.clone().into_bytes()).expect("a frame");
                for facts in &facts {
                    let mut want = frame.to_value();
                    assert!(facts.stamp(&mut want), "{line}");
                    let got = facts.stamp_frame(&frame).expect("a usage_update");
                    assert_eq!(got.value(), &want, "{line}");
                    assert!(got.is_shim());
                    // In place, the bytes before `update` are the CLI's (parsed and written again, the space
                    // is gone).
                    let head = &line.as_bytes()[..line.find(r#""update""#).expect("an update")];
                    spliced += usize::from(got.bytes().starts_with(head));
                }
            }
        }
        // All but those with a key twice or a lone surrogate.
        assert_eq!(spliced, 30, "stamped in place");
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"agent_message_chunk"}}}"#;
        assert!(Facts::default().stamp_frame(&Frame::parse(chunk.as_bytes().to_vec()).unwrap()).is_none());
        for facts in &facts {
            let mut text = Vec::new();
            facts.write_json(&mut text);
            assert_eq!(serde_json::from_slice::<Value>(&text).unwrap(), Value::Object(facts.to_json()));
        }
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

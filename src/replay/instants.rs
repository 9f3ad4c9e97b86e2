//! The instants of Coda's usage facts in a fixture: `lastRequestAt` and `compactedAt` under `_meta.coda` of
//! what the client received are times of the day it was recorded, so the recorder writes each distinct one as
//! `{{AT_<n>}}` (numbered in order of first sight). On replay a placeholder named `AT_…` binds only to an ISO
//! 8601 UTC instant with milliseconds (`2026-10-28T01:06:12.418Z`), and the same name to the same instant
//! each time: a fact that must stay the same across updates (`compactedAt`) is checked to, on any day.

use crate::HashMap;

use serde_json::Value;

use super::format::{Body, Record};
use crate::trace::Dir;

/// The prefix of the instants' placeholder names.
pub const PREFIX: &str = "AT_";

/// The facts whose values are instants.
const FACTS: [&str; 2] = ["lastRequestAt", "compactedAt"];

/// Whether `s` is an instant as the facts carry it: `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn is_instant(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.into_iter().all(|i| b[i].is_ascii_digit());
    b.len() == 24
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && b[23] == b'Z'
        && s.parse::<jiff::Timestamp>().is_ok()
}

/// Writes the instants of the facts in `records` (shim to client) as `{{AT_<n>}}`.
pub fn placeholders(records: &mut [Record]) {
    let mut names: HashMap<String, String> = HashMap::default();
    for r in records.iter_mut().filter(|r| r.edge == Dir::ShimToClient) {
        let Body::Frame(text) = &mut r.body else { continue };
        if !text.contains("\"coda\"") {
            continue;
        }
        let Ok(value) = crate::json::from_str::<Value>(text) else { continue };
        let Some(coda) = value.pointer("/params/update/_meta/coda").and_then(Value::as_object) else { continue };
        for fact in FACTS {
            let Some(at) = coda.get(fact).and_then(Value::as_str).filter(|s| is_instant(s)) else { continue };
            let next = names.len() + 1;
            let name = names.entry(at.to_owned()).or_insert_with(|| format!("{PREFIX}{next}")).clone();
            *text = text.replace(&format!("\"{at}\""), &format!("\"{{{{{name}}}}}\""));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::format::parse_records;
    use crate::replay::placeholder::{Bindings, match_str};

    #[test]
    fn instants_are_exactly_the_facts_spelling() {
        assert!(is_instant("2026-10-28T01:06:12.418Z"));
        for not in ["2026-10-28T01:06:12Z", "2026-10-28T01:06:12.418+00:00", "2026-13-28T01:06:12.418Z", "", "é"] {
            assert!(!is_instant(not), "{not}");
        }
        assert!(!is_instant(&"9".repeat(24)));
    }

    #[test]
    fn each_distinct_instant_gets_one_name_and_only_facts_of_client_frames_are_touched() {
        let text = [
            r#"{"t":0,"dir":"agent->shim","frame":{"jsonrpc":"2.0","method":"x","params":{"update":{"_meta":{"coda":{"lastRequestAt":"2026-01-01T00:00:00.100Z"}}}}}}"#,
            r#"{"t":1,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"usage_update","used":1e400,"_meta":{"coda":{"lastRequestAt":"2026-01-01T00:00:00.100Z","contextTokens":5}}}}}}"#,
            r#"{"t":2,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"usage_update","_meta":{"coda":{"lastRequestAt":"2026-01-01T00:00:00.200Z","compactedAt":"2026-01-01T00:00:00.100Z"}}}}}}"#,
            r#"{"t":3,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"update":{"_meta":{"coda":{"lastRequestAt":"yesterday"}}}}}}"#,
        ]
        .join("\n");
        let mut records = parse_records(&text).unwrap();
        placeholders(&mut records);
        let frames: Vec<String> =
            records.iter().map(|r| if let Body::Frame(f) = &r.body { f.clone() } else { String::new() }).collect();
        assert!(frames[0].contains("00:00:00.100Z"), "the agent's frames stay");
        assert!(frames[1].contains(r#""lastRequestAt":"{{AT_1}}""#) && frames[1].contains("1e400"), "{}", frames[1]);
        assert!(frames[2].contains(r#""lastRequestAt":"{{AT_2}}","compactedAt":"{{AT_1}}""#), "{}", frames[2]);
        assert!(frames[3].contains("yesterday"));
    }

    #[test]
    fn an_instant_placeholder_binds_only_to_an_instant_and_then_holds() {
        let mut b = Bindings::default();
        assert!(!match_str(r#""{{AT_1}}""#, r#""soon""#, &mut b));
        assert!(match_str(r#"{"a":"{{AT_1}}"}"#, r#"{"a":"2030-02-03T04:05:06.007Z"}"#, &mut b));
        assert!(match_str(r#""{{AT_1}}""#, r#""2030-02-03T04:05:06.007Z""#, &mut b));
        assert!(!match_str(r#""{{AT_1}}""#, r#""2030-02-03T04:05:06.008Z""#, &mut b));
    }
}

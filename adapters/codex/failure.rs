//! Failed turns as Coda's failure kinds (section 执行失败).
//!
//! codex-acp ends a failed turn of an AIR `sessionFailure` client with `stopReason: end_turn` and
//! `_meta.jetbrains.air.sessionFailure {category, severity, title, actions}`; without that declaration a usage
//! limit is a `-32603` error with `data.codexErrorInfo: "usageLimitExceeded"`. Coda gets a JSON-RPC error
//! with the upstream reason as `message` and, where the protocol allows one, `data._meta.coda.failure`.

use std::convert::Infallible;

use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Layer};
use jiff::civil::Date;
use jiff::fmt::strtime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};
use serde_json::{Value, json};

/// What a failed turn is for Coda.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `kind: quota_exhausted`: codex-acp's `limit` with no action is Codex's `usageLimitExceeded`.
    Quota,
    /// `kind: service_unavailable, input: accepted`: the turn ran and ended on a temporary upstream failure.
    Service,
    /// Auth: stays ACP `auth_required` (-32000), never a quota.
    Auth,
    /// A plain error without a kind: policy refusals, bad requests, context or budget overruns, unknowns.
    Plain,
}

/// Classifies a `sessionFailure` record by codex-acp's category and actions (its table `SESSION_FAILURE_POLICY`).
pub fn classify(category: &str, actions: &[&str]) -> Verdict {
    match category {
        "limit" if actions.is_empty() => Verdict::Quota,
        // Rate limiting (any HTTP 429 that is not a usage limit) asks for a retry.
        "limit" if actions.contains(&"retry") => Verdict::Service,
        "service" | "connection" => Verdict::Service,
        "access" => Verdict::Auth,
        _ => Verdict::Plain,
    }
}

/// The error frame Coda gets for a failed turn, `now` being when the shim got Codex's answer, in the zone
/// Codex writes its local times in (`None`: no reset time is marked).
pub fn error_for(id: &Id, verdict: &Verdict, message: &str, upstream: Option<Value>, now: Option<&Zoned>) -> Frame {
    let failure = match verdict {
        Verdict::Quota => Some(json!({"kind": "quota_exhausted"})),
        Verdict::Service => Some(json!({"kind": "service_unavailable", "input": "accepted"})),
        Verdict::Auth => {
            return frame::error_response(id, -32000, message, upstream);
        }
        Verdict::Plain => None,
    };
    let data = match (failure, upstream) {
        (Some(failure), upstream) => {
            let mut data = match upstream {
                Some(Value::Object(map)) => map,
                _ => serde_json::Map::new(),
            };
            let meta = data.entry("_meta").or_insert_with(|| json!({}));
            if !meta.is_object() {
                *meta = json!({});
            }
            meta["coda"] = json!({ "failure": failure });
            Some(Value::Object(data))
        }
        (None, upstream) => upstream,
    };
    let message = match now {
        Some(now) => mark_reset_time(message, now.time_zone(), now.date()),
        None => message.to_owned(),
    };
    frame::error_response(id, -32603, &message, data)
}

/// Codex writes when a limit resets in this machine's local time: "… try again at 5:49 AM." on the day
/// itself, "… try again at Dec 3rd, 2026 5:50 AM." otherwise (seen live from Codex 0.166.0). Coda wants
/// `<t:ISO 8601>` (文字里的时刻), so that phrase is rewritten; the time is Codex's, to the minute, nothing
/// inferred. Anything else is left as it is.
pub fn mark_reset_time(message: &str, tz: &TimeZone, today: Date) -> String {
    const LEAD: &str = "try again at ";
    let Some(at) = message.find(LEAD).map(|i| i + LEAD.len()) else { return message.to_owned() };
    let rest = &message[at..];
    let end = rest.find(['.', '\n']).unwrap_or(rest.len());
    let phrase = rest[..end].trim();
    let Some(utc) = reset_instant(phrase, tz, today) else { return message.to_owned() };
    format!("{}<t:{}>{}", &message[..at], utc.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"), &rest[end..])
}

fn reset_instant(phrase: &str, tz: &TimeZone, today: Date) -> Option<jiff::Timestamp> {
    let local = match strtime::parse("%I:%M %p", phrase).and_then(|t| t.to_time()) {
        Ok(time) => today.to_datetime(time),
        Err(_) => {
            // "Dec 3rd, 2026 5:50 AM": the day carries an English ordinal suffix.
            let (month_day, tail) = phrase.split_once(", ")?;
            let day = month_day.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            strtime::parse("%b %d, %Y %I:%M %p", format!("{day}, {tail}")).and_then(|t| t.to_datetime()).ok()?
        }
    };
    local.to_zoned(tz.clone()).ok().map(|z| z.timestamp())
}

/// The answer Coda gets instead of `reply`, if `reply` ends a failed turn (`now`: see [`error_for`]).
pub fn translate(id: &Id, reply: &Value, now: Option<&Zoned>) -> Option<Frame> {
    if let Some(failure) = reply.pointer("/result/_meta/jetbrains/air/sessionFailure") {
        // A warning is a retry that was still under way; only an error ends the turn.
        if failure.get("severity").and_then(Value::as_str) != Some("error") {
            return None;
        }
        let category = failure.get("category").and_then(Value::as_str).unwrap_or("unknown");
        let actions: Vec<&str> =
            failure.get("actions").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let verdict = classify(category, &actions);
        let title = failure.get("title").and_then(Value::as_str).filter(|t| !t.trim().is_empty());
        let details = failure.get("details").and_then(Value::as_str).filter(|t| !t.trim().is_empty());
        let message = match (title, details) {
            (Some(t), Some(d)) => format!("{t}\n{d}"),
            (Some(t), None) => t.to_owned(),
            (None, Some(d)) => d.to_owned(),
            (None, None) => format!("Codex failed ({category})"),
        };
        let upstream = json!({"codex": {"category": category, "actions": actions}});
        return Some(error_for(id, &verdict, &message, Some(upstream), now));
    }
    let error = reply.get("error")?;
    if error.get("code").and_then(Value::as_i64) != Some(-32603)
        || error.pointer("/data/codexErrorInfo").and_then(Value::as_str) != Some("usageLimitExceeded")
    {
        return None;
    }
    let message = error
        .pointer("/data/message")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .or_else(|| error.get("message").and_then(Value::as_str))
        .unwrap_or("usage limit reached");
    Some(error_for(id, &Verdict::Quota, message, error.get("data").cloned(), now))
}

/// Watches `session/prompt` answers (the stack's request table says which answers those are) and rewrites
/// failed ones.
pub struct Failure {
    /// The zone Codex writes local times in: the machine's, read once at set-up and handed in (Codex runs
    /// as the shim's child, in its environment).
    zone: TimeZone,
}

impl Failure {
    pub fn new(zone: TimeZone) -> Failure {
        Failure { zone }
    }
}

impl Layer for Failure {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Response { id } = frame.kind() else { return cx.to_client(frame) };
        if !cx.answer_to(&frame).is_some_and(|r| r.is("session/prompt")) {
            return cx.to_client(frame);
        }
        if !frame.contains(b"sessionFailure") && !frame.contains(b"usageLimitExceeded") {
            return cx.to_client(frame);
        }
        let id = id.clone();
        let v = frame.value();
        // The day of a reset time Codex gives without one is the day the shim got the answer: the engine's
        // wall time, in the zone handed in at set-up (a layer reads neither clock nor zone itself).
        let now = Timestamp::try_from(cx.wall()).ok().map(|t| t.to_zoned(self.zone.clone()));
        match translate(&id, v, now.as_ref()) {
            Some(error) => cx.to_client(error),
            None => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Response { .. })
    }
}

#[cfg(test)]
mod reset_time_tests {
    use super::*;

    fn mark(message: &str) -> String {
        let tz = TimeZone::get("Asia/Shanghai").expect("the bundled tz database has it");
        mark_reset_time(message, &tz, Date::constant(2026, 11, 30))
    }

    #[test]
    fn codex_reset_times_become_coda_time_marks() {
        let head = "You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/settings/usage to purchase more credits or try again at ";
        assert_eq!(mark(&format!("{head}5:49 AM.")), format!("{head}<t:2026-11-29T21:49:00.000Z>."));
        assert_eq!(mark(&format!("{head}Dec 3rd, 2026 5:50 PM.")), format!("{head}<t:2026-12-03T09:50:00.000Z>."));
        assert_eq!(mark(&format!("{head}Jan 1st, 2027 12:05 AM.")), format!("{head}<t:2026-12-31T16:05:00.000Z>."));
    }

    #[test]
    fn other_wording_is_left_alone() {
        for m in ["… or try again later.", "try again at some point.", "no time here", "try again at 25:99 XM."] {
            assert_eq!(mark(m), m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(failure: Value) -> Value {
        json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn","usage":null,
            "_meta":{"jetbrains":{"air":{"version":1,"sessionFailure":failure}},"quota":{"model_usage":[],"token_count":null}}}})
    }

    fn error_of(frame: &Frame) -> Value {
        frame.value().get("error").cloned().unwrap_or(Value::Null)
    }

    #[test]
    fn usage_limit_is_quota_exhausted() {
        let r = reply(json!({"actions":[],"category":"limit","id":"t:error","revision":1,"severity":"error",
            "title":"You’ve hit your usage limit. Try again later."}));
        let out = translate(&Id::from_json("3"), &r, None).expect("a failure");
        assert_eq!(
            error_of(&out),
            json!({"code":-32603,"message":"You’ve hit your usage limit. Try again later.",
                "data":{"codex":{"category":"limit","actions":[]},"_meta":{"coda":{"failure":{"kind":"quota_exhausted"}}}}})
        );
    }

    #[test]
    fn rate_limit_server_error_and_overload_are_service_unavailable_input_accepted() {
        for (category, actions) in
            [("limit", json!(["retry"])), ("service", json!(["retry", "new_session"])), ("service", json!(["retry"]))]
        {
            let r = reply(json!({"actions":actions,"category":category,"severity":"error","title":"busy"}));
            let e = error_of(&translate(&Id::from_json("3"), &r, None).expect("a failure"));
            assert_eq!(e["code"], -32603);
            assert_eq!(e["message"], "busy");
            assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"service_unavailable","input":"accepted"}));
        }
    }

    #[test]
    fn policy_bad_request_and_context_overrun_are_plain_errors_without_a_kind() {
        for (category, actions) in [("request", json!([])), ("limit", json!(["new_session"])), ("unknown", json!([]))] {
            let r = reply(json!({"actions":actions,"category":category,"severity":"error","title":"no"}));
            let e = error_of(&translate(&Id::from_json("3"), &r, None).expect("a failure"));
            assert_eq!(e["code"], -32603);
            assert!(e.pointer("/data/_meta/coda").is_none(), "{e}");
        }
    }

    #[test]
    fn auth_is_never_a_quota() {
        let r = reply(json!({"actions":["login"],"category":"access","severity":"error","title":"log in"}));
        let e = error_of(&translate(&Id::from_json("3"), &r, None).expect("a failure"));
        assert_eq!(e["code"], -32000);
        assert!(e.pointer("/data/_meta/coda").is_none());
        let plain = json!({"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"Authentication required"}});
        assert!(translate(&Id::from_json("7"), &plain, None).is_none());
    }

    #[test]
    fn a_warning_or_a_clean_turn_is_left_alone() {
        let r = reply(json!({"actions":[],"category":"connection","severity":"warning","title":"Reconnecting... 1/5"}));
        assert!(translate(&Id::from_json("3"), &r, None).is_none());
        let ok = json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}});
        assert!(translate(&Id::from_json("3"), &ok, None).is_none());
    }

    #[test]
    fn usage_limit_error_without_session_failure_keeps_upstream_data() {
        let r = json!({"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"Internal error",
            "data":{"message":"You’ve hit your usage limit.","codexErrorInfo":"usageLimitExceeded"}}});
        let e = error_of(&translate(&Id::from_json("4"), &r, None).expect("a failure"));
        assert_eq!(
            e,
            json!({"code":-32603,"message":"You’ve hit your usage limit.","data":{"message":"You’ve hit your usage limit.",
                "codexErrorInfo":"usageLimitExceeded","_meta":{"coda":{"failure":{"kind":"quota_exhausted"}}}}})
        );
        let other = json!({"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"Internal error",
            "data":{"codexErrorInfo":"badRequest"}}});
        assert!(translate(&Id::from_json("4"), &other, None).is_none());
    }

    /// The day of a time-only reset comes from the engine's wall time and the zone handed in, never from this
    /// machine's clock or zone: the harness's wall is 2026-01-01T00:00:00Z, which is still 2025-12-31 in Honolulu.
    #[test]
    fn a_reset_time_takes_its_day_from_the_engine_and_its_zone_from_set_up() {
        let honolulu = TimeZone::get("Pacific/Honolulu").expect("the bundled tz database has it");
        let title = "You’ve hit your usage limit. Upgrade to Pro or try again at 5:49 PM.";
        let failed = reply(json!({"actions":[],"category":"limit","severity":"error","title":title})).to_string();
        let parse = |s: &str| Frame::parse(s.as_bytes().to_vec()).expect("frame");
        let prompt = r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{}}"#;
        for (zone, days, want) in [
            (honolulu.clone(), 0, "<t:2026-01-01T03:49:00.000Z>"),
            (TimeZone::UTC, 0, "<t:2026-01-01T17:49:00.000Z>"),
            (honolulu, 3, "<t:2026-01-04T03:49:00.000Z>"),
        ] {
            let mut h = crate::layer::testing::Harness::of(Failure::new(zone));
            h.advance(std::time::Duration::from_secs(days * 86_400));
            h.client_frame(parse(prompt));
            h.agent_frame(parse(&failed));
            let got = error_of(&h.take().to_client[0]);
            assert_eq!(got["message"], title.replace("5:49 PM", want), "{days} days on");
        }
    }

    #[test]
    fn only_prompt_answers_are_rewritten() {
        let mut h = crate::layer::testing::Harness::of(Failure::new(TimeZone::UTC));
        let parse = |s: &str| Frame::parse(s.as_bytes().to_vec()).expect("frame");
        h.client_frame(parse(r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{}}"#));
        h.client_frame(parse(r#"{"jsonrpc":"2.0","id":9,"method":"session/set_mode","params":{}}"#));
        let failed = reply(json!({"actions":[],"category":"limit","severity":"error","title":"limit"})).to_string();
        // Same shape under another id: not a prompt answer, untouched.
        let other = failed.replace("\"id\":3", "\"id\":9");
        h.agent_frame(parse(&other));
        h.agent_frame(parse(&failed));
        let exits = h.take();
        assert_eq!(exits.to_client[0].bytes(), other.as_bytes());
        assert_eq!(error_of(&exits.to_client[1])["data"]["_meta"]["coda"]["failure"]["kind"], "quota_exhausted");
    }
}

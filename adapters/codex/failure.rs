//! Failed turns as Coda's failure kinds (section 执行失败): where codex-acp's failure signals are.
//!
//! codex-acp ends a failed turn of an AIR `sessionFailure` client with `stopReason: end_turn` and
//! `_meta.jetbrains.air.sessionFailure {category, severity, title, actions}`; without that declaration a usage
//! limit is a `-32603` error with `data.codexErrorInfo: "usageLimitExceeded"`. A retry Codex makes is a
//! `session_info_update` with a `sessionFailure` of severity `warning` (its id `<turnId>:error`).
//!
//! The record names codex-acp's category and actions, not Codex's error (its `codexErrorInfo`), and one pair may
//! stand for several errors (codex-acp's `SESSION_FAILURE_POLICY`):
//!
//! | category, actions | Codex's errors | Coda |
//! | --- | --- | --- |
//! | `limit`, `[]` | `usageLimitExceeded` | `quota_exhausted` |
//! | `limit`, `["retry"]` | `rateLimitExceeded`, any HTTP 429 (a quota too) | plain |
//! | `service`, `["retry"]` | `serverOverloaded`, `flexUnavailable`, `tooManyDenials`, sandbox and rollback errors, `other`, and every code codex-acp's table lacks (Codex 0.171's `inferenceHookDenied` and `bioPolicy`, `modelNotFound`, `policyCapacityUnavailable`) | `service_unavailable` only for `serverOverloaded` (its title, Codex's own words for it); else plain |
//! | `service`, `["retry","new_session"]` | `internalServerError` (any HTTP 500), adapter errors | plain |
//! | `connection` | transport lost (502, 529, a dropped stream) | plain |
//! | `access` | login | -32000 |
//! | `request` | policy refusals, bad requests | plain |
//!
//! Only an explicit temporary-service signal is `service_unavailable`: Coda retries those, and a sandbox error
//! retried three times never succeeds. Codex 0.171's two new codes are refusals no retry fixes:
//! `inferenceHookDenied` is the workspace's inference hook blocking the request ("Your workspace inference hook
//! blocked this request."), `bioPolicy` OpenAI's biological-risk policy ("This content was flagged for possible
//! biological risk."); neither is a quota nor a login problem, so both are plain errors. A rate limit
//! (`limit`, `["retry"]`) is plain too: codex-acp gives every HTTP 429 that record, a used-up quota included, so
//! it names neither kind explicitly (a quota must never be reported `service_unavailable`).

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use crate::coda::failure::{Failure, Kind, Retry, Signal, Signals, Verdict};
use crate::frame::{Frame, Needle};
use jiff::civil::Date;
use jiff::fmt::strtime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};
use serde_json::{Value, json};

/// The key of codex-acp's failure record (`update._meta.jetbrains.air.sessionFailure`): its searcher built once.
static SESSION_FAILURE: Needle = crate::needle!(b"\"sessionFailure\"");
static USAGE_LIMIT: Needle = crate::needle!(b"usageLimitExceeded");

/// Codex's title for `serverOverloaded` (codex 0.166: "Selected model is at capacity."), the one `service`
/// record that says the server is temporarily unable to serve.
const OVERLOADED: &str = "Selected model is at capacity. Please try a different model.";

/// What a `sessionFailure` record is for Coda, by codex-acp's category and actions and (for `service`) the title.
pub fn classify(category: &str, actions: &[&str], title: &str) -> Verdict {
    match category {
        "limit" if actions.is_empty() => Verdict::Kind(Kind::Quota),
        "service" if actions == ["retry"] && title == OVERLOADED => Verdict::Kind(Kind::SERVICE),
        "access" => Verdict::Auth,
        _ => Verdict::Plain,
    }
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
    format!("{}{}{}", &message[..at], crate::coda::failure::time_mark(utc), &rest[end..])
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

/// The failure `reply` (codex-acp's answer to a prompt) ends its turn with, `now` being when the shim got it, in
/// the zone Codex writes its local times in (`None`: no reset time is marked).
pub fn translate(reply: &Value, now: Option<&Zoned>) -> Option<Failure> {
    let mark = |message: &str| match now {
        Some(now) => mark_reset_time(message, now.time_zone(), now.date()),
        None => message.to_owned(),
    };
    if let Some(failure) = reply.pointer("/result/_meta/jetbrains/air/sessionFailure") {
        // A warning is a retry that was still under way; only an error ends the turn.
        if failure.get("severity").and_then(Value::as_str) != Some("error") {
            return None;
        }
        let (category, actions, title) = record(failure);
        let details = failure.get("details").and_then(Value::as_str).filter(|t| !t.trim().is_empty());
        let message = match (title.filter(|t| !t.trim().is_empty()), details) {
            (Some(t), Some(d)) => format!("{t}\n{d}"),
            (Some(t), None) => t.to_owned(),
            (None, Some(d)) => d.to_owned(),
            (None, None) => format!("Codex failed ({category})"),
        };
        let verdict = classify(category, &actions, title.unwrap_or_default());
        let data = json!({"codex": {"category": category, "actions": actions}});
        // A login problem keeps Codex's words as they are.
        let message = if verdict == Verdict::Auth { message } else { mark(&message) };
        return Some(Failure { verdict, message, data: Some(data) });
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
    Some(Failure { verdict: Verdict::Kind(Kind::Quota), message: mark(message), data: error.get("data").cloned() })
}

/// A `sessionFailure` record's category, actions and title.
fn record(failure: &Value) -> (&str, Vec<&str>, Option<&str>) {
    let category = failure.get("category").and_then(Value::as_str).unwrap_or("unknown");
    let actions =
        failure.get("actions").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    (category, actions, failure.get("title").and_then(Value::as_str))
}

/// The end of the id of a retry warning's record (`<turnId>:error`), with its closing quote.
static ERROR_ID: Needle = crate::needle!(b":error\"");

/// The retry a `session_info_update`'s `sessionFailure` record of `session` says: a warning of the turn's error
/// incident (a notice's id is `…:notice:…`).
fn retry_of(failure: &Value, session: &str) -> Option<Signal<Infallible>> {
    let incident = failure.get("id").and_then(Value::as_str).is_some_and(|id| id.ends_with(":error"));
    if failure.get("severity").and_then(Value::as_str) != Some("warning") || !incident {
        return None;
    }
    let (category, actions, title) = record(failure);
    Some(Signal::Retrying {
        session: session.to_owned(),
        retry: Retry {
            reason: title.unwrap_or_default().to_owned(),
            verdict: classify(category, &actions, title.unwrap_or_default()),
            at_ms: None,
            wait_ms: None,
            attempt: None,
            attempts: None,
            data: Some(json!({"codex": {"category": category, "actions": actions, "stopped": true}})),
        },
    })
}

/// Where codex-acp's failure signals are: its prompt answers, and the retry warnings before them.
pub struct Codex {
    /// The zone Codex writes local times in: the machine's, read once at set-up and handed in (Codex runs
    /// as the shim's child, in its environment).
    zone: TimeZone,
}

impl Codex {
    pub fn new(zone: TimeZone) -> Codex {
        Codex { zone }
    }
}

impl Signals for Codex {
    type Event = Infallible;
    type Record = Infallible;

    /// A `session_info_update` whose update may hold a retry warning, the one record acted on: its record's id
    /// ends in `:error`, so an update whose bytes hold no `:error"` (looked for in the update alone: a frame's
    /// envelope does not hold it), in a line with no `\u` escape that could spell one, is one of codex-acp's
    /// notices (most of its `session_info_update`s), passed on without reading its record. One search, where a
    /// look for the `sessionFailure` key and then for the id took two.
    fn wants(&self, frame: &Frame) -> bool {
        frame.session_update() == Some("session_info_update")
            && (frame.unicode_escaped() || frame.update_value().is_some_and(|u| ERROR_ID.is_in(u.text())))
    }

    fn from_agent(&mut self, frame: &Frame, out: &mut Vec<Signal<Infallible>>) {
        // Read where it lies: the session from the frame check's one pass, the failure record alone parsed.
        let Some(session) = frame.session() else { return };
        let failure = frame.update_value().and_then(|u| u.pointer(&["_meta", "jetbrains", "air", "sessionFailure"]));
        let Some(failure) = failure.map(|f| f.to_value()) else { return };
        out.extend(retry_of(&failure, &session));
    }

    fn failure(&self, answer: &Frame, _: Option<Infallible>, wall: SystemTime) -> Option<Failure> {
        // (An answer with a `\u` escape is read: one may spell either.)
        if !answer.has(&SESSION_FAILURE) && !answer.has(&USAGE_LIMIT) && !answer.unicode_escaped() {
            return None;
        }
        // The day of a reset time Codex gives without one is the day the shim got the answer: the engine's
        // wall time, in the zone handed in at set-up (a layer reads neither clock nor zone itself).
        let now = Timestamp::try_from(wall).ok().map(|t| t.to_zoned(self.zone.clone()));
        translate(answer.value(), now.as_ref())
    }

    fn retrying(&self, _: &Retry, _: Duration) -> String {
        "Codex was retrying without an answer".to_owned()
    }
}

/// coda-codex's failure layer.
pub type Failures = crate::coda::failure::FailureKinds<Codex>;

/// The layer, in the zone Codex writes local times in, stopping retries after `patience`.
pub fn layer(zone: TimeZone, patience: Duration) -> Failures {
    crate::coda::failure::FailureKinds::new(Codex::new(zone), patience)
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
    use crate::frame::Id;

    /// The retry warnings read behind the byte checks are those of the parsed record, for every frame of every
    /// recorded fixture, the hostile lines, and records whose id is escaped, spaced or repeated, or whose key is
    /// escaped: a frame the layer does not want holds none.
    #[test]
    fn retry_warnings_are_read_as_the_parsed_record_says() {
        let mut lines = crate::frame::recorded_lines();
        lines.extend(crate::frame::hostile_lines());
        let keyed = |key: &str, id: &str, severity: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"session_info_update","_meta":{{"jetbrains":{{"air":{{"version":1,{key}:{{"id":{id},"revision":1,"category":"service","severity":{severity},"title":"Selected model is at capacity. Please try a different model.","actions":["retry"]}}}}}}}}}}}}}}"#
            )
        };
        let record = |id: &str, severity: &str| keyed(r#""sessionFailure""#, id, severity);
        lines.push(keyed(r#""session\u0046ailure""#, r#""t1:error""#, r#""warning""#).into_bytes());
        lines.push(keyed(r#""sessionFailur\u0065""#, r#""t1:notice""#, r#""warning""#).into_bytes());
        for (id, severity) in [
            (r#""t1:error""#, r#""warning""#),
            (r#""t1:notice:a:1""#, r#""warning""#),
            (r#""t1:error""#, r#""error""#),
            (r#""t1\u003aerror""#, r#""warning""#),
            (r#""t1:erro\u0072""#, r#""warn\u0069ng""#),
            (r#""t1:error" , "id" : "t1:notice""#, r#""warning""#),
            (r#""t1:notice" , "id" : "t1:error""#, r#""warning""#),
            (r#""t1:error\ud800""#, r#""warning""#),
            (r#"1"#, r#""warning""#),
        ] {
            lines.push(record(id, severity).into_bytes());
        }
        let mut codex = Codex::new(TimeZone::UTC);
        let mut retries = 0;
        for line in lines {
            let Ok(frame) = Frame::parse(line) else { continue };
            let v = frame.value();
            let failure = v.pointer("/params/update/_meta/jetbrains/air/sessionFailure");
            let session = v.pointer("/params/sessionId").and_then(Value::as_str);
            // (codex-acp's records come in `session_info_update`s: only those are read.)
            let is_info = frame.session_update() == Some("session_info_update");
            let want: Vec<_> =
                failure.zip(session).filter(|_| is_info).and_then(|(f, s)| retry_of(f, s)).into_iter().collect();
            let mut got = Vec::new();
            if codex.wants(&frame) {
                codex.from_agent(&frame, &mut got);
            }
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "{frame:?}");
            retries += got.len();
        }
        assert_eq!(retries, 5, "the retry warnings");
    }

    fn reply(failure: Value) -> Value {
        json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn","usage":null,
            "_meta":{"jetbrains":{"air":{"version":1,"sessionFailure":failure}},"quota":{"model_usage":[],"token_count":null}}}})
    }

    fn error_of(frame: &Frame) -> Value {
        frame.value().get("error").cloned().unwrap_or(Value::Null)
    }

    /// The answer to prompt 3 that Coda gets for `reply`, if it is a failure.
    fn answered(reply: &Value) -> Option<Frame> {
        translate(reply, None).map(|f| f.answer(&Id::from_json("3")))
    }

    /// A prompt's answer whose failure record's key is written with an escape is read as the one without.
    #[test]
    fn an_answers_record_under_an_escaped_key_is_read() {
        let r =
            reply(json!({"actions":[],"category":"limit","severity":"error","title":"You’ve hit your usage limit."}));
        let plain = Frame::from_value(&r);
        let line = String::from_utf8_lossy(plain.bytes()).replace(r#""sessionFailure""#, r#""session\u0046ailure""#);
        assert!(line.contains(r"\u0046"), "{line}");
        let escaped = Frame::parse(line.into_bytes()).expect("a line");
        let codex = Codex::new(TimeZone::UTC);
        let wall = std::time::UNIX_EPOCH;
        let [plain, escaped] =
            [plain, escaped].map(|f| codex.failure(&f, None, wall).map(|f| f.answer(&Id::from_json("3"))));
        assert!(plain.is_some(), "the plain record is a failure");
        assert_eq!(escaped.map(|f| f.value().clone()), plain.map(|f| f.value().clone()));
    }

    #[test]
    fn usage_limit_is_quota_exhausted() {
        let r = reply(json!({"actions":[],"category":"limit","id":"t:error","revision":1,"severity":"error",
            "title":"You’ve hit your usage limit. Try again later."}));
        let out = answered(&r).expect("a failure");
        assert_eq!(
            error_of(&out),
            json!({"code":-32603,"message":"You’ve hit your usage limit. Try again later.",
                "data":{"codex":{"category":"limit","actions":[]},"_meta":{"coda":{"failure":{"kind":"quota_exhausted"}}}}})
        );
    }

    #[test]
    fn only_codexs_overloaded_record_is_service_unavailable() {
        let r = reply(json!({"actions":["retry"],"category":"service","severity":"error","title":OVERLOADED}));
        let e = error_of(&answered(&r).expect("a failure"));
        assert_eq!((&e["code"], &e["message"]), (&json!(-32603), &json!(OVERLOADED)));
        assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"service_unavailable","input":"accepted"}));
        // The same category and actions hold sandbox and rollback errors; a 429 may be a quota; a 500 or a lost
        // connection says nothing of the service: none is retried by Coda.
        for (category, actions, title) in [
            ("service", json!(["retry"]), "sandbox error: command was killed by a signal"),
            ("service", json!(["retry"]), "thread rollback failed"),
            ("limit", json!(["retry"]), "exceeded retry limit, last status: 429 Too Many Requests"),
            ("service", json!(["retry", "new_session"]), "We’re currently experiencing high demand"),
            ("connection", json!(["retry", "new_session"]), "unexpected status 502 Bad Gateway"),
        ] {
            let r = reply(json!({"actions":actions,"category":category,"severity":"error","title":title}));
            let e = error_of(&answered(&r).expect("a failure"));
            assert_eq!((&e["code"], &e["message"]), (&json!(-32603), &json!(title)));
            assert!(e.pointer("/data/_meta/coda").is_none(), "{title}: {e}");
        }
    }

    #[test]
    fn policy_bad_request_and_context_overrun_are_plain_errors_without_a_kind() {
        for (category, actions) in [("request", json!([])), ("limit", json!(["new_session"])), ("unknown", json!([]))] {
            let r = reply(json!({"actions":actions,"category":category,"severity":"error","title":"no"}));
            let e = error_of(&answered(&r).expect("a failure"));
            assert_eq!(e["code"], -32603);
            assert!(e.pointer("/data/_meta/coda").is_none(), "{e}");
        }
    }

    /// Codex 0.171's new codes, as codex-acp 2.6.0 records them (a code its table lacks is `provider_error`:
    /// `service`, `["retry"]`, Codex's message as the title), and the other codes it lacks: refusals and
    /// configuration errors that no retry fixes, so plain errors.
    #[test]
    fn codex_0171s_new_refusals_are_plain_errors() {
        for title in [
            "Your workspace inference hook blocked this request.",
            "This content was flagged for possible biological risk.",
            "This request has been flagged for possible biological risk.",
            "The model `gpt-9` does not exist or you do not have access to it.",
            "policy-restricted capacity unavailable",
        ] {
            let r = reply(json!({"actions":["retry"],"category":"service","id":"t:error","revision":1,
                "severity":"error","title":title}));
            let e = error_of(&answered(&r).expect("a failure"));
            assert_eq!((&e["code"], &e["message"]), (&json!(-32603), &json!(title)));
            assert!(e.pointer("/data/_meta/coda").is_none(), "{title}: no kind: {e}");
            assert_eq!(e["data"]["codex"], json!({"category":"service","actions":["retry"]}));
        }
        // Without the AIR record codex-acp makes an error answer only of a usage limit: any other code (here as a
        // later codex-acp could pass it on) is left as it is, a plain error.
        for code in ["inferenceHookDenied", "bioPolicy"] {
            let e = json!({"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"Internal error",
                "data":{"message":"blocked","codexErrorInfo":code}}});
            assert!(answered(&e).is_none(), "{code}");
        }
    }

    #[test]
    fn auth_is_never_a_quota() {
        let r = reply(json!({"actions":["login"],"category":"access","severity":"error","title":"log in"}));
        let e = error_of(&answered(&r).expect("a failure"));
        assert_eq!(e["code"], -32000);
        assert!(e.pointer("/data/_meta/coda").is_none());
        let plain = json!({"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"Authentication required"}});
        assert!(answered(&plain).is_none());
    }

    #[test]
    fn a_warning_or_a_clean_turn_is_left_alone() {
        let r = reply(json!({"actions":[],"category":"connection","severity":"warning","title":"Reconnecting... 1/5"}));
        assert!(answered(&r).is_none());
        let ok = json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}});
        assert!(translate(&ok, None).is_none());
    }

    #[test]
    fn usage_limit_error_without_session_failure_keeps_upstream_data() {
        let r = json!({"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"Internal error",
            "data":{"message":"You’ve hit your usage limit.","codexErrorInfo":"usageLimitExceeded"}}});
        let e = error_of(&translate(&r, None).map(|f| f.answer(&Id::from_json("4"))).expect("a failure"));
        assert_eq!(
            e,
            json!({"code":-32603,"message":"You’ve hit your usage limit.","data":{"message":"You’ve hit your usage limit.",
                "codexErrorInfo":"usageLimitExceeded","_meta":{"coda":{"failure":{"kind":"quota_exhausted"}}}}})
        );
        let other = json!({"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"Internal error",
            "data":{"codexErrorInfo":"badRequest"}}});
        assert!(translate(&other, None).is_none());
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
            let mut h = crate::layer::testing::Harness::of(layer(zone, crate::coda::failure::RETRY_PATIENCE));
            h.advance(std::time::Duration::from_secs(days * 86_400));
            h.client_frame(parse(prompt));
            h.agent_frame(parse(&failed));
            let got = error_of(&h.take().to_client[0]);
            assert_eq!(got["message"], title.replace("5:49 PM", want), "{days} days on");
        }
    }

    #[test]
    fn only_prompt_answers_are_rewritten() {
        let mut h = crate::layer::testing::Harness::of(layer(TimeZone::UTC, crate::coda::failure::RETRY_PATIENCE));
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

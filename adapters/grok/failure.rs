//! Failed Grok turns as Coda's failure answer (section 执行失败).
//!
//! Seen live on Grok Build 1.0.41 against OpenAI-shaped upstream errors:
//! - Grok reports each retry as `_x.ai/session_notification` `retry_state {type: "retrying", attempt, max_retries,
//!   reason, error_type}` (no wait), and the end of its retries as `{type: "exhausted", reason, is_rate_limited}`.
//!   The `reason` is `API error (status <code> <text>): [<upstream code>: ]<upstream message>`.
//! - A 429 whose `Retry-After` is 0 ends the turn at once: the prompt is answered with error -32003
//!   `Rate limited`, `data` = the reason. With a real `Retry-After` Grok waits it out silently (two hours for a
//!   usage window); 500, 502, 503 and 529 are retried fifteen times with a backoff that grows to about 30 s
//!   (over six minutes), silent over ACP.
//! - For an upstream answer whose body is not an OpenAI error object (a 503 with a line of text), the reason is
//!   Grok's own `API error (status 503 Service Unavailable): Grok is temporarily unavailable. Please try again in
//!   a moment. (HTTP 503).`: the upstream's status, but none of its body. The body reaches only Grok's stderr
//!   (`chat/completions API error status=503 Service Unavailable … body_preview=<body>`); its log file
//!   (`$GROK_HOME/logs/unified.jsonl`, `shell.turn.inference_retry {attempt, max_retries, kind, reason}`) says
//!   no more than `retry_state`, and the session's `chat_history.jsonl` nothing of the failure.
//!
//! So: the upstream's code and status in a reason (a -32003 answer's `data`, a retry's `reason`) are what Grok
//! passes on of the upstream's reason, read by the rule all binaries share ([`failure::upstream`]); each
//! `retrying` report is a retry of the running turn, and output of the turn is its progress, for the engine's
//! one-minute rule ([`crate::coda::failure`]), which stops the run and answers with the last retry's reason. Grok
//! does not say how long it meant to wait, so no `retryAfterMs`.

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use crate::coda::failure::{self, Failure, REASON_MAX, Retry, Signal, Signals, Verdict};
use crate::frame::Frame;
use crate::json::View;
use serde_json::{Value, json};

/// Grok's error code for a rate-limited turn.
const RATE_LIMITED: i64 = -32003;

/// What a Grok retry or error reason says.
#[derive(Debug, Clone, PartialEq)]
pub struct Reason {
    pub status: Option<u16>,
    /// The upstream's error code, where Grok quotes one (`insufficient_quota`).
    pub code: Option<String>,
    pub text: String,
}

/// Reads `API error (status 429 Too Many Requests): insufficient_quota: You exceeded …`.
pub fn parse_reason(reason: &str) -> Reason {
    let text = reason.to_owned();
    let Some(rest) = reason.strip_prefix("API error (status ") else {
        return Reason { status: None, code: None, text };
    };
    // Three digits, then the status text or the closing parenthesis.
    let status =
        rest.get(..3).filter(|_| matches!(rest.as_bytes().get(3), Some(b' ' | b')'))).and_then(|s| s.parse().ok());
    let after = rest.split_once("): ").map(|(_, a)| a).unwrap_or_default();
    let code = after
        .split_once(": ")
        .map(|(c, _)| c)
        .filter(|c| !c.is_empty() && c.len() <= 64 && c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'))
        .map(str::to_owned);
    Reason { status, code, text }
}

/// What a reason names ([`failure::upstream`]): the upstream's code where Grok quotes one, else the upstream's
/// status. Grok's `error_type` and its own words for a body it could not read ("Grok is temporarily unavailable",
/// for a 502 page too) are no upstream reason: so a 500 or 502 without a code stays a plain error.
pub fn verdict(reason: &Reason) -> Verdict {
    failure::upstream(reason.code.as_deref(), reason.status.map(u64::from))
}

/// The retry a `retry_state` of `session` says: of `type` `retrying`, with its `reason`, `attempt` and
/// `max_retries`.
fn retrying(
    session: &str,
    kind: Option<&str>,
    reason: Option<&str>,
    attempt: Option<u64>,
    attempts: Option<u64>,
) -> Option<Signal<Infallible>> {
    if kind != Some("retrying") {
        return None;
    }
    let reason = reason.unwrap_or_default();
    Some(Signal::Retrying {
        session: session.to_owned(),
        retry: Retry {
            reason: reason.to_owned(),
            verdict: verdict(&parse_reason(reason)),
            // Grok names no wait: the engine's minute decides.
            at_ms: None,
            wait_ms: None,
            attempt: Some(attempt.unwrap_or(0)),
            attempts: Some(attempts.unwrap_or(0)),
            data: Some(json!({"grok": {"stopped": true}})),
        },
    })
}

/// Where Grok's failure signals are: its `retry_state` notifications and its error answers.
pub struct Grok;

impl Signals for Grok {
    type Event = Infallible;
    type Record = Infallible;

    fn wants(&self, frame: &Frame) -> bool {
        frame.session_update() == Some("retry_state") && frame.is_notification("_x.ai/session_notification")
    }

    fn from_agent(&mut self, frame: &Frame, out: &mut Vec<Signal<Infallible>>) {
        // Read where it lies: the session from the frame check's one pass, the update's fields in one pass.
        let Some(session) = frame.session() else { return };
        let (mut kind, mut reason, mut attempt, mut attempts) = (None, None, None, None);
        for (key, value) in frame.update_value().iter().flat_map(View::members) {
            if key.is("type") {
                kind = Some(value);
            } else if key.is("reason") {
                reason = Some(value);
            } else if key.is("attempt") {
                attempt = Some(value);
            } else if key.is("max_retries") {
                attempts = Some(value);
            }
        }
        let count = |v: Option<View<'_>>| v.and_then(|v| v.as_u64());
        let (kind, reason) = (kind.and_then(|v| v.as_str()), reason.and_then(|v| v.as_str()));
        out.extend(retrying(&session, kind.as_deref(), reason.as_deref(), count(attempt), count(attempts)));
    }

    fn failure(&self, answer: &Frame, _: Option<Infallible>, _: SystemTime) -> Option<Failure> {
        let error = answer.value().get("error")?;
        let data = error.get("data").and_then(Value::as_str)?;
        // Seen live: a 401 is `-32603 "Internal error"` with `Unauthorized (401) from <url>: …`: a login problem.
        if data.starts_with("Unauthorized (401)") {
            let message = data.lines().next().unwrap_or(data).to_owned();
            let data = Some(json!({"grok": {"data": failure::clip(data, REASON_MAX)}}));
            return Some(Failure { verdict: Verdict::Auth, message, data });
        }
        if error.get("code").and_then(Value::as_i64) != Some(RATE_LIMITED) {
            return None;
        }
        let reason = parse_reason(data);
        let verdict = verdict(&reason);
        let data = Some(json!({"grok": {"code": RATE_LIMITED, "data": failure::clip(data, REASON_MAX)}}));
        (verdict != Verdict::Plain).then_some(Failure { verdict, message: reason.text, data })
    }

    fn retrying(&self, retry: &Retry, _: Duration) -> String {
        let (attempt, max) = (retry.attempt.unwrap_or(0), retry.attempts.unwrap_or(0));
        format!("Grok was retrying (attempt {attempt} of {max}) without an answer")
    }
}

/// coda-grok's failure layer.
pub type GrokFailure = failure::FailureKinds<Grok>;

/// The layer, stopping retries after `patience` (see [`failure::retry_patience`]).
pub fn layer(patience: Duration) -> GrokFailure {
    failure::FailureKinds::new(Grok, patience)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    /// A retry read where it lies is the one the parsed frame says, for every frame of every recorded fixture,
    /// the hostile lines, and updates with keys twice or escaped, mistyped fields and lone surrogates.
    #[test]
    fn a_retry_read_in_place_is_the_parsed_one() {
        let lines = crate::frame::lines_and_updates(
            "_x.ai/session_notification",
            &[
                r#"{"sessionUpdate":"retry_state","type":"retrying","attempt":2,"attempt":3,"max_retries":"15","reason":"API error (status 503 Service Unavailable)"}"#,
                r#"{"sessionUpdate":"retry_state","typ\u0065":"retr\u0079ing","attempt":-1,"max_retries":1e400,"reason":"\ud800 (status 429)"}"#,
                r#" { "sessionUpdate" : "retry_state" , "type" : "retrying" , "reason" : 7 } "#,
                r#"{"sessionUpdate":"retry_state","type":"exhausted","attempts":0}"#,
            ],
        );
        let mut retries = 0;
        for line in lines {
            let Ok(frame) = Frame::parse(line) else { continue };
            if !Grok.wants(&frame) {
                continue;
            }
            let mut got = Vec::new();
            Grok.from_agent(&frame, &mut got);
            let v = frame.value();
            let update = v.pointer("/params/update").filter(|u| u.is_object());
            let text = |k: &str| update.and_then(|u| u.get(k)).and_then(Value::as_str);
            let count = |k: &str| update.and_then(|u| u.get(k)).and_then(Value::as_u64);
            let want = v
                .pointer("/params/sessionId")
                .and_then(Value::as_str)
                .and_then(|s| retrying(s, text("type"), text("reason"), count("attempt"), count("max_retries")));
            assert_eq!(format!("{got:?}"), format!("{:?}", Vec::from_iter(want)), "{frame:?}");
            retries += got.len();
        }
        assert!(retries > 5, "retries read ({retries})");
    }

    const S: &str = "01a2313e-7dec-70b2-8c5e-50497d2c8462";

    fn parse(v: Value) -> Frame {
        Frame::from_value(&v)
    }

    fn prompt(id: u64) -> Frame {
        parse(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}))
    }

    fn retry(attempt: u64, reason: &str, error_type: &str) -> Frame {
        parse(json!({"jsonrpc":"2.0","method":"_x.ai/session_notification","params":{"sessionId":S,
            "update":{"sessionUpdate":"retry_state","type":"retrying","attempt":attempt,"max_retries":15,
            "reason":reason,"error_type":error_type}}}))
    }

    fn error(v: &Value) -> Value {
        v.get("error").cloned().unwrap_or(Value::Null)
    }

    const QUOTA: &str = "API error (status 429 Too Many Requests): insufficient_quota: You exceeded your current quota, please check your plan and billing details.";
    const RATE: &str = "API error (status 429 Too Many Requests): rate_limit_exceeded: Rate limit reached for requests. Please try again later.";
    const SERVER: &str =
        "API error (status 500 Internal Server Error): The server had an error while processing your request.";

    fn harness() -> Harness {
        Harness::of(layer(Duration::from_secs(60)))
    }

    #[test]
    fn reasons_are_read_with_the_upstream_code() {
        assert_eq!(
            parse_reason(QUOTA),
            Reason { status: Some(429), code: Some("insufficient_quota".into()), text: QUOTA.into() }
        );
        assert_eq!(parse_reason(SERVER).code, None);
        assert_eq!(parse_reason(SERVER).status, Some(500));
        assert_eq!(parse_reason("connection refused").status, None);
        // Bad input: a short or odd prefix, a 20 KB reason, non-ASCII.
        assert_eq!(parse_reason("API error (status 4").status, None);
        let long = format!("API error (status 503 x): {}", "é".repeat(10_000));
        assert_eq!(parse_reason(&long).status, Some(503));
    }

    #[test]
    fn rate_limited_answers_become_quota_or_service_by_the_upstream_code() {
        for (data, kind) in [
            (QUOTA, json!({"kind":"quota_exhausted"})),
            (RATE, json!({"kind":"service_unavailable","input":"accepted"})),
        ] {
            let mut h = harness();
            h.client_frame(prompt(4));
            h.from_agent(json!({"jsonrpc":"2.0","id":4,"error":{"code":-32003,"message":"Rate limited","data":data}}));
            let e = error(&h.to_client()[0]);
            assert_eq!(e["code"], -32603);
            assert_eq!(e["message"], data);
            assert_eq!(e["data"]["_meta"]["coda"]["failure"], kind);
        }
    }

    #[test]
    fn a_bare_status_or_another_error_is_left_alone() {
        let mut h = harness();
        h.client_frame(prompt(4));
        let bare = json!({"jsonrpc":"2.0","id":4,"error":{"code":-32003,"message":"Rate limited",
            "data":"API error (status 429 Too Many Requests): slow down"}});
        h.from_agent(bare.clone());
        h.client_frame(prompt(5));
        let auth = json!({"jsonrpc":"2.0","id":5,"error":{"code":-32000,"message":"Authentication required"}});
        h.from_agent(auth.clone());
        // Grok's answer to a 401 (seen live) is a login problem: -32000, never a failure kind.
        h.client_frame(prompt(6));
        let data = "Unauthorized (401) from http://127.0.0.1:1/v1/chat/completions: invalid_request_error: Incorrect API key provided.\n\n  Model:     fake-model";
        h.from_agent(json!({"jsonrpc":"2.0","id":6,"error":{"code":-32603,"message":"Internal error","data":data}}));
        let out = h.to_client();
        assert_eq!(out[0], bare);
        assert_eq!(out[1], auth);
        let e = error(&out[2]);
        assert_eq!(e["code"], -32000);
        assert!(e["message"].as_str().is_some_and(|m| m.starts_with("Unauthorized (401)") && !m.contains('\n')), "{e}");
        assert!(e.pointer("/data/_meta").is_none());
    }

    #[test]
    fn retries_past_the_patience_stop_the_run_and_end_the_turn_with_the_failure() {
        let mut h = harness();
        h.client_frame(prompt(6));
        h.agent_frame(retry(1, SERVER, "api"));
        h.advance(Duration::from_secs(30));
        h.agent_frame(retry(2, SERVER, "api"));
        h.take();
        h.advance(Duration::ZERO);
        assert!(h.to_agent().is_empty(), "not before the patience has passed since the first retry");
        h.advance(Duration::from_secs(30));
        assert_eq!(h.to_agent(), vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        // Grok ends the cancelled turn; Coda gets the failure instead.
        h.from_agent(json!({"jsonrpc":"2.0","id":6,"result":{"stopReason":"cancelled"}}));
        let e = error(&h.to_client()[0]);
        // Grok quotes no upstream code for a 500: a plain error with the reason and the retries.
        assert_eq!(e["code"], -32603);
        assert!(e.pointer("/data/_meta").is_none(), "{e}");
        assert!(e["message"].as_str().is_some_and(|m| m.starts_with(SERVER) && m.contains("attempt 2 of 15")), "{e}");
        assert!(e["message"].as_str().is_some_and(|m| m.ends_with("stopped after over a minute of retries.")), "{e}");
        // Nothing of that turn wakes again.
        h.advance(Duration::from_secs(540));
        assert!(h.to_agent().is_empty());
        assert_eq!(h.next_wake(), None);
    }

    /// Grok's retry report for a 503 whose body is a line of text (no error object), as Grok 1.0.41 sends it.
    const UNAVAILABLE: &str = "API error (status 503 Service Unavailable): Grok is temporarily unavailable. Please try again in a moment. (HTTP 503).";

    fn retry_as_sent(attempt: u64, event: u64, reason: &str) -> Frame {
        parse(json!({"jsonrpc":"2.0","method":"_x.ai/session_notification","params":{
            "_meta":{"agentTimestampMs":1796156719966u64 + attempt * 1000,"eventId":format!("{S}-{event}")},
            "sessionId":S,"update":{"attempt":attempt,"error_type":"api","max_retries":15,"reason":reason,
            "sessionUpdate":"retry_state","type":"retrying"}}}))
    }

    #[test]
    fn a_503_without_a_code_is_service_unavailable_when_its_retries_are_stopped() {
        let mut h = harness();
        h.client_frame(prompt(3));
        h.take();
        for attempt in 1..=6 {
            h.agent_frame(retry_as_sent(attempt, attempt + 3, UNAVAILABLE));
            h.advance(Duration::from_secs(10));
        }
        assert_eq!(h.to_agent(), vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        h.take();
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"cancelled","_meta":{"sessionId":S,
            "requestId":"6b791075-2aa2-41d7-99a7-0065e697bf4a","promptId":"6b791075-2aa2-41d7-99a7-0065e697bf4a",
            "totalTokens":2262,"modelId":"fake-model","cancellationCategory":"MidTurnAbort"}}}));
        let e = error(&h.to_client()[0]);
        assert_eq!(e["code"], -32603);
        // Grok names no wait: no retryAfterMs.
        assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"service_unavailable","input":"accepted"}));
        assert!(
            e["message"].as_str().is_some_and(|m| m.starts_with(UNAVAILABLE) && m.contains("attempt 6 of 15")),
            "{e}"
        );
        // The same words for a 502 page, or a 500 without a code: no explicit reason.
        let page = "API error (status 502 Bad Gateway): Grok is temporarily unavailable. Please try again in a moment. (HTTP 502).";
        assert_eq!(verdict(&parse_reason(page)), Verdict::Plain);
        assert_eq!(verdict(&parse_reason(SERVER)), Verdict::Plain);
        // A status only where Grok writes one: three digits, then its text.
        assert_eq!(parse_reason("API error (status 5031 x): y").status, None);
        assert_eq!(parse_reason("API error (status 503): y").status, Some(503));
        assert_eq!(verdict(&parse_reason("upstream said 503 Service Unavailable")), Verdict::Plain);
    }

    #[test]
    fn a_timer_of_an_earlier_turn_never_stops_a_later_one() {
        let mut h = harness();
        h.client_frame(prompt(4));
        h.agent_frame(retry(1, QUOTA, "rate_limited"));
        h.advance(Duration::from_secs(30));
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"error":{"code":-32003,"message":"Rate limited","data":QUOTA}}));
        h.client_frame(prompt(5));
        h.advance(Duration::from_secs(20));
        h.agent_frame(retry(1, QUOTA, "rate_limited"));
        h.take();
        // The first turn's minute is over; the second's is not.
        h.advance(Duration::from_secs(20));
        assert!(h.to_agent().is_empty(), "the first turn's timer fired in the second");
        h.advance(Duration::from_secs(40));
        assert_eq!(h.to_agent()[0]["method"], "session/cancel");
    }

    #[test]
    fn a_retry_that_succeeds_disarms_the_check_and_a_reset_stays_plain() {
        let mut h = harness();
        h.client_frame(prompt(7));
        h.take();
        h.agent_frame(retry(1, SERVER, "api"));
        h.from_agent(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}));
        h.advance(Duration::from_secs(120));
        assert!(h.to_agent().is_empty(), "output ended the retries");
        assert_eq!(h.next_wake(), None);
        assert_eq!(verdict(&parse_reason("error sending request: connection reset")), Verdict::Plain);
        assert_eq!(verdict(&parse_reason(SERVER)), Verdict::Plain);
        assert_eq!(verdict(&parse_reason(QUOTA)), Verdict::Kind(failure::Kind::Quota));
    }

    #[test]
    fn a_second_prompt_queued_in_the_session_leaves_the_stop_with_the_turn_that_retried() {
        // A client that breaks ACP sends a second prompt while the first runs: Grok queues it. The first retries
        // past the patience: it, not the queued one, is answered with the failure; the second as Grok answers it.
        let mut h = harness();
        h.client_frame(prompt(4));
        h.client_frame(prompt(5));
        assert_eq!(h.to_agent().len(), 2);
        h.agent_frame(retry(1, RATE, "rate_limited"));
        h.to_client();
        h.advance(Duration::from_secs(61));
        assert_eq!(h.to_agent()[0]["method"], "session/cancel");
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"result":{"stopReason":"cancelled"}}));
        let first = h.to_client();
        assert_eq!(first[0]["id"], 4);
        assert_eq!(error(&first[0])["data"]["_meta"]["coda"]["failure"]["kind"], "service_unavailable");
        h.from_agent(json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}));
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}})]);
    }
}

//! Failed Kimi turns as Coda's failure answer (section 执行失败), from Kimi's session files (sans-IO).
//!
//! Kimi answers every failed turn with a plain `end_turn` over ACP (seen live on 2.1.0); what failed is only in
//! its main wire: `turn.ended {reason: "failed", error: {code, message, name, details, retryable}}`, and each
//! retry before it as `turn.step.retrying {delayMs, errorName, errorMessage, statusCode}`. The kind comes from
//! Kimi's own error class, which Kimi derives from the upstream's answer (its error code or type, e.g. OpenAI's
//! `insufficient_quota`), never from a status code alone:
//!
//! | Kimi error | Coda |
//! | --- | --- |
//! | `APIProviderQuotaExhaustedError` | `quota_exhausted` |
//! | `APIProviderRateLimitError`, `APIProviderOverloadedError`, `APIConnectionError` (`provider.connection_error`) | `service_unavailable`, `input: accepted` (the prompt is in Kimi's history and the run has ended) |
//! | `provider.auth_error` | -32000 (a login problem) |
//! | anything else (a bare `APIStatusError`, context overflow, ...) | a plain error with Kimi's message |
//!
//! Kimi retries a step up to ten times with a backoff that doubles from 0.5 s (up to 32 s, or the upstream's
//! `Retry-After`): about two and a half minutes in all, silent over ACP. Once the retries of a turn would keep it
//! open past [`RETRY_PATIENCE`] (counted on Kimi's own record times, from its first retry to the end of the wait it
//! just scheduled), the layer asks to stop the run (`session/cancel`) and answers with that failure, naming the
//! wait Kimi had planned.

use crate::coda::failure::{self, Input, Kind, RETRY_PATIENCE};
use crate::frame::{self, Frame};
use serde_json::{Value, json};

use crate::adapters::kimi::wire::{Entry, Record, Retrying};

/// Longest upstream message kept in an answer (Kimi's messages may quote a whole response body).
const MESSAGE_MAX: usize = 2000;

/// What a failed turn is for Coda.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// None: a plain error; the login case is [`Verdict::auth`].
    pub kind: Option<Kind>,
    pub auth: bool,
    pub message: String,
    /// Kimi's own record of the failure, kept in `error.data.kimi`.
    pub data: Value,
}

/// The main agent's client turns of one session, as far as their failures go.
///
/// Kimi may answer a short turn before the watch has read that turn from its wire (a quota failure takes
/// 0.1 s), so answers and turn ends are paired in order: the n-th client turn that ends in the wire is the
/// turn of the n-th prompt answer (slash commands, which Kimi runs without a turn, are not counted).
#[derive(Default)]
pub struct Failures {
    /// The client turn running in the main wire.
    turn: Option<i64>,
    /// Kimi's time of the first retry in that turn.
    retry_since: Option<u64>,
    /// The shim stopped the run: the failure to answer with.
    stopped: Option<Verdict>,
    /// Client turns that ended in the wire and were not answered yet, oldest first: a failure, or None.
    ended: std::collections::VecDeque<Option<Verdict>>,
    /// Answers that went out before the wire showed their turn's end: that many ends are not paired again.
    unpaired: usize,
}

impl Failures {
    /// A record of the main wire. True: stop the native run now (send `session/cancel`).
    pub fn record(&mut self, entry: &Entry) -> bool {
        match &entry.record {
            Record::TurnPrompt { turn_id, origin } if origin.is_user() => {
                self.turn = Some(*turn_id);
                self.retry_since = None;
                self.stopped = None;
            }
            Record::TurnPrompt { .. } => self.turn = None,
            Record::StepRetrying(r) if Some(r.turn_id) == self.turn && self.stopped.is_none() => {
                let since = *self.retry_since.get_or_insert(entry.time);
                let planned_until = entry.time.saturating_add(r.delay_ms);
                if planned_until.saturating_sub(since) > RETRY_PATIENCE.as_millis() as u64 {
                    self.stopped = Some(stopped(r, planned_until.saturating_sub(since)));
                    return true;
                }
            }
            // An attempt that got an answer: the retries are over.
            Record::Text { .. } | Record::ToolCall { .. } if self.turn.is_some() => self.retry_since = None,
            Record::TurnEnded { turn_id, reason, error } if Some(*turn_id) == self.turn => {
                self.turn = None;
                let verdict = match (self.stopped.take(), error) {
                    (Some(v), _) => Some(v),
                    (None, Some(error)) if reason == "failed" => Some(classify(error)),
                    _ => None,
                };
                if self.unpaired > 0 {
                    self.unpaired -= 1;
                } else {
                    self.ended.push_back(verdict);
                }
            }
            _ => {}
        }
        false
    }

    /// Whether the wire has shown the end of the turn of the next prompt answer.
    pub fn turn_ended(&self) -> bool {
        !self.ended.is_empty()
    }

    /// The answer Coda gets for Kimi's answer `reply` to a client prompt (not a slash command).
    pub fn answer(&mut self, reply: Frame) -> Frame {
        let Some(verdict) = self.ended.pop_front() else {
            // Answered before the wire showed the turn's end (the hold ran out): that end is not this answer's.
            self.unpaired += 1;
            return reply;
        };
        let Some(verdict) = verdict else { return reply };
        let Some(id) = reply.id().cloned() else { return reply };
        // Kimi's own error answer stays as it is.
        if reply.value().get("result").is_none() {
            return reply;
        }
        if verdict.auth {
            return frame::error_response(&id, -32000, &verdict.message, Some(json!({ "kimi": verdict.data })));
        }
        failure::answer(&id, &verdict.message, verdict.kind.as_ref(), Some(json!({ "kimi": verdict.data })))
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn clip(s: String) -> String {
    failure::clip(&s, MESSAGE_MAX)
}

/// The kind of a failure Kimi named by its error class or code.
fn kind_of(name: &str, code: &str) -> Result<Option<Kind>, ()> {
    let service = Kind::Service { input: Some(Input::Accepted), retry_after_ms: None };
    Ok(match (name, code) {
        (_, "provider.auth_error") => return Err(()),
        ("APIProviderQuotaExhaustedError", _) => Some(Kind::Quota),
        ("APIProviderRateLimitError" | "APIProviderOverloadedError" | "APIConnectionError", _)
        | (_, "provider.rate_limit" | "provider.overloaded" | "provider.connection_error") => Some(service),
        _ => None,
    })
}

/// A `turn.ended` error payload.
pub fn classify(error: &Value) -> Verdict {
    let (name, code) = (text(error, "name"), text(error, "code"));
    let mut message = clip(text(error, "message"));
    if message.trim().is_empty() {
        message = format!("Kimi's turn failed ({})", if name.is_empty() { &code } else { &name });
    }
    let status = error.pointer("/details/statusCode").and_then(Value::as_u64);
    let data = json!({"name": name, "code": code, "statusCode": status});
    match kind_of(&name, &code) {
        Err(()) => Verdict { kind: None, auth: true, message, data },
        Ok(kind) => Verdict { kind, auth: false, message, data },
    }
}

/// The failure of a run the shim stopped while Kimi was retrying `r`; `waited_ms` is how long the retries
/// would have kept the turn open by the end of the wait Kimi scheduled last.
fn stopped(r: &Retrying, waited_ms: u64) -> Verdict {
    let reason = clip(r.message.clone());
    let message = format!(
        "{reason}\nKimi was retrying (attempt {} of {} failed) and would have waited {:.1} s more, {:.0} s in all: \
         stopped after over a minute of retries.",
        r.failed_attempt,
        r.max_attempts,
        r.delay_ms as f64 / 1000.0,
        waited_ms as f64 / 1000.0
    );
    let data = json!({"name": r.error_name, "statusCode": r.status, "attempt": r.failed_attempt,
        "maxAttempts": r.max_attempts, "delayMs": r.delay_ms});
    match kind_of(&r.error_name, "") {
        Ok(Some(Kind::Service { input, .. })) => Verdict {
            kind: Some(Kind::Service { input, retry_after_ms: Some(r.delay_ms) }),
            auth: false,
            message,
            data,
        },
        Ok(kind) => Verdict { kind, auth: false, message, data },
        Err(()) => Verdict { kind: None, auth: true, message, data },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::wire::parse_line;

    fn entry(line: &str) -> Entry {
        parse_line(line.as_bytes()).expect("a wire record")
    }

    fn prompt(turn: i64) -> Entry {
        entry(&format!(
            r#"{{"type":"turn.prompt","agentId":"main","turnId":{turn},"origin":{{"kind":"user"}},"time":1000}}"#
        ))
    }

    fn ended(turn: i64, error: &str) -> Entry {
        entry(&format!(
            r#"{{"type":"turn.ended","agentId":"main","turnId":{turn},"reason":"failed","error":{error},"time":2000}}"#
        ))
    }

    fn retrying(turn: i64, time: u64, delay: &str, name: &str) -> Entry {
        entry(&format!(
            r#"{{"type":"turn.step.retrying","agentId":"main","turnId":{turn},"step":1,"failedAttempt":7,"nextAttempt":8,
            "maxAttempts":10,"delayMs":{delay},"errorName":"{name}","errorMessage":"429 Rate limit reached","statusCode":429,"time":{time}}}"#
        ))
    }

    fn end_turn(id: u64) -> Frame {
        Frame::from_value(&json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}))
    }

    fn error(f: &Frame) -> Value {
        f.value().get("error").cloned().unwrap_or(Value::Null)
    }

    const QUOTA: &str = r#"{"code":"provider.api_error","message":"429 You exceeded your current quota, please check your plan and billing details.","name":"APIProviderQuotaExhaustedError","details":{"statusCode":429,"requestId":null,"traceId":null},"retryable":false}"#;

    #[test]
    fn a_quota_failure_recorded_by_kimi_answers_the_prompt_with_quota_exhausted() {
        let mut f = Failures::default();
        f.record(&prompt(0));
        f.record(&ended(0, QUOTA));
        let e = error(&f.answer(end_turn(4)));
        assert_eq!(e["code"], -32603);
        assert_eq!(e["message"], "429 You exceeded your current quota, please check your plan and billing details.");
        assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"quota_exhausted"}));
        assert_eq!(e["data"]["kimi"]["name"], "APIProviderQuotaExhaustedError");
        // Taken once: the next clean answer is left alone.
        assert_eq!(f.answer(end_turn(5)).value(), end_turn(5).value());
    }

    #[test]
    fn rate_limit_overload_and_connection_are_service_unavailable_input_accepted() {
        for (name, code) in [
            ("APIProviderRateLimitError", "provider.rate_limit"),
            ("APIProviderOverloadedError", "provider.overloaded"),
            ("APIConnectionError", "provider.connection_error"),
        ] {
            let mut f = Failures::default();
            f.record(&prompt(2));
            f.record(&ended(2, &format!(r#"{{"code":"{code}","message":"busy","name":"{name}","retryable":true}}"#)));
            let e = error(&f.answer(end_turn(4)));
            assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"service_unavailable","input":"accepted"}));
        }
    }

    #[test]
    fn a_bare_status_error_is_never_a_failure_kind_and_auth_stays_auth() {
        let mut f = Failures::default();
        f.record(&prompt(1));
        f.record(&ended(1, r#"{"code":"provider.api_error","message":"500 boom","name":"APIStatusError","details":{"statusCode":500},"retryable":true}"#));
        let e = error(&f.answer(end_turn(4)));
        assert_eq!(e["code"], -32603);
        assert!(e.pointer("/data/_meta").is_none(), "{e}");
        f.record(&prompt(2));
        f.record(&ended(2, r#"{"code":"provider.auth_error","message":"401 Incorrect API key","name":"ChatProviderError","retryable":false}"#));
        let e = error(&f.answer(end_turn(5)));
        assert_eq!(e["code"], -32000);
        assert!(e.pointer("/data/_meta").is_none(), "{e}");
    }

    #[test]
    fn a_clean_or_cancelled_turn_and_kimis_own_turns_are_left_alone() {
        let mut f = Failures::default();
        f.record(&prompt(0));
        f.record(&entry(r#"{"type":"turn.ended","agentId":"main","turnId":0,"reason":"completed","time":3}"#));
        assert_eq!(f.answer(end_turn(4)).value(), end_turn(4).value());
        // A failure of a turn Kimi started itself (a task notification) is not a client prompt's.
        f.record(&entry(
            r#"{"type":"turn.prompt","agentId":"main","turnId":1,"origin":{"kind":"task","taskId":"t"},"time":4}"#,
        ));
        f.record(&ended(1, QUOTA));
        assert_eq!(f.answer(end_turn(5)).value(), end_turn(5).value());
    }

    #[test]
    fn retries_past_a_minute_stop_the_run_with_the_wait_kimi_planned() {
        let mut f = Failures::default();
        f.record(&prompt(2));
        // Seen live: 0.5, 1.2, 2.4, 4.7, 8.2, 16.3 s, then 38.9 s planned 33.7 s after the first retry.
        assert!(!f.record(&retrying(2, 516_428, "547.5", "APIProviderRateLimitError")));
        assert!(!f.record(&retrying(2, 533_752, "16335.1", "APIProviderRateLimitError")));
        assert!(f.record(&retrying(2, 550_122, "38917.37554200881", "APIProviderRateLimitError")));
        // The stop asked once; Kimi's cancelled turn then ends.
        assert!(!f.record(&retrying(2, 550_200, "38917", "APIProviderRateLimitError")));
        f.record(&entry(r#"{"type":"turn.ended","agentId":"main","turnId":2,"reason":"cancelled","time":550300}"#));
        let cancelled = Frame::from_value(&json!({"jsonrpc":"2.0","id":6,"result":{"stopReason":"cancelled"}}));
        let e = error(&f.answer(cancelled));
        assert_eq!(
            e["data"]["_meta"]["coda"]["failure"],
            json!({"kind":"service_unavailable","input":"accepted","retryAfterMs":38917})
        );
        let m = e["message"].as_str().unwrap_or_default();
        assert!(m.starts_with("429 Rate limit reached\nKimi was retrying (attempt 7 of 10 failed)"), "{m}");
        assert!(m.contains("38.9 s more, 73 s in all"), "{m}");
    }

    #[test]
    fn hostile_records_are_read_safely() {
        let mut f = Failures::default();
        f.record(&prompt(3));
        // 1e400 is beyond an f64: the record is read (numbers are read with all their digits) and its wait,
        // not a finite number, counts as none; a negative wait is no wait; a huge one saturates.
        let line = r#"{"type":"turn.step.retrying","turnId":3,"delayMs":1e400,"time":10}"#;
        let read = parse_line(line.as_bytes()).map(|e| e.record);
        assert!(matches!(read, Ok(Record::StepRetrying(Retrying { delay_ms: 0, .. }))), "{read:?}");
        assert!(!f.record(&retrying(3, 20, "-5", "APIProviderRateLimitError")));
        assert!(f.record(&retrying(3, 30, "1e300", "APIProviderRateLimitError")));
        let mut f = Failures::default();
        f.record(&prompt(4));
        let long = "é".repeat(20_000);
        f.record(&ended(4, &format!(r#"{{"name":"APIProviderQuotaExhaustedError","message":"{long}","code":7}}"#)));
        let e = error(&f.answer(end_turn(9)));
        assert!(e["message"].as_str().is_some_and(|m| m.len() <= MESSAGE_MAX + 3 && m.ends_with('…')));
        // A turn end with bad UTF-8 in its message is no record (the feed skips it with a warning): the answer
        // is not paired with it, so it waits for the hold and goes on as Kimi gave it.
        let mut line = br#"{"type":"turn.ended","agentId":"main","turnId":4,"reason":"failed","error":{"name":"APIProviderQuotaExhaustedError","message":"#.to_vec();
        line.extend_from_slice(b"\"bad \xff\xfe\"},\"time\":1}");
        assert!(parse_line(&line).is_err());
        // An error that is not an object is no error; an answer without an id is passed on.
        let mut f = Failures::default();
        f.record(&prompt(5));
        f.record(&entry(r#"{"type":"turn.ended","agentId":"main","turnId":5,"reason":"failed","error":"x","time":1}"#));
        assert_eq!(f.answer(end_turn(9)).value(), end_turn(9).value());
    }
}

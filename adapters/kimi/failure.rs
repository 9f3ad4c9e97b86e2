//! Where Kimi's failure signals are (section 执行失败): its session files (sans-IO).
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
//! `Retry-After`): about two and a half minutes in all, silent over ACP. Each retry of a client turn is a retry
//! for the engine's one-minute rule ([`crate::coda::failure`]), stamped with Kimi's own record time and the wait
//! Kimi scheduled. Kimi writes the end of every client turn to its wire (a slash command makes none): each is
//! the record an answer is paired with, in order (a failed turn is answered in 0.1 s, before the watch has read
//! its end, so the answer waits for it).

use crate::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use crate::adapters::kimi::facts::WireFacts;
use crate::adapters::kimi::wire::{Record, Retrying};
use crate::coda::failure::{self, Failure, Kind, Retry, Signal, Signals, Verdict};
use crate::frame::Frame;
use serde_json::{Value, json};

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// What Kimi's error class or code names.
fn verdict_of(name: &str, code: &str) -> Verdict {
    match (name, code) {
        (_, "provider.auth_error") => Verdict::Auth,
        ("APIProviderQuotaExhaustedError", _) => Verdict::Kind(Kind::Quota),
        ("APIProviderRateLimitError" | "APIProviderOverloadedError" | "APIConnectionError", _)
        | (_, "provider.rate_limit" | "provider.overloaded" | "provider.connection_error") => {
            Verdict::Kind(Kind::SERVICE)
        }
        _ => Verdict::Plain,
    }
}

/// A `turn.ended` error payload.
pub fn classify(error: &Value) -> Failure {
    let (name, code) = (text(error, "name"), text(error, "code"));
    let mut message = text(error, "message");
    if message.trim().is_empty() {
        message = format!("Kimi's turn failed ({})", if name.is_empty() { &code } else { &name });
    }
    let status = error.pointer("/details/statusCode").and_then(Value::as_u64);
    let data = json!({"kimi": {"name": name, "code": code, "statusCode": status}});
    Failure { verdict: verdict_of(&name, &code), message, data: Some(data) }
}

/// A retry of Kimi's, at Kimi's record time `at_ms`.
fn retry(r: &Retrying, at_ms: u64) -> Retry {
    let data = json!({"kimi": {"name": r.error_name, "statusCode": r.status, "attempt": r.failed_attempt,
        "maxAttempts": r.max_attempts, "delayMs": r.delay_ms}});
    Retry {
        reason: r.message.clone(),
        verdict: verdict_of(&r.error_name, ""),
        at_ms: Some(at_ms),
        wait_ms: Some(r.delay_ms),
        attempt: Some(r.failed_attempt),
        attempts: Some(r.max_attempts),
        data: Some(data),
    }
}

/// Where Kimi's failure signals are: the main agent's wire records of each session, handed on by the activity
/// layer's watch ([`WireFacts`]). The record of a turn is how it ended: a failure, or none.
#[derive(Default)]
pub struct Kimi {
    /// The client turn (by Kimi's turn id) running in each session's main wire.
    turns: HashMap<String, i64>,
    /// Sessions whose files the watch reads: their turns' ends will show.
    wired: HashSet<String>,
}

impl Signals for Kimi {
    type Event = WireFacts;
    type Record = Option<Failure>;

    fn on_event(&mut self, facts: WireFacts, out: &mut Vec<Signal<Option<Failure>>>) {
        let session = facts.session;
        self.wired.insert(session.clone());
        for entry in facts.entries {
            let running = self.turns.get(&session).copied();
            match &entry.record {
                Record::TurnPrompt { turn_id, origin } if origin.is_user() => {
                    self.turns.insert(session.clone(), *turn_id);
                    out.push(Signal::Began { session: session.clone(), turn: *turn_id });
                }
                Record::TurnPrompt { .. } => {
                    self.turns.remove(&session);
                }
                Record::StepRetrying(r) if Some(r.turn_id) == running => {
                    out.push(Signal::Retrying { session: session.clone(), retry: retry(r, entry.time) });
                }
                Record::TurnEnded { turn_id, reason, error } if Some(*turn_id) == running => {
                    self.turns.remove(&session);
                    let failure = error.as_ref().filter(|_| reason == "failed").map(classify);
                    out.push(Signal::Ended { session: session.clone(), turn: Some(*turn_id), record: failure });
                }
                _ => {}
            }
        }
    }

    fn closed(&mut self, session: &str) {
        self.turns.remove(session);
        self.wired.remove(session);
    }

    fn kept(&self) -> usize {
        self.turns.len() + self.wired.len()
    }

    /// A slash command runs no client turn (a builtin runs none at all, a skill one of origin
    /// `skill_activation`).
    fn makes_turn(&self, prompt: &Frame) -> bool {
        let first = prompt.value().pointer("/params/prompt/0/text").and_then(Value::as_str);
        !first.is_some_and(|t| t.starts_with('/'))
    }

    /// A result (an error answer means Kimi refused the prompt: no turn) of a session whose wire is read.
    fn awaits_record(&self, session: &str, answer: &Frame) -> bool {
        self.wired.contains(session) && answer.value().get("result").is_some()
    }

    /// Kimi's answer ends the turn its record says failed (Kimi's own error answer stays as it is).
    fn failure(&self, answer: &Frame, record: Option<Option<Failure>>, _: SystemTime) -> Option<Failure> {
        answer.value().get("result")?;
        record.flatten()
    }

    fn retrying(&self, r: &Retry, waited: Duration) -> String {
        format!(
            "Kimi was retrying (attempt {} of {} failed) and would have waited {:.1} s more, {:.0} s in all",
            r.attempt.unwrap_or(0),
            r.attempts.unwrap_or(0),
            r.wait_ms.unwrap_or(0) as f64 / 1000.0,
            waited.as_secs_f64()
        )
    }
}

/// coda-kimi's failure layer.
pub type Failures = failure::FailureKinds<Kimi>;

/// The layer, stopping retries after `patience`.
pub fn layer(patience: Duration) -> Failures {
    failure::FailureKinds::new(Kimi::default(), patience)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::wire::{Entry, parse_line};
    use crate::layer::testing::Harness;

    const S: &str = "session_k";

    fn entry(line: &str) -> Entry {
        parse_line(line.as_bytes()).expect("a wire record")
    }

    fn user(turn: i64) -> Entry {
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

    /// The layer, with the session's wire read (its watch started).
    fn kimi() -> Harness {
        let mut h = Harness::of(layer(failure::RETRY_PATIENCE));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"sessionId":S}}));
        h.take();
        wire(&mut h, vec![]);
        h
    }

    fn wire(h: &mut Harness, entries: Vec<Entry>) {
        h.event(0, WireFacts { session: S.into(), entries });
    }

    fn prompt(h: &mut Harness, id: u64, text: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":text}]}}));
        assert_eq!(h.to_agent().len(), 1);
    }

    fn end_turn(id: u64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}})
    }

    /// Prompt `id` runs turn `turn` of the wire, which completes: its answer goes on as Kimi gave it.
    fn clean_turn(h: &mut Harness, id: u64, turn: i64) {
        prompt(h, id, "again");
        let done = format!(r#"{{"type":"turn.ended","agentId":"main","turnId":{turn},"reason":"completed","time":3}}"#);
        wire(h, vec![user(turn), entry(&done)]);
        h.from_agent(end_turn(id));
        assert_eq!(h.to_client(), [end_turn(id)]);
    }

    fn error(v: &Value) -> Value {
        v.get("error").cloned().unwrap_or(Value::Null)
    }

    const QUOTA: &str = r#"{"code":"provider.api_error","message":"429 You exceeded your current quota, please check your plan and billing details.","name":"APIProviderQuotaExhaustedError","details":{"statusCode":429,"requestId":null,"traceId":null},"retryable":false}"#;

    #[test]
    fn a_quota_failure_recorded_by_kimi_answers_the_prompt_with_quota_exhausted() {
        let mut h = kimi();
        prompt(&mut h, 4, "go");
        // Answered in 0.1 s, before the watch read the turn: the answer waits for its record.
        h.from_agent(end_turn(4));
        assert!(h.to_client().is_empty());
        wire(&mut h, vec![user(0), ended(0, QUOTA)]);
        let e = error(&h.to_client()[0]);
        assert_eq!(e["code"], -32603);
        assert_eq!(e["message"], "429 You exceeded your current quota, please check your plan and billing details.");
        assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"quota_exhausted"}));
        assert_eq!(e["data"]["kimi"]["name"], "APIProviderQuotaExhaustedError");
        // Taken once: the next clean turn is left alone.
        clean_turn(&mut h, 5, 1);
    }

    #[test]
    fn rate_limit_overload_and_connection_are_service_unavailable_input_accepted() {
        for (name, code) in [
            ("APIProviderRateLimitError", "provider.rate_limit"),
            ("APIProviderOverloadedError", "provider.overloaded"),
            ("APIConnectionError", "provider.connection_error"),
        ] {
            let mut h = kimi();
            prompt(&mut h, 4, "go");
            let error_json = format!(r#"{{"code":"{code}","message":"busy","name":"{name}","retryable":true}}"#);
            wire(&mut h, vec![user(2), ended(2, &error_json)]);
            h.from_agent(end_turn(4));
            let e = error(&h.to_client()[0]);
            assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"service_unavailable","input":"accepted"}));
        }
    }

    #[test]
    fn a_bare_status_error_is_never_a_failure_kind_and_auth_stays_auth() {
        let mut h = kimi();
        prompt(&mut h, 4, "go");
        wire(
            &mut h,
            vec![
                user(1),
                ended(
                    1,
                    r#"{"code":"provider.api_error","message":"500 boom","name":"APIStatusError","details":{"statusCode":500},"retryable":true}"#,
                ),
            ],
        );
        h.from_agent(end_turn(4));
        let e = error(&h.to_client()[0]);
        assert_eq!(e["code"], -32603);
        assert!(e.pointer("/data/_meta").is_none(), "{e}");
        prompt(&mut h, 5, "go");
        wire(
            &mut h,
            vec![
                user(2),
                ended(
                    2,
                    r#"{"code":"provider.auth_error","message":"401 Incorrect API key","name":"ChatProviderError","retryable":false}"#,
                ),
            ],
        );
        h.from_agent(end_turn(5));
        let e = error(&h.to_client()[0]);
        assert_eq!(e["code"], -32000);
        assert!(e.pointer("/data/_meta").is_none(), "{e}");
    }

    #[test]
    fn slash_commands_refusals_and_kimis_own_turns_take_no_record() {
        let mut h = kimi();
        // A builtin slash command runs no turn, a refused prompt neither: both answered at once.
        prompt(&mut h, 3, "/status");
        h.from_agent(end_turn(3));
        prompt(&mut h, 4, "busy");
        let busy = json!({"jsonrpc":"2.0","id":4,"error":{"code":-32600,"message":"turn.agent_busy"}});
        h.from_agent(busy.clone());
        assert_eq!(h.to_client(), [end_turn(3), busy]);
        // A failure of a turn Kimi started itself (a task notification) is not a client prompt's.
        wire(
            &mut h,
            vec![
                entry(
                    r#"{"type":"turn.prompt","agentId":"main","turnId":1,"origin":{"kind":"task","taskId":"t"},"time":4}"#,
                ),
                ended(1, QUOTA),
            ],
        );
        clean_turn(&mut h, 5, 2);
    }

    #[test]
    fn an_answer_whose_record_never_comes_goes_on_and_that_record_is_no_later_turns() {
        let mut h = kimi();
        prompt(&mut h, 4, "go");
        h.from_agent(end_turn(4));
        h.advance(failure::ANSWER_HOLD);
        assert_eq!(h.to_client(), [end_turn(4)], "as Kimi gave it, after the hold");
        prompt(&mut h, 5, "go");
        // The late record of the first turn is not the second's.
        wire(&mut h, vec![user(0), ended(0, QUOTA), user(1)]);
        h.from_agent(end_turn(5));
        assert!(h.to_client().is_empty(), "waits for its own record");
        wire(&mut h, vec![entry(r#"{"type":"turn.ended","agentId":"main","turnId":1,"reason":"completed","time":5}"#)]);
        assert_eq!(h.to_client(), [end_turn(5)]);
    }

    #[test]
    fn retries_past_a_minute_stop_the_run_with_the_wait_kimi_planned() {
        let mut h = kimi();
        prompt(&mut h, 6, "go");
        // Seen live: 0.5, 1.2, 2.4, 4.7, 8.2, 16.3 s, then 38.9 s planned 33.7 s after the first retry.
        wire(&mut h, vec![user(2), retrying(2, 516_428, "547.5", "APIProviderRateLimitError")]);
        wire(&mut h, vec![retrying(2, 533_752, "16335.1", "APIProviderRateLimitError")]);
        assert!(h.to_agent().is_empty());
        wire(&mut h, vec![retrying(2, 550_122, "38917.37554200881", "APIProviderRateLimitError")]);
        assert_eq!(h.to_agent(), [json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        // The stop is asked once; Kimi's cancelled turn then ends.
        wire(&mut h, vec![retrying(2, 550_200, "38917", "APIProviderRateLimitError")]);
        assert!(h.to_agent().is_empty());
        wire(
            &mut h,
            vec![entry(r#"{"type":"turn.ended","agentId":"main","turnId":2,"reason":"cancelled","time":550300}"#)],
        );
        h.from_agent(json!({"jsonrpc":"2.0","id":6,"result":{"stopReason":"cancelled"}}));
        let e = error(&h.to_client()[0]);
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
        let mut h = kimi();
        prompt(&mut h, 3, "go");
        // 1e400 is beyond an f64: the record is read (numbers are read with all their digits) and its wait,
        // not a finite number, counts as none; a negative wait is no wait; a huge one saturates.
        let line = r#"{"type":"turn.step.retrying","turnId":3,"delayMs":1e400,"time":10}"#;
        let read = parse_line(line.as_bytes()).map(|e| e.record);
        assert!(matches!(read, Ok(Record::StepRetrying(Retrying { delay_ms: 0, .. }))), "{read:?}");
        wire(&mut h, vec![user(3), retrying(3, 20, "-5", "APIProviderRateLimitError")]);
        assert!(h.to_agent().is_empty());
        wire(&mut h, vec![retrying(3, 30, "1e300", "APIProviderRateLimitError")]);
        assert_eq!(h.to_agent().len(), 1, "stopped");
        let mut h = kimi();
        prompt(&mut h, 9, "go");
        let long = "é".repeat(20_000);
        wire(
            &mut h,
            vec![
                user(4),
                ended(4, &format!(r#"{{"name":"APIProviderQuotaExhaustedError","message":"{long}","code":7}}"#)),
            ],
        );
        h.from_agent(end_turn(9));
        let e = error(&h.to_client()[0]);
        assert!(e["message"].as_str().is_some_and(|m| m.len() <= failure::REASON_MAX + 3 && m.ends_with('…')));
        // A turn end with bad UTF-8 in its message is no record (the feed skips it with a warning).
        let mut line = br#"{"type":"turn.ended","agentId":"main","turnId":4,"reason":"failed","error":{"name":"APIProviderQuotaExhaustedError","message":"#.to_vec();
        line.extend_from_slice(b"\"bad \xff\xfe\"},\"time\":1}");
        assert!(parse_line(&line).is_err());
        // An error that is not an object is no failure.
        let mut h = kimi();
        prompt(&mut h, 9, "go");
        wire(
            &mut h,
            vec![
                user(5),
                entry(r#"{"type":"turn.ended","agentId":"main","turnId":5,"reason":"failed","error":"x","time":1}"#),
            ],
        );
        h.from_agent(end_turn(9));
        assert_eq!(h.to_client(), [end_turn(9)]);
    }
}

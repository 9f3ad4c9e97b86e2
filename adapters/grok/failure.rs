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
//! So: a -32003 answer is classified by the upstream's own code in its reason (`insufficient_quota` ->
//! `quota_exhausted`, `rate_limit_exceeded` -> `service_unavailable`); and once Grok's retries have kept a turn
//! open for [`failure::retry_patience`] (a minute) the layer stops the run (`session/cancel`) and answers with the
//! last retry's reason, classified the same way. Where the reason quotes no code, the upstream's status 503 is
//! itself the explicit reason (RFC 9110: the server is temporarily unable to handle the request, overloaded or in
//! maintenance): `service_unavailable`. Other statuses without a code (500, 502) and a dropped connection stay
//! plain errors. Grok does not say how long it meant to wait, so no `retryAfterMs`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use crate::coda::failure::{self, Input, Kind};
use crate::frame::{self, Frame, Id, Kind as FrameKind};
use crate::json::View;
use crate::layer::{Cx, Layer};
use serde_json::{Value, json};

/// Longest upstream reason kept in an answer.
const REASON_MAX: usize = 2000;

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
    let text = clip(reason);
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

fn clip(s: &str) -> String {
    failure::clip(s, REASON_MAX)
}

/// The kind a reason names, in Grok's error answers and in the retries the shim stops: the upstream's code where
/// Grok quotes one, else the upstream's status 503 (Service Unavailable: by definition a temporary failure of the
/// server). A 429 without a code may be a quota or a rate limit and a status never names a quota; Grok's
/// `error_type` and its own words for a body it could not read ("Grok is temporarily unavailable", for a 502 page
/// too) are no upstream reason: so a 500 or 502 without a code stays a plain error.
pub fn kind_of(reason: &Reason) -> Option<Kind> {
    match (reason.code.as_deref().and_then(kind_of_code), reason.status) {
        (Some(kind), _) => Some(kind),
        (None, Some(503)) => Some(Kind::Service { input: Some(Input::Accepted), retry_after_ms: None }),
        (None, _) => None,
    }
}

/// The kind an upstream code names, if it names one Coda knows.
fn kind_of_code(code: &str) -> Option<Kind> {
    match code {
        // OpenAI's and Moonshot's quota codes.
        "insufficient_quota" | "exceeded_current_quota_error" => Some(Kind::Quota),
        "rate_limit_exceeded" | "server_error" | "server_is_overloaded" | "overloaded_error" => {
            Some(Kind::Service { input: Some(Input::Accepted), retry_after_ms: None })
        }
        _ => None,
    }
}

struct Turn {
    prompt: Id,
    /// The latest retry report: its reason, attempt and Grok's limit.
    retry: Option<(Reason, u64, u64)>,
    /// Set anew (from the layer's counter) whenever the turn makes progress, so an older timer finds nothing to do.
    /// A wake-up ([`Check`]) names the generation it checks.
    generation: u64,
    /// The shim stopped the run: the answer's message and kind.
    stopped: Option<(String, Option<Kind>)>,
}

/// The wake-up that checks whether the turn of `session` is still retrying since `generation`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Check {
    session: String,
    generation: u64,
}

pub struct GrokFailure {
    turns: HashMap<String, Turn>,
    patience: Duration,
    /// Generations handed out so far (never reused, so a timer of an earlier turn never matches a later one).
    generations: u64,
}

impl GrokFailure {
    /// Stops a turn that has been retrying for `patience` (see [`failure::retry_patience`]).
    pub fn new(patience: Duration) -> GrokFailure {
        GrokFailure { turns: HashMap::new(), patience, generations: 0 }
    }

    /// A retry was reported, or the turn went on: (re)arms or disarms the check.
    /// `update` is the update's value as it lies in the frame.
    fn progress(&mut self, session: &str, update: View, cx: &mut Cx) {
        let Some(turn) = self.turns.get_mut(session) else { return };
        if turn.stopped.is_some() {
            return;
        }
        let text = |k: &str| update.get(k).and_then(|v| v.as_str());
        let kind = text("sessionUpdate").unwrap_or_default();
        match (kind.as_ref(), text("type").as_deref()) {
            ("retry_state", Some("retrying")) => {
                let reason = parse_reason(&text("reason").unwrap_or_default());
                let n = |k: &str| update.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
                let first = turn.retry.is_none();
                turn.retry = Some((reason, n("attempt"), n("max_retries")));
                if first {
                    self.generations += 1;
                    turn.generation = self.generations;
                    cx.after(self.patience, Check { session: session.to_owned(), generation: turn.generation });
                }
            }
            ("retry_state", _) => {}
            // Output of the turn: an attempt went through.
            ("agent_message_chunk" | "agent_thought_chunk" | "tool_call", _) if turn.retry.is_some() => {
                turn.retry = None;
                cx.cancel(&Check { session: session.to_owned(), generation: turn.generation });
                self.generations += 1;
                turn.generation = self.generations;
            }
            _ => {}
        }
    }

    /// A check: if the turn of `session` is still retrying since `generation`, stop it.
    pub fn check(&mut self, session: &str, generation: u64, cx: &mut Cx) {
        let Some(turn) = self.turns.get_mut(session) else { return };
        if turn.generation != generation || turn.stopped.is_some() {
            return;
        }
        let Some((reason, attempt, max)) = &turn.retry else { return };
        let message = format!(
            "{}\nGrok was retrying (attempt {attempt} of {max}) without an answer: stopped after over a minute of \
             retries.",
            reason.text
        );
        turn.stopped = Some((message, kind_of(reason)));
        tracing::info!("stopping Grok's turn in session {session}: it has been retrying for over {:?}", self.patience);
        cx.to_agent(frame::notification("session/cancel", json!({ "sessionId": session })));
    }

    /// The generation of the turn of `session` (for tests driving checks by hand).
    #[cfg(test)]
    pub fn generation(&self, session: &str) -> Option<u64> {
        self.turns.get(session).map(|t| t.generation)
    }

    /// The answer Coda gets for Grok's answer to a prompt of `session`.
    fn answer(&mut self, session: &str, reply: Frame) -> Frame {
        let Some(turn) = self.turns.remove(session) else { return reply };
        let Some(id) = reply.id().cloned() else { return reply };
        if let Some((message, kind)) = turn.stopped {
            return failure::answer(&id, &message, kind.as_ref(), Some(json!({"grok": {"stopped": true}})));
        }
        let v = reply.value();
        let Some(error) = v.get("error") else { return reply };
        let Some(data) = error.get("data").and_then(Value::as_str) else { return reply };
        // Seen live: a 401 is `-32603 "Internal error"` with `Unauthorized (401) from <url>: …`: a login problem.
        if data.starts_with("Unauthorized (401)") {
            let message = clip(data.lines().next().unwrap_or(data));
            return frame::error_response(&id, -32000, &message, Some(json!({"grok": {"data": clip(data)}})));
        }
        if error.get("code").and_then(Value::as_i64) != Some(RATE_LIMITED) {
            return reply;
        }
        let reason = parse_reason(data);
        let Some(kind) = kind_of(&reason) else { return reply };
        failure::answer(&id, &reason.text, Some(&kind), Some(json!({"grok": {"code": RATE_LIMITED, "data": data}})))
    }
}

impl Layer for GrokFailure {
    type Timer = Check;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if let FrameKind::Request { id, method } = frame.kind()
            && method == "session/prompt"
            && let Some(session) = frame.value().pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned)
        {
            self.generations += 1;
            let turn = Turn { prompt: id.clone(), retry: None, generation: self.generations, stopped: None };
            self.turns.insert(session, turn);
        }
        cx.to_agent(frame);
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            FrameKind::Response { id } => {
                // The turn of the prompt it answers (in the session as this layer saw it, below the renames).
                if let Some(session) = self.turns.iter().find(|(_, t)| &t.prompt == id).map(|(s, _)| s.clone()) {
                    return cx.to_client(self.answer(&session, frame));
                }
            }
            FrameKind::Notification { method }
                if !self.turns.is_empty()
                    && matches!(method.as_str(), "_x.ai/session_notification" | "session/update") =>
            {
                // Read where it lies (a retry report, or output while a turn retries).
                if let (Some(session), Some(update)) = (frame.session(), frame.update_value()) {
                    self.progress(&session, update, cx);
                }
            }
            _ => {}
        }
        cx.to_client(frame);
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            FrameKind::Response { id } => !self.turns.values().any(|t| &t.prompt == id),
            FrameKind::Notification { method }
                if !self.turns.is_empty()
                    && matches!(method.as_str(), "_x.ai/session_notification" | "session/update") =>
            {
                // `progress` changes a turn only on a retry report, or on output while it retries.
                match frame.session_update() {
                    Some("retry_state") => false,
                    Some("agent_message_chunk" | "agent_thought_chunk" | "tool_call") => {
                        self.turns.values().all(|t| t.retry.is_none())
                    }
                    _ => true,
                }
            }
            _ => true,
        }
    }

    fn on_timer(&mut self, check: Check, cx: &mut Cx) {
        self.check(&check.session, check.generation, cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

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
        Harness::of(GrokFailure::new(Duration::from_secs(60)))
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
        assert!(parse_reason(&long).text.len() <= REASON_MAX + 3);
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
        assert_eq!(kind_of(&parse_reason(page)), None);
        assert_eq!(kind_of(&parse_reason(SERVER)), None);
        // A status only where Grok writes one: three digits, then its text.
        assert_eq!(parse_reason("API error (status 5031 x): y").status, None);
        assert_eq!(parse_reason("API error (status 503): y").status, Some(503));
        assert_eq!(kind_of(&parse_reason("upstream said 503 Service Unavailable")), None);
    }

    #[test]
    fn a_timer_of_an_earlier_turn_never_stops_a_later_one() {
        let mut layer = GrokFailure::new(Duration::from_secs(60));
        let mut cx = Cx::default();
        layer.from_client(prompt(4), &mut cx);
        layer.from_agent(retry(1, QUOTA, "rate_limited"), &mut cx);
        let earlier = layer.generation(S).expect("a turn");
        let answer = json!({"jsonrpc":"2.0","id":4,"error":{"code":-32003,"message":"Rate limited","data":QUOTA}});
        layer.from_agent(parse(answer), &mut cx);
        layer.from_client(prompt(5), &mut cx);
        layer.from_agent(retry(1, QUOTA, "rate_limited"), &mut cx);
        layer.check(S, earlier, &mut cx);
        assert!(layer.turns[S].stopped.is_none(), "the first turn's timer fired in the second");
        let now = layer.generation(S).expect("a turn");
        layer.check(S, now, &mut cx);
        assert!(layer.turns[S].stopped.is_some());
    }

    #[test]
    fn a_retry_that_succeeds_disarms_the_check_and_a_reset_stays_plain() {
        let mut layer = GrokFailure::new(Duration::from_secs(60));
        let mut cx = Cx::default();
        layer.from_client(prompt(7), &mut cx);
        layer.from_agent(retry(1, SERVER, "api"), &mut cx);
        let generation = layer.generation(S).expect("a turn");
        let chunk = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}});
        layer.from_agent(parse(chunk), &mut cx);
        layer.check(S, generation, &mut cx);
        assert!(layer.turns[S].stopped.is_none());
        assert_eq!(kind_of(&parse_reason("error sending request: connection reset")), None);
        assert_eq!(kind_of(&parse_reason(SERVER)), None);
        assert_eq!(kind_of(&parse_reason(QUOTA)), Some(Kind::Quota));
    }
}

//! Failed OpenCode turns as Coda's failure answer (section 执行失败), sans-IO.
//!
//! Seen live on OpenCode 1.18.33 (openai-compatible provider): a failed model request is retried silently over
//! ACP (its server says `session.status {type: "retry", attempt, message, next}`), honouring `Retry-After`
//! (a two-hour wait for a usage window is waited out); when the retries end, the prompt is answered with
//! `-32603 "Internal error: <upstream message>"`, `data: {errorName: "APIError"}`: no status, no upstream code.
//! The server's `session.error` carries them (`error.data.statusCode`, `responseBody`), so the layer classifies
//! by the upstream's own error code in that body and holds an error answer until that event has come (at most
//! [`ANSWER_HOLD`]):
//!
//! | upstream code (`error.code` or `error.type` of the body) | Coda |
//! | --- | --- |
//! | `insufficient_quota`, `exceeded_current_quota_error` | `quota_exhausted` |
//! | `rate_limit_exceeded`, `server_error`, `server_is_overloaded`, `overloaded_error` | `service_unavailable`, `input: accepted` |
//! | `invalid_api_key` (HTTP 401) | -32000 (a login problem) |
//! | none, HTTP 503 (a body of plain text: "Service Unavailable: `<body>`") | `service_unavailable`, `input: accepted` |
//! | none (a 502 page, a dropped connection) | the plain error |
//!
//! HTTP 503 is an explicit reason of its own (RFC 9110: the server is temporarily unable to handle the request,
//! overloaded or in maintenance); no other status is (a 429 may be a quota or a rate limit, a status never names a
//! quota).
//!
//! When a retry OpenCode scheduled would keep the turn retrying past [`failure::retry_patience`] (counted from
//! its first retry of the turn to the attempt it scheduled), the layer stops the run (`session/cancel`) and
//! answers with the reason and the time of the attempt OpenCode had planned. All OpenCode says of a retry is
//! `session.status {type: "retry", attempt, message, next}` (its bundle sets nothing else; seen live): no status,
//! body or code. A stopped run brings no `session.error`; OpenCode's log file has only `stream error …
//! error.error="AI_APICallError: <message>"` and its database nothing of the failure. The message is the
//! upstream's own words (`You exceeded your current quota, …` for an `insufficient_quota`), except for a body
//! whose message OpenCode could not read: then it starts with the status's standard text (Node's
//! `STATUS_CODES[status]`), `Service Unavailable: <body>` for a 503. So a stopped run is `service_unavailable`
//! (`input: accepted`, `retryAfterMs`: the wait OpenCode had planned) when its message starts with the text of a
//! 503, and a plain error otherwise: the upstream's words are not read for a kind (执行失败: a long wait without
//! an explicit reason is a plain error).

use std::collections::HashMap;
use std::time::Duration;

use crate::coda::failure::{self, Input, Kind};
use crate::frame::{self, Frame, Id};
use serde_json::{Value, json};

/// Longest wait for OpenCode's `session.error` after its error answer to a prompt.
pub const ANSWER_HOLD: Duration = Duration::from_secs(2);

/// Longest upstream message kept in an answer.
const MESSAGE_MAX: usize = 2000;

/// What OpenCode's server said about a failed run (`session.error`).
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub message: String,
    pub status: Option<u64>,
    /// `error.code`, else `error.type`, of the upstream's answer body.
    pub code: Option<String>,
}

#[derive(Default)]
struct Turn {
    prompt: Option<Id>,
    /// OpenCode's time (ms) of the first retry of the turn.
    retry_since: Option<u64>,
    /// The shim stopped the run: the answer's message and kind.
    stopped: Option<(String, Option<Kind>)>,
    failed: Option<Upstream>,
    /// OpenCode's error answer, waiting for `session.error`, with its hold tag.
    held: Option<(Frame, u64)>,
}

/// Prompts of one session tracked at most (a client that sends more before OpenCode answers breaks ACP; the
/// oldest is then answered as OpenCode answers it).
const TURNS_KEPT: usize = 16;

/// Failed turns of every session.
pub struct Failures {
    /// By session, oldest first: the first is the run OpenCode's server reports on (a prompt sent while another
    /// runs waits for it).
    turns: HashMap<String, Vec<Turn>>,
    patience: Duration,
    next_tag: u64,
}

impl Failures {
    pub fn new(patience: Duration) -> Failures {
        Failures { turns: HashMap::new(), patience, next_tag: 0 }
    }

    /// Coda sent prompt `id` of `session`.
    pub fn prompt(&mut self, id: &Id, session: &str) {
        let turns = self.turns.entry(session.to_owned()).or_default();
        if turns.len() == TURNS_KEPT {
            turns.remove(0);
        }
        turns.push(Turn { prompt: Some(id.clone()), ..Turn::default() });
    }

    /// The run of `session` OpenCode's server reports on.
    fn running(&mut self, session: &str) -> Option<&mut Turn> {
        self.turns.get_mut(session)?.first_mut()
    }

    /// OpenCode will retry a request of `session` at `at_ms + wait_ms`. True: stop the run now.
    pub fn retry(&mut self, session: &str, at_ms: u64, attempt: u64, message: &str, wait_ms: Option<u64>) -> bool {
        let patience = self.patience.as_millis() as u64;
        let Some(turn) = self.running(session).filter(|t| t.prompt.is_some() && t.stopped.is_none()) else {
            return false;
        };
        let since = *turn.retry_since.get_or_insert(at_ms);
        let wait = wait_ms.unwrap_or(0);
        let until = at_ms.saturating_add(wait);
        if until.saturating_sub(since) <= patience {
            return false;
        }
        let planned = jiff::Timestamp::from_millisecond(until.min(i64::MAX as u64) as i64)
            .map(failure::time_mark)
            .unwrap_or_else(|_| format!("in {} s", wait / 1000));
        let text = format!(
            "{}\nOpenCode was retrying (attempt {attempt}) and had planned its next attempt for {planned}, {:.1} s \
             away: stopped after over a minute of retries.",
            clip(message),
            wait as f64 / 1000.0
        );
        turn.stopped = Some((text, kind_of_retry(message, wait)));
        true
    }

    /// `session.error` of `session`: the held answer, if any, to send now.
    pub fn failed(&mut self, session: &str, upstream: Upstream) -> Option<Frame> {
        let turn = self.running(session)?;
        turn.failed = Some(upstream);
        let (held, _) = turn.held.take()?;
        Some(self.answer_now(session, held))
    }

    /// OpenCode's answer to a prompt (`Ok`: pass it on), or `Err(tag)`: held until `session.error` or
    /// [`Failures::hold_over`] with that tag.
    pub fn answer(&mut self, reply: Frame) -> Result<Frame, u64> {
        // The session whose turn the prompt it answers started.
        let Some(id) = reply.id() else { return Ok(reply) };
        let found = self.turns.iter_mut().find_map(|(s, turns)| {
            let turn = turns.iter_mut().find(|t| t.prompt.as_ref() == Some(id))?;
            Some((s.clone(), turn))
        });
        let Some((session, turn)) = found else { return Ok(reply) };
        let is_api_error = reply.value().pointer("/error/data/errorName").and_then(Value::as_str) == Some("APIError");
        if is_api_error && turn.failed.is_none() && turn.stopped.is_none() {
            self.next_tag += 1;
            turn.held = Some((reply, self.next_tag));
            return Err(self.next_tag);
        }
        Ok(self.answer_now(&session, reply))
    }

    /// The hold `tag` ran out: the answer goes on as it is.
    pub fn hold_over(&mut self, tag: u64) -> Option<Frame> {
        let held = |t: &Turn| t.held.as_ref().is_some_and(|(_, h)| *h == tag);
        let (session, at) = self.turns.iter().find_map(|(s, turns)| Some((s.clone(), turns.iter().position(held)?)))?;
        tracing::warn!("OpenCode's server said nothing of the failed run of session {session}; answering as it is");
        let turn = self.take(&session, at);
        turn.held.map(|(f, _)| f)
    }

    /// Every answer held for `session.error`, oldest first, as it is (OpenCode is gone: no event will come).
    pub fn release_all(&mut self) -> Vec<Frame> {
        let mut sessions: Vec<String> = self.turns.keys().cloned().collect();
        sessions.sort();
        let mut out = Vec::new();
        for s in sessions {
            for turn in self.turns.get_mut(&s).into_iter().flatten() {
                out.extend(turn.held.take().map(|(f, _)| f));
            }
        }
        out
    }

    /// Removes the turn at `at` of `session` (the session's entry with its last).
    fn take(&mut self, session: &str, at: usize) -> Turn {
        let turns = self.turns.get_mut(session).expect("a session with turns");
        let turn = turns.remove(at);
        if turns.is_empty() {
            self.turns.remove(session);
        }
        turn
    }

    fn answer_now(&mut self, session: &str, reply: Frame) -> Frame {
        let Some(id) = reply.id().cloned() else { return reply };
        let at = self.turns.get(session).and_then(|turns| turns.iter().position(|t| t.prompt.as_ref() == Some(&id)));
        let Some(at) = at else { return reply };
        let turn = self.take(session, at);
        if let Some((message, kind)) = turn.stopped {
            return failure::answer(&id, &message, kind.as_ref(), Some(json!({"opencode": {"stopped": true}})));
        }
        let v = reply.value();
        let (Some(error), Some(upstream)) = (v.get("error"), turn.failed) else { return reply };
        let data =
            json!({"opencode": {"errorName": upstream.name, "statusCode": upstream.status, "code": upstream.code}});
        let message = error.get("message").and_then(Value::as_str).map(clip).unwrap_or_else(|| clip(&upstream.message));
        match verdict(&upstream) {
            Verdict::Kind(kind) => failure::answer(&id, &message, Some(&kind), Some(data)),
            Verdict::Auth => frame::error_response(&id, -32000, &message, Some(data)),
            Verdict::Plain => reply,
        }
    }
}

enum Verdict {
    Kind(Kind),
    Auth,
    Plain,
}

/// What a failed run is for Coda: the upstream's code, else its status 503.
fn verdict(upstream: &Upstream) -> Verdict {
    match (upstream.code.as_deref().map(kind_of), upstream.status) {
        (Some(v @ (Verdict::Kind(_) | Verdict::Auth)), _) => v,
        (_, Some(503)) => Verdict::Kind(Kind::Service { input: Some(Input::Accepted), retry_after_ms: None }),
        _ => Verdict::Plain,
    }
}

/// The kind of a run the shim stopped, from the message of OpenCode's last retry (see the module's notes): only
/// the status text OpenCode writes for a 503 whose body it could not read names one.
fn kind_of_retry(message: &str, wait_ms: u64) -> Option<Kind> {
    let unavailable =
        message.strip_prefix(SERVICE_UNAVAILABLE).is_some_and(|rest| rest.is_empty() || rest.starts_with(": "));
    unavailable.then_some(Kind::Service { input: Some(Input::Accepted), retry_after_ms: Some(wait_ms) })
}

/// Node's `STATUS_CODES[503]`, which OpenCode writes for the status of a body it could not read.
const SERVICE_UNAVAILABLE: &str = "Service Unavailable";

fn kind_of(code: &str) -> Verdict {
    match code {
        "insufficient_quota" | "exceeded_current_quota_error" => Verdict::Kind(Kind::Quota),
        "rate_limit_exceeded" | "server_error" | "server_is_overloaded" | "overloaded_error" => {
            Verdict::Kind(Kind::Service { input: Some(Input::Accepted), retry_after_ms: None })
        }
        "invalid_api_key" => Verdict::Auth,
        _ => Verdict::Plain,
    }
}

fn clip(s: &str) -> String {
    failure::clip(s, MESSAGE_MAX)
}

/// Reads `session.error`'s `error` (`{name, data: {message, statusCode, responseBody}}`); the body is the
/// upstream's answer as text, read for its `error.code` or `error.type` (bounded: bodies over 64 KiB are not read).
pub fn upstream_of(error: &Value) -> Upstream {
    let data = error.get("data").unwrap_or(&Value::Null);
    let body = data
        .get("responseBody")
        .and_then(Value::as_str)
        .filter(|b| b.len() <= 64 * 1024)
        .and_then(|b| crate::json::from_str::<Value>(b).ok());
    let code = body.as_ref().and_then(|b| {
        let e = b.get("error")?;
        e.get("code").or_else(|| e.get("type")).and_then(Value::as_str).map(str::to_owned)
    });
    Upstream {
        name: error.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
        message: data.get("message").and_then(Value::as_str).unwrap_or_default().to_owned(),
        status: data.get("statusCode").and_then(Value::as_u64),
        code: code.filter(|c| c.len() <= 64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "ses_dcec1680fffeS1pejVkxgpQHrI";

    fn api_error(id: u64, message: &str) -> Frame {
        Frame::from_value(
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32603,"message":format!("Internal error: {message}"),
            "data":{"service":"session","errorName":"APIError"}}}),
        )
    }

    fn session_error(code: &str, status: u64) -> Upstream {
        let body = json!({"error":{"code":code,"message":"m","type":code}}).to_string();
        upstream_of(
            &json!({"name":"APIError","data":{"message":"m","statusCode":status,"isRetryable":true,"responseBody":body}}),
        )
    }

    fn error(f: &Frame) -> Value {
        f.value().get("error").cloned().unwrap_or(Value::Null)
    }

    #[test]
    fn an_error_answer_waits_for_the_server_and_is_classified_by_the_upstream_code() {
        for (code, status, want) in [
            ("insufficient_quota", 429, json!({"kind":"quota_exhausted"})),
            ("rate_limit_exceeded", 429, json!({"kind":"service_unavailable","input":"accepted"})),
            ("server_is_overloaded", 503, json!({"kind":"service_unavailable","input":"accepted"})),
        ] {
            let mut f = Failures::new(Duration::from_secs(60));
            f.prompt(&Id::from_json("4"), S);
            let tag = f.answer(api_error(4, "You exceeded your current quota")).expect_err("held");
            assert!(tag > 0);
            let out = f.failed(S, session_error(code, status)).expect("released");
            let e = error(&out);
            assert_eq!(e["code"], -32603);
            assert_eq!(e["message"], "Internal error: You exceeded your current quota");
            assert_eq!(e["data"]["_meta"]["coda"]["failure"], want, "{code}");
        }
    }

    #[test]
    fn the_server_first_then_the_answer_and_auth_and_bodyless_errors() {
        let mut f = Failures::new(Duration::from_secs(60));
        f.prompt(&Id::from_json("5"), S);
        assert!(f.failed(S, session_error("invalid_api_key", 401)).is_none());
        let e = error(&f.answer(api_error(5, "Incorrect API key provided.")).expect("not held"));
        assert_eq!(e["code"], -32000);
        assert!(e.pointer("/data/_meta").is_none());
        // A 502 page: no code in the body, the answer stays as OpenCode gave it.
        f.prompt(&Id::from_json("6"), S);
        let page = json!({"name":"APIError","data":{"message":"Bad Gateway","statusCode":502,"responseBody":"<html>502</html>"}});
        f.failed(S, upstream_of(&page));
        let a = api_error(6, "Bad Gateway");
        assert_eq!(f.answer(a.clone()).expect("not held").value(), a.value());
        // No event at all: the hold runs out and the answer goes on as it is.
        f.prompt(&Id::from_json("7"), S);
        let tag = f.answer(api_error(7, "x")).expect_err("held");
        assert_eq!(f.hold_over(tag).map(|f| f.value().clone()), Some(api_error(7, "x").value().clone()));
    }

    #[test]
    fn a_retry_planned_past_a_minute_stops_the_run() {
        let mut f = Failures::new(Duration::from_secs(60));
        f.prompt(&Id::from_json("8"), S);
        assert!(!f.retry(S, 1_000, 1, "Rate limit", Some(2_000)));
        assert!(!f.retry(S, 3_000, 2, "Rate limit", Some(50_000)));
        // Retry-After: 7200 -> the next attempt two hours away.
        assert!(f.retry(S, 60_000, 3, "You exceeded your current quota", Some(7_200_000)));
        assert!(!f.retry(S, 60_001, 4, "again", Some(7_200_000)), "asked once");
        let out = f.answer(Frame::from_value(&json!({"jsonrpc":"2.0","id":8,"result":{"stopReason":"cancelled"}})));
        let e = error(&out.expect("not held"));
        assert_eq!(e["code"], -32603);
        assert!(e.pointer("/data/_meta/coda").is_none(), "no explicit reason, no kind: {e}");
        let m = e["message"].as_str().unwrap_or_default();
        assert!(m.starts_with("You exceeded your current quota\nOpenCode was retrying (attempt 3)"), "{m}");
        assert!(m.contains("<t:1970-01-01T02:01:00.000Z>") && m.contains("7200.0 s away"), "{m}");
    }

    /// The layers of coda-opencode, with what OpenCode 1.18.33 sent for a 503 whose body is a line of text
    /// (`[[error:503-text]]` of the live rig), frame for frame.
    mod as_sent {
        use super::*;
        use crate::adapters::opencode::rig::{P, Rig};
        use crate::adapters::opencode::server::{Reducer, ServerEvent};

        const MESSAGE: &str = "Service Unavailable: the engine is currently overloaded";

        fn answer(id: u64) -> Value {
            json!({"jsonrpc":"2.0","id":id,"error":{"code":-32603,"message":format!("Internal error: {MESSAGE}"),
                "data":{"service":"session","errorName":"APIError"}}})
        }

        /// OpenCode's server event, as its `/global/event` stream carries it.
        fn session_error() -> ServerEvent {
            let line = json!({"directory":"/w","project":"global","payload":{"id":"evt_2334cfc2e001wX1KCPmv509EiF",
                "type":"session.error","properties":{"sessionID":P,"error":{"name":"APIError","data":{
                "message":MESSAGE,"statusCode":503,"isRetryable":true,"responseHeaders":{"content-length":"34",
                "content-type":"text/plain","date":"Tue, 01 Dec 2026 20:30:13 GMT","retry-after":"0",
                "retry-after-ms":"100"},"responseBody":"the engine is currently overloaded",
                "metadata":{"url":"http://127.0.0.1:34343/v1/chat/completions"}}}}}});
            Reducer::default().reduce(&line).expect("a session.error")
        }

        fn retry(message: &str, wait_ms: u64) -> ServerEvent {
            ServerEvent::Retry {
                session: P.into(),
                attempt: 1,
                message: message.into(),
                at_ms: 1796156810729,
                wait_ms: Some(wait_ms),
            }
        }

        /// OpenCode's answer to a prompt whose run was cancelled.
        fn ended(id: u64) -> Value {
            json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn",
                "usage":{"inputTokens":0,"outputTokens":0,"totalTokens":0},"_meta":{}}})
        }

        fn error(out: &[Value]) -> Value {
            out.first().and_then(|f| f.get("error")).cloned().unwrap_or(Value::Null)
        }

        #[test]
        fn a_503_whose_body_has_no_code_is_service_unavailable_by_its_status() {
            let mut rig = Rig::started();
            rig.prompt(3);
            assert_eq!(rig.raw_agent(answer(3)), (vec![], vec![]), "held for OpenCode's session.error");
            let (to_client, _) = rig.server(session_error());
            let e = error(&to_client);
            assert_eq!(e["code"], -32603);
            assert_eq!(e["message"], format!("Internal error: {MESSAGE}"));
            assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind":"service_unavailable","input":"accepted"}));
            assert_eq!(e["data"]["opencode"], json!({"errorName":"APIError","statusCode":503,"code":null}));
        }

        #[test]
        fn a_stopped_retry_of_a_503_is_service_unavailable_with_the_wait_opencode_planned() {
            let mut rig = Rig::started();
            rig.prompt(4);
            // Retry-After: 90 -> OpenCode plans its next attempt 90 s on: the shim stops the run at once.
            let (_, to_agent) = rig.server(retry(MESSAGE, 89_999));
            assert_eq!(to_agent, vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":P}})]);
            let e = error(&rig.raw_agent(ended(4)).0);
            assert_eq!(e["code"], -32603);
            assert_eq!(
                e["data"]["_meta"]["coda"]["failure"],
                json!({"kind":"service_unavailable","input":"accepted","retryAfterMs":89_999})
            );
            let m = e["message"].as_str().unwrap_or_default();
            assert!(m.starts_with(&format!("{MESSAGE}\nOpenCode was retrying (attempt 1)")), "{m}");
            assert!(m.contains("<t:2026-12-01T20:28:20.728Z>, 90.0 s away"), "{m}");

            // A retry that names no 503 stays a plain error: OpenCode's retry carries only the upstream's words,
            // for `insufficient_quota` with Retry-After 7200 (seen live) and for an OpenAI-shaped 503
            // (`server_is_overloaded`, whose code it drops).
            for message in [
                "You exceeded your current quota, please check your plan and billing details.",
                "The server is overloaded, please try again later.",
                "Service Unavailable Soon",
            ] {
                let mut rig = Rig::started();
                rig.prompt(5);
                assert_eq!(rig.server(retry(message, 7_200_000)).1.len(), 1, "stopped");
                let e = error(&rig.raw_agent(ended(5)).0);
                assert_eq!(e["code"], -32603);
                assert!(e.pointer("/data/_meta").is_none(), "{message}: {e}");
                assert_eq!(e["data"]["opencode"]["stopped"], true);
            }
        }
    }

    #[test]
    fn hostile_server_errors_are_read_safely() {
        let huge = "x".repeat(70 * 1024);
        let u = upstream_of(&json!({"name":"APIError","data":{"responseBody":huge,"statusCode":1e300}}));
        assert_eq!((u.code, u.status), (None, None));
        let u = upstream_of(&json!({"data":{"responseBody":"{\"error\":{\"code\":\"\u{fffd}bad\"}}"}}));
        assert!(matches!(kind_of(u.code.as_deref().unwrap_or_default()), Verdict::Plain));
        let u = upstream_of(&json!("not an object"));
        assert_eq!(u.name, "");
        let mut f = Failures::new(Duration::from_secs(60));
        f.prompt(&Id::from_json("9"), S);
        assert!(f.retry(S, 5, 1, &"é".repeat(20_000), Some(u64::MAX)));
    }

    #[test]
    fn a_second_prompt_leaves_the_first_ones_held_answer_and_failure_with_it() {
        // A client that breaks ACP sends a second prompt while OpenCode's error answer to the first waits for
        // `session.error`: the first is still answered, with the failure the event names; the second as it comes.
        let mut f = Failures::new(Duration::from_secs(60));
        f.prompt(&Id::from_json("4"), S);
        let tag = f.answer(api_error(4, "You exceeded your current quota")).expect_err("held");
        f.prompt(&Id::from_json("5"), S);
        let first = f.failed(S, session_error("insufficient_quota", 429)).expect("the held answer");
        assert_eq!(first.id(), Some(&Id::from_json("4")));
        assert_eq!(error(&first)["data"]["_meta"]["coda"]["failure"]["kind"], "quota_exhausted");
        assert!(f.hold_over(tag).is_none(), "answered once");
        let ok = Frame::from_value(&json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}));
        assert_eq!(f.answer(ok.clone()).expect("not held").value(), ok.value());
        // Held when OpenCode is gone: it goes on as it is.
        f.prompt(&Id::from_json("6"), S);
        f.answer(api_error(6, "x")).expect_err("held");
        assert_eq!(f.release_all().len(), 1);
        assert!(f.release_all().is_empty());
    }
}

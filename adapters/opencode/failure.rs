//! Failed OpenCode turns as Coda's failure answer (section 执行失败), sans-IO.
//!
//! Seen live on OpenCode 1.18.33 (openai-compatible provider): a failed model request is retried silently over
//! ACP (its server says `session.status {type: "retry", attempt, message, next}`), honouring `Retry-After`
//! (a two-hour wait for a usage window is waited out); when the retries end, the prompt is answered with
//! `-32603 "Internal error: <upstream message>"`, `data: {errorName: "APIError"}`: no status, no upstream code.
//! The server's `session.error` carries them (`error.data.statusCode`, `responseBody`), so the layer classifies
//! by the upstream's own error code in that body, else its status, by the rule all binaries share
//! ([`failure::upstream`]); the engine's failure layer holds an error answer until that event has come (at most
//! [`failure::ANSWER_HOLD`]). Without either (a 502 page, a dropped connection) the answer stays the plain error.
//!
//! Each retry is one for the engine's one-minute rule ([`crate::coda::failure`]), stamped with the time it was
//! read and the wait to the attempt OpenCode scheduled; a run the rule stops is answered with the reason and the
//! time of the attempt OpenCode had planned. All OpenCode says of a retry is
//! `session.status {type: "retry", attempt, message, next}` (its bundle sets nothing else; seen live): no status,
//! body or code. A stopped run brings no `session.error`; OpenCode's log file has only `stream error …
//! error.error="AI_APICallError: <message>"` and its database nothing of the failure. The message is the
//! upstream's own words (`You exceeded your current quota, …` for an `insufficient_quota`), except for a body
//! whose message OpenCode could not read: then it starts with the status's standard text (Node's
//! `STATUS_CODES[status]`), `Service Unavailable: <body>` for a 503. So a stopped run is `service_unavailable`
//! (`input: accepted`, `retryAfterMs`: the wait OpenCode had planned) when its message starts with the text of a
//! 503, and a plain error otherwise: the upstream's words are not read for a kind (执行失败: a long wait without
//! an explicit reason is a plain error).

use std::time::{Duration, SystemTime};

use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::coda::failure::{self, Failure, Kind, Retry, Signal, Signals, Verdict};
use crate::frame::Frame;
use serde_json::{Value, json};

/// What OpenCode's server said about a failed run (`session.error`).
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub message: String,
    pub status: Option<u64>,
    /// `error.code`, else `error.type`, of the upstream's answer body.
    pub code: Option<String>,
}

/// What a failed run is for Coda: what the upstream's code, else its status, names ([`failure::upstream`]).
fn verdict(upstream: &Upstream) -> Verdict {
    failure::upstream(upstream.code.as_deref(), upstream.status)
}

/// The kind of a run the shim stopped, from the message of OpenCode's last retry (see the module's notes): only
/// the status text OpenCode writes for a 503 whose body it could not read names one.
fn kind_of_retry(message: &str) -> Verdict {
    let unavailable =
        message.strip_prefix(SERVICE_UNAVAILABLE).is_some_and(|rest| rest.is_empty() || rest.starts_with(": "));
    if unavailable { Verdict::Kind(Kind::SERVICE) } else { Verdict::Plain }
}

/// Node's `STATUS_CODES[503]`, which OpenCode writes for the status of a body it could not read.
const SERVICE_UNAVAILABLE: &str = "Service Unavailable";

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

/// Where OpenCode's failure signals are: its server's `session.status` `retry` and `session.error` (the set-up
/// routes them here), and its error answers.
pub struct OpenCode;

impl Signals for OpenCode {
    type Event = FromServer;
    type Record = Upstream;

    fn on_event(&mut self, event: FromServer, out: &mut Vec<Signal<Upstream>>) {
        match event {
            FromServer::Event(ServerEvent::Retry { session, attempt, message, at_ms, wait_ms }) => {
                let verdict = kind_of_retry(&message);
                let retry = Retry {
                    reason: message,
                    verdict,
                    at_ms: Some(at_ms),
                    wait_ms,
                    attempt: Some(attempt),
                    attempts: None,
                    data: Some(json!({"opencode": {"stopped": true}})),
                };
                out.push(Signal::Retrying { session, retry });
            }
            FromServer::Event(ServerEvent::Failed { session, name, message, status, code }) => {
                out.push(Signal::Ended { session, turn: None, record: Upstream { name, message, status, code } });
            }
            _ => {}
        }
    }

    /// OpenCode's error answer says none of the upstream's status or code: its server's `session.error` does.
    fn awaits_record(&self, _: &str, answer: &Frame) -> bool {
        answer.value().pointer("/error/data/errorName").and_then(Value::as_str) == Some("APIError")
    }

    fn failure(&self, answer: &Frame, record: Option<Upstream>, _: SystemTime) -> Option<Failure> {
        let upstream = record?;
        let error = answer.value().get("error")?;
        let data =
            json!({"opencode": {"errorName": upstream.name, "statusCode": upstream.status, "code": upstream.code}});
        let message = error.get("message").and_then(Value::as_str).unwrap_or(&upstream.message);
        let verdict = verdict(&upstream);
        // Without an explicit reason the answer stays as OpenCode gave it.
        (verdict != Verdict::Plain).then(|| Failure { verdict, message: message.to_owned(), data: Some(data) })
    }

    fn retrying(&self, r: &Retry, _: Duration) -> String {
        let wait = r.wait_ms.unwrap_or(0);
        let until = r.at_ms.unwrap_or(0).saturating_add(wait);
        let planned = jiff::Timestamp::from_millisecond(until.min(i64::MAX as u64) as i64)
            .map(failure::time_mark)
            .unwrap_or_else(|_| format!("in {} s", wait / 1000));
        format!(
            "OpenCode was retrying (attempt {}) and had planned its next attempt for {planned}, {:.1} s away",
            r.attempt.unwrap_or(0),
            wait as f64 / 1000.0
        )
    }
}

/// coda-opencode's failure layer.
pub type Failures = failure::FailureKinds<OpenCode>;

/// The layer, stopping retries after `patience`.
pub fn layer(patience: Duration) -> Failures {
    failure::FailureKinds::new(OpenCode, patience)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

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

    fn error_v(v: &Value) -> Value {
        v.get("error").cloned().unwrap_or(Value::Null)
    }

    fn harness() -> Harness {
        let mut h = Harness::of(layer(Duration::from_secs(60)));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.take();
        h
    }

    fn prompt(h: &mut Harness, id: u64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}));
        h.take();
    }

    fn failed(h: &mut Harness, u: Upstream) {
        h.event(
            0,
            FromServer::Event(ServerEvent::Failed {
                session: S.into(),
                name: u.name,
                message: u.message,
                status: u.status,
                code: u.code,
            }),
        );
    }

    fn retry(h: &mut Harness, at_ms: u64, attempt: u64, message: &str, wait_ms: Option<u64>) -> Vec<Value> {
        let e = ServerEvent::Retry { session: S.into(), attempt, message: message.into(), at_ms, wait_ms };
        h.event(0, FromServer::Event(e));
        h.to_agent()
    }

    #[test]
    fn an_error_answer_waits_for_the_server_and_is_classified_by_the_upstream_code() {
        for (code, status, want) in [
            ("insufficient_quota", 429, json!({"kind":"quota_exhausted"})),
            ("rate_limit_exceeded", 429, json!({"kind":"service_unavailable","input":"accepted"})),
            ("server_is_overloaded", 503, json!({"kind":"service_unavailable","input":"accepted"})),
        ] {
            let mut h = harness();
            prompt(&mut h, 4);
            h.agent_frame(api_error(4, "You exceeded your current quota"));
            assert!(h.to_client().is_empty(), "held");
            assert_eq!(h.next_wake(), Some(failure::ANSWER_HOLD));
            failed(&mut h, session_error(code, status));
            let e = error_v(&h.to_client()[0]);
            assert_eq!(e["code"], -32603);
            assert_eq!(e["message"], "Internal error: You exceeded your current quota");
            assert_eq!(e["data"]["_meta"]["coda"]["failure"], want, "{code}");
        }
    }

    #[test]
    fn the_server_first_then_the_answer_and_auth_and_bodyless_errors() {
        let mut h = harness();
        prompt(&mut h, 5);
        failed(&mut h, session_error("invalid_api_key", 401));
        h.agent_frame(api_error(5, "Incorrect API key provided."));
        let e = error_v(&h.to_client()[0]);
        assert_eq!(e["code"], -32000);
        assert!(e.pointer("/data/_meta").is_none());
        // A 502 page: no code in the body, the answer stays as OpenCode gave it.
        prompt(&mut h, 6);
        let page = json!({"name":"APIError","data":{"message":"Bad Gateway","statusCode":502,"responseBody":"<html>502</html>"}});
        failed(&mut h, upstream_of(&page));
        let a = api_error(6, "Bad Gateway");
        h.agent_frame(a.clone());
        assert_eq!(h.to_client(), [a.value().clone()]);
        // No event at all: the hold runs out and the answer goes on as it is.
        prompt(&mut h, 7);
        h.agent_frame(api_error(7, "x"));
        h.advance(failure::ANSWER_HOLD);
        assert_eq!(h.to_client(), [api_error(7, "x").value().clone()]);
    }

    #[test]
    fn a_retry_planned_past_a_minute_stops_the_run() {
        let mut h = harness();
        prompt(&mut h, 8);
        assert!(retry(&mut h, 1_000, 1, "Rate limit", Some(2_000)).is_empty());
        assert!(retry(&mut h, 3_000, 2, "Rate limit", Some(50_000)).is_empty());
        // Retry-After: 7200 -> the next attempt two hours away.
        let stop = retry(&mut h, 60_000, 3, "You exceeded your current quota", Some(7_200_000));
        assert_eq!(stop, [json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        assert!(retry(&mut h, 60_001, 4, "again", Some(7_200_000)).is_empty(), "asked once");
        h.from_agent(json!({"jsonrpc":"2.0","id":8,"result":{"stopReason":"cancelled"}}));
        let e = error_v(&h.to_client()[0]);
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
        assert_eq!(verdict(&u), Verdict::Plain);
        let u = upstream_of(&json!("not an object"));
        assert_eq!(u.name, "");
        let mut h = harness();
        prompt(&mut h, 9);
        assert_eq!(retry(&mut h, 5, 1, &"é".repeat(20_000), Some(u64::MAX)).len(), 1, "stopped");
        h.from_agent(json!({"jsonrpc":"2.0","id":9,"result":{"stopReason":"cancelled"}}));
        let e = error_v(&h.to_client()[0]);
        assert!(e["message"].as_str().is_some_and(|m| m.len() < failure::REASON_MAX + 200), "{e}");
    }
}

//! Where coda-acp finds an agent's explicit failure signals (section 执行失败; the rules are
//! [`crate::coda::failure`]'s), as its profile says ([`FailuresBy`]). Only a failed turn's error answer says
//! anything over ACP: none of the checked agents reports its retries to a client that is not JetBrains AIR, so
//! the engine's one-minute rule has no retry to count, and a turn they retry for minutes stays open until they
//! answer (seen live: docs/acp-agents.md, "Upstream errors").
//!
//! - **Gemini CLI 0.61.0** (`gemini-status`): a failed turn is the JSON-RPC error `{code: <the upstream's HTTP
//!   status>, message: <its own reading of the upstream's error>}`, no `data`. `You have exhausted your daily
//!   quota on this model.` is its message for a 429 whose `QuotaFailure` names a per-day quota (its
//!   `TerminalQuotaError`, answered at once): `quota_exhausted`. A 503 (answered after its own retries, about
//!   four minutes) is `service_unavailable` by the shared rule ([`failure::upstream`]); any other status, a plain
//!   error.
//! - **Claude Agent ACP 0.101.0** (`claude-error-kind`): a failed turn is `-32603` with `data.errorKind`, the
//!   Claude Agent SDK's classification of the upstream's error (its `SDKAssistantMessageError`) once Claude
//!   Code's own retries are over: `rate_limit`, `overloaded`, `billing_error` and `authentication_failed` name
//!   Anthropic's error types `rate_limit_error`, `overloaded_error`, `billing_error` and
//!   `authentication_error`, read by the shared rule with the status its message quotes (`API Error: 503
//!   Service Unavailable. …`: a `server_error` of a 503 is `service_unavailable`); the others name no kind. A
//!   429 is Anthropic's `rate_limit_error` even for a usage limit (`This request would exceed your account's
//!   usage limit.`): `service_unavailable`, never a quota from a status or a message.
//! - **Qwen Code 0.24.4** (`qwen-status`): it retries a 429 or a 503 itself, silently, up to its setting
//!   `model.generationConfig.maxRetries` (10) times, each wait the longer of its back-off (from
//!   `retryInitialDelayMs`, 60 s, doubling up to `retryMaxDelayMs`, 5 min) and the upstream's `Retry-After`:
//!   about 40 minutes by default (its profile bounds them: [`super::defaults_file`]). Then it answers: a 429 as `{code: 429, message: "Rate limit exceeded. Try
//!   again later."}` (a quota or a rate limit alike: a plain error, never a kind from a status), anything else as
//!   `-32603` with the upstream's status first in `data.details` (`503 The server is overloaded, …`): a 503 is
//!   `service_unavailable` by the shared rule. A quota message Qwen itself recognises (`quota … exhausted … reset`)
//!   it answers at once as `Quota exhausted: …` in `data.details` with no status: a plain error too, since it says
//!   no upstream code.

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::profile::FailuresBy;
use crate::coda::failure::{self, Failure, Kind, REASON_MAX, Retry, Signals, Verdict};
use crate::frame::Frame;

/// The upstream's HTTP status at the start of Qwen Code's `data.details` (`503 The server is overloaded, …`).
fn leading_status(details: &str) -> Option<u64> {
    let digits = details.get(..3).filter(|d| d.bytes().all(|b| b.is_ascii_digit()))?;
    (details.as_bytes().get(3) == Some(&b' ')).then(|| digits.parse().ok()).flatten()
}

/// Gemini CLI's message for an upstream 429 that names a per-day quota.
pub const GEMINI_DAILY_QUOTA: &str = "You have exhausted your daily quota on this model.";

/// An ACP agent's error answers, read as its profile says.
pub struct AcpFailures(pub FailuresBy);

/// Anthropic's error type that a Claude Agent SDK `errorKind` names.
fn anthropic_type(error_kind: &str) -> Option<&'static str> {
    Some(match error_kind {
        "rate_limit" => "rate_limit_error",
        "overloaded" => "overloaded_error",
        "billing_error" => "billing_error",
        "authentication_failed" => "authentication_error",
        _ => return None,
    })
}

/// The upstream's HTTP status in Claude Code's message of a failed request: `API Error: 503 Service
/// Unavailable. …` (after the adapter's `Internal error: `). Its other shapes (`API Error: Request rejected
/// (429) · …`) name no status here: the `errorKind` says more.
fn api_status(message: &str) -> Option<u64> {
    let rest = message.strip_prefix("Internal error: ").unwrap_or(message).strip_prefix("API Error: ")?;
    let digits = rest.get(..3).filter(|d| d.bytes().all(|b| b.is_ascii_digit()))?;
    matches!(rest.as_bytes().get(3), Some(b' ' | b'.') | None).then(|| digits.parse().ok()).flatten()
}

impl Signals for AcpFailures {
    type Event = Infallible;
    type Record = Infallible;

    fn failure(&self, answer: &Frame, _: Option<Infallible>, _: SystemTime) -> Option<Failure> {
        let error = answer.value().get("error")?;
        let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
        let code = error.get("code").and_then(Value::as_i64);
        let (verdict, data) = match self.0 {
            FailuresBy::GeminiStatus => {
                // Only a code in the range of HTTP statuses is one (JSON-RPC's own are negative).
                let status = code.filter(|c| (100..=599).contains(c))?;
                let verdict = match status {
                    429 if message == GEMINI_DAILY_QUOTA => Verdict::Kind(Kind::Quota),
                    _ => failure::upstream(None, u64::try_from(status).ok()),
                };
                (verdict, json!({"gemini": {"code": status}}))
            }
            FailuresBy::ClaudeErrorKind => {
                let kind = error.pointer("/data/errorKind").and_then(Value::as_str)?;
                let verdict = failure::upstream(anthropic_type(kind), api_status(message));
                (verdict, json!({"errorKind": failure::clip(kind, 64)}))
            }
            FailuresBy::QwenStatus => {
                let details = error.pointer("/data/details").and_then(Value::as_str).unwrap_or_default();
                let status = match code {
                    Some(c @ 100..=599) => u64::try_from(c).ok(),
                    Some(-32603) => leading_status(details),
                    _ => None,
                }?;
                let data = json!({"qwen": {"status": status, "details": failure::clip(details, REASON_MAX)}});
                (failure::upstream(None, Some(status)), data)
            }
        };
        if verdict == Verdict::Plain {
            return None;
        }
        Some(Failure { verdict, message: failure::clip(message, REASON_MAX), data: Some(data) })
    }

    fn retrying(&self, _: &Retry, _: Duration) -> String {
        // No agent of these reports a retry over ACP: the engine never stops one.
        "the agent was retrying without an answer".into()
    }
}

/// The layer for an agent whose profile says `failures`, stopping retries after `patience`.
pub fn layer(failures: FailuresBy, patience: Duration) -> failure::FailureKinds<AcpFailures> {
    failure::FailureKinds::new(AcpFailures(failures), patience)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    fn prompt(id: u64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}})
    }

    fn answered(by: FailuresBy, error: Value) -> Value {
        let mut h = Harness::of(layer(by, failure::RETRY_PATIENCE));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"sessionId":"s"}}));
        h.from_client(prompt(1));
        h.take();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"error":error}));
        h.to_client().pop().expect("the answer")
    }

    /// Qwen Code 0.24.4's answers after its own retries, as seen live.
    #[test]
    fn qwens_503_is_a_service_failure_and_its_429_a_plain_error() {
        let busy = answered(
            FailuresBy::QwenStatus,
            json!({"code":-32603,"message":"Internal error","data":{"details":"503 The server is overloaded, please try again later."}}),
        );
        assert_eq!(
            busy["error"]["data"]["_meta"]["coda"]["failure"],
            json!({"kind":"service_unavailable","input":"accepted"}),
            "{busy}"
        );
        assert_eq!(busy["error"]["data"]["qwen"]["status"], 503, "{busy}");
        for plain in [
            json!({"code":429,"message":"Rate limit exceeded. Try again later."}),
            json!({"code":-32603,"message":"Internal error","data":{"details":"Quota exhausted: your quota will reset at 0:00"}}),
            json!({"code":-32603,"message":"Internal error","data":{"details":"5030 x"}}),
            json!({"code":-32603,"message":"Internal error","data":{"details":7}}),
            json!({"code":-32603,"message":"Internal error"}),
        ] {
            let out = answered(FailuresBy::QwenStatus, plain.clone());
            assert!(out.pointer("/error/data/_meta/coda").is_none(), "{out}");
        }
    }

    #[test]
    fn geminis_daily_quota_and_503_are_kinds_and_other_statuses_plain() {
        let quota = answered(FailuresBy::GeminiStatus, json!({"code":429,"message":GEMINI_DAILY_QUOTA}));
        assert_eq!(
            quota["error"],
            json!({"code":-32603,"message":GEMINI_DAILY_QUOTA,"data":{"gemini":{"code":429},
            "_meta":{"coda":{"failure":{"kind":"quota_exhausted"}}}}})
        );
        let busy = answered(FailuresBy::GeminiStatus, json!({"code":503,"message":"The model is overloaded."}));
        assert_eq!(busy["error"]["message"], "The model is overloaded.");
        assert_eq!(
            busy["error"]["data"]["_meta"]["coda"]["failure"],
            json!({"kind":"service_unavailable","input":"accepted"})
        );
        // A 429 without Gemini's daily-quota reading (a rate limit, a capacity error), a 500, JSON-RPC's own
        // codes, a code that is no number: left as they came.
        for error in [
            json!({"code":429,"message":"Resource exhausted. Please try again later."}),
            json!({"code":500,"message":"Internal error"}),
            json!({"code":-32603,"message":"Internal error"}),
            json!({"code":"429","message":GEMINI_DAILY_QUOTA}),
            json!({"code":429.0,"message":GEMINI_DAILY_QUOTA}),
        ] {
            assert_eq!(answered(FailuresBy::GeminiStatus, error.clone())["error"], error);
        }
    }

    #[test]
    fn claudes_error_kind_names_anthropics_error_type() {
        for (kind, want) in [
            ("rate_limit", json!({"kind":"service_unavailable","input":"accepted"})),
            ("overloaded", json!({"kind":"service_unavailable","input":"accepted"})),
            ("billing_error", json!({"kind":"quota_exhausted"})),
        ] {
            let got = answered(
                FailuresBy::ClaudeErrorKind,
                json!({"code":-32603,"message":"API Error: 429","data":{"errorKind":kind}}),
            );
            assert_eq!(got["error"]["data"]["_meta"]["coda"]["failure"], want, "{kind}");
            assert_eq!(got["error"]["data"]["errorKind"], kind);
        }
        let auth = answered(
            FailuresBy::ClaudeErrorKind,
            json!({"code":-32603,"message":"Invalid API key","data":{"errorKind":"authentication_failed"}}),
        );
        assert_eq!(auth["error"]["code"], -32000);
        // Claude Code's message of a 503, as recorded: the status names the kind.
        let unavailable = "Internal error: API Error: 503 Service Unavailable. This is a server-side issue, usually temporary — try again in a moment.";
        let got = answered(
            FailuresBy::ClaudeErrorKind,
            json!({"code":-32603,"message":unavailable,"data":{"errorKind":"server_error"}}),
        );
        assert_eq!(
            got["error"]["data"]["_meta"]["coda"]["failure"],
            json!({"kind":"service_unavailable","input":"accepted"})
        );
        assert_eq!(api_status("API Error: 5031 x"), None);
        assert_eq!(api_status("API Error: 50"), None);
        assert_eq!(api_status("API Error: Request rejected (429) · x"), None);
        assert_eq!(api_status("API Error: 503"), Some(503));
        for error in [
            json!({"code":-32603,"message":"Internal error: API Error: 500 Internal server error","data":{"errorKind":"server_error"}}),
            json!({"code":-32603,"message":"API Error: 503 x"}),
            json!({"code":-32603,"message":"x","data":{"errorKind":["rate_limit"]}}),
            json!({"code":-32603,"message":"x","data":"rate_limit"}),
            json!({"code":-32603,"message":"x"}),
        ] {
            assert_eq!(answered(FailuresBy::ClaudeErrorKind, error.clone())["error"], error);
        }
    }
}

//! The upstream failure cases and what Coda must receive for each, per CLI (docs/contract.md, "Upstream failures").
//!
//! `tests/failure_live.rs` prompts them against the real CLIs; the replays of its recordings
//! (`tests/failure_replay.rs`) check the same table.

use serde_json::Value;

/// (case, fake model marker), in the order the live suite prompts them (prompt ids 4, 5, ...).
pub const CASES: [(&str, &str); 10] = [
    ("quota", "[[error:429-usage]]"),
    ("quota-reset", "[[error:429-usage~7200]]"),
    ("rate-limit", "[[error:429-rate]]"),
    ("rate-limit-long", "[[error:429-rate~90]]"),
    ("500", "[[error:500]]"),
    ("502", "[[error:502]]"),
    ("503", "[[error:503]]"),
    ("529", "[[error:529]]"),
    ("reset", "[[error:reset]]"),
    ("401", "[[error:401]]"),
];

/// Cases run against some CLIs only, after [`CASES`] (so the ids of those stay as every recording has them): a 503
/// whose body is a line of text, no error object (no code to read), answered with the quick retry and with
/// `Retry-After: 90`.
const TEXT_503: [(&str, &str); 2] = [("503-text", "[[error:503-text]]"), ("503-text-long", "[[error:503-text~90]]")];

/// The cases of `agent`, in the order the live suite prompts them (prompt ids 4, 5, ...).
pub fn cases(agent: &str) -> Vec<(&'static str, &'static str)> {
    let mut all = CASES.to_vec();
    match agent {
        "opencode" => all.extend(TEXT_503),
        // Grok ignores Retry-After on a 5xx: the long case would be the same run again.
        "grok" => all.push(TEXT_503[0]),
        _ => {}
    }
    all
}

/// The JSON-RPC id of the prompt of `case` in a full run against `agent`.
pub fn prompt_id(agent: &str, case: &str) -> u64 {
    4 + cases(agent).iter().position(|(c, _)| *c == case).expect("a known case") as u64
}

/// What Coda must get.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// -32603 with `{kind: "quota_exhausted"}`.
    Quota,
    /// -32603 with `{kind: "service_unavailable", input: "accepted"}`, `retryAfterMs` present or not.
    Service { retry_after: bool },
    /// -32603 without a kind.
    Plain,
    /// -32000 (a login problem).
    Auth,
}

/// Whether the shim stopped the CLI's own retries (the message names them).
pub fn stopped(agent: &str, case: &str) -> bool {
    match agent {
        "kimi" => matches!(case, "rate-limit" | "rate-limit-long" | "500" | "502" | "503" | "529" | "reset"),
        "grok" => {
            matches!(case, "quota-reset" | "rate-limit-long" | "500" | "502" | "503" | "529" | "reset" | "503-text")
        }
        "opencode" => matches!(case, "quota-reset" | "rate-limit-long" | "reset" | "503-text-long"),
        _ => false,
    }
}

pub fn expected(agent: &str, case: &str) -> Expect {
    use Expect::*;
    match (agent, case) {
        (_, "quota") => Quota,
        (_, "401") => Auth,
        // Kimi: its own error class (kimi/failure.rs); stopped retries carry the wait Kimi scheduled.
        ("kimi", "quota-reset") => Quota,
        ("kimi", "rate-limit" | "rate-limit-long" | "503" | "529" | "reset") => Service { retry_after: true },
        ("kimi", "500" | "502") => Plain,
        // Grok: the upstream code it quotes, else a status 503 (grok/failure.rs); it never says its wait.
        ("grok", "quota-reset") => Quota,
        ("grok", "rate-limit" | "rate-limit-long" | "503" | "529" | "503-text") => Service { retry_after: false },
        ("grok", "500" | "502" | "reset") => Plain,
        // Codex (live config: no retries of its own): codex-acp's failure categories (codex/failure.rs). Its record
        // names no upstream reason but a usage limit and Codex's overloaded server (503 `server_is_overloaded`):
        // a 429 may be a quota, a 500 or a lost connection says nothing of the service.
        ("codex", "quota-reset") => Quota,
        ("codex", "503") => Service { retry_after: false },
        ("codex", "rate-limit" | "rate-limit-long" | "500" | "502" | "529" | "reset") => Plain,
        // OpenCode: the upstream code in its server's session.error, else a status 503 (opencode/failure.rs); a
        // stopped retry says only the upstream's words, or "Service Unavailable" for a 503 with a body of text.
        ("opencode", "rate-limit" | "500" | "503" | "529" | "503-text") => Service { retry_after: false },
        ("opencode", "503-text-long") => Service { retry_after: true },
        ("opencode", "quota-reset" | "rate-limit-long" | "502" | "reset") => Plain,
        _ => panic!("no expectation for {agent}/{case}"),
    }
}

/// Checks Coda's answer to the prompt of `case`.
pub fn check(agent: &str, case: &str, answer: &Value) -> Result<(), String> {
    let error = answer.get("error").ok_or_else(|| format!("{agent}/{case}: not an error answer: {answer}"))?;
    let failure = error.pointer("/data/_meta/coda/failure");
    let code = error.get("code").and_then(Value::as_i64);
    let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
    let want = expected(agent, case);
    let ok = match want {
        Expect::Quota => code == Some(-32603) && failure == Some(&serde_json::json!({"kind": "quota_exhausted"})),
        Expect::Service { retry_after } => {
            code == Some(-32603)
                && failure.and_then(|f| f.get("kind")) == Some(&Value::from("service_unavailable"))
                && failure.and_then(|f| f.get("input")) == Some(&Value::from("accepted"))
                && failure.and_then(|f| f.get("retryAfterMs")).is_some_and(Value::is_u64) == retry_after
        }
        Expect::Plain => code == Some(-32603) && failure.is_none(),
        Expect::Auth => code == Some(-32000) && failure.is_none(),
    };
    if !ok {
        return Err(format!("{agent}/{case}: expected {want:?}, got {error}"));
    }
    if message.trim().is_empty() {
        return Err(format!("{agent}/{case}: no reason in error.message"));
    }
    if stopped(agent, case) && !message.contains("was retrying") {
        return Err(format!("{agent}/{case}: the message does not name the retries the shim stopped: {message:?}"));
    }
    Ok(())
}

//! The upstream failure cases and what Coda must receive for each, per CLI (README "Upstream failures").
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

/// The JSON-RPC id of the prompt of `case` in a full run.
pub fn prompt_id(case: &str) -> u64 {
    4 + CASES.iter().position(|(c, _)| *c == case).expect("a known case") as u64
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
        "grok" => matches!(case, "quota-reset" | "rate-limit-long" | "500" | "502" | "503" | "529" | "reset"),
        "opencode" => matches!(case, "quota-reset" | "rate-limit-long" | "reset"),
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
        // Grok: the upstream code it quotes (grok/failure.rs); it never says its wait.
        ("grok", "quota-reset") => Quota,
        ("grok", "rate-limit" | "rate-limit-long" | "503" | "529") => Service { retry_after: false },
        ("grok", "500" | "502" | "reset") => Plain,
        // Codex (live config: no retries of its own): codex-acp's failure categories (codex/failure.rs).
        ("codex", "quota-reset") => Quota,
        ("codex", "rate-limit" | "rate-limit-long" | "500" | "502" | "503" | "529" | "reset") => {
            Service { retry_after: false }
        }
        // OpenCode: the upstream code in its server's session.error (opencode/failure.rs).
        ("opencode", "rate-limit" | "500" | "503" | "529") => Service { retry_after: false },
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

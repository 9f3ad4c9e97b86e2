//! The invariants, each as Coda's protocol (`coda-agent-protocol.md`) and JSON-RPC state it, checked on every
//! frame Coda receives and after every step; the CLI's side comes from the model's [`Truth`].
//!
//! | rule | what breaks it |
//! | --- | --- |
//! | `answer-once` | an answer to a request Coda has no open request of (a second answer), or the CLI getting the answer to its request twice |
//! | `answered` | after the drain (an hour of virtual time with Coda idle), a request of Coda's without an answer, unless it reached the CLI and the CLI never answered it, or the process ended |
//! | `not-json` | a line to Coda that is not JSON |
//! | `held-cancel` | a prompt Coda cancelled before it reached the CLI reaching it afterwards (压缩上下文, session/cancel) |
//! | `steering-in-turn` | a steering message reaching the CLI outside Coda's running turn (插话: only then, else `promptRequired`) |
//! | `waits` | a `_coda/wait` to a client that did not declare `_meta.coda.waits`, one missing a required field, a state not in the table, a field over its length (UTF-16 units, as Coda counts), or a report after a terminal state |
//! | `usage` | `_meta.coda` on a `usage_update` that is not an object, is `{}`, is over 4 KiB, or is on a session that is not a root session Coda opened |
//! | `failure` | `_meta.coda.failure` on an answer whose turn failed with no explicit upstream reason, of the other kind than the reason, or not in the protocol's shape |
//! | `frames` | a chunk of a turn (Coda's or the CLI's own) that Coda gets twice, out of order within its session, or never |
//! | `compact-answer` | a `_coda/session/compact` answer with fields other than `compacted`, `reason`, `before`, `after` |
//! | `panic` | the relay panicked |

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::cli::{Truth, chunk_marker};
use crate::coda::Coda;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
}

fn broke(rule: &'static str, detail: impl Into<String>) -> Option<Violation> {
    Some(Violation { rule, detail: detail.into() })
}

fn utf16(s: &str) -> usize {
    s.encode_utf16().count()
}

#[derive(Default)]
pub struct Checker {
    /// Terminal `_coda/wait` items, by (session, waitId).
    ended: HashSet<(String, String)>,
    /// Chunk markers Coda got, with their session, in order.
    got_chunks: Vec<(u64, String)>,
    got_set: HashSet<u64>,
    /// Prompts Coda cancelled before the CLI had them: marker -> session.
    cancelled_unsent: HashMap<u32, String>,
    /// Ids Coda used for two open requests at once (a hostile client's): which answer is whose is unknown.
    ambiguous: HashSet<String>,
}

impl Checker {
    /// Coda sends `session/cancel` for `session`: its prompts there that the CLI has not got are cancelled.
    pub fn cancelled(&mut self, coda: &Coda, truth: &Truth, session: &str) {
        for o in &coda.open {
            if o.method == "session/prompt"
                && o.session.as_deref() == Some(session)
                && let Some(m) = o.marker
                && !truth.prompts.contains_key(&m)
            {
                self.cancelled_unsent.insert(m, session.to_owned());
            }
        }
    }

    /// What the CLI side says after a step.
    pub fn cli_side(&mut self, truth: &mut Truth) -> Option<Violation> {
        if let Some((rule, detail)) = truth.broken.first().cloned() {
            truth.broken.clear();
            return broke(rule, detail);
        }
        for (m, session) in &self.cancelled_unsent {
            if truth.prompts.contains_key(m) {
                return broke(
                    "held-cancel",
                    format!(
                        "Coda's prompt ⟦p{m}⟧ of session {session} was cancelled before it reached the CLI, and reached it afterwards"
                    ),
                );
            }
        }
        None
    }

    /// A line Coda received at `now`.
    pub fn client_line(&mut self, coda: &mut Coda, truth: &Truth, line: &str) -> Option<Violation> {
        let mended = coda_shim::json::mend_surrogates(line.as_bytes());
        let Ok(v) = coda_shim::json::from_slice::<Value>(&mended) else {
            return broke("not-json", format!("the shim wrote a line that is not JSON: {line:.200}"));
        };
        let method = v.get("method").and_then(Value::as_str);
        match (method, v.get("id")) {
            (None, Some(id)) => self.answer(coda, truth, id, &v),
            (Some("session/request_permission"), Some(id)) => {
                coda.permissions.push_back(id.clone());
                None
            }
            (Some("_coda/wait"), None) => self.wait(coda, &v),
            (Some("session/update"), None) => self.update(coda, &v),
            _ => None,
        }
    }

    fn answer(&mut self, coda: &mut Coda, truth: &Truth, id: &Value, v: &Value) -> Option<Violation> {
        let key = id.to_string();
        let Some(at) = coda.open.iter().position(|o| o.id == key) else {
            if id.is_null() {
                return None; // An error for a frame that could not be read (JSON-RPC answers it with id null).
            }
            return broke(
                "answer-once",
                format!("Coda got an answer to {key}, which it has no open request of: {v:.300}"),
            );
        };
        let open = coda.open.remove(at);
        if coda.open.iter().any(|o| o.id == key) || self.ambiguous.contains(&key) {
            self.ambiguous.insert(key);
            return None;
        }
        let result = v.get("result");
        match open.method.as_str() {
            "initialize" => {
                if let Some(r) = result {
                    coda.steering_declared = r.pointer("/_meta/steering/supported") == Some(&Value::Bool(true));
                    coda.compact_declared = r.pointer("/agentCapabilities/_meta/coda/compact").is_some();
                }
            }
            "session/new" => {
                if let Some(s) = result.and_then(|r| r.get("sessionId")).and_then(Value::as_str) {
                    coda.sessions.push(s.to_owned());
                }
            }
            "session/load" => {
                if let (Some(_), Some(s)) = (result, open.session)
                    && !coda.sessions.contains(&s)
                {
                    coda.sessions.push(s);
                }
            }
            "session/prompt" => return check_failure(truth, &key, v),
            "_coda/session/compact" => {
                if let Some(r) = result.and_then(Value::as_object) {
                    let odd: Vec<&String> = r
                        .keys()
                        .filter(|k| !["compacted", "reason", "before", "after"].contains(&k.as_str()))
                        .collect();
                    if !odd.is_empty() || !r.get("compacted").is_some_and(Value::is_boolean) {
                        return broke(
                            "compact-answer",
                            format!("a compaction answer not in the protocol's shape: {v}"),
                        );
                    }
                }
            }
            _ => {}
        }
        None
    }

    fn wait(&mut self, coda: &mut Coda, v: &Value) -> Option<Violation> {
        if coda.waits != Some(true) {
            return broke("waits", format!("a `_coda/wait` to a client that did not declare waits: {v:.300}"));
        }
        let p = v.get("params").cloned().unwrap_or(Value::Null);
        let (Some(session), Some(wait), Some(state)) = (
            p.get("sessionId").and_then(Value::as_str),
            p.get("waitId").and_then(Value::as_str),
            p.get("state").and_then(Value::as_str),
        ) else {
            return broke("waits", format!("a `_coda/wait` without sessionId, waitId or state: {v:.300}"));
        };
        if !["waiting", "handling", "done", "failed", "cancelled"].contains(&state) {
            return broke("waits", format!("a `_coda/wait` state not in the protocol's table: {v:.300}"));
        }
        for (field, max) in [("waitId", 200), ("title", 500), ("detail", 4000)] {
            if let Some(text) = p.get(field).and_then(Value::as_str)
                && utf16(text) > max
            {
                return broke(
                    "waits",
                    format!("`_coda/wait` {field} of {} UTF-16 units (at most {max}): Coda drops it", utf16(text)),
                );
            }
        }
        let key = (session.to_owned(), wait.to_owned());
        if self.ended.contains(&key) {
            return broke("waits", format!("a `_coda/wait` report after the terminal state of {wait}: {v:.300}"));
        }
        if ["done", "failed", "cancelled"].contains(&state) {
            self.ended.insert(key);
        } else if p.get("stoppable") == Some(&Value::Bool(true)) {
            coda.stoppable.entry(session.to_owned()).or_default().push(wait.to_owned());
        }
        if let Some(child) = p.get("childSessionId").and_then(Value::as_str) {
            coda.children.push(child.to_owned());
        }
        None
    }

    fn update(&mut self, coda: &Coda, v: &Value) -> Option<Violation> {
        let session = v.pointer("/params/sessionId").and_then(Value::as_str).unwrap_or("");
        let u = v.pointer("/params/update").cloned().unwrap_or(Value::Null);
        if u.get("sessionUpdate").and_then(Value::as_str) == Some("usage_update")
            && let Some(facts) = u.pointer("/_meta/coda")
        {
            let root = coda.sessions.iter().any(|s| s == session) && !coda.children.iter().any(|c| c == session);
            let size = facts.to_string().len();
            if !facts.is_object() || facts.as_object().is_some_and(|o| o.is_empty()) || size > 4096 || !root {
                return broke(
                    "usage",
                    format!("usage facts that are empty, not an object, over 4 KiB or not on a root session: {v:.300}"),
                );
            }
        }
        if let Some(n) = u.pointer("/content/text").and_then(Value::as_str).and_then(chunk_marker) {
            if !self.got_set.insert(n) {
                return broke("frames", format!("Coda got chunk «{n}» twice"));
            }
            self.got_chunks.push((n, session.to_owned()));
        }
        None
    }

    /// After the drain: every chunk Coda must get came once, in its session's order.
    pub fn chunks(&self, truth: &Truth) -> Option<Violation> {
        let written: HashMap<u64, usize> = truth.chunks.iter().enumerate().map(|(i, (n, _, _))| (*n, i)).collect();
        for (n, session, must) in &truth.chunks {
            if *must && !self.got_set.contains(n) {
                return broke(
                    "frames",
                    format!("chunk «{n}» of session {session}, part of a turn, never reached Coda"),
                );
            }
        }
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (n, session) in &self.got_chunks {
            let Some(i) = written.get(n) else { continue };
            if let Some(before) = last.insert(session, *i)
                && before > *i
            {
                return broke(
                    "frames",
                    format!("Coda got chunk «{n}» of session {session} before one the CLI wrote earlier"),
                );
            }
        }
        None
    }

    /// After the drain: every request of Coda's is answered, unless the CLI never answered it.
    pub fn answered(&self, coda: &Coda, truth: &Truth) -> Option<Violation> {
        for o in coda.open.iter().filter(|o| !self.ambiguous.contains(&o.id)) {
            let reached = truth.requests.get(&o.id).is_some_and(|m| *m == o.method);
            if reached && !truth.answered.contains(&o.id) {
                continue;
            }
            let why = if reached { "the CLI answered it" } else { "it never reached the CLI as it was" };
            return broke(
                "answered",
                format!("Coda's {} {} (sent at {} ms) was never answered, and {why}", o.method, o.id, o.at),
            );
        }
        None
    }
}

/// `_meta.coda.failure` on a prompt's error: only from an explicit reason of the CLI's, of that kind, in shape.
fn check_failure(truth: &Truth, id: &str, v: &Value) -> Option<Violation> {
    use crate::plan::Failure;
    let f = v.pointer("/error/data/_meta/coda/failure")?;
    let kind = f.get("kind").and_then(Value::as_str).unwrap_or("");
    let shape_ok = match kind {
        "quota_exhausted" => true,
        "service_unavailable" => {
            f.get("input").is_none_or(|i| i == "accepted" || i == "not_accepted")
                && f.get("retryAfterMs").is_none_or(|r| r.as_f64().is_some_and(|ms| ms >= 0.0 && ms.is_finite()))
        }
        _ => false,
    };
    if !shape_ok {
        return broke("failure", format!("a failure kind not in the protocol's shape: {f}"));
    }
    let cause = truth.failures.get(id);
    let fits = matches!(
        (kind, cause),
        ("quota_exhausted", Some(Failure::FailQuota)) | ("service_unavailable", Some(Failure::FailService))
    );
    if !fits {
        return broke(
            "failure",
            format!("Coda got failure kind {kind} for a turn that ended with {cause:?}: {v:.400}"),
        );
    }
    None
}

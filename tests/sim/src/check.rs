//! The invariants, each as Coda's protocol (`coda-agent-protocol.md`) and JSON-RPC state it, checked on every
//! frame Coda receives and after every step; the CLI's side comes from the model's [`Truth`], the shim's tables
//! from its [`Sizes`].
//!
//! | rule | what breaks it |
//! | --- | --- |
//! | `answer-once` | an answer to a request Coda has no open request of (a second answer), or the CLI getting the answer to its request twice |
//! | `answered` | after the drain (an hour of virtual time with Coda idle), a request of Coda's without an answer, unless it reached the CLI and the CLI never answered it, or the process ended |
//! | `id-in-use` | a request reaching the CLI while the CLI owes the answer to another request with the same id (JSON-RPC: ids tell open requests apart) |
//! | `not-json` | a line to Coda that is not JSON |
//! | `held-cancel` | a prompt Coda cancelled before it reached the CLI reaching it afterwards (压缩上下文, session/cancel) |
//! | `steering-in-turn` | a steering message reaching the CLI outside Coda's running turn (插话: only then, else `promptRequired`) |
//! | `waits` | a `_coda/wait` to a client that did not declare `_meta.coda.waits`, one missing a required field, a state not in the table, a field over its length (UTF-16 units, as Coda counts), a report after a terminal state, one for a session Coda does not know (dropped), a terminal state other than the CLI's end (done, failed, stopped) or while the CLI still runs it; after the drain, work the CLI ended whose wait is still open, or work the CLI started that Coda was never told of (since the latest `initialize` that declared waits, in a process whose every `initialize` did, and the latest `session/load` of its session: what the CLI says of a session while it is loaded is history) |
//! | `usage` | `_meta.coda` on a `usage_update` that is not an object, is `{}`, is over 4 KiB, or is on a session that is not a root session Coda opened (a subagent's) |
//! | `failure` | `_meta.coda.failure` on anything but a prompt's error answer, of a kind the turn's upstream failure does not say explicitly (quota only for a quota, service only for a temporary failure of the server, none for a login, a local error or no reason), `input: not_accepted` for input the CLI took, a `retryAfterMs` longer than any wait the upstream asked for or the CLI scheduled, or not in the protocol's shape |
//! | `retry-watchdog` | a prompt whose turn the CLI retries for over a minute still open a minute (and 5 s) after the first retry showed (and the steering machine's hold more while a steering message of the session is in flight), or ended without a failure (执行失败: a long retry is not waited out silently), unless Coda stopped it |
//! | `frames` | a chunk of a turn (Coda's, the CLI's own, a subagent's) that Coda gets twice, out of order within its session, or never |
//! | `compact-answer` | a `_coda/session/compact` answer with fields beyond `compacted`, `reason`, `before`, `after` |
//! | `bounded` | the shim's request table holding more requests than Coda has open; after the drain, more of the shim's own requests open than the CLI owes answers to, or wake-ups pending beyond two per session and open request |
//! | `schema` | a frame the shim made or changed that breaks ACP's schema or Coda's shapes (`relay::testing::Pair`'s check) |
//! | `panic` | the relay panicked |

use std::collections::{HashMap, HashSet};

use coda_shim::layer::Sizes;
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

/// How long after a CLI's first retry Coda may wait for the turn's failure: the shim's minute, and time for the
/// CLI to answer its Stop.
pub const RETRY_DEADLINE_MS: u64 = 65_000;

#[derive(Default)]
pub struct Checker {
    /// Terminal `_coda/wait` items, by (session, waitId).
    ended: HashSet<(String, String)>,
    /// Items reported and not ended, in this process: (session, waitId) -> latest state.
    open_waits: HashMap<(String, String), String>,
    /// WaitIds Coda was told of, in this process.
    reported: HashSet<String>,
    /// Chunk markers Coda got, with their session, in order.
    got_chunks: Vec<(u64, String)>,
    got_set: HashSet<u64>,
    /// Prompts Coda cancelled before the CLI had them: marker -> (session, the `session/cancel`s of that session
    /// the CLI had got when Coda sent this one).
    cancelled_unsent: HashMap<u32, (String, u32)>,
    /// Prompts (by id) Coda sent `session/cancel` for while they were open.
    cancelled: HashSet<String>,
    /// The process the checks are in, counted from 0.
    process: u32,
    /// Since when (ms) Coda knows the shim reports waits to it, in this process.
    waits_since: Option<u64>,
    /// For each process: whether every `initialize` in it declared waits (`None` before the first), and since when.
    waits_always: Vec<(Option<bool>, u64)>,
    /// The time of the line being checked.
    now: u64,
    /// When the latest `session/load` of each session was answered.
    loaded: HashMap<String, u64>,
    /// Work of a session that was loaded while the work ran: how it ended may have been history to the shim.
    history: HashSet<String>,
}

impl Checker {
    /// Coda sends `session/cancel` for `session`: its prompts there that the CLI has not got are cancelled.
    pub fn cancelled(&mut self, coda: &Coda, truth: &Truth, session: &str) {
        for o in &coda.open {
            if o.method == "session/prompt" && o.session.as_deref() == Some(session) {
                self.cancelled.insert(o.id.clone());
                if let Some(m) = o.marker
                    && !truth.prompts.contains_key(&m)
                {
                    let cancels = truth.cancels.get(session).copied().unwrap_or(0);
                    self.cancelled_unsent.entry(m).or_insert((session.to_owned(), cancels));
                }
            }
        }
    }

    /// A new process: what Coda knew of the old one's activities ended with it (rule 6).
    pub fn restart(&mut self) {
        self.waits_since = None;
        self.open_waits.clear();
        self.reported.clear();
        self.process += 1;
    }

    /// What the CLI side says after a step, and the shim's tables at `now`.
    /// `alive`: the process runs (its end answers what is open, so nothing waits then).
    pub fn cli_side(
        &mut self,
        coda: &Coda,
        truth: &mut Truth,
        sizes: Sizes,
        now: u64,
        alive: bool,
    ) -> Option<Violation> {
        if let Some((rule, detail)) = truth.broken.first().cloned() {
            truth.broken.clear();
            return broke(rule, detail);
        }
        for (m, (session, cancels)) in &self.cancelled_unsent {
            // The shim may have sent the prompt on before it read the cancel (its hold ended at the same instant):
            // then this cancel reaches the CLI right after the prompt, as the next of its session, and stops it
            // there. Otherwise the prompt reached the CLI after the shim had the cancel.
            let stopped_there = truth.cancels_before.get(m) == Some(cancels)
                && truth.cancels.get(session).copied().unwrap_or(0) > *cancels;
            if truth.prompts.contains_key(m) && !stopped_there {
                return broke(
                    "held-cancel",
                    format!(
                        "Coda's prompt ⟦p{m}⟧ of session {session} was cancelled before it reached the CLI, and reached it afterwards"
                    ),
                );
            }
        }
        for (id, first) in &truth.retrying {
            let Some(prompt) = coda.open.iter().find(|o| o.id == *id && o.method == "session/prompt") else { continue };
            // A steering message in flight in the session holds the turn's answer a while longer (插话: Coda gets
            // the steering answer first, and the shim waits for it no longer than its hold).
            let steering = coda.open.iter().any(|o| o.method == "_session/steering" && o.session == prompt.session);
            let hold = if steering { coda_shim::coda::steering::TURN_HOLD.as_millis() as u64 } else { 0 };
            if alive && now > first + RETRY_DEADLINE_MS + hold && !self.cancelled.contains(id) {
                return broke(
                    "retry-watchdog",
                    format!(
                        "the CLI has retried prompt {id} since {first} ms and Coda still waits at {now} ms: a retry over a minute held the turn silently"
                    ),
                );
            }
        }
        if sizes.open_requests > coda.open.len() {
            return broke(
                "bounded",
                format!(
                    "the shim's request table holds {} requests, Coda has {} open",
                    sizes.open_requests,
                    coda.open.len()
                ),
            );
        }
        None
    }

    /// After the drain: the shim's tables hold no more than what is still open.
    pub fn tables(&self, coda: &Coda, truth: &Truth, sizes: Sizes) -> Option<Violation> {
        let owed_own = truth.owed.keys().filter(|id| id.starts_with("\"coda-shim-")).count();
        if sizes.own_requests > owed_own {
            return broke(
                "bounded",
                format!(
                    "after an hour idle the shim holds {} requests of its own open, the CLI owes answers to {owed_own}",
                    sizes.own_requests
                ),
            );
        }
        let bound = 2 * (coda.sessions.len() + sizes.open_requests) + 2;
        if sizes.timers > bound {
            return broke(
                "bounded",
                format!(
                    "after an hour idle {} wake-ups are pending ({} sessions, {} open requests)",
                    sizes.timers,
                    coda.sessions.len(),
                    sizes.open_requests
                ),
            );
        }
        None
    }

    /// A line Coda received at `now`.
    pub fn client_line(&mut self, coda: &mut Coda, truth: &Truth, line: &str, now: u64) -> Option<Violation> {
        self.now = now;
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
            (Some("_coda/wait"), None) => self.wait(coda, truth, &v),
            (Some("session/update"), None) => self.update(coda, truth, &v),
            _ => None,
        }
    }

    fn answer(&mut self, coda: &mut Coda, truth: &Truth, id: &Value, v: &Value) -> Option<Violation> {
        // A parse error answers no request (JSON-RPC 2.0: its id is null, since none could be read), not even a
        // request of Coda's whose id is null.
        if id.is_null() && v.pointer("/error/code").and_then(Value::as_i64) == Some(-32700) {
            return None;
        }
        // Nor does the refusal of a request whose id is no id (JSON-RPC 2.0: Invalid Request, id null), even while
        // a request of Coda's with the id null is open.
        let refused = v.pointer("/error/code").and_then(Value::as_i64) == Some(-32600);
        if id.is_null() && refused && coda.refusals_due > 0 {
            coda.refusals_due -= 1;
            return None;
        }
        let key = id.to_string();
        // The shim refuses a request reusing an open id at once: its error answers the duplicate.
        let at = coda
            .open
            .iter()
            .position(|o| o.id == key && o.duplicate == refused)
            .or_else(|| coda.open.iter().position(|o| o.id == key));
        let Some(at) = at else {
            if id.is_null() {
                return None; // An error for a frame that could not be read (JSON-RPC answers it with id null).
            }
            return broke(
                "answer-once",
                format!("Coda got an answer to {key}, which it has no open request of: {v:.300}"),
            );
        };
        let open = coda.open.remove(at);
        let failure = v.pointer("/error/data/_meta/coda/failure").or_else(|| v.pointer("/result/_meta/coda/failure"));
        if failure.is_some() && (open.method != "session/prompt" || v.get("error").is_none()) {
            return broke(
                "failure",
                format!("a failure kind on an answer to a {} that is no failed prompt: {v:.300}", open.method),
            );
        }
        if open.method == "session/prompt"
            && truth.retrying.contains_key(&key)
            && v.get("error").is_none()
            && !self.cancelled.contains(&key)
        {
            return broke(
                "retry-watchdog",
                format!("a prompt the CLI retried for over a minute ended without a failure: {v:.300}"),
            );
        }
        if open.duplicate {
            return None; // The answer to a request reusing an open id: the shim's refusal (or, in a race, its answer).
        }
        let result = v.get("result");
        match open.method.as_str() {
            "initialize" => {
                if let Some(r) = result {
                    coda.steering_declared = r.pointer("/_meta/steering/supported") == Some(&Value::Bool(true));
                    coda.compact_declared = r.pointer("/agentCapabilities/_meta/coda/compact").is_some();
                    let declared = r.pointer("/agentCapabilities/_meta/coda/waits").is_some();
                    self.waits_since = (declared && coda.waits == Some(true)).then_some(self.now);
                    if self.waits_since.is_none() {
                        // A client that now takes no waits has none open (a second `initialize`, a hostile
                        // client's: the shim reports no more, so it ends none of the earlier ones either).
                        self.open_waits.clear();
                    }
                    let at = self.process as usize;
                    if self.waits_always.len() <= at {
                        self.waits_always.resize(at + 1, (None, 0));
                    }
                    let (before, since) = self.waits_always[at];
                    let since = if before.is_none() { self.now } else { since };
                    self.waits_always[at] = (Some(before.unwrap_or(true) && coda.waits == Some(true)), since);
                }
            }
            "session/new" => {
                if let Some(s) = result.and_then(|r| r.get("sessionId")).and_then(Value::as_str) {
                    coda.sessions.push(s.to_owned());
                }
            }
            "session/load" => {
                if let Some(s) = &open.session {
                    // What the CLI said of the session while it was loaded is history to the shim: Coda knows of
                    // its activity only what it is told after the load (a load of a session open in this process
                    // is a hostile client's; Coda loads only in a new process).
                    self.open_waits.retain(|(session, _), _| session != s);
                    self.loaded.insert(s.clone(), self.now);
                    let before = truth.work.iter().filter(|(_, w)| &w.session == s && w.started <= self.now);
                    self.history.extend(before.map(|(id, _)| id.clone()));
                }
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

    fn wait(&mut self, coda: &mut Coda, truth: &Truth, v: &Value) -> Option<Violation> {
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
        let known = coda.sessions.iter().chain(&coda.children).any(|s| s == session);
        if !known {
            return broke("waits", format!("a `_coda/wait` for a session Coda does not know (it drops it): {v:.300}"));
        }
        let key = (session.to_owned(), wait.to_owned());
        if self.ended.contains(&key) {
            return broke("waits", format!("a `_coda/wait` report after the terminal state of {wait}: {v:.300}"));
        }
        let terminal = ["done", "failed", "cancelled"].contains(&state);
        let history = self.history.contains(wait);
        if terminal
            && !history
            && let Some(w) = truth.work.get(wait).filter(|w| w.process == self.process + 1)
        {
            match w.ended {
                None => {
                    return broke("waits", format!("`_coda/wait` says {wait} is {state}, but the CLI still runs it"));
                }
                Some(real) if real != state => {
                    return broke("waits", format!("`_coda/wait` says {wait} is {state}, but at the CLI it {real}"));
                }
                _ => {}
            }
        }
        self.reported.insert(wait.to_owned());
        if terminal {
            self.ended.insert(key.clone());
            self.open_waits.remove(&key);
            if let Some(w) = coda.stoppable.get_mut(session) {
                w.retain(|x| x != wait);
            }
        } else {
            self.open_waits.insert(key, state.to_owned());
            if p.get("stoppable") == Some(&Value::Bool(true)) {
                coda.stoppable.entry(session.to_owned()).or_default().push(wait.to_owned());
            }
        }
        if let Some(child) = p.get("childSessionId").and_then(Value::as_str) {
            coda.children.push(child.to_owned());
        }
        None
    }

    /// After the drain: work the CLI ended is ended for Coda; work it started in a session of Coda's was reported.
    pub fn waits_end(&self, coda: &Coda, truth: &Truth) -> Option<Violation> {
        if coda.waits != Some(true) {
            return None;
        }
        for ((session, wait), state) in &self.open_waits {
            if let Some(real) = truth.work.get(wait).and_then(|w| w.ended) {
                return broke(
                    "waits",
                    format!(
                        "the CLI's work {wait} of session {session} ended ({real}), but Coda's wait is still {state}"
                    ),
                );
            }
        }
        // A process whose client once said it takes no waits (a second `initialize`, a hostile client's) may have
        // set the CLI up without what reports them (codex-acp's AIR capabilities).
        let always = self.waits_always.get(self.process as usize).is_some_and(|(a, _)| *a == Some(true));
        for (id, w) in &truth.work {
            let ours = coda.sessions.contains(&w.session);
            let loaded = self.loaded.get(&w.session).copied().unwrap_or(0);
            let told = always && self.waits_since.is_some_and(|since| w.started > since.max(loaded));
            if w.process == self.process + 1 && ours && told && !self.reported.contains(id) {
                return broke("waits", format!("the CLI's work {id} in session {} was never reported", w.session));
            }
        }
        None
    }

    fn update(&mut self, coda: &Coda, truth: &Truth, v: &Value) -> Option<Violation> {
        let session = v.pointer("/params/sessionId").and_then(Value::as_str).unwrap_or("");
        let u = v.pointer("/params/update").cloned().unwrap_or(Value::Null);
        if u.get("sessionUpdate").and_then(Value::as_str) == Some("usage_update")
            && let Some(facts) = u.pointer("/_meta/coda")
        {
            let child = coda.children.iter().any(|c| c == session) || truth.children.contains(session);
            let root = coda.sessions.iter().any(|s| s == session) && !child;
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

    /// After the drain: every chunk Coda must get came once, in its session's order (a subagent's only to a client
    /// that declared waits throughout that process: no other learns its session).
    pub fn chunks(&self, truth: &Truth) -> Option<Violation> {
        let written: HashMap<u64, usize> = truth.chunks.iter().enumerate().map(|(i, (n, ..))| (*n, i)).collect();
        for (n, session, must, process, at) in &truth.chunks {
            let waits = self.waits_always.get(*process as usize - 1).copied();
            let waits = waits.is_some_and(|(always, since)| always == Some(true) && *at > since);
            let told = waits || !truth.children.contains(session);
            if *must && told && !self.got_set.contains(n) {
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
        for o in &coda.open {
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
    let allowed = cause.map(|c| c.kinds()).unwrap_or(&[]);
    if !allowed.contains(&kind) {
        return broke(
            "failure",
            format!("Coda got failure kind {kind} for a turn that ended with {cause:?}: {v:.400}"),
        );
    }
    if f.get("input").and_then(Value::as_str) == Some("not_accepted") {
        return broke("failure", format!("`input: not_accepted` for input the CLI had taken (its turn ran): {v:.400}"));
    }
    if let Some(ms) = f.get("retryAfterMs").and_then(Value::as_f64) {
        let scheduled = truth.scheduled_waits.get(id).copied().unwrap_or(0);
        if ms > scheduled as f64 {
            return broke(
                "failure",
                format!(
                    "a `retryAfterMs` of {ms} ms, longer than any wait the CLI scheduled ({scheduled} ms): {v:.400}"
                ),
            );
        }
    }
    None
}

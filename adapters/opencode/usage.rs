//! Coda's usage facts (section 用量里的数据) for OpenCode: `_meta.coda` on a root session's `usage_update`.
//!
//! What OpenCode 1.18.33 gives (seen live against the fake model):
//! - ACP: `usage_update {used, size, cost}` just before each `session/prompt` answer; `used` is the input +
//!   cache read + cache write tokens of the session's latest assistant message, so the context of the last
//!   model request. None outside a prompt (none after a compaction asked for over OpenCode's server).
//! - OpenCode's server (`server.rs`): `message.updated` of an assistant message, one per model request
//!   ("step"), created just before the request is sent (`time.created`), later completed with its tokens;
//!   a compaction's summary is one with `summary: true`; `session.compacted` when a compaction ended.
//!
//! So: `lastRequestAt` is the creation time of the session's latest step that is not a summary (OpenCode's
//! own clock; the error against the fake model's log is in docs/opencode.md), `contextTokens` the `used` of the
//! `usage_update` being stamped, `compactedAt` the completion time of the latest summary. `cacheTtl` is
//! never said. After a compaction outside a turn the layer sends a `usage_update` of its own, with
//! `contextTokens` (and `used`) the estimate of the compacted context ([`Contexts::after`]).
//!
//! Root sessions only: sessions Coda opened (`session/new`, `load`, `resume`, `fork`), never a child a
//! `_coda/wait` names (the activity layer below announces OpenCode's subagent sessions so).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::coda::usage::Facts;
use crate::frame::{Frame, Kind};
use crate::layer::{Cx, Layer};

/// One assistant message of OpenCode's (a model request), as the server's `message.updated` says it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub session: String,
    pub message: String,
    /// Unix ms, OpenCode's clock: just before the request went out.
    pub created_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_ms: Option<u64>,
    /// Once completed: the request's context (input + cache read + cache write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<u64>,
    /// A compaction's summary.
    #[serde(default)]
    pub summary: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The user message this one answers (what steering waits for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The agent it runs with (`agent`, else `mode`) and the model's variant, if any (steering's `POST`s
    /// run with the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// A count as OpenCode writes it (a JSON number), if it is one: no negative, fractional part dropped,
/// nothing beyond 2^53 (`1e400` and friends are no count).
fn count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64().or_else(|| v.as_f64().filter(|f| f.is_finite() && *f >= 0.0 && *f < 9.0e15).map(|f| f as u64))
}

/// How many messages the reducer remembers having said (then it forgets them all: a repeat said again is
/// harmless, the layers take a step twice the same).
const SAID_MAX: usize = 4096;

/// The reader's side: `message.updated` of an assistant message to a [`Step`], said when it is created and
/// once more when it is completed (OpenCode repeats the event many times).
#[derive(Default)]
pub struct StepReducer {
    /// Message -> said completed.
    said: HashMap<String, bool>,
}

impl StepReducer {
    pub fn reduce(&mut self, props: &Value) -> Option<ServerEvent> {
        let info = props.get("info")?;
        if info.get("role").and_then(Value::as_str) != Some("assistant") {
            return None;
        }
        let text = |k: &str| info.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
        let (session, message) = (text("sessionID")?, text("id")?);
        let created_ms = count(info.pointer("/time/created"))?;
        let completed_ms = count(info.pointer("/time/completed"));
        if self.said.get(&message) == Some(&true) || (completed_ms.is_none() && self.said.contains_key(&message)) {
            return None;
        }
        if self.said.len() >= SAID_MAX {
            self.said.clear();
        }
        self.said.insert(message.clone(), completed_ms.is_some());
        let tokens = completed_ms.and_then(|_| {
            let t = info.get("tokens")?;
            let input = count(t.get("input"))?;
            let cache = count(t.pointer("/cache/read")).unwrap_or(0) + count(t.pointer("/cache/write")).unwrap_or(0);
            Some(input + cache)
        });
        Some(ServerEvent::Step(Box::new(Step {
            session,
            message,
            created_ms,
            completed_ms,
            tokens,
            output: completed_ms.and_then(|_| count(info.pointer("/tokens/output"))),
            summary: info.get("summary").and_then(Value::as_bool) == Some(true),
            provider: text("providerID"),
            model: text("modelID"),
            parent: text("parentID"),
            agent: text("agent").or_else(|| text("mode")),
            variant: text("variant"),
        })))
    }
}

/// What the steps say of one session's context.
#[derive(Default, Debug, Clone)]
pub struct Context {
    /// The latest step that is not a summary: created (ms), and its context once completed.
    pub last_request_ms: Option<u64>,
    pub last_tokens: Option<u64>,
    /// The smallest context of a completed step: the system prompt, the tools and a prompt, about what a
    /// compacted context starts from.
    pub baseline: Option<u64>,
    /// The latest completed summary: completed (ms) and its output tokens.
    pub summary_ms: Option<u64>,
    pub summary_output: Option<u64>,
}

/// Each session's [`Context`], from the [`Step`]s OpenCode's server reported.
#[derive(Default)]
pub struct Contexts {
    by_session: HashMap<String, Context>,
}

impl Contexts {
    pub fn step(&mut self, s: &Step) {
        let c = self.by_session.entry(s.session.clone()).or_default();
        if s.summary {
            if let Some(done) = s.completed_ms {
                c.summary_ms = Some(done);
                c.summary_output = s.output;
            }
            return;
        }
        if c.last_request_ms.is_none_or(|at| s.created_ms >= at) {
            c.last_request_ms = Some(s.created_ms);
            c.last_tokens = s.tokens.or(c.last_tokens.filter(|_| s.completed_ms.is_none()));
        }
        if let Some(t) = s.tokens.filter(|t| *t > 0) {
            c.baseline = Some(c.baseline.map_or(t, |b| b.min(t)));
        }
    }

    pub fn of(&self, session: &str) -> Option<&Context> {
        self.by_session.get(session)
    }

    /// The context before a compaction: that of the latest completed step.
    pub fn before(&self, session: &str) -> Option<u64> {
        self.of(session)?.last_tokens
    }

    /// An estimate of the context after a compaction: the smallest context seen plus the summary's output.
    /// None when either is unknown (OpenCode says nothing of its compacted context until the next request).
    pub fn after(&self, session: &str) -> Option<u64> {
        let c = self.of(session)?;
        Some(c.baseline? + c.summary_output?)
    }

    pub fn forget(&mut self, session: &str) {
        self.by_session.remove(session);
    }
}

fn at_ms(ms: u64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// Per root session: the facts, and the figures of its last `usage_update`.
#[derive(Default)]
struct Session {
    compacted_at: Option<SystemTime>,
    /// `contextTokens` after a compaction, until the next `usage_update` says the real one.
    compacted_tokens: Option<u64>,
    size: Option<u64>,
}

pub struct OpenCodeUsage {
    record: Record,
    contexts: Contexts,
    roots: HashMap<String, Session>,
    /// Sessions named as a subagent's child (`_coda/wait` `childSessionId`).
    children: HashSet<String>,
}

impl OpenCodeUsage {
    pub fn new(record: Record) -> OpenCodeUsage {
        OpenCodeUsage { record, contexts: Contexts::default(), roots: HashMap::new(), children: HashSet::new() }
    }

    fn facts(&self, session: &str, used: Option<u64>) -> Facts {
        let c = self.contexts.of(session);
        let s = self.roots.get(session);
        Facts {
            last_request_at: c.and_then(|c| c.last_request_ms).and_then(at_ms),
            context_tokens: used.or(s.and_then(|s| s.compacted_tokens)).or(c.and_then(|c| c.last_tokens)),
            compacted_at: s.and_then(|s| s.compacted_at),
            cache_ttl: None,
        }
    }

    fn is_root(&self, session: &str) -> bool {
        self.roots.contains_key(session) && !self.children.contains(session)
    }

    /// A `usage_update` on its way to Coda: stamped when it is a root session's.
    /// Read where it lies and written in place (a `usage_update` is a quarter of OpenCode's stream).
    fn stamp(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(session) = frame.session().map(|s| s.into_owned()) else { return cx.to_client(frame) };
        if !self.is_root(&session) {
            return cx.to_client(frame);
        }
        let (mut used, mut size) = (None, None);
        for (key, value) in frame.update_value().into_iter().flat_map(|u| u.members()) {
            if key.is("used") {
                used = count(Some(&value.to_value()));
            } else if key.is("size") {
                size = count(Some(&value.to_value()));
            }
        }
        if let Some(s) = self.roots.get_mut(&session) {
            s.size = size.or(s.size);
            // OpenCode's own figure of the context from now on.
            s.compacted_tokens = None;
        }
        let facts = self.facts(&session, used);
        match facts.stamp_frame(&frame) {
            Some(stamped) => cx.to_client(stamped),
            None => cx.to_client(frame),
        }
    }

    /// A compaction of `session` ended (asked for or OpenCode's own).
    fn compacted(&mut self, session: &str, cx: &mut Cx) {
        let when = self.contexts.of(session).and_then(|c| c.summary_ms).and_then(at_ms).unwrap_or(cx.wall());
        let after = self.contexts.after(session);
        let is_root = self.is_root(session);
        let Some(s) = self.roots.get_mut(session) else { return };
        s.compacted_at = Some(when);
        s.compacted_tokens = after;
        let size = s.size;
        // Inside a turn OpenCode sends its own usage_update before the answer; between turns nothing comes (a
        // prompt held while the session compacted has not gone to OpenCode yet).
        let turn = cx.open_requests().any(|r| r.is("session/prompt") && r.is_sent() && r.session() == Some(session));
        if !is_root || turn {
            return;
        }
        let facts = self.facts(session, None);
        match (facts.context_tokens, size) {
            (Some(used), Some(size)) => cx.to_client(facts.update(session, used, size)),
            _ => tracing::debug!("no usage_update after OpenCode's compaction: its context window is not known yet"),
        }
    }

    /// A client request that opens a session whose id it names (`load`, `resume`).
    fn opened(&mut self, v: &Value) {
        if let Some(s) = v.pointer("/params/sessionId").and_then(Value::as_str) {
            self.roots.entry(s.to_owned()).or_default();
        }
    }
}

impl Layer for OpenCodeUsage {
    type Timer = Infallible;
    type Event = FromServer;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if matches!(frame.method(), Some("session/load" | "session/resume")) && frame.id().is_some() {
            self.opened(frame.value());
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => {
                let opened = cx.answer_to(&frame).is_some_and(|r| r.is("session/new") || r.is("session/fork"));
                if opened && let Some(s) = frame.value().pointer("/result/sessionId").and_then(Value::as_str) {
                    self.roots.entry(s.to_owned()).or_default();
                }
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == "session/update" => {
                if frame.session_update() == Some("usage_update") { self.stamp(frame, cx) } else { cx.to_client(frame) }
            }
            Kind::Notification { method } if method == "_coda/wait" => {
                if let Some(child) = frame.value().pointer("/params/childSessionId").and_then(Value::as_str) {
                    self.children.insert(child.to_owned());
                    self.roots.remove(child);
                    self.contexts.forget(child);
                }
                cx.to_client(frame)
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        frame.is_notification("session/update") && frame.session_update() != Some("usage_update")
    }

    fn on_event(&mut self, event: FromServer, cx: &mut Cx) {
        let FromServer::Event(e) = event else { return };
        match &e {
            ServerEvent::Step(s) => {
                self.record.handled(&e, cx.wall());
                if !self.children.contains(&s.session) {
                    self.contexts.step(s);
                }
            }
            ServerEvent::Compacted { session } => {
                self.record.handled(&e, cx.wall());
                let session = session.clone();
                self.compacted(&session, cx);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;
    use serde_json::json;

    const S: &str = "ses_root";

    fn step(message: &str, created: u64, done: Option<(u64, u64)>, summary: bool) -> FromServer {
        FromServer::Event(ServerEvent::Step(Box::new(Step {
            session: S.into(),
            message: message.into(),
            created_ms: created,
            completed_ms: done.map(|d| d.0),
            tokens: done.map(|d| d.1),
            output: done.map(|_| 40),
            summary,
            provider: Some("fake".into()),
            model: Some("fake-model".into()),
            parent: None,
            agent: None,
            variant: None,
        })))
    }

    fn usage(session: &str, used: u64) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
            "update":{"sessionUpdate":"usage_update","used":used,"size":32000,"cost":{"amount":0,"currency":"USD"}}}})
    }

    fn opened() -> Harness {
        let mut h = Harness::of(OpenCodeUsage::new(Record::off()));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.to_client();
        h
    }

    #[test]
    fn a_root_sessions_usage_update_carries_the_last_request_and_its_context() {
        let mut h = opened();
        h.event(0, step("msg_1", 1_796_186_333_444, None, false));
        h.event(0, step("msg_1", 1_796_186_333_444, Some((1_796_186_339_327, 7678)), false));
        h.event(0, step("msg_2", 1_796_186_339_400, None, false));
        h.from_agent(usage(S, 7729));
        let out = h.to_client();
        assert_eq!(
            out[0]["params"]["update"]["_meta"],
            json!({"coda":{"lastRequestAt":"2026-12-02T04:38:59.400Z","contextTokens":7729}})
        );
        assert_eq!(out[0]["params"]["update"]["cost"]["currency"], "USD", "OpenCode's fields are kept");
    }

    #[test]
    fn a_compaction_between_turns_gets_an_update_of_the_shims_with_its_time_and_estimate() {
        let mut h = opened();
        h.event(0, step("msg_1", 1_000, Some((2_000, 7678)), false));
        h.from_agent(usage(S, 7729));
        h.to_client();
        h.event(0, step("msg_s", 3_000, Some((3_500, 578)), true));
        h.event(0, FromServer::Event(ServerEvent::Compacted { session: S.into() }));
        let out = h.to_client();
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0]["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":7718,"size":32000,"_meta":{"coda":{
                "lastRequestAt":"1970-01-01T00:00:01.000Z","contextTokens":7718,"compactedAt":"1970-01-01T00:00:03.500Z"}}})
        );
        // The next usage_update says OpenCode's own figure, and keeps the compaction's time.
        h.event(0, step("msg_3", 4_000, Some((4_200, 7697)), false));
        h.from_agent(usage(S, 7697));
        let coda = &h.to_client()[0]["params"]["update"]["_meta"]["coda"];
        assert_eq!(coda["contextTokens"], 7697);
        assert_eq!(coda["lastRequestAt"], "1970-01-01T00:00:04.000Z");
        assert_eq!(coda["compactedAt"], "1970-01-01T00:00:03.500Z");
    }

    #[test]
    fn inside_a_turn_opencodes_own_update_carries_the_compaction() {
        let mut h = opened();
        h.from_agent(usage(S, 9000));
        h.to_client();
        h.from_client(json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}));
        h.event(0, step("msg_s", 3_000, Some((3_500, 578)), true));
        h.event(0, FromServer::Event(ServerEvent::Compacted { session: S.into() }));
        assert!(h.to_client().is_empty(), "OpenCode's usage_update comes before the answer");
        h.from_agent(usage(S, 9808));
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"]["coda"]["compactedAt"], "1970-01-01T00:00:03.500Z");
    }

    #[test]
    fn a_child_or_unknown_session_is_not_stamped() {
        let mut h = opened();
        h.from_agent(json!({"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":S,"waitId":"c1",
            "state":"waiting","childSessionId":"ses_child"}}));
        h.to_client();
        for s in ["ses_child", "ses_other"] {
            let u = usage(s, 10);
            h.from_agent(u.clone());
            assert_eq!(h.to_client(), vec![u], "{s}");
        }
    }

    #[test]
    fn hostile_usage_updates_are_passed_or_answered_never_a_panic() {
        let mut h = opened();
        // Figures that are no counts: no contextTokens from them.
        let text = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"usage_update","used":1e400,"size":-3}}}}}}"#
        );
        h.agent_frame(Frame::parse(text.into_bytes()).expect("a frame"));
        let out = h.to_client();
        assert!(out.is_empty() || out[0]["params"]["update"]["_meta"] == json!({"coda":{}}), "{out:?}");
        h.from_agent(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,
            "update":{"sessionUpdate":"usage_update","used":-1,"size":1e300}}}));
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"], json!({"coda":{}}));
        // A frame that claims to be a usage update but cannot be read is dropped with a warning.
        let bad =
            br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"usage_update","used":"#;
        if let Ok(f) = Frame::parse(bad.to_vec()) {
            h.agent_frame(f);
            assert!(h.to_client().is_empty());
        }
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        let text = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"usage_update","used":1,"size":2,"x":{deep}}}}}}}"#
        );
        if let Ok(f) = Frame::parse(text.into_bytes()) {
            h.agent_frame(f);
            h.to_client();
        }
    }

    #[test]
    fn the_reducer_says_a_step_when_created_and_when_completed_and_skips_the_rest() {
        let mut r = StepReducer::default();
        let ev = |created: Value, completed: Option<u64>, role: &str| {
            let mut info = json!({"id":"msg_1","sessionID":S,"role":role,"time":{"created":created},
                "tokens":{"input":7678,"output":5,"cache":{"read":10,"write":2}},"summary":true,
                "providerID":"fake","modelID":"fake-model"});
            if let Some(c) = completed {
                info["time"]["completed"] = json!(c);
            }
            json!({"info": info})
        };
        let Some(ServerEvent::Step(s)) = r.reduce(&ev(json!(5), None, "assistant")) else { panic!("a step") };
        assert_eq!((s.created_ms, s.tokens, s.summary), (5, None, true));
        assert!(r.reduce(&ev(json!(5), None, "assistant")).is_none(), "a repeat");
        let Some(ServerEvent::Step(s)) = r.reduce(&ev(json!(5), Some(9), "assistant")) else { panic!("completed") };
        assert_eq!((s.completed_ms, s.tokens, s.output), (Some(9), Some(7690), Some(5)));
        assert!(r.reduce(&ev(json!(5), Some(9), "assistant")).is_none());
        let mut r = StepReducer::default();
        assert!(r.reduce(&ev(json!(5), None, "user")).is_none());
        for bad in [json!(1e300), json!(-1), json!("5"), json!(null)] {
            assert!(r.reduce(&ev(bad.clone(), None, "assistant")).is_none(), "{bad}");
        }
        assert!(r.reduce(&json!({"info":"x"})).is_none());
    }

    #[test]
    fn the_estimate_after_is_the_smallest_context_plus_the_summary() {
        let mut c = Contexts::default();
        let s = |m: &str, tokens: u64, summary: bool, output: u64| Step {
            session: S.into(),
            message: m.into(),
            created_ms: 1,
            completed_ms: Some(2),
            tokens: Some(tokens),
            output: Some(output),
            summary,
            provider: None,
            model: None,
            parent: None,
            agent: None,
            variant: None,
        };
        assert_eq!(c.after(S), None);
        c.step(&s("a", 7678, false, 5));
        c.step(&s("b", 9000, false, 5));
        assert_eq!(c.before(S), Some(9000));
        assert_eq!(c.after(S), None, "no summary yet");
        c.step(&s("c", 578, true, 40));
        assert_eq!(c.after(S), Some(7718));
        assert_eq!(c.before(S), Some(9000), "a summary is not a step of the session's own");
    }
}

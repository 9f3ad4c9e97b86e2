//! Where OpenCode's usage facts are (section 用量里的数据; the rules are [`crate::coda::usage`]'s).
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
//! own clock; the error against the fake model's log is in docs/opencode.md), `contextTokens` that step's
//! context (the `used` of the `usage_update` being stamped), `compactedAt` the completion time of the latest
//! summary. `cacheTtl` is never said. After a compaction outside a turn the shim sends a `usage_update` of its own, its
//! `used` the estimate of the compacted context ([`Contexts::after`]).
//!
//! At load: OpenCode keeps its sessions in its own database and says their messages over its server
//! (`GET /session/{id}/message`): the latest assistant message that is no summary (`lastRequestAt`, its context),
//! the latest completed summary (`compactedAt`) ([`facts_of_messages`]). A replay has no server: nothing is read.

use crate::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::coda::usage::{Fact, Facts, Figures, LoadJob, Said, Source, UsageFacts, per_root};
use crate::layer::Cx;

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
    v.as_u64().or_else(|| in_range(v.as_f64()?))
}

/// A count OpenCode wrote as a float (a whole number of tokens, in the range an f64 holds exactly).
fn in_range(f: f64) -> Option<u64> {
    (f.is_finite() && (0.0..9.0e15).contains(&f)).then_some(f as u64)
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

impl Context {
    fn step(&mut self, s: &Step) {
        let c = self;
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
}

impl Contexts {
    /// Coda closed `session`: its context goes.
    pub fn closed(&mut self, session: &str) {
        self.by_session.remove(session);
    }

    /// How many sessions' contexts are kept.
    pub fn kept(&self) -> usize {
        self.by_session.len()
    }

    pub fn step(&mut self, s: &Step) {
        self.by_session.entry(s.session.clone()).or_default().step(s);
    }

    /// A step of a root session only: the table follows the engine's roots ([`per_root`]).
    pub fn root_step(&mut self, s: &Step, cx: &Cx) {
        if let Some(c) = per_root(&mut self.by_session, &s.session, cx, |_| false) {
            c.step(s);
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
}

fn at_ms(ms: u64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// What OpenCode keeps of a session (its server's messages of session, directory): made at set-up from the
/// server (none in a replay), run as a job at load.
pub type History = Arc<dyn Fn(&str, &str) -> Facts + Send + Sync>;

/// The facts in OpenCode's messages of a session (`GET /session/{id}/message`: `[{info, parts}]`): the latest
/// assistant message that is no summary (created: the request; its tokens once completed) and the latest
/// completed summary.
pub fn facts_of_messages(messages: &Value) -> Facts {
    let mut facts = Facts::default();
    let (mut last, mut compacted) = (None::<u64>, None::<u64>);
    for info in messages.as_array().into_iter().flatten().filter_map(|m| m.get("info")) {
        if info.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let completed = count(info.pointer("/time/completed"));
        if info.get("summary").and_then(Value::as_bool) == Some(true) {
            compacted = compacted.max(completed);
            continue;
        }
        let Some(created) = count(info.pointer("/time/created")) else { continue };
        if last.is_none_or(|l| created >= l) {
            last = Some(created);
            let tokens = info.get("tokens").filter(|_| completed.is_some()).and_then(|t| {
                let cache =
                    count(t.pointer("/cache/read")).unwrap_or(0) + count(t.pointer("/cache/write")).unwrap_or(0);
                Some(count(t.get("input"))? + cache)
            });
            facts.context_tokens = tokens;
        }
    }
    facts.last_request_at = last.and_then(at_ms);
    facts.compacted_at = compacted.and_then(at_ms);
    facts
}

/// Where OpenCode's facts are (see the module's docs).
pub struct OpenCode {
    record: Record,
    contexts: Contexts,
    history: Option<History>,
}

impl OpenCode {
    pub fn new(record: Record, history: Option<History>) -> OpenCode {
        OpenCode { record, contexts: Contexts::default(), history }
    }

    /// The latest request of `session` and its context, as the steps say them.
    fn request(&self, session: &str, out: &mut Vec<Fact>) {
        let Some(c) = self.contexts.of(session) else { return };
        out.extend(c.last_request_ms.and_then(at_ms).map(Fact::Request));
        out.extend(c.last_tokens.map(Fact::Context));
    }
}

impl Source for OpenCode {
    type Event = FromServer;

    fn closed(&mut self, session: &str) {
        self.contexts.closed(session);
    }

    fn kept(&self) -> usize {
        self.contexts.kept()
    }

    fn at_load(&self, session: &str, params: &Value, _: &Cx) -> Option<LoadJob> {
        let history = self.history.clone()?;
        let (session, directory) = (session.to_owned(), params.get("cwd").and_then(Value::as_str)?.to_owned());
        Some(Box::new(move || history(&session, &directory)))
    }

    /// OpenCode's `used` is the context of its latest assistant message: that request's.
    fn usage_update(&mut self, session: &str, update: &Figures<'_>, _: &mut Cx, out: &mut Vec<Fact>) {
        self.request(session, out);
        if let Some(used) = update.used.and_then(|v| v.as_u64().or_else(|| in_range(v.as_f64()?))) {
            out.push(Fact::Context(used));
        }
    }

    fn on_event(&mut self, event: FromServer, cx: &mut Cx, out: &mut Said) {
        let FromServer::Event(e) = event else { return };
        match &e {
            ServerEvent::Step(s) => {
                self.record.handled(&e, cx.wall());
                // Only a root's steps (a subagent's child session is never one).
                self.contexts.root_step(s, cx);
            }
            ServerEvent::Compacted { session } => {
                self.record.handled(&e, cx.wall());
                let when = self.contexts.of(session).and_then(|c| c.summary_ms).and_then(at_ms).unwrap_or(cx.wall());
                out.push((session.clone(), Fact::Compacted(when)));
                // The estimate of the compacted context is OpenCode's count from now on (`used`), until it says
                // its own.
                if let Some(after) = self.contexts.after(session) {
                    out.push((session.clone(), Fact::Used(after)));
                }
                // Inside a turn OpenCode sends its own usage_update before the answer; between turns nothing comes
                // (a prompt held while the session compacted has not gone to OpenCode yet).
                let turn = cx
                    .open_requests()
                    .any(|r| r.is("session/prompt") && r.is_sent() && r.session() == Some(session.as_str()));
                if !turn {
                    out.push((session.clone(), Fact::Send));
                }
            }
            _ => {}
        }
    }
}

/// coda-opencode's usage facts layer; `record` logs the server events it handles (recordings).
pub type OpenCodeUsage = UsageFacts<OpenCode>;

/// The layer; `history` reads what OpenCode keeps of a session Coda loads.
pub fn layer(record: Record, history: Option<History>) -> OpenCodeUsage {
    UsageFacts::new(OpenCode::new(record, history))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Frame;
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
        let mut h = Harness::of(layer(Record::off(), None));
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
            // `used` is the estimate of the compacted context; `contextTokens` stays that of the last request.
            json!({"sessionUpdate":"usage_update","used":7718,"size":32000,"_meta":{"coda":{
                "lastRequestAt":"1970-01-01T00:00:01.000Z","contextTokens":7729,"compactedAt":"1970-01-01T00:00:03.500Z"}}})
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
        // Nothing known: passed on as it came, never with an empty `_meta.coda`.
        assert!(out[0]["params"]["update"].get("_meta").is_none(), "{out:?}");
        h.from_agent(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,
            "update":{"sessionUpdate":"usage_update","used":-1,"size":1e300}}}));
        assert!(h.to_client()[0]["params"]["update"].get("_meta").is_none());
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

    /// OpenCode's messages of a session, as its server says them (the fields the facts read).
    #[test]
    fn a_loaded_sessions_facts_are_read_from_its_messages() {
        let messages = json!([
            {"info":{"id":"msg_u1","role":"user","time":{"created":1_000}}},
            {"info":{"id":"msg_a1","role":"assistant","time":{"created":1_100,"completed":1_900},
                "tokens":{"input":7678,"output":5,"cache":{"read":10,"write":2}}}},
            {"info":{"id":"msg_s","role":"assistant","summary":true,"time":{"created":2_000,"completed":2_500},
                "tokens":{"input":9000,"output":40}}},
            {"info":{"id":"msg_a2","role":"assistant","time":{"created":-5}}},
        ]);
        let facts = facts_of_messages(&messages);
        assert_eq!(facts.last_request_at, at_ms(1_100));
        assert_eq!(facts.context_tokens, Some(7690), "the request's context, not the summary's");
        assert_eq!(facts.compacted_at, at_ms(2_500));
        assert_eq!(facts_of_messages(&json!({"error":"x"})), Facts::default());
    }
}

//! Coda's `_coda/session/compact` (section 压缩上下文) for OpenCode, through OpenCode's own server.
//!
//! What OpenCode 1.18.33 does (seen live against the fake model):
//! - `POST /session/{id}/summarize {providerID, modelID}` answers `true` once the summary is written; the
//!   server's event stream then says `session.compacted`. The summary is an assistant message with
//!   `summary: true`, and OpenCode's ACP bridge streams its text as `agent_message_chunk`s (with that
//!   message's `messageId`) outside any prompt: the layer drops them, they are not a reply to anyone.
//! - Run during a turn it stopped that turn's loop and the running tool's result never reached the model:
//!   the layer refuses while a Coda turn of the session is open, and the ask (`summarize.rs`) asks
//!   `GET /session/status` first (OpenCode's own turns on a background result are busy too).
//! - The session's model is needed: the latest said by `session/new`, `load`, `resume` (`configOptions`
//!   `model`, `provider/model`), `set_config_option`, `set_model`, or a step on OpenCode's server.
//!
//! The layer does no HTTP: it runs the set-up's [`Asker`] (`summarize.rs`) on an [`Ask`] as a job
//! ([`Cx::work`], off the relay loop) and gets the answer back as the job's result, handled as a
//! [`ServerEvent::Summarized`] (in a replay that event comes from the recording's events file instead).
//! `before` is the context of the latest step (exact, OpenCode's own count); `after` an estimate
//! (`usage::Contexts::after`). A `session/prompt` that comes
//! during it waits in the [`Gate`]; Coda's request is answered `compacted: false` after [`DEADLINE`], and the
//! summary is then cancelled (`session/cancel`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::adapters::opencode::usage::Contexts;
use crate::coda::compact::{self as coda, ALREADY, DEADLINE, Gate, NOT_RUNNING, Outcome, TIMED_OUT, TURN_RUNNING};
use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Layer};

/// What OpenCode's server answered the shim's compaction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Summarized {
    /// `true`: compacted.
    Done,
    /// `GET /session/status` said the session is running: nothing was asked.
    Busy,
    /// An error, or an answer other than `true` (for people; no peer content beyond OpenCode's status).
    Failed { why: String },
}

/// A compaction to ask OpenCode's server for.
#[derive(Clone, Debug, PartialEq)]
pub struct Ask {
    pub session: String,
    /// The session's folder (OpenCode's server picks its instance by it).
    pub directory: String,
    pub provider: String,
    pub model: String,
}

/// Asks OpenCode's server for a compaction and gives its answer, or `None` when the answer comes another way (a
/// replay's events file, `summarize::ReplayGate`). HTTP requests, the summary a model request of minutes: the
/// layer runs it as a job ([`Cx::work`]), which holds one of the engine's few workers meanwhile.
pub type Asker = Arc<dyn Fn(Ask) -> Option<Summarized> + Send + Sync>;

/// After OpenCode's server answered `true`: how long to wait for its `session.compacted` (and the summary's
/// tokens) before answering with what is known.
pub const SETTLE: Duration = Duration::from_secs(2);

/// How many summaries per session are remembered, for their late chunks.
const SUMMARIES: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tick {
    /// [`DEADLINE`] passed for the compaction with this number.
    Deadline(u64),
    /// [`SETTLE`] passed after the server's `true`.
    Settle(u64),
}

struct Running {
    /// Coda's request.
    id: Id,
    n: u64,
    before: Option<u64>,
}

#[derive(Default)]
struct Session {
    cwd: String,
    model: Option<(String, String)>,
}

pub struct OpenCodeCompact {
    /// None: OpenCode's server is unknown (an agent command without `--port`): requests are refused with the
    /// reason. The capability is declared all the same: OpenCode compacts, and the default command has it.
    asker: Option<Asker>,
    record: Record,
    gate: Gate,
    running: HashMap<String, Running>,
    sessions: HashMap<String, Session>,
    /// `session/new`, `load`, `resume`, `fork` in flight: their cwd.
    setups: HashMap<Id, String>,
    contexts: Contexts,
    /// Summary messages per session: their chunks are dropped wherever they come.
    summaries: HashMap<String, VecDeque<String>>,
    /// Sessions compacted on Coda's request whose next prompt has not gone to OpenCode yet: a chunk of a
    /// message not known to be OpenCode's reply is the summary's (its `messageId` may not be known yet).
    window: HashMap<String, HashSet<String>>,
    next: u64,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// `provider/model` (a model id may hold more slashes).
fn split_model(v: &str) -> Option<(String, String)> {
    let (p, m) = v.split_once('/')?;
    (!p.is_empty() && !m.is_empty()).then(|| (p.to_owned(), m.to_owned()))
}

/// The current model among a result's `configOptions`.
fn model_of(result: &Value) -> Option<(String, String)> {
    let options = result.get("configOptions")?.as_array()?;
    let model = options.iter().find(|o| o.get("id").and_then(Value::as_str) == Some("model"))?;
    split_model(model.get("currentValue")?.as_str()?)
}

impl OpenCodeCompact {
    pub fn new(asker: Option<Asker>, record: Record) -> OpenCodeCompact {
        OpenCodeCompact {
            asker,
            record,
            gate: Gate::default(),
            running: HashMap::new(),
            sessions: HashMap::new(),
            setups: HashMap::new(),
            contexts: Contexts::default(),
            summaries: HashMap::new(),
            window: HashMap::new(),
            next: 0,
        }
    }

    fn turn_running(cx: &Cx, session: &str) -> bool {
        cx.open_requests().any(|r| r.is("session/prompt") && r.is_sent() && r.session() == Some(session))
    }

    fn compact(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(id) = frame.id().cloned() else { return };
        let v = frame.value();
        let session = match coda::session_of(v, &id) {
            Ok(s) => s,
            Err(answer) => return cx.to_client(answer),
        };
        let refuse = |reason: &str, cx: &mut Cx| cx.to_client(Outcome::not(reason).answer(&id));
        let Some(known) = self.sessions.get(&session) else { return refuse(NOT_RUNNING, cx) };
        if self.gate.is_closed(&session) {
            return refuse(ALREADY, cx);
        }
        if Self::turn_running(cx, &session) {
            return refuse(TURN_RUNNING, cx);
        }
        let Some((provider, model)) = known.model.clone() else {
            return refuse("OpenCode has not said which model this session uses; send a prompt first", cx);
        };
        let directory = known.cwd.clone();
        let Some(asker) = self.asker.clone() else {
            return refuse("OpenCode's server is not known to the shim, and only it compacts", cx);
        };
        self.next += 1;
        let n = self.next;
        self.gate.close(&session);
        self.window.insert(session.clone(), HashSet::new());
        let before = self.contexts.before(&session);
        self.running.insert(session.clone(), Running { id, n, before });
        self.record.handled(&ServerEvent::SummarizeAsked { session: session.clone() }, cx.wall());
        let ask = Ask { session, directory, provider, model };
        cx.work(
            move || {
                let session = ask.session.clone();
                asker(ask).map(|result| ServerEvent::Summarized { session, result })
            },
            OpenCodeCompact::asked,
        );
        cx.after(DEADLINE, Tick::Deadline(n));
    }

    /// OpenCode's server answered an ask (none: a replay's events file brings the answer).
    fn asked(&mut self, answer: Option<ServerEvent>, cx: &mut Cx) {
        if let Some(e) = answer {
            self.server_event(e, cx);
        }
    }

    /// The compaction of `session` ended: Coda's answer, then the prompts held meanwhile.
    fn finish(&mut self, session: &str, outcome: Outcome, cx: &mut Cx) {
        let Some(r) = self.running.remove(session) else { return };
        cx.cancel(&Tick::Deadline(r.n));
        cx.cancel(&Tick::Settle(r.n));
        if matches!(outcome, Outcome::NotCompacted(_)) {
            self.window.remove(session);
        }
        cx.to_client(outcome.answer(&r.id));
        for held in self.gate.open(session) {
            self.window.remove(session);
            cx.to_agent(held);
        }
    }

    fn compacted(&mut self, session: &str, cx: &mut Cx) {
        let Some(r) = self.running.get(session) else { return };
        let outcome = Outcome::Compacted { before: r.before, after: self.contexts.after(session) };
        self.finish(session, outcome, cx);
    }

    fn server_event(&mut self, e: ServerEvent, cx: &mut Cx) {
        match e {
            ServerEvent::Step(s) => {
                self.contexts.step(&s);
                if let (false, Some(p), Some(m), Some(known)) =
                    (s.summary, &s.provider, &s.model, self.sessions.get_mut(&s.session))
                {
                    known.model = Some((p.clone(), m.clone()));
                }
                if s.summary {
                    let known = self.summaries.entry(s.session.clone()).or_default();
                    if !known.contains(&s.message) {
                        known.push_back(s.message.clone());
                        if known.len() > SUMMARIES {
                            known.pop_front();
                        }
                    }
                } else if let Some(w) = self.window.get_mut(&s.session) {
                    w.insert(s.message.clone());
                }
            }
            ServerEvent::Compacted { session } => self.compacted(&session, cx),
            ServerEvent::Summarized { ref session, ref result } => {
                self.record.handled(&e, cx.wall());
                let Some(r) = self.running.get(session) else { return };
                match result {
                    Summarized::Done => cx.after(SETTLE, Tick::Settle(r.n)),
                    Summarized::Busy => self.finish(session, Outcome::not(TURN_RUNNING), cx),
                    Summarized::Failed { why } => {
                        let reason = format!("OpenCode did not compact the session: {why}");
                        self.finish(session, Outcome::not(reason), cx)
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether a message chunk of the agent's is a summary's (dropped).
    fn is_summary_chunk(&self, frame: &Frame, cx: &Cx) -> bool {
        let maybe = self.summaries.values().flatten().any(|m| frame.contains(m.as_bytes()));
        if !maybe && self.window.is_empty() {
            return false;
        }
        let v = frame.value();
        let (Some(session), message) = (str_at(v, "/params/sessionId"), str_at(v, "/params/update/messageId")) else {
            return false;
        };
        if let Some(m) = message
            && self.summaries.get(session).is_some_and(|known| known.iter().any(|k| k == m))
        {
            return true;
        }
        let Some(replies) = self.window.get(session) else { return false };
        !Self::turn_running(cx, session) && message.is_none_or(|m| !replies.contains(m))
    }

    fn setup_answer(&mut self, method: &str, session: Option<String>, frame: &Frame) {
        let Some(id) = frame.id() else { return };
        let cwd = self.setups.remove(id);
        let v = frame.value();
        let Some(result) = v.get("result") else { return };
        let session = match method {
            "session/new" | "session/fork" => str_at(result, "/sessionId").map(str::to_owned),
            _ => session,
        };
        let Some(session) = session else { return };
        let entry = self.sessions.entry(session).or_default();
        if let Some(cwd) = cwd {
            entry.cwd = cwd;
        }
        if let Some(m) = model_of(result) {
            entry.model = Some(m);
        }
    }
}

impl Layer for OpenCodeCompact {
    type Timer = Tick;
    type Event = FromServer;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Request { method, id } = frame.kind().clone() else { return cx.to_agent(frame) };
        match method.as_str() {
            coda::METHOD => return self.compact(frame, cx),
            "session/prompt" => {
                let session = cx.request_of(&id).and_then(|r| r.session()).map(str::to_owned);
                if let Some(s) = session {
                    let Some(frame) = self.gate.hold(&s, frame) else { return };
                    self.window.remove(&s);
                    return cx.to_agent(frame);
                }
            }
            "session/new"
            | "session/load"
            | "session/resume"
            | "session/fork"
            | "session/set_config_option"
            | "session/set_model" => {
                let v = frame.value();
                if let Some(cwd) = str_at(v, "/params/cwd") {
                    self.setups.insert(id.clone(), cwd.to_owned());
                }
                let model = match method.as_str() {
                    "session/set_model" => str_at(v, "/params/modelId"),
                    "session/set_config_option" if str_at(v, "/params/configId") == Some("model") => {
                        str_at(v, "/params/value")
                    }
                    _ => None,
                };
                if let (Some(s), Some(m)) = (str_at(v, "/params/sessionId"), model.and_then(split_model))
                    && let Some(known) = self.sessions.get_mut(s)
                {
                    known.model = Some(m);
                }
            }
            _ => {}
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => {
                let request = cx.answer_to(&frame).map(|r| (r.method.to_string(), r.session().map(str::to_owned)));
                match request {
                    Some((m, _)) if m == "initialize" => {
                        let mut v = frame.to_value();
                        if let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) {
                            coda::declare(result);
                            return cx.to_client(frame.rewritten(v));
                        }
                    }
                    Some((m, session))
                        if matches!(m.as_str(), "session/new" | "session/load" | "session/resume" | "session/fork") =>
                    {
                        self.setup_answer(&m, session, &frame)
                    }
                    _ => {}
                }
                cx.to_client(frame)
            }
            Kind::Notification { method }
                if method == "session/update"
                    && matches!(frame.session_update(), Some("agent_message_chunk" | "agent_thought_chunk")) =>
            {
                if self.is_summary_chunk(&frame, cx) {
                    tracing::debug!("dropped a chunk of OpenCode's compaction summary");
                    return;
                }
                cx.to_client(frame)
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        // A chunk is looked at only while a summary may be streaming (see `is_summary_chunk`).
        matches!(frame.kind(), Kind::Notification { .. })
            && (!frame.is_streamed_chunk()
                || (self.window.is_empty() && !self.summaries.values().flatten().any(|m| frame.contains(m.as_bytes()))))
    }

    fn on_event(&mut self, event: FromServer, cx: &mut Cx) {
        if let FromServer::Event(e) = event {
            self.server_event(e, cx)
        }
    }

    fn on_timer(&mut self, tick: Tick, cx: &mut Cx) {
        let find =
            |n: u64, running: &HashMap<String, Running>| running.iter().find(|(_, r)| r.n == n).map(|(s, _)| s.clone());
        match tick {
            Tick::Settle(n) => {
                if let Some(s) = find(n, &self.running) {
                    self.compacted(&s, cx);
                }
            }
            Tick::Deadline(n) => {
                if let Some(s) = find(n, &self.running) {
                    tracing::warn!("OpenCode did not finish compacting session {s} in time: cancelled");
                    cx.to_agent(frame::notification("session/cancel", json!({ "sessionId": s })));
                    self.finish(&s, Outcome::not(TIMED_OUT), cx);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::opencode::usage::Step;
    use crate::layer::testing::Harness;
    use std::sync::{Arc, Mutex};

    const S: &str = "ses_a";

    type Asked = Arc<Mutex<Vec<Ask>>>;

    fn harness(server: bool) -> (Harness, Asked) {
        let asked = Asked::default();
        let a = asked.clone();
        let asker: Option<Asker> = server.then(|| {
            Arc::new(move |ask| {
                a.lock().unwrap().push(ask);
                None
            }) as Asker
        });
        let mut h = Harness::of(OpenCodeCompact::new(asker, Record::off()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
        h.from_agent(
            json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}}),
        );
        let init = h.to_client();
        assert_eq!(init[0]["result"]["agentCapabilities"]["_meta"]["coda"]["compact"], json!({}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w d","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S,"configOptions":[
            {"id":"mode","currentValue":"build"},{"id":"model","currentValue":"fake/fake-model"}]}}));
        h.to_client();
        h.to_agent();
        (h, asked)
    }

    fn compact(h: &mut Harness, id: u64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"_coda/session/compact","params":{"sessionId":S}}));
    }

    fn step(message: &str, tokens: u64, summary: bool) -> FromServer {
        FromServer::Event(ServerEvent::Step(Box::new(Step {
            session: S.into(),
            message: message.into(),
            created_ms: 1,
            completed_ms: Some(2),
            tokens: Some(tokens),
            output: Some(40),
            summary,
            provider: Some("fake".into()),
            model: Some("m2".into()),
            parent: None,
            agent: None,
            variant: None,
        })))
    }

    fn ev(e: ServerEvent) -> FromServer {
        FromServer::Event(e)
    }

    fn prompt(id: u64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}})
    }

    fn chunk(message: &str) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":{
            "sessionUpdate":"agent_message_chunk","messageId":message,"content":{"type":"text","text":"x"}}}})
    }

    #[test]
    fn between_turns_it_asks_the_server_holds_prompts_and_answers_with_before_and_after() {
        let (mut h, asked) = harness(true);
        h.event(0, step("msg_1", 7678, false));
        compact(&mut h, 7);
        assert!(h.to_client().is_empty() && h.to_agent().is_empty(), "nothing over ACP");
        let ask = asked.lock().unwrap().pop().expect("asked");
        assert_eq!(
            ask,
            Ask { session: S.into(), directory: "/w d".into(), provider: "fake".into(), model: "m2".into() }
        );
        h.from_client(prompt(8));
        assert!(h.to_agent().is_empty(), "held while compacting");
        h.event(0, ev(ServerEvent::Summarized { session: S.into(), result: Summarized::Done }));
        h.event(0, step("msg_s", 578, true));
        // The summary's text over ACP is not a reply: dropped.
        h.from_agent(chunk("msg_s"));
        assert!(h.to_client().is_empty());
        h.event(0, ev(ServerEvent::Compacted { session: S.into() }));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":7678,"after":7718}})]
        );
        assert_eq!(h.to_agent(), vec![prompt(8)], "the held prompt runs after it");
        // The next turn's reply passes; a late summary chunk still does not.
        h.from_agent(chunk("msg_2"));
        h.from_agent(chunk("msg_s"));
        assert_eq!(h.to_client(), vec![chunk("msg_2")]);
        assert_eq!(h.next_wake(), None, "no timer left");
    }

    #[test]
    fn an_unknown_chunk_outside_a_turn_right_after_asking_is_the_summarys() {
        let (mut h, _) = harness(true);
        h.event(0, step("msg_1", 100, false));
        compact(&mut h, 7);
        h.from_agent(chunk("msg_unknown_yet"));
        assert!(h.to_client().is_empty());
        h.event(0, ev(ServerEvent::Summarized { session: S.into(), result: Summarized::Done }));
        h.advance(SETTLE);
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":true,"before":100}), "after unknown: left out");
        // OpenCode's own reply (known from its server) passes.
        h.event(0, step("msg_own", 120, false));
        h.from_agent(chunk("msg_own"));
        assert_eq!(h.to_client().len(), 1);
    }

    #[test]
    fn refused_when_a_turn_runs_when_busy_when_unknown_and_twice() {
        let (mut h, asked) = harness(true);
        h.from_client(prompt(2));
        h.to_agent();
        compact(&mut h, 3);
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":TURN_RUNNING}));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        h.to_client();
        h.from_client(json!({"jsonrpc":"2.0","id":4,"method":"_coda/session/compact","params":{"sessionId":"nope"}}));
        assert_eq!(h.to_client()[0]["result"]["reason"], NOT_RUNNING);
        compact(&mut h, 5);
        compact(&mut h, 6);
        assert_eq!(h.to_client()[0]["result"]["reason"], ALREADY);
        assert_eq!(asked.lock().unwrap().len(), 1);
        h.event(0, ev(ServerEvent::Summarized { session: S.into(), result: Summarized::Busy }));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":5,"result":{"compacted":false,"reason":TURN_RUNNING}})]
        );
        compact(&mut h, 9);
        h.event(
            0,
            ev(ServerEvent::Summarized { session: S.into(), result: Summarized::Failed { why: "HTTP 500".into() } }),
        );
        assert_eq!(h.to_client()[0]["result"]["reason"], "OpenCode did not compact the session: HTTP 500");
        assert!(h.to_agent().is_empty());
    }

    #[test]
    fn a_hung_compaction_is_cancelled_and_answered_before_codas_ten_minutes() {
        let (mut h, _) = harness(true);
        compact(&mut h, 3);
        h.from_client(prompt(4));
        h.advance(DEADLINE - Duration::from_millis(1));
        assert!(h.to_client().is_empty());
        h.advance(Duration::from_millis(1));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":TIMED_OUT}));
        let out = h.to_agent();
        assert_eq!(out[0], json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}}));
        assert_eq!(out[1], prompt(4));
        // A late answer changes nothing.
        h.event(0, ev(ServerEvent::Compacted { session: S.into() }));
        assert!(h.to_client().is_empty());
    }

    #[test]
    fn without_the_server_a_request_is_refused_with_the_reason() {
        let (mut h, _) = harness(false);
        compact(&mut h, 3);
        let r = &h.to_client()[0]["result"];
        assert_eq!(r["compacted"], false);
        assert!(r["reason"].as_str().unwrap().contains("server"));
    }

    #[test]
    fn hostile_requests_get_errors_and_the_model_can_change() {
        let (mut h, asked) = harness(true);
        for params in [json!({}), json!({"sessionId":1e300}), json!({"sessionId":""}), json!([1])] {
            h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"_coda/session/compact","params":params}));
            assert_eq!(h.to_client()[0]["error"]["code"], -32602, "{params}");
        }
        let huge = r#"{"jsonrpc":"2.0","id":3,"method":"_coda/session/compact","params":{"sessionId":1e400}}"#;
        if let Ok(f) = Frame::parse(huge.as_bytes().to_vec()) {
            h.client_frame(f);
            assert!(h.to_client()[0]["error"]["code"].is_i64());
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let text = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"_coda/session/compact","params":{{"sessionId":"{S}","x":{deep}}}}}"#
        );
        if let Ok(f) = Frame::parse(text.into_bytes()) {
            h.client_frame(f);
            let out = h.to_client();
            assert_eq!(out.len(), 1);
            assert!(out[0]["error"]["code"].is_i64() || out[0]["result"].is_object(), "{}", out[0]);
        }
        assert!(h.to_agent().is_empty(), "never forwarded");
        asked.lock().unwrap().clear();
        h.from_client(json!({"jsonrpc":"2.0","id":5,"method":"session/set_config_option",
            "params":{"sessionId":S,"configId":"model","value":"openrouter/anthropic/claude"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":5,"result":{}}));
        compact(&mut h, 6);
        let ask = asked.lock().unwrap().pop();
        let ask = ask.or_else(|| {
            // A compaction started by the deep request above is still running: end it first.
            h.event(0, ev(ServerEvent::Compacted { session: S.into() }));
            compact(&mut h, 6);
            asked.lock().unwrap().pop()
        });
        let ask = ask.expect("asked");
        assert_eq!((ask.provider.as_str(), ask.model.as_str()), ("openrouter", "anthropic/claude"));
    }
}

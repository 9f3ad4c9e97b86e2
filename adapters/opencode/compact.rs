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
//! So OpenCode's backend for the engine's compaction machine ([`crate::coda::compact`], which keeps the
//! rules): it does no HTTP itself but runs the set-up's [`Asker`] (`summarize.rs`) on an [`Ask`] as a job
//! (off the relay loop) and gets the answer back as a [`ServerEvent::Summarized`] (in a replay that event
//! comes from the recording's events file instead). `true` is followed by `session.compacted` (or, after
//! [`SETTLE`], what is known): compacted, `before` the context of the latest step (exact, OpenCode's own
//! count), `after` an estimate (`usage::Contexts::after`). Busy or an error: not compacted. The server's
//! `session.status` says whether a turn runs (told to the session table). Stopped (past the deadline) with
//! `session/cancel`.
//!
//! The summary's chunks are dropped wherever they come (their `messageId` is a summary's, from its step on the
//! server). From the compaction's start until its summary is known (or its end and [`SETTLE`] after it, or the
//! event stream is lost), a chunk of a message the server has not named yet, outside Coda's turn, is held
//! until the server names it: the summary's is dropped, any other (OpenCode's own turn) goes on in order. Every
//! other frame of the session OpenCode writes meanwhile (a tool call, a usage update, a request) waits behind a
//! held chunk, so nothing passes it: at most `HELD_CHUNKS` frames, then what is held goes on.

use crate::{HashMap, HashSet};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::adapters::opencode::usage::Contexts;
use crate::coda::compact::{Compactor, Ctl, Outcome, TURN_RUNNING};
use crate::frame::{Frame, Id, Kind, Needle};
use crate::layer::{Cx, Turn};

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
/// backend runs it as a job, which holds one of the engine's few workers meanwhile.
pub type Asker = Arc<dyn Fn(Ask) -> Option<Summarized> + Send + Sync>;

/// After OpenCode's server answered `true`: how long to wait for its `session.compacted` (and the summary's
/// tokens) before answering with what is known; after the compaction ended, how long unnamed chunks are held.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The key of a chunk's message ([`OpenCodeCompact::may_be_summary`]).
static MESSAGE_ID: Needle = crate::needle!(b"\"messageId\"");

/// How many summaries per session are remembered, for their late chunks.
const SUMMARIES: usize = 8;
/// Chunks held per session at most while their message is unknown (past that they go on).
const HELD_CHUNKS: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tick {
    /// [`SETTLE`] passed after the server's `true` for the compaction of this session and round.
    Settle(String, u64),
    /// [`SETTLE`] passed after the compaction of this session ended: its window closes.
    Close(String, u64),
}

#[derive(Default)]
struct Session {
    cwd: String,
    model: Option<(String, String)>,
}

/// The chunks of a session whose message the server has not named, while a summary may be streaming.
#[derive(Default)]
struct Window {
    round: u64,
    /// The summary's message is known: any other message is not it.
    summary_known: bool,
    /// Messages the server named as steps of a turn (OpenCode's replies).
    replies: HashSet<String>,
    /// Chunks of unnamed messages, in order.
    held: Vec<Frame>,
}

/// OpenCode's compaction (see the module docs).
pub struct OpenCodeCompact {
    /// None: OpenCode's server is unknown (an agent command without `--port`): requests are refused with the
    /// reason. The capability is declared all the same: OpenCode compacts, and the default command has it.
    asker: Option<Asker>,
    record: Record,
    /// Running compactions: session -> (round, before).
    running: HashMap<String, (u64, Option<u64>)>,
    sessions: HashMap<String, Session>,
    /// `session/new`, `load`, `resume`, `fork` in flight: their cwd.
    setups: HashMap<Id, String>,
    contexts: Contexts,
    /// Summary messages per session: their chunks are dropped wherever they come.
    summaries: HashMap<String, VecDeque<String>>,
    windows: HashMap<String, Window>,
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
            running: HashMap::default(),
            sessions: HashMap::default(),
            setups: HashMap::default(),
            contexts: Contexts::default(),
            summaries: HashMap::default(),
            windows: HashMap::default(),
        }
    }

    /// OpenCode's server answered an ask (none: a replay's events file brings the answer).
    fn asked(&mut self, answer: Option<ServerEvent>, ctl: &mut Ctl<Self>) {
        if let Some(e) = answer {
            self.server_event(e, ctl);
        }
    }

    fn compacted(&mut self, session: &str, ctl: &mut Ctl<Self>) {
        let Some(&(round, before)) = self.running.get(session) else { return };
        let outcome = Outcome::Compacted { before, after: self.contexts.after(session) };
        ctl.ended(session, round, outcome);
    }

    /// Hands on the held chunks of `session` whose message is known not to be a summary (`all`: every one that
    /// is not a summary's), drops those of a summary; a frame that is no chunk goes on once it is at the front.
    fn release(&mut self, session: &str, cx: &mut Cx, all: bool) {
        let Some(w) = self.windows.get_mut(session) else { return };
        let summaries = self.summaries.get(session);
        let held = std::mem::take(&mut w.held);
        for frame in held {
            let message = frame.value().pointer("/params/update/messageId").and_then(Value::as_str).map(str::to_owned);
            let summary = message.as_ref().is_some_and(|m| summaries.is_some_and(|k| k.contains(m)));
            let named = message.as_ref().is_some_and(|m| w.replies.contains(m)) || !frame.is_streamed_chunk();
            if summary {
                tracing::debug!("dropped a chunk of OpenCode's compaction summary");
            } else if (all || named || w.summary_known) && w.held.is_empty() {
                cx.to_client(frame);
            } else {
                // Still unnamed, or behind one that is: in order.
                w.held.push(frame);
            }
        }
    }

    fn close(&mut self, session: &str, cx: &mut Cx) {
        self.release(session, cx, true);
        self.windows.remove(session);
    }

    /// Nothing more will name a message (the event stream is lost, or OpenCode is gone): what is held goes on.
    fn close_all(&mut self, cx: &mut Cx) {
        let mut sessions: Vec<String> = self.windows.keys().cloned().collect();
        sessions.sort();
        for s in sessions {
            self.close(&s, cx);
        }
    }

    fn server_event(&mut self, e: ServerEvent, ctl: &mut Ctl<Self>) {
        match e {
            ServerEvent::Step(s) => {
                self.contexts.root_step(&s, ctl.cx);
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
                    if let Some(w) = self.windows.get_mut(&s.session) {
                        w.summary_known = true;
                    }
                } else if let Some(w) = self.windows.get_mut(&s.session) {
                    w.replies.insert(s.message.clone());
                }
                self.release(&s.session, ctl.cx, false);
            }
            ServerEvent::Status { session, busy } => {
                if let Some(s) = ctl.cx.session_mut(&session) {
                    s.set_busy(busy);
                }
            }
            ServerEvent::Compacted { session } => self.compacted(&session, ctl),
            ServerEvent::Summarized { ref session, ref result } => {
                self.record.handled(&e, ctl.cx.wall());
                let Some(&(round, _)) = self.running.get(session) else { return };
                match result {
                    Summarized::Done => ctl.after(SETTLE, Tick::Settle(session.clone(), round)),
                    Summarized::Busy => ctl.ended(session, round, Outcome::not(TURN_RUNNING)),
                    Summarized::Failed { why } => {
                        ctl.ended(session, round, Outcome::not(format!("OpenCode did not compact the session: {why}")))
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether `frame` may be a chunk of a summary of its session's: a `"messageId"` key of its line has one's
    /// message as its value, or a value with an escape (which may spell one), or the line has a `\u` escape
    /// (which may spell the key). Exact where it says no; one search of the line however many are kept.
    fn may_be_summary(&self, frame: &Frame) -> bool {
        let Some(known) = frame.session().and_then(|s| self.summaries.get(&*s)).filter(|k| !k.is_empty()) else {
            return false;
        };
        frame.unicode_escaped()
            || frame.key_strings(&MESSAGE_ID).any(|m| m.is_none_or(|m| known.iter().any(|k| k == m)))
    }

    /// A message chunk of the agent's: `true` to pass it on now.
    fn chunk(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        if self.windows.is_empty() && !self.may_be_summary(frame) {
            return true;
        }
        let v = frame.value();
        let (Some(session), message) = (str_at(v, "/params/sessionId"), str_at(v, "/params/update/messageId")) else {
            return true;
        };
        if let Some(m) = message
            && self.summaries.get(session).is_some_and(|known| known.iter().any(|k| k == m))
        {
            tracing::debug!("dropped a chunk of OpenCode's compaction summary");
            return false;
        }
        let coda_turn = matches!(ctl.cx.turn(session), Some(Turn::Coda { sent: true, .. }));
        let Some(w) = self.windows.get_mut(session) else { return true };
        // Behind a held chunk any chunk of the session waits too: they go on in the order they came.
        let known = coda_turn || w.summary_known || message.is_some_and(|m| w.replies.contains(m));
        if known && w.held.is_empty() {
            return true;
        }
        if w.held.len() >= HELD_CHUNKS {
            // What is held goes on first, in order; then this one.
            self.release(session, ctl.cx, true);
            return true;
        }
        w.held.push(frame.clone());
        false
    }

    /// A frame of the agent's that is no chunk: `true` to pass it on now; `false` when it waits behind its
    /// session's held chunks (see `chunk`).
    fn behind_held(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        if self.windows.values().all(|w| w.held.is_empty()) {
            return true;
        }
        let v = frame.value();
        let Some(session) = str_at(v, "/params/sessionId").map(str::to_owned) else { return true };
        let Some(w) = self.windows.get_mut(&session).filter(|w| !w.held.is_empty()) else { return true };
        if w.held.len() >= HELD_CHUNKS {
            self.release(&session, ctl.cx, true);
            return true;
        }
        w.held.push(frame.clone());
        false
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
        if self.sessions.len() >= crate::layer::sessions::MAX_ROOTS && !self.sessions.contains_key(&session) {
            self.sessions.clear();
        }
        let entry = self.sessions.entry(session).or_default();
        if let Some(cwd) = cwd {
            entry.cwd = cwd;
        }
        if let Some(m) = model_of(result) {
            entry.model = Some(m);
        }
    }
}

impl Compactor for OpenCodeCompact {
    fn session_closed(&mut self, session: &str, ctl: &mut Ctl<Self>) {
        self.close(session, ctl.cx);
        self.running.remove(session);
        self.sessions.remove(session);
        self.summaries.remove(session);
        self.contexts.closed(session);
    }

    fn kept(&self) -> usize {
        self.running.len()
            + self.sessions.len()
            + self.setups.len()
            + self.summaries.len()
            + self.windows.len()
            + self.contexts.kept()
    }

    type Event = FromServer;
    type Reply = std::convert::Infallible;
    type Timer = Tick;

    fn refuse(&self, session: &str, _cx: &Cx) -> Option<String> {
        let Some(known) = self.sessions.get(session) else {
            return Some("OpenCode has not said which model this session uses; send a prompt first".into());
        };
        if known.model.is_none() {
            return Some("OpenCode has not said which model this session uses; send a prompt first".into());
        }
        self.asker.is_none().then(|| "OpenCode's server is not known to the shim, and only it compacts".into())
    }

    fn start(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>) {
        let known = self.sessions.get(session);
        let (Some(asker), Some((provider, model))) = (self.asker.clone(), known.and_then(|k| k.model.clone())) else {
            return;
        };
        let directory = known.map(|k| k.cwd.clone()).unwrap_or_default();
        let before = self.contexts.before(session);
        self.running.insert(session.to_owned(), (round, before));
        self.close(session, ctl.cx);
        self.windows.insert(session.to_owned(), Window { round, ..Window::default() });
        self.record.handled(&ServerEvent::SummarizeAsked { session: session.to_owned() }, ctl.cx.wall());
        let ask = Ask { session: session.to_owned(), directory, provider, model };
        ctl.work(
            move || {
                let session = ask.session.clone();
                asker(ask).map(|result| ServerEvent::Summarized { session, result })
            },
            OpenCodeCompact::asked,
        );
    }

    fn finished(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>) {
        if self.running.get(session).is_some_and(|(r, _)| *r == round) {
            self.running.remove(session);
        }
        ctl.cancel(Tick::Settle(session.to_owned(), round));
        match self.windows.get(session) {
            Some(w) if w.summary_known => self.close(session, ctl.cx),
            Some(_) => ctl.after(SETTLE, Tick::Close(session.to_owned(), round)),
            None => {}
        }
    }

    fn client_request(&mut self, frame: &Frame, cx: &mut Cx) {
        let Kind::Request { method, id } = frame.kind() else { return };
        if method == "session/prompt" {
            // Coda's turn begins: what OpenCode streamed before it goes first.
            if let Some(session) = cx.request_of(id).and_then(|r| r.session()).map(str::to_owned) {
                self.close(&session, cx);
            }
            return;
        }
        if !matches!(
            method.as_str(),
            "session/new"
                | "session/load"
                | "session/resume"
                | "session/fork"
                | "session/set_config_option"
                | "session/set_model"
        ) {
            return;
        }
        let v = frame.value();
        if let Some(cwd) = str_at(v, "/params/cwd") {
            self.setups.insert(id.clone(), cwd.to_owned());
        }
        let model = match method.as_str() {
            "session/set_model" => str_at(v, "/params/modelId"),
            "session/set_config_option" if str_at(v, "/params/configId") == Some("model") => str_at(v, "/params/value"),
            _ => None,
        };
        if let (Some(s), Some(m)) = (str_at(v, "/params/sessionId"), model.and_then(split_model))
            && let Some(known) = self.sessions.get_mut(s)
        {
            known.model = Some(m);
        }
    }

    fn from_agent(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        match frame.kind() {
            Kind::Response { .. } => {
                let request = ctl.cx.answer_to(frame).map(|r| (r.method.to_string(), r.session().map(str::to_owned)));
                if let Some((m, session)) = request
                    && matches!(m.as_str(), "session/new" | "session/load" | "session/resume" | "session/fork")
                {
                    self.setup_answer(&m, session, frame);
                }
                true
            }
            Kind::Notification { method }
                if method == "session/update"
                    && matches!(frame.session_update(), Some("agent_message_chunk" | "agent_thought_chunk")) =>
            {
                self.chunk(frame, ctl)
            }
            _ => self.behind_held(frame, ctl),
        }
    }

    fn ignores(&self, frame: &Frame) -> bool {
        // A chunk is looked at only while a summary may be streaming (see `chunk`).
        matches!(frame.kind(), Kind::Notification { .. })
            && self.windows.values().all(|w| w.held.is_empty())
            && (!frame.is_streamed_chunk() || (self.windows.is_empty() && !self.may_be_summary(frame)))
    }

    /// A chunk is searched for a summary's message id while there is one and no window is open.
    fn chunks_by_session(&self) -> bool {
        !self.windows.is_empty() || self.summaries.values().flatten().next().is_none()
    }

    fn on_event(&mut self, event: FromServer, ctl: &mut Ctl<Self>) {
        match event {
            FromServer::Event(e) => self.server_event(e, ctl),
            // Nothing more will name a message: what is held goes on.
            FromServer::Lost => self.close_all(ctl.cx),
            FromServer::Read(_) => {}
        }
    }

    fn on_timer(&mut self, tick: Tick, ctl: &mut Ctl<Self>) {
        match tick {
            Tick::Settle(session, round) => {
                if self.running.get(&session).is_some_and(|(r, _)| *r == round) {
                    self.compacted(&session, ctl);
                }
            }
            Tick::Close(session, round) => {
                if self.windows.get(&session).is_some_and(|w| w.round == round) {
                    self.close(&session, ctl.cx);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::opencode::usage::Step;
    use crate::coda::compact::{ALREADY, Compaction, DEADLINE, GRACE, NOT_RUNNING, TIMED_OUT};
    use crate::layer::testing::Harness;
    use serde_json::json;
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
        let mut h = Harness::of(Compaction::new(OpenCodeCompact::new(asker, Record::off())));
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
        // However its line writes it: white space around the colon, the id or the key spelled with an escape,
        // the key's text inside another key before it.
        let update = |members: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"agent_message_chunk",{members},"content":{{"type":"text","text":"msg_s"}}}}}}}}"#
            )
        };
        for members in [
            concat!(r#""messageId" :"#, "\t", r#""msg_s""#),
            r#""messageId":"msg\u005fs""#,
            r#""message\u0049d":"msg_s""#,
            r#""a\"messageId":"msg_2","messageId":"msg_s""#,
        ] {
            h.agent_frame(Frame::parse(update(members).into_bytes()).expect("valid"));
            assert!(h.take().to_client.is_empty(), "{members}");
        }
        // Another message's chunk that names the summary's id in its text goes on.
        h.agent_frame(Frame::parse(update(r#""messageId":"msg_3""#).into_bytes()).expect("valid"));
        assert_eq!(h.take().to_client.len(), 1);
    }

    #[test]
    fn a_chunk_of_a_message_not_named_yet_waits_until_the_server_names_it() {
        let (mut h, _) = harness(true);
        h.event(0, step("msg_1", 100, false));
        compact(&mut h, 7);
        // The summary's text, before its step: held, then dropped once the step names it.
        h.from_agent(chunk("msg_s"));
        // OpenCode's own turn (a background result) before its step: held, then passed on, in order.
        h.from_agent(chunk("msg_own"));
        h.from_agent(chunk("msg_own"));
        // A chunk of a message the server did name waits behind them: the session's chunks keep their order.
        h.event(0, step("msg_r", 120, false));
        h.from_agent(chunk("msg_r"));
        assert!(h.to_client().is_empty());
        h.event(0, step("msg_s", 578, true));
        assert_eq!(h.to_client(), vec![chunk("msg_own"), chunk("msg_own"), chunk("msg_r")]);
        h.event(0, ev(ServerEvent::Summarized { session: S.into(), result: Summarized::Done }));
        h.advance(SETTLE);
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":true,"before":100,"after":140}));
        // After the compaction, OpenCode's own turn passes as it comes.
        h.advance(SETTLE);
        h.from_agent(chunk("msg_next"));
        assert_eq!(h.to_client(), vec![chunk("msg_next")]);
    }

    /// OpenCode's own turn writes a tool call (and a usage update) after a chunk held until the server names its
    /// message: they wait behind it, and go on after it, in the order OpenCode wrote them; past the bound, what is
    /// held goes on first.
    #[test]
    fn what_opencode_writes_after_a_held_chunk_waits_behind_it() {
        let (mut h, _) = harness(true);
        compact(&mut h, 7);
        h.from_agent(chunk("msg_own"));
        let tool = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,
            "update":{"sessionUpdate":"tool_call","toolCallId":"t1","title":"ls","status":"pending"}}});
        h.from_agent(tool.clone());
        assert!(h.to_client().is_empty(), "behind the held chunk");
        h.event(0, step("msg_own", 120, false));
        assert_eq!(h.to_client(), vec![chunk("msg_own"), tool.clone()]);
        h.from_agent(chunk("msg_own_2"));
        for _ in 0..HELD_CHUNKS {
            h.from_agent(tool.clone());
        }
        let got = h.to_client();
        assert_eq!(got.len(), HELD_CHUNKS + 1, "past the bound all of it goes on");
        assert_eq!(got[0], chunk("msg_own_2"), "in order");
    }

    #[test]
    fn when_the_event_stream_is_lost_held_chunks_go_on_and_nothing_more_is_held() {
        let (mut h, _) = harness(true);
        compact(&mut h, 7);
        h.from_agent(chunk("msg_own"));
        assert!(h.to_client().is_empty());
        h.event(0, FromServer::Lost);
        assert_eq!(h.to_client(), vec![chunk("msg_own")], "nothing will name it now");
        h.from_agent(chunk("msg_own_2"));
        assert_eq!(h.to_client(), vec![chunk("msg_own_2")]);
    }

    #[test]
    fn when_opencode_is_gone_held_chunks_go_on() {
        // A chunk of a message the server never named, held in the compaction's window when the process ends
        // (before the window would have closed): Coda still gets it.
        let (mut h, _) = harness(true);
        compact(&mut h, 7);
        h.from_agent(chunk("msg_own"));
        assert!(h.to_client().is_empty());
        h.end();
        let out = h.to_client();
        assert_eq!(out.iter().filter(|f| **f == chunk("msg_own")).count(), 1, "{out:?}");
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
        assert_eq!(out, vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        // Past the grace with no end from the server: the held prompt ends unsent.
        h.advance(GRACE);
        assert_eq!(h.to_client()[0]["id"], 4);
        assert!(h.to_agent().is_empty());
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

//! The permission bridge: OpenCode's subagent sessions resumed, and their permission requests put to Coda.
//!
//! OpenCode forwards nothing of a session it has not been told about (checked live on 1.18.33): a permission
//! request inside a foreground child never reaches Coda, and the turn hangs until Coda cancels it. This layer
//! sits above the activity layer (`activity.rs`) and follows what it announces:
//! - a `_coda/wait` that is `waiting` and names a `childSessionId` makes the layer resume that child
//!   (`session/resume`, no replay), after the report is on its way to Coda (Coda takes the child's frames
//!   only from then on); from then on OpenCode forwards the child's output and permission requests on the
//!   child session itself;
//! - a request the child raised before the resume took effect is not forwarded by OpenCode. OpenCode's server
//!   (`server.rs`) names it (`permission.asked`); if it is still unforwarded [`ASK_GRACE`] after the resume
//!   (or after the resume failed), the layer asks Coda itself and answers it on OpenCode's server. A copy
//!   OpenCode forwards late gets Coda's answer instead of a second question.

use crate::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::coda::wait;
use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Layer, cancel};

/// How long a child's permission request may stay unforwarded after the child was resumed before the shim
/// asks Coda itself (OpenCode forwards one raised after the resume within milliseconds).
pub const ASK_GRACE: Duration = Duration::from_secs(1);

/// Ids of the shim's own permission requests to Coda.
pub const ASK_ID: &str = "coda-opencode-ask-";

/// Answers a permission request on OpenCode's server: (directory, request id, `once`|`always`|`reject`); the
/// error says why OpenCode did not take it. An HTTP request (`mod.rs`): the layer runs it as a job
/// ([`Cx::work`]), off the relay loop.
pub type Replier = Arc<dyn Fn(&str, &str, &str) -> Result<(), String> + Send + Sync>;

/// What became of an answer to a permission request on OpenCode's server (the result of its job).
struct Replied {
    id: String,
    result: Result<(), String>,
}

/// Wake-ups this layer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tick {
    /// [`ASK_GRACE`] after a child's permission requests became due (the count of such moments).
    Asks(u64),
    /// The resume delay of a test ran out: send the held `session/resume` with this tag.
    Resume(u64),
}

/// The tag of the shim's own `session/resume` of a child, handed back with its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume(u64);

/// A child's permission request seen on OpenCode's server.
#[derive(Debug)]
struct Ask {
    session: String,
    permission: String,
    /// OpenCode's `toolCallId` for it (the tool call, else the request id).
    call: String,
    metadata: Value,
    directory: String,
    /// The [`Tick::Asks`] from which on it counts as not forwarded; `None` while its child is not resumed.
    due: Option<u64>,
    /// The id of the shim's own request to Coda, once asked.
    asked: Option<String>,
}

/// Sessions' folders, and the children the layer resumes.
#[derive(Default)]
struct Children {
    /// session/new|load|resume in flight -> its cwd (the session asked for is the request table's).
    setup: HashMap<Id, String>,
    /// Session -> its cwd (a child is resumed in its parent's).
    cwd: HashMap<String, String>,
    /// Children named by an activity report.
    named: HashSet<String>,
    /// Children the shim has resumed (or tried to).
    resumed: HashSet<String>,
    /// `session/resume` in flight: tag -> child.
    resuming: HashMap<u64, String>,
    /// Resumes held back by the resume delay: tag -> cwd.
    delayed: HashMap<u64, String>,
    /// Children OpenCode knows now (resumed), and children it never will (the resume failed).
    known_to_opencode: HashSet<String>,
    unreachable: HashSet<String>,
    next_tag: u64,
}

/// Children's permission requests and what became of them.
#[derive(Default)]
struct Asks {
    /// By OpenCode's request id.
    pending: HashMap<String, Ask>,
    /// (session, toolCallId) of permission requests OpenCode forwarded itself.
    forwarded: HashSet<(String, String)>,
    /// OpenCode's own request for an ask the shim had already put to Coda: answered with Coda's answer.
    held: HashMap<(String, String), Id>,
    /// Coda's answers to the shim's own requests, for a copy OpenCode forwards late.
    answered: HashMap<(String, String), Value>,
    next_tick: u64,
    next_asked: u64,
}

pub struct Permissions {
    replier: Replier,
    record: Record,
    /// Zero, unless a live test holds each `session/resume` back this long (the race [`ASK_GRACE`] is there for).
    resume_delay: Duration,
    children: Children,
    asks: Asks,
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// OpenCode's options for a permission request (its ids are what it expects back).
pub fn ask_options() -> Value {
    json!([
        {"optionId": "once", "kind": "allow_once", "name": "Allow once"},
        {"optionId": "always", "kind": "allow_always", "name": "Always allow"},
        {"optionId": "reject", "kind": "reject_once", "name": "Reject"}
    ])
}

/// The tool-call kind OpenCode gives a permission's tool.
fn tool_kind(permission: &str) -> &'static str {
    match permission.to_ascii_lowercase().as_str() {
        "bash" | "shell" => "execute",
        "webfetch" => "fetch",
        "edit" | "write" | "patch" | "apply_patch" => "edit",
        "grep" | "glob" => "search",
        "read" => "read",
        "task" => "think",
        _ => "other",
    }
}

/// A line people can read for a permission request: the command, file, pattern or address it is about.
fn ask_title(ask: &Ask) -> String {
    ["command", "cmd", "filePath", "filepath", "path", "pattern", "url", "query", "description"]
        .iter()
        .find_map(|k| str_at(&ask.metadata, k))
        .unwrap_or(&ask.permission)
        .to_owned()
}

impl Permissions {
    /// `replier` answers on OpenCode's server; `record` logs the server events handled; each `session/resume`
    /// is sent `resume_delay` late (zero but in live tests).
    pub fn new(replier: Replier, record: Record, resume_delay: Duration) -> Permissions {
        Permissions { replier, record, resume_delay, children: Children::default(), asks: Asks::default() }
    }

    /// An activity report from the layer below: a child it names is resumed once the report is on its way.
    fn report_seen(&mut self, report: &Frame, cx: &mut Cx) {
        // Read where it lies (a report is written as bytes: no value of it is kept), its members gone over once
        // with the waits layer above, which reads it next.
        let read = report.params_pick(["sessionId", "childSessionId", "state"]);
        let [parent, child, state] = read.map(crate::json::str_of);
        let (Some(parent), Some(child)) = (parent, child) else { return };
        self.children.named.insert(child.clone().into_owned());
        if state.as_deref() == Some(wait::State::Waiting.as_str()) {
            self.follow(&parent, &child, cx);
        }
    }

    /// Resumes a child so that OpenCode forwards its output and permission requests.
    fn follow(&mut self, parent: &str, child: &str, cx: &mut Cx) {
        let c = &mut self.children;
        if !c.resumed.insert(child.to_owned()) {
            return;
        }
        let Some(cwd) = c.cwd.get(parent).cloned() else {
            tracing::warn!("no cwd known for session {parent}; its subagent {child} is not followed");
            c.unreachable.insert(child.to_owned());
            return self.asks_due(child, cx);
        };
        c.next_tag += 1;
        let tag = c.next_tag;
        c.resuming.insert(tag, child.to_owned());
        if self.resume_delay.is_zero() {
            self.send_resume(tag, &cwd, cx);
        } else {
            c.delayed.insert(tag, cwd);
            cx.after(self.resume_delay, Tick::Resume(tag));
        }
    }

    fn send_resume(&mut self, tag: u64, cwd: &str, cx: &mut Cx) {
        let Some(child) = self.children.resuming.get(&tag) else { return };
        cx.request("session/resume", json!({"sessionId": child, "cwd": cwd, "mcpServers": []}), Resume(tag));
    }

    fn is_child(&self, session: &str) -> bool {
        self.children.resumed.contains(session) || self.children.named.contains(session)
    }

    /// The child's pending asks start counting: OpenCode forwards any it still can within [`ASK_GRACE`].
    fn asks_due(&mut self, child: &str, cx: &mut Cx) {
        let ready = self.children.known_to_opencode.contains(child) || self.children.unreachable.contains(child);
        if !ready {
            return;
        }
        let a = &mut self.asks;
        let mut any = false;
        for ask in a.pending.values_mut().filter(|ask| ask.session == child && ask.due.is_none()) {
            ask.due = Some(a.next_tick + 1);
            any = true;
        }
        if any {
            a.next_tick += 1;
            cx.after(ASK_GRACE, Tick::Asks(a.next_tick));
        }
    }

    /// Puts to Coda the due asks OpenCode has not forwarded.
    fn ask_overdue(&mut self, tick: u64, cx: &mut Cx) {
        let a = &mut self.asks;
        let mut overdue: Vec<String> = a
            .pending
            .iter()
            .filter(|(_, ask)| ask.asked.is_none() && ask.due.is_some_and(|d| d <= tick))
            .filter(|(_, ask)| !a.forwarded.contains(&(ask.session.clone(), ask.call.clone())))
            .map(|(id, _)| id.clone())
            .collect();
        overdue.sort();
        for id in overdue {
            let Some(ask) = a.pending.get_mut(&id) else { continue };
            a.next_asked += 1;
            let own = format!("{ASK_ID}{}", a.next_asked);
            ask.asked = Some(own.clone());
            tracing::info!("OpenCode did not forward permission request {id} of subagent {}: asking Coda", ask.session);
            let params = json!({
                "sessionId": ask.session,
                "toolCall": {"toolCallId": ask.call, "title": ask_title(ask), "kind": tool_kind(&ask.permission),
                    "status": "pending", "locations": [], "rawInput": ask.metadata},
                "options": ask_options(),
            });
            cx.to_client(Frame::from_value(
                &json!({"jsonrpc": "2.0", "id": own, "method": "session/request_permission", "params": params}),
            ));
        }
    }

    /// Coda's answer to one of the shim's own permission requests.
    fn asked_answered(&mut self, own: &str, answer: &Value, cx: &mut Cx) {
        let a = &mut self.asks;
        let Some(id) = a.pending.iter().find(|(_, ask)| ask.asked.as_deref() == Some(own)).map(|(id, _)| id.clone())
        else {
            return; // answered elsewhere meanwhile
        };
        let Some(ask) = a.pending.remove(&id) else { return };
        let result = answer.get("result").cloned().unwrap_or(json!({"outcome": {"outcome": "cancelled"}}));
        a.answered.insert((ask.session.clone(), ask.call.clone()), result.clone());
        if let Some(held) = a.held.remove(&(ask.session.clone(), ask.call.clone())) {
            // OpenCode forwarded it after all: its own request carries Coda's answer.
            return cx.to_agent(frame::result_response(&held, result));
        }
        let reply = match (result.pointer("/outcome/outcome"), result.pointer("/outcome/optionId")) {
            (Some(o), Some(Value::String(opt))) if o == "selected" && (opt == "once" || opt == "always") => {
                opt.as_str()
            }
            _ => "reject",
        };
        let (replier, directory, reply) = (self.replier.clone(), ask.directory, reply.to_owned());
        cx.work(
            move || {
                let result = replier(&directory, &id, &reply);
                Replied { id, result }
            },
            Permissions::replied,
        );
    }

    /// OpenCode's server took Coda's answer to a permission request, or did not.
    fn replied(&mut self, Replied { id, result }: Replied, _: &mut Cx) {
        if let Err(e) = result {
            tracing::warn!("OpenCode did not take the answer to permission request {id}: {e}");
        }
    }

    /// OpenCode's own forward of a permission request: passed on, unless Coda has (or had) the shim's copy.
    fn forwarded(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let v = frame.value();
        let at = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
        if let (Some(session), Some(call)) = (at("/params/sessionId"), at("/params/toolCall/toolCallId")) {
            let key = (session, call);
            let a = &mut self.asks;
            if let Some(result) = a.answered.get(&key) {
                // Coda answered the shim's copy already (and OpenCode has that answer).
                return cx.to_agent(frame::result_response(&id, result.clone()));
            }
            let mine =
                a.pending.values().any(|ask| ask.asked.is_some() && (&ask.session, &ask.call) == (&key.0, &key.1));
            if mine {
                // Coda already has the shim's copy of this request: one question, one answer.
                a.held.insert(key, id);
                return;
            }
            a.forwarded.insert(key);
        }
        cx.to_client(frame)
    }

    /// OpenCode withdrew a request of its own (`$/cancel_request`): one the shim holds (Coda has the shim's copy)
    /// is answered here as Coda answers a withdrawn question, `cancelled`; the shim's copy stays with Coda, as it
    /// answers the question on OpenCode's server. One Coda has goes on to Coda.
    fn withdrawn(&mut self, frame: Frame, cx: &mut Cx) {
        let held = cancel::target(&frame)
            .and_then(|id| self.asks.held.iter().find(|(_, h)| **h == id).map(|(k, h)| (k.clone(), h.clone())));
        match held {
            Some((key, id)) => {
                self.asks.held.remove(&key);
                cx.to_agent(frame::result_response(&id, json!({"outcome": {"outcome": "cancelled"}})));
            }
            None => cx.to_client(frame),
        }
    }

    fn server_event(&mut self, e: ServerEvent, cx: &mut Cx) {
        // Every layer hears every event; these are the bridge's to log.
        if matches!(e, ServerEvent::Asked { .. } | ServerEvent::Replied { .. }) {
            self.record.handled(&e, cx.wall());
        }
        match e {
            ServerEvent::Asked { id, session, permission, call, metadata, directory } => {
                if !self.is_child(&session) || self.asks.pending.contains_key(&id) {
                    return; // a parent's: OpenCode forwards those itself
                }
                let call = call.unwrap_or_else(|| id.clone());
                let ask =
                    Ask { session: session.clone(), permission, call, metadata, directory, due: None, asked: None };
                self.asks.pending.insert(id, ask);
                self.asks_due(&session, cx);
            }
            ServerEvent::Replied { id, .. } => {
                let Some(ask) = self.asks.pending.remove(&id) else { return };
                if let Some(own) = ask.asked {
                    // Answered some other way (the turn was cancelled): Coda need not answer any more.
                    cx.to_client(frame::notification("$/cancel_request", json!({"requestId": own})));
                }
                if let Some(held) = self.asks.held.remove(&(ask.session, ask.call)) {
                    cx.to_agent(frame::result_response(&held, json!({"outcome": {"outcome": "cancelled"}})));
                }
            }
            // The activity layer's (the set-up routes them there).
            _ => {}
        }
    }
}

impl Layer for Permissions {
    type Timer = Tick;
    type Event = FromServer;
    type Reply = Resume;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Request { id, method }
                if matches!(method.as_str(), "session/new" | "session/load" | "session/resume") =>
            {
                let id = id.clone();
                let v = frame.value();
                let param = |k: &str| v.get("params").and_then(|p| str_at(p, k)).map(str::to_owned);
                if let Some(cwd) = param("cwd") {
                    self.children.setup.insert(id, cwd);
                }
            }
            Kind::Response { id } => {
                if let Some(own) = id.to_value().as_str().filter(|s| s.starts_with(ASK_ID)) {
                    let own = own.to_owned();
                    return self.asked_answered(&own, frame.value(), cx);
                }
            }
            _ => {}
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { id } => {
                if let Some(cwd) = self.children.setup.remove(id) {
                    let asked = cx.answer_to(&frame).and_then(|r| r.session()).map(str::to_owned);
                    let sid = frame.value().pointer("/result/sessionId").and_then(Value::as_str).map(str::to_owned);
                    if let Some(sid) = sid.or(asked) {
                        self.children.cwd.insert(sid, cwd);
                    }
                }
                cx.to_client(frame)
            }
            Kind::Request { id, method } if method == "session/request_permission" => {
                let id = id.clone();
                self.forwarded(id, frame, cx)
            }
            Kind::Notification { method } if method == wait::METHOD => {
                // The report goes first, ahead of what its read sends: Coda takes a child's frames only once it
                // is announced.
                let mark = cx.mark();
                self.report_seen(&frame, cx);
                cx.to_client_at(mark, frame);
            }
            Kind::Notification { method } if method == cancel::METHOD => self.withdrawn(frame, cx),
            _ => cx.to_client(frame),
        }
    }

    fn session_closed(&mut self, closed: &[String], cx: &mut Cx) {
        let gone = |s: &String| closed.contains(s);
        let a = &mut self.asks;
        // Coda need not answer the shim's questions of a closed session any more; OpenCode's own copies get
        // what Coda answers a withdrawn question.
        let mut asked: Vec<String> =
            a.pending.values().filter(|ask| gone(&ask.session)).filter_map(|ask| ask.asked.clone()).collect();
        asked.sort();
        for own in asked {
            cx.to_client(cancel::withdraw(&Id::string(&own)));
        }
        for ((session, _), held) in a.held.iter() {
            if gone(session) {
                cx.to_agent(frame::result_response(held, json!({"outcome": {"outcome": "cancelled"}})));
            }
        }
        a.pending.retain(|_, ask| !gone(&ask.session));
        a.held.retain(|(session, _), _| !gone(session));
        a.forwarded.retain(|(session, _)| !gone(session));
        a.answered.retain(|(session, _), _| !gone(session));
        let c = &mut self.children;
        c.cwd.retain(|s, _| !gone(s));
        c.named.retain(|s| !gone(s));
        c.resumed.retain(|s| !gone(s));
        c.known_to_opencode.retain(|s| !gone(s));
        c.unreachable.retain(|s| !gone(s));
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        matches!(frame.kind(), Kind::Notification { method } if method != wait::METHOD && method != cancel::METHOD)
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }

    fn on_reply(&mut self, Resume(tag): Resume, reply: Frame, cx: &mut Cx) {
        let Some(child) = self.children.resuming.remove(&tag) else { return };
        if let Some(err) = reply.value().get("error") {
            let code = err.get("code").and_then(Value::as_i64).unwrap_or_default();
            tracing::warn!("OpenCode did not resume subagent session {child} (error {code}); its output stays hidden");
            tracing::debug!("OpenCode's answer to the resume: {err}");
            self.children.unreachable.insert(child.clone());
        } else {
            self.children.known_to_opencode.insert(child.clone());
        }
        self.asks_due(&child, cx);
    }

    fn on_event(&mut self, event: FromServer, cx: &mut Cx) {
        if let FromServer::Event(e) = event {
            self.server_event(e, cx);
        }
    }

    fn on_timer(&mut self, tick: Tick, cx: &mut Cx) {
        match tick {
            Tick::Asks(n) => self.ask_overdue(n, cx),
            Tick::Resume(tag) => {
                if let Some(cwd) = self.children.delayed.remove(&tag) {
                    self.send_resume(tag, &cwd, cx);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::opencode::rig::{C, P, Rig, asked, forwarded, task_child, task_running};

    #[test]
    fn a_childs_request_opencode_never_forwarded_is_put_to_coda_and_answered_on_the_server() {
        let mut rig = Rig::started();
        rig.prompt(2);
        rig.agent(task_running("call_26", false, None));
        let (_, to_agent) = rig.server(task_child("call_26"));
        // The child asked before the resume took effect: OpenCode dropped it.
        assert_eq!(rig.server(asked("per_1", "call_28")), (vec![], vec![]));
        assert_eq!(rig.wake_in(), None, "not due before the child is resumed");
        rig.resumed(&to_agent);
        assert_eq!(rig.wake_in(), Some(ASK_GRACE));
        let (to_client, _) = rig.advance(ASK_GRACE);
        assert_eq!(
            to_client,
            vec![json!({"jsonrpc":"2.0","id":"coda-opencode-ask-1","method":"session/request_permission",
                "params":{"sessionId":C,"toolCall":{"toolCallId":"call_28","title":"echo hi","kind":"execute",
                "status":"pending","locations":[],"rawInput":{"command":"echo hi"}},"options":ask_options()}})]
        );
        assert!(rig.advance(ASK_GRACE).0.is_empty(), "asked once");
        let answer = json!({"jsonrpc":"2.0","id":"coda-opencode-ask-1",
            "result":{"outcome":{"outcome":"selected","optionId":"once"}}});
        // The answer on OpenCode's server is a job, made off the loop: not before it runs.
        rig.hold_work();
        assert_eq!(rig.client(answer), (vec![], vec![]), "Coda's answer is the shim's");
        assert!(rig.replies().is_empty(), "not answered on the relay loop");
        assert_eq!(rig.run_work(), (vec![], vec![]));
        assert_eq!(rig.replies(), vec![("/w".into(), "per_1".into(), "once".into())]);
        // OpenCode's copy turning up after all gets the same answer, not a second question.
        let (to_client, to_agent) = rig.raw_agent(forwarded(5, "call_28"));
        assert!(to_client.is_empty());
        assert_eq!(to_agent[0]["result"]["outcome"]["optionId"], "once");
    }

    #[test]
    fn a_request_opencode_forwarded_is_not_asked_again_and_a_rejection_is_passed_as_reject() {
        let mut rig = Rig::started();
        rig.prompt(2);
        rig.agent(task_running("call_26", false, None));
        let (_, to_agent) = rig.server(task_child("call_26"));
        rig.resumed(&to_agent);
        let apart = Duration::from_millis(100);
        rig.server(asked("per_1", "call_28"));
        rig.advance(apart);
        rig.server(asked("per_2", "call_29"));
        rig.agent(forwarded(0, "call_28"));
        assert!(rig.advance(ASK_GRACE - apart).0.is_empty(), "OpenCode forwarded the first");
        let (to_client, _) = rig.advance(apart);
        assert_eq!(to_client.len(), 1);
        assert_eq!(to_client[0]["params"]["toolCall"]["toolCallId"], "call_29", "only the one not forwarded");
        let cancelled = json!({"jsonrpc":"2.0","id":to_client[0]["id"],"result":{"outcome":{"outcome":"cancelled"}}});
        rig.client(cancelled);
        assert_eq!(rig.replies(), vec![("/w".into(), "per_2".into(), "reject".into())]);
    }

    /// A foreground child asks (`per_1`, call_28) before OpenCode knows it; the shim's own copy goes to Coda.
    /// Returns the id of that copy.
    fn shims_own_request(rig: &mut Rig) -> Value {
        rig.prompt(2);
        rig.agent(task_running("call_26", false, None));
        let (_, to_agent) = rig.server(task_child("call_26"));
        rig.server(asked("per_1", "call_28"));
        rig.resumed(&to_agent);
        rig.advance(ASK_GRACE).0[0]["id"].clone()
    }

    #[test]
    fn opencode_forwarding_while_coda_has_the_shims_copy_gets_codas_answer() {
        let mut rig = Rig::started();
        let own = shims_own_request(&mut rig);
        let (to_client, _) = rig.raw_agent(forwarded(7, "call_28"));
        assert!(to_client.is_empty(), "held: Coda is already asked");
        let answer = json!({"jsonrpc":"2.0","id":own,"result":{"outcome":{"outcome":"selected","optionId":"always"}}});
        let (_, to_agent) = rig.client(answer);
        assert_eq!(
            to_agent,
            vec![json!({"jsonrpc":"2.0","id":7,"result":{"outcome":{"outcome":"selected","optionId":"always"}}})]
        );
        assert!(rig.replies().is_empty(), "OpenCode answers it itself");
    }

    #[test]
    fn opencode_withdrawing_the_copy_the_shim_holds_gets_cancelled_and_coda_keeps_the_shims_question() {
        let mut rig = Rig::started();
        let own = shims_own_request(&mut rig);
        assert!(rig.raw_agent(forwarded(7, "call_28")).0.is_empty(), "held: Coda is already asked");
        let withdrawal = json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":7}});
        let (to_client, to_agent) = rig.raw_agent(withdrawal);
        assert!(to_client.is_empty(), "Coda never saw request 7, nor is told of its withdrawal");
        assert_eq!(to_agent, vec![json!({"jsonrpc":"2.0","id":7,"result":{"outcome":{"outcome":"cancelled"}}})]);
        // Coda's answer to the shim's copy still answers the question, on OpenCode's server; 7 is answered once.
        let answer = json!({"jsonrpc":"2.0","id":own,"result":{"outcome":{"outcome":"selected","optionId":"once"}}});
        let (_, to_agent) = rig.client(answer);
        assert!(to_agent.is_empty());
        let (_, to_agent) = rig.run_work();
        assert!(to_agent.is_empty());
        assert_eq!(rig.replies(), [("/w".to_owned(), "per_1".to_owned(), "once".to_owned())]);
        // A withdrawal of a request Coda has goes on to Coda as it came.
        let other = json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"perm-9"}});
        assert_eq!(rig.raw_agent(other.clone()).0, vec![other]);
    }

    #[test]
    fn closing_the_parent_withdraws_the_shims_questions_and_answers_opencodes_copies() {
        let mut rig = Rig::started();
        let own = shims_own_request(&mut rig);
        assert!(rig.raw_agent(forwarded(7, "call_28")).0.is_empty(), "held: Coda is already asked");
        rig.client(json!({"jsonrpc":"2.0","id":30,"method":"session/close","params":{"sessionId":P}}));
        let (to_client, to_agent) = rig.raw_agent(json!({"jsonrpc":"2.0","id":30,"result":{}}));
        assert_eq!(to_agent, vec![json!({"jsonrpc":"2.0","id":7,"result":{"outcome":{"outcome":"cancelled"}}})]);
        let withdrawal = json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":own}});
        let at = |v: &Value| to_client.iter().position(|f| f == v);
        assert!(at(&withdrawal).is_some(), "{to_client:?}");
        let close = to_client.iter().position(|f| f["id"] == 30).expect("the close is answered");
        assert!(at(&withdrawal) < Some(close), "before the close's answer");
        let ended: Vec<&Value> = to_client.iter().filter(|f| f["method"] == "_coda/wait").collect();
        assert!(ended.iter().all(|w| w["params"]["state"] == "cancelled") && !ended.is_empty(), "{to_client:?}");
        let b = rig.h.layer::<Permissions>(1);
        assert!(b.asks.pending.is_empty() && b.asks.held.is_empty() && b.children.resumed.is_empty());
        assert!(b.children.cwd.is_empty(), "the session's folder is forgotten");
    }

    #[test]
    fn a_request_answered_elsewhere_is_withdrawn_from_coda_and_parents_requests_are_opencodes() {
        let mut rig = Rig::started();
        let own = shims_own_request(&mut rig);
        let (to_client, _) = rig.server(ServerEvent::Replied { session: C.into(), id: "per_1".into() });
        assert_eq!(to_client, vec![json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":own}})]);
        let parents = ServerEvent::Asked {
            id: "per_9".into(),
            session: P.into(),
            permission: "bash".into(),
            call: None,
            metadata: json!({}),
            directory: "/w".into(),
        };
        rig.server(parents);
        assert_eq!(rig.wake_in(), None, "a parent's request is OpenCode's to forward");
        assert!(rig.advance(ASK_GRACE * 10).0.is_empty());
    }

    #[test]
    fn a_delayed_resume_waits_for_its_wake_up() {
        let delay = Duration::from_millis(3000);
        let mut rig = Rig::started_with(delay);
        rig.prompt(2);
        rig.server(task_child("call_26"));
        let (waits, to_agent) = rig.agent(task_running("call_26", false, None));
        assert_eq!(waits[0]["childSessionId"], C, "announced at once");
        assert!(to_agent.is_empty(), "the resume is held back");
        assert_eq!(rig.wake_in(), Some(delay));
        let (_, to_agent) = rig.advance(delay);
        rig.resumed(&to_agent);
    }

    #[test]
    fn a_child_that_cannot_be_resumed_has_its_requests_put_to_coda() {
        let mut rig = Rig::started();
        rig.prompt(2);
        rig.agent(task_running("call_26", false, None));
        let (_, to_agent) = rig.server(task_child("call_26"));
        let resume = to_agent[0]["id"].clone();
        rig.raw_agent(json!({"jsonrpc":"2.0","id":resume,"error":{"code":-32603,"message":"no"}}));
        rig.server(asked("per_1", "call_28"));
        assert_eq!(rig.wake_in(), Some(ASK_GRACE));
        assert_eq!(rig.advance(ASK_GRACE).0[0]["method"], "session/request_permission");
    }
}

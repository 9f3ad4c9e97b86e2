//! OpenCode's subagents (the `task` tool) as Coda's `_coda/wait` (section "Agent 活动").
//!
//! OpenCode 1.18.33 has no activity messages over ACP; what it shows (seen live):
//! - The `task` tool is a `tool_call` / `tool_call_update` of the parent session with `rawInput`
//!   `{description, prompt, subagent_type, background?, task_id?}` (`task_id` = a follow-up of that child);
//!   its completed update carries `rawOutput.metadata {sessionId: <child ses_…>, parentSessionId, background?}`.
//!   A foreground task is a subagent wait from the call's start to its end; the child session is only named
//!   at the end, so it is reported with the final state.
//! - A background task (`OPENCODE_EXPERIMENTAL_BACKGROUND_SUBAGENTS=true`) completes at once with the child
//!   named. OpenCode forwards nothing of a session it has not been told about, so the shim resumes the child
//!   (`session/resume`, no replay): from then on the child's output and its permission requests reach Coda on
//!   the child session (which the wait has announced).
//! - When it finishes, OpenCode prompts the parent itself: its output streams on the parent outside any
//!   Coda turn, and nothing marks the end. So: the first such output makes the oldest background wait
//!   `handling`; when the parent has been quiet for [`QUIET`] it is `done` (OpenCode does not say whether the
//!   child failed). A child that ends while a Coda turn runs is folded into that turn by OpenCode and is not
//!   seen; its wait stays `waiting` until the process ends.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use coda_shim::frame::{self, Frame, Id, Kind, Needle};
use coda_shim::layer::{Cx, Event, EventSender, Layer};
use coda_shim::wait::{self, Register, State, Wait};
use serde_json::{Value, json};

/// How long the parent must stay quiet before OpenCode's own follow-up turn counts as over.
pub const QUIET: Duration = Duration::from_secs(10);

/// A quiet-check, `n` = the count of parent frames when it was asked for.
pub struct Tick(pub u64);

/// Asks for a [`Tick`] after [`QUIET`]; tests hand ticks in themselves.
pub type Timer = Box<dyn FnMut(u64) + Send>;

#[derive(Debug)]
struct Task {
    session: String,
    call: String,
    child: Option<String>,
    background: bool,
    open: bool,
    /// Order of registration, for picking the oldest.
    seq: u64,
}

pub struct OpenCodeActivity {
    timer: Timer,
    waits: bool,
    initialize: HashSet<Id>,
    register: Register,
    /// Client prompts in flight -> session.
    prompts: HashMap<Id, String>,
    /// session/new|load|resume in flight -> cwd asked for.
    setup: HashMap<Id, (Option<String>, String)>,
    /// `session/load` in flight -> session: its replayed history is not activity.
    loading: HashMap<Id, String>,
    /// Session -> its cwd (for resuming its children).
    cwd: HashMap<String, String>,
    /// By (session, toolCallId) = (session, waitId).
    tasks: HashMap<(String, String), Task>,
    /// Children the shim has resumed.
    resumed: HashSet<String>,
    /// The wait being handled in OpenCode's own turn, per parent session.
    handling: HashMap<String, (String, String)>,
    /// Parent frames seen while handling (compared by [`Tick`]).
    seen: u64,
    tick_pending: bool,
    next_seq: u64,
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Updates that are output of a turn (what OpenCode's own follow-up turn streams).
static TOOL_CALL: Needle = coda_shim::needle!(b"\"tool_call");

fn is_turn_output(kind: &str) -> bool {
    matches!(kind, "agent_message_chunk" | "agent_thought_chunk" | "tool_call" | "tool_call_update" | "plan")
}

impl OpenCodeActivity {
    /// The real layer: ticks come from a sleeping thread through the layer's event sender.
    pub fn new(events: EventSender) -> OpenCodeActivity {
        OpenCodeActivity::with_timer(Box::new(move |n| {
            let events = events.clone();
            let spawned = std::thread::Builder::new().name("opencode-quiet".into()).spawn(move || {
                std::thread::sleep(QUIET);
                events.send(Tick(n));
            });
            if let Err(e) = spawned {
                tracing::warn!("cannot start the quiet timer: {e}");
            }
        }))
    }

    pub fn with_timer(timer: Timer) -> OpenCodeActivity {
        OpenCodeActivity {
            timer,
            waits: false,
            initialize: HashSet::new(),
            register: Register::new(),
            prompts: HashMap::new(),
            setup: HashMap::new(),
            loading: HashMap::new(),
            cwd: HashMap::new(),
            tasks: HashMap::new(),
            resumed: HashSet::new(),
            handling: HashMap::new(),
            seen: 0,
            tick_pending: false,
            next_seq: 0,
        }
    }

    fn report(&mut self, w: &Wait, cx: &mut Cx) {
        if self.waits
            && let Some(f) = self.register.report(w)
        {
            cx.to_client(f);
        }
    }

    fn in_turn(&self, session: &str) -> bool {
        self.prompts.values().any(|s| s == session)
    }

    /// A `task` tool update of `session`.
    fn task_update(&mut self, session: &str, u: &Value, cx: &mut Cx) {
        let Some(call) = str_at(u, "toolCallId") else { return };
        let key = (session.to_owned(), call.to_owned());
        let input = u.get("rawInput").filter(|i| i.get("subagent_type").is_some() && i.get("prompt").is_some());
        if !self.tasks.contains_key(&key) {
            let Some(input) = input else { return };
            self.next_seq += 1;
            let child = str_at(input, "task_id").map(str::to_owned);
            let mut w = Wait::new(session, call, State::Waiting);
            w.kind = Some("subagent".into());
            w.title = str_at(input, "description").map(str::to_owned);
            w.detail = str_at(input, "prompt").map(str::to_owned);
            w.tool_call_id = Some(call.to_owned());
            w.child_session_id.clone_from(&child);
            let task = Task {
                session: session.to_owned(),
                call: call.to_owned(),
                child,
                background: input.get("background").and_then(Value::as_bool) == Some(true),
                open: true,
                seq: self.next_seq,
            };
            self.tasks.insert(key.clone(), task);
            self.report(&w, cx);
        }
        let state = match str_at(u, "status") {
            Some("completed") => State::Done,
            Some("failed") => State::Failed,
            _ => return,
        };
        let meta = u.pointer("/rawOutput/metadata");
        let child = meta.and_then(|m| str_at(m, "sessionId")).map(str::to_owned);
        let background = meta.and_then(|m| m.get("background")).and_then(Value::as_bool) == Some(true);
        let Some(task) = self.tasks.get_mut(&key) else { return };
        if !task.open {
            return;
        }
        if child.is_some() {
            task.child.clone_from(&child);
        }
        let mut w = Wait::new(session, call, State::Waiting);
        w.child_session_id = task.child.clone();
        if background && state == State::Done {
            // Runs on after the call: wait for OpenCode's own turn on its result.
            task.background = true;
            self.report(&w, cx);
            if let Some(child) = child {
                self.follow(session, &child, cx);
            }
        } else {
            task.open = false;
            w.state = Some(state);
            self.report(&w, cx);
        }
    }

    /// Resumes a background child so that OpenCode forwards its output and permission requests.
    fn follow(&mut self, parent: &str, child: &str, cx: &mut Cx) {
        if !self.resumed.insert(child.to_owned()) {
            return;
        }
        let Some(cwd) = self.cwd.get(parent).cloned() else {
            tracing::warn!("no cwd known for session {parent}; its subagent {child} is not followed");
            return;
        };
        cx.request("session/resume", json!({"sessionId": child, "cwd": cwd, "mcpServers": []}), 0);
    }

    /// Output on a parent session outside a Coda turn: OpenCode is working on a background result.
    fn own_turn_output(&mut self, session: &str, cx: &mut Cx) {
        if !self.handling.contains_key(session) {
            let oldest = self
                .tasks
                .values()
                .filter(|t| t.session == session && t.open && t.background)
                .min_by_key(|t| t.seq)
                .map(|t| (t.session.clone(), t.call.clone()));
            let Some(key) = oldest else { return };
            self.handling.insert(session.to_owned(), key.clone());
            self.report(&Wait::new(&key.0, &key.1, State::Handling), cx);
        }
        self.seen += 1;
        if !self.tick_pending {
            self.tick_pending = true;
            (self.timer)(self.seen);
        }
    }

    /// Ends the handling of `session`'s wait (quiet, a new Coda turn, or a cancel).
    fn settle(&mut self, session: &str, cx: &mut Cx) {
        let Some(key) = self.handling.remove(session) else { return };
        if let Some(t) = self.tasks.get_mut(&key) {
            t.open = false;
        }
        self.report(&Wait::new(&key.0, &key.1, State::Done), cx);
    }
}

impl Layer for OpenCodeActivity {
    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind().clone() {
            Kind::Request { id, method } => {
                let v = frame.value();
                let param = |k: &str| v.as_ref().and_then(|v| v.get("params")).and_then(|p| str_at(p, k));
                match method.as_str() {
                    "initialize" => {
                        self.waits = v.as_ref().and_then(|v| v.get("params")).is_some_and(wait::client_declares_waits);
                        self.initialize.insert(id);
                    }
                    "session/new" | "session/load" | "session/resume" => {
                        if method == "session/load"
                            && let Some(sid) = param("sessionId")
                        {
                            self.loading.insert(id.clone(), sid.to_owned());
                        }
                        if let Some(cwd) = param("cwd") {
                            self.setup.insert(id, (param("sessionId").map(str::to_owned), cwd.to_owned()));
                        }
                    }
                    "session/prompt" => {
                        if let Some(sid) = param("sessionId").map(str::to_owned) {
                            // A Coda turn starts: OpenCode folds whatever it was doing on its own into it.
                            self.settle(&sid, cx);
                            self.prompts.insert(id, sid);
                        }
                    }
                    wait::STOP_METHOD => {
                        let msg = "OpenCode's subagents cannot be stopped on their own (none is declared stoppable)";
                        return cx.to_client(frame::error_response(&id, -32602, msg, None));
                    }
                    _ => {}
                }
            }
            Kind::Notification { method } if method == "session/cancel" => {
                if let Some(sid) = frame.value().and_then(|v| v.pointer("/params/sessionId").cloned())
                    && let Some(sid) = sid.as_str()
                {
                    self.settle(sid, cx);
                }
            }
            _ => {}
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind().clone() {
            Kind::Response { id } => {
                self.prompts.remove(&id);
                self.loading.remove(&id);
                if let Some((asked, cwd)) = self.setup.remove(&id) {
                    let sid = frame.value().and_then(|v| v.pointer("/result/sessionId").cloned());
                    if let Some(sid) = sid.as_ref().and_then(Value::as_str).map(str::to_owned).or(asked) {
                        self.cwd.insert(sid, cwd);
                    }
                }
                if self.initialize.remove(&id) {
                    return cx.to_client(wait::declare_waits_in(frame));
                }
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == "session/update" => {
                // Most updates are text chunks: parse only tool calls, or anything while a background
                // subagent may wake the parent (its follow-up turn is output outside a Coda turn).
                let watching = !self.handling.is_empty() || self.tasks.values().any(|t| t.open && t.background);
                if !watching && !frame.has(&TOOL_CALL) {
                    return cx.to_client(frame);
                }
                let v = frame.value();
                cx.to_client(frame);
                let Some(v) = v else { return };
                let (Some(sid), Some(u)) =
                    (v.pointer("/params/sessionId").and_then(Value::as_str), v.pointer("/params/update"))
                else {
                    return;
                };
                if self.resumed.contains(sid) || self.loading.values().any(|s| s == sid) {
                    return;
                }
                let kind = u.get("sessionUpdate").and_then(Value::as_str).unwrap_or("");
                if matches!(kind, "tool_call" | "tool_call_update") {
                    self.task_update(sid, u, cx);
                }
                if is_turn_output(kind) && !self.in_turn(sid) {
                    self.own_turn_output(sid, cx);
                }
            }
            _ => cx.to_client(frame),
        }
    }

    fn on_reply(&mut self, _tag: u64, reply: Frame, _cx: &mut Cx) {
        if let Some(err) = reply.value().and_then(|v| v.get("error").cloned()) {
            tracing::warn!("OpenCode did not resume a subagent's session (its output stays hidden): {err}");
        }
    }

    fn on_event(&mut self, event: Event, cx: &mut Cx) {
        let Ok(tick) = event.downcast::<Tick>() else { return };
        self.tick_pending = false;
        if self.handling.is_empty() {
            return;
        }
        if tick.0 == self.seen {
            let sessions: Vec<String> = self.handling.keys().cloned().collect();
            for s in sessions {
                self.settle(&s, cx);
            }
        } else {
            self.tick_pending = true;
            (self.timer)(self.seen);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use coda_shim::layer::{Exits, Stack};

    const P: &str = "ses_parent";
    const C: &str = "ses_child";

    fn parse(v: Value) -> Frame {
        Frame::from_value(&v)
    }

    fn values(frames: &[Frame]) -> Vec<Value> {
        frames.iter().map(|f| f.value().expect("json")).collect()
    }

    /// A stack with the layer, initialized with a session P in /w; the ticks asked for are collected.
    fn started() -> (Stack, Arc<Mutex<Vec<u64>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        let layer = OpenCodeActivity::with_timer(Box::new(move |n| log.lock().expect("lock").push(n)));
        let mut stack = Stack::new(vec![Box::new(layer)]);
        let mut exits = Exits::default();
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize",
            "params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"coda":{"waits":{}}}}}});
        stack.from_client(parse(init), &mut exits);
        stack.from_agent(parse(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}})), &mut exits);
        assert_eq!(values(&exits.to_client)[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}));
        stack.from_client(
            parse(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}})),
            &mut exits,
        );
        stack.from_agent(parse(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":P}})), &mut exits);
        (stack, asked)
    }

    fn prompt(stack: &mut Stack, id: u64) {
        let mut exits = Exits::default();
        let p = json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":P,"prompt":[]}});
        stack.from_client(parse(p), &mut exits);
    }

    /// What reaches each side for one agent frame; the frame itself goes on first, untouched.
    fn agent(stack: &mut Stack, v: Value) -> (Vec<Value>, Vec<Value>) {
        let mut exits = Exits::default();
        stack.from_agent(parse(v.clone()), &mut exits);
        let out = values(&exits.to_client);
        assert_eq!(out.first(), Some(&v));
        (out[1..].iter().map(|f| f["params"].clone()).collect(), values(&exits.to_agent))
    }

    fn update(session: &str, u: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":u}})
    }

    fn task_running(call: &str, background: bool, follow_up: Option<&str>) -> Value {
        let mut input = json!({"background":background,"description":"worker_1 task","prompt":"child work",
            "subagent_type":"general"});
        if let Some(t) = follow_up {
            input["task_id"] = json!(t);
        }
        update(
            P,
            json!({"sessionUpdate":"tool_call_update","toolCallId":call,"status":"in_progress","kind":"think",
            "title":"worker_1 task","rawInput":input}),
        )
    }

    fn task_done(call: &str, background: bool) -> Value {
        let mut meta = json!({"parentSessionId":P,"sessionId":C,"model":{"modelID":"m","providerID":"p"}});
        if background {
            meta["background"] = json!(true);
        }
        update(
            P,
            json!({"sessionUpdate":"tool_call_update","toolCallId":call,"status":"completed","title":"worker_1 task",
            "rawOutput":{"output":"<task …>","metadata":meta}}),
        )
    }

    fn chunk(session: &str) -> Value {
        update(session, json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}))
    }

    #[test]
    fn a_foreground_task_is_a_subagent_wait_settled_with_its_child_when_the_call_completes() {
        let (mut stack, _) = started();
        prompt(&mut stack, 2);
        let pending = update(
            P,
            json!({"sessionUpdate":"tool_call","toolCallId":"call_91","title":"task","kind":"think","status":"pending","rawInput":{}}),
        );
        assert!(agent(&mut stack, pending).0.is_empty());
        assert_eq!(
            agent(&mut stack, task_running("call_91", false, None)).0,
            vec![json!({"sessionId":P,"waitId":"call_91","state":"waiting","kind":"subagent","title":"worker_1 task",
                "detail":"child work","toolCallId":"call_91"})]
        );
        assert!(agent(&mut stack, task_running("call_91", false, None)).0.is_empty(), "a repeat says nothing");
        let (waits, to_agent) = agent(&mut stack, task_done("call_91", false));
        assert_eq!(waits, vec![json!({"sessionId":P,"waitId":"call_91","state":"done","childSessionId":C})]);
        assert!(to_agent.is_empty(), "a finished child is not followed");
    }

    #[test]
    fn a_background_task_follows_its_child_and_is_handled_in_opencodes_own_turn() {
        let (mut stack, ticks) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_101", true, None));
        let (waits, to_agent) = agent(&mut stack, task_done("call_101", true));
        assert_eq!(waits, vec![json!({"sessionId":P,"waitId":"call_101","state":"waiting","childSessionId":C})]);
        assert_eq!(to_agent[0]["method"], "session/resume");
        assert_eq!(to_agent[0]["params"], json!({"sessionId":C,"cwd":"/w","mcpServers":[]}));
        // The turn's own closing text is in the Coda turn: nothing to handle yet.
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        // The child's output (its session was announced) is not the parent's turn.
        assert!(agent(&mut stack, chunk(C)).0.is_empty());
        assert_eq!(agent(&mut stack, chunk(P)).0, vec![json!({"sessionId":P,"waitId":"call_101","state":"handling"})]);
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
        assert_eq!(*ticks.lock().expect("lock"), vec![1]);
        // More output came after the first tick was asked for: not quiet yet, ask again.
        let mut exits = Exits::default();
        stack.event(0, Box::new(Tick(1)), &mut exits);
        assert!(exits.to_client.is_empty());
        assert_eq!(*ticks.lock().expect("lock"), vec![1, 2]);
        stack.event(0, Box::new(Tick(2)), &mut exits);
        assert_eq!(values(&exits.to_client)[0]["params"], json!({"sessionId":P,"waitId":"call_101","state":"done"}));
    }

    #[test]
    fn a_coda_turn_or_a_cancel_ends_the_handling() {
        let (mut stack, _) = started();
        for (n, end) in ["prompt", "cancel"].into_iter().enumerate() {
            let call = format!("call_{n}");
            prompt(&mut stack, 10 + n as u64);
            agent(&mut stack, task_running(&call, true, None));
            agent(&mut stack, task_done(&call, true));
            agent(&mut stack, json!({"jsonrpc":"2.0","id":10 + n as u64,"result":{"stopReason":"end_turn"}}));
            assert_eq!(agent(&mut stack, chunk(P)).0[0]["state"], "handling");
            let mut exits = Exits::default();
            let frame = if end == "prompt" {
                json!({"jsonrpc":"2.0","id":20,"method":"session/prompt","params":{"sessionId":P,"prompt":[]}})
            } else {
                json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":P}})
            };
            stack.from_client(parse(frame), &mut exits);
            assert_eq!(values(&exits.to_client)[0]["params"]["state"], "done", "{end}");
            assert_eq!(exits.to_agent.len(), 1, "the client's frame goes on");
            agent(&mut stack, json!({"jsonrpc":"2.0","id":20,"result":{"stopReason":"end_turn"}}));
        }
    }

    #[test]
    fn a_follow_up_names_its_child_from_the_start() {
        let (mut stack, _) = started();
        prompt(&mut stack, 2);
        let waits = agent(&mut stack, task_running("call_123", true, Some(C))).0;
        assert_eq!(waits[0]["childSessionId"], C);
        assert_eq!(waits[0]["waitId"], "call_123");
    }

    #[test]
    fn a_failed_task_fails_and_output_without_background_work_is_not_handling() {
        let (mut stack, _) = started();
        prompt(&mut stack, 2);
        agent(&mut stack, task_running("call_1", false, None));
        let failed = update(P, json!({"sessionUpdate":"tool_call_update","toolCallId":"call_1","status":"failed"}));
        assert_eq!(agent(&mut stack, failed).0, vec![json!({"sessionId":P,"waitId":"call_1","state":"failed"})]);
        agent(&mut stack, json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
    }

    #[test]
    fn task_calls_replayed_by_a_load_are_history() {
        let (mut stack, _) = started();
        let mut exits = Exits::default();
        let load =
            json!({"jsonrpc":"2.0","id":7,"method":"session/load","params":{"sessionId":P,"cwd":"/w","mcpServers":[]}});
        stack.from_client(parse(load), &mut exits);
        assert!(agent(&mut stack, task_running("call_1", true, None)).0.is_empty());
        let (waits, to_agent) = agent(&mut stack, task_done("call_1", true));
        assert!(waits.is_empty() && to_agent.is_empty(), "no wait, no resume of an old child");
        assert!(agent(&mut stack, chunk(P)).0.is_empty());
        agent(&mut stack, json!({"jsonrpc":"2.0","id":7,"result":{}}));
        assert!(agent(&mut stack, chunk(P)).0.is_empty(), "nothing was registered to handle");
    }

    #[test]
    fn stop_is_refused_and_no_waits_without_the_capability() {
        let (mut stack, _) = started();
        let mut exits = Exits::default();
        stack.from_client(
            parse(json!({"jsonrpc":"2.0","id":3,"method":"_coda/wait/stop","params":{"sessionId":P,"waitId":"x"}})),
            &mut exits,
        );
        assert_eq!(values(&exits.to_client)[0]["error"]["code"], -32602);
        assert!(exits.to_agent.is_empty());

        let layer = OpenCodeActivity::with_timer(Box::new(|_| {}));
        let mut stack = Stack::new(vec![Box::new(layer)]);
        stack.from_client(
            parse(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"clientCapabilities":{}}})),
            &mut exits,
        );
        assert!(agent(&mut stack, task_running("call_1", false, None)).0.is_empty());
    }
}

//! Grok Build's background commands and subagents, from its own `_x.ai/*` messages, as Coda's `_coda/wait`
//! (section "Agent 活动"). Grok's messages pass through untouched; the reports are added after them.
//!
//! What Grok 1.0.41 sends (seen live, shapes in the crate's tests):
//! - `_x.ai/task_backgrounded` `{sessionId, update:{task_id, tool_call_id, command, description, output_file}}`
//!   when `run_terminal_command` goes to the background -> a `task` wait, `waiting`.
//! - `_x.ai/session_notification` `subagent_spawned` `{subagent_id, child_session_id, parent_session_id,
//!   description, model, resumed_from?}` -> a `subagent` wait with `childSessionId`; the child's own
//!   `session/update`s already carry the child session id.
//! - `_x.ai/task_completed` `{task_snapshot:{task_id, exit_code, explicitly_killed, …}, will_wake}` and
//!   `subagent_finished` `{subagent_id, status, will_wake}` end them. With `will_wake` Grok then runs a turn
//!   of its own on the result (prompt id `task-completed-<id>` / `subagent-completed-<id>`): the wait is
//!   `handling` from the first sign of that turn until its `turn_completed`, then final.
//! - Stop (of a wait the engine's `Waits` layer found open and stoppable): `_x.ai/task/kill {sessionId, taskId}`
//!   and `_x.ai/subagent/cancel {subagentId}`.
//! - A subagent continued with `resume_from` gets a new child session from Grok; Coda keeps the first one
//!   (rule 5), so the new one's frames are renamed to it both ways.

use crate::HashMap;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::convert::Infallible;

use crate::adapters::grok::compact::Queue;
use crate::coda::wait::{self, Register, State, Wait};
use crate::frame::{self, Frame, Id, Kind, Needle};
use crate::json::View;
use crate::layer::{Cx, Layer};
use serde_json::{Value, json};

const TASK_WAKE: &str = "task-completed-";
const SUBAGENT_WAKE: &str = "subagent-completed-";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Item {
    Task,
    Subagent,
}

#[derive(Debug)]
struct Activity {
    /// The session Coda files it under.
    session: String,
    /// Grok's session that owns it (where `_x.ai/task/kill` goes).
    grok_session: String,
    /// The final state once Grok said it ended, while its wake turn runs.
    ended: Option<State>,
    open: bool,
}

#[derive(Default)]
pub struct GrokActivity {
    register: Register,
    /// By (kind, Grok's id = waitId): at most [`wait::MAX_KNOWN`], as the register's (`order`).
    items: HashMap<(Item, String), Activity>,
    /// The keys of `items`, oldest first.
    order: VecDeque<(Item, String)>,
    /// How many of `items` are open: an `_x.ai/queue/changed` (a sixth of Grok's frames) concerns only an open
    /// item's wake turn, and is passed on unread while none is.
    open: usize,
    /// Grok child session -> the child session Coda knows (itself, or the first of a resumed chain).
    alias: HashMap<String, String>,
    /// The child session Coda knows -> Grok's newest session behind it.
    current: HashMap<String, String>,
    /// Subagent id -> the child session Coda knows, for `resume_from`.
    child_of: HashMap<String, String>,
    /// `spawn_subagent` calls not linked to a subagent yet, per Grok session, oldest first.
    spawn_calls: HashMap<String, VecDeque<String>>,
    /// Subagent id -> the call whose result named it.
    named_by: HashMap<String, String>,
}

/// What the shim's own stop request was (its answer is only logged).
pub struct Stop;

static SPAWN_SUBAGENT: Needle = crate::needle!(b"spawn_subagent");

/// A string value that is not empty.
fn text(v: Option<View<'_>>) -> Option<Cow<'_, str>> {
    v?.as_str().filter(|s| !s.is_empty())
}

/// The id in a `subagent_id: <id>` line of `spawn_subagent`'s text result.
fn named_subagent(text: &str) -> Option<&str> {
    let rest = &text[text.find("subagent_id: ")? + "subagent_id: ".len()..];
    let id = rest.split(|c: char| c.is_whitespace() || c == ',').next()?;
    (!id.is_empty()).then_some(id)
}

impl GrokActivity {
    pub fn new() -> GrokActivity {
        GrokActivity::default()
    }

    fn visible(&self, grok_session: &str) -> String {
        self.alias.get(grok_session).cloned().unwrap_or_else(|| grok_session.to_owned())
    }

    /// Whether a `session/load` / `session/resume` of `session` is with Grok (the stack's request table says):
    /// replayed history is not activity.
    fn is_loading(cx: &Cx, session: &str) -> bool {
        cx.open_requests().any(|r| (r.is("session/load") || r.is("session/resume")) && r.session() == Some(session))
    }

    /// Sends what `wait` changes (the `Waits` layer decides whether the client gets it).
    fn report(&mut self, wait: &Wait, cx: &mut Cx) {
        if let Some(f) = self.register.report(wait) {
            cx.to_client(f);
        }
    }

    fn set_state(&mut self, key: &(Item, String), state: State, cx: &mut Cx) {
        let Some(a) = self.items.get_mut(key) else { return };
        if !a.open {
            return;
        }
        if state.is_terminal() {
            a.open = false;
            self.open -= 1;
        }
        let wait = Wait::new(&a.session.clone(), &key.1, state);
        self.report(&wait, cx);
    }

    /// Grok said the item ended; with a wake turn to come it is `handling` until that turn ends.
    fn ended(&mut self, key: (Item, String), state: State, will_wake: bool, cx: &mut Cx) {
        let Some(a) = self.items.get_mut(&key) else {
            tracing::debug!(id = %key.1, "end of an activity that was never announced; ignored");
            return;
        };
        if will_wake && a.open {
            a.ended = Some(state);
            self.set_state(&key, State::Handling, cx);
        } else {
            self.set_state(&key, state, cx);
        }
    }

    fn wake_key(prompt_id: &str) -> Option<(Item, String)> {
        if let Some(id) = prompt_id.strip_prefix(TASK_WAKE) {
            return Some((Item::Task, id.to_owned()));
        }
        prompt_id.strip_prefix(SUBAGENT_WAKE).map(|id| (Item::Subagent, id.to_owned()))
    }

    fn task_backgrounded(&mut self, grok_session: &str, u: View<'_>, cx: &mut Cx) {
        let Some(task) = text(u.get("task_id")) else {
            tracing::warn!("_x.ai/task_backgrounded without task_id; not reported");
            return;
        };
        self.open_task(grok_session, &task, u, cx);
    }

    fn open_task(&mut self, grok_session: &str, task: &str, u: View<'_>, cx: &mut Cx) {
        let key = (Item::Task, task.to_owned());
        if self.items.contains_key(&key) {
            return;
        }
        let [command, description, output_file, tool_call_id] =
            u.pick(["command", "description", "output_file", "tool_call_id"]).map(text);
        let session = self.visible(grok_session);
        let mut w = Wait::new(&session, task, State::Waiting);
        w.kind = Some("task".into());
        w.title = description.or(command.clone()).map(Cow::into_owned);
        w.detail = command.map(Cow::into_owned);
        w.output_file = output_file.map(Cow::into_owned);
        w.tool_call_id = tool_call_id.map(Cow::into_owned);
        w.stoppable = Some(true);
        let a = Activity { session, grok_session: grok_session.to_owned(), ended: None, open: true };
        self.keep(key, a);
        self.report(&w, cx);
    }

    /// Keeps a new open item; past [`wait::MAX_KNOWN`] the oldest ended one goes, else the oldest (an end Grok
    /// reports of it later is then ignored, as the register ignores a wait it forgot).
    fn keep(&mut self, key: (Item, String), a: Activity) {
        self.order.push_back(key.clone());
        self.items.insert(key, a);
        self.open += 1;
        let items = &self.items;
        let Some(old) = wait::forget_one(&mut self.order, |k| items.get(k).is_some_and(|a| !a.open)) else { return };
        if self.items.remove(&old).is_some_and(|a| a.open) {
            self.open -= 1;
            tracing::warn!("over {} activities open at once: the oldest is forgotten", wait::MAX_KNOWN);
        }
        if old.0 == Item::Subagent {
            self.child_of.remove(&old.1);
        }
    }

    fn subagent_spawned(&mut self, u: View<'_>, cx: &mut Cx) {
        let [id, parent, grok_child, resumed_from, description, model] = u
            .pick(["subagent_id", "parent_session_id", "child_session_id", "resumed_from", "description", "model"])
            .map(text);
        let (Some(id), Some(parent)) = (id.as_deref(), parent.as_deref()) else {
            tracing::warn!("subagent_spawned without subagent_id or parent_session_id; not reported");
            return;
        };
        let key = (Item::Subagent, id.to_owned());
        if self.items.contains_key(&key) {
            return;
        }
        let grok_child = grok_child.as_deref().unwrap_or(id);
        // A continued subagent is the same child for Coda (rule 5).
        let child = resumed_from
            .and_then(|from| self.child_of.get(&*from).cloned())
            .unwrap_or_else(|| self.visible(grok_child));
        if child != grok_child {
            self.alias.insert(grok_child.to_owned(), child.clone());
            self.current.insert(child.clone(), grok_child.to_owned());
        }
        self.child_of.insert(id.to_owned(), child.clone());
        let calls = self.spawn_calls.entry(parent.to_owned()).or_default();
        let call = match self.named_by.remove(id) {
            Some(call) => {
                calls.retain(|c| *c != call);
                Some(call)
            }
            None => calls.pop_front(),
        };
        let session = self.visible(parent);
        let mut w = Wait::new(&session, id, State::Waiting);
        w.kind = Some("subagent".into());
        w.title = description.map(Cow::into_owned);
        w.child_session_id = Some(child);
        w.model = model.map(Cow::into_owned);
        w.tool_call_id = call;
        w.stoppable = Some(true);
        let a = Activity { session, grok_session: parent.to_owned(), ended: None, open: true };
        self.keep(key, a);
        self.report(&w, cx);
    }

    /// Learns which `spawn_subagent` call started which subagent.
    fn tool_update(&mut self, grok_session: &str, kind: Option<&str>, u: View<'_>) {
        let [call, meta, raw] = u.pick(["toolCallId", "_meta", "rawOutput"]);
        let call = text(call);
        match kind {
            Some("tool_call") => {
                let tool = meta.and_then(|m| m.pointer(&["x.ai/tool", "name"])).and_then(|n| n.as_str());
                if let (Some("spawn_subagent"), Some(call)) = (tool.as_deref(), call) {
                    self.spawn_calls.entry(grok_session.to_owned()).or_default().push_back(call.into_owned());
                }
            }
            Some("tool_call_update") => {
                let Some(call) = call else { return };
                let pending = self.spawn_calls.get(grok_session).is_some_and(|c| c.iter().any(|c| *c == call));
                if !pending {
                    return;
                }
                let [subagent, said] = raw.map_or([None, None], |r| r.pick(["subagent_id", "text"]).map(text));
                let named = subagent.or_else(|| {
                    let said = said?;
                    named_subagent(&said).map(|id| Cow::Owned(id.to_owned()))
                });
                if let Some(id) = named {
                    self.named_by.insert(id.into_owned(), call.into_owned());
                }
            }
            _ => {}
        }
    }

    /// One of Grok's `_x.ai/*` notifications this layer reads; `u` is its `params.update` (read where it lies:
    /// a background task's list or a subagent's news can be long, and only a few of its fields matter).
    fn notification(&mut self, method: &str, grok_session: &str, kind: Option<&str>, u: View<'_>, cx: &mut Cx) {
        let is_true = |v: Option<View<'_>>| v.and_then(|v| v.as_bool()) == Some(true);
        match (method, kind) {
            ("_x.ai/task_backgrounded", _) => self.task_backgrounded(grok_session, u, cx),
            ("_x.ai/task_completed", _) => {
                let [snap, will_wake] = u.pick(["task_snapshot", "will_wake"]);
                let Some(snap) = snap else { return };
                let [task, killed, exit] = snap.pick(["task_id", "explicitly_killed", "exit_code"]);
                let Some(task) = text(task) else { return };
                // (`exit_code` 0 as an integer: serde_json's `as_i64` reads `-0` as 0 and `0.0` as none.)
                let state = if is_true(killed) {
                    State::Cancelled
                } else if exit.is_some_and(|e| matches!(e.text(), b"0" | b"-0")) {
                    State::Done
                } else {
                    State::Failed
                };
                self.ended((Item::Task, task.into_owned()), state, is_true(will_wake), cx);
            }
            ("_x.ai/session_notification", Some("background_tasks")) => {
                // A running task this shim has not heard of (e.g. started by a tool other than the shell).
                for t in u.get("tasks").iter().flat_map(View::elements) {
                    let [task, status] = t.pick(["task_id", "status"]).map(text);
                    if let (Some(task), Some("running")) = (task, status.as_deref()) {
                        self.open_task(grok_session, &task, t, cx);
                    }
                }
            }
            ("_x.ai/session_notification", Some("subagent_spawned")) => self.subagent_spawned(u, cx),
            ("_x.ai/session_notification", Some("subagent_finished")) => {
                let [id, status, will_wake] = u.pick(["subagent_id", "status", "will_wake"]);
                let Some(id) = text(id) else { return };
                let state = match text(status).as_deref() {
                    Some("completed") => State::Done,
                    Some("cancelled") => State::Cancelled,
                    _ => State::Failed,
                };
                self.ended((Item::Subagent, id.into_owned()), state, is_true(will_wake), cx);
            }
            ("_x.ai/session_notification", Some("turn_completed")) => {
                self.turn_completed(text(u.get("prompt_id")).as_deref(), cx)
            }
            _ => {}
        }
    }

    /// A turn of Grok's ended; `prompt` is its `prompt_id`: a wake turn's ends its item.
    fn turn_completed(&mut self, prompt: Option<&str>, cx: &mut Cx) {
        let Some(key) = prompt.and_then(Self::wake_key) else { return };
        let Some(a) = self.items.get(&key) else { return };
        let state = a.ended.unwrap_or(State::Done);
        self.set_state(&key, state, cx);
    }

    /// `_x.ai/queue/changed` naming a wake turn as running (`running`, its `runningPromptId`): Grok is
    /// working on that item's result.
    fn queue_changed(&mut self, running: Option<&str>, cx: &mut Cx) {
        let Some(key) = running.and_then(Self::wake_key) else { return };
        if self.items.get(&key).is_some_and(|a| a.open) {
            self.set_state(&key, State::Handling, cx);
        }
    }

    /// A stop `Waits` passed on (the wait is open and stoppable as far as the reports say); one this layer
    /// did not report goes on to Grok.
    fn stop(&mut self, id: &Id, frame: Frame, cx: &mut Cx) {
        let params = frame.view().get("params");
        let [session, wait_id] = params.map_or([None, None], |p| p.pick(["sessionId", "waitId"]).map(text));
        let wait_id = wait_id.unwrap_or_default();
        let found = [Item::Task, Item::Subagent]
            .into_iter()
            .map(|k| (k, wait_id.clone().into_owned()))
            .find(|k| self.items.get(k).is_some_and(|a| Some(a.session.as_str()) == session.as_deref()));
        let Some((key, a)) = found.and_then(|k| self.items.get(&k).map(|a| (k, a))) else {
            return cx.to_agent(frame);
        };
        if a.open && a.ended.is_none() {
            match key.0 {
                Item::Task => {
                    cx.request("_x.ai/task/kill", json!({"sessionId": a.grok_session, "taskId": key.1}), Stop)
                }
                Item::Subagent => cx.request("_x.ai/subagent/cancel", json!({"subagentId": key.1}), Stop),
            }
        }
        // Under way (or already over); the `cancelled` report follows from Grok's own messages.
        cx.to_client(frame::result_response(id, json!({})));
    }

    /// Whether Grok's `_x.ai/*` notification `method` may change what this layer knows: the others (most of
    /// them: set-up, queue and session lists, retries) are passed on unread.
    fn reads(&self, method: &str, frame: &Frame) -> bool {
        match method {
            "_x.ai/task_backgrounded" | "_x.ai/task_completed" => true,
            // It changes only an open item's state, and a turn's end only an item's.
            "_x.ai/queue/changed" => self.open > 0,
            "_x.ai/session_notification" => match frame.session_update() {
                Some("background_tasks" | "subagent_spawned" | "subagent_finished") => true,
                Some("turn_completed") => !self.items.is_empty(),
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether a frame names a session [`GrokActivity::rename`] renames (towards the client when `to_visible`).
    fn may_rename(&self, frame: &Frame, to_visible: bool) -> bool {
        let map = if to_visible { &self.alias } else { &self.current };
        // `params.sessionId` from the frame check: a lookup, not a search of the frame for every name.
        !map.is_empty() && frame.session().is_some_and(|s| map.get(&*s).is_some_and(|to| *to != *s))
    }

    /// Whether a `session/update` is a tool call this layer learns from: a spawn, or what may follow one.
    fn tool_news(&self, frame: &Frame) -> bool {
        match frame.session_update() {
            // (A `\u` escape may spell the tool's name.)
            Some("tool_call") => frame.has(&SPAWN_SUBAGENT) || frame.unicode_escaped(),
            Some("tool_call_update") => self.spawn_calls.values().any(|c| !c.is_empty()),
            _ => false,
        }
    }

    /// Renames a continued subagent's Grok session to the one Coda knows, in `params.sessionId`, and
    /// passes the frame on (towards the client when `to_visible`).
    fn rename(&self, frame: Frame, to_visible: bool, cx: &mut Cx) {
        let pass = |cx: &mut Cx, f: Frame| if to_visible { cx.to_client(f) } else { cx.to_agent(f) };
        // Parse only a frame whose session is one to rename.
        if !self.may_rename(&frame, to_visible) {
            return pass(cx, frame);
        }
        let mut v = frame.to_value();
        let Some(Value::String(sid)) = v.pointer_mut("/params/sessionId") else { return pass(cx, frame) };
        let renamed = if to_visible { self.alias.get(sid.as_str()) } else { self.current.get(sid.as_str()) }.cloned();
        match renamed {
            Some(new) => {
                *sid = new;
                pass(cx, frame.rewritten(v))
            }
            None => pass(cx, frame),
        }
    }

    /// An `_x.ai/*` notification `frame` (of `method`) that this layer reads (see [`GrokActivity::reads`]).
    fn x_ai(&mut self, method: &str, frame: &Frame, cx: &mut Cx) {
        let Some(session) = frame.session().filter(|s| !s.is_empty()) else { return };
        if Self::is_loading(cx, &session) {
            return;
        }
        // The queue and a turn's end, the most frequent, read where they lie (they carry prompts).
        fn nonempty(s: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
            s.filter(|s| !s.is_empty())
        }
        if method == "_x.ai/queue/changed" {
            return self.queue_changed(Queue::of(frame).as_ref().and_then(Queue::running), cx);
        }
        if method == "_x.ai/session_notification" && frame.session_update() == Some("turn_completed") {
            let prompt = frame.update_value().and_then(|u| u.get("prompt_id")).and_then(|p| p.as_str());
            return self.turn_completed(nonempty(prompt).as_deref(), cx);
        }
        // (An update that is no object reads as one without fields: a task without its id is warned of.)
        let u = frame.update_value().unwrap_or(View::of(b"null"));
        self.notification(method, &session, frame.session_update(), u, cx);
    }
}

impl Layer for GrokActivity {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Stop;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if let Kind::Request { id, method } = frame.kind()
            && method == wait::STOP_METHOD
        {
            let id = id.clone();
            return self.stop(&id, frame, cx);
        }
        if matches!(frame.method(), Some("session/cancel" | "session/prompt")) {
            return self.rename(frame, false, cx);
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => cx.to_client(frame),
            Kind::Notification { method } if method.starts_with("_x.ai/") => {
                if !self.reads(method, &frame) {
                    return cx.to_client(frame);
                }
                // (Read before it goes on, and sent ahead of what the read sends.)
                let mark = cx.mark();
                self.x_ai(method, &frame, cx);
                cx.to_client_at(mark, frame);
            }
            Kind::Notification { method } if method == "session/update" => {
                // Only tool calls matter, and of those only a spawn or what follows one.
                if self.tool_news(&frame)
                    && let (Some(sid), Some(u)) = (frame.session(), frame.update_value())
                    && !Self::is_loading(cx, &sid)
                {
                    self.tool_update(&sid, frame.session_update(), u);
                }
                self.rename(frame, true, cx)
            }
            Kind::Request { method, .. } if method == "session/request_permission" => self.rename(frame, true, cx),
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Notification { method } if method.starts_with("_x.ai/") => !self.reads(method, frame),
            Kind::Notification { method } if method == "session/update" => {
                !self.tool_news(frame) && !self.may_rename(frame, true)
            }
            Kind::Request { method, .. } if method == "session/request_permission" => !self.may_rename(frame, true),
            _ => true,
        }
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }

    /// A closed session's waits ended with it (the engine's waits layer told Coda): what is kept of them, and of
    /// its children, goes.
    fn session_closed(&mut self, closed: &[String], _cx: &mut Cx) {
        let gone = |s: &str| closed.iter().any(|c| c == s);
        self.items.retain(|_, a| !gone(&a.session) && !gone(&a.grok_session));
        self.order.retain(|k| self.items.contains_key(k));
        self.open = self.items.values().filter(|a| a.open).count();
        self.alias.retain(|grok, known| !gone(grok) && !gone(known));
        self.current.retain(|known, grok| !gone(known) && !gone(grok));
        self.child_of.retain(|_, child| !gone(child));
        self.spawn_calls.retain(|session, _| !gone(session));
        self.register.forget(gone);
    }

    fn kept(&self) -> usize {
        self.items.len() + self.alias.len() + self.current.len() + self.child_of.len() + self.spawn_calls.len()
    }

    fn on_reply(&mut self, _: Stop, reply: Frame, _cx: &mut Cx) {
        if let Some(err) = reply.value().get("error") {
            let code = err.get("code").and_then(Value::as_i64).unwrap_or_default();
            tracing::warn!("Grok refused to stop an activity (error {code}; its message is logged at debug)");
            tracing::debug!("Grok's answer to the stop: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::waits::Waits;
    use crate::layer::testing::Harness;

    const S: &str = "01a22a85-d266-70c3-8852-84420f5f38e0";

    /// The layer under the engine's `Waits`, as in the binary.
    fn harness() -> Harness {
        Harness::new(vec![Box::new(Waits::new()), Box::new(GrokActivity::new())])
    }

    fn started() -> Harness {
        let mut h = harness();
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize",
            "params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"coda":{"waits":{}}}}}});
        h.from_client(init);
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}}));
        assert_eq!(h.to_client()[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}));
        h.to_agent();
        h
    }

    /// Frames reaching the client for one agent frame: the frame itself first, untouched.
    fn agent(h: &mut Harness, v: Value) -> Vec<Value> {
        h.from_agent(v.clone());
        let out = h.to_client();
        assert_eq!(out.first(), Some(&v), "Grok's own frame goes on first and untouched");
        out[1..].to_vec()
    }

    fn waits(out: &[Value]) -> Vec<Value> {
        out.iter().map(|f| f["params"].clone()).collect()
    }

    fn note(method: &str, session: &str, update: Value) -> Value {
        json!({"jsonrpc":"2.0","method":method,"params":{"sessionId":session,"update":update}})
    }

    fn backgrounded(task: &str) -> Value {
        note(
            "_x.ai/task_backgrounded",
            S,
            json!({"sessionUpdate":"task_backgrounded","task_id":task,"tool_call_id":"call_4",
            "command":"sleep 3; echo built","description":"run sleep 3; echo built","output_file":"/h/call_4.log"}),
        )
    }

    fn task_completed(task: &str, exit: Value, killed: bool, wake: bool) -> Value {
        note(
            "_x.ai/task_completed",
            S,
            json!({"sessionUpdate":"task_completed","will_wake":wake,
            "task_snapshot":{"task_id":task,"exit_code":exit,"explicitly_killed":killed,"completed":true}}),
        )
    }

    fn turn_completed(session: &str, prompt: &str) -> Value {
        note(
            "_x.ai/session_notification",
            session,
            json!({"sessionUpdate":"turn_completed","prompt_id":prompt,"stop_reason":"end_turn"}),
        )
    }

    fn running(prompt: &str) -> Value {
        json!({"jsonrpc":"2.0","method":"_x.ai/queue/changed","params":{"sessionId":S,"entries":[],
            "runningPromptId":prompt,"runningKind":"prompt"}})
    }

    /// What is kept of Grok's tasks and subagents is bounded as the register's waits are: past
    /// [`wait::MAX_KNOWN`] the oldest ended one goes first, else the oldest open one (whose end Grok reports
    /// later is then ignored).
    #[test]
    fn the_activities_kept_are_bounded_and_the_ended_ones_go_first() {
        let mut h = started();
        agent(&mut h, backgrounded("first"));
        agent(&mut h, backgrounded("ended"));
        let out = agent(&mut h, task_completed("ended", json!(0), false, false));
        assert_eq!(waits(&out), vec![json!({"sessionId":S,"waitId":"ended","state":"done"})]);
        for n in 2..wait::MAX_KNOWN {
            agent(&mut h, backgrounded(&format!("t{n}")));
        }
        let layer = |h: &mut Harness| -> (usize, usize, bool, bool) {
            let a = h.layer::<GrokActivity>(1);
            let has = |id: &str| a.items.contains_key(&(Item::Task, id.to_owned()));
            (a.items.len(), a.open, has("first"), has("ended"))
        };
        assert_eq!(layer(&mut h), (wait::MAX_KNOWN, wait::MAX_KNOWN - 1, true, true), "at the bound, all kept");
        agent(&mut h, backgrounded("one more"));
        assert_eq!(layer(&mut h), (wait::MAX_KNOWN, wait::MAX_KNOWN, true, false), "the ended one goes first");
        agent(&mut h, backgrounded("and another"));
        assert_eq!(layer(&mut h), (wait::MAX_KNOWN, wait::MAX_KNOWN, false, false), "then the oldest open one");
        assert!(agent(&mut h, task_completed("first", json!(0), false, false)).is_empty(), "forgotten");
        let a = h.layer::<GrokActivity>(1);
        assert_eq!(a.order.len(), a.items.len());
        assert!(a.order.iter().all(|k| a.items.contains_key(k)));
    }

    #[test]
    fn background_command_is_a_task_wait_handled_in_groks_wake_turn() {
        let mut h = started();
        assert_eq!(
            waits(&agent(&mut h, backgrounded("t1"))),
            vec![json!({"sessionId":S,"waitId":"t1","state":"waiting","kind":"task","title":"run sleep 3; echo built",
                "detail":"sleep 3; echo built","outputFile":"/h/call_4.log","toolCallId":"call_4","stoppable":true})]
        );
        // Grok names its wake turn before it reports the completion.
        assert_eq!(
            waits(&agent(&mut h, running("task-completed-t1"))),
            vec![json!({"sessionId":S,"waitId":"t1","state":"handling"})]
        );
        assert!(agent(&mut h, task_completed("t1", json!(0), false, true)).is_empty());
        let out = agent(&mut h, turn_completed(S, "task-completed-t1"));
        assert_eq!(waits(&out), vec![json!({"sessionId":S,"waitId":"t1","state":"done"})]);
        assert!(agent(&mut h, turn_completed(S, "task-completed-t1")).is_empty(), "terminal is final");
    }

    /// A queue change is read while a task or subagent is open (its wake turn may be the one running), and
    /// passed on unread once every one has ended, or gone with its session.
    #[test]
    fn queue_changes_are_read_only_while_an_item_is_open() {
        let mut h = started();
        let queue = Frame::parse(running("task-completed-x").to_string().into_bytes()).expect("a frame");
        let reads = |h: &mut Harness| !h.layer::<GrokActivity>(1).passes_from_agent(&queue);
        assert!(!reads(&mut h), "nothing open");
        agent(&mut h, backgrounded("a"));
        agent(&mut h, backgrounded("b"));
        agent(&mut h, backgrounded("b"));
        agent(&mut h, task_completed("a", json!(0), false, false));
        assert!(reads(&mut h), "b is open");
        agent(&mut h, task_completed("b", json!(1), false, true));
        assert!(reads(&mut h), "b is handled in its wake turn");
        agent(&mut h, turn_completed(S, "task-completed-b"));
        agent(&mut h, turn_completed(S, "task-completed-b"));
        assert!(!reads(&mut h), "both ended");
        agent(&mut h, backgrounded("c"));
        assert!(reads(&mut h));
        h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"session/close","params":{"sessionId":S}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":9,"result":{}}));
        assert!(!reads(&mut h), "c went with its session");
    }

    #[test]
    fn a_task_is_done_only_with_the_integer_exit_code_zero() {
        for (exit, state) in [(json!(0), "done"), (json!(0.0), "failed"), (json!("0"), "failed"), (json!(-1), "failed")]
        {
            let mut h = started();
            agent(&mut h, backgrounded("a"));
            let out = agent(&mut h, task_completed("a", exit.clone(), false, false));
            assert_eq!(waits(&out), vec![json!({"sessionId":S,"waitId":"a","state":state})], "{exit}");
        }
        // An update that is no object, or a task without its id: nothing reported, nothing lost.
        let mut h = started();
        assert!(agent(&mut h, note("_x.ai/task_backgrounded", S, json!([1, 2]))).is_empty());
        assert!(agent(&mut h, note("_x.ai/task_completed", S, json!({"task_snapshot":"a"}))).is_empty());
    }

    #[test]
    fn task_outcomes_failed_and_killed() {
        let mut h = started();
        agent(&mut h, backgrounded("a"));
        let out = agent(&mut h, task_completed("a", json!(2), false, false));
        assert_eq!(waits(&out), vec![json!({"sessionId":S,"waitId":"a","state":"failed"})]);
        agent(&mut h, backgrounded("b"));
        assert_eq!(waits(&agent(&mut h, task_completed("b", Value::Null, true, true)))[0]["state"], "handling");
        assert_eq!(waits(&agent(&mut h, turn_completed(S, "task-completed-b")))[0]["state"], "cancelled");
    }

    #[test]
    fn a_first_report_is_never_terminal() {
        let mut h = started();
        assert!(agent(&mut h, task_completed("ghost", json!(0), false, false)).is_empty());
        let fin = note(
            "_x.ai/session_notification",
            S,
            json!({"sessionUpdate":"subagent_finished","subagent_id":"ghost","status":"completed","will_wake":false}),
        );
        assert!(agent(&mut h, fin).is_empty());
    }

    fn spawn_call(call: &str) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":{"sessionUpdate":"tool_call",
            "toolCallId":call,"title":"spawn_subagent","rawInput":{"background":true},
            "_meta":{"x.ai/tool":{"name":"spawn_subagent","kind":"task"}}}}})
    }

    fn spawn_result(call: &str, id: &str) -> Value {
        let text = format!("Subagent started in background.\nsubagent_id: {id}\ndescription: helper task\n");
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":{"sessionUpdate":"tool_call_update",
            "toolCallId":call,"status":"completed","rawOutput":{"type":"Text","text":text}}}})
    }

    fn spawned(id: &str, child: &str, resumed_from: Option<&str>) -> Value {
        let mut u = json!({"sessionUpdate":"subagent_spawned","subagent_id":id,"child_session_id":child,
            "parent_session_id":S,"description":"helper task","model":"fake","subagent_type":"general-purpose"});
        if let Some(from) = resumed_from {
            u["resumed_from"] = json!(from);
        }
        note("_x.ai/session_notification", S, u)
    }

    fn finished(id: &str, status: &str, wake: bool) -> Value {
        note(
            "_x.ai/session_notification",
            S,
            json!({"sessionUpdate":"subagent_finished","subagent_id":id,"child_session_id":id,"status":status,"will_wake":wake}),
        )
    }

    #[test]
    fn subagent_is_a_subagent_wait_with_its_child_session_and_spawning_call() {
        let mut h = started();
        assert!(agent(&mut h, spawn_call("call_12")).is_empty());
        assert!(agent(&mut h, spawn_result("call_12", "sub1")).is_empty());
        assert_eq!(
            waits(&agent(&mut h, spawned("sub1", "sub1", None))),
            vec![json!({"sessionId":S,"waitId":"sub1","state":"waiting","kind":"subagent","title":"helper task",
                "childSessionId":"sub1","model":"fake","toolCallId":"call_12","stoppable":true})]
        );
        // The child's output passes as the child's own session/update.
        let chunk = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sub1",
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"child result"}}}});
        assert!(agent(&mut h, chunk).is_empty());
        assert_eq!(waits(&agent(&mut h, finished("sub1", "completed", true)))[0]["state"], "handling");
        assert!(agent(&mut h, running("subagent-completed-sub1")).is_empty(), "already handling");
        let out = agent(&mut h, turn_completed(S, "subagent-completed-sub1"));
        assert_eq!(waits(&out), vec![json!({"sessionId":S,"waitId":"sub1","state":"done"})]);
    }

    /// A spawn whose tool name is spelled with an escape is read as the parsed frame reads it (fail closed).
    #[test]
    fn a_spawn_named_with_an_escape_links_its_call() {
        let mut h = started();
        let spawn = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"tool_call","toolCallId":"call_7","title":"spawn\u005fsubagent","_meta":{{"x.ai/tool":{{"name":"spawn\u005fsubagent","kind":"task"}}}}}}}}}}"#
        );
        h.agent_frame(Frame::parse(spawn.into_bytes()).expect("valid"));
        h.take();
        assert_eq!(waits(&agent(&mut h, spawned("fg", "fg", None)))[0]["toolCallId"], "call_7");
    }

    #[test]
    fn a_foreground_subagent_ends_in_the_turn_and_links_the_pending_call() {
        let mut h = started();
        agent(&mut h, spawn_call("call_116"));
        assert_eq!(waits(&agent(&mut h, spawned("fg", "fg", None)))[0]["toolCallId"], "call_116");
        assert_eq!(
            waits(&agent(&mut h, finished("fg", "completed", false))),
            vec![json!({"sessionId":S,"waitId":"fg","state":"done"})]
        );
    }

    #[test]
    fn a_resumed_subagent_is_a_new_wait_on_the_same_child_session() {
        let mut h = started();
        agent(&mut h, spawned("sub1", "sub1", None));
        agent(&mut h, finished("sub1", "completed", false));
        let out = waits(&agent(&mut h, spawned("sub2", "sub2", Some("sub1"))));
        assert_eq!(out[0]["waitId"], "sub2");
        assert_eq!(out[0]["childSessionId"], "sub1");
        // Grok's new child session is the first one for Coda, both ways.
        let chunk = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sub2",
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"more"}}}});
        h.from_agent(chunk);
        assert_eq!(h.to_client()[0]["params"]["sessionId"], "sub1");
        let cancel = json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"sub1"}});
        h.from_client(cancel);
        assert_eq!(h.to_agent()[0]["params"]["sessionId"], "sub2");
    }

    #[test]
    fn stop_asks_grok_and_answers_at_once() {
        let mut h = started();
        agent(&mut h, backgrounded("t1"));
        agent(&mut h, spawned("sub1", "sub1", None));
        for (wait_id, method, params) in [
            ("t1", "_x.ai/task/kill", json!({"sessionId":S,"taskId":"t1"})),
            ("sub1", "_x.ai/subagent/cancel", json!({"subagentId":"sub1"})),
        ] {
            let stop =
                json!({"jsonrpc":"2.0","id":9,"method":"_coda/wait/stop","params":{"sessionId":S,"waitId":wait_id}});
            h.from_client(stop);
            let asked = h.to_agent();
            assert_eq!(asked[0]["method"], method);
            assert_eq!(asked[0]["params"], params);
            assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":9,"result":{}})]);
            // Grok's answer is the shim's own, never forwarded.
            h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{}}));
            assert!(h.to_client().is_empty());
        }
    }

    #[test]
    fn stop_of_an_unknown_wait_is_invalid_params() {
        let mut h = started();
        for params in [json!({"sessionId":S,"waitId":"nope"}), json!({"sessionId":S})] {
            h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"_coda/wait/stop","params":params}));
            assert!(h.to_agent().is_empty());
            assert_eq!(h.to_client()[0]["error"]["code"], -32602);
        }
    }

    #[test]
    fn activity_replayed_during_a_load_is_history() {
        let mut h = started();
        h.from_client(json!({"jsonrpc":"2.0","id":5,"method":"session/load","params":{"sessionId":S}}));
        assert!(agent(&mut h, backgrounded("old")).is_empty());
        agent(&mut h, json!({"jsonrpc":"2.0","id":5,"result":{}}));
        assert_eq!(waits(&agent(&mut h, backgrounded("new")))[0]["waitId"], "new");
    }

    #[test]
    fn no_waits_for_a_client_that_did_not_declare_them() {
        let mut h = harness();
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"clientCapabilities":{}}}));
        assert!(agent(&mut h, backgrounded("t1")).is_empty());
    }

    #[test]
    fn a_running_task_only_in_the_snapshot_is_registered_once() {
        let mut h = started();
        let snap = note(
            "_x.ai/session_notification",
            S,
            json!({"sessionUpdate":"background_tasks","tasks":[{"task_id":"m1","command":"tail -f log","kind":"monitor","status":"running"},
            {"task_id":"x","status":"completed"}]}),
        );
        let out = waits(&agent(&mut h, snap.clone()));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["waitId"], "m1");
        assert!(agent(&mut h, snap).is_empty());
    }

    #[test]
    fn subagent_ids_are_read_from_the_result_text() {
        assert_eq!(named_subagent("Subagent started.\nsubagent_id: abc-1\ndescription: x"), Some("abc-1"));
        assert_eq!(named_subagent("nothing here"), None);
    }
}

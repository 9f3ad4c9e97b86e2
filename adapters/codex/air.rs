//! codex-acp's JetBrains AIR extensions, turned into Coda's (section Agent 活动, and the Codex row of
//! 内置 Agent 的入口进程).
//!
//! - `initialize`: declares AIR `nativeSubagentSessions`, `asyncTasks`, `sessionFailure` to codex-acp; a
//!   codex-acp whose answer does not report both subagents and tasks gets a warning, and waits are not
//!   declared for it (a [`WithholdWaits`] note on the request; the handshake itself is the engine's `Waits`
//!   layer; `agentInfo` is the identity layer's).
//! - `async_task_*` and `subagent_*` updates become `_coda/wait` reports (through `wait::Register`, which
//!   keeps Coda's rules for them); the AIR updates are consumed.
//! - A continued subagent `X:generation:N` is session `X` for Coda, both ways.
//! - `_coda/wait/stop` (of a wait `Waits` found open and stoppable): AIR's task stop on the root session, or
//!   `session/cancel` of a cancellable subagent.
//! - `_session/steering` always asks for `promptRequired`, so codex-acp never opens a turn of its own.

use crate::HashMap;
use std::borrow::Cow;
use std::convert::Infallible;

use crate::coda::wait::{Register, State, Wait, WithholdWaits};
use crate::frame::{self, Frame, Kind};
use crate::json::{View, object_at, str_of as text};
use crate::layer::{Cx, Layer};
use serde_json::{Map, Value, json};

/// The AIR capabilities the shim declares to codex-acp.
pub const AIR_CAPABILITIES: [&str; 3] = ["nativeSubagentSessions", "asyncTasks", "sessionFailure"];
/// Where codex-acp puts a continued subagent's generation in its session id.
const GENERATION: &str = ":generation:";

/// Whether a frame's `params.sessionId` (from the frame check) is a continued subagent's, with a generation.
/// Every frame of a stream is asked this: a session id without a colon (nearly all) is told by one look at
/// its bytes, a word at a time, without a SIMD search's set-up.
fn of_a_generation(frame: &Frame) -> bool {
    let generation = GENERATION.as_bytes();
    frame.session_bytes().is_some_and(|s| s.contains(&b':') && s.windows(generation.len()).any(|w| w == generation))
}

/// The oldest codex-acp that reports subagents and background commands to an AIR client with steering.
const AIR_BUILD: &str = "@agentclientprotocol/codex-acp >= 2.4.0";

/// The part of a codex-acp session id before `:generation:`: the subagent as Coda knows it.
pub fn stable(id: &str) -> &str {
    id.find(GENERATION).map_or(id, |at| &id[..at])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum WaitKind {
    Task,
    Subagent,
}

/// A wait opened for an AIR task or subagent; its waitId is the upstream id (`asyncTaskId`, or the
/// generation's session id).
#[derive(Debug)]
struct Opened {
    /// The session Coda files the wait under (a root session or a subagent's stable id).
    session: String,
}

#[derive(Debug)]
struct Subagent {
    /// The session id of the newest generation, where frames for `X` go.
    current: String,
    /// The session that spawned it, as Coda knows it.
    parent: String,
}

/// The shim's own `_session/async_task/stop` (its answer is only logged).
pub struct TaskStop;

/// Whether a request replays a session's history.
fn loads(method: &str) -> bool {
    method == "session/load" || method == "session/resume"
}

/// Whether a `session/load` or `session/resume` of `session` is with codex-acp (the stack's request table says):
/// what codex-acp says of that session meanwhile is its history; other sessions' news is news.
fn loading(cx: &Cx, session: &str) -> bool {
    cx.open_requests().any(|r| loads(&r.method) && r.session() == Some(session))
}

#[derive(Default)]
pub struct Air {
    subagents: HashMap<String, Subagent>,
    /// Waits by `(upstream kind, upstream id = waitId)`.
    waits: HashMap<(WaitKind, String), Opened>,
    /// `(session, waitId)` -> kind, for `_coda/wait/stop`.
    by_wait: HashMap<(String, String), WaitKind>,
    /// Coda's `_coda/wait` rules: what was reported, only changes, nothing after a terminal state.
    register: Register,
    /// Opening reports held during `session/load`, in arrival order.
    held: Vec<((WaitKind, String), Wait)>,
}

impl Air {
    pub fn new() -> Air {
        Air::default()
    }

    /// The root session above `session` (itself when it is not a subagent).
    fn root_of(&self, session: &str) -> String {
        let mut at = session;
        for _ in 0..64 {
            match self.subagents.get(at) {
                Some(s) if s.parent != at => at = &s.parent,
                _ => break,
            }
        }
        at.to_owned()
    }

    fn client_initialize(&mut self, frame: Frame, cx: &mut Cx) {
        let mut value = frame.to_value();
        let Some(params) = value.get_mut("params").and_then(Value::as_object_mut) else {
            return cx.to_agent(frame);
        };
        let caps = object_at(params, "clientCapabilities");
        let air = object_at(object_at(object_at(caps, "_meta"), "jetbrains"), "air");
        let mut names: Vec<Value> = match air.get("capabilities") {
            Some(Value::Array(have)) => have.clone(),
            _ => Vec::new(),
        };
        for name in AIR_CAPABILITIES {
            if !names.iter().any(|n| n.as_str() == Some(name)) {
                names.push(json!(name));
            }
        }
        if air.get("version").and_then(Value::as_u64).is_none_or(|v| v < 1) {
            air.insert("version".into(), json!(1));
        }
        air.insert("capabilities".into(), Value::Array(names));
        cx.to_agent(frame.rewritten(value))
    }

    /// codex-acp's `initialize` answer: without AIR reports, a warning and no waits declared.
    fn initialized(&mut self, frame: Frame, cx: &mut Cx) {
        let mut value = frame.to_value();
        let Some(result) = value.get_mut("result").filter(|r| r.is_object()) else {
            return cx.to_client(frame);
        };
        let air = result.get("_meta").and_then(|m| m.pointer("/jetbrains/air/capabilities")).and_then(Value::as_array);
        let has = |name: &str| air.is_some_and(|caps| caps.iter().any(|c| c.as_str() == Some(name)));
        if has("nativeSubagentSessions") && has("asyncTasks") {
            return cx.to_client(frame);
        }
        let described = result
            .get("agentInfo")
            .map(|i| {
                let name = i.get("name").and_then(Value::as_str).unwrap_or("codex-acp");
                let version = i.get("version").and_then(Value::as_str).unwrap_or("(version unknown)");
                format!("{name} {version}")
            })
            .unwrap_or_else(|| "this codex-acp".into());
        tracing::warn!(
            "{described} does not report subagents or background commands (JetBrains AIR); Coda will see no \
             activity. {AIR_BUILD} does"
        );
        if let Some(id) = frame.id() {
            cx.note(id, WithholdWaits);
        }
        cx.to_client(frame)
    }

    fn steering(&mut self, frame: Frame, cx: &mut Cx) {
        let mut value = frame.to_value();
        let Some(params) = value.get_mut("params").and_then(Value::as_object_mut) else {
            return cx.to_agent(frame);
        };
        self.address(params);
        let steering = object_at(object_at(params, "_meta"), "steering");
        if !steering.contains_key("idleBehavior") {
            steering.insert("idleBehavior".into(), json!("promptRequired"));
        }
        cx.to_agent(frame.rewritten(value))
    }

    /// Points `params.sessionId` = `X` at the current generation of subagent `X`. True when changed.
    fn address(&self, params: &mut Map<String, Value>) -> bool {
        let Some(Value::String(sid)) = params.get_mut("sessionId") else { return false };
        match self.subagents.get(sid.as_str()) {
            Some(s) if s.current != *sid => {
                *sid = s.current.clone();
                true
            }
            _ => false,
        }
    }

    /// A stop `Waits` passed on: the wait is open and stoppable as far as the reports say. One this layer did
    /// not report goes on to codex-acp.
    fn stop(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(id) = frame.id().cloned() else { return cx.to_agent(frame) };
        let params = frame.value().get("params").cloned().unwrap_or(Value::Null);
        let text = |key: &str| params.get(key).and_then(Value::as_str).unwrap_or_default();
        let (session, wait_id) = (text("sessionId"), text("waitId"));
        let key = self.by_wait.get(&(session.to_owned(), wait_id.to_owned())).map(|&kind| (kind, wait_id.to_owned()));
        let Some((kind, wait)) = key.and_then(|k| self.waits.get(&k).map(|w| (k.0, w))) else {
            return cx.to_agent(frame);
        };
        match kind {
            WaitKind::Task => {
                // codex-acp looks tasks up among root sessions only (reference codex.md §1.5).
                let params = json!({"sessionId": self.root_of(&wait.session), "asyncTaskId": wait_id});
                cx.request("_session/async_task/stop", params, TaskStop);
            }
            WaitKind::Subagent => {
                cx.to_agent(frame::notification("session/cancel", json!({"sessionId": wait_id})));
            }
        }
        cx.to_client(frame::result_response(&id, json!({})))
    }

    /// Sends what `wait` changes (the `Waits` layer decides whether the client gets it).
    fn report(&mut self, wait: &Wait, cx: &mut Cx) {
        if let Some(f) = self.register.report(wait) {
            cx.to_client(f);
        }
    }

    fn held_at(&self, key: &(WaitKind, String)) -> Option<usize> {
        self.held.iter().position(|(k, _)| k == key)
    }

    /// Opens a wait; held back while a `session/load` replays history.
    fn open(&mut self, kind: WaitKind, wait: Wait, cx: &mut Cx) {
        let key = (kind, wait.wait_id.clone());
        if self.waits.get(&key).is_some_and(|old| self.register.is_open(&old.session, &key.1)) {
            // The same run announced again: Coda has it already.
            return;
        }
        self.by_wait.insert((wait.session_id.clone(), key.1.clone()), kind);
        self.waits.insert(key.clone(), Opened { session: wait.session_id.clone() });
        match self.held_at(&key) {
            _ if !loading(cx, &self.root_of(&wait.session_id)) => self.report(&wait, cx),
            Some(at) => self.held[at].1 = wait,
            None => self.held.push((key, wait)),
        }
    }

    /// Ends a wait with `state`; one that was never reported is dropped by the register.
    fn end(&mut self, key: (WaitKind, String), state: State, cx: &mut Cx) {
        let Some(wait) = self.waits.get(&key) else {
            tracing::debug!(id = %key.1, "end of an activity that was never announced; dropped");
            return;
        };
        if let Some(at) = self.held_at(&key) {
            // Began and ended inside a replay: history, not activity.
            self.held.remove(at);
            return;
        }
        let end = Wait::new(&wait.session, &key.1, state);
        self.report(&end, cx);
    }

    /// Reports the held openings of the sessions no longer loading.
    fn flush_held(&mut self, cx: &mut Cx) {
        let (done, still): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.held).into_iter().partition(|(_, w)| !loading(cx, &self.root_of(&w.session_id)));
        self.held = still;
        for (_, wait) in done {
            self.report(&wait, cx);
        }
    }

    /// Handles an AIR-only update of kind `name` (read where it lies); true when it was one (and is consumed).
    fn air_update(&mut self, sid: &str, name: &str, update: View<'_>, cx: &mut Cx) -> bool {
        let (kind, id_field) = match name {
            "async_task_spawned" | "async_task_state_update" => (WaitKind::Task, "asyncTaskId"),
            "subagent_spawned" | "subagent_state_update" => (WaitKind::Subagent, "subagentSessionId"),
            "async_task_progress" => return true,
            _ => return false,
        };
        let session = stable(sid).to_owned();
        // Every field read here, in one pass over the update's members.
        let fields =
            ["asyncTaskId", "subagentSessionId", "state", "name", "toolCallId", "canStop", "task", "capabilities"];
        let [task_id, subagent_id, state, title, call, can_stop, task, capabilities] = update.pick(fields);
        let id = text(if kind == WaitKind::Task { task_id } else { subagent_id });
        let Some(id) = id.as_deref() else {
            tracing::warn!("{name} without {id_field}; dropped");
            return true;
        };
        if name.ends_with("_state_update") {
            let state = match (kind, text(state).as_deref()) {
                (_, Some("completed")) => State::Done,
                (_, Some("failed")) | (WaitKind::Subagent, Some("disconnected")) => State::Failed,
                (WaitKind::Task, Some("stopped")) | (WaitKind::Subagent, Some("cancelled")) => State::Cancelled,
                // A task's `running` or `stopping` and the like change nothing Coda sees.
                (_, other) => {
                    tracing::debug!(?other, "{name} that changes nothing for Coda");
                    return true;
                }
            };
            self.end((kind, id.to_owned()), state, cx);
            return true;
        }
        if id.is_empty() {
            tracing::warn!("{name} with an empty {id_field}; dropped");
            return true;
        }
        let mut wait = Wait::new(&session, id, State::Waiting);
        wait.title = text(title).map(Cow::into_owned);
        let stoppable = match kind {
            WaitKind::Task => {
                wait.kind = Some("task".into());
                wait.tool_call_id = text(call).map(Cow::into_owned);
                can_stop.and_then(|c| c.as_bool()) == Some(true)
            }
            WaitKind::Subagent => {
                let x = stable(id).to_owned();
                self.subagents.insert(x.clone(), Subagent { current: id.to_owned(), parent: session.clone() });
                wait.kind = Some("subagent".into());
                wait.detail = text(task).map(Cow::into_owned);
                wait.child_session_id = Some(x);
                let cancel = capabilities.and_then(|c| c.get("cancel"));
                cancel.is_some_and(|c| c.text().first() == Some(&b'{'))
            }
        };
        wait.stoppable = Some(stoppable);
        self.open(kind, wait, cx);
        true
    }

    fn agent_message(&mut self, frame: Frame, cx: &mut Cx) {
        let air = is_air_update(&frame);
        if !air && !of_a_generation(&frame) {
            return cx.to_client(frame);
        }
        // The session and the update where they lie; a continued subagent's session renamed where it lies.
        let sid = frame.session().map(Cow::into_owned);
        if air
            && let (Some(sid), Some(name), Some(update)) = (&sid, frame.session_update(), frame.update_value())
            && self.air_update(sid, name, update, cx)
        {
            return;
        }
        match sid {
            Some(sid) if stable(&sid) != sid => cx.to_client(frame.with_session(stable(&sid))),
            _ => cx.to_client(frame),
        }
    }
}

/// Whether a frame is one of AIR's own updates (a task's or a subagent's), which become reports.
fn is_air_update(frame: &Frame) -> bool {
    frame.is_notification("session/update")
        && frame.session_update().is_some_and(|k| k.starts_with("subagent_") || k.starts_with("async_task_"))
}

/// `map[key]` as an object, replacing whatever non-object was there.
impl Layer for Air {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = TaskStop;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        let method = match frame.kind() {
            Kind::Request { method, .. } => method.as_str(),
            Kind::Notification { method } => method.as_str(),
            _ => return cx.to_agent(frame),
        };
        match method {
            "initialize" => self.client_initialize(frame, cx),
            "_coda/wait/stop" => self.stop(frame, cx),
            "_session/steering" => self.steering(frame, cx),
            _ if self.subagents.values().any(|s| s.current.contains(GENERATION)) => {
                let mut value = frame.to_value();
                let changed = value.get_mut("params").and_then(Value::as_object_mut).is_some_and(|p| self.address(p));
                if changed { cx.to_agent(frame.rewritten(value)) } else { cx.to_agent(frame) }
            }
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => {
                let request = cx.answer_to(&frame).map(|r| r.method.clone());
                if request.as_deref() == Some("initialize") {
                    return self.initialized(frame, cx);
                }
                if request.as_deref().is_some_and(loads) {
                    self.flush_held(cx);
                }
                cx.to_client(frame)
            }
            Kind::Request { .. } | Kind::Notification { .. } => self.agent_message(frame, cx),
            Kind::Batch => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        // What `agent_message` leaves as it is: no AIR update, no continued subagent's session to rename.
        !matches!(frame.kind(), Kind::Response { .. }) && !is_air_update(frame) && !of_a_generation(frame)
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }

    /// A closed session's waits ended with it (the engine's waits layer told Coda): what is kept of them, and of
    /// its subagents, goes.
    fn session_closed(&mut self, closed: &[String], _cx: &mut Cx) {
        let gone = |s: &str| closed.iter().any(|c| c == s);
        self.subagents.retain(|id, s| !gone(id) && !gone(&s.parent));
        self.waits.retain(|_, w| !gone(&w.session));
        self.by_wait.retain(|(session, _), _| !gone(session));
        self.held.retain(|(_, w)| !gone(&w.session_id));
        self.register.forget(gone);
    }

    fn kept(&self) -> usize {
        self.subagents.len() + self.waits.len() + self.by_wait.len() + self.held.len()
    }

    fn on_reply(&mut self, _: TaskStop, reply: Frame, _cx: &mut Cx) {
        let value = reply.value();
        match value.pointer("/result/stopped").and_then(Value::as_bool) {
            Some(true) => tracing::debug!("codex-acp is stopping the background command"),
            _ => {
                tracing::warn!("codex-acp did not stop the background command (its answer is logged at debug)");
                tracing::debug!("codex-acp's answer to the stop: {value}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::identity::{Identity, Policy, Probed};
    use crate::coda::wait::{MAX_DETAIL, MAX_TITLE, MAX_WAIT_ID};
    use crate::coda::waits::Waits;
    use crate::layer::testing::Harness;

    const ROOT: &str = "root-1";

    fn update(session: &str, update: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":update}})
    }

    /// The layer under the engine's `Waits` and Codex's identity layer, as in the binary.
    fn harness(identity: Identity) -> Harness {
        Harness::new(vec![Box::new(Waits::new()), Box::new(identity), Box::new(Air::new())])
    }

    fn codex(version: Option<&str>) -> Identity {
        Identity::new("codex", Policy::Replace, version.map(Into::into))
    }

    /// A harness with the layer, after a Coda-style initialize.
    fn started() -> Harness {
        let mut h = harness(codex(Some("0.166.0")));
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,
            "clientCapabilities":{"_meta":{"coda":{"waits":{}}}}}});
        h.from_client(init);
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,
            "_meta":{"jetbrains":{"air":{"version":1,"capabilities":["sessionFailure","nativeSubagentSessions","asyncTasks"]}}}}}));
        h.take();
        h
    }

    /// A frame from codex-acp: what Coda gets.
    fn from_agent(h: &mut Harness, frame: Value) -> Vec<Value> {
        h.from_agent(frame);
        let to_client = h.to_client();
        h.take();
        to_client
    }

    /// A frame from Coda: (what codex-acp gets, what Coda gets).
    fn from_client(h: &mut Harness, frame: Value) -> (Vec<Value>, Vec<Value>) {
        h.from_client(frame);
        (h.to_agent(), h.to_client())
    }

    fn stop(h: &mut Harness, id: u64, params: Value) -> (Vec<Value>, Vec<Value>) {
        from_client(h, json!({"jsonrpc":"2.0","id":id,"method":"_coda/wait/stop","params":params}))
    }

    /// `subagent_spawned` of subagent `id` ("W") on the root session.
    fn subagent(id: &str, capabilities: Value) -> Value {
        update(
            ROOT,
            json!({"sessionUpdate":"subagent_spawned","subagentSessionId":id,"name":"W","capabilities":capabilities}),
        )
    }

    #[test]
    fn initialize_declares_air_and_answers_with_codex_identity_and_waits() {
        let mut h = harness(codex(Some("0.166.0")));
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":
            {"fs":{"readTextFile":true},"_meta":{"coda":{"waits":{}},"jetbrains":{"air":{"version":1,"capabilities":["diffPatch"]}}}}}});
        h.from_client(init);
        let sent = &h.to_agent()[0];
        assert_eq!(
            sent["params"]["clientCapabilities"],
            json!({"fs":{"readTextFile":true},"_meta":{"coda":{"waits":{}},"jetbrains":{"air":{"version":1,
                "capabilities":["diffPatch","nativeSubagentSessions","asyncTasks","sessionFailure"]}}}})
        );
        let answer = json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,
            "agentInfo":{"name":"@agentclientprotocol/codex-acp","title":"Codex","version":"2.6.0"},
            "agentCapabilities":{"loadSession":true,"sessionCapabilities":{"systemPrompt":{}},"_meta":{"authStatus":{}}},
            "_meta":{"steering":{"supported":true},"jetbrains":{"air":{"version":1,"capabilities":["nativeSubagentSessions","asyncTasks"]}}}}});
        let out = from_agent(&mut h, answer);
        let result = &out[0]["result"];
        assert_eq!(result["agentInfo"], json!({"name":"codex","version":"0.166.0"}));
        assert_eq!(result["agentCapabilities"]["_meta"], json!({"authStatus":{},"coda":{"waits":{}}}));
        assert_eq!(result["agentCapabilities"]["sessionCapabilities"], json!({"systemPrompt":{}}));
        assert_eq!(result["_meta"]["steering"], json!({"supported":true}));
    }

    #[test]
    fn a_build_without_air_gets_no_waits_declaration_and_unknown_version_drops_agent_info() {
        let mut h = harness(codex(None));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}));
        let answer = json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,
            "agentInfo":{"name":"codex-acp","title":"Codex","version":"0.16.0"},"agentCapabilities":{"loadSession":true}}});
        let out = from_agent(&mut h, answer);
        assert_eq!(out[0]["result"], json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true}}));
    }

    #[test]
    fn an_answer_faster_than_the_version_probe_waits_for_it_in_order() {
        for release in [Some("0.166.0"), None] {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            let mut h = harness(Identity::awaiting("codex", Policy::Replace, deadline));
            h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
            let answer = json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentInfo":{"name":"a","version":"2.6.0"}}});
            assert!(from_agent(&mut h, answer).is_empty());
            let after = json!({"jsonrpc":"2.0","method":"_auth/status_update","params":{}});
            assert!(from_agent(&mut h, after.clone()).is_empty());
            match release {
                Some(v) => h.event(1, Probed(Some(v.into()))),
                None => {
                    // The probe hangs: given up on at its deadline.
                    let left = deadline.saturating_duration_since(h.now());
                    h.advance(left);
                }
            }
            let out = h.to_client();
            assert_eq!(out.len(), 2);
            assert_eq!(
                out[0]["result"].get("agentInfo"),
                release.map(|v| json!({"name":"codex","version":v})).as_ref()
            );
            assert_eq!(out[1], after);
        }
    }

    #[test]
    fn background_command_becomes_a_task_wait_and_ends_after_the_turn() {
        let mut h = started();
        from_client(
            &mut h,
            json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":ROOT,"prompt":[]}}),
        );
        let spawned = update(
            ROOT,
            json!({"sessionUpdate":"async_task_spawned","asyncTaskId":"call_2","name":"sleep 4",
            "taskType":"shell","showInTranscript":false,"canStop":true,"toolCallId":"call_2"}),
        );
        assert_eq!(
            from_agent(&mut h, spawned),
            vec![
                json!({"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":ROOT,"waitId":"call_2","kind":"task",
                "state":"waiting","title":"sleep 4","toolCallId":"call_2","stoppable":true}})
            ]
        );
        let prompt_done = json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}});
        assert_eq!(from_agent(&mut h, prompt_done).len(), 1);
        {
            let (state, coda) = ("completed", "done");
            let end = update(
                ROOT,
                json!({"sessionUpdate":"async_task_state_update","asyncTaskId":"call_2","state":state,"toolCallId":"call_2"}),
            );
            assert_eq!(
                from_agent(&mut h, end),
                vec![
                    json!({"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":ROOT,"waitId":"call_2","state":coda}})
                ]
            );
        }
        // Terminal is final: a late duplicate says nothing.
        let again =
            update(ROOT, json!({"sessionUpdate":"async_task_state_update","asyncTaskId":"call_2","state":"failed"}));
        assert!(from_agent(&mut h, again).is_empty());
    }

    #[test]
    fn task_states_map_failed_and_stopped() {
        let mut h = started();
        for (id, state, coda) in [("a", "failed", "failed"), ("b", "stopped", "cancelled")] {
            let spawned =
                update(ROOT, json!({"sessionUpdate":"async_task_spawned","asyncTaskId":id,"name":"x","canStop":true}));
            from_agent(&mut h, spawned);
            let end = update(ROOT, json!({"sessionUpdate":"async_task_state_update","asyncTaskId":id,"state":state}));
            assert_eq!(from_agent(&mut h, end)[0]["params"]["state"], coda);
        }
    }

    #[test]
    fn a_first_report_is_never_terminal() {
        let mut h = started();
        let end =
            update(ROOT, json!({"sessionUpdate":"async_task_state_update","asyncTaskId":"ghost","state":"completed"}));
        assert!(from_agent(&mut h, end).is_empty());
        let end = update(
            ROOT,
            json!({"sessionUpdate":"subagent_state_update","subagentSessionId":"ghost","state":"completed"}),
        );
        assert!(from_agent(&mut h, end).is_empty());
    }

    /// A session id is of a generation exactly when its text holds `:generation:`, however it is written: at
    /// either end, after other colons, escaped, or cut short.
    #[test]
    fn a_generation_is_told_by_the_session_ids_text() {
        for (id, written) in [
            ("s1", r#""s1""#),
            ("s1:generation:2", r#""s1:generation:2""#),
            (":generation:", r#"":generation:""#),
            ("a:b::generation:", r#""a:b::generation:""#),
            ("a:generation", r#""a:generation""#),
            ("a:generatio:n:", r#""a:generatio:n:""#),
            ("s1:generation:2", r#""s1\u003ageneration:2""#),
            ("s1:generation:2", r#""s1\u003Ageneration\u003a2""#),
            ("", r#""""#),
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{written}}}}}"#);
            let frame = Frame::parse(line.clone().into_bytes()).expect("a frame");
            assert_eq!(of_a_generation(&frame), id.contains(GENERATION), "{line}");
        }
    }

    #[test]
    fn subagent_generations_are_one_child_session_with_a_wait_per_run() {
        let mut h = started();
        let spawn = |id: &str| {
            update(
                ROOT,
                json!({"sessionUpdate":"subagent_spawned","subagentSessionId":id,"name":"Worker bee",
                "task":"say hi","capabilities":{}}),
            )
        };
        let first = from_agent(&mut h, spawn("X"));
        assert_eq!(
            first,
            vec![
                json!({"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":ROOT,"waitId":"X","kind":"subagent",
                "state":"waiting","title":"Worker bee","detail":"say hi","stoppable":false,"childSessionId":"X"}})
            ]
        );
        let end =
            update(ROOT, json!({"sessionUpdate":"subagent_state_update","subagentSessionId":"X","state":"completed"}));
        assert_eq!(from_agent(&mut h, end)[0]["params"], json!({"sessionId":ROOT,"waitId":"X","state":"done"}));
        let second = from_agent(&mut h, spawn("X:generation:2"));
        assert_eq!(second[0]["params"]["waitId"], "X:generation:2");
        assert_eq!(second[0]["params"]["childSessionId"], "X");
        // The child's own traffic is session X.
        let chunk = update(
            "X:generation:2",
            json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}),
        );
        assert_eq!(from_agent(&mut h, chunk)[0]["params"]["sessionId"], "X");
        let ask = json!({"jsonrpc":"2.0","id":"p1","method":"session/request_permission",
            "params":{"sessionId":"X:generation:2","toolCall":{"toolCallId":"t"},"options":[]}});
        let out = from_agent(&mut h, ask);
        assert_eq!(out[0]["params"]["sessionId"], "X");
        assert_eq!(out[0]["id"], "p1");
        // Coda's frames for X go to the current generation.
        let (to_agent, _) =
            from_client(&mut h, json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"X"}}));
        assert_eq!(to_agent[0]["params"]["sessionId"], "X:generation:2");
        {
            let (state, coda) = ("disconnected", "failed");
            let end = update(
                ROOT,
                json!({"sessionUpdate":"subagent_state_update","subagentSessionId":"X:generation:2","state":state}),
            );
            assert_eq!(from_agent(&mut h, end)[0]["params"]["state"], coda);
        }
    }

    #[test]
    fn a_later_generation_seen_first_is_a_valid_first_sighting() {
        let mut h = started();
        let out = from_agent(&mut h, subagent("Y:generation:2", json!({})));
        assert_eq!(out[0]["params"]["childSessionId"], "Y");
        assert_eq!(out[0]["params"]["state"], "waiting");
    }

    #[test]
    fn a_subagent_is_stoppable_when_its_cancel_capability_is_an_object_and_only_then() {
        for (n, (capabilities, stoppable)) in [
            (json!({"cancel":{}}), true),
            (json!({"cancel":{"reason":true},"other":1}), true),
            (json!({"cancel":null}), false),
            (json!({"cancel":true}), false),
            (json!({"cancel":[]}), false),
            (json!({}), false),
            (json!("cancel"), false),
        ]
        .into_iter()
        .enumerate()
        {
            let mut h = started();
            let out = from_agent(&mut h, subagent(&format!("S{n}"), capabilities.clone()));
            assert_eq!(out[0]["params"]["stoppable"], stoppable, "{capabilities}");
        }
    }

    #[test]
    fn stopping_a_task_asks_codex_on_the_root_session_and_answers_at_once() {
        let mut h = started();
        // A task of a subagent's thread is published on the child session.
        from_agent(&mut h, subagent("X", json!({})));
        let spawned = update(
            "X",
            json!({"sessionUpdate":"async_task_spawned","asyncTaskId":"X:call_9","name":"sleep 30","canStop":true,"toolCallId":"call_9"}),
        );
        assert_eq!(from_agent(&mut h, spawned)[0]["params"]["sessionId"], "X");
        let (to_agent, to_client) = stop(&mut h, 8, json!({"sessionId":"X","waitId":"X:call_9"}));
        let asked = &to_agent[0];
        assert_eq!(asked["method"], "_session/async_task/stop");
        assert_eq!(asked["params"], json!({"sessionId":ROOT,"asyncTaskId":"X:call_9"}));
        assert_eq!(to_client, vec![json!({"jsonrpc":"2.0","id":8,"result":{}})]);
        // Its reply is the shim's own, never forwarded.
        let reply = json!({"jsonrpc":"2.0","id":asked["id"],"result":{"stopped":true}});
        assert!(from_agent(&mut h, reply).is_empty());
    }

    #[test]
    fn stop_of_anything_else_is_invalid_params() {
        let mut h = started();
        from_agent(&mut h, subagent("X", json!({})));
        from_agent(
            &mut h,
            update(ROOT, json!({"sessionUpdate":"async_task_spawned","asyncTaskId":"t","canStop":false})),
        );
        for params in [
            json!({"sessionId":ROOT,"waitId":"X"}),
            json!({"sessionId":ROOT,"waitId":"t"}),
            json!({"sessionId":ROOT,"waitId":"nope"}),
            json!({"sessionId":ROOT}),
        ] {
            let (to_agent, to_client) = stop(&mut h, 2, params);
            assert!(to_agent.is_empty());
            assert_eq!(to_client[0]["error"]["code"], -32602);
        }
    }

    #[test]
    fn a_cancellable_subagent_is_stopped_with_session_cancel_of_its_generation() {
        let mut h = started();
        from_agent(&mut h, subagent("X:generation:3", json!({"cancel":{}})));
        let (to_agent, to_client) = stop(&mut h, 2, json!({"sessionId":ROOT,"waitId":"X:generation:3"}));
        assert_eq!(
            to_agent,
            vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"X:generation:3"}})]
        );
        assert_eq!(to_client, vec![json!({"jsonrpc":"2.0","id":2,"result":{}})]);
    }

    #[test]
    fn steering_always_asks_for_prompt_required() {
        let mut h = started();
        let steer =
            json!({"jsonrpc":"2.0","id":3,"method":"_session/steering","params":{"sessionId":ROOT,"prompt":[]}});
        let (to_agent, _) = from_client(&mut h, steer);
        assert_eq!(to_agent[0]["params"]["_meta"], json!({"steering":{"idleBehavior":"promptRequired"}}));
        let given = json!({"jsonrpc":"2.0","id":4,"method":"_session/steering","params":{"sessionId":ROOT,"prompt":[],"_meta":{"steering":{"idleBehavior":"promptRequired"}}}});
        assert_eq!(from_client(&mut h, given.clone()).0, vec![given]);
    }

    #[test]
    fn children_that_begin_and_end_inside_a_load_are_history_not_activity() {
        let mut h = started();
        from_client(&mut h, json!({"jsonrpc":"2.0","id":9,"method":"session/load","params":{"sessionId":ROOT}}));
        assert!(from_agent(&mut h, subagent("X", json!({}))).is_empty());
        assert!(
            from_agent(
                &mut h,
                update(
                    ROOT,
                    json!({"sessionUpdate":"subagent_state_update","subagentSessionId":"X","state":"completed"})
                )
            )
            .is_empty()
        );
        assert!(from_agent(&mut h, subagent("X:generation:2", json!({}))).is_empty());
        assert!(from_agent(&mut h, update(ROOT, json!({"sessionUpdate":"subagent_state_update","subagentSessionId":"X:generation:2","state":"disconnected"}))).is_empty());
        let history = update(
            "X:generation:2",
            json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}),
        );
        assert_eq!(from_agent(&mut h, history)[0]["params"]["sessionId"], "X");
        let out = from_agent(&mut h, json!({"jsonrpc":"2.0","id":9,"result":{}}));
        assert_eq!(out, vec![json!({"jsonrpc":"2.0","id":9,"result":{}})]);
    }

    #[test]
    fn no_waits_for_a_client_that_did_not_ask_but_air_updates_are_still_consumed() {
        for caps in [json!({}), json!({"_meta":{"coda":{"waits":null}}})] {
            let mut h = harness(codex(Some("0.166.0")));
            h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"clientCapabilities":caps}}));
            let spawned = update(ROOT, json!({"sessionUpdate":"async_task_spawned","asyncTaskId":"a","canStop":true}));
            assert!(from_agent(&mut h, spawned).is_empty());
        }
    }

    #[test]
    fn long_fields_are_cut_on_character_boundaries_and_an_over_long_wait_id_is_not_sent() {
        let mut h = started();
        let long: String = "é".repeat(5000);
        let spawn = |id: String| {
            update(
                ROOT,
                json!({"sessionUpdate":"subagent_spawned","subagentSessionId":id,"name":long,"task":long,"capabilities":{}}),
            )
        };
        let out = from_agent(&mut h, spawn("ü".repeat(MAX_WAIT_ID)));
        let p = &out[0]["params"];
        assert_eq!(p["waitId"], "ü".repeat(MAX_WAIT_ID));
        assert_eq!(p["title"].as_str().map(|s| s.chars().count()), Some(MAX_TITLE));
        assert_eq!(p["detail"].as_str().map(|s| s.chars().count()), Some(MAX_DETAIL));
        // Cutting a waitId could make two waits one; Coda would drop it whole, so it is not sent.
        assert!(from_agent(&mut h, spawn("ü".repeat(MAX_WAIT_ID + 1))).is_empty());
    }

    #[test]
    fn a_wait_that_ended_is_never_reopened() {
        let mut h = started();
        let spawned = update(ROOT, json!({"sessionUpdate":"async_task_spawned","asyncTaskId":"t","canStop":true}));
        assert_eq!(from_agent(&mut h, spawned.clone()).len(), 1);
        let end =
            update(ROOT, json!({"sessionUpdate":"async_task_state_update","asyncTaskId":"t","state":"completed"}));
        assert_eq!(from_agent(&mut h, end)[0]["params"]["state"], "done");
        assert!(from_agent(&mut h, spawned).is_empty(), "a terminal state is final");
        let (to_agent, to_client) = stop(&mut h, 3, json!({"sessionId":ROOT,"waitId":"t"}));
        assert!(to_agent.is_empty(), "nothing left to stop");
        assert_eq!(to_client, vec![json!({"jsonrpc":"2.0","id":3,"result":{}})]);
    }
}

//! ACP's standard subagent sessions turned into Coda's activity reports, for any binary whose agent speaks them.
//!
//! ACP (subagents, stable since 2026-11-20) lets an agent expose a subagent as a child session: it announces the
//! child with a `subagent_update` on the parent session (child `sessionId`, `title`, `description`,
//! `capabilities`, `state`; patch semantics: an omitted field is unchanged, `null` clears it), before any traffic
//! of that child, and then sends the child's messages, tool calls and requests under the child's own
//! `sessionId`. A v1 client opts in with `clientCapabilities.subagents: {}`; a client may stop a child's current
//! work with `session/cancel` of the child when the child advertises `capabilities.cancel`.
//!
//! Coda (1.0.0) declares no `subagents`; it takes a child session it learnt from a `_coda/wait` report's
//! `childSessionId` (section "Agent 活动"). So, when the client declared `_meta.coda.waits` and not
//! `subagents`, [`Subagents`] declares `subagents: {}` to the agent on the client's behalf and owns what that
//! brings:
//!
//! - a `subagent_update` never reaches the client; a child whose `state` says it works (`running`,
//!   `requires_action`) is reported as a wait `kind: subagent` on the session the update came on (the child's
//!   immediate parent), with `childSessionId`, `title` (the child's title, else its description),
//!   `detail` (its description), and `stoppable` while the child advertises `cancel`. The report takes the
//!   update's place, so it comes before any traffic of the child, as ACP orders it;
//! - the child going `idle` ends the wait: `done`, or `cancelled` for the stop reason `cancelled`, `failed` for
//!   `error`. A child that works again later (ACP lets a parent reuse a child) is a new run of the same child
//!   (rule 5): a new `waitId`, the same `childSessionId`. `state: null` and `unknown` change nothing;
//! - the child's model, the `currentValue` of the `category: model` option of its `config_option_update`s, is
//!   the wait's `model`;
//! - the child's traffic already carries the child's `sessionId` and reaches the client as that child's; the
//!   `session_message` that gives a child its task (on the child, with the child as recipient) becomes the
//!   child's `user_message_chunk`s, one per content block, the way Coda shows a subagent's input;
//! - `_coda/wait/stop` of such a wait sends `session/cancel` for the child and answers `{}`; the child's next
//!   `subagent_update` (`idle`, `cancelled`) ends the wait;
//! - a `session/close` the agent answered with a result ends the open waits of that session and of its
//!   children's sessions (`cancelled`): the session's work ended with it.
//!
//! A client that declares `subagents` itself gets everything untouched, and so does one that did not declare
//! waits (the agent is then not told about `subagents`, so it sends none).

use crate::{HashMap, HashSet};
use std::convert::Infallible;

use serde_json::{Map, Value, json};

use crate::coda::wait::{self, Register, State, Wait};
use crate::frame::{self, Frame, Kind};
use crate::json;
use crate::layer::{Cx, Layer};

/// The `sessionUpdate` that announces and updates a child.
pub const UPDATE: &str = "subagent_update";
/// Most children remembered; past it, children with no open run are forgotten first.
const MAX_CHILDREN: usize = 4096;
/// Longest child session id used as its waits' id; longer ones get a counted id.
const MAX_ID_IN_WAIT_ID: usize = 180;

/// What the updates so far said about one child session.
#[derive(Debug, Default)]
struct Child {
    /// The session the child was announced on (its immediate parent).
    parent: String,
    title: Option<String>,
    description: Option<String>,
    stoppable: bool,
    /// The `currentValue` of the child's `category: model` config option, from its `config_option_update`.
    model: Option<String>,
    /// Runs started so far.
    runs: u32,
    /// The `waitId` of the run in progress.
    open: Option<String>,
    /// The base of its waits' ids.
    id: String,
}

impl Child {
    fn wait(&self, wait_id: &str, state: State) -> Wait {
        let mut wait = Wait::new(&self.parent, wait_id, state);
        wait.kind = Some("subagent".into());
        wait.title = Some(self.title.clone().or_else(|| self.description.clone()).unwrap_or_else(|| "Subagent".into()));
        wait.detail = self.description.clone().filter(|_| self.title.is_some());
        wait.stoppable = Some(self.stoppable);
        wait.model = self.model.clone();
        wait
    }
}

/// Standard subagent sessions as `_coda/wait` (see the module docs). Sits below [`crate::coda::waits::Waits`].
#[derive(Default)]
pub struct Subagents {
    /// The shim declared `subagents` to the agent for the latest `initialize`.
    translating: bool,
    /// By child session id.
    children: HashMap<String, Child>,
    register: Register,
    /// Counted ids given so far (for child ids too long to be a wait id).
    counted: u64,
}

impl Subagents {
    pub fn new() -> Subagents {
        Subagents::default()
    }

    fn initialize(&mut self, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        let params = value.get("params").unwrap_or(&Value::Null);
        let own = params.pointer("/clientCapabilities/subagents").is_some_and(|s| !s.is_null());
        self.translating = !own && wait::client_declares_waits(params);
        if !self.translating {
            return cx.to_agent(frame);
        }
        let mut value = frame.to_value();
        let Some(caps) = value.pointer_mut("/params/clientCapabilities").and_then(Value::as_object_mut) else {
            // No capabilities object to add to: the client declared waits, so there is one; a frame that reads
            // otherwise is passed on as it came.
            self.translating = false;
            return cx.to_agent(frame);
        };
        caps.insert("subagents".into(), json!({}));
        cx.to_agent(frame.rewritten(value))
    }

    /// A `subagent_update` on `parent`: remembered, reported as a wait where it says so, never passed on.
    fn update(&mut self, parent: &str, update: &Map<String, Value>, cx: &mut Cx) {
        let Some(child_id) = update.get("sessionId").and_then(Value::as_str) else {
            tracing::warn!("a subagent_update without a string sessionId dropped");
            return;
        };
        if child_id == parent {
            tracing::warn!("a subagent_update naming its own session as the child dropped");
            return;
        }
        self.make_room();
        let counted = &mut self.counted;
        let child = self.children.entry(child_id.to_owned()).or_insert_with(|| {
            let id = if child_id.chars().count() <= MAX_ID_IN_WAIT_ID {
                child_id.to_owned()
            } else {
                *counted += 1;
                format!("subagent-{counted}")
            };
            Child { parent: parent.to_owned(), id, ..Child::default() }
        });
        let text = |key: &str, now: &mut Option<String>| match update.get(key) {
            Some(Value::String(s)) => *now = Some(s.clone()),
            Some(Value::Null) => *now = None,
            _ => {}
        };
        text("title", &mut child.title);
        text("description", &mut child.description);
        match update.get("capabilities") {
            Some(Value::Object(caps)) => child.stoppable = caps.get("cancel").is_some_and(Value::is_object),
            Some(Value::Null) => child.stoppable = false,
            _ => {}
        }
        let state = update.get("state").and_then(|s| s.get("state")).and_then(Value::as_str);
        let report = match (state, &child.open) {
            (Some("running" | "requires_action"), None) => {
                child.runs += 1;
                let wait_id = match child.runs {
                    1 => child.id.clone(),
                    n => format!("{}#{n}", child.id),
                };
                child.open = Some(wait_id.clone());
                let mut wait = child.wait(&wait_id, State::Waiting);
                wait.child_session_id = Some(child_id.to_owned());
                Some(wait)
            }
            (Some("idle"), Some(open)) => {
                let end = match update.get("state").and_then(|s| s.get("stopReason")).and_then(Value::as_str) {
                    Some("cancelled") => State::Cancelled,
                    Some("error") => State::Failed,
                    _ => State::Done,
                };
                let wait = child.wait(open, end);
                child.open = None;
                Some(wait)
            }
            // Labels or the stop capability changed during a run.
            (_, Some(open)) => Some(child.wait(open, State::Waiting)),
            _ => None,
        };
        if let Some(frame) = report.and_then(|w| self.register.report(&w)) {
            cx.to_client(frame);
        }
    }

    /// A child's `config_option_update`: its model, for the wait of the run in progress. Passed on as it came.
    fn config(&mut self, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        let session = value.pointer("/params/sessionId").and_then(Value::as_str);
        let model = value
            .pointer("/params/update/configOptions")
            .and_then(Value::as_array)
            .and_then(|options| options.iter().find(|o| o.get("category").and_then(Value::as_str) == Some("model")))
            .and_then(|o| o.get("currentValue"))
            .and_then(Value::as_str);
        let report = match (session.and_then(|s| self.children.get_mut(s)), model) {
            (Some(child), Some(model)) => {
                child.model = Some(model.to_owned());
                child.open.clone().map(|open| child.wait(&open, State::Waiting))
            }
            _ => None,
        };
        cx.to_client(frame);
        if let Some(frame) = report.and_then(|w| self.register.report(&w)) {
            cx.to_client(frame);
        }
    }

    /// Forgets children with no run in progress once there are too many.
    fn make_room(&mut self) {
        if self.children.len() < MAX_CHILDREN {
            return;
        }
        self.children.retain(|_, c| c.open.is_some());
        if self.children.len() >= MAX_CHILDREN {
            tracing::warn!("over {MAX_CHILDREN} subagent sessions at work at once; forgetting them all");
            self.children.clear();
        }
    }

    /// The task a parent gave its child (`session_message` on the child, to the child) as the child's user
    /// message; any other `session_message` passes as it came.
    fn message(&mut self, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        let session = value.pointer("/params/sessionId").and_then(Value::as_str);
        let update = value.pointer("/params/update");
        let recipient = update.and_then(|u| u.get("recipientSessionId")).and_then(Value::as_str);
        let (Some(session), Some(update)) = (session, update) else { return cx.to_client(frame) };
        if recipient != Some(session) || !self.children.contains_key(session) {
            return cx.to_client(frame);
        }
        let blocks = update.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
        let message_id = update.get("messageId").cloned();
        for block in blocks {
            let mut chunk = json::object([("sessionUpdate", "user_message_chunk".into()), ("content", block)]);
            if let Some(id) = &message_id {
                chunk["messageId"] = id.clone();
            }
            let params = json::object([("sessionId", session.into()), ("update", chunk)]);
            cx.to_client(frame::notification("session/update", params));
        }
    }

    /// The agent closed `session`: the open runs of its children, and of theirs, end with it.
    fn closed(&mut self, session: &str, cx: &mut Cx) {
        let mut gone: HashSet<String> = HashSet::from_iter([session.to_owned()]);
        loop {
            let more: Vec<String> = self
                .children
                .iter()
                .filter(|(id, c)| gone.contains(&c.parent) && !gone.contains(*id))
                .map(|(id, _)| id.clone())
                .collect();
            if more.is_empty() {
                break;
            }
            gone.extend(more);
        }
        let mut ended = Vec::new();
        for (id, child) in self.children.iter_mut().filter(|(id, _)| gone.contains(*id)) {
            if let Some(open) = child.open.take() {
                ended.push(child.wait(&open, State::Cancelled));
            }
            tracing::debug!(child = %id, "a subagent session ended with its parent's session/close");
        }
        self.children.retain(|id, _| !gone.contains(id));
        for wait in ended {
            if let Some(frame) = self.register.report(&wait) {
                cx.to_client(frame);
            }
        }
        self.register.forget(|s| gone.contains(s));
    }

    /// `_coda/wait/stop` of a run this layer reported: `session/cancel` of the child, `{}` to the client.
    fn stop(&mut self, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        let text = |key: &str| value.pointer(&format!("/params/{key}")).and_then(Value::as_str);
        let (Some(id), Some(session), Some(wait_id)) = (frame.id().cloned(), text("sessionId"), text("waitId")) else {
            return cx.to_agent(frame);
        };
        let child = self
            .children
            .iter()
            .find(|(_, c)| c.parent == session && c.open.as_deref() == Some(wait_id) && c.stoppable)
            .map(|(id, _)| id.clone());
        let Some(child) = child else { return cx.to_agent(frame) };
        cx.to_agent(frame::notification("session/cancel", json!({"sessionId": child})));
        cx.to_client(frame::result_response(&id, json!({})));
    }
}

impl Layer for Subagents {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Request { method, .. } if method == "initialize" => self.initialize(frame, cx),
            Kind::Request { method, .. } if method == wait::STOP_METHOD && self.translating => self.stop(frame, cx),
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        if !self.translating {
            return cx.to_client(frame);
        }
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => match frame.session_update() {
                Some(UPDATE) => {
                    let value = frame.value();
                    let parent = value.pointer("/params/sessionId").and_then(Value::as_str);
                    let update = value.pointer("/params/update").and_then(Value::as_object);
                    match (parent, update) {
                        (Some(parent), Some(update)) => {
                            let (parent, update) = (parent.to_owned(), update.clone());
                            self.update(&parent, &update, cx)
                        }
                        _ => tracing::warn!("a subagent_update without a string sessionId on its parent dropped"),
                    }
                }
                Some("session_message") => self.message(frame, cx),
                Some("config_option_update") if !self.children.is_empty() => self.config(frame, cx),
                _ => cx.to_client(frame),
            },
            _ => cx.to_client(frame),
        }
    }

    fn session_closed(&mut self, closed: &[String], cx: &mut Cx) {
        for session in closed {
            self.closed(session, cx);
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        if !self.translating || frame.is_streamed_chunk() {
            return true;
        }
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => match frame.session_update() {
                Some(UPDATE | "session_message") => false,
                Some("config_option_update") => self.children.is_empty(),
                _ => true,
            },
            Kind::Response { .. } => self.children.is_empty(),
            _ => true,
        }
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    const CODA_CAPS: &str = r#"{"_meta":{"coda":{"waits":{}}},"fs":{"readTextFile":true}}"#;

    fn update(parent: &str, update: Value) -> Value {
        let mut update = update;
        update["sessionUpdate"] = json!(UPDATE);
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":parent,"update":update}})
    }

    fn translating() -> Harness {
        let mut h = Harness::of(Subagents::new());
        let caps: Value = serde_json::from_str(CODA_CAPS).unwrap();
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":caps}}));
        let sent = h.to_agent();
        assert_eq!(sent[0]["params"]["clientCapabilities"]["subagents"], json!({}));
        assert_eq!(sent[0]["params"]["clientCapabilities"]["fs"], json!({"readTextFile":true}));
        h
    }

    #[test]
    fn subagents_are_declared_only_for_a_client_that_declared_waits_and_not_subagents() {
        for (caps, declared) in [
            (json!({}), false),
            (json!({"_meta":{"coda":{"waits":null}}}), false),
            (json!({"_meta":{"coda":{"waits":{}}},"subagents":{}}), true),
        ] {
            let mut h = Harness::of(Subagents::new());
            let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"clientCapabilities":caps}});
            h.from_client(init.clone());
            assert_eq!(h.to_agent(), vec![init], "passed on as it came");
            // Nothing is translated: the client gets the update itself.
            let u = update("s", json!({"sessionId":"c","state":{"state":"running"}}));
            h.from_agent(u.clone());
            assert_eq!(h.to_client(), vec![u], "{declared}");
        }
    }

    #[test]
    fn a_run_is_a_wait_from_running_to_idle_and_the_update_never_reaches_the_client() {
        let mut h = translating();
        h.from_agent(update(
            "s",
            json!({"sessionId":"c1","title":"评审","description":"review the diff",
            "capabilities":{"cancel":{}},"state":{"state":"running"}}),
        ));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":"s","waitId":"c1",
                "state":"waiting","kind":"subagent","title":"评审","detail":"review the diff","childSessionId":"c1",
                "stoppable":true}})]
        );
        // Waiting on a permission is still the same run; nothing changed, nothing is sent.
        h.from_agent(update("s", json!({"sessionId":"c1","state":{"state":"requires_action"}})));
        assert!(h.to_client().is_empty());
        // The child's own traffic is the child's.
        let chunk = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"c1",
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}});
        h.from_agent(chunk.clone());
        assert_eq!(h.to_client(), vec![chunk]);
        h.from_agent(update("s", json!({"sessionId":"c1","state":{"state":"idle","stopReason":"end_turn"}})));
        assert_eq!(
            h.to_client(),
            vec![
                json!({"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":"s","waitId":"c1","state":"done"}})
            ]
        );
        // Reused: a new run, a new waitId, the same child.
        h.from_agent(update("s", json!({"sessionId":"c1","state":{"state":"running"}})));
        let out = h.to_client();
        assert_eq!(out[0]["params"]["waitId"], "c1#2");
        assert_eq!(out[0]["params"]["childSessionId"], "c1");
        assert_eq!(out[0]["params"]["state"], "waiting");
        for (reason, state) in [("cancelled", "cancelled"), ("error", "failed")] {
            h.from_agent(update("s", json!({"sessionId":"c1","state":{"state":"idle","stopReason":reason}})));
            let out = h.to_client();
            assert_eq!(out.len(), 1);
            assert_eq!(out[0]["params"]["state"], state);
            h.from_agent(update("s", json!({"sessionId":"c1","state":{"state":"running"}})));
            h.to_client();
        }
    }

    #[test]
    fn patches_follow_acps_rules() {
        let mut h = translating();
        // Announced with no state: no run yet, no wait.
        h.from_agent(update("s", json!({"sessionId":"c","description":"d"})));
        assert!(h.to_client().is_empty());
        h.from_agent(update("s", json!({"sessionId":"c","state":{"state":"running"}})));
        let out = h.to_client();
        assert_eq!(out[0]["params"]["title"], "d", "the description stands in for a missing title");
        assert_eq!(out[0]["params"]["stoppable"], false, "no capabilities: nothing may be done to the child");
        // A null or unknown state confirms nothing: the run goes on.
        for state in [Value::Null, json!({"state":"unknown"}), json!({"state":"_vendor"})] {
            h.from_agent(update("s", json!({"sessionId":"c","state":state})));
            assert!(h.to_client().is_empty(), "{state}");
        }
        // Capabilities granted, then cleared.
        h.from_agent(update("s", json!({"sessionId":"c","capabilities":{"cancel":{}}})));
        assert_eq!(h.to_client()[0]["params"]["stoppable"], true);
        h.from_agent(update("s", json!({"sessionId":"c","capabilities":null})));
        assert_eq!(h.to_client()[0]["params"]["stoppable"], false);
        h.from_agent(update("s", json!({"sessionId":"c","title":"t"})));
        assert_eq!(h.to_client()[0]["params"]["title"], "t");
    }

    #[test]
    fn the_childs_model_goes_on_its_wait_and_its_config_update_goes_on_too() {
        let mut h = translating();
        h.from_agent(update("s", json!({"sessionId":"c","state":{"state":"running"}})));
        h.to_client();
        let config = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"c","update":{
            "sessionUpdate":"config_option_update","configOptions":[{"id":"agent","currentValue":"general-purpose"},
            {"id":"model","category":"model","currentValue":"fake-model","type":"select"}]}}});
        h.from_agent(config.clone());
        let out = h.to_client();
        assert_eq!(out[0], config);
        assert_eq!(out[1]["params"], json!({"sessionId":"s","waitId":"c","state":"waiting","model":"fake-model"}));
        // The same model again: nothing new to report. Another session's options: only passed on.
        h.from_agent(config.clone());
        assert_eq!(h.to_client(), vec![config]);
        let root = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{
            "sessionUpdate":"config_option_update","configOptions":[{"id":"model","category":"model","currentValue":"m2"}]}}});
        h.from_agent(root.clone());
        assert_eq!(h.to_client(), vec![root]);
    }

    #[test]
    fn a_stop_cancels_the_child_and_is_answered_at_once() {
        let mut h = translating();
        h.from_agent(update("s", json!({"sessionId":"c","capabilities":{"cancel":{}},"state":{"state":"running"}})));
        h.to_client();
        h.from_client(
            json!({"jsonrpc":"2.0","id":7,"method":"_coda/wait/stop","params":{"sessionId":"s","waitId":"c"}}),
        );
        assert_eq!(h.to_agent(), vec![json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"c"}})]);
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":7,"result":{}})]);
        // A stop of a wait of another layer goes on down.
        let other = json!({"jsonrpc":"2.0","id":8,"method":"_coda/wait/stop","params":{"sessionId":"s","waitId":"x"}});
        h.from_client(other.clone());
        assert_eq!(h.to_agent(), vec![other]);
    }

    #[test]
    fn races_of_a_stop_with_the_childs_own_end_and_with_a_close() {
        // The child ends on its own while the stop is on its way: the run is done, not cancelled, and the
        // client's stop still got its `{}` (a stop only says it was received).
        let mut h = translating();
        h.from_agent(update("s", json!({"sessionId":"c","capabilities":{"cancel":{}},"state":{"state":"running"}})));
        h.to_client();
        h.from_client(
            json!({"jsonrpc":"2.0","id":1,"method":"_coda/wait/stop","params":{"sessionId":"s","waitId":"c"}}),
        );
        assert_eq!(h.to_agent().len(), 1);
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":1,"result":{}})]);
        h.from_agent(update("s", json!({"sessionId":"c","state":{"state":"idle","stopReason":"end_turn"}})));
        assert_eq!(h.to_client()[0]["params"]["state"], "done");
        // A stop of the ended run goes on down (the engine's waits layer above answers it `{}`).
        let late = json!({"jsonrpc":"2.0","id":2,"method":"_coda/wait/stop","params":{"sessionId":"s","waitId":"c"}});
        h.from_client(late.clone());
        assert_eq!(h.to_agent(), vec![late]);
        // The session closes while a stop of its child is on its way: the close ends the run; the cancelled
        // child's own late `idle` changes nothing.
        h.from_agent(update("s", json!({"sessionId":"c","state":{"state":"running"}})));
        h.to_client();
        h.from_client(
            json!({"jsonrpc":"2.0","id":3,"method":"_coda/wait/stop","params":{"sessionId":"s","waitId":"c#2"}}),
        );
        h.from_client(json!({"jsonrpc":"2.0","id":4,"method":"session/close","params":{"sessionId":"s"}}));
        h.to_agent();
        h.to_client();
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"result":{}}));
        let out = h.to_client();
        assert_eq!(out[0]["params"], json!({"sessionId":"s","waitId":"c#2","state":"cancelled"}));
        assert_eq!(out[1]["id"], 4, "the close's answer after the waits it ended");
        h.from_agent(update("s", json!({"sessionId":"c","state":{"state":"idle","stopReason":"cancelled"}})));
        assert!(h.to_client().is_empty(), "the child was forgotten with its session");
    }

    #[test]
    fn the_childs_task_becomes_its_user_message_other_messages_pass() {
        let mut h = translating();
        h.from_agent(update("s", json!({"sessionId":"c","state":{"state":"running"}})));
        h.to_client();
        let incoming = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"c","update":{
            "sessionUpdate":"session_message","messageId":"toolu_1","senderSessionId":"s","recipientSessionId":"c",
            "content":[{"type":"text","text":"look at the tests"}]}}});
        h.from_agent(incoming);
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"c","update":{
                "sessionUpdate":"user_message_chunk","content":{"type":"text","text":"look at the tests"},
                "messageId":"toolu_1"}}})]
        );
        let outgoing = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{
            "sessionUpdate":"session_message","messageId":"toolu_1","senderSessionId":"s","recipientSessionId":"c",
            "content":[{"type":"text","text":"look at the tests"}]}}});
        h.from_agent(outgoing.clone());
        assert_eq!(h.to_client(), vec![outgoing]);
    }

    #[test]
    fn a_closed_session_ends_its_childrens_runs_and_theirs() {
        let mut h = translating();
        h.from_agent(update("s", json!({"sessionId":"c","state":{"state":"running"}})));
        h.from_agent(update("c", json!({"sessionId":"g","state":{"state":"running"}})));
        h.from_agent(update("other", json!({"sessionId":"o","state":{"state":"running"}})));
        assert_eq!(h.to_client().len(), 3);
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/close","params":{"sessionId":"s"}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":{}}));
        let out = h.to_client();
        assert_eq!(out.last(), Some(&json!({"jsonrpc":"2.0","id":3,"result":{}})), "the answer after the waits");
        let ended: HashSet<(String, String)> = out[..out.len() - 1]
            .iter()
            .map(|f| {
                (f["params"]["waitId"].as_str().unwrap().to_owned(), f["params"]["state"].as_str().unwrap().to_owned())
            })
            .collect();
        assert_eq!(ended, HashSet::from_iter([("c".into(), "cancelled".into()), ("g".into(), "cancelled".into())]));
    }

    #[test]
    fn hostile_updates_are_dropped_with_a_warning_never_passed_or_panicked_on() {
        let mut h = translating();
        for u in [
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":UPDATE}}}),
            update("s", json!({"sessionId":7,"state":{"state":"running"}})),
            update("s", json!({"sessionId":"s","state":{"state":"running"}})),
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":1,"update":{"sessionUpdate":UPDATE,"sessionId":"c"}}}),
            update("s", json!({"sessionId":"c","state":"running","title":{"x":1},"capabilities":[1]})),
        ] {
            h.from_agent(u);
        }
        assert!(h.to_client().is_empty());
        // A child id too long to be a wait id gets a counted one.
        let long = "子".repeat(300);
        h.from_agent(update("s", json!({"sessionId":long,"state":{"state":"running"}})));
        let out = h.to_client();
        assert_eq!(out[0]["params"]["waitId"], "subagent-1");
        assert_eq!(out[0]["params"]["childSessionId"], long.as_str());
    }
}

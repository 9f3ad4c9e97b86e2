//! Qwen Code 0.24.4's background shell commands as `_coda/wait` tasks, and its own turns for them as `handling`
//! (section Agent 活动). Read in its ACP agent (`acpAgent-*.js`: the background notification queue, its
//! `_qwencode/start_turn` admission and `_qwencode/end_turn`) and seen live through coda-acp:
//!
//! - A `run_shell_command` with `is_background: true` ends its tool call with the text `Background shell
//!   started.\nid: bg_…\npid: …\noutput file: <path>\n…`: a task `waiting`, titled with the command (the
//!   `rawInput.command` of that tool call, in its updates or its permission request), with the tool call's id and
//!   the output file.
//! - When the command ends, Qwen sends an `agent_message_chunk` with `_meta.backgroundTask {taskId, status,
//!   kind: "shell"}` (`completed`, `failed`, `cancelled`), then asks the client `_qwencode/start_turn {sessionId,
//!   source: "background_notification", kind, taskId, turnId, startedAt}` (a request it waits 2 s for; any answer
//!   but `{accepted: false}` admits the turn, -32601 too) and runs a turn of its own for it, ended by the
//!   notification `_qwencode/end_turn {sessionId, reason, turnId, source}`. coda-acp answers the request itself
//!   (`{accepted: true}`, Coda does not know the method), reports the task `handling` for that turn, and at its end
//!   the task's own end (`done`, `failed`, `cancelled` as the command ended). A start for a task it does not know
//!   (a goal turn, a background agent) goes on to Coda as it came.
//! - Qwen's background commands cannot be stopped over ACP: the tasks are not `stoppable`.
//!
//! Bounds: the commands remembered per tool call and the open tasks are at most [`MAX_KNOWN`] each (oldest
//! forgotten first); a session's go with it.

use std::collections::VecDeque;
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::wait::{Register, State, Wait};
use crate::frame::{self, Frame, Kind};
use crate::layer::{Cx, Layer};

/// Qwen's request to start a turn of its own, and the notification that ends it.
pub const START_TURN: &str = "_qwencode/start_turn";
pub const END_TURN: &str = "_qwencode/end_turn";

/// Tool calls' commands, and open tasks, remembered at most.
pub const MAX_KNOWN: usize = 256;

const STARTED: &str = "Background shell started.";

/// A background command Qwen runs.
struct Task {
    session: String,
    id: String,
    /// How the command ended, once Qwen said (`_meta.backgroundTask.status`).
    ended: Option<State>,
    /// Qwen's turn for it, once admitted.
    turn: Option<String>,
}

/// Qwen Code's background commands as tasks (see the module docs).
#[derive(Default)]
pub struct QwenTasks {
    /// `rawInput.command` by (session, toolCallId), oldest first.
    commands: VecDeque<((String, String), String)>,
    tasks: VecDeque<Task>,
    register: Register,
}

/// The `id:` and `output file:` of Qwen's text for a started background command.
fn started(text: &str) -> Option<(String, Option<String>)> {
    let rest = text.strip_prefix(STARTED)?;
    let field = |name: &str| rest.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned());
    let id = field("id: ").filter(|id| !id.is_empty())?;
    Some((id, field("output file: ").filter(|f| !f.is_empty())))
}

/// The texts of an update's `content` (a tool call's list of `{type: "content", content: {text}}`, or a block).
fn texts(update: &Value) -> Vec<&str> {
    match update.get("content") {
        Some(Value::Array(items)) => {
            items.iter().filter_map(|i| i.pointer("/content/text").and_then(Value::as_str)).collect()
        }
        Some(block) => block.get("text").and_then(Value::as_str).into_iter().collect(),
        None => Vec::new(),
    }
}

impl QwenTasks {
    pub fn new() -> QwenTasks {
        QwenTasks::default()
    }

    fn remember_command(&mut self, session: &str, call: &Value) {
        let (Some(id), Some(command)) =
            (call.get("toolCallId").and_then(Value::as_str), call.pointer("/rawInput/command").and_then(Value::as_str))
        else {
            return;
        };
        let key = (session.to_owned(), id.to_owned());
        self.commands.retain(|(k, _)| *k != key);
        if self.commands.len() == MAX_KNOWN {
            self.commands.pop_front();
        }
        self.commands.push_back((key, crate::coda::wait::truncate_chars(command, 500).to_owned()));
    }

    fn report(&mut self, wait: Wait, cx: &mut Cx) {
        if let Some(frame) = self.register.report(&wait) {
            cx.to_client(frame);
        }
    }

    /// A `session/update` of Qwen's, after it went on.
    fn update(&mut self, session: &str, update: &Value, cx: &mut Cx) {
        self.remember_command(session, update);
        if let Some(task) = update.pointer("/_meta/backgroundTask") {
            let (Some(id), Some(status)) =
                (task.get("taskId").and_then(Value::as_str), task.get("status").and_then(Value::as_str))
            else {
                return;
            };
            let state = match status {
                "completed" => State::Done,
                "failed" => State::Failed,
                "cancelled" | "killed" => State::Cancelled,
                _ => return,
            };
            if let Some(t) = self.tasks.iter_mut().find(|t| t.session == session && t.id == id) {
                t.ended = Some(state);
            }
            return;
        }
        let is_call =
            matches!(update.get("sessionUpdate").and_then(Value::as_str), Some("tool_call" | "tool_call_update"));
        let Some((id, output)) = is_call.then(|| texts(update).into_iter().find_map(started)).flatten() else { return };
        let call = update.get("toolCallId").and_then(Value::as_str).map(str::to_owned);
        let command = call.as_ref().and_then(|c| {
            self.commands.iter().find(|(k, _)| k.0 == session && k.1 == *c).map(|(_, command)| command.clone())
        });
        let mut wait = Wait::new(session, &id, State::Waiting);
        wait.kind = Some("task".into());
        wait.title = Some(command.unwrap_or_else(|| format!("background shell {id}")));
        wait.output_file = output;
        wait.tool_call_id = call;
        wait.stoppable = Some(false);
        if self.tasks.len() == MAX_KNOWN {
            self.tasks.pop_front();
        }
        self.tasks.push_back(Task { session: session.to_owned(), id, ended: None, turn: None });
        self.report(wait, cx);
    }

    /// Qwen asks to start a turn of its own: admitted here, and its task `handling`, if it is one of ours.
    fn start_turn(&mut self, frame: Frame, cx: &mut Cx) {
        let params = frame.value().get("params").cloned().unwrap_or(Value::Null);
        let field = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_owned);
        let (session, task, turn) = (field("sessionId"), field("taskId"), field("turnId"));
        let (Some(session), Some(task_id), Some(id)) = (session, task, frame.id().cloned()) else {
            return cx.to_client(frame);
        };
        let Some(task) = self.tasks.iter_mut().find(|t| t.session == session && t.id == task_id) else {
            return cx.to_client(frame);
        };
        task.turn = turn;
        cx.to_agent(frame::result_response(&id, json!({"accepted": true})));
        tracing::debug!("Qwen starts a turn of its own for its background command {task_id}");
        self.report(Wait::new(&session, &task_id, State::Handling), cx);
    }

    /// Qwen's turn of its own ended: its task ends as the command did.
    fn end_turn(&mut self, frame: &Frame, cx: &mut Cx) {
        let params = frame.value().get("params");
        let field = |k: &str| params.and_then(|p| p.get(k)).and_then(Value::as_str);
        let (Some(session), Some(turn)) = (field("sessionId"), field("turnId")) else { return };
        let Some(at) = self.tasks.iter().position(|t| t.session == session && t.turn.as_deref() == Some(turn)) else {
            return;
        };
        let task = self.tasks.remove(at).expect("found");
        self.report(Wait::new(&task.session, &task.id, task.ended.unwrap_or(State::Done)), cx);
    }
}

impl Layer for QwenTasks {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Request { method, .. } if method == START_TURN => self.start_turn(frame, cx),
            Kind::Request { method, .. } if method == "session/request_permission" => {
                let v = frame.value();
                if let (Some(session), Some(call)) =
                    (v.pointer("/params/sessionId").and_then(Value::as_str), v.pointer("/params/toolCall"))
                {
                    let (session, call) = (session.to_owned(), call.clone());
                    self.remember_command(&session, &call);
                }
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == END_TURN => {
                let keep = frame.clone();
                cx.to_client(frame);
                self.end_turn(&keep, cx)
            }
            Kind::Notification { method } if method == "session/update" => {
                let v = frame.shared_value();
                cx.to_client(frame);
                let (Some(session), Some(update)) =
                    (v.pointer("/params/sessionId").and_then(Value::as_str), v.pointer("/params/update"))
                else {
                    return;
                };
                if cx.session(session).is_some_and(|s| s.is_root()) {
                    self.update(session, update, cx);
                }
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Request { method, .. } => method != START_TURN && method != "session/request_permission",
            Kind::Notification { method } if method == END_TURN => false,
            Kind::Notification { .. } => match frame.session_update() {
                Some("tool_call" | "tool_call_update") => false,
                Some("agent_message_chunk") => !frame.contains(b"\"backgroundTask\""),
                _ => true,
            },
            _ => true,
        }
    }

    fn session_closed(&mut self, closed: &[String], _cx: &mut Cx) {
        self.tasks.retain(|t| !closed.contains(&t.session));
        self.commands.retain(|((s, _), _)| !closed.contains(s));
        self.register.forget(|s| closed.iter().any(|c| c == s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    const S: &str = "f1ba9f83";

    fn rig() -> Harness {
        let mut h = Harness::of(QwenTasks::new());
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.take();
        h
    }

    fn update(update: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":update}})
    }

    /// The frames of Qwen Code 0.24.4's background command, as seen live through coda-acp.
    #[test]
    fn a_background_command_is_a_task_handled_in_qwens_own_turn_and_done() {
        let mut h = rig();
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"method":"session/request_permission","params":{"sessionId":S,
            "toolCall":{"toolCallId":"call_2","rawInput":{"command":"sleep 3; echo done","is_background":true}},
            "options":[]}}));
        let started = update(json!({"sessionUpdate":"tool_call_update","toolCallId":"call_2","status":"completed",
            "content":[{"type":"content","content":{"type":"text","text":"Background shell started.\nid: bg_0947e52f\npid: 30466\noutput file: /tmp/q/shell-bg_0947e52f.output\nstatus file: /tmp/q/s"}}]}));
        h.from_agent(started.clone());
        let out = h.to_client();
        assert_eq!(out[1], started);
        assert_eq!(
            out[2]["params"],
            json!({"sessionId":S,"waitId":"bg_0947e52f","state":"waiting","kind":"task","title":"sleep 3; echo done",
                "outputFile":"/tmp/q/shell-bg_0947e52f.output","toolCallId":"call_2","stoppable":false})
        );
        h.from_agent(update(json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text",
            "text":"Background shell \"sleep 3; echo done\" completed."},"_meta":{"backgroundTask":{"commandLabel":
            "sleep 3; echo done","kind":"shell","status":"completed","taskId":"bg_0947e52f"}}})));
        assert_eq!(h.to_client().len(), 1, "the chunk only");
        let turn = "f1ba9f83########notificationa9dc";
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"method":START_TURN,"params":{"kind":"shell","sessionId":S,
            "source":"background_notification","startedAt":1796381378951u64,"taskId":"bg_0947e52f","turnId":turn}}));
        assert_eq!(h.to_agent(), [json!({"jsonrpc":"2.0","id":2,"result":{"accepted":true}})]);
        assert_eq!(h.to_client()[0]["params"], json!({"sessionId":S,"waitId":"bg_0947e52f","state":"handling"}));
        let end = json!({"jsonrpc":"2.0","method":END_TURN,"params":{"sessionId":S,"reason":"end_turn","turnId":turn,
            "source":"background_notification"}});
        h.from_agent(end.clone());
        let out = h.to_client();
        assert_eq!(out[0], end, "passed on as it came");
        assert_eq!(out[1]["params"], json!({"sessionId":S,"waitId":"bg_0947e52f","state":"done"}));
    }

    #[test]
    fn a_start_for_no_task_of_ours_and_hostile_frames_go_on_as_they_came() {
        let mut h = rig();
        let goal =
            json!({"jsonrpc":"2.0","id":5,"method":START_TURN,"params":{"sessionId":S,"source":"goal","turnId":"t"}});
        h.from_agent(goal.clone());
        assert_eq!(h.to_client(), [goal]);
        let unknown =
            json!({"jsonrpc":"2.0","id":6,"method":START_TURN,"params":{"sessionId":S,"taskId":"bg_x","turnId":"t"}});
        h.from_agent(unknown.clone());
        assert_eq!(h.to_client(), [unknown]);
        for bad in [
            update(
                json!({"sessionUpdate":"tool_call_update","content":[{"content":{"text":"Background shell started.\nid: \n"}}]}),
            ),
            update(json!({"sessionUpdate":"tool_call_update","content":"Background shell started."})),
            update(json!({"sessionUpdate":"agent_message_chunk","_meta":{"backgroundTask":{"taskId":7,"status":[]}}})),
            json!({"jsonrpc":"2.0","method":END_TURN,"params":7}),
            json!({"jsonrpc":"2.0","id":7,"method":START_TURN}),
        ] {
            h.from_agent(bad.clone());
            assert_eq!(h.to_client(), [bad]);
        }
        // A child session's (none Coda opened) is not reported.
        h.from_agent(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"other","update":{
            "sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"content":{"text":"Background shell started.\nid: bg_1\n"}}]}}}));
        assert_eq!(h.to_client().len(), 1);
    }
}

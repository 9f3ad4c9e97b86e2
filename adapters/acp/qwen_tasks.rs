//! Qwen Code 0.24.4's background shell commands and background agents as `_coda/wait` (`task` and `subagent`),
//! and its own turns for them as `handling` (section Agent 活动). Read in its ACP agent (`acpAgent-*.js`: the
//! background notification queue, its `_qwencode/start_turn` admission and `_qwencode/end_turn`, the
//! `qwen/control/session/task/cancel` method) and its agent tool, and seen live through coda-acp:
//!
//! - A `run_shell_command` with `is_background: true` ends its tool call with the text `Background shell
//!   started.\nid: bg_…\npid: …\noutput file: <path>\n…`: a task `waiting`, titled with the command (the
//!   `rawInput.command` of that tool call, in its updates or its permission request), with the tool call's id and
//!   the output file.
//! - An `agent` call Qwen runs in the background (its default for a top-level agent, or `run_in_background:
//!   true`) ends its tool call with `Background agent launched successfully.\ntask_id: <type>-<call> (…)\n…
//!   output_file: <path>…`: a wait `kind: subagent` `waiting`, titled with the call's `rawInput.description`.
//!   Qwen gives it no ACP session of its own (no `childSessionId`); its result comes back in Qwen's own turn.
//! - When the command ends, Qwen sends an `agent_message_chunk` with `_meta.backgroundTask {taskId, status,
//!   kind: "shell"}` (`completed`, `failed`, `cancelled`), then asks the client `_qwencode/start_turn {sessionId,
//!   source: "background_notification", kind, taskId, turnId, startedAt}` (a request it waits 2 s for; any answer
//!   but `{accepted: false}` admits the turn, -32601 too) and runs a turn of its own for it, ended by the
//!   notification `_qwencode/end_turn {sessionId, reason, turnId, source}`. coda-acp answers the request itself
//!   (`{accepted: true}`, Coda does not know the method), reports the task `handling` for that turn, and at its end
//!   the task's own end (`done`, `failed`, `cancelled` as the command ended). A start for a task it does not know
//!   (a goal turn) goes on to Coda as it came. The same for a background agent (`kind: "agent"`).
//! - A stopped one (`cancelled`) gets a turn of Qwen's too (seen live: `_qwencode/start_turn` right after its
//!   `_meta.backgroundTask` says `cancelled`): `handling`, then `cancelled` at its end.
//! - Both are `stoppable`: `_coda/wait/stop` becomes Qwen's own `qwen/control/session/task/cancel {sessionId,
//!   taskId, taskKind: "shell" | "agent"}` (answered `{cancelled, status}`); Coda gets `{}` once Qwen answered
//!   (its error as it came), and the wait's end when Qwen reports it.
//!
//! Bounds: the commands remembered per tool call are at most [`MAX_COMMANDS`], the open tasks at most
//! [`wait::MAX_KNOWN`] as every layer's waits (`wait::forget_one`; oldest
//! forgotten first); a session's go with it.

use std::collections::VecDeque;
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::wait::{self, Register, State, Wait};
use crate::frame::{self, Frame, Id, Kind, Needle};
use crate::layer::{Cx, Layer};

/// Qwen's request to start a turn of its own, and the notification that ends it.
pub const START_TURN: &str = "_qwencode/start_turn";
pub const END_TURN: &str = "_qwencode/end_turn";

/// Qwen's request that stops one of its background tasks.
pub const TASK_CANCEL: &str = "qwen/control/session/task/cancel";

/// Tool calls' commands remembered at most.
pub const MAX_COMMANDS: usize = 256;

const SHELL_STARTED: &str = "Background shell started.";
const AGENT_STARTED: &str = "Background agent launched successfully.";

/// What Qwen runs in the background: its `taskKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskKind {
    Shell,
    Agent,
}

impl TaskKind {
    fn name(self) -> &'static str {
        match self {
            TaskKind::Shell => "shell",
            TaskKind::Agent => "agent",
        }
    }
}

/// A background command or agent Qwen runs.
struct Task {
    session: String,
    id: String,
    kind: TaskKind,
    /// How it ended, once Qwen said (`_meta.backgroundTask.status`).
    ended: Option<State>,
    /// Qwen's turn for it, once admitted.
    turn: Option<String>,
}

/// Qwen Code's background commands and agents (see the module docs).
#[derive(Default)]
pub struct QwenTasks {
    /// `rawInput.command` (or an agent's `rawInput.description`) by (session, toolCallId), oldest first.
    commands: VecDeque<((String, String), String)>,
    tasks: VecDeque<Task>,
    register: Register,
}

/// What Qwen's text for a started background command or agent says: its id, output file and kind.
fn started(text: &str) -> Option<(String, Option<String>, TaskKind)> {
    let (rest, kind, id_key, file_key) = if let Some(rest) = text.strip_prefix(SHELL_STARTED) {
        (rest, TaskKind::Shell, "id: ", "output file: ")
    } else {
        (text.strip_prefix(AGENT_STARTED)?, TaskKind::Agent, "task_id: ", "output_file: ")
    };
    let field = |name: &str| rest.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    // An agent's `task_id: <id> (internal ID …)`: the id is its first word.
    let id = field(id_key).and_then(|v| v.split_whitespace().next()).filter(|id| !id.is_empty())?;
    let file = field(file_key).map(|f| f.split(" (").next().unwrap_or(f).trim()).filter(|f| !f.is_empty());
    Some((id.to_owned(), file.map(str::to_owned), kind))
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
        let input = call.get("rawInput");
        let said = |k: &str| input.and_then(|i| i.get(k)).and_then(Value::as_str).filter(|t| !t.is_empty());
        let (Some(id), Some(command)) =
            (call.get("toolCallId").and_then(Value::as_str), said("command").or_else(|| said("description")))
        else {
            return;
        };
        let key = (session.to_owned(), id.to_owned());
        self.commands.retain(|(k, _)| *k != key);
        if self.commands.len() == MAX_COMMANDS {
            self.commands.pop_front();
        }
        self.commands.push_back((key, wait::truncate_chars(command, 500).to_owned()));
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
        let Some((id, output, kind)) = is_call.then(|| texts(update).into_iter().find_map(started)).flatten() else {
            return;
        };
        if self.tasks.iter().any(|t| t.session == session && t.id == id) {
            return;
        }
        let call = update.get("toolCallId").and_then(Value::as_str).map(str::to_owned);
        let command = call.as_ref().and_then(|c| {
            self.commands.iter().find(|(k, _)| k.0 == session && k.1 == *c).map(|(_, command)| command.clone())
        });
        let mut wait = Wait::new(session, &id, State::Waiting);
        let (kind_name, fallback) = match kind {
            TaskKind::Shell => ("task", format!("background shell {id}")),
            TaskKind::Agent => ("subagent", format!("background agent {id}")),
        };
        wait.kind = Some(kind_name.into());
        wait.title = Some(command.unwrap_or(fallback));
        wait.output_file = output;
        wait.tool_call_id = call;
        wait.stoppable = Some(true);
        self.tasks.push_back(Task { session: session.to_owned(), id, kind, ended: None, turn: None });
        // (Every task kept is open, its wake turn still to come: the oldest goes, found at once.)
        if wait::forget_one(&mut self.tasks, |_| true).is_some() {
            tracing::warn!("over {} background tasks open at once: the oldest is forgotten", wait::MAX_KNOWN);
        }
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
        tracing::debug!("Qwen starts a turn of its own for its background task {task_id}");
        self.report(Wait::new(&session, &task_id, State::Handling), cx);
    }

    /// Qwen's turn of its own ended: its task ends as the command or agent did.
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

    /// Coda's `_coda/wait/stop` of an open task of ours: Qwen's own cancel; anything else goes on down.
    fn stop(&mut self, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        let text = |key: &str| value.pointer(&format!("/params/{key}")).and_then(Value::as_str);
        let (Some(id), Some(session), Some(wait_id)) = (frame.id().cloned(), text("sessionId"), text("waitId")) else {
            return cx.to_agent(frame);
        };
        let Some(task) = self.tasks.iter().find(|t| t.session == session && t.id == wait_id) else {
            return cx.to_agent(frame);
        };
        let params = json!({"sessionId": session, "taskId": wait_id, "taskKind": task.kind.name()});
        cx.request_for(&id, TASK_CANCEL, params, id.clone());
    }
}

impl Layer for QwenTasks {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Id;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Request { method, .. } if method == wait::STOP_METHOD => self.stop(frame, cx),
            _ => cx.to_agent(frame),
        }
    }

    /// Qwen's answer to its cancel: `{}` to Coda (the wait's end comes when Qwen reports it), its error as it came.
    fn on_reply(&mut self, client: Id, reply: Frame, cx: &mut Cx) {
        let v = reply.value();
        if let Some(error) = v.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603);
            let message = error.get("message").and_then(Value::as_str).unwrap_or("Qwen Code did not stop it");
            return cx.to_client(frame::error_response(&client, code, message, error.get("data").cloned()));
        }
        if v.pointer("/result/cancelled") != Some(&Value::Bool(true)) {
            let reason = v.pointer("/result/reason").and_then(Value::as_str).unwrap_or("none given");
            tracing::debug!("Qwen did not cancel the background task (reason: {reason:.40})");
        }
        cx.to_client(frame::result_response(&client, json!({})))
    }

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
                // (A `\u` escape may spell the key.)
                Some("agent_message_chunk") => !frame.has(&BACKGROUND_TASK) && !frame.unicode_escaped(),
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

    fn kept(&self) -> usize {
        self.tasks.len() + self.commands.len()
    }
}

/// The key of Qwen's report of a background task's end, on a chunk.
static BACKGROUND_TASK: Needle = crate::needle!(b"\"backgroundTask\"");

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
                "outputFile":"/tmp/q/shell-bg_0947e52f.output","toolCallId":"call_2","stoppable":true})
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

    /// The frames of Qwen Code 0.24.4's background agent, as seen live through coda-acp.
    fn launched(h: &mut Harness, call: &str, task: &str) -> Value {
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"method":"session/request_permission","params":{"sessionId":S,
            "toolCall":{"toolCallId":call,"rawInput":{"description":"helper task","prompt":"look",
            "run_in_background":true,"subagent_type":"general-purpose"},"title":"helper task"},"options":[]}}));
        h.from_agent(update(json!({"sessionUpdate":"tool_call_update","toolCallId":call,"_meta":{"toolName":"agent"},
            "content":[{"type":"content","content":{"type":"text","text":format!("Background agent launched \
            successfully.\ntask_id: {task} (internal ID \u{2014} do not mention to the user. Use send_message to \
            continue this agent, or task_stop to cancel.)\nThe agent is working in the background.\noutput_file: \
            /tmp/q/subagents/{task}.jsonl (for review after the completion notification, not for polling)")}}]})));
        h.to_client().pop().expect("the wait")
    }

    /// The open tasks are bounded as every layer's waits are: past [`wait::MAX_KNOWN`] the oldest is forgotten
    /// (Qwen's turn for it then goes on to Coda as one for a task not ours).
    #[test]
    fn the_open_tasks_kept_are_bounded_and_the_oldest_goes() {
        let mut h = rig();
        let start = |h: &mut Harness, n: usize| {
            h.from_agent(update(json!({"sessionUpdate":"tool_call_update","toolCallId":format!("call_{n}"),
                "content":[{"type":"content","content":{"type":"text",
                "text":format!("Background shell started.\nid: bg_{n}\npid: 1\noutput file: /tmp/q/{n}.output")}}]})));
            h.to_client();
        };
        for n in 0..=wait::MAX_KNOWN {
            start(&mut h, n);
        }
        let tasks = &h.layer::<QwenTasks>(0).tasks;
        assert_eq!(tasks.len(), wait::MAX_KNOWN);
        assert_eq!((tasks[0].id.as_str(), tasks[tasks.len() - 1].id.as_str()), ("bg_1", "bg_4096"), "the oldest went");
        let turn = |task: &str| {
            json!({"jsonrpc":"2.0","id":7,"method":START_TURN,"params":{"kind":"shell","sessionId":S,
                "source":"background_notification","taskId":task,"turnId":"t"}})
        };
        h.from_agent(turn("bg_0"));
        assert!(h.to_agent().is_empty(), "a forgotten task's turn is not answered here");
        assert_eq!(h.to_client()[0]["method"], START_TURN, "it goes on to Coda");
        h.from_agent(turn("bg_1"));
        assert_eq!(h.to_agent(), [json!({"jsonrpc":"2.0","id":7,"result":{"accepted":true}})]);
    }

    #[test]
    fn a_background_agent_is_a_subagent_handled_in_qwens_own_turn_and_done() {
        let mut h = rig();
        let task = "general-purpose-call_7";
        let wait = launched(&mut h, "call_7", task);
        assert_eq!(
            wait["params"],
            json!({"sessionId":S,"waitId":task,"state":"waiting","kind":"subagent","title":"helper task",
                "outputFile":"/tmp/q/subagents/general-purpose-call_7.jsonl","toolCallId":"call_7","stoppable":true})
        );
        h.from_agent(update(json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text",
            "text":"Background agent \"general-purpose: helper task\" completed."},"_meta":{"backgroundTask":{
            "kind":"agent","status":"completed","taskId":task,"toolUseId":"call_7"},"source":"background_task_completed"}})));
        assert_eq!(h.to_client().len(), 1, "the chunk only");
        let turn = "s########notification667e";
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"method":START_TURN,"params":{"kind":"agent","label":"helper task",
            "sessionId":S,"source":"background_notification","taskId":task,"toolUseId":"call_7","turnId":turn}}));
        assert_eq!(h.to_agent(), [json!({"jsonrpc":"2.0","id":2,"result":{"accepted":true}})]);
        assert_eq!(h.to_client()[0]["params"], json!({"sessionId":S,"waitId":task,"state":"handling"}));
        h.from_agent(
            json!({"jsonrpc":"2.0","method":END_TURN,"params":{"sessionId":S,"reason":"end_turn","turnId":turn,
            "source":"background_notification"}}),
        );
        assert_eq!(h.to_client()[1]["params"], json!({"sessionId":S,"waitId":task,"state":"done"}));
    }

    #[test]
    fn a_stop_is_qwens_own_cancel_and_the_end_comes_from_its_report() {
        let mut h = rig();
        let task = "general-purpose-call_9";
        launched(&mut h, "call_9", task);
        h.from_client(
            json!({"jsonrpc":"2.0","id":"st","method":"_coda/wait/stop","params":{"sessionId":S,"waitId":task}}),
        );
        let asked = h.to_agent();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0]["method"], TASK_CANCEL);
        assert_eq!(asked[0]["params"], json!({"sessionId":S,"taskId":task,"taskKind":"agent"}));
        assert!(h.to_client().is_empty(), "answered once Qwen answered");
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{"cancelled":true,"status":"running"}}));
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":"st","result":{}})]);
        // Qwen reports the end, then runs a turn of its own for it, as for one that ended by itself.
        h.from_agent(update(
            json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"cancelled"},
            "_meta":{"backgroundTask":{"kind":"agent","status":"cancelled","taskId":task}}}),
        ));
        assert_eq!(h.to_client().len(), 1, "the chunk only");
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"method":START_TURN,"params":{"kind":"agent","sessionId":S,
            "source":"background_notification","taskId":task,"turnId":"t9"}}));
        assert_eq!(h.to_agent(), [json!({"jsonrpc":"2.0","id":3,"result":{"accepted":true}})]);
        assert_eq!(h.to_client()[0]["params"], json!({"sessionId":S,"waitId":task,"state":"handling"}));
        h.from_agent(
            json!({"jsonrpc":"2.0","method":END_TURN,"params":{"sessionId":S,"reason":"end_turn","turnId":"t9"}}),
        );
        assert_eq!(h.to_client()[1]["params"], json!({"sessionId":S,"waitId":task,"state":"cancelled"}));
        // A shell's stop names its kind; Qwen's error goes back as it came.
        h.from_agent(update(json!({"sessionUpdate":"tool_call_update","toolCallId":"c3","content":[{"type":"content",
            "content":{"type":"text","text":"Background shell started.\nid: bg_1\npid: 3\noutput file: /tmp/o"}}]})));
        h.take();
        h.from_client(
            json!({"jsonrpc":"2.0","id":4,"method":"_coda/wait/stop","params":{"sessionId":S,"waitId":"bg_1"}}),
        );
        let asked = h.to_agent();
        assert_eq!(asked[0]["params"]["taskKind"], "shell");
        h.from_agent(
            json!({"jsonrpc":"2.0","id":asked[0]["id"],"error":{"code":-32602,"message":"Session not found"}}),
        );
        assert_eq!(
            h.to_client(),
            [json!({"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"Session not found"}})]
        );
        // A stop of a wait that is none of ours goes on down.
        let other = json!({"jsonrpc":"2.0","id":5,"method":"_coda/wait/stop","params":{"sessionId":S,"waitId":"zz"}});
        h.from_client(other.clone());
        assert_eq!(h.to_agent(), [other]);
    }

    /// A report whose key is spelled with an escape is read as the parsed frame reads it (fail closed).
    #[test]
    fn a_report_under_an_escaped_key_is_read() {
        let mut h = rig();
        let task = "general-purpose-call_8";
        launched(&mut h, "call_8", task);
        let report = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"cancelled"}},"_meta":{{"background\u0054ask":{{"kind":"agent","status":"cancelled","taskId":"{task}"}}}}}}}}}}"#
        );
        let report = Frame::parse(report.into_bytes()).expect("valid");
        // (Asked directly too: a debug build's stack calls a layer that says it passes a frame, to check it.)
        assert!(!QwenTasks::new().passes_from_agent(&report), "the layer reads it");
        h.agent_frame(report);
        assert_eq!(h.take().to_client.len(), 1, "the chunk only");
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"method":START_TURN,"params":{"kind":"agent","sessionId":S,
            "source":"background_notification","taskId":task,"turnId":"t8"}}));
        assert_eq!(h.to_client()[0]["params"], json!({"sessionId":S,"waitId":task,"state":"handling"}));
        h.from_agent(
            json!({"jsonrpc":"2.0","method":END_TURN,"params":{"sessionId":S,"reason":"end_turn","turnId":"t8"}}),
        );
        assert_eq!(h.to_client()[1]["params"], json!({"sessionId":S,"waitId":task,"state":"cancelled"}));
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

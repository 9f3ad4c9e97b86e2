//! Background work a turn leaves running, as each CLI reports it (fixtures `codex/bg-*`, `codex/subagent-*`,
//! `grok/bg-task-*`, `grok/subagent-*`; reference codex.md §1, grok-opencode.md):
//!
//! - Codex (codex-acp's AIR extensions): a command's `tool_call`, then, when it goes to the background,
//!   `tool_call_update` `backgrounded` and `async_task_spawned` (`canStop: true`), later `async_task_state_update`
//!   (`completed`, `failed`, `stopped`) and the call's end; stopped by `_session/async_task/stop` on the root session
//!   (`stopped` before the answer `{stopped: true}`). A subagent: `subagent_spawned` on the parent (`capabilities:
//!   {}`: never stoppable), its own frames on its session, `subagent_state_update` at its end; continued, it is
//!   `X:generation:N`. The turn's answer waits for the turn's subagents (ten minutes at most, then they are
//!   `failed`); Stop of the turn cancels them, Stop of a turn that only waits for them does nothing.
//! - Grok: `_x.ai/task_backgrounded`, later `_x.ai/task_completed` (`will_wake`) and a turn of Grok's own on the
//!   result (`task-completed-<id>`); `_x.ai/task/kill` kills it (that turn follows too). A background subagent:
//!   `spawn_subagent`'s call naming it, `subagent_spawned`, its turn on its own session, `subagent_finished`
//!   (`will_wake`) and Grok's turn on the result; `_x.ai/subagent/cancel` cancels it (no turn follows); continued
//!   (`resume_from`), it runs on a new session of Grok's.

use serde_json::{Value, json};

use super::{Effect, Flavor, Model, WorkTruth, error, notification, result, update};
use crate::plan::{Work, WorkEnd};

/// A subagent's run, as the CLI keeps it on disk.
#[derive(Debug, Clone)]
pub struct Sub {
    /// What its wait is called: Codex's session id of the run (`X`, `X:generation:N`), Grok's subagent id.
    pub id: String,
    /// The session the CLI runs it in (Codex: `id`; Grok: its child session).
    pub child: String,
    /// The child session Coda knows: Codex's `X`, Grok's first run's session.
    pub first: String,
    pub parent: String,
    pub generation: u32,
    /// Codex: the turn that started it (its answer waits for it).
    pub turn: u64,
    pub running: bool,
    /// How the CLI said it ended (its own word).
    pub ended: Option<&'static str>,
    /// How it is to end when its end comes.
    pending: &'static str,
    /// When it is announced.
    spawn_at: u64,
}

/// A background command of this process.
#[derive(Debug, Clone)]
pub struct Task {
    pub session: String,
    pub call: String,
    pub running: bool,
    pending: &'static str,
    /// The turn that starts it, and when it goes to the background.
    turn: u64,
    spawn_at: u64,
}

/// The part of a Codex session id before `:generation:`.
pub fn stable(id: &str) -> &str {
    id.find(":generation:").map_or(id, |at| &id[..at])
}

/// The tag of a work item's scheduled frames (removed when it is stopped).
fn tag(id: &str) -> Option<(String, u64)> {
    Some((format!("work:{id}"), 0))
}

impl Model {
    /// The session Coda knows a chunk of `on` by: a subagent's first session.
    pub(super) fn seen_as(&self, on: &str) -> String {
        self.subagents.iter().find(|s| s.child == on).map_or_else(|| stable(on).to_owned(), |s| s.first.clone())
    }

    fn new_id(&mut self, what: &str) -> String {
        self.ids += 1;
        format!("{}-{what}-{:04}", self.flavor.session_id(0).split('-').next().unwrap_or("x"), self.ids)
    }

    /// A background command `id` of turn `no`, started at `at` by the tool call `call`, to end as `pending`.
    fn new_task(&mut self, id: &str, session: &str, call: &str, no: u64, at: u64, pending: &'static str) {
        let task =
            Task { session: session.to_owned(), call: call.to_owned(), running: true, pending, turn: no, spawn_at: at };
        self.tasks.insert(id.to_owned(), task);
        self.record_work(id, session, at);
    }

    fn record_work(&mut self, id: &str, session: &str, started: u64) {
        let truth =
            WorkTruth { session: session.to_owned(), ended: None, process: self.process, will_end: None, started };
        self.truth.work.insert(id.to_owned(), truth);
    }

    /// Starts the work of turn `no` of `session`, whose content runs from `start` to `end`.
    pub(super) fn begin_work(&mut self, session: &str, no: u64, start: u64, end: u64, work: &Work) {
        let mid = start + (end - start) / 2 + 1;
        let word = |e: WorkEnd| match e {
            WorkEnd::WorkDone => "completed",
            WorkEnd::WorkFailed => "failed",
            WorkEnd::WorkNever => "",
        };
        let turn_tag = Some((session.to_owned(), no));
        match (work, self.flavor) {
            (Work::Task(ms, e), Flavor::Kimi) => {
                self.ids += 1;
                let id = format!("bash-{:08}", self.ids);
                let call = format!("call_{id}");
                let pending = word(*e);
                self.new_task(&id, session, &call, no, mid, pending);
                let started = vec![
                    json!({"type": "context.append_loop_event", "event": {"type": "tool.call", "turnId": no.to_string(),
                        "step": 1, "toolCallId": call, "name": "Bash", "args": {"command": "sleep 30",
                        "description": "run sleep 30", "run_in_background": true}}}),
                    json!({"type": "task.started", "info": super::kimi::task_info(&id, &call, "running", None)}),
                ];
                self.task_file_at(session, mid, super::kimi::task_info(&id, &call, "running", None), tag(&id));
                self.wire_at(session, mid, started, tag(&id));
                if *e != WorkEnd::WorkNever {
                    self.end_task_at(&id, mid + *ms as u64, pending);
                }
            }
            (Work::NoWork, _) | (_, Flavor::Kimi | Flavor::OpenCode) => {}
            (_, Flavor::Codex) if !self.air => {}
            (Work::Task(ms, e), flavor) => {
                let id = self.new_id("call");
                let call = id.clone();
                let pending = word(*e);
                let spawned_at = if flavor == Flavor::Codex { end.saturating_sub(1).max(mid) } else { mid };
                self.new_task(&id, session, &call, no, spawned_at, pending);
                for line in self.flavor.task_started(session, &id, &call) {
                    self.at(if flavor == Flavor::Codex { mid } else { spawned_at }, line, turn_tag.clone(), None);
                }
                for line in self.flavor.task_spawned(session, &id, &call) {
                    self.at(spawned_at, line, turn_tag.clone(), None);
                }
                if *e != WorkEnd::WorkNever {
                    self.end_task_at(&id, spawned_at + *ms as u64, pending);
                }
            }
            (Work::Subagent { ms, end: e, again }, flavor) => {
                let earlier = self
                    .subagents
                    .iter()
                    .rev()
                    .find(|s| s.parent == session && s.generation >= 1 && !s.running)
                    .cloned()
                    .filter(|_| *again);
                let (id, child, first, generation) = match (&earlier, flavor) {
                    (Some(prev), Flavor::Codex) => {
                        let g = self.subagents.iter().filter(|s| s.first == prev.first).count() as u32 + 1;
                        (format!("{}:generation:{g}", prev.first), String::new(), prev.first.clone(), g)
                    }
                    (Some(prev), _) => {
                        let id = self.new_id("sub");
                        (id.clone(), format!("{id}-s"), prev.first.clone(), 2)
                    }
                    (None, Flavor::Codex) => {
                        let id = self.new_id("sub");
                        (id.clone(), id.clone(), id, 1)
                    }
                    (None, _) => {
                        let id = self.new_id("sub");
                        (id.clone(), format!("{id}-s"), format!("{id}-s"), 1)
                    }
                };
                let child = if child.is_empty() { id.clone() } else { child };
                let pending = word(*e);
                let resumed_from = earlier.as_ref().map(|p| p.id.clone());
                self.subagents.push(Sub {
                    id: id.clone(),
                    child: child.clone(),
                    first: first.clone(),
                    parent: session.to_owned(),
                    generation,
                    turn: no,
                    running: true,
                    ended: None,
                    pending,
                    spawn_at: mid,
                });
                self.record_work(&id, session, mid);
                self.truth.children.insert(child.clone());
                self.truth.children.insert(first.clone());
                for line in self.flavor.subagent_spawned(session, &id, &child, resumed_from.as_deref()) {
                    self.at(mid, line, tag(&id), None);
                }
                // Its own turn, on its own session: a chunk Coda must get (its session is announced).
                let chunks = 1 + (ms % 2) as u8;
                let last = self.content_on(&id, &child, mid, (*ms).min(20_000), chunks);
                if flavor == Flavor::Codex {
                    if let Some(u) = self.flavor.usage(&child, 2_000) {
                        self.at(last, u, tag(&id), None);
                    }
                    self.at(last, super::shapes::thread_status(&child, "idle"), tag(&id), None);
                    if let Some(r) = self.running.get_mut(session) {
                        r.children.push(id.clone());
                    }
                } else {
                    let done = super::shapes::grok_turn_completed(&child, &format!("{child}-turn"), "end_turn");
                    self.at(last, done, tag(&id), None);
                }
                if *e != WorkEnd::WorkNever {
                    self.end_subagent_at(&id, mid + *ms as u64, pending);
                }
            }
        }
    }

    /// Stop of turn `no` of `session` at `now`: the work it had not started yet never starts.
    pub(super) fn drop_unstarted_work(&mut self, session: &str, no: u64, now: u64) {
        let tasks: Vec<String> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.session == session && t.turn == no && t.spawn_at > now)
            .map(|(id, _)| id.clone())
            .collect();
        let subs: Vec<String> = self
            .subagents
            .iter()
            .filter(|s| s.parent == session && s.turn == no && s.spawn_at > now)
            .map(|s| s.id.clone())
            .collect();
        for id in tasks.iter().chain(&subs) {
            let work = tag(id);
            self.out.retain(|_, o| o.turn != work);
            self.truth.work.remove(id);
            self.tasks.remove(id);
        }
        self.subagents.retain(|s| !subs.contains(&s.id));
        if let Some(run) = self.running.get_mut(session) {
            run.children.retain(|c| !subs.contains(c));
        }
    }

    /// A subagent's chunks on its session, tagged as its work; the time of the last.
    fn content_on(&mut self, id: &str, child: &str, now: u64, ms: u32, chunks: u8) -> u64 {
        let seen_as = self.seen_as(child);
        for i in 0..chunks as u64 {
            self.chunk_no += 1;
            let n = self.chunk_no;
            self.chunk_must.insert(n, (seen_as.clone(), true));
            let at = now + 2 + ms as u64 * (i + 1) / (chunks as u64 + 1);
            self.at(at, self.flavor.chunk(child, 0, n), tag(id), None);
        }
        now + 3 + ms as u64
    }

    fn end_task_at(&mut self, id: &str, at: u64, how: &'static str) {
        let Some(task) = self.tasks.get_mut(id) else { return };
        task.pending = how;
        let (session, call) = (task.session.clone(), task.call.clone());
        if self.flavor == Flavor::Kimi {
            let exit = if how == "completed" { 0 } else { 1 };
            let info = super::kimi::task_info(id, &call, how, Some(exit));
            // Kimi writes the task file first, then the wire record that ends the task.
            self.task_file_at(&session, at, info.clone(), tag(id));
            let ended = Some(Effect::WorkEnded(id.to_owned()));
            self.wire_with(&session, at, vec![json!({"type": "task.terminated", "info": info})], tag(id), ended);
            return;
        }
        let lines = self.flavor.task_ended(&session, id, &call, how);
        let n = lines.len();
        for (i, line) in lines.into_iter().enumerate() {
            let effect = (i + 1 == n).then(|| Effect::WorkEnded(id.to_owned()));
            self.at(at, line, tag(id), effect);
        }
    }

    fn end_subagent_at(&mut self, id: &str, at: u64, how: &'static str) {
        let Some(sub) = self.subagents.iter_mut().find(|s| s.id == id) else { return };
        sub.pending = how;
        let (parent, child) = (sub.parent.clone(), sub.child.clone());
        let will_wake = how != "cancelled";
        let line = self.flavor.subagent_ended(&parent, id, &child, how, will_wake);
        self.at(at, line, tag(id), Some(Effect::WorkEnded(id.to_owned())));
    }

    /// Ends a running subagent now as `how` (its scheduled frames dropped).
    pub(super) fn end_subagent(&mut self, id: &str, how: &'static str, at: u64) {
        if !self.subagents.iter().any(|s| s.id == id && s.running) {
            return;
        }
        let work = tag(id);
        self.out.retain(|_, o| o.turn != work);
        self.end_subagent_at(id, at, how);
    }

    /// The end frames of a work item were written.
    pub(super) fn work_ended(&mut self, id: &str, now: u64) {
        let coda_word = |how: &str| match how {
            "completed" => "done",
            "failed" | "disconnected" => "failed",
            _ => "cancelled",
        };
        // Grok's work is over for Coda once its turn on the result ends (a cancelled subagent gets none). Kimi
        // injects a result into the turn it runs (client turn or its own, kimi.md §3.3 case 2) and otherwise
        // wakes on it in a turn of its own. The work is over for Coda at once if that is a client turn whose start
        // is in the wire (the shim reads it as ending in the turn), else once the turn handling it ends in the
        // wire. A turn whose end is in the wire is over for Kimi, even before its answer is out.
        if self.flavor == Flavor::Kimi
            && let Some(task) = self.tasks.get_mut(id)
        {
            task.running = false;
            let (how, session) = (task.pending, task.session.clone());
            let open = self.running.get_mut(&session).filter(|r| r.kind != super::Kind::Compact && !r.wire_ended);
            let Some(run) = open else {
                if let Some(t) = self.truth.work.get_mut(id) {
                    t.will_end = Some(coda_word(how));
                }
                return self.wake(&session, &format!("task-completed-{id}"), now);
            };
            let at_once = run.kind == super::Kind::Coda && run.wire_started;
            if !at_once {
                run.injected.push(id.to_owned());
            }
            if let Some(t) = self.truth.work.get_mut(id) {
                if at_once { t.ended = Some(coda_word(how)) } else { t.will_end = Some(coda_word(how)) }
            }
            let injected = json!({"type": "context.append_message", "message": {"role": "user",
                "content": [{"type": "text", "text": format!("<notification>task {id} {how}</notification>")}],
                "origin": {"kind": "task", "taskId": id}}});
            // Right after the command's end (before the turn's end, if that is due now too), or right after the
            // turn's start when that is not yet written.
            if run.wire_started {
                self.wire_next(&session, vec![injected]);
            } else {
                run.to_inject.push(injected);
            }
            return;
        }
        let wakes = |how: &str| self.flavor == Flavor::Grok && how != "cancelled";
        if let Some(task) = self.tasks.get_mut(id) {
            task.running = false;
            let (how, session) = (task.pending, task.session.clone());
            let wake = wakes(how);
            if let Some(t) = self.truth.work.get_mut(id) {
                if wake { t.will_end = Some(coda_word(how)) } else { t.ended = Some(coda_word(how)) }
            }
            if wake {
                self.wake(&session, &format!("task-completed-{id}"), now);
            }
            return;
        }
        let Some(sub) = self.subagents.iter_mut().find(|s| s.id == id) else { return };
        sub.running = false;
        sub.ended = Some(sub.pending);
        let (how, parent, turn) = (sub.pending, sub.parent.clone(), sub.turn);
        let wake = wakes(how);
        if let Some(t) = self.truth.work.get_mut(id) {
            if wake { t.will_end = Some(coda_word(how)) } else { t.ended = Some(coda_word(how)) }
        }
        match self.flavor {
            Flavor::Codex => {
                let Some(run) = self.running.get_mut(&parent).filter(|r| r.no == turn) else { return };
                run.children.retain(|c| c != id);
                if run.children.is_empty()
                    && let Some(answers) = run.held.take()
                {
                    self.answer_lines(&parent, turn, now + 1, answers);
                }
            }
            _ if how != "cancelled" => self.wake(&parent, &format!("subagent-completed-{id}"), now),
            _ => {}
        }
    }

    /// Grok's turn of its own on a background result: now, or once the session's turn ends.
    pub(super) fn wake(&mut self, session: &str, prompt: &str, now: u64) {
        if self.running.contains_key(session) {
            self.queued.entry(session.to_owned()).or_default().push_back(super::Queued::Wake(prompt.to_owned()));
        } else {
            self.own_turn_in(session, 1, now, prompt);
        }
    }

    /// Codex gave up waiting for the subagents of turn `no`: they fail, and the answer follows.
    pub(super) fn children_timeout(&mut self, session: &str, no: u64, now: u64) {
        let Some(run) = self.running.get(session).filter(|r| r.no == no) else { return };
        for child in run.children.clone() {
            self.end_subagent(&child, "failed", now);
        }
    }

    /// A stop of a background command (Codex's `_session/async_task/stop`, Grok's `_x.ai/task/kill`).
    pub(super) fn stop_task(&mut self, task: &str, id: Value, now: u64) {
        let running = self.tasks.get(task).is_some_and(|t| t.running);
        match (self.flavor, running) {
            (Flavor::Codex, true) => {
                let work = tag(task);
                self.out.retain(|_, o| o.turn != work);
                self.end_task_at(task, now + 7, "stopped");
                self.at(now + 11, result(&id, json!({"stopped": true})), None, None);
            }
            (Flavor::Codex, false) => self.at(now + 3, result(&id, json!({"stopped": false})), None, None),
            (_, true) => {
                let work = tag(task);
                self.out.retain(|_, o| o.turn != work);
                self.at(now + 2, result(&id, json!({"result": {"taskId": task, "outcome": "killed"}})), None, None);
                self.end_task_at(task, now + 2, "killed");
            }
            (_, false) => {
                let e = json!({"code": -32602, "message": format!("task not found: {task}")});
                self.at(now + 2, error(&id, e), None, None)
            }
        }
    }

    /// Grok's `_x.ai/subagent/cancel`.
    pub(super) fn cancel_subagent(&mut self, sub: &str, id: Value, now: u64) {
        let found = self.subagents.iter().find(|s| s.id == sub && s.running).map(|s| s.child.clone());
        let Some(child) = found else {
            let r = json!({"result": {"subagentId": sub, "cancelled": false}});
            return self.at(now + 2, result(&id, r), None, None);
        };
        let r = json!({"result": {"subagentId": sub, "cancelled": true, "outcome": {"kind": "cancelled"}}});
        self.at(now + 8, result(&id, r), None, None);
        let work = tag(sub);
        self.out.retain(|_, o| o.turn != work);
        let done = super::shapes::grok_turn_completed(&child, &format!("{child}-turn"), "cancelled");
        self.at(now + 8, done, None, None);
        self.end_subagent_at(sub, now + 113, "cancelled");
    }

    /// What codex-acp replays of a session's subagents on `session/load`: each run announced, then how it
    /// ended; a run an earlier process ended before it did, `disconnected`.
    pub(super) fn replay_subagents(&mut self, session: &str) -> Vec<Value> {
        let mut lines = Vec::new();
        for s in self.subagents.iter_mut().filter(|s| s.parent == session) {
            let spawned = json!({"sessionUpdate": "subagent_spawned", "subagentSessionId": s.id, "name": "Worker bee",
                "task": "Delegated task for Worker bee", "capabilities": {}});
            lines.push(update(session, spawned));
            if s.running {
                continue; // Loaded again in the process that runs it: it goes on.
            }
            let state = *s.ended.get_or_insert("disconnected");
            let end = json!({"sessionUpdate": "subagent_state_update", "subagentSessionId": s.id, "state": state});
            lines.push(update(session, end));
        }
        lines
    }
}

impl Flavor {
    /// The frames of a command's start, during its turn.
    pub fn task_started(self, session: &str, id: &str, call: &str) -> Vec<Value> {
        match self {
            Flavor::Codex => vec![update(
                session,
                json!({"sessionUpdate": "tool_call", "toolCallId": call, "name": "exec_command", "kind": "execute",
                    "title": "sleep 30; echo finished", "status": "in_progress",
                    "content": [{"type": "terminal", "terminalId": call}]}),
            )],
            _ => vec![
                update(
                    session,
                    json!({"sessionUpdate": "tool_call", "toolCallId": call, "title": "run_terminal_command",
                    "rawInput": {"background": true, "command": "sleep 30", "description": "run sleep 30"},
                    "_meta": {"x.ai/tool": {"version": 1, "name": "run_terminal_command", "kind": "execute"}}}),
                ),
                notification(
                    "_x.ai/task_backgrounded",
                    json!({"sessionId": session, "update": {"sessionUpdate": "task_backgrounded",
                    "tool_call_id": call, "task_id": id, "command": "sleep 30", "cwd": "/work/app",
                    "output_file": format!("/home/u/.grok/sessions/x/{session}/terminal/{call}.log"),
                    "description": "run sleep 30"}}),
                ),
            ],
        }
    }

    /// The frames that say a command went to the background.
    pub fn task_spawned(self, session: &str, id: &str, call: &str) -> Vec<Value> {
        match self {
            Flavor::Codex => vec![
                update(
                    session,
                    json!({"sessionUpdate": "tool_call_update", "toolCallId": call,
                    "_meta": {"jetbrains": {"air": {"asyncTasks": {"backgrounded": true}}}}}),
                ),
                update(
                    session,
                    json!({"sessionUpdate": "async_task_spawned", "asyncTaskId": id, "name": "sleep 30; echo finished",
                    "taskType": "shell", "showInTranscript": false, "canStop": true, "toolCallId": call}),
                ),
            ],
            _ => vec![update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": call, "status": "completed",
                    "title": "[bg] sleep 30", "content": [{"type": "content", "content": {"type": "text",
                    "text": format!("Background task {id} started")}}]}),
            )],
        }
    }

    /// The frames of a command's end (`completed`, `failed`, `stopped`, `killed`).
    pub fn task_ended(self, session: &str, id: &str, call: &str, how: &str) -> Vec<Value> {
        match self {
            Flavor::Codex => {
                let exit = if how == "completed" { 0 } else { -1 };
                vec![
                    update(
                        session,
                        json!({"sessionUpdate": "async_task_state_update", "asyncTaskId": id, "state": how,
                        "toolCallId": call}),
                    ),
                    update(
                        session,
                        json!({"sessionUpdate": "tool_call_update", "toolCallId": call, "name": "exec_command",
                        "status": if how == "completed" { "completed" } else { "failed" },
                        "_meta": {"terminal_exit": {"exit_code": exit, "signal": null, "terminal_id": call}}}),
                    ),
                ]
            }
            _ => {
                let killed = how == "killed";
                let exit = match how {
                    "completed" => json!(0),
                    "killed" => Value::Null,
                    _ => json!(1),
                };
                vec![notification(
                    "_x.ai/task_completed",
                    json!({"sessionId": session, "update": {"sessionUpdate": "task_completed",
                    "task_snapshot": {"task_id": id, "command": "sleep 30", "exit_code": exit,
                        "explicitly_killed": killed}, "will_wake": true}}),
                )]
            }
        }
    }

    /// The frames of a subagent's start.
    pub fn subagent_spawned(self, session: &str, id: &str, child: &str, resumed_from: Option<&str>) -> Vec<Value> {
        match self {
            Flavor::Codex => vec![
                update(
                    session,
                    json!({"sessionUpdate": "subagent_spawned", "subagentSessionId": id, "name": "Worker bee",
                    "task": "Delegated task for Worker bee", "capabilities": {}}),
                ),
                update(
                    id,
                    json!({"sessionUpdate": "config_option_update", "configOptions": [{"id": "model",
                    "name": "Model", "category": "model", "type": "select", "currentValue": "fake-model",
                    "options": [{"value": "fake-model", "name": "fake-model"}]}]}),
                ),
                super::shapes::thread_status(id, "active"),
            ],
            _ => {
                let call = format!("call_{id}");
                let mut spawned = json!({"sessionUpdate": "subagent_spawned", "subagent_id": id,
                    "parent_session_id": session, "child_session_id": child, "subagent_type": "general-purpose",
                    "description": "helper task", "model": "fake"});
                if let Some(from) = resumed_from {
                    spawned["resumed_from"] = json!(from);
                }
                vec![
                    update(
                        session,
                        json!({"sessionUpdate": "tool_call", "toolCallId": call, "title": "spawn_subagent",
                        "rawInput": {"background": true, "description": "helper task", "prompt": "child work"},
                        "_meta": {"x.ai/tool": {"version": 1, "name": "spawn_subagent", "kind": "task"},
                            "subagentBackground": true}}),
                    ),
                    update(
                        session,
                        json!({"sessionUpdate": "tool_call_update", "toolCallId": call, "status": "completed",
                        "content": [{"type": "content", "content": {"type": "text",
                            "text": format!("Subagent started in background.\nsubagent_id: {id}\ndescription: helper task")}}]}),
                    ),
                    notification("_x.ai/session_notification", json!({"sessionId": session, "update": spawned})),
                    notification(
                        "_x.ai/queue/changed",
                        json!({"sessionId": child, "entries": [], "runningPromptId": format!("{child}-turn"),
                        "runningText": "child work", "runningKind": "prompt"}),
                    ),
                ]
            }
        }
    }

    /// The frame of a subagent's end.
    pub fn subagent_ended(self, parent: &str, id: &str, child: &str, how: &str, will_wake: bool) -> Value {
        match self {
            Flavor::Codex => {
                update(parent, json!({"sessionUpdate": "subagent_state_update", "subagentSessionId": id, "state": how}))
            }
            _ => notification(
                "_x.ai/session_notification",
                json!({"sessionId": parent, "update": {"sessionUpdate": "subagent_finished", "subagent_id": id,
                    "child_session_id": child, "status": how, "will_wake": will_wake}}),
            ),
        }
    }
}

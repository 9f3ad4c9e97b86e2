//! Kimi's activity, from its session files, as Coda's `_coda/wait` and `session/update` (sans-IO).
//!
//! Fed the records of one session's wire files (in each file's order, files interleaved as read) and
//! answers the client frames to send. The rules are those of "Agent 活动" (rules 1-7) as the protocol's
//! table row for Kimi applies them; which Kimi record means what was seen live on Kimi 2.1.0 (fixtures/kimi).
//!
//! Settling uses Kimi's own turn records, not the ACP stream, so the outcome does not depend on how the
//! file events and the ACP frames interleave: a task that ends while the main agent's client turn runs
//! settles at once; one that ends while Kimi runs a turn of its own, or while the main agent is idle, is
//! `handling` until the end of the turn that handles it.

use crate::{HashMap, HashSet};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::coda::wait::{Register, State, Wait};
use crate::frame::{self, Frame};
use serde_json::{Value, json};

use crate::adapters::kimi::wire::{Entry, Origin, Outcome, Record, Spawn, TaskInfo};

pub const MAIN: &str = "main";

/// Where the main agent was when an item's end was recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
enum EndedIn {
    /// A turn started by a client prompt: the main agent handles the result in that turn.
    UserTurn,
    /// A turn Kimi started itself; `seq` numbers main turns in the order they started.
    OwnTurn { seq: u64 },
    /// No turn; `seq` = how many main turns had started.
    Idle { seq: u64 },
}

struct Run {
    wait_id: String,
    spawn: Spawn,
    registered: bool,
    /// The subagent-wire turn of this run, once seen.
    turn: Option<i64>,
    turn_done: bool,
    /// The final state and where the main agent was when it was recorded.
    end: Option<(State, EndedIn, bool)>,
    /// When the end was first known (for [`Translator::overdue`]).
    end_known: Option<Instant>,
    /// Settle without the turn end: it did not show within the grace.
    overdue: bool,
}

#[derive(Default)]
struct Agent {
    /// Records of this subagent's wire not delivered yet.
    pending: VecDeque<Entry>,
    /// Runs requested by the parent, oldest first; the front one is being reported.
    runs: VecDeque<Run>,
    /// Coda knows this agent's session (a run was registered with it as `childSessionId`).
    announced: bool,
    /// The turn running in this agent's wire.
    turn: Option<(i64, Origin)>,
    /// The turn of the run being reported (its progress is forwarded).
    run_turn: Option<i64>,
    /// The wait of this agent's previous run while it is `handling`: the next run is reported only once
    /// it settled, so the same card goes on (the protocol's Kimi row).
    settling: Option<String>,
}

/// A main-owned item in `handling`.
struct Handled {
    wait_id: String,
    /// Its final state, reported when the turn that handles it ends.
    state: State,
    /// The main turn (by seq) handling it, once Kimi named it.
    turn: Option<u64>,
}

/// The translation for one Kimi session (sessionId = the session folder's name).
pub struct Translator {
    session: String,
    session_dir: String,
    register: Register,
    main_turn: Option<(i64, Origin, u64)>,
    turns_started: u64,
    /// Process tasks we registered: taskId -> owning agent.
    tasks: HashMap<String, String>,
    suppressed: HashSet<String>,
    agents: HashMap<String, Agent>,
    /// Main-owned items in `handling`, in the order they ended.
    handling: Vec<Handled>,
    /// Task ids a main turn named (its prompt's or an injected message's `origin.taskId`): the turn's seq
    /// and whether it has ended.
    named: HashMap<String, (u64, bool)>,
    /// Wait ids made up for runs without a task id.
    next_run: u64,
}

/// `task` status -> the wait's final state.
pub fn final_state(status: &str) -> Option<State> {
    match status {
        "completed" => Some(State::Done),
        "failed" | "timed_out" | "lost" => Some(State::Failed),
        "killed" => Some(State::Cancelled),
        "running" | "" => None,
        other => {
            tracing::warn!("unknown Kimi task status ({} characters); reported as failed", other.chars().count());
            tracing::debug!("the status: {other:?}");
            Some(State::Failed)
        }
    }
}

fn outcome_state(o: Outcome) -> State {
    match o {
        Outcome::Completed => State::Done,
        Outcome::Failed => State::Failed,
        Outcome::Cancelled => State::Cancelled,
    }
}

fn tool_kind(name: &str) -> &'static str {
    match name {
        "Bash" | "BashOutput" => "execute",
        "Read" | "ReadFile" => "read",
        "Write" | "Edit" | "MultiEdit" | "WriteFile" | "StrReplaceFile" => "edit",
        "Grep" | "Glob" => "search",
        "WebFetch" | "FetchURL" => "fetch",
        _ => "other",
    }
}

fn update(session: &str, update: Value) -> Frame {
    frame::notification("session/update", json!({ "sessionId": session, "update": update }))
}

impl Translator {
    /// `session_dir` is the session folder as it should appear in `outputFile` paths.
    pub fn new(session: &str, session_dir: &str) -> Translator {
        Translator {
            session: session.into(),
            session_dir: session_dir.trim_end_matches('/').into(),
            register: Register::new(),
            main_turn: None,
            turns_started: 0,
            tasks: HashMap::default(),
            suppressed: HashSet::default(),
            agents: HashMap::default(),
            handling: Vec::new(),
            named: HashMap::default(),
            next_run: 0,
        }
    }

    /// Kimi is busy with something of its own: a turn it started itself, or items waiting for the turn
    /// that handles them. A client prompt sent now would be answered empty and queued (fixtures/kimi/prompt-during-kimi-turn).
    pub fn main_busy(&self) -> bool {
        self.main_turn.as_ref().is_some_and(|(_, o, _)| !o.is_user()) || !self.handling.is_empty()
    }

    /// The wire shows a client turn of the main agent that has not ended yet.
    pub fn user_turn_open(&self) -> bool {
        self.main_turn.as_ref().is_some_and(|(_, o, _)| o.is_user())
    }

    /// A task file was (re)written.
    pub fn task_file(&mut self, _agent: &str, info: &TaskInfo) {
        if info.suppressed {
            self.suppressed.insert(info.task_id.clone());
        }
    }

    /// One record of `agent`'s wire.
    pub fn entry(&mut self, agent: &str, entry: Entry, out: &mut Vec<Frame>) {
        if agent == MAIN {
            self.main_entry(entry, out);
        } else {
            self.agents.entry(agent.to_owned()).or_default().pending.push_back(entry);
            self.pump(agent, out);
        }
    }

    /// Every file has been read to its end once more, at `now` (the engine's time).
    pub fn drained(&mut self, now: Instant, out: &mut Vec<Frame>) {
        let names: Vec<String> = self.agents.keys().cloned().collect();
        for name in names {
            if let Some(run) = self.agents.get_mut(&name).and_then(|a| a.runs.front_mut())
                && run.end.is_some()
            {
                run.end_known.get_or_insert(now);
            }
            self.pump(&name, out);
        }
    }

    /// The earliest time a run being reported has known its end without its turn end showing in its
    /// wire (the run is settled by [`Translator::overdue`] once that is long enough ago).
    pub fn awaiting_run_end(&self) -> Option<Instant> {
        self.agents
            .values()
            .filter_map(|a| a.runs.front())
            .filter(|r| r.end.is_some())
            .filter_map(|r| r.end_known)
            .min()
    }

    /// Settles the runs whose end has been known for `grace` without their turn end showing: Kimi
    /// recorded the end in the parent; the subagent's own wire may never say more (rule 6 would otherwise
    /// leave the item open until the process ends).
    pub fn overdue(&mut self, now: Instant, grace: Duration, out: &mut Vec<Frame>) {
        let names: Vec<String> = self.agents.keys().cloned().collect();
        for name in names {
            if let Some(run) = self.agents.get_mut(&name).and_then(|a| a.runs.front_mut())
                && run.end.is_some()
                && run.end_known.is_some_and(|at| now.duration_since(at) >= grace)
            {
                tracing::warn!(
                    "Kimi recorded the end of subagent {name}'s run {} but its wire shows no turn end after \
                     {grace:?}; settling it without",
                    run.wait_id
                );
                run.overdue = true;
                self.pump(&name, out);
            }
        }
    }

    fn ended_in(&self) -> EndedIn {
        match &self.main_turn {
            Some((_, o, _)) if o.is_user() => EndedIn::UserTurn,
            Some((_, _, seq)) => EndedIn::OwnTurn { seq: *seq },
            None => EndedIn::Idle { seq: self.turns_started },
        }
    }

    fn send(&mut self, wait: &Wait, out: &mut Vec<Frame>) {
        if let Some(f) = self.register.report(wait) {
            out.push(f);
        }
    }

    fn main_entry(&mut self, entry: Entry, out: &mut Vec<Frame>) {
        match entry.record {
            Record::TurnPrompt { turn_id, origin } => {
                self.turns_started += 1;
                let seq = self.turns_started;
                match &origin.task_id {
                    Some(task) if origin.kind == "task" => self.name_task(task, seq),
                    // A turn of Kimi's own that names no task: it takes whatever waits to be handled.
                    _ if !origin.is_user() => {
                        for h in self.handling.iter_mut().filter(|h| h.turn.is_none()) {
                            h.turn = Some(seq);
                        }
                    }
                    _ => {}
                }
                self.main_turn = Some((turn_id, origin, seq));
            }
            Record::Injected { origin } => {
                if let (Some(task), Some((_, _, seq))) = (&origin.task_id, &self.main_turn)
                    && origin.kind == "task"
                {
                    let seq = *seq;
                    self.name_task(&task.clone(), seq);
                }
            }
            // The end of the running turn; an end of another one (a turn whose end was written late, or twice)
            // leaves the running turn running: its own end settles what it handles.
            Record::TurnEnded { turn_id, .. } => {
                if let Some((_, _, seq)) = self.main_turn.take_if(|(id, _, _)| *id == turn_id) {
                    for n in self.named.values_mut().filter(|n| n.0 == seq) {
                        n.1 = true;
                    }
                    self.settle_handling(seq, out);
                }
            }
            Record::Text { .. } | Record::ToolCall { .. } | Record::ToolResult { .. } => {
                // Kimi reports its client turns over ACP itself; only its own turns are invisible.
                if let Some((turn, origin, _)) = &self.main_turn
                    && !origin.is_user()
                    && let Some(u) = progress(*turn, &entry.record)
                {
                    out.push(update(&self.session, u));
                }
            }
            Record::TaskStarted(info) if info.kind == "process" => {
                self.start_task(MAIN, &info, out);
            }
            Record::TaskTerminated(info) => {
                let Some(state) = final_state(&info.status) else { return };
                if info.suppressed {
                    self.suppressed.insert(info.task_id.clone());
                }
                if info.kind == "agent" {
                    let ended_in = self.ended_in();
                    let run = self
                        .agents
                        .values_mut()
                        .flat_map(|a| a.runs.iter_mut())
                        .find(|r| r.spawn.task_id.as_deref() == Some(&info.task_id));
                    if let Some(run) = run {
                        if run.end.is_none() {
                            run.end = Some((state, ended_in, info.suppressed));
                        }
                        let agent = run.spawn.subagent_id.clone();
                        self.pump(&agent, out);
                    }
                } else if self.tasks.get(&info.task_id).map(String::as_str) == Some(MAIN) {
                    let ended_in = self.ended_in();
                    self.end_item(info.task_id.clone(), state, ended_in, info.suppressed, out);
                }
            }
            Record::WaitDelivered { task_ids } => self.suppressed.extend(task_ids),
            Record::SubagentSpawned(spawn) => {
                let wait_id = match &spawn.task_id {
                    Some(t) if !t.is_empty() => t.clone(),
                    _ => {
                        self.next_run += 1;
                        format!("{}-run-{}", spawn.subagent_id, self.next_run)
                    }
                };
                let agent = spawn.subagent_id.clone();
                let run = Run {
                    wait_id,
                    spawn,
                    registered: false,
                    turn: None,
                    turn_done: false,
                    end: None,
                    end_known: None,
                    overdue: false,
                };
                self.agents.entry(agent.clone()).or_default().runs.push_back(run);
                self.pump(&agent, out);
            }
            Record::SubagentEnded { subagent_id, outcome } => {
                let ended_in = self.ended_in();
                if let Some(a) = self.agents.get_mut(&subagent_id) {
                    // The oldest run still open; a background run's end comes from its task record.
                    if let Some(run) = a.runs.iter_mut().find(|r| r.end.is_none())
                        && !(run.spawn.background && run.spawn.task_id.is_some())
                    {
                        run.end = Some((outcome_state(outcome), ended_in, false));
                    }
                }
                self.pump(&subagent_id, out);
            }
            _ => {}
        }
    }

    fn start_task(&mut self, agent: &str, info: &TaskInfo, out: &mut Vec<Frame>) {
        if self.tasks.contains_key(&info.task_id) {
            return;
        }
        self.tasks.insert(info.task_id.clone(), agent.to_owned());
        let session = if agent == MAIN { self.session.clone() } else { agent.to_owned() };
        let mut w = Wait::new(&session, &info.task_id, State::Waiting);
        w.kind = Some("task".into());
        w.title = Some(if info.description.is_empty() { info.task_id.clone() } else { info.description.clone() });
        w.detail = info.command.clone().filter(|c| !c.is_empty());
        w.output_file = Some(format!("{}/agents/{agent}/tasks/{}/output.log", self.session_dir, info.task_id));
        self.send(&w, out);
    }

    /// Main turn `seq` handles task `task` (its notification opened the turn or was injected into it).
    fn name_task(&mut self, task: &str, seq: u64) {
        self.named.insert(task.to_owned(), (seq, false));
        for h in self.handling.iter_mut().filter(|h| h.wait_id == task && h.turn.is_none()) {
            h.turn = Some(seq);
        }
    }

    /// A main-owned item (background task or background subagent run) ended.
    fn end_item(&mut self, id: String, state: State, ended_in: EndedIn, suppressed: bool, out: &mut Vec<Frame>) {
        let suppressed = suppressed || self.suppressed.contains(&id);
        let session = self.session.clone();
        // Ended inside a client turn: the main agent handles it there (settle at once); suppressed: no turn
        // handles it. Otherwise it is `handling` until the end of the main turn that Kimi names it in (a
        // notification turn, or the running turn it is injected into): several ending close together may
        // share one turn or get one each (both seen live).
        let turn = match self.named.get(&id) {
            _ if suppressed || ended_in == EndedIn::UserTurn => None,
            // Known late (a subagent run settles after its own wire's turn end): that turn handled it.
            Some((_, true)) => None,
            Some((seq, false)) => Some(Some(*seq)),
            None => Some(None),
        };
        match turn {
            None => self.send(&Wait::new(&session, &id, state), out),
            Some(turn) => {
                self.send(&Wait::new(&session, &id, State::Handling), out);
                self.handling.push(Handled { wait_id: id, state, turn });
            }
        }
    }

    /// The main turn `seq` ended: what it handled is settled.
    fn settle_handling(&mut self, seq: u64, out: &mut Vec<Frame>) {
        let session = self.session.clone();
        let (done, rest): (Vec<Handled>, Vec<Handled>) =
            std::mem::take(&mut self.handling).into_iter().partition(|h| h.turn == Some(seq));
        self.handling = rest;
        for h in &done {
            self.send(&Wait::new(&session, &h.wait_id, h.state), out);
        }
        // Runs that waited for one of these to settle go on now.
        let waiting: Vec<String> = self
            .agents
            .iter()
            .filter(|(_, a)| a.settling.as_ref().is_some_and(|w| done.iter().any(|h| &h.wait_id == w)))
            .map(|(name, _)| name.clone())
            .collect();
        for name in waiting {
            self.pump(&name, out);
        }
    }

    /// Delivers what can be delivered for subagent `name`: its runs' registration, progress and
    /// settlement in order, one run after the other.
    fn pump(&mut self, name: &str, out: &mut Vec<Frame>) {
        loop {
            let session = self.session.clone();
            let Some(agent) = self.agents.get_mut(name) else { return };
            // The previous run is still being handled by the main agent: nothing of the next one yet.
            if let Some(previous) = &agent.settling {
                if self.handling.iter().any(|h| &h.wait_id == previous) {
                    return;
                }
                agent.settling = None;
            }
            // Register the run being reported.
            let mut register = None;
            if let Some(run) = agent.runs.front_mut()
                && !run.registered
            {
                run.registered = true;
                agent.announced = true;
                let mut w = Wait::new(&session, &run.wait_id, State::Waiting);
                w.kind = Some("subagent".into());
                w.child_session_id = Some(name.to_owned());
                w.title = Some(if run.spawn.description.is_empty() {
                    name.to_owned()
                } else {
                    run.spawn.description.clone()
                });
                w.model = run.spawn.model.clone().filter(|m| !m.is_empty());
                register = Some(w);
            }
            if let Some(w) = register {
                self.send(&w, out);
            }
            // Deliver the subagent's records.
            let mut frames = Vec::new();
            let mut task_events = Vec::new();
            let Some(agent) = self.agents.get_mut(name) else { return };
            while let Some(entry) = agent.pending.front() {
                match &entry.record {
                    Record::TurnPrompt { turn_id, origin } if origin.is_subagent_run() => {
                        let Some(run) = agent.runs.front_mut().filter(|r| r.turn.is_none()) else {
                            break; // the next run: wait until it is registered
                        };
                        run.turn = Some(*turn_id);
                        agent.run_turn = Some(*turn_id);
                        agent.turn = Some((*turn_id, origin.clone()));
                    }
                    Record::TurnPrompt { turn_id, origin } => agent.turn = Some((*turn_id, origin.clone())),
                    Record::TurnEnded { turn_id, .. } => {
                        if let Some(run) = agent.runs.front_mut()
                            && run.turn == Some(*turn_id)
                        {
                            run.turn_done = true;
                        }
                        agent.turn = None;
                    }
                    Record::Text { .. } | Record::ToolCall { .. } | Record::ToolResult { .. } => {
                        if let Some((turn, _)) = &agent.turn
                            && agent.run_turn == Some(*turn)
                            && agent.announced
                            && let Some(u) = progress(*turn, &entry.record)
                        {
                            frames.push(Some(update(name, u)));
                        }
                    }
                    Record::TaskStarted(info) if info.kind == "process" && agent.announced => {
                        task_events.push((frames.len(), info.clone(), true));
                        frames.push(None);
                    }
                    Record::TaskTerminated(info) if info.kind == "process" => {
                        task_events.push((frames.len(), info.clone(), false));
                        frames.push(None);
                    }
                    _ => {}
                }
                agent.pending.pop_front();
            }
            // Emit in record order (task reports go through the register).
            let mut tasks = task_events.into_iter().peekable();
            for (i, f) in frames.into_iter().enumerate() {
                match f {
                    Some(f) => out.push(f),
                    None => {
                        if let Some((at, info, started)) = tasks.next() {
                            debug_assert_eq!(at, i);
                            if started {
                                self.start_task(name, &info, out);
                            } else if self.tasks.get(&info.task_id).map(String::as_str) == Some(name) {
                                // A subagent's own task: its result goes to the subagent, never to main.
                                if let Some(state) = final_state(&info.status) {
                                    self.send(&Wait::new(name, &info.task_id, state), out);
                                }
                            }
                        }
                    }
                }
            }
            // Settle the front run once both its end and its turn's end are known.
            let Some(agent) = self.agents.get_mut(name) else { return };
            let Some(run) = agent.runs.front() else { return };
            let Some((state, ended_in, suppressed)) = run.end else { return };
            // Not before the run's turn end shows in its wire: its progress comes first (a scan that read
            // the parent's end record may precede the one that reads the subagent's last records).
            if !(run.turn_done || run.overdue) {
                return;
            }
            let Some(run) = agent.runs.pop_front() else { return };
            agent.run_turn = None;
            if run.spawn.background && run.spawn.parent_agent_id == MAIN {
                agent.settling = Some(run.wait_id.clone());
                self.end_item(run.wait_id, state, ended_in, suppressed, out);
            } else {
                // A foreground run's result is the Agent tool's result, inside the turn that called it.
                self.send(&Wait::new(&session, &run.wait_id, state), out);
            }
        }
    }
}

/// The `session/update` body for a progress record of turn `turn`.
fn progress(turn: i64, record: &Record) -> Option<Value> {
    Some(match record {
        Record::Text { text, thought, .. } => {
            if text.is_empty() {
                return None;
            }
            let kind = if *thought { "agent_thought_chunk" } else { "agent_message_chunk" };
            json!({ "sessionUpdate": kind, "content": { "type": "text", "text": text } })
        }
        Record::ToolCall { call_id, name, args, .. } => json!({
            "sessionUpdate": "tool_call",
            "toolCallId": format!("{turn}:{call_id}"),
            "title": name,
            "kind": tool_kind(name),
            "status": "in_progress",
            "rawInput": args,
        }),
        Record::ToolResult { call_id, output, is_error } => json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": format!("{turn}:{call_id}"),
            "status": if *is_error { "failed" } else { "completed" },
            "content": [{ "type": "content", "content": { "type": "text", "text": output } }],
            "rawOutput": output,
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::wire::parse_line;

    /// Feeds `(agent, record JSON)` pairs and returns the client frames as compact strings.
    fn run(t: &mut Translator, records: &[(&str, Value)]) -> Vec<String> {
        let mut out = Vec::new();
        for (agent, v) in records {
            let e = parse_line(v.to_string().as_bytes()).unwrap();
            t.entry(agent, e, &mut out);
        }
        t.drained(Instant::now(), &mut out);
        out.iter().map(show).collect()
    }

    /// `wait <session> <waitId> <state> [kind] [child]` or `update <session> <kind> <text|id>`.
    fn show(f: &Frame) -> String {
        let v = f.value();
        let p = &v["params"];
        let s = |k: &str| p[k].as_str().unwrap_or("").to_owned();
        match v["method"].as_str() {
            Some("_coda/wait") => {
                let mut line = format!("wait {} {} {}", s("sessionId"), s("waitId"), s("state"));
                for k in ["kind", "childSessionId", "title"] {
                    if let Some(x) = p[k].as_str() {
                        line += &format!(" {k}={x}");
                    }
                }
                line
            }
            _ => {
                let u = &p["update"];
                let what = u["content"]["text"].as_str().or(u["toolCallId"].as_str()).unwrap_or("");
                format!("update {} {} {what}", s("sessionId"), u["sessionUpdate"].as_str().unwrap_or(""))
            }
        }
    }

    fn prompt(turn: i64, origin: Value) -> Value {
        json!({"type":"turn.prompt","agentId":"x","turnId":turn,"origin":origin,"time":1})
    }
    fn user(turn: i64) -> Value {
        prompt(turn, json!({"kind":"user"}))
    }
    fn ended(turn: i64) -> Value {
        json!({"type":"turn.ended","agentId":"x","turnId":turn,"reason":"completed","time":1})
    }
    fn text(turn: i64, t: &str) -> Value {
        json!({"type":"context.append_loop_event","event":{"type":"content.part","turnId":turn.to_string(),"part":{"type":"text","text":t}},"time":1})
    }
    fn task(ty: &str, id: &str, status: &str) -> Value {
        json!({"type":ty,"agentId":"x","info":{"taskId":id,"kind":"process","status":status,"description":"d","command":"sleep 1"},"time":1})
    }
    fn agent_task(ty: &str, id: &str, agent: &str, status: &str) -> Value {
        json!({"type":ty,"info":{"taskId":id,"kind":"agent","agentId":agent,"status":status,"description":"sub"},"time":1})
    }
    fn spawned(agent: &str, task: &str, bg: bool) -> Value {
        json!({"type":"subagent.spawned","subagentId":agent,"parentAgentId":"main","description":"sub","runInBackground":bg,"model":"m","taskId":task,"time":1})
    }
    fn sub_ended(agent: &str) -> Value {
        json!({"type":"subagent.completed","subagentId":agent,"time":1})
    }
    fn run_prompt(turn: i64) -> Value {
        prompt(turn, json!({"kind":"system_trigger","name":"subagent"}))
    }

    fn t() -> Translator {
        Translator::new("S", "/d")
    }

    #[test]
    fn task_ending_inside_a_client_turn_settles_at_once() {
        let mut t = t();
        let out = run(
            &mut t,
            &[
                ("main", user(0)),
                ("main", task("task.started", "bash-1", "running")),
                ("main", task("task.terminated", "bash-1", "completed")),
                ("main", ended(0)),
            ],
        );
        assert_eq!(out, ["wait S bash-1 waiting kind=task title=d", "wait S bash-1 done"]);
        assert!(!t.main_busy());
    }

    #[test]
    fn task_ending_after_the_turn_is_handling_until_kimis_own_turn_ends() {
        let mut t = t();
        run(&mut t, &[("main", user(0)), ("main", task("task.started", "bash-1", "running")), ("main", ended(0))]);
        let out = run(&mut t, &[("main", task("task.terminated", "bash-1", "failed"))]);
        assert_eq!(out, ["wait S bash-1 handling"]);
        assert!(t.main_busy(), "a client prompt now must be held");
        let out = run(
            &mut t,
            &[
                ("main", prompt(1, json!({"kind":"task","taskId":"bash-1"}))),
                ("main", text(1, "saw it")),
                ("main", ended(1)),
            ],
        );
        assert_eq!(out, ["update S agent_message_chunk saw it", "wait S bash-1 failed"]);
        assert!(!t.main_busy());
    }

    /// An end of a turn that is not the running one (written late, or twice) leaves the running turn running:
    /// its own end then settles what it handles, and Kimi is no longer busy.
    #[test]
    fn the_end_of_another_turn_leaves_the_running_one_running() {
        let mut t = t();
        run(&mut t, &[("main", user(0)), ("main", task("task.started", "bash-1", "running")), ("main", ended(0))]);
        run(&mut t, &[("main", task("task.terminated", "bash-1", "failed"))]);
        run(&mut t, &[("main", prompt(1, json!({"kind":"task","taskId":"bash-1"})))]);
        assert!(run(&mut t, &[("main", ended(0))]).is_empty(), "turn 0's end again");
        assert!(t.main_busy(), "Kimi's own turn 1 still runs");
        let out = run(&mut t, &[("main", text(1, "saw it")), ("main", ended(1))]);
        assert_eq!(out, ["update S agent_message_chunk saw it", "wait S bash-1 failed"]);
        assert!(!t.main_busy(), "its end settled what it handled");
    }

    #[test]
    fn stopped_task_outside_a_turn_is_not_handled() {
        let mut t = t();
        run(&mut t, &[("main", user(0)), ("main", task("task.started", "bash-1", "running")), ("main", ended(0))]);
        let mut killed = task("task.terminated", "bash-1", "killed");
        killed["info"]["terminalNotificationSuppressed"] = json!(true);
        assert_eq!(run(&mut t, &[("main", killed)]), ["wait S bash-1 cancelled"]);
        assert!(!t.main_busy());
    }

    fn injected(task: &str) -> Value {
        json!({"type":"context.append_message","agentId":"main","message":{"role":"user","content":[],"origin":{"kind":"task","taskId":task}},"time":1})
    }

    #[test]
    fn several_ending_together_join_the_turn_their_notification_is_injected_into() {
        let mut t = t();
        run(
            &mut t,
            &[
                ("main", user(0)),
                ("main", task("task.started", "bash-1", "running")),
                ("main", task("task.started", "bash-2", "running")),
                ("main", ended(0)),
            ],
        );
        let out = run(
            &mut t,
            &[
                ("main", task("task.terminated", "bash-1", "completed")),
                ("main", prompt(1, json!({"kind":"task","taskId":"bash-1"}))),
                ("main", task("task.terminated", "bash-2", "completed")),
                ("main", injected("bash-2")),
                ("main", ended(1)),
            ],
        );
        assert_eq!(
            out,
            ["wait S bash-1 handling", "wait S bash-2 handling", "wait S bash-1 done", "wait S bash-2 done"]
        );
        assert!(!t.main_busy());
    }

    #[test]
    fn one_ending_during_the_turn_of_another_waits_for_the_turn_that_names_it() {
        // Seen live: the second task's notification got a turn of its own after the first one's.
        let mut t = t();
        run(
            &mut t,
            &[
                ("main", user(0)),
                ("main", task("task.started", "bash-1", "running")),
                ("main", task("task.started", "bash-2", "running")),
                ("main", ended(0)),
            ],
        );
        let out = run(
            &mut t,
            &[
                ("main", task("task.terminated", "bash-1", "completed")),
                ("main", prompt(1, json!({"kind":"task","taskId":"bash-1"}))),
                ("main", task("task.terminated", "bash-2", "failed")),
                ("main", text(1, "first")),
                ("main", ended(1)),
            ],
        );
        assert_eq!(
            out,
            [
                "wait S bash-1 handling",
                "wait S bash-2 handling",
                "update S agent_message_chunk first",
                "wait S bash-1 done"
            ]
        );
        assert!(t.main_busy(), "bash-2 still waits for its turn");
        let out = run(
            &mut t,
            &[
                ("main", prompt(2, json!({"kind":"task","taskId":"bash-2"}))),
                ("main", text(2, "second")),
                ("main", ended(2)),
            ],
        );
        assert_eq!(out, ["update S agent_message_chunk second", "wait S bash-2 failed"]);
        assert!(!t.main_busy());
    }

    #[test]
    fn background_subagent_in_order_even_when_its_wire_is_read_first() {
        let mut t = t();
        // The subagent's wire is read before the parent's spawn record.
        let out = run(
            &mut t,
            &[
                ("main", user(0)),
                ("agent-0", run_prompt(0)),
                ("agent-0", text(0, "working")),
                ("main", agent_task("task.started", "agent-aaaa1111", "agent-0", "running")),
                ("main", spawned("agent-0", "agent-aaaa1111", true)),
                ("main", ended(0)),
            ],
        );
        assert_eq!(
            out,
            [
                "wait S agent-aaaa1111 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk working"
            ]
        );
        // The parent's end record is read before the subagent's turn end: settlement waits for it.
        let out = run(
            &mut t,
            &[
                ("main", sub_ended("agent-0")),
                ("main", agent_task("task.terminated", "agent-aaaa1111", "agent-0", "completed")),
            ],
        );
        assert!(out.is_empty(), "{out:?}");
        let out = run(&mut t, &[("agent-0", text(0, "done!")), ("agent-0", ended(0))]);
        assert_eq!(out, ["update agent-0 agent_message_chunk done!", "wait S agent-aaaa1111 handling"]);
        let out = run(&mut t, &[("main", prompt(1, json!({"kind":"task"}))), ("main", ended(1))]);
        assert_eq!(out, ["wait S agent-aaaa1111 done"]);
    }

    #[test]
    fn the_next_run_of_a_subagent_waits_for_the_previous_to_settle() {
        let mut t = t();
        let out = run(
            &mut t,
            &[
                ("main", user(0)),
                ("main", spawned("agent-0", "agent-r1", false)),
                ("main", spawned("agent-0", "agent-r2", false)),
                ("agent-0", run_prompt(0)),
                ("agent-0", text(0, "one")),
                ("agent-0", ended(0)),
                ("agent-0", run_prompt(1)),
                ("agent-0", text(1, "two")),
                ("main", sub_ended("agent-0")),
                ("agent-0", ended(1)),
                ("main", sub_ended("agent-0")),
                ("main", ended(0)),
            ],
        );
        assert_eq!(
            out,
            [
                "wait S agent-r1 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk one",
                "wait S agent-r1 done",
                "wait S agent-r2 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk two",
                "wait S agent-r2 done",
            ]
        );
        assert!(!t.main_busy());
    }

    /// A background run of agent-0 that ended after the client turn: `handling` (Kimi's own turn is next).
    fn first_run_handling(t: &mut Translator) {
        let out = run(
            t,
            &[
                ("main", user(0)),
                ("main", agent_task("task.started", "agent-r1", "agent-0", "running")),
                ("main", spawned("agent-0", "agent-r1", true)),
                ("agent-0", run_prompt(0)),
                ("agent-0", text(0, "one")),
                ("main", ended(0)),
                ("agent-0", ended(0)),
                ("main", sub_ended("agent-0")),
                ("main", agent_task("task.terminated", "agent-r1", "agent-0", "completed")),
            ],
        );
        assert_eq!(
            out,
            [
                "wait S agent-r1 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk one",
                "wait S agent-r1 handling",
            ]
        );
    }

    #[test]
    fn a_run_resumed_in_kimis_own_turn_waits_until_the_handled_run_settled() {
        // Kimi's own turn on agent-r1's result resumes agent-0 in the foreground, inside that turn.
        let mut t = t();
        first_run_handling(&mut t);
        let out = run(
            &mut t,
            &[
                ("main", prompt(1, json!({"kind":"task","taskId":"agent-r1"}))),
                ("main", spawned("agent-0", "agent-r2", false)),
                ("agent-0", run_prompt(1)),
                ("agent-0", text(1, "two")),
                ("agent-0", ended(1)),
                ("main", sub_ended("agent-0")),
                ("main", text(1, "resumed it")),
            ],
        );
        assert_eq!(out, ["update S agent_message_chunk resumed it"], "nothing of the next run before agent-r1 settled");
        let out = run(&mut t, &[("main", ended(1))]);
        assert_eq!(
            out,
            [
                "wait S agent-r1 done",
                "wait S agent-r2 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk two",
                "wait S agent-r2 done",
            ]
        );
        assert!(!t.main_busy());
    }

    #[test]
    fn a_background_run_started_while_the_previous_is_handling_goes_on_after_it() {
        // Resumed in the background from Kimi's own turn; it outlives that turn and is handled by the next.
        let mut t = t();
        first_run_handling(&mut t);
        let out = run(
            &mut t,
            &[
                ("main", prompt(1, json!({"kind":"task","taskId":"agent-r1"}))),
                ("main", agent_task("task.started", "agent-r2", "agent-0", "running")),
                ("main", spawned("agent-0", "agent-r2", true)),
                ("agent-0", run_prompt(1)),
                ("agent-0", text(1, "two")),
            ],
        );
        assert!(out.is_empty(), "{out:?}");
        let out = run(&mut t, &[("main", ended(1))]);
        assert_eq!(
            out,
            [
                "wait S agent-r1 done",
                "wait S agent-r2 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk two",
            ]
        );
        let out = run(
            &mut t,
            &[
                ("agent-0", ended(1)),
                ("main", sub_ended("agent-0")),
                ("main", agent_task("task.terminated", "agent-r2", "agent-0", "completed")),
                ("main", prompt(2, json!({"kind":"task","taskId":"agent-r2"}))),
                ("main", ended(2)),
            ],
        );
        assert_eq!(out, ["wait S agent-r2 handling", "wait S agent-r2 done"]);
        assert!(!t.main_busy());
    }

    #[test]
    fn a_run_resumed_in_kimis_own_turn_after_the_previous_settled_goes_on_at_once() {
        // The previous run settled inside the client turn; Kimi's own turn (on a shell task) resumes agent-0.
        let mut t = t();
        run(
            &mut t,
            &[
                ("main", user(0)),
                ("main", task("task.started", "bash-1", "running")),
                ("main", spawned("agent-0", "agent-r1", false)),
                ("agent-0", run_prompt(0)),
                ("agent-0", ended(0)),
                ("main", sub_ended("agent-0")),
                ("main", ended(0)),
                ("main", task("task.terminated", "bash-1", "completed")),
            ],
        );
        let out = run(
            &mut t,
            &[
                ("main", prompt(1, json!({"kind":"task","taskId":"bash-1"}))),
                ("main", spawned("agent-0", "agent-r2", false)),
                ("agent-0", run_prompt(1)),
                ("agent-0", text(1, "two")),
                ("agent-0", ended(1)),
                ("main", sub_ended("agent-0")),
                ("main", ended(1)),
            ],
        );
        assert_eq!(
            out,
            [
                "wait S agent-r2 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk two",
                "wait S agent-r2 done",
                "wait S bash-1 done",
            ]
        );
    }

    #[test]
    fn after_a_load_in_a_fresh_process_the_next_run_is_reported_from_its_registration() {
        // A fresh translator (the shim restarted, then session/load): the earlier runs of agent-0 are
        // before the cutoff and never fed; the next run goes through registration, progress and settlement.
        let mut t = t();
        let out = run(
            &mut t,
            &[
                ("main", user(4)),
                ("main", spawned("agent-0", "agent-r3", false)),
                ("agent-0", run_prompt(7)),
                ("agent-0", text(7, "three")),
                ("agent-0", ended(7)),
                ("main", sub_ended("agent-0")),
                ("main", ended(4)),
            ],
        );
        assert_eq!(
            out,
            [
                "wait S agent-r3 waiting kind=subagent childSessionId=agent-0 title=sub",
                "update agent-0 agent_message_chunk three",
                "wait S agent-r3 done",
            ]
        );
    }

    #[test]
    fn a_subagents_own_task_is_reported_from_its_session_and_never_handled_by_main() {
        let mut t = t();
        let out = run(
            &mut t,
            &[
                ("main", user(0)),
                ("main", spawned("agent-0", "agent-r1", false)),
                ("agent-0", run_prompt(0)),
                ("agent-0", task("task.started", "bash-s", "running")),
                ("agent-0", ended(0)),
                ("main", sub_ended("agent-0")),
                ("main", ended(0)),
                ("agent-0", task("task.terminated", "bash-s", "completed")),
                ("agent-0", prompt(1, json!({"kind":"task","taskId":"bash-s"}))),
                ("agent-0", text(1, "not a run")),
                ("agent-0", ended(1)),
            ],
        );
        assert_eq!(
            out,
            [
                "wait S agent-r1 waiting kind=subagent childSessionId=agent-0 title=sub",
                "wait agent-0 bash-s waiting kind=task title=d",
                "wait S agent-r1 done",
                "wait agent-0 bash-s done",
            ]
        );
        assert!(!t.main_busy());
    }

    #[test]
    fn unknown_tasks_from_before_the_start_are_ignored() {
        let mut t = t();
        assert!(run(&mut t, &[("main", task("task.terminated", "bash-old", "lost"))]).is_empty());
    }
}

//! A compaction backend ([`crate::coda::compact::Compactor`]) for an ACP agent that compacts on a slash command
//! of its own (`/compact`, Qwen Code's `/compress`), which the shim sends as a `session/prompt` of its own, and
//! reports in ACP's `compaction_update` (codex-acp, Claude Agent ACP), in the "Compact conversation" tool call
//! AIR clients get, or in updates of its own that the adapter reads ([`Own`]). The machine keeps the rules of
//! section 压缩上下文; this backend only starts, reads and ends the agent's compaction:
//!
//! - The shim's prompt is no turn of Coda's. Of the session's updates while it runs, `compaction_update` and
//!   `usage_update` pass on (Coda reads them between turns too), so do updates that are no turn's content
//!   (commands, config, titles); the turn's content is dropped: messages, thoughts, plans, tool calls (for a
//!   Coda that did not declare `session.compaction`, the compaction shows as the "Compact conversation" tool
//!   call) and codex-acp's `threadStatus` active/idle of its start and end. Its answer is the shim's and never
//!   reaches Coda.
//! - The outcome: compacted when the agent reported the compaction completed, with `before` and `after` in one
//!   measure: the agent's own counts where it reports them ([`Said::Completed`]), else its `used` when it started
//!   (the last response's tokens as the model reported them: its latest `usage_update`'s, which the usage facts
//!   layer below keeps in the session table, [`crate::layer::sessions::Session::used`]) and no `after`: a
//!   `usage_update` during the compaction is the agent's own estimate, another measure (codex-acp live against
//!   the fake model: 110 reported before, 7601 estimated after), and the next response's count comes after the
//!   answer; not compacted with the agent's own text when it failed (the failed update's `error`, an error
//!   answer's `data.message` before its generic `message`), was cancelled, found nothing to compact, or ended
//!   without saying it compacted.
//! - Stopped (past the deadline) with `session/cancel`, which ends the shim's prompt `cancelled`.

use crate::{HashMap, HashSet};
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::compact::{Compactor, Ctl, Outcome};
use crate::frame::{Frame, Kind};

/// The longest part of the agent's own error text a reason quotes, in characters.
const REASON_MAX: usize = 300;

/// Updates that are a turn's content: the shim's prompt shows none of them to Coda.
const TURN_CONTENT: [&str; 7] = [
    "agent_message_chunk",
    "agent_thought_chunk",
    "user_message_chunk",
    "tool_call",
    "tool_call_update",
    "plan",
    "compaction_summary_chunk",
];

/// What an update of the agent's own says of the compaction it runs ([`Own`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Started,
    /// Compacted, with the agent's own counts of the context before and after (one measure).
    Completed {
        before: Option<u64>,
        after: Option<u64>,
    },
    /// It could not, and why (the agent's text).
    Failed(String),
    /// It found nothing to compact.
    Nothing,
}

/// Reads the agent's own report of its compaction in one `session/update` (its `update` object) of the session
/// that compacts; `None`: the update says nothing of it.
pub type Own = fn(&Value) -> Option<Said>;

/// The shim's prompt for a session, in a compaction round.
pub struct Asked {
    session: String,
    round: u64,
}

#[derive(Debug, PartialEq)]
enum Progress {
    NotSeen,
    Started,
    Completed,
    Failed(String),
    Nothing,
}

/// One compaction the agent runs.
struct Running {
    round: u64,
    before: Option<u64>,
    after: Option<u64>,
    progress: Progress,
    /// The "Compact conversation" tool calls of this compaction.
    tools: HashSet<String>,
}

/// The slash-command compaction of one agent (see the module docs).
pub struct SlashCompact {
    /// The agent as people know it ("Codex"), in reasons.
    agent: &'static str,
    /// The prompt's text ("/compact").
    command: &'static str,
    own: Option<Own>,
    running: HashMap<String, Running>,
}

fn cut(s: &str) -> String {
    match s.char_indices().nth(REASON_MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// The agent's own text in an error: codex-acp answers `-32603 "Internal error"` with Codex's message in
/// `data.message`; a failed update's `error` is a string or `{message}`.
fn error_text(error: &Value) -> String {
    let text = error.pointer("/data/message").or_else(|| error.get("message")).and_then(Value::as_str);
    match (error, text) {
        (Value::String(s), _) => s.clone(),
        (_, Some(t)) => t.to_owned(),
        (e, None) => e.to_string(),
    }
}

impl SlashCompact {
    /// `agent` compacts on the prompt `command` and reports in ACP's `compaction_update`, and (`own`) in
    /// updates of its own.
    pub fn new(agent: &'static str, command: &'static str, own: Option<Own>) -> SlashCompact {
        SlashCompact { agent, command, own, running: HashMap::default() }
    }

    /// A `session/update` from the agent: what a running compaction learns from it, and whether it goes on.
    fn update(&mut self, frame: &Frame) -> bool {
        if self.running.is_empty() {
            return true;
        }
        let kind = frame.session_update().unwrap_or_default();
        let value = frame.value();
        let Some(session) = value.pointer("/params/sessionId").and_then(Value::as_str) else { return true };
        let update = &value["params"]["update"];
        let Some(run) = self.running.get_mut(session) else { return true };
        if let Some(said) = self.own.and_then(|own| own(update)) {
            run.progress = match said {
                Said::Started => Progress::Started,
                Said::Completed { before, after } => {
                    if before.is_some() || after.is_some() {
                        (run.before, run.after) = (before, after);
                    }
                    Progress::Completed
                }
                Said::Failed(why) => Progress::Failed(why),
                Said::Nothing => Progress::Nothing,
            };
        }
        let status = update.get("status").and_then(Value::as_str);
        let tool = update.get("toolCallId").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "usage_update" => true,
            "compaction_update" => {
                run.progress = match status {
                    Some("in_progress") => Progress::Started,
                    Some("completed") => Progress::Completed,
                    Some("failed") => {
                        let error = update.get("error").map(error_text);
                        Progress::Failed(error.unwrap_or_else(|| "no reason given".into()))
                    }
                    _ => std::mem::replace(&mut run.progress, Progress::NotSeen),
                };
                true
            }
            "tool_call" if update.pointer("/_meta/jetbrains/air/contextCompaction").is_some() => {
                run.tools.insert(tool.to_owned());
                run.progress = Progress::Started;
                tracing::debug!("the shim's {}: the compaction tool call dropped", self.command);
                false
            }
            "tool_call_update" if run.tools.contains(tool) => {
                match status {
                    Some("completed") => run.progress = Progress::Completed,
                    Some("failed") => run.progress = Progress::Failed("the compaction tool call failed".into()),
                    _ => {}
                }
                tracing::debug!("the shim's {}: the compaction tool call update dropped", self.command);
                false
            }
            k if TURN_CONTENT.contains(&k) => {
                tracing::debug!("the shim's {}: a {k} dropped (no turn of Coda's)", self.command);
                false
            }
            "session_info_update" if update.pointer("/_meta/codex/threadStatus").is_some() => {
                tracing::debug!("the shim's {}: its thread status dropped (no turn of Coda's)", self.command);
                false
            }
            _ => true,
        }
    }

    fn outcome(&self, run: &Running, reply: &Frame) -> Outcome {
        let agent = self.agent;
        match &run.progress {
            Progress::Failed(why) => return Outcome::not(format!("{agent} could not compact: {}", cut(why))),
            Progress::Nothing => return Outcome::not(format!("{agent} found nothing to compact")),
            _ => {}
        }
        let reply = reply.value();
        if let Some(error) = reply.get("error") {
            return Outcome::not(format!("{agent} could not compact: {}", cut(&error_text(error))));
        }
        let stop = reply.pointer("/result/stopReason").and_then(Value::as_str);
        match (&run.progress, stop) {
            (Progress::Completed, _) => Outcome::Compacted { before: run.before, after: run.after },
            (_, Some("cancelled")) => Outcome::not("the compaction was cancelled"),
            _ => Outcome::not(format!("{agent} ended {} without reporting a compaction", self.command)),
        }
    }
}

impl Compactor for SlashCompact {
    fn session_closed(&mut self, session: &str, _ctl: &mut Ctl<Self>) {
        self.running.remove(session);
    }

    fn kept(&self) -> usize {
        self.running.len()
    }

    type Event = Infallible;
    type Reply = Asked;
    type Timer = Infallible;

    fn start(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>) {
        // (The CLI's latest `used`, as the usage facts layer below read it.)
        let before = ctl.cx.session(session).and_then(|s| s.used());
        let run = Running { round, before, after: None, progress: Progress::NotSeen, tools: HashSet::default() };
        self.running.insert(session.to_owned(), run);
        let prompt = json!({"sessionId": session, "prompt": [{"type": "text", "text": self.command}]});
        ctl.request("session/prompt", prompt, Asked { session: session.to_owned(), round });
    }

    fn finished(&mut self, session: &str, round: u64, _ctl: &mut Ctl<Self>) {
        if self.running.get(session).is_some_and(|r| r.round == round) {
            self.running.remove(session);
        }
    }

    fn from_agent(&mut self, frame: &Frame, _ctl: &mut Ctl<Self>) -> bool {
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => self.update(frame),
            _ => true,
        }
    }

    fn ignores(&self, frame: &Frame) -> bool {
        // `update` reads updates only while a compaction runs.
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => self.running.is_empty(),
            _ => true,
        }
    }

    fn on_reply(&mut self, asked: Asked, reply: Frame, ctl: &mut Ctl<Self>) {
        let Some(run) = self.running.get(&asked.session).filter(|r| r.round == asked.round) else {
            return tracing::debug!("the agent answered the shim's {} after the shim stopped waiting", self.command);
        };
        let outcome = self.outcome(run, &reply);
        ctl.ended(&asked.session, asked.round, outcome);
    }
}

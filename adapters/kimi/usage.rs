//! coda-kimi's usage facts (Coda's 用量里的数据): `_meta.coda` on Kimi's `usage_update`s, from its wire, and a
//! `usage_update` of the shim's where Kimi sends none.
//!
//! Where each fact comes from (main agent's wire, `agents/main/wire.jsonl`, handed in as [`WireFacts`]):
//! - `lastRequestAt`: the `time` of the last `llm.request` of kind `loop` (Kimi's clock, written just before
//!   it sends the request; compaction summaries are not the main thread's requests).
//! - `contextTokens`: the `usage.record` answering that request: inputOther + inputCacheRead +
//!   inputCacheCreation, as the provider reported them.
//! - `compactedAt`: the `time` of the last `context.apply_compaction` (asked for or automatic).
//! - `cacheTtl`: Kimi does not say it; never written.
//!
//! Kimi sends its `usage_update {used, size}` right after answering a prompt the shim forwarded, and none
//! after `/compact` or after a turn it started itself. Its update is stamped once the wire has shown the end
//! of that prompt's turn (it writes the turn's end before it answers, but the watch may read it a little
//! later): until then it, and every frame from Kimi after it, waits here, at most [`HOLD`]. Where Kimi sends
//! none the shim sends one ([`Facts::update`], with Kimi's own `used`, its token count, and `size`, the
//! model's window): at the end of Kimi's own turns, and after a compaction that ended between turns.
//!
//! Kimi's ACP sessions are all root sessions (its subagents never reach ACP, and their wires are not read
//! here).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::adapters::kimi::BUILTINS;
use crate::adapters::kimi::facts::WireFacts;
use crate::adapters::kimi::wire::Record;
use crate::coda::usage::Facts;
use crate::frame::{Frame, Id, Kind};
use crate::layer::{Cx, Layer};

/// The longest a `usage_update` of Kimi's waits for the wire to show its turn's end (then it is stamped with
/// what is known, with a warning): the activity layer's hold of the prompt answer, for the same reason.
pub const HOLD: Duration = Duration::from_secs(2);

/// The wake-up of the hold ([`HOLD`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Release;

#[derive(Default)]
struct Session {
    facts: Facts,
    /// The last `llm.request` was a step of the agent's loop: the `usage.record` after it is its context.
    after_loop: bool,
    /// Kimi's own count of its context (its `used`).
    used: Option<u64>,
    /// The model's context window: from Kimi's `usage_update`, else from the wire's `llm.request`.
    size: Option<u64>,
    wire_size: Option<u64>,
    /// Prompts forwarded to Kimi that make a turn, and the ends of client turns the wire showed.
    sent: u64,
    ended: u64,
    /// The main turn the wire shows running: whether a client prompt started it.
    turn: Option<bool>,
    /// A compaction applied that no `usage_update` has carried yet.
    unsent_compaction: bool,
}

impl Session {
    /// The wire has shown the end of every client turn Kimi was sent.
    fn caught_up(&self) -> bool {
        self.ended >= self.sent
    }
}

pub struct Usage {
    sessions: HashMap<String, Session>,
    /// Prompts counted in [`Session::sent`], by request id, until answered.
    counted: HashMap<Id, String>,
    /// Frames from Kimi waiting behind a `usage_update` whose turn the wire has not shown the end of yet, in
    /// the order they came.
    held: VecDeque<Frame>,
}

/// A time of Kimi's wire (milliseconds since the epoch); 0 is none.
fn wire_time(ms: u64) -> Option<SystemTime> {
    (ms > 0).then(|| UNIX_EPOCH.checked_add(Duration::from_millis(ms))).flatten()
}

/// Whether a prompt starts a turn in Kimi: anything but one of its builtin slash commands.
fn makes_turn(prompt: &Value) -> bool {
    let first = prompt.pointer("/params/prompt/0/text").and_then(Value::as_str).unwrap_or("");
    let Some(command) = first.strip_prefix('/') else { return true };
    let name = command.split_whitespace().next().unwrap_or("");
    !BUILTINS.contains(&name)
}

fn session_of(v: &Value) -> Option<String> {
    v.pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned)
}

impl Default for Usage {
    fn default() -> Self {
        Usage::new()
    }
}

impl Usage {
    pub fn new() -> Usage {
        Usage { sessions: HashMap::new(), counted: HashMap::new(), held: VecDeque::new() }
    }

    /// The session a `usage_update` of Kimi's is of, when it is one of a known session (else None).
    fn usage_session(&self, frame: &Frame) -> Option<String> {
        if frame.session_update() != Some("usage_update") {
            return None;
        }
        let v = frame.value().ok()?;
        session_of(&v).filter(|s| self.sessions.contains_key(s))
    }

    /// Kimi's `usage_update` with the facts written in (its `size` remembered).
    fn stamped(&mut self, frame: Frame, session: &str) -> Frame {
        let Some(s) = self.sessions.get_mut(session) else { return frame };
        let Ok(mut v) = frame.value() else { return frame };
        if let Some(size) = v.pointer("/params/update/size").and_then(Value::as_u64) {
            s.size = Some(size);
        }
        if s.facts.is_empty() {
            return frame;
        }
        s.unsent_compaction = false;
        s.facts.stamp(&mut v);
        Frame::from_value(&v)
    }

    /// Sends on what was held, in order, up to a `usage_update` whose turn is still not shown (all of it
    /// with `all`, when the hold ran out).
    fn release(&mut self, all: bool, cx: &mut Cx) {
        while let Some(front) = self.held.front() {
            let session = self.usage_session(front);
            if let Some(sid) = &session
                && !all
                && !self.sessions[sid].caught_up()
            {
                return;
            }
            let frame = self.held.pop_front().expect("a front");
            let frame = match session {
                Some(sid) => self.stamped(frame, &sid),
                None => frame,
            };
            cx.to_client(frame);
        }
        cx.cancel(&Release);
    }

    /// A frame towards the client, behind what is held.
    fn emit(&mut self, frame: Frame, cx: &mut Cx) {
        if !self.held.is_empty() {
            self.held.push_back(frame);
            return;
        }
        match self.usage_session(&frame) {
            Some(sid) if !self.sessions[&sid].caught_up() => {
                self.held.push_back(frame);
                cx.after(HOLD, Release);
            }
            Some(sid) => {
                let frame = self.stamped(frame, &sid);
                cx.to_client(frame);
            }
            None => cx.to_client(frame),
        }
    }

    /// A `usage_update` of the shim's for `session`, where Kimi sends none.
    fn own_update(&mut self, session: &str, cx: &mut Cx) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        let used = s.used.or(s.facts.context_tokens);
        let (Some(used), Some(size)) = (used, s.size.or(s.wire_size)) else {
            tracing::debug!("no usage_update of the shim's for session {session}: Kimi's count or window unknown");
            return;
        };
        if s.facts.is_empty() {
            return;
        }
        s.unsent_compaction = false;
        let frame = s.facts.update(session, used, size);
        if self.held.is_empty() { cx.to_client(frame) } else { self.held.push_back(frame) }
    }

    /// What the wire said of one session's main agent.
    pub fn facts(&mut self, facts: WireFacts, cx: &mut Cx) {
        let session = facts.session;
        for entry in facts.entries {
            let Some(s) = self.sessions.get_mut(&session) else { break };
            let at = wire_time(entry.time);
            match entry.record {
                Record::TurnPrompt { origin, .. } => s.turn = Some(origin.is_user()),
                Record::TurnEnded { .. } => match s.turn.take() {
                    Some(true) => s.ended += 1,
                    // Kimi sends no usage_update after a turn it started itself.
                    Some(false) => self.own_update(&session, cx),
                    None => {}
                },
                Record::LlmRequest { kind, max_tokens } => {
                    s.after_loop = kind == "loop";
                    if s.after_loop && at.is_some() {
                        s.facts.last_request_at = at;
                    }
                    if max_tokens.is_some() {
                        s.wire_size = max_tokens;
                    }
                }
                Record::Usage { input: Some(n) } if s.after_loop => s.facts.context_tokens = Some(n),
                Record::TokenCount { tokens } => s.used = Some(tokens),
                Record::CompactionApplied { .. } if at.is_some() => {
                    s.facts.compacted_at = at;
                    s.unsent_compaction = true;
                }
                Record::CompactionEnded { completed: true }
                    if s.unsent_compaction && s.turn.is_none() && s.caught_up() =>
                {
                    // Between turns (asked for): Kimi sends no usage_update after it.
                    self.own_update(&session, cx);
                }
                _ => {}
            }
        }
        self.release(false, cx);
    }
}

impl Layer for Usage {
    type Timer = Release;
    type Event = WireFacts;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if let Kind::Request { id, method } = frame.kind()
            && method.as_ref() as &str == "session/prompt"
        {
            let v = match frame.value() {
                Ok(v) => v,
                Err(e) => return cx.unreadable(frame, &e, true),
            };
            if let Some(sid) = session_of(&v)
                && makes_turn(&v)
                && let Some(s) = self.sessions.get_mut(&sid)
            {
                s.sent += 1;
                self.counted.insert(id.clone(), sid);
            }
        }
        cx.to_agent(frame);
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        if let Kind::Response { id } = frame.kind() {
            let counted = self.counted.remove(id);
            let request = cx.answer_to(&frame).map(|r| (r.method.to_string(), r.session().map(str::to_owned)));
            let needs_value = counted.is_some()
                || request
                    .as_ref()
                    .is_some_and(|(m, _)| matches!(m.as_str(), "session/new" | "session/load" | "session/resume"));
            if needs_value {
                let v = match frame.value() {
                    Ok(v) => v,
                    Err(e) => return cx.unreadable(frame, &e, false),
                };
                let refused = v.get("result").is_none();
                if let Some(sid) = counted
                    && refused
                    && let Some(s) = self.sessions.get_mut(&sid)
                {
                    // Refused: no turn in Kimi.
                    s.sent = s.sent.saturating_sub(1);
                }
                if let Some((method, asked)) = request
                    && method != "session/prompt"
                    && !refused
                {
                    let named = v.pointer("/result/sessionId").and_then(Value::as_str).map(str::to_owned);
                    if let Some(sid) = named.or(asked) {
                        self.sessions.entry(sid).or_default();
                    }
                }
            }
        }
        self.emit(frame, cx);
    }

    fn on_event(&mut self, facts: WireFacts, cx: &mut Cx) {
        self.facts(facts, cx);
    }

    fn on_timer(&mut self, _: Release, cx: &mut Cx) {
        if !self.held.is_empty() {
            tracing::warn!(
                "Kimi sent a usage_update but its wire has not shown that turn's end within {HOLD:?}; sending it \
                 with the facts known (they may be a turn old)"
            );
            self.release(true, cx);
        }
    }
}

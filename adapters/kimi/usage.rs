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
    /// The watch has handed in records of this session: without it (its files cannot be read) nothing waits.
    wired: bool,
}

impl Session {
    /// The wire has shown the end of every client turn Kimi was sent (or is not read).
    fn caught_up(&self) -> bool {
        !self.wired || self.ended >= self.sent
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
        frame.session().map(|s| s.into_owned()).filter(|s| self.sessions.contains_key(s))
    }

    /// Kimi's `usage_update` with the facts written in (its `size` remembered).
    fn stamped(&mut self, frame: Frame, session: &str) -> Frame {
        let Some(s) = self.sessions.get_mut(session) else { return frame };
        // Read where it lies and written in place (a `usage_update` is a fifth of Kimi's stream).
        let size = frame.update_value().and_then(|u| u.get("size")).and_then(|size| size.as_u64());
        if let Some(size) = size {
            s.size = Some(size);
        }
        if s.facts.is_empty() {
            return frame;
        }
        s.unsent_compaction = false;
        s.facts.stamp_frame(&frame).unwrap_or(frame)
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
            s.wired = true;
            let at = wire_time(entry.time);
            match entry.record {
                Record::TurnPrompt { origin, .. } => s.turn = Some(origin.is_user()),
                Record::TurnEnded { .. } => match s.turn.take() {
                    // A client turn of a prompt not counted here (none is expected) counts for no later one.
                    Some(true) => s.ended = (s.ended + 1).min(s.sent),
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
            let v = frame.value();
            if let Some(sid) = session_of(v)
                && makes_turn(v)
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
                let v = frame.value();
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

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        // What `emit` neither holds nor stamps.
        self.held.is_empty()
            && !matches!(frame.kind(), Kind::Response { .. })
            && frame.session_update() != Some("usage_update")
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
            // The turns that never showed count for no later update.
            for s in self.sessions.values_mut() {
                s.ended = s.sent;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::wire::parse_line;
    use crate::layer::testing::Harness;
    use serde_json::json;

    const SID: &str = "session_6b1d1f0e-0000-4000-8000-0000000000u5";

    /// The usage layer alone, after `session/new` was answered.
    fn rig() -> Harness {
        let mut h = Harness::of(Usage::new());
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":SID}}));
        assert_eq!(h.to_client().len(), 1);
        h
    }

    fn wire(h: &mut Harness, records: &[Value]) {
        let entries = records.iter().map(|r| parse_line(r.to_string().as_bytes()).unwrap()).collect();
        h.event(0, WireFacts { session: SID.into(), entries });
    }

    fn prompt(id: i64, text: &str) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":SID,"prompt":[{"type":"text","text":text}]}})
    }

    fn usage_update(used: u64) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SID,"update":{"sessionUpdate":"usage_update","used":used,"size":131072}}})
    }

    fn turn(kind: &str, id: i64, request_at: u64, input: u64) -> Vec<Value> {
        vec![
            json!({"type":"turn.prompt","agentId":"main","turnId":id,"origin":{"kind":kind},"input":[],"time":request_at - 5}),
            json!({"type":"llm.request","agentId":"main","kind":"loop","maxTokens":40000,"time":request_at}),
            json!({"type":"usage.record","agentId":"main","usage":{"inputOther":input,"output":5,"inputCacheRead":0,"inputCacheCreation":0},"usageScope":"turn","time":request_at + 20}),
            json!({"type":"token_counting.measured","agentId":"main","tokens":input + 5,"time":request_at + 21}),
            json!({"type":"turn.ended","agentId":"main","turnId":id,"reason":"completed","time":request_at + 30}),
        ]
    }

    fn iso_ms(ms: u64) -> String {
        crate::coda::usage::iso(UNIX_EPOCH + Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn kimis_update_waits_for_its_turn_in_the_wire_and_carries_that_turns_request() {
        let mut h = rig();
        h.from_client(prompt(2, "go"));
        let records = turn("user", 0, 1_796_185_815_017, 21864);
        wire(&mut h, &records[..1]);
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        // Kimi's update came before the watch read the turn: it waits, and what follows waits behind it.
        h.from_agent(usage_update(21869));
        let after = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SID,"update":{"sessionUpdate":"available_commands_update","availableCommands":[]}}});
        h.from_agent(after.clone());
        let out = h.to_client();
        assert_eq!(out.len(), 1, "the answer went on: {out:?}");
        assert_eq!(h.next_wake(), Some(HOLD));
        wire(&mut h, &records[1..]);
        let out = h.to_client();
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            out[0]["params"]["update"]["_meta"],
            json!({"coda":{"lastRequestAt": iso_ms(1_796_185_815_017),"contextTokens":21864}})
        );
        assert_eq!(out[0]["params"]["update"]["used"], 21869, "Kimi's own figures stay");
        assert_eq!(out[1], after);
        assert_eq!(h.next_wake(), None);
        // Its next update, the wire caught up: at once.
        h.from_agent(usage_update(21869));
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"]["coda"]["contextTokens"], 21864);
    }

    #[test]
    fn without_the_sessions_files_nothing_waits_and_nothing_is_stamped() {
        let mut h = rig();
        h.from_client(prompt(2, "go"));
        h.from_agent(usage_update(15));
        assert_eq!(h.to_client(), [usage_update(15)]);
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn a_turn_that_never_shows_releases_the_update_after_the_hold() {
        let mut h = rig();
        wire(&mut h, &turn("user", 0, 1_000_000, 900));
        h.from_client(prompt(2, "go"));
        h.from_agent(usage_update(905));
        assert!(h.to_client().is_empty());
        h.advance(HOLD - Duration::from_millis(1));
        assert!(h.to_client().is_empty());
        h.advance(Duration::from_millis(1));
        let out = h.to_client();
        assert_eq!(out[0]["params"]["update"]["_meta"]["coda"]["contextTokens"], 900, "the facts known");
        // Builtin slash commands make no turn and a refused prompt none either: nothing waits for them.
        h.from_client(prompt(3, "/status"));
        h.from_client(prompt(4, "busy"));
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"error":{"code":-32600,"message":"turn.agent_busy"}}));
        h.from_agent(usage_update(905));
        assert_eq!(h.to_client().len(), 2, "the error and the update, at once");
    }

    #[test]
    fn kimis_own_turn_and_a_compaction_between_turns_get_an_update_of_the_shims() {
        let mut h = rig();
        wire(&mut h, &turn("task", 0, 2_000_000, 22000));
        let out = h.to_client();
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0]["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":22005,"size":40000,"_meta":{"coda":{
                "lastRequestAt": iso_ms(2_000_000),"contextTokens":22000}}})
        );
        // `/compact`: its summary request is not the main thread's, its usage not the context.
        wire(
            &mut h,
            &[
                json!({"type":"full_compaction.begin","source":"manual","agentId":"main","time":2_100_000}),
                json!({"type":"llm.request","agentId":"main","kind":"compaction","maxTokens":40000,"time":2_100_010}),
                json!({"type":"usage.record","agentId":"main","usage":{"inputOther":23000,"output":5},"usageScope":"session","time":2_100_020}),
                json!({"type":"context.apply_compaction","agentId":"main","tokensBefore":32720,"tokensAfter":22290,"time":2_100_030}),
                json!({"type":"token_counting.rebased","agentId":"main","tokens":22290,"time":2_100_031}),
                json!({"type":"full_compaction.complete","agentId":"main","time":2_100_032}),
            ],
        );
        let out = h.to_client();
        assert_eq!(
            out[0]["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":22290,"size":40000,"_meta":{"coda":{
                "lastRequestAt": iso_ms(2_000_000),"contextTokens":22000,"compactedAt": iso_ms(2_100_030)}}})
        );
    }

    #[test]
    fn hostile_wire_records_change_no_fact_and_send_nothing() {
        let mut h = rig();
        wire(&mut h, &turn("task", 0, 3_000_000, 500));
        assert_eq!(h.to_client().len(), 1);
        wire(
            &mut h,
            &[
                // Numbers that are no token counts, a cancel and a complete without a compaction, a time of 1e400.
                json!({"type":"llm.request","agentId":"main","kind":"loop","time":3_100_000}),
                json!({"type":"usage.record","agentId":"main","usage":{"inputOther":-4},"time":3_100_001}),
                json!({"type":"full_compaction.cancel","agentId":"main","time":3_100_002}),
                json!({"type":"full_compaction.complete","agentId":"main","time":3_100_003}),
            ],
        );
        let line = br#"{"type":"context.apply_compaction","agentId":"main","tokensBefore":1e400,"time":1e400}"#;
        h.event(0, WireFacts { session: SID.into(), entries: vec![parse_line(line).unwrap()] });
        wire(&mut h, &[json!({"type":"full_compaction.complete","agentId":"main","time":3_100_004})]);
        assert!(h.to_client().is_empty(), "nothing to say");
        // Another session's records (not one Kimi answered) are not read.
        h.event(0, WireFacts { session: "session_other".into(), entries: vec![] });
        h.from_agent(usage_update(505));
        assert_eq!(
            h.to_client()[0]["params"]["update"]["_meta"]["coda"],
            json!({"lastRequestAt": iso_ms(3_100_000), "contextTokens": 500})
        );
    }
}

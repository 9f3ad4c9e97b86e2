//! Where Kimi's usage facts are (section 用量里的数据; the rules are [`crate::coda::usage`]'s): its wire.
//!
//! Where each fact comes from (main agent's wire, `agents/main/wire.jsonl`, handed in as [`WireFacts`]):
//! - `lastRequestAt`: the `time` of the last `llm.request` of kind `loop` (Kimi's clock, written just before
//!   it sends the request; compaction summaries are not the main thread's requests).
//! - `contextTokens`: the `usage.record` answering that request: inputOther + inputCacheRead +
//!   inputCacheCreation, as the provider reported them.
//! - `compactedAt`: the `time` of the last `context.apply_compaction` (asked for or automatic).
//! - `cacheTtl`: Kimi does not say it.
//! - At load: the same records, read from the history of the session's main wire ([`history`]).
//!
//! Kimi sends its `usage_update {used, size}` right after answering a prompt the shim forwarded, and none
//! after `/compact` or after a turn it started itself. Its update waits until the wire has shown the end of that
//! prompt's turn (it writes the turn's end before it answers, but the watch may read it a little later:
//! [`Source::waits`]). Where Kimi sends none the shim sends one, with Kimi's own `used` (its token count) and
//! `size` (the model's window): at the end of Kimi's own turns, and after a compaction that ended between turns.
//!
//! Kimi's subagents never reach ACP, and their wires are not read here.

use crate::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::adapters::kimi::BUILTINS;
use crate::adapters::kimi::facts::WireFacts;
use crate::adapters::kimi::wire::{self, Record};
use crate::coda::usage::{Fact, Facts, Figures, LoadJob, Said, Source, UsageFacts, history_lines, per_root};
use crate::frame::{Frame, Id, Kind};
use crate::inside::Folder;
use crate::layer::Cx;

#[derive(Default)]
struct Session {
    /// The last `llm.request` was a step of the agent's loop: the `usage.record` after it is its context.
    after_loop: bool,
    /// The model's window: Kimi's own `size`, else the wire's `maxTokens`.
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
    /// The skills Kimi offers in the session (its last `available_commands_update`, builtins left out): a slash
    /// command naming one runs a turn. None until Kimi said.
    skills: Option<HashSet<String>>,
}

impl Session {
    /// The wire has shown the end of every client turn Kimi was sent (or is not read).
    fn caught_up(&self) -> bool {
        !self.wired || self.ended >= self.sent
    }
}

/// A time of Kimi's wire (milliseconds since the epoch); 0 is none.
fn wire_time(ms: u64) -> Option<SystemTime> {
    (ms > 0).then(|| UNIX_EPOCH.checked_add(Duration::from_millis(ms))).flatten()
}

/// Whether a prompt starts a turn in Kimi (reference notes kimi.md, slash commands): anything but a slash
/// command, or one naming a skill Kimi offers in the session (`skills`, its `available_commands_update`: user
/// skills as `skill:<name>`, builtin skills by their bare name). A builtin runs no turn, nor does a name Kimi does
/// not know (`Unknown ACP command`). Before Kimi said which it offers, only `skill:<name>` counts as one.
fn makes_turn(prompt: &Value, skills: Option<&HashSet<String>>) -> bool {
    let first = prompt.pointer("/params/prompt/0/text").and_then(Value::as_str).unwrap_or("");
    let Some(command) = first.strip_prefix('/') else { return true };
    let name = command.split_whitespace().next().unwrap_or("");
    if BUILTINS.contains(&name) {
        return false;
    }
    match skills {
        Some(skills) => skills.contains(name),
        None => name.starts_with("skill:"),
    }
}

/// The most skill names kept per session, and the longest name kept.
const SKILLS_MAX: usize = 1024;
const SKILL_NAME_MAX: usize = 256;

/// Where Kimi's facts are (see the module's docs).
pub struct Kimi {
    /// Kimi's data root (where [`history`] finds a loaded session's wire).
    root: Option<PathBuf>,
    sessions: HashMap<String, Session>,
    /// Prompts counted in [`Session::sent`], by request id, until answered.
    counted: HashMap<Id, String>,
}

impl Kimi {
    pub fn new(root: Option<PathBuf>) -> Kimi {
        Kimi { root, sessions: HashMap::default(), counted: HashMap::default() }
    }

    fn session(&mut self, session: &str, cx: &Cx) -> Option<&mut Session> {
        per_root(&mut self.sessions, session, cx, |_| false)
    }
}

impl Source for Kimi {
    type Event = WireFacts;

    fn closed(&mut self, session: &str) {
        self.sessions.remove(session);
        self.counted.retain(|_, s| s != session);
    }

    fn kept(&self) -> usize {
        self.sessions.len() + self.counted.len()
    }

    fn from_client(&mut self, frame: &Frame, cx: &mut Cx, _: &mut Said) {
        let Kind::Request { id, method } = frame.kind() else { return };
        if method.as_ref() as &str != "session/prompt" {
            return;
        }
        let Some(sid) = cx.request_of(id).and_then(|r| r.session()).map(str::to_owned) else { return };
        let id = id.clone();
        if let Some(s) = self.session(&sid, cx)
            && makes_turn(frame.value(), s.skills.as_ref())
        {
            s.sent += 1;
            // Bounded by the client's open requests: one Kimi never answers is forgotten with it.
            self.counted.retain(|id, _| cx.request_of(id).is_some());
            self.counted.insert(id, sid);
        }
    }

    fn wants(&self, frame: &Frame) -> bool {
        frame.session_update() == Some("available_commands_update")
    }

    /// Kimi's `available_commands_update`: the skills it offers in the session.
    fn from_agent(&mut self, frame: &Frame, cx: &mut Cx, _: &mut Said) {
        let v = frame.value();
        let (Some(sid), Some(commands)) = (
            v.pointer("/params/sessionId").and_then(Value::as_str),
            v.pointer("/params/update/availableCommands").and_then(Value::as_array),
        ) else {
            return;
        };
        let Some(s) = self.session(sid, cx) else { return };
        let names = commands.iter().filter_map(|c| c.get("name").and_then(Value::as_str));
        let skills = names.filter(|n| n.len() <= SKILL_NAME_MAX && !BUILTINS.contains(n)).take(SKILLS_MAX);
        s.skills = Some(skills.map(str::to_owned).collect());
    }

    fn answered(&mut self, answer: &Frame, cx: &mut Cx, _: &mut Said) {
        let Some(id) = answer.id() else { return };
        let Some(sid) = self.counted.remove(id) else { return };
        // Refused: no turn in Kimi.
        if answer.value().get("result").is_none()
            && let Some(s) = self.sessions.get_mut(&sid)
        {
            s.sent = s.sent.saturating_sub(1);
        }
        let _ = cx;
    }

    fn usage_update(&mut self, session: &str, update: &Figures<'_>, cx: &mut Cx, _: &mut Vec<Fact>) {
        let Some(s) = self.session(session, cx) else { return };
        if let Some(size) = update.size() {
            s.size = Some(size);
        }
        s.unsent_compaction = false;
    }

    fn on_event(&mut self, facts: WireFacts, cx: &mut Cx, out: &mut Said) {
        let session = facts.session;
        let Some(s) = self.session(&session, cx) else { return };
        // The watch reads this session's wire (its first hand-off may hold no record): its turns' ends will show.
        s.wired = true;
        let mut say = |fact| out.push((session.clone(), fact));
        for entry in facts.entries {
            let at = wire_time(entry.time);
            match entry.record {
                Record::TurnPrompt { origin, .. } => s.turn = Some(origin.is_client()),
                Record::TurnEnded { .. } => match s.turn.take() {
                    // A client turn of a prompt not counted here (none is expected) counts for no later one.
                    Some(true) => s.ended = (s.ended + 1).min(s.sent),
                    // Kimi sends no usage_update after a turn it started itself.
                    Some(false) => {
                        s.unsent_compaction = false;
                        say(Fact::Send);
                    }
                    None => {}
                },
                Record::LlmRequest { kind, max_tokens } => {
                    s.after_loop = kind == "loop";
                    if let Some(at) = at.filter(|_| s.after_loop) {
                        say(Fact::Request(at));
                    }
                    if max_tokens.is_some() {
                        s.wire_size = max_tokens;
                    }
                    if let (None, Some(size)) = (s.size, s.wire_size) {
                        say(Fact::Size(size));
                    }
                }
                Record::Usage { input: Some(n) } if s.after_loop => say(Fact::Context(n)),
                Record::TokenCount { tokens } => say(Fact::Used(tokens)),
                Record::CompactionApplied { .. } => {
                    if let Some(at) = at {
                        say(Fact::Compacted(at));
                        s.unsent_compaction = true;
                    }
                }
                Record::CompactionEnded { completed: true }
                    if s.unsent_compaction && s.turn.is_none() && s.caught_up() =>
                {
                    // Between turns (asked for): Kimi sends no usage_update after it.
                    s.unsent_compaction = false;
                    say(Fact::Send);
                }
                _ => {}
            }
        }
    }

    fn waits(&self, session: &str) -> bool {
        self.sessions.get(session).is_some_and(|s| !s.caught_up())
    }

    /// The turns of `session` that never showed count for no later update (other sessions' still do).
    fn waited_out(&mut self, session: &str) {
        if let Some(s) = self.sessions.get_mut(session) {
            s.ended = s.sent;
        }
    }

    fn at_load(&self, session: &str, _: &Value, _: &Cx) -> Option<LoadJob> {
        let dir = crate::adapters::kimi::watch::locate(self.root.as_deref(), session).ok()?;
        Some(Box::new(move || history(&dir).unwrap_or_default()))
    }
}

/// The facts in the history of the main wire of the session folder `dir` (its last
/// [`crate::coda::usage::HISTORY_MAX`]): the last
/// request of the agent's loop and its context, the last compaction. Links are not followed.
pub fn history(dir: &std::path::Path) -> Option<Facts> {
    let file = Folder::open(dir).ok()?.file("agents/main/wire.jsonl").ok()?;
    let (mut facts, mut after_loop) = (Facts::default(), false);
    for line in history_lines(file) {
        let Ok(entry) = wire::parse_line(&line) else { continue };
        let at = wire_time(entry.time);
        match entry.record {
            Record::LlmRequest { kind, .. } => {
                after_loop = kind == "loop";
                if after_loop && at.is_some() {
                    facts.last_request_at = at;
                }
            }
            Record::Usage { input: Some(n) } if after_loop => facts.context_tokens = Some(n),
            Record::CompactionApplied { .. } if at.is_some() => facts.compacted_at = at,
            _ => {}
        }
    }
    Some(facts)
}

/// coda-kimi's usage facts layer.
pub type Usage = UsageFacts<Kimi>;

/// The layer over Kimi's data root `root`.
pub fn layer(root: Option<PathBuf>) -> Usage {
    UsageFacts::new(Kimi::new(root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::wire::parse_line;
    use crate::coda::usage::HOLD;
    use crate::layer::testing::Harness;
    use serde_json::json;

    const SID: &str = "session_6b1d1f0e-0000-4000-8000-0000000000u5";

    /// The usage layer alone, after `session/new` was answered.
    fn rig() -> Harness {
        let mut h = Harness::of(layer(None));
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

    /// A skill's slash command runs a turn of origin `skill_activation` for the prompt: Kimi's own update follows
    /// it, which waits for that turn as for any prompt's, and the shim sends none of its own.
    #[test]
    fn a_skills_turn_is_the_prompts_turn() {
        let mut h = rig();
        wire(&mut h, &[]);
        h.from_client(prompt(2, "/skill:review the diff"));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        h.from_agent(usage_update(905));
        assert_eq!(h.to_client().len(), 1, "the update waits for the skill's turn");
        wire(&mut h, &turn("skill_activation", 0, 3_000_000, 900));
        let out = h.to_client();
        assert_eq!(out.len(), 1, "Kimi's update, stamped; no update of the shim's: {out:?}");
        assert_eq!(out[0]["params"]["update"]["_meta"]["coda"]["contextTokens"], 900);
        assert_eq!(h.next_wake(), None);
    }

    /// Only a slash command naming a skill Kimi offers runs a turn: one it does not know (`Unknown ACP command`)
    /// runs none, and the next prompt's update waits for that prompt's turn only.
    #[test]
    fn a_slash_command_makes_a_turn_only_when_it_names_a_skill_kimi_offers() {
        let mut h = rig();
        wire(&mut h, &[]);
        let offered = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SID,"update":{
            "sessionUpdate":"available_commands_update","availableCommands":[{"name":"compact"},{"name":"help"},
            {"name":"check-kimi-code-docs"},{"name":"skill:review"}]}}});
        h.from_agent(offered.clone());
        assert_eq!(h.to_client(), [offered], "passed on");
        // Unknown, and a builtin: no turn.
        for (id, text) in [(2, "/review the last commit"), (3, "/help")] {
            h.from_client(prompt(id, text));
            h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
        }
        h.to_client();
        h.from_client(prompt(4, "go"));
        wire(&mut h, &turn("user", 0, 1_000_000, 900));
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"result":{"stopReason":"end_turn"}}));
        h.from_agent(usage_update(905));
        let out = h.to_client();
        assert_eq!(out.len(), 2, "the update waits for no turn of the unknown command: {out:?}");
        assert_eq!(out[1]["params"]["update"]["_meta"]["coda"]["contextTokens"], 900);
        // A builtin skill by its bare name, and a user skill: turns.
        for (id, text, at) in [(5, "/check-kimi-code-docs x", 2_000_000), (6, "/skill:review it", 3_000_000)] {
            h.from_client(prompt(id, text));
            h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
            h.from_agent(usage_update(905));
            assert_eq!(h.to_client().len(), 1, "{text}: the update waits for the skill's turn");
            wire(&mut h, &turn("skill_activation", id - 4, at, 900));
            assert_eq!(h.to_client().len(), 1, "{text}");
        }
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn when_kimi_is_gone_what_waits_behind_an_update_goes_on() {
        let mut h = rig();
        wire(&mut h, &turn("user", 0, 1_000_000, 900));
        h.from_client(prompt(2, "go"));
        h.from_agent(usage_update(905));
        let answer = json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}});
        h.from_agent(answer.clone());
        assert!(h.to_client().is_empty());
        h.end();
        let out = h.to_client();
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0]["params"]["update"]["used"], 905);
        assert_eq!(out[1], answer);
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

    #[test]
    fn a_loaded_session_starts_with_the_facts_of_its_wire_history() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("sessions/wd_w_0123456789ab").join(SID);
        std::fs::create_dir_all(dir.join("agents/main")).unwrap();
        let lines = [
            json!({"type":"metadata","protocol_version":"1.5","created_at":1}),
            json!({"type":"llm.request","agentId":"main","kind":"loop","maxTokens":40000,"time":1_000_000}),
            json!({"type":"usage.record","agentId":"main","usage":{"inputOther":900,"output":5},"time":1_000_020}),
            json!({"type":"llm.request","agentId":"main","kind":"compaction","time":2_000_000}),
            json!({"type":"usage.record","agentId":"main","usage":{"inputOther":1200,"output":5},"time":2_000_020}),
            json!({"type":"context.apply_compaction","agentId":"main","tokensBefore":900,"tokensAfter":300,"time":2_000_030}),
        ];
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.join("agents/main/wire.jsonl"), format!("{text}{{\"type\":\"cut")).unwrap();
        let mut h = Harness::of(layer(Some(root.path().to_path_buf())));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":SID,"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        h.from_client(prompt(2, "go"));
        h.from_agent(usage_update(905));
        let out = h.to_client();
        // The compaction's summary request is no request of the main thread; the last one before it is.
        assert_eq!(
            out[1]["params"]["update"]["_meta"]["coda"],
            json!({"lastRequestAt": iso_ms(1_000_000), "contextTokens": 900, "compactedAt": iso_ms(2_000_030)})
        );
        // A folder that is a link, or no wire at all: nothing read, nothing kept.
        assert_eq!(history(&root.path().join("nowhere")), None);
    }
}

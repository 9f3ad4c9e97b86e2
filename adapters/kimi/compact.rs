//! coda-kimi's `_coda/session/compact` (Coda's 压缩上下文): Kimi's builtin `/compact`, sent as a prompt of the
//! shim's own, answered when Kimi's wire says the compaction ended.
//!
//! What Kimi 2.1.0 does (seen live, fixtures/kimi/compact-*): `/compact` as a prompt answers `end_turn` at
//! once with the text "Context compaction started …"; the compaction runs afterwards, outside any prompt: the
//! main wire shows `full_compaction.begin`, an `llm.request` of kind `compaction`, `context.apply_compaction`
//! {tokensBefore, tokensAfter} and `full_compaction.complete` (or `.cancel`, when its summary request failed),
//! and Kimi sends the result as a text outside any prompt ("Compaction completed. … Tokens before: …"). During
//! a turn it answers with "/compact failed: Cannot compact while a turn is active …"; while it compacts,
//! "A context compaction is already running."; a prompt sent while it compacts is answered empty at once and
//! run unreported later.
//!
//! So Kimi's backend for the engine's compaction machine ([`crate::coda::compact`], which keeps the rules):
//! the shim sends `/compact`, drops what Kimi streams for that prompt and its later result text (the shim's,
//! not a turn of Coda's; `usage_update`s pass), and the compaction ends `{compacted: true, before, after}`
//! (Kimi's estimates) on `full_compaction.complete`, `{compacted: false}` on `.cancel` or Kimi's refusal. The
//! result text ends it too when it comes first (it carries the same numbers). Kimi's wire also says when a
//! turn runs (Coda's or its own: told to the session table) and when Kimi compacts by itself (refused as
//! [`ALREADY`]). Stopped (past the deadline) with `session/cancel`, which Kimi ends with `.cancel`.

use crate::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{Value, json};

use crate::adapters::kimi::facts::WireFacts;
use crate::adapters::kimi::wire::Record;
use crate::coda::compact::{ALREADY, Compactor, Ctl, Outcome, TURN_RUNNING};
use crate::frame::{Frame, Kind};
use crate::layer::Cx;

/// Kimi cancelled the compaction (`full_compaction.cancel`: its summary request failed, or it was stopped).
pub const CANCELLED: &str = "Kimi cancelled the compaction (its summary request failed or was stopped)";

/// How long after the compaction ended the shim still drops Kimi's result text of it.
pub const RESULT_TEXT_WAIT: Duration = Duration::from_secs(30);

/// The texts Kimi 2.1.0 writes for `/compact` (prefixes).
const FAILED: &str = "/compact failed:";
const BUSY: &str = "A context compaction is already running";
const DONE_TEXT: &str = "Compaction completed.";
const CANCELLED_TEXT: &str = "Compaction cancelled.";

/// Updates that are a turn's output: what Kimi streams for the shim's `/compact` is dropped.
const TURN_OUTPUT: &[&str] =
    &["agent_message_chunk", "agent_thought_chunk", "user_message_chunk", "tool_call", "tool_call_update", "plan"];

/// Kimi's result text of the session's compaction is no longer waited for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Forget(String);

/// The shim's `/compact` prompt of a session, in a compaction round.
#[derive(Debug)]
pub struct Asked {
    session: String,
    round: u64,
}

struct Job {
    round: u64,
    /// The shim's `/compact` prompt is not answered yet.
    prompt_open: bool,
    /// Why Kimi would not compact, from its text.
    refused: Option<String>,
    /// The wire shows it began.
    begun: bool,
    before: Option<u64>,
    after: Option<u64>,
}

/// Kimi's compaction (see the module docs).
#[derive(Default)]
pub struct KimiCompact {
    /// Sessions Kimi compacts now (begun, not ended in its wire), asked for or by itself.
    compacting: HashSet<String>,
    jobs: HashMap<String, Job>,
    /// Sessions whose compaction's result text Kimi has still to send (dropped when it comes).
    results: HashSet<String>,
}

fn text_of(v: &Value) -> Option<&str> {
    v.pointer("/params/update/content/text").and_then(Value::as_str)
}

/// `- Tokens before: 21,196` in Kimi's result text.
fn count_in(text: &str, label: &str) -> Option<u64> {
    let line = text.lines().find_map(|l| l.trim_start_matches(['-', ' ']).strip_prefix(label))?;
    let digits: String = line.trim().chars().filter(|c| *c != ',').collect();
    digits.parse().ok()
}

/// Kimi's result text as an outcome.
fn result_text(text: &str) -> Option<Outcome> {
    if text.starts_with(DONE_TEXT) {
        let (before, after) = (count_in(text, "Tokens before:"), count_in(text, "Tokens after:"));
        return Some(Outcome::Compacted { before, after });
    }
    text.starts_with(CANCELLED_TEXT).then(|| Outcome::not(CANCELLED))
}

/// Why Kimi refused, from the text it answered `/compact` with (None: it started).
fn refusal(text: &str) -> Option<String> {
    if let Some(why) = text.strip_prefix(FAILED) {
        let why = why.trim();
        return Some(if why.starts_with("Cannot compact while a turn is active") {
            TURN_RUNNING.to_owned()
        } else {
            format!("Kimi could not compact: {why}")
        });
    }
    text.starts_with(BUSY).then(|| ALREADY.to_owned())
}

impl KimiCompact {
    pub fn new() -> KimiCompact {
        KimiCompact::default()
    }

    /// One of Kimi's updates while the shim compacts the session: `false` (dropped) when it is the shim's.
    fn update(&mut self, session: &str, v: &Value, ctl: &mut Ctl<Self>) -> bool {
        let kind = v.pointer("/params/update/sessionUpdate").and_then(Value::as_str).unwrap_or("");
        if let Some(job) = self.jobs.get_mut(session)
            && job.prompt_open
        {
            if !TURN_OUTPUT.contains(&kind) {
                return true;
            }
            if let Some(text) = text_of(v) {
                job.refused = job.refused.take().or_else(|| refusal(text));
            }
            return false;
        }
        if kind != "agent_message_chunk" || !self.results.contains(session) {
            return true;
        }
        let Some(outcome) = text_of(v).and_then(result_text) else { return true };
        self.results.remove(session);
        ctl.cancel(Forget(session.to_owned()));
        if let Some(job) = self.jobs.get(session) {
            ctl.ended(session, job.round, outcome);
        }
        false
    }

    /// The main agent's records of one scan of Kimi's wire.
    fn facts(&mut self, facts: WireFacts, ctl: &mut Ctl<Self>) {
        let session = facts.session;
        for entry in facts.entries {
            match entry.record {
                Record::TurnPrompt { .. } => busy(ctl.cx, &session, true),
                Record::TurnEnded { .. } => busy(ctl.cx, &session, false),
                Record::CompactionBegin { .. } => {
                    self.compacting.insert(session.clone());
                    if let Some(job) = self.jobs.get_mut(&session) {
                        job.begun = true;
                        self.results.insert(session.clone());
                    }
                }
                Record::CompactionApplied { before, after } => {
                    if let Some(job) = self.jobs.get_mut(&session) {
                        (job.before, job.after) = (before, after);
                    }
                }
                Record::CompactionEnded { completed } => {
                    let began = self.compacting.remove(&session);
                    let Some(job) = self.jobs.get(&session).filter(|j| j.begun) else {
                        if !began {
                            tracing::debug!("Kimi's wire ended a compaction of session {session} it never began");
                        }
                        continue;
                    };
                    let outcome = if completed {
                        Outcome::Compacted { before: job.before, after: job.after }
                    } else {
                        Outcome::not(CANCELLED)
                    };
                    ctl.ended(&session, job.round, outcome);
                    if self.results.contains(&session) {
                        ctl.after(RESULT_TEXT_WAIT, Forget(session.clone()));
                    }
                }
                _ => {}
            }
        }
    }
}

/// Kimi's wire says whether a turn runs in `session` (Coda's or its own): told to the session table.
fn busy(cx: &mut Cx, session: &str, busy: bool) {
    if let Some(s) = cx.session_mut(session) {
        s.set_busy(busy);
    }
}

impl Compactor for KimiCompact {
    fn session_closed(&mut self, session: &str, _ctl: &mut Ctl<Self>) {
        self.compacting.remove(session);
        self.jobs.remove(session);
        self.results.remove(session);
    }

    fn kept(&self) -> usize {
        self.compacting.len() + self.jobs.len() + self.results.len()
    }

    type Event = WireFacts;
    type Reply = Asked;
    type Timer = Forget;

    fn refuse(&self, session: &str, _cx: &Cx) -> Option<String> {
        self.compacting.contains(session).then(|| ALREADY.to_owned())
    }

    fn start(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>) {
        let job = Job { round, prompt_open: true, refused: None, begun: false, before: None, after: None };
        self.jobs.insert(session.to_owned(), job);
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": "/compact"}]});
        ctl.request("session/prompt", params, Asked { session: session.to_owned(), round });
    }

    fn finished(&mut self, session: &str, round: u64, _ctl: &mut Ctl<Self>) {
        if self.jobs.get(session).is_some_and(|j| j.round == round) {
            self.jobs.remove(session);
        }
    }

    fn from_agent(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        if !matches!(frame.kind(), Kind::Notification { .. })
            || frame.session_update().is_none()
            || (self.jobs.is_empty() && self.results.is_empty())
        {
            return true;
        }
        let v = frame.value();
        let session = v.pointer("/params/sessionId").and_then(Value::as_str).unwrap_or("").to_owned();
        self.update(&session, v, ctl)
    }

    fn ignores(&self, frame: &Frame) -> bool {
        // Updates are read only while a `/compact` of the shim's runs or its result text is due.
        !matches!(frame.kind(), Kind::Notification { .. })
            || frame.session_update().is_none()
            || (self.jobs.is_empty() && self.results.is_empty())
    }

    fn on_reply(&mut self, Asked { session, round }: Asked, reply: Frame, ctl: &mut Ctl<Self>) {
        let Some(job) = self.jobs.get_mut(&session).filter(|j| j.round == round) else { return };
        job.prompt_open = false;
        let v = reply.value();
        let refused = if v.get("result").is_some() {
            job.refused.take()
        } else {
            let why = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("an error");
            Some(format!("Kimi refused to compact: {why}"))
        };
        match refused {
            Some(reason) => ctl.ended(&session, round, Outcome::NotCompacted(reason)),
            // Kimi started: the wire ends it, or its result text (also when the session's files cannot be read).
            None => {
                self.results.insert(session);
            }
        }
    }

    fn on_event(&mut self, facts: WireFacts, ctl: &mut Ctl<Self>) {
        self.facts(facts, ctl);
    }

    fn on_timer(&mut self, Forget(session): Forget, _ctl: &mut Ctl<Self>) {
        self.results.remove(&session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::wire::parse_line;
    use crate::coda::compact::{self, Compaction, DEADLINE, NOT_RUNNING, TIMED_OUT};
    use crate::layer::testing::Harness;

    const SID: &str = "session_6b1d1f0e-0000-4000-8000-0000000000c0";

    fn rig() -> Harness {
        let mut h = Harness::of(Compaction::new(KimiCompact::new()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
        h.from_agent(
            json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}}),
        );
        let init = h.to_client();
        assert_eq!(init[0]["result"]["agentCapabilities"], json!({"loadSession":true,"_meta":{"coda":{"compact":{}}}}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":SID}}));
        h.to_client();
        h.to_agent();
        h
    }

    fn wire(h: &mut Harness, records: &[Value]) {
        let entries = records.iter().map(|r| parse_line(r.to_string().as_bytes()).unwrap()).collect();
        h.event(0, WireFacts { session: SID.into(), entries });
    }

    fn compact(h: &mut Harness, id: i64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":METHOD,"params":{"sessionId":SID}}));
    }

    const METHOD: &str = compact::METHOD;

    fn chunk(text: &str) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SID,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":text}}}})
    }

    fn prompt(id: i64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":SID,"prompt":[{"type":"text","text":"go"}]}})
    }

    /// The shim's `/compact` went to Kimi; its id.
    fn asked(h: &mut Harness) -> Value {
        let out = h.to_agent();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0]["params"]["prompt"], json!([{"type":"text","text":"/compact"}]));
        out[0]["id"].clone()
    }

    fn begin_to_end(end: &str) -> Vec<Value> {
        vec![
            json!({"type":"full_compaction.begin","source":"manual","agentId":"main","time":10}),
            json!({"type":"context.apply_compaction","agentId":"main","tokensBefore":32720,"tokensAfter":22290,"time":11}),
            json!({"type":end,"agentId":"main","time":12}),
        ]
    }

    #[test]
    fn between_turns_it_compacts_holds_codas_prompt_and_shows_nothing_of_the_shims_own() {
        let mut h = rig();
        compact(&mut h, 7);
        let id = asked(&mut h);
        h.from_client(prompt(8));
        assert!(h.to_agent().is_empty(), "Coda's prompt waits for the compaction");
        h.from_agent(chunk("Context compaction started — it runs in the background …"));
        h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
        let usage = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SID,"update":{"sessionUpdate":"usage_update","used":1,"size":2}}});
        h.from_agent(usage.clone());
        assert_eq!(h.to_client(), [usage], "only the usage update passes");
        wire(&mut h, &begin_to_end("full_compaction.complete"));
        assert_eq!(
            h.to_client(),
            [json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":32720,"after":22290}})]
        );
        assert_eq!(h.to_agent(), [prompt(8)]);
        // Kimi's result text, later and outside any prompt: the shim's, dropped; Coda's turn's text passes.
        h.from_agent(chunk(
            "Compaction completed.\n- Messages compacted: 5\n- Tokens before: 32,720\n- Tokens after: 22,290",
        ));
        h.from_agent(chunk("Compaction completed. (the model's words)"));
        assert_eq!(h.to_client().len(), 1);
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn kimis_result_text_answers_when_it_comes_before_the_wire() {
        let mut h = rig();
        compact(&mut h, 7);
        let id = asked(&mut h);
        h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
        // No wire record read yet (or none readable): the text ends it.
        h.from_agent(chunk(
            "Compaction completed.\n- Messages compacted: 5\n- Tokens before: 1,032,720\n- Tokens after: x",
        ));
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":1032720}})]);
        wire(&mut h, &begin_to_end("full_compaction.complete")[1..]);
        assert!(h.to_client().is_empty(), "answered once");
    }

    #[test]
    fn it_is_refused_when_the_session_is_unknown_a_turn_runs_or_it_already_compacts() {
        let mut h = rig();
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":METHOD,"params":{"sessionId":"session_x"}}));
        let raw = format!(r#"{{"jsonrpc":"2.0","id":3,"method":"{METHOD}","params":{{"sessionId":1e400}}}}"#);
        h.client_frame(Frame::parse(raw.into_bytes()).expect("a frame"));
        let out = h.to_client();
        assert_eq!(out[0]["result"], json!({"compacted":false,"reason":NOT_RUNNING}));
        assert_eq!(out[1]["error"]["code"], -32602);
        // Coda's turn is open.
        h.from_client(prompt(4));
        h.to_agent();
        compact(&mut h, 5);
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":TURN_RUNNING}));
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"result":{"stopReason":"end_turn"}}));
        h.to_client();
        // Kimi's own turn, then its own compaction, in the wire.
        wire(&mut h, &[json!({"type":"turn.prompt","agentId":"main","turnId":1,"origin":{"kind":"task"},"time":20})]);
        compact(&mut h, 6);
        assert_eq!(h.to_client()[0]["result"]["reason"], TURN_RUNNING);
        wire(
            &mut h,
            &[
                json!({"type":"turn.ended","agentId":"main","turnId":1,"reason":"completed","time":21}),
                json!({"type":"full_compaction.begin","source":"auto","agentId":"main","time":22}),
            ],
        );
        compact(&mut h, 7);
        assert_eq!(h.to_client()[0]["result"]["reason"], ALREADY);
        // Kimi's own compaction ends: nothing to answer.
        wire(&mut h, &[json!({"type":"full_compaction.complete","agentId":"main","time":23})]);
        assert!(h.to_client().is_empty());
        compact(&mut h, 8);
        asked(&mut h);
        compact(&mut h, 9);
        assert_eq!(h.to_client()[0]["result"]["reason"], ALREADY);
        assert!(h.to_agent().is_empty());
    }

    #[test]
    fn kimis_refusals_and_cancel_are_compacted_false_with_a_reason() {
        for (text, reason) in [
            (
                "/compact failed: Cannot compact while a turn is active. Wait for it to finish, then retry.",
                TURN_RUNNING.to_owned(),
            ),
            ("A context compaction is already running.", ALREADY.to_owned()),
            ("/compact failed: disk full", "Kimi could not compact: disk full".to_owned()),
        ] {
            let mut h = rig();
            compact(&mut h, 7);
            let id = asked(&mut h);
            h.from_client(prompt(8));
            h.from_agent(chunk(text));
            h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
            assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":7,"result":{"compacted":false,"reason":reason}})]);
            assert_eq!(h.to_agent(), [prompt(8)], "the held prompt goes on");
        }
        let mut h = rig();
        compact(&mut h, 7);
        let id = asked(&mut h);
        h.from_agent(json!({"jsonrpc":"2.0","id":id,"error":{"code":-32600,"message":"turn.agent_busy"}}));
        assert_eq!(h.to_client()[0]["result"]["reason"], "Kimi refused to compact: turn.agent_busy");
        // A cancel without a begin is not this compaction's end; the one after its begin is.
        let mut h = rig();
        compact(&mut h, 7);
        let id = asked(&mut h);
        h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
        wire(&mut h, &[json!({"type":"full_compaction.cancel","agentId":"main","time":9})]);
        assert!(h.to_client().is_empty());
        wire(&mut h, &begin_to_end("full_compaction.cancel"));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":CANCELLED}));
        h.from_agent(chunk("Compaction cancelled."));
        assert!(h.to_client().is_empty(), "its text is the shim's");
    }

    #[test]
    fn a_kimi_that_never_ends_is_cancelled_before_codas_ten_minutes_and_codas_cancel_ends_held_prompts() {
        let mut h = rig();
        compact(&mut h, 7);
        let id = asked(&mut h);
        h.from_client(prompt(8));
        h.from_client(json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":SID}}));
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":8,"result":{"stopReason":"cancelled"}})]);
        assert!(h.to_agent().is_empty(), "the compaction is not Coda's turn: not cancelled");
        h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}}));
        assert_eq!(h.next_wake(), Some(DEADLINE));
        assert!(DEADLINE < Duration::from_secs(600));
        h.advance(DEADLINE);
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":TIMED_OUT}));
        assert_eq!(h.to_agent()[0]["method"], "session/cancel");
    }
}

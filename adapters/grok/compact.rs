//! Coda's `_coda/session/compact` (section 压缩上下文) over Grok Build's `_x.ai/compact_conversation`.
//!
//! What Grok 1.0.41 does (seen live against the fake model, `fixtures/grok/compact-*`):
//! - `_x.ai/compact_conversation {sessionId}` is not a turn: Grok asks the model for a summary (up to three
//!   tries), sends `_x.ai/session_notification` `auto_compact_completed {tokens_before, tokens_after}` and then
//!   answers `{}`. A summary it finds too short fails: -32603 with `data: {kind: "compact_failed", message}`.
//! - An empty session compacts too (one model call) and reports `tokens_before == tokens_after`.
//! - It compacts in the middle of a running turn without complaint, and a `session/prompt` sent meanwhile runs
//!   at once beside the compaction.
//! - A session it does not have got no answer at all (30 s and more).
//!
//! So Grok's backend for the engine's compaction machine ([`crate::coda::compact`], which keeps the rules):
//! - It compacts with `_x.ai/compact_conversation`; `{}` is `compacted: true` with `before`/`after` from the
//!   `auto_compact_completed` that came with it (Grok's counts: its last response's tokens before, its estimate
//!   of the summary after). An empty session is compacted too (`before == after`): Grok did run a compaction,
//!   and the protocol answers `compacted: false` only when not running, a turn runs, or it failed. An error is
//!   `compacted: false` with Grok's message.
//! - A session this process never created, loaded or resumed is refused by the machine (Grok would not answer),
//!   so is one where Grok runs a turn, its own included: the session table says so, told by Grok's
//!   `_x.ai/queue/changed` naming a `runningPromptId`, which the steering backend below this layer reads for
//!   both (`Queue::note`; a queue carries Coda's instruction, and is gone over once).
//! - Stopped (past the deadline) with `session/cancel`; a late answer is dropped.

use crate::HashMap;
use std::borrow::Cow;
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::coda::compact::{Compactor, Ctl, Outcome};
use crate::frame::{Frame, Kind};
use crate::json::View;
use crate::layer::Cx;

const COMPACT: &str = "_x.ai/compact_conversation";
const NOTIFICATION: &str = "_x.ai/session_notification";
pub(crate) const QUEUE_CHANGED: &str = "_x.ai/queue/changed";
const COMPLETED: &str = "auto_compact_completed";

/// The compaction of one session, while Grok has it.
struct Running {
    round: u64,
    before: Option<u64>,
    after: Option<u64>,
}

/// What `_x.ai/compact_conversation` carries back with Grok's answer.
#[derive(Debug)]
pub struct Asked {
    session: String,
    round: u64,
}

/// Grok's compaction (see the module docs).
#[derive(Default)]
pub struct GrokCompact {
    running: HashMap<String, Running>,
}

/// What an `_x.ai/queue/changed` says, read where it lies in one pass over its `params`: the queue's entries
/// (prompts, the session instruction among them) and the running prompt's text are neither parsed nor gone over
/// again by each layer that reads the queue.
#[derive(Debug, Default)]
pub(crate) struct Queue<'f> {
    /// `params.entries`.
    pub entries: Option<View<'f>>,
    /// `params.runningPromptId` when it is a string.
    pub running: Option<Cow<'f, str>>,
    /// `params.runningText`.
    pub text: Option<View<'f>>,
}

impl<'f> Queue<'f> {
    /// The queue of `frame`, when it is an `_x.ai/queue/changed`.
    pub fn of(frame: &'f Frame) -> Option<Queue<'f>> {
        if !frame.is_notification(QUEUE_CHANGED) {
            return None;
        }
        let (mut queue, mut running) = (Queue::default(), None);
        for (key, value) in frame.view().members_at("params") {
            if key.is("entries") {
                queue.entries = Some(value);
            } else if key.is("runningPromptId") {
                running = Some(value);
            } else if key.is("runningText") {
                queue.text = Some(value);
            }
        }
        queue.running = running.and_then(|r| r.as_str());
        Some(queue)
    }

    /// The running prompt, when one runs.
    pub fn running(&self) -> Option<&str> {
        self.running.as_deref().filter(|p| !p.is_empty())
    }

    /// The ids (strings) of the queue's entries, in their order.
    pub fn entry_ids(&self) -> impl Iterator<Item = Cow<'f, str>> + '_ {
        self.entries.iter().flat_map(|e| e.elements_pick(["id"])).filter_map(|[id]| id?.as_str())
    }

    /// Tells the session table of `frame` (this queue's) whether a turn runs in its session (a
    /// `runningPromptId`, Grok's own turns too): what the compaction machine refuses by. Whether the running
    /// prompt is Coda's is the steering backend's to say ([`super::steering`], which calls this for every queue:
    /// it is the layer next to Grok that reads them).
    pub fn note(&self, frame: &Frame, cx: &mut Cx) {
        let Some(session) = frame.session() else { return };
        let busy = self.running().is_some();
        if let Some(s) = cx.session_mut(&session) {
            if busy { s.set_running(false) } else { s.set_busy(false) }
        }
    }
}

impl GrokCompact {
    pub fn new() -> GrokCompact {
        GrokCompact::default()
    }
}

impl Compactor for GrokCompact {
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
        self.running.insert(session.to_owned(), Running { round, before: None, after: None });
        ctl.request(COMPACT, json!({"sessionId": session}), Asked { session: session.to_owned(), round });
    }

    fn finished(&mut self, session: &str, round: u64, _ctl: &mut Ctl<Self>) {
        if self.running.get(session).is_some_and(|r| r.round == round) {
            self.running.remove(session);
        }
    }

    fn from_agent(&mut self, frame: &Frame, _ctl: &mut Ctl<Self>) -> bool {
        if frame.is_notification(NOTIFICATION) && frame.session_update() == Some(COMPLETED) {
            // Read where they lie: the session from the frame check's pass, the counts from the update.
            let [before, after] = frame.update_value().map_or([None; 2], |u| u.pick(["tokens_before", "tokens_after"]));
            if let Some(run) = frame.session().and_then(|s| self.running.get_mut(&*s)) {
                run.before = before.and_then(|n| n.as_u64());
                run.after = after.and_then(|n| n.as_u64());
            }
        }
        true
    }

    fn ignores(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Notification { method } => {
                method != QUEUE_CHANGED && !(method == NOTIFICATION && frame.session_update() == Some(COMPLETED))
            }
            _ => true,
        }
    }

    fn on_reply(&mut self, tag: Asked, reply: Frame, ctl: &mut Ctl<Self>) {
        let Some(run) = self.running.get(&tag.session).filter(|r| r.round == tag.round) else {
            return tracing::debug!("Grok answered a compaction that was already given up; dropped");
        };
        let outcome = match reply.value().get("error") {
            Some(err) => {
                let code = err.get("code").and_then(Value::as_i64).unwrap_or_default();
                tracing::warn!("Grok could not compact (error {code}; its message is logged at debug)");
                tracing::debug!("Grok's answer to the compaction: {err}");
                let message = err
                    .pointer("/data/message")
                    .or_else(|| err.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("no message");
                Outcome::not(format!("Grok could not compact: {}", crate::coda::wait::truncate_chars(message, 500)))
            }
            None => Outcome::Compacted { before: run.before, after: run.after },
        };
        ctl.ended(&tag.session, tag.round, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::compact::{self, Compaction};
    use crate::layer::testing::Harness;
    use std::time::Duration;

    /// Grok's queue read where it lies is what the parsed frame says, for every frame of every recorded fixture,
    /// the hostile lines, and queues with keys twice or escaped, mistyped fields and lone surrogates.
    #[test]
    fn a_queue_read_in_place_is_the_parsed_queue() {
        let mut lines = crate::frame::recorded_lines();
        lines.extend(crate::frame::hostile_lines());
        for params in [
            r#"{"sessionId":"s","entries":[{"id":"a","text":"x\"]}"},{"id":7},{"text":"t","id":"b","id":"c"},"e",[{"id":"x"}]],"runningPromptId":"","runningText":"t"}"#,
            r#"{"entries":{"id":"a"},"runningPromptId":"p1","runningPromptId":"p2","running\u0054ext":"\ud800 fallback"}"#,
            r#" { "sessionId" : "s" , "entries" : [ { "id" : "a" } , { "id" : "\u0062" } ] , "runningPromptId" : 5 , "runningText" : null } "#,
            r#"{"entries":[],"entr\u0069es":[{"id":"z"}],"runningPromptId":"\ud83d\ude00"}"#,
            r#"[{"entries":[{"id":"a"}]}]"#,
            r#""no params""#,
        ] {
            lines.push(format!(r#"{{"jsonrpc":"2.0","method":"_x.ai/queue/changed","params":{params}}}"#).into_bytes());
        }
        let mut queues = 0;
        for line in lines {
            let Ok(frame) = Frame::parse(line) else { continue };
            let Some(queue) = Queue::of(&frame) else {
                assert!(!frame.is_notification(QUEUE_CHANGED));
                continue;
            };
            let params = frame.value().get("params").filter(|p| p.is_object());
            let field = |k: &str| params.and_then(|p| p.get(k));
            let ids: Vec<String> = field("entries")
                .and_then(Value::as_array)
                .map(|e| e.iter().filter_map(|e| e.get("id").and_then(Value::as_str)).map(str::to_owned).collect())
                .unwrap_or_default();
            let what = format!("{frame:?} {:?}", frame.value());
            assert_eq!(queue.entry_ids().map(Cow::into_owned).collect::<Vec<_>>(), ids, "{what}");
            assert_eq!(queue.entries.map(|e| e.to_value()).as_ref(), field("entries"), "{what}");
            let running = field("runningPromptId").and_then(Value::as_str);
            assert_eq!(queue.running.as_deref(), running, "{what}");
            assert_eq!(queue.running(), running.filter(|r| !r.is_empty()), "{what}");
            let text = field("runningText").and_then(Value::as_str);
            assert_eq!(queue.text.and_then(|t| t.as_str()).as_deref(), text, "{what}");
            queues += 1;
        }
        assert!(queues > 50, "queues read ({queues})");
    }

    const S: &str = "01a2350d-04b9-7631-977e-821743ed1d2a";

    /// The compaction layer over the steering layer, as coda-grok stacks them (steering reads Grok's queue and
    /// tells the session table whether a turn runs).
    fn started() -> Harness {
        let steering = crate::coda::steering::Steering::new(super::super::steering::GrokSteering::new());
        let mut h = Harness::new(vec![Box::new(Compaction::new(GrokCompact::new())), Box::new(steering)]);
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"agentCapabilities":{"loadSession":true}}}));
        let init = h.to_client();
        assert_eq!(init[0]["result"]["agentCapabilities"]["_meta"]["coda"]["compact"], json!({}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.to_client();
        h
    }

    fn compact(h: &mut Harness, id: &str, session: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"_coda/session/compact","params":{"sessionId":session}}));
    }

    fn completed(before: u64, after: u64) -> Value {
        json!({"jsonrpc":"2.0","method":NOTIFICATION,"params":{"_meta":{"agentTimestampMs":1_796_186_078_044u64},
            "sessionId":S,"update":{"sessionUpdate":COMPLETED,"summary_preview":null,"tokens_before":before,
            "tokens_after":after}}})
    }

    fn prompt(h: &mut Harness, id: i64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"next"}]}}));
    }

    #[test]
    fn between_turns_it_compacts_with_groks_counts_and_holds_prompts_until_the_answer() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0]["method"], COMPACT);
        assert_eq!(asked[0]["params"], json!({"sessionId":S}));
        prompt(&mut h, 7);
        assert!(h.to_agent().is_empty(), "the prompt waits for the compaction");
        // Grok's notification passes on.
        h.from_agent(completed(15, 8));
        assert_eq!(h.to_client()[0]["params"]["update"]["sessionUpdate"], COMPLETED);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{}}));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":"c","result":{"compacted":true,"before":15,"after":8}})]
        );
        let sent = h.to_agent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["id"], 7);
        assert!(h.next_wake().is_none(), "the deadline is gone");
    }

    #[test]
    fn an_empty_session_is_compacted_with_equal_counts() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        h.from_agent(completed(2262, 2262));
        h.to_client();
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{}}));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":true,"before":2262,"after":2262}));
    }

    #[test]
    fn refusals_go_to_coda_and_nothing_to_grok() {
        let mut h = started();
        compact(&mut h, "u", "another");
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::NOT_RUNNING}));
        // Coda's turn.
        prompt(&mut h, 3);
        h.to_agent();
        compact(&mut h, "t", S);
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":compact::TURN_RUNNING}));
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}));
        h.to_client();
        // Grok's own turn (a wake after a background task).
        h.from_agent(json!({"jsonrpc":"2.0","method":QUEUE_CHANGED,"params":{"sessionId":S,"entries":[],
            "runningPromptId":"task-completed-t1","runningKind":"prompt"}}));
        h.to_client();
        compact(&mut h, "g", S);
        assert_eq!(h.to_client()[0]["result"]["reason"], compact::TURN_RUNNING);
        h.from_agent(json!({"jsonrpc":"2.0","method":QUEUE_CHANGED,"params":{"sessionId":S,"entries":[]}}));
        h.to_client();
        assert!(h.to_agent().is_empty());
        compact(&mut h, "ok", S);
        assert_eq!(h.to_agent()[0]["method"], COMPACT, "idle again");
        compact(&mut h, "again", S);
        assert_eq!(h.to_client()[0]["result"]["reason"], compact::ALREADY);
    }

    #[test]
    fn a_failure_is_not_compacted_with_groks_message() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        prompt(&mut h, 4);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"error":{"code":-32603,"message":"Internal error",
            "data":{"kind":"compact_failed","message":"degenerate summary (26 chars for ~2276 input tokens)"}}}));
        assert_eq!(
            h.to_client()[0]["result"],
            json!({"compacted":false,"reason":"Grok could not compact: degenerate summary (26 chars for ~2276 input tokens)"})
        );
        assert_eq!(h.to_agent()[0]["id"], 4, "the held prompt goes on");
    }

    #[test]
    fn grok_that_never_answers_is_cancelled_at_the_deadline_and_its_late_answer_dropped() {
        let mut h = started();
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        prompt(&mut h, 5);
        h.advance(compact::DEADLINE - Duration::from_secs(1));
        assert!(h.to_client().is_empty());
        h.advance(Duration::from_secs(1));
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":"c","result":{"compacted":false,"reason":compact::TIMED_OUT}})]
        );
        let out = h.to_agent();
        assert_eq!(out, [json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})]);
        // Grok's late answer ends the compaction: the held prompt goes on, Coda is not answered again.
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{}}));
        assert!(h.to_client().is_empty(), "a late answer is the shim's own, dropped");
        assert_eq!(h.to_agent()[0]["id"], 5);
    }

    #[test]
    fn hostile_requests_and_answers() {
        let mut h = started();
        for params in [json!({}), json!({"sessionId": 7}), json!({"sessionId": ""}), json!([[[[]]]])] {
            h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"_coda/session/compact","params":params}));
            assert_eq!(h.to_client()[0]["error"]["code"], -32602);
        }
        // A number too large for a float beside the session: read, answered by the shim, never passed on.
        let huge = r#"{"jsonrpc":"2.0","id":9,"method":"_coda/session/compact","params":{"sessionId":"s","n":1e400}}"#;
        h.client_frame(Frame::parse(huge.as_bytes().to_vec()).expect("a frame"));
        assert_eq!(h.to_client()[0]["result"]["reason"], compact::NOT_RUNNING);
        assert!(h.to_agent().is_empty());
        // Nesting too deep to read never reaches a layer: the engine answers it (src/relay/behaviour.rs).
        let n = crate::json::MAX_DEPTH + 5;
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"_coda/session/compact","params":{}{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        );
        assert!(Frame::parse(deep.into_bytes()).is_err());
        // A result with a huge message and an unreadable update do not panic.
        compact(&mut h, "c", S);
        let asked = h.to_agent();
        let bad = format!(
            r#"{{"jsonrpc":"2.0","method":"{NOTIFICATION}","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"{COMPLETED}","tokens_before":1e400,"tokens_after":-3}}}}}}"#
        );
        h.agent_frame(Frame::parse(bad.into_bytes()).expect("a frame"));
        assert_eq!(h.to_client().len(), 1, "Grok's frame passes on");
        let long = "x".repeat(100_000);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"error":{"code":-32603,"message":long}}));
        let reason = h.to_client()[0]["result"]["reason"].as_str().unwrap().to_owned();
        assert!(reason.chars().count() < 600, "{}", reason.len());
    }
}

//! Coda's steering (section 插话) over Grok Build's `_x.ai/interject`: a message joins the turn Coda is running.
//!
//! What Grok 1.0.41 does (seen live against the fake model, `fixtures/grok/steering`):
//! - `_x.ai/interject {sessionId, text}` answers `{"result":{"status":"queued"}}` at once and echoes
//!   `_x.ai/session/interjection {sessionId, text}`. In a running turn the text joins it at its next safe point
//!   (after the running tool's result, and once more just before the turn completes): the model's next request
//!   ends with a user message "The user sent a message while you were working: <user_query>…</user_query>", and
//!   the original `session/prompt` is answered after that.
//! - With no turn running Grok starts a turn of its own for it (prompt id `interject-fallback-…` in
//!   `_x.ai/queue/changed`), as it does for one that arrives after the turn's last safe point.
//!
//! So Grok's backend for the engine's steering machine ([`crate::coda::steering`], which keeps the rules):
//! - The prompt's text blocks and resource links (their URI), one paragraph each, go to Grok as
//!   `_x.ai/interject`; any other block is refused (-32602). The echo of a message steered here is dropped.
//! - `queued` is no proof that the message joined Coda's turn: Grok takes it at its next safe point, or runs it
//!   as a turn of its own when that point never comes. Nothing Grok sends says which, but its loop does: a safe
//!   point lies after each model answer (`response_completed`) and after the tools it asked for
//!   (`tool_call_update` completed or failed), and every model request after a safe point carries what was
//!   taken there. So once a safe point passed after `queued` and then the model answers again (a chunk, a
//!   thought, a tool call's arguments, `response_completed`), the message is in Coda's turn: `injected`. A turn of Grok's
//!   own for it (`_x.ai/queue/changed` running `interject-fallback-…` with its text): `startedNewTurn`. Coda's
//!   turn ending without either: unknown, once the machine stops waiting.
//! - Grok's queue (`_x.ai/queue/changed`) tells the session table when a turn runs in a session, and whether it
//!   is Coda's. Grok queues every prompt before it runs it: the queue lists it under `entries` with an id of
//!   Grok's (`{id, kind: "prompt", text}`), then names the running one (`runningPromptId`, and Grok's own turns
//!   as `task-completed-…`, `subagent-completed-…`, `interject-fallback-…`); a prompt sent while a turn runs
//!   waits there behind it (reference lifecycle.md). `session/prompt` carries no id of Grok's, so Coda's prompt
//!   is the entry that first shows in the queue after it was sent, and Coda's turn runs only when the queue
//!   names that entry as running. A running prompt never so tied to Coda's (Grok's own turn, one queued before
//!   Coda's, or a queue that skipped the entry) is no Coda turn: a steering message waits, and is answered
//!   `promptRequired` when the machine stops waiting, rather than joining a turn that may not be Coda's.

use crate::HashMap;
use std::convert::Infallible;

use serde_json::{Value, json};

use super::compact::Queue;
use crate::coda::steering::{Ctl, Outcome, Steerer};
use crate::frame::{Frame, Kind};

const INTERJECT: &str = "_x.ai/interject";
const ECHO: &str = "_x.ai/session/interjection";
const QUEUE_CHANGED: &str = "_x.ai/queue/changed";
const NOTIFICATION: &str = "_x.ai/session_notification";
const FALLBACK: &str = "interject-fallback-";
/// Echoes kept per session to recognise (a Grok that never echoes must not make this grow).
const ECHOES_KEPT: usize = 8;
/// Ids of Grok's queue entries kept per session (a longer queue: the first ones).
const ENTRIES_KEPT: usize = 64;

/// Coda's latest prompt of a session, as Grok's queue names it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CodaPrompt {
    /// Sent; not in Grok's queue yet. The entries the queue held before it, which are not it.
    Sent(Vec<String>),
    /// Grok's id for it.
    Queued(String),
}

/// Where a message Grok queued is, as far as Grok's frames say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// Sent; Grok has not answered.
    Asked,
    /// Queued; no safe point seen since.
    Queued,
    /// A safe point passed since it was queued: Grok's next model answer carries it.
    SafePoint,
}

/// A message sent to Grok, until the machine has its outcome.
struct Steer {
    round: u64,
    text: String,
    proof: Proof,
}

/// What an `_x.ai/interject` of this backend's carries back with Grok's answer.
#[derive(Debug)]
pub struct Interjection {
    session: String,
    round: u64,
}

/// Grok's steering (see the module docs).
#[derive(Default)]
pub struct GrokSteering {
    /// By session.
    steers: HashMap<String, Steer>,
    /// Texts steered into a session whose echo has not come yet, oldest first.
    echoes: HashMap<String, Vec<String>>,
    /// By session: Coda's latest prompt in Grok's queue.
    prompts: HashMap<String, CodaPrompt>,
    /// By session: the ids of the entries Grok's queue held last.
    entries: HashMap<String, Vec<String>>,
}

/// The text Grok gets for a steering `prompt`: its text blocks, and resource links as their URI, one paragraph
/// each. `Err` names what Grok cannot take this way.
fn steered_text(blocks: &[Value]) -> Result<String, String> {
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("resource_link") => match block.get("uri").and_then(Value::as_str) {
                Some(uri) => parts.push(uri),
                None => return Err("a resource link without `uri`".into()),
            },
            Some(other) => return Err(format!("a `{other}` block cannot be added to a running Grok turn")),
            None => return Err("a content block without `type`".into()),
        }
    }
    let text = parts.join("\n\n");
    if text.trim().is_empty() {
        return Err("the steering message is empty".into());
    }
    Ok(text)
}

/// What a frame of Grok's says of its loop: a safe point, a model answer, or neither.
fn loop_step(frame: &Frame) -> (bool, bool) {
    let update = frame.session_update().unwrap_or_default();
    let completed = || {
        let v = frame.value();
        matches!(v.pointer("/params/update/status").and_then(Value::as_str), Some("completed" | "failed"))
    };
    match frame.method() {
        Some("session/update") => match update {
            "tool_call_update" => (completed(), false),
            // A `tool_call` is announced after the answer that asked for it completed: no new answer.
            "agent_message_chunk" | "agent_thought_chunk" => (false, true),
            _ => (false, false),
        },
        Some(NOTIFICATION) => match update {
            "response_completed" => (true, true),
            "tool_call_delta_chunk" => (false, true),
            _ => (false, false),
        },
        _ => (false, false),
    }
}

impl GrokSteering {
    pub fn new() -> GrokSteering {
        GrokSteering::default()
    }

    /// Grok's echo of a message steered here: dropped (Coda has the message).
    fn echo(&mut self, frame: &Frame) -> bool {
        let v = frame.value();
        let params = v.get("params").unwrap_or(&Value::Null);
        let session = params.get("sessionId").and_then(Value::as_str).unwrap_or_default();
        let text = params.get("text").and_then(Value::as_str);
        if let (Some(echoes), Some(text)) = (self.echoes.get_mut(session), text)
            && let Some(at) = echoes.iter().position(|e| e == text)
        {
            echoes.remove(at);
            if echoes.is_empty() {
                self.echoes.remove(session);
            }
            return false;
        }
        true
    }

    /// Grok's loop moved in a session: a queued message is proven in Coda's turn once a model answer follows a
    /// safe point.
    fn step(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) {
        let (safe, answer) = loop_step(frame);
        if !safe && !answer {
            return;
        }
        let session = frame.value().pointer("/params/sessionId").and_then(Value::as_str).unwrap_or_default();
        let Some(steer) = self.steers.get_mut(session) else { return };
        match steer.proof {
            Proof::SafePoint if answer => ctl.answer(session, steer.round, Outcome::Injected),
            Proof::Queued if safe => steer.proof = Proof::SafePoint,
            _ => {}
        }
    }

    /// Grok's queue: whose turn runs (told to the session table), and a turn of its own for a message of Coda's.
    fn queue(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) {
        // Read where it lies, once: the entries' prompts are not parsed.
        let Some(queue) = Queue::of(frame) else { return };
        queue.note(frame, ctl.cx);
        let session = frame.session().unwrap_or_default();
        if ctl.cx.session(&session).is_none() {
            return; // No session of Coda's (what is kept is kept only for those).
        }
        // The ids kept are those of the queue before, most times: each is copied only where it changed.
        let ids = match self.entries.get_mut(&*session) {
            Some(ids) => ids,
            None => self.entries.entry(session.to_string()).or_default(),
        };
        let mut listed = 0;
        for id in queue.entry_ids().take(ENTRIES_KEPT) {
            if ids.get(listed).is_none_or(|kept| *kept != id) {
                ids.truncate(listed);
                ids.push(id.into_owned());
            }
            listed += 1;
        }
        ids.truncate(listed);
        if let Some(CodaPrompt::Sent(before)) = self.prompts.get(&*session)
            && let Some(new) = ids.iter().find(|id| !before.contains(id))
        {
            self.prompts.insert(session.to_string(), CodaPrompt::Queued(new.clone()));
        }
        let running = queue.running();
        if let Some(running) = running {
            let coda = self.prompts.get(&*session) == Some(&CodaPrompt::Queued(running.to_string()));
            if let Some(s) = ctl.cx.session_mut(&session) {
                s.set_running(coda);
            }
        }
        if !running.is_some_and(|running| running.starts_with(FALLBACK)) {
            return;
        }
        let text = queue.text.and_then(|t| t.as_str());
        if let Some(steer) = self.steers.get(&*session).filter(|s| Some(s.text.as_str()) == text.as_deref()) {
            tracing::info!("Grok runs a steering message as a turn of its own: it missed Coda's turn");
            ctl.answer(&session, steer.round, Outcome::StartedNewTurn);
        }
    }
}

impl Steerer for GrokSteering {
    fn session_closed(&mut self, session: &str) {
        self.steers.remove(session);
        self.echoes.remove(session);
        self.prompts.remove(session);
        self.entries.remove(session);
    }

    fn kept(&self) -> usize {
        self.steers.len() + self.echoes.len() + self.prompts.len() + self.entries.len()
    }

    /// Coda's prompt on its way to Grok: it is the next new entry of Grok's queue.
    fn client_request(&mut self, frame: &Frame, cx: &mut crate::layer::Cx) {
        if !matches!(frame.kind(), Kind::Request { method, .. } if method == "session/prompt") {
            return;
        }
        let Some(session) = frame.session().filter(|s| cx.session(s).is_some()) else { return };
        let before = self.entries.get(&*session).cloned().unwrap_or_default();
        self.prompts.insert(session.to_string(), CodaPrompt::Sent(before));
    }

    type Event = Infallible;
    type Reply = Interjection;
    type Timer = Infallible;

    const SAYS_STARTED: bool = true;

    fn accepts(&self, prompt: &[Value]) -> Result<(), String> {
        steered_text(prompt).map(|_| ())
    }

    fn steer(&mut self, session: &str, round: u64, prompt: &[Value], ctl: &mut Ctl<Self>) {
        let Ok(text) = steered_text(prompt) else { return };
        let echoes = self.echoes.entry(session.to_owned()).or_default();
        echoes.push(text.clone());
        if echoes.len() > ECHOES_KEPT {
            echoes.remove(0);
        }
        self.steers.insert(session.to_owned(), Steer { round, text: text.clone(), proof: Proof::Asked });
        let tag = Interjection { session: session.to_owned(), round };
        ctl.request(INTERJECT, json!({"sessionId": session, "text": text}), tag);
    }

    fn finished(&mut self, session: &str, round: u64) {
        if self.steers.get(session).is_some_and(|s| s.round == round) {
            self.steers.remove(session);
        }
    }

    fn from_agent(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        match frame.kind() {
            Kind::Notification { method } if method == ECHO => self.echo(frame),
            Kind::Notification { method } if method == QUEUE_CHANGED => {
                self.queue(frame, ctl);
                true
            }
            Kind::Notification { .. } => {
                if !self.steers.is_empty() {
                    self.step(frame, ctl);
                }
                true
            }
            _ => true,
        }
    }

    fn ignores(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Notification { method } => {
                method != ECHO
                    && method != QUEUE_CHANGED
                    && (self.steers.is_empty() || frame.session_update().is_none())
            }
            _ => true,
        }
    }

    fn on_reply(&mut self, Interjection { session, round }: Interjection, reply: Frame, ctl: &mut Ctl<Self>) {
        let Some(steer) = self.steers.get_mut(&session).filter(|s| s.round == round) else { return };
        let v = reply.value();
        if let Some(err) = v.get("error") {
            let code = err.get("code").and_then(Value::as_i64).unwrap_or(-32603);
            tracing::warn!("Grok refused a steering message (error {code}; its message is logged at debug)");
            tracing::debug!("Grok's answer to the interjection: {err}");
            let message = err.get("message").and_then(Value::as_str).unwrap_or("no message");
            self.echoes.get_mut(&session).map(Vec::pop);
            let outcome = Outcome::Error { code, message: format!("Grok refused the steering message: {message}") };
            return ctl.answer(&session, round, outcome);
        }
        let result = v.get("result").unwrap_or(&Value::Null);
        let status = result.pointer("/result/status").or_else(|| result.get("status"));
        if status.and_then(Value::as_str) == Some("queued") {
            steer.proof = Proof::Queued;
        } else {
            tracing::warn!("Grok answered a steering message with no `queued` status");
            ctl.answer(&session, round, Outcome::Unknown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::steering::{METHOD, Steering, TURN_HOLD};
    use crate::layer::testing::Harness;

    const S: &str = "01a23362-d7f9-7dc1-8cb6-f3bc8dc3908f";

    fn rig() -> Harness {
        let mut h = Harness::of(Steering::new(GrokSteering::new()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"sessionId":S}}));
        h.take();
        h
    }

    fn steer(h: &mut Harness, id: i64, text: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":METHOD,"params":{"sessionId":S,
            "prompt":[{"type":"text","text":text}],"_meta":{"steering":{"idleBehavior":"promptRequired"}}}}));
    }

    fn queue(running: Option<(&str, &str)>) -> Value {
        queue_with(&[], running)
    }

    /// Grok's queue: the prompts waiting (id, text), and the one running.
    fn queue_with(entries: &[(&str, &str)], running: Option<(&str, &str)>) -> Value {
        let entries: Vec<Value> = entries
            .iter()
            .enumerate()
            .map(|(at, (id, text))| json!({"id":id,"version":0,"kind":"prompt","text":text,"position":at}))
            .collect();
        let mut params = json!({"sessionId":S,"entries":entries});
        if let Some((id, text)) = running {
            params["runningPromptId"] = json!(id);
            params["runningText"] = json!(text);
        }
        json!({"jsonrpc":"2.0","method":QUEUE_CHANGED,"params":params})
    }

    /// Coda's prompt `id`, running in Grok (its queue says so).
    fn prompt(h: &mut Harness, id: i64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"run it"}]}}));
        assert_eq!(h.to_agent().len(), 1, "the prompt goes on");
        h.from_agent(queue_with(&[("p-1", "run it")], None));
        h.from_agent(queue(Some(("p-1", "run it"))));
        h.to_client();
    }

    fn queued(h: &mut Harness, interject: &Value) {
        h.from_agent(json!({"jsonrpc":"2.0","id":interject["id"],"result":{"result":{"status":"queued"}}}));
    }

    fn update(update: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":update}})
    }

    fn tool_done() -> Value {
        update(json!({"sessionUpdate":"tool_call_update","toolCallId":"call_16","status":"completed"}))
    }

    fn chunk() -> Value {
        update(json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hello"}}))
    }

    fn response_completed() -> Value {
        json!({"jsonrpc":"2.0","method":NOTIFICATION,"params":{"sessionId":S,
            "update":{"sessionUpdate":"response_completed","usage":{"input_tokens":10}}}})
    }

    fn end(id: i64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}})
    }

    #[test]
    fn initialize_declares_steering_at_the_top_of_meta() {
        let mut h = rig();
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}));
        h.to_agent();
        h.from_agent(
            json!({"jsonrpc":"2.0","id":1,"result":{"agentCapabilities":{},"_meta":{"agentVersion":"1.0.41"}}}),
        );
        let out = h.to_client();
        assert_eq!(out[0]["result"]["_meta"], json!({"agentVersion":"1.0.41","steering":{"supported":true}}));
        assert_eq!(out[0]["result"]["agentCapabilities"], json!({}));
        // Grok's numbers keep their spelling.
        h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"initialize","params":{}}));
        h.agent_frame(Frame::parse(br#"{"jsonrpc":"2.0","id":9,"result":{"n":1e400}}"#.to_vec()).unwrap());
        let out = h.take().to_client;
        let text = String::from_utf8_lossy(out[0].bytes()).into_owned();
        assert!(text.contains(r#""n":1e400"#) && text.contains(r#""steering":{"supported":true}"#), "{text}");
        // A `_meta` that is no object is replaced; an error answer is passed on.
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"initialize","params":{}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"_meta":7}}));
        assert_eq!(h.to_client()[0]["result"]["_meta"], json!({"steering":{"supported":true}}));
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"initialize","params":{}}));
        let error = json!({"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":"auth"}});
        h.from_agent(error.clone());
        assert_eq!(h.to_client(), vec![error]);
    }

    #[test]
    fn a_prompt_queued_behind_groks_own_turn_takes_no_steering_until_it_runs() {
        let mut h = rig();
        h.from_agent(queue(Some(("task-completed-7", "<system-reminder>done</system-reminder>"))));
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"run it"}]}}));
        assert_eq!(h.to_agent().len(), 1);
        // Grok queues Coda's prompt behind its own turn, and says again that its own turn runs.
        h.from_agent(queue_with(&[("p-9", "run it")], Some(("task-completed-7", "<system-reminder>"))));
        h.from_agent(queue(Some(("task-completed-7", "<system-reminder>done</system-reminder>"))));
        h.to_client();
        steer(&mut h, 5, "先别改测试");
        assert!(h.to_agent().is_empty(), "Grok's own turn runs: the message waits");
        assert!(h.to_client().is_empty());
        h.from_agent(queue(Some(("p-9", "run it"))));
        let sent = h.to_agent();
        assert_eq!(sent.len(), 1, "Coda's turn runs: the message goes");
        assert_eq!(sent[0]["method"], INTERJECT);
    }

    #[test]
    fn codas_prompt_queued_in_the_place_of_another_is_codas() {
        let mut h = rig();
        h.from_agent(queue_with(&[("p-1", "theirs")], None));
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"run it"}]}}));
        h.to_agent();
        // The other prompt runs, and Coda's takes its place in the queue: as many entries, another id.
        h.from_agent(queue_with(&[("p-2", "run it")], Some(("p-1", "theirs"))));
        h.from_agent(queue(Some(("p-2", "run it"))));
        h.to_client();
        steer(&mut h, 5, "先别改测试");
        let sent = h.to_agent();
        assert_eq!(sent.len(), 1, "Coda's turn runs: the message goes");
        assert_eq!(sent[0]["method"], INTERJECT);
    }

    #[test]
    fn a_running_prompt_grok_never_queued_after_codas_is_no_coda_turn() {
        let mut h = rig();
        // A prompt of someone else's in Grok's queue before Coda's was sent, then running.
        h.from_agent(queue_with(&[("p-1", "theirs")], None));
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":S,
            "prompt":[{"type":"text","text":"run it"}]}}));
        h.to_agent();
        h.from_agent(queue_with(&[("p-1", "theirs")], None));
        h.from_agent(queue(Some(("p-1", "theirs"))));
        h.to_client();
        steer(&mut h, 5, "wait");
        assert!(h.to_agent().is_empty());
        h.advance(crate::coda::steering::START_WAIT);
        assert_eq!(h.to_client()[0]["result"]["outcome"], "promptRequired");
        assert!(h.to_agent().is_empty(), "Grok never saw it");
    }

    #[test]
    fn between_turns_the_answer_is_prompt_required_and_grok_sees_nothing() {
        let mut h = rig();
        steer(&mut h, 5, "先别改测试");
        assert!(h.to_agent().is_empty());
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":5,"result":{"outcome":"promptRequired","reason":"noRunningTurn"}})]
        );
        prompt(&mut h, 6);
        h.from_agent(end(6));
        h.to_client();
        steer(&mut h, 7, "again");
        assert!(h.to_agent().is_empty());
        assert_eq!(h.to_client()[0]["result"]["outcome"], "promptRequired");
    }

    #[test]
    fn during_a_command_the_text_is_interjected_and_injected_once_the_model_answers_after_the_safe_point() {
        let mut h = rig();
        prompt(&mut h, 3);
        let text = "Stop changing the tests.\n\n只看实现\n- keep `main` green";
        h.from_client(json!({"jsonrpc":"2.0","id":"steer-1","method":METHOD,"params":{"sessionId":S,
            "prompt":[{"type":"text","text":text},{"type":"resource_link","uri":"file:///p/a.rs","name":"a.rs"}]}}));
        let sent = h.to_agent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["method"], INTERJECT);
        assert_eq!(sent[0]["params"], json!({"sessionId":S,"text":format!("{text}\n\nfile:///p/a.rs")}));
        queued(&mut h, &sent[0]);
        assert!(h.to_client().is_empty(), "queued is no proof");
        // Grok's echo of it stays here; other echoes go on.
        let echo =
            json!({"jsonrpc":"2.0","method":ECHO,"params":{"sessionId":S,"text":format!("{text}\n\nfile:///p/a.rs")}});
        h.from_agent(echo.clone());
        assert!(h.to_client().is_empty());
        h.from_agent(echo.clone());
        assert_eq!(h.to_client(), vec![echo]);
        // The command's output is no safe point; its end is; the model's next answer is the proof.
        h.from_agent(update(json!({"sessionUpdate":"tool_call_update","toolCallId":"call_16","status":"in_progress"})));
        assert_eq!(h.to_client().len(), 1);
        h.from_agent(tool_done());
        assert_eq!(h.to_client().len(), 1);
        h.from_agent(chunk());
        assert_eq!(
            h.to_client(),
            vec![json!({"jsonrpc":"2.0","id":"steer-1","result":{"outcome":"injected"}}), chunk()]
        );
        h.from_agent(end(3));
        assert_eq!(h.to_client(), vec![end(3)]);
    }

    #[test]
    fn during_the_last_answer_the_drain_before_the_turn_completes_takes_it() {
        let mut h = rig();
        prompt(&mut h, 3);
        h.from_agent(chunk());
        steer(&mut h, 4, "late in the answer");
        let sent = h.to_agent();
        queued(&mut h, &sent[0]);
        h.from_agent(chunk());
        h.from_agent(response_completed());
        assert_eq!(h.to_client().len(), 3, "the answer that ran when it was queued proves nothing");
        h.from_agent(chunk());
        let out = h.to_client();
        assert_eq!(out[0]["result"]["outcome"], "injected");
    }

    #[test]
    fn a_message_grok_takes_after_the_turns_last_safe_point_is_started_new_turn() {
        let mut h = rig();
        prompt(&mut h, 3);
        h.from_agent(response_completed());
        h.to_client();
        steer(&mut h, 4, "edge");
        let sent = h.to_agent();
        queued(&mut h, &sent[0]);
        h.from_agent(queue(None));
        h.from_agent(end(3));
        assert_eq!(h.to_client().len(), 1, "the turn's answer waits for the steering answer");
        h.from_agent(queue(Some(("interject-fallback-1", "edge"))));
        let out = h.to_client();
        assert_eq!(out[0], json!({"jsonrpc":"2.0","id":4,"result":{"outcome":"startedNewTurn"}}));
        assert_eq!(out[1], end(3));
        assert_eq!(out[2]["method"], QUEUE_CHANGED, "Grok's queue passes on");
    }

    #[test]
    fn a_turn_that_ends_without_proof_answers_unknown_within_the_hold() {
        let mut h = rig();
        prompt(&mut h, 3);
        steer(&mut h, 4, "no proof");
        let sent = h.to_agent();
        queued(&mut h, &sent[0]);
        h.from_agent(end(3));
        assert!(h.to_client().is_empty());
        h.advance(TURN_HOLD);
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":4,"result":{"outcome":"failed"}}), end(3)]);
        // Grok never answering the interjection is bounded the same way.
        prompt(&mut h, 5);
        steer(&mut h, 6, "never answered");
        h.to_agent();
        h.from_agent(end(5));
        h.advance(TURN_HOLD);
        let out = h.to_client();
        assert_eq!((out[0]["id"].clone(), out[1]["id"].clone()), (json!(6), json!(5)));
    }

    #[test]
    fn one_steering_in_flight_per_session() {
        let mut h = rig();
        prompt(&mut h, 3);
        steer(&mut h, 4, "one");
        let sent = h.to_agent();
        steer(&mut h, 5, "two");
        assert!(h.to_agent().is_empty());
        assert_eq!(h.to_client()[0]["error"]["code"], -32600);
        queued(&mut h, &sent[0]);
        h.from_agent(tool_done());
        h.from_agent(chunk());
        assert_eq!(h.to_client()[1]["result"]["outcome"], "injected");
        steer(&mut h, 6, "three");
        assert_eq!(h.to_agent().len(), 1, "the next one goes once the first is answered");
    }

    #[test]
    fn grok_refusing_or_not_queueing_is_no_injection() {
        let mut h = rig();
        prompt(&mut h, 3);
        steer(&mut h, 4, "one");
        let sent = h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":sent[0]["id"],"error":{"code":-32602,"message":"unknown session"}}));
        let out = h.to_client();
        assert_eq!(out[0]["id"], 4);
        assert_eq!(out[0]["error"]["code"], -32602);
        steer(&mut h, 5, "two");
        let sent = h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":sent[0]["id"],"result":{"status":"dropped"}}));
        assert_eq!(h.to_client()[0]["result"], json!({"outcome":"failed"}));
        // Odd numbers are no status either.
        steer(&mut h, 6, "three");
        let sent = h.to_agent();
        let id = sent[0]["id"].as_str().unwrap();
        let line = format!(r#"{{"jsonrpc":"2.0","id":"{id}","result":{{"status":1e400}}}}"#);
        h.agent_frame(Frame::parse(line.into_bytes()).unwrap());
        assert_eq!(h.to_client()[0]["result"], json!({"outcome":"failed"}));
    }

    #[test]
    fn bad_steering_requests_get_clear_errors_and_reach_no_one() {
        let mut h = rig();
        for during in [false, true] {
            if during {
                prompt(&mut h, 3);
            }
            for (id, params) in [
                (10, json!({"prompt":[{"type":"text","text":"x"}]})),
                (11, json!({"sessionId":S,"prompt":"x"})),
                (12, json!({"sessionId":S,"prompt":[{"type":"image","data":"AAAA","mimeType":"image/png"}]})),
                (13, json!({"sessionId":S,"prompt":[{"type":"text","text":"  \n"}]})),
                (14, json!({"sessionId":S,"prompt":[{"text":"no type"}]})),
                (15, json!({"sessionId":S,"prompt":[]})),
            ] {
                h.from_client(json!({"jsonrpc":"2.0","id":id,"method":METHOD,"params":params}));
                assert!(h.to_agent().is_empty(), "{id}");
                assert_eq!(h.to_client()[0]["error"]["code"], -32602, "{id}, during a turn: {during}");
            }
        }
        let n = crate::json::MAX_DEPTH + 5;
        let deep = format!("{}{}", "[".repeat(n), "]".repeat(n));
        let line = format!(r#"{{"jsonrpc":"2.0","id":15,"method":"_session/steering","params":{deep}}}"#);
        // Nesting too deep to read never reaches a layer: the engine answers it (src/relay/behaviour.rs).
        assert!(Frame::parse(line.into_bytes()).is_err());
    }
}

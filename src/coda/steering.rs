//! Coda's steering (section 插话), written once: the machine ([`Steering`]) that keeps the section's rules for
//! every adapter that steers, over the small [`Steerer`] an adapter writes for how its CLI takes a message
//! into a running turn (`adapters/<agent>/steering.rs`, or nothing but [`Steerer::NATIVE`] for a CLI that takes
//! `_session/steering` itself).
//!
//! The rules, and what the machine does for them:
//!
//! - Declared as `_meta.steering.supported: true` at the top of the `initialize` result (beside
//!   `agentCapabilities`), where the backend can steer ([`Steerer::declares`]).
//! - The request is `{sessionId, prompt, _meta}`; `prompt` is what `session/prompt` takes: a non-empty list of
//!   content blocks. Anything else is -32602, whether a turn runs or not; so is a block the CLI cannot take into
//!   a running turn ([`Steerer::accepts`]).
//! - One steering message in flight per session: another one before the first is answered gets -32600.
//! - Only Coda's own running turn takes it. None runs: `promptRequired` (`noRunningTurn`), and the CLI sees
//!   nothing (a native CLI answers that itself). Coda's prompt waits behind a compaction: the message joins that
//!   prompt (its blocks are added to the held `session/prompt`) and is `injected`; it never goes into the
//!   compaction. The CLI has not said yet that Coda's turn runs ([`Steerer::SAYS_STARTED`]): the message waits
//!   for it, at most [`START_WAIT`], then `promptRequired` (it went nowhere). It said the turn ran and the session
//!   is idle again (the turn's answer is on its way): `promptRequired`, and the CLI sees nothing.
//! - `injected` only once the backend is certain the message joined Coda's turn; `promptRequired` only when it
//!   is certain the CLI did not take it and runs it nowhere; otherwise unknown (`failed` or `startedNewTurn`,
//!   which Coda records as unknown and does not send again).
//! - The turn's answer waits for the steering answer, so that Coda gets the steering answer first, at most
//!   [`TURN_HOLD`]; then the steering is answered unknown and the turn's answer goes on. A steering answer never
//!   comes: unknown after [`ANSWER_WAIT`]. A late or second answer of the CLI's is dropped. While the turn's
//!   answer waits, what the CLI writes of the session after it (its notifications and requests, at most
//!   [`BEHIND_MAX`]) waits behind it, so Coda never sees inside the turn what the CLI wrote after it; the backend
//!   still reads those frames as they come (they may decide the outcome).
//!
//! The session table marks the message in flight ([`crate::layer::Session::steering`]) and holds the prompts
//! a compaction holds; whose turn runs is the table's to say ([`crate::layer::Cx::turn`]).

use crate::HashMap;
use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::coda::machine::Machine;
use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Layer, Session, Timer, Turn, cancel};

/// Coda's request.
pub const METHOD: &str = "_session/steering";

/// How long the turn's answer waits for the steering answer.
pub const TURN_HOLD: Duration = Duration::from_secs(15);
/// How long a message waits for the CLI to say Coda's turn runs.
pub const START_WAIT: Duration = Duration::from_secs(15);
/// How long the CLI's answer to a steering message is waited for while the turn goes on.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5 * 60);
/// The most frames of the CLI's that wait behind a held turn answer: past it the steering is answered unknown
/// and the turn's answer goes on (a CLI that floods while the shim waits).
pub const BEHIND_MAX: usize = 10_000;
/// Answers of the CLI's to a native steering request the machine already answered, remembered to drop.
const ANSWERED_KEPT: usize = 64;

/// How a steering message ended, as Coda is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It joined Coda's running turn (certainly).
    Injected,
    /// It was not taken, and nothing runs it (`reason: noRunningTurn`).
    PromptRequired,
    /// The CLI runs it as a turn of its own (unknown to Coda).
    StartedNewTurn,
    /// Whether it reached the session is not known.
    Unknown,
    /// A JSON-RPC error, with the CLI's reason.
    Error { code: i64, message: String },
}

impl Outcome {
    /// The answer to Coda's request `id`.
    pub fn answer(&self, id: &Id) -> Frame {
        let result = match self {
            Outcome::Injected => json!({"outcome": "injected"}),
            Outcome::PromptRequired => json!({"outcome": "promptRequired", "reason": "noRunningTurn"}),
            Outcome::StartedNewTurn => json!({"outcome": "startedNewTurn"}),
            Outcome::Unknown => json!({"outcome": "failed"}),
            Outcome::Error { code, message } => return frame::error_response(id, *code, message, None),
        };
        frame::result_response(id, result)
    }
}

/// Adds `_meta.steering.supported: true` to an `initialize` result object.
pub fn declare(result: &mut Map<String, Value>) {
    let meta = result.entry("_meta").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    let steering = meta.as_object_mut().expect("made an object above").entry("steering").or_insert_with(|| json!({}));
    if !steering.is_object() {
        *steering = json!({});
    }
    steering.as_object_mut().expect("made an object above").insert("supported".into(), json!(true));
}

/// The session and prompt of a steering request, or why it is invalid (-32602).
pub fn read(params: &Value) -> Result<(&str, &Vec<Value>), String> {
    let session = params.get("sessionId").and_then(Value::as_str).filter(|s| !s.is_empty());
    let session = session.ok_or("`_session/steering` needs params.sessionId (a string)")?;
    let Some(blocks) = params.get("prompt").and_then(Value::as_array) else {
        return Err("`prompt` is not a list of content blocks".into());
    };
    if blocks.is_empty() {
        return Err("`prompt` is empty".into());
    }
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            None => return Err("a content block without `type`".into()),
            Some("text") if !block.get("text").is_some_and(Value::is_string) => {
                return Err("a text block without `text`".into());
            }
            Some(_) => {}
        }
    }
    Ok((session, blocks))
}

/// How one CLI takes a message into a running turn: what an adapter writes for [`Steering`]. Every method
/// has a default that does nothing.
pub trait Steerer: Send + Sized + 'static {
    /// The backend's events (a server's), `Infallible` for none.
    type Event: Send + 'static;
    /// What the backend's own requests to the CLI carry back ([`Ctl::request`]), `Infallible` for none.
    type Reply: Send + 'static;
    /// The backend's own wake-ups ([`Ctl::after`]), `Infallible` for none.
    type Timer: Timer;

    /// The CLI takes `_session/steering` itself: Coda's request goes to it as it is, its answer is Coda's; the
    /// machine keeps the rules around it ([`Steerer::steer`] is not called). It also judges between turns.
    const NATIVE: bool = false;

    /// The CLI says when a turn runs (the session table's [`Session::started`]): a message waits for it.
    const SAYS_STARTED: bool = false;

    /// Whether the CLI can steer (declared, and steering requests handled); `false` passes them to the CLI.
    fn declares(&self) -> bool {
        true
    }

    /// Why the CLI cannot take `prompt` (already a valid list of content blocks) into a running turn.
    fn accepts(&self, _prompt: &[Value]) -> Result<(), String> {
        Ok(())
    }

    /// Sends `prompt` into Coda's running turn in `session`; reports how it ended with [`Ctl::answer`], for
    /// `round`.
    fn steer(&mut self, _session: &str, _round: u64, _prompt: &[Value], _ctl: &mut Ctl<Self>) {}

    /// Coda's turn in `session` ended (its answer waits) while the message `round` is in flight.
    fn turn_ended(&mut self, _session: &str, _round: u64, _ctl: &mut Ctl<Self>) {}

    /// The message `round` of `session` was answered (or given up): what the backend kept for it can go.
    fn finished(&mut self, _session: &str, _round: u64) {}

    /// A request of the client on its way to the CLI, to read (a session's folder).
    fn client_request(&mut self, _frame: &Frame, _cx: &mut Cx) {}

    /// Coda withdrew the message `round` of `session`, which the CLI has (`$/cancel_request`): the backend takes
    /// back what it can (the stack already withdraws the backend's own requests to the CLI made for it) and
    /// reports the outcome as usual.
    fn withdrawn(&mut self, _session: &str, _round: u64, _ctl: &mut Ctl<Self>) {}

    /// Coda closed `session` (the CLI answered its `session/close`): what the backend keeps of it can go.
    fn session_closed(&mut self, _session: &str) {}

    /// How many entries the backend keeps for sessions ([`Layer::kept`]).
    fn kept(&self) -> usize {
        0
    }

    /// A frame from the CLI: `true` passes it on to Coda, `false` drops it (the CLI's echo of a message).
    fn from_agent(&mut self, _frame: &Frame, _ctl: &mut Ctl<Self>) -> bool {
        true
    }

    /// Whether [`Steerer::from_agent`] would pass `frame` on and learn nothing from it (cheap). `false` is
    /// always right.
    fn ignores(&self, _frame: &Frame) -> bool {
        false
    }

    /// Whether [`Steerer::ignores`] answers a streamed chunk from no more than the steerer's state, the chunk's
    /// session and its kind (see [`Layer::chunks_pass_by_session`]); one that looks into a chunk's text says `false`.
    fn chunks_by_session(&self) -> bool {
        true
    }

    fn on_reply(&mut self, _tag: Self::Reply, _reply: Frame, _ctl: &mut Ctl<Self>) {}

    fn on_event(&mut self, _event: Self::Event, _ctl: &mut Ctl<Self>) {}

    fn on_timer(&mut self, _timer: Self::Timer, _ctl: &mut Ctl<Self>) {}
}

/// The backend of an agent that takes `_session/steering` itself where it declares it (`_meta.steering.supported:
/// true` in its `initialize` result, as Claude Agent ACP does): Coda's request goes to it as it is, and the
/// machine keeps the rules around it; an agent that declares nothing is not declared for, and gets nothing.
#[derive(Debug, Default)]
pub struct AsDeclared {
    declared: bool,
}

impl Steerer for AsDeclared {
    type Event = std::convert::Infallible;
    type Reply = std::convert::Infallible;
    type Timer = std::convert::Infallible;
    const NATIVE: bool = true;

    fn declares(&self) -> bool {
        self.declared
    }

    fn from_agent(&mut self, frame: &Frame, ctl: &mut Ctl<Self>) -> bool {
        if matches!(frame.kind(), Kind::Response { .. }) && ctl.cx.answer_to(frame).is_some_and(|r| r.is("initialize"))
        {
            self.declared = frame.value().pointer("/result/_meta/steering/supported") == Some(&Value::Bool(true));
        }
        true
    }

    fn ignores(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Response { .. })
    }
}

/// What a steering backend is handed with each input ([`crate::coda::machine::Ctl`]).
pub type Ctl<'c, 'a, B> = crate::coda::machine::Ctl<'c, 'a, Steering<B>>;

impl<B: Steerer> Ctl<'_, '_, B> {
    /// The message `round` of `session` ended with `outcome` (one already answered is ignored).
    pub fn answer(&mut self, session: &str, round: u64, outcome: Outcome) {
        self.report((session.to_owned(), round, outcome));
    }
}

/// The machine's wake-ups, and its backend's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tick<T> {
    /// [`START_WAIT`] for a message waiting for Coda's turn to run.
    Start(String, u64),
    /// [`ANSWER_WAIT`] for the CLI's answer.
    Answer(String, u64),
    /// [`TURN_HOLD`] for the turn's answer.
    Hold(String, u64),
    Backend(T),
}

/// A steering message of Coda's, from its request until it is answered.
struct InFlight {
    /// Coda's request.
    id: Id,
    round: u64,
    /// Coda's `session/prompt` it is for.
    turn: Id,
    /// Waiting for Coda's turn to run in the CLI: the request to send then.
    waiting: Option<Frame>,
    /// Coda's request went to the CLI as it is ([`Steerer::NATIVE`]).
    native: bool,
    /// The turn's answer, held until this one is answered.
    turn_end: Option<Frame>,
    /// The CLI's frames of the session that came after the held turn answer, in order: they follow it.
    behind: Vec<Frame>,
}

/// Whether Coda's `turn` in `session` runs in the CLI: the CLI has it and, where it says so, said it runs and
/// has not said since that the session is idle.
fn runs<B: Steerer>(session: &str, turn: &Id, cx: &Cx) -> bool {
    cx.request_of(turn).is_some_and(|r| r.is_sent())
        && (!B::SAYS_STARTED || cx.session(session).is_some_and(|s| s.started() && s.busy() != Some(false)))
}

/// Whether a CLI that says when its turn runs said Coda's latest turn in `session` ran and is over (the session
/// idle again): its answer is on its way, and a message for it would land nowhere or in a turn of the CLI's own.
fn over<B: Steerer>(session: &str, cx: &Cx) -> bool {
    B::SAYS_STARTED && cx.session(session).is_some_and(|s| s.started() && s.busy() == Some(false))
}

/// The steering machine: a layer, over the backend `B` of one CLI (see the module docs).
pub struct Steering<B: Steerer> {
    backend: B,
    in_flight: HashMap<String, InFlight>,
    rounds: u64,
    /// Native requests the machine answered itself: a late answer of the CLI's to one is dropped.
    answered: VecDeque<Id>,
}

impl<B: Steerer> Steering<B> {
    pub fn new(backend: B) -> Steering<B> {
        Steering { backend, in_flight: HashMap::default(), rounds: 0, answered: VecDeque::new() }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Answers the message `round` of `session` with `outcome`, then lets the turn's answer follow.
    fn settle(&mut self, session: &str, round: u64, outcome: Outcome, cx: &mut Cx) {
        if self.in_flight.get(session).is_none_or(|f| f.round != round) {
            return tracing::debug!("a steering outcome for a message already answered; dropped");
        }
        let flight = self.in_flight.remove(session).expect("looked at above");
        for tick in [Tick::<B::Timer>::Start, Tick::Answer, Tick::Hold] {
            cx.cancel(&tick(session.to_owned(), round));
        }
        if let Some(s) = cx.session_mut(session) {
            s.set_steering(None);
        }
        if flight.native {
            self.answered.push_back(flight.id.clone());
            if self.answered.len() > ANSWERED_KEPT {
                self.answered.pop_front();
            }
        }
        self.backend.finished(session, round);
        cx.to_client(outcome.answer(&flight.id));
        if let Some(end) = flight.turn_end {
            cx.to_client(end);
        }
        for frame in flight.behind {
            cx.to_client(frame);
        }
    }

    /// A frame of the CLI's of `session` (a notification's or request's `params.sessionId`, or the session of
    /// the `session/load` or `session/resume` an answer is to): it waits behind its session's held turn answer,
    /// if there is one, so that Coda gets the session's frames in the CLI's order (a load's answer never
    /// overtakes the history it replayed before it).
    fn pass(&mut self, frame: Frame, session: Option<String>, cx: &mut Cx) {
        if self.in_flight.values().all(|f| f.turn_end.is_none()) {
            return cx.to_client(frame);
        }
        let session =
            session.or_else(|| frame.value().pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned));
        let Some((session, flight)) =
            session.and_then(|s| self.in_flight.get_mut(&s).filter(|f| f.turn_end.is_some()).map(|f| (s, f)))
        else {
            return cx.to_client(frame);
        };
        flight.behind.push(frame);
        if flight.behind.len() > BEHIND_MAX {
            tracing::warn!(
                "over {BEHIND_MAX} frames of the CLI waited behind a turn's answer: its steering is unknown"
            );
            let round = flight.round;
            self.settle(&session, round, Outcome::Unknown, cx);
        }
    }

    fn request(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let value = frame.value();
        let params = value.get("params").unwrap_or(&Value::Null);
        let (session, prompt) = match read(params).and_then(|(s, p)| self.backend.accepts(p).map(|()| (s, p))) {
            Ok(read) => read,
            Err(why) => return cx.to_client(frame::error_response(&id, -32602, &why, None)),
        };
        let session = session.to_owned();
        if self.in_flight.contains_key(&session) {
            let msg = "a steering message for this session is still waiting for its answer";
            return cx.to_client(frame::error_response(&id, -32600, msg, None));
        }
        let turn = cx.turn(&session);
        let compacting = cx.session(&session).and_then(Session::compaction).is_some();
        match turn {
            Some(Turn::Coda { sent: false, .. }) if compacting => {
                let prompt = prompt.clone();
                self.join_held(&id, &session, prompt, cx)
            }
            Some(Turn::Coda { sent: true, .. }) if over::<B>(&session, cx) => {
                cx.to_client(Outcome::PromptRequired.answer(&id))
            }
            Some(Turn::Coda { prompt: turn, .. }) => {
                let runs = runs::<B>(&session, &turn, cx);
                self.rounds += 1;
                let round = self.rounds;
                let flight = InFlight {
                    id: id.clone(),
                    round,
                    turn,
                    waiting: None,
                    native: B::NATIVE,
                    turn_end: None,
                    behind: Vec::new(),
                };
                self.in_flight.insert(session.clone(), flight);
                if let Some(s) = cx.session_mut(&session) {
                    s.set_steering(Some(id));
                }
                if runs {
                    self.send(&session, round, frame, cx);
                } else {
                    tracing::debug!("a steering message waits for Coda's turn to run in the CLI");
                    if let Some(f) = self.in_flight.get_mut(&session) {
                        f.waiting = Some(frame);
                    }
                    cx.after(START_WAIT, Tick::<B::Timer>::Start(session, round));
                }
            }
            // No turn of Coda's runs. While the CLI compacts, or runs a request of the shim's, nothing goes to it
            // (the message would land in that); else a native CLI judges itself, and for the others it is not
            // taken.
            _ if compacting || matches!(turn, Some(Turn::Shim { .. })) => {
                cx.to_client(Outcome::PromptRequired.answer(&id))
            }
            _ if B::NATIVE => {
                self.rounds += 1;
                let flight = InFlight {
                    id: id.clone(),
                    round: self.rounds,
                    turn: Id::null(),
                    waiting: None,
                    native: true,
                    turn_end: None,
                    behind: Vec::new(),
                };
                self.in_flight.insert(session.clone(), flight);
                cx.after(ANSWER_WAIT, Tick::<B::Timer>::Answer(session, self.rounds));
                cx.to_agent(frame)
            }
            _ => cx.to_client(Outcome::PromptRequired.answer(&id)),
        }
    }

    /// Sends the message `round` to the CLI: Coda's request as it is (native), else through the backend.
    fn send(&mut self, session: &str, round: u64, frame: Frame, cx: &mut Cx) {
        cx.after(ANSWER_WAIT, Tick::<B::Timer>::Answer(session.to_owned(), round));
        if B::NATIVE {
            return cx.to_agent(frame);
        }
        let prompt = frame.value().pointer("/params/prompt").and_then(Value::as_array).cloned().unwrap_or_default();
        let id = frame.id().cloned();
        self.with_backend_for(cx, id.as_ref(), |b, ctl| b.steer(session, round, &prompt, ctl));
    }

    /// Coda's `$/cancel_request`. A message still waiting for its turn is answered cancelled and never sent; one
    /// the CLI has is withdrawn from it (the request as it came goes on to a native CLI; the stack withdraws the
    /// backend's own requests for it; the backend takes back what else it did, [`Steerer::withdrawn`]) and is
    /// answered as it ends: it may have joined the turn already.
    fn withdrawn(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(id) = cancel::target(&frame) else { return cx.to_agent(frame) };
        let found =
            self.in_flight.iter().find(|(_, f)| f.id == id).map(|(s, f)| (s.clone(), f.round, f.waiting.is_some()));
        let Some((session, round, waiting)) = found else { return cx.to_agent(frame) };
        if waiting {
            tracing::debug!("Coda withdrew a steering message that waited for its turn; it is not sent");
            let outcome = Outcome::Error { code: cancel::CANCELLED, message: "Request cancelled".into() };
            return self.settle(&session, round, outcome, cx);
        }
        if !B::NATIVE {
            self.with_backend(cx, |b, ctl| b.withdrawn(&session, round, ctl));
        }
        cx.to_agent(frame)
    }

    /// Coda's `session/close` of `session` on its way: a message still waiting for its turn went nowhere.
    fn closing(&mut self, session: &str, cx: &mut Cx) {
        if let Some(f) = self.in_flight.get(session).filter(|f| f.waiting.is_some()) {
            let round = f.round;
            self.settle(session, round, Outcome::PromptRequired, cx);
        }
    }

    /// Coda's prompt waits behind a compaction: the message joins it.
    fn join_held(&mut self, id: &Id, session: &str, prompt: Vec<Value>, cx: &mut Cx) {
        let Some(s) = cx.session_mut(session) else { return };
        let held = s.held_mut().iter_mut().rev().find(|f| f.is_request("session/prompt"));
        let Some(held) = held else { return cx.to_client(Outcome::PromptRequired.answer(id)) };
        let mut value = held.to_value();
        match value.pointer_mut("/params/prompt").and_then(Value::as_array_mut) {
            Some(blocks) => blocks.extend(prompt),
            None => return cx.to_client(Outcome::PromptRequired.answer(id)),
        }
        *held = held.rewritten(value);
        tracing::debug!("a steering message joined the prompt that waits behind the session's compaction");
        cx.to_client(Outcome::Injected.answer(id));
    }

    /// Messages waiting for their turn go once it runs in the CLI.
    fn go_if_started(&mut self, cx: &mut Cx) {
        let ready: Vec<(String, u64)> = self
            .in_flight
            .iter()
            .filter(|(s, f)| f.waiting.is_some() && runs::<B>(s, &f.turn, cx))
            .map(|(s, f)| (s.clone(), f.round))
            .collect();
        for (session, round) in ready {
            let Some(frame) = self.in_flight.get_mut(&session).and_then(|f| f.waiting.take()) else { continue };
            cx.cancel(&Tick::<B::Timer>::Start(session.clone(), round));
            self.send(&session, round, frame, cx);
        }
    }

    /// Coda's turn's answer: held while a message for that turn is in flight.
    fn turn_ended(&mut self, frame: Frame, session: &str, cx: &mut Cx) {
        let Some(flight) = self.in_flight.get_mut(session).filter(|f| Some(&f.turn) == frame.id()) else {
            return cx.to_client(frame);
        };
        let round = flight.round;
        if flight.waiting.take().is_some() {
            // It never went anywhere.
            cx.to_client(frame);
            return self.settle(session, round, Outcome::PromptRequired, cx);
        }
        flight.turn_end = Some(frame);
        if cx.agent_gone() {
            // Nothing will answer it now.
            return self.settle(session, round, Outcome::Unknown, cx);
        }
        cx.after(TURN_HOLD, Tick::<B::Timer>::Hold(session.to_owned(), round));
        let session = session.to_owned();
        self.with_backend(cx, |b, ctl| b.turn_ended(&session, round, ctl));
    }

    /// The CLI's answer to Coda's native request.
    fn native_answer(&mut self, frame: Frame, session: &str, cx: &mut Cx) {
        let Some(flight) = self.in_flight.get_mut(session).filter(|f| f.native && Some(&f.id) == frame.id()) else {
            return cx.to_client(frame);
        };
        let round = flight.round;
        let end = flight.turn_end.take();
        let behind = std::mem::take(&mut flight.behind);
        self.in_flight.remove(session);
        self.answered.push_back(frame.id().cloned().unwrap_or_else(Id::null));
        if self.answered.len() > ANSWERED_KEPT {
            self.answered.pop_front();
        }
        for tick in [Tick::<B::Timer>::Start, Tick::Answer, Tick::Hold] {
            cx.cancel(&tick(session.to_owned(), round));
        }
        if let Some(s) = cx.session_mut(session) {
            s.set_steering(None);
        }
        self.backend.finished(session, round);
        cx.to_client(frame);
        if let Some(end) = end {
            cx.to_client(end);
        }
        for frame in behind {
            cx.to_client(frame);
        }
    }

    fn initialized(&self, frame: Frame, cx: &mut Cx) {
        let declared = frame.value().pointer("/result/_meta/steering/supported") == Some(&Value::Bool(true));
        if declared {
            return cx.to_client(frame);
        }
        let mut v = frame.to_value();
        match v.get_mut("result").and_then(Value::as_object_mut) {
            Some(result) => {
                declare(result);
                cx.to_client(frame.rewritten(v))
            }
            None => cx.to_client(frame),
        }
    }
}

impl<B: Steerer> Machine for Steering<B> {
    type Backend = B;
    type Report = (String, u64, Outcome);
    type BackendTimer = B::Timer;

    fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    fn apply(&mut self, answers: Vec<(String, u64, Outcome)>, cx: &mut Cx) {
        for (session, round, outcome) in answers {
            self.settle(&session, round, outcome, cx);
        }
        self.go_if_started(cx);
    }

    fn backend_timer(timer: B::Timer) -> Tick<B::Timer> {
        Tick::Backend(timer)
    }
}

impl<B: Steerer> Layer for Steering<B> {
    type Timer = Tick<B::Timer>;
    type Event = B::Event;
    type Reply = B::Reply;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Request { id, method } if method == METHOD && self.backend.declares() => {
                let id = id.clone();
                self.request(id, frame, cx)
            }
            Kind::Notification { method } if method == cancel::METHOD => self.withdrawn(frame, cx),
            Kind::Request { id, method } if method == "session/close" => {
                let session = cx.request_of(id).and_then(|r| r.session()).map(str::to_owned);
                if let Some(session) = session {
                    self.closing(&session, cx);
                }
                self.backend.client_request(&frame, cx);
                cx.to_agent(frame)
            }
            Kind::Request { .. } => {
                self.backend.client_request(&frame, cx);
                cx.to_agent(frame)
            }
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        let mut keep = true;
        self.with_backend(cx, |b, ctl| keep = b.from_agent(&frame, ctl));
        if !keep {
            return;
        }
        let Kind::Response { id } = frame.kind() else { return self.pass(frame, None, cx) };
        let asked = cx.answer_to(&frame).map(|r| (r.method.to_string(), r.session().map(str::to_owned)));
        match asked {
            Some((m, _)) if m == "initialize" && self.backend.declares() => self.initialized(frame, cx),
            Some((m, Some(session))) if m == "session/prompt" => self.turn_ended(frame, &session, cx),
            Some((m, Some(session))) if m == METHOD => self.native_answer(frame, &session, cx),
            None if self.answered.contains(id) => {
                tracing::debug!("the CLI answered a steering request the shim had answered; dropped");
            }
            // A load's or resume's answer follows the history the CLI replayed before it (which may wait behind
            // the held turn answer): arriving first, it would turn that history into news.
            Some((m, Some(session))) if m == "session/load" || m == "session/resume" => {
                self.pass(frame, Some(session), cx)
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Response { .. })
            && self.backend.ignores(frame)
            && self.in_flight.values().all(|f| f.waiting.is_none() && f.turn_end.is_none())
    }

    fn chunks_pass_by_session(&self) -> bool {
        self.backend.chunks_by_session()
    }

    fn on_reply(&mut self, tag: B::Reply, reply: Frame, cx: &mut Cx) {
        self.with_backend(cx, |b, ctl| b.on_reply(tag, reply, ctl));
    }

    fn on_event(&mut self, event: B::Event, cx: &mut Cx) {
        self.with_backend(cx, |b, ctl| b.on_event(event, ctl));
    }

    fn session_closed(&mut self, closed: &[String], cx: &mut Cx) {
        for session in closed {
            if let Some(round) = self.in_flight.get(session).map(|f| f.round) {
                tracing::debug!(
                    "the session was closed while a steering message was in flight: its outcome is unknown"
                );
                self.settle(session, round, Outcome::Unknown, cx);
            }
            self.backend.session_closed(session);
        }
    }

    fn kept(&self) -> usize {
        self.in_flight.len() + self.backend.kept()
    }

    fn on_timer(&mut self, tick: Tick<B::Timer>, cx: &mut Cx) {
        match tick {
            Tick::Start(session, round) => {
                tracing::debug!("the CLI never said the turn runs: the steering message was not sent");
                self.settle(&session, round, Outcome::PromptRequired, cx);
            }
            Tick::Answer(session, round) => {
                tracing::warn!("the CLI did not answer a steering message in {ANSWER_WAIT:?}: its outcome is unknown");
                self.settle(&session, round, Outcome::Unknown, cx);
            }
            Tick::Hold(session, round) => {
                tracing::warn!("the turn ended without an answer to its steering message: its outcome is unknown");
                self.settle(&session, round, Outcome::Unknown, cx);
            }
            Tick::Backend(t) => self.with_backend(cx, |b, ctl| b.on_timer(t, ctl)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    #[test]
    fn a_prompt_must_be_a_list_of_content_blocks() {
        let ok = json!({"sessionId":"s","prompt":[{"type":"text","text":"x"},{"type":"image","data":"AA"}]});
        assert!(read(&ok).is_ok());
        for bad in [
            json!({"prompt":[{"type":"text","text":"x"}]}),
            json!({"sessionId":"","prompt":[{"type":"text","text":"x"}]}),
            json!({"sessionId":"s","prompt":"x"}),
            json!({"sessionId":"s","prompt":[]}),
            json!({"sessionId":"s","prompt":[{"text":"x"}]}),
            json!({"sessionId":"s","prompt":[{"type":"text","text":7}]}),
            json!({"sessionId":"s","prompt":{"type":"text","text":"x"}}),
            json!(null),
        ] {
            assert!(read(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_declaration_sits_at_the_top_of_meta_and_replaces_what_is_no_object() {
        let mut r = json!({"_meta":{"x":1}});
        declare(r.as_object_mut().unwrap());
        assert_eq!(r, json!({"_meta":{"x":1,"steering":{"supported":true}}}));
        let mut r = json!({"_meta":{"steering":3}});
        declare(r.as_object_mut().unwrap());
        assert_eq!(r, json!({"_meta":{"steering":{"supported":true}}}));
    }

    /// A CLI that says when its turn runs and never answers a message.
    #[derive(Default)]
    struct Silent {
        steered: Vec<String>,
    }

    impl Steerer for Silent {
        type Event = bool;
        type Reply = std::convert::Infallible;
        type Timer = std::convert::Infallible;
        const SAYS_STARTED: bool = true;
        fn steer(&mut self, session: &str, _: u64, _: &[Value], _: &mut Ctl<Self>) {
            self.steered.push(session.to_owned());
        }
        fn on_event(&mut self, busy: bool, ctl: &mut Ctl<Self>) {
            if let Some(s) = ctl.cx.session_mut("s") {
                s.set_busy(busy);
            }
        }
    }

    fn rig() -> Harness {
        let mut h = Harness::of(Steering::new(Silent::default()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"sessionId":"s"}}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}));
        h.take();
        h
    }

    fn steer(h: &mut Harness, id: u64) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":METHOD,"params":{"sessionId":"s",
            "prompt":[{"type":"text","text":"x"}]}}));
    }

    #[test]
    fn a_message_waits_for_the_turn_to_run_and_goes_nowhere_past_the_wait() {
        let mut h = rig();
        steer(&mut h, 2);
        assert!(h.layer::<Steering<Silent>>(0).backend().steered.is_empty(), "not before the CLI said it runs");
        h.event(0, true);
        assert_eq!(h.layer::<Steering<Silent>>(0).backend().steered, ["s"]);
        // Another turn, a message the CLI never says it runs for.
        h.advance(ANSWER_WAIT);
        assert_eq!(h.to_client()[0]["result"]["outcome"], "failed", "never answered: unknown");
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}));
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}));
        h.take();
        steer(&mut h, 4);
        h.advance(START_WAIT);
        assert_eq!(h.to_client()[0]["result"]["outcome"], "promptRequired");
        assert_eq!(h.layer::<Steering<Silent>>(0).backend().steered.len(), 1);
    }

    #[test]
    fn the_turns_answer_waits_for_the_steering_answer_no_longer_than_the_hold() {
        let mut h = rig();
        h.event(0, true);
        steer(&mut h, 2);
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}));
        assert!(h.to_client().is_empty());
        h.advance(TURN_HOLD);
        let out = h.to_client();
        assert_eq!((out[0]["id"].clone(), out[0]["result"]["outcome"].clone()), (json!(2), json!("failed")));
        assert_eq!(out[1]["id"], 1);
        assert!(h.stack().sessions().get("s").is_some_and(|s| s.steering().is_none()));
    }

    #[test]
    fn the_sessions_frames_and_answers_after_a_held_turn_answer_follow_it_in_the_clis_order() {
        let mut h = rig();
        h.event(0, true);
        steer(&mut h, 2);
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/load","params":{"sessionId":"s","cwd":"/w"}}));
        h.take();
        let replay = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s",
            "update":{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":"earlier"}}}});
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}));
        h.from_agent(replay.clone());
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":{}}));
        assert!(h.to_client().is_empty(), "the load's answer waits behind the turn's, after its replay");
        h.advance(TURN_HOLD);
        let ids: Vec<Value> = h.to_client().iter().map(|f| f.get("id").cloned().unwrap_or(Value::Null)).collect();
        assert_eq!(ids, [json!(2), json!(1), Value::Null, json!(3)]);
    }

    #[test]
    fn a_message_after_the_cli_said_the_turn_is_over_goes_nowhere() {
        // The CLI ran Coda's turn and said the session is idle again; the turn's answer is still on its way when
        // Coda steers (a Stop raced it): the message is not sent, and is `promptRequired`.
        let mut h = rig();
        h.event(0, true);
        h.event(0, false);
        steer(&mut h, 2);
        assert_eq!(
            h.to_client(),
            [json!({"jsonrpc":"2.0","id":2,"result":{"outcome":"promptRequired",
            "reason":"noRunningTurn"}})]
        );
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"stopReason":"cancelled"}}));
        assert_eq!(h.to_client()[0]["id"], 1, "the turn's answer is not held");
        assert!(h.layer::<Steering<Silent>>(0).backend().steered.is_empty(), "the CLI never had it");
    }
}

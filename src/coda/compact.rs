//! Coda's `_coda/session/compact` (section 压缩上下文), written once: the declaration, the request's one
//! parameter, the answer's shape, and the machine ([`Compaction`]) that keeps the section's rules for every
//! adapter. How a CLI compacts is its adapter's [`Compactor`] (`adapters/<agent>/compact.rs`): it starts the
//! CLI's compaction, reads what the CLI says, reports how the compaction ended ([`Ctl::ended`]), and stops the
//! CLI when asked.
//!
//! The rules, and what the machine does for them:
//!
//! - Declared as `agentCapabilities._meta.coda.compact: {}` in the `initialize` result ([`declare`]).
//! - The request is `{sessionId}`: without a string `sessionId` it is -32602.
//! - Answered `compacted: false` at once, with nothing asked of the CLI, when the session is not running in this
//!   process ([`NOT_RUNNING`]: not a root of the stack's session table), is compacting ([`ALREADY`]), or runs a
//!   turn ([`TURN_RUNNING`]: Coda's, the shim's own or the CLI's own, [`crate::layer::Cx::turn`]); then the
//!   backend's own refusals ([`Compactor::refuse`]).
//! - Not a turn: Coda opens none and the session's view does not change; `session/update`s during it pass on
//!   (the backend drops only what the CLI streams for a prompt of the shim's own).
//! - A `session/prompt` that arrives while its session compacts waits, held in the session table
//!   ([`crate::layer::Session::held`]), until the compaction ended; then the held prompts go to the CLI in their
//!   order, after Coda's answer.
//! - A `session/cancel` for a session whose prompts wait behind its compaction stops those prompts (the turns
//!   Coda is running there): each is answered `stopReason: cancelled` and never reaches the CLI. The compaction
//!   is no turn (and no activity Coda could stop) and goes on: the cancel is not sent to the CLI, which would
//!   stop the compaction with it (Codex's `/compact` prompt, OpenCode's summary).
//! - The answer is `{compacted, reason?, before?, after?}`; nothing else ([`Outcome::answer`]).
//! - Coda waits at most 10 minutes. At [`DEADLINE`] Coda is answered `compacted: false` ([`TIMED_OUT`]) and the
//!   CLI is asked to stop ([`Compactor::stop`]); the held prompts still wait, since the CLI may still be
//!   compacting, until the CLI says its compaction ended ([`Ctl::ended`]) or [`GRACE`] passed. Past the grace
//!   each held prompt is answered with an error saying it was not sent ([`not_sent`]), and none is sent.
//!
//! The session table holds the compaction ([`crate::layer::sessions::Compaction`]) and the held prompts; the
//! machine keeps no copy of either. A CLI that dies meanwhile: the engine answers every request still open.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::coda::machine::Machine;
use crate::frame::{self, Frame, Id, Kind};
use crate::json;
use crate::layer::sessions::Compaction as Mark;
use crate::layer::{Cx, Layer, Session, Timer, cancel};

/// Coda's request.
pub const METHOD: &str = "_coda/session/compact";

/// How long the CLI gets before Coda is answered [`TIMED_OUT`] and the CLI is asked to stop: inside Coda's 10
/// minutes, with room for the answer.
pub const DEADLINE: Duration = Duration::from_secs(9 * 60);

/// How long after [`DEADLINE`] the held prompts wait for the CLI to say its compaction ended.
pub const GRACE: Duration = Duration::from_secs(30);

/// Reasons shared by every adapter, for people to read.
pub const NOT_RUNNING: &str = "the session is not running in this agent process";
pub const TURN_RUNNING: &str = "a turn is running in this session; compact between turns";
pub const ALREADY: &str = "this session is already compacting";
pub const TIMED_OUT: &str = "the agent did not finish compacting within 9 minutes; it was cancelled";
pub const CLOSED: &str = "the session was closed";
/// The error message of a prompt that waited behind a compaction the CLI never ended.
pub const NOT_SENT: &str = "the agent did not end its compaction after it was cancelled, so this prompt was not \
                            sent to it; send it again";

/// Adds `agentCapabilities._meta.coda.compact: {}` to an `initialize` result object.
pub fn declare(result: &mut Map<String, Value>) {
    let capabilities = json::object_at(result, "agentCapabilities");
    let coda = json::object_at(json::object_at(capabilities, "_meta"), "coda");
    coda.insert("compact".into(), json!({}));
}

/// The session a `_coda/session/compact` request names, or the error answer for it (-32602; boxed: a frame is
/// large beside a session's name).
pub fn session_of(request: &Value, id: &Id) -> Result<String, Box<Frame>> {
    match request.get("params").and_then(|p| p.get("sessionId")).and_then(Value::as_str) {
        Some(s) if !s.is_empty() => Ok(s.to_owned()),
        _ => Err(Box::new(frame::error_response(
            id,
            -32602,
            "`_coda/session/compact` needs params.sessionId (a string)",
            None,
        ))),
    }
}

/// The answer to a prompt `id` that waited behind a compaction the CLI never ended: a plain error saying it was
/// not sent. No failure kind: a CLI stuck in its compaction is no upstream's temporary failure (section 执行失败
/// asks for an explicit upstream reason), so Coda does not send it again by itself.
pub fn not_sent(id: &Id) -> Frame {
    frame::error_response(id, -32603, NOT_SENT, None)
}

/// How a compaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Compacted; the context's tokens before and after where the CLI lets them be known (one measure for both).
    Compacted { before: Option<u64>, after: Option<u64> },
    /// Not compacted, and why (for people; times as `<t:…>`).
    NotCompacted(String),
}

impl Outcome {
    pub fn not(reason: impl Into<String>) -> Outcome {
        Outcome::NotCompacted(reason.into())
    }

    /// The answer to Coda's request `id`: exactly the protocol's fields.
    pub fn answer(&self, id: &Id) -> Frame {
        let mut result = Map::new();
        match self {
            Outcome::Compacted { before, after } => {
                result.insert("compacted".into(), json!(true));
                if let Some(b) = before {
                    result.insert("before".into(), json!(b));
                }
                if let Some(a) = after {
                    result.insert("after".into(), json!(a));
                }
            }
            Outcome::NotCompacted(reason) => {
                result.insert("compacted".into(), json!(false));
                result.insert("reason".into(), json!(reason));
            }
        }
        frame::result_response(id, Value::Object(result))
    }
}

/// How one CLI compacts: what an adapter writes for [`Compaction`]. Every method but [`Compactor::start`] has a
/// default that does nothing (or passes the frame on).
pub trait Compactor: Send + Sized + 'static {
    /// The backend's events (a server's), `Infallible` for none.
    type Event: Send + 'static;
    /// What the backend's own requests to the CLI carry back ([`Ctl::request`]), `Infallible` for none.
    type Reply: Send + 'static;
    /// The backend's own wake-ups ([`Ctl::after`]), `Infallible` for none.
    type Timer: Timer;

    /// Why the CLI cannot compact `session` now, beyond the protocol's refusals (checked first); `None`: it can.
    fn refuse(&self, _session: &str, _cx: &Cx) -> Option<String> {
        None
    }

    /// Starts compacting `session`, the compaction numbered `round`; reports its end with [`Ctl::ended`].
    fn start(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>);

    /// [`DEADLINE`] passed: asks the CLI to stop compacting `session`. By default a `session/cancel` for it. The
    /// CLI's end, if it comes, is reported with [`Ctl::ended`] as usual.
    fn stop(&mut self, session: &str, _round: u64, ctl: &mut Ctl<Self>) {
        ctl.cx.to_agent(frame::notification("session/cancel", json!({ "sessionId": session })));
    }

    /// The compaction `round` of `session` is over (answered and its prompts let go, or given up): what the
    /// backend kept for it can go.
    fn finished(&mut self, _session: &str, _round: u64, _ctl: &mut Ctl<Self>) {}

    /// A request of the client on its way to the CLI, to read (a session's folder or model).
    fn client_request(&mut self, _frame: &Frame, _cx: &mut Cx) {}

    /// Coda closed `session` (the CLI answered its `session/close`): what the backend keeps of it can go.
    fn session_closed(&mut self, _session: &str, _ctl: &mut Ctl<Self>) {}

    /// How many entries the backend keeps for sessions ([`Layer::kept`]).
    fn kept(&self) -> usize {
        0
    }

    /// A frame from the CLI: `true` passes it on to Coda, `false` drops it (what the CLI streams for a prompt of
    /// the shim's own).
    fn from_agent(&mut self, _frame: &Frame, _ctl: &mut Ctl<Self>) -> bool {
        true
    }

    /// Whether [`Compactor::from_agent`] would pass `frame` on and learn nothing from it (cheap: the machine
    /// then skips it, as [`Layer::passes_from_agent`]). `false` is always right.
    fn ignores(&self, _frame: &Frame) -> bool {
        false
    }

    /// Whether [`Compactor::ignores`] answers a streamed chunk from no more than the compactor's state, the
    /// chunk's session and its kind (see [`Layer::chunks_pass_by_session`]); a compactor that looks into a chunk's
    /// text says `false` while it does.
    fn chunks_by_session(&self) -> bool {
        true
    }

    fn on_reply(&mut self, _tag: Self::Reply, _reply: Frame, _ctl: &mut Ctl<Self>) {}

    fn on_event(&mut self, _event: Self::Event, _ctl: &mut Ctl<Self>) {}

    fn on_timer(&mut self, _timer: Self::Timer, _ctl: &mut Ctl<Self>) {}
}

/// What a compaction backend is handed with each input ([`crate::coda::machine::Ctl`]).
pub type Ctl<'c, 'a, B> = crate::coda::machine::Ctl<'c, 'a, Compaction<B>>;

impl<B: Compactor> Ctl<'_, '_, B> {
    /// The CLI's compaction `round` of `session` ended with `outcome` (one of an earlier round, or of no
    /// compaction the machine runs, is ignored).
    pub fn ended(&mut self, session: &str, round: u64, outcome: Outcome) {
        self.report((session.to_owned(), round, outcome));
    }

    /// The round of the compaction `session` runs now (the session table's).
    pub fn round(&self, session: &str) -> Option<u64> {
        self.cx.session(session).and_then(Session::compaction).map(|c| c.round)
    }
}

/// The machine's wake-ups, and its backend's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tick<T> {
    /// [`DEADLINE`] of a session's compaction.
    Deadline(String, u64),
    /// [`GRACE`] after it.
    Grace(String, u64),
    Backend(T),
}

/// The compaction machine: a layer, over the backend `B` of one CLI (see the module docs).
pub struct Compaction<B: Compactor> {
    backend: B,
    /// Compactions started so far (numbers each one's round).
    rounds: u64,
}

impl<B: Compactor> Compaction<B> {
    pub fn new(backend: B) -> Compaction<B> {
        Compaction { backend, rounds: 0 }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    fn request(&mut self, id: Id, frame: Frame, cx: &mut Cx) {
        let session = match session_of(frame.value(), &id) {
            Ok(s) => s,
            Err(answer) => return cx.to_client(*answer),
        };
        let known = cx.session(&session).filter(|s| s.is_root());
        let refused = match known {
            None => Some(NOT_RUNNING.to_owned()),
            Some(s) if s.compaction().is_some() => Some(ALREADY.to_owned()),
            Some(_) if cx.turn(&session).is_some() => Some(TURN_RUNNING.to_owned()),
            Some(_) => self.backend.refuse(&session, cx),
        };
        if let Some(reason) = refused {
            tracing::debug!("a compaction refused: {reason}");
            return cx.to_client(Outcome::not(reason).answer(&id));
        }
        self.rounds += 1;
        let round = self.rounds;
        if let Some(s) = cx.session_mut(&session) {
            s.set_compaction(Some(Mark { coda: Some(id.clone()), round, overdue: false }));
        }
        cx.after(DEADLINE, Tick::<B::Timer>::Deadline(session.clone(), round));
        self.with_backend_for(cx, Some(&id), |b, ctl| b.start(&session, round, ctl));
    }

    /// The compaction `round` of `session` ended: Coda's answer (unless it has it), then its held prompts go on.
    fn end(&mut self, session: &str, round: u64, outcome: Outcome, cx: &mut Cx) {
        let Some(mark) = cx.session(session).and_then(Session::compaction).filter(|c| c.round == round).cloned() else {
            return tracing::debug!("the CLI ended a compaction the shim no longer waits for; ignored");
        };
        if let Outcome::NotCompacted(why) = &outcome {
            tracing::info!("the session was not compacted: {why}");
        }
        if let Some(id) = mark.coda.as_ref().filter(|id| cx.request_of(id).is_some()) {
            cx.to_client(outcome.answer(id));
        }
        self.release(session, round, cx, |held, cx| cx.to_agent(held));
    }

    /// Forgets the compaction and hands each held prompt to `each`, in order.
    fn release(&mut self, session: &str, round: u64, cx: &mut Cx, each: impl Fn(Frame, &mut Cx)) {
        cx.cancel(&Tick::<B::Timer>::Deadline(session.to_owned(), round));
        cx.cancel(&Tick::<B::Timer>::Grace(session.to_owned(), round));
        let held = cx.session_mut(session).map(|s| {
            s.set_compaction(None);
            s.take_held()
        });
        self.backend.finished(session, round, &mut Ctl::new(cx));
        for frame in held.unwrap_or_default() {
            each(frame, cx);
        }
    }

    fn deadline(&mut self, session: String, round: u64, cx: &mut Cx) {
        tracing::warn!("the CLI did not finish compacting within {DEADLINE:?}; it is asked to stop");
        self.give_up(session, round, |id| Outcome::not(TIMED_OUT).answer(id), cx);
    }

    /// Coda stops waiting for the compaction `round` of `session` (its deadline, or its withdrawal): Coda is
    /// answered with `answer`, the CLI is asked to stop, and the held prompts wait for the CLI's end or
    /// [`GRACE`].
    fn give_up(&mut self, session: String, round: u64, answer: impl FnOnce(&Id) -> Frame, cx: &mut Cx) {
        let Some(mark) = cx.session_mut(&session).and_then(|s| s.compaction_mut()).filter(|c| c.round == round) else {
            return;
        };
        if mark.overdue {
            return;
        }
        mark.overdue = true;
        let coda = mark.coda.take();
        // Still open (the engine answers it with an error when the agent is gone).
        if let Some(id) = coda.filter(|id| cx.request_of(id).is_some()) {
            cx.to_client(answer(&id));
        }
        cx.cancel(&Tick::<B::Timer>::Deadline(session.clone(), round));
        cx.after(GRACE, Tick::<B::Timer>::Grace(session.clone(), round));
        self.with_backend(cx, |b, ctl| b.stop(&session, round, ctl));
    }

    /// Coda's `$/cancel_request`: a prompt held behind a compaction is answered cancelled and never sent; Coda's
    /// compaction request is answered cancelled and the CLI asked to stop, as at the deadline. The withdrawal
    /// goes on down, where the stack withdraws what the backend asked the CLI for it.
    fn withdrawn(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(id) = cancel::target(&frame) else { return cx.to_agent(frame) };
        let Some(session) = cx.request_of(&id).and_then(|r| r.session()).map(str::to_owned) else {
            return cx.to_agent(frame);
        };
        if cx.session_mut(&session).and_then(|s| s.take_held_id(&id)).is_some() {
            tracing::debug!("Coda withdrew a prompt that waited behind a compaction; it is not sent");
            return cx.to_client(cancel::cancelled(&id));
        }
        let mark = cx.session(&session).and_then(Session::compaction).filter(|c| c.coda.as_ref() == Some(&id));
        if let Some(round) = mark.map(|m| m.round) {
            tracing::info!("Coda withdrew its compaction request; the CLI is asked to stop compacting");
            self.give_up(session, round, cancel::cancelled, cx);
        }
        cx.to_agent(frame)
    }

    /// Coda's `session/close` of `session` on its way to the CLI: the prompts held behind its compaction are
    /// stopped (answered `cancelled`, as a `session/cancel` stops them), and Coda's compaction request is
    /// answered: the CLI ends its work in a session it closes.
    fn closing(&mut self, session: &str, cx: &mut Cx) {
        let Some(s) = cx.session_mut(session) else { return };
        let held = s.take_held();
        let coda = s.compaction_mut().and_then(|m| m.coda.take());
        if let Some(id) = coda {
            cx.to_client(Outcome::not(CLOSED).answer(&id));
        }
        for prompt in held {
            if let Some(id) = prompt.id() {
                cx.to_client(frame::result_response(id, json!({"stopReason": "cancelled"})));
            }
        }
    }

    fn grace(&mut self, session: String, round: u64, cx: &mut Cx) {
        let overdue = cx.session(&session).and_then(Session::compaction).is_some_and(|c| c.round == round);
        if !overdue {
            return;
        }
        tracing::warn!(
            "the CLI never ended its compaction after it was asked to stop; the prompts held for it end unsent"
        );
        self.release(&session, round, cx, |held, cx| {
            if let Some(id) = held.id().filter(|id| cx.request_of(id).is_some()) {
                cx.to_client(not_sent(id));
            }
        });
    }

    /// Coda's `session/cancel` of a compacting session: its held prompts end `cancelled`; the cancel stays here.
    fn cancel(&mut self, session: &str, cx: &mut Cx) {
        let held = cx.session_mut(session).map(Session::take_held).unwrap_or_default();
        for prompt in held {
            if let Some(id) = prompt.id() {
                cx.to_client(frame::result_response(id, json!({"stopReason": "cancelled"})));
            }
        }
        tracing::debug!("a session/cancel while the session compacts: the compaction is no turn and goes on");
    }

    fn initialized(frame: Frame, cx: &mut Cx) {
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

/// The session a client frame is about (a request's, as the request table has it), when it compacts now.
fn compacting(frame: &Frame, cx: &Cx) -> Option<String> {
    let session = match frame.kind() {
        Kind::Request { id, .. } => cx.request_of(id).and_then(|r| r.session()),
        Kind::Notification { .. } => frame.value().pointer("/params/sessionId").and_then(Value::as_str),
        _ => None,
    }?;
    cx.session(session)?.compaction().is_some().then(|| session.to_owned())
}

impl<B: Compactor> Machine for Compaction<B> {
    type Backend = B;
    type Report = (String, u64, Outcome);
    type BackendTimer = B::Timer;

    fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    fn apply(&mut self, ended: Vec<(String, u64, Outcome)>, cx: &mut Cx) {
        for (session, round, outcome) in ended {
            self.end(&session, round, outcome, cx);
        }
    }

    fn backend_timer(timer: B::Timer) -> Tick<B::Timer> {
        Tick::Backend(timer)
    }
}

impl<B: Compactor> Layer for Compaction<B> {
    type Timer = Tick<B::Timer>;
    type Event = B::Event;
    type Reply = B::Reply;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Request { id, method } if method == METHOD => {
                let id = id.clone();
                self.request(id, frame, cx)
            }
            Kind::Request { method, .. } if method == "session/prompt" => {
                if let Some(session) = compacting(&frame, cx) {
                    tracing::debug!("a session/prompt waits for the session's compaction to end");
                    if let Some(s) = cx.session_mut(&session) {
                        return s.hold(frame);
                    }
                }
                self.backend.client_request(&frame, cx);
                cx.to_agent(frame)
            }
            Kind::Notification { method } if method == "session/cancel" => match compacting(&frame, cx) {
                Some(session) => self.cancel(&session, cx),
                None => cx.to_agent(frame),
            },
            Kind::Notification { method } if method == cancel::METHOD => self.withdrawn(frame, cx),
            Kind::Request { method, .. } if method == "session/close" => {
                if let Some(session) = compacting(&frame, cx) {
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
        if matches!(frame.kind(), Kind::Response { .. }) && cx.answer_to(&frame).is_some_and(|r| r.is("initialize")) {
            return Self::initialized(frame, cx);
        }
        cx.to_client(frame)
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Response { .. }) && self.backend.ignores(frame)
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
            if let Some(round) = cx.session(session).and_then(Session::compaction).map(|c| c.round) {
                // Whatever still waits is over with the session.
                self.closing(session, cx);
                self.release(session, round, cx, |_, _| {});
            }
            self.with_backend(cx, |b, ctl| b.session_closed(session, ctl));
        }
    }

    fn kept(&self) -> usize {
        self.backend.kept()
    }

    fn on_timer(&mut self, tick: Tick<B::Timer>, cx: &mut Cx) {
        match tick {
            Tick::Deadline(session, round) => self.deadline(session, round, cx),
            Tick::Grace(session, round) => self.grace(session, round, cx),
            Tick::Backend(t) => self.with_backend(cx, |b, ctl| b.on_timer(t, ctl)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(o: Outcome) -> Value {
        o.answer(&Id::from_json("7")).value().clone()
    }

    #[test]
    fn answers_carry_exactly_the_protocols_fields() {
        let v = answer(Outcome::Compacted { before: Some(120_000), after: Some(9_000) });
        assert_eq!(v, json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":120000,"after":9000}}));
        let v = answer(Outcome::Compacted { before: None, after: None });
        assert_eq!(v["result"], json!({"compacted":true}));
        let v = answer(Outcome::not(TURN_RUNNING));
        assert_eq!(v["result"], json!({"compacted":false,"reason":TURN_RUNNING}));
    }

    #[test]
    fn the_declaration_sits_under_agent_capabilities_meta_coda_and_keeps_what_was_there() {
        let mut r = json!({"agentCapabilities":{"loadSession":true,"_meta":{"coda":{"wait":{}}, "x":1}}});
        declare(r.as_object_mut().unwrap());
        assert_eq!(
            r,
            json!({"agentCapabilities":{"loadSession":true,"_meta":{"coda":{"wait":{},"compact":{}},"x":1}}})
        );
        let mut r = json!({"agentCapabilities":7});
        declare(r.as_object_mut().unwrap());
        assert_eq!(r, json!({"agentCapabilities":{"_meta":{"coda":{"compact":{}}}}}));
    }

    #[test]
    fn a_request_without_a_session_gets_invalid_params() {
        let id = Id::from_json("\"c\"");
        assert_eq!(session_of(&json!({"params":{"sessionId":"s1"}}), &id).ok().as_deref(), Some("s1"));
        for bad in
            [json!({}), json!({"params":[]}), json!({"params":{"sessionId":1e3}}), json!({"params":{"sessionId":""}})]
        {
            let err = session_of(&bad, &id).expect_err("refused").value().clone();
            assert_eq!(err["error"]["code"], -32602);
            assert_eq!(err["id"], "c");
        }
    }

    /// A CLI that compacts on `_test/compact` and answers `{compacted: bool}` or an error.
    #[derive(Default)]
    struct Scripted {
        stopped: Vec<String>,
        finished: Vec<(String, u64)>,
    }

    impl Compactor for Scripted {
        type Event = std::convert::Infallible;
        type Reply = (String, u64);
        type Timer = std::convert::Infallible;
        fn start(&mut self, session: &str, round: u64, ctl: &mut Ctl<Self>) {
            ctl.request("_test/compact", json!({"sessionId": session}), (session.to_owned(), round));
        }
        fn stop(&mut self, session: &str, _: u64, ctl: &mut Ctl<Self>) {
            self.stopped.push(session.to_owned());
            ctl.cx.to_agent(frame::notification("session/cancel", json!({ "sessionId": session })));
        }
        fn finished(&mut self, session: &str, round: u64, _: &mut Ctl<Self>) {
            self.finished.push((session.to_owned(), round));
        }
        fn on_reply(&mut self, (session, round): (String, u64), reply: Frame, ctl: &mut Ctl<Self>) {
            let outcome = match reply.value().pointer("/result/compacted") {
                Some(Value::Bool(true)) => Outcome::Compacted { before: Some(10), after: Some(2) },
                _ => Outcome::not("the CLI could not"),
            };
            ctl.ended(&session, round, outcome);
        }
    }

    use crate::layer::testing::Harness;

    const S: &str = "s1";

    fn started() -> Harness {
        let mut h = Harness::of(Compaction::new(Scripted::default()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"agentCapabilities":{"loadSession":true}}}));
        assert_eq!(h.to_client()[0]["result"]["agentCapabilities"]["_meta"]["coda"], json!({"compact":{}}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.take();
        h
    }

    fn compact(h: &mut Harness, id: u64) -> Vec<Value> {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":METHOD,"params":{"sessionId":S}}));
        h.to_agent()
    }

    fn prompt(id: u64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":S,"prompt":[{"type":"text","text":"hi"}]}})
    }

    fn cancel() -> Value {
        json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":S}})
    }

    #[test]
    fn held_prompts_go_on_after_the_answer_in_their_order() {
        let mut h = started();
        let asked = compact(&mut h, 7);
        assert_eq!(asked[0]["method"], "_test/compact");
        h.from_client(prompt(8));
        h.from_client(prompt(9));
        assert!(h.to_agent().is_empty(), "held");
        assert_eq!(h.stack().sessions().get(S).map(|s| s.held().len()), Some(2));
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{"compacted":true}}));
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":7,"result":{"compacted":true,"before":10,"after":2}})]);
        assert_eq!(h.to_agent(), [prompt(8), prompt(9)]);
        assert_eq!(h.next_wake(), None);
        assert_eq!(h.layer::<Compaction<Scripted>>(0).backend().finished, [(S.to_owned(), 1)]);
    }

    #[test]
    fn refusals_come_at_once_and_ask_the_cli_nothing() {
        let mut h = started();
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":METHOD,"params":{"sessionId":"other"}}));
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":NOT_RUNNING}));
        h.from_client(prompt(3));
        h.to_agent();
        assert!(compact(&mut h, 4).is_empty());
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":TURN_RUNNING}));
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}));
        h.to_client();
        assert_eq!(compact(&mut h, 5).len(), 1);
        assert!(compact(&mut h, 6).is_empty());
        assert_eq!(h.to_client()[0]["result"], json!({"compacted":false,"reason":ALREADY}));
        for params in [json!({}), json!({"sessionId":1e300}), json!([1]), json!({"sessionId":""})] {
            h.from_client(json!({"jsonrpc":"2.0","id":9,"method":METHOD,"params":params}));
            assert_eq!(h.to_client()[0]["error"]["code"], -32602);
        }
        assert!(h.to_agent().is_empty());
    }

    #[test]
    fn a_cancel_ends_the_held_prompts_and_not_the_compaction() {
        let mut h = started();
        let asked = compact(&mut h, 7);
        h.from_client(prompt(8));
        h.from_client(cancel());
        assert!(h.to_agent().is_empty(), "neither the prompt nor the cancel reaches the CLI");
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":8,"result":{"stopReason":"cancelled"}})]);
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{"compacted":true}}));
        assert_eq!(h.to_client()[0]["result"]["compacted"], true, "the compaction went on");
        assert!(h.to_agent().is_empty(), "the cancelled prompt never goes");
        // Between compactions a cancel is the CLI's.
        h.from_client(cancel());
        assert_eq!(h.to_agent(), [cancel()]);
    }

    #[test]
    fn at_the_deadline_held_prompts_wait_for_the_clis_end_and_past_the_grace_end_unsent() {
        let mut h = started();
        let asked = compact(&mut h, 7);
        h.from_client(prompt(8));
        h.advance(DEADLINE);
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":7,"result":{"compacted":false,"reason":TIMED_OUT}})]);
        assert_eq!(h.to_agent(), [cancel()], "the CLI is asked to stop; the prompt still waits");
        // The CLI's end lets the prompt go; Coda is not answered twice.
        h.from_agent(json!({"jsonrpc":"2.0","id":asked[0]["id"],"result":{"compacted":false}}));
        assert!(h.to_client().is_empty());
        assert_eq!(h.to_agent(), [prompt(8)]);
        h.from_agent(json!({"jsonrpc":"2.0","id":8,"result":{"stopReason":"end_turn"}}));
        h.to_client();
        // A CLI that never ends: the held prompt is answered unsent past the grace.
        assert_eq!(compact(&mut h, 9).len(), 1);
        h.from_client(prompt(10));
        h.advance(DEADLINE);
        h.take();
        h.advance(GRACE - Duration::from_millis(1));
        assert!(h.take() == Default::default(), "nothing before the grace");
        h.advance(Duration::from_millis(1));
        let out = h.to_client();
        assert_eq!(out[0]["id"], 10);
        assert_eq!(out[0]["error"], json!({"code":-32603,"message":NOT_SENT}), "no failure kind: no upstream failed");
        assert!(h.to_agent().is_empty(), "never sent");
        assert!(h.stack().sessions().get(S).is_some_and(|s| s.compaction().is_none() && s.held().is_empty()));
        // The late end of that compaction changes nothing.
        h.from_client(prompt(11));
        assert_eq!(h.to_agent(), [prompt(11)]);
    }
}

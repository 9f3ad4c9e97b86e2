//! Failure kinds (section 执行失败), once for every binary: the answer's shape, the one-minute rule, and the
//! holds and deadlines around a failed turn. An adapter only says where its CLI's explicit signals are
//! ([`Signals`]); this layer ([`FailureKinds`]) does the rest.
//!
//! - **The answer**: a failed `session/prompt` is answered with a JSON-RPC error whose
//!   `error.data._meta.coda.failure` names the kind ([`Kind`]), the readable reason in `error.message`; a login
//!   problem is `-32000` ([`Verdict::Auth`]), anything without an explicit upstream reason a plain `-32603`.
//!   The kind comes only from an explicit upstream reason the CLI passes on (never from a status code alone,
//!   except 503, which by definition says the server is temporarily unavailable; never for a login problem).
//! - **The one-minute rule**: a CLI that keeps retrying must not hold Coda's turn silently for over a minute
//!   ([`RETRY_PATIENCE`]). Counted from the first retry of a turn that brought no output since: when a retry's
//!   planned wait would take the retries past it (on the CLI's own clock where it stamps its reports), or when
//!   the minute has passed on the engine's clock (a CLI that names no wait), the layer stops the native run
//!   (`session/cancel`) and answers with the last retry's reason, its kind, and `retryAfterMs` (the wait the CLI
//!   had planned, for `service_unavailable`, where the CLI named one).
//! - **Deadlines**: an answer that waits for the CLI's own record of its turn (Kimi's wire, OpenCode's server)
//!   waits at most [`ANSWER_HOLD`]; a run the layer stopped that the CLI then never answers is answered by the
//!   layer after [`STOP_GRACE`] (the CLI's late answer is dropped).
//! - **Order**: while an answer waits for its record, every later frame of the CLI waits behind it (at most
//!   [`HELD_MAX`], and no longer than the answer's own hold), so Coda sees the CLI's frames in the order the CLI
//!   wrote them: what the CLI wrote after its answer is never inside the turn. Those frames are read (signals,
//!   progress) when they go on, in that order. The shim's own decisions (a stopped run's answer after
//!   [`STOP_GRACE`]) are not held: they go out when they are made.
//!
//! Every prompt is its own turn (keyed by its request id, in the order Coda sent them): a second prompt in a
//! session never takes the first one's record. A session's signals belong to its oldest turn that is still
//! running.

use crate::HashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value, json};

use crate::frame::{self, Frame, Id, Kind as FrameKind};
use crate::layer::{Cx, Layer};

/// How long a CLI's own retries may keep a turn open before the shim stops the run and reports the failure
/// (执行失败 / 服务暂不可用: a wait of over a minute is not waited out silently).
pub const RETRY_PATIENCE: Duration = Duration::from_secs(60);

/// Longest an answer waits for the CLI's own record of its turn (a failed turn is answered in 0.1 s, before the
/// record is read); then it goes on as the CLI gave it, with a warning.
pub const ANSWER_HOLD: Duration = Duration::from_secs(2);

/// How long the CLI has to answer a run the shim stopped before the shim answers it itself.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Longest reason kept in an answer (upstream messages may quote whole response bodies).
pub const REASON_MAX: usize = 2000;

/// The most frames of the CLI that wait behind a held answer: past it the answer goes on without its record
/// (a CLI that floods while the shim waits).
pub const HELD_MAX: usize = 10_000;

/// How many answered prompts are remembered, to drop the CLI's second or late answers to them.
const ANSWERED_MAX: usize = 64;

/// [`RETRY_PATIENCE`], or `CODA_SHIM_RETRY_PATIENCE_MS` where set (replays of a stopped run use a shorter one,
/// so they need not wait a real minute). Set-up only (an adapter's `mod.rs`): it reads the environment.
pub fn retry_patience() -> Duration {
    std::env::var("CODA_SHIM_RETRY_PATIENCE_MS")
        .ok()
        .and_then(|ms| ms.trim().parse().ok())
        .map_or(RETRY_PATIENCE, Duration::from_millis)
}

/// Whether the input of a failed turn reached the native session (`input` of `service_unavailable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The input entered the native session and the native run has ended.
    Accepted,
    /// Explicitly refused before the native session took the input.
    NotAccepted,
}

/// A failure kind Coda knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `quota_exhausted`: the upstream said the quota or balance is used up.
    Quota,
    /// `service_unavailable`: the upstream said it cannot serve for now. `input` only where the evidence
    /// says; `retry_after_ms` only a wait the upstream asked for or the CLI really scheduled.
    Service { input: Option<Input>, retry_after_ms: Option<u64> },
}

impl Kind {
    /// `service_unavailable` of a run that ended after the CLI took the input (every CLI's case).
    pub const SERVICE: Kind = Kind::Service { input: Some(Input::Accepted), retry_after_ms: None };

    /// The `_meta.coda.failure` object.
    pub fn to_value(&self) -> Value {
        match self {
            Kind::Quota => json!({"kind": "quota_exhausted"}),
            Kind::Service { input, retry_after_ms } => {
                let mut v = json!({"kind": "service_unavailable"});
                match input {
                    Some(Input::Accepted) => v["input"] = json!("accepted"),
                    Some(Input::NotAccepted) => v["input"] = json!("not_accepted"),
                    None => {}
                }
                if let Some(ms) = retry_after_ms {
                    v["retryAfterMs"] = json!(ms);
                }
                v
            }
        }
    }
}

/// What an explicit signal of the CLI says a failure is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Kind(Kind),
    /// A login problem: ACP's `auth_required` (-32000), never a kind.
    Auth,
    /// No explicit reason: a plain error, which Coda does not retry.
    Plain,
}

/// A failed turn: what it is, the readable reason, and the CLI's own record of it (kept in `error.data`).
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub verdict: Verdict,
    pub message: String,
    pub data: Option<Value>,
}

impl Failure {
    /// The answer to prompt `id`: the reason cut to [`REASON_MAX`].
    pub fn answer(&self, id: &Id) -> Frame {
        let message = clip(&self.message, REASON_MAX);
        match &self.verdict {
            Verdict::Kind(kind) => answer(id, &message, Some(kind), self.data.clone()),
            Verdict::Auth => frame::error_response(id, -32000, &message, self.data.clone()),
            Verdict::Plain => answer(id, &message, None, self.data.clone()),
        }
    }
}

/// What an upstream's own reason names, as a CLI passes it on: its error code (`error.code`, else `error.type`,
/// of an OpenAI-shaped error body, which OpenAI, Moonshot and xAI write; `error.type` of Anthropic's) first, else
/// its HTTP status 503 (RFC 9110: the server is temporarily unable to handle the request, overloaded or in
/// maintenance). No other status names a kind: a 429 may be a quota or a rate limit, a 403 a login problem
/// (额度不足: never from a status alone). A rejected key is a login problem, never a kind.
///
/// | upstream code | status | what it is |
/// | --- | --- | --- |
/// | `insufficient_quota`, `exceeded_current_quota_error`, `billing_error` | any | `quota_exhausted` |
/// | `rate_limit_exceeded`, `rate_limit_error`, `server_error`, `server_is_overloaded`, `overloaded_error` | any | `service_unavailable` |
/// | `invalid_api_key`, `authentication_error` | any | a login problem (-32000) |
/// | another, or none | 503 | `service_unavailable` |
/// | another, or none | another, or none | a plain error |
pub fn upstream(code: Option<&str>, status: Option<u64>) -> Verdict {
    match code {
        Some("insufficient_quota" | "exceeded_current_quota_error" | "billing_error") => Verdict::Kind(Kind::Quota),
        Some(
            "rate_limit_exceeded" | "rate_limit_error" | "server_error" | "server_is_overloaded" | "overloaded_error",
        ) => Verdict::Kind(Kind::SERVICE),
        Some("invalid_api_key" | "authentication_error") => Verdict::Auth,
        _ if status == Some(503) => Verdict::Kind(Kind::SERVICE),
        _ => Verdict::Plain,
    }
}

/// The error answer for prompt `id`: code -32603, `message`, and `data` (an object is kept; anything else
/// is put under `data.upstream`) with `_meta.coda.failure` when `kind` is known.
pub fn answer(id: &Id, message: &str, kind: Option<&Kind>, data: Option<Value>) -> Frame {
    let Some(kind) = kind else {
        return frame::error_response(id, -32603, message, data);
    };
    let mut map = match data {
        Some(Value::Object(map)) => map,
        Some(other) => Map::from_iter([("upstream".to_owned(), other)]),
        None => Map::new(),
    };
    let meta = map.entry("_meta").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta["coda"] = json!({ "failure": kind.to_value() });
    frame::error_response(id, -32603, message, Some(Value::Object(map)))
}

/// `text` cut to at most `max` bytes at a character boundary, with `…` where it was cut (upstream messages may
/// quote whole response bodies).
pub fn clip(text: &str, max: usize) -> String {
    crate::text::cut(text, max, crate::text::Unit::Bytes).into_owned()
}

/// `<t:2026-10-24T18:10:00.000Z>`: a time inside text meant for people (文字里的时刻).
pub fn time_mark(at: jiff::Timestamp) -> String {
    format!("<t:{}>", at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"))
}

/// One retry the CLI reported for the running turn of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    /// The upstream's reason, as the CLI passed it on.
    pub reason: String,
    /// What the reason explicitly names ([`Verdict::Plain`] when nothing).
    pub verdict: Verdict,
    /// When the CLI reported it, on its own clock (ms since the epoch), if it stamps its reports.
    pub at_ms: Option<u64>,
    /// The wait the CLI scheduled before its next attempt, if it says.
    pub wait_ms: Option<u64>,
    /// Which attempt failed, of how many the CLI will make, where it says.
    pub attempt: Option<u64>,
    pub attempts: Option<u64>,
    /// What goes in `error.data` when the shim stops the run.
    pub data: Option<Value>,
}

/// What a CLI says about the turns the layer watches (handed out by [`Signals`]).
#[derive(Debug)]
pub enum Signal<R> {
    /// The CLI retries a failed model request of the session's running turn.
    Retrying { session: String, retry: Retry },
    /// A turn of the CLI's, numbered `turn` by it, began for the session's oldest prompt that has none (Kimi's
    /// `turn.prompt` of a client turn): its record names it.
    Began { session: String, turn: i64 },
    /// The CLI's own record of how a turn of the session ended (Kimi's wire, OpenCode's server), which
    /// [`Signals::failure`] reads with the answer: of the CLI's turn `turn`, or (`None`, a CLI that numbers
    /// none) of the session's oldest prompt without a record.
    Ended { session: String, turn: Option<i64>, record: R },
}

/// Where one CLI's failure signals are: all an adapter writes for failure kinds.
pub trait Signals: Send + 'static {
    /// What the adapter's set-up hands in (a file watch's records, a server's events).
    type Event: Send + 'static;
    /// The CLI's record of how a turn ended ([`Signal::Ended`]).
    type Record: Send + 'static;

    /// Whether a frame from the CLI that is no answer may hold a signal (cheap: its envelope).
    fn wants(&self, _frame: &Frame) -> bool {
        false
    }

    /// Whether [`Signals::wants`] answers a streamed chunk from no more than the adapter's state, the chunk's
    /// session and its kind (see [`Layer::chunks_pass_by_session`]); one that looks into a chunk's text says `false`.
    fn chunks_by_session(&self) -> bool {
        true
    }

    /// The signals in such a frame.
    fn from_agent(&mut self, _frame: &Frame, _out: &mut Vec<Signal<Self::Record>>) {}

    /// The signals in an event of the set-up's.
    fn on_event(&mut self, _event: Self::Event, _out: &mut Vec<Signal<Self::Record>>) {}

    /// Whether a prompt runs a turn in the CLI (Kimi runs its builtin slash commands without one): only those
    /// take a record.
    fn makes_turn(&self, _prompt: &Frame) -> bool {
        true
    }

    /// Whether `answer`, to a prompt of `session` that has no record yet, waits for one (at most
    /// [`ANSWER_HOLD`]).
    fn awaits_record(&self, _session: &str, _answer: &Frame) -> bool {
        false
    }

    /// The failure the CLI's `answer` ends its turn with, given the CLI's record of that turn (None: the
    /// answer goes on as it is). `wall` is when the answer came.
    fn failure(&self, answer: &Frame, record: Option<Self::Record>, wall: SystemTime) -> Option<Failure>;

    /// Coda closed `session`: what the backend keeps of it goes.
    fn closed(&mut self, _session: &str) {}

    /// How many entries the backend keeps for sessions ([`Layer::kept`]).
    fn kept(&self) -> usize {
        0
    }

    /// How the CLI's retries stood when the shim stopped them, for the answer's message ("Grok was retrying
    /// (attempt 2 of 15) without an answer"); `waited` is how long they would have kept the turn open.
    fn retrying(&self, retry: &Retry, waited: Duration) -> String;
}

/// The layer's wake-ups, each naming the turn (its key) it is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Check {
    /// The turn's retries have had their minute, unless it made progress since (`generation`).
    Patience { turn: u64, generation: u64 },
    /// The turn's held answer has waited long enough for the CLI's record.
    Hold(u64),
    /// The CLI has had long enough to answer the run the shim stopped.
    Unanswered(u64),
}

struct Retrying {
    since: Instant,
    since_ms: Option<u64>,
    last: Retry,
}

struct Turn<R> {
    key: u64,
    id: Id,
    session: String,
    makes_turn: bool,
    /// The CLI's number for the turn it runs for this prompt ([`Signal::Began`]).
    cli_turn: Option<i64>,
    retrying: Option<Retrying>,
    /// Moves on whenever the turn makes progress: a wake-up of an older generation finds nothing to do.
    generation: u64,
    stopped: Option<Failure>,
    /// The CLI's record of the turn ([`Signal::Ended`]), once it came.
    record: Option<R>,
    recorded: bool,
    /// The CLI's answer, waiting for the record.
    held: Option<Frame>,
}

/// Updates that show an attempt of the turn went through.
const OUTPUT: &[&str] = &["agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update", "plan"];

/// Failure kinds for one CLI (see the module's docs): sits next to the CLI, below any layer that holds
/// prompts, so it sees what the CLI was really sent and answers first.
pub struct FailureKinds<S: Signals> {
    cli: S,
    patience: Duration,
    /// The prompts the CLI was sent and has not been answered for, oldest first. Bounded by the stack's request
    /// table: a turn whose prompt is no longer open there (and whose answer is not held here) is forgotten.
    turns: Vec<Turn<S::Record>>,
    /// Per session: records still to come for answers that went out without theirs (the hold ran out), which
    /// belong to no later turn. At most one per such answer; a session's entry goes with its last, or with the
    /// session (the engine's table).
    skip: HashMap<String, usize>,
    /// Prompts answered to Coda, newest last ([`ANSWERED_MAX`] at most): a CLI's second answer to one (or its late
    /// answer to a run the shim stopped and answered) is dropped. A new request with the same id takes it out.
    answered: VecDeque<Id>,
    /// The CLI's frames that came while an answer was held (or behind such frames), in order: they go on, and
    /// are read, once it is released ([`HELD_MAX`] at most).
    behind: VecDeque<Frame>,
    /// Keys and generations handed out so far (never reused).
    counter: u64,
}

impl<S: Signals> FailureKinds<S> {
    /// The layer for the CLI whose signals `cli` reads, stopping retries after `patience`
    /// ([`retry_patience`]).
    pub fn new(cli: S, patience: Duration) -> FailureKinds<S> {
        FailureKinds {
            cli,
            patience,
            turns: Vec::new(),
            skip: HashMap::default(),
            answered: VecDeque::new(),
            behind: VecDeque::new(),
            counter: 0,
        }
    }

    /// The CLI's signals (for tests).
    pub fn signals(&self) -> &S {
        &self.cli
    }

    /// How many turns, sessions owed a record, and frames held the layer keeps (for tests: its bounds).
    pub fn kept(&self) -> (usize, usize, usize) {
        (self.turns.len(), self.skip.len(), self.behind.len())
    }

    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// The session's running turn: its oldest one whose answer has not come.
    fn running(&mut self, session: &str) -> Option<&mut Turn<S::Record>> {
        self.turns.iter_mut().find(|t| t.session == session && t.held.is_none() && t.stopped.is_none())
    }

    /// Forgets turns whose prompt is no longer open (answered by another layer, or the client went away).
    fn prune(&mut self, cx: &Cx) {
        self.turns.retain(|t| t.held.is_some() || cx.request_of(&t.id).is_some());
        self.skip.retain(|s, _| cx.session(s).is_some());
    }

    fn handle(&mut self, signals: Vec<Signal<S::Record>>, cx: &mut Cx) {
        for signal in signals {
            match signal {
                Signal::Retrying { session, retry } => self.retry(&session, retry, cx),
                Signal::Began { session, turn } => {
                    // A turn whose prompt was answered before it began (the hold ran out) is no later prompt's.
                    if self.skipped(&session) {
                        continue;
                    }
                    let unbegun =
                        self.turns.iter_mut().find(|t| t.session == session && t.makes_turn && t.cli_turn.is_none());
                    if let Some(t) = unbegun {
                        t.cli_turn = Some(turn);
                    }
                }
                Signal::Ended { session, turn, record } => self.ended(&session, turn, record, cx),
            }
        }
    }

    fn retry(&mut self, session: &str, retry: Retry, cx: &mut Cx) {
        let (now, patience, generation) = (cx.now(), self.patience, self.next());
        let Some(turn) = self.running(session) else { return };
        if turn.retrying.is_none() {
            // The first retry since the turn started or last made progress: its minute starts now.
            turn.generation = generation;
            cx.after(patience, Check::Patience { turn: turn.key, generation });
            turn.retrying = Some(Retrying { since: now, since_ms: retry.at_ms, last: retry.clone() });
        }
        let retrying = turn.retrying.as_mut().expect("set above");
        // How long the retries would keep the turn open once the planned wait is over: on the CLI's clock
        // where it stamps them, else on the engine's.
        let planned = retry.wait_ms.map(|wait| {
            let so_far = match (retry.at_ms, retrying.since_ms) {
                (Some(at), Some(since)) => Duration::from_millis(at.saturating_sub(since)),
                _ => now.saturating_duration_since(retrying.since),
            };
            so_far.saturating_add(Duration::from_millis(wait))
        });
        retrying.last = retry;
        if let Some(planned) = planned.filter(|p| *p > patience) {
            let key = turn.key;
            self.stop(key, planned, cx);
        }
    }

    /// Stops the run of turn `key`, whose retries would keep it open for `waited`.
    fn stop(&mut self, key: u64, waited: Duration, cx: &mut Cx) {
        let Some(turn) = self.turns.iter_mut().find(|t| t.key == key) else { return };
        let Some(Retrying { last, .. }) = turn.retrying.take() else { return };
        let verdict = match &last.verdict {
            // The wait the CLI had planned is the one Coda is not to retry before.
            Verdict::Kind(Kind::Service { input, .. }) => {
                Verdict::Kind(Kind::Service { input: *input, retry_after_ms: last.wait_ms })
            }
            other => other.clone(),
        };
        // Both parts cut so that the whole stays within [`REASON_MAX`] and its last line is said.
        let message = format!(
            "{}\n{}: stopped after over a minute of retries.",
            clip(&last.reason, REASON_MAX / 2),
            clip(&self.cli.retrying(&last, waited), REASON_MAX / 4)
        );
        turn.stopped = Some(Failure { verdict, message, data: last.data });
        cx.cancel(&Check::Patience { turn: key, generation: turn.generation });
        cx.after(STOP_GRACE, Check::Unanswered(key));
        tracing::info!(
            "stopping the CLI's turn in session {}: its retries would outlast {:?}",
            turn.session,
            self.patience
        );
        cx.to_agent(frame::notification("session/cancel", json!({ "sessionId": turn.session })));
    }

    /// The CLI's record of how a turn of the session ended: kept for its answer, or released with it. A
    /// numbered turn's record is that turn's (none: its answer went out without it); an unnumbered one is the
    /// oldest prompt's without a record, unless an answer that went out without its record is owed one.
    fn ended(&mut self, session: &str, number: Option<i64>, record: S::Record, cx: &mut Cx) {
        let turn = match number {
            Some(n) => self.turns.iter_mut().find(|t| t.session == session && t.cli_turn == Some(n)),
            None => {
                if self.skipped(session) {
                    return;
                }
                self.turns.iter_mut().find(|t| t.session == session && t.makes_turn && !t.recorded)
            }
        };
        let Some(turn) = turn.filter(|t| !t.recorded) else {
            return tracing::debug!("the CLI's record of a turn whose prompt was answered already; dropped");
        };
        turn.recorded = true;
        turn.record = Some(record);
        if turn.held.is_some() {
            let key = turn.key;
            cx.cancel(&Check::Hold(key));
            self.release(key, cx);
        }
    }

    /// Answers turn `key` with the CLI's held answer and what is known of the turn.
    fn release(&mut self, key: u64, cx: &mut Cx) {
        let Some(at) = self.turns.iter().position(|t| t.key == key) else { return };
        let mut turn = self.turns.remove(at);
        self.leave(&turn, true);
        if let Some(held) = turn.held.take() {
            let out = self.answer(&mut turn, held, cx);
            self.answered_now(&turn.id);
            cx.to_client(out);
        }
        self.go_on(cx);
    }

    /// Whether a frame of the CLI must wait now: an answer is held, or frames wait behind one.
    fn holding(&self) -> bool {
        !self.behind.is_empty() || self.turns.iter().any(|t| t.held.is_some())
    }

    /// Once no answer is held: the frames that waited behind it go on, in order, each read as it goes (one may
    /// be an answer that is held in turn: the rest wait behind that one).
    fn go_on(&mut self, cx: &mut Cx) {
        if self.turns.iter().any(|t| t.held.is_some()) {
            return;
        }
        for frame in std::mem::take(&mut self.behind) {
            Layer::from_agent(self, frame, cx);
        }
    }

    /// The oldest held answer goes on as it is (its record is given up on): the CLI flooded behind it, or its
    /// session is closed.
    fn give_up(&mut self, key: u64, cx: &mut Cx) {
        cx.cancel(&Check::Hold(key));
        self.release(key, cx);
    }

    /// What Coda gets for the CLI's answer to `turn`.
    fn answer(&self, turn: &mut Turn<S::Record>, reply: Frame, cx: &mut Cx) -> Frame {
        cx.cancel(&Check::Patience { turn: turn.key, generation: turn.generation });
        cx.cancel(&Check::Unanswered(turn.key));
        if let Some(stopped) = &turn.stopped {
            return stopped.answer(&turn.id);
        }
        match self.cli.failure(&reply, turn.record.take(), cx.wall()) {
            Some(failure) => failure.answer(&turn.id),
            None => reply,
        }
    }

    fn from_cli_answer(&mut self, id: &Id, frame: Frame, cx: &mut Cx) {
        if self.answered.contains(id) {
            tracing::warn!("the CLI answered a prompt that was answered already; dropped");
            return;
        }
        let Some(at) = self.turns.iter().position(|t| &t.id == id && t.held.is_none()) else {
            return cx.to_client(frame);
        };
        let turn = &self.turns[at];
        let awaited = turn.makes_turn && !turn.recorded && self.cli.awaits_record(&turn.session, &frame);
        if awaited && turn.stopped.is_none() {
            let key = turn.key;
            self.turns[at].held = Some(frame);
            return cx.after(ANSWER_HOLD, Check::Hold(key));
        }
        let mut turn = self.turns.remove(at);
        self.leave(&turn, awaited);
        let out = self.answer(&mut turn, frame, cx);
        self.answered_now(&turn.id);
        cx.to_client(out);
    }

    /// Remembers that Coda got its answer to prompt `id`.
    fn answered_now(&mut self, id: &Id) {
        if self.answered.len() == ANSWERED_MAX {
            self.answered.pop_front();
        }
        self.answered.push_back(id.clone());
    }

    /// Whether the next record of `session` (a [`Signal::Began`], or an unnumbered [`Signal::Ended`]) is one to
    /// skip; counts it.
    fn skipped(&mut self, session: &str) -> bool {
        let Some(n) = self.skip.get_mut(session) else { return false };
        *n -= 1;
        if *n == 0 {
            self.skip.remove(session);
        }
        true
    }

    /// `turn` is answered: a record of it still to come (`awaited`: its unnumbered end, or the beginning of a
    /// numbered one) is skipped when it comes, so that no later turn takes it.
    fn leave(&mut self, turn: &Turn<S::Record>, awaited: bool) {
        if !turn.recorded && awaited && turn.cli_turn.is_none() {
            *self.skip.entry(turn.session.clone()).or_default() += 1;
        }
    }

    /// An update of the CLI's: output of a session's turn ends its retries.
    fn progress(&mut self, frame: &Frame, cx: &mut Cx) {
        // The session from the frame check's pass: the update is not parsed.
        let Some(session) = frame.session() else { return };
        let next = self.counter + 1;
        let Some(turn) = self.turns.iter_mut().find(|t| t.session == *session && t.retrying.is_some()) else { return };
        turn.retrying = None;
        cx.cancel(&Check::Patience { turn: turn.key, generation: turn.generation });
        turn.generation = next;
        self.counter = next;
    }

    /// Whether `frame` is output of a turn while some turn retries (then it may end those retries). Asked of
    /// every frame: whether a turn retries (seldom) is asked first.
    fn reads_progress(&self, frame: &Frame) -> bool {
        self.turns.iter().any(|t| t.retrying.is_some()) && frame.session_update().is_some_and(|u| OUTPUT.contains(&u))
    }
}

impl<S: Signals> Layer for FailureKinds<S> {
    type Timer = Check;
    type Event = S::Event;
    type Reply = std::convert::Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if let FrameKind::Request { id, .. } = frame.kind() {
            // A request that reuses the id of an answered prompt is a new one, whatever its method: the CLI's
            // answer to it is its first.
            self.answered.retain(|a| a != id);
        }
        if let FrameKind::Request { id, method } = frame.kind()
            && method == "session/prompt"
        {
            // A prompt that names no session is the CLI's to refuse; its answer is still this turn's.
            let session = cx.request_of(id).and_then(|r| r.session()).unwrap_or_default().to_owned();
            self.prune(cx);
            let (key, generation) = (self.next(), self.next());
            let makes_turn = self.cli.makes_turn(&frame);
            self.turns.push(Turn {
                key,
                id: id.clone(),
                session,
                makes_turn,
                cli_turn: None,
                retrying: None,
                generation,
                stopped: None,
                record: None,
                recorded: false,
                held: None,
            });
        }
        cx.to_agent(frame);
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        if self.holding() {
            self.behind.push_back(frame);
            if self.behind.len() > HELD_MAX
                && let Some(key) = self.turns.iter().find(|t| t.held.is_some()).map(|t| t.key)
            {
                tracing::warn!("over {HELD_MAX} frames of the CLI waited behind a held answer: it goes on");
                self.give_up(key, cx);
            }
            return;
        }
        match frame.kind() {
            FrameKind::Response { id } => {
                let id = id.clone();
                self.from_cli_answer(&id, frame, cx);
            }
            _ => {
                if self.reads_progress(&frame) {
                    self.progress(&frame, cx);
                }
                if self.cli.wants(&frame) {
                    let mut out = Vec::new();
                    self.cli.from_agent(&frame, &mut out);
                    cx.to_client(frame);
                    return self.handle(out, cx);
                }
                cx.to_client(frame);
            }
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        if self.holding() {
            return false;
        }
        match frame.kind() {
            FrameKind::Response { id } => !self.answered.contains(id) && !self.turns.iter().any(|t| &t.id == id),
            _ => !(self.cli.wants(frame) || self.reads_progress(frame)),
        }
    }

    fn chunks_pass_by_session(&self) -> bool {
        self.cli.chunks_by_session()
    }

    fn on_event(&mut self, event: S::Event, cx: &mut Cx) {
        let mut out = Vec::new();
        self.cli.on_event(event, &mut out);
        self.handle(out, cx);
    }

    /// A closed session's turns end here: a held answer goes on as it is (its record is given up on), a run the
    /// shim stopped is answered with its failure now (the CLI's late answer is dropped), and the rest is
    /// forgotten (the CLI answers what it still runs of the session as it closes it).
    fn session_closed(&mut self, closed: &[String], cx: &mut Cx) {
        let of_closed = |t: &Turn<S::Record>| closed.contains(&t.session);
        while let Some(key) = self.turns.iter().find(|t| of_closed(t) && t.held.is_some()).map(|t| t.key) {
            self.give_up(key, cx);
        }
        for turn in std::mem::take(&mut self.turns) {
            if !of_closed(&turn) {
                self.turns.push(turn);
                continue;
            }
            cx.cancel(&Check::Patience { turn: turn.key, generation: turn.generation });
            cx.cancel(&Check::Unanswered(turn.key));
            if let Some(stopped) = &turn.stopped {
                self.answered_now(&turn.id);
                cx.to_client(stopped.answer(&turn.id));
            }
        }
        self.skip.retain(|s, _| !closed.contains(s));
        for session in closed {
            self.cli.closed(session);
        }
    }

    fn kept(&self) -> usize {
        self.turns.len() + self.skip.len() + self.behind.len() + self.cli.kept()
    }

    fn on_timer(&mut self, check: Check, cx: &mut Cx) {
        match check {
            Check::Patience { turn, generation } => {
                let Some(t) = self.turns.iter().find(|t| t.key == turn && t.generation == generation) else { return };
                let Some(since) = t.retrying.as_ref().map(|r| r.since) else { return };
                let waited = cx.now().saturating_duration_since(since);
                self.stop(turn, waited, cx);
            }
            Check::Hold(turn) => {
                let Some(t) = self.turns.iter().find(|t| t.key == turn && t.held.is_some()) else { return };
                tracing::warn!(
                    "the CLI answered a prompt of session {} but its record of that turn did not come within \
                     {ANSWER_HOLD:?}; answering as it is",
                    t.session
                );
                // The record, when it comes, is this answer's: no later turn takes it (`leave`).
                self.release(turn, cx);
            }
            Check::Unanswered(turn) => {
                let Some(at) = self.turns.iter().position(|t| t.key == turn && t.held.is_none()) else { return };
                let turn = self.turns.remove(at);
                let Some(stopped) = &turn.stopped else { return };
                tracing::warn!(
                    "the CLI did not answer the run of session {} the shim stopped within {STOP_GRACE:?}; answering \
                     it with the failure",
                    turn.session
                );
                let answer = stopped.answer(&turn.id);
                self.answered_now(&turn.id);
                cx.to_client(answer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(f: &Frame) -> Value {
        f.value().get("error").cloned().unwrap_or(Value::Null)
    }

    #[test]
    fn a_service_failure_carries_only_what_is_known() {
        let id = Id::from_json("7");
        let k = Kind::Service { input: Some(Input::Accepted), retry_after_ms: Some(90_000) };
        let e = error(&answer(&id, "busy", Some(&k), Some(json!({"agent": {"name": "X"}}))));
        assert_eq!(
            e,
            json!({"code": -32603, "message": "busy", "data": {"agent": {"name": "X"},
                "_meta": {"coda": {"failure": {"kind": "service_unavailable", "input": "accepted", "retryAfterMs": 90000}}}}})
        );
        let k = Kind::Service { input: None, retry_after_ms: None };
        let e = error(&answer(&id, "busy", Some(&k), Some(json!("text"))));
        assert_eq!(e["data"]["upstream"], "text");
        assert_eq!(e["data"]["_meta"]["coda"]["failure"], json!({"kind": "service_unavailable"}));
    }

    #[test]
    fn without_a_kind_it_is_a_plain_error_and_auth_is_auth() {
        let e = error(&answer(&Id::from_json("1"), "no", None, Some(json!({"_meta": 3}))));
        assert_eq!(e, json!({"code": -32603, "message": "no", "data": {"_meta": 3}}));
        let e = error(&answer(&Id::from_json("1"), "quota", Some(&Kind::Quota), Some(json!({"_meta": 3}))));
        assert_eq!(e["data"]["_meta"], json!({"coda": {"failure": {"kind": "quota_exhausted"}}}));
        let auth = Failure { verdict: Verdict::Auth, message: "log in".into(), data: None };
        assert_eq!(error(&auth.answer(&Id::from_json("2"))), json!({"code": -32000, "message": "log in"}));
    }

    #[test]
    fn an_upstream_code_names_the_kind_and_of_the_statuses_only_503_does() {
        assert_eq!(upstream(Some("insufficient_quota"), Some(429)), Verdict::Kind(Kind::Quota));
        assert_eq!(upstream(Some("rate_limit_exceeded"), Some(429)), Verdict::Kind(Kind::SERVICE));
        assert_eq!(upstream(Some("invalid_api_key"), Some(503)), Verdict::Auth);
        // Anthropic's error types.
        assert_eq!(upstream(Some("billing_error"), None), Verdict::Kind(Kind::Quota));
        assert_eq!(upstream(Some("rate_limit_error"), Some(429)), Verdict::Kind(Kind::SERVICE));
        assert_eq!(upstream(Some("overloaded_error"), Some(529)), Verdict::Kind(Kind::SERVICE));
        assert_eq!(upstream(Some("authentication_error"), Some(401)), Verdict::Auth);
        assert_eq!(upstream(Some("api_error"), Some(500)), Verdict::Plain);
        assert_eq!(upstream(None, Some(503)), Verdict::Kind(Kind::SERVICE));
        assert_eq!(upstream(Some("context_length_exceeded"), Some(503)), Verdict::Kind(Kind::SERVICE));
        for status in [None, Some(429), Some(403), Some(500), Some(502), Some(529)] {
            assert_eq!(upstream(None, status), Verdict::Plain, "{status:?}");
            assert_eq!(upstream(Some("unknown_code"), status), Verdict::Plain, "{status:?}");
        }
    }

    #[test]
    fn a_long_reason_is_cut_in_every_answer() {
        let long = "é".repeat(10_000);
        for verdict in [Verdict::Kind(Kind::Quota), Verdict::Auth, Verdict::Plain] {
            let f = Failure { verdict, message: long.clone(), data: None };
            let m = error(&f.answer(&Id::from_json("1")))["message"].as_str().unwrap_or_default().to_owned();
            assert!(m.len() <= REASON_MAX + 3 && m.ends_with('…'), "{}", m.len());
        }
    }

    #[test]
    fn times_are_marked_in_utc_to_the_millisecond() {
        let at: jiff::Timestamp = "2026-10-24T18:10:00Z".parse().expect("a time");
        assert_eq!(time_mark(at), "<t:2026-10-24T18:10:00.000Z>");
    }
}

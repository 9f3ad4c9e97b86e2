//! Layers: sans-IO state machines that see every frame and decide what goes on.
//!
//! A binary is a stack of layers over the same engine. Index 0 sits next to the client (Coda), the last
//! one next to the agent. A frame from the client enters layer 0 and walks down; a frame from the agent
//! enters the last layer and walks up. Whatever a layer emits towards the agent continues through the
//! layers below it, whatever it emits towards the client through the layers above it.
//!
//! The contract: a layer does no I/O of its own. It is handed each input with a [`Cx`] that carries the
//! time of that input ([`Cx::now`], [`Cx::wall`]) and takes what the layer asks for: frames towards either
//! peer, requests of its own to the agent ([`Cx::request`], answered in [`Layer::on_reply`]) and wake-ups
//! ([`Cx::after`], run in [`Layer::on_timer`]). It never spawns a thread to sleep, reads the clock, or
//! reads the environment after set-up (the adapter's set-up reads the environment and hands it to the
//! layer's constructor), and never touches a file or starts a thread. I/O it needs it asks for as a job
//! ([`Cx::work`]): a closure that does the I/O and returns a value, and a method of the layer that takes that
//! value; the engine runs the job off the relay loop ([`work::Pool`]) and calls the method with a `Cx` as one
//! more input, in arrival order with frames, events and wake-ups:
//!
//! ```ignore
//! fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
//!     let path = self.path.clone();
//!     cx.work(move || std::fs::read(&path).ok(), Me::on_read); // the job owns what it needs
//!     self.held.push(frame);                                    // what waits for it, the layer keeps
//! }
//! fn on_read(&mut self, bytes: Option<Vec<u8>>, cx: &mut Cx) { /* emit what was held */ }
//! ```
//!
//! A layer that must hold frames for a job keeps the order of what depends on them (see
//! `adapters/kimi/title.rs`: a session's frames wait, others go on). Threads set up with the stack (a file
//! watcher, an event stream) hand their results in through an [`EventSender`], in order with the frames; a
//! layer may hand an event on to another layer's sender while it handles one (`adapters/kimi/activity.rs`
//! passes each scan's usage facts below it): the relay takes queued events before the next frame, so no frame
//! comes between the two.
//! [`testing::Harness`] drives a stack by hand, with a clock that moves only when the test says so, and runs
//! jobs at once after the input that asked (or on demand: [`testing::Harness::hold_work`]).
//!
//! Each layer names its own types ([`Layer::Timer`], [`Layer::Event`], [`Layer::Reply`]; `Infallible` where
//! it has none): its wake-ups, events and request tags come back as the values it asked with. The stack
//! erases them in one place ([`AnyLayer`]): an [`EventSender`] is typed by the layer it was made for, and a
//! timer or tag of another type is a loud error (a panic in debug builds), never dropped in silence.
//!
//! The stack records every client request once ([`requests`]): a layer asks which request an answer answers
//! ([`Cx::answer_to`]) and which are still open ([`Cx::open_requests`]) rather than keeping its own map of
//! ids, and tells the layers above something about a request with a typed note ([`Cx::note`]), never with a
//! key written into a frame. A layer may hold a client request (keep the frame and emit it later): it stays
//! open, and not sent, until then.
//!
//! Beside it the stack keeps the session table ([`sessions`]): the sessions Coda opened (learnt from the agent's
//! answers before any layer sees them), the children layers name ([`Cx::add_child`]), whose turn runs in each
//! ([`Cx::turn`]), and the marks of the compaction and steering machines ([`Cx::session_mut`]).
//!
//! Most frames from an agent are streamed chunks that most layers only pass on: a layer says so from its state
//! and the envelope ([`Layer::passes_from_agent`]) and is skipped; one whose answer for a chunk reads no more
//! than its state, the chunk's session and its kind says that too ([`Layer::chunks_pass_by_session`]), and the
//! stack keeps its word for the session's next chunks until it next calls the layer (`Passing`: a bit per
//! layer, so that the layers whose word is kept are passed in one step). Debug builds check both: they call a
//! skipped layer anyway and panic unless it only passed the frame on.

use crate::HashMap;
use std::any::{Any, TypeId};
use std::marker::PhantomData;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::frame::{Frame, Id, Kind};

pub mod cancel;
pub mod requests;
pub mod sessions;
pub mod testing;
mod timers;
pub mod work;

pub use requests::{Request, Requests};
pub use sessions::{Session, Sessions, Turn};
pub use timers::Timer;
use timers::{AnyTimers, Timers};
pub use work::{Done, Job, Pool};

/// How many rounds of wake-ups [`Stack::wake_all`] runs at the end (a wake-up that asks for another is one more).
pub const END_ROUNDS: usize = 8;

/// Something other than a frame that reaches a layer (a file change, a probe's result), with its type
/// erased on its way through the relay's one queue; [`AnyLayer`] gives it its type back.
pub type Event = Box<dyn Any + Send>;

pub trait Layer: Send + 'static {
    /// What this layer's wake-ups are ([`Cx::after`]): an enum of its own, or `Infallible` for none.
    type Timer: Timer;
    /// What this layer's [`EventSender`] carries; `Infallible` for none.
    type Event: Send + 'static;
    /// What this layer's own requests carry back with their answer ([`Cx::request`]); `Infallible` for none.
    type Reply: Send + 'static;

    /// A frame travelling from the client towards the agent.
    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        cx.to_agent(frame);
    }

    /// A frame travelling from the agent towards the client.
    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        cx.to_client(frame);
    }

    /// Whether [`Layer::from_agent`] would do nothing with `frame` but pass it on to the client unchanged:
    /// ask for nothing, emit nothing else, change none of the layer's state. The stack then skips the layer
    /// for that frame (most agent frames are streamed chunks that no layer reads). A layer answers from its
    /// state and the frame's envelope, cheaply, and `false` (the default) is always right. Debug builds
    /// check every `true` by calling [`Layer::from_agent`] anyway and panicking unless it only passed the
    /// frame on.
    fn passes_from_agent(&self, _frame: &Frame) -> bool {
        false
    }

    /// Whether [`Layer::passes_from_agent`], asked of a streamed chunk ([`Frame::is_streamed_chunk`]), answers
    /// from no more than the layer's own state, the chunk's session and its kind of update: never from its text,
    /// its `_meta` or anything outside the layer (a clock, another thread). The stack then keeps a `true` for the
    /// next chunks of that session and kind and does not ask again until it next calls the layer with anything
    /// (the only way its state changes). Asked when a chunk has just passed the layer; `false` (the default) is
    /// always right. Debug builds ask anyway and panic where the kept answer is not the layer's.
    fn chunks_pass_by_session(&self) -> bool {
        false
    }

    /// The agent's answer to a request this layer sent with [`Cx::request`], with the tag it was sent with.
    fn on_reply(&mut self, _tag: Self::Reply, _reply: Frame, _cx: &mut Cx) {}

    /// An event sent to this layer through its [`EventSender`].
    fn on_event(&mut self, _event: Self::Event, _cx: &mut Cx) {}

    /// A wake-up this layer asked for with [`Cx::after`].
    fn on_timer(&mut self, _timer: Self::Timer, _cx: &mut Cx) {}

    /// Coda's `session/close` of `closed[0]` succeeded (the agent answered it with a result): that session and
    /// its children (`closed[1..]`, the ones the session table knows) are over. The layer ends what it still
    /// runs or holds for them (what it says to Coda reaches Coda before the answer to the close) and forgets
    /// them. Called for every layer, nearest the agent first, before the answer goes up; the session table
    /// forgets them once the answer has left the stack.
    fn session_closed(&mut self, _closed: &[String], _cx: &mut Cx) {}

    /// How many entries the layer keeps for sessions (the sizes of its per-session tables, its backend's
    /// included): once Coda closed every session it opened and nothing is in flight, 0. For the tests of the
    /// layer's bounds ([`Stack::kept`]).
    fn kept(&self) -> usize {
        0
    }
}

/// A layer with its types erased: what a [`Stack`] holds. Every [`Layer`] is one; this is the one place
/// where events, tags and timers get their types back.
pub trait AnyLayer: Send {
    #[doc(hidden)]
    fn client_frame(&mut self, frame: Frame, cx: &mut Cx);
    #[doc(hidden)]
    fn agent_frame(&mut self, frame: Frame, cx: &mut Cx);
    #[doc(hidden)]
    fn passes_agent_frame(&self, frame: &Frame) -> bool;
    /// [`Layer::passes_from_agent`] of a streamed chunk, and [`Layer::chunks_pass_by_session`], in one call.
    #[doc(hidden)]
    fn passes_chunk(&self, chunk: &Frame) -> Passes;
    #[doc(hidden)]
    fn reply(&mut self, tag: Box<dyn Any + Send>, reply: Frame, cx: &mut Cx);
    #[doc(hidden)]
    fn event(&mut self, event: Event, cx: &mut Cx);
    #[doc(hidden)]
    fn wake(&mut self, key: (Instant, u64), cx: &mut Cx);
    #[doc(hidden)]
    fn closed(&mut self, closed: &[String], cx: &mut Cx);
    #[doc(hidden)]
    fn kept_entries(&self) -> usize;
    #[doc(hidden)]
    fn new_timers(&self) -> Box<dyn AnyTimers>;
    #[doc(hidden)]
    fn reply_type(&self) -> TypeId;
    #[doc(hidden)]
    fn layer_type(&self) -> TypeId;
    #[doc(hidden)]
    fn event_type(&self) -> TypeId;
    /// The layer's type, for errors.
    fn name(&self) -> &'static str;
    /// The layer itself, for tests that look inside it ([`testing::Harness::layer`]).
    fn as_any(&mut self) -> &mut dyn Any;
}

impl<L: Layer> AnyLayer for L {
    fn client_frame(&mut self, frame: Frame, cx: &mut Cx) {
        Layer::from_client(self, frame, cx)
    }

    fn agent_frame(&mut self, frame: Frame, cx: &mut Cx) {
        Layer::from_agent(self, frame, cx)
    }

    fn passes_agent_frame(&self, frame: &Frame) -> bool {
        Layer::passes_from_agent(self, frame)
    }

    fn passes_chunk(&self, chunk: &Frame) -> Passes {
        match Layer::passes_from_agent(self, chunk) {
            false => Passes::No,
            true if Layer::chunks_pass_by_session(self) => Passes::BySession,
            true => Passes::Yes,
        }
    }

    fn reply(&mut self, tag: Box<dyn Any + Send>, reply: Frame, cx: &mut Cx) {
        match tag.downcast::<L::Reply>() {
            Ok(tag) => self.on_reply(*tag, reply, cx),
            Err(_) => misrouted("a request tag", std::any::type_name::<L::Reply>(), self.name()),
        }
    }

    fn event(&mut self, event: Event, cx: &mut Cx) {
        match event.downcast::<L::Event>() {
            Ok(event) => self.on_event(*event, cx),
            Err(_) => misrouted("an event", std::any::type_name::<L::Event>(), self.name()),
        }
    }

    fn wake(&mut self, key: (Instant, u64), cx: &mut Cx) {
        if let Some(timer) = cx.timers::<L::Timer>().and_then(|t| t.take(key)) {
            self.on_timer(timer, cx);
        }
    }

    fn closed(&mut self, closed: &[String], cx: &mut Cx) {
        self.session_closed(closed, cx)
    }

    fn kept_entries(&self) -> usize {
        Layer::kept(self)
    }

    fn new_timers(&self) -> Box<dyn AnyTimers> {
        Box::new(Timers::<L::Timer>::default())
    }

    fn reply_type(&self) -> TypeId {
        TypeId::of::<L::Reply>()
    }

    fn layer_type(&self) -> TypeId {
        TypeId::of::<L>()
    }

    fn event_type(&self) -> TypeId {
        TypeId::of::<L::Event>()
    }

    fn name(&self) -> &'static str {
        std::any::type_name::<L>()
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

/// A value of the wrong type reached a layer: a bug of the set-up or of a layer, said loudly (a panic in
/// debug builds, so every test finds it), never dropped in silence.
fn misrouted(what: &str, wanted: &str, layer: &str) {
    tracing::error!("{what} of the wrong type reached {layer}, which takes {wanted}; dropped (a bug of the shim)");
    debug_assert!(false, "{what} of the wrong type reached {layer}, which takes {wanted}");
}

/// What a layer asks for while handling one input, the time of that input, and the stack's request table.
pub struct Cx<'a> {
    out: Vec<Out>,
    now: Instant,
    wall: SystemTime,
    /// `None` outside any stack.
    stack: Option<(&'a mut Shared, usize)>,
}

/// What the layers of a stack share, and what a context inside it reaches (with the handled layer's index).
struct Shared {
    requests: Requests,
    sessions: Sessions,
    /// The agent is gone: what it still owes comes as the engine's errors, and nothing more after them.
    agent_gone: bool,
    /// Wake-ups asked for so far across the stack (orders equal deadlines).
    asked: u64,
    /// Each layer's wake-ups, by index.
    timers: Vec<Box<dyn AnyTimers>>,
    /// Each layer's name, for errors.
    names: Vec<&'static str>,
}

/// A context outside any stack (a layer driven by hand): the time is read once, here; what the layer asks
/// for is dropped with the context, and it sees no requests.
impl Default for Cx<'_> {
    fn default() -> Self {
        Cx { out: Vec::new(), now: Instant::now(), wall: SystemTime::now(), stack: None }
    }
}

enum Out {
    ToAgent(Frame),
    ToClient(Frame),
    Request { method: String, params: Value, tag: Box<dyn Any + Send>, on_behalf: Option<Id> },
    Work(Job, TypeId),
}

impl<'a> Cx<'a> {
    /// The time the engine handed this input (monotonic). Layers never call `Instant::now()`.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Wall-clock time of the same moment (for file times, record stamps). Layers never call
    /// `SystemTime::now()`.
    pub fn wall(&self) -> SystemTime {
        self.wall
    }

    /// This layer's table of wake-ups, if its timers are of type `T` (else a loud error).
    fn timers<T: Timer>(&mut self) -> Option<&mut Timers<T>> {
        let (shared, at) = self.stack.as_mut()?;
        let table = shared.timers[*at].as_any().downcast_mut::<Timers<T>>();
        if table.is_none() {
            misrouted("a timer", std::any::type_name::<T>(), shared.names[*at]);
        }
        table
    }

    /// Calls this layer's [`Layer::on_timer`] with `timer` once `delay` has passed. Asking again for the same
    /// timer replaces the earlier wake-up: one pending wake-up per (layer, timer). Takes effect at once.
    pub fn after<T: Timer>(&mut self, delay: Duration, timer: T) {
        let at = self.now.checked_add(delay);
        let Some(asked) = self.stack.as_mut().map(|(s, _)| {
            s.asked += 1;
            s.asked
        }) else {
            return;
        };
        let Some(table) = self.timers::<T>() else { return };
        match at {
            Some(at) => table.set(timer, at, asked),
            // A delay too long to add to an instant never comes: no wake-up.
            None => table.cancel(&timer),
        }
    }

    /// Forgets a pending wake-up of this layer (no-op when there is none).
    pub fn cancel<T: Timer>(&mut self, timer: &T) {
        if let Some(table) = self.timers::<T>() {
            table.cancel(timer);
        }
    }

    /// Pass a frame on towards the agent.
    pub fn to_agent(&mut self, frame: Frame) {
        self.out.push(Out::ToAgent(frame));
    }

    /// Pass a frame on towards the client.
    pub fn to_client(&mut self, frame: Frame) {
        self.out.push(Out::ToClient(frame));
    }

    /// Where what this layer sends next lies among what it has sent: for [`Cx::to_client_at`].
    pub fn mark(&self) -> usize {
        self.out.len()
    }

    /// Pass `frame` on towards the client ahead of what this layer sent since `mark` (from [`Cx::mark`]): for a
    /// layer that reads a frame it passes on and may send frames that follow it, without a copy of the frame
    /// kept to read after it is sent.
    pub fn to_client_at(&mut self, mark: usize, frame: Frame) {
        self.out.insert(mark.min(self.out.len()), Out::ToClient(frame));
    }

    /// Send a request of the shim's own to the agent. The reply comes back to this layer's
    /// [`Layer::on_reply`] with `tag` (of the layer's [`Layer::Reply`] type), and is never forwarded to the client.
    pub fn request<R: Send + 'static>(&mut self, method: &str, params: Value, tag: R) {
        self.out.push(Out::Request { method: method.to_owned(), params, tag: Box::new(tag), on_behalf: None });
    }

    /// [`Cx::request`], made to answer the client's request `client` (the layer answers it from this one's
    /// answer): when the client withdraws `client` (`$/cancel_request`), the stack withdraws this request
    /// from the agent by the shim's id ([`cancel`]).
    pub fn request_for<R: Send + 'static>(&mut self, client: &Id, method: &str, params: Value, tag: R) {
        let on_behalf = Some(client.clone());
        self.out.push(Out::Request { method: method.to_owned(), params, tag: Box::new(tag), on_behalf });
    }

    /// The client request that `answer` (an answer on its way to the client) answers, while it is open.
    pub fn answer_to(&self, answer: &Frame) -> Option<&Request> {
        match answer.kind() {
            Kind::Response { id } => self.request_of(id),
            _ => None,
        }
    }

    /// The open client request with id `id`.
    pub fn request_of(&self, id: &Id) -> Option<&Request> {
        self.stack.as_ref()?.0.requests.get(id)
    }

    /// The client requests the agent has not answered yet (sent, or held by a layer), as this layer sees the
    /// agent's frames: one whose answer a layer below holds is still open here, so that what the agent wrote
    /// before that answer (a `session/load`'s replay, say) reads here as written while it was open.
    pub fn open_requests(&self) -> impl Iterator<Item = &Request> + '_ {
        self.stack.iter().flat_map(|(s, at)| s.requests.open_at(*at))
    }

    /// Asks the engine to run `job` (the I/O this layer needs: read a file, start a watcher, write a record)
    /// off the relay loop, and to hand what it returns to `done`, on this layer, as one more input (in its
    /// order of arrival among frames, events and wake-ups). `L` is this layer's type; `done` is usually one
    /// of its methods (`cx.work(move || read(&path), Me::on_read)`). The job owns what it needs (it runs on
    /// another thread, maybe while the layer handles other inputs) and must not block for ever: jobs share a
    /// few worker threads. Nothing is done outside a stack; a stack without a relay runs the job at once,
    /// after this input ([`work`]).
    pub fn work<L, T, J, D>(&mut self, job: J, done: D)
    where
        L: Layer,
        T: Send + 'static,
        J: FnOnce() -> T + Send + 'static,
        D: FnOnce(&mut L, T, &mut Cx) + Send + 'static,
    {
        let Some((_, at)) = &self.stack else { return };
        self.out.push(Out::Work(Job::new::<L, T, J, D>(*at, job, done), TypeId::of::<L>()));
    }

    /// Leaves a typed note on the open client request `id`, for the layers that handle its answer after this
    /// one ([`Request::note`]); one note per type. False when no such request is open.
    pub fn note<T: Any + Send>(&mut self, id: &Id, note: T) -> bool {
        self.stack.as_mut().is_some_and(|(s, _)| s.requests.note(id, note))
    }

    /// Whether the agent is gone (its process ended): the answers that come now are the engine's errors for
    /// what it still owed, and nothing comes after them, so a layer holds nothing more (no wake-up will come).
    pub fn agent_gone(&self) -> bool {
        self.stack.as_ref().is_some_and(|(s, _)| s.agent_gone)
    }

    /// The stack's session table ([`sessions`]); `None` outside a stack.
    pub fn sessions(&self) -> Option<&Sessions> {
        self.stack.as_ref().map(|(s, _)| &s.sessions)
    }

    /// The session `id` of the table: a root Coda opened on this connection, or a child a layer named.
    pub fn session(&self, id: &str) -> Option<&Session> {
        self.sessions()?.get(id)
    }

    /// The session `id`, to record what a layer knows of it ([`Session::set_busy`], and the compaction and
    /// steering machines' marks). Takes effect at once, for the layers after this one.
    pub fn session_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.stack.as_mut()?.0.sessions.get_mut(id)
    }

    /// Tells the table that `child` is a session the agent runs for `parent` (a subagent's), as this layer
    /// learnt. A root stays a root.
    pub fn add_child(&mut self, child: &str, parent: Option<&str>) {
        if let Some((s, _)) = self.stack.as_mut() {
            s.sessions.add_child(child, parent);
        }
    }

    /// Whose turn runs in `session` ([`Turn`]): Coda's open `session/prompt` (one the agent has before one a
    /// layer holds), else the shim's own request about it the agent owes, else the CLI's own when it said the
    /// session is busy; `None` when none runs.
    pub fn turn(&self, session: &str) -> Option<Turn> {
        let (shared, _) = self.stack.as_ref()?;
        let prompts = shared.requests.open().filter(|r| r.is("session/prompt") && r.session() == Some(session));
        let coda = prompts.max_by_key(|r| (r.is_sent(), std::cmp::Reverse(r.seq())));
        if let Some(r) = coda {
            return Some(Turn::Coda { prompt: r.id.clone(), sent: r.is_sent() });
        }
        if let Some(method) = shared.sessions.own_request(session) {
            return Some(Turn::Shim { method: method.clone() });
        }
        (shared.sessions.get(session)?.busy() == Some(true)).then_some(Turn::Cli)
    }
}

/// How much a stack holds ([`Stack::sizes`]): what a test checks stays bounded however a session goes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// The client's requests not yet answered to it.
    pub open_requests: usize,
    /// The shim's own requests the agent has not answered.
    pub own_requests: usize,
    /// Wake-ups pending, across the layers.
    pub timers: usize,
}

/// The error a request gets whose id is that of a request still open: JSON-RPC's invalid request.
pub const ID_IN_USE: (i64, &str) = (-32600, "invalid request: id in use");

/// The layers of one binary, the client's requests, and the shim's own outstanding requests.
pub struct Stack {
    layers: Vec<Box<dyn AnyLayer>>,
    /// The request table and each layer's wake-ups.
    shared: Shared,
    /// The shim's own requests to the agent: id -> (layer index, tag, the client request it was made for).
    own: HashMap<Id, Own>,
    own_prefix: String,
    next_own: u64,
    /// Emptied output buffers, reused.
    spare: Vec<Vec<Out>>,
    /// The time handed to layers with the next inputs.
    now: Instant,
    wall: SystemTime,
    /// Jobs asked for and not yet taken ([`work`]).
    jobs: Vec<Job>,
    /// Whether jobs wait for [`Stack::take_work`] (else they run after each input).
    keep_work: bool,
    /// Where the stack says its [`Sizes`] after each input, when a test asked ([`Stack::gauge`]).
    gauge: Option<std::sync::Arc<std::sync::Mutex<Sizes>>>,
    /// What the layers said of the streamed chunks of one session and kind ([`Layer::chunks_pass_by_session`]).
    passing: Passing,
}

/// What a layer says of a streamed chunk from the agent ([`AnyLayer::passes_chunk`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passes {
    /// It reads the frame.
    No,
    /// It would only pass the frame on.
    Yes,
    /// It would only pass this streamed chunk on, and the next of its session and kind while its state is this.
    BySession,
}

/// The session and kind of update of the last streamed chunk that went up, and which layers pass such chunks
/// by their state (which changes only when the stack calls the layer): most frames of a session are its chunks,
/// and most layers only pass them on.
#[derive(Default)]
struct Passing {
    /// The chunks' `params.sessionId` as written, and their `sessionUpdate`.
    session: Vec<u8>,
    update: String,
    /// Bit `at`: layer `at` passed one of these chunks by its state, and the stack has not called it since
    /// (nor did the session or the kind change). Layers from the 64th up are always asked.
    kept: u64,
}

/// Layer `at`'s bit in [`Passing::kept`] (none from the 64th layer up).
fn bit(at: usize) -> u64 {
    u32::try_from(at).ok().and_then(|at| 1u64.checked_shl(at)).unwrap_or(0)
}

impl Passing {
    /// The stack is calling layer `at`, which may change its state.
    #[inline]
    fn calling(&mut self, at: usize) {
        self.kept &= !bit(at);
    }

    /// Whether `frame` is a streamed chunk whose session and kind this keeps answers for (from now on, when
    /// they are not the last chunk's: what was kept for those goes).
    #[inline]
    fn of(&mut self, frame: &Frame) -> bool {
        if !frame.is_streamed_chunk() {
            return false;
        }
        let (Some(session), Some(update)) = (frame.session_as_written(), frame.session_update()) else {
            return false;
        };
        // (Compared inline: a call to `memcmp` for a few dozen bytes costs more than the comparison.)
        if !crate::json::same(session, &self.session) || !crate::json::same(update.as_bytes(), self.update.as_bytes()) {
            self.session.clear();
            self.session.extend_from_slice(session);
            self.update.clear();
            self.update.push_str(update);
            self.kept = 0;
        }
        true
    }

    /// The nearest layer under `below` whose word on these chunks is not kept (the next to ask), if any: the
    /// layers between are passed in one step.
    #[inline]
    fn next_to_ask(&self, below: usize) -> Option<usize> {
        if below > 64 {
            return Some(below - 1);
        }
        let ask = !self.kept & bit(below).wrapping_sub(1);
        (ask != 0).then(|| 63 - ask.leading_zeros() as usize)
    }

    /// Layer `at` passed one of these chunks and said it does so by its state.
    fn keep(&mut self, at: usize) {
        self.kept |= bit(at);
    }
}

/// One of the shim's own requests to the agent, until the agent answers it.
struct Own {
    layer: usize,
    tag: Box<dyn Any + Send>,
    /// The client request it was made to answer ([`Cx::request_for`]).
    on_behalf: Option<Id>,
}

/// Where frames leave the stack.
#[derive(Debug, Default, PartialEq)]
pub struct Exits {
    pub to_agent: Vec<Frame>,
    pub to_client: Vec<Frame>,
}

impl Stack {
    pub fn new(layers: Vec<Box<dyn AnyLayer>>) -> Stack {
        Stack {
            shared: Shared {
                requests: Requests::default(),
                sessions: Sessions::default(),
                agent_gone: false,
                asked: 0,
                timers: layers.iter().map(|l| l.new_timers()).collect(),
                names: layers.iter().map(|l| l.name()).collect(),
            },
            layers,
            own: HashMap::default(),
            own_prefix: format!("coda-shim-{}-", std::process::id()),
            next_own: 0,
            spare: Vec::new(),
            now: Instant::now(),
            wall: SystemTime::now(),
            jobs: Vec::new(),
            keep_work: false,
            gauge: None,
            passing: Passing::default(),
        }
    }

    /// How much the stack holds now.
    pub fn sizes(&self) -> Sizes {
        Sizes {
            open_requests: self.shared.requests.len(),
            own_requests: self.own.len(),
            timers: self.shared.timers.iter().map(|t| t.len()).sum(),
        }
    }

    /// A cell the stack writes its [`Sizes`] to after each input, for a test that cannot reach the stack while a
    /// relay runs it (read-only: nothing the stack does depends on it).
    pub fn gauge(&mut self) -> std::sync::Arc<std::sync::Mutex<Sizes>> {
        self.gauge.get_or_insert_with(Default::default).clone()
    }

    fn publish_sizes(&self) {
        if let Some(gauge) = &self.gauge {
            *gauge.lock().unwrap_or_else(|p| p.into_inner()) = self.sizes();
        }
    }

    /// Sets the time handed to layers with the next inputs (the relay calls it on each wake-up; tests by hand).
    pub fn set_time(&mut self, now: Instant, wall: SystemTime) {
        self.now = now;
        self.wall = wall;
    }

    /// The earliest pending wake-up.
    pub fn next_wake(&self) -> Option<Instant> {
        self.shared.timers.iter().filter_map(|t| t.first()).min()
    }

    /// Runs every wake-up due at the current time (see [`Stack::set_time`]), in deadline order (equal
    /// deadlines in the order they were asked for). A wake-up asked for while these run waits for the next
    /// call, even when already due, so a layer that keeps asking cannot hold the stack here.
    pub fn wake_due(&mut self, exits: &mut Exits) {
        self.wake(Some(self.now), exits);
        self.settle(exits);
    }

    /// The agent is gone ([`Cx::agent_gone`]) and the session ends: every pending wake-up runs now, in deadline
    /// order, so that what a layer holds until one (an answer waiting for the CLI's record of its turn, an update
    /// waiting for its facts) still reaches the client: nothing it waits for comes any more. Wake-ups asked for
    /// while these run run too, for [`END_ROUNDS`] rounds at most.
    pub fn wake_all(&mut self, exits: &mut Exits) {
        self.shared.agent_gone = true;
        for _ in 0..END_ROUNDS {
            if !self.wake(None, exits) {
                break;
            }
        }
        self.settle(exits);
    }

    /// Runs the wake-ups due at `now` (None: all) that were asked for before this call; whether any ran. One
    /// asked for while these run waits for the next call, even when already due, so a layer that keeps asking
    /// cannot hold the stack here.
    fn wake(&mut self, now: Option<Instant>, exits: &mut Exits) -> bool {
        let asked_before = self.shared.asked;
        let mut ran = false;
        loop {
            let due =
                self.shared.timers.iter().enumerate().filter_map(|(i, t)| Some((t.first_due(now, asked_before)?, i)));
            let Some((key, layer)) = due.min() else { return ran };
            ran = true;
            self.call(layer, exits, |l, cx| l.wake(key, cx));
        }
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// A frame read from the client. A request whose id is that of a request still open (the client's not yet
    /// answered, or the shim's own) is answered with an error at once and goes no further: JSON-RPC's ids tell
    /// requests apart, and two open under one id would make every answer ambiguous.
    pub fn from_client(&mut self, frame: Frame, exits: &mut Exits) {
        if let Kind::Request { id, .. } = frame.kind()
            && (self.shared.requests.get(id).is_some() || self.is_own(id))
        {
            tracing::warn!("client sent a request with the id of one still open; answered with an error");
            let answer = crate::frame::error_response(id, ID_IN_USE.0, ID_IN_USE.1, None);
            return exits.to_client.push(answer);
        }
        self.shared.requests.opened(&frame, self.now, self.wall);
        self.down(0, frame, exits);
        self.settle(exits);
    }

    /// A frame read from the agent. A second answer to a request of the client's is dropped here, with a warning:
    /// one to a request the client has had its answer to (the layers never see it), or whose first answer is
    /// still on its way to the client (a layer holds it). An answer to an id the client never sent goes on.
    pub fn from_agent(&mut self, frame: Frame, exits: &mut Exits) {
        if let Kind::Response { id } = frame.kind() {
            if let Some(Own { layer, tag, .. }) = self.own.remove(id) {
                self.shared.sessions.own_answered(id);
                self.call(layer, exits, |l, cx| l.reply(tag, frame, cx));
                return self.settle(exits);
            }
            if self.is_own(id) {
                // An answer to a request of the shim's that was answered already (or never sent): Coda never
                // sent that id, so it is no answer of Coda's.
                return tracing::warn!("the agent answered one of the shim's own requests twice; dropped");
            }
            if self.shared.requests.was_answered(id) {
                // Coda has its answer: a second one would answer nothing it asked.
                return tracing::warn!(
                    "the agent answered a request of the client's that was answered already; dropped"
                );
            }
            let Shared { requests, sessions, .. } = &mut self.shared;
            let closing = match requests.get(id).filter(|r| !r.is_answered()) {
                Some(r) if r.is("session/close") => r.session().filter(|_| frame.value().get("result").is_some()),
                Some(r) => {
                    sessions.answered(&r.method, r.session(), &frame);
                    None
                }
                None => None,
            };
            let closed = closing.map(|s| sessions.family(s));
            requests.answered(id);
            if let Some(closed) = closed.filter(|c| !c.is_empty()) {
                // Every layer ends what it runs for the sessions, nearest the agent first; then the answer goes
                // up, and the table forgets them.
                for at in (0..self.layers.len()).rev() {
                    self.call(at, exits, |l, cx| l.closed(&closed, cx));
                }
                self.up(self.layers.len(), frame, exits);
                self.shared.sessions.forget(&closed);
                return self.settle(exits);
            }
        }
        self.up(self.layers.len(), frame, exits);
        self.settle(exits);
    }

    /// An event for layer `layer` (as its [`EventSender`] queued it), or for every layer that takes its type
    /// (as a [`Broadcast`] queued it).
    pub fn event(&mut self, layer: usize, event: Event, exits: &mut Exits) {
        if layer == EVERY {
            let Ok(fanout) = event.downcast::<Fanout>() else {
                return misrouted("a broadcast", "a Fanout", "the stack");
            };
            for at in 0..self.layers.len() {
                if self.layers[at].event_type() == fanout.event_type {
                    let copy = (fanout.copy)(&*fanout.value);
                    self.call(at, exits, |l, cx| l.event(copy, cx));
                }
            }
            return self.settle(exits);
        }
        if layer >= self.layers.len() {
            return misrouted("an event", "(no such layer)", "the stack");
        }
        self.call(layer, exits, |l, cx| l.event(event, cx));
        self.settle(exits);
    }

    /// Whether `id` names one of the shim's own requests.
    pub fn is_own(&self, id: &Id) -> bool {
        id.as_json().strip_prefix('"').is_some_and(|s| s.starts_with(&self.own_prefix))
    }

    /// The client's requests not answered to the client yet.
    pub fn requests(&self) -> &Requests {
        &self.shared.requests
    }

    /// The agent is gone ([`Cx::agent_gone`]).
    pub fn agent_gone(&mut self) {
        self.shared.agent_gone = true;
    }

    /// The session table ([`sessions`]).
    pub fn sessions(&self) -> &Sessions {
        &self.shared.sessions
    }

    /// The client requests the agent was sent and has not answered, in their order of arrival.
    pub fn owed(&self) -> Vec<Id> {
        self.shared.requests.owed()
    }

    /// The client requests the agent has not answered, sent or held by a layer, in their order of arrival.
    pub fn unanswered(&self) -> Vec<Id> {
        self.shared.requests.unanswered()
    }

    /// Whether the agent was sent the client request `id` and has not answered it.
    pub fn owes(&self, id: &Id) -> bool {
        self.shared.requests.owes(id)
    }

    /// Each layer that keeps entries for sessions ([`Layer::kept`]): its name and how many.
    pub fn kept(&self) -> Vec<(&'static str, usize)> {
        self.layers.iter().map(|l| (l.name(), l.kept_entries())).filter(|(_, n)| *n > 0).collect()
    }

    /// The layer at `at`, for tests that look inside it.
    pub fn layer_mut(&mut self, at: usize) -> Option<&mut (dyn AnyLayer + 'static)> {
        // What is done with it may change its state: what it said of chunks is asked again.
        self.passing.calling(at);
        self.layers.get_mut(at).map(|l| &mut **l)
    }

    /// Sends `frame` through layers `from..` towards the agent.
    fn down(&mut self, from: usize, frame: Frame, exits: &mut Exits) {
        if from == self.layers.len() {
            if let Some(withdrawn) = cancel::target(&frame) {
                return self.withdraw(withdrawn, frame, exits);
            }
            if let Kind::Request { id, method } = frame.kind()
                && !self.is_own(id)
            {
                self.shared.requests.sent(&frame, self.now, self.wall);
                if method == "session/prompt"
                    && let Some(session) = self.shared.requests.get(id).and_then(Request::session)
                {
                    self.shared.sessions.prompt_sent(session);
                }
            }
            return exits.to_agent.push(frame);
        }
        self.call(from, exits, |l, cx| l.client_frame(frame, cx));
    }

    /// The client's `$/cancel_request` of `withdrawn` leaves the stack: as it came when the agent has that
    /// request; as the withdrawal of each of the shim's own requests made for it ([`Cx::request_for`]) the
    /// agent still owes; nowhere when the agent never saw the request (a layer held it, or answered it) and no
    /// request was made for it. One of an id the stack does not know goes on as it came.
    fn withdraw(&mut self, withdrawn: Id, frame: Frame, exits: &mut Exits) {
        let mut own: Vec<&Id> =
            self.own.iter().filter(|(_, o)| o.on_behalf.as_ref() == Some(&withdrawn)).map(|(id, _)| id).collect();
        if !own.is_empty() {
            own.sort_by(|a, b| a.as_json().cmp(b.as_json()));
            tracing::debug!("the client withdrew a request the shim asks the agent for: withdrawn by the shim's id");
            let frames: Vec<Frame> = own.into_iter().map(cancel::withdraw).collect();
            return exits.to_agent.extend(frames);
        }
        let requests = &self.shared.requests;
        if requests.owes(&withdrawn) || (requests.get(&withdrawn).is_none() && !requests.was_answered(&withdrawn)) {
            return exits.to_agent.push(frame);
        }
        tracing::debug!("the client withdrew a request the agent never saw; not passed on");
    }

    /// Sends `frame` through layers `..below` (nearest first) towards the client, past the layers that
    /// say they would only pass it on ([`Layer::passes_from_agent`]).
    fn up(&mut self, mut below: usize, frame: Frame, exits: &mut Exits) {
        if self.passing.of(&frame) {
            below = self.past_for_chunk(below, &frame);
        } else {
            while below > 0 && self.layers[below - 1].passes_agent_frame(&frame) {
                #[cfg(debug_assertions)]
                self.check_passes(below - 1, &frame);
                below -= 1;
            }
        }
        match below.checked_sub(1) {
            None => {
                if let Kind::Response { id } = frame.kind() {
                    let Shared { requests, sessions, .. } = &mut self.shared;
                    if requests.was_answered(id) {
                        // A layer answered a request the client has had its answer to (a hold's deadline that
                        // ran after the agent was gone, say): the client gets one answer.
                        return tracing::warn!("a second answer to a request of the client's; dropped");
                    }
                    sessions.closed(id, requests.get(id).and_then(Request::session));
                    requests.closed(id);
                }
                exits.to_client.push(frame)
            }
            Some(at) => {
                if let Kind::Response { id } = frame.kind() {
                    self.shared.requests.reached(id, at);
                }
                self.call(at, exits, |l, cx| l.agent_frame(frame, cx))
            }
        }
    }

    /// How far a streamed chunk goes up from layer `below` before a layer reads it (0: to the client): past the
    /// layers that pass it, without asking those whose word for its session and kind is kept.
    fn past_for_chunk(&mut self, mut below: usize, chunk: &Frame) -> usize {
        loop {
            let next = self.passing.next_to_ask(below);
            #[cfg(debug_assertions)]
            for at in (next.map_or(0, |at| at + 1)..below).rev() {
                self.check_kept(at, chunk);
            }
            let Some(at) = next else { return 0 };
            match self.layers[at].passes_chunk(chunk) {
                Passes::No => return at + 1,
                Passes::Yes => {}
                Passes::BySession => self.passing.keep(at),
            }
            #[cfg(debug_assertions)]
            self.check_passes(at, chunk);
            below = at;
        }
    }

    /// Debug builds: layer `at` passes chunks of `frame`'s session and kind by its state, as it said; asks it
    /// of this one, and calls it to see that it only passes it on.
    #[cfg(debug_assertions)]
    fn check_kept(&mut self, at: usize, frame: &Frame) {
        let name = self.layers[at].name();
        assert!(
            self.layers[at].passes_agent_frame(frame),
            "{name} said it passes chunks by their session, but not this one"
        );
        self.check_passes(at, frame);
    }

    /// Debug builds: layer `at` said it would only pass `frame` on; calls it to see that it does.
    #[cfg(debug_assertions)]
    fn check_passes(&mut self, at: usize, frame: &Frame) {
        let mut cx = Cx { out: Vec::new(), now: self.now, wall: self.wall, stack: Some((&mut self.shared, at)) };
        self.layers[at].agent_frame(frame.clone(), &mut cx);
        let passed = matches!(cx.out.as_slice(), [Out::ToClient(f)] if f == frame);
        assert!(passed, "{} said it passes a frame on but did otherwise", self.layers[at].name());
    }

    /// Hands layer `at` one input with a context whose buffer comes from the pool (no allocation per frame
    /// and layer), then sends on what it asked for.
    fn call(&mut self, at: usize, exits: &mut Exits, input: impl FnOnce(&mut dyn AnyLayer, &mut Cx)) {
        self.passing.calling(at);
        let stack = Some((&mut self.shared, at));
        let mut cx = Cx { out: self.spare.pop().unwrap_or_default(), now: self.now, wall: self.wall, stack };
        input(&mut *self.layers[at], &mut cx);
        let outs = cx.out;
        self.emit(at, outs, exits);
    }

    fn emit(&mut self, at: usize, mut outs: Vec<Out>, exits: &mut Exits) {
        // In the order asked for, popped from the back (cheaper than a drain on the per-frame path).
        outs.reverse();
        while let Some(out) = outs.pop() {
            match out {
                Out::ToAgent(frame) => self.down(at + 1, frame, exits),
                Out::ToClient(frame) => self.up(at, frame, exits),
                Out::Work(job, layer_type) => {
                    if layer_type != self.layers[at].layer_type() {
                        misrouted("a job", "its own type as the job's layer", self.layers[at].name());
                        continue;
                    }
                    self.jobs.push(job);
                }
                Out::Request { method, params, tag, on_behalf } => {
                    if (*tag).type_id() != self.layers[at].reply_type() {
                        misrouted("a request tag", "its Reply type", self.layers[at].name());
                        continue;
                    }
                    self.next_own += 1;
                    let id = format!("{}{}", self.own_prefix, self.next_own);
                    self.shared.sessions.own_sent(&Id::string(&id), &method, &params);
                    self.own.insert(Id::string(&id), Own { layer: at, tag, on_behalf });
                    let frame = Frame::from_value(&serde_json::json!({
                        "jsonrpc": "2.0", "id": id, "method": method, "params": params
                    }));
                    self.down(at + 1, frame, exits);
                }
            }
        }
        self.spare.push(outs);
    }
}

/// Lets code outside the relay loop (a file watcher, a probe) hand events to one layer, in order with
/// the frames the loop handles. Typed by the layer it was made for ([`Layers::add`]).
pub struct EventSender<E> {
    layer: usize,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Event)>,
    _event: PhantomData<fn(E)>,
}

impl<E> Clone for EventSender<E> {
    fn clone(&self) -> Self {
        EventSender { layer: self.layer, tx: self.tx.clone(), _event: PhantomData }
    }
}

impl<E: Send + 'static> EventSender<E> {
    /// Queues an event; false once the relay has stopped.
    pub fn send(&self, event: E) -> bool {
        self.tx.send((self.layer, Box::new(event))).is_ok()
    }
}

/// The layer index a [`Broadcast`] queues its events with: every layer that takes their type.
const EVERY: usize = usize::MAX;

/// An event on its way to every layer that takes its type, with how to copy it for each.
struct Fanout {
    value: Box<dyn Any + Send>,
    event_type: TypeId,
    copy: fn(&(dyn Any + Send)) -> Event,
}

/// Hands each event to every layer of the stack whose [`Layer::Event`] is `E`, in stack order (nearest the
/// client first), as one input of the relay, in order with the frames: for a source several layers read (a
/// server's event stream), so that no set-up fans events out by hand. Made by [`Layers::broadcast`].
pub struct Broadcast<E> {
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Event)>,
    _event: PhantomData<fn(E)>,
}

impl<E> Clone for Broadcast<E> {
    fn clone(&self) -> Self {
        Broadcast { tx: self.tx.clone(), _event: PhantomData }
    }
}

impl<E: Clone + Send + 'static> Broadcast<E> {
    /// Queues an event for every layer that takes `E`; false once the relay has stopped.
    pub fn send(&self, event: E) -> bool {
        fn copy<E: Clone + Send + 'static>(value: &(dyn Any + Send)) -> Event {
            Box::new(value.downcast_ref::<E>().expect("a fanout holds its own type").clone())
        }
        let fanout = Fanout { value: Box::new(event), event_type: TypeId::of::<E>(), copy: copy::<E> };
        self.tx.send((EVERY, Box::new(fanout))).is_ok()
    }

    /// Whether the relay has stopped (what is sent then goes nowhere).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Builds a stack, nearest the client first, and gives each layer a sender of its own event type.
pub struct Layers {
    layers: Vec<Box<dyn AnyLayer>>,
    events: tokio::sync::mpsc::UnboundedSender<(usize, Event)>,
}

impl Layers {
    /// No layers yet, and the queue their events come in on (the relay's, or a harness's).
    pub fn new() -> (Layers, tokio::sync::mpsc::UnboundedReceiver<(usize, Event)>) {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        (Layers { layers: Vec::new(), events }, rx)
    }

    /// Adds a layer below the ones added so far; `make` gets the sender of the layer's own events.
    pub fn add<L: Layer>(&mut self, make: impl FnOnce(EventSender<L::Event>) -> Box<L>) {
        let sender = EventSender { layer: self.layers.len(), tx: self.events.clone(), _event: PhantomData };
        let layer: Box<dyn AnyLayer> = make(sender);
        self.layers.push(layer);
    }

    /// Adds a layer that takes no events below the ones added so far.
    pub fn push(&mut self, layer: Box<dyn AnyLayer>) {
        self.layers.push(layer);
    }

    /// A sender of events of type `E` to every layer of the stack that takes them ([`Broadcast`]).
    pub fn broadcast<E: Clone + Send + 'static>(&self) -> Broadcast<E> {
        Broadcast { tx: self.events.clone(), _event: PhantomData }
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    pub fn stack(self) -> Stack {
        Stack::new(self.layers)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Harness, WALL_START_SECS, loud_error};
    use super::*;
    use crate::HashSet;
    use serde_json::json;
    use std::convert::Infallible;

    /// Answers `ping` itself, asks the agent `probe` on `ask`, and reports the reply to the client.
    struct Pinger;
    impl Layer for Pinger {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = u64;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if f.is_request("ping") {
                cx.to_client(crate::frame::result_response(f.id().unwrap(), "pong".into()));
            } else if f.is_notification("ask") {
                cx.request("probe", json!({}), 9u64);
            } else {
                cx.to_agent(f);
            }
        }
        fn on_reply(&mut self, tag: u64, reply: Frame, cx: &mut Cx) {
            cx.to_client(crate::frame::notification("answered", json!({"tag": tag, "len": reply.bytes().len()})));
        }
    }

    #[test]
    fn frames_walk_the_stack_and_own_requests_come_back() {
        let mut h = Harness::new(vec![Box::new(Pinger), Box::new(Pinger)]);
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"ping"}));
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":1,"result":"pong"})]);
        assert!(h.to_agent().is_empty());

        let passthrough = r#"{"jsonrpc":"2.0","method":"other"}"#;
        h.client_frame(Frame::parse(passthrough.as_bytes().to_vec()).unwrap());
        assert_eq!(h.take().to_agent[0].bytes(), passthrough.as_bytes());

        h.from_client(json!({"jsonrpc":"2.0","method":"ask"}));
        let probe = h.to_agent().pop().unwrap();
        assert_eq!(probe["method"], "probe");
        let id = Id::string(probe["id"].as_str().unwrap());
        assert!(h.stack().is_own(&id));

        h.from_agent(json!({"jsonrpc":"2.0","id": probe["id"],"result":{}}));
        assert!(h.to_agent().is_empty());
        let answered = h.to_client();
        assert_eq!(answered.len(), 1);
        assert_eq!(answered[0]["method"], "answered");
        assert_eq!(answered[0]["params"]["tag"], 9);
    }

    /// Says it passes every notification on, but drops those named `drop`.
    struct Liar;
    impl Layer for Liar {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            if !f.is_notification("drop") {
                cx.to_client(f);
            }
        }
        fn passes_from_agent(&self, f: &Frame) -> bool {
            matches!(f.kind(), Kind::Notification { .. })
        }
    }

    #[test]
    fn layers_that_pass_a_frame_are_skipped_and_what_they_say_is_checked() {
        let mut h = Harness::new(vec![Box::new(Pinger), Box::new(Liar)]);
        h.from_agent(json!({"jsonrpc":"2.0","method":"keep"}));
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","method":"keep"})]);
        h.from_client(json!({"jsonrpc":"2.0","id":4,"method":"m"}));
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"result":{}}));
        assert_eq!(h.to_client().len(), 1, "an answer is not said to pass: the layer sees it");
        // Debug builds call the layer anyway and see that it did not pass the frame on.
        if cfg!(debug_assertions) {
            let lied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                h.from_agent(json!({"jsonrpc":"2.0","method":"drop"}));
            }));
            assert!(lied.is_err(), "a layer that said it passes a frame but dropped it is caught");
        }
    }

    /// Reads the streamed chunks of the sessions it watches (of thoughts too when `thoughts`), saying `seen`
    /// before passing each on; watches a session on Coda's `watch`, stops on `unwatch`, and takes a session to
    /// watch as an event. Passes every other chunk by its state and says so; counts how often it is asked.
    #[derive(Default)]
    struct Watcher {
        watched: HashSet<String>,
        thoughts: bool,
        asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }
    impl Watcher {
        fn reads(&self, f: &Frame) -> bool {
            let watched = f.session().is_some_and(|s| self.watched.contains(&*s));
            f.is_streamed_chunk() && watched && (self.thoughts || f.session_update() == Some("agent_message_chunk"))
        }
    }
    impl Layer for Watcher {
        type Timer = Infallible;
        type Event = String;
        type Reply = Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            let session = f.value()["params"]["session"].as_str().unwrap_or_default().to_owned();
            match f.method() {
                Some("watch") => drop(self.watched.insert(session)),
                Some("unwatch") => drop(self.watched.remove(&session)),
                Some("thoughts") => self.thoughts = true,
                _ => cx.to_agent(f),
            }
        }
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            if self.reads(&f) {
                cx.to_client(crate::frame::notification("seen", json!({"session": f.session()})));
            }
            cx.to_client(f);
        }
        fn passes_from_agent(&self, f: &Frame) -> bool {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            !self.reads(f)
        }
        fn chunks_pass_by_session(&self) -> bool {
            true
        }
        fn on_event(&mut self, session: String, _cx: &mut Cx) {
            self.watched.insert(session);
        }
    }

    /// Passes every frame on and says so (that it does by its state when `by_session`, else it is asked of
    /// every chunk); counts how often it is asked, and the frames it is handed all the same.
    #[derive(Default)]
    struct Passer {
        by_session: bool,
        asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        handed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }
    impl Passer {
        fn by_session() -> Passer {
            Passer { by_session: true, ..Passer::default() }
        }
    }
    impl Layer for Passer {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            self.handed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            cx.to_client(f);
        }
        fn passes_from_agent(&self, _f: &Frame) -> bool {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            true
        }
        fn chunks_pass_by_session(&self) -> bool {
            self.by_session
        }
    }

    /// The stack keeps a layer's word that it passes a session's chunks by its state only until the session,
    /// the kind of chunk or the layer's state may have changed: a chunk after any of those reaches a layer
    /// that now reads it, whatever came before (a frame from Coda, an event, a chunk of another session, a
    /// thought after a message, the same session written with an escape). A layer that did not say so is asked
    /// of every chunk; the layers whose word is kept are passed, and the chunk is handed to the one that reads
    /// it, never to one of them.
    #[test]
    fn a_layers_word_on_a_sessions_chunks_is_kept_only_while_nothing_can_have_changed_it() {
        let (watcher, counted, near, far) =
            (Watcher::default(), Passer::default(), Passer::by_session(), Passer::by_session());
        let (asked, counted_asked) = (watcher.asked.clone(), counted.asked.clone());
        let handed = [near.handed.clone(), far.handed.clone()];
        let mut h = Harness::new(vec![Box::new(watcher), Box::new(near), Box::new(counted), Box::new(far)]);
        let chunk = |session: &str, kind: &str| {
            let text = r"第一段\n## Markdown\n- 多行 \u00e9";
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"{kind}","content":{{"type":"text","text":"{text}"}}}},"_meta":{{"t":1}}}}}}"#
            )
        };
        let seen = |h: &mut Harness, line: String| -> usize {
            h.agent_frame(Frame::parse(line.clone().into_bytes()).unwrap());
            let out = h.take().to_client;
            assert_eq!(out.last().map(|f| f.bytes().to_vec()), Some(line.into_bytes()), "the chunk goes on");
            out.iter().filter(|f| f.is_notification("seen")).count()
        };
        let message = "agent_message_chunk";
        let mut chunks = 0;
        let mut see = |h: &mut Harness, session: &str, kind: &str| {
            chunks += 1;
            seen(h, chunk(session, kind))
        };
        for _ in 0..5 {
            assert_eq!(see(&mut h, "s1", message), 0);
        }
        let watch = |h: &mut Harness, m: &str, s: &str| {
            h.from_client(json!({"jsonrpc":"2.0","method":m,"params":{"session":s}}))
        };
        watch(&mut h, "watch", "s1");
        assert_eq!(see(&mut h, "s1", message), 1, "a frame from Coda changed the layer's mind");
        assert_eq!(see(&mut h, r"s\u0031", message), 1, "the same session, escaped");
        watch(&mut h, "unwatch", "s1");
        assert_eq!(see(&mut h, "s1", message), 0);
        assert_eq!(see(&mut h, "s2", message), 0);
        assert_eq!(see(&mut h, "s2", message), 0);
        h.event(0, "s2".to_owned());
        assert_eq!(see(&mut h, "s2", message), 1, "an event changed the layer's mind");
        assert_eq!(see(&mut h, "s1", message), 0);
        assert_eq!(see(&mut h, "s2", message), 1, "another session's chunk came between");
        watch(&mut h, "unwatch", "s2");
        watch(&mut h, "watch", "s3");
        assert_eq!(see(&mut h, "s3", "agent_thought_chunk"), 0);
        watch(&mut h, "thoughts", "");
        assert_eq!(see(&mut h, "s3", message), 1);
        assert_eq!(see(&mut h, "s3", "agent_thought_chunk"), 1, "a thought after a message");
        assert_eq!(see(&mut h, "s4", "agent_thought_chunk"), 0);
        // The layer that said nothing of chunks was asked of each; the watcher once per session, kind and
        // state it passed (debug builds ask it of every chunk again, and check the answer kept).
        let n = chunks;
        assert_eq!(counted_asked.load(std::sync::atomic::Ordering::Relaxed), n);
        let asked = asked.load(std::sync::atomic::Ordering::Relaxed);
        if cfg!(debug_assertions) {
            assert_eq!(asked, n);
        } else {
            assert!(asked < n - 3, "asked {asked} times for {n} chunks");
        }
        // A layer that passes every chunk is handed none (debug builds hand it each, to check that it passes it).
        for handed in handed {
            assert_eq!(handed.load(std::sync::atomic::Ordering::Relaxed), if cfg!(debug_assertions) { n } else { 0 });
        }
    }

    /// A stack deeper than the 64 layers whose word is kept in one bit each: the layers past the 64th are
    /// asked of every chunk, the others passed by their word, and a chunk still reaches each layer that reads
    /// it, at the bottom and at the top.
    #[test]
    fn a_stack_deeper_than_the_kept_words_asks_the_layers_past_them() {
        let (bottom, top) = (Watcher::default(), Watcher::default());
        let asked = [bottom.asked.clone(), top.asked.clone()];
        let (mut layers, mut counts): (Vec<Box<dyn AnyLayer>>, Vec<_>) = (vec![Box::new(bottom)], Vec::new());
        for _ in 0..68 {
            let still = Passer::by_session();
            counts.push(still.handed.clone());
            layers.push(Box::new(still));
        }
        layers.push(Box::new(top));
        let mut h = Harness::new(layers);
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"多行\n- x"}}}}"#;
        let seen = |h: &mut Harness| {
            h.agent_frame(Frame::parse(chunk.as_bytes().to_vec()).unwrap());
            let out = h.take().to_client;
            assert_eq!(out.last().map(|f| f.bytes()), Some(chunk.as_bytes()), "the chunk goes on");
            out.iter().filter(|f| f.is_notification("seen")).count()
        };
        assert_eq!((seen(&mut h), seen(&mut h)), (0, 0));
        h.event(69, "s".to_owned());
        assert_eq!((seen(&mut h), seen(&mut h)), (1, 1), "the top layer reads them");
        h.event(0, "s".to_owned());
        assert_eq!(seen(&mut h), 2, "and the bottom one");
        let load = |n: &std::sync::Arc<std::sync::atomic::AtomicUsize>| n.load(std::sync::atomic::Ordering::Relaxed);
        // The top layer, past the 64th, is asked of every chunk; the bottom one of the first chunk, of the last
        // (an event called it), and of the three notes the top one sent (no chunks: no word is kept for them).
        // Debug builds ask each layer of every frame, and hand it each.
        assert_eq!(load(&asked[1]), 5);
        assert_eq!(load(&asked[0]), if cfg!(debug_assertions) { 8 } else { 5 });
        for count in counts {
            assert_eq!(load(&count), if cfg!(debug_assertions) { 8 } else { 0 });
        }
    }

    /// Asks for wake-ups on `after` / `cancel` notifications (passing `after` on when `pass`); reports each
    /// wake-up with its layer's name and the time it was handed, in milliseconds since the first input.
    struct Sleeper {
        name: &'static str,
        pass: bool,
        base: Option<Instant>,
    }
    fn sleeper(name: &'static str, pass: bool) -> Box<dyn AnyLayer> {
        Box::new(Sleeper { name, pass, base: None })
    }
    impl Layer for Sleeper {
        type Timer = u64;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            self.base.get_or_insert(cx.now());
            let v = f.value();
            let token = v["params"]["token"].as_u64().unwrap_or(0);
            match f.method() {
                Some("after") => {
                    cx.after(Duration::from_millis(v["params"]["ms"].as_u64().unwrap()), token);
                    if self.pass {
                        cx.to_agent(f);
                    }
                }
                Some("cancel") => cx.cancel(&token),
                _ => cx.to_agent(f),
            }
        }
        fn on_timer(&mut self, token: u64, cx: &mut Cx) {
            let at = cx.now().duration_since(self.base.unwrap()).as_millis() as u64;
            let wall = cx.wall().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
            let params = json!({"layer": self.name, "token": token, "at": at, "wall": wall});
            cx.to_client(crate::frame::notification("woke", params));
            if token == 99 {
                // Asks again at once: waits for the next call of wake_due.
                cx.after(Duration::ZERO, 99u64);
            }
        }
    }

    /// A Sleeper below a Pinger (what it emits walks the layer above it).
    fn sleeping() -> Harness {
        Harness::new(vec![Box::new(Pinger), sleeper("low", false)])
    }

    fn ask(h: &mut Harness, method: &str, token: u64, ms: u64) {
        h.from_client(json!({"jsonrpc":"2.0","method":method,"params":{"token":token,"ms":ms}}));
    }

    /// Moves the clock to `ms` after the start; (token, ms since the start, ms of wall time since the harness's
    /// start) of each wake-up that ran.
    fn at(h: &mut Harness, ms: u64) -> Vec<(u64, u64, u64)> {
        h.advance(Duration::from_millis(ms) - h.elapsed());
        assert!(h.to_agent().is_empty());
        h.to_client()
            .iter()
            .map(|v| {
                let p = &v["params"];
                let wall = p["wall"].as_u64().unwrap() - WALL_START_SECS * 1000;
                (p["token"].as_u64().unwrap(), p["at"].as_u64().unwrap(), wall)
            })
            .collect()
    }

    #[test]
    fn wake_ups_fire_in_deadline_order_with_the_time_set() {
        let mut h = sleeping();
        assert_eq!(h.next_wake(), None);
        ask(&mut h, "after", 3, 30);
        ask(&mut h, "after", 1, 10);
        ask(&mut h, "after", 2, 20);
        ask(&mut h, "after", 4, 20);
        assert_eq!(h.next_wake(), Some(Duration::from_millis(10)));
        assert_eq!(at(&mut h, 9), vec![], "nothing is due before its deadline");
        // Late: every due wake-up runs, earliest first (equal deadlines in the order asked), with the time set.
        assert_eq!(at(&mut h, 25), vec![(1, 25, 25), (2, 25, 25), (4, 25, 25)]);
        assert_eq!(h.next_wake(), Some(Duration::from_millis(5)));
        assert_eq!(at(&mut h, 30), vec![(3, 30, 30)]);
        assert_eq!(h.next_wake(), None);
        assert_eq!(at(&mut h, 100), vec![], "each wake-up runs once");
    }

    #[test]
    fn asking_again_for_a_token_replaces_its_wake_up() {
        let mut h = sleeping();
        ask(&mut h, "after", 5, 10);
        assert_eq!(at(&mut h, 5), vec![]);
        ask(&mut h, "after", 5, 50);
        // The delay counts from the time handed with the input that asked.
        assert_eq!(h.next_wake(), Some(Duration::from_millis(50)));
        assert_eq!(at(&mut h, 20), vec![]);
        assert_eq!(at(&mut h, 55), vec![(5, 55, 55)]);
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn cancel_forgets_a_wake_up_and_is_a_no_op_without_one() {
        let mut h = sleeping();
        ask(&mut h, "cancel", 8, 0);
        ask(&mut h, "after", 7, 10);
        ask(&mut h, "after", 8, 10);
        ask(&mut h, "cancel", 7, 0);
        assert_eq!(at(&mut h, 10), vec![(8, 10, 10)]);
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn a_wake_up_asked_for_while_waking_waits_for_the_next_call() {
        let mut h = sleeping();
        ask(&mut h, "after", 99, 0);
        assert_eq!(at(&mut h, 0), vec![(99, 0, 0)]);
        assert_eq!(h.next_wake(), Some(Duration::ZERO), "asked again, due at once");
        assert_eq!(at(&mut h, 1), vec![(99, 1, 1)]);
    }

    #[test]
    fn at_the_end_every_wake_up_runs_at_once_in_deadline_order_and_one_that_keeps_asking_is_bounded() {
        let mut h = sleeping();
        ask(&mut h, "after", 3, 600_000);
        ask(&mut h, "after", 1, 10);
        ask(&mut h, "after", 99, 20);
        assert_eq!(at(&mut h, 5), vec![]);
        h.end();
        let woke: Vec<u64> = h.to_client().iter().map(|v| v["params"]["token"].as_u64().unwrap()).collect();
        // 99 asks again each time it runs: once per round.
        let mut want = vec![1, 99, 3];
        want.extend(std::iter::repeat_n(99, END_ROUNDS - 1));
        assert_eq!(woke, want, "all of them, the clock unmoved, then 99 for the rounds left");
        assert_eq!(h.elapsed(), Duration::from_millis(5));
    }

    #[test]
    fn wake_ups_are_per_layer_and_a_huge_delay_is_no_panic() {
        let mut h = Harness::new(vec![sleeper("high", true), sleeper("low", false)]);
        // Both layers ask for token 1; only the upper one cancels it.
        ask(&mut h, "after", 1, 10);
        ask(&mut h, "cancel", 1, 0);
        ask(&mut h, "after", 2, u64::MAX);
        h.advance(Duration::from_millis(10));
        let woke = h.to_client();
        assert_eq!(woke.len(), 1);
        assert_eq!((&woke[0]["params"]["layer"], &woke[0]["params"]["token"]), (&json!("low"), &json!(1)));
        // Some 584 million years: far, but an instant all the same (one past the end of time is no wake-up).
        assert_eq!(h.next_wake(), Some(Duration::from_millis(u64::MAX - 10)));
    }

    /// Asks for a wake-up at once, then replaces it with one past the end of time.
    struct Never;
    impl Layer for Never {
        type Timer = u8;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, _: Frame, cx: &mut Cx) {
            cx.after(Duration::ZERO, 1u8);
            cx.after(Duration::MAX, 1u8);
        }
        fn on_timer(&mut self, _: u8, cx: &mut Cx) {
            cx.to_client(crate::frame::notification("woke", json!({})));
        }
    }

    #[test]
    fn a_wake_up_past_the_end_of_time_never_comes_and_forgets_the_earlier_one() {
        let mut h = Harness::of(Never);
        h.from_client(json!({"jsonrpc":"2.0","method":"x"}));
        assert_eq!(h.next_wake(), None);
        h.advance(Duration::from_secs(1));
        assert!(h.to_client().is_empty());
    }

    /// An event handed to a layer through the harness reaches its `on_event`.
    struct Echo;
    impl Layer for Echo {
        type Timer = Infallible;
        type Event = u32;
        type Reply = Infallible;
        fn on_event(&mut self, n: u32, cx: &mut Cx) {
            cx.to_agent(crate::frame::notification("event", json!({"n": n})));
        }
    }

    #[test]
    fn events_reach_their_layer() {
        let mut h = Harness::new(vec![Box::new(Echo), Box::new(Echo)]);
        h.event(1, 7u32);
        assert_eq!(h.to_agent(), vec![json!({"jsonrpc":"2.0","method":"event","params":{"n":7}})]);
    }

    /// Two kinds of wake-up that carry the same count.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    enum Tick {
        Quiet(u64),
        Idle(u64),
    }
    struct Ticks;
    impl Layer for Ticks {
        type Timer = Tick;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, _: Frame, cx: &mut Cx) {
            cx.after(Duration::from_millis(10), Tick::Quiet(1));
            cx.after(Duration::from_millis(20), Tick::Idle(1));
            cx.after(Duration::from_millis(30), Tick::Idle(1 << 62));
            cx.cancel(&Tick::Quiet(1 << 62));
        }
        fn on_timer(&mut self, t: Tick, cx: &mut Cx) {
            cx.to_client(crate::frame::notification("woke", json!(format!("{t:?}"))));
        }
    }

    #[test]
    fn a_layer_gets_back_the_timer_value_it_asked_with() {
        let mut h = Harness::of(Ticks);
        h.from_client(json!({"jsonrpc":"2.0","method":"x"}));
        h.advance(Duration::from_millis(30));
        let woke: Vec<Value> = h.to_client().iter().map(|v| v["params"].clone()).collect();
        assert_eq!(woke, [json!("Quiet(1)"), json!("Idle(1)"), json!("Idle(4611686018427387904)")]);
    }

    #[test]
    fn a_broadcast_reaches_every_layer_of_its_type_in_stack_order() {
        let mut h = Harness::build(|layers| {
            layers.add(|_| Box::new(Echo));
            layers.push(Box::new(Pinger));
            layers.add(|_| Box::new(Echo));
            let bus = layers.broadcast::<u32>();
            assert!(bus.send(3));
            assert!(layers.broadcast::<u64>().send(4), "one nobody takes reaches nobody");
        });
        h.deliver();
        let out = h.to_agent();
        assert_eq!(out, vec![json!({"jsonrpc":"2.0","method":"event","params":{"n":3}}); 2]);
    }

    #[test]
    fn an_event_of_the_wrong_type_is_a_loud_error() {
        let mut h = Harness::new(vec![Box::new(Echo)]);
        // A release build logs it and drops the event: the layer never sees it.
        if loud_error("an event of the wrong type reached", || h.event(0, 7u64)).is_some() {
            assert!(h.to_client().is_empty() && h.to_agent().is_empty());
        }
    }

    #[test]
    fn a_timer_of_the_wrong_type_is_a_loud_error() {
        // Outside a stack nothing is checked (or kept); inside, the layer's own type only.
        Cx::default().after(Duration::ZERO, 1i32);
        struct Wrong;
        impl Layer for Wrong {
            type Timer = u64;
            type Event = Infallible;
            type Reply = Infallible;
            fn from_client(&mut self, _: Frame, cx: &mut Cx) {
                cx.after(Duration::ZERO, 1i32);
            }
        }
        let mut h = Harness::of(Wrong);
        // A release build logs it and keeps no wake-up.
        if loud_error("a timer of the wrong type reached", || h.from_client(json!({"jsonrpc":"2.0","method":"x"})))
            .is_some()
        {
            assert_eq!(h.next_wake(), None);
        }
    }

    #[test]
    fn an_event_for_no_layer_is_a_loud_error() {
        let mut h = Harness::new(vec![Box::new(Echo)]);
        if loud_error("an event of the wrong type reached the stack", || h.event(5, 8u32)).is_some() {
            assert!(h.to_client().is_empty() && h.to_agent().is_empty());
        }
    }

    /// Reports what the session table says of `params.sessionId` on `look`; asks the agent `own` for it.
    struct Looker;
    impl Layer for Looker {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = ();
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            let session = f.value()["params"]["sessionId"].as_str().unwrap_or_default().to_owned();
            match f.method() {
                Some("look") => {
                    let s = cx.session(&session);
                    let about = json!({"root": s.is_some_and(Session::is_root), "child": s.is_some_and(|s| !s.is_root()),
                        "turn": format!("{:?}", cx.turn(&session)), "started": s.is_some_and(Session::started)});
                    cx.to_client(crate::frame::notification("about", about));
                }
                Some("own") => cx.request("session/prompt", json!({"sessionId": session}), ()),
                Some("busy") => {
                    if let Some(s) = cx.session_mut(&session) {
                        s.set_busy(f.value()["params"]["busy"] == true);
                    }
                }
                Some("child") => cx.add_child(&session, Some("r")),
                _ => cx.to_agent(f),
            }
        }
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            // The table knows a session before any layer handles the answer that opened it.
            if let Some(id) = f.value()["result"]["sessionId"].as_str() {
                assert!(cx.session(id).is_some_and(Session::is_root));
            }
            cx.to_client(f)
        }
        fn on_reply(&mut self, _: (), reply: Frame, cx: &mut Cx) {
            cx.to_client(crate::frame::notification("replied", reply.value()["result"].clone()));
        }
    }

    fn look(h: &mut Harness, session: &str) -> Value {
        h.from_client(json!({"jsonrpc":"2.0","method":"look","params":{"sessionId":session}}));
        h.to_client().pop().expect("an answer")["params"].clone()
    }

    #[test]
    fn the_session_table_knows_roots_children_and_whose_turn_runs() {
        let mut h = Harness::of(Looker);
        assert_eq!(look(&mut h, "r"), json!({"root":false,"child":false,"turn":"None","started":false}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"r"}}));
        h.to_client();
        assert_eq!(look(&mut h, "r"), json!({"root":true,"child":false,"turn":"None","started":false}));
        h.from_client(json!({"jsonrpc":"2.0","method":"child","params":{"sessionId":"c"}}));
        assert_eq!(look(&mut h, "c")["child"], true);
        // The CLI's own turn, then Coda's prompt: busy from before the prompt is no start of it.
        h.from_client(json!({"jsonrpc":"2.0","method":"busy","params":{"sessionId":"r","busy":true}}));
        assert_eq!(look(&mut h, "r")["turn"], "Some(Cli)");
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"r"}}));
        assert_eq!(
            look(&mut h, "r"),
            json!({"root":true,"child":false,"turn":"Some(Coda { prompt: Id(\"2\"), sent: true })","started":false})
        );
        h.from_client(json!({"jsonrpc":"2.0","method":"busy","params":{"sessionId":"r","busy":true}}));
        assert_eq!(look(&mut h, "r")["started"], true);
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        h.from_client(json!({"jsonrpc":"2.0","method":"busy","params":{"sessionId":"r","busy":false}}));
        // The shim's own request about the session is a turn of the shim's while the agent owes its answer.
        h.from_client(json!({"jsonrpc":"2.0","method":"own","params":{"sessionId":"r"}}));
        let own = h.to_agent().pop().expect("the shim's request");
        assert_eq!(look(&mut h, "r")["turn"], "Some(Shim { method: \"session/prompt\" })");
        h.from_agent(json!({"jsonrpc":"2.0","id":own["id"],"result":{"n":1}}));
        assert_eq!(h.to_client()[0]["method"], "replied");
        assert_eq!(look(&mut h, "r")["turn"], "None");
        // Answered twice: the second answer is nobody's, and Coda never sees it.
        h.from_agent(json!({"jsonrpc":"2.0","id":own["id"],"result":{"n":2}}));
        assert!(h.to_client().is_empty());
        // Closed: forgotten.
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/close","params":{"sessionId":"r"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":{}}));
        assert_eq!(look(&mut h, "r")["root"], false);
    }

    /// Answers every request itself, twice.
    struct Twice;
    impl Layer for Twice {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if let Some(id) = f.id() {
                for n in [1, 2] {
                    cx.to_client(crate::frame::result_response(id, json!({"n": n})));
                }
            }
        }
    }

    #[test]
    fn a_layers_second_answer_to_a_request_never_reaches_the_client() {
        let mut h = Harness::new(vec![Box::new(Twice)]);
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"x","params":{}}));
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":1,"result":{"n":1}})]);
        // A new request with the same id is answered again.
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"x","params":{}}));
        assert_eq!(h.to_client(), [json!({"jsonrpc":"2.0","id":1,"result":{"n":1}})]);
    }

    /// Tells the client, for each answer it passes, which request it answers; notes `Seen` on prompts.
    struct Asker;
    #[derive(Debug, PartialEq)]
    struct Seen(&'static str);
    impl Layer for Asker {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if let Some(id) = f.id().filter(|_| f.is_request("session/prompt")) {
                assert!(cx.note(id, Seen("below")));
            }
            cx.to_agent(f)
        }
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            let about = cx.answer_to(&f).map(|r| {
                let open: Vec<String> = cx.open_requests().map(|r| r.method.to_string()).collect();
                json!({"method": r.method.as_str(), "session": r.session(), "sent": r.is_sent(),
                    "answered": r.is_answered(), "note": r.note::<Seen>().map(|s| s.0), "open": open})
            });
            cx.to_client(f);
            if let Some(about) = about {
                cx.to_client(crate::frame::notification("about", about));
            }
        }
    }

    #[test]
    fn the_stack_records_each_request_once_and_layers_ask_it() {
        // The note is left by the lower layer and read by the upper one.
        let mut h = Harness::new(vec![Box::new(Asker), Box::new(Asker)]);
        h.from_client(
            json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s1","prompt":[]}}),
        );
        h.from_client(json!({"jsonrpc":"2.0","id":"n","method":"session/new","params":{"cwd":"/w"}}));
        assert_eq!(h.to_agent().len(), 2);
        assert_eq!(h.stack().owed(), vec![Id::from_json("1"), Id::string("n")], "in their order of arrival");
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        let out = h.to_client();
        assert_eq!(out.len(), 3, "{out:?}");
        let about = json!({"method":"session/prompt","session":"s1","sent":true,"answered":true,"note":"below",
            "open":["session/new"]});
        assert_eq!((&out[1]["params"], &out[2]["params"]), (&about, &about));
        assert_eq!(h.stack().owed(), vec![Id::string("n")]);
        // Answered to the client: forgotten. A second answer answers nothing Coda asks: dropped.
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        assert!(h.to_client().is_empty());
        assert!(h.stack().requests().get(&Id::from_json("1")).is_none());
        // Until Coda sends a request with that id again; an answer to an id Coda never sent passes.
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s1"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        assert_eq!(h.to_client().len(), 3);
        h.from_agent(json!({"jsonrpc":"2.0","id":77,"result":{}}));
        assert_eq!(h.to_client().len(), 1);
    }

    /// Holds the agent's answers until the client sends `release`.
    #[derive(Default)]
    struct Holder(Vec<Frame>);
    impl Layer for Holder {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if f.is_notification("release") {
                return self.0.drain(..).for_each(|a| cx.to_client(a));
            }
            cx.to_agent(f)
        }
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            match f.kind() {
                Kind::Response { .. } => self.0.push(f),
                _ => cx.to_client(f),
            }
        }
    }

    /// Answers `early` requests itself at once and still sends them on; says `late` when the agent's answer to
    /// one comes (it never does: that answer is a second one), and passes that answer on too.
    struct Early;
    impl Layer for Early {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            let early = f.id().filter(|_| f.is_request("early")).cloned();
            cx.to_agent(f);
            if let Some(id) = early {
                cx.to_client(crate::frame::result_response(&id, json!("early")));
            }
        }
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            if matches!(f.kind(), Kind::Response { .. }) && cx.answer_to(&f).is_none() {
                cx.to_client(crate::frame::notification("late", json!({})));
            }
            cx.to_client(f)
        }
    }

    #[test]
    fn the_agents_second_answer_never_reaches_the_client() {
        // Twice in a row: the second is dropped, the request forgotten once the first reached the client.
        let mut h = Harness::new(vec![Box::new(Pinger)]);
        h.from_client(json!({"jsonrpc":"2.0","id":"a","method":"m"}));
        h.from_agent(json!({"jsonrpc":"2.0","id":"a","result":1}));
        h.from_agent(json!({"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"again"}}));
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":"a","result":1})]);
        // The second while a layer still holds the first: dropped on arrival, the layers never see it.
        let mut h = Harness::new(vec![Box::new(Holder::default())]);
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"m"}));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":"first"}));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":"second"}));
        h.from_client(json!({"jsonrpc":"2.0","method":"release"}));
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":2,"result":"first"})]);
        assert!(h.stack().requests().get(&Id::from_json("2")).is_none());
        // A layer answered the client itself: the agent's answer after that is a second one, dropped on arrival.
        let mut h = Harness::new(vec![Box::new(Pinger), Box::new(Early)]);
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"early"}));
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":3,"result":"early"})]);
        assert_eq!(h.to_agent().len(), 1);
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"result":"from the agent"}));
        assert_eq!(h.to_client(), Vec::<Value>::new());
        // A layer that passes an answer on twice: the client gets it once, the second is dropped at the top.
        let mut h = Harness::new(vec![Box::new(Doubler)]);
        h.from_client(json!({"jsonrpc":"2.0","id":4,"method":"m"}));
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"result":"once"}));
        assert_eq!(h.to_client(), vec![json!({"jsonrpc":"2.0","id":4,"result":"once"})]);
        // An answer with id null (an agent's parse error) or an id the client never sent answers no request of
        // the client's: it still goes on.
        h.from_agent(json!({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":"never","result":{}}));
        assert_eq!(h.to_client().len(), 4, "each twice: neither answers a request the client had");
    }

    /// Passes every frame of the agent's on twice.
    struct Doubler;
    impl Layer for Doubler {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_agent(&mut self, f: Frame, cx: &mut Cx) {
            cx.to_client(f.clone());
            cx.to_client(f)
        }
    }

    #[test]
    fn a_request_with_the_id_of_one_still_open_is_refused_and_goes_no_further() {
        let mut h = Harness::new(vec![Box::new(Asker), Box::new(Holder::default())]);
        let prompt = json!({"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}});
        h.from_client(prompt.clone());
        assert_eq!(h.to_agent().len(), 1);
        // Same id, another method, spelled otherwise: refused at once, nothing reaches the agent or a layer.
        let again = r#"{"jsonrpc":"2.0","id":7.0,"method":"session/set_mode","params":{"sessionId":"s","modeId":"x"}}"#;
        h.client_frame(Frame::parse(again.as_bytes().to_vec()).unwrap());
        let out = h.take();
        assert!(out.to_agent.is_empty());
        assert_eq!(out.to_client.len(), 1);
        assert_eq!(
            out.to_client[0].bytes(),
            br#"{"jsonrpc":"2.0","id":7.0,"error":{"code":-32600,"message":"invalid request: id in use"}}"#
        );
        assert!(
            h.stack().requests().get(&Id::from_json("7")).is_some_and(|r| r.is("session/prompt")),
            "still the prompt"
        );
        // Answered by the agent but held by a layer: still open for the client, still in use.
        h.from_agent(json!({"jsonrpc":"2.0","id":7,"result":{"stopReason":"end_turn"}}));
        h.from_client(prompt.clone());
        assert_eq!(h.to_client()[0]["error"]["code"], -32600);
        assert!(h.to_agent().is_empty());
        h.from_client(json!({"jsonrpc":"2.0","method":"release"}));
        let released = h.to_client();
        assert_eq!(released[0], json!({"jsonrpc":"2.0","id":7,"result":{"stopReason":"end_turn"}}));
        // Answered to the client: the id is free again.
        h.from_client(prompt);
        assert_eq!(h.to_agent().len(), 1);
        assert!(h.to_client().is_empty());
        // Notifications and the client's answers carry no id of a request of its: never refused.
        h.from_client(json!({"jsonrpc":"2.0","id":7,"result":{}}));
        assert_eq!(h.to_agent().len(), 1);
    }

    #[test]
    fn the_sizes_count_open_requests_own_requests_and_wake_ups() {
        let mut h = Harness::new(vec![Box::new(Pinger), sleeper("low", false)]);
        let gauge = h.stack().gauge();
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"m"}));
        h.from_client(json!({"jsonrpc":"2.0","method":"ask"}));
        ask(&mut h, "after", 1, 10);
        ask(&mut h, "after", 2, 20);
        let want = Sizes { open_requests: 1, own_requests: 1, timers: 2 };
        assert_eq!((h.stack().sizes(), *gauge.lock().unwrap()), (want, want));
        let probe = h.to_agent().into_iter().find(|f| f["method"] == "probe").unwrap();
        h.from_agent(json!({"jsonrpc":"2.0","id":probe["id"],"result":{}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        h.advance(Duration::from_millis(20));
        let none = Sizes { open_requests: 0, own_requests: 0, timers: 0 };
        assert_eq!((h.stack().sizes(), *gauge.lock().unwrap()), (none, none));
    }

    #[test]
    fn a_request_with_the_id_of_one_of_the_shims_own_is_refused() {
        let mut h = Harness::new(vec![Box::new(Pinger)]);
        h.from_client(json!({"jsonrpc":"2.0","method":"ask"}));
        let probe = h.to_agent().pop().unwrap();
        h.from_client(json!({"jsonrpc":"2.0","id":probe["id"],"method":"m"}));
        assert!(h.to_agent().is_empty());
        assert_eq!(h.to_client()[0]["error"]["code"], -32600);
        // The agent's answer to the probe is still the layer's.
        h.from_agent(json!({"jsonrpc":"2.0","id":probe["id"],"result":{}}));
        assert_eq!(h.to_client()[0]["method"], "answered");
    }
}

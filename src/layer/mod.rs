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
//! layer's constructor). Threads that do real I/O (a file watcher, an event stream, a probe) hand their
//! results in through an [`EventSender`], in order with the frames. [`testing::Harness`] drives a stack by
//! hand, with a clock that moves only when the test says so.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::frame::{Frame, Id, Kind};
use crate::json;

pub mod testing;

/// Something other than a frame that reaches a layer: a file change, a probe's result, ...
pub type Event = Box<dyn Any + Send>;

pub trait Layer: Send {
    /// A frame travelling from the client towards the agent.
    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        cx.to_agent(frame);
    }

    /// A frame travelling from the agent towards the client.
    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        cx.to_client(frame);
    }

    /// The agent's answer to a request this layer sent with [`Cx::request`].
    fn on_reply(&mut self, _tag: u64, _reply: Frame, _cx: &mut Cx) {}

    /// An event sent to this layer through its [`EventSender`].
    fn on_event(&mut self, _event: Event, _cx: &mut Cx) {}

    /// A wake-up this layer asked for with [`Cx::after`].
    fn on_timer(&mut self, _token: u64, _cx: &mut Cx) {}
}

/// What a layer asks for while handling one input, and the time of that input.
pub struct Cx {
    out: Vec<Out>,
    now: Instant,
    wall: SystemTime,
}

/// A context outside any stack (a layer driven by hand): the time is read once, here; what the layer asks
/// for is dropped with the context.
impl Default for Cx {
    fn default() -> Cx {
        Cx { out: Vec::new(), now: Instant::now(), wall: SystemTime::now() }
    }
}

enum Out {
    ToAgent(Frame),
    ToClient(Frame),
    Request { method: String, params: Value, tag: u64 },
    After { at: Instant, token: u64 },
    Cancel { token: u64 },
}

impl Cx {
    /// The time the engine handed this input (monotonic). Layers never call `Instant::now()`.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Wall-clock time of the same moment (for file times, record stamps). Layers never call
    /// `SystemTime::now()`.
    pub fn wall(&self) -> SystemTime {
        self.wall
    }

    /// Calls this layer's [`Layer::on_timer`] with `token` once `delay` has passed. Asking again for the same
    /// token replaces the earlier wake-up: one pending wake-up per (layer, token).
    pub fn after(&mut self, delay: Duration, token: u64) {
        // A delay too long to add to an instant never comes: no wake-up.
        match self.now.checked_add(delay) {
            Some(at) => self.out.push(Out::After { at, token }),
            None => self.out.push(Out::Cancel { token }),
        }
    }

    /// Forgets a pending wake-up of this layer (no-op when there is none).
    pub fn cancel(&mut self, token: u64) {
        self.out.push(Out::Cancel { token });
    }

    /// Pass a frame on towards the agent.
    pub fn to_agent(&mut self, frame: Frame) {
        self.out.push(Out::ToAgent(frame));
    }

    /// Pass a frame on towards the client.
    pub fn to_client(&mut self, frame: Frame) {
        self.out.push(Out::ToClient(frame));
    }

    /// Handles a frame this layer must act on but cannot read ([`Frame::value`] failed), instead of passing
    /// it on untouched: a request is answered with an error where it came from, an answer becomes an error
    /// answer for the same request, a notification is dropped; each with a warning.
    pub fn unreadable(&mut self, frame: Frame, err: &json::Error, from_client: bool) {
        let (sender, receiver) = if from_client { ("client", "agent") } else { ("agent", "client") };
        match frame.kind() {
            Kind::Request { id, .. } => {
                tracing::warn!("the {sender} sent a request the shim cannot read ({err}); answered with an error");
                let msg = format!("invalid request: the shim cannot read it: {err}");
                let answer = crate::frame::error_response(id, -32600, &msg, None);
                if from_client { self.to_client(answer) } else { self.to_agent(answer) }
            }
            Kind::Response { id } => {
                tracing::warn!(
                    "the {sender} sent an answer the shim cannot read ({err}); the {receiver} gets an error"
                );
                let answer = unreadable_answer(id, err, sender);
                if from_client { self.to_agent(answer) } else { self.to_client(answer) }
            }
            Kind::Notification { .. } | Kind::Batch => {
                tracing::warn!("the {sender} sent a notification the shim cannot read ({err}); dropped");
            }
        }
    }

    /// Send a request of the shim's own to the agent. The reply comes back to this layer's
    /// [`Layer::on_reply`] with `tag`, and is never forwarded to the client.
    pub fn request(&mut self, method: &str, params: Value, tag: u64) {
        self.out.push(Out::Request { method: method.to_owned(), params, tag });
    }
}

/// What goes on in place of an answer (from `sender`) that a layer must act on but cannot read: an error
/// answer for the same request.
pub fn unreadable_answer(id: &Id, err: &json::Error, sender: &str) -> Frame {
    let msg = format!("the {sender}'s answer was dropped: the shim cannot read it: {err}");
    crate::frame::error_response(id, -32603, &msg, None)
}

/// The layers of one binary, and the shim's own outstanding requests.
pub struct Stack {
    layers: Vec<Box<dyn Layer>>,
    /// The shim's own requests to the agent: id -> (layer index, tag).
    own: HashMap<Id, (usize, u64)>,
    own_prefix: String,
    next_own: u64,
    /// Emptied output buffers, reused.
    spare: Vec<Vec<Out>>,
    /// The time handed to layers with the next inputs.
    now: Instant,
    wall: SystemTime,
    timers: Timers,
}

/// Pending wake-ups, by deadline and by (layer, token).
#[derive(Default)]
struct Timers {
    /// (deadline, order of asking) -> (layer, token): the order breaks ties between equal deadlines.
    queue: BTreeMap<(Instant, u64), (usize, u64)>,
    /// (layer, token) -> its key in `queue`.
    pending: HashMap<(usize, u64), (Instant, u64)>,
    asked: u64,
}

impl Timers {
    fn set(&mut self, layer: usize, token: u64, at: Instant) {
        self.cancel(layer, token);
        self.asked += 1;
        self.queue.insert((at, self.asked), (layer, token));
        self.pending.insert((layer, token), (at, self.asked));
    }

    fn cancel(&mut self, layer: usize, token: u64) {
        if let Some(key) = self.pending.remove(&(layer, token)) {
            self.queue.remove(&key);
        }
    }

    /// The earliest wake-up due at `now` and asked for before `asked_before`, taken out.
    fn pop_due(&mut self, now: Instant, asked_before: u64) -> Option<(usize, u64)> {
        let (&(at, asked), _) = self.queue.iter().find(|((_, asked), _)| *asked <= asked_before)?;
        if at > now {
            return None;
        }
        let (layer, token) = self.queue.remove(&(at, asked))?;
        self.pending.remove(&(layer, token));
        Some((layer, token))
    }
}

/// Where frames leave the stack.
#[derive(Debug, Default, PartialEq)]
pub struct Exits {
    pub to_agent: Vec<Frame>,
    pub to_client: Vec<Frame>,
}

impl Stack {
    pub fn new(layers: Vec<Box<dyn Layer>>) -> Stack {
        Stack {
            layers,
            own: HashMap::new(),
            own_prefix: format!("coda-shim-{}-", std::process::id()),
            next_own: 0,
            spare: Vec::new(),
            now: Instant::now(),
            wall: SystemTime::now(),
            timers: Timers::default(),
        }
    }

    /// Sets the time handed to layers with the next inputs (the relay calls it on each wake-up; tests by hand).
    pub fn set_time(&mut self, now: Instant, wall: SystemTime) {
        self.now = now;
        self.wall = wall;
    }

    /// The earliest pending wake-up.
    pub fn next_wake(&self) -> Option<Instant> {
        self.timers.queue.keys().next().map(|(at, _)| *at)
    }

    /// Runs every wake-up due at the current time (see [`Stack::set_time`]), in deadline order (equal
    /// deadlines in the order they were asked for). A wake-up asked for while these run waits for the next
    /// call, even when already due, so a layer that keeps asking cannot hold the stack here.
    pub fn wake_due(&mut self, exits: &mut Exits) {
        let asked_before = self.timers.asked;
        while let Some((layer, token)) = self.timers.pop_due(self.now, asked_before) {
            let mut cx = self.cx();
            self.layers[layer].on_timer(token, &mut cx);
            self.emit(layer, cx, exits);
        }
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// A frame read from the client.
    pub fn from_client(&mut self, frame: Frame, exits: &mut Exits) {
        self.down(0, frame, exits);
    }

    /// A frame read from the agent.
    pub fn from_agent(&mut self, frame: Frame, exits: &mut Exits) {
        if let Kind::Response { id } = frame.kind()
            && let Some((layer, tag)) = self.own.remove(id)
        {
            let mut cx = self.cx();
            self.layers[layer].on_reply(tag, frame, &mut cx);
            self.emit(layer, cx, exits);
            return;
        }
        self.up(self.layers.len(), frame, exits);
    }

    /// An event for layer `layer`.
    pub fn event(&mut self, layer: usize, event: Event, exits: &mut Exits) {
        if layer >= self.layers.len() {
            return;
        }
        let mut cx = self.cx();
        self.layers[layer].on_event(event, &mut cx);
        self.emit(layer, cx, exits);
    }

    /// Whether `id` names one of the shim's own requests.
    pub fn is_own(&self, id: &Id) -> bool {
        id.as_json().strip_prefix('"').is_some_and(|s| s.starts_with(&self.own_prefix))
    }

    /// Sends `frame` through layers `from..` towards the agent.
    fn down(&mut self, from: usize, frame: Frame, exits: &mut Exits) {
        if from == self.layers.len() {
            return exits.to_agent.push(frame);
        }
        let mut cx = self.cx();
        self.layers[from].from_client(frame, &mut cx);
        self.emit(from, cx, exits);
    }

    /// Sends `frame` through layers `..below` (nearest first) towards the client.
    fn up(&mut self, below: usize, frame: Frame, exits: &mut Exits) {
        match below.checked_sub(1) {
            None => exits.to_client.push(frame),
            Some(at) => {
                let mut cx = self.cx();
                self.layers[at].from_agent(frame, &mut cx);
                self.emit(at, cx, exits);
            }
        }
    }

    /// A context whose buffer comes from the pool: no allocation per frame and layer.
    fn cx(&mut self) -> Cx {
        Cx { out: self.spare.pop().unwrap_or_default(), now: self.now, wall: self.wall }
    }

    fn emit(&mut self, at: usize, cx: Cx, exits: &mut Exits) {
        let mut outs = cx.out;
        for out in outs.drain(..) {
            match out {
                Out::ToAgent(frame) => self.down(at + 1, frame, exits),
                Out::ToClient(frame) => self.up(at, frame, exits),
                Out::Request { method, params, tag } => {
                    self.next_own += 1;
                    let id = format!("{}{}", self.own_prefix, self.next_own);
                    self.own.insert(Id::string(&id), (at, tag));
                    let frame = Frame::from_value(&serde_json::json!({
                        "jsonrpc": "2.0", "id": id, "method": method, "params": params
                    }));
                    self.down(at + 1, frame, exits);
                }
                Out::After { at: deadline, token } => self.timers.set(at, token, deadline),
                Out::Cancel { token } => self.timers.cancel(at, token),
            }
        }
        self.spare.push(outs);
    }
}

/// Lets code outside the relay loop (a file watcher, a probe) hand events to one layer, in order with
/// the frames the loop handles.
#[derive(Clone)]
pub struct EventSender {
    layer: usize,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Event)>,
}

impl EventSender {
    pub(crate) fn new(layer: usize, tx: tokio::sync::mpsc::UnboundedSender<(usize, Event)>) -> EventSender {
        EventSender { layer, tx }
    }

    /// Queues an event; false once the relay has stopped.
    pub fn send<E: Any + Send>(&self, event: E) -> bool {
        self.tx.send((self.layer, Box::new(event))).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Harness, WALL_START_SECS};
    use super::*;
    use serde_json::json;

    /// Answers `ping` itself, asks the agent `probe` on `ask`, and reports the reply to the client.
    struct Pinger;
    impl Layer for Pinger {
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if f.is_request("ping") {
                cx.to_client(crate::frame::result_response(f.id().unwrap(), "pong".into()));
            } else if f.is_notification("ask") {
                cx.request("probe", json!({}), 9);
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

    /// Asks for wake-ups on `after` / `cancel` notifications (passing `after` on when `pass`); reports each
    /// wake-up with its layer's name and the time it was handed, in milliseconds since the first input.
    struct Sleeper {
        name: &'static str,
        pass: bool,
        base: Option<Instant>,
    }
    fn sleeper(name: &'static str, pass: bool) -> Box<dyn Layer> {
        Box::new(Sleeper { name, pass, base: None })
    }
    impl Layer for Sleeper {
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            self.base.get_or_insert(cx.now());
            let v = f.value().unwrap();
            let token = v["params"]["token"].as_u64().unwrap_or(0);
            match f.method() {
                Some("after") => {
                    cx.after(Duration::from_millis(v["params"]["ms"].as_u64().unwrap()), token);
                    if self.pass {
                        cx.to_agent(f);
                    }
                }
                Some("cancel") => cx.cancel(token),
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
                cx.after(Duration::ZERO, 99);
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
        fn from_client(&mut self, _: Frame, cx: &mut Cx) {
            cx.after(Duration::ZERO, 1);
            cx.after(Duration::MAX, 1);
        }
        fn on_timer(&mut self, _: u64, cx: &mut Cx) {
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
        fn on_event(&mut self, event: Event, cx: &mut Cx) {
            if let Ok(n) = event.downcast::<u32>() {
                cx.to_agent(crate::frame::notification("event", json!({"n": *n})));
            }
        }
    }

    #[test]
    fn events_reach_their_layer() {
        let mut h = Harness::new(vec![Box::new(Echo), Box::new(Echo)]);
        h.event(1, 7u32);
        h.event(5, 8u32);
        assert_eq!(h.to_agent(), vec![json!({"jsonrpc":"2.0","method":"event","params":{"n":7}})]);
    }
}

//! A layer-test harness: a [`Stack`] driven by hand, with a clock that moves only when the test says so.
//!
//! Tests of a layer (unit tests, integration tests, fuzz targets) send frames from either peer as JSON,
//! read what left the stack on each side, and move the clock to run the wake-ups that fall due, the way the
//! relay loop does, with no runtime, thread or process. The jobs layers ask for ([`super::Cx::work`]) run at
//! once, after the input that asked for them, unless [`Harness::hold_work`] keeps them for
//! [`Harness::run_work`]:
//!
//! ```
//! use coda_shim::layer::testing::Harness;
//! use coda_shim::layer::{Cx, Layer};
//! use coda_shim::frame::Frame;
//! use serde_json::json;
//! use std::time::Duration;
//!
//! /// Tells the client "late" a second after each prompt.
//! struct Late;
//! /// Its one wake-up.
//! #[derive(Debug, Clone, PartialEq, Eq, Hash)]
//! struct Tick;
//! impl Layer for Late {
//!     type Timer = Tick;
//!     type Event = std::convert::Infallible;
//!     type Reply = std::convert::Infallible;
//!     fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
//!         if frame.is_request("session/prompt") {
//!             cx.after(Duration::from_secs(1), Tick);
//!         }
//!         cx.to_agent(frame);
//!     }
//!     fn on_timer(&mut self, _: Tick, cx: &mut Cx) {
//!         cx.to_client(coda_shim::frame::notification("late", json!({})));
//!     }
//! }
//!
//! let mut h = Harness::of(Late);
//! h.from_client(json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {}}));
//! assert_eq!(h.to_agent().len(), 1);
//! h.advance(Duration::from_millis(999));
//! assert!(h.to_client().is_empty());
//! h.advance(Duration::from_millis(1));
//! assert_eq!(h.to_client(), vec![json!({"jsonrpc": "2.0", "method": "late", "params": {}})]);
//! ```

use std::any::Any;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::{AnyLayer, Event, Exits, Layer, Layers, Stack};
use crate::frame::Frame;

/// The wall-clock time a harness starts at, in seconds since the epoch (2026-01-01T00:00:00Z), so that
/// stamps in expected output are fixed.
pub const WALL_START_SECS: u64 = 1_767_225_600;

/// [`WALL_START_SECS`] as a time.
pub fn wall_start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(WALL_START_SECS)
}

/// A stack of layers, a clock, and what has left the stack on each side since it was last taken.
pub struct Harness {
    stack: Stack,
    start: Instant,
    now: Instant,
    exits: Exits,
    /// Events queued through the senders of [`Harness::build`], handed in by [`Harness::deliver`].
    events: Option<UnboundedReceiver<(usize, Event)>>,
    /// Jobs kept for [`Harness::run_work`].
    held_work: Vec<super::Job>,
}

impl Harness {
    /// `layers` as a binary stacks them: index 0 next to the client.
    pub fn new(layers: Vec<Box<dyn AnyLayer>>) -> Harness {
        Harness::with(Stack::new(layers), None)
    }

    /// The layers as a binary's set-up adds them ([`Layers::add`]), each with the sender of its own events:
    /// what the senders queue reaches the layers at [`Harness::deliver`].
    pub fn build(add: impl FnOnce(&mut Layers)) -> Harness {
        let (mut layers, events) = Layers::new();
        add(&mut layers);
        Harness::with(layers.stack(), Some(events))
    }

    fn with(mut stack: Stack, events: Option<UnboundedReceiver<(usize, Event)>>) -> Harness {
        let start = Instant::now();
        stack.set_time(start, wall_start());
        Harness { stack, start, now: start, exits: Exits::default(), events, held_work: Vec::new() }
    }

    /// One layer alone.
    pub fn of(layer: impl Layer + 'static) -> Harness {
        Harness::new(vec![Box::new(layer)])
    }

    /// A frame from the client.
    pub fn from_client(&mut self, frame: Value) {
        self.client_frame(Frame::from_value(&frame));
    }

    /// A frame from the agent.
    pub fn from_agent(&mut self, frame: Value) {
        self.agent_frame(Frame::from_value(&frame));
    }

    /// A frame from the client, as it was spelled on the wire (numbers such as `1e400` keep their spelling).
    pub fn client_frame(&mut self, frame: Frame) {
        self.stack.from_client(frame, &mut self.exits);
    }

    /// A frame from the agent, as it was spelled on the wire.
    pub fn agent_frame(&mut self, frame: Frame) {
        self.stack.from_agent(frame, &mut self.exits);
    }

    /// An event for the layer at `layer`, as its [`super::EventSender`] would hand it in (one of another type
    /// than the layer's is a loud error).
    pub fn event<E: Any + Send>(&mut self, layer: usize, event: E) {
        self.stack.event(layer, Box::new(event), &mut self.exits);
    }

    /// An event for every layer that takes its type, as a [`super::Broadcast`] hands it in.
    pub fn broadcast<E: Clone + Send + 'static>(&mut self, event: E) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        super::Broadcast::<E> { tx, _event: std::marker::PhantomData }.send(event);
        if let Ok((layer, event)) = rx.try_recv() {
            self.stack.event(layer, event, &mut self.exits);
        }
    }

    /// Hands the layers the events their senders queued, in the order they were sent, as the relay does.
    pub fn deliver(&mut self) {
        let Some(events) = &mut self.events else { return };
        while let Ok((layer, event)) = events.try_recv() {
            self.stack.event(layer, event, &mut self.exits);
        }
    }

    /// Keeps the jobs layers ask for ([`super::Cx::work`]) until [`Harness::run_work`], to look at what
    /// happens before they are done. Without it each job runs at once, after the input that asked for it.
    pub fn hold_work(&mut self) {
        self.stack.keep_work();
        self.held_work.extend(self.stack.take_work());
    }

    /// How many jobs wait, once [`Harness::hold_work`] keeps them.
    pub fn work_waiting(&mut self) -> usize {
        self.held_work.extend(self.stack.take_work());
        self.held_work.len()
    }

    /// Runs the jobs kept so far, in the order asked, and hands each result to its layer (those asked for
    /// meanwhile wait for the next call); how many ran.
    pub fn run_work(&mut self) -> usize {
        self.held_work.extend(self.stack.take_work());
        let jobs = std::mem::take(&mut self.held_work);
        let n = jobs.len();
        for job in jobs {
            let done = job.run();
            self.stack.done(done, &mut self.exits);
        }
        n
    }

    /// The layer at `at`, as the type it is (for tests that look inside it); panics on another type.
    pub fn layer<L: Layer>(&mut self, at: usize) -> &mut L {
        let layer = self.stack.layer_mut(at).unwrap_or_else(|| panic!("no layer at {at}"));
        let name = layer.name();
        layer.as_any().downcast_mut::<L>().unwrap_or_else(|| panic!("layer {at} is {name}"))
    }

    /// Moves the clock on by `by` and runs the wake-ups due then, as the relay loop does when it wakes.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        self.stack.set_time(self.now, self.wall());
        self.stack.wake_due(&mut self.exits);
    }

    /// The agent is gone and the session ends: every pending wake-up runs now, as the relay does at its end
    /// ([`Stack::wake_all`]); the clock does not move.
    pub fn end(&mut self) {
        self.stack.wake_all(&mut self.exits);
    }

    /// How long the clock has moved since the harness was made.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// The time handed to layers now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The wall-clock time handed to layers now: [`wall_start`] plus [`Harness::elapsed`].
    pub fn wall(&self) -> SystemTime {
        wall_start() + self.elapsed()
    }

    /// How long until the earliest pending wake-up (zero when one is already due).
    pub fn next_wake(&self) -> Option<Duration> {
        self.stack.next_wake().map(|at| at.saturating_duration_since(self.now))
    }

    /// Takes the frames that reached the client, in order, as JSON.
    pub fn to_client(&mut self) -> Vec<Value> {
        values(std::mem::take(&mut self.exits.to_client))
    }

    /// Takes the frames that reached the agent, in order, as JSON.
    pub fn to_agent(&mut self) -> Vec<Value> {
        values(std::mem::take(&mut self.exits.to_agent))
    }

    /// Takes the frames that left the stack on both sides, as frames (to compare bytes).
    pub fn take(&mut self) -> Exits {
        std::mem::take(&mut self.exits)
    }

    /// The stack itself, for what the harness does not cover (such as [`Stack::is_own`]).
    pub fn stack(&mut self) -> &mut Stack {
        &mut self.stack
    }
}

/// Frames as JSON, read from their bytes. A frame the shim built or rewrote that does not read back is a bug
/// of the layer under test; a peer's frame passed on as it came is read as [`Frame::value`] reads it.
fn values(frames: Vec<Frame>) -> Vec<Value> {
    frames
        .iter()
        .map(|f| match f.is_shim() {
            true => crate::json::from_slice(f.bytes())
                .unwrap_or_else(|e| panic!("a frame the shim wrote does not read back: {e}: {:?}", f.bytes())),
            false => Value::clone(f.value()),
        })
        .collect()
}

/// Runs `f`, which must make a bug of the shim loud the way each build does (see `misrouted`): a debug build
/// panics with a message holding `expected`, a release build logs an error holding it and goes on. Returns
/// what `f` returned in a release build (`None` in a debug build), for the caller to check what was dropped.
/// Panics when `f` did neither.
pub fn loud_error<T>(expected: &str, f: impl FnOnce() -> T) -> Option<T> {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Buffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::ERROR)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let run =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tracing::subscriber::with_default(subscriber, f)));
    let logged = String::from_utf8_lossy(&logs.0.lock().expect("lock")).into_owned();
    match run {
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or_default();
            if !cfg!(debug_assertions) {
                panic!("a release build panicked: {message}");
            }
            assert!(message.contains(expected), "panicked with {message:?}, not {expected:?}");
            None
        }
        Ok(out) => {
            if cfg!(debug_assertions) {
                panic!("a debug build did not panic ({expected:?})");
            }
            assert!(
                logged.lines().any(|l| l.contains("ERROR") && l.contains(expected)),
                "no error holding {expected:?} was logged: {logged:?}"
            );
            Some(out)
        }
    }
}

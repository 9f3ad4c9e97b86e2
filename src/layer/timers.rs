//! A layer's pending wake-ups, by deadline and by the layer's own timer value.
//!
//! Each layer names its wake-ups with a type of its own ([`crate::layer::Layer::Timer`]); the stack keeps one
//! table per layer, typed, behind [`AnyTimers`], so the timer a layer gets back in `on_timer` is the value it
//! asked with. One pending wake-up per value: asking again replaces it.

use crate::HashMap;
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant;

/// What a layer's timer values must be: compared and hashed to replace and cancel them.
pub trait Timer: Eq + Hash + Clone + Debug + Send + 'static {}

impl<T: Eq + Hash + Clone + Debug + Send + 'static> Timer for T {}

/// One layer's pending wake-ups.
pub(super) struct Timers<T> {
    /// (deadline, order of asking across the stack) -> timer: the order breaks ties between equal deadlines.
    queue: BTreeMap<(Instant, u64), T>,
    /// Timer -> its key in `queue`.
    pending: HashMap<T, (Instant, u64)>,
}

impl<T> Default for Timers<T> {
    fn default() -> Timers<T> {
        Timers { queue: BTreeMap::new(), pending: HashMap::default() }
    }
}

impl<T: Timer> Timers<T> {
    pub(super) fn set(&mut self, timer: T, at: Instant, asked: u64) {
        self.cancel(&timer);
        self.queue.insert((at, asked), timer.clone());
        self.pending.insert(timer, (at, asked));
    }

    pub(super) fn cancel(&mut self, timer: &T) {
        if let Some(key) = self.pending.remove(timer) {
            self.queue.remove(&key);
        }
    }

    pub(super) fn take(&mut self, key: (Instant, u64)) -> Option<T> {
        let timer = self.queue.remove(&key)?;
        self.pending.remove(&timer);
        Some(timer)
    }
}

/// A layer's table with its timer type erased: what the stack needs to order wake-ups across layers.
pub trait AnyTimers: Send {
    /// The earliest deadline.
    fn first(&self) -> Option<Instant>;
    /// The key of the earliest wake-up asked for at or before `asked_before`, if it is due at `now` (None: due
    /// whatever its deadline).
    fn first_due(&self, now: Option<Instant>, asked_before: u64) -> Option<(Instant, u64)>;
    /// How many wake-ups are pending.
    fn len(&self) -> usize;
    fn as_any(&mut self) -> &mut dyn Any;
}

impl<T: Timer> AnyTimers for Timers<T> {
    fn first(&self) -> Option<Instant> {
        self.queue.keys().next().map(|(at, _)| *at)
    }

    fn first_due(&self, now: Option<Instant>, asked_before: u64) -> Option<(Instant, u64)> {
        let (&key, _) = self.queue.iter().find(|((_, asked), _)| *asked <= asked_before)?;
        now.is_none_or(|now| key.0 <= now).then_some(key)
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

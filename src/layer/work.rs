//! Work a layer asks the engine for ([`crate::layer::Cx::work`]): a job run off the relay loop, its result
//! handed back to the layer that asked, as one more input.
//!
//! A layer does no I/O; what it needs read, written or started (a session file, a watcher, a record) it
//! asks for as a job: a closure that does the I/O and returns a value, and a function of the layer that takes
//! that value with a [`Cx`]. The stack keeps the jobs its layers ask for ([`Stack::take_work`]); the relay
//! hands them to a [`Pool`] of worker threads and feeds each result back ([`Stack::done`]) in its order of
//! arrival among frames, events and wake-ups, so nothing a layer asks for can hold up the loop. A stack with
//! no relay (a [`crate::layer::testing::Harness`], a test that drives a [`Stack`] by hand) runs each job at
//! once, after the input that asked for it, unless told to keep them ([`Stack::keep_work`]).

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use super::{AnyLayer, Cx, Stack, misrouted};

/// Hands a job's result to its layer.
type Deliver = Box<dyn FnOnce(&mut dyn AnyLayer, &mut Cx) + Send>;

/// The result of a job, ready to be handed to its layer.
pub struct Done {
    pub(super) layer: usize,
    pub(super) deliver: Deliver,
}

/// A job a layer asked for: runs on any thread, once.
pub struct Job {
    layer: usize,
    run: Box<dyn FnOnce() -> Done + Send>,
}

impl Job {
    /// The job `job`, whose result `done` hands to layer `layer` (of type `L`).
    pub(super) fn new<L, T, J, D>(layer: usize, job: J, done: D) -> Job
    where
        L: Any,
        T: Send + 'static,
        J: FnOnce() -> T + Send + 'static,
        D: FnOnce(&mut L, T, &mut Cx) + Send + 'static,
    {
        let run = move || {
            let value = job();
            let deliver = move |layer: &mut dyn AnyLayer, cx: &mut Cx| {
                let name = layer.name();
                match layer.as_any().downcast_mut::<L>() {
                    Some(layer) => done(layer, value, cx),
                    None => misrouted("the result of a job", std::any::type_name::<L>(), name),
                }
            };
            Done { layer, deliver: Box::new(deliver) as Deliver }
        };
        Job { layer, run: Box::new(run) }
    }

    /// The layer that asked for it.
    pub fn layer(&self) -> usize {
        self.layer
    }

    /// Does the job (its I/O) and returns its result, for [`Stack::done`].
    pub fn run(self) -> Done {
        (self.run)()
    }
}

/// Worker threads that run jobs and send their results to the relay. Threads start as jobs come, up to
/// [`Pool::WORKERS`]; jobs beyond wait their turn, in order. A job that panics is reported and its layer
/// gets no result; the worker goes on. Dropping the pool lets the workers end once the queue is empty.
pub struct Pool {
    shared: Arc<Queue>,
    workers: usize,
    results: tokio::sync::mpsc::UnboundedSender<Done>,
    /// Runs each job on the caller's thread (the relay loop) instead: the behaviour before jobs existed,
    /// kept as a measurement baseline only ([`INLINE_ENV`]).
    inline: bool,
}

/// Set (to anything) when the relay starts, the relay runs layers' jobs on its own loop: only for measuring
/// what running them off the loop gains (benches/kimi_title.rs).
pub const INLINE_ENV: &str = "CODA_SHIM_INLINE_WORK";

#[derive(Default)]
struct Queue {
    state: Mutex<State>,
    ready: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job.
    idle: usize,
    /// The pool is gone: workers end once the queue is empty.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Pool {
    /// Most worker threads at once.
    pub const WORKERS: usize = 4;

    /// A pool whose results go to `results`.
    pub fn new(results: tokio::sync::mpsc::UnboundedSender<Done>) -> Pool {
        Pool { shared: Arc::default(), workers: 0, results, inline: false }
    }

    /// A pool that runs jobs inline (see [`INLINE_ENV`]).
    pub fn inline(results: tokio::sync::mpsc::UnboundedSender<Done>) -> Pool {
        let mut pool = Pool::new(results);
        pool.inline = true;
        pool
    }

    /// The relay's pool: [`Pool::new`], or [`Pool::inline`] when [`INLINE_ENV`] is set (read once, here).
    pub fn from_env(results: tokio::sync::mpsc::UnboundedSender<Done>) -> Pool {
        if std::env::var_os(INLINE_ENV).is_some() {
            tracing::info!("{INLINE_ENV} is set: layers' jobs run on the relay loop (a measurement baseline)");
            Pool::inline(results)
        } else {
            Pool::new(results)
        }
    }

    /// Queues a job; its result reaches the results channel when it is done.
    pub fn run(&mut self, job: Job) {
        if self.inline {
            let _ = self.results.send(job.run());
            return;
        }
        let short = {
            let mut q = self.shared.lock();
            q.jobs.push_back(job);
            q.jobs.len() > q.idle
        };
        // More jobs waiting than workers waiting for them: one more worker, up to the most.
        if short && self.workers < Pool::WORKERS {
            self.spawn();
        }
        self.shared.ready.notify_one();
    }

    fn spawn(&mut self) {
        let (shared, results) = (self.shared.clone(), self.results.clone());
        let n = self.workers;
        let spawned = std::thread::Builder::new().name(format!("coda-work-{n}")).spawn(move || work(&shared, &results));
        match spawned {
            Ok(_) => self.workers += 1,
            Err(e) if self.workers == 0 => {
                // No thread at all: the jobs run here rather than never.
                tracing::warn!("cannot start a worker thread ({e}); layers' jobs run on the relay loop");
                self.inline = true;
                let jobs = std::mem::take(&mut self.shared.lock().jobs);
                for job in jobs {
                    let _ = self.results.send(job.run());
                }
            }
            Err(e) => tracing::warn!("cannot start another worker thread ({e}); jobs wait for the ones running"),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

/// How much lower than the relay's a worker's scheduling priority is (its nice value, on Linux): a job that
/// burns CPU (parsing a large file) gives way to the loop on a busy machine instead of sharing a core.
#[cfg(target_os = "linux")]
const WORKER_NICE: i32 = 10;

/// Lowers the calling thread's priority (Linux, where a nice value is per thread; elsewhere nothing).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers; they touch no memory of ours.
        let tid = unsafe { libc::gettid() };
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, WORKER_NICE) } != 0 {
            tracing::debug!("cannot lower a worker's priority: {}", std::io::Error::last_os_error());
        }
    }
}

/// A worker: takes jobs until the pool is gone and the queue empty (or nobody takes results any more).
fn work(shared: &Queue, results: &tokio::sync::mpsc::UnboundedSender<Done>) {
    lower_priority();
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                if q.closed {
                    return;
                }
                q.idle += 1;
                q = shared.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                q.idle -= 1;
            }
        };
        let layer = job.layer;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run())) {
            Ok(done) => {
                if results.send(done).is_err() {
                    return;
                }
            }
            Err(_) => tracing::error!("a job of layer {layer} panicked; it gives no result (a bug of the shim)"),
        }
    }
}

impl Stack {
    /// Keeps the jobs layers ask for until [`Stack::take_work`] instead of running them at once after each
    /// input: the relay's way (it runs them on a [`Pool`]), and a test's that looks at the time in between.
    pub fn keep_work(&mut self) {
        self.keep_work = true;
    }

    /// The jobs asked for since the last call, in the order asked.
    pub fn take_work(&mut self) -> Vec<Job> {
        std::mem::take(&mut self.jobs)
    }

    /// Hands a job's result to the layer that asked for it, as one more input.
    pub fn done(&mut self, done: Done, exits: &mut super::Exits) {
        let Done { layer, deliver } = done;
        if layer >= self.layers.len() {
            return misrouted("the result of a job", "(no such layer)", "the stack");
        }
        self.call(layer, exits, |l, cx| deliver(l, cx));
        self.settle(exits);
    }

    /// After each input: without [`Stack::keep_work`], runs the jobs asked for, each result one more input
    /// (and the jobs those ask for, in turn).
    pub(super) fn settle(&mut self, exits: &mut super::Exits) {
        if !self.keep_work {
            let mut queue: VecDeque<Job> = std::mem::take(&mut self.jobs).into();
            while let Some(job) = queue.pop_front() {
                let Done { layer, deliver } = job.run();
                self.call(layer, exits, |l, cx| deliver(l, cx));
                queue.extend(self.jobs.drain(..));
            }
        }
        self.publish_sizes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Frame, notification};
    use crate::layer::Layer;
    use crate::layer::testing::Harness;
    use serde_json::json;
    use std::convert::Infallible;

    /// On `read` asks for a job that gives back its `n` doubled, and on that result tells the client; a result
    /// of 8 or more asks for one more job (a job asked for while handling a job's result).
    struct Doubler;
    impl Doubler {
        fn doubled(&mut self, n: u64, cx: &mut Cx) {
            cx.to_client(notification("doubled", json!(n)));
            if (8..16).contains(&n) {
                cx.work(move || n * 2, Doubler::doubled);
            }
        }
    }
    impl Layer for Doubler {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if f.is_notification("read") {
                let n = f.value()["params"].as_u64().unwrap();
                cx.work(move || n * 2, Doubler::doubled);
            }
            cx.to_agent(f);
        }
    }

    fn read(n: u64) -> serde_json::Value {
        json!({"jsonrpc": "2.0", "method": "read", "params": n})
    }

    #[test]
    fn without_a_relay_a_job_runs_after_the_input_that_asked_for_it() {
        let mut h = Harness::of(Doubler);
        h.from_client(read(2));
        assert_eq!(h.to_agent(), [read(2)]);
        assert_eq!(h.to_client(), [notification_value(4)]);
        // One asked for while handling a result runs too, after it.
        h.from_client(read(4));
        assert_eq!(h.to_client(), [notification_value(8), notification_value(16)]);
    }

    fn notification_value(n: u64) -> serde_json::Value {
        json!({"jsonrpc": "2.0", "method": "doubled", "params": n})
    }

    #[test]
    fn held_jobs_wait_while_other_inputs_go_on_and_results_come_in_the_order_asked() {
        let mut h = Harness::of(Doubler);
        h.hold_work();
        h.from_client(read(1));
        h.from_client(read(5));
        h.from_client(json!({"jsonrpc": "2.0", "id": 1, "method": "x"}));
        assert_eq!(h.to_agent().len(), 3);
        assert!(h.to_client().is_empty(), "nothing is done before the jobs run");
        assert_eq!(h.work_waiting(), 2);
        assert_eq!(h.run_work(), 2);
        assert_eq!(h.to_client(), [notification_value(2), notification_value(10)]);
        // The job asked for on 10 waits for the next call.
        assert_eq!(h.work_waiting(), 1);
        assert_eq!(h.run_work(), 1);
        assert_eq!(h.to_client(), [notification_value(20)]);
        assert_eq!(h.run_work(), 0);
    }

    #[test]
    fn outside_a_stack_a_job_is_not_run() {
        let ran = Arc::new(Mutex::new(false));
        let seen = ran.clone();
        Cx::default().work(move || *seen.lock().unwrap() = true, |_: &mut Doubler, (), _| {});
        assert!(!*ran.lock().unwrap());
    }

    #[test]
    fn a_job_for_another_layer_type_is_a_loud_error() {
        struct Other;
        impl Layer for Other {
            type Timer = Infallible;
            type Event = Infallible;
            type Reply = Infallible;
            fn from_client(&mut self, _: Frame, cx: &mut Cx) {
                cx.work(|| 1u64, Doubler::doubled);
            }
        }
        let mut h = Harness::of(Other);
        // A release build logs it and runs no job: nothing comes of it.
        if super::super::testing::loud_error("a job of the wrong type reached", || h.from_client(read(1))).is_some() {
            assert_eq!(h.run_work(), 0);
            assert!(h.to_client().is_empty() && h.to_agent().is_empty());
        }
    }

    #[test]
    fn the_pool_runs_jobs_on_its_threads_and_outlives_a_job_that_panics() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut pool = Pool::new(tx);
        let mut stack = Stack::new(vec![Box::new(Doubler)]);
        let here = std::thread::current().id();
        let thread = |n: u64| {
            Job::new::<Doubler, _, _, _>(
                0,
                move || {
                    assert!(n != 0, "a job that panics");
                    assert_ne!(std::thread::current().id(), here);
                    n
                },
                Doubler::doubled,
            )
        };
        pool.run(thread(0));
        for n in 1..=6 {
            pool.run(thread(n));
        }
        let mut got = Vec::new();
        let mut exits = crate::layer::Exits::default();
        while got.len() < 6 {
            let done = rx.blocking_recv().expect("a result");
            stack.done(done, &mut exits);
            got.extend(exits.to_client.drain(..).map(|f| f.value()["params"].as_u64().unwrap()));
        }
        got.sort();
        assert_eq!(got, [1, 2, 3, 4, 5, 6]);
        assert!(pool.workers <= Pool::WORKERS);
    }

    #[test]
    fn an_inline_pool_runs_each_job_before_it_returns() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut pool = Pool::inline(tx);
        pool.run(Job::new::<Doubler, _, _, _>(0, || 3u64, Doubler::doubled));
        assert!(rx.try_recv().is_ok());
        assert_eq!(pool.workers, 0);
    }
}

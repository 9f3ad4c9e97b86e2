//! What the feature machines of [`crate::coda`] share: a machine is a layer over a backend an adapter writes
//! ([`crate::coda::compact::Compaction`] over a `Compactor`, [`crate::coda::steering::Steering`] over a
//! `Steerer`); the backend is handed each input with a [`Ctl`], through which it asks the engine for what a
//! layer asks for (requests, wake-ups, jobs) and reports what the machine acts on.

use std::marker::PhantomData;
use std::time::Duration;

use serde_json::Value;

use crate::frame::Id;
use crate::layer::{Cx, Layer, Timer};

/// A feature machine: a layer with a backend, and the reports the backend gives it.
pub trait Machine: Layer + Sized {
    type Backend;
    /// What the backend reports (a compaction's end, a steering message's outcome).
    type Report;
    /// The backend's own wake-ups.
    type BackendTimer: Timer;

    fn backend_mut(&mut self) -> &mut Self::Backend;

    /// The machine acts on what its backend reported while handling one input.
    fn apply(&mut self, reports: Vec<Self::Report>, cx: &mut Cx);

    /// The machine's own wake-up that carries a backend's.
    fn backend_timer(timer: Self::BackendTimer) -> Self::Timer;

    /// Hands the backend one input with a [`Ctl`], then acts on what it reported.
    fn with_backend(&mut self, cx: &mut Cx, call: impl FnOnce(&mut Self::Backend, &mut Ctl<Self>)) {
        self.with_backend_for(cx, None, call)
    }

    /// [`Machine::with_backend`] while the machine carries out the client's request `client`: the requests the
    /// backend makes meanwhile are made for it ([`Cx::request_for`]), so that Coda's withdrawal of it reaches
    /// them.
    fn with_backend_for(
        &mut self,
        cx: &mut Cx,
        client: Option<&Id>,
        call: impl FnOnce(&mut Self::Backend, &mut Ctl<Self>),
    ) {
        let mut ctl = Ctl::new(cx);
        ctl.on_behalf = client.cloned();
        call(self.backend_mut(), &mut ctl);
        let reports = ctl.reports;
        self.apply(reports, cx);
    }
}

/// What a backend is handed with each input: the layer's [`Cx`], and where it reports to its machine.
pub struct Ctl<'c, 'a, M: Machine> {
    pub cx: &'c mut Cx<'a>,
    reports: Vec<M::Report>,
    /// The client request the machine carries out now ([`Machine::with_backend_for`]).
    on_behalf: Option<Id>,
    _machine: PhantomData<fn(M)>,
}

impl<'c, 'a, M: Machine> Ctl<'c, 'a, M> {
    pub(crate) fn new(cx: &'c mut Cx<'a>) -> Self {
        Ctl { cx, reports: Vec::new(), on_behalf: None, _machine: PhantomData }
    }

    /// Reports `report` to the machine (acted on once the backend returns).
    pub(crate) fn report(&mut self, report: M::Report) {
        self.reports.push(report);
    }

    /// A request of the shim's own to the CLI; its answer comes back to the backend's `on_reply` with `tag`.
    /// Made while the machine carries out a request of Coda's, it is made for that one ([`Cx::request_for`]).
    pub fn request(&mut self, method: &str, params: Value, tag: M::Reply) {
        match &self.on_behalf {
            Some(client) => self.cx.request_for(client, method, params, tag),
            None => self.cx.request(method, params, tag),
        }
    }

    /// The backend's `on_timer` with `timer` once `delay` has passed.
    pub fn after(&mut self, delay: Duration, timer: M::BackendTimer) {
        self.cx.after(delay, M::backend_timer(timer));
    }

    pub fn cancel(&mut self, timer: M::BackendTimer) {
        self.cx.cancel(&M::backend_timer(timer));
    }

    /// Runs `job` off the relay loop ([`Cx::work`]) and hands its result to `done`, on the backend.
    pub fn work<T, J, D>(&mut self, job: J, done: D)
    where
        T: Send + 'static,
        J: FnOnce() -> T + Send + 'static,
        D: FnOnce(&mut M::Backend, T, &mut Ctl<M>) + Send + 'static,
    {
        self.cx.work::<M, T, J, _>(job, move |machine: &mut M, value, cx| {
            machine.with_backend(cx, |backend, ctl| done(backend, value, ctl));
        });
    }
}

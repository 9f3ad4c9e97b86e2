//! Layers: sans-IO state machines that see every frame and decide what goes on.
//!
//! A binary is a stack of layers over the same engine. Index 0 sits next to the client (Coda), the last
//! one next to the agent. A frame from the client enters layer 0 and walks down; a frame from the agent
//! enters the last layer and walks up. Whatever a layer emits towards the agent continues through the
//! layers below it, whatever it emits towards the client through the layers above it.

use std::any::Any;
use std::collections::HashMap;

use serde_json::Value;

use crate::frame::{Frame, Id, Kind};
use crate::json;

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
}

/// What a layer asks for while handling one input.
#[derive(Default)]
pub struct Cx {
    out: Vec<Out>,
}

enum Out {
    ToAgent(Frame),
    ToClient(Frame),
    Request { method: String, params: Value, tag: u64 },
}

impl Cx {
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
        Cx { out: self.spare.pop().unwrap_or_default() }
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
            }
        }
        self.spare.push(outs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(s: &str) -> Frame {
        Frame::parse(s.as_bytes().to_vec()).unwrap()
    }

    /// Answers `ping` itself, asks the agent `probe` on `ask`, and reports the reply to the client.
    struct Pinger;
    impl Layer for Pinger {
        fn from_client(&mut self, f: Frame, cx: &mut Cx) {
            if f.is_request("ping") {
                cx.to_client(crate::frame::result_response(f.id().unwrap(), "pong".into()));
            } else if f.is_notification("ask") {
                cx.request("probe", serde_json::json!({}), 9);
            } else {
                cx.to_agent(f);
            }
        }
        fn on_reply(&mut self, tag: u64, reply: Frame, cx: &mut Cx) {
            cx.to_client(crate::frame::notification(
                "answered",
                serde_json::json!({"tag": tag, "len": reply.bytes().len()}),
            ));
        }
    }

    #[test]
    fn frames_walk_the_stack_and_own_requests_come_back() {
        let mut stack = Stack::new(vec![Box::new(Pinger), Box::new(Pinger)]);
        let mut exits = Exits::default();
        stack.from_client(frame(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#), &mut exits);
        assert_eq!(exits.to_client.len(), 1);
        assert!(exits.to_agent.is_empty());

        let passthrough = r#"{"jsonrpc":"2.0","method":"other"}"#;
        stack.from_client(frame(passthrough), &mut exits);
        assert_eq!(exits.to_agent[0].bytes(), passthrough.as_bytes());

        stack.from_client(frame(r#"{"jsonrpc":"2.0","method":"ask"}"#), &mut exits);
        let probe = exits.to_agent.pop().unwrap();
        assert_eq!(probe.method(), Some("probe"));
        let id = probe.id().unwrap().clone();
        assert!(stack.is_own(&id));

        let reply = Frame::from_value(&serde_json::json!({"jsonrpc":"2.0","id": id.to_value(),"result":{}}));
        let mut exits = Exits::default();
        stack.from_agent(reply, &mut exits);
        assert_eq!(exits.to_client.len(), 1);
        assert_eq!(exits.to_client[0].method(), Some("answered"));
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

    /// Queues `event` once `after` has passed: a timer of the engine's runtime (a task, no thread of its own),
    /// for layers that need to look again later. Outside a runtime (a layer driven by hand) it is dropped
    /// with a warning: such a caller hands its events in itself.
    pub fn send_after<E: Any + Send>(&self, after: std::time::Duration, event: E) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("a layer asked for a timer outside the relay's runtime; it will not fire");
            return;
        };
        let sender = self.clone();
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            sender.send(event);
        });
    }
}

#[cfg(test)]
mod timer_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn send_after_delivers_the_event_later_through_the_runtime() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sender = EventSender::new(3, tx);
        runtime.block_on(async {
            sender.send_after(Duration::from_millis(20), 7u32);
            assert!(rx.try_recv().is_err(), "not at once");
            let (layer, event) = rx.recv().await.expect("the event");
            assert_eq!(layer, 3);
            assert_eq!(event.downcast::<u32>().ok().map(|e| *e), Some(7));
        });
    }

    #[test]
    fn send_after_outside_a_runtime_drops_the_event() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        EventSender::new(0, tx).send_after(Duration::ZERO, 1u8);
        assert!(rx.try_recv().is_err());
    }
}

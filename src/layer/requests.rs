//! The request table: every request of the client, recorded once by the stack, for every layer to ask.
//!
//! The stack records a client request when it enters the stack (its id, method and `params.sessionId`, and the
//! time handed with it), marks it when it leaves the stack towards the agent and when the agent's answer comes
//! in, and forgets it when an answer to it leaves the stack towards the client (whoever made that answer). A
//! layer asks which request an answer answers ([`crate::layer::Cx::answer_to`]) and which requests are still
//! open ([`crate::layer::Cx::open_requests`]) instead of keeping a copy of its own; the relay asks which ones
//! the agent still owes ([`crate::layer::Stack::owed`]). Layers leave typed notes on a request for the layers
//! that handle its answer after them ([`crate::layer::Cx::note`]): the one way layers tell each other
//! something, never a key written into a frame.

use crate::HashMap;
use std::any::Any;
use std::time::{Instant, SystemTime};

use crate::frame::{Frame, Id, Kind, Method};

/// One request of the client, as it entered the stack.
pub struct Request {
    pub id: Id,
    pub method: Method,
    /// `params.sessionId` as the client sent it (a layer below may have renamed it on the way).
    session: Option<String>,
    /// The time handed to the layers with it.
    pub at: Instant,
    pub wall: SystemTime,
    /// Order of arrival.
    seq: u64,
    sent: bool,
    answered: bool,
    /// The index of the layer nearest the client that the agent's answer has reached (`usize::MAX`: none yet).
    reached: usize,
    notes: Vec<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("id", &self.id)
            .field("method", &self.method)
            .field("sent", &self.sent)
            .field("answered", &self.answered)
            .finish()
    }
}

impl Request {
    /// `params.sessionId` of the request, when it named one.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    pub fn is(&self, method: &str) -> bool {
        self.method == method
    }

    /// Its place in the order of arrival of the client's requests.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether it has left the stack towards the agent (a layer may hold it back first).
    pub fn is_sent(&self) -> bool {
        self.sent
    }

    /// Whether the agent's answer has come in (it may still be on its way through the layers).
    pub fn is_answered(&self) -> bool {
        self.answered
    }

    /// The note of type `T` a layer left on it ([`crate::layer::Cx::note`]).
    pub fn note<T: Any>(&self) -> Option<&T> {
        self.notes.iter().find_map(|n| n.downcast_ref::<T>())
    }
}

/// Ids of requests answered to the client remembered at most, to tell the agent's second answer to one.
const ANSWERED_KEPT: usize = 256;

/// The client's requests not answered yet (to the client), by id.
#[derive(Default)]
pub struct Requests {
    open: HashMap<Id, Request>,
    next: u64,
    /// The latest requests answered to the client, oldest first (a request that reuses an id leaves it).
    done: std::collections::VecDeque<Id>,
}

impl Requests {
    /// A client request entered the stack (the stack refuses one with the id of a request still open).
    pub(super) fn opened(&mut self, frame: &Frame, at: Instant, wall: SystemTime) {
        let Kind::Request { id, method } = frame.kind() else { return };
        self.done.retain(|d| d != id);
        self.next += 1;
        let request = Request {
            id: id.clone(),
            method: method.clone(),
            session: session_of(frame),
            at,
            wall,
            seq: self.next,
            sent: false,
            answered: false,
            reached: usize::MAX,
            notes: Vec::new(),
        };
        self.open.insert(id.clone(), request);
    }

    /// A request left the stack towards the agent (one a layer made with a client's id is recorded here).
    pub(super) fn sent(&mut self, frame: &Frame, at: Instant, wall: SystemTime) {
        let Kind::Request { id, .. } = frame.kind() else { return };
        if !self.open.contains_key(id) {
            self.opened(frame, at, wall);
        }
        if let Some(r) = self.open.get_mut(id) {
            r.sent = true;
        }
    }

    /// The agent answered `id`.
    pub(super) fn answered(&mut self, id: &Id) {
        if let Some(r) = self.open.get_mut(id) {
            r.answered = true;
        }
    }

    /// The answer to `id` is handed to layer `at` on its way to the client (a layer below may have held it).
    pub(super) fn reached(&mut self, id: &Id, at: usize) {
        if let Some(r) = self.open.get_mut(id) {
            r.reached = r.reached.min(at);
        }
    }

    /// An answer to `id` left the stack towards the client: the request is over.
    pub(super) fn closed(&mut self, id: &Id) {
        if self.open.remove(id).is_some() {
            self.done.push_back(id.clone());
            if self.done.len() > ANSWERED_KEPT {
                self.done.pop_front();
            }
        }
    }

    /// Whether the client has had its answer to the request `id` (one of the latest `ANSWERED_KEPT`) and sent
    /// no request with that id since: an answer to it now is a second one.
    pub fn was_answered(&self, id: &Id) -> bool {
        !self.open.contains_key(id) && self.done.contains(id)
    }

    /// How many requests are open (not yet answered to the client).
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn get(&self, id: &Id) -> Option<&Request> {
        self.open.get(id)
    }

    /// Requests not answered by the agent yet (sent or held by a layer), in no particular order.
    pub fn open(&self) -> impl Iterator<Item = &Request> {
        self.open.values().filter(|r| !r.answered)
    }

    /// Requests not answered by the agent yet as layer `at` sees the agent's frames: the ones whose answer has not
    /// reached that layer (a layer below it holds it, and the frames the agent wrote before it) count as open.
    pub fn open_at(&self, at: usize) -> impl Iterator<Item = &Request> {
        self.open.values().filter(move |r| !r.answered || r.reached > at)
    }

    /// Whether the agent owes an answer to `id`: it was sent and has not been answered.
    pub fn owes(&self, id: &Id) -> bool {
        self.open.get(id).is_some_and(|r| r.sent && !r.answered)
    }

    /// The requests the agent owes an answer, in their order of arrival.
    pub fn owed(&self) -> Vec<Id> {
        let mut owed: Vec<&Request> = self.open.values().filter(|r| r.sent && !r.answered).collect();
        owed.sort_by_key(|r| r.seq);
        owed.into_iter().map(|r| r.id.clone()).collect()
    }

    /// The requests the agent has not answered (sent, or held by a layer), in their order of arrival.
    pub fn unanswered(&self) -> Vec<Id> {
        let mut open: Vec<&Request> = self.open.values().filter(|r| !r.answered).collect();
        open.sort_by_key(|r| r.seq);
        open.into_iter().map(|r| r.id.clone()).collect()
    }

    /// Leaves `note` on the open request `id`, replacing a note of the same type; false without such a request.
    pub(super) fn note<T: Any + Send>(&mut self, id: &Id, note: T) -> bool {
        let Some(r) = self.open.get_mut(id) else { return false };
        r.notes.retain(|n| !n.is::<T>());
        r.notes.push(Box::new(note));
        true
    }
}

/// `params.sessionId` of a request, read without parsing the rest (the frame check has read it already).
fn session_of(frame: &Frame) -> Option<String> {
    let raw = sonic_rs::get_from_slice(frame.bytes(), &["params", "sessionId"]).ok()?;
    let text = raw.as_raw_str();
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(inner.to_owned());
    }
    // A lone surrogate escape reads as U+FFFD, as in `Frame::value`.
    crate::json::from_str::<String>(text)
        .or_else(|_| crate::json::from_slice(&crate::json::mend_surrogates(text.as_bytes())))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frame(v: serde_json::Value) -> Frame {
        Frame::from_value(&v)
    }

    #[test]
    fn a_request_is_open_until_an_answer_to_it_reaches_the_client() {
        let mut t = Requests::default();
        let (now, wall) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let prompt = frame(json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"sé"}}));
        t.opened(&prompt, now, wall);
        let id = Id::from_json("1");
        assert_eq!(t.get(&Id::from_json("1e0")).and_then(Request::session), Some("sé"), "ids match by value");
        assert!(!t.owes(&id), "not sent yet");
        t.sent(&prompt, now, wall);
        assert!(t.owes(&id));
        assert_eq!(t.owed(), vec![id.clone()]);
        t.answered(&id);
        assert!(!t.owes(&id));
        assert_eq!(t.open().count(), 0);
        assert!(t.get(&id).is_some(), "still on its way to the client");
        t.closed(&id);
        assert!(t.get(&id).is_none());
    }

    #[test]
    fn a_layer_above_one_holding_the_answer_still_sees_the_request_open() {
        let mut t = Requests::default();
        let (now, wall) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let load = frame(json!({"jsonrpc":"2.0","id":5,"method":"session/load","params":{"sessionId":"s"}}));
        t.opened(&load, now, wall);
        t.sent(&load, now, wall);
        let id = Id::from_json("5");
        assert_eq!(t.open_at(0).count(), 1);
        t.answered(&id);
        // Layer 3 (nearest the agent of four) holds the answer: the layers above it have not seen it.
        t.reached(&id, 3);
        assert_eq!(t.open_at(3).count(), 0, "the holder has the answer");
        assert_eq!(t.open_at(2).count(), 1, "a layer above it reads the frames before the answer as the load's");
        t.reached(&id, 1);
        t.reached(&id, 2);
        assert_eq!((t.open_at(1).count(), t.open_at(0).count()), (0, 1), "never back down the stack");
    }

    #[test]
    fn the_session_is_read_escaped_or_not_and_only_from_params() {
        let mut t = Requests::default();
        let (now, wall) = (Instant::now(), SystemTime::UNIX_EPOCH);
        for (n, text, want) in [
            (1, r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"sessionId":"\u0073\"x"}}"#, Some("s\"x")),
            (2, r#"{"jsonrpc":"2.0","id":2,"method":"m","params":{"sessionId":7}}"#, None),
            (3, r#"{"jsonrpc":"2.0","id":3,"method":"m","sessionId":"top"}"#, None),
            (4, r#"{"jsonrpc":"2.0","id":4,"method":"m","params":{"sessionId":"\ud800"}}"#, Some("\u{fffd}")),
        ] {
            t.opened(&Frame::parse(text.as_bytes().to_vec()).unwrap(), now, wall);
            assert_eq!(t.get(&Id::from_json(&n.to_string())).and_then(Request::session), want, "{text}");
        }
    }

    #[test]
    fn notes_are_typed_and_one_per_type() {
        let mut t = Requests::default();
        t.opened(&frame(json!({"jsonrpc":"2.0","id":"i","method":"initialize"})), Instant::now(), SystemTime::now());
        let id = Id::string("i");
        assert!(t.note(&id, 1u8));
        assert!(t.note(&id, 2u8));
        assert!(t.note(&id, "text"));
        assert_eq!(t.get(&id).and_then(Request::note::<u8>), Some(&2));
        assert_eq!(t.get(&id).and_then(Request::note::<&str>), Some(&"text"));
        assert_eq!(t.get(&id).and_then(Request::note::<u16>), None);
        assert!(!t.note(&Id::string("other"), 1u8), "no such request");
    }
}

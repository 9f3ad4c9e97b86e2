//! A trace as JSON-RPC conversations: what each frame is, and which request each answer answers.
//!
//! A trace holds two conversations: Coda's with the shim (`client->shim`, `shim->client`: the client side) and
//! the shim's with the CLI (`shim->agent`, `agent->shim`: the agent side). In each, either party sends
//! requests and the other answers them; [`Conversation`] keeps the open ones, bounded, so an answer is matched
//! to its request's method and time. `acp-replay validate` and `stats` read a trace through it.

use crate::HashMap;
use std::borrow::Cow;
use std::collections::VecDeque;

use serde_json::Value;

use super::validate::schema::Party;
use super::view::read::Record;
use crate::trace::Dir;

/// A record's frame as the shim reads it: a lone UTF-16 surrogate escape (valid JSON, not valid Unicode) as
/// U+FFFD. `None` for a record without a frame, or one that is not JSON.
pub fn frame_of(rec: &Record) -> Option<Cow<'_, Value>> {
    match &rec.frame {
        Some(v) => Some(Cow::Borrowed(v)),
        None if rec.not_json || rec.dir == Dir::AgentToFile => None,
        None => crate::json::from_slice(&crate::json::mend_surrogates(rec.raw.as_bytes())).ok().map(Cow::Owned),
    }
}

/// Which conversation of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Coda and the shim: what Coda saw.
    Client,
    /// The shim and the CLI: what the CLI saw.
    Agent,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Agent => "agent",
        }
    }
}

/// The conversation a direction belongs to, and who sent its frames there. `None` for session files.
pub fn side_of(dir: Dir) -> Option<(Side, Party)> {
    match dir {
        Dir::ClientToShim => Some((Side::Client, Party::Client)),
        Dir::ShimToClient => Some((Side::Client, Party::Agent)),
        Dir::ShimToAgent => Some((Side::Agent, Party::Client)),
        Dir::AgentToShim => Some((Side::Agent, Party::Agent)),
        Dir::AgentToFile | Dir::Shim => None,
    }
}

/// What a frame is, by its members.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape<'v> {
    Request {
        id: &'v Value,
        method: &'v str,
    },
    Notification {
        method: &'v str,
    },
    /// An answer: `result` (or `error` when `ok` is false).
    Answer {
        id: &'v Value,
        ok: bool,
    },
    /// Not an object: a batch (an array) or a scalar.
    NotAnObject,
    /// An object that is none of the above (a `method` that is not a string, an answer with both or
    /// neither of `result` and `error`).
    Unclear(&'static str),
}

/// What `frame` is.
pub fn shape(frame: &Value) -> Shape<'_> {
    let Some(obj) = frame.as_object() else { return Shape::NotAnObject };
    match (obj.get("method"), obj.get("id")) {
        (Some(Value::String(method)), Some(id)) => Shape::Request { id, method },
        (Some(Value::String(method)), None) => Shape::Notification { method },
        (Some(_), _) => Shape::Unclear("\"method\" is not a string"),
        (None, Some(id)) => match (obj.contains_key("result"), obj.contains_key("error")) {
            (true, false) => Shape::Answer { id, ok: true },
            (false, true) => Shape::Answer { id, ok: false },
            (true, true) => Shape::Unclear("an answer has both \"result\" and \"error\""),
            (false, false) => Shape::Unclear("neither a request (\"method\") nor an answer (\"result\" or \"error\")"),
        },
        (None, None) => Shape::Unclear("neither a request, a notification nor an answer (no \"method\", no \"id\")"),
    }
}

/// A request not answered yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Open {
    pub method: String,
    /// When it was sent (milliseconds, the trace's clock).
    pub t: f64,
    /// Its line in the trace.
    pub line: usize,
}

/// Open requests kept per party: a peer that never answers cannot make the reader hold more.
pub const MAX_OPEN: usize = 1 << 16;

/// The requests one party sent and the other has not answered yet.
#[derive(Debug, Default)]
pub struct Requests {
    /// By id: the open requests with it, oldest first (a peer may reuse an id still open; each gets its answer).
    open: HashMap<String, VecDeque<Open>>,
    /// Requests open in all.
    count: usize,
    /// Ids in the order sent, for dropping the oldest past [`MAX_OPEN`] (answered ones are skipped then).
    order: VecDeque<String>,
}

/// An id as a key: its JSON text (`1` and `"1"` are different ids).
fn key(id: &Value) -> String {
    id.to_string()
}

impl Requests {
    /// A request was sent. `false`: a request with this id is still open (both are kept, answered in order).
    pub fn sent(&mut self, id: &Value, method: &str, t: f64, line: usize) -> bool {
        let k = key(id);
        let same = self.open.entry(k.clone()).or_default();
        let fresh = same.is_empty();
        same.push_back(Open { method: method.to_owned(), t, line });
        self.count += 1;
        self.order.push_back(k);
        if self.order.len() > 2 * MAX_OPEN {
            let open = &self.open;
            self.order.retain(|k| open.contains_key(k));
        }
        while self.count > MAX_OPEN {
            let Some(old) = self.order.pop_front() else { break };
            self.take(&old);
        }
        fresh
    }

    /// The request `id` answers (the oldest open one with that id), no longer open; `None` if no open request
    /// has that id.
    pub fn answered(&mut self, id: &Value) -> Option<Open> {
        self.take(&key(id))
    }

    /// The oldest open request with the id whose JSON text is `k`, no longer open.
    fn take(&mut self, k: &str) -> Option<Open> {
        let same = self.open.get_mut(k)?;
        let open = same.pop_front();
        if same.is_empty() {
            self.open.remove(k);
        }
        if open.is_some() {
            self.count -= 1;
        }
        open
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The requests still open.
    pub fn open_requests(&self) -> impl Iterator<Item = &Open> {
        self.open.values().flatten()
    }
}

/// One conversation: the open requests of each party.
#[derive(Debug, Default)]
pub struct Conversation {
    pub by_client: Requests,
    pub by_agent: Requests,
}

impl Conversation {
    pub fn requests(&mut self, sender: Party) -> &mut Requests {
        match sender {
            Party::Client => &mut self.by_client,
            Party::Agent => &mut self.by_agent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frames_are_told_apart_by_their_members() {
        let req = json!({"jsonrpc": "2.0", "id": 1, "method": "m"});
        assert_eq!(shape(&req), Shape::Request { id: &json!(1), method: "m" });
        assert_eq!(shape(&json!({"method": "m"})), Shape::Notification { method: "m" });
        assert_eq!(shape(&json!({"id": null, "error": {}})), Shape::Answer { id: &Value::Null, ok: false });
        assert!(matches!(shape(&json!([1])), Shape::NotAnObject));
        assert!(matches!(shape(&json!({"id": 1, "result": 1, "error": {}})), Shape::Unclear(_)));
        assert!(matches!(shape(&json!({"id": 1})), Shape::Unclear(_)));
        assert!(matches!(shape(&json!({"method": 3})), Shape::Unclear(_)));
    }

    #[test]
    fn answers_find_their_request_once_and_ids_keep_their_type() {
        let mut r = Requests::default();
        assert!(r.sent(&json!(1), "a", 0.0, 1));
        assert!(r.sent(&json!("1"), "b", 1.0, 2));
        assert!(!r.sent(&json!(1), "c", 2.0, 3), "a duplicate of an open id");
        // Each gets an answer, the oldest first.
        assert_eq!(r.answered(&json!(1)).map(|o| o.method), Some("a".into()));
        assert_eq!(r.answered(&json!(1)).map(|o| o.method), Some("c".into()));
        assert_eq!(r.answered(&json!(1)), None);
        assert_eq!(r.answered(&json!("1")).map(|o| o.line), Some(2));
    }

    #[test]
    fn open_requests_are_bounded() {
        let mut r = Requests::default();
        for i in 0..MAX_OPEN + 10 {
            r.sent(&json!(i), "m", 0.0, i);
        }
        assert_eq!(r.len(), MAX_OPEN);
        assert!(r.answered(&json!(0)).is_none(), "the oldest went first");
        assert!(r.answered(&json!(MAX_OPEN + 9)).is_some());
    }
}

//! The session table: the sessions of this connection and what runs in each, recorded once by the stack
//! beside its request table ([`super::requests`]), for every layer to ask through [`super::Cx`].
//!
//! What it holds, and who writes it:
//!
//! - **Root sessions**, the ones Coda opened on this connection: the stack records one when the agent's
//!   result to `session/new` or `session/fork` (its `sessionId`), or to `session/load` or `session/resume`
//!   (the request's `sessionId`) comes in, before any layer sees that answer. When the agent answers its
//!   `session/close` with a result, every layer's [`super::Layer::session_closed`] ends what it runs for the
//!   session and its children ([`Sessions::family`]) before that answer goes up, and once it has left the stack
//!   the table forgets them and remembers them as closed ([`Sessions::was_closed`]). An error answer opens (or
//!   closes) nothing.
//! - **Children**: sessions the agent runs for a root (a subagent's), as the layer that learns of them says
//!   ([`super::Cx::add_child`]); never a root.
//! - **Whose turn runs** ([`super::Cx::turn`]): Coda's (an open `session/prompt` of the session, from the
//!   request table), the shim's own (a request of the shim's that names the session, such as a `/compact`
//!   prompt: the stack records each while the agent owes its answer), or the CLI's own (the CLI said the
//!   session is busy, [`Session::set_busy`], and neither of the others runs).
//! - Whether the CLI said the session runs **since Coda's latest prompt was sent** ([`Session::started`]): what
//!   "the agent has started executing" (section 插话) means for a CLI that says so.
//! - **A compaction** ([`Session::compaction`]), the **prompts held** behind it ([`Session::held`]) and **a
//!   steering message in flight** ([`Session::steering`]): the compaction and steering machines of
//!   [`crate::coda`] write them, every other layer reads them.
//!
//! Bounds: a root is forgotten on its `session/close` (with its children), at most [`CLOSED_KEPT`] closed ones
//! are remembered, and everything with the process (the table lives in the
//! stack). At most [`MAX_ROOTS`] roots are kept (past that the oldest with nothing running or held is dropped,
//! with a warning), at most [`MAX_CHILDREN`] children (the oldest dropped first), and at most [`MAX_OWN`] of
//! the shim's own requests (one the agent never answers is dropped oldest first). Held prompts are client
//! requests, bounded as the client's requests are; each held prompt leaves the table when it is released or
//! answered.

use crate::HashMap;
use std::collections::VecDeque;

use serde_json::Value;

use crate::frame::{Frame, Id, Kind, Method};

/// Roots kept at most (Coda opens a few per process; a client that opens more loses its oldest idle ones).
pub const MAX_ROOTS: usize = 1024;
/// Children kept at most (the oldest are dropped first).
pub const MAX_CHILDREN: usize = 4096;
/// The shim's own requests about a session kept at most while the agent owes their answer.
pub const MAX_OWN: usize = 1024;

/// How a root session came to this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    New,
    Fork,
    Load,
    Resume,
}

impl Opened {
    /// The method that opens a session this way, or `None` for another method.
    pub fn by(method: &str) -> Option<Opened> {
        Some(match method {
            "session/new" => Opened::New,
            "session/fork" => Opened::Fork,
            "session/load" => Opened::Load,
            "session/resume" => Opened::Resume,
            _ => return None,
        })
    }

    /// Whether the session existed before this connection opened it (its history is the CLI's).
    pub fn is_reopened(self) -> bool {
        matches!(self, Opened::Load | Opened::Resume)
    }
}

/// Whose turn runs in a session ([`super::Cx::turn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Coda's `session/prompt` `prompt` is open; `sent`: it has left the stack towards the agent (else a layer
    /// holds it).
    Coda { prompt: Id, sent: bool },
    /// The shim's own request `method` about the session (a `/compact` prompt) is with the agent.
    Shim { method: Method },
    /// The CLI said the session runs a turn (its own: no request of Coda's or the shim's is open).
    Cli,
}

/// A compaction of a session, as the compaction machine ([`crate::coda::compact`]) records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// Coda's `_coda/session/compact` request, until it is answered.
    pub coda: Option<Id>,
    /// Tells this compaction from an earlier one of the same session (their late answers and wake-ups).
    pub round: u64,
    /// Past the deadline: Coda was answered, the CLI was asked to stop and its end is awaited.
    pub overdue: bool,
}

/// One session of the table.
#[derive(Debug)]
pub struct Session {
    /// How Coda opened it; `None` for a child.
    opened: Option<Opened>,
    /// The root it runs for, when a child and the layer that named it knew.
    parent: Option<String>,
    /// What the CLI last said: a turn runs in the session (`None`: it never said).
    busy: Option<bool>,
    /// The CLI said the session runs since Coda's latest prompt in it was sent.
    started: bool,
    compaction: Option<Compaction>,
    /// Coda's requests held for the session (its prompts behind a compaction), in arrival order.
    held: Vec<Frame>,
    /// Coda's `_session/steering` request in flight.
    steering: Option<Id>,
    /// The CLI's `used` in its latest `usage_update` of the session (a root's).
    used: Option<u64>,
    /// Order of arrival among sessions (the oldest go first past the bounds).
    seq: u64,
}

impl Session {
    fn new(opened: Option<Opened>, parent: Option<String>, seq: u64) -> Session {
        Session {
            opened,
            parent,
            busy: None,
            started: false,
            compaction: None,
            held: Vec::new(),
            steering: None,
            used: None,
            seq,
        }
    }

    /// How Coda opened it on this connection; `None` for a child.
    pub fn opened(&self) -> Option<Opened> {
        self.opened
    }

    /// Whether Coda opened it (a root), not a child.
    pub fn is_root(&self) -> bool {
        self.opened.is_some()
    }

    /// The root a child runs for, when known.
    pub fn parent(&self) -> Option<&str> {
        self.parent.as_deref()
    }

    /// What the CLI last said about a turn running in the session (`None`: it never said).
    pub fn busy(&self) -> Option<bool> {
        self.busy
    }

    /// The CLI says whether a turn runs in the session (any turn: Coda's, its own). A CLI that says nothing
    /// never calls this.
    pub fn set_busy(&mut self, busy: bool) {
        self.busy = Some(busy);
        if busy {
            self.started = true;
        }
    }

    /// The CLI says a turn runs in the session and whose: a CLI that names the running prompt tells Coda's
    /// (`coda`, which marks [`Session::started`]) from one of its own or one it queued before Coda's.
    pub fn set_running(&mut self, coda: bool) {
        self.busy = Some(true);
        if coda {
            self.started = true;
        }
    }

    /// Whether the CLI said the session runs since Coda's latest prompt in it was sent.
    pub fn started(&self) -> bool {
        self.started
    }

    pub fn compaction(&self) -> Option<&Compaction> {
        self.compaction.as_ref()
    }

    /// The compaction machine records (or, with `None`, ends) the session's compaction.
    pub fn set_compaction(&mut self, compaction: Option<Compaction>) {
        self.compaction = compaction;
    }

    pub fn compaction_mut(&mut self) -> Option<&mut Compaction> {
        self.compaction.as_mut()
    }

    /// Coda's requests held for the session, in arrival order.
    pub fn held(&self) -> &[Frame] {
        &self.held
    }

    /// The held requests, to edit one in place (a steering message joining a held prompt).
    pub fn held_mut(&mut self) -> &mut [Frame] {
        &mut self.held
    }

    /// Holds Coda's request `frame` for the session (it stays open and unsent in the request table).
    pub fn hold(&mut self, frame: Frame) {
        self.held.push(frame);
    }

    /// Takes every held request, in arrival order.
    pub fn take_held(&mut self) -> Vec<Frame> {
        std::mem::take(&mut self.held)
    }

    /// Takes the held request `id` (one the client withdrew), if it is held.
    pub fn take_held_id(&mut self, id: &Id) -> Option<Frame> {
        let at = self.held.iter().position(|f| f.id() == Some(id))?;
        Some(self.held.remove(at))
    }

    /// The CLI's `used` in its latest `usage_update` of the session, for a root: its own count of the context,
    /// which a compaction's `before` is where the CLI says no count of its own. Set by the usage facts layer
    /// ([`crate::coda::usage`]), which reads every update's figures and is below the compaction layer in every
    /// stack (which reads them here, not in the frame again).
    pub fn used(&self) -> Option<u64> {
        self.used
    }

    pub fn set_used(&mut self, used: u64) {
        self.used = Some(used);
    }

    /// Coda's `_session/steering` request in flight in the session.
    pub fn steering(&self) -> Option<&Id> {
        self.steering.as_ref()
    }

    pub fn set_steering(&mut self, steering: Option<Id>) {
        self.steering = steering;
    }

    /// Whether anything runs or waits in the session that dropping it would lose.
    fn is_idle(&self) -> bool {
        self.compaction.is_none() && self.held.is_empty() && self.steering.is_none()
    }
}

/// The shim's own request about a session, while the agent owes its answer.
#[derive(Debug)]
struct Own {
    session: String,
    method: Method,
    seq: u64,
}

/// The sessions of this connection (see the module docs).
#[derive(Debug, Default)]
pub struct Sessions {
    map: HashMap<String, Session>,
    /// Children in the order they were named (for [`MAX_CHILDREN`]).
    children: VecDeque<String>,
    own: HashMap<Id, Own>,
    next: u64,
    /// Sessions closed on this connection, the latest [`CLOSED_KEPT`], oldest first (what a layer still says
    /// of one afterwards is about no session Coda has).
    closed: VecDeque<String>,
}

/// Closed sessions remembered at most.
pub const CLOSED_KEPT: usize = 256;

/// A string `key` of a JSON object, unless empty.
fn string_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

impl Sessions {
    pub fn get(&self, session: &str) -> Option<&Session> {
        self.map.get(session)
    }

    pub fn get_mut(&mut self, session: &str) -> Option<&mut Session> {
        self.map.get_mut(session)
    }

    /// Whether Coda opened `session` on this connection (and did not close it).
    pub fn is_root(&self, session: &str) -> bool {
        self.map.get(session).is_some_and(Session::is_root)
    }

    /// Whether a layer named `session` a child.
    pub fn is_child(&self, session: &str) -> bool {
        self.map.get(session).is_some_and(|s| !s.is_root())
    }

    /// The root sessions, in no particular order.
    pub fn roots(&self) -> impl Iterator<Item = &str> {
        self.map.iter().filter(|(_, s)| s.is_root()).map(|(id, _)| id.as_str())
    }

    /// The method of the shim's own request about `session` the agent owes, the oldest first.
    pub fn own_request(&self, session: &str) -> Option<&Method> {
        self.own.values().filter(|o| o.session == session).min_by_key(|o| o.seq).map(|o| &o.method)
    }

    fn tick(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The agent answered Coda's request `method` (`named`: its `params.sessionId`) with `answer`.
    pub(super) fn answered(&mut self, method: &str, named: Option<&str>, answer: &Frame) {
        let Some(opened) = Opened::by(method) else { return };
        let value = answer.value();
        let Some(result) = value.get("result") else { return };
        let session = match opened {
            Opened::New | Opened::Fork => string_at(result, "sessionId"),
            Opened::Load | Opened::Resume => named.filter(|s| !s.is_empty()),
        };
        let Some(session) = session else { return };
        self.closed.retain(|c| c != session);
        let seq = self.tick();
        match self.map.get_mut(session) {
            Some(known) => {
                known.opened = Some(opened);
                known.parent = None;
                known.seq = seq;
            }
            None => {
                self.map.insert(session.to_owned(), Session::new(Some(opened), None, seq));
                self.bound_roots();
            }
        }
    }

    /// Past [`MAX_ROOTS`]: drops the oldest root with nothing running or held.
    fn bound_roots(&mut self) {
        if self.map.values().filter(|s| s.is_root()).count() <= MAX_ROOTS {
            return;
        }
        let oldest = self.map.iter().filter(|(_, s)| s.is_root() && s.is_idle()).min_by_key(|(_, s)| s.seq);
        if let Some(id) = oldest.map(|(id, _)| id.clone()) {
            tracing::warn!(
                "more than {MAX_ROOTS} sessions opened on this connection: the oldest idle one is forgotten"
            );
            self.map.remove(&id);
        }
    }

    /// A layer learnt that `child` is a session the agent runs for `parent` (a subagent's). A root stays a root.
    pub fn add_child(&mut self, child: &str, parent: Option<&str>) {
        if child.is_empty() {
            return;
        }
        if let Some(known) = self.map.get_mut(child) {
            if !known.is_root() && parent.is_some() {
                known.parent = parent.map(str::to_owned);
            }
            return;
        }
        let seq = self.tick();
        self.map.insert(child.to_owned(), Session::new(None, parent.map(str::to_owned), seq));
        self.children.push_back(child.to_owned());
        while self.children.len() > MAX_CHILDREN {
            let Some(old) = self.children.pop_front() else { break };
            if self.map.get(&old).is_some_and(|s| !s.is_root()) {
                self.map.remove(&old);
            }
        }
    }

    /// `session` and every session the table has as its child, grandchild and so on (`session` first; the
    /// others in the order they were named).
    pub fn family(&self, session: &str) -> Vec<String> {
        let mut family = vec![session.to_owned()];
        let mut at = 0;
        while at < family.len() {
            let parent = family[at].clone();
            let mut kids: Vec<(&String, u64)> = self
                .map
                .iter()
                .filter(|(id, s)| s.parent.as_deref() == Some(parent.as_str()) && !family.contains(id))
                .map(|(id, s)| (id, s.seq))
                .collect();
            kids.sort_by_key(|(_, seq)| *seq);
            family.extend(kids.into_iter().map(|(id, _)| id.clone()));
            at += 1;
        }
        family
    }

    /// Forgets `sessions` (a closed session's [`Sessions::family`]): what the table kept of them, and the shim's
    /// own requests about them; remembers them as closed.
    pub(super) fn forget(&mut self, sessions: &[String]) {
        for s in sessions {
            self.map.remove(s);
            self.children.retain(|c| c != s);
            self.own.retain(|_, o| o.session != *s);
            self.closed.retain(|c| c != s);
            self.closed.push_back(s.clone());
        }
        while self.closed.len() > CLOSED_KEPT {
            self.closed.pop_front();
        }
    }

    /// Whether `session` was closed on this connection (one of the latest [`CLOSED_KEPT`]) and not opened
    /// again since.
    pub fn was_closed(&self, session: &str) -> bool {
        self.closed.iter().any(|c| c == session)
    }

    /// Coda's `session/prompt` of `session` left the stack towards the agent.
    pub(super) fn prompt_sent(&mut self, session: &str) {
        if let Some(s) = self.map.get_mut(session) {
            s.started = false;
        }
    }

    /// The shim sent its own request `frame` (`id`) to the agent: recorded when it names a session.
    pub(super) fn own_sent(&mut self, id: &Id, method: &str, params: &Value) {
        let Some(session) = string_at(params, "sessionId") else { return };
        let seq = self.tick();
        self.own.insert(id.clone(), Own { session: session.to_owned(), method: Method::from(method), seq });
        if self.own.len() > MAX_OWN
            && let Some(oldest) = self.own.iter().min_by_key(|(_, o)| o.seq).map(|(id, _)| id.clone())
        {
            self.own.remove(&oldest);
        }
    }

    /// The agent answered the shim's own request `id`.
    pub(super) fn own_answered(&mut self, id: &Id) {
        self.own.remove(id);
    }

    /// An answer to Coda's request `id` left the stack towards the client: it is held no more.
    pub(super) fn closed(&mut self, id: &Id, session: Option<&str>) {
        if let Some(s) = session.and_then(|s| self.map.get_mut(s))
            && !s.held.is_empty()
        {
            s.held.retain(|f| !matches!(f.kind(), Kind::Request { id: held, .. } if held == id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(v: Value) -> Frame {
        Frame::from_value(&v)
    }

    #[test]
    fn roots_are_opened_by_answers_with_a_result_and_closed_by_session_close() {
        let mut t = Sessions::default();
        t.answered("session/new", None, &answer(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"n"}})));
        t.answered("session/load", Some("l"), &answer(json!({"jsonrpc":"2.0","id":2,"result":null})));
        t.answered("session/resume", Some("r"), &answer(json!({"jsonrpc":"2.0","id":3,"result":{}})));
        t.answered("session/fork", Some("n"), &answer(json!({"jsonrpc":"2.0","id":4,"result":{"sessionId":"f"}})));
        // Errors, other methods, ids that are no strings or empty open nothing.
        t.answered("session/load", Some("gone"), &answer(json!({"jsonrpc":"2.0","id":5,"error":{"code":1}})));
        t.answered("session/prompt", Some("p"), &answer(json!({"jsonrpc":"2.0","id":6,"result":{"sessionId":"q"}})));
        t.answered("session/new", None, &answer(json!({"jsonrpc":"2.0","id":7,"result":{"sessionId":1e300}})));
        t.answered("session/new", None, &answer(json!({"jsonrpc":"2.0","id":8,"result":{"sessionId":""}})));
        t.answered("session/load", Some(""), &answer(json!({"jsonrpc":"2.0","id":9,"result":{}})));
        let mut roots: Vec<&str> = t.roots().collect();
        roots.sort();
        assert_eq!(roots, ["f", "l", "n", "r"]);
        assert_eq!(t.get("l").and_then(Session::opened), Some(Opened::Load));
        assert!(t.get("l").and_then(Session::opened).is_some_and(Opened::is_reopened));
        assert!(!t.get("n").and_then(Session::opened).is_some_and(Opened::is_reopened));
        // Closed: the session and its children go, and are remembered as closed until opened again.
        t.add_child("c", Some("n"));
        t.add_child("gc", Some("c"));
        t.add_child("other", Some("f"));
        assert_eq!(t.family("n"), ["n", "c", "gc"]);
        assert_eq!(t.family("nobody"), ["nobody"], "a session a layer may know of though the table does not");
        t.forget(&t.family("n"));
        assert!(!t.is_root("n") && t.get("n").is_none() && t.get("gc").is_none());
        assert!(t.was_closed("n") && t.was_closed("c") && !t.was_closed("f"));
        assert!(t.is_child("other"));
        t.answered("session/load", Some("n"), &answer(json!({"jsonrpc":"2.0","id":12,"result":{}})));
        assert!(t.is_root("n") && !t.was_closed("n"), "opened again");
        for n in 0..=CLOSED_KEPT {
            t.forget(&[format!("x{n}")]);
        }
        assert_eq!(t.closed.len(), CLOSED_KEPT);
    }

    #[test]
    fn children_are_no_roots_and_bounded_oldest_first() {
        let mut t = Sessions::default();
        t.answered("session/new", None, &answer(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"root"}})));
        t.add_child("root", Some("x"));
        assert!(t.is_root("root"), "a root named as a child stays a root");
        t.add_child("c", Some("root"));
        t.add_child("", Some("root"));
        assert!(t.is_child("c") && !t.is_root("c"));
        assert_eq!(t.get("c").and_then(Session::parent), Some("root"));
        for n in 0..MAX_CHILDREN {
            t.add_child(&format!("k{n}"), None);
        }
        assert!(t.get("c").is_none(), "the oldest child is dropped past the bound");
        assert!(t.is_child("k0") && t.is_root("root"));
        assert_eq!(t.map.len(), MAX_CHILDREN + 1);
    }

    #[test]
    fn past_the_root_bound_the_oldest_idle_root_goes() {
        let mut t = Sessions::default();
        for n in 0..=MAX_ROOTS {
            let new = answer(json!({"jsonrpc":"2.0","id":n,"result":{"sessionId":format!("s{n}")}}));
            t.answered("session/new", None, &new);
            if n == 0 {
                t.get_mut("s0").unwrap().set_compaction(Some(Compaction { coda: None, round: 1, overdue: false }));
            }
        }
        assert!(t.is_root("s0"), "a compacting session is kept");
        assert!(!t.is_root("s1"), "the oldest idle one went");
        assert_eq!(t.roots().count(), MAX_ROOTS);
    }

    #[test]
    fn started_means_busy_since_the_latest_prompt_and_own_requests_are_bounded() {
        let mut t = Sessions::default();
        t.answered("session/new", None, &answer(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}})));
        let s = t.get_mut("s").unwrap();
        assert_eq!((s.busy(), s.started()), (None, false));
        s.set_busy(true);
        t.prompt_sent("s");
        assert!(!t.get("s").unwrap().started(), "busy from before the prompt says nothing of it");
        t.get_mut("s").unwrap().set_busy(true);
        assert!(t.get("s").unwrap().started());
        let id = Id::string("own-1");
        t.own_sent(&id, "session/prompt", &json!({"sessionId":"s"}));
        t.own_sent(&Id::string("own-x"), "x/y", &json!({"noSession":1}));
        assert_eq!(t.own_request("s").map(|m| m.as_str()), Some("session/prompt"));
        t.own_answered(&id);
        assert_eq!(t.own_request("s"), None);
        for n in 0..=MAX_OWN {
            t.own_sent(&Id::string(&format!("o{n}")), "m", &json!({"sessionId":"s"}));
        }
        assert_eq!(t.own.len(), MAX_OWN);
        assert!(!t.own.contains_key(&Id::string("o0")), "the oldest goes");
    }

    #[test]
    fn a_held_request_leaves_the_table_when_its_answer_reaches_the_client() {
        let mut t = Sessions::default();
        t.answered("session/new", None, &answer(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}})));
        let prompt =
            |id: u32| answer(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":"s"}}));
        t.get_mut("s").unwrap().hold(prompt(7));
        t.get_mut("s").unwrap().hold(prompt(8));
        t.closed(&Id::from_json("7"), Some("s"));
        assert_eq!(t.get("s").unwrap().held(), [prompt(8)]);
        assert_eq!(t.get_mut("s").unwrap().take_held(), [prompt(8)]);
        assert!(t.get("s").unwrap().held().is_empty());
    }
}

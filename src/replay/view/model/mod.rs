//! The picture of a trace: lanes (sessions and child sessions), turns, marks and waits, each with its frames.
//!
//! Built in one pass over the frames Coda sent and received (`client->shim`, `shim->client`): what Coda saw
//! is the timeline. The agent's side appears through [`super::changes`]: every frame the shim edited (both
//! versions), made, or did not pass on is a mark of its own. Nothing here knows an agent by name: an agent's
//! own turn is recognised the way Coda's protocol ("Agent 活动", rule 3) defines it, as the time a wait is
//! `handling` while no turn of Coda's is running.
//!
//! What the builder reads from the frames is here; the marks of what the shim changed and of what `diff` found
//! are in `marks`, and the rows each lane gets once every item is known in `layout`.

use crate::{HashMap, HashSet};

use serde::Serialize;
use serde_json::Value;

use super::changes::Linker;
use super::read::{self, BadLine, Dir, Record};

mod layout;
mod marks;

/// What a timeline item shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A turn Coda started (`session/prompt` → its answer).
    Turn,
    /// A turn the agent ran on its own (a wait `handling` outside Coda's turns).
    Own,
    /// `session/cancel`.
    Cancel,
    /// Text the agent wrote (consecutive chunks merged).
    Text,
    Thinking,
    /// Text of the user's message (a replayed history or the agent's echo).
    User,
    /// A tool call, from its first report to its last.
    Tool,
    /// `session/request_permission` → the answer.
    Permission,
    /// Another request, either way, → its answer.
    Request,
    /// Another `session/update`.
    Update,
    /// A frame of another method.
    Other,
    /// A `_coda/wait` from its first state to its end state.
    Wait,
    /// `_coda/wait/stop` → its answer.
    Stop,
    /// A compaction: Coda's `_coda/session/compact` → its answer (`compacted`, `before` → `after`), or the
    /// agent's `compaction_update`s from `in_progress` to `completed` or `failed` (asked for or automatic).
    Compact,
    /// A `usage_update`: `used` of `size`, and the usage facts (`_meta.coda`) on hover and in the detail.
    Usage,
    /// A frame the shim edited, made, or did not pass on.
    Shim,
    /// A session file the CLI wrote.
    File,
    /// A line that was not JSON-RPC, or a frame that could not be read.
    Bad,
}

/// One session's lane.
#[derive(Debug, Clone, Serialize)]
pub struct Lane {
    /// The session id; empty for the connection (frames of no session).
    pub session: String,
    /// The lane of the session whose wait announced this one as its `childSessionId`.
    pub parent: Option<usize>,
    /// When the session was created, loaded, announced (a child), or first seen.
    pub start: f64,
    /// The rows of the lane, top to bottom (`turns`, `own`, `events`, `shim`, `wait`…).
    pub rows: Vec<&'static str>,
}

/// One span or mark.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub lane: usize,
    pub kind: Kind,
    pub row: usize,
    pub t: f64,
    /// End of a span; `None` for a point, or a span still open when the trace ends (`open`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
    pub label: String,
    /// Status, stop reason, answer, or a wait's end state.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub state: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub red: bool,
    /// One of its frames was edited or made by the shim.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub changed: bool,
    pub method: String,
    /// Text for the search box (prompt, message, title, detail).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub text: String,
    /// Indexes of its frames in the trace's records (0-based).
    pub frames: Vec<u32>,
    /// A wait's states: `[state, time]` each time it changed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub segs: Vec<(String, f64)>,
    /// A wait's `waitId` (a wait, a stop).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub wait: String,
}

/// A frame the shim did not pass on as it came: `[frame, fate, other version or -1, changes]` (fates as in
/// [`super::changes::Fate::code`]).
#[derive(Debug, Clone, Serialize)]
pub struct Changed(pub usize, pub u8, pub i64, pub Vec<String>);

#[derive(Debug, Serialize)]
pub struct Model {
    /// Wall-clock time of the first record (ms since 1970), for a trace with `ts`.
    pub clock: Option<f64>,
    /// Time of the last record (ms since the first).
    pub end: f64,
    /// Records read (each is a frame of the page, by its index).
    pub frames: usize,
    pub lanes: Vec<Lane>,
    pub items: Vec<Item>,
    /// Every frame edited, made or not passed on, by its index; the rest were passed on as they came.
    pub changed: Vec<Changed>,
    pub bad: Vec<BadLine>,
}

const LABEL_CHARS: usize = 120;
const TEXT_CHARS: usize = 4000;
const TERMINAL: [&str; 4] = ["done", "failed", "cancelled", "stopped"];
const PLAIN_STOPS: [&str; 5] = ["end_turn", "cancelled", "max_tokens", "max_turn_requests", "refusal"];

fn cut(s: &str, n: usize) -> String {
    crate::text::cut(s, n, crate::text::Unit::Chars).into_owned()
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// The text of ACP content blocks (a prompt, a chunk's `content`).
fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::Array(blocks)) => {
            blocks.iter().filter_map(|b| b.get("text")?.as_str()).collect::<Vec<_>>().join("\n")
        }
        Some(b) => b.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
        None => String::new(),
    }
}

/// A value as a person reads it: a string without its quotes.
fn plain(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// An error answer as `(state, message)`: Coda's failure kind when it has one.
fn error_state(err: &Value) -> (String, String) {
    let kind = str_at(err, &["data", "_meta", "coda", "failure", "kind"]);
    let code = err.get("code").map(Value::to_string).unwrap_or_default();
    let message = str_at(err, &["message"]).unwrap_or_default();
    (kind.map(str::to_owned).unwrap_or_else(|| format!("error {code}")), cut(message, LABEL_CHARS))
}

/// Builds the model one record at a time (see the module's docs).
#[derive(Default)]
pub struct Builder {
    lanes: Vec<Lane>,
    lane_of: HashMap<String, usize>,
    items: Vec<Item>,
    /// The first item of each record (`NONE`: none).
    item_of: Vec<u32>,
    linker: Linker,
    /// Frames are not linked with their other version (a page of one side of two traces: `acp-replay diff`).
    no_links: bool,
    changed: Vec<Changed>,
    bad: Vec<BadLine>,
    end: f64,
    /// Client requests awaiting the shim's answer, and agent requests awaiting Coda's, by id text.
    client_asks: HashMap<String, usize>,
    agent_asks: HashMap<String, usize>,
    turns_running: HashMap<usize, usize>,
    waits: HashMap<(usize, String), usize>,
    handling: HashMap<usize, HashSet<String>>,
    own: HashMap<usize, usize>,
    tools: HashMap<(usize, String), usize>,
    /// Compactions the agent reported, by (lane, compactionId).
    compactions: HashMap<(usize, String), usize>,
    /// The last event item of a lane, while text chunks may still join it.
    last_text: HashMap<usize, usize>,
}

impl Builder {
    fn lane(&mut self, session: &str, t: f64) -> usize {
        if let Some(&l) = self.lane_of.get(session) {
            return l;
        }
        self.lanes.push(Lane { session: session.to_owned(), parent: None, start: t, rows: Vec::new() });
        self.lane_of.insert(session.to_owned(), self.lanes.len() - 1);
        self.lanes.len() - 1
    }

    fn add(&mut self, lane: usize, kind: Kind, rec: usize, t: f64, label: String, method: &str) -> usize {
        self.items.push(Item {
            lane,
            kind,
            row: 0,
            t,
            end: None,
            open: false,
            label: cut(&label, LABEL_CHARS),
            state: String::new(),
            red: false,
            changed: false,
            method: method.to_owned(),
            text: String::new(),
            frames: vec![rec as u32],
            segs: Vec::new(),
            wait: String::new(),
        });
        let it = self.items.len() - 1;
        self.first_item(rec, it);
        if !matches!(kind, Kind::Text | Kind::Thinking | Kind::User) {
            self.last_text.remove(&lane);
        }
        it
    }

    fn join(&mut self, it: usize, rec: usize, t: f64) {
        let item = &mut self.items[it];
        item.frames.push(rec as u32);
        item.end = Some(item.end.unwrap_or(item.t).max(t));
        self.first_item(rec, it);
    }

    fn first_item(&mut self, rec: usize, it: usize) {
        if self.item_of[rec] == NONE {
            self.item_of[rec] = it as u32;
        }
    }

    fn item_of(&self, rec: usize) -> Option<usize> {
        self.item_of.get(rec).filter(|&&it| it != NONE).map(|&it| it as usize)
    }

    fn record(&mut self, i: usize, rec: &Record) {
        let t = rec.t;
        if rec.dir == Dir::Shim {
            // Which shim recorded the trace: no frame of either conversation.
            return;
        }
        if rec.dir == Dir::AgentToFile {
            let v: Value = serde_json::from_str(&rec.raw).unwrap_or_default();
            let label =
                format!("{} {}", str_at(&v, &["op"]).unwrap_or("file"), str_at(&v, &["path"]).unwrap_or_default());
            self.add(0, Kind::File, i, t, label, "");
            return;
        }
        let Some(frame) = &rec.frame else {
            if read::client_side(rec.dir) || rec.not_json {
                let label = if rec.not_json { "not JSON-RPC" } else { "unreadable frame" };
                let it = self.add(0, Kind::Bad, i, t, format!("{label} ({})", rec.dir.as_str()), "");
                self.items[it].red = true;
                self.items[it].text = cut(&rec.raw, TEXT_CHARS);
            }
            return;
        };
        if !read::client_side(rec.dir) {
            return;
        }
        let method = str_at(frame, &["method"]).unwrap_or_default();
        let id = frame.get("id").map(Value::to_string);
        let session = str_at(frame, &["params", "sessionId"]);
        let lane = session.map(|s| self.lane(s, t)).unwrap_or(0);
        match (rec.dir, method.is_empty(), id) {
            (Dir::ClientToShim, false, Some(id)) => self.client_request(i, t, lane, method, frame, id),
            (Dir::ClientToShim, false, None) => {
                let kind = if method == "session/cancel" { Kind::Cancel } else { Kind::Other };
                self.add(lane, kind, i, t, method.to_owned(), method);
            }
            (Dir::ShimToClient, true, Some(id)) => {
                let asked = self.client_asks.remove(&id);
                self.answer(i, t, frame, asked, true)
            }
            (Dir::ClientToShim, true, Some(id)) => {
                let asked = self.agent_asks.remove(&id);
                self.answer(i, t, frame, asked, false)
            }
            (Dir::ShimToClient, false, Some(id)) => {
                let (kind, label) = if method == "session/request_permission" {
                    (
                        Kind::Permission,
                        str_at(frame, &["params", "toolCall", "title"]).unwrap_or("permission").to_owned(),
                    )
                } else {
                    (Kind::Request, method.to_owned())
                };
                let it = self.add(lane, kind, i, t, label, method);
                self.agent_asks.insert(id, it);
            }
            (Dir::ShimToClient, false, None) if method == "session/update" => self.update(i, t, lane, frame),
            (Dir::ShimToClient, false, None) if method == "_coda/wait" => self.wait(i, t, lane, frame),
            _ => {
                let label = match str_at(frame, &["params", "update", "sessionUpdate"]) {
                    Some(u) => format!("{method} {u}"),
                    None if method.is_empty() => "answer to an unknown request".to_owned(),
                    None => method.to_owned(),
                };
                self.add(lane, Kind::Other, i, t, label, method);
            }
        }
    }

    fn client_request(&mut self, i: usize, t: f64, lane: usize, method: &str, frame: &Value, id: String) {
        let it = match method {
            "session/prompt" => {
                let text = content_text(frame.pointer("/params/prompt"));
                let it = self.add(lane, Kind::Turn, i, t, text.lines().next().unwrap_or("prompt").to_owned(), method);
                self.items[it].text = cut(&text, TEXT_CHARS);
                *self.turns_running.entry(lane).or_default() += 1;
                it
            }
            "_coda/wait/stop" => {
                let wait = str_at(frame, &["params", "waitId"]).unwrap_or_default().to_owned();
                let it = self.add(lane, Kind::Stop, i, t, format!("stop {wait}"), method);
                self.items[it].wait = wait;
                it
            }
            "_coda/session/compact" => self.add(lane, Kind::Compact, i, t, "compact".into(), method),
            _ => self.add(lane, Kind::Request, i, t, method.to_owned(), method),
        };
        self.client_asks.insert(id, it);
    }

    fn answer(&mut self, i: usize, t: f64, frame: &Value, asked: Option<usize>, to_client: bool) {
        let Some(it) = asked else {
            let it = self.add(0, Kind::Other, i, t, "answer to an unknown request".into(), "");
            if let Some(err) = frame.get("error") {
                self.items[it].red = true;
                self.items[it].state = error_state(err).0;
            }
            return;
        };
        self.join(it, i, t);
        let item = &mut self.items[it];
        if let Some(err) = frame.get("error") {
            let (state, message) = error_state(err);
            item.red = true;
            item.state = state;
            item.text = format!("{} {message}", item.text);
        } else if item.kind == Kind::Compact {
            let result = frame.get("result").cloned().unwrap_or_default();
            let n = |k: &str| result.get(k).and_then(Value::as_u64).map_or("?".to_owned(), |n| n.to_string());
            if result.get("compacted") == Some(&Value::Bool(true)) {
                item.state = "compacted".into();
                item.label = match (result.get("before"), result.get("after")) {
                    (None, None) => "compacted".into(),
                    (Some(_), None) => format!("compacted from {} tokens", n("before")),
                    (None, Some(_)) => format!("compacted to {} tokens", n("after")),
                    _ => format!("compacted {} → {} tokens", n("before"), n("after")),
                };
            } else {
                item.state = "not compacted".into();
                let reason = str_at(&result, &["reason"]).unwrap_or("no reason given");
                item.label = cut(&format!("not compacted: {reason}"), LABEL_CHARS);
            }
            item.text = cut(&serde_json::to_string_pretty(&result).unwrap_or_default(), TEXT_CHARS);
        } else if let Some(stop) = str_at(frame, &["result", "stopReason"]) {
            item.state = stop.to_owned();
            item.red = !PLAIN_STOPS.contains(&stop);
        } else if !to_client {
            let outcome = frame.pointer("/result/outcome");
            let answer = outcome.and_then(|o| str_at(o, &["optionId"]).or_else(|| str_at(o, &["outcome"])));
            item.state = answer.unwrap_or("answered").to_owned();
        }
        if item.kind == Kind::Turn
            && let Some(n) = self.turns_running.get_mut(&item.lane)
        {
            *n = n.saturating_sub(1);
        }
        // A new or loaded session: its lane starts with the request.
        if let Some(session) = str_at(frame, &["result", "sessionId"]) {
            let start = self.items[it].t;
            let lane = self.lane(session, start);
            self.lanes[lane].start = self.lanes[lane].start.min(start);
            self.items[it].lane = lane;
        }
    }

    fn update(&mut self, i: usize, t: f64, lane: usize, frame: &Value) {
        let update = frame.pointer("/params/update").cloned().unwrap_or_default();
        let kind_name = str_at(&update, &["sessionUpdate"]).unwrap_or_default();
        let chunk = match kind_name {
            "agent_message_chunk" => Some(Kind::Text),
            "agent_thought_chunk" => Some(Kind::Thinking),
            "user_message_chunk" => Some(Kind::User),
            _ => None,
        };
        if let Some(kind) = chunk {
            let text = content_text(update.get("content"));
            let it = match self.last_text.get(&lane) {
                Some(&it) if self.items[it].kind == kind => {
                    self.join(it, i, t);
                    it
                }
                _ => {
                    let it = self.add(lane, kind, i, t, String::new(), "session/update");
                    self.last_text.insert(lane, it);
                    it
                }
            };
            let item = &mut self.items[it];
            if item.text.len() < TEXT_CHARS {
                item.text.push_str(&text);
                item.text = cut(&item.text, TEXT_CHARS);
            }
            item.label = cut(item.text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default(), LABEL_CHARS);
            return;
        }
        if let Some(call) = str_at(&update, &["toolCallId"]).filter(|_| kind_name.starts_with("tool_call")) {
            let key = (lane, call.to_owned());
            let it = match self.tools.get(&key) {
                Some(&it) => {
                    self.join(it, i, t);
                    self.last_text.remove(&lane);
                    it
                }
                None => {
                    let it = self.add(lane, Kind::Tool, i, t, "tool call".into(), "session/update");
                    self.tools.insert(key, it);
                    it
                }
            };
            let item = &mut self.items[it];
            if let Some(title) = str_at(&update, &["title"]).filter(|s| !s.is_empty()) {
                item.label = cut(title, LABEL_CHARS);
                item.text = cut(title, TEXT_CHARS);
            }
            if let Some(status) = str_at(&update, &["status"]) {
                item.state = status.to_owned();
                item.red = status == "failed";
            }
            return;
        }
        match kind_name {
            "compaction_update" => self.compaction(i, t, lane, &update),
            "usage_update" => self.usage(i, t, lane, &update),
            _ => {
                self.add(lane, Kind::Update, i, t, kind_name.to_owned(), "session/update");
            }
        }
    }

    /// A `compaction_update`: a span per `compactionId` from its first report to `completed` or `failed`.
    fn compaction(&mut self, i: usize, t: f64, lane: usize, update: &Value) {
        let id = str_at(update, &["compactionId"]).unwrap_or_default().to_owned();
        let status = str_at(update, &["status"]).unwrap_or_default();
        let key = (lane, id);
        let it = match self.compactions.get(&key) {
            Some(&it) => {
                self.join(it, i, t);
                it
            }
            None => {
                let it = self.add(lane, Kind::Compact, i, t, "compaction".into(), "session/update");
                self.items[it].open = true;
                self.compactions.insert(key.clone(), it);
                it
            }
        };
        let item = &mut self.items[it];
        item.state = cut(status, LABEL_CHARS);
        if matches!(status, "completed" | "failed") {
            item.open = false;
            item.end = Some(item.end.unwrap_or(t).max(t));
            item.red = status == "failed";
            if let Some(e) = update.get("error") {
                let e = e.as_str().map_or_else(|| e.to_string(), str::to_owned);
                item.text = cut(&format!("error: {e}"), TEXT_CHARS);
            }
            self.compactions.remove(&key);
        }
    }

    /// A `usage_update`: a mark whose label says `used` of `size` and whose state and text carry the usage
    /// facts (`_meta.coda`), shown on hover and in the detail panel.
    fn usage(&mut self, i: usize, t: f64, lane: usize, update: &Value) {
        let n = |k: &str| update.get(k).map_or("?".to_owned(), |v| cut(&v.to_string(), 24));
        let label = format!("usage {} / {}", n("used"), n("size"));
        let it = self.add(lane, Kind::Usage, i, t, label, "session/update");
        let Some(facts) = update.pointer("/_meta/coda") else { return };
        let item = &mut self.items[it];
        match facts.as_object() {
            Some(map) => {
                let shown: Vec<String> = ["contextTokens", "lastRequestAt", "compactedAt", "cacheTtl"]
                    .iter()
                    .filter_map(|k| Some(format!("{k} {}", cut(&plain(map.get(*k)?), 40))))
                    .collect();
                item.state = cut(&shown.join(" · "), LABEL_CHARS * 2);
                item.text = cut(&serde_json::to_string_pretty(facts).unwrap_or_default(), TEXT_CHARS);
            }
            None => {
                item.state = "usage facts that are no object".into();
                item.red = true;
            }
        }
    }

    fn wait(&mut self, i: usize, t: f64, lane: usize, frame: &Value) {
        let p = frame.get("params").cloned().unwrap_or_default();
        let wait = str_at(&p, &["waitId"]).unwrap_or_default().to_owned();
        let state = str_at(&p, &["state"]).unwrap_or_default().to_owned();
        let key = (lane, wait.clone());
        let it = match self.waits.get(&key) {
            Some(&it) => {
                self.join(it, i, t);
                it
            }
            None => {
                let it = self.add(lane, Kind::Wait, i, t, wait.clone(), "_coda/wait");
                self.items[it].wait = wait.clone();
                self.waits.insert(key, it);
                it
            }
        };
        let item = &mut self.items[it];
        item.end = None;
        if let Some(title) = str_at(&p, &["title"]) {
            item.label = cut(title, LABEL_CHARS);
        }
        let kind = str_at(&p, &["kind"]).unwrap_or_default();
        let detail = str_at(&p, &["detail"]).unwrap_or_default();
        if !kind.is_empty() || !detail.is_empty() {
            item.text = cut(&format!("{kind} {} {detail}", item.label), TEXT_CHARS);
        }
        if item.segs.last().is_none_or(|(s, _)| *s != state) {
            item.segs.push((state.clone(), t));
        }
        if TERMINAL.contains(&state.as_str()) {
            item.end = Some(t);
            item.red = state == "failed";
        }
        item.state = state.clone();
        if let Some(child) = str_at(&p, &["childSessionId"]) {
            let c = self.lane(child, t);
            if c != lane && self.lanes[c].parent.is_none() {
                self.lanes[c].parent = Some(lane);
                self.lanes[c].start = t;
            }
        }
        self.own_turn(i, t, lane, &wait, &state);
    }

    /// Coda's protocol, "Agent 活动" rule 3: a wait `handling` outside Coda's turns is a turn of the agent's
    /// own, lasting until no wait of the session is `handling`.
    fn own_turn(&mut self, i: usize, t: f64, lane: usize, wait: &str, state: &str) {
        let handling = self.handling.entry(lane).or_default();
        if state == "handling" {
            handling.insert(wait.to_owned());
            let idle = self.turns_running.get(&lane).copied().unwrap_or(0) == 0;
            if idle && !self.own.contains_key(&lane) {
                let it = self.add(lane, Kind::Own, i, t, "agent's own turn".into(), "_coda/wait");
                self.items[it].open = true;
                self.own.insert(lane, it);
            } else if let Some(&it) = self.own.get(&lane) {
                self.join(it, i, t);
            }
        } else if handling.remove(wait) && handling.is_empty() {
            if let Some(it) = self.own.remove(&lane) {
                self.join(it, i, t);
                self.items[it].open = false;
            }
        }
    }
}

const NONE: u32 = u32::MAX;

impl Builder {
    pub fn new() -> Builder {
        let mut b = Builder::default();
        b.lane("", 0.0);
        b
    }

    /// Takes the next line of the trace.
    pub fn push(&mut self, line: read::Line) {
        match line {
            read::Line::Bad(b) => self.bad.push(b),
            read::Line::Record(rec) => {
                let i = self.item_of.len();
                self.item_of.push(NONE);
                self.end = self.end.max(rec.t);
                self.record(i, &rec);
                if self.no_links {
                    return;
                }
                for found in self.linker.push(i, &rec) {
                    self.shim_mark(found, Some(&rec));
                }
            }
        }
    }

    /// A builder for frames of one side only (what a peer sent and got), not linked to another version.
    pub fn without_links() -> Builder {
        Builder { no_links: true, ..Builder::new() }
    }

    /// The lane of `session` (made now when it is new), so lanes come in the order asked for.
    pub fn lane_for(&mut self, session: &str) -> usize {
        self.lane(session, 0.0)
    }

    /// Forgets the requests, turns, waits and text spans still open: the next records are of another trace.
    pub fn next_trace(&mut self) {
        self.client_asks.clear();
        self.agent_asks.clear();
        self.turns_running.clear();
        self.waits.clear();
        self.handling.clear();
        self.own.clear();
        self.tools.clear();
        self.last_text.clear();
    }

    /// Records taken so far.
    pub fn frames(&self) -> usize {
        self.item_of.len()
    }

    /// The model, once every line is in.
    pub fn finish(mut self, clock: Option<f64>) -> Model {
        let linker = std::mem::take(&mut self.linker);
        for found in linker.finish() {
            self.shim_mark(found, None);
        }
        let end = self.end;
        layout::layout(&mut self.items, &mut self.lanes, end);
        self.changed.sort_by_key(|c| c.0);
        Model {
            clock,
            end,
            frames: self.item_of.len(),
            lanes: self.lanes,
            items: self.items,
            changed: self.changed,
            bad: self.bad,
        }
    }
}

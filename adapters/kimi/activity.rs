//! The activity layer of `coda-kimi`: declares `_coda/wait`, finds each session's folder once Kimi has
//! answered `session/new`/`load`/`resume`, feeds what its files say through the [`Translator`], and
//! holds a client prompt while Kimi runs a turn of its own (kimi.md §3.3: Kimi would answer it with an
//! empty `end_turn` and run it unreported).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use coda_shim::frame::{self, Frame, Id, Kind};
use coda_shim::layer::{Cx, Event, EventSender, Layer};
use coda_shim::wait;
use serde_json::{Value, json};

use crate::translate::Translator;
use crate::watch::{self, Chunk, Op, Scan};
use crate::wire::{self, Fed, Feed, KNOWN_PROTOCOLS};

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Starts watching a session folder; the real one uses inotify, tests hand events in themselves.
pub type Starter = Box<dyn FnMut(&str, &Path) -> Result<(watch::Start, Option<watch::Handle>), String> + Send>;

struct Session {
    translator: Translator,
    feed: Feed,
    /// Client prompts held while Kimi is busy with a turn of its own.
    held: VecDeque<Frame>,
    /// Prompt answers held until the wire shows that turn's end, so that what Kimi recorded during
    /// the turn is reported before the turn ends (rule 1: the cause is the turn in progress).
    answers: Vec<Frame>,
    dir: String,
    _handle: Option<watch::Handle>,
}

pub struct Activity {
    start: Starter,
    root: Option<PathBuf>,
    /// The client declared `_meta.coda.waits`.
    waits: bool,
    initialize: HashSet<Id>,
    /// session/new|load|resume requests in flight: id -> sessionId asked for (None for new).
    setup: HashMap<Id, Option<String>>,
    sessions: HashMap<String, Session>,
    /// Client prompts sent to Kimi: id -> session.
    prompts: HashMap<Id, String>,
    /// Sessions whose files cannot be read: the relay carries on without activity.
    off: HashSet<String>,
    record: Option<std::fs::File>,
}

impl Activity {
    /// The real layer: watches Kimi's data root with inotify.
    pub fn new(events: EventSender) -> Activity {
        let start: Starter =
            Box::new(move |session, dir| watch::start(session, dir, events.clone()).map(|(s, h)| (s, Some(h))));
        let mut a = Activity::with_starter(watch::data_root(), start);
        if let Some(path) = std::env::var_os("CODA_KIMI_RECORD").filter(|p| !p.is_empty()) {
            match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
                Ok(f) => a.record = Some(f),
                Err(e) => tracing::warn!("cannot open CODA_KIMI_RECORD {}: {e}", PathBuf::from(path).display()),
            }
        }
        a
    }

    pub fn with_starter(root: Option<PathBuf>, start: Starter) -> Activity {
        Activity {
            start,
            root,
            waits: false,
            initialize: HashSet::new(),
            setup: HashMap::new(),
            sessions: HashMap::new(),
            prompts: HashMap::new(),
            off: HashSet::new(),
            record: None,
        }
    }

    /// Appends one record of what this layer saw, in the order it saw it (see fixtures/README.md).
    fn rec(&mut self, value: Value) {
        if let Some(f) = &mut self.record {
            let mut line = value.to_string().into_bytes();
            line.push(b'\n');
            let _ = f.write_all(&line);
        }
    }

    fn open_session(&mut self, session: &str, cx: &mut Cx) {
        let _ = cx;
        if self.sessions.contains_key(session) {
            return;
        }
        self.off.remove(session);
        let Some(root) = self.root.clone() else {
            tracing::warn!("no KIMI_CODE_HOME or HOME: Kimi's activity is not reported");
            self.off.insert(session.to_owned());
            return;
        };
        let Some(dir) = watch::find_session(&root, session) else {
            tracing::warn!(
                "Kimi's folder for session {session} not found under {}; activity is not reported",
                root.display()
            );
            self.off.insert(session.to_owned());
            return;
        };
        match (self.start)(session, &dir) {
            Ok((start, handle)) => {
                self.begin(session, &dir.to_string_lossy(), &start.header, start.cutoff_ms, handle);
            }
            Err(why) => {
                tracing::warn!("cannot watch Kimi's session {session}: {why}; activity is not reported");
                self.off.insert(session.to_owned());
            }
        }
    }

    /// Sets up the translation for a session whose main wire starts with `header`.
    pub fn begin(&mut self, session: &str, dir: &str, header: &[u8], cutoff_ms: u64, handle: Option<watch::Handle>) {
        let version = wire::parse_line(header.trim_ascii_end()).ok().and_then(|e| match e.record {
            wire::Record::Metadata { protocol_version } => Some(protocol_version),
            _ => None,
        });
        match version.as_deref() {
            Some(v) if KNOWN_PROTOCOLS.contains(&v) => {}
            other => {
                tracing::warn!(
                    "Kimi session {session} has wire protocol_version {:?}, which this shim does not know \
                     (knows {KNOWN_PROTOCOLS:?}); its background activity is not reported",
                    other.unwrap_or("(none)")
                );
                self.off.insert(session.to_owned());
                return;
            }
        }
        let translator = Translator::new(session, dir, self.waits);
        let s = Session {
            translator,
            feed: Feed::new(cutoff_ms),
            held: VecDeque::new(),
            answers: Vec::new(),
            dir: dir.to_owned(),
            _handle: handle,
        };
        self.sessions.insert(session.to_owned(), s);
    }

    /// What the watcher read: parse, order by the wire records, translate.
    pub fn scan(&mut self, session: &str, chunks: &[Chunk], cx: &mut Cx) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        let mut out = Vec::new();
        let mut lists = Vec::new();
        for c in chunks {
            match s.feed.chunk(&c.file, c.op == Op::Reopen, c.op == Op::Replace, &c.bytes) {
                Fed::Task { agent, info } => s.translator.task_file(&agent, &info),
                Fed::Entries { agent, entries } if !entries.is_empty() => {
                    // The main agent first on equal times: its records register what the others report.
                    let at = if agent == crate::translate::MAIN { 0 } else { lists.len() };
                    lists.insert(at, (agent, entries.into()));
                }
                _ => {}
            }
        }
        for (agent, entry) in wire::merge(lists) {
            s.translator.entry(&agent, entry, &mut out);
        }
        s.translator.drained(&mut out);
        for f in out {
            cx.to_client(f);
        }
        if !s.translator.user_turn_open() {
            for a in std::mem::take(&mut s.answers) {
                cx.to_client(a);
            }
        }
        self.release(session, cx);
    }

    /// Forwards held prompts once Kimi is no longer busy with a turn of its own.
    fn release(&mut self, session: &str, cx: &mut Cx) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        while !s.translator.main_busy()
            && let Some(p) = s.held.pop_front()
        {
            cx.to_agent(p);
        }
    }
}

fn param_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get("params").and_then(|p| p.get(key)).and_then(Value::as_str)
}

impl Layer for Activity {
    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind().clone() {
            Kind::Request { id, method } => match method.as_str() {
                "initialize" => {
                    if let Some(v) = frame.value() {
                        self.waits = v.get("params").is_some_and(wait::client_declares_waits);
                    }
                    self.initialize.insert(id);
                }
                "session/new" => {
                    self.setup.insert(id, None);
                }
                "session/load" | "session/resume" => {
                    let sid = frame.value().and_then(|v| param_str(&v, "sessionId").map(str::to_owned));
                    self.setup.insert(id, sid);
                }
                "session/prompt" => {
                    let sid = frame.value().and_then(|v| param_str(&v, "sessionId").map(str::to_owned));
                    if let Some(sid) = &sid {
                        self.prompts.insert(id.clone(), sid.clone());
                    }
                    if let Some(s) = sid.and_then(|sid| self.sessions.get_mut(&sid))
                        && (s.translator.main_busy() || !s.held.is_empty())
                    {
                        tracing::debug!("holding a prompt while Kimi runs a turn of its own");
                        s.held.push_back(frame);
                        return;
                    }
                }
                wait::STOP_METHOD => {
                    let msg = "Kimi's background tasks and subagents cannot be stopped (none is declared stoppable)";
                    cx.to_client(frame::error_response(&id, -32602, msg, None));
                    return;
                }
                _ => {}
            },
            Kind::Notification { method } if method == "session/cancel" => {
                // A held prompt is Coda's turn: stopping it answers it; Kimi never saw it.
                let sid = frame.value().and_then(|v| param_str(&v, "sessionId").map(str::to_owned));
                if let Some(s) = sid.and_then(|sid| self.sessions.get_mut(&sid))
                    && !s.held.is_empty()
                {
                    for p in std::mem::take(&mut s.held) {
                        if let Some(id) = p.id() {
                            self.prompts.remove(id);
                            cx.to_client(frame::result_response(id, json!({ "stopReason": "cancelled" })));
                        }
                    }
                    return;
                }
            }
            _ => {}
        }
        cx.to_agent(frame);
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Response { id } = frame.kind() else {
            return cx.to_client(frame);
        };
        if self.initialize.remove(id) {
            if let Some(mut v) = frame.value()
                && let Some(result) = v.get_mut("result")
            {
                wait::declare_waits(result);
                return cx.to_client(Frame::from_value(&v));
            }
            return cx.to_client(frame);
        }
        if let Some(sid) = self.prompts.remove(id)
            && let Some(s) = self.sessions.get_mut(&sid)
            && s.translator.user_turn_open()
        {
            s.answers.push(frame);
            return;
        }
        if let Some(asked) = self.setup.remove(id) {
            let v = frame.value();
            let ok = v.as_ref().is_some_and(|v| v.get("result").is_some());
            let sid =
                v.as_ref().and_then(|v| v.pointer("/result/sessionId")).and_then(Value::as_str).map(str::to_owned);
            cx.to_client(frame);
            if ok && let Some(sid) = sid.or(asked) {
                self.open_session(&sid, cx);
            }
            return;
        }
        cx.to_client(frame);
    }

    fn on_event(&mut self, event: Event, cx: &mut Cx) {
        let Ok(scan) = event.downcast::<Scan>() else { return };
        if self.record.is_some()
            && let Some(dir) = self.sessions.get(&scan.session).map(|s| s.dir.clone())
        {
            // The file log of fixtures/README.md ("Kimi session files"), in the order the shim read it.
            let ts = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
            for c in &scan.chunks {
                let op = match c.op {
                    Op::Append => "append",
                    Op::Reopen => "write",
                    Op::Replace => "replace",
                };
                let path = format!("{dir}/{}", c.file);
                let rec = match std::str::from_utf8(&c.bytes) {
                    Ok(text) => json!({ "ts": ts, "op": op, "path": path, "data": text }),
                    Err(_) => json!({ "ts": ts, "op": op, "path": path, "base64": base64(&c.bytes) }),
                };
                self.rec(rec);
            }
        }
        self.scan(&scan.session, &scan.chunks, cx);
    }
}

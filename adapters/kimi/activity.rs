//! The activity layer of `coda-kimi`: declares `_coda/wait`, finds each session's folder once Kimi has
//! answered `session/new`/`load`/`resume`, feeds what its files say through the [`Translator`], and
//! holds a client prompt while Kimi runs a turn of its own (kimi.md §3.3: Kimi would answer it with an
//! empty `end_turn` and run it unreported).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::coda::wait;
use crate::frame::{self, Frame, Id, Kind};
use crate::layer::{Cx, Event, EventSender, Layer};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::adapters::kimi::failure::Failures;
use crate::adapters::kimi::translate::Translator;
use crate::adapters::kimi::watch::{self, Chunk, Op, Scan, Started};
use crate::adapters::kimi::wire::{self, Fed, KNOWN_PROTOCOLS};

/// Starts watching a session folder: notes where its files end and sets up the watch on a thread of its own;
/// tests hand scans in themselves (no handle).
pub type Starter = Box<dyn FnMut(&str, &Path) -> Result<(Started, Option<watch::Handle>), String> + Send>;

/// Longest hold of a prompt answer waiting for the wire to show the turn's end. Kimi writes `turn.ended`
/// before it answers, so the watch normally sees it within milliseconds; when it never shows (a watch that
/// broke, a wire Kimi stopped writing) the answer goes out anyway, with a warning, rather than leaving
/// Coda's turn open until the process ends.
pub const ANSWER_HOLD: Duration = Duration::from_secs(2);

/// How long a subagent run whose end the parent recorded may wait for its own turn end to show in its
/// wire before it is settled without it (its progress, if any, would then follow the settlement).
pub const RUN_END_GRACE: Duration = Duration::from_secs(2);

/// A timer of the layer: look again at a session's held answers and unsettled runs.
struct Tick {
    session: String,
}

struct Session {
    translator: Translator,
    /// Client prompts held while Kimi is busy with a turn of its own.
    held: VecDeque<Frame>,
    /// Prompt answers held until the wire shows that turn's end, so that what Kimi recorded during
    /// the turn is reported before the turn ends (rule 1: the cause is the turn in progress); with the
    /// time each was held, for [`ANSWER_HOLD`].
    answers: Vec<(Frame, Instant)>,
    /// A [`Tick`] is on its way.
    tick_due: bool,
    /// Failed client turns, answered as Coda's failure kinds.
    failures: Failures,
    dir: String,
    _handle: Option<watch::Handle>,
}

pub struct Activity {
    start: Starter,
    root: Option<PathBuf>,
    /// The client declared `_meta.coda.waits`.
    waits: bool,
    initialize: HashSet<Id>,
    /// session/new|load|resume requests in flight: id -> sessionId asked for (None for new), and when the
    /// request went by (the time of the recording's snapshot of the session's files).
    setup: HashMap<Id, (Option<String>, SystemTime)>,
    sessions: HashMap<String, Session>,
    /// Client prompts sent to Kimi: id -> session.
    prompts: HashMap<Id, String>,
    /// Those of them that are slash commands (Kimi runs them without a turn; see [`Failures`]).
    commands: HashSet<Id>,
    /// Those of them whose turn has streamed no output yet: a failed turn ends that way in 0.1 s, before the watch
    /// has read it, so their answers wait for the turn's end in the wire.
    quiet: HashSet<Id>,
    /// Sessions whose files cannot be read: the relay carries on without activity.
    off: HashSet<String>,
    record: Option<std::fs::File>,
    /// Sends the layer its own [`Tick`]s (none in tests driven by hand).
    timer: Option<EventSender>,
}

impl Activity {
    /// The real layer: watches Kimi's data root with inotify.
    pub fn new(events: EventSender) -> Activity {
        let mut record = None;
        if let Some(path) = std::env::var_os("CODA_KIMI_RECORD").filter(|p| !p.is_empty()) {
            match crate::private_file::open(Path::new(&path), crate::private_file::Write::Append) {
                Ok(f) => record = Some(f),
                Err(e) => tracing::warn!("cannot open CODA_KIMI_RECORD {}: {e}", PathBuf::from(path).display()),
            }
        }
        let snapshot = record.is_some();
        let watch_events = events.clone();
        let start: Starter = Box::new(move |session, dir| {
            watch::start(session, dir, watch_events.clone(), snapshot).map(|(s, h)| (s, Some(h)))
        });
        let mut a = Activity::with_starter(watch::data_root(), start);
        a.record = record;
        a.timer = Some(events);
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
            commands: HashSet::new(),
            quiet: HashSet::new(),
            off: HashSet::new(),
            record: None,
            timer: None,
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

    /// Writes the file records of one scan (or of the snapshot, `at: "open"`) to the file log.
    fn rec_chunks(&mut self, dir: &str, chunks: &[Chunk], at: SystemTime, open: bool) {
        if self.record.is_none() {
            return;
        }
        let ts = humantime::format_rfc3339_micros(at).to_string();
        for c in chunks {
            let op = match c.op {
                Op::Append => "append",
                Op::Reopen => "write",
                Op::Replace => "replace",
            };
            let path = format!("{dir}/{}", c.file);
            let mut rec = match std::str::from_utf8(&c.bytes) {
                Ok(text) => json!({ "ts": ts, "op": op, "path": path, "data": text }),
                Err(_) => {
                    json!({ "ts": ts, "op": op, "path": path, "base64": base64::engine::general_purpose::STANDARD.encode(&c.bytes) })
                }
            };
            if open {
                rec["at"] = json!("open");
            }
            self.rec(rec);
        }
    }

    /// Asks for a [`Tick`] of `session` after `after`, unless one is on its way.
    fn tick_later(&mut self, session: &str, after: Duration) {
        let Some(timer) = self.timer.clone() else { return };
        let Some(s) = self.sessions.get_mut(session) else { return };
        if s.tick_due {
            return;
        }
        s.tick_due = true;
        let session = session.to_owned();
        let spawned = std::thread::Builder::new().name("kimi-tick".into()).spawn(move || {
            std::thread::sleep(after);
            timer.send(Tick { session });
        });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a timer thread: {e}");
            s.tick_due = false;
        }
    }

    /// A tick: answers held too long go out; runs whose turn end never showed are settled.
    pub fn tick(&mut self, session: &str, now: Instant, cx: &mut Cx) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        s.tick_due = false;
        let mut out = Vec::new();
        s.translator.overdue(now, RUN_END_GRACE, &mut out);
        for f in out {
            cx.to_client(f);
        }
        let (late, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut s.answers).into_iter().partition(|(_, at)| now.duration_since(*at) >= ANSWER_HOLD);
        s.answers = keep;
        for (a, _) in late {
            tracing::warn!(
                "Kimi answered a prompt of session {session} but its wire has not shown that turn's end within \
                 {ANSWER_HOLD:?}; answering without it (activity recorded in that turn may follow the answer)"
            );
            cx.to_client(answer_of(&mut self.commands, &mut s.failures, a));
        }
        self.release(session, cx);
        self.schedule(session);
    }

    /// Asks for a tick at the earliest deadline something waits on.
    fn schedule(&mut self, session: &str) {
        let Some(s) = self.sessions.get(session) else { return };
        let answer = s.answers.iter().map(|(_, at)| *at + ANSWER_HOLD).min();
        let run = s.translator.awaiting_run_end().map(|at| at + RUN_END_GRACE);
        let due = match (answer, run) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        };
        if let Some(due) = due {
            let wait = due.saturating_duration_since(Instant::now());
            self.tick_later(session, wait.max(Duration::from_millis(10)));
        }
    }

    /// Starts the watch of a session's files: here only a few reads of folders and sizes; the watch itself is
    /// set up on the watch's own thread, so the answer that named the session does not wait for it.
    fn open_session(&mut self, session: &str, seen: SystemTime) {
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
                // What the files held when the session was found: the recording's starting state.
                self.rec_chunks(&start.dir, &start.snapshot, seen, true);
                self.begin(session, &start.dir, &start.header, handle);
            }
            Err(why) => {
                tracing::warn!("cannot watch Kimi's session {session}: {why}; activity is not reported");
                self.off.insert(session.to_owned());
            }
        }
    }

    /// Sets up the translation for a session whose main wire starts with `header`.
    pub fn begin(&mut self, session: &str, dir: &str, header: &[u8], handle: Option<watch::Handle>) {
        let version = wire::parse_line(header.trim_ascii_end()).ok().and_then(|e| match e.record {
            wire::Record::Metadata { protocol_version } => Some(protocol_version),
            _ => None,
        });
        match version.as_deref() {
            Some(v) if KNOWN_PROTOCOLS.contains(&v) => {}
            other => {
                tracing::warn!(
                    "Kimi session {session} has a wire protocol_version this shim does not know (knows \
                     {KNOWN_PROTOCOLS:?}); its background activity is not reported"
                );
                tracing::debug!("its protocol_version: {:?}", other.unwrap_or("(none)"));
                self.off.insert(session.to_owned());
                return;
            }
        }
        let translator = Translator::new(session, dir, self.waits);
        let s = Session {
            translator,
            held: VecDeque::new(),
            answers: Vec::new(),
            tick_due: false,
            failures: Failures::default(),
            dir: dir.to_owned(),
            _handle: handle,
        };
        self.sessions.insert(session.to_owned(), s);
    }

    /// What the watch read, parsed: order by the wire records, translate.
    pub fn scan(&mut self, session: &str, fed: Vec<Fed>, cx: &mut Cx) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        let mut out = Vec::new();
        let mut lists = Vec::new();
        for f in fed {
            match f {
                Fed::Task { agent, info } => s.translator.task_file(&agent, &info),
                Fed::Entries { agent, entries } if !entries.is_empty() => {
                    // The main agent first on equal times: its records register what the others report.
                    let at = if agent == crate::adapters::kimi::translate::MAIN { 0 } else { lists.len() };
                    lists.insert(at, (agent, entries.into()));
                }
                _ => {}
            }
        }
        let mut stop = false;
        for (agent, entry) in wire::merge(lists) {
            if agent == crate::adapters::kimi::translate::MAIN && s.failures.record(&entry) {
                stop = true;
            }
            s.translator.entry(&agent, entry, &mut out);
        }
        if stop {
            // Kimi's retries would keep the turn open past a minute: stop the run; its end carries the failure.
            tracing::info!("stopping Kimi's turn in session {session}: its retries would outlast a minute");
            cx.to_agent(frame::notification("session/cancel", json!({ "sessionId": session })));
        }
        s.translator.drained(&mut out);
        for f in out {
            cx.to_client(f);
        }
        if !s.translator.user_turn_open() {
            let mut held = std::mem::take(&mut s.answers).into_iter();
            while let Some((a, at)) = held.next() {
                if pairs(&self.commands, &a) && !s.failures.turn_ended() {
                    // Its turn's end is not in the wire yet.
                    s.answers.push((a, at));
                    s.answers.extend(held);
                    break;
                }
                cx.to_client(answer_of(&mut self.commands, &mut s.failures, a));
            }
        }
        self.release(session, cx);
        self.schedule(session);
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

/// Updates that show a turn produced output.
const TURN_OUTPUT: &[&str] = &["agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update", "plan"];

/// Whether Kimi's answer `a` pairs with a turn end in the wire: a result to a prompt that is not a slash
/// command (an error answer means Kimi refused the prompt).
fn pairs(commands: &HashSet<Id>, a: &Frame) -> bool {
    a.id().is_some_and(|id| !commands.contains(id)) && a.value().is_ok_and(|v| v.get("result").is_some())
}

/// The answer Coda gets for Kimi's prompt answer `a` once its turn's end is known (or the hold ran out).
fn answer_of(commands: &mut HashSet<Id>, failures: &mut Failures, a: Frame) -> Frame {
    let paired = pairs(commands, &a);
    if let Some(id) = a.id() {
        commands.remove(id);
    }
    if paired { failures.answer(a) } else { a }
}

fn param_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get("params").and_then(|p| p.get(key)).and_then(Value::as_str)
}

impl Layer for Activity {
    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind().clone() {
            Kind::Request { id, method } => match method.as_str() {
                "initialize" => {
                    let v = match frame.value() {
                        Ok(v) => v,
                        Err(e) => return cx.unreadable(frame, &e, true),
                    };
                    self.waits = v.get("params").is_some_and(wait::client_declares_waits);
                    self.initialize.insert(id);
                }
                "session/new" => {
                    self.setup.insert(id, (None, SystemTime::now()));
                }
                "session/load" | "session/resume" => {
                    let v = match frame.value() {
                        Ok(v) => v,
                        Err(e) => return cx.unreadable(frame, &e, true),
                    };
                    let sid = param_str(&v, "sessionId").map(str::to_owned);
                    self.setup.insert(id, (sid, SystemTime::now()));
                }
                "session/prompt" => {
                    let v = match frame.value() {
                        Ok(v) => v,
                        Err(e) => return cx.unreadable(frame, &e, true),
                    };
                    let first = v.pointer("/params/prompt/0/text").and_then(Value::as_str);
                    if first.is_some_and(|t| t.starts_with('/')) {
                        self.commands.insert(id.clone());
                    } else {
                        self.quiet.insert(id.clone());
                    }
                    let sid = param_str(&v, "sessionId").map(str::to_owned);
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
                let v = match frame.value() {
                    Ok(v) => v,
                    Err(e) => return cx.unreadable(frame, &e, true),
                };
                let sid = param_str(&v, "sessionId").map(str::to_owned);
                if let Some(s) = sid.and_then(|sid| self.sessions.get_mut(&sid))
                    && !s.held.is_empty()
                {
                    for p in std::mem::take(&mut s.held) {
                        if let Some(id) = p.id() {
                            self.prompts.remove(id);
                            self.commands.remove(id);
                            self.quiet.remove(id);
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
            if frame.session_update().is_some_and(|u| TURN_OUTPUT.contains(&u)) {
                self.quiet.clear();
            }
            return cx.to_client(frame);
        };
        let quiet = self.quiet.remove(id);
        if self.initialize.remove(id) {
            return wait::declare_waits_in(frame, cx);
        }
        if let Some(sid) = self.prompts.remove(id)
            && let Some(s) = self.sessions.get_mut(&sid)
        {
            if s.translator.user_turn_open() || (quiet && pairs(&self.commands, &frame) && !s.failures.turn_ended()) {
                s.answers.push((frame, Instant::now()));
                self.schedule(&sid);
                return;
            }
            return cx.to_client(answer_of(&mut self.commands, &mut s.failures, frame));
        }
        self.commands.remove(id);
        if let Some((asked, seen)) = self.setup.remove(id) {
            let v = match frame.value() {
                Ok(v) => v,
                Err(e) => return cx.unreadable(frame, &e, false),
            };
            let ok = v.get("result").is_some();
            let sid = v.pointer("/result/sessionId").and_then(Value::as_str).map(str::to_owned);
            cx.to_client(frame);
            if ok && let Some(sid) = sid.or(asked) {
                self.open_session(&sid, seen);
            }
            return;
        }
        cx.to_client(frame);
    }

    fn on_event(&mut self, event: Event, cx: &mut Cx) {
        let event = match event.downcast::<Scan>() {
            Ok(scan) => return self.on_scan(*scan, cx),
            Err(event) => event,
        };
        if let Ok(tick) = event.downcast::<Tick>() {
            self.tick(&tick.session, Instant::now(), cx);
        }
    }
}

impl Activity {
    fn on_scan(&mut self, scan: Scan, cx: &mut Cx) {
        if self.record.is_some()
            && let Some(dir) = self.sessions.get(&scan.session).map(|s| s.dir.clone())
        {
            // The file log of fixtures/README.md ("Kimi session files"), in the order the shim read it.
            self.rec_chunks(&dir, &scan.chunks, SystemTime::now(), false);
        }
        let Scan { session, fed, .. } = scan;
        self.scan(&session, fed, cx);
    }
}

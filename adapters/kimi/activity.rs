//! coda-kimi's activity layer: Kimi's session files, as the watch reads them, turned into Coda's reports.
//!
//! It finds each session's folder once Kimi has answered `session/new`/`load`/`resume`, feeds what its files
//! say through the [`Translator`] (which reports waits whether or not the client asked for them: the engine's
//! waits layer decides), holds a client prompt while Kimi runs a turn of its own (Kimi 2.1.0 would answer it
//! with an empty `end_turn` and run it unreported), and holds each prompt answer until the wire shows that
//! turn's end. Its clock is the engine's: [`Cx::now`], [`Cx::wall`] and wake-ups through [`Cx::after`].

use crate::{HashMap, HashSet};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::frame::{self, Frame, Kind};
use crate::layer::{Cx, EventSender, Layer, cancel};
use serde_json::{Value, json};

use crate::adapters::kimi::facts::{Tap, WireFacts};
use crate::adapters::kimi::feed::{self, Fed};
use crate::adapters::kimi::record;
use crate::adapters::kimi::translate::{self, Translator};
use crate::adapters::kimi::watch::{self, Scan, Started, WatchError};
use crate::adapters::kimi::wire::{self, KNOWN_PROTOCOLS};
use crate::file_log::FileLog;

/// Finds a session's folder and starts watching it: notes where its files end (records older than the time
/// handed in are history when a replaced file is read again) and sets up the watch on a thread of its own;
/// tests hand scans in themselves (no handle). All of the layer's file-system work is here, and the layer
/// runs it as a job of the engine's ([`Cx::work`]), off the relay loop.
pub type Starter = Arc<dyn Fn(&str, SystemTime) -> Result<(Started, Option<watch::Handle>), WatchError> + Send + Sync>;

/// What [`Starter`] made of a session, back from its job.
pub struct Opened {
    session: String,
    seen: SystemTime,
    result: Result<(Started, Option<watch::Handle>), WatchError>,
}

/// What reached the layer for a session whose watch is being started, handled once it is, in order.
enum Waiting {
    /// Kimi's answer that named the session: the client gets it once the watch has noted where the files
    /// end, so that what the client causes after it is read as new.
    Answer(Frame),
    FromClient(Frame),
    FromAgent(Frame),
    Scan(Scan),
}

/// Longest hold of a prompt answer waiting for the wire to show the turn's end. Kimi writes `turn.ended`
/// before it answers, so the watch normally sees it within milliseconds; when it never shows (a watch that
/// broke, a wire Kimi stopped writing) the answer goes out anyway, with a warning, rather than leaving
/// Coda's turn open until the process ends.
pub const ANSWER_HOLD: Duration = Duration::from_secs(2);

/// How long a subagent run whose end the parent recorded may wait for its own turn end to show in its
/// wire before it is settled without it (its progress, if any, would then follow the settlement).
pub const RUN_END_GRACE: Duration = Duration::from_secs(2);

/// Longest a client prompt waits while Kimi runs a turn of its own (or has a background result to handle): past
/// it the prompt goes to Kimi anyway, with a warning (Kimi then queues it as 2.1.0 does), rather than waiting for
/// a turn end the wire may never show (a watch that broke, a Kimi that stopped writing).
pub const PROMPT_HOLD: Duration = Duration::from_secs(10 * 60);

/// The most of Kimi's frames that wait behind a session's held answer: past it the answer goes on without the
/// wire's turn end (a Kimi that floods while the shim waits).
pub const BEHIND_MAX: usize = 10_000;

/// A session's wake-up ([`Cx::after`]): look again at its held answers and unsettled runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Look(String);

struct Session {
    translator: Translator,
    /// Client prompts held while Kimi is busy with a turn of its own, with the time each was held, for
    /// [`PROMPT_HOLD`].
    held: VecDeque<(Frame, Instant)>,
    /// Prompt answers held until the wire shows that turn's end, so that what Kimi recorded during
    /// the turn is reported before the turn ends (rule 1: the cause is the turn in progress); with the
    /// time each was held, for [`ANSWER_HOLD`].
    answers: Vec<(Frame, Instant)>,
    /// Kimi's frames of the session that came after a held answer, in order: they go on behind it (what Kimi
    /// wrote after its answer is not inside the turn), at most [`BEHIND_MAX`].
    behind: VecDeque<Frame>,
    dir: String,
    _handle: Option<watch::Handle>,
}

pub struct Activity {
    start: Starter,
    sessions: HashMap<String, Session>,
    /// Sessions whose files cannot be read: the relay carries on without activity.
    off: HashSet<String>,
    /// Sessions whose watch is being started: the client's frames of that session and the watch's scans
    /// wait, in order, until it is.
    opening: HashMap<String, VecDeque<Waiting>>,
    record: Option<FileLog>,
    /// The took log of `CODA_KIMI_TOOK`: each watch started, and how far each scan handled read each file.
    took: Option<FileLog>,
    /// Where each scan's usage and compaction records go once the scan is handled.
    tap: Tap,
}

/// The logs the activity layer writes, each when its variable names a file (opened at set-up).
#[derive(Default)]
pub struct Logs {
    /// `CODA_KIMI_RECORD`: what the shim read of the session files, for recordings ([`record::chunks`]).
    pub record: Option<FileLog>,
    /// `CODA_KIMI_TOOK`: how far the shim has taken in each file, for the replay player (fixtures/README.md).
    pub took: Option<FileLog>,
    /// Watches a test steps itself instead of a thread each ([`watch::Driven`]: the simulator's).
    pub driven: Option<watch::Driven>,
}

impl Activity {
    /// The real layer: watches the sessions under Kimi's data root `root` (inotify, FSEvents), with the file
    /// log when one is kept (its records then start with a snapshot of each session's files) and the took
    /// log. Once a scan is handled, the main agent's usage and compaction records it read go to the layers on
    /// `tap`, in the engine's one queue: no frame is handled between the two.
    pub fn new(events: EventSender<Scan>, root: Option<PathBuf>, logs: Logs, tap: Tap) -> Activity {
        let snapshot = logs.record.is_some();
        let took = logs.took.as_ref().map(FileLog::direct);
        let driven = logs.driven;
        let start: Starter = Arc::new(move |session, cutoff| {
            let dir = watch::locate(root.as_deref(), session)?;
            let started = match &driven {
                Some(d) => (d.start(session, &dir, cutoff, events.clone(), took.is_some())?, None),
                None => {
                    let (started, handle) =
                        watch::start(session, &dir, cutoff, events.clone(), snapshot, took.is_some())?;
                    (started, Some(handle))
                }
            };
            if let Some(took) = &took {
                // Written by the job, so before the answer that named the session reaches the client: each write
                // of the files it reads under `dir` shows in a scan from now on.
                took.record(&json!({ "watch": started.0.dir, "reads": watch::READS }));
            }
            Ok(started)
        });
        let mut a = Activity::with_starter(start);
        (a.record, a.took, a.tap) = (logs.record, logs.took, tap);
        a
    }

    /// The layer with its own way of starting watches (tests hand scans in themselves).
    pub fn with_starter(start: Starter) -> Activity {
        Activity {
            start,
            sessions: HashMap::default(),
            off: HashSet::default(),
            opening: HashMap::default(),
            record: None,
            took: None,
            tap: Tap::default(),
        }
    }

    /// A session's wake-up: answers held too long go out; runs whose turn end never showed are settled. Once
    /// Kimi is gone ([`Cx::agent_gone`]: the session ends) nothing it would write comes any more: everything held
    /// goes out now, in order, whatever its deadline.
    fn wake(&mut self, session: &str, cx: &mut Cx) {
        let now = cx.now();
        let (hold, grace) =
            if cx.agent_gone() { (Duration::ZERO, Duration::ZERO) } else { (ANSWER_HOLD, RUN_END_GRACE) };
        let Some(s) = self.sessions.get_mut(session) else { return };
        let mut out = Vec::new();
        s.translator.overdue(now, grace, &mut out);
        for f in out {
            cx.to_client(f);
        }
        let (late, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut s.answers).into_iter().partition(|(_, at)| now.duration_since(*at) >= hold);
        s.answers = keep;
        for (a, _) in late {
            if hold.is_zero() {
                tracing::warn!("Kimi is gone before its wire showed the end of a turn of session {session}: answering");
            } else {
                tracing::warn!(
                    "Kimi answered a prompt of session {session} but its wire has not shown that turn's end within \
                     {ANSWER_HOLD:?}; answering without it (activity recorded in that turn may follow the answer)"
                );
            }
            cx.to_client(a);
        }
        self.go_on(session, cx);
        self.release(session, cx);
        if let Some(s) = self.sessions.get_mut(session) {
            while let Some((_, at)) = s.held.front()
                && now.duration_since(*at) >= PROMPT_HOLD
                && let Some((p, _)) = s.held.pop_front()
            {
                tracing::warn!(
                    "Kimi's own turn in session {session} has not shown its end within {PROMPT_HOLD:?}; sending the \
                     prompt held for it"
                );
                cx.to_agent(p);
            }
        }
        self.schedule(session, cx);
    }

    /// Once no answer of the session is held, Kimi's frames that waited behind one go on, in order, each handled
    /// as it goes (an answer among them may be held in turn: the rest wait behind it).
    fn go_on(&mut self, session: &str, cx: &mut Cx) {
        let Some(s) = self.sessions.get_mut(session).filter(|s| s.answers.is_empty()) else { return };
        for frame in std::mem::take(&mut s.behind) {
            Layer::from_agent(self, frame, cx);
        }
    }

    /// Whether a frame of Kimi's of `session` waits behind a held answer; keeps it there if so.
    fn behind(&mut self, session: Option<&str>, frame: Frame, cx: &mut Cx) -> Option<Frame> {
        let Some(sid) = session else { return Some(frame) };
        let Some(s) = self.sessions.get_mut(sid).filter(|s| !s.answers.is_empty() || !s.behind.is_empty()) else {
            return Some(frame);
        };
        s.behind.push_back(frame);
        if s.behind.len() > BEHIND_MAX {
            tracing::warn!(
                "over {BEHIND_MAX} frames of Kimi's waited behind a prompt answer of session {sid}: it goes on"
            );
            for (a, _) in std::mem::take(&mut s.answers) {
                cx.to_client(a);
            }
            let sid = sid.to_owned();
            self.go_on(&sid, cx);
            self.schedule(&sid, cx);
        }
        None
    }

    /// Asks for the session's wake-up at the earliest deadline something waits on (none: forgets it).
    fn schedule(&mut self, session: &str, cx: &mut Cx) {
        let Some(s) = self.sessions.get(session) else { return };
        let answer = s.answers.iter().map(|(_, at)| *at + ANSWER_HOLD).min();
        let run = s.translator.awaiting_run_end().map(|at| at + RUN_END_GRACE);
        let prompt = s.held.front().map(|(_, at)| *at + PROMPT_HOLD);
        let due = [answer, run, prompt].into_iter().flatten().min();
        let wake = Look(session.to_owned());
        match due {
            Some(due) => cx.after(due.saturating_duration_since(cx.now()), wake),
            None => cx.cancel(&wake),
        }
    }

    /// Starts the watch of a session's files, as a job (a few reads of folders and sizes; the watch itself
    /// runs on a thread of its own): the answer that named the session does not wait for it; the client's
    /// frames of that session do, so that its prompts are handled as the session's.
    fn open_session(&mut self, session: &str, seen: SystemTime, answer: Frame, cx: &mut Cx) {
        if self.sessions.contains_key(session) {
            return cx.to_client(answer);
        }
        if let Some(waiting) = self.opening.get_mut(session) {
            return waiting.push_back(Waiting::Answer(answer));
        }
        self.off.remove(session);
        self.opening.insert(session.to_owned(), VecDeque::from([Waiting::Answer(answer)]));
        let (start, session) = (self.start.clone(), session.to_owned());
        cx.work(
            move || {
                let result = start(&session, seen);
                Opened { session, seen, result }
            },
            Activity::opened,
        );
    }

    /// The watch of a session is started (or cannot be): what waited for it is handled, in order.
    fn opened(&mut self, Opened { session, seen, result }: Opened, cx: &mut Cx) {
        let waiting = self.opening.remove(&session).unwrap_or_default();
        self.begin_watch(&session, seen, result);
        for w in waiting {
            match w {
                Waiting::Answer(f) => cx.to_client(f),
                Waiting::FromClient(f) => self.from_client(f, cx),
                Waiting::FromAgent(f) => self.from_agent(f, cx),
                Waiting::Scan(scan) => self.on_scan(scan, cx),
            }
        }
    }

    fn begin_watch(
        &mut self,
        session: &str,
        seen: SystemTime,
        result: Result<(Started, Option<watch::Handle>), WatchError>,
    ) {
        match result {
            Ok((start, handle)) => {
                // What the files held when the session was found: the recording's starting state.
                if let Some(log) = &mut self.record {
                    record::chunks(log, &start.dir, &start.snapshot, seen, true);
                }
                self.begin(session, &start.dir, &start.header, handle);
                if let Some(log) = &mut self.took
                    && !self.sessions.contains_key(session)
                {
                    // Announced by the job, but not read after all: nothing to wait for there.
                    log.record(&json!({ "unwatch": start.dir }));
                }
            }
            Err(why) => {
                match why {
                    WatchError::NoDataRoot => {
                        tracing::warn!("no KIMI_CODE_HOME or HOME: Kimi's activity is not reported")
                    }
                    WatchError::NotFound { root } => tracing::warn!(
                        "Kimi's folder for session {session} not found under {}; activity is not reported",
                        root.display()
                    ),
                    WatchError::Failed(why) => {
                        tracing::warn!("cannot watch Kimi's session {session}: {why}; activity is not reported")
                    }
                }
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
        let translator = Translator::new(session, dir);
        let s = Session {
            translator,
            held: VecDeque::new(),
            answers: Vec::new(),
            behind: VecDeque::new(),
            dir: dir.to_owned(),
            _handle: handle,
        };
        self.sessions.insert(session.to_owned(), s);
        // The layers below learn that this session's wire is read: its turns' ends will show.
        self.tap.send(Some(WireFacts { session: session.to_owned(), entries: Vec::new() }));
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
                    let at = if agent == translate::MAIN { 0 } else { lists.len() };
                    lists.insert(at, (agent, entries.into()));
                }
                _ => {}
            }
        }
        for (agent, entry) in feed::merge(lists) {
            s.translator.entry(&agent, entry, &mut out);
        }
        s.translator.drained(cx.now(), &mut out);
        for f in out {
            cx.to_client(f);
        }
        if !s.translator.user_turn_open() {
            for (a, _) in std::mem::take(&mut s.answers) {
                cx.to_client(a);
            }
        }
        self.go_on(session, cx);
        self.release(session, cx);
        self.schedule(session, cx);
    }

    /// Forwards held prompts once Kimi is no longer busy with a turn of its own.
    fn release(&mut self, session: &str, cx: &mut Cx) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        while !s.translator.main_busy()
            && let Some((p, _)) = s.held.pop_front()
        {
            cx.to_agent(p);
        }
    }
}

impl Activity {
    /// Answers the prompts held for `session` `cancelled` (Kimi never saw them); whether there were any.
    fn stop_held(&mut self, session: &str, cx: &mut Cx) -> bool {
        let Some(s) = self.sessions.get_mut(session).filter(|s| !s.held.is_empty()) else { return false };
        for (p, _) in std::mem::take(&mut s.held) {
            if let Some(id) = p.id() {
                cx.to_client(frame::result_response(id, json!({ "stopReason": "cancelled" })));
            }
        }
        true
    }
}

fn param_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get("params").and_then(|p| p.get(key)).and_then(Value::as_str)
}

impl Layer for Activity {
    type Timer = Look;
    type Event = Scan;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        // A request waiting for its session's watch to start, withdrawn: answered, never sent.
        if !self.opening.is_empty()
            && let Some(id) = cancel::target(&frame)
        {
            let queued = |w: &Waiting| matches!(w, Waiting::FromClient(f) if f.id() == Some(&id));
            if let Some(waiting) = self.opening.values_mut().find(|q| q.iter().any(queued)) {
                waiting.retain(|w| !queued(w));
                return cx.to_client(cancel::cancelled(&id));
            }
        }
        if !self.opening.is_empty() {
            let session = sonic_rs::get(frame.bytes(), &["params", "sessionId"]).ok();
            if let Some(waiting) = session
                .as_ref()
                .and_then(|v| sonic_rs::JsonValueTrait::as_str(v))
                .and_then(|sid| self.opening.get_mut(sid))
            {
                waiting.push_back(Waiting::FromClient(frame));
                return;
            }
        }
        match frame.kind().clone() {
            Kind::Request { method, .. } if method == "session/prompt" => {
                let v = frame.value();
                let sid = param_str(v, "sessionId").map(str::to_owned);
                if let Some(sid) = sid
                    && let Some(s) = self.sessions.get_mut(&sid)
                    && (s.translator.main_busy() || !s.held.is_empty())
                {
                    tracing::debug!("holding a prompt while Kimi runs a turn of its own");
                    s.held.push_back((frame, cx.now()));
                    self.schedule(&sid, cx);
                    return;
                }
            }
            Kind::Notification { method } if method == "session/cancel" => {
                // A held prompt is Coda's turn: stopping it answers it; Kimi never saw it, and the turn Kimi runs
                // is its own: the cancel stays here. Unless the session compacts: prompts of Coda's may wait
                // behind the compaction too, and the cancel goes on to stop them (the compaction keeps it from
                // Kimi).
                let v = frame.value();
                let sid = param_str(v, "sessionId").map(str::to_owned);
                if let Some(sid) = sid
                    && self.stop_held(&sid, cx)
                    && cx.session(&sid).is_none_or(|s| s.compaction().is_none())
                {
                    return;
                }
            }
            // A closed session's held prompts are stopped the same way; Kimi closes the rest.
            Kind::Request { method, .. } if method == "session/close" => {
                if let Some(sid) = param_str(frame.value(), "sessionId").map(str::to_owned) {
                    self.stop_held(&sid, cx);
                }
            }
            // Coda withdrew a held prompt: answered cancelled, never sent (Kimi never saw it, nor its withdrawal).
            Kind::Notification { method } if method == cancel::METHOD => {
                if let Some(id) = cancel::target(&frame)
                    && let Some(s) =
                        self.sessions.values_mut().find(|s| s.held.iter().any(|(p, _)| p.id() == Some(&id)))
                {
                    s.held.retain(|(p, _)| p.id() != Some(&id));
                    return cx.to_client(cancel::cancelled(&id));
                }
            }
            _ => {}
        }
        cx.to_agent(frame);
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        let waits = !self.opening.is_empty() || self.sessions.values().any(|s| !s.answers.is_empty());
        let session = match frame.kind() {
            _ if !waits => None,
            Kind::Response { .. } => cx.answer_to(&frame).and_then(|r| r.session()).map(str::to_owned),
            _ => sonic_rs::get(frame.bytes(), &["params", "sessionId"])
                .ok()
                .and_then(|v| sonic_rs::JsonValueTrait::as_str(&v).map(str::to_owned)),
        };
        // Kimi's frames of a session whose watch is being started stay behind the answer that named it.
        if let Some(waiting) = session.as_deref().and_then(|sid| self.opening.get_mut(sid)) {
            return waiting.push_back(Waiting::FromAgent(frame));
        }
        let Some(frame) = self.behind(session.as_deref(), frame, cx) else { return };
        let Kind::Response { .. } = frame.kind() else {
            return cx.to_client(frame);
        };
        // The request it answers, as the stack recorded it: which session, and when it went by (the time of the
        // recording's snapshot of a session's files).
        let request = cx.answer_to(&frame).map(|r| (r.method.clone(), r.session().map(str::to_owned), r.wall));
        let Some((method, asked, seen)) = request else {
            return cx.to_client(frame);
        };
        if method == "session/prompt"
            && let Some(sid) = asked.clone()
            && let Some(s) = self.sessions.get_mut(&sid)
        {
            if s.translator.user_turn_open() {
                s.answers.push((frame, cx.now()));
                self.schedule(&sid, cx);
                return;
            }
            return cx.to_client(frame);
        }
        if matches!(method.as_str(), "session/new" | "session/load" | "session/resume") {
            let asked = if method == "session/new" { None } else { asked };
            let v = frame.value();
            let ok = v.get("result").is_some();
            let sid = v.pointer("/result/sessionId").and_then(Value::as_str).map(str::to_owned);
            match sid.or(asked) {
                Some(sid) if ok => self.open_session(&sid, seen, frame, cx),
                _ => cx.to_client(frame),
            }
            return;
        }
        cx.to_client(frame);
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        !matches!(frame.kind(), Kind::Response { .. })
            && self.opening.is_empty()
            && self.sessions.values().all(|s| s.answers.is_empty())
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }

    fn on_event(&mut self, scan: Scan, cx: &mut Cx) {
        self.on_scan(scan, cx);
    }

    fn session_closed(&mut self, closed: &[String], cx: &mut Cx) {
        for sid in closed {
            self.off.remove(sid);
            self.stop_held(sid, cx);
            cx.cancel(&Look(sid.clone()));
            // Its watch ends with it; prompt answers still held for its wire go out now.
            if let Some(mut s) = self.sessions.remove(sid) {
                for (answer, _) in std::mem::take(&mut s.answers) {
                    cx.to_client(answer);
                }
                for frame in std::mem::take(&mut s.behind) {
                    cx.to_client(frame);
                }
            }
        }
    }

    fn kept(&self) -> usize {
        self.sessions.len() + self.off.len() + self.opening.len()
    }

    fn on_timer(&mut self, Look(session): Look, cx: &mut Cx) {
        self.wake(&session, cx);
    }
}

impl Activity {
    fn on_scan(&mut self, scan: Scan, cx: &mut Cx) {
        if let Some(waiting) = self.opening.get_mut(&scan.session) {
            return waiting.push_back(Waiting::Scan(scan));
        }
        if let Some(log) = &mut self.record
            && let Some(s) = self.sessions.get(&scan.session)
        {
            // The file log of fixtures/README.md ("Kimi session files"), in the order the shim read it.
            record::chunks(log, &s.dir, &scan.chunks, cx.wall(), false);
        }
        let Scan { session, fed, took, facts, .. } = scan;
        self.scan(&session, fed, cx);
        // The layers below act on the same records after this layer (before any frame: events go first).
        self.tap.send(facts);
        if let Some(log) = &mut self.took
            && let Some(s) = self.sessions.get(&session)
        {
            // Everything this scan made is handled, or queued before any frame that comes after this line.
            for (file, len) in took {
                log.record(&json!({ "took": format!("{}/{file}", s.dir), "len": len }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::events::{EventSource, Wake};
    use crate::adapters::kimi::watch::Watch;
    use crate::layer::testing::Harness;
    use std::io::Write as _;
    use std::sync::{Arc, Mutex};

    const SID: &str = "session_6b1d1f0e-0000-4000-8000-00000000a11e";

    /// Never reports a change: the test says when the watch looks.
    struct Quiet;

    impl EventSource for Quiet {
        fn watch(&mut self, _folder: &std::path::Path) -> Result<(), String> {
            Ok(())
        }
        fn wait(&mut self, _timeout: Duration) -> Wake {
            Wake::Quiet
        }
    }

    /// The activity layer in a stack whose clock the test sets, over a session folder the test writes; the watch
    /// looks when the test says so.
    struct Rig {
        h: Harness,
        /// Where the activity layer is in the stack.
        layer: usize,
        watch: Watch,
        dir: PathBuf,
        _tmp: tempfile::TempDir,
    }

    impl Rig {
        /// The layer alone, after `session/new` was answered, at time 0.
        fn new() -> Rig {
            Rig::with_waits(None)
        }

        /// With `Some(declared)`, under the engine's waits layer, after an `initialize` whose client declared
        /// `_meta.coda.waits` or not; then `session/new`.
        fn with_waits(declared: Option<bool>) -> Rig {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("kimi-home");
            let dir = root.join(format!("sessions/wd_work_000000000000/{SID}"));
            std::fs::create_dir_all(dir.join("agents/main")).unwrap();
            std::fs::write(
                dir.join("agents/main/wire.jsonl"),
                "{\"type\":\"metadata\",\"protocol_version\":\"1.5\"}\n",
            )
            .unwrap();
            let slot: Arc<Mutex<Option<Watch>>> = Arc::default();
            let opened = slot.clone();
            let starter: Starter = Arc::new(move |session, cutoff| {
                let dir = watch::locate(Some(root.as_path()), session)?;
                let (w, started) = Watch::open(session, &dir, cutoff, false).map_err(WatchError::Failed)?;
                *opened.lock().unwrap() = Some(w);
                Ok((started, None))
            });
            let activity: Box<dyn crate::layer::AnyLayer> = Box::new(Activity::with_starter(starter));
            let layers = match declared {
                None => vec![activity],
                Some(_) => vec![Box::new(crate::coda::waits::Waits::new()), activity],
            };
            let layer = layers.len() - 1;
            let mut h = Harness::new(layers);
            if let Some(declared) = declared {
                let caps = if declared { json!({"_meta": {"coda": {"waits": {}}}}) } else { json!({}) };
                h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":caps}}));
                h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}));
                h.to_client();
            }
            h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
            h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":SID}}));
            let mut watch = slot.lock().unwrap().take().expect("the layer opened the session");
            assert!(watch.rescan(&mut Quiet, &mut |_| true), "the first look");
            let mut rig = Rig { h, layer, watch, dir, _tmp: tmp };
            assert_eq!(rig.to_client(), ["answer 1"]);
            rig
        }

        /// The engine's time is now `ms` after the start: wake-ups due by then run.
        fn at(&mut self, ms: u64) {
            let by = Duration::from_millis(ms) - self.h.elapsed();
            self.h.advance(by);
        }

        /// Appends records to `agents/<agent>/wire.jsonl`, and the watch reads them.
        fn wire(&mut self, agent: &str, records: &[Value]) {
            let path = self.dir.join(format!("agents/{agent}/wire.jsonl"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
            for r in records {
                writeln!(f, "{r}").unwrap();
            }
            let mut scans = Vec::new();
            assert!(self.watch.rescan(&mut Quiet, &mut |s| {
                scans.push(s);
                true
            }));
            for s in scans {
                self.h.event(self.layer, s);
            }
        }

        /// What reached the client since the last look: `wait <waitId> <state>`, `answer <id>`, `update`.
        fn to_client(&mut self) -> Vec<String> {
            self.h
                .to_client()
                .iter()
                .map(|v| match v["method"].as_str() {
                    Some(m) if m == crate::coda::wait::METHOD => {
                        format!(
                            "wait {} {}",
                            v["params"]["waitId"].as_str().unwrap(),
                            v["params"]["state"].as_str().unwrap()
                        )
                    }
                    Some(m) => format!("{m} {}", v["params"]["sessionId"].as_str().unwrap_or("")),
                    None => format!("answer {}", v["id"]),
                })
                .collect()
        }
    }

    fn prompt(id: i64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":SID,"prompt":[{"type":"text","text":"go"}]}})
    }
    fn end_turn(id: i64) -> Value {
        json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}})
    }
    fn user_turn(turn: i64) -> Value {
        json!({"type":"turn.prompt","agentId":"main","turnId":turn,"origin":{"kind":"user"},"input":[],"time":1})
    }
    fn turn_ended(turn: i64) -> Value {
        json!({"type":"turn.ended","agentId":"main","turnId":turn,"reason":"completed","time":1})
    }

    #[test]
    fn a_prompt_answer_waits_for_the_turn_end_on_the_wire_and_at_most_answer_hold() {
        let mut r = Rig::new();
        r.h.from_client(prompt(5));
        r.wire("main", &[user_turn(0)]);
        r.at(200);
        // Kimi answers before it flushed the records of that turn.
        r.h.from_agent(end_turn(5));
        r.at(500);
        assert!(r.to_client().is_empty(), "held");
        r.wire(
            "main",
            &[
                json!({"type":"task.started","agentId":"main","info":{"taskId":"bash-bbbb2222","kind":"process","status":"running","description":"d","command":"sleep 1"},"time":1}),
                turn_ended(0),
            ],
        );
        // Rule 1: registered inside the turn that started it, so before that turn's answer.
        assert_eq!(r.to_client(), ["wait bash-bbbb2222 waiting", "answer 5"]);
        assert_eq!(r.h.next_wake(), None, "nothing left to wait for");

        // A turn whose end never shows on the wire: the answer goes out once ANSWER_HOLD has passed.
        r.h.from_client(prompt(6));
        r.wire("main", &[user_turn(1)]);
        r.at(1_000);
        r.h.from_agent(end_turn(6));
        assert_eq!(r.h.next_wake(), Some(ANSWER_HOLD));
        r.at(1_000 + ANSWER_HOLD.as_millis() as u64 - 1);
        assert!(r.to_client().is_empty(), "still held just before the hold runs out");
        r.at(1_000 + ANSWER_HOLD.as_millis() as u64);
        assert_eq!(r.to_client(), ["answer 6"]);
        assert_eq!(r.h.next_wake(), None);
    }

    /// Kimi writes a `usage_update` after its answer (as in the recordings): it reaches Coda after the answer
    /// the layer holds for the wire, never inside the turn; another session's frames do not wait.
    #[test]
    fn what_kimi_writes_after_a_held_answer_follows_it() {
        let mut r = Rig::new();
        r.h.from_client(prompt(5));
        r.wire("main", &[user_turn(0)]);
        r.at(200);
        r.h.from_agent(end_turn(5));
        let update = |sid: &str| {
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":sid,
                "update":{"sessionUpdate":"usage_update","used":10,"size":100}}})
        };
        r.h.from_agent(update(SID));
        r.h.from_agent(update("another"));
        assert_eq!(r.to_client(), ["session/update another"], "the session's update waits behind its answer");
        r.wire("main", &[turn_ended(0)]);
        assert_eq!(r.to_client(), ["answer 5", format!("session/update {SID}").as_str()]);
        // Without the wire's turn end: at the hold's deadline, in order too.
        r.h.from_client(prompt(6));
        r.wire("main", &[user_turn(1)]);
        r.at(1_000);
        r.h.from_agent(end_turn(6));
        r.h.from_agent(update(SID));
        assert!(r.to_client().is_empty());
        r.at(1_000 + ANSWER_HOLD.as_millis() as u64);
        assert_eq!(r.to_client(), ["answer 6", format!("session/update {SID}").as_str()]);
    }

    /// Kimi is busy with a turn of its own (a background task ended after Coda's turn): Coda's prompts wait.
    fn kimis_own_turn(r: &mut Rig) {
        let task = |kind: &str, status: &str| {
            json!({"type":kind,"agentId":"main","info":{"taskId":"bash-1","kind":"process","status":status,
                "description":"d","command":"sleep 1"},"time":1})
        };
        r.h.from_client(prompt(5));
        r.wire("main", &[user_turn(0), task("task.started", "running")]);
        r.h.from_agent(end_turn(5));
        r.wire("main", &[turn_ended(0), task("task.terminated", "completed")]);
        assert_eq!(r.to_client(), ["wait bash-1 waiting", "wait bash-1 handling", "answer 5"]);
        r.h.to_agent();
    }

    #[test]
    fn a_held_prompt_withdrawn_or_closed_is_answered_and_never_reaches_kimi() {
        let mut r = Rig::new();
        kimis_own_turn(&mut r);
        r.h.from_client(prompt(6));
        r.h.from_client(prompt(7));
        assert!(r.h.to_agent().is_empty(), "held while Kimi runs its own turn");
        // Withdrawn: answered cancelled at once; neither it nor its withdrawal reaches Kimi.
        r.h.from_client(json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":6}}));
        assert_eq!(
            r.h.to_client(),
            [json!({"jsonrpc":"2.0","id":6,"error":{"code":-32800,"message":"Request cancelled"}})]
        );
        assert!(r.h.to_agent().is_empty());
        // Closed: the other held prompt is stopped as a `session/cancel` stops it; the close goes on to Kimi.
        r.h.from_client(json!({"jsonrpc":"2.0","id":8,"method":"session/close","params":{"sessionId":SID}}));
        assert_eq!(r.h.to_client(), [json!({"jsonrpc":"2.0","id":7,"result":{"stopReason":"cancelled"}})]);
        let sent = r.h.to_agent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["method"], "session/close");
        r.h.from_agent(json!({"jsonrpc":"2.0","id":8,"result":{}}));
        let out = r.h.to_client();
        assert_eq!(out.last().map(|v| v["id"].clone()), Some(json!(8)), "{out:?}");
        assert!(r.h.layer::<Activity>(r.layer).sessions.is_empty(), "the session's watch and tables are gone");
        assert_eq!(r.h.next_wake(), None);
    }

    /// A prompt held for Kimi's own turn waits at most [`PROMPT_HOLD`]: when the wire never shows that turn
    /// (here: a background result no turn of Kimi's ever takes up), the prompt goes to Kimi then.
    #[test]
    fn a_prompt_held_for_kimis_own_turn_goes_on_at_its_deadline() {
        let mut r = Rig::new();
        kimis_own_turn(&mut r);
        r.h.from_client(prompt(6));
        r.h.advance(PROMPT_HOLD - Duration::from_millis(1));
        assert!(r.h.to_agent().is_empty(), "held while Kimi has a result of its own to handle");
        r.h.advance(Duration::from_millis(1));
        let sent = r.h.to_agent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0]["id"], 6, "{sent:?}");
        assert!(r.to_client().is_empty(), "Kimi answers it");
        assert_eq!(r.h.next_wake(), None, "nothing else waits");
    }

    #[test]
    fn a_prompt_waiting_for_its_sessions_watch_to_start_is_answered_when_withdrawn() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("kimi-home");
        let dir = root.join(format!("sessions/wd_work_000000000000/{SID}"));
        std::fs::create_dir_all(dir.join("agents/main")).unwrap();
        let starter: Starter = Arc::new(move |session, cutoff| {
            let dir = watch::locate(Some(root.as_path()), session)?;
            let (_, started) = Watch::open(session, &dir, cutoff, false).map_err(WatchError::Failed)?;
            Ok((started, None))
        });
        let mut h = Harness::build(|layers| layers.add(|_| Box::new(Activity::with_starter(starter))));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.hold_work();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":SID}}));
        h.from_client(prompt(2));
        h.from_client(prompt(3));
        h.from_client(json!({"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":2}}));
        assert_eq!(
            h.to_client(),
            [json!({"jsonrpc":"2.0","id":2,"error":{"code":-32800,"message":"Request cancelled"}})]
        );
        h.run_work();
        let sent: Vec<Value> = h.to_agent().into_iter().filter(|v| v["method"] == "session/prompt").collect();
        assert_eq!(sent, [prompt(3)], "the withdrawn prompt never reaches Kimi, the other goes once the watch runs");
    }

    #[test]
    fn a_subagent_run_whose_turn_end_never_shows_is_settled_after_the_grace() {
        let mut r = Rig::new();
        r.wire("main", &[user_turn(0)]);
        r.wire(
            "main",
            &[json!({"type":"subagent.spawned","subagentId":"agent-0","parentAgentId":"main","description":"helper","runInBackground":false,"taskId":"agent-cccc3333","time":1})],
        );
        r.wire(
            "agent-0",
            &[
                json!({"type":"metadata","protocol_version":"1.5","created_at":1}),
                json!({"type":"turn.prompt","agentId":"agent-0","turnId":0,"origin":{"kind":"system_trigger","name":"subagent"},"input":[],"time":1}),
            ],
        );
        assert_eq!(r.to_client(), ["wait agent-cccc3333 waiting"]);
        // The parent records the end; the subagent's wire never shows its turn end.
        r.at(300);
        r.wire("main", &[json!({"type":"subagent.completed","subagentId":"agent-0","time":1}), turn_ended(0)]);
        assert!(r.to_client().is_empty(), "its progress could still come");
        assert_eq!(r.h.next_wake(), Some(RUN_END_GRACE));
        r.at(300 + RUN_END_GRACE.as_millis() as u64 - 1);
        assert!(r.to_client().is_empty());
        r.at(300 + RUN_END_GRACE.as_millis() as u64);
        assert_eq!(r.to_client(), ["wait agent-cccc3333 done"]);
        assert_eq!(r.h.next_wake(), None);
    }

    /// The reports of Kimi's own turn on a background task that ended after the client turn, and of a
    /// subagent run with its progress.
    fn own_turn_and_a_subagent(r: &mut Rig) {
        let task = |ty: &str, status: &str| json!({"type":ty,"agentId":"main","info":{"taskId":"bash-1","kind":"process","status":status,"description":"d","command":"sleep 1"},"time":1});
        r.wire("main", &[user_turn(0), task("task.started", "running"), turn_ended(0)]);
        r.wire(
            "main",
            &[
                task("task.terminated", "completed"),
                json!({"type":"turn.prompt","agentId":"main","turnId":1,"origin":{"kind":"task","taskId":"bash-1"},"input":[],"time":1}),
                json!({"type":"context.append_loop_event","event":{"type":"content.part","turnId":"1","part":{"type":"text","text":"x"}},"time":1}),
                turn_ended(1),
            ],
        );
        r.wire(
            "main",
            &[
                user_turn(2),
                json!({"type":"subagent.spawned","subagentId":"agent-0","parentAgentId":"main","description":"helper","runInBackground":false,"taskId":"agent-r1","time":1}),
            ],
        );
        r.wire(
            "agent-0",
            &[
                json!({"type":"metadata","protocol_version":"1.5","created_at":1}),
                json!({"type":"turn.prompt","agentId":"agent-0","turnId":0,"origin":{"kind":"system_trigger","name":"subagent"},"input":[],"time":1}),
                json!({"type":"context.append_loop_event","event":{"type":"content.part","turnId":"0","part":{"type":"text","text":"sub"}},"time":1}),
                json!({"type":"turn.ended","agentId":"agent-0","turnId":0,"reason":"completed","time":1}),
            ],
        );
        r.wire("main", &[json!({"type":"subagent.completed","subagentId":"agent-0","time":1}), turn_ended(2)]);
    }

    /// Takes the facts the activity layer hands on: how many records each carried.
    struct Below(Arc<Mutex<Vec<usize>>>);

    impl Layer for Below {
        type Timer = Infallible;
        type Event = crate::adapters::kimi::facts::WireFacts;
        type Reply = Infallible;

        fn on_event(&mut self, facts: Self::Event, _cx: &mut Cx) {
            self.0.lock().unwrap().push(facts.entries.len());
        }
    }

    #[test]
    fn a_scans_facts_go_below_once_it_is_handled_and_the_took_log_follows_its_reads() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("kimi-home");
        let dir = root.join(format!("sessions/wd_work_000000000000/{SID}"));
        std::fs::create_dir_all(dir.join("agents/main")).unwrap();
        let wire = dir.join("agents/main/wire.jsonl");
        std::fs::write(&wire, "{\"type\":\"metadata\",\"protocol_version\":\"1.5\"}\n").unwrap();
        let starter: Starter = Arc::new(move |session, cutoff| {
            let dir = watch::locate(Some(root.as_path()), session)?;
            let (_, started) = Watch::open(session, &dir, cutoff, false).map_err(WatchError::Failed)?;
            Ok((started, None))
        });
        // The test's own watch of the same folder makes the scans.
        let (watch, _) = Watch::open(SID, &dir, SystemTime::now(), false).unwrap();
        let mut watch = watch.with_took();
        assert!(watch.rescan(&mut Quiet, &mut |_| true));
        let (tap, got) = (Tap::default(), Arc::new(Mutex::new(Vec::new())));
        let took = tmp.path().join("took.jsonl");
        let mut h = Harness::build(|layers| {
            let mut a = Activity::with_starter(starter);
            a.tap = tap.clone();
            a.took = FileLog::open("CODA_KIMI_TOOK", &took);
            layers.add(|_| Box::new(a));
            layers.add(|events| {
                tap.add(events);
                Box::new(Below(got.clone()))
            });
        });
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.hold_work();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":SID}}));
        let mut f = std::fs::OpenOptions::new().append(true).open(&wire).unwrap();
        writeln!(f, "{}", user_turn(0)).unwrap();
        writeln!(f, "{}", json!({"type":"llm.request","agentId":"main","kind":"loop","time":5})).unwrap();
        let mut scans = Vec::new();
        assert!(watch.rescan(&mut Quiet, &mut |s| {
            scans.push(s);
            true
        }));
        assert_eq!(scans.len(), 1);
        let len = std::fs::metadata(&wire).unwrap().len();
        assert_eq!(scans[0].took, [("agents/main/wire.jsonl".to_owned(), len)]);
        assert!(scans[0].facts.is_some(), "picked with the scan");
        // While the session's watch is starting the scan waits, and its facts with it.
        h.event(0, scans.pop().unwrap());
        h.deliver();
        assert!(got.lock().unwrap().is_empty(), "not before the activity layer handled the scan");
        assert_eq!(h.run_work(), 1);
        assert_eq!(h.to_client().len(), 1, "the answer");
        h.deliver();
        // First that the session's wire is read (no records), then the turn's prompt and the request.
        assert_eq!(*got.lock().unwrap(), [0, 2], "the watch's start, then the turn's prompt and the request");
        // The took log, written by its thread: whole once the layer is gone.
        drop(h);
        let text = std::fs::read_to_string(&took).unwrap();
        let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records, [json!({"took": format!("{}/agents/main/wire.jsonl", dir.display()), "len": len})]);
    }

    #[test]
    fn reports_go_out_only_to_a_client_that_declared_waits() {
        let all = [
            "wait bash-1 waiting",
            "wait bash-1 handling",
            "session/update S",
            "wait bash-1 done",
            "wait agent-r1 waiting",
            "session/update agent-0",
            "wait agent-r1 done",
        ];
        let all: Vec<String> = all.iter().map(|l| l.replace(" S", &format!(" {SID}"))).collect();
        let mut alone = Rig::new();
        own_turn_and_a_subagent(&mut alone);
        assert_eq!(alone.to_client(), all, "the layer reports unconditionally");
        let mut declared = Rig::with_waits(Some(true));
        own_turn_and_a_subagent(&mut declared);
        assert_eq!(declared.to_client(), all);
        // Without the capability only the main session's updates (Kimi's own turn) reach the client.
        let mut plain = Rig::with_waits(Some(false));
        own_turn_and_a_subagent(&mut plain);
        assert_eq!(plain.to_client(), [format!("session/update {SID}")]);
    }
}

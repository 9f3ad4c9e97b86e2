//! The I/O shell of coda-kimi's activity: watches one Kimi session folder and hands its changes on, parsed.
//!
//! It finds the session folder, watches it, and hands what changed in it to the activity layer as [`Scan`]s,
//! from a thread of its own (never the relay loop).
//!
//! An event only says "something in a watched folder may have changed" ([`crate::adapters::kimi::events`]): its kind, path and count
//! are not used. On each one (and after [`RESCAN_IDLE`] without one, [`RESCAN_EVERY`] while a folder could not be
//! watched) the watch looks again at every file it knows: a wire that grew is read on from where it stopped, a task
//! file whose identity (inode, size, mtime) changed is read again, a new folder is watched and then read. inotify
//! reports each write; macOS's FSEvents delivers late, coalesced, sometimes only for the folder, a rename as one
//! event or two: both lead to the same reads.
//!
//! Nothing outside the session folder is watched or read ([`crate::inside`]): a symbolic link inside it (folder
//! or file) is refused with a warning, and so is anything that is not a regular file. A wire is read in pieces of
//! [`READ_PIECE`], at most [`ROUND_BYTES`] of each file per scan, and at most [`IN_FLIGHT`] scans wait for the
//! relay loop at a time: memory does not grow with the size of an append.

use crate::{HashMap, HashSet};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::layer::EventSender;

use crate::adapters::kimi::events::{EventSource, Msg, NotifySource, Unwatched, Wake};
use crate::adapters::kimi::facts;
use crate::adapters::kimi::feed::{Fed, Feed};
use crate::inside::{Folder, Kind, Meta, Refused};

/// How long the watch waits for an event while a folder could not be watched (or no watcher could be made)
/// before it looks anyway: the longest such a change goes unseen. Under the activity layer's 2 s holds
/// (`ANSWER_HOLD`, `RUN_END_GRACE`), so a turn end written there still releases a held answer before the hold
/// runs out.
pub const RESCAN_EVERY: Duration = Duration::from_secs(1);
/// How long the watch waits for an event before it looks anyway while every folder is watched: a safety net only.
/// inotify and FSEvents say when they lost events (notify hands that on as an event, which leads to a look at
/// once), and a folder added to the watch is looked at right after.
pub const RESCAN_IDLE: Duration = Duration::from_secs(30);
/// Looks again within one scan at changes reported while it read, at most.
pub const MORE_LOOKS: usize = 4;
/// Bytes read from a file at a time.
pub const READ_PIECE: usize = 256 << 10;
/// Bytes of one wire handed over in one scan; the rest follows in the next scan.
pub const ROUND_BYTES: u64 = 1 << 20;
/// Scans handed over and not yet handled by the relay loop; the watch waits beyond that.
pub const IN_FLIGHT: usize = 2;
/// The largest task file read (Kimi's are under 1 KiB).
pub const TASK_FILE_MAX: u64 = 1 << 20;
/// Agent folders read in one session (Kimi makes one per subagent run: a session has a few, or dozens).
pub const MAX_AGENTS: usize = 1000;

/// The files of a session folder the watch reads, as `/`-separated patterns (`*` stands for any part of one
/// name), as the took log of `CODA_KIMI_TOOK` states them (fixtures/README.md).
pub const READS: &[&str] = &["agents/*/wire.jsonl", "agents/*/tasks/*.json"];

/// What happened to one file (the file log of `CODA_KIMI_RECORD`, fixtures/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Bytes appended to a wire file.
    Append,
    /// A wire file was replaced (new inode) or truncated: its content from the start.
    Reopen,
    /// A task file's content after an atomic replace.
    Replace,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Relative to the session folder, `/`-separated: `agents/main/wire.jsonl`.
    pub file: String,
    pub op: Op,
    pub bytes: Vec<u8>,
}

/// What changed since the last scan, for one session, parsed.
#[derive(Debug)]
pub struct Scan {
    pub session: String,
    /// Each file's new records, in the order read (task files first).
    pub fed: Vec<Fed>,
    /// The bytes read, for the file log; only when recording.
    pub chunks: Vec<Chunk>,
    /// How far this scan read each file it read (relative path, bytes from the start: a wire's offset, a task
    /// file's size), for the took log of `CODA_KIMI_TOOK`; only when that log is kept.
    pub took: Vec<(String, u64)>,
    /// The main agent's usage and compaction records of this scan, for the layers below the activity layer
    /// (handed on by it, once it has acted on the same records: [`facts::Tap`]).
    pub facts: Option<facts::WireFacts>,
    /// Frees a place for the next scan when this one is dropped (handled).
    _credit: Option<Credit>,
}

/// What the watch knew when it started.
pub struct Started {
    pub dir: String,
    /// The first line of `agents/main/wire.jsonl` (the metadata record).
    pub header: Vec<u8>,
    /// With `snapshot`: the wires (whole, up to where the watch starts reading) and task files as they were at
    /// the start, for a recording of a session made before the shim saw it (fixtures/README.md).
    pub snapshot: Vec<Chunk>,
}

/// The data root: `$KIMI_CODE_HOME`, else `~/.kimi-code`, with `env` answering for the environment. Set-up only
/// (`mod.rs`).
pub fn data_root(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(home) = env("KIMI_CODE_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(home));
    }
    env("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".kimi-code"))
}

/// Why a session's files are not watched: the activity layer warns (each case its own way) and goes on
/// without activity for that session.
#[derive(Debug)]
pub enum WatchError {
    /// Neither `KIMI_CODE_HOME` nor `HOME` says where Kimi keeps its data.
    NoDataRoot,
    /// No folder of that session under the data root.
    NotFound { root: PathBuf },
    /// Found, but it cannot be opened or watched (a link, its main wire unreadable, no thread).
    Failed(String),
}

/// The session's folder under the data root `root` ([`find_session`]).
pub fn locate(root: Option<&Path>, session: &str) -> Result<PathBuf, WatchError> {
    let root = root.ok_or(WatchError::NoDataRoot)?;
    find_session(root, session).ok_or_else(|| WatchError::NotFound { root: root.to_path_buf() })
}

/// `<root>/sessions/*/<session>`. The folders above the session folder may be links (a data root kept on
/// another disk is the user's choice, and Kimi follows them too); the session folder and everything in it may
/// not ([`Watch::open`]).
pub fn find_session(root: &Path, session: &str) -> Option<PathBuf> {
    if session.is_empty() || session.contains('/') || session.starts_with('.') {
        return None;
    }
    let candidates: Vec<PathBuf> =
        std::fs::read_dir(root.join("sessions")).ok()?.flatten().map(|d| d.path().join(session)).collect();
    let meta = |p: &PathBuf| std::fs::symlink_metadata(p).ok();
    // A real folder with an `agents` entry; else a link there, which [`Watch::open`] refuses with a warning
    // that says so.
    candidates
        .iter()
        .find(|p| meta(p).is_some_and(|m| m.is_dir()) && meta(&p.join("agents")).is_some())
        .or_else(|| candidates.iter().find(|p| meta(p).is_some_and(|m| m.is_symlink())))
        .cloned()
}

/// Milliseconds since the epoch, as Kimi writes a record's `time` (0 before the epoch).
fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Where the watch is in one wire.
struct Tracked {
    offset: u64,
    inode: (u64, u64),
    /// Replaced: being read again from the start.
    rereading: bool,
}

/// One session folder being watched: what is known of each file, and the parse of the wires.
pub struct Watch {
    session: String,
    dir: PathBuf,
    root: Folder,
    /// agent -> its wire.
    wires: BTreeMap<String, Tracked>,
    /// `agents/<agent>/tasks/<id>.json` -> as last read (a new one, by atomic replace, has another inode).
    tasks: HashMap<String, Meta>,
    /// Folders (relative) being watched.
    watched: HashSet<String>,
    /// Paths already warned about, so a bad entry is reported once.
    warned: HashSet<String>,
    /// A watch could not be added (warned once).
    watch_failed: bool,
    feed: Feed,
    record: bool,
    /// Scans say how far they read each file ([`Scan::took`]).
    took: bool,
}

impl Watch {
    /// Opens the session folder `dir` and notes where each file ends: history is not read again (with
    /// `snapshot` it is handed back in [`Started::snapshot`]; records older than `cutoff` are history when a
    /// replaced file is read again). A few reads of folders and sizes, nothing watched yet: the first
    /// [`Watch::rescan`] watches every folder and then reads what changed since these notes.
    pub fn open(session: &str, dir: &Path, cutoff: SystemTime, snapshot: bool) -> Result<(Watch, Started), String> {
        let root = Folder::open(dir).map_err(|why| format!("the session folder is {why}"))?;
        let header = read_header(&root).map_err(|why| format!("agents/main/wire.jsonl: {why}"))?;
        let cutoff_ms = epoch_ms(cutoff);
        let mut w = Watch {
            session: session.to_owned(),
            dir: dir.to_path_buf(),
            root,
            wires: BTreeMap::new(),
            tasks: HashMap::default(),
            watched: HashSet::default(),
            warned: HashSet::default(),
            watch_failed: false,
            feed: Feed::new(cutoff_ms),
            record: snapshot,
            took: false,
        };
        let agents = w.agents(None);
        let mut taken = Vec::new();
        for agent in &agents {
            for (rel, meta) in w.task_files(agent) {
                if snapshot && let Some(bytes) = w.open_file(&rel).and_then(|f| read_small(f, &rel)) {
                    taken.push(Chunk { file: rel.clone(), op: Op::Replace, bytes });
                }
                w.tasks.insert(rel, meta);
            }
        }
        for agent in &agents {
            let rel = wire_of(agent);
            let Some(mut file) = w.open_file(&rel) else { continue };
            let Ok(meta) = file.metadata() else { continue };
            let mut offset = meta.len();
            if snapshot {
                // The watch reads on from exactly where the snapshot ends.
                let mut bytes = Vec::new();
                if file.read_to_end(&mut bytes).is_ok() {
                    offset = bytes.len() as u64;
                    taken.push(Chunk { file: rel, op: Op::Append, bytes });
                }
            }
            w.wires.insert(agent.clone(), Tracked { offset, inode: (meta.dev(), meta.ino()), rereading: false });
        }
        let started = Started { dir: dir.to_string_lossy().into_owned(), header, snapshot: taken };
        Ok((w, started))
    }

    /// Scans say how far they read each file ([`Scan::took`]), as with `CODA_KIMI_TOOK`.
    pub fn with_took(mut self) -> Watch {
        self.took = true;
        self
    }

    /// Warns once about an entry that is not read.
    fn refuse(&mut self, rel: &str, why: Refused) {
        if self.warned.insert(rel.to_owned()) {
            tracing::warn!("Kimi session {}: {rel} is {why}; not read", self.session);
        }
    }

    fn open_file(&mut self, rel: &str) -> Option<File> {
        match self.root.file(rel) {
            Ok(f) => Some(f),
            Err(Refused::Missing) => None,
            Err(why) => {
                self.refuse(rel, why);
                None
            }
        }
    }

    /// Watches `rel` unless it is already (no source: only looks).
    fn watch(&mut self, rel: &str, source: &mut Option<&mut dyn EventSource>) {
        let Some(source) = source else { return };
        if self.watched.insert(rel.to_owned())
            && let Err(e) = source.watch(&self.dir.join(rel))
            && !std::mem::replace(&mut self.watch_failed, true)
        {
            tracing::warn!(
                "cannot watch {rel} of Kimi session {} ({e}; further failures are not reported); what is not \
                 watched is looked at every {RESCAN_EVERY:?}",
                self.session
            );
        }
    }

    /// The agent folders (real folders only, at most [`MAX_AGENTS`], `main` first), each watched with its `tasks`
    /// folder before it is read.
    fn agents(&mut self, mut source: Option<&mut dyn EventSource>) -> Vec<String> {
        let agents = match self.root.folder("agents") {
            Ok(f) => f,
            Err(Refused::Missing) => return Vec::new(),
            Err(why) => {
                self.refuse("agents", why);
                return Vec::new();
            }
        };
        self.watch("agents", &mut source);
        let mut out = Vec::new();
        let mut entries = agents.entries();
        // The main agent first: it is never among those left out.
        entries.sort_by_key(|(name, _)| name != "main");
        for (name, meta) in entries {
            let rel = format!("agents/{name}");
            match meta.kind {
                Kind::Folder => {}
                Kind::Link => {
                    self.refuse(&rel, Refused::Link);
                    continue;
                }
                _ => continue,
            }
            if out.len() == MAX_AGENTS {
                if self.warned.insert("agents/*".into()) {
                    tracing::warn!(
                        "Kimi session {}: over {MAX_AGENTS} agent folders; the rest is not read",
                        self.session
                    );
                }
                break;
            }
            self.watch(&rel, &mut source);
            let tasks = format!("{rel}/tasks");
            match agents.folder(&name).ok().and_then(|a| a.meta("tasks")).map(|m| m.kind) {
                Some(Kind::Folder) => self.watch(&tasks, &mut source),
                Some(Kind::Link) => self.refuse(&tasks, Refused::Link),
                _ => {}
            }
            out.push(name);
        }
        out
    }

    /// The task files of one agent (regular files only), as they are now.
    fn task_files(&mut self, agent: &str) -> Vec<(String, Meta)> {
        let folder = format!("agents/{agent}/tasks");
        let Ok(tasks) = self.root.folder(&folder) else { return Vec::new() };
        let mut out = Vec::new();
        for (name, meta) in tasks.entries() {
            if !name.ends_with(".json") || name.contains(".tmp.") {
                continue;
            }
            let rel = format!("{folder}/{name}");
            match meta.kind {
                Kind::File => out.push((rel, meta)),
                Kind::Link => self.refuse(&rel, Refused::Link),
                _ => self.refuse(&rel, Refused::WrongKind),
            }
        }
        out
    }

    /// Looks at every known file and hands over what is new, as scans, through `send` (false: stop). Changes
    /// reported while it read (up to [`MORE_LOOKS`] times) are read into the same scan: files written together
    /// (a parent's wire and its subagent's) reach the activity layer together.
    pub fn rescan(&mut self, source: &mut dyn EventSource, send: &mut dyn FnMut(Scan) -> bool) -> bool {
        let mut scan = self.empty_scan();
        let mut looks = 0;
        'look: loop {
            let agents = self.agents(Some(source));
            // Task files first: Kimi writes one before the wire record that ends its task.
            for agent in &agents {
                for (rel, meta) in self.task_files(agent) {
                    if self.tasks.get(&rel) == Some(&meta) {
                        continue;
                    }
                    self.tasks.insert(rel.clone(), meta);
                    let Some(bytes) = self.open_file(&rel).and_then(|f| read_small(f, &rel)) else { continue };
                    scan.fed.push(self.feed.piece(&rel, true, &bytes));
                    if self.took {
                        scan.took.push((rel.clone(), bytes.len() as u64));
                    }
                    if self.record {
                        scan.chunks.push(Chunk { file: rel, op: Op::Replace, bytes });
                    }
                }
            }
            // Then the wires, a round of at most ROUND_BYTES of each per scan, until all are read to their end.
            loop {
                let mut more = false;
                for agent in &agents {
                    more |= self.read_wire(agent, &mut scan);
                }
                if !more && looks < MORE_LOOKS && source.more() {
                    looks += 1;
                    continue 'look;
                }
                if !scan.fed.is_empty() || !scan.chunks.is_empty() || !scan.took.is_empty() {
                    let mut full = std::mem::replace(&mut scan, self.empty_scan());
                    full.facts = facts::pick(&full.session, &full.fed);
                    if !send(full) {
                        return false;
                    }
                }
                if !more {
                    return true;
                }
            }
        }
    }

    /// Waits once for the source (at most `timeout`) and looks again, whatever woke it; false when the watch
    /// is to end.
    pub fn step(
        &mut self,
        source: &mut dyn EventSource,
        timeout: Duration,
        send: &mut dyn FnMut(Scan) -> bool,
    ) -> bool {
        match source.wait(timeout) {
            Wake::Stop => false,
            Wake::Changed | Wake::Quiet => self.rescan(source, send),
        }
    }

    /// The longest wait for an event before the next look.
    pub fn idle_wait(&self) -> Duration {
        if self.watch_failed { RESCAN_EVERY } else { RESCAN_IDLE }
    }

    fn empty_scan(&self) -> Scan {
        Scan {
            session: self.session.clone(),
            fed: Vec::new(),
            chunks: Vec::new(),
            took: Vec::new(),
            facts: None,
            _credit: None,
        }
    }

    /// Reads up to ROUND_BYTES of what is new in `agent`'s wire into `scan`; true when more is left.
    fn read_wire(&mut self, agent: &str, scan: &mut Scan) -> bool {
        let rel = wire_of(agent);
        let Some(mut file) = self.open_file(&rel) else { return false };
        let Ok(meta) = file.metadata() else { return false };
        let inode = (meta.dev(), meta.ino());
        let tracked = self.wires.entry(agent.to_owned()).or_insert(Tracked { offset: 0, inode, rereading: false });
        if tracked.inode != inode || meta.len() < tracked.offset {
            // Replaced or truncated: read again from the start, dropping what was delivered (wire::Feed).
            *tracked = Tracked { offset: 0, inode, rereading: true };
            self.feed.reread(&rel);
        }
        if meta.len() <= tracked.offset {
            return false;
        }
        let rereading = tracked.rereading;
        let start = tracked.offset;
        let end = meta.len().min(start + ROUND_BYTES);
        let mut offset = start;
        let mut buf = vec![0u8; READ_PIECE];
        let mut entries = Vec::new();
        let mut raw = Vec::new();
        if std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start)).is_err() {
            return false;
        }
        while offset < end {
            let want = ((end - offset) as usize).min(READ_PIECE);
            let n = match file.read(&mut buf[..want]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            offset += n as u64;
            if let Fed::Entries { entries: got, .. } = self.feed.piece(&rel, false, &buf[..n]) {
                entries.extend(got);
            }
            if self.record {
                raw.extend_from_slice(&buf[..n]);
            }
        }
        if let Some(t) = self.wires.get_mut(agent) {
            t.offset = offset;
        }
        let done = offset >= meta.len();
        if done && rereading {
            self.feed.caught_up(&rel);
            if let Some(t) = self.wires.get_mut(agent) {
                t.rereading = false;
            }
        }
        if !entries.is_empty() {
            scan.fed.push(Fed::Entries { agent: agent.to_owned(), entries });
        }
        if self.took && offset > start {
            scan.took.push((rel.clone(), offset));
        }
        if self.record && offset > start {
            let op = if rereading && start == 0 { Op::Reopen } else { Op::Append };
            scan.chunks.push(Chunk { file: rel, op, bytes: raw });
        }
        !done && offset > start
    }
}

fn wire_of(agent: &str) -> String {
    format!("agents/{agent}/wire.jsonl")
}

/// A task file's whole content, unless it is larger than [`TASK_FILE_MAX`].
fn read_small(file: File, rel: &str) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    match file.take(TASK_FILE_MAX + 1).read_to_end(&mut bytes) {
        Ok(n) if n as u64 <= TASK_FILE_MAX => Some(bytes),
        Ok(_) => {
            tracing::warn!("Kimi's {rel} is over {TASK_FILE_MAX} bytes; not read");
            None
        }
        Err(_) => None,
    }
}

/// The first line of the main wire (at most 64 KiB).
fn read_header(root: &Folder) -> Result<Vec<u8>, String> {
    let file = root.file("agents/main/wire.jsonl").map_err(|why| why.to_string())?;
    let mut head = Vec::new();
    file.take(64 << 10).read_to_end(&mut head).map_err(|e| e.to_string())?;
    match memchr::memchr(b'\n', &head) {
        Some(at) => {
            head.truncate(at + 1);
            Ok(head)
        }
        None if head.len() < 64 << 10 => Ok(head),
        None => Err("its first line is over 64 KiB".into()),
    }
}

/// Places for scans in flight: the watch waits while [`IN_FLIGHT`] scans are with the relay loop.
struct Credits {
    used: Mutex<usize>,
    freed: Condvar,
}

#[derive(Debug)]
struct Credit(Arc<Credits>);

impl std::fmt::Debug for Credits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credits")
    }
}

impl Credits {
    fn take(self: &Arc<Self>, stop: &AtomicBool) -> Option<Credit> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        while *used >= IN_FLIGHT {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            used = self.freed.wait_timeout(used, Duration::from_millis(200)).unwrap_or_else(|p| p.into_inner()).0;
        }
        *used += 1;
        Some(Credit(self.clone()))
    }
}

impl Drop for Credit {
    fn drop(&mut self) {
        let mut used = self.0.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(1);
        self.0.freed.notify_one();
    }
}

/// Keeps the watch alive; dropping it ends the thread.
pub struct Handle {
    stop: Arc<AtomicBool>,
    wake: mpsc::Sender<Msg>,
    credits: Arc<Credits>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.wake.send(Msg::Stop);
        self.credits.freed.notify_all();
    }
}

/// Starts watching the session folder `dir`: notes where its files end ([`Watch::open`], a few reads of folders
/// and sizes, so nothing Kimi writes after the answer that named the session is taken for history), then sets
/// up the watch and reads on a thread of its own, which sends [`Scan`]s through `events`, each with the main
/// agent's usage and compaction records it read ([`Scan::facts`]) and, with `took`, how far it read each file.
pub fn start(
    session: &str,
    dir: &Path,
    cutoff: SystemTime,
    events: EventSender<Scan>,
    snapshot: bool,
    took: bool,
) -> Result<(Started, Handle), WatchError> {
    let (watch, started) = Watch::open(session, dir, cutoff, snapshot).map_err(WatchError::Failed)?;
    let mut watch = if took { watch.with_took() } else { watch };
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let credits = Arc::new(Credits { used: Mutex::new(0), freed: Condvar::new() });
    let handle = Handle { stop: stop.clone(), wake: tx.clone(), credits: credits.clone() };
    let spawned = std::thread::Builder::new().name(format!("kimi-watch-{session}")).spawn(move || {
        let mut source: Box<dyn EventSource> = match notify::recommended_watcher(move |ev| {
            let _ = tx.send(Msg::Fs(ev));
        }) {
            Ok(watcher) => Box::new(NotifySource { watcher, rx }),
            Err(e) => {
                tracing::warn!("cannot watch Kimi's files ({e}); they are looked at every {RESCAN_EVERY:?}");
                Box::new(Unwatched { rx })
            }
        };
        let mut send = |mut scan: Scan| {
            // One event, with its facts: they reach the layers below through the activity layer, when it
            // handles the scan, so no frame is handled between the two.
            let Some(credit) = credits.take(&stop) else { return false };
            scan._credit = Some(credit);
            events.send(scan)
        };
        // The first look watches every folder, then reads what changed since the notes.
        if !watch.rescan(source.as_mut(), &mut send) {
            return;
        }
        while !stop.load(Ordering::Relaxed) && watch.step(source.as_mut(), watch.idle_wait(), &mut send) {}
    });
    spawned.map_err(|e| WatchError::Failed(format!("cannot start the watch thread: {e}")))?;
    Ok((started, handle))
}

/// Watches stepped by their owner instead of a thread (a simulation: each write of the CLI's files is followed by
/// [`Driven::look`], so what the watch reads and when depends on no clock and no thread). [`start`]'s watch as it
/// reads: the same [`Watch`], scanning the same files; only what wakes it differs.
#[derive(Clone, Default)]
pub struct Driven(Arc<Mutex<Vec<Stepped>>>);

/// A watch of [`Driven`]'s, and where its scans go.
type Stepped = (Watch, EventSender<Scan>);

/// Folders are never watched: the owner says when to look.
struct Looked;

impl EventSource for Looked {
    fn watch(&mut self, _folder: &Path) -> Result<(), String> {
        Ok(())
    }

    fn wait(&mut self, _timeout: Duration) -> Wake {
        Wake::Quiet
    }
}

impl Driven {
    /// [`start`], stepped by [`Driven::look`]: its first look is now.
    pub fn start(
        &self,
        session: &str,
        dir: &Path,
        cutoff: SystemTime,
        events: EventSender<Scan>,
        took: bool,
    ) -> Result<Started, WatchError> {
        let (watch, started) = Watch::open(session, dir, cutoff, false).map_err(WatchError::Failed)?;
        let mut watch = if took { watch.with_took() } else { watch };
        watch.rescan(&mut Looked, &mut |scan| events.send(scan));
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((watch, events));
        Ok(started)
    }

    /// Every watch looks at its folder once, in the order they started: what changed goes to the layers.
    pub fn look(&self) {
        let mut watches = self.0.lock().unwrap_or_else(|p| p.into_inner());
        watches.retain_mut(|(watch, events)| watch.rescan(&mut Looked, &mut |scan| events.send(scan)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the folders it is asked to watch; never reports a change.
    #[derive(Default)]
    struct Counting(Vec<PathBuf>);

    impl EventSource for Counting {
        fn watch(&mut self, folder: &Path) -> Result<(), String> {
            self.0.push(folder.to_path_buf());
            Ok(())
        }
        fn wait(&mut self, _timeout: Duration) -> Wake {
            Wake::Quiet
        }
    }

    #[test]
    fn agent_folders_beyond_the_limit_and_oversized_task_files_are_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("session_x");
        std::fs::create_dir_all(dir.join("agents/main/tasks")).unwrap();
        std::fs::write(dir.join("agents/main/wire.jsonl"), "{\"type\":\"metadata\",\"protocol_version\":\"1.5\"}\n")
            .unwrap();
        for i in 0..MAX_AGENTS + 5 {
            std::fs::create_dir(dir.join(format!("agents/agent-{i:05}"))).unwrap();
        }
        let (mut w, started) = Watch::open("session_x", &dir, SystemTime::now(), false).unwrap();
        assert!(started.header.starts_with(b"{\"type\":\"metadata\""));
        // A task file over the limit, and one of usual size, written after the start.
        let big = format!("{{\"taskId\":\"bash-00000001\",\"pad\":\"{}\"}}", "x".repeat(TASK_FILE_MAX as usize));
        std::fs::write(dir.join("agents/main/tasks/bash-00000001.json"), big).unwrap();
        std::fs::write(dir.join("agents/main/tasks/bash-00000002.json"), "{\"taskId\":\"bash-00000002\"}").unwrap();
        let mut source = Counting::default();
        let mut scans = Vec::new();
        assert!(w.rescan(&mut source, &mut |s| {
            scans.push(s);
            true
        }));
        // `agents`, then each agent folder read (and `main/tasks`): no more than the limit.
        let agents = source.0.iter().filter(|p| p.parent().is_some_and(|p| p.ends_with("agents"))).count();
        assert_eq!(agents, MAX_AGENTS);
        let tasks: Vec<String> = scans
            .iter()
            .flat_map(|s| &s.fed)
            .filter_map(|f| match f {
                Fed::Task { info, .. } => Some(info.task_id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(tasks, ["bash-00000002"]);
    }
}

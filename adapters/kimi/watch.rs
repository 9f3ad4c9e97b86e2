//! The thin I/O shell: watches one Kimi session folder with inotify (through `notify`) and hands the
//! bytes that changed to the activity layer as [`Scan`]s. No parsing, no polling: the thread blocks on
//! the watcher's channel while nothing happens.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{SystemTime, UNIX_EPOCH};

use coda_shim::layer::EventSender;
use notify::{EventKind, RecursiveMode, Watcher};

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Bytes appended to a wire file.
    Append,
    /// A wire file was replaced (new inode) or truncated: its whole content.
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

/// Everything that changed since the last scan, for one session.
#[derive(Debug)]
pub struct Scan {
    pub session: String,
    pub chunks: Vec<Chunk>,
}

/// What the watch knew when it started.
pub struct Start {
    /// The first line of `agents/main/wire.jsonl` (the metadata record).
    pub header: Vec<u8>,
    /// Wall-clock ms at the start: records older than this are history.
    pub cutoff_ms: u64,
    /// With `snapshot`: the wires (whole, up to where the watch starts reading) and task files as they
    /// were at the start, for a recording of a session made before the shim saw it (fixtures/README.md).
    pub snapshot: Vec<Chunk>,
}

/// Keeps the watch alive; dropping it stops the thread.
pub struct Handle {
    watcher: Shared,
}

/// The watcher, shared with the thread that adds watches on new folders; `None` once the handle is dropped.
type Shared = Arc<Mutex<Option<notify::RecommendedWatcher>>>;

impl Drop for Handle {
    fn drop(&mut self) {
        // Without its watcher the event loop ends, and with it the channel the thread blocks on.
        let watcher = match self.watcher.lock() {
            Ok(mut w) => w.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(watcher);
    }
}

/// The data root: `$KIMI_CODE_HOME`, else `~/.kimi-code`.
pub fn data_root() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("KIMI_CODE_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(home));
    }
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".kimi-code"))
}

/// `<root>/sessions/*/<session>`.
pub fn find_session(root: &Path, session: &str) -> Option<PathBuf> {
    if session.is_empty() || session.contains('/') || session.starts_with('.') {
        return None;
    }
    std::fs::read_dir(root.join("sessions"))
        .ok()?
        .flatten()
        .map(|d| d.path().join(session))
        .find(|p| p.join("agents").is_dir())
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

struct Tracked {
    offset: u64,
    inode: u64,
}

struct Reader {
    dir: PathBuf,
    wires: HashMap<PathBuf, Tracked>,
    /// `agents/<agent>` and `agents/<agent>/tasks` folders known to be watched.
    folders: HashSet<PathBuf>,
}

impl Reader {
    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(&self.dir).unwrap_or(p).to_string_lossy().replace('\\', "/")
    }

    /// All `agents/*/wire.jsonl` currently present.
    fn wire_paths(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(self.dir.join("agents"))
            .map(|rd| rd.flatten().map(|d| d.path().join("wire.jsonl")).filter(|p| p.is_file()).collect())
            .unwrap_or_default();
        out.sort();
        out
    }

    /// Folders that appeared since the last look. `notify` adds its watch on a new folder only after it has
    /// reported the folder's creation, so a file written there in between raises no event (tried: a file
    /// written right after its folder, 7 in 1000 unread until the next unrelated write, and most task files
    /// of a new `tasks/`). The thread watches each new folder itself before reading it: a write before that
    /// is read, one after it raises an event.
    fn new_folders(&mut self) -> Vec<PathBuf> {
        let agents: Vec<PathBuf> = std::fs::read_dir(self.dir.join("agents"))
            .map(|rd| rd.flatten().map(|d| d.path()).filter(|p| p.is_dir()).collect())
            .unwrap_or_default();
        let mut out = Vec::new();
        for agent in agents {
            for folder in [agent.join("tasks"), agent] {
                if folder.is_dir() && self.folders.insert(folder.clone()) {
                    out.push(folder);
                }
            }
        }
        out.sort();
        out
    }

    /// Reads what is new in every wire; files that appear later are read from their start.
    fn wires(&mut self, out: &mut Vec<Chunk>) {
        for path in self.wire_paths() {
            let Ok(mut f) = File::open(&path) else { continue };
            let Ok(meta) = f.metadata() else { continue };
            let tracked = self.wires.entry(path.clone()).or_insert(Tracked { offset: 0, inode: meta.ino() });
            let mut op = Op::Append;
            if tracked.inode != meta.ino() || meta.len() < tracked.offset {
                *tracked = Tracked { offset: 0, inode: meta.ino() };
                op = Op::Reopen;
            }
            if meta.len() == tracked.offset {
                continue;
            }
            let mut bytes = Vec::new();
            if f.seek(SeekFrom::Start(tracked.offset)).is_err() || f.read_to_end(&mut bytes).is_err() {
                continue;
            }
            tracked.offset += bytes.len() as u64;
            out.push(Chunk { file: self.rel(&path), op, bytes });
        }
    }
}

fn is_task_file(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".json")
        && !name.contains(".tmp.")
        && p.parent().and_then(Path::file_name).is_some_and(|n| n == "tasks")
}

/// The task files in one `tasks` folder.
fn tasks_in(folder: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(folder)
        .map(|rd| rd.flatten().map(|t| t.path()).filter(|p| is_task_file(p)).collect())
        .unwrap_or_default()
}

/// `agents/*/tasks/*.json` currently present.
fn task_paths(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir.join("agents"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|d| std::fs::read_dir(d.path().join("tasks")).ok())
                .flat_map(|tasks| tasks.flatten().map(|t| t.path()))
                .filter(|p| is_task_file(p))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Starts watching `dir` (a session folder). History is skipped: existing wires are read from their
/// current end. `snapshot`: also hand back what the files held at the start ([`Start::snapshot`]).
pub fn start(session: &str, dir: &Path, events: EventSender, snapshot: bool) -> Result<(Start, Handle), String> {
    let main = dir.join("agents/main/wire.jsonl");
    let header = File::open(&main)
        .and_then(|f| {
            let mut line = Vec::new();
            BufReader::new(f).read_until(b'\n', &mut line)?;
            Ok(line)
        })
        .map_err(|e| format!("cannot read {}: {e}", main.display()))?;
    let (tx, rx) = mpsc::channel();
    let mut reader = Reader { dir: dir.to_path_buf(), wires: HashMap::new(), folders: HashSet::new() };
    // Before the watch: a folder made after this is walked by it, or reported and then found new.
    reader.new_folders();
    let mut watcher = notify::recommended_watcher(tx).map_err(|e| format!("cannot watch: {e}"))?;
    watcher
        .watch(&dir.join("agents"), RecursiveMode::Recursive)
        .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    let watcher: Shared = Arc::new(Mutex::new(Some(watcher)));
    let shared = watcher.clone();
    let cutoff_ms = now_ms();
    let mut taken = Vec::new();
    if snapshot {
        for path in task_paths(dir) {
            if let Ok(bytes) = std::fs::read(&path) {
                taken.push(Chunk { file: reader.rel(&path), op: Op::Replace, bytes });
            }
        }
    }
    for path in reader.wire_paths() {
        let Ok(mut f) = File::open(&path) else { continue };
        let Ok(meta) = f.metadata() else { continue };
        let mut offset = meta.len();
        if snapshot {
            // The watch reads on from exactly where the snapshot ends.
            let mut bytes = Vec::new();
            if f.read_to_end(&mut bytes).is_ok() {
                offset = bytes.len() as u64;
                taken.push(Chunk { file: reader.rel(&path), op: Op::Append, bytes });
            }
        }
        reader.wires.insert(path, Tracked { offset, inode: meta.ino() });
    }
    let session = session.to_owned();
    let spawned = std::thread::Builder::new().name(format!("kimi-watch-{session}")).spawn(move || {
        // Blocks until something changes; ends when the watcher is dropped.
        while let Ok(first) = rx.recv() {
            let mut tasks: Vec<PathBuf> = Vec::new();
            let mut changed = false;
            // Our own reads raise open/close (access) events: they must not wake a scan, or the
            // watch would feed itself.
            let mut note = |ev: notify::Result<notify::Event>| {
                if let Ok(ev) = ev
                    && !matches!(ev.kind, EventKind::Access(_))
                {
                    changed = true;
                    tasks.extend(ev.paths.into_iter().filter(|p| is_task_file(p)));
                }
            };
            note(first);
            while let Ok(more) = rx.try_recv() {
                note(more);
            }
            if !changed {
                continue;
            }
            let fresh = reader.new_folders();
            if !fresh.is_empty() {
                if let Ok(mut guard) = shared.lock()
                    && let Some(w) = guard.as_mut()
                {
                    for folder in &fresh {
                        if let Err(e) = w.watch(folder, RecursiveMode::Recursive) {
                            tracing::warn!("cannot watch {}: {e}", folder.display());
                        }
                    }
                }
                for folder in fresh.iter().filter(|f| f.ends_with("tasks")) {
                    tasks.extend(tasks_in(folder));
                }
            }
            tasks.sort();
            tasks.dedup();
            let mut chunks = Vec::new();
            // Task files first: they are written before the wire record that ends the task.
            for path in tasks {
                if let Ok(bytes) = std::fs::read(&path) {
                    chunks.push(Chunk { file: reader.rel(&path), op: Op::Replace, bytes });
                }
            }
            reader.wires(&mut chunks);
            if chunks.is_empty() {
                continue;
            }
            if !events.send(Scan { session: session.clone(), chunks }) {
                break;
            }
        }
    });
    spawned.map_err(|e| format!("cannot start the watch thread: {e}"))?;
    Ok((Start { header, cutoff_ms, snapshot: taken }, Handle { watcher }))
}

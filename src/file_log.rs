//! The one log writer: a file the shim writes for the replay tools (`CODA_KIMI_RECORD`, `CODA_KIMI_TOOK`,
//! `CODA_OPENCODE_TOOK`, `CODA_OPENCODE_RECORD`, `CODA_CODEX_RECORD`, `CODA_GROK_RECORD`):
//! one JSON line a record, private to the user (`src/private_file.rs`), written in order by a thread of the
//! log's own (started at set-up), so the relay loop never waits on the disk. A layer only makes the lines.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One record of a file log of what the shim read (fixtures/README.md): `op` on `path` at `at`, its `bytes` as
/// `data` when they are UTF-8 text, else as `base64`.
pub fn file_op(at: SystemTime, op: &str, path: &str, bytes: &[u8]) -> serde_json::Value {
    let ts = humantime::format_rfc3339_micros(at).to_string();
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::json!({ "ts": ts, "op": op, "path": path, "data": text }),
        Err(_) => {
            use base64::Engine as _;
            let base64 = base64::engine::general_purpose::STANDARD.encode(bytes);
            serde_json::json!({ "ts": ts, "op": op, "path": path, "base64": base64 })
        }
    }
}

/// Where the records go: the writer thread's queue.
pub struct FileLog {
    lines: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    writer: Option<std::thread::JoinHandle<()>>,
    out: Shared,
}

type Shared = Arc<Mutex<Box<dyn Write + Send>>>;

/// Writes records to a log at once, from a job of the layer's (off the relay loop), in between the lines the
/// writer thread writes.
#[derive(Clone)]
pub struct Direct(Shared);

impl Direct {
    /// Records the file at `path` as a job read it for the session Coda opened at `at`: a `replace` with its
    /// `lines` (each ended by a newline), marked `"at":"open"` (it was there before the CLI's answer).
    pub fn opened(&self, at: SystemTime, path: &Path, lines: &[Vec<u8>]) {
        let text: Vec<u8> = lines.iter().flat_map(|l| l.iter().chain(b"\n")).copied().collect();
        let mut rec = file_op(at, "replace", &path.to_string_lossy(), &text);
        rec["at"] = "open".into();
        self.record(&rec);
    }

    pub fn record(&self, rec: &serde_json::Value) {
        let mut line = rec.to_string().into_bytes();
        line.push(b'\n');
        let mut out = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = out.write_all(&line) {
            tracing::warn!("cannot write a log record: {e}");
        }
    }
}

impl FileLog {
    /// The log in `path` (appended to; private to the user, no symbolic link followed) named by the variable
    /// `var`; None, with a warning, when it cannot be opened.
    pub fn open(var: &str, path: &Path) -> Option<FileLog> {
        match crate::private_file::open(path, crate::private_file::Write::Append) {
            Ok(f) => Some(FileLog::to(var, Box::new(f))),
            Err(e) => {
                tracing::warn!("cannot open {var} {}: {e}", path.display());
                None
            }
        }
    }

    /// The log written to `out`, by a thread of its own (None, with a warning, when none can start).
    pub fn to(var: &str, out: Box<dyn Write + Send>) -> FileLog {
        let (lines, queue) = std::sync::mpsc::channel::<Vec<u8>>();
        let name = var.to_owned();
        let out: Shared = Arc::new(Mutex::new(out));
        let shared = out.clone();
        let writer = std::thread::Builder::new().name("file-log".into()).spawn(move || {
            for line in queue {
                let mut out = shared.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = out.write_all(&line) {
                    tracing::warn!("cannot write {name}: {e}; no more records");
                    return;
                }
            }
            let _ = shared.lock().unwrap_or_else(|p| p.into_inner()).flush();
        });
        match writer {
            Ok(writer) => FileLog { lines: Some(lines), writer: Some(writer), out },
            Err(e) => {
                tracing::warn!("cannot start the thread that writes {var}: {e}; nothing is recorded");
                FileLog { lines: None, writer: None, out }
            }
        }
    }

    /// A handle that writes records at once, for the layer's jobs.
    pub fn direct(&self) -> Direct {
        Direct(self.out.clone())
    }

    /// Writes one record as a line (queued: the writer thread writes them in order). A log shared by several
    /// layers is an `Arc<FileLog>`: its last owner's drop waits for the queue.
    pub fn record(&self, rec: &serde_json::Value) {
        let mut line = rec.to_string().into_bytes();
        line.push(b'\n');
        if let Some(lines) = &self.lines {
            let _ = lines.send(line);
        }
    }
}

/// The log ends with the layer: what is queued is written first.
impl Drop for FileLog {
    fn drop(&mut self) {
        self.lines = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

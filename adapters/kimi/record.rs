//! The file log of `CODA_KIMI_RECORD`: what coda-kimi read of Kimi's session files, for recordings; and the
//! took log of `CODA_KIMI_TOOK`, written the same way: how far the shim has taken in each file, for the
//! replay player (fixtures/README.md, "Waiting for the shim").
//!
//! One JSON line per file operation, in the order the activity layer handled them (fixtures/README.md, "Kimi
//! session files"): `{ts, op, path, data|base64}`, and `at: "open"` on the records of what the files held
//! when the session was found. The time of each record is the one the engine handed the layer. The layer only
//! makes the lines; a thread of the log's own (started at set-up) writes them, in order, so the relay loop
//! never waits on the disk.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use base64::Engine as _;
use serde_json::json;

use crate::adapters::kimi::watch::{Chunk, Op};

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

    /// Writes the records of one scan, or of the snapshot taken when the session was found (`open`), with the
    /// time `at`; the session folder `dir` is the start of each path.
    pub fn chunks(&mut self, dir: &str, chunks: &[Chunk], at: SystemTime, open: bool) {
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
            self.record(&rec);
        }
    }

    /// Writes one record as a line.
    pub fn record(&mut self, rec: &serde_json::Value) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn records_carry_the_time_handed_in_and_bytes_that_are_not_text_as_base64() {
        let out = Shared::default();
        let mut log = FileLog::to("CODA_KIMI_RECORD", Box::new(out.clone()));
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_796_000_000_123_456);
        let chunks = [
            Chunk { file: "agents/main/wire.jsonl".into(), op: Op::Append, bytes: b"{}\n".to_vec() },
            Chunk { file: "agents/main/tasks/t.json".into(), op: Op::Replace, bytes: vec![0xff, 0xfe] },
        ];
        log.chunks("/s/x", &chunks, at, true);
        log.chunks("/s/x", &chunks[..1], at, false);
        // Written by the log's thread: all of it once the log is dropped.
        drop(log);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["ts"], "2026-11-30T00:53:20.123456Z");
        assert_eq!(lines[0]["path"], "/s/x/agents/main/wire.jsonl");
        assert_eq!(
            (&lines[0]["op"], &lines[0]["data"], &lines[0]["at"]),
            (&json!("append"), &json!("{}\n"), &json!("open"))
        );
        assert_eq!((&lines[1]["op"], &lines[1]["base64"]), (&json!("replace"), &json!("//4=")));
        assert!(lines[2].get("at").is_none());
    }
}

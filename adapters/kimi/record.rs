//! The file log of `CODA_KIMI_RECORD`: what coda-kimi read of Kimi's session files, for recordings.
//!
//! One JSON line per file operation, in the order the activity layer handled them (fixtures/README.md, "Kimi
//! session files"): `{ts, op, path, data|base64}`, and `at: "open"` on the records of what the files held
//! when the session was found. The time of each record is the one the engine handed the layer. The layer only
//! makes the lines; a thread of the log's own (started at set-up) writes them, in order, so the relay loop
//! never waits on the disk.

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use base64::Engine as _;
use serde_json::json;

use crate::adapters::kimi::watch::{Chunk, Op};

/// Where the records go: the writer thread's queue.
pub struct FileLog {
    lines: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl FileLog {
    /// The log in `path` (appended to; private to the user, no symbolic link followed); None, with a warning,
    /// when it cannot be opened.
    pub fn open(path: &Path) -> Option<FileLog> {
        match crate::private_file::open(path, crate::private_file::Write::Append) {
            Ok(f) => Some(FileLog::to(Box::new(f))),
            Err(e) => {
                tracing::warn!("cannot open CODA_KIMI_RECORD {}: {e}", path.display());
                None
            }
        }
    }

    /// The log written to `out`, by a thread of its own (None, with a warning, when none can start).
    pub fn to(mut out: Box<dyn Write + Send>) -> FileLog {
        let (lines, queue) = std::sync::mpsc::channel::<Vec<u8>>();
        let writer = std::thread::Builder::new().name("kimi-record".into()).spawn(move || {
            for line in queue {
                if let Err(e) = out.write_all(&line) {
                    tracing::warn!("cannot write CODA_KIMI_RECORD: {e}; no more records");
                    return;
                }
            }
            let _ = out.flush();
        });
        match writer {
            Ok(writer) => FileLog { lines: Some(lines), writer: Some(writer) },
            Err(e) => {
                tracing::warn!("cannot start the thread that writes CODA_KIMI_RECORD: {e}; nothing is recorded");
                FileLog { lines: None, writer: None }
            }
        }
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
            let mut line = rec.to_string().into_bytes();
            line.push(b'\n');
            if let Some(lines) = &self.lines {
                let _ = lines.send(line);
            }
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
    use std::sync::{Arc, Mutex};

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
        let mut log = FileLog::to(Box::new(out.clone()));
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

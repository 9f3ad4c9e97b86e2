//! The file log of `CODA_KIMI_RECORD`: what coda-kimi read of Kimi's session files, for recordings; and the
//! took log of `CODA_KIMI_TOOK`, written the same way: how far the shim has taken in each file, for the
//! replay player (fixtures/README.md, "Waiting for the shim"). Both are [`FileLog`]s (`src/file_log.rs`).
//!
//! One JSON line per file operation, in the order the activity layer handled them (fixtures/README.md, "Kimi
//! session files"): `{ts, op, path, data|base64}`, and `at: "open"` on the records of what the files held
//! when the session was found. The time of each record is the one the engine handed the layer. The layer only
//! makes the lines; a thread of the log's own (started at set-up) writes them, in order, so the relay loop
//! never waits on the disk.

use std::time::SystemTime;

use serde_json::json;

use crate::adapters::kimi::watch::{Chunk, Op};
use crate::file_log::{FileLog, file_op};

/// Writes the records of one scan, or of the snapshot taken when the session was found (`open`), with the
/// time `at`; the session folder `dir` is the start of each path.
pub fn chunks(log: &mut FileLog, dir: &str, chunks: &[Chunk], at: SystemTime, open: bool) {
    for c in chunks {
        let op = match c.op {
            Op::Append => "append",
            Op::Reopen => "write",
            Op::Replace => "replace",
        };
        let mut rec = file_op(at, op, &format!("{dir}/{}", c.file), &c.bytes);
        if open {
            rec["at"] = json!("open");
        }
        log.record(&rec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
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
        let mut log = FileLog::to("CODA_KIMI_RECORD", Box::new(out.clone()));
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_796_000_000_123_456);
        let chunks = [
            Chunk { file: "agents/main/wire.jsonl".into(), op: Op::Append, bytes: b"{}\n".to_vec() },
            Chunk { file: "agents/main/tasks/t.json".into(), op: Op::Replace, bytes: vec![0xff, 0xfe] },
        ];
        super::chunks(&mut log, "/s/x", &chunks, at, true);
        super::chunks(&mut log, "/s/x", &chunks[..1], at, false);
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

//! The log of the OpenCode server events the layers handled (`CODA_OPENCODE_RECORD`), for `acp-replay`.
//!
//! One line per event, as `acp-replay record --files` takes them.
//!
//! A layer hands each event it handled, with the time it handled it, to a [`Record`]; the set-up owns the
//! file (private: mode 0600, no symlink followed) and a thread that writes the lines, so no layer writes a file.

use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::SystemTime;

use serde_json::json;

use crate::adapters::opencode::server::ServerEvent;

/// Where layers log the server events they handled; clones write to the same file, in the order handled.
#[derive(Clone, Default)]
pub struct Record {
    writer: Option<Arc<Writer>>,
    /// Where the recording says the events were read from.
    events_path: String,
}

/// The thread that writes the lines. Dropped with the last [`Record`] (when the layers are): it then waits
/// for the thread to write what is queued, so the events handled last are in the file before the shim exits.
struct Writer {
    lines: Option<mpsc::Sender<String>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.lines = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("the OpenCode event record's writer failed");
        }
    }
}

impl Record {
    /// Logs nothing.
    pub fn off() -> Record {
        Record::default()
    }

    /// Logs to `log` (opened now, appended to), naming `events_path` as the file the events were read from.
    pub fn to_file(log: &Path, events_path: String) -> std::io::Result<Record> {
        let file = crate::private_file::open(log, crate::private_file::Write::Append)?;
        let (tx, rx) = mpsc::channel::<String>();
        let thread = std::thread::Builder::new().name("opencode-record".into()).spawn(move || write_all(file, rx))?;
        Ok(Record { writer: Some(Arc::new(Writer { lines: Some(tx), thread: Some(thread) })), events_path })
    }

    /// Logs `event`, handled at `at` (one file-log line: an append of the event's line to the events file).
    pub fn handled(&self, event: &ServerEvent, at: SystemTime) {
        let Some(tx) = self.writer.as_ref().and_then(|w| w.lines.as_ref()) else { return };
        let data = serde_json::to_string(event).unwrap_or_default() + "\n";
        let ts = humantime::format_rfc3339_nanos(at).to_string();
        let line = json!({"ts": ts, "op": "append", "path": self.events_path, "data": data}).to_string() + "\n";
        // The writer gone (a write failed, with a warning) means no more logging.
        let _ = tx.send(line);
    }
}

fn write_all(mut file: std::fs::File, lines: mpsc::Receiver<String>) {
    use std::io::Write;
    for line in lines {
        if let Err(err) = file.write_all(line.as_bytes()) {
            tracing::warn!("cannot write the OpenCode event record: {err}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn events_are_logged_in_the_order_handled_with_their_time_into_a_private_file() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("files.jsonl");
        let record = Record::to_file(&log, "/t/coda-opencode-events.jsonl".into()).expect("open");
        let other = record.clone();
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_500);
        record.handled(&ServerEvent::Status { session: "ses_parent".into(), busy: true }, at);
        let child = ServerEvent::TaskChild { session: "ses_parent".into(), call: "call_1".into(), child: "c".into() };
        other.handled(&child, at);
        // Dropping the last clone waits for the writer.
        drop((record, other));
        let text = std::fs::read_to_string(&log).expect("read");
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["op"], "append");
        assert_eq!(lines[0]["path"], "/t/coda-opencode-events.jsonl");
        assert_eq!(lines[0]["data"], "{\"type\":\"session.status\",\"session\":\"ses_parent\",\"busy\":true}\n");
        assert_eq!(lines[1]["ts"], "1970-01-01T00:00:01.500000000Z");
        assert!(lines[1]["data"].as_str().is_some_and(|d| d.contains("task.child")));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&log).expect("meta").permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_symlink_is_refused_and_off_logs_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").expect("target");
        let link = dir.path().join("log");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        assert!(Record::to_file(&link, String::new()).is_err());
        Record::off().handled(&ServerEvent::Status { session: "s".into(), busy: false }, SystemTime::now());
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "");
    }
}

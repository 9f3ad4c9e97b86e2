//! The log of the OpenCode server events the layers handled (`CODA_OPENCODE_RECORD`), for `acp-replay`.
//!
//! One line per event, as `acp-replay record --files` takes them.
//!
//! A layer hands each event it handled, with the time it handled it, to a [`Record`]; the shim's one log writer
//! ([`FileLog`]: private, mode 0600, no symlink followed, a thread of its own) writes the lines, so no layer
//! writes a file.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::json;

use crate::adapters::opencode::server::ServerEvent;
use crate::file_log::FileLog;

/// Where layers log the server events they handled; clones write to the same file, in the order handled. The
/// log's writer ([`FileLog`]) ends with the last clone (when the layers do), once it has written what is queued.
#[derive(Clone, Default)]
pub struct Record {
    log: Option<Arc<FileLog>>,
    /// Where the recording says the events were read from.
    events_path: String,
}

impl Record {
    /// Logs nothing.
    pub fn off() -> Record {
        Record::default()
    }

    /// Logs to `log` (opened now, appended to; named by the variable `var` in warnings), naming `events_path` as
    /// the file the events were read from. None, with a warning, when it cannot be opened.
    pub fn to_file(var: &str, log: &Path, events_path: String) -> Option<Record> {
        let log = FileLog::open(var, log)?;
        Some(Record { log: Some(Arc::new(log)), events_path })
    }

    /// Logs `event`, handled at `at` (one file-log line: an append of the event's line to the events file).
    pub fn handled(&self, event: &ServerEvent, at: SystemTime) {
        let Some(log) = &self.log else { return };
        let data = serde_json::to_string(event).unwrap_or_default() + "\n";
        let ts = humantime::format_rfc3339_nanos(at).to_string();
        log.record(&json!({"ts": ts, "op": "append", "path": self.events_path, "data": data}));
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
        let record = Record::to_file("TEST", &log, "/t/coda-opencode-events.jsonl".into()).expect("open");
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
        assert!(Record::to_file("TEST", &link, String::new()).is_none());
        Record::off().handled(&ServerEvent::Status { session: "s".into(), busy: false }, SystemTime::now());
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "");
    }
}

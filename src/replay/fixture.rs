//! A fixture on disk: the files of a fixture folder, loaded as one list of records.

use std::fmt;
use std::path::{Path, PathBuf};

use super::format::{ParseError, Record, parse_records};
use super::normalise::{Normaliser, RecordError, record};

/// The file inside a fixture folder that holds the recording.
pub const TRACE_FILE: &str = "trace.jsonl";

/// The session-file log that may sit beside `trace.jsonl` (merged by time when the folder is loaded).
pub const FILES_FILE: &str = "files.jsonl";

/// Why a fixture could not be loaded; each names the file or folder.
#[derive(Debug)]
pub enum LoadError {
    Read(PathBuf, std::io::Error),
    Parse(PathBuf, ParseError),
    Merge(PathBuf, RecordError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read(p, e) => write!(f, "cannot read {}: {e}", p.display()),
            LoadError::Parse(p, e) => write!(f, "{}: {e}", p.display()),
            LoadError::Merge(p, e) => write!(f, "{}: {e}", p.display()),
        }
    }
}

impl std::error::Error for LoadError {}

/// Loads a fixture folder (its `trace.jsonl`, merged with a `files.jsonl` beside it) or a trace/fixture file.
pub fn load(path: &Path) -> Result<Vec<Record>, LoadError> {
    let file = if path.is_dir() { path.join(TRACE_FILE) } else { path.to_path_buf() };
    let text = std::fs::read_to_string(&file).map_err(|e| LoadError::Read(file.clone(), e))?;
    let files = file.with_file_name(FILES_FILE);
    if path.is_dir() && files.is_file() {
        let log = std::fs::read_to_string(&files).map_err(|e| LoadError::Read(files.clone(), e))?;
        // Merging needs the trace's absolute `ts`; the records are normalised already.
        return record(&text, Some(&log), &Normaliser::default()).map_err(|e| LoadError::Merge(path.to_owned(), e));
    }
    parse_records(&text).map_err(|e| LoadError::Parse(file, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_merges_its_file_log_and_a_fixture_cannot_be_merged() {
        let dir = tempfile::tempdir().unwrap();
        let trace = concat!(
            r#"{"ts":"2026-01-01T00:00:00.000Z","dir":"agent->shim","line":"a"}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.010Z","dir":"agent->shim","line":"b"}"#,
            "\n",
        );
        let files = concat!(r#"{"ts":"2026-01-01T00:00:00.005Z","op":"mkdir","path":"{{HOME}}/x"}"#, "\n");
        std::fs::write(dir.path().join(TRACE_FILE), trace).unwrap();
        std::fs::write(dir.path().join(FILES_FILE), files).unwrap();
        let records = load(dir.path()).unwrap();
        assert_eq!(records.iter().map(|r| r.t).collect::<Vec<_>>(), vec![Some(0), Some(5), Some(10)]);
        // The trace file alone: the log beside it is not merged.
        assert_eq!(load(&dir.path().join(TRACE_FILE)).unwrap().len(), 2);
        std::fs::write(dir.path().join(TRACE_FILE), r#"{"t":0,"dir":"agent->shim","line":"a"}"#).unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(matches!(err, LoadError::Merge(_, RecordError::NeedsTraceTimes)), "{err}");
        let err = load(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, LoadError::Read(..)), "{err}");
    }
}

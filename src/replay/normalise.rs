//! Turning a trace into a fixture: machine-specific values become placeholders, a file log is merged by time.

use std::fmt;
use std::path::Path;
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::Value;

use super::file_op::FileOp;
use super::format::{Body, ParseError, Record, parse_records};
use super::homes;
use super::placeholder::is_name;
use crate::trace::Dir;

/// Why a trace (and its file log) could not become a fixture.
#[derive(Debug)]
pub enum RecordError {
    /// A line of the trace is not a record.
    Trace(ParseError),
    /// A line of the file log (1-based) is not a record.
    FileLogNotARecord(usize, crate::json::Error),
    /// A line of the file log (1-based) has a `ts` that is no time.
    FileLogBadTs(usize, String, humantime::TimestampError),
    /// A file log can be merged only by the trace's absolute times, which it lacks (it is a fixture already).
    NeedsTraceTimes,
    /// A frame (record number) is no longer JSON after normalising.
    NotJsonAfterNormalising(usize),
    /// A file write (record number, normalised path) lies outside every placeholder's folder.
    OutsideFolders(usize, String),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Trace(e) => write!(f, "{e}"),
            RecordError::FileLogNotARecord(line, e) => write!(f, "file log line {line}: not a record: {e}"),
            RecordError::FileLogBadTs(line, ts, e) => write!(f, "file log line {line}: bad \"ts\" {ts:?}: {e}"),
            RecordError::NeedsTraceTimes => {
                write!(f, "merging a file log needs the trace's \"ts\" on every record (a raw --trace-file)")
            }
            RecordError::NotJsonAfterNormalising(i) => {
                write!(f, "record {i}: the frame is no longer JSON after normalising")
            }
            RecordError::OutsideFolders(i, path) => {
                write!(f, "record {i}: file path {path:?} is outside the placeholders' folders")
            }
        }
    }
}

impl std::error::Error for RecordError {}

/// Replaces machine-specific values by placeholders.
#[derive(Debug, Clone, Default)]
pub struct Normaliser {
    /// (literal, placeholder name), longest literal first.
    subs: Vec<(String, String)>,
}

/// Paths of this machine that must not be committed.
const FORBIDDEN: &[&str] = &["/tmp/", "/root/", "/home/", "/work/"];

impl Normaliser {
    /// The usual substitutions for a live run in `root` (HOME = root/home, cwd = root/work, TMPDIR = root/tmp).
    pub fn for_live_root(root: &Path) -> Normaliser {
        let mut n = Normaliser::default();
        let homes = homes::with_session_files();
        for variant in path_variants(root) {
            for home in &homes {
                n.add(&format!("{variant}/home/{}", home.default), home.var);
            }
            n.add(&format!("{variant}/home"), "HOME");
            n.add(&format!("{variant}/work"), "CWD");
            n.add(&url_encoded(&format!("{variant}/work")), "CWD_URL");
            n.add(&format!("{variant}/tmp"), "TMPDIR");
            n.add(&variant, "ROOT");
        }
        n
    }

    /// Adds a substitution (and its canonical spelling when it differs).
    pub fn add(&mut self, literal: &str, name: &str) {
        let literal = literal.trim_end_matches('/');
        if literal.is_empty() || !is_name(name) {
            return;
        }
        for variant in path_variants(Path::new(literal)) {
            if !self.subs.iter().any(|(l, _)| *l == variant) {
                self.subs.push((variant, name.to_owned()));
            }
        }
        self.subs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    /// Normalises one piece of text (a frame's JSON text, a line, file data).
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (literal, name) in &self.subs {
            if out.contains(literal.as_str()) {
                out = out.replace(literal.as_str(), &format!("{{{{{name}}}}}"));
            }
        }
        shim_pid(&out)
    }

    /// Names of this machine still present in `text`.
    pub fn leftovers(&self, text: &str) -> Vec<String> {
        let mut found: Vec<String> =
            FORBIDDEN.iter().filter(|p| names_path(text, p)).map(|p| (*p).to_owned()).collect();
        if let Ok(home) = std::env::var("HOME")
            && home.len() > 1
            && text.contains(&format!("{home}/"))
        {
            found.push(home);
        }
        found
    }
}

/// Whether `text` has `prefix` (`/tmp/`) where a path starts: not inside another path or word (Qwen's skills
/// name `.qwen/tmp/` of the project, which is no folder of the machine). After a JSON escape (`\n/tmp/…`) it
/// starts one.
fn names_path(text: &str, prefix: &str) -> bool {
    text.match_indices(prefix).any(|(at, _)| {
        let before = &text.as_bytes()[..at];
        let escaped = before.len() >= 2 && before[before.len() - 2] == b'\\';
        match before.last() {
            None => true,
            Some(_) if escaped => true,
            Some(c) => !(c.is_ascii_alphanumeric() || b"._-~".contains(c)),
        }
    })
}

fn path_variants(p: &Path) -> Vec<String> {
    let mut out = vec![p.to_string_lossy().trim_end_matches('/').to_owned()];
    if let Ok(canon) = std::fs::canonicalize(p) {
        let canon = canon.to_string_lossy().trim_end_matches('/').to_owned();
        if !out.contains(&canon) {
            out.push(canon);
        }
    }
    out
}

/// `path` URL-encoded as one name (every byte but ASCII letters, digits and `-._~` as `%XX`): how Grok Build names
/// the folder of a cwd's sessions (`$GROK_HOME/sessions/%2Fhome%2Fme%2Fapp/<session>/`), the `{{CWD_URL}}`
/// placeholder.
pub fn url_encoded(path: &str) -> String {
    const KEPT: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
    percent_encoding::utf8_percent_encode(path, KEPT).to_string()
}

/// `coda-shim-<pid>-` (the shim's own request ids) -> `coda-shim-{{SHIM_PID}}-`.
fn shim_pid(text: &str) -> String {
    const PREFIX: &str = "coda-shim-";
    if !text.contains(PREFIX) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(PREFIX) {
        let after = &rest[at + PREFIX.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at + PREFIX.len()]);
        if digits > 0 && after.as_bytes().get(digits) == Some(&b'-') {
            out.push_str("{{SHIM_PID}}");
            rest = &after[digits..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A line of a file log beside a trace (`--files`).
#[derive(Deserialize)]
struct FileLogLine {
    ts: String,
    /// `"open"`: state that existed before the agent frame whose handling read it (a session folder found
    /// when its `session/new` answer arrived); goes before the last `agent->shim` record at or before `ts`.
    #[serde(default)]
    at: Option<String>,
    #[serde(flatten)]
    op: FileOp,
}

/// Turns trace text (and an optional file log) into fixture records, normalised.
pub fn record(trace: &str, files: Option<&str>, n: &Normaliser) -> Result<Vec<Record>, RecordError> {
    // Absolute times: of the trace lines (parse_records makes them relative) and of the file log.
    let stamps: Vec<Option<SystemTime>> = trace
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            crate::json::from_str::<Value>(l)
                .ok()
                .and_then(|v| v.get("ts").and_then(Value::as_str).map(str::to_owned))
                .and_then(|ts| humantime::parse_rfc3339_weak(&ts).ok())
        })
        .collect();
    let trace_records = parse_records(trace).map_err(RecordError::Trace)?;
    let mut file_records: Vec<(SystemTime, bool, Record)> = Vec::new();
    for (i, line) in files.unwrap_or_default().lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: FileLogLine = crate::json::from_str(line).map_err(|e| RecordError::FileLogNotARecord(i + 1, e))?;
        let ts = humantime::parse_rfc3339_weak(&f.ts).map_err(|e| RecordError::FileLogBadTs(i + 1, f.ts.clone(), e))?;
        if homes::ignored(&f.op.path) {
            continue;
        }
        let r = Record { edge: Dir::AgentToFile, t: None, shim: false, body: Body::File(f.op), lineno: 0 };
        file_records.push((ts, f.at.as_deref() == Some("open"), r));
    }
    if stamps.len() != trace_records.len() || (!file_records.is_empty() && stamps.iter().any(Option::is_none)) {
        return Err(RecordError::NeedsTraceTimes);
    }
    // Stable: writes of the same instant keep the log's order.
    file_records.sort_by_key(|(ts, _, _)| *ts);
    // Trace records keep their order; a file write goes after every trace record with the same or an earlier
    // ts, an "open" one just before the last agent frame among those.
    let mut timed: Vec<(Option<SystemTime>, Record)> = Vec::new();
    let mut pending = file_records.into_iter().peekable();
    let place = |timed: &mut Vec<(Option<SystemTime>, Record)>, fts: SystemTime, open: bool, f: Record| {
        let at = open
            .then(|| timed.iter().rposition(|(ts, r)| r.edge == Dir::AgentToShim && ts.is_some_and(|t| t <= fts)))
            .flatten();
        match at {
            Some(i) => timed.insert(i, (Some(fts), f)),
            None => timed.push((Some(fts), f)),
        }
    };
    for (r, ts) in trace_records.into_iter().zip(stamps) {
        if let Some(ts) = ts {
            while let Some((fts, open, f)) = pending.next_if(|(fts, _, _)| *fts < ts) {
                place(&mut timed, fts, open, f);
            }
        }
        timed.push((ts, r));
    }
    for (fts, open, f) in pending {
        place(&mut timed, fts, open, f);
    }
    let start = timed.iter().filter_map(|x| x.0).min();
    let mut out: Vec<Record> = Vec::new();
    for (ts, mut r) in timed {
        if let (Some(ts), Some(start)) = (ts, start) {
            r.t = ts.duration_since(start).ok().map(|d| d.as_millis() as u64);
        }
        out.push(r);
    }
    for (i, r) in out.iter_mut().enumerate() {
        r.lineno = i + 1;
        r.body = match std::mem::replace(&mut r.body, Body::Line(String::new())) {
            Body::Frame(text) => {
                let norm = n.apply(&text);
                if crate::json::from_str::<Value>(&norm).is_err() {
                    return Err(RecordError::NotJsonAfterNormalising(i + 1));
                }
                Body::Frame(norm)
            }
            Body::Line(text) => Body::Line(n.apply(&text)),
            Body::File(mut op) => {
                op.path = n.apply(&op.path);
                op.to = op.to.map(|t| n.apply(&t));
                op.data = op.data.map(|d| n.apply(&d));
                if !op.path.starts_with("{{") {
                    return Err(RecordError::OutsideFolders(i + 1, op.path));
                }
                Body::File(op)
            }
        };
    }
    super::instants::placeholders(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::format::render;

    /// A data folder whose session files a shim reads (`@DEFAULT@` under HOME, placeholder `{{@VAR@}}`), and a
    /// part of path its CLI's file log leaves out (`@IGNORED@`).
    fn with_session_files(text: &str) -> String {
        let (home, files) = crate::adapters::all()
            .into_iter()
            .find_map(|a| a.session_files.filter(|_| a.data_home.owns_var()).map(|s| (a.data_home, s)))
            .expect("an adapter reads session files");
        let ignored = files.ignored.first().copied().unwrap_or(".tmp.");
        text.replace("@DEFAULT@", home.default).replace("@VAR@", home.var).replace("@IGNORED@", ignored)
    }

    #[test]
    fn normaliser_replaces_longest_paths_first_and_the_shim_pid() {
        let n = Normaliser::for_live_root(Path::new("/nonexistent-root/r1"));
        let text = r#"{"cwd":"/nonexistent-root/r1/work","h":"/nonexistent-root/r1/home/@DEFAULT@/sessions","t":"/nonexistent-root/r1/tmp/x","r":"/nonexistent-root/r1","id":"coda-shim-123-4","s":"coda-shim-x-1"}"#;
        assert_eq!(
            n.apply(&with_session_files(text)),
            with_session_files(
                r#"{"cwd":"{{CWD}}","h":"{{@VAR@}}/sessions","t":"{{TMPDIR}}/x","r":"{{ROOT}}","id":"coda-shim-{{SHIM_PID}}-4","s":"coda-shim-x-1"}"#
            )
        );
        // Grok's folder of the cwd's sessions: the cwd URL-encoded as one name.
        assert_eq!(
            n.apply(r#"{"p":"/nonexistent-root/r1/home/x/%2Fnonexistent-root%2Fr1%2Fwork/s/updates.jsonl"}"#),
            r#"{"p":"{{HOME}}/x/{{CWD_URL}}/s/updates.jsonl"}"#
        );
        assert_eq!(url_encoded("/Users/me/My App/项目-1.2_~x"), "%2FUsers%2Fme%2FMy%20App%2F%E9%A1%B9%E7%9B%AE-1.2_~x");
        assert_eq!(n.leftovers("see /tmp/foo and /work/x"), vec!["/tmp/".to_owned(), "/work/".to_owned()]);
        assert!(n.leftovers("{{CWD}}/a").is_empty());
        // A project's own `.qwen/tmp/` is no folder of the machine; a path after a JSON escape or a quote is.
        assert!(n.leftovers(r#"{"t":"under .qwen/tmp/s-1 and x_/tmp/y"}"#).is_empty());
        assert_eq!(n.leftovers(r#"{"t":"a\n/tmp/x"}"#), vec!["/tmp/".to_owned()]);
        assert_eq!(n.leftovers(r#"{"t":"/work/x"}"#), vec!["/work/".to_owned()]);
    }

    #[test]
    fn record_normalises_and_merges_the_file_log_by_time() {
        let n = Normaliser::for_live_root(Path::new("/nonexistent-root/r2"));
        let trace = concat!(
            r#"{"ts":"2026-01-01T00:00:00.000Z","dir":"agent->shim","frame":{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.010Z","dir":"agent->shim","frame":{"jsonrpc":"2.0","method":"u","params":{"cwd":"/nonexistent-root/r2/work"}}}"#,
            "\n",
        );
        let files = with_session_files(concat!(
            r#"{"ts":"2026-01-01T00:00:00.005Z","op":"append","path":"/nonexistent-root/r2/home/@DEFAULT@/sessions/w","data":"{\"cwd\":\"/nonexistent-root/r2/work\"}\n"}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.006Z","op":"write","path":"/nonexistent-root/r2/home/@DEFAULT@/sessions@IGNORED@s.1"}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.010Z","op":"replace","path":"/nonexistent-root/r2/home/@DEFAULT@/state.json","data":"{}"}"#,
        ));
        let out = record(trace, Some(&files), &n).unwrap();
        let edges: Vec<Dir> = out.iter().map(|r| r.edge).collect();
        assert_eq!(edges, vec![Dir::AgentToShim, Dir::AgentToFile, Dir::AgentToShim, Dir::AgentToFile]);
        assert_eq!(out.iter().map(|r| r.t).collect::<Vec<_>>(), vec![Some(0), Some(5), Some(10), Some(10)]);
        let Body::File(op) = &out[1].body else { panic!() };
        assert_eq!(op.path, with_session_files("{{@VAR@}}/sessions/w"));
        assert_eq!(op.data.as_deref(), Some("{\"cwd\":\"{{CWD}}\"}\n"));
        assert_eq!(out[2].body, Body::Frame(r#"{"jsonrpc":"2.0","method":"u","params":{"cwd":"{{CWD}}"}}"#.into()));
        // Rendered and parsed back, the records are the same.
        let again = parse_records(&render(&out)).unwrap();
        assert_eq!(again, out);
    }

    #[test]
    fn state_read_when_a_session_opened_goes_before_the_frame_that_opened_it() {
        let trace = concat!(
            r#"{"ts":"2026-01-01T00:00:00.000Z","dir":"agent->shim","frame":{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.000Z","dir":"shim->client","frame":{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}}"#,
            "\n",
        );
        let files = concat!(
            r#"{"ts":"2026-01-01T00:00:00.000400Z","at":"open","op":"append","path":"{{HOME}}/w","data":"h\n"}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.000500Z","op":"append","path":"{{HOME}}/w","data":"x\n"}"#,
        );
        let out = record(trace, Some(files), &Normaliser::default()).unwrap();
        let edges: Vec<Dir> = out.iter().map(|r| r.edge).collect();
        assert_eq!(edges, vec![Dir::AgentToFile, Dir::AgentToShim, Dir::ShimToClient, Dir::AgentToFile]);
        let fixture = concat!(r#"{"t":0,"dir":"agent->shim","line":"x"}"#, "\n");
        let err = record(fixture, Some(files), &Normaliser::default()).unwrap_err();
        assert!(matches!(err, RecordError::NeedsTraceTimes), "{err}");
        assert!(err.to_string().contains("needs the trace's"), "{err}");
    }
}

//! The record format of traces and fixtures: one record per line, parsed and rendered.
//!
//! `fixtures/README.md` describes the format; `src/trace.rs` writes the raw form (absolute `ts`), fixtures
//! hold the normalised form (relative `t`, placeholders).

use std::fmt;
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::file_op::FileOp;
use crate::trace::Dir;

/// What a record carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// The exact JSON text of a frame (placeholders included).
    Frame(String),
    /// A line that was not JSON-RPC.
    Line(String),
    File(FileOp),
}

/// One record of a fixture or trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Where it was seen (the record's `"dir"`).
    pub edge: Dir,
    /// Milliseconds since the first record, when known.
    pub t: Option<u64>,
    pub shim: bool,
    pub body: Body,
    /// 1-based line in the file it came from (0 when built in memory).
    pub lineno: usize,
}

impl Record {
    /// The record as one fixture line.
    pub fn to_line(&self) -> String {
        let mut out = String::from("{");
        if let Some(t) = self.t {
            out.push_str(&format!("\"t\":{t},"));
        }
        out.push_str(&format!("\"dir\":\"{}\"", self.edge.as_str()));
        if self.shim {
            out.push_str(",\"shim\":true");
        }
        match &self.body {
            Body::Frame(text) => {
                out.push_str(",\"frame\":");
                out.push_str(text);
            }
            Body::Line(text) => {
                out.push_str(",\"line\":");
                out.push_str(&Value::from(text.as_str()).to_string());
            }
            Body::File(op) => {
                out.push_str(",\"file\":");
                out.push_str(&serde_json::to_string(op).unwrap_or_default());
            }
        }
        out.push('}');
        out
    }
}

#[derive(Deserialize)]
struct RawRecord {
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    t: Option<u64>,
    dir: String,
    #[serde(default)]
    shim: bool,
    #[serde(default)]
    frame: Option<Box<RawValue>>,
    #[serde(default)]
    line: Option<String>,
    #[serde(default)]
    file: Option<FileOp>,
}

/// Why a line of a recording is not a record.
#[derive(Debug)]
pub struct ParseError {
    /// 1-based line of the text.
    pub lineno: usize,
    pub kind: ParseErrorKind,
}

/// What is wrong with a line (see [`ParseError`]).
#[derive(Debug)]
pub enum ParseErrorKind {
    NotARecord(crate::json::Error),
    UnknownDir(String),
    BadTs(String, humantime::TimestampError),
    DataAndBase64,
    NotOneBody,
    FileOutsideAgentToFile,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.lineno)?;
        match &self.kind {
            ParseErrorKind::NotARecord(e) => write!(f, "not a record: {e}"),
            ParseErrorKind::UnknownDir(dir) => write!(f, "unknown \"dir\" {dir:?}"),
            ParseErrorKind::BadTs(ts, e) => write!(f, "bad \"ts\" {ts:?}: {e}"),
            ParseErrorKind::DataAndBase64 => write!(f, "a file record has both \"data\" and \"base64\""),
            ParseErrorKind::NotOneBody => write!(f, "a record needs exactly one of \"frame\", \"line\", \"file\""),
            ParseErrorKind::FileOutsideAgentToFile => {
                write!(f, "\"file\" goes with \"dir\":\"agent->file\" and only there")
            }
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses records (fixture lines with `t`, or raw trace lines with `ts`). Empty lines are skipped.
pub fn parse_records(text: &str) -> Result<Vec<Record>, ParseError> {
    let mut out = Vec::new();
    let mut first_ts: Option<SystemTime> = None;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let fail = |kind| ParseError { lineno, kind };
        let raw: RawRecord = crate::json::from_str(line).map_err(|e| fail(ParseErrorKind::NotARecord(e)))?;
        let edge = Dir::parse(&raw.dir).ok_or_else(|| fail(ParseErrorKind::UnknownDir(raw.dir.clone())))?;
        let t = match (raw.t, raw.ts.as_deref()) {
            (Some(t), _) => Some(t),
            (None, Some(ts)) => {
                let at =
                    humantime::parse_rfc3339_weak(ts).map_err(|e| fail(ParseErrorKind::BadTs(ts.to_owned(), e)))?;
                let first = *first_ts.get_or_insert(at);
                Some(at.duration_since(first).map(|d| d.as_millis() as u64).unwrap_or(0))
            }
            (None, None) => None,
        };
        let body = match (raw.frame, raw.line, raw.file) {
            (Some(frame), None, None) => Body::Frame(frame.get().to_owned()),
            (None, Some(line), None) => Body::Line(line),
            (None, None, Some(file)) => {
                if (file.data.is_some() as u8 + file.base64.is_some() as u8) > 1 {
                    return Err(fail(ParseErrorKind::DataAndBase64));
                }
                Body::File(file)
            }
            _ => return Err(fail(ParseErrorKind::NotOneBody)),
        };
        if (edge == Dir::AgentToFile) != matches!(body, Body::File(_)) {
            return Err(fail(ParseErrorKind::FileOutsideAgentToFile));
        }
        out.push(Record { edge, t, shim: raw.shim, body, lineno });
    }
    Ok(out)
}

/// Renders records as fixture text.
pub fn render(records: &[Record]) -> String {
    let mut out = String::new();
    for r in records {
        out.push_str(&r.to_line());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::file_op::FileOpKind;

    #[test]
    fn parses_traces_and_fixtures_and_rejects_bad_records() {
        let trace = concat!(
            r#"{"ts":"2026-01-01T00:00:00.100Z","dir":"client->shim","frame":{"jsonrpc":"2.0","id":0,"method":"initialize"}}"#,
            "\n\n",
            r#"{"ts":"2026-01-01T00:00:00.350Z","dir":"agent->shim","line":"hello"}"#,
            "\n",
            r#"{"t":5,"dir":"agent->file","file":{"op":"append","path":"{{HOME}}/w","data":"x\n"}}"#,
        );
        let r = parse_records(trace).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].t, r[1].t, r[2].t), (Some(0), Some(250), Some(5)));
        assert_eq!(r[0].body, Body::Frame(r#"{"jsonrpc":"2.0","id":0,"method":"initialize"}"#.into()));
        assert_eq!(r[1].lineno, 3);
        assert!(matches!(&r[2].body, Body::File(f) if f.op == FileOpKind::Append));
        let err = parse_records(r#"{"dir":"sideways","line":"x"}"#).unwrap_err();
        assert!(matches!(&err.kind, ParseErrorKind::UnknownDir(d) if d == "sideways"), "{err}");
        assert!(err.to_string().contains("unknown \"dir\""), "{err}");
        let err = parse_records(r#"{"dir":"agent->shim"}"#).unwrap_err();
        assert!(matches!(err.kind, ParseErrorKind::NotOneBody), "{err}");
        assert!(err.to_string().contains("exactly one"), "{err}");
        assert!(parse_records(r#"{"dir":"agent->shim","file":{"op":"mkdir","path":"{{HOME}}"}}"#).is_err());
        assert!(parse_records("not json").is_err());
    }
}

//! Reading a trace for the viewer: one record per line, every line that cannot be shown kept aside with why.
//!
//! Accepts what `--trace-file` writes (`ts`, RFC 3339) and what a fixture holds (`t`, milliseconds). A line is
//! never fatal: invalid UTF-8 is replaced (and noted), a line that is not a record is listed as bad, a record
//! without a time takes the time of the one before it.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::json;

/// Where a record was seen (the recordings' own directions).
pub use crate::trace::Dir;

/// Frames Coda sent or received: the timeline is drawn from these.
pub fn client_side(dir: Dir) -> bool {
    matches!(dir, Dir::ClientToShim | Dir::ShimToClient)
}

/// One readable line of the trace.
#[derive(Debug)]
pub struct Record {
    /// 1-based line number in the trace.
    pub line: usize,
    /// Milliseconds since the first record.
    pub t: f64,
    pub dir: Dir,
    /// The shim made or edited this frame.
    pub shim: bool,
    /// The frame's text as recorded (or the non-JSON-RPC line, or the file operation).
    pub raw: String,
    /// The frame, when the record holds one that parses.
    pub frame: Option<Value>,
    /// The record holds a line that was not JSON-RPC (`"line"`).
    pub not_json: bool,
}

/// A line that is not shown as a frame, or shown altered.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BadLine {
    pub line: usize,
    pub reason: String,
    /// The first characters of the line.
    pub excerpt: String,
}

/// The trace as read.
#[derive(Debug, Default)]
pub struct Trace {
    pub records: Vec<Record>,
    pub bad: Vec<BadLine>,
    /// Wall-clock time of the first record in milliseconds since 1970 (a `--trace-file` trace), or `None` (a
    /// fixture's relative `t`).
    pub clock: Option<f64>,
}

#[derive(Deserialize)]
struct Raw {
    ts: Option<String>,
    t: Option<serde_json::Number>,
    dir: String,
    #[serde(default)]
    shim: bool,
    frame: Option<Box<RawValue>>,
    line: Option<String>,
    file: Option<Box<RawValue>>,
}

const EXCERPT_CHARS: usize = 160;

fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(EXCERPT_CHARS).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

impl Trace {
    fn note(&mut self, line: usize, reason: impl Into<String>, text: &str) {
        self.bad.push(BadLine { line, reason: reason.into(), excerpt: excerpt(text) });
    }
}

/// Reads a whole trace. Bytes that are not UTF-8 are replaced with U+FFFD and the line is noted.
pub fn read(bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let mut first: Option<f64> = None;
    let mut last_t = 0.0;
    let mut lines = bytes.split(|&b| b == b'\n').peekable();
    let mut lineno = 0;
    while let Some(line) = lines.next() {
        lineno += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let text = String::from_utf8_lossy(line);
        if matches!(text, std::borrow::Cow::Owned(_)) {
            trace.note(lineno, "not valid UTF-8: shown with U+FFFD in place of the bad bytes", &text);
        }
        let raw: Raw = match json::from_str(&text) {
            Ok(raw) => raw,
            Err(e) => {
                let cut = lines.peek().is_none() && !bytes.ends_with(b"\n");
                let reason = if cut {
                    format!("cut short (the trace ends inside it): {e}")
                } else {
                    format!("not a record: {e}")
                };
                trace.note(lineno, reason, &text);
                continue;
            }
        };
        let Some(dir) = Dir::parse(&raw.dir) else {
            trace.note(lineno, format!("unknown \"dir\" {:?}", raw.dir), &text);
            continue;
        };
        let at = match (raw.t.as_ref().and_then(serde_json::Number::as_f64), raw.ts.as_deref()) {
            (Some(t), _) => Some(t),
            (None, Some(ts)) => match humantime::parse_rfc3339_weak(ts) {
                Ok(at) => {
                    let ms = at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0);
                    trace.clock.get_or_insert(ms);
                    Some(ms)
                }
                Err(e) => {
                    trace.note(lineno, format!("bad \"ts\" ({e}): shown at the time of the record before"), &text);
                    None
                }
            },
            (None, None) => None,
        };
        let t = match at {
            Some(at) => {
                let base = *first.get_or_insert(at);
                (at - base).max(0.0)
            }
            None => last_t,
        };
        last_t = t;
        let (raw_text, frame, not_json) = match (raw.frame, raw.line, raw.file) {
            (Some(frame), _, _) => {
                let value = match json::from_str::<Value>(frame.get()) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        trace.note(lineno, format!("frame not readable: {e}"), &text);
                        None
                    }
                };
                (frame.get().to_owned(), value, false)
            }
            (None, Some(line), _) => (line, None, true),
            (None, None, Some(file)) => (file.get().to_owned(), None, false),
            (None, None, None) => {
                trace.note(lineno, "a record with neither \"frame\", \"line\" nor \"file\"", &text);
                continue;
            }
        };
        trace.records.push(Record { line: lineno, t, dir, shim: raw.shim, raw: raw_text, frame, not_json });
    }
    trace
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_listed_and_the_rest_is_read() {
        let mut text = Vec::new();
        text.extend_from_slice(
            b"{\"t\":0,\"dir\":\"client->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}}\n",
        );
        text.extend_from_slice(b"garbage\n\n");
        text.extend_from_slice(b"{\"t\":5,\"dir\":\"shim->client\",\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{\"a\":\"\xff\"}}}\n");
        text.extend_from_slice(b"{\"t\":7,\"dir\":\"sideways\",\"frame\":{}}\n");
        text.extend_from_slice(b"{\"t\":9,\"dir\":\"shim->client\",\"frame\":{\"jsonrpc\":\"2.0\",\"id\":1,\"res");
        let trace = read(&text);
        assert_eq!(trace.records.len(), 2);
        assert_eq!(trace.records[1].t, 5.0);
        assert!(trace.records[1].raw.contains('\u{fffd}'));
        let bad: Vec<(usize, &str)> = trace.bad.iter().map(|b| (b.line, b.reason.as_str())).collect();
        assert_eq!(bad.len(), 4, "{bad:?}");
        assert_eq!(bad[0].0, 2);
        assert!(bad[0].1.starts_with("not a record"));
        assert_eq!(bad[1].0, 4);
        assert!(bad[1].1.starts_with("not valid UTF-8"));
        assert_eq!(bad[2].0, 5);
        assert!(bad[2].1.contains("sideways"));
        assert_eq!(bad[3].0, 6);
        assert!(bad[3].1.starts_with("cut short"), "{}", bad[3].1);
    }

    #[test]
    fn wall_clock_times_are_relative_to_the_first_record() {
        let text = concat!(
            r#"{"ts":"2026-12-01T11:37:16.000000Z","dir":"client->shim","frame":{"jsonrpc":"2.0","id":1,"method":"a"}}"#,
            "\n",
            r#"{"ts":"2026-12-01T11:37:17.250000Z","dir":"shim->client","frame":{"jsonrpc":"2.0","id":1,"result":1e400}}"#,
            "\n",
            r#"{"ts":"yesterday","dir":"shim->client","frame":{"jsonrpc":"2.0","method":"b"}}"#,
            "\n"
        );
        let trace = read(text.as_bytes());
        assert_eq!(trace.records.iter().map(|r| r.t).collect::<Vec<_>>(), vec![0.0, 1250.0, 1250.0]);
        assert!(trace.clock.is_some());
        assert_eq!(trace.records[1].raw, r#"{"jsonrpc":"2.0","id":1,"result":1e400}"#);
        assert_eq!(trace.bad.len(), 1);
    }
}

//! Reading a trace for the viewer: one record per line, every line that cannot be shown kept aside with why.
//!
//! Accepts what `--trace-file` writes (`ts`, RFC 3339) and what a fixture holds (`t`, milliseconds). A line is
//! never fatal: invalid UTF-8 is replaced (and noted), a line that is not a record is listed as bad, a record
//! without a time takes the time of the one before it. [`Reader`] reads one line at a time from any
//! `BufRead`, so a trace of any length is never held whole; a line longer than [`MAX_LINE`] is skipped (read
//! through in pieces, never buffered) and listed.

use std::io::BufRead;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::json;

/// Where a record was seen (the recordings' own directions).
pub use crate::trace::Dir;

/// Longest line read as a record: far above any frame the shims pass on, small enough to keep in memory.
pub const MAX_LINE: usize = 64 * 1024 * 1024;

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

/// Reads the next line of `input` into `buf` (without its newline): `Ok(None)` at the end, `Ok(Some(false))`
/// for a line over [`MAX_LINE`] (read through; `buf` holds its first bytes), `Ok(Some(true))` otherwise. `cut`
/// is set for a last line without its newline.
pub fn next_line(input: &mut impl BufRead, buf: &mut Vec<u8>, cut: &mut bool) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut over = false;
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            if buf.is_empty() && !over {
                return Ok(None);
            }
            *cut = true;
            return Ok(Some(!over));
        }
        let (take, done) = match memchr::memchr(b'\n', chunk) {
            Some(at) => (at, true),
            None => (chunk.len(), false),
        };
        if !over {
            if buf.len() + take > MAX_LINE {
                // Kept: its first bytes, for the excerpt; the memory of the rest is given back.
                over = true;
                buf.truncate(EXCERPT_CHARS * 4);
                buf.shrink_to_fit();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        input.consume(take + usize::from(done));
        if done {
            return Ok(Some(!over));
        }
    }
}

/// What the next line of a trace is.
#[derive(Debug)]
pub enum Line {
    Record(Record),
    Bad(BadLine),
}

/// Reads a trace one line at a time.
pub struct Reader<R> {
    input: R,
    buf: Vec<u8>,
    lineno: usize,
    first: Option<f64>,
    last_t: f64,
    /// See [`Trace::clock`].
    pub clock: Option<f64>,
    /// Bad lines met on a line that still gave a record (bad UTF-8, a bad time), returned before it.
    pending: Vec<BadLine>,
    held: Option<Record>,
    failed: bool,
}

impl<R: BufRead> Reader<R> {
    pub fn new(input: R) -> Reader<R> {
        Reader {
            input,
            buf: Vec::new(),
            lineno: 0,
            first: None,
            last_t: 0.0,
            clock: None,
            pending: Vec::new(),
            held: None,
            failed: false,
        }
    }

    fn bad(&self, reason: impl Into<String>, text: &str) -> BadLine {
        BadLine { line: self.lineno, reason: reason.into(), excerpt: excerpt(text) }
    }

    fn next_line(&mut self, cut: &mut bool) -> std::io::Result<Option<bool>> {
        next_line(&mut self.input, &mut self.buf, cut)
    }

    /// The next record or bad line; `None` at the end of the trace (or after a read error, listed as bad).
    pub fn next_line_item(&mut self) -> Option<Line> {
        loop {
            if !self.pending.is_empty() {
                return Some(Line::Bad(self.pending.remove(0)));
            }
            if let Some(rec) = self.held.take() {
                return Some(Line::Record(rec));
            }
            if self.failed {
                return None;
            }
            let mut cut = false;
            let whole = match self.next_line(&mut cut) {
                Ok(None) => return None,
                Ok(Some(whole)) => whole,
                Err(e) => {
                    self.failed = true;
                    self.lineno += 1;
                    return Some(Line::Bad(self.bad(format!("the trace could not be read on: {e}"), "")));
                }
            };
            self.lineno += 1;
            if !whole {
                let text = String::from_utf8_lossy(&self.buf).into_owned();
                return Some(Line::Bad(self.bad(format!("longer than {} MiB: left out", MAX_LINE >> 20), &text)));
            }
            let line = self.buf.strip_suffix(b"\r").unwrap_or(&self.buf);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let text = String::from_utf8_lossy(line).into_owned();
            if text.len() != line.len() || std::str::from_utf8(line).is_err() {
                let b = self.bad("not valid UTF-8: shown with U+FFFD in place of the bad bytes", &text);
                self.pending.push(b);
            }
            match self.parse(&text, cut) {
                Ok(rec) => self.held = Some(rec),
                Err(b) => self.pending.push(b),
            }
        }
    }

    fn parse(&mut self, text: &str, cut: bool) -> Result<Record, BadLine> {
        let raw: Raw = match json::from_str(text) {
            Ok(raw) => raw,
            Err(e) => {
                let reason = if cut {
                    format!("cut short (the trace ends inside it): {e}")
                } else {
                    format!("not a record: {e}")
                };
                return Err(self.bad(reason, text));
            }
        };
        let Some(dir) = Dir::parse(&raw.dir) else {
            return Err(self.bad(format!("unknown \"dir\" {:?}", raw.dir), text));
        };
        let at = match (raw.t.as_ref().and_then(serde_json::Number::as_f64), raw.ts.as_deref()) {
            (Some(t), _) => Some(t),
            (None, Some(ts)) => match humantime::parse_rfc3339_weak(ts) {
                Ok(at) => {
                    let ms = at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0);
                    self.clock.get_or_insert(ms);
                    Some(ms)
                }
                Err(e) => {
                    let b = self.bad(format!("bad \"ts\" ({e}): shown at the time of the record before"), text);
                    self.pending.push(b);
                    None
                }
            },
            (None, None) => None,
        };
        let t = match at {
            Some(at) => {
                let base = *self.first.get_or_insert(at);
                (at - base).max(0.0)
            }
            None => self.last_t,
        };
        self.last_t = t;
        let (raw_text, frame, not_json) = match (raw.frame, raw.line, raw.file) {
            (Some(frame), _, _) => {
                let value = match json::from_str::<Value>(frame.get()) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        self.pending.push(self.bad(format!("frame not readable: {e}"), text));
                        None
                    }
                };
                (frame.get().to_owned(), value, false)
            }
            (None, Some(line), _) => (line, None, true),
            (None, None, Some(file)) => (file.get().to_owned(), None, false),
            (None, None, None) => {
                return Err(self.bad("a record with neither \"frame\", \"line\" nor \"file\"", text));
            }
        };
        Ok(Record { line: self.lineno, t, dir, shim: raw.shim, raw: raw_text, frame, not_json })
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Line;
    fn next(&mut self) -> Option<Line> {
        self.next_line_item()
    }
}

/// Reads a whole trace. Bytes that are not UTF-8 are replaced with U+FFFD and the line is noted.
pub fn read(bytes: &[u8]) -> Trace {
    let mut reader = Reader::new(bytes);
    let mut trace = Trace::default();
    for line in reader.by_ref() {
        match line {
            Line::Record(r) => trace.records.push(r),
            Line::Bad(b) => trace.bad.push(b),
        }
    }
    trace.clock = reader.clock;
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
    fn an_endless_line_is_read_through_and_listed_not_kept() {
        use std::io::Read;
        let endless = std::io::repeat(b'x').take(MAX_LINE as u64 + 10);
        let rest: &[u8] = b"\n{\"t\":1,\"dir\":\"client->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"m\"}}\n";
        let mut reader = Reader::new(std::io::BufReader::new(endless.chain(rest)));
        let Some(Line::Bad(b)) = reader.next() else { panic!("the long line is listed") };
        assert_eq!(b.line, 1);
        assert!(b.reason.starts_with("longer than 64 MiB"), "{}", b.reason);
        assert!(reader.buf.capacity() < 1 << 20, "not held: {}", reader.buf.capacity());
        let Some(Line::Record(r)) = reader.next() else { panic!("the next line is read") };
        assert_eq!((r.line, r.t), (2, 0.0));
        assert!(reader.next().is_none());
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

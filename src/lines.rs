//! Newline-delimited frames on a byte stream, with a size limit that keeps memory bounded.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Frames handed to a writer in one go (one channel message, one wake-up).
pub type Batch = Vec<Vec<u8>>;

/// Default limit for one line: 64 MiB.
pub const DEFAULT_MAX_LINE: usize = 64 << 20;

impl Line {
    /// Bytes held.
    pub fn len(&self) -> usize {
        match self {
            Line::Text(b) => b.len(),
            Line::TooLong { head, .. } => head.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// One line without its `\n` (and without a trailing `\r`).
    Text(Vec<u8>),
    /// A line longer than the limit: its first bytes are kept for the error report, the rest skipped.
    TooLong { head: Vec<u8>, len: usize },
}

/// How many bytes of an over-long line are kept to find its id.
const HEAD: usize = 4096;

/// Splits a byte stream into lines, sans I/O: feed it what the reader has, take lines out.
pub struct Splitter {
    max: usize,
    buf: Vec<u8>,
    /// Length of the current line so far (may exceed what `buf` keeps).
    len: usize,
    last: Option<u8>,
}

impl Splitter {
    pub fn new(max: usize) -> Splitter {
        Splitter { max, buf: Vec::new(), len: 0, last: None }
    }

    /// Takes bytes from `avail`; returns how many it used, and the line they completed, if any.
    /// Empty lines are skipped: `(n, None)` with `n > 0` means "keep feeding".
    pub fn feed(&mut self, avail: &[u8]) -> (usize, Option<Line>) {
        let (chunk, done) = match memchr::memchr(b'\n', avail) {
            Some(i) => (&avail[..i], true),
            None => (avail, false),
        };
        self.len += chunk.len();
        self.last = chunk.last().copied().or(self.last);
        let room = if self.len <= self.max { self.max } else { HEAD };
        if self.buf.len() < room {
            let take = chunk.len().min(room - self.buf.len());
            self.buf.extend_from_slice(&chunk[..take]);
        }
        let used = chunk.len() + usize::from(done);
        (used, if done { self.take() } else { None })
    }

    /// End of stream: the last line, if it had no newline.
    pub fn finish(&mut self) -> Option<Line> {
        self.take()
    }

    fn take(&mut self) -> Option<Line> {
        let mut len = std::mem::take(&mut self.len);
        let mut buf = std::mem::take(&mut self.buf);
        if std::mem::take(&mut self.last) == Some(b'\r') {
            len -= 1;
            buf.truncate(len);
        }
        if len > self.max {
            buf.truncate(HEAD);
            return Some(Line::TooLong { head: buf, len });
        }
        // Empty lines between frames are tolerated.
        (!buf.iter().all(u8::is_ascii_whitespace)).then_some(Line::Text(buf))
    }
}

/// Reads the next non-empty line. `None` at end of stream; a last line without `\n` still counts.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, split: &mut Splitter) -> std::io::Result<Option<Line>> {
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(split.finish());
        }
        let (used, line) = split.feed(avail);
        r.consume(used);
        if line.is_some() {
            return Ok(line);
        }
    }
}

/// Whether `buffered` (what a reader holds) already contains the end of a line, so the next read
/// returns without waiting.
pub fn has_line(buffered: &[u8]) -> bool {
    memchr::memchr(b'\n', buffered).is_some()
}

/// [`read_line`] for a blocking reader (the shim's own stdin, read on a thread of its own).
pub fn read_line_blocking<R: std::io::BufRead>(r: &mut R, split: &mut Splitter) -> std::io::Result<Option<Line>> {
    loop {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Ok(split.finish());
        }
        let (used, line) = split.feed(avail);
        r.consume(used);
        if line.is_some() {
            return Ok(line);
        }
    }
}

/// Writes each frame followed by `\n`, flushing whenever no further frame is waiting. Ends when the
/// channel closes (after flushing) or the peer stops reading (a write error).
pub async fn write_frames<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<Batch>) -> std::io::Result<()> {
    let mut out = tokio::io::BufWriter::with_capacity(64 * 1024, &mut w);
    while let Some(mut batch) = rx.recv().await {
        loop {
            for frame in &batch {
                out.write_all(frame).await?;
                out.write_all(b"\n").await?;
            }
            match rx.try_recv() {
                Ok(next) => batch = next,
                Err(_) => break,
            }
        }
        out.flush().await?;
    }
    out.flush().await?;
    drop(out);
    w.shutdown().await
}

/// [`write_frames`] for a blocking writer (the shim's own stdout, written on a thread of its own).
pub fn write_frames_blocking<W: std::io::Write>(w: W, mut rx: mpsc::Receiver<Batch>) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, w);
    while let Some(mut batch) = rx.blocking_recv() {
        loop {
            for frame in &batch {
                out.write_all(frame)?;
                out.write_all(b"\n")?;
            }
            match rx.try_recv() {
                Ok(next) => batch = next,
                Err(_) => break,
            }
        }
        out.flush()?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        // A tiny buffer makes lines straddle reads.
        let mut r = tokio::io::BufReader::with_capacity(3, input);
        let mut split = Splitter::new(max);
        let mut out = Vec::new();
        while let Some(l) = read_line(&mut r, &mut split).await.unwrap() {
            out.push(l);
        }
        let mut blocking = Vec::new();
        let mut r = std::io::BufReader::with_capacity(2, input);
        while let Some(l) = read_line_blocking(&mut r, &mut split).unwrap() {
            blocking.push(l);
        }
        assert_eq!(out, blocking);
        out
    }

    fn text(s: &str) -> Line {
        Line::Text(s.as_bytes().to_vec())
    }

    #[tokio::test]
    async fn splits_lines_and_tolerates_crlf_and_blank_lines() {
        assert_eq!(lines(b"ab\r\n\n\r\ncd\n  \nef", 100).await, vec![text("ab"), text("cd"), text("ef")]);
        assert_eq!(lines(b"", 100).await, vec![]);
        assert_eq!(lines(b"\n\n", 100).await, vec![]);
    }

    #[tokio::test]
    async fn over_long_lines_are_reported_and_skipped() {
        let input = b"0123456789\nok\n";
        assert_eq!(lines(input, 5).await, vec![Line::TooLong { head: b"0123456789".to_vec(), len: 10 }, text("ok")]);
        assert_eq!(lines(b"12345\n", 5).await, vec![text("12345")]);
        assert_eq!(lines(b"12345\r\n", 5).await, vec![text("12345")]);
    }

    #[tokio::test]
    async fn writer_terminates_each_frame() {
        let (tx, rx) = mpsc::channel(4);
        let mut sink = Vec::new();
        tx.send(vec![b"a".to_vec()]).await.unwrap();
        tx.send(vec![b"b".to_vec(), b"c".to_vec()]).await.unwrap();
        drop(tx);
        write_frames(&mut sink, rx).await.unwrap();
        assert_eq!(sink, b"a\nb\nc\n");
    }
}

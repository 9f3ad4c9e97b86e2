//! The line splitter: cuts newline-delimited frames out of a byte stream, within a size limit.
//!
//! Lines are cut out of the buffer they were read into, without copying: a line is a [`Bytes`] view of
//! that buffer, ending in its `\n`, and is written out from there (by `crate::transport`).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Default limit for one line: 64 MiB.
pub const DEFAULT_MAX_LINE: usize = 64 << 20;

/// How many bytes of an over-long line are kept to find its id.
const HEAD: usize = 4096;

/// Bytes asked of the kernel per read: a sixteenth of the agent's pipe (see `child`), a quarter of a buffer.
const READ: usize = 64 << 10;

/// The same for a blocking read, whose buffer is zeroed first: a default pipe's worth.
const READ_BLOCKING: usize = 64 << 10;

/// Size of a read buffer: four reads go into one before the next is taken. A buffer is free again only once
/// every line cut from it has been written, so the memory a stream of small frames keeps is about what is in
/// flight rounded up to whole buffers: the smaller they are, the less is kept beyond it.
const BUF: usize = 256 << 10;

/// Read buffers kept for reuse once every line cut from them has been written: 6 MiB, room for what a flood
/// of large frames has in flight between the reader, the relay loop and the writer (a buffer not kept is
/// freed, and a new one costs its page faults again).
const POOL: usize = 24;

/// What the reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// One line, ending in `\n` (a `\r` before it, or a missing one at the end of the stream, is mended).
    Text(Bytes),
    /// A line longer than the limit: its first bytes are kept for the error report, the rest skipped.
    TooLong { head: Vec<u8>, len: usize },
}

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

/// An over-long line being skipped.
struct Skip {
    head: Vec<u8>,
    len: usize,
    last: u8,
}

/// Splits a byte stream into lines, sans I/O: read into it (or [`Lines::push`]), take lines out.
/// Blank lines are skipped; `\r\n` counts as `\n`.
pub struct Lines {
    max: usize,
    buf: BytesMut,
    /// Earlier buffers, whose lines may still be on their way out. Reusing them, instead of taking fresh
    /// memory for every read, spares the page faults that otherwise cost more than the reads.
    spare: Vec<BytesMut>,
    /// Size of `buf`'s allocation: only buffers of the usual size are kept, not one grown for a huge line.
    size: usize,
    /// How much of `buf` is known to hold no `\n`, so a long line is searched once.
    scanned: usize,
    skip: Option<Skip>,
}

impl Lines {
    pub fn new(max: usize) -> Lines {
        Lines { max, buf: BytesMut::new(), spare: Vec::new(), size: 0, scanned: 0, skip: None }
    }

    /// Adds bytes read elsewhere (tests, fuzzing).
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Reads once from `r`; 0 at the end of the stream.
    pub async fn fill<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> std::io::Result<usize> {
        self.make_room(READ);
        r.read_buf(&mut self.buf).await
    }

    /// Makes room for one read after what `buf` holds (the start of a line): in `buf` itself, in a spare
    /// buffer none of whose lines is still out, or in a new one.
    fn make_room(&mut self, read: usize) {
        if self.buf.capacity() - self.buf.len() >= read || self.buf.try_reclaim(read) {
            return;
        }
        let need = self.buf.len() + read;
        // A long line doubles its buffer (up to what the limit lets a line reach), so it is copied a few
        // times in all, not once per read: grown to the exact size, a 60 MB line cost seconds.
        let grown = need.max(BUF).max((2 * self.buf.len()).min(self.max.saturating_add(2 + read)));
        let (mut next, size) = match self.spare.iter_mut().position(|b| b.try_reclaim(need)) {
            Some(i) => (self.spare.swap_remove(i), BUF),
            None => (BytesMut::with_capacity(grown), grown),
        };
        next.extend_from_slice(&self.buf);
        let mut old = std::mem::replace(&mut self.buf, next);
        old.clear();
        let old_size = std::mem::replace(&mut self.size, size);
        if old_size == BUF && self.spare.len() < POOL {
            self.spare.push(old);
        }
    }

    /// [`Lines::fill`] for a blocking reader (the shim's own stdin, read on a thread of its own).
    pub fn fill_blocking<R: std::io::Read>(&mut self, r: &mut R) -> std::io::Result<usize> {
        self.make_room(READ_BLOCKING);
        let len = self.buf.len();
        // A safe read needs initialised memory: zeroing a pipe's worth costs far less than the read.
        self.buf.resize(len + READ_BLOCKING, 0);
        let read = loop {
            match r.read(&mut self.buf[len..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        self.buf.truncate(len + *read.as_ref().unwrap_or(&0));
        read
    }

    /// The next whole line already read, if any.
    pub fn next_line(&mut self) -> Option<Line> {
        loop {
            if let Some(skip) = &mut self.skip {
                let Some(at) = memchr::memchr(b'\n', &self.buf) else {
                    skip.len += self.buf.len();
                    skip.last = self.buf.last().copied().unwrap_or(skip.last);
                    self.buf.clear();
                    return None;
                };
                skip.len += at;
                skip.last = if at > 0 { self.buf[at - 1] } else { skip.last };
                self.buf.advance(at + 1);
                let Skip { head, len, last } = self.skip.take()?;
                return Some(Line::TooLong { head, len: len - usize::from(last == b'\r') });
            }
            let Some(at) = memchr::memchr(b'\n', &self.buf[self.scanned..]).map(|i| self.scanned + i) else {
                self.scanned = self.buf.len();
                // One byte over for a `\r` that may still come off.
                if self.buf.len() > self.max + 1 {
                    let head = self.buf[..HEAD.min(self.buf.len())].to_vec();
                    let last = self.buf.last().copied().unwrap_or_default();
                    self.skip = Some(Skip { head, len: self.buf.len(), last });
                    if self.size == BUF {
                        self.buf.clear();
                    } else {
                        // Freed, not cleared: the memory the line grew goes back at once.
                        (self.buf, self.size) = (BytesMut::new(), 0);
                    }
                    self.scanned = 0;
                }
                return None;
            };
            self.scanned = 0;
            let mut line = self.buf.split_to(at + 1);
            if at > 0 && line[at - 1] == b'\r' {
                line[at - 1] = b'\n';
                line.truncate(at);
            }
            let len = line.len() - 1;
            if len > self.max {
                return Some(Line::TooLong { head: line[..HEAD.min(len)].to_vec(), len });
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Some(Line::Text(line.freeze()));
            }
        }
    }

    /// Bytes held now, and the room of the buffer holding them (tests of what a splitter keeps).
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        (self.buf.len(), self.buf.capacity())
    }

    /// End of stream: the last line, if it had no newline.
    pub fn finish(&mut self) -> Option<Line> {
        if let Some(Skip { head, len, last }) = self.skip.take() {
            let len = len + self.buf.len();
            let last = self.buf.last().copied().unwrap_or(last);
            self.buf.clear();
            return Some(Line::TooLong { head, len: len - usize::from(last == b'\r') });
        }
        if self.buf.is_empty() {
            return None;
        }
        self.buf.put_u8(b'\n');
        self.next_line()
    }
}

/// Reads the next non-empty line. `None` at end of stream; a last line without `\n` still counts.
pub async fn read_line<R: AsyncRead + Unpin>(r: &mut R, lines: &mut Lines) -> std::io::Result<Option<Line>> {
    loop {
        if let Some(line) = lines.next_line() {
            return Ok(Some(line));
        }
        if lines.fill(r).await? == 0 {
            return Ok(lines.finish());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Hands out at most `step` bytes per read, so lines straddle reads.
    struct Trickle<'a> {
        input: &'a [u8],
        step: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.input.len());
            buf[..n].copy_from_slice(&self.input[..n]);
            self.input = &self.input[n..];
            Ok(n)
        }
    }

    impl AsyncRead for Trickle<'_> {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let this = self.get_mut();
            let n = this.step.min(buf.remaining()).min(this.input.len());
            buf.put_slice(&this.input[..n]);
            this.input = &this.input[n..];
            Poll::Ready(Ok(()))
        }
    }

    /// The lines of `input`, the same whether read in steps of 1, 2, 3 or 7 bytes, async or blocking.
    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut all = Vec::new();
        for step in [1, 2, 3, 7, usize::MAX] {
            let mut r = Trickle { input, step };
            let mut split = Lines::new(max);
            let mut out = Vec::new();
            while let Some(l) = read_line(&mut r, &mut split).await.unwrap() {
                out.push(l);
            }
            let mut r = Trickle { input, step };
            let mut split = Lines::new(max);
            let mut blocking = Vec::new();
            loop {
                if let Some(l) = split.next_line() {
                    blocking.push(l);
                } else if split.fill_blocking(&mut r).unwrap() == 0 {
                    blocking.extend(split.finish());
                    break;
                }
            }
            all.push(out);
            all.push(blocking);
        }
        // Over-long lines keep a head whose length depends on the reads: compare lengths, check prefixes.
        let shape = |ls: &Vec<Line>| -> Vec<(Option<Bytes>, usize)> {
            ls.iter()
                .map(|l| match l {
                    Line::Text(b) => (Some(b.clone()), b.len()),
                    Line::TooLong { head, len } => {
                        assert!(input.windows(head.len()).any(|w| w == &head[..]) && head.len() <= HEAD);
                        (None, *len)
                    }
                })
                .collect()
        };
        for other in &all[1..] {
            assert_eq!(shape(&all[0]), shape(other));
        }
        all.swap_remove(0)
    }

    fn text(s: &str) -> Line {
        Line::Text(Bytes::from(format!("{s}\n")))
    }

    fn too_long(ls: &[Line]) -> Vec<usize> {
        ls.iter().filter_map(|l| if let Line::TooLong { len, .. } = l { Some(*len) } else { None }).collect()
    }

    #[tokio::test]
    async fn splits_lines_and_tolerates_crlf_and_blank_lines() {
        assert_eq!(lines(b"ab\r\n\n\r\ncd\n  \nef", 100).await, vec![text("ab"), text("cd"), text("ef")]);
        assert_eq!(lines(b"a\rb\r\r\n", 100).await, vec![text("a\rb\r")]);
        assert_eq!(lines(b"", 100).await, vec![]);
        assert_eq!(lines(b"\n\n", 100).await, vec![]);
        assert_eq!(lines(b"\r", 100).await, vec![]);
    }

    #[tokio::test]
    async fn over_long_lines_are_reported_and_skipped() {
        let got = lines(b"0123456789\nok\n", 5).await;
        assert_eq!((too_long(&got), &got[1]), (vec![10], &text("ok")));
        assert_eq!(lines(b"12345\n", 5).await, vec![text("12345")]);
        assert_eq!(lines(b"12345\r\n", 5).await, vec![text("12345")]);
        let got = lines(b"123456\r\nok", 5).await;
        assert_eq!((too_long(&got), &got[1]), (vec![6], &text("ok")));
        assert_eq!(too_long(&lines(b"12345678", 5).await), vec![8]);
        assert_eq!(too_long(&lines(b"12345678\r", 5).await), vec![8]);
    }

    #[test]
    fn memory_stays_bounded_while_skipping() {
        let mut split = Lines::new(10);
        for _ in 0..1000 {
            split.push(&[b'x'; 100]);
            assert_eq!(split.next_line(), None);
            assert!(split.buf.len() <= 100);
        }
        split.push(b"\n{}\n");
        assert_eq!(split.next_line(), Some(Line::TooLong { head: vec![b'x'; 100], len: 100_000 }));
        assert_eq!(split.next_line(), Some(text("{}")));
    }

    #[test]
    fn a_long_line_grows_its_buffer_geometrically() {
        // 32 MiB in a pipe's reads: the buffer is replaced a few times (doubling), not once per read.
        let line = [vec![b'x'; 32 << 20], b"\n".to_vec()].concat();
        let mut input = &line[..];
        let mut split = Lines::new(DEFAULT_MAX_LINE);
        let (mut reads, mut grown, mut capacity) = (0, 0, 0);
        let mut got = None;
        while got.is_none() && split.fill_blocking(&mut input).expect("read") > 0 {
            reads += 1;
            if split.buf.capacity() != capacity {
                (grown, capacity) = (grown + 1, split.buf.capacity());
            }
            got = split.next_line();
        }
        assert!(matches!(got, Some(Line::Text(b)) if b.len() == line.len()));
        assert!(reads > 500, "read in pipe-sized pieces ({reads} reads)");
        assert!(grown <= 10, "the buffer was replaced {grown} times in {reads} reads");
        // Never more than the limit lets a line reach (and one read), however it doubles.
        let mut split = Lines::new(BUF * 3);
        let long = vec![b'x'; BUF * 3];
        let mut input = &long[..];
        while split.fill_blocking(&mut input).expect("read") > 0 {
            assert!(split.buf.capacity() <= BUF * 3 + 2 + READ_BLOCKING + READ, "{}", split.buf.capacity());
            assert_eq!(split.next_line(), None);
        }
    }

    #[test]
    fn a_buffer_grown_for_a_huge_line_is_not_kept_for_reuse() {
        let frame = |n: usize| [vec![b'x'; n], b"\n".to_vec()].concat();
        let read_all = |split: &mut Lines, input: Vec<u8>| {
            let mut input = &input[..];
            let mut out = Vec::new();
            while split.fill_blocking(&mut input).expect("read") > 0 {
                out.extend(std::iter::from_fn(|| split.next_line()));
            }
            out
        };
        let mut split = Lines::new(DEFAULT_MAX_LINE);
        let small = read_all(&mut split, frame(100).repeat(20_000));
        assert_eq!(small.len(), 20_000);
        assert!(small.iter().all(|l| matches!(l, Line::Text(b) if b.len() == 101)));
        let huge = read_all(&mut split, frame(3 * BUF));
        assert!(matches!(&huge[..], [Line::Text(b)] if b.len() == 3 * BUF + 1));
        assert_eq!(read_all(&mut split, frame(100).repeat(20_000)).len(), 20_000);
        drop((small, huge));
        // Every line is written (dropped): each kept buffer is whole again, and none is the huge one.
        assert!(!split.spare.is_empty() && split.spare.len() <= POOL);
        for b in &mut split.spare {
            assert!(b.try_reclaim(1), "nothing else holds a kept buffer now");
            assert!(b.capacity() <= BUF, "kept a buffer of {} bytes", b.capacity());
        }
    }
}

//! Newline-delimited frames on a byte stream, with a size limit that keeps memory bounded.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Default limit for one line: 64 MiB.
pub const DEFAULT_MAX_LINE: usize = 64 << 20;

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

/// Reads the next non-empty line. `None` at end of stream; a last line without `\n` still counts.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Option<Line>> {
    let mut buf = Vec::new();
    let mut len = 0usize;
    let mut last = None;
    loop {
        let (done, used) = {
            let avail = r.fill_buf().await?;
            if avail.is_empty() {
                (true, 0)
            } else {
                let (chunk, done) = match memchr::memchr(b'\n', avail) {
                    Some(i) => (&avail[..i], true),
                    None => (avail, false),
                };
                len += chunk.len();
                last = chunk.last().copied().or(last);
                let room = if len <= max { max } else { HEAD };
                if buf.len() < room {
                    let take = chunk.len().min(room - buf.len());
                    buf.extend_from_slice(&chunk[..take]);
                }
                (done, chunk.len() + usize::from(done))
            }
        };
        if used == 0 {
            // End of stream.
            if len == 0 {
                return Ok(None);
            }
        } else {
            r.consume(used);
            if !done {
                continue;
            }
        }
        if last == Some(b'\r') {
            len -= 1;
            buf.truncate(len);
        }
        if len > max {
            buf.truncate(HEAD);
            return Ok(Some(Line::TooLong { head: buf, len }));
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            // Empty lines between frames are tolerated.
            buf.clear();
            len = 0;
            last = None;
            if used == 0 {
                return Ok(None);
            }
            continue;
        }
        return Ok(Some(Line::Text(buf)));
    }
}

/// Writes each frame followed by `\n`, flushing whenever no further frame is waiting. Ends when the
/// channel closes (after flushing) or the peer stops reading (a write error).
pub async fn write_frames<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<Vec<u8>>) -> std::io::Result<()> {
    let mut out = tokio::io::BufWriter::with_capacity(64 * 1024, &mut w);
    while let Some(mut frame) = rx.recv().await {
        loop {
            frame.push(b'\n');
            out.write_all(&frame).await?;
            match rx.try_recv() {
                Ok(next) => frame = next,
                Err(_) => break,
            }
        }
        out.flush().await?;
    }
    out.flush().await?;
    drop(out);
    w.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        // A tiny buffer makes lines straddle reads.
        let mut r = tokio::io::BufReader::with_capacity(3, input);
        let mut out = Vec::new();
        while let Some(l) = read_line(&mut r, max).await.unwrap() {
            out.push(l);
        }
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
        tx.send(b"a".to_vec()).await.unwrap();
        tx.send(b"b".to_vec()).await.unwrap();
        drop(tx);
        write_frames(&mut sink, rx).await.unwrap();
        assert_eq!(sink, b"a\nb\n");
    }
}

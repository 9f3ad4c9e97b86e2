//! The reader and writer loops between a peer's byte streams and the relay loop, written once.
//!
//! A reader cuts lines with the splitter ([`crate::lines`]), parses each into a [`Frame`] (or says why it
//! cannot) and hands them over in batches: a burst costs one wake-up of the loop rather than one per frame.
//! A writer takes batches of frames and hands each to one vectored write. Readers and writers of the shim's
//! own stdin and stdout run on threads of their own with blocking I/O (tokio's stdio hands every read and
//! write to its blocking pool, which costs more than the relay itself); those of other streams are tasks.

use std::io::IoSlice;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::frame::{self, Frame, Id, Invalid, Reader};
use crate::json;
use crate::lines::{Line, Lines};

/// Frames handed to a writer in one go (one channel message, one wake-up). Each ends in `\n`.
pub type Batch = Vec<Bytes>;

/// Slices per vectored write (Linux takes at most 1024).
const IOV_MAX: usize = 1024;

/// One item read from a peer.
pub enum Received {
    Frame(Frame),
    /// The line, without its `\n`.
    Invalid {
        line: Bytes,
        err: Invalid,
    },
    /// Refused for its size or its nesting (not for what it says): its id and whether it has a method,
    /// read cheaply, and why, for the warning and the error answer.
    Refused {
        id: Option<Id>,
        has_method: bool,
        why: String,
    },
}

impl Received {
    /// The error answer JSON-RPC 2.0 prescribes for a line that is not a frame, once per line; `None` for a
    /// frame, and for a line refused for its size or nesting that names a method but no id (a notification,
    /// which is never answered) or an id but no method (an answer, which the relay loop deals with). Not
    /// JSON: -32700; JSON but not a JSON-RPC message, or a request refused: -32600. Both carry the request's
    /// id where it could be read, `null` otherwise. The one home of this rule for either peer.
    pub fn answer(&self) -> Option<Frame> {
        let (id, code, message) = match self {
            Received::Frame(_) => return None,
            Received::Invalid { err, .. } => (err.id.clone(), err.code, err.message.clone()),
            Received::Refused { id, has_method, why } => match (id, has_method) {
                (Some(_), false) | (None, true) => return None,
                (id, _) => (id.clone(), -32600, format!("invalid request: message {why}")),
            },
        };
        Some(frame::error_response(&id.unwrap_or_else(Id::null), code, &message, None))
    }
}

/// One line of a stream, read with the stream's reader (see [`Reader`]).
fn received(line: Line, reader: &mut Reader) -> Received {
    match line {
        Line::Text(wire) => match Frame::read(wire, reader) {
            Ok(frame) => Received::Frame(frame),
            Err((line, err)) if err.too_deep => {
                let why = format!("of {} bytes nested deeper than {} levels", line.len() - 1, json::MAX_DEPTH);
                Received::Refused { id: err.id, has_method: err.has_method, why }
            }
            Err((line, err)) => Received::Invalid { line: line.slice(..line.len() - 1), err },
        },
        Line::TooLong { head, len } => {
            let (id, has_method) = frame::sniff(&head);
            Received::Refused { id, has_method, why: format!("of {len} bytes, over the size limit") }
        }
    }
}

/// What a reader hands the relay loop: every frame it could read without waiting, or why it stopped.
pub type Delivery = std::io::Result<Vec<Received>>;

/// Most frames, and about the most bytes, in one batch.
pub const BATCH: usize = 256;
pub const BATCH_BYTES: usize = 256 << 10;
/// Batches waiting in a channel between a reader or writer and the loop.
pub const CHANNEL: usize = 4;

/// Turns what one reader has buffered into batches: every whole line it holds, so that a burst costs
/// one wake-up of the loop rather than one per frame. `send` returns false once nobody listens.
fn drain(lines: &mut Lines, reader: &mut Reader, mut send: impl FnMut(Delivery) -> bool) -> bool {
    // Sized once: grown push by push, a full batch would be reallocated (and copied) nine times.
    let (mut batch, mut bytes) = (Vec::with_capacity(BATCH), 0);
    while let Some(line) = lines.next_line() {
        bytes += line.len();
        batch.push(received(line, reader));
        if batch.len() == BATCH || bytes >= BATCH_BYTES {
            if !send(Ok(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))) {
                return false;
            }
            bytes = 0;
        }
    }
    batch.is_empty() || send(Ok(batch))
}

/// What a reader does at the end of its stream or on an error: the last line, then why it stopped.
fn last(lines: &mut Lines, reader: &mut Reader, read: std::io::Result<usize>) -> Option<Delivery> {
    match read {
        Ok(0) => lines.finish().map(|line| Ok(vec![received(line, reader)])),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Reads and parses frames on a task: parsing runs beside the relay loop, not in it.
pub fn spawn_reader<R: AsyncRead + Unpin + Send + 'static>(mut r: R, max: usize) -> mpsc::Receiver<Delivery> {
    let (tx, rx) = mpsc::channel(CHANNEL);
    tokio::spawn(async move {
        let (mut lines, mut reader) = (Lines::new(max), Reader::default());
        loop {
            let read = lines.fill(&mut r).await;
            let mut batches = Vec::new();
            let _ = drain(&mut lines, &mut reader, |b| {
                batches.push(b);
                true
            });
            let stop = !matches!(read, Ok(n) if n > 0);
            batches.extend(last(&mut lines, &mut reader, read));
            for batch in batches {
                if tx.send(batch).await.is_err() {
                    return;
                }
            }
            if stop {
                return;
            }
        }
    });
    rx
}

/// One peer as the relay loop sees it: frames read from it, frames to write to it, and a signal once
/// everything handed to the writer has been written (or the peer stopped reading).
pub struct Link {
    pub input: mpsc::Receiver<Delivery>,
    pub output: mpsc::Sender<Batch>,
    pub written: tokio::sync::oneshot::Receiver<()>,
    /// A message once the peer has closed its end of what we read, however much it left unread (see
    /// `watch_hangup`); `None` where that cannot be watched (streams in the process).
    pub hangup: Option<mpsc::Receiver<()>>,
}

/// The shim's own stdin and stdout, each on a thread of its own with blocking I/O: tokio's stdio
/// hands every read and write to its blocking pool, which costs more than the relay itself.
pub fn stdio(max: usize) -> std::io::Result<Link> {
    use std::os::fd::AsFd;
    let stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let (in_tx, input) = mpsc::channel(CHANNEL);
    std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let mut stdin = stdin;
        let (mut lines, mut reader) = (Lines::new(max), Reader::default());
        loop {
            let read = lines.fill_blocking(&mut stdin);
            if !drain(&mut lines, &mut reader, |b| in_tx.blocking_send(b).is_ok()) {
                return;
            }
            let stop = !matches!(read, Ok(n) if n > 0);
            if let Some(item) = last(&mut lines, &mut reader, read)
                && in_tx.blocking_send(item).is_err()
            {
                return;
            }
            if stop {
                return;
            }
        }
    })?;
    let (output, out_rx) = mpsc::channel(CHANNEL);
    let (done, written) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("stdout".into()).spawn(move || {
        if let Err(e) = write_frames_blocking(stdout, out_rx) {
            tracing::debug!("stdout closed: {e}");
        }
        let _ = done.send(());
    })?;
    let (hung_up, hangup) = mpsc::channel(1);
    let watched = std::io::stdin().as_fd().try_clone_to_owned()?;
    std::thread::Builder::new().name("stdin-hangup".into()).spawn(move || watch_hangup(watched, hung_up))?;
    Ok(Link { input, output, written, hangup: Some(hangup) })
}

/// Tells `hung_up` once the writer of `fd` (a pipe or a socket) has gone away, whatever it left unread.
/// While the relay applies backpressure nothing reads the client's stdin, so its end would never be read;
/// the kernel says it all the same. Linux reports a pipe's hang-up (`POLLHUP`) whatever is asked, and a
/// socket's half-close as `POLLRDHUP`: the wait costs nothing until then. Elsewhere (macOS) a hang-up comes
/// with readable data, so readable is asked for and looked at again after a pause while data waits.
/// Anything else (a file, a terminal, `/dev/null`) is read to its end anyway and is not watched.
fn watch_hangup(fd: std::os::fd::OwnedFd, hung_up: mpsc::Sender<()>) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    let file = std::fs::File::from(fd);
    match file.metadata().map(|m| m.file_type()) {
        Ok(t) if t.is_fifo() || t.is_socket() => {}
        _ => return,
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let (events, pause) = (PollFlags::from_bits_retain(nix::libc::POLLRDHUP), None);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let (events, pause) = (PollFlags::POLLIN, Some(std::time::Duration::from_millis(100)));
    let gone = PollFlags::POLLHUP
        | PollFlags::POLLERR
        | PollFlags::from_bits_retain(events.bits() & !PollFlags::POLLIN.bits());
    loop {
        let mut fds = [PollFd::new(file.as_fd(), events)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        let revents = fds[0].revents().unwrap_or(PollFlags::empty());
        if revents.intersects(gone) {
            let _ = hung_up.blocking_send(());
            return;
        }
        if revents.contains(PollFlags::POLLNVAL) || hung_up.is_closed() {
            return;
        }
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
    }
}

/// A peer on any byte streams (a child's pipes, an in-process client, in-memory pipes), with tasks doing
/// the I/O.
pub fn streams<R, W>(reader: R, writer: W, max: usize) -> Link
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let input = spawn_reader(reader, max);
    let (output, out_rx) = mpsc::channel(CHANNEL);
    let (done, written) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = write_frames(writer, out_rx).await;
        let _ = done.send(());
    });
    Link { input, output, written, hangup: None }
}

/// Writes batches of frames (each ending in `\n`) with vectored writes, taking every batch already waiting
/// into the same write. Ends when the channel closes or the peer stops reading (a write error).
pub async fn write_frames<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<Batch>) -> std::io::Result<()> {
    let mut frames = Batch::new();
    while let Some(first) = rx.recv().await {
        gather(&mut frames, first, &mut rx);
        for chunk in frames.chunks(IOV_MAX) {
            let mut slices: Vec<IoSlice> = chunk.iter().map(|f| IoSlice::new(f)).collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                match w.write_vectored(rest).await? {
                    0 => return Err(std::io::ErrorKind::WriteZero.into()),
                    n => IoSlice::advance_slices(&mut rest, n),
                }
            }
        }
        // (Let go at once: a read buffer is reused once every line cut from it is written.)
        frames.clear();
        w.flush().await?;
    }
    w.shutdown().await
}

/// [`write_frames`] for a blocking writer (the shim's own stdout, written on a thread of its own).
pub fn write_frames_blocking<W: std::io::Write>(mut w: W, mut rx: mpsc::Receiver<Batch>) -> std::io::Result<()> {
    let mut frames = Batch::new();
    while let Some(first) = rx.blocking_recv() {
        gather(&mut frames, first, &mut rx);
        for chunk in frames.chunks(IOV_MAX) {
            let mut slices: Vec<IoSlice> = chunk.iter().map(|f| IoSlice::new(f)).collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                match w.write_vectored(rest) {
                    Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                    Ok(n) => IoSlice::advance_slices(&mut rest, n),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        frames.clear();
        w.flush()?;
    }
    Ok(())
}

/// Bytes gathered for one vectored write, at most (more only when one frame is larger).
const WRITE_BYTES: usize = 1 << 20;

/// `first`, then the batches already waiting, up to one vectored write's worth, in `frames` (empty): one
/// list kept for every write, grown to a write's worth once, not grown from the first batch's room each write
/// (a reallocation and a copy of the list, about 40 instructions a frame).
fn gather(frames: &mut Batch, first: Batch, rx: &mut mpsc::Receiver<Batch>) {
    frames.reserve(IOV_MAX.max(first.len()));
    let mut bytes: usize = first.iter().map(Bytes::len).sum();
    frames.extend(first);
    while frames.len() < IOV_MAX && bytes < WRITE_BYTES {
        match rx.try_recv() {
            Ok(more) => {
                bytes += more.iter().map(Bytes::len).sum::<usize>();
                frames.extend(more);
            }
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writer_sends_every_frame_in_order() {
        let (tx, rx) = mpsc::channel(4);
        let mut sink = Vec::new();
        tx.send(vec![Bytes::from_static(b"a\n")]).await.unwrap();
        tx.send(vec![Bytes::from_static(b"b\n"), Bytes::from_static(b"c\n")]).await.unwrap();
        drop(tx);
        write_frames(&mut sink, rx).await.unwrap();
        assert_eq!(sink, b"a\nb\nc\n");

        // More frames than one vectored write takes, through a writer that takes a few bytes at a time.
        struct Slow(Vec<u8>);
        impl std::io::Write for Slow {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let n = b.len().min(5);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (tx, rx) = mpsc::channel(4);
        let many: Batch = (0..3000).map(|i| Bytes::from(format!("{i}\n"))).collect();
        let want: Vec<u8> = many.concat();
        tx.try_send(many).unwrap();
        drop(tx);
        let slow = std::thread::spawn(move || {
            let mut slow = Slow(Vec::new());
            write_frames_blocking(&mut slow, rx).map(|_| slow.0)
        });
        assert_eq!(slow.join().unwrap().unwrap(), want);
    }
}

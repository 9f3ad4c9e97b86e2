//! The frames in the page: every record's text, kept compressed in chunks the page opens only on a click.
//!
//! A chunk is [`CHUNK`] records, one JSON line each (`[line, t, dir, text]`), gzip-compressed and written as
//! base64 into a `<script type="application/x-acp-frames" id="c<N>">` element, which the browser neither runs
//! nor parses: the page reads one with `DecompressionStream` when a mark of its frames is opened. So the page
//! of a day-long trace is a fraction of the trace's size, loads without reading its frames, and the command
//! holds one chunk at a time.

use std::io::{self, Write};

use base64::Engine;
use flate2::Compression;
use flate2::write::GzEncoder;

use super::read::Record;

/// Records per chunk: small enough that opening one is instant, large enough to compress well.
pub const CHUNK: usize = 512;

/// Writes the chunks to the page as records come.
pub struct Store {
    current: GzEncoder<Vec<u8>>,
    in_chunk: usize,
    chunks: usize,
    /// Bytes of chunk elements written.
    pub written: u64,
}

impl Default for Store {
    fn default() -> Store {
        Store::new()
    }
}

impl Store {
    pub fn new() -> Store {
        Store { current: GzEncoder::new(Vec::new(), Compression::fast()), in_chunk: 0, chunks: 0, written: 0 }
    }

    /// Adds a record; writes its chunk to `out` when it is full.
    pub fn push(&mut self, rec: &Record, out: &mut impl Write) -> io::Result<()> {
        let line = serde_json::to_string(&(rec.line, rec.t, rec.dir.as_str(), rec.raw.as_str()))?;
        self.current.write_all(line.as_bytes())?;
        self.current.write_all(b"\n")?;
        self.in_chunk += 1;
        if self.in_chunk == CHUNK {
            self.flush(out)?;
        }
        Ok(())
    }

    /// Writes the last, partly filled chunk.
    pub fn finish(mut self, out: &mut impl Write) -> io::Result<usize> {
        if self.in_chunk > 0 {
            self.flush(out)?;
        }
        Ok(self.chunks)
    }

    fn flush(&mut self, out: &mut impl Write) -> io::Result<()> {
        let full = std::mem::replace(&mut self.current, GzEncoder::new(Vec::new(), Compression::fast()));
        let bytes = full.finish()?;
        let text = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let head = format!("<script type=\"application/x-acp-frames\" id=\"c{}\">", self.chunks);
        out.write_all(head.as_bytes())?;
        out.write_all(text.as_bytes())?;
        out.write_all(b"</script>\n")?;
        self.written += (head.len() + text.len() + 10) as u64;
        self.chunks += 1;
        self.in_chunk = 0;
        Ok(())
    }
}

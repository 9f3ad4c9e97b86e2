//! The line splitter on one huge frame: what cutting a 64 MiB line out of pipe-sized reads costs, as a
//! multiple of copying those bytes once (into a fresh buffer, page faults included) in the same run.
//!
//! Run with `cargo bench --bench lines`. Grown to the exact size at each read, the splitter copied a long
//! line once per read (a 60 MB notification took seconds); grown geometrically, it costs a small multiple
//! of one copy. Nothing here asserts a time.

use std::time::{Duration, Instant};

use coda_shim::lines::{DEFAULT_MAX_LINE, Line, Lines};

/// A pipe: at most `step` bytes per read.
struct Pipe<'a> {
    input: &'a [u8],
    step: usize,
}

impl std::io::Read for Pipe<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 2 } else { 5 };
    // The largest frame the limit lets through, with its newline.
    let mut frame = vec![b'x'; DEFAULT_MAX_LINE];
    frame.push(b'\n');

    // Copied once: through a pipe-sized read loop into one buffer of the right size.
    let once = best_of(runs, || {
        let mut out = Vec::with_capacity(frame.len());
        for chunk in frame.chunks(64 << 10) {
            out.extend_from_slice(chunk);
        }
        out
    });
    println!("| path | 64 MiB frame | ratio to one copy |");
    println!("| --- | --- | --- |");
    println!("| one copy (baseline) | {:.1} ms | 1.0 |", once.as_secs_f64() * 1e3);
    for (name, step) in [("splitter, 64 KiB reads", 64 << 10), ("splitter, 4 KiB reads", 4 << 10)] {
        let took = best_of(runs, || {
            let mut split = Lines::new(DEFAULT_MAX_LINE);
            let mut pipe = Pipe { input: &frame, step };
            loop {
                if let Some(line) = split.next_line() {
                    assert!(matches!(&line, Line::Text(b) if b.len() == frame.len()));
                    return line;
                }
                assert!(split.fill_blocking(&mut pipe).expect("read") > 0, "the frame comes out whole");
            }
        });
        println!("| {name} | {:.1} ms | {:.1} |", took.as_secs_f64() * 1e3, took.as_secs_f64() / once.as_secs_f64());
    }
}

//! `acp-replay view`: a trace turned into one self-contained HTML page, a timeline a person reads at a glance.
//!
//! [`read`] reads the trace one line at a time (bad lines kept aside), [`changes`] pairs each frame with its
//! other version, [`model`](mod@model) builds lanes, turns, marks and waits, [`frames`] keeps every record's
//! text compressed for the page, [`html`] writes the page with its script and style (`page.js`, `page.css`)
//! and the model embedded as JSON. Nothing holds the whole trace: the page of a trace of any length is
//! written as it is read. The page needs no network, works from `file://`, and draws only what is on screen.

pub mod changes;
pub mod frames;
pub mod html;
pub mod model;
pub mod read;

use std::io::{BufRead, Write};

pub use model::{Builder, Item, Kind, Lane, Model};

/// The model of a trace (`--trace-file` output or a fixture's `trace.jsonl`), whatever its bytes.
pub fn model(bytes: &[u8]) -> Model {
    model_of(bytes)
}

/// The model of a trace read from `input`.
pub fn model_of(input: impl BufRead) -> Model {
    let mut reader = read::Reader::new(input);
    let mut b = Builder::new();
    for line in reader.by_ref() {
        b.push(line);
    }
    b.finish(reader.clock)
}

/// What a page shows, in numbers.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub frames: usize,
    pub lanes: usize,
    pub items: usize,
    pub bad_lines: usize,
    /// Bytes of the page.
    pub bytes: u64,
}

/// The page of a trace, titled `title` (the trace's file name), and what it shows.
pub fn page(bytes: &[u8], title: &str) -> (String, Summary) {
    let mut out = Vec::new();
    let summary = write_page(bytes, &mut out, title).expect("writing to memory");
    (String::from_utf8(out).expect("the page is UTF-8"), summary)
}

/// Writes the page of the trace read from `input` to `out`, as the trace is read.
pub fn write_page(input: impl BufRead, out: &mut impl Write, title: &str) -> std::io::Result<Summary> {
    html::write(input, out, title)
}

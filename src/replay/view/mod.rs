//! `acp-replay view`: a trace turned into one self-contained HTML page, a timeline a person reads at a glance.
//!
//! [`read`] reads the trace (bad lines kept aside), [`changes`] pairs each frame with its other version,
//! [`model`](mod@model) builds lanes, turns, marks and waits, [`html`] writes the page with its script and style
//! (`page.js`, `page.css`) and the model embedded as JSON. The page needs no network and works from `file://`.

pub mod changes;
pub mod html;
pub mod model;
pub mod read;

pub use model::{Item, Kind, Lane, Model};

/// The model of a trace (`--trace-file` output or a fixture's `trace.jsonl`), whatever its bytes.
pub fn model(bytes: &[u8]) -> Model {
    let trace = read::read(bytes);
    let links = changes::link(&trace.records);
    model::build(trace, &links)
}

/// What a page shows, in numbers.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub frames: usize,
    pub lanes: usize,
    pub items: usize,
    pub bad_lines: usize,
}

/// The page of a trace, titled `title` (the trace's file name), and what it shows.
pub fn page(bytes: &[u8], title: &str) -> (String, Summary) {
    let m = model(bytes);
    let summary =
        Summary { frames: m.frames.len(), lanes: m.lanes.len(), items: m.items.len(), bad_lines: m.bad.len() };
    (html::page(&m, title), summary)
}

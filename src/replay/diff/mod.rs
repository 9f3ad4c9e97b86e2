//! `acp-replay diff A B`: two traces (or fixtures, or two sides of one trace) side by side.
//!
//! [`side`] reads the side of a trace to compare (what Coda saw, or what the CLI saw) and takes out what
//! differs in any two runs (ids, times, paths); [`align`] pairs sessions and turns and aligns the frames of each
//! turn; [`report`] writes the text; [`page`] the viewer's page with both sides' lanes.

pub mod align;
pub mod page;
pub mod report;
pub mod side;

pub use align::{Change, Report, Turn, compare};
pub use side::{Side, Which};

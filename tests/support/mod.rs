//! Test helpers shared by test files that reach them as `mod support;` (older files name one with `#[path]`).

pub mod cdp;
pub mod replay;

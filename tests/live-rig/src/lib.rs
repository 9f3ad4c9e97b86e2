//! The live test rig: a scripted fake model server and the hermetic set-up of each pinned agent CLI.
//!
//! - [`fake_model`]: the HTTP server every CLI's config points at (OpenAI chat completions and Responses API,
//!   answers scripted by markers in the prompt);
//! - [`live`]: a fresh HOME with the CLI's config and the complete environment to run it with, nothing leaving
//!   the machine;
//! - [`opt_in`]: when a live test runs (`CODA_LIVE=1`, `CODA_LIVE_AGENTS`), and that a CLI asked for and missing
//!   fails it;
//! - [`cli`]: what the rig knows of each CLI (pinned package, config, the tool names its model requests offer);
//! - [`paths`]: where the pinned CLIs are installed (`.live/`).
//!
//! It does not depend on `coda_shim`: what needs the shim's binaries stays in `tests/support/`.

pub mod cli;
pub mod fake_model;
pub mod live;
pub mod opt_in;
pub mod paths;

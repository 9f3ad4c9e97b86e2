//! Support code of the integration tests (tests/all.rs), reached from each test module the one way:
//! `use crate::support;`.
//!
//! - [`shim`]: a shim binary run as Coda runs it, with the scripted test agent (`examples/test_agent.rs`) or any
//!   command as child; [`temp`]: temporary folders; [`wait`]: waiting for an event with a deadline (no "sleep,
//!   then look"); [`executable`]: scripts a test writes and runs, safe from ETXTBSY;
//! - [`replay`]: fixtures replayed through the shim binaries with `acp-replay`; [`recorder`]: recording a live
//!   session as a fixture; [`kimi_expected`]: what Coda received from coda-kimi, in `expected.txt` notation;
//! - [`cdp`]: a headless Chromium driven over the DevTools protocol (the viewer's browser test);
//! - [`coda_text`]: what Coda really sends (its instruction, a first prompt); [`failures`]: the upstream
//!   failure cases and what Coda must get for each;
//! - [`fake_model`] and [`live`]: the fake model server and the hermetic set-up of each real CLI, from the
//!   `live-rig` package (shared with the examples; it needs no shim binary).

pub mod cdp;
pub mod coda_text;
pub mod executable;
pub mod failures;
pub mod kimi_expected;
pub mod recorder;
pub mod replay;
pub mod shim;
pub mod temp;
pub mod wait;

pub use live_rig::{fake_model, live};

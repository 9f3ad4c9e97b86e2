//! Recordings and replay (`fixtures/README.md` describes the format).
//!
//! A fixture is a `--trace-file` recording with machine-specific values replaced by `{{NAME}}` placeholders.
//! [`Script`] walks one side of it: the agent side (the player, `acp-replay play`, which stands in for the CLI)
//! or the client side ([`check()`], which drives a shim binary and compares what the client receives).
//! [`Normaliser`] and [`record`] turn a trace into a fixture.
//!
//! By job: [`format`](mod@format) (records: parse, render), [`fixture`] (a fixture folder, loaded), [`placeholder`]
//! (matching and filling `{{NAME}}`), [`script`] (the state machine of one side), [`play`](mod@play) (the
//! player's loop), [`file_op`] (session-file writes), [`normalise`] (trace to fixture), [`instants`] (the usage
//! facts' times as `{{AT_n}}`), [`check`](mod@check) (a shim binary against a fixture), [`view`] (a trace as an
//! HTML timeline), [`diff`] (two traces side by side), [`redact`] (a trace safe to share), [`took`] (what the
//! player waits on: the shim's account of the writes it has taken in), [`rpc`] (a trace's two JSON-RPC
//! conversations), [`validate`](mod@validate) (frames against ACP's schema and Coda's shapes), [`stats`](mod@stats)
//! (counts and latencies per method), [`commands`] (what each `acp-replay` command does with its files).

pub mod check;
pub mod commands;
pub mod diff;
pub mod file_op;
pub mod fixture;
pub mod format;
pub mod homes;
pub mod instants;
pub mod normalise;
pub mod placeholder;
pub mod play;
pub mod redact;
pub mod rpc;
pub mod script;
pub mod stats;
pub mod took;
pub mod validate;
pub mod view;

pub use crate::trace::Dir;
pub use check::{CheckOptions, CheckReport, check};
pub use file_op::{FileOp, FileOpError, FileOpKind, apply_file_op};
pub use fixture::{FILES_FILE, LoadError, TRACE_FILE, load};
pub use format::{Body, ParseError, ParseErrorKind, Record, parse_records, render};
pub use normalise::{Normaliser, RecordError, record};
pub use placeholder::{Bindings, Difference, Escape, fill, match_str, match_value};
pub use script::{Fallback, Mismatch, Script, Side, Step, env_fallback};

//! coda-shim: makes agent CLIs that speak ACP meet Coda's agent contract.
//!
//! One binary per wrapped CLI runs the real CLI as a child and relays newline-delimited JSON-RPC 2.0 between
//! Coda (the client, on the binary's stdin/stdout) and the CLI (the agent, on the child's pipes), with a stack
//! of [`layer::Layer`]s adding exactly what that CLI lacks. This crate is the whole of it; each binary's
//! `main` is one line naming its adapter.
//!
//! # Map
//!
//! - The engine, which knows no agent by name: [`frame`] (one line's bytes and a cheap envelope view),
//!   [`scan`] (the one pass that checks every line and reads its envelope; a stream's [`scan::Scanner`] goes
//!   on from where a line stops repeating the one before), [`json`] (the one bounded parser of peer and file data), [`lines`] (the splitter), [`transport`] (the
//!   reader and writer loops), [`relay`] (the loop that owns all state), [`relay::lifecycle`] (the
//!   session's lifecycle as a sans-IO state machine: which peer is still read, the stop ladder, the drain
//!   deadline) and [`relay::testing`] (the loop on in-memory pipes and virtual time with an in-process
//!   scripted agent: a `Pair` whose `drive()` runs both sides until idle, for behaviour tests that need no
//!   process), [`layer`] (the layer contract, the [`layer::Stack`], its request table [`layer::requests`] and
//!   session table [`layer::sessions`], the jobs it runs for layers [`layer::work`] and [`layer::testing`]), [`child`] and [`watchdog`] (the CLI's process and what stops
//!   it), [`trace`], [`file_log`] and [`private_file`] (what the shim writes), [`maybe`] (small async helpers).
//! - [`coda`]: Coda's contract, once: `_coda/wait` rules ([`coda::wait`]) and the handshake that gates them
//!   ([`coda::waits`], at the top of every stack), the session instruction ([`coda::instruction`]), the
//!   agent's identity ([`coda::identity`]), failure kinds ([`coda::failure`]), compaction on request
//!   ([`coda::compact`]: the machine [`coda::compact::Compaction`] keeps every rule of the section, over the
//!   small [`coda::compact::Compactor`] an adapter writes for how its CLI compacts), steering ([`coda::steering`]:
//!   the machine [`coda::steering::Steering`] over an adapter's [`coda::steering::Steerer`], or a CLI's own
//!   `_session/steering`) and the usage facts on
//!   `usage_update` ([`coda::usage`]); how each CLI does them is its adapter's. The feature suites (`coda::suite`,
//!   tests only) run the same scenarios on every binary's stack over a scripted stand-in for each CLI.
//! - [`cli`]: what every binary shares: the [`Adapter`] value (an agent's facts and how its stack is built),
//!   arguments, set-up, finding the CLI on a short PATH, prompt mode, `doctor`.
//! - [`adapters`]: one module per wrapped CLI (`adapters/<agent>/`, mounted from the top-level folder): its
//!   `adapter()` value and its layers.
//! - [`replay`]: the recording format, the player and checker behind `acp-replay`, the trace viewer, `diff`
//!   and `redact`.
//!
//! # Data flow
//!
//! ```text
//! Coda --stdin--> reader --Frame--> relay loop --Frame--> writer --stdin--> CLI
//! Coda <-stdout-- writer <--Frame-- relay loop <--Frame-- reader <-stdout-- CLI
//!                                    |    ^
//!                      layers (Stack) +    +-- events (file watcher, event stream, probe), wake-ups,
//!                                    |         results of jobs
//!                                    +--> jobs (Cx::work) --> worker threads (layer::work)
//! ```
//!
//! A source several layers read (OpenCode's server events) reaches each of them through the engine
//! ([`layer::Broadcast`]), not through a fan-out of its adapter's. One task owns every layer and handles frames,
//! events and wake-ups strictly in arrival order; readers and
//! writers are joined to it by bounded channels, so a slow peer applies backpressure. A frame nobody changes
//! leaves byte for byte.
//!
//! # The layer contract
//!
//! A layer is a sans-IO state machine (see [`layer`]): it is handed one input at a time (a frame from either
//! side, an answer to its own request, an event, a wake-up) with a [`layer::Cx`] carrying the time, and it
//! asks for output through that `Cx`: frames towards either peer, requests of its own, wake-ups, and work.
//! It never sleeps, reads the clock, reads the environment after set-up, touches a file or starts a thread:
//! I/O it needs (read a session file, start a watcher, write a record) it asks the engine for as a job
//! ([`layer::Cx::work`]), which runs off the relay loop on the engine's workers ([`layer::work`]) and comes
//! back to the layer as one more input, so nothing a layer calls can hold up the loop; threads set up with
//! the stack hand their results in through a [`layer::EventSender`]. A layer reads a frame through
//! [`frame::Frame::value`], which cannot fail and parses each frame at most once, the result shared with the
//! layers after it; a layer that edits one takes a copy ([`frame::Frame::to_value`]) and hands it to
//! [`frame::Frame::rewritten`], whose frame keeps it. A lone UTF-16 surrogate escape reads as U+FFFD. A layer
//! that would only pass an agent frame on says so ([`layer::Layer::passes_from_agent`]) and is skipped for it
//! (debug builds check that it would have).
//!
//! Each layer names its own types: its wake-ups ([`layer::Layer::Timer`], an enum of its own, never a number
//! packed by hand), its events ([`layer::Layer::Event`]; the [`layer::EventSender`] the set-up hands it is
//! typed by it) and the tags of its own requests ([`layer::Layer::Reply`]). The stack erases them in one place
//! ([`layer::AnyLayer`]); a value of the wrong type is a loud error, never dropped in silence.
//!
//! The stack records every client request once (id, method, `params.sessionId`, time): a layer asks which
//! request an answer answers ([`layer::Cx::answer_to`]) and which are open ([`layer::Cx::open_requests`]),
//! and keeps no map of ids of its own; the relay asks it what the agent still owes. Beside it the stack keeps
//! the session table ([`layer::sessions`], read through [`layer::Cx::session`] and [`layer::Cx::turn`]): the
//! root sessions Coda opened, the children layers named, whose turn runs in each (Coda's, the shim's own
//! request, the CLI's own), a compaction, the prompts held behind it and a steering message in flight. No
//! layer keeps its own copy of those. Layers tell each other
//! things through typed notes on a request ([`layer::Cx::note`], e.g. [`coda::wait::WithholdWaits`]), never
//! through keys written into frames.

// The layer hooks are named for where a frame comes from (`from_client`, `from_agent`), not conversions.
#![allow(clippy::wrong_self_convention)]

#[path = "../adapters/mod.rs"]
pub mod adapters;
pub mod child;
pub mod cli;
pub mod coda;
pub mod file_log;
pub mod frame;
pub mod json;
pub mod layer;
pub mod lines;
pub mod maybe;
pub mod private_file;
pub mod relay;
pub mod replay;
pub mod scan;
pub mod trace;
pub mod transport;
pub mod watchdog;

pub use cli::adapter::Adapter;

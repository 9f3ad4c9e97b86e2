//! coda-shim: makes agent CLIs that speak ACP meet Coda's agent contract.
//!
//! One binary per wrapped CLI runs the real CLI as a child and relays newline-delimited JSON-RPC 2.0 between
//! Coda (the client, on the binary's stdin/stdout) and the CLI (the agent, on the child's pipes), with a stack
//! of [`layer::Layer`]s adding exactly what that CLI lacks. This crate is the whole of it; each binary's
//! `main` is one line naming its adapter.
//!
//! The map of the code (the data flow, what each module does, the invariants that hold across them) is
//! `ARCHITECTURE.md` at the root of the repository; the layer contract is [`layer`]'s documentation. The
//! top-level modules:
//!
//! - the engine, which names no agent: [`frame`], [`scan`], [`json`], [`lines`], [`transport`], [`relay`],
//!   [`layer`], [`child`], [`watchdog`], [`trace`], [`file_log`], [`private_file`], [`inside`], [`maybe`];
//! - [`coda`]: Coda's contract, written once;
//! - [`cli`]: what every binary shares (the [`Adapter`] value, arguments, finding the CLI, prompt mode, `doctor`);
//! - [`adapters`]: one module per wrapped CLI;
//! - [`replay`]: the recordings and the tools of `acp-replay`, and the check of frames against ACP's schema
//!   ([`replay::validate`]) that the tests run on everything a shim writes.
//!
//! Beside the tests of each module, the deterministic simulator (the dev-only package in `tests/sim`,
//! `docs/simulation.md`) plays whole sessions against each binary's stack: it builds the stack with
//! [`Adapter::stack_in`], handing its set-up the environment and, for coda-kimi, watches it steps itself
//! ([`adapters::kimi::watch::Driven`]), and runs it in the real relay loop on virtual time
//! ([`relay::testing::Pair`]).

// The layer hooks are named for where a frame comes from (`from_client`, `from_agent`), not conversions.
#![allow(clippy::wrong_self_convention)]

#[path = "../adapters/mod.rs"]
pub mod adapters;
pub mod child;
pub mod cli;
pub mod coda;
pub mod file_log;
pub mod frame;
pub mod inside;
pub mod json;
pub mod layer;
pub mod lines;
pub mod maybe;
pub mod private_file;
pub mod relay;
pub mod replay;
pub mod scan;
pub mod text;
pub mod trace;
pub mod transport;
pub mod watchdog;

pub use cli::adapter::Adapter;

/// The hash map of the crate: what the relay keeps by a peer's id (sessions, requests, tool calls, waits) is
/// looked up on every frame, and std's SipHash costs more there than the frame check. foldhash's hasher is
/// seeded per process as std's is, so a peer cannot choose keys that collide; it is no keyed hash for secrets
/// (the redaction's names use std's).
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// The hash set of the crate ([`HashMap`]'s hasher).
pub type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

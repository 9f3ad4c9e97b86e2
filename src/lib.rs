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

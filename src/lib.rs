//! coda-shim: makes agent CLIs that speak ACP meet Coda's agent contract.
//!
//! Each binary (`coda-codex`, `coda-kimi`, `coda-grok`, `coda-opencode`) runs the real CLI as a child and
//! relays newline-delimited JSON-RPC between Coda and it, with a stack of [`layer::Layer`]s adding what
//! that CLI lacks. See `ARCHITECTURE` notes in README.md.

// The layer hooks are named for where a frame comes from (`from_client`, `from_agent`), not conversions.
#![allow(clippy::wrong_self_convention)]

#[path = "../adapters/mod.rs"]
pub mod adapters;
pub mod child;
pub mod cli;
pub mod coda;
pub mod frame;
pub mod json;
pub mod layer;
pub mod lines;
pub mod maybe;
pub mod private_file;
pub mod relay;
pub mod replay;
pub mod trace;
pub mod transport;
pub mod watchdog;

pub use cli::adapter::Adapter;

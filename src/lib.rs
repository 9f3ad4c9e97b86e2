//! coda-shim: makes agent CLIs that speak ACP meet Coda's agent contract.
//!
//! Each binary (`coda-codex`, `coda-kimi`, `coda-grok`, `coda-opencode`) runs the real CLI as a child and
//! relays newline-delimited JSON-RPC between Coda and it, with a stack of [`layer::Layer`]s adding what
//! that CLI lacks. See `ARCHITECTURE` notes in README.md.

// The layer hooks are named for where a frame comes from (`from_client`, `from_agent`), not conversions.
#![allow(clippy::wrong_self_convention)]

pub mod adapter;
pub mod child;
pub mod doctor;
pub mod failure;
pub mod frame;
pub mod identity;
pub mod instruction;
pub mod json;
pub mod layer;
pub mod lines;
pub mod locate;
pub mod private_file;
pub mod prompt_mode;
pub mod relay;
pub mod render;
pub mod replay;
pub mod trace;
pub mod wait;
pub mod watchdog;

pub use adapter::{Adapter, main};

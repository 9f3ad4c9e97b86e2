//! The wrapped CLIs: one module per agent, each a [`crate::cli::adapter::Adapter`] value and the layers it
//! stacks. The engine (`src/`) knows none of them by name; a binary is `adapters/<agent>/main.rs`.

pub mod codex;
pub mod grok;
pub mod kimi;
pub mod opencode;

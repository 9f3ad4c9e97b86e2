//! What every binary shares: what an adapter is, the command line, finding the CLI, prompt mode and `doctor`.

pub mod adapter;
pub mod args;
pub mod binary;
pub mod client;
pub mod coda_view;
pub mod doctor;
pub mod locate;
pub mod program;
pub mod prompt_mode;
pub mod prompt_options;
pub mod questions;
pub mod render;
pub mod setup;

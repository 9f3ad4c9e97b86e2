//! What every binary shares: the command line, finding the CLI, prompt mode and `doctor`.

pub mod adapter;
pub mod doctor;
pub mod locate;
pub mod prompt_mode;
pub mod render;

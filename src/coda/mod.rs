//! Coda's contract for agents (its protocol text for agents; sections are cited by their Chinese titles): the
//! rules every adapter shares, written once.

pub mod compact;
pub mod failure;
pub mod identity;
pub mod instruction;
pub mod machine;
pub mod steering;
pub mod subagents;
#[cfg(test)]
pub mod suite;
pub mod usage;
pub mod wait;
pub mod waits;

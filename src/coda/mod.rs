//! Coda's contract for agents (its protocol text for agents; sections are cited by their Chinese titles): the
//! rules every adapter shares, written once.
//!
//! A feature that each CLI does its own way is a machine here over what the adapter writes for its CLI:
//! [`failure::FailureKinds`] over [`failure::Signals`] (执行失败), [`usage::UsageFacts`] over [`usage::Source`]
//! (用量里的数据), [`compact::Compaction`] over [`compact::Compactor`] (压缩上下文) and [`steering::Steering`] over
//! [`steering::Steerer`] (插话). The adapter says only what its CLI does natively: where its signals and facts
//! are, how it compacts or steers. The feature suites (`suite/`, tests only) run each machine's scenarios on every
//! binary's stack that declares the feature.

pub mod compact;
pub mod failure;
pub mod identity;
pub mod instruction;
pub mod machine;
pub mod slash_compact;
pub mod steering;
pub mod subagents;
#[cfg(test)]
pub mod suite;
pub mod usage;
pub mod wait;
pub mod waits;

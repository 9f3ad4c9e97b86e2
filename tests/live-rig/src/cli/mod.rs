//! What the rig knows of each real CLI: pinned package, hermetic set-up, the tools its model requests offer.
//!
//! One file per CLI holds all of that CLI's facts; [`crate::live`] and [`crate::fake_model`] read them from
//! [`ALL`] and know no CLI by name.

pub mod claude;
pub mod codex;
pub mod gemini;
pub mod grok;
pub mod kimi;
pub mod opencode;
pub mod qwen;
mod spec;

pub(crate) use spec::path_string;
pub use spec::{Cli, MODEL, Setup, Tools};

/// Every CLI the rig runs, in the order the live suites run them (and the fake model looks up tool names): first
/// the four wrapped by binaries of their own ([`AGENTS`]), then the ACP agents `coda-acp` runs ([`ACP_AGENTS`]).
pub const ALL: [&Cli; 7] =
    [&codex::CLI, &kimi::CLI, &grok::CLI, &opencode::CLI, &qwen::CLI, &gemini::CLI, &claude::CLI];

/// The CLIs wrapped by a binary of their own (`coda-<name>`).
pub const AGENTS: [&str; 4] = [ALL[0].name, ALL[1].name, ALL[2].name, ALL[3].name];

/// The ACP agents run by `coda-acp --profile <name>`.
pub const ACP_AGENTS: [&str; 3] = [ALL[4].name, ALL[5].name, ALL[6].name];

/// Shell tools of every CLI, in the order of [`ALL`], then `shell` (a name none of the pinned CLIs offers,
/// kept as the last choice).
pub fn shell_tools() -> Vec<&'static str> {
    ALL.iter().flat_map(|cli| cli.tools.shell.iter().copied()).chain(["shell"]).collect()
}

/// Subagent tools of every CLI, in the order of [`ALL`].
pub fn spawn_tools() -> Vec<&'static str> {
    ALL.iter().flat_map(|cli| cli.tools.spawn.iter().copied()).collect()
}

/// Follow-up tools of every CLI, in the order of [`ALL`]; the others resume through their spawn tool.
pub fn followup_tools() -> Vec<&'static str> {
    ALL.iter().flat_map(|cli| cli.tools.followup.iter().copied()).collect()
}

/// Phrases (lower case) that open any CLI's title and summary requests.
pub fn side_phrases() -> impl Iterator<Item = &'static str> {
    ALL.iter().flat_map(|cli| cli.tools.side_phrases.iter().copied())
}

/// The CLI named `name`.
pub fn by_name(name: &str) -> Option<&'static Cli> {
    ALL.into_iter().find(|cli| cli.name == name)
}

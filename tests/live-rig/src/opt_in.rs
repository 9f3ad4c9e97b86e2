//! When a live test runs: the one gate every live suite goes through (issue 22).
//!
//! - Without `CODA_LIVE=1` a live test is skipped, and says so on stderr: `cargo test` needs no CLI.
//! - `CODA_LIVE_AGENTS=kimi,grok` runs only those agents (scripts/live-test runs one agent at a time); the
//!   others are skipped, saying so.
//! - With `CODA_LIVE=1`, an agent that is asked for and whose CLI is missing (or not at its pinned version)
//!   fails the test: a live run that was asked for and could not run is no pass.

use crate::cli::{self, ACP_AGENTS, AGENTS};
use crate::live::installed;

/// What the gate decided for one agent.
#[derive(Debug, PartialEq)]
enum Decision {
    Run,
    /// Skipped, with the reason (printed).
    Skip(String),
    /// The test fails, with the reason.
    Fail(String),
}

/// The rule, without the environment: `live` is whether `CODA_LIVE` is set, `only` is `CODA_LIVE_AGENTS`,
/// `ready` whether the CLI is installed at its pinned version.
fn decide(agent: &str, live: bool, only: Option<&str>, ready: impl FnOnce() -> Result<(), String>) -> Decision {
    if !live {
        return Decision::Skip("set CODA_LIVE=1 (after scripts/install-clis) to run it".into());
    }
    if cli::by_name(agent).is_none() {
        return Decision::Fail(format!("unknown agent {agent:?}; expected one of {AGENTS:?} or {ACP_AGENTS:?}"));
    }
    if let Some(only) = only
        && !only.split(',').any(|a| a.trim() == agent)
    {
        return Decision::Skip(format!("not in CODA_LIVE_AGENTS={only}"));
    }
    match ready() {
        Ok(()) => Decision::Run,
        Err(why) => Decision::Fail(format!("CODA_LIVE is set but {why}")),
    }
}

/// Whether the live test `what` runs for `agent`: false (saying why on stderr) when it is skipped; panics when
/// `CODA_LIVE=1` asks for it and the CLI is missing.
pub fn wanted(agent: &str, what: &str) -> bool {
    let live = std::env::var_os("CODA_LIVE").is_some_and(|v| !v.is_empty());
    let only = std::env::var("CODA_LIVE_AGENTS").ok();
    match decide(agent, live, only.as_deref(), || installed(agent).map(drop)) {
        Decision::Run => true,
        Decision::Skip(why) => {
            eprintln!("skipped {what} on {agent}: {why}");
            false
        }
        Decision::Fail(why) => panic!("{what} on {agent}: {why}"),
    }
}

/// The agents the live test `what` runs, in the rig's order: each one through [`wanted`] (none without
/// `CODA_LIVE=1`; a missing CLI that is asked for fails the test). Names in `CODA_LIVE_AGENTS` that are no
/// agent fail it too.
pub fn selected_agents(what: &str) -> Vec<&'static str> {
    if let Ok(only) = std::env::var("CODA_LIVE_AGENTS")
        && let Some(unknown) = only.split(',').map(str::trim).find(|a| !a.is_empty() && cli::by_name(a).is_none())
    {
        panic!("CODA_LIVE_AGENTS names {unknown:?}, not one of {AGENTS:?}");
    }
    AGENTS.into_iter().filter(|agent| wanted(agent, what)).collect()
}

/// [`selected_agents`] for the ACP agents that `coda-acp` runs by profile.
pub fn selected_acp_agents(what: &str) -> Vec<&'static str> {
    if let Ok(only) = std::env::var("CODA_LIVE_AGENTS")
        && let Some(unknown) = only.split(',').map(str::trim).find(|a| !a.is_empty() && cli::by_name(a).is_none())
    {
        panic!("CODA_LIVE_AGENTS names {unknown:?}, not one of {AGENTS:?} or {ACP_AGENTS:?}");
    }
    ACP_AGENTS.into_iter().filter(|agent| wanted(agent, what)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_coda_live_every_agent_is_skipped_installed_or_not() {
        for agent in AGENTS {
            assert!(matches!(decide(agent, false, None, || Ok(())), Decision::Skip(_)));
            assert!(matches!(decide(agent, false, None, || Err("missing".into())), Decision::Skip(_)));
        }
    }

    #[test]
    fn with_coda_live_a_missing_cli_fails_and_an_installed_one_runs() {
        assert_eq!(decide("kimi", true, None, || Ok(())), Decision::Run);
        let missing = decide("kimi", true, None, || Err("kimi is not installed".into()));
        assert_eq!(missing, Decision::Fail("CODA_LIVE is set but kimi is not installed".into()));
    }

    #[test]
    fn coda_live_agents_skips_the_others_without_looking_for_their_cli() {
        let looked = std::cell::Cell::new(false);
        let ready = || {
            looked.set(true);
            Err("missing".into())
        };
        assert!(matches!(decide("grok", true, Some("kimi, codex"), ready), Decision::Skip(_)));
        assert!(!looked.get());
        assert_eq!(decide("codex", true, Some("kimi, codex"), || Ok(())), Decision::Run);
        assert!(matches!(decide("codex", true, Some("kimi,codex"), || Err("gone".into())), Decision::Fail(_)));
    }

    #[test]
    fn an_unknown_agent_is_a_failure_not_a_skip() {
        assert!(matches!(decide("nobody", true, None, || Ok(())), Decision::Fail(_)));
    }
}

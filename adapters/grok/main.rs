//! coda-grok: Grok Build (`grok agent --no-leader stdio`) with Coda's session instruction, agentInfo, and
//! Grok's background commands and subagents as `_coda/wait` (see `activity.rs`).
//!
//! The instruction is injected into the first prompt, not passed as Grok's native `session/new`
//! `_meta.rules`: live on 1.0.41 a session made with `_meta.rules` keeps them through one `session/load` or
//! `session/resume` in a fresh process, but loses them on the second (Grok folds `rules` into the system
//! prompt only at creation), while an injected block stays in the history.

mod activity;
mod failure;

use std::path::PathBuf;
use std::time::Duration;

use coda_shim::adapter::{Adapter, Found, Setup, find_program, run_for_output};
use coda_shim::child::AgentCommand;
use coda_shim::identity::{Identity, Policy};
use coda_shim::instruction::Instruction;

const ARGS: [&str; 3] = ["agent", "--no-leader", "stdio"];
const INSTALL: &str = "npm install -g @xai-official/grok";

/// Grok's slash commands that it runs without advertising them (aliases included).
const BUILTINS: &[&str] =
    &["loop", "compact", "always-approve", "yolo", "context", "session-info", "goal", "workflow", "mem"];

/// `grok <version> (<commit>)`, optionally followed by a channel label; anything else is not Grok Build.
fn parse_version(out: &str) -> Option<String> {
    let mut words = out.lines().next()?.split_whitespace();
    let (name, version, commit) = (words.next()?, words.next()?, words.next()?);
    (name == "grok" && commit.starts_with('(')).then(|| version.to_owned())
}

fn version(cmd: &AgentCommand) -> Option<String> {
    parse_version(&run_for_output(&cmd.program, &["--version"], Duration::from_secs(10))?)
}

fn default_command() -> Result<Found, String> {
    let args = ARGS.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let home = std::env::var_os("GROK_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".grok")));
    if let Some(installed) = home.map(|h| h.join("bin/grok")).filter(|p| p.is_file()) {
        return Ok(Found { command: AgentCommand { program: installed, args }, version: None });
    }
    let Some(program) = find_program("grok") else {
        return Err(format!(
            "cannot find Grok Build: no ~/.grok/bin/grok and no `grok` on PATH; install it with: {INSTALL}"
        ));
    };
    // Debian ships an unrelated `grok`; trust one on PATH only if it says it is Grok Build.
    let out = run_for_output(&program, &["--version"], Duration::from_secs(10)).unwrap_or_default();
    match parse_version(&out) {
        Some(v) => Ok(Found { command: AgentCommand { program, args }, version: Some(v) }),
        None => Err(format!(
            "{} is not Grok Build (`grok --version` printed {:?}); install Grok Build with: {INSTALL}",
            program.display(),
            out.lines().next().unwrap_or("nothing")
        )),
    }
}

fn layers(setup: &mut Setup) {
    let probed = setup.version.clone();
    setup.add(|_| Box::new(Identity::new("grok", Policy::FillIn, probed)));
    setup.add(|_| Box::new(Instruction::new(BUILTINS)));
    setup.add(|_| Box::new(activity::GrokActivity::new()));
    // Next to Grok, like the other shims' failure answers: the instruction layer sees Coda's answer.
    setup.add(|events| Box::new(failure::GrokFailure::new(events)));
}

fn main() {
    coda_shim::main(Adapter {
        agent: "grok",
        cli_name: "Grok Build",
        install_hint: INSTALL,
        default_command,
        version,
        env_defaults: &[],
        layers,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn tells_grok_build_from_debians_grok() {
        assert_eq!(super::parse_version("grok 1.0.41 (4220f3b224a6)\n").as_deref(), Some("1.0.41"));
        assert_eq!(super::parse_version("grok 1.0.41 (4220f3b224a6) [stable]").as_deref(), Some("1.0.41"));
        assert_eq!(super::parse_version("Usage: grok [-d] -f configfile"), None);
        assert_eq!(super::parse_version(""), None);
    }
}

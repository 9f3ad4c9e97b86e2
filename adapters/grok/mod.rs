//! coda-grok: Grok Build (`grok agent --no-leader stdio`) with Coda's session instruction, agentInfo, and
//! Grok's background commands and subagents as `_coda/wait` (see `activity.rs`), and Coda's steering through
//! Grok's `_x.ai/interject` (see `steering.rs`), Coda's `_coda/session/compact` through Grok's
//! `_x.ai/compact_conversation` (see `compact.rs`), and usage facts Grok does not send (see `usage.rs`).
//!
//! The instruction is injected into the first prompt, not passed as Grok's native `session/new`
//! `_meta.rules`: live on 1.0.41 a session made with `_meta.rules` keeps them through one `session/load` or
//! `session/resume` in a fresh process, but loses them on the second (Grok folds `rules` into the system
//! prompt only at creation), while an injected block stays in the history.

pub mod activity;
pub mod compact;
pub mod failure;
pub mod steering;
pub mod usage;

use std::path::PathBuf;
use std::time::Duration;

use crate::child::AgentCommand;
use crate::cli::adapter::{Adapter, DataHome, SessionFiles, Setup, Tested};
use crate::cli::locate::{self, Place};
use crate::cli::program::{FindError, Found, not_found, run_for_output};
use crate::coda::identity::{Identity, Policy};
use crate::coda::instruction::Instruction;

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

/// Grok's own install folder (`$GROK_HOME/bin`, else `~/.grok/bin`): where its installer and its npm package's
/// postinstall put `grok`, so it is looked at before PATH.
fn own_place() -> Vec<Place> {
    let home = std::env::var_os("GROK_HOME").filter(|h| !h.is_empty()).map(|h| (PathBuf::from(h), "$GROK_HOME/bin"));
    let home = home.or_else(|| std::env::var_os("HOME").map(|h| (PathBuf::from(h).join(".grok"), "~/.grok/bin")));
    home.map(|(dir, name)| Place::new(dir.join("bin"), format!("Grok's own install folder ({name}), looked at first")))
        .into_iter()
        .collect()
}

fn default_command() -> Result<Found, FindError> {
    let args = ARGS.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let own = own_place();
    let mut refused = None;
    for found in locate::with_process_env(|env| locate::candidates("grok", &own, env)) {
        if own.iter().any(|p| found.path.parent() == Some(p.dir.as_path())) {
            let command = AgentCommand { program: found.path, args };
            return Ok(Found { command, version: None, how: found.how });
        }
        // Debian ships an unrelated `grok`; trust one elsewhere only if it says it is Grok Build.
        let out = run_for_output(&found.path, &["--version"], Duration::from_secs(10)).unwrap_or_default();
        match parse_version(&out) {
            Some(v) => {
                let command = AgentCommand { program: found.path, args };
                return Ok(Found { command, version: Some(v), how: found.how });
            }
            None => {
                tracing::info!("{} is not Grok Build; looking further", found.path.display());
                refused.get_or_insert((found.path, out));
            }
        }
    }
    Err(match refused {
        Some((program, out)) => FindError::WrongProgram(format!(
            "{} is not Grok Build (`grok --version` printed {:?}); install Grok Build with: {INSTALL}",
            program.display(),
            out.lines().next().unwrap_or("nothing")
        )),
        None => not_found("grok", "Grok Build", &own, INSTALL),
    })
}

/// The stack. Set-up, like all of this file (the layers are not): the environment (Grok's home, the retry
/// patience) is read here, once; the layers get values.
fn layers(setup: &mut Setup) {
    layers_over(setup, Some(adapter().data_home.dir()));
}

/// [`layers`] over Grok's data folder `home` (where a loaded session's facts are; None: none are read).
fn layers_over(setup: &mut Setup, home: Option<PathBuf>) {
    let probed = setup.version.clone();
    setup.add(|_| Box::new(Identity::new("grok", Policy::FillIn, probed)));
    setup.add(|_| Box::new(Instruction::new(BUILTINS)));
    // Holds a compacting session's prompts after the instruction went into them.
    setup.add(|_| Box::new(crate::coda::compact::Compaction::new(compact::GrokCompact::new())));
    setup.add(|_| Box::new(activity::GrokActivity::new()));
    let record = setup.log("CODA_GROK_RECORD");
    setup.add(|_| Box::new(usage::layer(home, record)));
    // Above the failure layer: it sees the turn's end as Coda will.
    setup.add(|_| Box::new(crate::coda::steering::Steering::new(steering::GrokSteering::new())));
    // Next to Grok, like the other shims' failure answers: the instruction layer sees Coda's answer.
    let patience = crate::coda::failure::retry_patience();
    setup.add(move |_| Box::new(failure::layer(patience)));
}

/// coda-grok's stack over Grok's data folder `home` (a test's; None: nothing is read at load).
#[cfg(test)]
pub(crate) fn test_stack(
    command: &AgentCommand,
    home: Option<PathBuf>,
) -> (crate::layer::Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>) {
    crate::cli::adapter::stack_with(command, None, |setup| layers_over(setup, home))
}

/// What `coda-grok` is: the CLI it wraps, how it finds it, and its layers.
pub fn adapter() -> Adapter {
    Adapter {
        agent: "grok",
        cli_name: "Grok Build",
        install_hint: INSTALL,
        tested: Tested {
            what: "Grok Build",
            version: "1.0.41",
            package: Some("@xai-official/grok"),
            install: "npm install -g @xai-official/grok@1.0.41",
        },
        also_tested: &[],
        data_home: DataHome { var: "GROK_HOME", default: ".grok", sub: "" },
        session_files: Some(SessionFiles { ignored: &[] }),
        login_hint: "set XAI_API_KEY, or sign in with `grok`",
        default_command: &default_command,
        version: &version,
        // Grok asks the model for a one-line summary after every turn (`last_turn_summary`, unused by Coda);
        // with it off a turn costs one request (plus the session title on the first).
        env_defaults: &[("GROK_TURN_SUMMARY", "0")],
        layers: &layers,
        manifest_args: &[],
    }
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

    /// coda-grok's whole stack, initialised, with Grok's session `g`.
    fn with_session_g() -> crate::layer::testing::Harness {
        use crate::cli::adapter::{harness, nowhere};
        use serde_json::json;
        let mut h = harness(&nowhere(Some("1.0.41")), super::adapter().layers);
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"g"}}));
        h
    }

    /// Grok's own turn (a queue naming a running prompt of its own) refuses a compaction in coda-grok's stack,
    /// and its end lets one go to Grok: the steering layer, below the compaction layer, tells the session table
    /// what each queue says, for both.
    #[test]
    fn a_turn_of_groks_own_refuses_a_compaction_in_the_whole_stack() {
        use serde_json::json;
        let mut h = with_session_g();
        h.take();
        let queue = |running: Option<&str>| {
            let mut params = json!({"sessionId":"g","entries":[]});
            if let Some(running) = running {
                params["runningPromptId"] = json!(running);
                params["runningText"] = json!("<task-notification>t1 done</task-notification>");
            }
            json!({"jsonrpc":"2.0","method":"_x.ai/queue/changed","params":params})
        };
        h.from_agent(queue(Some("task-completed-t1")));
        h.take();
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"_coda/session/compact","params":{"sessionId":"g"}}));
        let refused = h.to_client();
        assert_eq!(refused[0]["result"], json!({"compacted":false,"reason":crate::coda::compact::TURN_RUNNING}));
        assert!(h.to_agent().is_empty());
        h.from_agent(queue(None));
        h.take();
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"_coda/session/compact","params":{"sessionId":"g"}}));
        assert_eq!(h.to_agent()[0]["method"], "_x.ai/compact_conversation", "idle again");
    }

    #[test]
    fn chunks_go_through_the_whole_stack_untouched_and_output_still_ends_a_retry() {
        use crate::cli::adapter::{bytes_of, chunks, stream};
        use serde_json::json;
        let mut h = with_session_g();
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"g","prompt":[]}}));
        h.take();
        // Plain, and stamped as Grok stamps them (the usage layer reads those, and passes them on).
        let stamps = json!({"agentTimestampMs": 1_796_186_852_464_u64, "streamStartMs": 1_796_186_852_464_u64,
            "turnStartMs": 1_796_186_848_405_u64});
        let turn = [chunks("g", 20, &json!({})), chunks("g", 20, &stamps)].concat();
        assert_eq!(stream(&mut h, &turn), bytes_of(&turn));
        // A retry, then output: the attempt went through, so the turn is not stopped later.
        let retry = json!({"jsonrpc":"2.0","method":"_x.ai/session_notification","params":{"sessionId":"g",
            "update":{"sessionUpdate":"retry_state","type":"retrying","attempt":1,"max_retries":15,
            "reason":"API error (status 503 Service Unavailable): busy"}}});
        let after = chunks("g", 3, &json!({}));
        let sent = [vec![retry.clone()], after].concat();
        assert_eq!(stream(&mut h, &sent), bytes_of(&sent));
        let patience = crate::coda::failure::retry_patience();
        h.advance(patience);
        assert!(h.to_agent().is_empty(), "output ended the retry");
        // Retries with no output are stopped.
        assert_eq!(stream(&mut h, std::slice::from_ref(&retry)), bytes_of(&[retry]));
        h.advance(patience);
        assert_eq!(h.to_agent()[0]["method"], "session/cancel");
    }
}

//! coda-codex: Codex through `codex-acp` (npm `@agentclientprotocol/codex-acp`), reporting Codex's identity,
//! its AIR subagents and background commands as `_coda/wait`, failed turns as Coda's failure kinds, its
//! automatic approval reviews as `_meta.coda.review` on the judged call, `_coda/session/compact` through
//! Codex's `/compact`, and usage facts on its `usage_update`s.
//! codex-acp >= 2.3 accepts `systemPrompt` itself, so the instruction layer passes it through; older or
//! other builds get the first-prompt injection.

pub mod air;
pub mod compact;
pub mod failure;
pub mod review;
pub mod usage;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::child::AgentCommand;
use crate::cli::adapter::{Adapter, DataHome, SessionFiles, Setup, Tested};
use crate::cli::program::{FindError, Found, installed, run_for_output};
use crate::coda::identity::{Identity, Policy, Probed};
use crate::coda::instruction::Instruction;
use crate::layer::AnyLayer;
use jiff::tz::TimeZone;

/// Longest the initialize answer waits for the version probe when it is slower than codex-acp's start.
const VERSION_DEADLINE: Duration = Duration::from_millis(1000);
/// Longest a version probe may run (`--version` waits for it; initialize only [`VERSION_DEADLINE`]).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
const INSTALL: &str = "npm install -g @agentclientprotocol/codex-acp";
/// The newer Codex CLI tested through `CODEX_PATH`.
const INSTALL_171: &str = "npm install -g @openai/codex@0.171.0, then CODEX_PATH=<its codex binary>";

/// The tested codex-acp, which brings the tested Codex CLI with it.
const INSTALL_TESTED: &str = "npm install -g @agentclientprotocol/codex-acp@2.6.0";

fn default_command() -> Result<Found, FindError> {
    installed("codex-acp", &[], "codex-acp", INSTALL)
}

/// The Codex CLI version codex-acp runs: `$CODEX_PATH -V`, else the `@openai/codex` package installed
/// beside codex-acp (read, not run), else what `codex-acp cli -V` says (any install shape: pnpm's and
/// volta's shims, a wrapper script, `npx`; about as slow as codex-acp's own start, which it runs beside).
fn version(cmd: &AgentCommand) -> Option<String> {
    if let Some(codex) = std::env::var_os("CODEX_PATH") {
        let out = run_for_output(Path::new(&codex), &["-V"], PROBE_TIMEOUT)?;
        return out.split_whitespace().last().map(str::to_owned);
    }
    package_version(cmd).or_else(|| asked_version(cmd))
}

/// `codex-acp`, or `node <codex-acp script>`: Codex is the `@openai/codex` that script resolves.
fn package_version(cmd: &AgentCommand) -> Option<String> {
    let script = std::iter::once(cmd.program.as_path())
        .chain(cmd.args.first().map(Path::new))
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .find(|p| p.ancestors().any(|d| d.ends_with("node_modules")))?;
    script.ancestors().skip(1).find_map(|dir| codex_package_version(&dir.join("node_modules/@openai/codex")))
}

/// The command with `cli -V` after its arguments: codex-acp runs its Codex CLI, which prints
/// `codex-cli 0.166.0`. Anything else printed is no version.
fn asked_version(cmd: &AgentCommand) -> Option<String> {
    let args: Vec<&str> = cmd.args.iter().map(String::as_str).chain(["cli", "-V"]).collect();
    let out = run_for_output(&cmd.program, &args, PROBE_TIMEOUT)?;
    out.lines()
        .find_map(|l| l.trim().strip_prefix("codex-cli "))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c)))
}

fn codex_package_version(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("package.json")).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value.get("version")?.as_str().map(str::to_owned)
}

/// The stack. Set-up, like all of this file (the layers are not): the clock (the probe's deadline), the time
/// zone, the environment and the CLI's version (on a thread started here, unless the set-up was handed it) are
/// read here, once; the layers get values.
fn layers(setup: &mut Setup) {
    layers_over(setup, Some(adapter().data_home.dir()));
}

/// [`layers`] over Codex's data folder `home` (where a loaded session's facts are; None: none are read).
fn layers_over(setup: &mut Setup, home: Option<std::path::PathBuf>) {
    let command = setup.command.clone();
    let known = setup.version.clone();
    let give_up_at = Instant::now() + VERSION_DEADLINE;
    setup.add(move |events| {
        if known.is_some() {
            // Known already (found with the command, or given by a test's set-up): nothing to probe.
            return Box::new(Identity::new("codex", Policy::Replace, known));
        }
        // Found while codex-acp starts, so the initialize answer never waits for it.
        let probe = std::thread::Builder::new().name("codex-version".into()).spawn({
            let events = events.clone();
            move || {
                events.send(Probed(version(&command)));
            }
        });
        if let Err(e) = probe {
            tracing::warn!("cannot look for the Codex CLI version: {e}");
            events.send(Probed(None));
        }
        // codex-acp names itself (its npm package) in agentInfo; Coda is to see the Codex CLI.
        Box::new(Identity::awaiting("codex", Policy::Replace, give_up_at))
    });
    let usage = usage::layer(home, setup.log("CODA_CODEX_RECORD"));
    for layer in below_identity(TimeZone::system(), crate::coda::failure::retry_patience(), usage) {
        setup.push(layer);
    }
}

/// Codex's layers under its identity layer, nearest the client first: the binary's, and the replays'.
/// `zone` is the one Codex writes local times in (the machine's: read once, at set-up); `patience` how long Codex
/// may retry a turn (`coda::failure`); `usage` the usage facts layer (over Codex's data folder, where a loaded
/// session's facts are).
pub fn below_identity(zone: TimeZone, patience: Duration, usage: usage::Usage) -> Vec<Box<dyn AnyLayer>> {
    vec![
        Box::new(air::Air::new()),
        Box::new(failure::layer(zone, patience)),
        Box::new(review::CodexReview::new()),
        Box::new(Instruction::new(&[])),
        // Steering is codex-acp's own (`_session/steering`; the AIR layer asks it for `promptRequired`): the
        // machine keeps Coda's rules around it.
        Box::new(crate::coda::steering::Steering::new(CodexSteering)),
        // Below the instruction layer, so that its `/compact` is never the prompt an instruction joins.
        Box::new(crate::coda::compact::Compaction::new(compact::codex_compact())),
        Box::new(usage),
    ]
}

/// coda-codex's stack over Codex's data folder `home` (a test's; None: nothing is read at load), handed the
/// tested version as the simulator hands it: on the paused clock of [`crate::relay::testing`] no probe may run on a
/// thread of its own (its event would come at whatever virtual time the thread got the CPU).
#[cfg(test)]
pub(crate) fn test_stack(
    command: &AgentCommand,
    home: Option<std::path::PathBuf>,
) -> (crate::layer::Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>) {
    let version = Some(adapter().tested.version.to_owned());
    crate::cli::adapter::stack_with(command, version, |setup| layers_over(setup, home))
}

/// codex-acp takes `_session/steering` itself.
pub struct CodexSteering;

impl crate::coda::steering::Steerer for CodexSteering {
    type Event = std::convert::Infallible;
    type Reply = std::convert::Infallible;
    type Timer = std::convert::Infallible;
    const NATIVE: bool = true;

    /// Nothing from codex-acp is read here (the machine reads the answers it keeps the rules around).
    fn ignores(&self, _frame: &crate::frame::Frame) -> bool {
        true
    }
}

/// What `coda-codex` is: the CLI it wraps, how it finds it, and its layers.
pub fn adapter() -> Adapter {
    Adapter {
        agent: "codex",
        cli_name: "codex-acp",
        install_hint: INSTALL,
        // What answers is the Codex CLI that codex-acp runs (its version is found by `version`, not by a
        // package beside the command); codex-acp itself is checked where its package is found.
        tested: Tested { what: "Codex CLI", version: "0.166.0", package: None, install: INSTALL_TESTED },
        also_tested: &[
            Tested {
                what: "codex-acp",
                version: "2.6.0",
                package: Some("@agentclientprotocol/codex-acp"),
                install: INSTALL_TESTED,
            },
            // codex-acp 2.6.0 pins ^0.166.0; a newer Codex CLI runs through `CODEX_PATH` (checked live).
            Tested { what: "Codex CLI", version: "0.171.0", package: None, install: INSTALL_171 },
        ],
        data_home: DataHome { var: "CODEX_HOME", default: ".codex", sub: "" },
        // The rollout file a load reads (`CODA_CODEX_RECORD` logs it for recordings); Codex writes nothing else the
        // shim reads.
        session_files: Some(SessionFiles { ignored: &[] }),
        login_hint: "run `codex-acp login`, or set OPENAI_API_KEY",
        default_command: &default_command,
        version: &version,
        // codex-acp asks the model for a suggested next message after every turn of an AIR client, at effort
        // `high`, paid from the user's quota; Coda never shows it (`session_info_update._meta.promptSuggestions`).
        env_defaults: &[("INITIAL_AGENT_MODE", "read-only"), ("CODEX_ACP_PROMPT_SUGGESTIONS", "false")],
        layers: &layers,
        manifest_args: &[],
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::adapter::{bytes_of, chunks, harness, nowhere, stream};
    use serde_json::json;

    #[test]
    fn a_version_handed_to_the_set_up_is_not_probed_for() {
        let mut h = harness(&nowhere(Some("0.166.0")), super::adapter().layers);
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,
            "agentInfo":{"name":"@agentclientprotocol/codex-acp","version":"2.6.0"}}}));
        // At once: no wait for a probe.
        assert_eq!(h.to_client()[0]["result"]["agentInfo"], json!({"name":"codex","version":"0.166.0"}));
    }

    #[test]
    fn chunks_go_through_the_whole_stack_untouched_unless_a_layer_holds_or_drops_them() {
        let mut h = harness(&nowhere(None), super::adapter().layers);
        let caps = json!({"_meta": {"coda": {"waits": {}}}});
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":caps}}));
        h.to_agent();
        // The version probe is not handed in: the answer waits for it, and the chunks behind the answer too.
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}));
        let early = chunks("s", 2, &json!({}));
        assert!(stream(&mut h, &early).is_empty(), "held behind the initialize answer");
        h.advance(super::VERSION_DEADLINE);
        let out: Vec<Vec<u8>> = h.take().to_client.iter().map(|f| f.bytes().to_vec()).collect();
        assert_eq!(out.len(), 3, "the answer, then the chunks");
        assert_eq!(out[1..], bytes_of(&early));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}));
        h.take();
        // While the shim's `/compact` runs, what Codex streams for it is dropped.
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"_coda/session/compact","params":{"sessionId":"s"}}));
        let own = h.to_agent().pop().expect("the shim's /compact");
        assert_eq!(own["params"]["prompt"][0]["text"], "/compact");
        assert!(stream(&mut h, &chunks("s", 4, &json!({}))).is_empty(), "the compaction's output is no turn");
        h.from_agent(json!({"jsonrpc":"2.0","id":own["id"],"result":{"stopReason":"end_turn"}}));
        assert_eq!(h.to_client()[0]["id"], 2, "Coda's compaction is answered");
        // A turn's chunks reach the client as Codex sent them.
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}));
        h.take();
        let turn = chunks("s", 40, &json!({"k": 1}));
        assert_eq!(stream(&mut h, &turn), bytes_of(&turn));
    }
}

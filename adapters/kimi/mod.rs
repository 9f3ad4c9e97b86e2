//! coda-kimi's adapter: what it wraps (`kimi acp`), how it finds it, and the layers it stacks.
//!
//! Kimi Code CLI with Coda's session instruction, Kimi's background tasks and subagents (from its session
//! files) as `_coda/wait`, its failed turns as Coda's failure kinds, `_coda/session/compact` through its
//! `/compact`, and Coda's usage facts from its wire.

pub mod activity;
pub mod compact;
pub mod events;
pub mod facts;
pub mod failure;
pub mod feed;
pub mod record;
pub mod title;
pub mod translate;
pub mod usage;
pub mod watch;
pub mod wire;

use crate::cli::adapter::{Adapter, DataHome, SessionFiles, Setup, Tested};
use crate::cli::program::{FindError, Found, installed, plain_version};
use crate::coda::instruction::Instruction;

const INSTALL: &str = "npm install -g @moonshot-ai/kimi-code (needs Node >= 22.19)";

/// Kimi runs these locally whether or not the latest command list names them (no turn).
pub const BUILTINS: &[&str] = &["compact", "status", "usage", "mcp", "tasks", "help"];

fn default_command() -> Result<Found, FindError> {
    installed("kimi", &["acp"], "Kimi Code CLI", INSTALL)
}

/// The environment is read here, once: the layers get what it says.
fn layers(setup: &mut Setup) {
    let root = watch::data_root(|name| setup.var_os(name));
    let logs = activity::Logs {
        record: setup.log("CODA_KIMI_RECORD"),
        took: setup.log("CODA_KIMI_TOOK"),
        driven: setup.part::<watch::Driven>().cloned(),
    };
    stack(setup, root, logs);
}

/// The layers over Kimi's data root `root`, with the logs `logs`.
fn stack(setup: &mut Setup, root: Option<std::path::PathBuf>, logs: activity::Logs) {
    let history = root.clone();
    stack_with_tap(setup, root, history, logs, facts::Tap::default());
}

/// coda-kimi's stack over no data root, whose wire records a test hands in through `tap` (no watch starts);
/// a loaded session's history is read under `history`.
#[cfg(test)]
pub(crate) fn test_stack(
    command: &crate::child::AgentCommand,
    tap: facts::Tap,
    history: Option<std::path::PathBuf>,
) -> (crate::layer::Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>) {
    crate::cli::adapter::stack_with(command, None, |setup| {
        stack_with_tap(setup, None, history, Default::default(), tap)
    })
}

/// [`stack`], the wire records of each scan going to the layers on `tap`, a loaded session's history read under
/// `history`.
fn stack_with_tap(
    setup: &mut Setup,
    root: Option<std::path::PathBuf>,
    history: Option<std::path::PathBuf>,
    logs: activity::Logs,
    tap: facts::Tap,
) {
    // Kimi reports its own agentInfo ("Kimi Code CLI", version): kept as it is.
    setup.add(|_| Box::new(Instruction::new(BUILTINS)));
    // Below the instruction layer: sees the prompt that carries the block, and Kimi's titles before the strip.
    let first_prompt = title::first_prompt_from_files(root.clone());
    setup.add(|_| Box::new(title::Title::new(first_prompt)));
    // The activity layer hands the main agent's failure, usage and compaction records of each scan of the watch
    // it starts to the layers below it (next to Kimi, so Kimi's frames reach them first).
    setup.add(|events| Box::new(activity::Activity::new(events, root, logs, tap.clone())));
    setup.add(|events| {
        tap.add(events);
        Box::new(crate::coda::compact::Compaction::new(compact::KimiCompact::new()))
    });
    // Failure kinds from the wire's turn ends and retries, below every layer that holds prompts (the activity
    // layer's, the compaction's): it sees the prompts Kimi was really sent, and only Kimi's answers to them wait
    // for their turn's end (a prompt the compaction answered `cancelled` never reached Kimi, and its wire will
    // show no turn of it). Kimi's answers reach it before the activity layer, which then sees the answer Coda
    // gets.
    let patience = crate::coda::failure::retry_patience();
    setup.add(|events| {
        tap.add(events);
        Box::new(failure::layer(patience))
    });
    setup.add(|events| {
        tap.add(events);
        Box::new(usage::layer(history))
    });
}

/// What `coda-kimi` is: the CLI it wraps, how it finds it, and its layers.
pub fn adapter() -> Adapter {
    Adapter {
        agent: "kimi",
        cli_name: "Kimi Code CLI",
        install_hint: INSTALL,
        tested: Tested {
            what: "Kimi Code CLI",
            version: "2.1.0",
            package: Some("@moonshot-ai/kimi-code"),
            install: "npm install -g @moonshot-ai/kimi-code@2.1.0",
        },
        also_tested: &[],
        data_home: DataHome { var: "KIMI_CODE_HOME", default: ".kimi-code", sub: "" },
        // The shim watches the session files; Kimi's index markers and logs it never reads.
        session_files: Some(SessionFiles { ignored: &["/.index-dirty/", "/logs/"] }),
        login_hint: "run `kimi login`",
        default_command: &default_command,
        version: &plain_version,
        env_defaults: &[],
        layers: &layers,
        manifest_args: &[],
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::adapter::{bytes_of, chunks, harness, nowhere, stream};
    use serde_json::json;

    #[test]
    fn chunks_go_through_the_whole_stack_untouched_unless_the_shims_compaction_drops_them() {
        // A data root without the session: its activity is not reported, and nothing outside the test is read.
        let root = tempfile::tempdir().unwrap();
        let found = nowhere(None);
        let mut h = harness(&found, |s| super::stack(s, Some(root.path().to_path_buf()), Default::default()));
        h.from_client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"k"}}));
        assert_eq!(h.to_client().len(), 2, "both answers");
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"k","prompt":[]}}));
        h.take();
        // The first ends the prompt's quiet (the activity layer reads it), the rest no layer reads.
        let turn = chunks("k", 40, &json!({}));
        assert_eq!(stream(&mut h, &turn), bytes_of(&turn));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        assert_eq!(h.to_client()[0]["id"], 2);
        // While the shim's `/compact` runs, what Kimi streams for it is dropped.
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"_coda/session/compact","params":{"sessionId":"k"}}));
        assert_eq!(h.to_agent()[0]["params"]["prompt"][0]["text"], "/compact");
        assert!(stream(&mut h, &chunks("k", 4, &json!({}))).is_empty(), "the compaction's output is no turn");
    }
}

//! coda-opencode: OpenCode (`opencode acp`) with Coda's session instruction and its subagents as
//! `_coda/wait` (see `activity.rs`).
//!
//! The instruction block is marked `annotations.audience: ["assistant"]`: OpenCode stores it as a synthetic
//! part that still reaches the model and comes back marked on `session/load` (checked live on 1.18.33).

mod activity;

use coda_shim::adapter::{Adapter, Found, Setup, on_path, plain_version};
use coda_shim::instruction::Instruction;

const INSTALL: &str = "npm install -g opencode-ai";

/// OpenCode runs `/compact` without advertising it.
const BUILTINS: &[&str] = &["compact"];

fn default_command() -> Result<Found, String> {
    on_path("opencode", &["acp"], "OpenCode", INSTALL)
}

fn layers(setup: &mut Setup) {
    // OpenCode reports its own agentInfo ("OpenCode", version): kept as it is.
    setup.add(|_| Box::new(Instruction::new(BUILTINS).with_audience(&["assistant"])));
    setup.add(|events| Box::new(activity::OpenCodeActivity::new(events)));
}

fn main() {
    coda_shim::main(Adapter {
        agent: "opencode",
        cli_name: "OpenCode",
        install_hint: INSTALL,
        default_command,
        version: plain_version,
        env_defaults: &[],
        layers,
    })
}

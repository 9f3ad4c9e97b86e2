//! coda-opencode: OpenCode (`opencode acp`) with Coda's session instruction.

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
    setup.add(|_| Box::new(Instruction::new(BUILTINS)));
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

//! Codex (codex-acp): its pinned package, its hermetic config, and the tools its model requests offer.

use super::spec::{Cli, MODEL, Setup, Tools, nothing_else, path_string, write};

use crate::paths::which_node;

pub const CLI: Cli = Cli {
    name: "codex",
    package: "@agentclientprotocol/codex-acp",
    version: "2.6.0",
    program: "@agentclientprotocol/codex-acp/dist/index.js",
    ready: nothing_else,
    setup,
    tools: Tools {
        shell: &["exec_command"],
        // Multi-agent v2 (the live config turns it on).
        spawn: &["spawn_agent"],
        // v2, v1.
        followup: &["followup_task", "send_input"],
        side_phrases: &["generate a very short title", "app-generated request"],
    },
};

fn setup(s: &mut Setup) -> std::io::Result<()> {
    let codex_home = s.home.join(".codex");
    write(&codex_home.join("config.toml"), &config(s.base_url))?;
    s.set("CODEX_HOME", path_string(&codex_home));
    // codex-acp is a Node script; it runs the bundled Codex binary itself.
    let script = path_string(&s.program);
    s.args.push(script);
    s.program = which_node();
    Ok(())
}

fn config(base_url: &str) -> String {
    format!(
        r#"model = "{MODEL}"
model_provider = "fake"
check_for_update_on_startup = false

[model_providers.fake]
name = "Fake local"
base_url = "{base_url}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[features]
multi_agent_v2 = true

[analytics]
enabled = false

[feedback]
enabled = false
"#
    )
}

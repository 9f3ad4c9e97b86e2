//! Grok Build: its pinned package, its hermetic config, and the tools its model requests offer.

use super::spec::{Cli, MODEL, Setup, Tools, nothing_else, path_string, write};

pub const CLI: Cli = Cli {
    name: "grok",
    package: "@xai-official/grok",
    version: "1.0.41",
    program: "@xai-official/grok/bin/grok",
    ready: nothing_else,
    setup,
    tools: Tools {
        shell: &["run_terminal_command"],
        spawn: &["spawn_subagent"],
        followup: &[],
        // Its session title, its turn summary.
        side_phrases: &["generating the session title", "ultra-short dashboard line"],
    },
};

fn setup(s: &mut Setup) -> std::io::Result<()> {
    let grok_home = s.home.join(".grok");
    write(&grok_home.join("config.toml"), &config(s.base_url))?;
    s.set("GROK_HOME", path_string(&grok_home));
    for (key, value) in [
        ("GROK_DISABLE_AUTOUPDATER", "1"),
        ("GROK_TELEMETRY_ENABLED", "0"),
        ("GROK_FEEDBACK_ENABLED", "0"),
        ("GROK_TELEMETRY_TRACE_UPLOAD", "0"),
    ] {
        s.set(key, value);
    }
    s.args = ["agent", "--no-leader", "stdio"].map(String::from).to_vec();
    Ok(())
}

fn config(base_url: &str) -> String {
    format!(
        r#"[cli]
auto_update = false

[features]
telemetry = false
feedback = false
remote_fetch = false

[models]
default = "fake"

[model.fake]
model = "{MODEL}"
base_url = "{base_url}"
name = "Fake Local"
api_key = "dummy"
context_window = 32000
"#
    )
}

//! Gemini CLI: its pinned package, its hermetic settings (its own API through `GOOGLE_GEMINI_BASE_URL`, a pinned
//! model so that it asks no router model first, telemetry and auto-update off) and its tool names.

use super::spec::{Cli, MODEL, Setup, Tools, nothing_else, path_string, write};

use crate::paths::which_node;

pub const CLI: Cli = Cli {
    name: "gemini",
    package: "@google/gemini-cli",
    version: "0.61.0",
    program: "@google/gemini-cli/bundle/gemini.js",
    ready: nothing_else,
    setup,
    tools: Tools { shell: &["run_shell_command"], spawn: &[], followup: &[], side_phrases: &[] },
};

fn setup(s: &mut Setup) -> std::io::Result<()> {
    write(&s.home.join(".gemini/settings.json"), &settings())?;
    s.set("GEMINI_API_KEY", "fake-key");
    // Gemini adds `/v1beta/models/…` itself.
    s.set("GOOGLE_GEMINI_BASE_URL", s.base_url.trim_end_matches("/v1"));
    s.set("GEMINI_CLI_TRUST_WORKSPACE", "true");
    s.args = vec![path_string(&s.program), "--acp".into()];
    s.program = which_node();
    Ok(())
}

fn settings() -> String {
    let settings = serde_json::json!({
        "security": {"auth": {"selectedType": "gateway"}},
        "model": {"name": MODEL},
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
    });
    serde_json::to_string_pretty(&settings).unwrap_or_default()
}

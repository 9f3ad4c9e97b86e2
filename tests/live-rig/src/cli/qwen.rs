//! Qwen Code: its pinned package (run with the Node 22 installed beside it), its hermetic settings (OpenAI-compatible
//! endpoint, a known context window, telemetry and auto-update off) and its tool names.

use std::path::Path;

use super::spec::{Cli, MODEL, Setup, Tools, path_string, write};

use crate::paths::node22_of;

pub const CLI: Cli = Cli {
    name: "qwen",
    package: "@qwen-code/qwen-code",
    version: "0.24.4",
    program: "@qwen-code/qwen-code/cli-entry.js",
    ready,
    setup,
    tools: Tools {
        shell: &["run_shell_command"],
        spawn: &["agent"],
        followup: &[],
        // Its memory extraction after each turn (a side request that carries the whole conversation).
        side_phrases: &["managed memory extraction subagent"],
    },
};

fn ready() -> Result<(), String> {
    if node22_of("qwen").is_file() { Ok(()) } else { Err("Node 22 for qwen is missing".into()) }
}

fn setup(s: &mut Setup) -> std::io::Result<()> {
    write(&s.home.join(".qwen/settings.json"), &settings())?;
    s.set("OPENAI_API_KEY", "sk-fake");
    s.set("OPENAI_BASE_URL", s.base_url);
    s.set("OPENAI_MODEL", MODEL);
    // Qwen Code relaunches itself as a child Node process: keep Node 22 first on PATH for it.
    s.prepend_path(node22_of("qwen").parent().unwrap_or(Path::new("/")));
    s.args = vec![path_string(&s.program), "--acp".into()];
    s.program = node22_of("qwen");
    Ok(())
}

/// Without a known context window Qwen sends no `usage_update`.
fn settings() -> String {
    let settings = serde_json::json!({
        "security": {"auth": {"selectedType": "openai"}},
        // Ask before edits and commands (its default `auto` asks an LLM classifier first).
        "tools": {"approvalMode": "default"},
        "model": {"name": MODEL, "generationConfig": {"contextWindowSize": 32000}},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"enableAutoUpdate": false, "disableAutoUpdate": true, "disableUpdateNag": true},
    });
    serde_json::to_string_pretty(&settings).unwrap_or_default()
}

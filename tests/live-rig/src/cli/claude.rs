//! Claude Agent ACP: its pinned package (run with the Node 22 installed beside it; it runs the Claude Code binary
//! of its SDK), its hermetic set-up (Anthropic's Messages API through `ANTHROPIC_BASE_URL`, telemetry, error
//! reports, auto-update and other non-essential traffic off) and its tool names.

use std::path::Path;

use super::spec::{Cli, MODEL, Setup, Tools, path_string, write};

use crate::paths::node22_of;

pub const CLI: Cli = Cli {
    name: "claude",
    package: "@agentclientprotocol/claude-agent-acp",
    version: "0.101.0",
    program: "@agentclientprotocol/claude-agent-acp/dist/index.js",
    ready,
    setup,
    tools: Tools { shell: &["Bash"], spawn: &["Agent"], followup: &["SendMessage"], side_phrases: &[] },
};

fn ready() -> Result<(), String> {
    if node22_of("claude").is_file() { Ok(()) } else { Err("Node 22 for claude is missing".into()) }
}

fn setup(s: &mut Setup) -> std::io::Result<()> {
    let config = s.home.join(".claude");
    // `defaultMode: default` asks before edits and commands (its `auto` asks a classifier model first).
    write(
        &config.join("settings.json"),
        r#"{"autoUpdates": false, "includeCoAuthoredBy": false, "permissions": {"defaultMode": "default"}}"#,
    )?;
    s.set("CLAUDE_CONFIG_DIR", path_string(&config));
    // The SDK's client adds `/v1/messages` itself.
    s.set("ANTHROPIC_BASE_URL", s.base_url.trim_end_matches("/v1"));
    s.set("ANTHROPIC_API_KEY", "sk-ant-fake");
    s.set("ANTHROPIC_MODEL", MODEL);
    s.set("ANTHROPIC_SMALL_FAST_MODEL", MODEL);
    for (key, value) in [
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_ERROR_REPORTING", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("DISABLE_BUG_COMMAND", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ] {
        s.set(key, value);
    }
    s.prepend_path(node22_of("claude").parent().unwrap_or(Path::new("/")));
    s.args = vec![path_string(&s.program)];
    s.program = node22_of("claude");
    Ok(())
}

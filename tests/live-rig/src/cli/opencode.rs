//! OpenCode: its pinned package, its hermetic config, and the tools its model requests offer.

use super::spec::{Cli, MODEL, Setup, Tools, nothing_else, write};

pub const CLI: Cli = Cli {
    name: "opencode",
    package: "opencode-ai",
    version: "1.18.33",
    program: "opencode-ai/bin/opencode.exe",
    ready: nothing_else,
    setup,
    tools: Tools { shell: &["bash"], spawn: &["task"], followup: &[], side_phrases: &["you are a title generator"] },
};

fn setup(s: &mut Setup) -> std::io::Result<()> {
    let config = s.home.join(".config/opencode/opencode.json");
    write(&config, &opencode_config(s.base_url))?;
    for (key, value) in [
        ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
        ("OPENCODE_DISABLE_AUTOUPDATE", "1"),
        ("OPENCODE_DISABLE_SHARE", "1"),
        ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1"),
        ("OPENCODE_DISABLE_CLAUDE_CODE", "1"),
        ("OPENCODE_DISABLE_EXTERNAL_SKILLS", "1"),
        // Lets the model start subagents in the background (the `task` tool's `background`).
        ("OPENCODE_EXPERIMENTAL_BACKGROUND_SUBAGENTS", "true"),
    ] {
        s.set(key, value);
    }
    s.args = vec!["acp".into()];
    Ok(())
}

fn opencode_config(base_url: &str) -> String {
    let config = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": false,
        "share": "disabled",
        "model": format!("fake/{MODEL}"),
        "small_model": format!("fake/{MODEL}"),
        "provider": {"fake": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Fake Local",
            "options": {"baseURL": base_url, "apiKey": "dummy"},
            "models": {MODEL: {"name": "Fake Model", "limit": {"context": 32000, "output": 4096}}}
        }}
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

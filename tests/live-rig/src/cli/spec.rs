//! What the rig holds for one CLI ([`Cli`], [`Tools`]) and what its set-up function fills in ([`Setup`]).

use std::fs;
use std::path::{Path, PathBuf};

/// The model name every config asks for; the fake server accepts any.
pub const MODEL: &str = "fake-model";

/// One pinned CLI.
pub struct Cli {
    /// The agent's name, as in `coda-<name>`.
    pub name: &'static str,
    /// The npm package `scripts/install-clis` installs into `.live/<name>/`.
    pub package: &'static str,
    /// The pinned version of that package.
    pub version: &'static str,
    /// The executable, relative to `.live/<name>/node_modules`.
    pub program: &'static str,
    /// What else the CLI needs installed: `Err(what is missing)`.
    pub ready: fn() -> Result<(), String>,
    /// Writes the CLI's config into the hermetic HOME and sets its command line and environment.
    pub setup: fn(&mut Setup) -> std::io::Result<()>,
    /// The tools its model requests offer, as the fake model picks them.
    pub tools: Tools,
}

impl Cli {
    /// `package@version`, as `scripts/install-clis` pins it (for a fixture's `meta.json`).
    pub fn pinned(&self) -> String {
        format!("{}@{}", self.package, self.version)
    }
}

/// For [`Cli::ready`]: nothing else is needed.
pub fn nothing_else() -> Result<(), String> {
    Ok(())
}

/// Tool names a CLI offers its model, by what the fake model's markers ask for.
pub struct Tools {
    /// Shell tools (`[[bg:…]]`, `[[sh:…]]`), in order of preference.
    pub shell: &'static [&'static str],
    /// Subagent tools (`[[subagent:…]]`; also resume where there is no follow-up tool).
    pub spawn: &'static [&'static str],
    /// Follow-up tools for a running subagent (`[[resume:…]]`).
    pub followup: &'static [&'static str],
    /// Phrases (lower case) that open the CLI's title and summary requests.
    pub side_phrases: &'static [&'static str],
}

/// A CLI's hermetic set-up in the making: [`Cli::setup`] fills in the command line and the environment.
pub struct Setup<'a> {
    /// `http://127.0.0.1:PORT/v1`, the fake model.
    pub base_url: &'a str,
    /// The temporary HOME.
    pub home: PathBuf,
    /// The executable to run (at first the installed program).
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The complete environment (at first the variables every CLI gets).
    pub env: Vec<(String, String)>,
}

impl Setup<'_> {
    /// Adds a variable.
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.env.push((key.into(), value.into()));
    }

    /// Puts `dir` first on the PATH of the environment.
    pub fn prepend_path(&mut self, dir: &Path) {
        if let Some((_, path)) = self.env.iter_mut().find(|(k, _)| k == "PATH") {
            *path = format!("{}:{path}", dir.display());
        }
    }
}

/// Writes `text` to `path`, making its folder.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, text)
}

pub fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

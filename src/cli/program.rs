//! Finding the wrapped CLI's program on this machine and asking it for its version.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::child::AgentCommand;
use crate::cli::locate::{self, Located, Place};

/// A command found on this machine, with its version where finding it already told us.
pub struct Found {
    pub command: AgentCommand,
    pub version: Option<String>,
    /// Where it was found and why it was looked for there ("on PATH", "from --agent-command", …).
    pub how: String,
}

/// Why no command was found. The text says what to do; the kind is what a caller branches on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    /// Nothing of that name where it was looked for, or a given command that names no file.
    #[error("{0}")]
    NotFound(String),
    /// A program of that name that is something else (a distribution's unrelated program of the same name).
    #[error("{0}")]
    WrongProgram(String),
    /// A given command line that cannot be a command (unbalanced quotes, nothing in it).
    #[error("{0}")]
    BadCommand(String),
}

/// Looks a program up like a shell would, without running one: a path with a `/` as is (`how` empty), else on
/// PATH or in the usual install places (`locate.rs`).
pub fn find_program(program: &str) -> Option<Located> {
    if program.contains('/') {
        let p = Path::new(program);
        return p.is_file().then(|| Located { path: p.to_path_buf(), how: String::new() });
    }
    locate::find(program, &[])
}

/// The usual default: `program args...` found on PATH, else in the usual install places.
pub fn installed(program: &str, args: &[&str], cli_name: &str, install_hint: &str) -> Result<Found, FindError> {
    match locate::find(program, &[]) {
        Some(found) => Ok(Found {
            command: AgentCommand { program: found.path, args: args.iter().map(|a| (*a).to_owned()).collect() },
            version: None,
            how: found.how,
        }),
        None => Err(not_found(program, cli_name, &[], install_hint)),
    }
}

/// "cannot find `<program>` (CLI name) on PATH or in …; install it with: …".
pub fn not_found(program: &str, cli_name: &str, preferred: &[Place], install_hint: &str) -> FindError {
    FindError::NotFound(format!(
        "cannot find `{program}` ({cli_name}) on PATH or in the usual install places ({}); install it with: {install_hint}",
        locate::searched(preferred)
    ))
}

/// Runs `program args` with no stdin and returns its stdout, or `None` after `timeout` or on failure.
pub fn run_for_output(program: &Path, args: &[&str], timeout: Duration) -> Option<String> {
    let mut child = std::process::Command::new(program)
        .args(args)
        .envs(locate::child_path_var(program))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `<program> [script] --version`, taking the first line's last word ("1.18.33", "`<cli>, version 2.1.0`").
/// Arguments before the `acp` subcommand are kept, so `node .../main.mjs acp` asks the script, not Node.
pub fn plain_version(cmd: &AgentCommand) -> Option<String> {
    let mut args: Vec<&str> = cmd.args.iter().map(String::as_str).take_while(|a| *a != "acp").collect();
    args.push("--version");
    let out = run_for_output(&cmd.program, &args, Duration::from_secs(10))?;
    out.lines().next()?.split_whitespace().last().map(str::to_owned)
}

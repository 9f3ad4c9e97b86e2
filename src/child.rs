//! The wrapped CLI as a child process, in a process group of its own.
//!
//! Spawned without a shell, guarded by a watchdog that kills the group if the shim dies
//! ([`crate::watchdog`]), its stderr drained and its tail kept, and stopped with a ladder (in the relay
//! loop) that leaves no process of the group behind.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::watchdog::Watchdog;

/// How many lines of the child's stderr are kept for error reports.
const STDERR_TAIL: usize = 40;

/// Grace after closing the child's stdin, and after SIGTERM.
pub const STDIN_GRACE: Duration = Duration::from_secs(5);
pub const TERM_GRACE: Duration = Duration::from_secs(2);

/// Size asked for the pipe the agent writes to (Linux's default is 64 KiB; 1 MiB is what an unprivileged
/// process may ask). A burst then costs the agent and the shim a sixteenth of the wake-ups.
#[cfg(target_os = "linux")]
const PIPE_SIZE: i32 = 1 << 20;

/// Best effort: where the system refuses, the pipe keeps its size.
#[cfg(target_os = "linux")]
fn grow_pipe(pipe: &impl std::os::fd::AsFd) {
    if let Err(e) = nix::fcntl::fcntl(pipe.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE)) {
        tracing::debug!("cannot grow the agent's stdout pipe: {e}");
    }
}

/// macOS and the BSDs have no call to size a pipe: the kernel grows a pipe by itself under large writes
/// (to 64 KiB on macOS), so the pipe keeps the system's size.
#[cfg(not(target_os = "linux"))]
fn grow_pipe(_pipe: &impl std::os::fd::AsFd) {}

/// A resolved command: program path and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl AgentCommand {
    pub fn display(&self) -> String {
        let mut words = vec![self.program.display().to_string()];
        words.extend(self.args.iter().cloned());
        shell_words::join(words)
    }
}

#[derive(Clone, Default)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    fn push(&self, line: String) {
        let mut tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

pub struct Agent {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr_tail: StderrTail,
    pub stderr_done: tokio::task::JoinHandle<()>,
    pgid: Option<Pid>,
    /// Kills what the agent started and its group once the shim is gone; `None` when it could not be
    /// started (warned).
    watchdog: Option<Watchdog>,
}

/// Starts the child in a process group of its own with env and cwd inherited (plus `env`), and a watchdog
/// in that group (src/watchdog.rs). Where the watchdog cannot start, a warning says what is lost.
pub fn spawn(cmd: &AgentCommand, env: &[(OsString, OsString)]) -> std::io::Result<Agent> {
    let mut command = Command::new(&cmd.program);
    command
        .args(&cmd.args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = command.spawn()?;
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let watchdog = match (child.id(), child.stdin.as_ref()) {
        (Some(pid), Some(stdin)) => match stdin.as_fd().try_clone_to_owned().and_then(|s| Watchdog::start(pid, s)) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(
                    "cannot start the watchdog ({e}): if the shim is killed, the agent's processes survive it"
                );
                None
            }
        },
        _ => None,
    };
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("child pipes were not set up"));
    };
    grow_pipe(&stdout);
    let stderr_tail = StderrTail::default();
    let tail = stderr_tail.clone();
    // Drained continuously: a child blocked on a full stderr pipe would stall the session.
    let stderr_done = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr);
        let mut line = Vec::new();
        let mut err = tokio::io::stderr();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let _ = err.write_all(&line).await;
                    let text = String::from_utf8_lossy(&line);
                    tail.push(text.trim_end_matches(['\n', '\r']).to_owned());
                }
            }
        }
        let _ = err.flush().await;
    });
    Ok(Agent { child, stdin, stdout, stderr_tail, stderr_done, pgid, watchdog })
}

/// A handle to signal the child's process group after its pipes have moved elsewhere. The default is no
/// group: signals go nowhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct Group(Option<Pid>);

impl Agent {
    pub fn group(&self) -> Group {
        Group(self.pgid)
    }

    /// The watchdog, for the stop ladder's last step ([`kill_all`]); the caller keeps it alive till then.
    pub fn take_watchdog(&mut self) -> Option<Watchdog> {
        self.watchdog.take()
    }
}

/// The last step of the stop ladder: SIGKILL whatever the agent started, also in sessions of its own
/// (through the watchdog, while the agent is still there to find them by), and the agent's group.
pub fn kill_all(group: Group, watchdog: &mut Option<Watchdog>) {
    match watchdog.take() {
        Some(w) => w.fire(),
        None => group.signal(Signal::SIGKILL),
    }
}

impl Group {
    pub fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.0 {
            // ESRCH: the group is already gone, which is what we want.
            let _ = killpg(pgid, sig);
        }
    }
}

/// The exit code the shim reports for the child's status (128 + signal when it was killed).
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// How a status reads in a message: "1", or "killed by signal 9".
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.to_string(),
        (None, Some(sig)) => format!("{} (killed by signal {sig})", 128 + sig),
        (None, None) => "unknown".to_owned(),
    }
}

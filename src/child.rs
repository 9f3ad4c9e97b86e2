//! The wrapped CLI as a child process, in a process group of its own.
//!
//! Spawned without a shell, guarded by a watchdog that kills the group if the shim dies
//! ([`crate::watchdog`]), its stderr drained and its tail kept, and stopped with a ladder (its steps
//! decided in [`crate::relay::lifecycle`], sent by the relay loop) that leaves no process of the group behind.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
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

/// Starts the child in a process group of its own with env and cwd inherited (plus `env`, and the tag the
/// watchdog finds what it started by), and a watchdog in that group (src/watchdog.rs). Where the watchdog
/// cannot start, a warning says what is lost.
pub fn spawn(cmd: &AgentCommand, env: &[(OsString, OsString)]) -> std::io::Result<Agent> {
    let tag = crate::watchdog::tag();
    let mut command = Command::new(&cmd.program);
    command
        .args(&cmd.args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(crate::watchdog::TAG_VAR, &tag)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = command.spawn()?;
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let watchdog = match (child.id(), child.stdin.as_ref()) {
        (Some(pid), Some(stdin)) => {
            match stdin.as_fd().try_clone_to_owned().and_then(|s| Watchdog::start(pid, &tag, s)) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(
                        "cannot start the watchdog ({e}): if the shim is killed, the agent's processes survive it"
                    );
                    None
                }
            }
        }
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
    let stderr_done = tokio::spawn(drain_stderr(stderr, tokio::io::stderr(), tail));
    Ok(Agent { child, stdin, stdout, stderr_tail, stderr_done, pgid, watchdog })
}

/// Longest line of the child's stderr passed on and kept whole; of a longer one, only its start. Each
/// line is cut out with the frame splitter, so an endless line holds no more than this.
const STDERR_LINE: usize = 64 << 10;

/// Copies the child's stderr to ours line by line and keeps its tail. A line over [`STDERR_LINE`] goes on
/// as its first bytes and a note of its length; the rest of it is skipped, not held.
async fn drain_stderr<R, W>(mut stderr: R, mut out: W, tail: StderrTail)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut lines = crate::lines::Lines::new(STDERR_LINE);
    while let Ok(Some(line)) = crate::lines::read_line(&mut stderr, &mut lines).await {
        let text = match line {
            crate::lines::Line::Text(bytes) => String::from_utf8_lossy(&bytes[..bytes.len() - 1]).into_owned(),
            crate::lines::Line::TooLong { head, len } => format!(
                "{}… [a line of {len} bytes, over the {} KiB kept of a stderr line]",
                String::from_utf8_lossy(&head),
                STDERR_LINE >> 10
            ),
        };
        let _ = out.write_all(format!("{text}\n").as_bytes()).await;
        tail.push(text);
    }
    let _ = out.flush().await;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An endless-looking line: `len` bytes of `x` made as they are read (none held by the test), then `rest`.
    struct Endless {
        len: usize,
        rest: &'static [u8],
    }

    impl tokio::io::AsyncRead for Endless {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self.len.min(buf.remaining()).min(1 << 20);
            if n > 0 {
                buf.put_slice(&vec![b'x'; n]);
                self.len -= n;
            } else {
                let m = self.rest.len().min(buf.remaining());
                buf.put_slice(&self.rest[..m]);
                self.rest = &self.rest[m..];
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn an_endless_stderr_line_is_passed_on_as_its_start_and_the_next_lines_follow() {
        let tail = StderrTail::default();
        let mut out = Vec::new();
        let stderr = Endless { len: 200 << 20, rest: "\nerror: quota 配额\nlast".as_bytes() };
        drain_stderr(stderr, &mut out, tail.clone()).await;
        let lines = tail.lines();
        assert_eq!(lines.len(), 3, "{:?}", lines.iter().map(String::len).collect::<Vec<_>>());
        assert!(lines[0].len() < 8 << 10 && lines[0].starts_with("xxxx"), "{} bytes kept", lines[0].len());
        assert!(lines[0].ends_with(&format!("[a line of {} bytes, over the 64 KiB kept of a stderr line]", 200 << 20)));
        assert_eq!(lines[1..], ["error: quota 配额", "last"]);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out, format!("{}\n{}\n{}\n", lines[0], lines[1], lines[2]));
        // A line within the bound goes on whole.
        let mut out = Vec::new();
        let whole = "y".repeat(STDERR_LINE);
        let stderr = std::io::Cursor::new(format!("{whole}\r\n"));
        drain_stderr(stderr, &mut out, StderrTail::default()).await;
        assert_eq!(out, format!("{whole}\n").into_bytes());
    }
}

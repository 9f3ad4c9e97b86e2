//! Nothing the CLI started outlives the shim: a watchdog process leads the group the CLI runs in and, as
//! soon as the shim is gone however it went, kills what the CLI started and then that group (itself
//! included).
//!
//! Coda kills the shim's own process group 30 s after a cancelled turn that has not ended (protocol,
//! "处理" item 3 and "进程结束"), and a shim can be SIGKILLed any time. Neither reaches the CLI, which runs
//! in a group of its own so the shim can stop it and what it started as one. The watchdog holds the read
//! end of a pipe whose write end only the shim holds (close-on-exec, so neither the watchdog nor the CLI
//! inherits it); the shim writes the CLI's pid into it once and keeps it open. When the shim dies the
//! kernel closes it and the watchdog's read sees end-of-file. This needs nothing of Linux that macOS
//! lacks (`PR_SET_PDEATHSIG` would cover only the direct child, and macOS has none).
//!
//! The real CLIs run their shell commands in sessions of their own (`setsid`: Kimi, Grok and OpenCode, and
//! Codex's sandbox, checked live), out of reach of any signal to the CLI's group. So before it kills the
//! group the watchdog stops the CLI (SIGSTOP: it starts nothing more) and SIGKILLs every descendant of
//! the CLI, and the group each of them leads, found through their parent links in `ps` (twice, for what
//! was starting meanwhile). That works while the CLI lives, which is the case when the shim died first.
//!
//! The watchdog is `/bin/sh` (present on macOS and every Linux, named by its path so a short PATH does not
//! matter; `ps` and `awk` are found on the PATH it is given, `/usr/bin:/bin`). It ignores SIGTERM,
//! SIGINT, SIGHUP and SIGQUIT, so the graceful ladder's SIGTERM to the group leaves it on guard; a SIGKILL
//! of the group ends it with the rest. Its stdio is the pipe and /dev/null: it holds none of the CLI's
//! pipes, so the shim still sees the CLI's end-of-file.
//!
//! Out of reach: a process whose parent chain to the CLI is already broken when the watchdog looks (its
//! parent exited, so it was handed to init) and that left the group (`setsid`, `setpgid`).

use std::os::fd::OwnedFd;
use std::process::Stdio;

use nix::unistd::Pid;

const SHELL: &str = "/bin/sh";
/// The first line is the CLI's pid; then nothing comes until end-of-file. Whatever `read` returns, the
/// group goes at the end. The descendants of `$cli`: every pid whose chain of parents reaches it.
const SCRIPT: &str = r#"trap '' HUP INT QUIT TERM
IFS= read -r cli
while read -r _; do :; done
case $cli in ''|*[!0-9]*) cli= ;; esac
if [ -n "$cli" ]; then
  kill -s STOP "$cli" 2>/dev/null
  for pass in 1 2; do
    for pid in $(ps -A -o pid= -o ppid= | awk -v root="$cli" '
      { parent[$1] = $2 }
      END { for (p in parent) { q = p; n = 0
              while ((q in parent) && q != root && n++ < 4096) q = parent[q]
              if (q == root && p != root) print p } }'); do
      kill -s KILL -- "-$pid" 2>/dev/null
      kill -s KILL "$pid" 2>/dev/null
    done
  done
fi
kill -s KILL 0"#;

/// A running watchdog: the group it leads, and the write end of its pipe. Dropping it (or the shim
/// exiting) closes the pipe, and the watchdog then kills what the CLI started and its whole group.
pub struct Watchdog {
    pgid: Pid,
    alive: std::fs::File,
}

impl Watchdog {
    /// Starts the watchdog as the leader of a new process group; the CLI is then spawned into that group
    /// ([`Watchdog::group`]). Call inside a tokio runtime: the watchdog is reaped by a task of its own.
    pub fn start() -> std::io::Result<Watchdog> {
        let (read, write) = cloexec_pipe()?;
        let mut command = tokio::process::Command::new(SHELL);
        command
            .arg("-c")
            .arg(SCRIPT)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir("/")
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let mut child = command.spawn()?;
        // The command held the read end; the shim keeps only the write end.
        drop(command);
        let pid = child.id().ok_or_else(|| std::io::Error::other("the watchdog exited at once"))?;
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Ok(Watchdog { pgid: Pid::from_raw(pid as i32), alive: std::fs::File::from(write) })
    }

    /// The process group the watchdog leads.
    pub fn group(&self) -> Pid {
        self.pgid
    }

    /// Tells the watchdog which process is the CLI (once, after spawning it), whose descendants it kills.
    pub fn guard(&mut self, cli: u32) {
        use std::io::Write;
        // A few bytes into an empty pipe: never blocks. Failing, the watchdog still kills the group.
        if let Err(e) = writeln!(self.alive, "{cli}") {
            tracing::warn!(
                "cannot tell the watchdog the agent's pid ({e}): what the agent starts may survive the shim"
            );
        }
    }

    /// Ends the watchdog's watch now: it kills what the CLI started, then the group (the ladder's last step).
    pub fn fire(self) {}
}

/// A pipe whose ends are both close-on-exec, so no child inherits the write end by accident.
fn cloexec_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    {
        Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
    }
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
    {
        // macOS has no pipe2. A process another thread spawns between these two calls could inherit
        // the write end (std's own pipes on macOS take the same risk); the shim's only such spawn is the
        // short `--version` probe, which would delay the watchdog until it ends.
        use nix::fcntl::{F_SETFD, FdFlag, fcntl};
        let (read, write) = nix::unistd::pipe()?;
        for fd in [&read, &write] {
            fcntl(fd, F_SETFD(FdFlag::FD_CLOEXEC))?;
        }
        Ok((read, write))
    }
}

//! The CLI's process group outlives no shim: a watchdog process leads the group the CLI runs in and
//! SIGKILLs that group (itself included) as soon as the shim is gone, however it went.
//!
//! Coda kills the shim's own process group 30 s after a cancelled turn that has not ended (protocol,
//! "处理" item 3 and "进程结束"), and a shim can be SIGKILLed any time. Neither reaches the CLI, which runs
//! in a group of its own so the shim can stop it and what it started as one. The watchdog holds the read
//! end of a pipe whose write end only the shim holds (close-on-exec, so neither the watchdog nor the CLI
//! inherits it): when the shim dies the kernel closes it, the watchdog's read sees end-of-file, and it
//! kills its group. This needs nothing of Linux that macOS lacks (`PR_SET_PDEATHSIG` would cover only the
//! direct child, and macOS has none), and costs one small process per shim.
//!
//! The watchdog is `/bin/sh` (present on macOS and every Linux, named by its path so a short PATH does not
//! matter) running only builtins: `read` waits for end-of-file, `kill -KILL 0` signals the caller's whole
//! process group. It ignores SIGTERM, SIGINT, SIGHUP and SIGQUIT, so the graceful ladder's SIGTERM to the
//! group leaves it on guard; the ladder's SIGKILL ends it with the rest. Its stdio is the pipe and
//! /dev/null: it holds none of the CLI's pipes, so the shim still sees the CLI's end-of-file.
//!
//! Out of reach: a process that leaves the group (`setsid`, `setpgid`) is no longer signalled.

use std::os::fd::OwnedFd;
use std::process::Stdio;

use nix::unistd::Pid;

const SHELL: &str = "/bin/sh";
/// `read` returns on end-of-file only (the shim never writes); whatever it returns, the group goes.
const SCRIPT: &str = "trap '' HUP INT QUIT TERM; read -r _; kill -KILL 0";

/// A running watchdog: the group it leads, and the write end of its pipe. Dropping it (or the shim
/// exiting) closes the pipe, and the watchdog then kills its whole group.
pub struct Watchdog {
    pgid: Pid,
    _alive: OwnedFd,
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
        Ok(Watchdog { pgid: Pid::from_raw(pid as i32), _alive: write })
    }

    /// The process group the watchdog leads.
    pub fn group(&self) -> Pid {
        self.pgid
    }
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

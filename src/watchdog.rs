//! The watchdog: nothing the CLI started outlives the shim, however the shim went.
//!
//! A watchdog process in the CLI's process group kills what the CLI started and then that group (itself
//! included) as soon as the shim is gone.
//!
//! Coda kills the shim's own process group 30 s after a cancelled turn that has not ended (protocol,
//! "处理" item 3 and "进程结束"), and a shim can be SIGKILLed any time. Neither reaches the CLI, which runs
//! in a group of its own so the shim can stop it and what it started as one. The watchdog holds the read
//! end of a pipe whose write end only the shim holds (close-on-exec, so neither the watchdog nor the CLI
//! inherits it): when the shim dies the kernel closes it and the watchdog's read sees end-of-file. This
//! needs nothing of Linux that macOS lacks (`PR_SET_PDEATHSIG` would cover only the direct child, and
//! macOS has none).
//!
//! Real CLIs run their shell commands in sessions of their own (`setsid`, or a sandbox that does; checked
//! live with each wrapped CLI), out of reach of any signal to the CLI's group. So the watchdog first
//! SIGKILLs every descendant of the CLI, and the group each of them leads, found through their parent
//! links in `ps` (twice, for what was starting meanwhile); then its own group. (It does not SIGSTOP the
//! CLI first: once the shim is gone the CLI's group is orphaned, and the kernel sends SIGHUP to an
//! orphaned group with a stopped member, which would end the CLI and break the parent links.)
//!
//! Parent links hold only while the CLI lives, so the watchdog also holds a copy of the CLI's stdin: when
//! the shim dies, the CLI does not see end-of-file (and exit, orphaning its commands) before the watchdog
//! has looked. For a normal end the shim records the CLI's descendants while the CLI still runs, then has
//! the watchdog let go of the CLI's stdin, then closes its own end: what the CLI leaves behind when it
//! exits is killed with the group.
//!
//! The watchdog is `/bin/sh` (present on macOS and every Linux, named by its path so a short PATH does not
//! matter; `ps` and `awk` are found on the PATH it is given, `/usr/bin:/bin`). It ignores SIGTERM,
//! SIGINT, SIGHUP and SIGQUIT, so the graceful ladder's SIGTERM to the group leaves it on guard; a SIGKILL
//! of the group ends it with the rest. Its stdin is the pipe, its stdout the copy of the CLI's stdin (it
//! writes nothing there), its stderr /dev/null: it holds none of the CLI's output, so the shim still sees
//! the CLI's end-of-file.
//!
//! Out of reach: a process that left the group (`setsid`, `setpgid`) and whose chain of parents to the
//! CLI was broken before the watchdog (or the shim, at a normal end) looked.

use std::os::fd::OwnedFd;
use std::process::Stdio;

const SHELL: &str = "/bin/sh";
/// `$1` is the CLI's pid. What the shim writes: `mark PID:PGID ...` (the CLI's descendants when the
/// session ends, to kill if they outlive the CLI); `release` (let go of the CLI's stdin, so that the CLI
/// sees it close); `exited` (the CLI is gone: its pid may be reused, so never look for it again). At
/// end-of-file: kill the CLI's descendants (twice, for what was starting meanwhile) while it lives, then the marked processes still in the group they were marked in, then the watchdog's own
/// group. A descendant that leads its process group is killed with its group.
const SCRIPT: &str = r#"trap '' HUP INT QUIT TERM
descendants() {
  ps -A -o pid= -o ppid= -o pgid= | awk -v root="$1" '
    { parent[$1] = $2; group[$1] = $3 }
    END { for (p in parent) { q = p; n = 0
            while ((q in parent) && q != root && n++ < 4096) q = parent[q]
            if (q == root && p != root) print p ":" group[p] } }'
}
end() {
  for rec in $1; do
    pid=${rec%%:*}
    [ "$pid" = "${rec#*:}" ] && kill -s KILL -- "-$pid" 2>/dev/null
    kill -s KILL "$pid" 2>/dev/null
  done
}
cli=$1
case $cli in ''|*[!0-9]*) cli= ;; esac
marked=
while IFS= read -r line; do
  case $line in
    'mark '*) marked="$marked ${line#mark }" ;;
    release) exec >/dev/null ;;
    exited) cli= ;;
  esac
done
if [ -n "$cli" ]; then
  end "$(descendants "$cli")"
  end "$(descendants "$cli")"
fi
for rec in $marked; do
  now=$(ps -o pgid= -p "${rec%%:*}" 2>/dev/null)
  [ "${now##* }" = "${rec#*:}" ] && end "$rec"
done
kill -s KILL 0"#;

/// A running watchdog: the write end of its pipe. Dropping it (or the shim exiting) closes the pipe, and
/// the watchdog then kills what the CLI started and its whole group.
pub struct Watchdog {
    alive: std::fs::File,
    /// The CLI, until it has exited.
    cli: Option<u32>,
}

impl Watchdog {
    /// Starts the watchdog in the process group of the CLI `cli` (which leads it), holding `cli_stdin`, a
    /// copy of the CLI's stdin, until the shim lets go of it or is gone. The process is started (and later
    /// reaped) on a thread of its own, off the path to the CLI's first answer; what the shim tells it
    /// meanwhile waits in the pipe.
    pub fn start(cli: u32, cli_stdin: OwnedFd) -> std::io::Result<Watchdog> {
        let (read, write) = cloexec_pipe()?;
        std::thread::Builder::new().name("watchdog".into()).spawn(move || {
            let mut command = std::process::Command::new(SHELL);
            command
                .arg("-c")
                .arg(SCRIPT)
                .arg("coda-shim-watchdog")
                .arg(cli.to_string())
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .current_dir("/")
                .stdin(Stdio::from(read))
                .stdout(Stdio::from(cli_stdin))
                .stderr(Stdio::null());
            std::os::unix::process::CommandExt::process_group(&mut command, cli as i32);
            let spawned = command.spawn();
            // The command held the read end and the copy; the shim keeps only the write end.
            drop(command);
            match spawned {
                Ok(mut child) => {
                    let _ = child.wait();
                }
                // The CLI exited before its group could be joined, or there is no /bin/sh.
                Err(e) => tracing::warn!(
                    "cannot start the watchdog ({e}): if the shim is killed, the agent's processes survive it"
                ),
            }
        })?;
        Ok(Watchdog { alive: std::fs::File::from(write), cli: Some(cli) })
    }

    /// The session is ending and the shim is about to close the CLI's stdin: records what the CLI started
    /// (its descendants, in whatever group or session) for the watchdog to kill once the CLI is gone, if
    /// they outlive it, and has the watchdog let go of its copy of the CLI's stdin. A CLI may exit at once
    /// on end-of-file, and what it leaves behind can no longer be told apart afterwards. Runs `ps` once (a
    /// few milliseconds, once per session).
    pub fn session_ends(&mut self) {
        if let Some(cli) = self.cli
            && let Some(table) = process_table()
        {
            let marked: Vec<String> =
                descendants(cli, &table).into_iter().map(|(pid, pgid)| format!("{pid}:{pgid}")).collect();
            if !marked.is_empty() {
                self.tell(&format!("mark {}", marked.join(" ")));
            }
        }
        self.tell("release");
    }

    /// The CLI has exited and been reaped: its pid may be reused, so the watchdog must never look for it.
    pub fn exited(&mut self) {
        if self.cli.take().is_some() {
            self.tell("exited");
        }
    }

    fn tell(&mut self, line: &str) {
        use std::io::Write;
        // Short lines into a pipe only the watchdog reads, which reads them at once.
        if let Err(e) = writeln!(self.alive, "{line}") {
            tracing::warn!("cannot write to the watchdog ({e}): what the agent starts may survive the shim");
        }
    }

    /// Ends the watchdog's watch now: it kills what the CLI started, then the group (the ladder's last step).
    pub fn fire(self) {}
}

/// `(pid, ppid, pgid)` of every process, from `ps` (the same options on Linux and macOS).
fn process_table() -> Option<Vec<(u32, u32, u32)>> {
    let ps = ["/bin/ps", "/usr/bin/ps"].into_iter().find(|p| std::path::Path::new(p).is_file())?;
    let out = std::process::Command::new(ps)
        .args(["-A", "-o", "pid=", "-o", "ppid=", "-o", "pgid="])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| tracing::debug!("cannot run ps: {e}"))
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let row = |l: &str| {
        let mut w = l.split_whitespace().map(|n| n.parse::<u32>().ok());
        Some((w.next()??, w.next()??, w.next()??))
    };
    Some(text.lines().filter_map(row).collect())
}

/// Every process whose chain of parents reaches `root` (not `root` itself), with its process group.
fn descendants(root: u32, table: &[(u32, u32, u32)]) -> Vec<(u32, u32)> {
    let parent: crate::HashMap<u32, u32> = table.iter().map(|&(pid, ppid, _)| (pid, ppid)).collect();
    table
        .iter()
        .filter(|&&(pid, ..)| {
            let mut at = pid;
            // Bounded: a table read while processes come and go could hold a loop.
            for _ in 0..4096 {
                match parent.get(&at) {
                    Some(&up) if up == root => return true,
                    Some(&up) if up > 1 && up != at => at = up,
                    _ => return false,
                }
            }
            false
        })
        .map(|&(pid, _, pgid)| (pid, pgid))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_follow_parent_links_across_groups() {
        // 10 is the CLI; 11 its child in a session of its own, 12 that one's child; 20 unrelated; 30 and 31
        // form a loop (a table read mid-change) and must not hang.
        let table = [(1, 0, 1), (10, 5, 9), (11, 10, 11), (12, 11, 11), (20, 1, 20), (30, 31, 30), (31, 30, 30)];
        let mut found = descendants(10, &table);
        found.sort();
        assert_eq!(found, [(11, 11), (12, 11)]);
        assert!(descendants(99, &table).is_empty());
    }
}

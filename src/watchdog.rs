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
//! SIGKILLs every descendant of the CLI, and the group each of them leads, found in `ps` (twice, for what
//! was starting meanwhile); then its own group. (It does not SIGSTOP the CLI first: once the shim is gone
//! the CLI's group is orphaned, and the kernel sends SIGHUP to an orphaned group with a stopped member,
//! which would end the CLI and break the parent links.)
//!
//! A descendant is found two ways. By its parent links, which hold only while its parents live; and by
//! its environment: the CLI starts with [`TAG_VAR`] set to a tag of this run alone, which every process
//! it starts inherits, and `ps` shows a process's environment (`-E` on macOS, `e` on Linux) where the
//! system lets it (on Linux, every process of the user; since macOS 11 only a process that is not
//! restricted, which Apple's own programs such as `/bin/bash` and `/bin/sleep` are). The tag finds what
//! a CLI that dies with its parent leaves behind: Grok Build ends itself the moment the shim dies, and its
//! commands are re-parented to init before the watchdog looks.
//!
//! Parent links hold only while the CLI lives, so the watchdog also holds a copy of the CLI's stdin: when
//! the shim dies, the CLI does not see end-of-file (and exit, orphaning its commands) before the watchdog
//! has looked. For a normal end the shim records the CLI's descendants while the CLI still runs, then has
//! the watchdog let go of the CLI's stdin, then closes its own end: what the CLI leaves behind when it
//! exits is killed with the group.
//!
//! Coda's own kill comes 30 s after a turn it cancelled has not ended, so the shim also records the CLI's
//! descendants when Coda cancels a turn (off the relay loop, at most one look at a time and one a second):
//! what a CLI that dies with the shim leaves behind is then known by pid even where `ps` hides the tag
//! (macOS, for Apple's own programs). A record is kept [`MARKS_FOR`] seconds after it reached the watchdog
//! (a pid can be reused once its process is gone) and must still be in the process group it was recorded in.
//!
//! The shim's own folders for the run (coda-acp's defaults file, `crate::private_file::remove_at_exit`) are
//! named to the watchdog when it starts, and it removes them after its kills: a SIGKILLed shim runs no exit.
//!
//! The watchdog is `/bin/sh` (present on macOS and every Linux, named by its path so a short PATH does not
//! matter; `ps`, `awk`, `date` and `rm` are found on the PATH it is given, `/usr/bin:/bin`). It ignores SIGTERM,
//! SIGINT, SIGHUP and SIGQUIT, so the graceful ladder's SIGTERM to the group leaves it on guard; a SIGKILL
//! of the group ends it with the rest. Its stdin is the pipe, its stdout the copy of the CLI's stdin (it
//! writes nothing there), its stderr /dev/null: it holds none of the CLI's output, so the shim still sees
//! the CLI's end-of-file.
//!
//! Out of reach: a process that left the group (`setsid`, `setpgid`), whose chain of parents to the CLI
//! was broken before the watchdog (or the shim, at a normal end) looked, that was not running at a cancel
//! less than [`MARKS_FOR`] seconds before, and whose environment `ps` does not show or no longer holds the
//! tag (a command started with a cleared environment).

use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const SHELL: &str = "/bin/sh";

/// The variable in the CLI's environment that marks it and everything it starts as this run's: its value
/// is [`tag`]'s.
pub const TAG_VAR: &str = "CODA_SHIM_TAG";

/// A tag no other run of the shim on this machine has: the shim's pid, its clock's nanoseconds and a
/// count of the CLIs it started, in hexadecimal (digits, `a-f` and `-`: safe in a shell word).
pub fn tag() -> String {
    static STARTED: AtomicU64 = AtomicU64::new(0);
    let n = STARTED.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{nanos:x}-{n:x}", std::process::id())
}

/// The awk program that reads `ps`'s table (pid, ppid, pgid, then the command and its environment where
/// `ps` shows it) and prints `PID:PGID` of each descendant of `root` (by parent links; none when `root` is
/// empty) and of each process other than `root` whose line holds ` NAME=TAG` followed by a space or the
/// line's end (none when `tag` is empty). A macro so that the script and its test share one text.
macro_rules! find_descendants {
    () => {
        r#"
    { parent[$1] = $2; group[$1] = $3
      if (tag != "" && $1 != root) { s = $0; k = " " name "=" tag
        while ((i = index(s, k)) > 0) { c = substr(s, i + length(k), 1)
          if (c == "" || c == " ") { tagged[$1] = 1; break }
          s = substr(s, i + 1) } } }
    END { for (p in parent) { q = p; n = 0
            if (root != "") while ((q in parent) && q != root && n++ < 4096) q = parent[q]
            if ((root != "" && q == root && p != root) || (p in tagged)) print p ":" group[p] } }"#
    };
}

/// How long, in seconds, the watchdog keeps a record of the CLI's descendants: past Coda's kill 30 s after
/// a cancelled turn (protocol "处理" item 3), with room for a loaded machine; a normal end uses its record
/// within the stop ladder's 7 s.
pub const MARKS_FOR: u32 = 90;

/// The shell function that says whether a record stamped `$1` (seconds, `date +%s`) is still kept at `$2`,
/// `$keep` seconds after it came (a stamp that is not a number, where `date` failed, is kept: the pgid
/// check still holds). A macro so that the script and its test share one text.
macro_rules! fresh_fn {
    () => {
        r#"fresh() {
  case $1 in ''|*[!0-9]*) return 0 ;; esac
  case $2 in ''|*[!0-9]*) return 0 ;; esac
  [ $(($2 - $1)) -le "$keep" ]
}
"#
    };
}

/// `$1` is the CLI's pid, `$2` its tag, `$3` the tag's variable ([`TAG_VAR`]), `$4` [`MARKS_FOR`]. What
/// the shim writes: `mark PID:PGID ...` (the CLI's descendants when the session ends or a turn is
/// cancelled, to kill if they outlive the CLI, for [`MARKS_FOR`] seconds after the line came); `release`
/// (let go of the CLI's stdin, so that the CLI sees it close); `exited` (the CLI is gone: its pid may be
/// reused, so never look for it by its pid again); `remove DIR` (a folder the shim made for this run, by its
/// absolute path: removed at the end, after the kills). At end-of-file: kill the CLI's
/// descendants (twice, for what was starting meanwhile), those found by parent links while the CLI lives
/// and those carrying the tag, then the marked processes still in the group they were marked in, then the
/// watchdog's own group. A descendant that leads its process group is killed with its group.
///
/// `ps` is asked for environments as macOS (`-E`), then as Linux (`e`) spells it, and without them where
/// neither is known. The tag is matched as `NAME=TAG` followed by a space or the line's end: `awk` gets the
/// name and the tag apart, so no process's arguments (this script's, awk's) hold them joined.
const SCRIPT: &str = concat!(
    r#"trap '' HUP INT QUIT TERM
table() {
  ps -A -ww -E -o pid= -o ppid= -o pgid= -o command= 2>/dev/null ||
    ps -A -ww -o pid= -o ppid= -o pgid= -o args= e 2>/dev/null ||
    ps -A -o pid= -o ppid= -o pgid=
}
descendants() {
  table | awk -v root="$1" -v name="$3" -v tag="$2" '"#,
    find_descendants!(),
    r#"'
}
"#,
    fresh_fn!(),
    r#"end() {
  for rec in $1; do
    pid=${rec%%:*}
    [ "$pid" = "${rec#*:}" ] && kill -s KILL -- "-$pid" 2>/dev/null
    kill -s KILL "$pid" 2>/dev/null
  done
}
cli=$1 tag=$2 keep=$4
case $cli in ''|*[!0-9]*) cli= ;; esac
case $keep in ''|*[!0-9]*) keep=0 ;; esac
case $tag in *[!0-9a-f-]*) tag= ;; esac
marked= removes=
while IFS= read -r line; do
  case $line in
    'mark '*)
      at=$(date +%s 2>/dev/null)
      for rec in ${line#mark }; do marked="$marked $rec@$at"; done ;;
    release) exec >/dev/null ;;
    exited) cli= ;;
    'remove /'?*) removes="$removes
${line#remove }" ;;
  esac
done
if [ -n "$cli$tag" ]; then
  end "$(descendants "$cli" "$tag" "$3")"
  end "$(descendants "$cli" "$tag" "$3")"
fi
now=$(date +%s 2>/dev/null)
for rec in $marked; do
  fresh "${rec##*@}" "$now" || continue
  rec=${rec%@*}
  group=$(ps -o pgid= -p "${rec%%:*}" 2>/dev/null)
  [ "${group##* }" = "${rec#*:}" ] && end "$rec"
done
printf '%s\n' "$removes" | while IFS= read -r dir; do [ -n "$dir" ] && rm -rf -- "$dir"; done
kill -s KILL 0"#
);

/// A running watchdog: the write end of its pipe. Dropping it (or the shim exiting) closes the pipe, and
/// the watchdog then kills what the CLI started and its whole group.
pub struct Watchdog {
    /// Held here alone but for the moment a look at a cancel writes what it found: dropping the watchdog
    /// closes the pipe whatever a look is doing.
    alive: Arc<std::fs::File>,
    /// The CLI, until it has exited.
    cli: Option<u32>,
    /// A look at a cancel is running ([`Watchdog::turn_cancelled`]).
    looking: Arc<AtomicBool>,
    /// When the last look at a cancel started.
    looked: Option<std::time::Instant>,
}

/// The longest line the shim writes to the watchdog: at most `PIPE_BUF` (512 bytes on macOS, the least
/// POSIX allows), so that each line is written at once even when a look's thread writes beside the relay.
const LINE: usize = 512;

impl Watchdog {
    /// Starts the watchdog in the process group of the CLI `cli` (which leads it and was started with
    /// [`TAG_VAR`] set to `tag`), holding `cli_stdin`, a copy of the CLI's stdin, until the shim lets go of
    /// it or is gone. The process is started (and later
    /// reaped) on a thread of its own, off the path to the CLI's first answer; what the shim tells it
    /// meanwhile waits in the pipe.
    pub fn start(cli: u32, tag: &str, cli_stdin: OwnedFd) -> std::io::Result<Watchdog> {
        let tag = tag.to_owned();
        let (read, write) = cloexec_pipe()?;
        std::thread::Builder::new().name("watchdog".into()).spawn(move || {
            let mut command = std::process::Command::new(SHELL);
            command
                .arg("-c")
                .arg(SCRIPT)
                .arg("coda-shim-watchdog")
                .arg(cli.to_string())
                .arg(tag)
                .arg(TAG_VAR)
                .arg(MARKS_FOR.to_string())
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
        let alive: Arc<std::fs::File> = Arc::new(write.into());
        // The shim's own folders for this run (coda-acp's defaults file): a SIGKILL of the shim skips its exit.
        for dir in crate::private_file::removed_at_exit() {
            match dir.to_str().filter(|d| d.starts_with('/') && !d.contains('\n') && d.len() + 8 <= LINE) {
                Some(dir) => tell(&alive, &format!("remove {dir}")),
                None => tracing::debug!("a folder the watchdog cannot be told of is removed only at exit"),
            }
        }
        Ok(Watchdog { alive, cli: Some(cli), looking: Arc::default(), looked: None })
    }

    /// The session is ending and the shim is about to close the CLI's stdin: records what the CLI started
    /// (its descendants, in whatever group or session) for the watchdog to kill once the CLI is gone, if
    /// they outlive it, and has the watchdog let go of its copy of the CLI's stdin. A CLI may exit at once
    /// on end-of-file, and what it leaves behind can no longer be told apart afterwards. Runs `ps` once (a
    /// few milliseconds, once per session).
    pub fn session_ends(&mut self) {
        if let Some(cli) = self.cli {
            for line in mark_lines(cli) {
                tell(&self.alive, &line);
            }
        }
        tell(&self.alive, "release");
    }

    /// Coda cancelled a turn, and kills the shim's group if the turn has not ended 30 s later: records what
    /// the CLI started now, while its parent links hold, for the watchdog to kill if the shim is killed
    /// within [`MARKS_FOR`] seconds. `ps` runs on a thread of its own, off the relay loop; a cancel while a
    /// look runs, or within a second of the last one, adds none (a flood of cancels runs no flood of `ps`).
    pub fn turn_cancelled(&mut self) {
        let Some(cli) = self.cli else { return };
        let now = std::time::Instant::now();
        if self.looked.is_some_and(|at| now.duration_since(at) < std::time::Duration::from_secs(1))
            || self.looking.swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.looked = Some(now);
        let (alive, looking) = (Arc::downgrade(&self.alive), Arc::clone(&self.looking));
        let spawned = std::thread::Builder::new().name("watchdog-look".into()).spawn(move || {
            let lines = mark_lines(cli);
            // The watchdog may have been let go meanwhile: then its pipe is closed, and nothing is written.
            if let Some(alive) = alive.upgrade() {
                let marked: usize = lines.iter().map(|l| l.split(' ').count() - 1).sum();
                lines.iter().for_each(|line| tell(&alive, line));
                tracing::debug!("recorded {marked} processes the agent started, at a cancel");
            }
            looking.store(false, Ordering::Release);
        });
        if let Err(e) = spawned {
            self.looking.store(false, Ordering::Release);
            tracing::warn!("cannot look for the agent's processes at a cancel ({e})");
        }
    }

    /// The CLI has exited and been reaped: its pid may be reused, so the watchdog must never look for it.
    pub fn exited(&mut self) {
        if self.cli.take().is_some() {
            tell(&self.alive, "exited");
        }
    }

    /// Ends the watchdog's watch now: it kills what the CLI started, then the group (the ladder's last step).
    pub fn fire(self) {}
}

/// Writes `line` and its `\n` to the watchdog's pipe in one write (lines are at most [`LINE`] bytes).
fn tell(mut alive: &std::fs::File, line: &str) {
    use std::io::Write;
    if let Err(e) = alive.write_all(format!("{line}\n").as_bytes()) {
        tracing::warn!("cannot write to the watchdog ({e}): what the agent starts may survive the shim");
    }
}

/// `mark PID:PGID ...` lines naming the descendants of `cli` (none when it has none, or `ps` cannot be run),
/// each at most [`LINE`] bytes with its `\n`.
fn mark_lines(cli: u32) -> Vec<String> {
    process_table().map_or_else(Vec::new, |table| marks_in(cli, &table))
}

/// [`mark_lines`] for the table `table`.
fn marks_in(cli: u32, table: &[(u32, u32, u32)]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for (pid, pgid) in descendants(cli, table) {
        let record = format!(" {pid}:{pgid}");
        match lines.last_mut() {
            Some(line) if line.len() + record.len() < LINE => line.push_str(&record),
            _ => lines.push(format!("mark{record}")),
        }
    }
    lines
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

    /// What the script's awk program prints for `table` (as `ps` writes it) with `root` and `tag`, sorted.
    fn found_by_script(root: &str, tag: &str, table: &str) -> Vec<String> {
        use std::io::Write;
        let mut awk = std::process::Command::new("awk")
            .args(["-v", &format!("root={root}"), "-v", &format!("name={TAG_VAR}"), "-v", &format!("tag={tag}")])
            .arg(find_descendants!())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("awk runs");
        awk.stdin.take().unwrap().write_all(table.as_bytes()).unwrap();
        let out = awk.wait_with_output().unwrap();
        assert!(out.status.success());
        let mut found: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect();
        found.sort();
        found
    }

    #[test]
    fn the_script_finds_descendants_by_parent_links_and_by_the_tag_alone() {
        let t = tag();
        // 10 is the CLI (tagged itself, never printed); 11 its child in a session of its own and 12 that
        // one's; 13 and 14 were re-parented to init and carry the tag (at the line's end, among others);
        // 15 carries a tag that merely starts with this one, 16 another run's, 17 none, 18 the name and tag
        // apart in its arguments (as the watchdog's and awk's own lines do); 30 and 31 form a loop.
        let table = format!(
            "    1     0     1 /sbin/init\n\
             \x20  10     5    10 grok agent stdio {TAG_VAR}={t}\n\
             \x20  11    10    11 /bin/bash -c sleep 9\n\
             \x20  12    11    11 sleep 9\n\
             \x20  13     1    13 /bin/bash -c sleep 8 HOME=/h {TAG_VAR}={t} PATH=/bin\n\
             \x20  14     1    13 sleep 8 {TAG_VAR}={t}\n\
             \x20  15     1    15 sleep 7 {TAG_VAR}={t}0\n\
             \x20  16     1    16 sleep 6 {TAG_VAR}=1-2-3\n\
             \x20  17     1    17 sleep 5\n\
             \x20  18     1    18 awk -v name={TAG_VAR} -v tag={t} {{ print }}\n\
             \x20  30    31    30 a\n\
             \x20  31    30    30 b\n"
        );
        assert_eq!(found_by_script("10", &t, &table), ["11:11", "12:11", "13:13", "14:13"]);
        // Once the CLI has exited its pid is not followed, and the tag still finds what carries it.
        assert_eq!(found_by_script("", &t, &table), ["10:10", "13:13", "14:13"]);
        // Without a tag (a `ps` that shows no environment is the same), parent links alone.
        assert_eq!(found_by_script("10", "", &table), ["11:11", "12:11"]);
        assert!(found_by_script("", "", &table).is_empty());
    }

    #[test]
    fn records_are_cut_into_lines_the_pipe_takes_at_once() {
        // 10 is the CLI with 3,000 descendants (pids of up to 10 digits, as large as a pid gets).
        let mut table = vec![(10, 1, 10)];
        table.extend((0..3000).map(|n| (4_000_000_000 - n, 10, 4_000_000_000 - n)));
        let lines = marks_in(10, &table);
        assert!(lines.len() > 1);
        assert!(lines.iter().all(|l| l.starts_with("mark ") && l.len() < LINE), "{:?}", lines[0].len());
        let records: Vec<&str> = lines.iter().flat_map(|l| l.split(' ').skip(1)).collect();
        assert_eq!(records.len(), 3000);
        assert!(records.iter().all(|r| r.len() == 21 && r.as_bytes()[10] == b':'));
        assert!(marks_in(99, &table).is_empty());
    }

    #[test]
    fn a_record_is_kept_for_its_time_and_where_the_clock_failed() {
        let fresh = |at: &str, now: &str| {
            let script = format!("keep={MARKS_FOR}\n{}fresh '{at}' '{now}'", fresh_fn!());
            std::process::Command::new(SHELL).args(["-c", &script]).status().expect("sh runs").success()
        };
        let keep = u64::from(MARKS_FOR);
        assert!(fresh("1000", "1000"));
        assert!(fresh("1000", &(1000 + keep).to_string()));
        assert!(!fresh("1000", &(1001 + keep).to_string()));
        // `date` printed nothing or something else: kept (the pgid check still holds), never a shell error.
        for (at, now) in [("", "1000"), ("1000", ""), ("", ""), ("x", "1000"), ("1000", "-5")] {
            assert!(fresh(at, now), "{at:?} {now:?}");
        }
    }

    #[test]
    fn tags_differ_and_are_shell_words() {
        let (a, b) = (tag(), tag());
        assert_ne!(a, b);
        for t in [a, b] {
            assert!(!t.is_empty() && t.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase() || c == b'-'));
        }
    }
}

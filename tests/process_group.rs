//! Nothing the CLI started outlives the shim (issue 13, section 5): Coda kills the shim's process group
//! 30 s after a cancelled turn that has not ended (protocol "处理" item 3, "进程结束"), and a shim may be
//! SIGKILLed any time; the CLI runs in a group of its own, which a watchdog kills when the shim is gone.

#[path = "support/shim.rs"]
mod shim;
#[path = "support/temp.rs"]
mod temp;

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::json;
use shim::{Shim, prompt_params, with_test_agent};

/// What Coda's protocol allows for the processes to go after the kill.
const GONE_WITHIN: Duration = Duration::from_secs(2);

/// Processes of process group `pgid` that are still running (zombies waiting for a reaper do not count),
/// as `ps` sees them (the same on Linux and macOS).
fn running_in_group(pgid: i32) -> Vec<(i32, String)> {
    let out = std::process::Command::new("ps").args(["-A", "-o", "pid=,pgid=,stat="]).output().expect("run ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (pid, group, stat) = (w.next()?.parse().ok()?, w.next()?.parse::<i32>().ok()?, w.next()?);
            (group == pgid && !stat.starts_with('Z')).then(|| (pid, stat.to_owned()))
        })
        .collect()
}

fn process_group_of(pid: i32) -> i32 {
    let out = std::process::Command::new("ps").args(["-o", "pgid=", "-p", &pid.to_string()]).output().expect("ps");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a process group")
}

/// Polls until nothing of the group runs, or `GONE_WITHIN` has passed; returns what still runs.
fn left_after_the_grace(pgid: i32) -> Vec<(i32, String)> {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        let left = running_in_group(pgid);
        if left.is_empty() || Instant::now() >= deadline {
            // Whatever the outcome, leave nothing behind for the next test.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shim in a group of its own whose test agent has started `sleep 300` in the agent's group; returns
/// the shim, the grandchild's pid and the agent's process group.
fn shim_with_a_grandchild(dir: &temp::TempDir) -> (Shim, i32, i32) {
    let pidfile = dir.join("grandchild.pid");
    let mut s = with_test_agent("opencode").own_group().start();
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let (done, _) = s.request(2, "session/prompt", prompt_params(&sid, &format!("!grandchild {}", pidfile.display())));
    assert_eq!(done["result"]["stopReason"], "end_turn");
    let grandchild: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let group = process_group_of(grandchild);
    let shim_pid = s.child.id() as i32;
    assert_ne!(group, shim_pid, "the agent runs in a group of its own, not the shim's");
    let members = running_in_group(group);
    assert!(members.iter().any(|(pid, _)| *pid == grandchild), "the grandchild runs: {members:?}");
    assert!(members.len() >= 2, "the test agent and the grandchild: {members:?}");
    (s, grandchild, group)
}

/// Starts a shim with a grandchild, kills it with `kill` and asserts that nothing of the agent's group is left.
fn killing_leaves_nothing(name: &str, what: &str, kill_it: fn(Pid) -> nix::Result<()>) {
    let dir = temp::TempDir::new(name);
    let (mut s, _grandchild, group) = shim_with_a_grandchild(&dir);
    kill_it(Pid::from_raw(s.child.id() as i32)).unwrap();
    assert_eq!(s.wait(Duration::from_secs(5)).code(), None, "the shim was killed");
    let left = left_after_the_grace(group);
    assert!(left.is_empty(), "still running {GONE_WITHIN:?} after {what} was killed: {left:?}");
}

#[test]
fn sigkill_of_the_shim_leaves_nothing_of_the_agents_group() {
    killing_leaves_nothing("coda-shim-kill", "the shim", |shim| kill(shim, Signal::SIGKILL));
}

#[test]
fn sigkill_of_the_shims_group_leaves_nothing_of_the_agents_group() {
    // What Coda does 30 s after a cancelled turn that did not end: SIGKILL the group it started the shim in.
    killing_leaves_nothing("coda-shim-killpg", "the shim's group", |shim| killpg(shim, Signal::SIGKILL));
}

#[test]
fn a_normal_end_leaves_nothing_and_reports_the_agents_own_status() {
    let dir = temp::TempDir::new("coda-shim-end");
    let (mut s, _grandchild, group) = shim_with_a_grandchild(&dir);
    // The test agent exits 0 when its stdin closes: the watchdog must neither hold the agent's pipes open
    // (the shim would wait for the agent's end-of-file) nor stand in for the agent's exit status.
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(10)).code(), Some(0));
    let left = left_after_the_grace(group);
    assert!(left.is_empty(), "still running after the shim ended: {left:?}");
}

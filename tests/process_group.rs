//! Nothing the CLI started outlives the shim (issue 13, section 5): Coda kills the shim's process group
//! 30 s after a cancelled turn that has not ended (protocol "处理" item 3, "进程结束"), and a shim may be
//! SIGKILLed any time; the CLI runs in a group of its own, which a watchdog kills when the shim is gone.

use crate::support;

use support::wait::runs;
use support::{fake_model, live, shim, temp};

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

/// Polls until nothing of the group and none of `pids` runs, or `GONE_WITHIN` has passed; returns what
/// still runs (and kills it, so nothing is left for the next test).
fn left_after_the_grace(pgid: i32, pids: &[i32]) -> Vec<(i32, String)> {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        let mut left = running_in_group(pgid);
        left.extend(pids.iter().filter(|&&p| runs(p)).map(|&p| (p, "detached".to_owned())));
        if left.is_empty() || Instant::now() >= deadline {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            for &p in pids {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shim in a group of its own whose test agent has started `sleep 300` in the agent's group and
/// `sleep 301` in a group of its own (as the real CLIs run commands); returns the shim, the agent's
/// process group and the detached sleep's pid.
fn shim_with_grandchildren(dir: &temp::TempDir, agent_env: &[(&str, &str)]) -> (Shim, i32, i32) {
    let (pidfile, detached_file) = (dir.join("grandchild.pid"), dir.join("detached.pid"));
    let mut b = with_test_agent("opencode").own_group();
    for (k, v) in agent_env {
        b = b.env(k, v);
    }
    let mut s = b.start();
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let prompt = format!("!grandchild {} !detached {}", pidfile.display(), detached_file.display());
    let (done, _) = s.request(2, "session/prompt", prompt_params(&sid, &prompt));
    assert_eq!(done["result"]["stopReason"], "end_turn");
    let read = |p: &std::path::Path| -> i32 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    let (grandchild, detached) = (read(&pidfile), read(&detached_file));
    let group = process_group_of(grandchild);
    let shim_pid = s.child.id() as i32;
    assert_ne!(group, shim_pid, "the agent runs in a group of its own, not the shim's");
    let members = running_in_group(group);
    assert!(members.iter().any(|(pid, _)| *pid == grandchild), "the grandchild runs: {members:?}");
    assert!(members.len() >= 2, "the test agent and the grandchild: {members:?}");
    assert!(runs(detached) && process_group_of(detached) == detached, "sleep 301 runs in a group of its own");
    (s, group, detached)
}

/// Starts a shim with grandchildren (its agent started with `agent_env`), kills it with `kill_it` and
/// asserts that nothing the agent started is left.
fn killing_leaves_nothing(name: &str, what: &str, agent_env: &[(&str, &str)], kill_it: fn(Pid) -> nix::Result<()>) {
    let dir = temp::TempDir::new(name);
    let (mut s, group, detached) = shim_with_grandchildren(&dir, agent_env);
    kill_it(Pid::from_raw(s.child.id() as i32)).unwrap();
    assert_eq!(s.wait(Duration::from_secs(5)).code(), None, "the shim was killed");
    let left = left_after_the_grace(group, &[detached]);
    assert!(left.is_empty(), "still running {GONE_WITHIN:?} after {what} was killed: {left:?}");
}

#[test]
fn sigkill_of_the_shim_leaves_nothing_the_agent_started() {
    killing_leaves_nothing("coda-shim-kill", "the shim", &[], |shim| kill(shim, Signal::SIGKILL));
}

#[test]
fn sigkill_of_the_shim_leaves_nothing_of_an_agent_that_dies_with_its_parent() {
    // Grok Build ends itself the moment its parent dies: its commands are re-parented to init before the
    // watchdog can follow parent links to them.
    let env = [("TEST_AGENT_DIE_WITH_PARENT", "1")];
    killing_leaves_nothing("coda-shim-kill-orphans", "the shim", &env, |shim| kill(shim, Signal::SIGKILL));
}

#[test]
fn a_kill_after_a_cancel_leaves_nothing_of_an_agent_that_dies_with_its_parent() {
    // Coda's own kill comes 30 s after a cancelled turn that has not ended. This agent dies with its parent
    // and its command has an empty environment, so neither parent links nor the tag find it after the kill
    // (as on macOS, whose `ps` hides the environment of Apple's own programs): only the shim's record of
    // what the agent started, taken at the cancel, does.
    let dir = temp::TempDir::new("coda-shim-cancel-kill");
    let bare_file = dir.join("bare.pid");
    let mut s = with_test_agent("opencode")
        .own_group()
        .env("TEST_AGENT_DIE_WITH_PARENT", "1")
        .env("CODA_SHIM_LOG", "coda_shim=debug")
        .start();
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let prompt = format!("!detached-bare {} !hang", bare_file.display());
    s.send_json(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt_params(&sid, &prompt)}),
    );
    while !s.recv().contains("hanging until cancelled") {}
    let bare: i32 = std::fs::read_to_string(&bare_file).unwrap().trim().parse().unwrap();
    assert!(runs(bare) && process_group_of(bare) == bare, "sleep 302 runs in a group of its own");
    s.send_json(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}));
    let recorded = s.stderr_with("processes the agent started, at a cancel");
    assert!(!recorded.contains("recorded 0 "), "{recorded}");
    killpg(Pid::from_raw(s.child.id() as i32), Signal::SIGKILL).unwrap();
    s.wait(Duration::from_secs(5));
    let left = left_after_the_grace(bare, &[bare]);
    assert!(left.is_empty(), "still running {GONE_WITHIN:?} after the shim's group was killed: {left:?}");
}

/// The folders under `tmp` whose names start with `coda-acp-` (coda-acp's defaults files).
fn defaults_folders(tmp: &std::path::Path) -> Vec<std::path::PathBuf> {
    let entries = std::fs::read_dir(tmp).expect("the temporary folder");
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("coda-acp-"))
        .map(|e| e.path())
        .collect()
}

#[test]
fn sigkill_of_coda_acp_leaves_no_defaults_folder() {
    // coda-acp writes Qwen's profile's defaults file in a folder of its own in the temporary folder and removes
    // it at exit; a SIGKILL skips the exit, and the watchdog removes it instead.
    let dir = temp::TempDir::new("coda-acp-kill-defaults");
    // (A space in the path, as in a macOS user's folder name: the watchdog reads it as one line.)
    let tmp = dir.join("my tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut s = with_test_agent("acp")
        .arg("--profile")
        .arg("qwen")
        .own_group()
        .env("TMPDIR", tmp.to_str().unwrap())
        .env_remove("QWEN_CODE_SYSTEM_DEFAULTS_PATH")
        .env_remove("QWEN_CODE_SYSTEM_SETTINGS_PATH")
        .start();
    let (new, _) = s.request(1, "session/new", json!({"cwd": "/w", "mcpServers": []}));
    assert!(new["result"]["sessionId"].is_string(), "{new}");
    let made = defaults_folders(&tmp);
    assert_eq!(made.len(), 1, "one defaults folder for the run: {made:?}");
    assert!(made[0].join("system-defaults.json").is_file(), "{made:?}");
    kill(Pid::from_raw(s.child.id() as i32), Signal::SIGKILL).unwrap();
    assert_eq!(s.wait(Duration::from_secs(5)).code(), None, "the shim was killed");
    let deadline = Instant::now() + GONE_WITHIN;
    while made[0].exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!made[0].exists(), "{} left {GONE_WITHIN:?} after the shim was killed", made[0].display());
}

#[test]
fn sigkill_of_the_shims_group_leaves_nothing_the_agent_started() {
    // What Coda does 30 s after a cancelled turn that did not end: SIGKILL the group it started the shim in.
    killing_leaves_nothing("coda-shim-killpg", "the shim's group", &[], |shim| killpg(shim, Signal::SIGKILL));
}

#[test]
fn a_normal_end_leaves_nothing_the_agent_started_and_reports_its_own_status() {
    let dir = temp::TempDir::new("coda-shim-end");
    let (mut s, group, detached) = shim_with_grandchildren(&dir, &[]);
    // The test agent exits 0 when its stdin closes: the watchdog must neither hold the agent's pipes open
    // (the shim would wait for the agent's end-of-file) nor stand in for the agent's exit status.
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(10)).code(), Some(0));
    // What the agent detached was marked when the session ended, and goes once the agent has exited.
    let left = left_after_the_grace(group, &[detached]);
    assert!(left.is_empty(), "still running after the shim ended: {left:?}");
}

#[test]
fn the_ladders_sigkill_also_ends_what_the_agent_detached() {
    let dir = temp::TempDir::new("coda-shim-ladder-detached");
    let stubborn = [("TEST_AGENT_IGNORE_EOF", "1"), ("TEST_AGENT_IGNORE_TERM", "1")];
    let (mut s, group, detached) = shim_with_grandchildren(&dir, &stubborn);
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(15)).code(), Some(128 + 9), "stdin closed, SIGTERM ignored, SIGKILL");
    let left = left_after_the_grace(group, &[detached]);
    assert!(left.is_empty(), "still running after the ladder: {left:?}");
}

/// A process as `ps` shows it: pid, process group, session, the start of its command.
type Proc = (i32, i32, i32, String);

/// Processes whose command line contains `needle`, zombies left out.
fn running_with(needle: &str) -> Vec<Proc> {
    let out = std::process::Command::new("ps").args(["-A", "-o", "pid=,pgid=,sid=,stat=,args="]).output().expect("ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (pid, pgid, sid) = (w.next()?.parse().ok()?, w.next()?.parse().ok()?, w.next()?.parse().ok()?);
            let stat = w.next()?;
            let args = w.collect::<Vec<_>>().join(" ");
            let short: String = args.chars().take(40).collect();
            (args.contains(needle) && !stat.starts_with('Z')).then_some((pid, pgid, sid, short))
        })
        .collect()
}

/// How a live session ends.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// What Coda does 30 s after a cancelled turn that did not end.
    KillShimsGroup,
    /// Coda closes the connection: the graceful ladder.
    CloseStdin,
    /// Coda cancels the turn, and kills the shim's group once the shim has recorded what the CLI started
    /// (Coda waits 30 s).
    CancelThenKill,
}

/// Runs a real CLI through its shim until it runs a foreground and a background shell command in a turn
/// that never ends, ends the session as `ending` says, and returns the commands that ran and those still
/// running 2 s after the shim is gone (killed by this function, so nothing is left behind).
fn live_commands_after(agent: &str, n: usize, ending: Ending) -> (Vec<Proc>, Vec<Proc>) {
    let model = fake_model::FakeModel::start();
    let temp = temp::TempDir::new(&format!("coda-live-end-{agent}"));
    let lc = live::prepare(agent, &model.base_url(), temp.path()).expect("prepare the CLI");
    // Sleep lengths no other process uses, to find the commands by.
    let (fg, bg) = (format!("sleep {}", 3171 + 2 * n), format!("sleep {}", 3172 + 2 * n));
    let mut s = shim::Builder::from_command(lc.shim_command(&shim::binary(agent)))
        .own_group()
        .env("CODA_SHIM_LOG", "coda_shim=debug")
        .start();
    s.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {"_meta": {"coda": {"waits": {}}}}}));
    let (new, _) = s.request(1, "session/new", json!({"cwd": lc.workdir, "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().expect("a session").to_owned();
    s.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
        "params": prompt_params(&sid, &format!("[[bg:{bg}]] [[sh:{fg}]]"))}));
    let deadline = Instant::now() + Duration::from_secs(60);
    while running_with(&fg).is_empty() && Instant::now() < deadline {
        // A CLI that asks before running a command is allowed once.
        while let Some(line) = s.try_recv(Duration::from_millis(50)) {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["method"] == "session/request_permission" {
                let option = v.pointer("/params/options/0/optionId").cloned().unwrap_or_default();
                s.send_json(&json!({"jsonrpc": "2.0", "id": v["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": option}}}));
            }
        }
    }
    let both = || [running_with(&fg), running_with(&bg)].concat();
    let before = both();
    match ending {
        Ending::KillShimsGroup => killpg(Pid::from_raw(s.child.id() as i32), Signal::SIGKILL).unwrap(),
        Ending::CloseStdin => s.close_stdin(),
        Ending::CancelThenKill => {
            s.send_json(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}));
            let recorded = s.stderr_with("processes the agent started, at a cancel");
            eprintln!("{agent}: {recorded}");
            killpg(Pid::from_raw(s.child.id() as i32), Signal::SIGKILL).unwrap();
        }
    }
    s.wait(Duration::from_secs(15));
    let end = Instant::now() + GONE_WITHIN;
    let mut left = both();
    while !left.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        left = both();
    }
    for (pid, ..) in &left {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    (before, left)
}

/// Live (`CODA_LIVE=1`, after `scripts/install-clis`; `CODA_LIVE_AGENTS=kimi,grok` for some): each real
/// CLI runs a foreground and a background shell command in a turn that never ends; then Coda kills the
/// shim's group, or closes stdin, or cancels the turn and then kills the group. Neither command may remain
/// 2 s after the shim is gone.
#[test]
fn live_the_clis_commands_end_with_the_shim() {
    let agents = live::selected_agents("the CLIs' commands ending with the shim");
    let mut failures = Vec::new();
    for (n, agent) in agents.iter().enumerate() {
        let endings = [Ending::KillShimsGroup, Ending::CloseStdin, Ending::CancelThenKill];
        for (m, ending) in endings.into_iter().enumerate() {
            let (before, left) = live_commands_after(agent, 2 * n + 10 * m, ending);
            eprintln!(
                "{agent} {ending:?}: ran (pid, pgid, sid, command) {before:?}; left after {GONE_WITHIN:?}: {left:?}"
            );
            if before.is_empty() {
                failures.push(format!("{agent} {ending:?}: the CLI never ran the foreground command"));
            }
            if !left.is_empty() {
                failures.push(format!("{agent} {ending:?}: still running: {left:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

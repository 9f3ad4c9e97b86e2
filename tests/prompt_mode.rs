//! Prompt mode (`coda-<agent> --prompt`): the binaries run with the scripted test agent (and a replayed
//! recording) as child, with stdin not a terminal, and the transcript, the exit status, the refusal of
//! permission requests and Ctrl-C are checked. A live run on the real CLIs is opt-in (`CODA_LIVE=1`).

use crate::support;

use support::{coda_text, fake_model, live, shim, temp, wait};

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A temporary working directory for one test (removed when the guard drops, also on failure), and its
/// canonical path.
fn workdir(name: &str) -> (temp::TempDir, PathBuf) {
    let guard = temp::TempDir::new(&format!("coda-prompt-{name}"));
    let dir = guard.path().canonicalize().expect("canonical work dir");
    (guard, dir)
}

/// `coda-<agent> --agent-command <test agent> --cwd <dir> --prompt <text> [extra...]`, stdin not a terminal.
fn prompt_command(agent: &str, dir: &Path, prompt: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(shim::binary(agent));
    cmd.arg("--agent-command")
        .arg(shell_words::quote(&shim::test_agent().display().to_string()).into_owned())
        .arg("--cwd")
        .arg(dir)
        .arg("--prompt")
        .arg(prompt)
        .args(extra)
        .env_remove("CODA_SHIM_TRACE")
        .env_remove("NO_COLOR")
        .env("CODA_SHIM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

fn run(mut cmd: Command) -> Run {
    let child = cmd.spawn().expect("start the shim");
    let (status, stdout, stderr) = shim::finish(child, Duration::from_secs(30));
    Run { status, stdout, stderr }
}

/// Removes colour sequences (prompt mode writes none without a terminal, but the check must not depend on it).
fn strip_ansi(s: &str) -> String {
    coda_shim::cli::render::strip_ansi(s)
}

fn header(dir: &Path, prompt: &str) -> String {
    format!(
        "agent: (no agentInfo) (protocol 1); declares: loadSession, systemPrompt, waits, compact\n\
         session sess-1 (new) in {}; model not reported\n\
         no current model reported: Coda would refuse the turn (适配器未报告实际模型)\n\
         > {prompt}\n\
         commands: /init /review\n",
        dir.display()
    )
}

#[test]
fn transcript_shows_thinking_tools_plan_usage_and_the_stop_reason() {
    let (_temp, dir) = workdir("rich");
    let r = run(prompt_command("opencode", &dir, "hello !rich", &[]));
    assert_eq!(r.status.code(), Some(0), "stderr: {}", r.stderr);
    let expected = header(&dir, "hello !rich")
        + "thinking: thinking about it\n\
           tool: Read README.md (read) pending\n\
           tool: Read README.md -> completed\n\
           plan:\n  [x] read\n  [ ] fix\n\
           usage: 1200 of 200000 tokens of context\n\
           usage facts: contextTokens 1200\n\
           [{\"text\":\"hello !rich\",\"type\":\"text\"}]\n\
           stop: end_turn\n";
    assert_eq!(strip_ansi(&r.stdout), expected);
    assert!(!r.stdout.contains('\x1b'), "no colours when stdout is not a terminal: {:?}", r.stdout);
}

#[test]
fn exit_status_tells_the_stop_reasons_and_errors_apart() {
    let (_temp, dir) = workdir("stops");
    let cases = [
        ("!stop end_turn", 0, "stop: end_turn"),
        ("!stop max_tokens", 3, "stop: max_tokens"),
        ("!stop max_turn_requests", 4, "stop: max_turn_requests"),
        ("!stop refusal", 5, "stop: refusal"),
        ("!stop cancelled", 6, "stop: cancelled"),
        ("!stop sideways", 7, "stop: sideways"),
        ("!fail", 1, "error -32603: failed as asked"),
        ("!exit 3", 9, "error -32603: agent process exited with status 3"),
    ];
    for (prompt, code, row) in cases {
        let r = run(prompt_command("grok", &dir, prompt, &[]));
        let out = strip_ansi(&r.stdout);
        assert_eq!(r.status.code(), Some(code), "{prompt}: {out}\nstderr: {}", r.stderr);
        assert!(out.lines().any(|l| l == row), "{prompt}: no row {row:?} in\n{out}");
    }
}

#[test]
fn permission_requests_are_refused_when_stdin_is_not_a_terminal() {
    let (_temp, dir) = workdir("permission");
    let r = run(prompt_command("kimi", &dir, "go !permission", &[]));
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(0), "{out}\nstderr: {}", r.stderr);
    assert!(
        out.contains(
            "permission: Delete build/; options: Allow once (allow_once), Reject (reject_once)\n  -> refused: stdin is not a terminal (outcome cancelled)\n"
        ),
        "{out}"
    );
    // What the agent got back: ACP's cancelled outcome, never a selected option.
    assert!(out.contains(r#"permission outcome: {"outcome":{"outcome":"cancelled"}}"#), "{out}");
}

#[test]
fn waits_are_rows_and_prompt_mode_stays_until_they_settle() {
    let (_temp, dir) = workdir("waits");
    let r = run(prompt_command("opencode", &dir, "build !wait 150", &[]));
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(0), "{out}\nstderr: {}", r.stderr);
    let tail: Vec<&str> = out.lines().skip(5).collect();
    assert_eq!(
        tail,
        [
            "wait build started (task, waiting): build - npm run build [stoppable]",
            r#"[{"text":"build !wait 150","type":"text"}]"#,
            "stop: end_turn",
            "1 wait(s) still open; watching them settle (up to 10m; Ctrl-C to stop)",
            "wait build handling",
            "wait build done",
            "every wait settled",
        ]
    );
}

#[test]
fn wait_timeout_gives_up_with_its_own_exit_status() {
    let (_temp, dir) = workdir("wait-timeout");
    let started = Instant::now();
    let r = run(prompt_command("opencode", &dir, "!wait-open", &["--wait-timeout", "1s"]));
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(10), "{out}");
    assert!(out.contains("wait forever started (timer, waiting): never ends\n"), "{out}");
    assert!(out.contains("1 wait(s) still open after --wait-timeout; giving up\n"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
}

#[test]
fn waits_coda_would_drop_say_why() {
    let (_temp, dir) = workdir("bad-waits");
    let r = run(prompt_command("opencode", &dir, "!bad-wait", &[]));
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(0), "{out}");
    for row in [
        "wait late done: not registered (a first report must not be terminal)",
        r#"wait dropped by Coda: sessionId, waitId and state are required: {"sessionId":"sess-1","state":"waiting"}"#,
        r#"wait odd dropped by Coda: state "finished" is not one Coda knows"#,
    ] {
        assert!(out.lines().any(|l| l == row), "no row {row:?} in\n{out}");
    }
    assert!(!out.contains("still open"), "dropped reports open nothing: {out}");
}

#[test]
fn needing_a_login_has_its_own_exit_status() {
    let (_temp, dir) = workdir("login");
    let mut cmd = prompt_command("grok", &dir, "hi", &[]);
    cmd.env("TEST_AGENT_AUTH_REQUIRED", "1");
    let r = run(cmd);
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(8), "{out}");
    assert!(out.contains("session/new: the agent needs a login (error -32000: Authentication required)\n"), "{out}");
}

#[test]
fn a_prompt_answered_with_auth_required_exits_as_needing_a_login() {
    let (_temp, dir) = workdir("login-prompt");
    let r = run(prompt_command("kimi", &dir, "hi !auth", &[]));
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(8), "exit 8: the agent needs a login (-32000): {out}");
    assert!(
        out.ends_with("session/prompt: the agent needs a login (error -32000: Authentication required)\n"),
        "{out}"
    );
}

#[test]
fn json_prints_the_frames_of_every_edge_with_codas_client_capabilities() {
    let (_temp, dir) = workdir("json");
    let file = dir.join("instruction.md");
    std::fs::write(&file, "Reply in English.").expect("write the instruction");
    let instruction = format!("@{}", file.display());
    let r = run(prompt_command("opencode", &dir, "hello", &["--json", "--system-prompt", &instruction]));
    assert_eq!(r.status.code(), Some(0), "stderr: {}", r.stderr);
    let records: Vec<Value> =
        r.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let dirs: std::collections::BTreeSet<&str> = records.iter().filter_map(|r| r["dir"].as_str()).collect();
    assert_eq!(dirs.into_iter().collect::<Vec<_>>(), ["agent->shim", "client->shim", "shim->agent", "shim->client"]);
    let init = &records[0];
    assert_eq!(init["dir"], "client->shim");
    assert_eq!(init["frame"]["method"], "initialize");
    assert_eq!(
        init["frame"]["params"]["clientCapabilities"],
        json!({"elicitation": {"form": {}, "url": {}}, "session": {"compaction": {}, "configOptions": {"boolean": {}}},
               "_meta": {"coda": {"waits": {}, "remote": {}}}})
    );
    let new = records
        .iter()
        .find(|r| r["dir"] == "client->shim" && r["frame"]["method"] == "session/new")
        .expect("session/new sent");
    assert_eq!(
        new["frame"]["params"]["systemPrompt"],
        json!({"mode": "append", "content": [{"type": "text", "text": "Reply in English."}]})
    );
    // The instruction layer did its work on the agent's side of the same run.
    let prompt = records
        .iter()
        .find(|r| r["dir"] == "shim->agent" && r["frame"]["method"] == "session/prompt")
        .expect("session/prompt forwarded");
    assert_eq!(
        prompt["frame"]["params"]["prompt"][0]["text"],
        "<coda-session-instruction>\nReply in English.\n</coda-session-instruction>\n\n"
    );
}

#[test]
fn load_opens_the_given_session() {
    let (_temp, dir) = workdir("load");
    let r = run(prompt_command("grok", &dir, "again", &["--load", "sess-9"]));
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(0), "{out}");
    assert!(out.contains(&format!("session sess-9 (loaded) in {}; model not reported\n", dir.display())), "{out}");
    assert!(out.contains("stop: end_turn\n"), "{out}");
}

#[test]
fn usage_errors_exit_2_and_help_lists_the_exit_statuses() {
    let r = run({
        let mut cmd = Command::new(shim::binary("kimi"));
        cmd.args(["--cwd", "/"]).stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        cmd
    });
    assert_eq!(r.status.code(), Some(2));
    assert!(r.stderr.contains("--cwd needs --prompt"), "{}", r.stderr);
    let (_temp, dir) = workdir("usage");
    let r = run(prompt_command("kimi", &dir, "x", &["--system-prompt", "@/nonexistent/instruction"]));
    assert_eq!(r.status.code(), Some(2), "{}", r.stderr);
    let help = run({
        let mut cmd = Command::new(shim::binary("kimi"));
        cmd.arg("--help").stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        cmd
    });
    for line in ["0 the turn ended with end_turn", "6 stop reason cancelled", "130 stopped by a second Ctrl-C"] {
        assert!(help.stdout.contains(line), "--help lacks {line:?}:\n{}", help.stdout);
    }
}

/// What a child writes on stdout, read on a thread as it comes.
struct Transcript {
    text: Arc<Mutex<String>>,
    /// Set once the child's stdout has closed.
    ended: Arc<AtomicBool>,
}

impl Transcript {
    fn read(mut out: impl Read + Send + 'static) -> Transcript {
        let (text, ended) = (Arc::new(Mutex::new(String::new())), Arc::new(AtomicBool::new(false)));
        let (sink, end) = (text.clone(), ended.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            end.store(true, Ordering::SeqCst);
        });
        Transcript { text, ended }
    }

    /// What has come so far (for a failure message).
    fn so_far(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Waits until `mark` has come.
    fn wait_for(&self, mark: &str) {
        wait::until(
            wait::WITHIN,
            || self.text.lock().unwrap().contains(mark).then_some(()),
            || format!("no {mark:?} in {:?}", self.so_far()),
        );
    }

    /// All of it, once the child has closed its stdout (after it exited: nothing still on its way is missed).
    fn to_the_end(&self) -> String {
        wait::until(
            wait::WITHIN,
            || self.ended.load(Ordering::SeqCst).then_some(()),
            || format!("stdout still open; so far {:?}", self.so_far()),
        );
        self.so_far()
    }
}

/// Starts `cmd` with its stdout read as it comes, and waits until `mark` has come.
fn start_until(cmd: &mut Command, mark: &str) -> (Child, Transcript) {
    let mut child = cmd.spawn().expect("start the shim");
    let seen = Transcript::read(child.stdout.take().expect("stdout"));
    seen.wait_for(mark);
    (child, seen)
}

fn sigint(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("send SIGINT");
}

fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pids of a process's children (Linux `/proc`).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

#[test]
fn ctrl_c_sends_session_cancel_and_the_turn_ends_cancelled() {
    let (_temp, dir) = workdir("ctrl-c");
    let (mut child, seen) =
        start_until(&mut prompt_command("grok", &dir, "wait !hang", &[]), "hanging until cancelled");
    sigint(&child);
    let status = wait_exit(&mut child, Duration::from_secs(15));
    let out = strip_ansi(&seen.to_the_end());
    // The test agent answers `cancelled` only when session/cancel reached it.
    assert_eq!(status.code(), Some(6), "{out}");
    assert!(
        out.ends_with(
            "hanging until cancelled\n^C sent session/cancel; press Ctrl-C again to stop the agent\nstop: cancelled\n"
        ),
        "{out}"
    );
}

#[test]
fn a_second_ctrl_c_shuts_the_agent_down() {
    let (_temp, dir) = workdir("ctrl-c-twice");
    let (mut child, seen) =
        start_until(&mut prompt_command("grok", &dir, "wait !hang !deaf", &[]), "hanging until cancelled");
    let agents = children_of(child.id());
    assert_eq!(agents.len(), 2, "two children: the agent and the watchdog of its group (src/watchdog.rs)");
    sigint(&child);
    seen.wait_for("press Ctrl-C again");
    sigint(&child);
    let status = wait_exit(&mut child, Duration::from_secs(10));
    let out = strip_ansi(&seen.to_the_end());
    assert_eq!(status.code(), Some(130), "{out}");
    assert!(out.contains("^C stopping the agent\n"), "{out}");
    assert!(!out.contains("stop: "), "the deaf agent never ended the turn: {out}");
    // The watchdog dies by the group's SIGKILL too, but may not be reaped before the shim exits: a zombie
    // left to init is no process that runs. Polled, as it goes at the shim's exit, not before.
    for pid in agents {
        wait::gone(pid as i32, Duration::from_secs(2));
    }
}

/// A real OpenCode turn with a shell tool call, recorded from prompt mode (`CODA_PROMPT_RECORD`, then
/// `acp-replay record`) and replayed by `acp-replay play`, drives the same transcript offline. The player
/// checks every frame the shim sends it, so the frames prompt mode sends are checked too (a new crate
/// version changes `clientInfo.version`: record again).
#[test]
fn replayed_opencode_recording_gives_the_recorded_transcript() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/opencode/prompt-mode-tool");
    let expected = std::fs::read_to_string(fixture.join("transcript.txt")).expect("the fixture's transcript.txt");
    let (_temp, dir) = workdir("replay");
    let player = PathBuf::from(env!("CARGO_BIN_EXE_acp-replay"));
    let mut cmd = Command::new(shim::binary("opencode"));
    cmd.arg("--agent-command")
        .arg(shell_words::join([player.display().to_string(), "play".into(), fixture.display().to_string()]))
        .arg("--cwd")
        .arg(&dir)
        .args(["--prompt", "Run it: [[sh:echo hi]]", "--system-prompt", "Answer briefly."])
        .env("CODA_SHIM_LOG", "warn")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let r = run(cmd);
    let got = strip_ansi(&r.stdout).replace(&dir.display().to_string(), "{{CWD}}");
    assert_eq!(r.status.code(), Some(0), "stdout: {got}\nstderr: {}", r.stderr);
    assert_eq!(got, expected);
}

/// Live (opt-in, `CODA_LIVE=1` after `scripts/install-clis`): prompt mode on each real CLI against the fake
/// model. Prints the transcripts; `CODA_PROMPT_RECORD=DIR` also keeps each run's trace there.
#[test]
fn live_prompt_mode_on_the_real_clis() {
    let agents = live::selected_agents("prompt mode on the real CLIs");
    if agents.is_empty() {
        return;
    }
    let model = fake_model::FakeModel::start();
    for agent in agents {
        let guard = temp::TempDir::new(&format!("coda-live-prompt-{agent}"));
        let temp = guard.path().to_path_buf();
        let lc = live::prepare(agent, &model.base_url(), &temp).expect("prepare the CLI");
        let mut doctor = lc.shim_command(&shim::binary(agent));
        doctor.arg("doctor").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let (status, out, _) = shim::finish(doctor.spawn().expect("start doctor"), Duration::from_secs(180));
        println!(
            "=== coda-{agent} doctor (exit {:?})\n{}",
            status.code(),
            out.replace(&temp.display().to_string(), "<tmp>")
        );
        let prompts = std::env::var("CODA_LIVE_PROMPTS").unwrap_or_else(|_| "Say hello.".into());
        for (n, prompt) in prompts.split("||").enumerate() {
            let mut cmd = lc.shim_command(&shim::binary(agent));
            let trace = temp.join(format!("trace-{n}.jsonl"));
            cmd.arg("--prompt")
                .arg(prompt)
                .arg("--cwd")
                .arg(&lc.workdir)
                .arg("--system-prompt")
                .arg(format!(
                    "@{}",
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/coda-instruction.md").display()
                ))
                .arg("--wait-timeout")
                .arg("60s")
                .arg("--trace-file")
                .arg(&trace)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = cmd.spawn().expect("start the shim");
            let (status, out, err) = shim::finish(child, Duration::from_secs(180));
            let shown = strip_ansi(&out).replace(&lc.workdir.display().to_string(), "<work>");
            println!("=== coda-{agent} --prompt {prompt:?} (exit {:?})\n{shown}", status.code());
            if !status.success() {
                println!("--- stderr\n{err}");
            }
            if let Some(dir) = std::env::var_os("CODA_PROMPT_RECORD") {
                let keep = Path::new(&dir).join(format!("{agent}-{n}"));
                let _ = std::fs::create_dir_all(&keep);
                let _ = std::fs::copy(&trace, keep.join("trace.jsonl"));
                let _ = std::fs::write(keep.join("root"), temp.display().to_string());
                let _ = std::fs::write(keep.join("transcript.txt"), &out);
            }
            assert!(status.code().is_some(), "coda-{agent} was killed");
            // Coda's real-size instruction went to the agent; the transcript (the client's view) shows none of it.
            assert_eq!(coda_text::leak(&serde_json::Value::String(out.clone())), None, "coda-{agent}");
        }
        if std::env::var_os("CODA_PROMPT_RECORD").is_some() {
            // The recordings name it as their root.
            guard.keep();
        }
    }
}

/// On a terminal (a pty from util-linux `script`): the permission request is asked, `y` allows it once, and
/// the transcript has colours.
#[test]
fn on_a_terminal_permissions_are_asked_y_n_and_rows_are_coloured() {
    let Some(script) = ["/usr/bin/script", "/bin/script"].into_iter().map(Path::new).find(|p| p.is_file()) else {
        // CI's machine has util-linux: there, a missing `script` is a failure, not a skip.
        assert!(std::env::var_os("CI").is_none(), "CI is set but there is no `script` (util-linux)");
        eprintln!("skipped: no `script` (util-linux) to give prompt mode a terminal");
        return;
    };
    let (_temp, dir) = workdir("tty");
    let inner = shell_words::join([
        shim::binary("grok").display().to_string(),
        "--agent-command".into(),
        shell_words::quote(&shim::test_agent().display().to_string()).into_owned(),
        "--cwd".into(),
        dir.display().to_string(),
        "--prompt".into(),
        "go !permission".into(),
    ]);
    let mut child = Command::new(script)
        .args(["-qec", &inner, "/dev/null"])
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start script");
    let mut stdin = child.stdin.take().expect("stdin");
    let seen = Transcript::read(child.stdout.take().expect("stdout"));
    seen.wait_for("allow? [y/N]");
    std::io::Write::write_all(&mut stdin, b"y\n").expect("answer");
    let status = wait_exit(&mut child, Duration::from_secs(15));
    drop(stdin);
    let raw = seen.to_the_end();
    let out = strip_ansi(&raw).replace('\r', "");
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(raw.contains("\x1b[32mstop: end_turn\x1b[0m"), "coloured stop row: {raw:?}");
    assert!(out.contains("  -> allowed: Allow once\n"), "{out}");
    assert!(out.contains(r#"permission outcome: {"outcome":{"optionId":"allow","outcome":"selected"}}"#), "{out}");
}

/// `--compact` under coda-grok with the test agent as Grok: the shim declares compaction and asks the agent,
/// which has no `_x.ai/compact_conversation`; prompt mode prints the shim's answer and exits 11.
#[test]
fn compact_after_the_turn_prints_the_answer_and_not_compacted_has_its_exit_status() {
    let (_temp, dir) = workdir("compact-refused");
    let r = run(prompt_command("grok", &dir, "hello", &["--compact"]));
    let out = strip_ansi(&r.stdout);
    assert_eq!(r.status.code(), Some(11), "{out}\nstderr: {}", r.stderr);
    let rows: Vec<&str> = out.lines().collect();
    let stop = rows.iter().position(|l| *l == "stop: end_turn").expect("the turn ends first");
    assert_eq!(rows[stop + 1], "> _coda/session/compact sess-1");
    assert!(rows[stop + 2].starts_with("not compacted: Grok could not compact: "), "{out}");
    // Without --prompt it is a usage error.
    let mut bare = Command::new(shim::binary("grok"));
    bare.arg("--compact").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let r = run(bare);
    assert_eq!(r.status.code(), Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("--compact needs --prompt"), "{}", r.stderr);
}

/// The prompt and compaction of `fixtures/grok/prompt-mode-compact` (recorded by the live test below).
const COMPACT_PROMPT: &str = "Say hello.";

fn compact_transcript_checks(out: &str) {
    let rows: Vec<&str> = out.lines().collect();
    let stop = rows.iter().position(|l| *l == "stop: end_turn").unwrap_or_else(|| panic!("no stop row: {out}"));
    let ask = rows.iter().position(|l| l.starts_with("> _coda/session/compact ")).expect("the compaction");
    assert!(stop < ask, "{out}");
    let done = rows[ask + 1..].iter().find(|l| l.starts_with("compacted")).unwrap_or_else(|| panic!("{out}"));
    let counts: Vec<u64> = done.trim_start_matches("compacted: ").split(' ').filter_map(|w| w.parse().ok()).collect();
    assert_eq!(counts.len(), 2, "before and after: {done}");
    let facts: Vec<&&str> = rows.iter().filter(|l| l.starts_with("usage facts: ")).collect();
    assert!(facts[0].starts_with("usage facts: lastRequestAt 20") && facts[0].contains(", contextTokens "), "{out}");
    let last = facts.last().expect("facts");
    assert!(last.contains(", compactedAt 20"), "the facts after the compaction carry compactedAt: {out}");
    assert!(rows.iter().rposition(|l| l.starts_with("usage facts:")) > Some(ask), "{out}");
}

/// The recording replays: prompt mode's own frames (initialize, session/new, the prompt, the compaction) are
/// checked by the player, and the transcript shows Grok's counts and the usage facts as they changed.
#[test]
fn replayed_grok_compaction_gives_the_recorded_transcript() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/grok/prompt-mode-compact");
    let expected = std::fs::read_to_string(fixture.join("transcript.txt")).expect("the fixture's transcript.txt");
    let (_temp, dir) = workdir("replay-compact");
    let player = PathBuf::from(env!("CARGO_BIN_EXE_acp-replay"));
    let mut cmd = Command::new(shim::binary("grok"));
    cmd.arg("--agent-command")
        .arg(shell_words::join([player.display().to_string(), "play".into(), fixture.display().to_string()]))
        .arg("--cwd")
        .arg(&dir)
        .args(["--prompt", COMPACT_PROMPT, "--compact"])
        .env("CODA_SHIM_LOG", "warn")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let r = run(cmd);
    let got = strip_ansi(&r.stdout).replace(&dir.display().to_string(), "{{CWD}}");
    assert_eq!(r.status.code(), Some(0), "stdout: {got}\nstderr: {}", r.stderr);
    compact_transcript_checks(&got);
    assert_eq!(got, expected);
}

/// Live (opt-in, `CODA_LIVE=1`, Grok): `--prompt … --compact` on the real Grok against the fake model compacts
/// after the turn; with `CODA_RECORD=1` the run becomes `fixtures/grok/prompt-mode-compact`.
#[test]
fn live_prompt_mode_compact_on_grok() {
    if !live::wanted("grok", "prompt mode --compact on Grok") {
        return;
    }
    let model = fake_model::FakeModel::start();
    let guard = temp::TempDir::new("coda-live-prompt-compact");
    let root = guard.path().to_path_buf();
    let lc = live::prepare("grok", &model.base_url(), &root).expect("prepare Grok");
    let trace = root.join("prompt-mode-compact.jsonl");
    let mut cmd = lc.shim_command(&shim::binary("grok"));
    cmd.args(["--prompt", COMPACT_PROMPT, "--compact", "--cwd"])
        .arg(&lc.workdir)
        .arg("--trace-file")
        .arg(&trace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (status, out, err) = shim::finish(cmd.spawn().expect("start the shim"), Duration::from_secs(180));
    let shown = strip_ansi(&out).replace(&lc.workdir.display().to_string(), "{{CWD}}");
    println!("{shown}");
    assert_eq!(status.code(), Some(0), "{shown}\nstderr: {err}");
    compact_transcript_checks(&shown);
    assert!(model.model_requests().iter().any(|r| r.body.to_string().contains("concise summary of the conversation")));
    support::recorder::keep(
        "grok",
        "prompt-mode-compact",
        &trace,
        &root,
        "coda-grok --prompt \"Say hello.\" --compact against the fake model; transcript.txt is what prompt mode \
         prints for it (tests/prompt_mode.rs)",
    );
    if std::env::var_os("CODA_RECORD").is_some() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/grok/prompt-mode-compact");
        std::fs::write(dir.join("transcript.txt"), &shown).expect("write transcript.txt");
    }
}

//! Live: records the Kimi activity fixtures (`fixtures/kimi/<scenario>/`) from the real Kimi Code CLI and
//! proves each recording replays through coda-kimi with `acp-replay` re-creating Kimi's file writes.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test all kimi_live:: -- --nocapture` (after `scripts/install-clis kimi`).
//! `CODA_RECORD=1` also writes the fixtures (review the diff before committing); `CODA_KIMI_ONLY=a,b` limits
//! the scenarios. Each scenario runs coda-kimi with `--trace-file` and `CODA_KIMI_RECORD` (the watcher's file
//! log, with the session's files as found when it opened) against `kimi acp` and the fake model, and prints
//! what Coda received (`expected.txt` notation, see tests/support/kimi_expected.rs).

use crate::support;

use support::{coda_text, fake_model, kimi_expected as kimi_common, live, replay as replay_support, shim};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coda_shim::replay::{self, Normaliser};
use serde_json::{Value, json};

/// Quiet time after which a scenario whose waits have all ended is over.
const QUIET: Duration = Duration::from_millis(1500);

/// One coda-kimi process against the live CLI, playing Coda.
struct Run {
    shim: shim::Shim,
    next_id: i64,
    /// waitId -> latest state.
    waits: BTreeMap<String, String>,
    /// Every frame received, for the report.
    log: Vec<Value>,
}

impl Run {
    fn start(lc: &live::LiveCommand, trace: &Path, files: &Path) -> Run {
        let cmd = lc.shim_command(&replay_support::shim_binary("kimi"));
        let shim = shim::Builder::from_command(cmd)
            .env("CODA_KIMI_RECORD", &files.display().to_string())
            .arg("--trace-file")
            .arg(&trace.display().to_string())
            .start();
        Run { shim, next_id: 1, waits: BTreeMap::new(), log: Vec::new() }
    }

    /// Handles one received frame: approves permission requests, tracks waits.
    fn take(&mut self, line: &str) -> Value {
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        if v["method"] == "session/request_permission" {
            let answer = json!({"jsonrpc": "2.0", "id": v["id"],
                "result": {"outcome": {"outcome": "selected", "optionId": "approve_once"}}});
            self.shim.send_json(&answer);
        }
        if v["method"] == "_coda/wait" {
            let p = &v["params"];
            let id = p["waitId"].as_str().unwrap_or("").to_owned();
            self.waits.insert(id, p["state"].as_str().unwrap_or("").to_owned());
        }
        self.log.push(v.clone());
        v
    }

    fn send(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.shim.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// Reads frames until the answer to `id`.
    fn answer(&mut self, id: i64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let Some(line) = self.shim.try_recv(Duration::from_millis(200)) else { continue };
            let v = self.take(&line);
            if v["id"] == json!(id) && v.get("method").is_none() {
                return v;
            }
        }
        panic!("no answer to request {id}; stderr: {:?}", self.shim.drain_stderr());
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        let answer = self.answer(id);
        assert!(answer.get("result").is_some(), "{method} failed: {answer}");
        answer
    }

    fn prompt(&mut self, sid: &str, text: &str) -> Value {
        self.call("session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}))
    }

    fn all_ended(&self) -> bool {
        self.waits.values().all(|s| ["done", "failed", "cancelled"].contains(&s.as_str()))
    }

    /// Reads frames until `until` holds, every wait has ended and nothing came for [`QUIET`].
    fn settle_until(&mut self, within: Duration, until: impl Fn(&Run) -> bool) {
        let deadline = Instant::now() + within;
        let mut quiet_since = Instant::now();
        while Instant::now() < deadline {
            match self.shim.try_recv(Duration::from_millis(100)) {
                Some(line) => {
                    self.take(&line);
                    quiet_since = Instant::now();
                }
                None if until(self) && self.all_ended() && quiet_since.elapsed() >= QUIET => return,
                None => {}
            }
        }
        eprintln!("settle: gave up after {within:?}; waits {:?}", self.waits);
    }

    fn settle(&mut self, within: Duration) {
        self.settle_until(within, |_| true);
    }

    /// Reads frames until one satisfies `want`.
    fn until(&mut self, within: Duration, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(line) = self.shim.try_recv(Duration::from_millis(100)) {
                let v = self.take(&line);
                if want(&v) {
                    return v;
                }
            }
        }
        panic!("the awaited frame never came; waits {:?}", self.waits);
    }

    fn initialize(&mut self) {
        let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
            "_meta": {"coda": {"waits": {}}}});
        self.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": caps}));
    }

    /// `session/new` with Coda's real-size instruction (`fixtures/coda-instruction.md`), as Coda sends it.
    fn new_session(&mut self, cwd: &str) -> String {
        let sp = coda_text::system_prompt(coda_text::INSTRUCTION);
        let answer = self.call("session/new", json!({"cwd": cwd, "mcpServers": [], "systemPrompt": sp}));
        answer["result"]["sessionId"].as_str().expect("a sessionId").to_owned()
    }

    fn finish(mut self) -> Vec<Value> {
        self.shim.close_stdin();
        let status = self.shim.wait(Duration::from_secs(20));
        assert!(status.success(), "the shim exited with {status}; stderr: {:?}", self.shim.drain_stderr());
        self.log
    }

    /// Ends the process whatever its exit status (Kimi with a background command running does not exit on
    /// stdin EOF by itself; the shim's ladder ends it with SIGTERM).
    fn end(mut self) -> std::process::ExitStatus {
        self.shim.close_stdin();
        self.shim.wait(Duration::from_secs(20))
    }
}

fn wait_state(v: &Value, state: &str) -> bool {
    v["method"] == "_coda/wait" && v["params"]["state"] == state
}

/// Normalises the trace and the file log, replays them through coda-kimi, prints what Coda received, and with
/// `CODA_RECORD=1` writes the fixture.
fn keep(scenario: &str, trace: &Path, files: &Path, root: &Path, notes: &str) {
    let mut n = Normaliser::for_live_root(root);
    n.add(&live::live_root().display().to_string(), "LIVE");
    let norm = |path: &Path| -> String {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().filter(|l| !l.trim().is_empty()).map(|l| n.apply(l) + "\n").collect()
    };
    // Raw records (with `ts`): coda_shim::replay::load merges files.jsonl beside trace.jsonl by time.
    let (trace_text, files_text) = (norm(trace), norm(files));
    for (what, text) in [("trace", &trace_text), ("file log", &files_text)] {
        let left = n.leftovers(text);
        assert!(left.is_empty(), "kimi/{scenario}: the {what} still names {left:?}");
    }
    let scratch = root.join("fixture").join(scenario);
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join(replay::TRACE_FILE), &trace_text).unwrap();
    std::fs::write(scratch.join(replay::FILES_FILE), &files_text).unwrap();
    let seen = kimi_common::summary(&trace_text);
    eprintln!("kimi/{scenario}: what Coda received:\n  {}", seen.join("\n  "));
    let report = replay_support::check("kimi", &scratch);
    match &report {
        Ok(r) => eprintln!("kimi/{scenario}: replayed through coda-kimi: {r:?}"),
        Err(e) => eprintln!("kimi/{scenario}: REPLAY FAILED: {e}"),
    }
    if std::env::var_os("CODA_RECORD").is_some() {
        let dir: PathBuf = replay_support::fixtures_root().join("kimi").join(scenario);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(replay::TRACE_FILE), &trace_text).unwrap();
        std::fs::write(dir.join(replay::FILES_FILE), &files_text).unwrap();
        std::fs::write(dir.join("expected.txt"), seen.join("\n") + "\n").unwrap();
        let meta = json!({"agent": "kimi", "scenario": scenario, "cli": "@moonshot-ai/kimi-code@2.1.0",
            "recorded_by": "tests/kimi_live.rs", "notes": notes});
        std::fs::write(dir.join("meta.json"), format!("{meta:#}\n")).unwrap();
        eprintln!("wrote {}", dir.display());
    }
    if let Err(e) = report {
        FAILED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("kimi/{scenario}: the recording does not replay: {e}"));
    }
}

/// Replays that failed (the other scenarios still run); each test takes its own (the live tests run one at a time).
static FAILED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The replays that failed since the last call: taken out, so that no other test reports them, and read without
/// the lock held (a failed assertion poisons no lock for the tests after it).
fn take_failed() -> Vec<String> {
    std::mem::take(&mut *FAILED.lock().unwrap_or_else(|p| p.into_inner()))
}

fn wanted(scenario: &str) -> bool {
    std::env::var("CODA_KIMI_ONLY").map_or(true, |only| only.split(',').any(|s| s.trim() == scenario))
}

struct Live {
    lc: live::LiveCommand,
    root: PathBuf,
    cwd: String,
    model: fake_model::FakeModel,
}

impl Live {
    fn start() -> Option<Live> {
        Live::start_named("coda-kimi-live")
    }

    /// The same, with its files under `<temp>/<name>-<pid>`.
    fn start_named(name: &str) -> Option<Live> {
        if !live::wanted("kimi", "live Kimi recordings") {
            return None;
        }
        let model = fake_model::FakeModel::start();
        let root = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let lc = live::prepare("kimi", &model.base_url(), &root).expect("prepare kimi");
        let cwd = lc.workdir.display().to_string();
        Some(Live { lc, root, cwd, model })
    }

    fn paths(&self, scenario: &str) -> (PathBuf, PathBuf) {
        let dir = self.root.join("traces");
        std::fs::create_dir_all(&dir).unwrap();
        (dir.join(format!("{scenario}.trace.jsonl")), dir.join(format!("{scenario}.files.jsonl")))
    }

    /// Kimi's model with a context window of `tokens` (its config.toml, written by the rig, edited).
    fn with_window(self, tokens: u64) -> Live {
        let config = self.lc.home.join(".kimi-code/config.toml");
        let text = std::fs::read_to_string(&config).expect("the rig's Kimi config");
        assert!(text.contains("max_context_size = 131072"), "the rig's Kimi config changed: {text}");
        std::fs::write(&config, text.replace("max_context_size = 131072", &format!("max_context_size = {tokens}")))
            .unwrap();
        self
    }

    fn new_session_in(&self, run: &mut Run) -> String {
        run.new_session(&self.cwd)
    }

    /// A fresh process with a new session: runs `script`, then keeps the recording.
    fn scenario(&self, scenario: &str, notes: &str, script: impl FnOnce(&mut Run, &str)) {
        if !wanted(scenario) {
            return;
        }
        let (trace, files) = self.paths(scenario);
        let mut run = Run::start(&self.lc, &trace, &files);
        run.initialize();
        let sid = run.new_session(&self.cwd);
        script(&mut run, &sid);
        run.finish();
        keep(scenario, &trace, &files, &self.root, notes);
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if std::env::var_os("CODA_KEEP_LIVE").is_none() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[test]
fn record_kimi_activity() {
    let Some(live) = Live::start() else { return };
    take_failed();
    let long = Duration::from_secs(40);

    live.scenario(
        "bg-ends-in-turn",
        "a background command that ends while a parallel foreground one still runs",
        |run, sid| {
            run.prompt(sid, "[[bg:sleep 0.5]] [[sh:sleep 1.5]]");
            run.settle(long);
        },
    );
    live.scenario("bg-ends-after-turn", "ends after the turn: handling, Kimi's own turn, settled", |run, sid| {
        run.prompt(sid, "[[bg:sleep 1]]");
        run.settle(long);
    });
    live.scenario("bg-fails", "a background command exiting 3 after the turn", |run, sid| {
        run.prompt(sid, "[[bg:sleep 0.5; exit 3]]");
        run.settle(long);
    });
    live.scenario("bg-stopped", "TaskStop of a running background command, in the next turn", |run, sid| {
        run.prompt(sid, "[[bg:sleep 30]]");
        run.prompt(sid, r#"stop it [[tool:TaskStop|{"task_id":"$last_task","reason":"not needed"}]]"#);
        run.settle(long);
    });
    live.scenario("bg-waitfor", "WaitFor consumes the result of a background command", |run, sid| {
        run.prompt(sid, "[[bg:sleep 2]]");
        run.prompt(sid, r#"wait for it [[tool:WaitFor|{"timeout":30,"task_id":"$last_task"}]]"#);
        run.settle(long);
    });
    live.scenario("subagent-background", "a background subagent", |run, sid| {
        run.prompt(sid, "[[subagent:[[text:sub done]]]]");
        run.settle(long);
    });
    live.scenario("subagent-foreground", "a foreground subagent", |run, sid| {
        run.prompt(sid, "[[subagent-fg:[[text:fg done]]]]");
        run.settle(long);
    });
    live.scenario(
        "subagent-resumed-twice",
        "one subagent run, then resumed twice (Kimi resumes in the background)",
        |run, sid| {
            run.prompt(sid, "[[subagent-fg:[[text:run one]]]]");
            run.settle(long);
            run.prompt(sid, "[[resume:last|[[text:run two]]]]");
            run.settle(long);
            run.prompt(sid, "[[resume:last|[[text:run three]]]]");
            run.settle(long);
        },
    );
    live.scenario(
        "subagent-own-background-command",
        "a foreground subagent starts a background command that ends after its run",
        |run, sid| {
            run.prompt(sid, "[[subagent-fg:[[bg:sleep 1]]]]");
            run.settle(long);
        },
    );
    live.scenario(
        "two-tasks-ending-together",
        "two `sleep 2` started in one parallel tool call (identical calls would be one task: Kimi dedupes them)",
        |run, sid| {
            run.prompt(sid, "[[bg:sleep 2; echo a]] [[bg:sleep 2; echo b]]");
            run.settle(long);
        },
    );
    live.scenario("two-tasks-ending-close-together", "two tasks ending 10 ms apart", |run, sid| {
        run.prompt(sid, "[[bg:sleep 2]] [[bg:sleep 2.01]]");
        run.settle(long);
    });
    live.scenario(
        "prompt-during-kimi-turn",
        "Coda's prompt sent the moment the shim reports handling (Kimi's own turn): held until that turn ends",
        |run, sid| {
            run.prompt(sid, "[[bg:sleep 1]]");
            run.until(long, |v| wait_state(v, "handling"));
            run.prompt(sid, "meanwhile [[text:second answer]]");
            run.settle(long);
        },
    );

    // session/load in a new process after the previous one ended with a background command running.
    if wanted("load-after-restart") {
        let (trace, files) = live.paths("load-before-restart");
        let mut run = Run::start(&live.lc, &trace, &files);
        run.initialize();
        let sid = run.new_session(&live.cwd);
        run.prompt(&sid, "[[bg:sleep 60]]");
        run.settle_until(Duration::from_secs(5), |_| true);
        let status = run.end();
        eprintln!("kimi/load-after-restart: the first process (a command still running) ended with {status}");
        let (trace, files) = live.paths("load-after-restart");
        let mut run = Run::start(&live.lc, &trace, &files);
        run.initialize();
        run.call("session/load", json!({"sessionId": sid, "cwd": live.cwd, "mcpServers": []}));
        run.settle(Duration::from_secs(5));
        run.prompt(&sid, "[[bg:sleep 0.5]] [[sh:sleep 1.5]]");
        run.settle(long);
        run.finish();
        keep(
            "load-after-restart",
            &trace,
            &files,
            &live.root,
            "session/load in a new process; the previous process ended with `sleep 60` running (Kimi marks it lost); then a command ending in a turn",
        );
    }
    let failed = take_failed();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Kimi's data folder is not trusted (issue #13 §4), with the real CLI: a link to a tree of folders and a link to a
/// file outside, put into a live session's folder, are neither watched nor read, and no content of them reaches
/// stderr; the session's own background command is reported as always.
#[test]
fn links_in_a_live_session_folder_are_not_followed() {
    let Some(live) = Live::start_named("coda-kimi-live-links") else { return };
    let outside = live.root.join("outside");
    for i in 0..300 {
        std::fs::create_dir_all(outside.join(format!("d{i}/e"))).unwrap();
    }
    std::fs::write(outside.join("passwd"), "root:x:0:0:SECRET-LINE-FROM-OUTSIDE:/root:/bin/bash\n").unwrap();
    let (trace, files) = live.paths("links");
    let mut run = Run::start(&live.lc, &trace, &files);
    run.initialize();
    let sid = run.new_session(&live.cwd);
    let sessions = live.lc.home.join(".kimi-code/sessions");
    let dir = std::fs::read_dir(&sessions)
        .unwrap()
        .flatten()
        .map(|d| d.path().join(&sid))
        .find(|p| p.is_dir())
        .expect("Kimi made the session folder");
    std::os::unix::fs::symlink(&outside, dir.join("agents/evil")).unwrap();
    std::fs::create_dir_all(dir.join("agents/sub9")).unwrap();
    std::os::unix::fs::symlink(outside.join("passwd"), dir.join("agents/sub9/wire.jsonl")).unwrap();
    run.prompt(&sid, "[[bg:sleep 0.5]]");
    run.settle(Duration::from_secs(40));
    let states: Vec<&String> = run.waits.values().collect();
    assert_eq!(states, ["done"], "the background command, reported to its end: {:?}", run.waits);
    #[cfg(target_os = "linux")]
    {
        let pid = run.shim.child.id();
        let watches: usize = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .map(|info| info.lines().filter(|l| l.starts_with("inotify wd:")).count())
            .sum();
        assert!(watches < 10, "{watches} inotify watches: the linked tree was walked");
    }
    let links = ["agents/evil is a symbolic link", "agents/sub9/wire.jsonl is a symbolic link"];
    run.shim.stderr_until("a warning for each link", |lines| links.iter().all(|w| lines.iter().any(|l| l.contains(w))));
    // All of stderr, once the shim has exited: no file content anywhere in it.
    run.shim.close_stdin();
    let status = run.shim.wait(Duration::from_secs(20));
    let stderr = run.shim.stderr_to_the_end().join("\n");
    assert!(status.success(), "the shim exited with {status}; stderr: {stderr}");
    assert!(!stderr.contains("SECRET"), "{stderr}");
}

/// The root `usage_update`s Coda received, with their `_meta.coda`.
fn usage_updates(log: &[Value]) -> Vec<Value> {
    log.iter()
        .filter(|v| v["method"] == "session/update" && v["params"]["update"]["sessionUpdate"] == "usage_update")
        .map(|v| v["params"]["update"].clone())
        .collect()
}

/// Milliseconds since the epoch of an ISO 8601 time of `_meta.coda`.
fn iso_ms(v: &Value) -> Option<i128> {
    let t: jiff::Timestamp = v.as_str()?.parse().ok()?;
    Some(t.as_millisecond() as i128)
}

/// The fake model's main-thread requests that are Kimi's own steps (not its compaction summaries).
fn loop_requests(model: &fake_model::FakeModel) -> Vec<fake_model::RecordedRequest> {
    model
        .model_requests()
        .into_iter()
        .filter(|r| {
            r.origin == fake_model::Origin::Main && !r.user_text().starts_with("You are about to run out of context")
        })
        .collect()
}

/// Every root usage_update carries `lastRequestAt` and `contextTokens`, and they are those of a main-thread
/// request of the fake model's log: the same input tokens, `lastRequestAt` at most `tolerance` ms before the
/// server saw it. Returns the largest error (ms) seen, for docs/kimi.md.
fn check_usage_facts(scenario: &str, log: &[Value], model: &fake_model::FakeModel) -> i128 {
    let requests = loop_requests(model);
    let updates = usage_updates(log);
    assert!(!updates.is_empty(), "{scenario}: no usage_update");
    let mut worst = 0;
    for u in &updates {
        let coda = &u["_meta"]["coda"];
        let at = iso_ms(&coda["lastRequestAt"]).unwrap_or_else(|| panic!("{scenario}: no lastRequestAt in {u}"));
        let tokens = coda["contextTokens"].as_u64().unwrap_or_else(|| panic!("{scenario}: no contextTokens in {u}"));
        let seen = requests
            .iter()
            .filter(|r| r.input_tokens == tokens)
            .map(|r| r.at.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i128 - at)
            .min_by_key(|d| d.abs())
            .unwrap_or_else(|| panic!("{scenario}: no request of {tokens} input tokens in the fake model's log ({u})"));
        assert!((0..=200).contains(&seen), "{scenario}: lastRequestAt is {seen} ms off the fake model's log");
        worst = worst.max(seen);
    }
    eprintln!(
        "{scenario}: {} usage_updates, lastRequestAt at most {worst} ms before the fake model saw the request",
        updates.len()
    );
    worst
}

const COMPACT: &str = "_coda/session/compact";

/// Issue 24 on the real Kimi: `_coda/session/compact` between turns (and a prompt sent during it), during a
/// turn, an automatic compaction with a small window, and usage facts over a turn with tool calls and a turn
/// Kimi starts itself; each recorded (`CODA_RECORD=1`) and replayed through coda-kimi.
#[test]
fn record_kimi_compaction_and_usage() {
    let Some(live) = Live::start_named("coda-kimi-live-compact") else { return };
    take_failed();
    let long = Duration::from_secs(40);
    let mut worst = 0;

    if wanted("compact-between-turns") {
        let (trace, files) = live.paths("compact-between-turns");
        let mut run = Run::start(&live.lc, &trace, &files);
        run.initialize();
        let caps = run
            .log
            .iter()
            .find_map(|v| v["result"]["agentCapabilities"]["_meta"]["coda"]["compact"].as_object().cloned());
        assert!(caps.is_some(), "coda-kimi declares agentCapabilities._meta.coda.compact");
        let sid = run.new_session(&live.cwd);
        // A tool's large output makes the context large enough for the summary to be smaller.
        run.prompt(&sid, "[[sh:seq 1 9000]]");
        let before = loop_requests(&live.model).last().map(|r| (r.input_tokens, r.body.to_string().len())).unwrap();
        // Coda's prompt sent right after the request, while Kimi compacts: it runs after the compaction.
        let asked = run.send(COMPACT, json!({"sessionId": sid}));
        let prompt = run.send(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "after [[text:held until compacted]]"}]}),
        );
        let answer = run.answer(asked);
        let at_answer = run.log.len();
        assert_eq!(answer["result"]["compacted"], true, "{answer}");
        let (b, a) = (answer["result"]["before"].as_u64(), answer["result"]["after"].as_u64());
        assert!(b.is_some() && a.is_some(), "Kimi's estimates before and after: {answer}");
        let done = run.answer(prompt);
        assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
        let text: Vec<&Value> = run.log[at_answer..]
            .iter()
            .filter(|v| v["params"]["update"]["content"]["text"] == "held until compacted")
            .collect();
        assert_eq!(text.len(), 1, "the held prompt ran as Coda's turn after the compaction");
        let shown: Vec<&str> = run
            .log
            .iter()
            .filter_map(|v| v["params"]["update"]["content"]["text"].as_str())
            .filter(|t| t.contains("ompaction"))
            .collect();
        assert!(shown.is_empty(), "the shim's /compact shows nothing in Coda: {shown:?}");
        let after = loop_requests(&live.model).last().map(|r| (r.input_tokens, r.body.to_string().len())).unwrap();
        assert!(after.0 < before.0 && after.1 < before.1, "the next request is smaller: {before:?} -> {after:?}");
        eprintln!("compact-between-turns: answer {answer}; next request {before:?} -> {after:?} (tokens, bytes)");
        run.settle(Duration::from_secs(5));
        let updates = usage_updates(&run.log);
        assert!(
            updates.iter().any(|u| u["_meta"]["coda"]["compactedAt"].is_string()),
            "compactedAt after it: {updates:?}"
        );
        worst = worst.max(check_usage_facts("compact-between-turns", &run.log, &live.model));
        run.finish();
        keep(
            "compact-between-turns",
            &trace,
            &files,
            &live.root,
            "`_coda/session/compact` between turns, with Coda's prompt sent during it (held, then run)",
        );
    }

    if wanted("compact-during-turn") {
        let (trace, files) = live.paths("compact-during-turn");
        let mut run = Run::start(&live.lc, &trace, &files);
        run.initialize();
        let sid = run.new_session(&live.cwd);
        let prompt = run.send(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "[[delay:1500]] slow"}]}),
        );
        run.until(long, |v| v["params"]["update"]["sessionUpdate"] == "session_info_update");
        let answer = run.call(COMPACT, json!({"sessionId": sid}));
        assert_eq!(answer["result"]["compacted"], false, "{answer}");
        assert!(answer["result"]["reason"].as_str().is_some_and(|r| r.contains("turn")), "{answer}");
        run.answer(prompt);
        run.settle(Duration::from_secs(5));
        worst = worst.max(check_usage_facts("compact-during-turn", &run.log, &live.model));
        run.finish();
        keep(
            "compact-during-turn",
            &trace,
            &files,
            &live.root,
            "`_coda/session/compact` while Coda's turn runs: compacted false",
        );
    }

    live.scenario(
        "usage-tool-calls",
        "usage facts over a turn with two tool calls in sequence, then Kimi's own turn on a background command (the shim's usage_update)",
        |run, sid| {
            run.prompt(sid, "[[sh:echo one]]");
            run.prompt(sid, "[[bg:sleep 1; echo two]]");
            run.settle(long);
            assert!(run.log.iter().any(|v| v["params"]["update"]["sessionUpdate"] == "usage_update"
                && v["params"]["update"]["_meta"]["coda"]["lastRequestAt"].is_string()));
        },
    );
    if wanted("usage-tool-calls") {
        // The last scenario's frames: read back from its trace.
        let (trace, _) = live.paths("usage-tool-calls");
        let log: Vec<Value> = std::fs::read_to_string(&trace)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["dir"] == "shim->client")
            .map(|r| r["frame"].clone())
            .collect();
        let updates = usage_updates(&log);
        assert!(
            updates.len() >= 3,
            "Kimi's update after each prompt and the shim's after Kimi's own turn: {updates:?}"
        );
        worst = worst.max(check_usage_facts("usage-tool-calls", &log, &live.model));
    }
    let failed = take_failed();
    drop(live);

    if wanted("compact-automatic") {
        let Some(small) = Live::start_named("coda-kimi-live-autocompact") else { return };
        let small = small.with_window(40_000);
        let (trace, files) = small.paths("compact-automatic");
        let mut run = Run::start(&small.lc, &trace, &files);
        run.initialize();
        let sid = small.new_session_in(&mut run);
        run.prompt(&sid, "[[sh:seq 1 9000]]");
        run.prompt(&sid, "next [[text:three]]");
        run.prompt(&sid, "more [[text:four]]");
        run.settle(Duration::from_secs(5));
        let updates = usage_updates(&run.log);
        assert!(
            updates.iter().any(|u| u["_meta"]["coda"]["compactedAt"].is_string()),
            "Kimi compacted by itself and the next usage_update says when: {updates:?}"
        );
        worst = worst.max(check_usage_facts("compact-automatic", &run.log, &small.model));
        run.finish();
        keep(
            "compact-automatic",
            &trace,
            &files,
            &small.root,
            "Kimi's automatic compaction with a 40,000-token window, inside Coda's second turn",
        );
    }
    eprintln!("lastRequestAt: largest error against the fake model's log {worst} ms");
    let mut failed = failed;
    failed.extend(take_failed());
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

//! The fixture checker: a shim binary, with the player as its CLI, against the client's side of a fixture.
//!
//! [`check`] sends the recorded client frames and compares what the client receives with the recording, then
//! checks every frame the shim made or changed in the replay (its own trace) against ACP's schema and Coda's
//! shapes ([`super::validate`]).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use super::fixture::load;
use super::homes;
use super::placeholder::{Bindings, cut};
use super::script::{Script, Step};
/// How to run [`check`].
pub struct CheckOptions {
    /// The shim binary (`coda-<agent>`).
    pub shim: PathBuf,
    /// The player binary (`acp-replay`).
    pub player: PathBuf,
    /// The adapter's agent name ([`crate::cli::adapter::Adapter::agent`]): the shim finds the player through
    /// that adapter's command variable.
    pub agent: String,
    /// Longest wait for one frame.
    pub timeout: Duration,
    /// Extra environment for the shim.
    pub env: Vec<(String, String)>,
}

/// What a successful check did.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub sent: usize,
    pub received: usize,
    pub elapsed: Duration,
    /// Frames of the client or the CLI in the replay that break ACP's schema (facts, not failures).
    pub peer_breaks: usize,
}

/// The placeholder for the UTC day on which the client received a frame, as `YYYY-MM-DD`.
pub const TODAY: &str = "TODAY";

fn utc_day(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map(|t| t.strftime("%Y-%m-%d").to_string()).unwrap_or_default()
}

/// The arguments the fixture's shim record gives the shim (`--profile qwen` of `coda-acp --profile qwen`); an
/// error when it names another binary than `shim`. A fixture recorded before shims named themselves has none.
fn recorded_shim(records: &[super::Record], shim: &Path) -> Result<Vec<String>, String> {
    let Some(r) = records.iter().find(|r| r.edge == crate::trace::Dir::Shim) else { return Ok(Vec::new()) };
    let super::Body::Line(text) = &r.body else { return Ok(Vec::new()) };
    let words = shell_words::split(text).map_err(|e| format!("line {}: the shim record {text:?}: {e}", r.lineno))?;
    let Some((binary, args)) = words.split_first() else { return Ok(Vec::new()) };
    let given = shim.file_stem().and_then(|n| n.to_str()).unwrap_or_default();
    if given != binary {
        return Err(format!("the fixture was recorded with {binary} ({text}); check it with that binary, not {given}"));
    }
    Ok(args.to_vec())
}

/// Runs the shim with the player as its child, drives the recorded client frames and compares what the client
/// receives with the recording. The error says what differed, with the shim's (and the player's) stderr.
pub fn check(fixture: &Path, opts: &CheckOptions) -> Result<CheckReport, String> {
    let records = load(fixture).map_err(|e| e.to_string())?;
    let adapter =
        crate::adapters::by_agent(&opts.agent).ok_or_else(|| format!("no adapter is named {:?}", opts.agent))?;
    let shim_args = recorded_shim(&records, &opts.shim)?;
    let temp =
        tempfile::Builder::new().prefix("acp-replay-").tempdir().map_err(|e| format!("cannot make a temp dir: {e}"))?;
    let root = temp.path().to_path_buf();
    let mut bindings = Bindings::default();
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    // The live runs' layout (see `Normaliser::for_live_root`), with the data folders whose session files the
    // shims read at their default place under HOME, named by their own variables.
    let homes = homes::with_session_files();
    let home_dirs = homes.iter().map(|h| (h.var, root.join("home").join(h.default)));
    let layout =
        [("ROOT", root.clone()), ("HOME", root.join("home")), ("CWD", root.join("work")), ("TMPDIR", root.join("tmp"))];
    for (name, dir) in layout.into_iter().chain(home_dirs) {
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        bindings.set(name, path(dir));
    }
    bindings.set("CWD_URL", super::normalise::url_encoded(&path(root.join("work"))));
    let player = std::fs::canonicalize(&opts.player).map_err(|e| format!("{}: {e}", opts.player.display()))?;
    let fixture_abs = std::fs::canonicalize(fixture).map_err(|e| format!("{}: {e}", fixture.display()))?;
    let player = shell_words::join([path(player), "play".into(), path(fixture_abs)]);
    // The shim runs in the temp work dir: a relative path would no longer name it.
    let shim = std::fs::canonicalize(&opts.shim).map_err(|e| format!("{}: {e}", opts.shim.display()))?;
    let mut cmd = Command::new(&shim);
    cmd.args(&shim_args);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", bindings.get("HOME").unwrap_or_default())
        .env("TMPDIR", bindings.get("TMPDIR").unwrap_or_default())
        // Fixtures are recorded in UTC (the live rig runs the CLIs so): a local time a CLI wrote means the same
        // instant on every machine that replays it.
        .env("TZ", "UTC")
        .envs(homes.iter().map(|h| (h.var, bindings.get(h.var).unwrap_or_default())))
        .env(adapter.command_env(), player)
        .current_dir(root.join("work"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in &bindings.0 {
        cmd.env(format!("ACP_REPLAY_BIND_{name}"), value);
    }
    // The player's own account of a failure, whole even when the shim cuts its child's stderr short.
    let report_file = root.join("player-report.txt");
    cmd.env("ACP_REPLAY_REPORT", &report_file);
    // What the check runs under reaches the shim too: its log level, and a preloaded library such as
    // libfaketime (the replays are run with the clock moved days ahead to show they mean the same every day).
    for key in [
        "CODA_SHIM_LOG",
        "ACP_REPLAY_FILE_SETTLE_MS",
        "LD_PRELOAD",
        "FAKETIME",
        "DYLD_INSERT_LIBRARIES",
        "DYLD_FORCE_FLAT_NAMESPACE",
    ] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
    // The shim's own trace of the replay, for the schema check: the one the options name (the player reads
    // it too), else one of the check's (an argument, so the player does not see it).
    let trace = match opts.env.iter().rev().find(|(k, _)| k == "CODA_SHIM_TRACE") {
        Some((_, p)) => root.join("work").join(p),
        None => {
            let p = root.join("shim-trace.jsonl");
            cmd.arg("--trace-file").arg(&p);
            p
        }
    };
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", opts.shim.display()))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        return Err("the shim's pipes are missing".into());
    };
    let (tx, rx) = mpsc::channel::<Result<String, String>>();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        loop {
            let mut buf = Vec::new();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']).to_owned();
                    if tx.send(Ok(line)).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    break;
                }
            }
        }
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });

    let started = Instant::now();
    let mut script = Script::client(records, bindings);
    let (mut sent, mut received) = (0, 0);
    let outcome: Result<(), String> = (|| {
        loop {
            match script.next_step() {
                Step::Send { line, lineno, .. } => {
                    stdin
                        .write_all(line.as_bytes())
                        .and_then(|_| stdin.write_all(b"\n"))
                        .and_then(|_| stdin.flush())
                        .map_err(|e| format!("cannot send the client frame of line {lineno}: {e}"))?;
                    sent += 1;
                }
                Step::File { .. } => {}
                Step::Expect => {
                    let waited_from = utc_day(SystemTime::now());
                    let line = match rx.recv_timeout(opts.timeout) {
                        Ok(Ok(line)) if line.trim().is_empty() => continue,
                        Ok(Ok(line)) => line,
                        Ok(Err(e)) => return Err(format!("cannot read the shim's stdout: {e}")),
                        Err(_) => {
                            let want = script.expected_now().first().map(|r| (r.lineno, r.to_line()));
                            let (lineno, want) = want.unwrap_or_default();
                            return Err(format!(
                                "no frame from the shim within {:?}; the recording expects (line {lineno}):\n  {}",
                                opts.timeout,
                                cut(&want, 4000)
                            ));
                        }
                    };
                    received += 1;
                    // `{{TODAY}}`: the day the frame was received (a reset time Codex gives without a day). The
                    // shim read its clock a moment before the client did: across midnight, either day is right.
                    let today = utc_day(SystemTime::now());
                    script.bindings.set(TODAY, &today);
                    if let Err(m) = script.received(&line) {
                        script.bindings.set(TODAY, &waited_from);
                        if waited_from == today || script.received(&line).is_err() {
                            return Err(format!("the client {m}"));
                        }
                    }
                }
                Step::Done => return Ok(()),
            }
        }
    })();
    drop(stdin);
    let deadline = Instant::now() + opts.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let extra: Vec<String> = rx.try_iter().filter_map(Result::ok).filter(|l| !l.trim().is_empty()).collect();
    let stderr = err_thread.join().unwrap_or_default();
    let report = std::fs::read_to_string(&report_file).unwrap_or_default();
    let report = if report.is_empty() { String::new() } else { format!("\n--- player report ---\n{report}") };
    let with_stderr = |msg: String| format!("{}: {msg}{report}\n--- shim stderr ---\n{stderr}", fixture.display());
    outcome.map_err(&with_stderr)?;
    if let Some(first) = extra.first() {
        return Err(with_stderr(format!(
            "the client received {} frame(s) after the end of the recording; first: {}",
            extra.len(),
            cut(first, 4000)
        )));
    }
    match status {
        Some(s) if s.success() => {}
        Some(s) => return Err(with_stderr(format!("the shim exited with {s} after the recording"))),
        None => {
            return Err(with_stderr(format!("the shim did not exit within {:?} of its stdin closing", opts.timeout)));
        }
    }
    if !script.unknown.is_empty() {
        return Err(with_stderr(format!("placeholders without a value: {:?}", script.unknown)));
    }
    let file = std::fs::File::open(&trace).map_err(|e| with_stderr(format!("the shim's trace: {e}")))?;
    let report = super::validate::validate(std::io::BufReader::new(file));
    let shims: Vec<String> = report.findings.iter().filter(|f| f.is_shims()).map(ToString::to_string).collect();
    if !shims.is_empty() {
        return Err(with_stderr(format!(
            "the shim wrote {} frame(s) that break ACP's schema or Coda's shapes (lines of its trace):\n{}",
            report.frames_breaking(true),
            shims.join("\n")
        )));
    }
    let peer_breaks = report.frames_breaking(false) - report.frames_breaking(true);
    Ok(CheckReport { sent, received, elapsed: started.elapsed(), peer_breaks })
}

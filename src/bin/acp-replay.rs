//! acp-replay: plays a recorded agent CLI, turns traces into fixtures, checks a shim against a fixture.
//! The format is in `fixtures/README.md`.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coda_shim::private_file;
use coda_shim::replay::{self, Bindings, CheckOptions, Normaliser, Script, Step};

const HELP: &str = "acp-replay: stands in for an ACP agent CLI by replaying a recording (see fixtures/README.md).

Usage:
  acp-replay [play] <FIXTURE | TRACE.jsonl> [--speed X] [--took FILE] [--file-settle MS]
      Be the CLI: answer the frames of the shim with the recorded agent frames, re-create recorded
      session-file writes. A frame the recording does not have here: message on stderr, exit 3.
      --speed X          keep the recorded gaps between agent frames, divided by X (default: no gaps)
      --took FILE        the shim's took log (CODA_KIMI_TOOK, CODA_OPENCODE_TOOK) [env ACP_REPLAY_TOOK]: after
                         file writes, wait (up to 5 s, then a warning) until the shim has taken them in before
                         the next frame; and, by the shim's trace (CODA_SHIM_TRACE), until it has handled the
                         frames sent before a write and the client frames recorded before each frame
      --file-settle MS   without a took log: pause after file writes before the next frame, and before a write
                         that follows frames [default: 100, env ACP_REPLAY_FILE_SETTLE_MS]
      Placeholders come from ACP_REPLAY_BIND_<NAME>, the received frames, or HOME/{HOMES}/TMPDIR/cwd.

  acp-replay record <TRACE.jsonl> <FIXTURE-DIR> --root DIR [--files FILE] [--subst PATH=NAME]... [--allow-paths]
      Normalise a --trace-file recording into FIXTURE-DIR/trace.jsonl. --root is the live run's temp dir
      (HOME = DIR/home, cwd = DIR/work, TMPDIR = DIR/tmp); --files merges a session-file log.

  acp-replay check <FIXTURE> --shim <coda-BINARY> [--agent NAME] [--timeout SECS] [--env KEY=VALUE]...
      Run the shim with this player as its child, send the recorded client frames, compare what the
      client receives with the recording (what `cargo test --test all replay::` does). The shim gets a clean
      environment (PATH, HOME, TMPDIR{SESSION_HOMES} of a fresh temp dir) plus --env: what each shim needs
      under the player (the recorded CLI version, say) is in tests/support/replay.rs.

  acp-replay view <TRACE.jsonl | FIXTURE> [-o|--output PAGE.html] [--open]
      Write the trace as one self-contained HTML page: a lane per session, turns, tool calls, waits,
      the frames the shim changed; click a mark for its frames. Default PAGE: the trace's name with
      .html, beside it. --open: show it in the default browser. Bad lines are listed in the page.

  acp-replay diff <A> [B] [--side-a client|agent] [--side-b client|agent] [--html PAGE.html]
      Compare two traces or fixtures, aligned by session and turn: frames on one side only, frames that
      differ (ids, times and paths of the machine ignored), how long each turn took. A side is what Coda
      saw (client, the default) or what the CLI saw (agent: as if Coda had talked to it directly). One
      trace alone: its agent side against its client side (what the shim changed). --html: the viewer's
      page with both sides' lanes. Exit 0: alike, 1: they differ, 2: bad arguments or an unreadable file.

  acp-replay redact <TRACE.jsonl | FIXTURE> [-o|--output OUT.jsonl] [--keep prompts,agent,tools,files|all]
      Write a copy safe to share: prompts, the instruction, messages, file contents and tool output become
      placeholders of the same shape and length class; the user name is replaced in paths and words;
      API keys, bearer tokens and other secrets are masked everywhere. Records, methods, ids, times and
      numbers are kept, so view and diff work on the copy. --keep: texts kept as they are (secrets and
      user names masked still); --keep-texts is --keep all. Default OUT: the trace's name with
      .redacted.jsonl, beside it.

  acp-replay -V | --version        print the version
  acp-replay -h | --help           print this help
";

/// The help, with the data-folder variables of the adapters.
fn help() -> String {
    let homes = replay::homes::own_vars().join("/");
    let session_homes: String = replay::homes::with_session_files().iter().map(|h| format!(", {}", h.var)).collect();
    HELP.replace("{HOMES}", &homes).replace("{SESSION_HOMES}", &session_homes)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        None | Some("-h") | Some("--help") => {
            print!("{}", help());
            0
        }
        Some("-V") | Some("--version") => {
            println!("acp-replay {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Some("record") => run(record(&args[1..])),
        Some("check") => run(check(&args[1..])),
        Some("play") => play(&args[1..]),
        Some("view") => run(view(&args[1..])),
        Some("diff") => diff(&args[1..]),
        Some("redact") => run(redact(&args[1..])),
        Some(_) => play(&args),
    };
    std::process::exit(code)
}

fn run(r: Result<(), String>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("acp-replay: {e}");
            1
        }
    }
}

fn usage(msg: String) -> i32 {
    eprintln!("acp-replay: {msg}\nTry `acp-replay --help`.");
    2
}

fn value(args: &[String], i: &mut usize, flag: &str) -> Result<String, String> {
    *i += 1;
    args.get(*i).cloned().ok_or_else(|| format!("{flag} needs a value"))
}

fn play(args: &[String]) -> i32 {
    let mut fixture = None;
    let mut speed: Option<f64> = None;
    let mut settle = std::env::var("ACP_REPLAY_FILE_SETTLE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(100u64);
    let mut took = std::env::var_os("ACP_REPLAY_TOOK").filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut i = 0;
    while i < args.len() {
        let parsed: Result<(), String> = match args[i].as_str() {
            "--speed" => value(args, &mut i, "--speed").and_then(|v| {
                let x: f64 = v.parse().map_err(|_| format!("--speed {v:?} is not a number"))?;
                speed = (x > 0.0).then_some(x);
                Ok(())
            }),
            "--took" => value(args, &mut i, "--took").map(|v| took = Some(PathBuf::from(v))),
            "--file-settle" => value(args, &mut i, "--file-settle").and_then(|v| {
                settle = v.parse().map_err(|_| format!("--file-settle {v:?} is not a number"))?;
                Ok(())
            }),
            a if a.starts_with('-') => Err(format!("unknown option {a}")),
            a if fixture.is_none() => {
                fixture = Some(PathBuf::from(a));
                Ok(())
            }
            a => Err(format!("unexpected argument {a}")),
        };
        if let Err(e) = parsed {
            return usage(e);
        }
        i += 1;
    }
    let Some(fixture) = fixture else {
        return usage("which recording? give a fixture folder or a trace file".into());
    };
    let records = match replay::load(&fixture) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("acp-replay: {e}");
            return 2;
        }
    };
    // Recorded times of file writes: writes the shim read at different times are written with a pause between.
    let file_times: std::collections::HashMap<usize, Option<u64>> =
        records.iter().filter(|r| matches!(r.body, replay::Body::File(_))).map(|r| (r.lineno, r.t)).collect();
    let mut last_file_t: Option<Option<u64>> = None;
    // How many client frames the recording has before each agent frame: the shim handled those first.
    let mut clients = 0;
    let client_before: std::collections::HashMap<usize, usize> = records
        .iter()
        .filter_map(|r| match r.edge {
            replay::Dir::ClientToShim => {
                clients += 1;
                None
            }
            replay::Dir::AgentToShim => Some((r.lineno, clients)),
            _ => None,
        })
        .collect();
    let mut script = Script::agent(records, Bindings::from_env());
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let started = Instant::now();
    let mut wrote_files = false;
    let mut sent_frames = false;
    let name = fixture.display().to_string();
    let trace = std::env::var_os("CODA_SHIM_TRACE").filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut shim = Shim::new(took, trace, Duration::from_millis(settle), name.clone());
    let mut queued = std::collections::VecDeque::new();
    loop {
        let mut step = queued.pop_front().unwrap_or_else(|| script.next_step());
        if shim.waits()
            && queued.is_empty()
            && let Step::File { lineno, .. } = &step
        {
            // The writes recorded at the same time as this one: the shim read them in one scan, in this order.
            let t = file_times.get(lineno).copied().flatten();
            let mut group = vec![step];
            loop {
                let next = script.next_step();
                match &next {
                    Step::File { lineno, .. } if file_times.get(lineno).copied().flatten() == t => group.push(next),
                    _ => {
                        queued.push_back(next);
                        break;
                    }
                }
            }
            for s in write_order(group).into_iter().rev() {
                queued.push_front(s);
            }
            step = queued.pop_front().unwrap_or(Step::Done);
        }
        if wrote_files && !matches!(step, Step::File { .. }) {
            // The shim's file watcher takes in the writes before the frames that followed them.
            let _ = out.flush();
            shim.wait_taken();
            wrote_files = false;
        }
        if sent_frames && matches!(step, Step::File { .. }) {
            // And the shim handles the frames sent before a write before the watcher reports the write.
            let _ = out.flush();
            shim.wait_handled();
        }
        if let Step::File { lineno, .. } = &step {
            let t = file_times.get(lineno).copied().flatten();
            if wrote_files && last_file_t.is_some_and(|last| last != t) {
                // A later read of the shim's watcher when recording: this one takes in the earlier writes alone.
                let _ = out.flush();
                shim.wait_taken();
            }
            last_file_t = Some(t);
        }
        sent_frames = matches!(step, Step::Send { .. });
        match step {
            Step::Send { line, t, lineno } => {
                if let (Some(speed), Some(t)) = (speed, t) {
                    let due = Duration::from_secs_f64(t as f64 / 1000.0 / speed);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        let _ = out.flush();
                        std::thread::sleep(wait);
                    }
                }
                if let Some(&n) = client_before.get(&lineno) {
                    let _ = out.flush();
                    shim.wait_client(n);
                }
                if let Err(e) = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n")) {
                    return fail(4, format!("{name}: cannot write the frame of line {lineno}: {e}"));
                }
                shim.sent += 1;
            }
            Step::File { op, lineno } => {
                let before = shim.before_write();
                if let Err(e) = replay::apply_file_op(&op) {
                    return fail(5, format!("{name}: the file write of line {lineno} failed: {e}"));
                }
                shim.wrote(&op, lineno, before);
                wrote_files = true;
            }
            Step::Expect | Step::Done => {
                let _ = out.flush();
                let done = step == Step::Done;
                let line = match read_frame(&mut input) {
                    Ok(Some(line)) => line,
                    Ok(None) if done => break,
                    Ok(None) => {
                        let expected = script.expected_now();
                        return fail(
                            4,
                            format!(
                                "{name}: the shim closed stdin while the recording expects {} more frame(s); next (line {}):\n  {}",
                                expected.len(),
                                expected.first().map(|r| r.lineno).unwrap_or(0),
                                expected.first().map(|r| r.to_line()).unwrap_or_default()
                            ),
                        );
                    }
                    Err(e) => {
                        return fail(4, format!("{name}: cannot read stdin: {e}"));
                    }
                };
                if done {
                    return fail(3, format!("{name}: received a frame after the end of the recording:\n  got: {line}"));
                }
                if let Err(m) = script.received(&line) {
                    return fail(3, format!("{name}: the agent {m}"));
                }
            }
        }
    }
    if !script.unknown.is_empty() {
        eprintln!(
            "acp-replay: {name}: warning: placeholders without a value were sent as they are: {:?}",
            script.unknown
        );
    }
    0
}

/// The order to write a group of writes the shim read in one scan: the files in reverse (each file's writes in
/// their order), so that a scan that sees the first file's write, which it reads first, sees all of them.
fn write_order(group: Vec<Step>) -> Vec<Step> {
    let mut files: Vec<(String, Vec<Step>)> = Vec::new();
    for step in group {
        let path = match &step {
            Step::File { op, .. } => op.path.clone(),
            _ => String::new(),
        };
        match files.iter_mut().find(|(p, _)| *p == path) {
            Some((_, steps)) => steps.push(step),
            None => files.push((path, vec![step])),
        }
    }
    files.into_iter().rev().flat_map(|(_, steps)| steps).collect()
}

/// The longest wait for the shim to take in a write or handle the frames sent before one.
const SHIM_WAIT: Duration = Duration::from_secs(5);

/// What the player knows of the shim's progress: with a took log, it waits for the shim's own account
/// ([`replay::took`]); without one, it pauses `settle` instead.
struct Shim {
    took: Option<(replay::took::Tail, replay::took::Took)>,
    trace: Option<(replay::took::Tail, replay::took::Handled)>,
    settle: Duration,
    /// Writes not known to be taken in yet, with the line of each.
    pending: Vec<(replay::took::Written, usize)>,
    /// Frames written to the shim.
    sent: usize,
    name: String,
    bad_reported: bool,
}

impl Shim {
    fn new(took: Option<PathBuf>, trace: Option<PathBuf>, settle: Duration, name: String) -> Shim {
        let took = took.map(|p| (replay::took::Tail::new(p), replay::took::Took::default()));
        // The trace only counts with a took log: without one the player pauses, as before.
        let trace = trace.filter(|_| took.is_some()).map(|p| (replay::took::Tail::new(p), Default::default()));
        Shim { took, trace, settle, pending: Vec::new(), sent: 0, name, bad_reported: false }
    }

    /// Whether the player waits on the shim's logs (else it pauses).
    fn waits(&self) -> bool {
        self.took.is_some()
    }

    /// Reads what the took log says now; the number of its records so far.
    fn read_took(&mut self) -> u64 {
        let Some((tail, took)) = &mut self.took else { return 0 };
        took.read(tail.lines());
        if took.bad > 0 && !std::mem::replace(&mut self.bad_reported, true) {
            warn(format!("{}: warning: {} has lines that are not took records", self.name, tail.path().display()));
        }
        took.seen()
    }

    fn before_write(&mut self) -> u64 {
        self.read_took()
    }

    /// Notes a write to wait for (`before`: took records read before it).
    fn wrote(&mut self, op: &replay::FileOp, lineno: usize, before: u64) {
        use replay::FileOpKind::*;
        if self.took.is_none() {
            return;
        }
        let (path, whole) = match op.op {
            Append => (&op.path, false),
            Write | Replace => (&op.path, true),
            Rename => match &op.to {
                Some(to) => (to, true),
                None => return,
            },
            Mkdir | Remove => return,
        };
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let w = replay::took::Written { path: replay::took::os_spelling(path), len, after: whole.then_some(before) };
        self.pending.push((w, lineno));
    }

    /// Until the shim has taken in every write noted (or [`SHIM_WAIT`] passed: a warning).
    fn wait_taken(&mut self) {
        if self.took.is_none() {
            return std::thread::sleep(self.settle);
        }
        let deadline = Instant::now() + SHIM_WAIT;
        loop {
            self.read_took();
            let Some((_, took)) = &self.took else { return };
            self.pending.retain(|(w, _)| !took.has_taken(w));
            if self.pending.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let lines: Vec<String> =
                    self.pending.iter().map(|(w, l)| format!("line {l} ({}, {} bytes)", w.path, w.len)).collect();
                warn(format!(
                    "{}: warning: the shim has not taken in the write(s) of {} within {SHIM_WAIT:?} (its took log                      does not show them read); going on",
                    self.name,
                    lines.join(", ")
                ));
                self.pending.clear();
                return;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Until the shim's trace shows every frame sent so far handled (or [`SHIM_WAIT`] passed: a warning);
    /// without a took log or a trace, the pause.
    fn wait_handled(&mut self) {
        let Some((tail, handled)) = &mut self.trace else {
            return std::thread::sleep(self.settle);
        };
        let deadline = Instant::now() + SHIM_WAIT;
        loop {
            handled.read(tail.lines());
            if handled.agent >= self.sent {
                return;
            }
            if Instant::now() >= deadline {
                return warn(format!(
                    "{}: warning: the shim's trace {} shows {} of the {} frames sent handled after {SHIM_WAIT:?}; \
                     writing the next file anyway",
                    self.name,
                    tail.path().display(),
                    handled.agent,
                    self.sent
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Until the shim's trace shows `n` frames of the client's handled (the recording has that many before the
    /// next frame of the agent's), or [`SHIM_WAIT`] passed (a warning); nothing without a trace.
    fn wait_client(&mut self, n: usize) {
        let Some((tail, handled)) = &mut self.trace else { return };
        let deadline = Instant::now() + SHIM_WAIT;
        loop {
            handled.read(tail.lines());
            if handled.client >= n {
                return;
            }
            if Instant::now() >= deadline {
                // Counted as handled from now on: the wait is not repeated for every later frame.
                let seen = std::mem::replace(&mut handled.client, n);
                return warn(format!(
                    "{}: warning: the shim's trace {} shows {} of the {n} client frames the recording has before the \
                     next agent frame handled after {SHIM_WAIT:?}; sending it anyway",
                    self.name,
                    tail.path().display(),
                    seen
                ));
            }
            std::thread::sleep(POLL);
        }
    }
}

/// How often a wait looks at the shim's logs.
const POLL: Duration = Duration::from_millis(1);

/// A warning on stderr and in the `ACP_REPLAY_REPORT` file (see [`fail`]).
fn warn(msg: String) {
    let msg = format!("acp-replay: {}\n", msg.trim_end());
    eprint!("{msg}");
    report(&msg);
}

fn report(msg: &str) {
    if let Some(path) = std::env::var_os("ACP_REPLAY_REPORT")
        && let Ok(mut f) = private_file::open(Path::new(&path), private_file::Write::Append)
    {
        let _ = f.write_all(msg.as_bytes());
    }
}

/// Reports a failed replay on stderr and, when `ACP_REPLAY_REPORT` names a file, there too (the shim may
/// cut its child's stderr short); returns the exit status.
fn fail(code: i32, msg: String) -> i32 {
    let msg = format!("acp-replay: {}\n", msg.trim_end());
    eprint!("{msg}");
    report(&msg);
    code
}

/// The next non-empty line of stdin, without its newline; `None` at EOF.
fn read_frame(input: &mut impl BufRead) -> std::io::Result<Option<String>> {
    loop {
        let mut buf = Vec::new();
        if input.read_until(b'\n', &mut buf)? == 0 {
            return Ok(None);
        }
        let line = String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']).to_owned();
        if !line.trim().is_empty() {
            return Ok(Some(line));
        }
    }
}

fn record(args: &[String]) -> Result<(), String> {
    let (mut trace, mut dir, mut root, mut files) = (None, None, None, None);
    let mut substs = Vec::new();
    let mut allow_paths = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--root" => root = Some(PathBuf::from(value(args, &mut i, "--root")?)),
            "--files" => files = Some(PathBuf::from(value(args, &mut i, "--files")?)),
            "--subst" => {
                let v = value(args, &mut i, "--subst")?;
                let (path, name) = v.rsplit_once('=').ok_or_else(|| format!("--subst {v:?}: expected PATH=NAME"))?;
                substs.push((path.to_owned(), name.to_owned()));
            }
            "--allow-paths" => allow_paths = true,
            a if a.starts_with('-') => return Err(format!("unknown option {a}")),
            a if trace.is_none() => trace = Some(PathBuf::from(a)),
            a if dir.is_none() => dir = Some(PathBuf::from(a)),
            a => return Err(format!("unexpected argument {a}")),
        }
        i += 1;
    }
    let (Some(trace), Some(dir)) = (trace, dir) else {
        return Err("usage: acp-replay record <TRACE.jsonl> <FIXTURE-DIR> --root DIR".into());
    };
    let mut n = match &root {
        Some(root) => Normaliser::for_live_root(root),
        None => Normaliser::default(),
    };
    for (path, name) in &substs {
        n.add(path, name);
    }
    let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    let text = read(&trace)?;
    let file_log = files.as_ref().map(read).transpose()?;
    let records = replay::record(&text, file_log.as_deref(), &n).map_err(|e| e.to_string())?;
    let out = replay::render(&records);
    let left = n.leftovers(&out);
    if !left.is_empty() && !allow_paths {
        let lines: Vec<usize> = out
            .lines()
            .enumerate()
            .filter(|(_, l)| left.iter().any(|p| l.contains(p.as_str())))
            .map(|(i, _)| i + 1)
            .take(10)
            .collect();
        return Err(format!(
            "the recording still names paths of this machine ({left:?}) on lines {lines:?}; add --subst PATH=NAME (or --allow-paths)"
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let file = dir.join(replay::TRACE_FILE);
    private_file::open(&file, private_file::Write::Replace)
        .and_then(|mut f| f.write_all(out.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    eprintln!("acp-replay: wrote {} records to {}", records.len(), file.display());
    Ok(())
}

fn check(args: &[String]) -> Result<(), String> {
    let (mut fixture, mut shim, mut agent) = (None, None, None);
    let mut env = Vec::new();
    let mut timeout = Duration::from_secs(20);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--shim" => shim = Some(PathBuf::from(value(args, &mut i, "--shim")?)),
            "--agent" => agent = Some(value(args, &mut i, "--agent")?),
            "--env" => {
                let v = value(args, &mut i, "--env")?;
                let (k, val) = v.split_once('=').ok_or_else(|| format!("--env {v:?}: expected KEY=VALUE"))?;
                env.push((k.to_owned(), val.to_owned()));
            }
            "--timeout" => {
                let v = value(args, &mut i, "--timeout")?;
                timeout = Duration::from_secs_f64(v.parse().map_err(|_| format!("--timeout {v:?} is not a number"))?);
            }
            a if a.starts_with('-') => return Err(format!("unknown option {a}")),
            a if fixture.is_none() => fixture = Some(PathBuf::from(a)),
            a => return Err(format!("unexpected argument {a}")),
        }
        i += 1;
    }
    let (Some(fixture), Some(shim)) = (fixture, shim) else {
        return Err("usage: acp-replay check <FIXTURE> --shim <coda-BINARY>".into());
    };
    // The agent from the binary's name (coda-<agent>) or the fixture's folder (fixtures/<agent>/<scenario>).
    let agent = agent
        .or_else(|| shim.file_name()?.to_str()?.strip_prefix("coda-").map(str::to_owned))
        .or_else(|| std::fs::canonicalize(&fixture).ok()?.parent()?.file_name()?.to_str().map(str::to_owned))
        .ok_or("cannot tell which agent this is; give --agent")?;
    let player = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let fixture = std::fs::canonicalize(&fixture).map_err(|e| format!("{}: {e}", fixture.display()))?;
    let opts = CheckOptions { shim, player, agent, timeout, env };
    let report = replay::check(&fixture, &opts)?;
    eprintln!(
        "acp-replay: {}: ok ({} client frames sent, {} received, {:?})",
        fixture.display(),
        report.sent,
        report.received,
        report.elapsed
    );
    Ok(())
}

/// `acp-replay view`: the trace as an HTML page (`coda_shim::replay::view`).
fn view(args: &[String]) -> Result<(), String> {
    let (mut trace, mut out, mut open) = (None, None, false);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-o" | "--output" => out = Some(PathBuf::from(value(args, &mut i, "-o")?)),
            "--open" => open = true,
            a if a.starts_with('-') => return Err(format!("unknown option {a}")),
            a if trace.is_none() => trace = Some(PathBuf::from(a)),
            a => return Err(format!("unexpected argument {a}")),
        }
        i += 1;
    }
    let trace = trace.ok_or("usage: acp-replay view <TRACE.jsonl | FIXTURE> [-o PAGE.html] [--open]")?;
    // A fixture folder: its recording.
    let file = if trace.is_dir() { trace.join(replay::TRACE_FILE) } else { trace.clone() };
    let input = std::fs::File::open(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let out = out.unwrap_or_else(|| file.with_extension("html"));
    let title = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let started = Instant::now();
    // The page holds every prompt of the trace: private, like the trace. Written as the trace is read.
    let summary = private_file::open(&out, private_file::Write::Replace)
        .and_then(|f| {
            let mut w = std::io::BufWriter::with_capacity(1 << 16, f);
            let summary = replay::view::write_page(std::io::BufReader::with_capacity(1 << 16, input), &mut w, &title)?;
            w.flush()?;
            Ok(summary)
        })
        .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    eprintln!(
        "acp-replay: wrote {} ({} bytes; {} frames, {} lanes, {} marks, {} bad lines) in {:?}",
        out.display(),
        summary.bytes,
        summary.frames,
        summary.lanes,
        summary.items,
        summary.bad_lines,
        started.elapsed()
    );
    if open {
        let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
        let status = std::process::Command::new(opener).arg(&out).status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => return Err(format!("{opener} {} failed: {s}", out.display())),
            Err(e) => return Err(format!("cannot run {opener}: {e}")),
        }
    }
    Ok(())
}

/// `acp-replay diff`: exit 0 when the two sides are alike, 1 when they differ, 2 on an error.
fn diff(args: &[String]) -> i32 {
    use replay::diff::{self, Which};
    let (mut paths, mut sides, mut html) = (Vec::new(), [None, None], None);
    let mut i = 0;
    while i < args.len() {
        let parsed: Result<(), String> = match args[i].as_str() {
            flag @ ("--side-a" | "--side-b") => value(args, &mut i, flag).and_then(|v| {
                let w = Which::parse(&v).ok_or_else(|| format!("{flag} {v:?}: expected client or agent"))?;
                sides[usize::from(flag == "--side-b")] = Some(w);
                Ok(())
            }),
            "--html" => value(args, &mut i, "--html").map(|v| html = Some(PathBuf::from(v))),
            a if a.starts_with('-') => Err(format!("unknown option {a}")),
            a if paths.len() < 2 => {
                paths.push(PathBuf::from(a));
                Ok(())
            }
            a => Err(format!("unexpected argument {a}")),
        };
        if let Err(e) = parsed {
            return usage(e);
        }
        i += 1;
    }
    if paths.is_empty() {
        return usage("which traces? acp-replay diff <A> [B]".into());
    }
    // One trace: what the CLI saw against what Coda saw.
    let one = paths.len() == 1;
    if one {
        paths.push(paths[0].clone());
    }
    let which = [sides[0].unwrap_or(if one { Which::Agent } else { Which::Client }), sides[1].unwrap_or(Which::Client)];
    let mut read = Vec::new();
    for (path, w) in paths.iter().zip(which) {
        let file = if path.is_dir() { path.join(replay::TRACE_FILE) } else { path.clone() };
        match std::fs::File::open(&file) {
            Ok(f) => read.push(diff::side::read(std::io::BufReader::with_capacity(1 << 16, f), w)),
            Err(e) => {
                eprintln!("acp-replay: cannot read {}: {e}", file.display());
                return 2;
            }
        }
    }
    let (a, b) = (&read[0], &read[1]);
    let report = diff::compare(a, b);
    let name = |k: usize| format!("{} ({} side)", paths[k].display(), which[k].as_str());
    print!("{}", diff::report::text(&report, a, b, &name(0), &name(1)));
    if let Some(out) = html {
        let title = format!(
            "{} vs {}",
            paths[0].file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            paths[1].file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        );
        // It holds both traces' prompts: private, like them.
        let written = private_file::open(&out, private_file::Write::Replace).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            diff::page::write(&mut w, &report, a, b, &title)?;
            w.flush()
        });
        if let Err(e) = written {
            eprintln!("acp-replay: cannot write {}: {e}", out.display());
            return 2;
        }
        eprintln!("acp-replay: wrote {}", out.display());
    }
    i32::from(report.differs())
}

/// `acp-replay redact`: a copy of a trace safe to share (`coda_shim::replay::redact`).
fn redact(args: &[String]) -> Result<(), String> {
    let (mut trace, mut out, mut keep) = (None, None, replay::redact::Keep::default());
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-o" | "--output" => out = Some(PathBuf::from(value(args, &mut i, "-o")?)),
            "--keep" => keep = replay::redact::Keep::parse(&value(args, &mut i, "--keep")?)?,
            "--keep-texts" => keep = replay::redact::Keep::ALL,
            a if a.starts_with('-') => return Err(format!("unknown option {a}")),
            a if trace.is_none() => trace = Some(PathBuf::from(a)),
            a => return Err(format!("unexpected argument {a}")),
        }
        i += 1;
    }
    let trace = trace.ok_or("usage: acp-replay redact <TRACE.jsonl | FIXTURE> [-o OUT.jsonl]")?;
    let file = if trace.is_dir() { trace.join(replay::TRACE_FILE) } else { trace.clone() };
    let out = out.unwrap_or_else(|| file.with_extension("redacted.jsonl"));
    if std::fs::canonicalize(&out).ok().is_some_and(|o| std::fs::canonicalize(&file).ok() == Some(o)) {
        return Err(format!("{} is the trace itself; give another -o", out.display()));
    }
    let reopen = || std::fs::File::open(&file).map(|f| std::io::BufReader::with_capacity(1 << 16, f));
    reopen().map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    // The copy is meant to be shared, but what is kept of it (--keep) is the user's: private until they share it.
    let counts = private_file::open(&out, private_file::Write::Replace)
        .and_then(|f| replay::redact::redact(reopen, &mut std::io::BufWriter::new(f), keep))
        .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    eprintln!(
        "acp-replay: wrote {} ({} records, {} texts replaced, {} unreadable lines replaced)",
        out.display(),
        counts.records,
        counts.texts,
        counts.unreadable
    );
    Ok(())
}

//! The player (`acp-replay play`): stands in for an agent CLI by replaying the agent's side of a recording.
//!
//! It writes the recorded agent frames, re-creates the recorded session-file writes, and matches what the shim
//! sends against the recording ([`Script::agent`]); `fixtures/README.md` ("The player") has the rules. Where the
//! recording has file writes, it waits for the shim's own account of having taken them in ([`super::took`]) or,
//! without one, pauses. A failure is reported on stderr and in the `ACP_REPLAY_REPORT` file, with an exit status
//! of its own: 3 a frame the recording does not have, 4 the shim's stdin or stdout failed, 5 a file write failed.

use crate::HashMap;
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::script::{Script, Step};
use super::{Bindings, Body, Dir, FileOp, FileOpKind, apply_file_op, load, took};
use crate::private_file;

/// How to play.
#[derive(Debug, Clone)]
pub struct PlayOptions {
    /// A fixture folder or a trace file.
    pub fixture: PathBuf,
    /// Keep the recorded gaps between agent frames, divided by this (`None`: no gaps).
    pub speed: Option<f64>,
    /// The shim's took log (`--took`, `ACP_REPLAY_TOOK`).
    pub took: Option<PathBuf>,
    /// Without a took log: the pause after file writes (`--file-settle`, `ACP_REPLAY_FILE_SETTLE_MS`).
    pub settle: Duration,
}

/// Plays the recording on stdin and stdout; returns the exit status (0: the whole recording played; 2: it
/// cannot be read; 3, 4, 5: see the module's docs).
pub fn play(opts: &PlayOptions) -> i32 {
    let fixture = &opts.fixture;
    let (speed, took, settle) = (opts.speed, opts.took.clone(), opts.settle.as_millis() as u64);
    let records = match load(fixture) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("acp-replay: {e}");
            return 2;
        }
    };
    // Recorded times of file writes: writes the shim read at different times are written with a pause between.
    let file_times: HashMap<usize, Option<u64>> =
        records.iter().filter(|r| matches!(r.body, Body::File(_))).map(|r| (r.lineno, r.t)).collect();
    let mut last_file_t: Option<Option<u64>> = None;
    // How many client frames the recording has before each agent frame: the shim handled those first.
    let mut clients = 0;
    let client_before: HashMap<usize, usize> = records
        .iter()
        .filter_map(|r| match r.edge {
            Dir::ClientToShim => {
                clients += 1;
                None
            }
            Dir::AgentToShim => Some((r.lineno, clients)),
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
    let mut queued = VecDeque::new();
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
                if let Err(e) = apply_file_op(&op) {
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
/// ([`super::took`]); without one, it pauses `settle` instead.
struct Shim {
    took: Option<(took::Tail, took::Took)>,
    trace: Option<(took::Tail, took::Handled)>,
    settle: Duration,
    /// Writes not known to be taken in yet, with the line of each.
    pending: Vec<(took::Written, usize)>,
    /// Frames written to the shim.
    sent: usize,
    name: String,
    bad_reported: bool,
}

impl Shim {
    fn new(took: Option<PathBuf>, trace: Option<PathBuf>, settle: Duration, name: String) -> Shim {
        let took = took.map(|p| (took::Tail::new(p), took::Took::default()));
        // The shim's trace tells which frames it handled (a shim with no took log, coda-acp's, gives it alone).
        let trace = trace.map(|p| (took::Tail::new(p), Default::default()));
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
    fn wrote(&mut self, op: &FileOp, lineno: usize, before: u64) {
        use FileOpKind::*;
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
        let w = took::Written { path: took::os_spelling(path), len, after: whole.then_some(before) };
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

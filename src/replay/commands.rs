//! The commands of `acp-replay` other than the player ([`super::play`]): what each does with the files it is
//! given, once `src/bin/acp-replay.rs` has read its command line. Each returns the exit status, or an error
//! the binary prints (status 1).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::diff::{self, Which};
use super::{CheckOptions, Normaliser, TRACE_FILE, redact as redaction};
use crate::private_file;

/// `acp-replay record`.
#[derive(Debug, Default)]
pub struct Record {
    pub trace: PathBuf,
    pub dir: PathBuf,
    pub root: Option<PathBuf>,
    pub files: Option<PathBuf>,
    pub substs: Vec<(String, String)>,
    pub allow_paths: bool,
}

/// Normalises a `--trace-file` recording into a fixture.
pub fn record(o: &Record) -> Result<(), String> {
    let (trace, dir, root, files, substs, allow_paths) =
        (&o.trace, &o.dir, &o.root, &o.files, &o.substs, o.allow_paths);
    let mut n = match &root {
        Some(root) => Normaliser::for_live_root(root),
        None => Normaliser::default(),
    };
    for (path, name) in substs {
        n.add(path, name);
    }
    let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    let text = read(trace)?;
    let file_log = files.as_ref().map(read).transpose()?;
    let records = super::record(&text, file_log.as_deref(), &n).map_err(|e| e.to_string())?;
    let out = super::render(&records);
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
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let file = dir.join(TRACE_FILE);
    private_file::open(&file, private_file::Write::Replace)
        .and_then(|mut f| f.write_all(out.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    eprintln!("acp-replay: wrote {} records to {}", records.len(), file.display());
    Ok(())
}

/// `acp-replay check`.
#[derive(Debug)]
pub struct Check {
    pub fixture: PathBuf,
    pub shim: PathBuf,
    pub agent: Option<String>,
    pub timeout: Duration,
    pub env: Vec<(String, String)>,
}

/// Runs a shim against a fixture with this program as its CLI.
pub fn check(o: &Check) -> Result<(), String> {
    let (fixture, shim, agent, timeout, env) = (&o.fixture, o.shim.clone(), o.agent.clone(), o.timeout, o.env.clone());
    // The agent from the binary's name (coda-<agent>) or the fixture's folder (fixtures/<agent>/<scenario>).
    let agent = agent
        .or_else(|| shim.file_name()?.to_str()?.strip_prefix("coda-").map(str::to_owned))
        .or_else(|| std::fs::canonicalize(fixture).ok()?.parent()?.file_name()?.to_str().map(str::to_owned))
        .ok_or("cannot tell which agent this is; give --agent")?;
    let player = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let fixture = std::fs::canonicalize(fixture).map_err(|e| format!("{}: {e}", fixture.display()))?;
    let opts = CheckOptions { shim, player, agent, timeout, env };
    let report = super::check(&fixture, &opts)?;
    eprintln!(
        "acp-replay: {}: ok ({} client frames sent, {} received, {:?})",
        fixture.display(),
        report.sent,
        report.received,
        report.elapsed
    );
    Ok(())
}

/// `acp-replay view`.
#[derive(Debug, Default)]
pub struct View {
    pub trace: PathBuf,
    pub out: Option<PathBuf>,
    pub open: bool,
}

/// Writes a trace's page.
pub fn view(o: &View) -> Result<(), String> {
    let (trace, out, open) = (&o.trace, o.out.clone(), o.open);
    // A fixture folder: its recording.
    let file = if trace.is_dir() { trace.join(TRACE_FILE) } else { trace.clone() };
    let input = std::fs::File::open(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let out = out.unwrap_or_else(|| file.with_extension("html"));
    let title = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let started = Instant::now();
    // The page holds every prompt of the trace: private, like the trace. Written as the trace is read.
    let summary = private_file::open(&out, private_file::Write::Replace)
        .and_then(|f| {
            let mut w = std::io::BufWriter::with_capacity(1 << 16, f);
            let summary = super::view::write_page(std::io::BufReader::with_capacity(1 << 16, input), &mut w, &title)?;
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

/// `acp-replay diff`.
#[derive(Debug, Default)]
pub struct Diff {
    pub paths: Vec<PathBuf>,
    pub sides: [Option<Which>; 2],
    pub html: Option<PathBuf>,
}

/// Compares two traces: 0 alike, 1 they differ, 2 a file cannot be read or written.
pub fn diff(o: &Diff) -> i32 {
    let (mut paths, sides, html) = (o.paths.clone(), o.sides, o.html.clone());
    // One trace: what the CLI saw against what Coda saw.
    let one = paths.len() == 1;
    if one {
        paths.push(paths[0].clone());
    }
    let which = [sides[0].unwrap_or(if one { Which::Agent } else { Which::Client }), sides[1].unwrap_or(Which::Client)];
    let mut read = Vec::new();
    for (path, w) in paths.iter().zip(which) {
        let file = if path.is_dir() { path.join(TRACE_FILE) } else { path.clone() };
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

/// `acp-replay redact`.
#[derive(Debug, Default)]
pub struct Redact {
    pub trace: PathBuf,
    pub out: Option<PathBuf>,
    pub keep: redaction::Keep,
}

/// Writes a copy of a trace safe to share.
pub fn redact(o: &Redact) -> Result<(), String> {
    let (trace, out, keep) = (&o.trace, o.out.clone(), o.keep);
    let file = if trace.is_dir() { trace.join(TRACE_FILE) } else { trace.clone() };
    let out = out.unwrap_or_else(|| file.with_extension("redacted.jsonl"));
    if std::fs::canonicalize(&out).ok().is_some_and(|o| std::fs::canonicalize(&file).ok() == Some(o)) {
        return Err(format!("{} is the trace itself; give another -o", out.display()));
    }
    let reopen = || std::fs::File::open(&file).map(|f| std::io::BufReader::with_capacity(1 << 16, f));
    reopen().map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    // The copy is meant to be shared, but what is kept of it (--keep) is the user's: private until they share it.
    let counts = private_file::open(&out, private_file::Write::Replace)
        .and_then(|f| redaction::redact(reopen, &mut std::io::BufWriter::new(f), keep))
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

/// A trace file, or a fixture folder's.
fn trace_file(path: &std::path::Path) -> PathBuf {
    if path.is_dir() { path.join(TRACE_FILE) } else { path.to_path_buf() }
}

fn open(path: &std::path::Path) -> Result<std::io::BufReader<std::fs::File>, i32> {
    let file = trace_file(path);
    match std::fs::File::open(&file) {
        Ok(f) => Ok(std::io::BufReader::with_capacity(1 << 16, f)),
        Err(e) => {
            eprintln!("acp-replay: cannot read {}: {e}", file.display());
            Err(2)
        }
    }
}

/// `acp-replay validate`.
#[derive(Debug, Default)]
pub struct Validate {
    pub trace: PathBuf,
    /// Only the frames the shim made or changed count (and are listed).
    pub shim_only: bool,
}

/// Checks every frame of a trace against ACP's schema and Coda's shapes: 0 none breaks one, 1 some frame does
/// (or a line cannot be read), 2 the trace cannot be read.
pub fn validate(o: &Validate) -> i32 {
    let input = match open(&o.trace) {
        Ok(i) => i,
        Err(code) => return code,
    };
    let report = super::validate::validate(input);
    print!("{}", report.text(o.shim_only));
    i32::from(report.frames_breaking(o.shim_only) > 0 || !report.bad_lines.is_empty())
}

/// `acp-replay stats`: 0, or 2 when the trace cannot be read.
pub fn stats(trace: &std::path::Path) -> i32 {
    match open(trace) {
        Ok(input) => {
            print!("{}", super::stats::stats(input).text());
            0
        }
        Err(code) => code,
    }
}

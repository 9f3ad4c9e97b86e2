//! acp-replay: plays a recorded agent CLI, turns traces into fixtures, checks a shim against a fixture, draws,
//! compares, redacts, validates and counts traces. The format is in `fixtures/README.md`.
//!
//! This file is the command line only, read with lexopt as the shims read theirs (`src/cli/args.rs`); what each
//! command does is in `coda_shim::replay` (the player in `replay::play`, the rest in `replay::commands`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use coda_shim::replay::commands::{self, Check, Diff, Record, Redact, Validate, View};
use coda_shim::replay::diff::Which;
use coda_shim::replay::play::{self, PlayOptions};
use coda_shim::replay::{self, redact, validate};
use lexopt::prelude::*;

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

  acp-replay validate <TRACE.jsonl | FIXTURE> [--shim-only]
      Check every frame against ACP's JSON Schema ({SCHEMA}) and Coda's shapes (fixtures/schema/): each
      frame that breaks a rule, with its line, edge, whose it is (the shim's own: made or changed by it;
      the client's or the agent's as they came), its method, where in the frame and which rule. Answers
      are checked by the method they answer. --shim-only: list and count only the shim's own breaks.
      Exit 0: none, 1: a frame breaks a rule (or a line cannot be read), 2: the trace cannot be read.

  acp-replay stats <TRACE.jsonl | FIXTURE>
      Per side (what Coda saw, what the CLI saw) and method: requests, notifications, answers, requests
      never answered, and the time from request to answer (p50, p90, p99, max); then what the shim added:
      frames it made or changed, and frames of a peer it did not pass on as they came, per method.

  acp-replay -V | --version        print the version
  acp-replay -h | --help           print this help
";

/// The help, with the data-folder variables of the adapters and the schema's version.
fn help() -> String {
    let homes = replay::homes::own_vars().join("/");
    let session_homes: String = replay::homes::with_session_files().iter().map(|h| format!(", {}", h.var)).collect();
    HELP.replace("{HOMES}", &homes)
        .replace("{SESSION_HOMES}", &session_homes)
        .replace("{SCHEMA}", &format!("v1, schema {}", validate::ACP_SCHEMA_VERSION))
}

/// What the command line asks for.
enum Command {
    Help,
    Version,
    Play(PlayOptions),
    Record(Record),
    Check(Check),
    View(View),
    Diff(Diff),
    Redact(Redact),
    Validate(Validate),
    Stats(PathBuf),
}

const COMMANDS: [&str; 8] = ["play", "record", "check", "view", "diff", "redact", "validate", "stats"];

fn main() {
    let code = match parse(std::env::args_os().skip(1).collect()) {
        Ok(Command::Help) => {
            print!("{}", help());
            0
        }
        Ok(Command::Version) => {
            println!("acp-replay {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Ok(Command::Play(o)) => play::play(&o),
        Ok(Command::Record(o)) => run(commands::record(&o)),
        Ok(Command::Check(o)) => run(commands::check(&o)),
        Ok(Command::View(o)) => run(commands::view(&o)),
        Ok(Command::Diff(o)) => commands::diff(&o),
        Ok(Command::Redact(o)) => run(commands::redact(&o)),
        Ok(Command::Validate(o)) => commands::validate(&o),
        Ok(Command::Stats(trace)) => commands::stats(&trace),
        Err(e) => {
            eprintln!("acp-replay: {e}\nTry `acp-replay --help`.");
            2
        }
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

/// Reads the command line: a command's name first (none: `play`), then its arguments.
fn parse(args: Vec<OsString>) -> Result<Command, lexopt::Error> {
    let first = args.first().and_then(|a| a.to_str()).unwrap_or("");
    match first {
        "" if args.is_empty() => return Ok(Command::Help),
        "-h" | "--help" => return Ok(Command::Help),
        "-V" | "--version" => return Ok(Command::Version),
        _ => {}
    }
    let name = COMMANDS.iter().find(|c| **c == first).copied().unwrap_or("play");
    let rest = if COMMANDS.contains(&first) { args[1..].to_vec() } else { args };
    let mut p = lexopt::Parser::from_args(rest);
    Ok(match name {
        "record" => Command::Record(record(&mut p)?),
        "check" => Command::Check(check(&mut p)?),
        "view" => Command::View(view(&mut p)?),
        "diff" => Command::Diff(diff(&mut p)?),
        "redact" => Command::Redact(redact_args(&mut p)?),
        "validate" => Command::Validate(validate_args(&mut p)?),
        "stats" => Command::Stats(one_trace(&mut p, "stats")?),
        _ => Command::Play(play_args(&mut p)?),
    })
}

/// A positional argument, or a complaint about an option this command does not take.
fn positional(arg: lexopt::Arg<'_>) -> Result<PathBuf, lexopt::Error> {
    match arg {
        Value(v) => Ok(PathBuf::from(v)),
        other => Err(other.unexpected()),
    }
}

fn missing(what: &str) -> lexopt::Error {
    lexopt::Error::from(what.to_owned())
}

fn play_args(p: &mut lexopt::Parser) -> Result<PlayOptions, lexopt::Error> {
    let mut fixture = None;
    let mut speed = None;
    let settle = std::env::var("ACP_REPLAY_FILE_SETTLE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(100u64);
    let mut settle = Duration::from_millis(settle);
    let mut took = std::env::var_os("ACP_REPLAY_TOOK").filter(|v| !v.is_empty()).map(PathBuf::from);
    while let Some(arg) = p.next()? {
        match arg {
            Long("speed") => {
                let x: f64 = p.value()?.parse()?;
                speed = (x > 0.0).then_some(x);
            }
            Long("took") => took = Some(p.value()?.into()),
            Long("file-settle") => settle = Duration::from_millis(p.value()?.parse()?),
            Value(v) if fixture.is_none() => fixture = Some(PathBuf::from(v)),
            other => return Err(other.unexpected()),
        }
    }
    let fixture = fixture.ok_or_else(|| missing("which recording? give a fixture folder or a trace file"))?;
    Ok(PlayOptions { fixture, speed, took, settle })
}

fn record(p: &mut lexopt::Parser) -> Result<Record, lexopt::Error> {
    let mut o = Record::default();
    let (mut trace, mut dir) = (None, None);
    while let Some(arg) = p.next()? {
        match arg {
            Long("root") => o.root = Some(p.value()?.into()),
            Long("files") => o.files = Some(p.value()?.into()),
            Long("subst") => {
                let v = p.value()?.string()?;
                let (path, name) =
                    v.rsplit_once('=').ok_or_else(|| missing(&format!("--subst {v:?}: expected PATH=NAME")))?;
                o.substs.push((path.to_owned(), name.to_owned()));
            }
            Long("allow-paths") => o.allow_paths = true,
            Value(v) if trace.is_none() => trace = Some(PathBuf::from(v)),
            Value(v) if dir.is_none() => dir = Some(PathBuf::from(v)),
            other => return Err(other.unexpected()),
        }
    }
    let (Some(trace), Some(dir)) = (trace, dir) else {
        return Err(missing("usage: acp-replay record <TRACE.jsonl> <FIXTURE-DIR> --root DIR"));
    };
    o.trace = trace;
    o.dir = dir;
    Ok(o)
}

fn check(p: &mut lexopt::Parser) -> Result<Check, lexopt::Error> {
    let (mut fixture, mut shim, mut agent) = (None, None, None);
    let mut env = Vec::new();
    let mut timeout = Duration::from_secs(20);
    while let Some(arg) = p.next()? {
        match arg {
            Long("shim") => shim = Some(p.value()?.into()),
            Long("agent") => agent = Some(p.value()?.string()?),
            Long("env") => {
                let v = p.value()?.string()?;
                let (k, val) = v.split_once('=').ok_or_else(|| missing(&format!("--env {v:?}: expected KEY=VALUE")))?;
                env.push((k.to_owned(), val.to_owned()));
            }
            Long("timeout") => timeout = Duration::from_secs_f64(p.value()?.parse()?),
            Value(v) if fixture.is_none() => fixture = Some(PathBuf::from(v)),
            other => return Err(other.unexpected()),
        }
    }
    let (Some(fixture), Some(shim)) = (fixture, shim) else {
        return Err(missing("usage: acp-replay check <FIXTURE> --shim <coda-BINARY>"));
    };
    Ok(Check { fixture, shim, agent, timeout, env })
}

fn view(p: &mut lexopt::Parser) -> Result<View, lexopt::Error> {
    let mut o = View::default();
    let mut trace = None;
    while let Some(arg) = p.next()? {
        match arg {
            Short('o') | Long("output") => o.out = Some(p.value()?.into()),
            Long("open") => o.open = true,
            arg if trace.is_none() => trace = Some(positional(arg)?),
            other => return Err(other.unexpected()),
        }
    }
    o.trace = trace.ok_or_else(|| missing("usage: acp-replay view <TRACE.jsonl | FIXTURE> [-o PAGE.html] [--open]"))?;
    Ok(o)
}

fn diff(p: &mut lexopt::Parser) -> Result<Diff, lexopt::Error> {
    let mut o = Diff::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long(flag @ ("side-a" | "side-b")) => {
                let (b, flag) = (usize::from(flag == "side-b"), flag.to_owned());
                let v = p.value()?.string()?;
                let w =
                    Which::parse(&v).ok_or_else(|| missing(&format!("--{flag} {v:?}: expected client or agent")))?;
                o.sides[b] = Some(w);
            }
            Long("html") => o.html = Some(p.value()?.into()),
            Value(v) if o.paths.len() < 2 => o.paths.push(PathBuf::from(v)),
            other => return Err(other.unexpected()),
        }
    }
    if o.paths.is_empty() {
        return Err(missing("which traces? acp-replay diff <A> [B]"));
    }
    Ok(o)
}

fn redact_args(p: &mut lexopt::Parser) -> Result<Redact, lexopt::Error> {
    let mut o = Redact::default();
    let mut trace = None;
    while let Some(arg) = p.next()? {
        match arg {
            Short('o') | Long("output") => o.out = Some(p.value()?.into()),
            Long("keep") => o.keep = redact::Keep::parse(&p.value()?.string()?).map_err(missing_owned)?,
            Long("keep-texts") => o.keep = redact::Keep::ALL,
            arg if trace.is_none() => trace = Some(positional(arg)?),
            other => return Err(other.unexpected()),
        }
    }
    o.trace = trace.ok_or_else(|| missing("usage: acp-replay redact <TRACE.jsonl | FIXTURE> [-o OUT.jsonl]"))?;
    Ok(o)
}

fn missing_owned(e: String) -> lexopt::Error {
    lexopt::Error::from(e)
}

fn validate_args(p: &mut lexopt::Parser) -> Result<Validate, lexopt::Error> {
    let mut o = Validate::default();
    let mut trace = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("shim-only") => o.shim_only = true,
            arg if trace.is_none() => trace = Some(positional(arg)?),
            other => return Err(other.unexpected()),
        }
    }
    o.trace = trace.ok_or_else(|| missing("usage: acp-replay validate <TRACE.jsonl | FIXTURE> [--shim-only]"))?;
    Ok(o)
}

/// The one trace a command takes, and no option.
fn one_trace(p: &mut lexopt::Parser, command: &str) -> Result<PathBuf, lexopt::Error> {
    let mut trace = None;
    while let Some(arg) = p.next()? {
        match arg {
            arg if trace.is_none() => trace = Some(positional(arg)?),
            other => return Err(other.unexpected()),
        }
    }
    trace.ok_or_else(|| missing(&format!("usage: acp-replay {command} <TRACE.jsonl | FIXTURE>")))
}

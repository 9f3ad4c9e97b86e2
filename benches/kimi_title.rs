//! Benchmark of coda-kimi's title layer reading Kimi's record of a session (issue #23 §1): it prints figures
//! and asserts nothing (a bench, not a test).
//!
//! Kimi titles a session prompted in an earlier process with the instruction; the title layer then reads up to
//! 8 MiB of that session's main wire for the user's first prompt. Measured: the round trip of an unrelated
//! request through coda-kimi while that read runs, in the same run, two ways: the read as a job of the engine's
//! (off the relay loop, as shipped), and the read run on the loop (`CODA_SHIM_INLINE_WORK`, the behaviour
//! before jobs). Also: the same round trip with no read going (the baseline), and how long the title took.
//!
//! Run: `cargo bench --bench kimi_title`. `CODA_KIMI_BIN=PATH` measures another build of coda-kimi.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// Sessions read per run, each from a wire of its own.
const SESSIONS: usize = 12;
/// Round trips measured per read (the first ones fall while the read runs).
const PINGS_PER_READ: usize = 30;
/// Round trips measured with no read going.
const IDLE_PINGS: usize = 300;

/// A stand-in for `kimi acp`: answers every request with an empty result at once, and on the client's
/// `_bench/title` notification reports a title that echoes Coda's instruction for the session it names (what
/// Kimi 2.1.0 does for a session first prompted in an earlier process).
const FAKE_AGENT: &str = r#"#!/bin/bash
while IFS= read -r line; do
  if [[ $line =~ \"method\":\"_bench/title\".*\"s\":\"([^\"]+)\" ]]; then
    printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"%s","update":{"sessionUpdate":"session_info_update","title":"<coda-session-instruction> # Coda client"}}}\n' "${BASH_REMATCH[1]}"
  elif [[ $line =~ \"id\":([0-9]+) ]]; then
    printf '{"jsonrpc":"2.0","id":%s,"result":{}}\n' "${BASH_REMATCH[1]}"
  fi
done
"#;

fn session(i: usize) -> String {
    format!("session_0b6f0f4e-0000-4000-8000-{i:012}")
}

/// A main wire of just over 8 MiB whose records all name `turn.prompt` (so each is parsed) and none of
/// which is the user's: the title layer reads as far as it ever does.
fn write_wire(home: &Path, i: usize) {
    let dir = home.join(format!("sessions/wd_work_000000000000/{}/agents/main", session(i)));
    std::fs::create_dir_all(&dir).unwrap();
    let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join("wire.jsonl")).unwrap());
    writeln!(out, r#"{{"type":"metadata","protocol_version":"1.5","created_at":1}}"#).unwrap();
    let text = "x".repeat(900);
    let mut written = 0;
    let mut turn = 0;
    while written <= 8 << 20 {
        let line = format!(
            r#"{{"type":"turn.prompt","agentId":"main","turnId":{turn},"origin":{{"kind":"skill_activation"}},"input":[{{"type":"text","text":"{text}"}}]}}"#
        );
        writeln!(out, "{line}").unwrap();
        written += line.len() + 1;
        turn += 1;
    }
}

fn lines(stdout: std::process::ChildStdout) -> Receiver<(Instant, String)> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_for(rx: &Receiver<(Instant, String)>, needle: &str) -> Instant {
    loop {
        let (at, line) = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| panic!("no frame with {needle}"));
        if line.contains(needle) {
            return at;
        }
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// What one run measured, in milliseconds.
struct Figures {
    idle: Vec<f64>,
    during: Vec<f64>,
}

fn run(home: &Path, agent: &Path, inline: bool) -> Figures {
    let bin = std::env::var_os("CODA_KIMI_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_coda-kimi").into());
    let mut cmd = Command::new(bin);
    if inline {
        cmd.env("CODA_SHIM_INLINE_WORK", "1");
    } else {
        cmd.env_remove("CODA_SHIM_INLINE_WORK");
    }
    let mut shim = cmd
        .arg("--agent-command")
        .arg(format!("bash {}", agent.display()))
        .env("KIMI_CODE_HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = shim.stdin.take().unwrap();
    let rx = lines(shim.stdout.take().unwrap());
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":1}}}}"#).unwrap();
    wait_for(&rx, r#""id":0"#);
    let mut id = 1;
    let mut ping = |stdin: &mut std::process::ChildStdin, rx: &Receiver<(Instant, String)>| {
        id += 1;
        let t0 = Instant::now();
        writeln!(stdin, r#"{{"jsonrpc":"2.0","id":{id},"method":"_bench/ping","params":{{}}}}"#).unwrap();
        wait_for(rx, &format!(r#""id":{id},"#)).duration_since(t0).as_secs_f64() * 1e3
    };
    let idle: Vec<f64> = (0..IDLE_PINGS).map(|_| ping(&mut stdin, &rx)).collect();
    let mut during = Vec::new();
    for i in 0..SESSIONS {
        // Each read starts cold in the title layer (a session it has not seen) but warm in the page cache.
        writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"_bench/title","params":{{"s":"{}"}}}}"#, session(i)).unwrap();
        for _ in 0..PINGS_PER_READ {
            during.push(ping(&mut stdin, &rx));
        }
    }
    drop(stdin);
    let _ = shim.wait();
    Figures { idle, during }
}

/// How long coda-kimi takes to answer an echoed title for one session (the read itself), on its own.
fn title_time(home: &Path, agent: &Path, inline: bool) -> Vec<f64> {
    let bin = std::env::var_os("CODA_KIMI_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_coda-kimi").into());
    let mut cmd = Command::new(bin);
    if inline {
        cmd.env("CODA_SHIM_INLINE_WORK", "1");
    } else {
        cmd.env_remove("CODA_SHIM_INLINE_WORK");
    }
    let mut shim = cmd
        .arg("--agent-command")
        .arg(format!("bash {}", agent.display()))
        .env("KIMI_CODE_HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = shim.stdin.take().unwrap();
    let rx = lines(shim.stdout.take().unwrap());
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":1}}}}"#).unwrap();
    wait_for(&rx, r#""id":0"#);
    let mut out = Vec::new();
    for i in 0..SESSIONS {
        let t0 = Instant::now();
        writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"_bench/title","params":{{"s":"{}"}}}}"#, session(i)).unwrap();
        out.push(wait_for(&rx, &session(i)).duration_since(t0).as_secs_f64() * 1e3);
    }
    drop(stdin);
    let _ = shim.wait();
    out
}

fn main() {
    let tmp = tempfile::Builder::new().prefix("kimi-title-").tempdir().expect("a temporary folder");
    let agent = tmp.path().join("agent.sh");
    std::fs::write(&agent, FAKE_AGENT).unwrap();
    let home = tmp.path().join("kimi-home");
    for i in 0..SESSIONS {
        write_wire(&home, i);
    }
    // Warm the page cache: both runs read from memory.
    let _ = title_time(&home, &agent, false);

    println!(
        "{SESSIONS} reads of an 8 MiB main wire; {PINGS_PER_READ} round trips of an unrelated request from each read's start"
    );
    let mut p99 = Vec::new();
    for (name, inline) in [("before: the read on the relay loop", true), ("after: the read as an engine job", false)] {
        let Figures { mut idle, mut during } = run(&home, &agent, inline);
        let mut titles = title_time(&home, &agent, inline);
        let (i50, i99) = (percentile(&mut idle, 0.5), percentile(&mut idle, 0.99));
        let (d50, d99, dmax) =
            (percentile(&mut during, 0.5), percentile(&mut during, 0.99), percentile(&mut during, 1.0));
        let t50 = percentile(&mut titles, 0.5);
        println!("{name}:");
        println!("  round trip, no read going: p50 {i50:.3} ms, p99 {i99:.3} ms ({} samples)", idle.len());
        println!(
            "  round trip during reads:   p50 {d50:.3} ms, p99 {d99:.3} ms, max {dmax:.3} ms ({} samples)",
            during.len()
        );
        println!("  echoed title -> title out (the read): p50 {t50:.3} ms");
        println!("  p99 during reads / p99 with none: {:.2}x", d99 / i99);
        p99.push(d99);
    }
    println!("p99 during reads, before/after: {:.2}x", p99[0] / p99[1]);
    println!("target p99 under 5 ms after: {}", if p99[1] < 5.0 { "met" } else { "NOT met" });
}

//! Benchmarks of coda-kimi's file reading: they print figures and assert nothing (a bench, not a test).
//! - latency of Kimi activity reports: from a wire record landing on disk to the `_coda/wait` frame on the
//!   shim's stdout, against a baseline in the same run: a frame the child writes on its stdout, relayed to the
//!   shim's stdout; also checks that the idle shim uses no CPU;
//! - under a flood (issue #13 §4): peak memory and the round trip of an unrelated request while 200 MB of ~1 KiB
//!   records land in `agents/main/wire.jsonl` as fast as the disk takes them, and for one 50 MB record.
//!
//! Run: `cargo bench --bench kimi_files` (all sections), or name sections: `-- latency append line limit`.
//! `CODA_KIMI_BIN=PATH` measures another build of coda-kimi (e.g. an older one, for a before/after comparison).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const SESSION: &str = "session_0b6f0f4e-0000-4000-8000-000000000001";

/// A stand-in for `kimi acp`: answers initialize and session/new (creating the session folder), then relays
/// whatever is written into the FIFO `$BENCH_FIFO` (when set) to its stdout and answers every request with an
/// empty result at once.
const FAKE_AGENT: &str = r#"#!/bin/bash
read -r _init
printf '%s\n' '{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}}'
read -r _new
dir="$KIMI_CODE_HOME/sessions/wd_work_000000000000/$BENCH_SESSION/agents/main"
mkdir -p "$dir"
printf '%s\n' '{"type":"metadata","protocol_version":"1.5","created_at":1}' > "$dir/wire.jsonl"
printf '{"jsonrpc":"2.0","id":1,"result":{"sessionId":"%s"}}\n' "$BENCH_SESSION"
if [ -n "$BENCH_FIFO" ]; then cat "$BENCH_FIFO" & fi
while IFS= read -r line; do
  if [[ $line =~ \"id\":([0-9]+) ]]; then
    printf '{"jsonrpc":"2.0","id":%s,"result":{}}\n' "${BASH_REMATCH[1]}"
  fi
done
"#;

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

/// The coda-kimi measured: this build, or `$CODA_KIMI_BIN`.
fn binary() -> std::ffi::OsString {
    std::env::var_os("CODA_KIMI_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_coda-kimi").into())
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

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the ")".
    fields.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// (thread id and name, CPU ticks) of every thread of `pid`.
fn thread_ticks(pid: u32) -> Vec<(String, u64)> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    rd.flatten()
        .filter_map(|t| {
            let tid: u32 = t.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            Some((format!("{tid} {}", comm.trim()), cpu_ticks_at(&t.path().join("stat"))))
        })
        .collect()
}

fn cpu_ticks_at(stat: &std::path::Path) -> u64 {
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// Section `latency`.
fn wire_record_to_coda_wait_latency() {
    let Run { mut shim, stdin, rx, wire, fifo, _tmp: tmp } = start("kimi-latency", true);
    let mut pipe = std::fs::OpenOptions::new().write(true).open(fifo.expect("a FIFO")).unwrap();
    let append = |text: &str| {
        let mut f = std::fs::OpenOptions::new().append(true).open(&wire).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };

    let n = 300;
    let (mut file_ms, mut relay_ms) = (Vec::new(), Vec::new());
    for i in 0..n {
        // Baseline: the child writes a frame; the shim relays it.
        let frame = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{SESSION}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"base-{i}"}}}}}}}}"#
        );
        let t0 = Instant::now();
        writeln!(pipe, "{frame}").unwrap();
        relay_ms.push(wait_for(&rx, &format!("base-{i}\"")).duration_since(t0).as_secs_f64() * 1e3);
        // The measured path: a wire record lands; the shim reports it.
        let rec = format!(
            r#"{{"type":"task.started","agentId":"main","info":{{"taskId":"bash-{i:08}","kind":"process","status":"running","description":"bench","command":"true"}},"time":2}}"#
        );
        let t0 = Instant::now();
        append(&format!("{rec}\n"));
        file_ms.push(wait_for(&rx, &format!("\"waitId\":\"bash-{i:08}\"")).duration_since(t0).as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_millis(2));
    }
    let pid = shim.id();
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_ticks(pid);
    let threads_before = thread_ticks(pid);
    std::thread::sleep(Duration::from_secs(3));
    let idle_ticks = cpu_ticks(pid) - before;
    for (name, ticks) in thread_ticks(pid) {
        let was = threads_before.iter().find(|(n, _)| *n == name).map_or(0, |(_, t)| *t);
        if ticks > was {
            println!("busy thread while idle: {name} ({} ticks)", ticks - was);
        }
    }
    drop(pipe);
    drop(stdin);
    let _ = shim.wait();
    drop(tmp);

    let (f50, f99) = (percentile(&mut file_ms, 0.5), percentile(&mut file_ms, 0.99));
    let (r50, r99) = (percentile(&mut relay_ms, 0.5), percentile(&mut relay_ms, 0.99));
    println!("wire record -> _coda/wait: p50 {f50:.3} ms, p99 {f99:.3} ms ({n} samples)");
    println!("baseline child frame -> relayed frame: p50 {r50:.3} ms, p99 {r99:.3} ms");
    println!("ratio file/baseline: p50 {:.2}x, p99 {:.2}x", f50 / r50, f99 / r99);
    println!("target p99 under 100 ms: {}", if f99 < 100.0 { "met" } else { "NOT met" });
    println!("CPU ticks used by the idle shim over 3 s: {idle_ticks} (the goal: 0)");
}

fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// coda-kimi with the stand-in, after initialize and session/new, with a client turn open in the main wire.
struct Run {
    shim: std::process::Child,
    stdin: std::process::ChildStdin,
    rx: Receiver<(Instant, String)>,
    wire: std::path::PathBuf,
    /// `$BENCH_FIFO`, when asked for.
    fifo: Option<std::path::PathBuf>,
    _tmp: tempfile::TempDir,
}

fn start(name: &str, with_fifo: bool) -> Run {
    let tmp = tempfile::Builder::new().prefix(&format!("{name}-")).tempdir().expect("a temporary folder");
    let agent = tmp.path().join("agent.sh");
    std::fs::write(&agent, FAKE_AGENT).unwrap();
    let home = tmp.path().join("kimi-home");
    let mut cmd = Command::new(binary());
    let fifo = with_fifo.then(|| tmp.path().join("fifo"));
    if let Some(fifo) = &fifo {
        assert!(Command::new("mkfifo").arg(fifo).status().unwrap().success());
        cmd.env("BENCH_FIFO", fifo);
    }
    let mut shim = cmd
        .arg("--agent-command")
        .arg(format!("bash {}", agent.display()))
        .env("KIMI_CODE_HOME", &home)
        .env("BENCH_SESSION", SESSION)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = shim.stdin.take().unwrap();
    let rx = lines(shim.stdout.take().unwrap());
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"coda":{"waits":{}}}}}}"#;
    writeln!(stdin, "{init}").unwrap();
    wait_for(&rx, r#""id":0"#);
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":1,"method":"session/new","params":{{"cwd":"/","mcpServers":[]}}}}"#)
        .unwrap();
    wait_for(&rx, r#""id":1"#);
    let wire = home.join(format!("sessions/wd_work_000000000000/{SESSION}/agents/main/wire.jsonl"));
    let mut run = Run { shim, stdin, rx, wire, fifo, _tmp: tmp };
    run.append(
        b"{\"type\":\"turn.prompt\",\"agentId\":\"main\",\"turnId\":0,\"origin\":{\"kind\":\"user\"},\"time\":1}\n",
    );
    run
}

impl Run {
    fn append(&mut self, bytes: &[u8]) {
        let mut f = std::fs::OpenOptions::new().append(true).open(&self.wire).unwrap();
        f.write_all(bytes).unwrap();
    }

    /// Appends `bulk` and then a task record on another thread (in writes of 1 MiB, as fast as the disk takes
    /// them), while sending pings every 5 ms from the start until that task's `_coda/wait` arrives; returns the
    /// longest ping round trip (ms) and how many pings went by.
    fn ping_until_reported(&mut self, bulk: Vec<u8>, task: &str, first_id: u64) -> (f64, usize) {
        let rec = format!(
            r#"{{"type":"task.started","agentId":"main","info":{{"taskId":"{task}","kind":"process","status":"running","description":"bench","command":"true"}},"time":2}}"#
        );
        let wire = self.wire.clone();
        let writer = std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().append(true).open(&wire).unwrap();
            for piece in bulk.chunks(1 << 20) {
                f.write_all(piece).unwrap();
            }
            f.write_all(format!("{rec}\n").as_bytes()).unwrap();
        });
        let mut worst: f64 = 0.0;
        let mut pings = 0;
        let mut id = first_id;
        loop {
            let sent = Instant::now();
            writeln!(self.stdin, r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{}}}}"#).unwrap();
            let needle = format!("\"id\":{id},");
            let mut reported = false;
            loop {
                let (at, line) = self.rx.recv_timeout(Duration::from_secs(120)).expect("the shim went quiet");
                if line.contains(&format!("\"waitId\":\"{task}\"")) {
                    reported = true;
                }
                if line.contains(&needle) {
                    worst = worst.max(at.duration_since(sent).as_secs_f64() * 1e3);
                    break;
                }
            }
            pings += 1;
            id += 1;
            if reported {
                writer.join().unwrap();
                return (worst, pings);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Section `append`.
fn memory_and_an_unrelated_round_trip_while_200_mb_are_appended() {
    let mut run = start("kimi-load-append", false);
    let idle = run.ping_until_reported(Vec::new(), "bash-00000000", 1_000_000);
    let out = "x".repeat(900);
    let mut batch = Vec::with_capacity(200_000_000 + 4096);
    let mut n = 0u64;
    while batch.len() < 200_000_000 {
        let r = format!(
            r#"{{"type":"context.append_loop_event","agentId":"main","event":{{"type":"tool.result","toolCallId":"call_{n}","result":{{"output":"{out}"}}}},"time":{}}}"#,
            1_796_000_000_000u64 + n
        );
        batch.extend_from_slice(r.as_bytes());
        batch.push(b'\n');
        n += 1;
    }
    let t0 = Instant::now();
    let (worst, pings) = run.ping_until_reported(batch, "bash-00000001", 0);
    let took = t0.elapsed();
    let peak = peak_rss_mib(run.shim.id());
    println!("idle: worst ping round trip {:.2} ms over {} pings", idle.0, idle.1);
    println!(
        "200 MB ({n} records) appended in 1 MiB writes: read and reported after {:.2} s; worst unrelated round trip \
         {worst:.2} ms over {pings} pings; peak RSS {peak:.1} MiB",
        took.as_secs_f64()
    );
    drop(run.stdin);
    let _ = run.shim.wait();
}

/// Peak memory and the worst unrelated round trip while one record (`line`) is appended.
fn one_record(name: &str, what: &str, line: Vec<u8>) {
    let mut run = start(name, false);
    let t0 = Instant::now();
    let (worst, pings) = run.ping_until_reported(line, "bash-00000002", 0);
    let peak = peak_rss_mib(run.shim.id());
    println!(
        "{what}: the next record reported after {:.2} s; worst unrelated round trip {worst:.2} ms over {pings} \
         pings; peak RSS {peak:.1} MiB",
        t0.elapsed().as_secs_f64()
    );
    drop(run.stdin);
    let _ = run.shim.wait();
}

/// Section `line`.
fn memory_for_one_50_mb_record() {
    let mut line = b"{\"type\":\"context.append_loop_event\",\"agentId\":\"main\",\"pad\":\"".to_vec();
    line.resize(line.len() + 50_000_000, b'y');
    line.extend_from_slice(b"\"}\n");
    one_record("kimi-load-line", "one 50 MB record (over the limit: skipped)", line);
}

/// Section `limit`.
fn memory_for_one_record_just_under_the_limit() {
    let mut line = br#"{"type":"context.append_loop_event","agentId":"main","event":{"type":"tool.result","toolCallId":"c","result":{"output":""#.to_vec();
    line.resize(line.len() + 16_700_000, b'y');
    line.extend_from_slice(b"\"}},\"time\":5}\n");
    one_record("kimi-load-limit", "one 16.7 MB tool result (under the 16 MiB limit: read)", line);
}

const SECTIONS: [(&str, fn()); 4] = [
    ("latency", wire_record_to_coda_wait_latency),
    ("append", memory_and_an_unrelated_round_trip_while_200_mb_are_appended),
    ("line", memory_for_one_50_mb_record),
    ("limit", memory_for_one_record_just_under_the_limit),
];

fn main() {
    // `cargo bench` passes `--bench`; every other argument names a section.
    let asked: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if let Some(unknown) = asked.iter().find(|a| !SECTIONS.iter().any(|(name, _)| name == a)) {
        eprintln!("unknown section {unknown:?}; the sections: latency append line limit");
        std::process::exit(2);
    }
    for (name, run) in SECTIONS {
        if asked.is_empty() || asked.iter().any(|a| a == name) {
            println!("== {name}");
            run();
        }
    }
}

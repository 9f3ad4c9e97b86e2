//! Relay benchmarks: the same load through three paths in one run, reported as ratios.
//!
//! - direct: the load client talks to the load agent itself;
//! - shim: through `coda-opencode` (relay + instruction layer);
//! - node: through `benches/node_forwarder.js` (readline + write, the approach this project replaces);
//! - cat (throughput only): `cat` in each direction, a middle process that only copies: the floor for
//!   any relay on this machine.
//!
//! The load agent is this same executable (env `CODA_BENCH_AGENT=1`): it answers each prompt with N
//! `session/update` frames of S bytes, each stamped with its send time (CLOCK_REALTIME, ns). Run with
//! `cargo bench --bench relay` (add `-- --quick` for a shorter run, and section names such as
//! `throughput latency initialize memory soak` to run only those; env `CODA_BENCH_NO_NODE=1` skips
//! Node). Env `CODA_BENCH_BASELINE=<another coda-opencode>` adds that build as a path of the same
//! run (a refactor is judged by shim/baseline, not by numbers from another day). Nothing here asserts a time.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

// ---------------------------------------------------------------- load agent

fn agent() {
    let stdin = std::io::stdin();
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let mut line = String::new();
    let mut input = stdin.lock();
    loop {
        line.clear();
        if input.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        let id = msg.get("id").cloned().unwrap_or_default();
        match msg.get("method").and_then(|m| m.as_str()).unwrap_or("") {
            "initialize" => {
                let _ = writeln!(
                    out,
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":1,"agentCapabilities":{{"loadSession":true}},"agentInfo":{{"name":"load","version":"1"}},"_meta":{{"sentAt":{}}}}}}}"#,
                    now_ns()
                );
            }
            "session/new" => {
                let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{{"sessionId":"load"}}}}"#);
            }
            "session/prompt" => {
                let load = msg.pointer("/params/_meta/load").cloned().unwrap_or_default();
                let count = load.get("count").and_then(|v| v.as_u64()).unwrap_or(0);
                let size = load.get("size").and_then(|v| v.as_u64()).unwrap_or(100) as usize;
                let pace = load.get("paceMicros").and_then(|v| v.as_u64()).unwrap_or(0);
                let text = "x".repeat(size.saturating_sub(190));
                for _ in 0..count {
                    let _ = writeln!(out, "{}", update_frame(&text, now_ns()));
                    if pace > 0 {
                        let _ = out.flush();
                        std::thread::sleep(Duration::from_micros(pace));
                    }
                }
                let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{{"stopReason":"end_turn"}}}}"#);
            }
            _ => {}
        }
        let _ = out.flush();
    }
}

/// One `session/update` as the load agent writes it: `size` bytes with `text` of `size - 190`.
fn update_frame(text: &str, stamp: u128) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"_meta":{{"t":{stamp}}},"sessionId":"load","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
    )
}

// ---------------------------------------------------------------- load client

#[derive(Clone, Copy, PartialEq)]
enum Path {
    Direct,
    Shim,
    Node,
    /// `cat` in each direction: a process in the middle that only copies, the floor for any relay.
    Cat,
    /// Another build of `coda-opencode` (env `CODA_BENCH_BASELINE`, e.g. the previous main's release build), run
    /// in the same session so a change is judged by same-run ratios.
    Baseline,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Shim => "coda-opencode",
            Path::Node => "node forwarder",
            Path::Cat => "cat",
            Path::Baseline => "baseline coda-opencode",
        }
    }
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<std::process::ChildStdout>,
    next_id: u64,
    line: Vec<u8>,
}

fn spawn(path: Path) -> Peer {
    let me = std::env::current_exe().expect("current exe");
    let mut cmd = match path {
        Path::Direct => Command::new(&me),
        Path::Shim => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_coda-opencode"));
            c.arg("--agent-command").arg(shell_words::quote(&me.display().to_string()).into_owned());
            c
        }
        Path::Baseline => {
            let mut c = Command::new(std::env::var_os("CODA_BENCH_BASELINE").expect("CODA_BENCH_BASELINE"));
            c.arg("--agent-command").arg(shell_words::quote(&me.display().to_string()).into_owned());
            c
        }
        Path::Cat => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(r#"cat | "$0" | cat"#).arg(&me);
            c
        }
        Path::Node => {
            let mut c = Command::new("node");
            c.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/node_forwarder.js")).arg(&me);
            c
        }
    };
    cmd.env("CODA_BENCH_AGENT", "1").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("spawn");
    let stdin = child.stdin.take().expect("stdin");
    let out = BufReader::with_capacity(1 << 20, child.stdout.take().expect("stdout"));
    Peer { child, stdin, out, next_id: 0, line: Vec::new() }
}

impl Peer {
    fn send(&mut self, method: &str, params: serde_json::Value) -> u64 {
        self.next_id += 1;
        let frame = serde_json::json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        writeln!(self.stdin, "{frame}").expect("write");
        self.stdin.flush().expect("flush");
        self.next_id
    }

    /// Reads one line into `self.line`; false at end of stream.
    fn read(&mut self) -> bool {
        self.line.clear();
        self.out.read_until(b'\n', &mut self.line).map(|n| n > 0).unwrap_or(false)
    }

    /// The send stamp of an update: `"t":<ns>` near the start of the frame.
    fn stamp(&self) -> Option<u128> {
        let head = &self.line[..self.line.len().min(160)];
        let at = memchr::memmem::find(head, b"\"t\":")? + 4;
        let digits = head[at..].iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&head[at..at + digits]).ok()?.parse().ok()
    }

    fn is_response(&self) -> bool {
        memchr::memmem::find(&self.line, b"\"stopReason\"").is_some()
    }

    fn start_session(&mut self) -> u128 {
        self.send(
            "initialize",
            serde_json::json!({"protocolVersion": 1, "clientCapabilities": {"_meta": {"coda": {"waits": {}}}}}),
        );
        assert!(self.read(), "initialize answer");
        let got = now_ns();
        let v: serde_json::Value = serde_json::from_slice(&self.line).expect("initialize answer is JSON");
        let sent = v.pointer("/result/_meta/sentAt").and_then(|t| t.as_u64()).unwrap_or(0) as u128;
        let sp = serde_json::json!({"mode": "append", "content": [{"type": "text", "text": "Benchmark session."}]});
        self.send("session/new", serde_json::json!({"cwd": "/", "mcpServers": [], "systemPrompt": sp}));
        assert!(self.read(), "session/new answer");
        got.saturating_sub(sent)
    }

    /// One prompt answered with `count` frames of `size` bytes; returns (seconds, bytes, latencies ns).
    fn turn(&mut self, count: u64, size: usize, pace_micros: u64) -> (f64, u64, Vec<u64>) {
        let started = Instant::now();
        self.send(
            "session/prompt",
            serde_json::json!({"sessionId": "load", "prompt": [{"type": "text", "text": "go"}],
                "_meta": {"load": {"count": count, "size": size, "paceMicros": pace_micros}}}),
        );
        let mut bytes = 0u64;
        let mut lat = Vec::with_capacity(count as usize);
        while self.read() {
            bytes += self.line.len() as u64;
            if let Some(t) = self.stamp() {
                lat.push(now_ns().saturating_sub(t) as u64);
            } else if self.is_response() {
                break;
            }
        }
        (started.elapsed().as_secs_f64(), bytes, lat)
    }

    /// CPU time used so far by the process we started, all its threads (ns): the process in the
    /// middle, or for direct the load agent itself.
    fn cpu_ns(&self) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.child.id())) else { return 0 };
        tasks.flatten().map(|t| schedstat_ns(&t.path())).sum()
    }

    fn peak_rss_kib(&self, path: Path) -> Option<u64> {
        // The shim and the Node forwarder: the process we started. Direct has no middle process.
        if path == Path::Direct {
            return None;
        }
        rss(self.child.id(), "VmHWM")
    }

    fn finish(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// CPU time of one thread so far (ns), from its `schedstat`.
fn schedstat_ns(task: &std::path::Path) -> u64 {
    let stat = std::fs::read_to_string(task.join("schedstat")).unwrap_or_default();
    stat.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Nanoseconds per call of `f`, over about a third of a second on this thread alone.
fn ns_per_call(mut f: impl FnMut()) -> f64 {
    let (started, mut calls) = (Instant::now(), 0u64);
    while started.elapsed() < Duration::from_millis(330) {
        for _ in 0..1000 {
            f();
        }
        calls += 1000;
    }
    started.elapsed().as_nanos() as f64 / calls as f64
}

fn rss(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn percentile(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn node_available() -> bool {
    Command::new("node").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn main() {
    if std::env::var_os("CODA_BENCH_AGENT").is_some() {
        return agent();
    }
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--") || a == "--quick").collect();
    let quick = args.iter().any(|a| a == "--quick");
    // Sections to run: any of throughput, latency, initialize, memory, soak; none named = all.
    let named: Vec<&str> = args.iter().map(String::as_str).filter(|a| *a != "--quick").collect();
    let run = |section: &str| named.is_empty() || named.contains(&section);
    let mut paths = vec![Path::Direct, Path::Shim];
    if std::env::var_os("CODA_BENCH_NO_NODE").is_some() {
        println!("CODA_BENCH_NO_NODE set: the Node forwarder baseline is skipped");
    } else if node_available() {
        paths.push(Path::Node);
    } else {
        println!("node not found: the Node forwarder baseline is skipped");
    }
    if let Some(base) = std::env::var_os("CODA_BENCH_BASELINE") {
        println!("baseline: {} (CODA_BENCH_BASELINE)", PathBuf::from(base).display());
        paths.push(Path::Baseline);
    }
    let scale = if quick { 4 } else { 1 };

    if run("throughput") {
        println!("\n## Throughput (frames flooded as fast as the agent writes; best of 3 turns, CPU the least of 3)\n");
        println!(
            "| frame size | frames | direct MB/s | shim MB/s | shim/direct | node MB/s | node/direct | cat/direct | shim CPU ns/frame | node CPU ns/frame |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        // Two `cat`s in the middle as well: what any process that only copies costs on this machine.
        let with_cat: Vec<Path> = paths.iter().copied().chain([Path::Cat]).collect();
        let mut budgets = Vec::new();
        for (size, count) in [(200usize, 200_000u64), (4 << 10, 40_000), (64 << 10, 4_000), (1 << 20, 300)] {
            let count = count / scale;
            let (mut mbps, mut cpu) = (Vec::new(), Vec::new());
            let mut direct_costs = (0.0, 0, 0);
            for &path in &with_cat {
                let mut peer = spawn(path);
                peer.start_session();
                peer.turn(count / 10, size, 0); // warm-up
                let (before, client_before) = (peer.cpu_ns(), schedstat_ns("/proc/thread-self".as_ref()));
                let (mut best, mut best_secs, mut least) = (0f64, f64::MAX, u64::MAX);
                for _ in 0..3 {
                    let turn_before = peer.cpu_ns();
                    let (secs, bytes, _) = peer.turn(count, size, 0);
                    best = best.max(bytes as f64 / secs / 1e6);
                    best_secs = best_secs.min(secs);
                    least = least.min((peer.cpu_ns() - turn_before) / count);
                }
                if path == Path::Direct {
                    let used = (peer.cpu_ns() - before) / (3 * count);
                    let client = (schedstat_ns("/proc/thread-self".as_ref()) - client_before) / (3 * count);
                    direct_costs = (best_secs * 1e9 / count as f64, used, client);
                }
                // The least of the three turns: a turn slowed by another process's use of the cores costs more.
                cpu.push(least);
                peer.finish();
                mbps.push((path, best));
            }
            let at = |p: Path| mbps.iter().find(|m| m.0 == p).map(|m| m.1);
            let direct = at(Path::Direct).unwrap_or(f64::NAN);
            let shim = at(Path::Shim).unwrap_or(f64::NAN);
            let node = at(Path::Node);
            println!(
                "| {} | {count} | {direct:.0} | {shim:.0} | {:.2} | {} | {} | {:.2} | {} | {} |",
                human(size),
                shim / direct,
                node.map_or("-".into(), |n| format!("{n:.0}")),
                node.map_or("-".into(), |n| format!("{:.2}", n / direct)),
                at(Path::Cat).unwrap_or(f64::NAN) / direct,
                cpu[1],
                node.map_or("-".into(), |_| cpu[2].to_string()),
            );
            if let Some(base) = at(Path::Baseline) {
                println!(
                    "|   baseline | {count} | {direct:.0} | {base:.0} | {:.2} | shim/baseline {:.2} | | | {} | |",
                    base / direct,
                    shim / base,
                    cpu[paths.iter().position(|p| *p == Path::Baseline).unwrap_or(0)],
                );
            }
            budgets.push((size, direct_costs, cpu[1]));
        }
        budget(&budgets);
    }
    if run("latency") {
        println!("\n## Latency per frame (paced: one frame every 200 us), microseconds\n");
        println!("| frame size | path | p50 | p99 | added p50 | added p99 |");
        println!("| --- | --- | --- | --- | --- | --- |");
        let mut added = Vec::new();
        for size in [200usize, 4 << 10, 64 << 10] {
            let count = 5_000 / scale as u64;
            let mut base = (0, 0);
            for &path in &paths {
                let mut peer = spawn(path);
                peer.start_session();
                peer.turn(200, size, 200);
                let (_, _, mut lat) = peer.turn(count, size, 200);
                peer.finish();
                let (p50, p99) = (percentile(&mut lat, 0.5) / 1000, percentile(&mut lat, 0.99) / 1000);
                if path == Path::Direct {
                    base = (p50, p99);
                }
                let (a50, a99) = (p50 as i64 - base.0 as i64, p99 as i64 - base.1 as i64);
                if path != Path::Direct {
                    added.push((size, path, a50, a99));
                }
                println!("| {} | {} | {p50} | {p99} | {a50} | {a99} |", human(size), path.name());
            }
        }
        for size in [200usize, 4 << 10, 64 << 10] {
            let shim = added.iter().find(|a| a.0 == size && a.1 == Path::Shim).map(|a| a.3);
            let node = added.iter().find(|a| a.0 == size && a.1 == Path::Node).map(|a| a.3);
            if let (Some(s), Some(n)) = (shim, node) {
                println!("added p99 at {}: node/shim = {:.1}x", human(size), n as f64 / s.max(1) as f64);
            }
        }
    }
    if run("initialize") {
        println!("\n## initialize: child's answer -> client, microseconds (median of 20 starts)\n");
        for &path in &paths {
            let mut v: Vec<u64> = (0..20 / scale)
                .map(|_| {
                    let mut peer = spawn(path);
                    let d = peer.start_session();
                    peer.finish();
                    (d / 1000) as u64
                })
                .collect();
            println!("- {}: {} us", path.name(), percentile(&mut v, 0.5));
        }
    }
    if run("memory") {
        println!("\n## Memory: peak RSS of the process in the middle after the 64 KiB and 1 MiB floods, KiB\n");
        let mut peaks = Vec::new();
        for &path in &paths[1..] {
            let mut peer = spawn(path);
            peer.start_session();
            peer.turn(2_000 / scale as u64, 64 << 10, 0);
            peer.turn(200 / scale as u64, 1 << 20, 0);
            let peak = peer.peak_rss_kib(path).unwrap_or(0);
            peer.finish();
            println!("- {}: {peak} KiB", path.name());
            peaks.push((path, peak));
        }
        let peak = |p: Path| peaks.iter().find(|(q, _)| *q == p).map(|(_, k)| *k as f64);
        if let (Some(shim), Some(node)) = (peak(Path::Shim), peak(Path::Node)) {
            println!("node/shim peak RSS = {:.1}x", node / shim.max(1.0));
        }
    }
    if !run("soak") {
        return;
    }
    let frames = if quick { 200_000 } else { 1_000_000 };
    println!("\n## Soak: {frames} frames of 200 B through coda-opencode (and the baseline), RSS every 10%\n");
    for path in paths.iter().copied().filter(|p| matches!(p, Path::Shim | Path::Baseline)) {
        let mut peer = spawn(path);
        peer.start_session();
        let mut samples = Vec::new();
        for _ in 0..10 {
            peer.turn(frames / 10, 200, 0);
            samples.push(rss(peer.child.id(), "VmRSS").unwrap_or(0));
        }
        let peak = peer.peak_rss_kib(path).unwrap_or(0);
        peer.finish();
        let growth = samples[9] as i64 - samples[0] as i64;
        println!("- {}: RSS KiB {samples:?}; peak {peak} KiB; growth first->last {growth} KiB", path.name());
    }
}

/// Where the CPU of one frame goes, against what the 80% goal leaves the shim on this machine.
fn budget(rows: &[(usize, (f64, u64, u64), u64)]) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("\n## CPU budget per frame for shim/direct >= 0.80 ({cores} cores)\n");
    println!(
        "At 80% of direct the agent, the client and the shim together may use at most cores x (direct wall time per \
         frame) / 0.8 of CPU per frame; what the load agent and client use leaves the rest to the shim. The last two \
         columns are the shim's envelope parse alone and a bare JSON check with nothing kept (sonic-rs into \
         IgnoredAny), each timed on one thread. All ns per frame.\n"
    );
    println!(
        "| frame size | direct wall | agent CPU | client CPU | shim budget | shim CPU | envelope parse | bare JSON check |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for &(size, (wall, agent, client), shim) in rows {
        let line = update_frame(&"x".repeat(size.saturating_sub(190)), now_ns()) + "\n";
        let wire = bytes::Bytes::from(line);
        let parse = ns_per_call(|| {
            std::hint::black_box(coda_shim::frame::Frame::parse_wire(std::hint::black_box(wire.clone())).is_ok());
        });
        let body = &wire[..wire.len() - 1];
        let check = ns_per_call(|| {
            std::hint::black_box(sonic_rs::from_slice::<serde::de::IgnoredAny>(std::hint::black_box(body)).is_ok());
        });
        let room = cores as f64 * wall / 0.8 - agent as f64 - client as f64;
        println!("| {} | {wall:.0} | {agent} | {client} | {room:.0} | {shim} | {parse:.0} | {check:.0} |", human(size));
    }
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

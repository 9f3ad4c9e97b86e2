//! Instructions per frame, counted by callgrind: a count a loaded machine does not move, printed next to a
//! raw line copy measured in the same run.
//!
//! Each path in the middle (a raw line copy, `coda-opencode`, and the build named by env
//! `CODA_BENCH_BASELINE` when set; with env `CODA_BENCH_SHIMS=codex,grok,kimi` those binaries too, and the
//! baseline's `coda-<agent>` beside it where there is one) runs under `valgrind --tool=callgrind` between
//! this program (the client) and a load agent (this program again, env `CODA_BENCH_AGENT=1`, not counted)
//! that answers one prompt with N `session/update` frames of 200 B. The count of a flood of 20,000 frames is
//! taken from that of 60,000, and the difference divided by 40,000: start-up and shut-down cancel out, what
//! is left is the cost of one frame. Each path takes two floods: streamed chunks that repeat the line before
//! them up to their text (as agents stream them, which the shim's scanner makes use of), and frames whose
//! start differs (`_meta.t` counted up), which it cannot. Run with `cargo bench --bench instructions` (needs
//! valgrind; env `CODA_BENCH_FRAMES=<small>,<large>` changes the two floods, `CODA_BENCH_SIZE` the frame
//! size, `CODA_BENCH_KEEP=<dir>` keeps callgrind's files there for `callgrind_annotate`). The shims run with
//! `KIMI_CODE_HOME` pointing at an empty folder (coda-kimi finds no session files there and reports no
//! activity); coda-codex's version probe finds nothing in the load agent. Nothing here asserts a count.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

// ---------------------------------------------------------------- load agent

/// Answers `initialize`, `session/new`, and a `session/prompt` with `params._meta.load.count` updates of
/// `size` bytes, as fast as it can write them.
fn agent() {
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let mut input = std::io::stdin().lock();
    let mut line = String::new();
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
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":1,"agentCapabilities":{{"loadSession":true}},"agentInfo":{{"name":"load","version":"1"}}}}}}"#
                );
            }
            "session/new" => {
                let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{{"sessionId":"load"}}}}"#);
            }
            "session/prompt" => {
                let load = msg.pointer("/params/_meta/load").cloned().unwrap_or_default();
                let count = load.get("count").and_then(|v| v.as_u64()).unwrap_or(0);
                let size = load.get("size").and_then(|v| v.as_u64()).unwrap_or(200) as usize;
                let vary = load.get("vary").and_then(|v| v.as_bool()).unwrap_or(false);
                let mut frame = update_frame(size).into_bytes();
                // `_meta.t`, early in the frame, as 19 digits: counted up per frame when `vary`.
                let t = memchr::memmem::find(&frame, STAMP.as_bytes()).expect("the stamp");
                for n in 0..count {
                    if vary {
                        frame[t..t + STAMP.len()].copy_from_slice(format!("{:019}", STAMP_START + n).as_bytes());
                    }
                    let _ = out.write_all(&frame);
                }
                let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{{"stopReason":"end_turn"}}}}"#);
            }
            _ => {}
        }
        let _ = out.flush();
    }
}

const STAMP: &str = "1764633600000000000";
const STAMP_START: u64 = 1_764_633_600_000_000_000;

/// One `session/update` of exactly `size` bytes with its `\n` (at least 150), shaped as `benches/relay.rs`'s.
fn update_frame(size: usize) -> String {
    let frame = |text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"_meta":{{"t":{STAMP}}},"sessionId":"load","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
        ) + "\n"
    };
    let bare = frame("").len();
    frame(&"x".repeat(size.saturating_sub(bare)))
}

// ---------------------------------------------------------------- raw line copy

/// The floor: a middle process that starts the agent and copies lines both ways, with std's buffered
/// reader and writer (one `read_until` and one `write_all` per line, a flush when nothing more is buffered).
fn copy() {
    let me = std::env::current_exe().expect("current exe");
    let mut child = Command::new(me)
        .env_remove("CODA_BENCH_COPY")
        .env("CODA_BENCH_AGENT", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the load agent");
    let to_agent = child.stdin.take().expect("stdin");
    let from_agent = child.stdout.take().expect("stdout");
    let up = std::thread::spawn(move || pump(std::io::stdin().lock(), to_agent));
    pump(from_agent, std::io::stdout().lock());
    let _ = up.join();
    let _ = child.wait();
}

fn pump(from: impl Read, to: impl Write) {
    let mut from = BufReader::with_capacity(64 << 10, from);
    let mut to = BufWriter::with_capacity(64 << 10, to);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if to.write_all(&line).is_err() {
            return;
        }
        if from.buffer().is_empty() && to.flush().is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------- client and counting

#[derive(Clone)]
enum Middle {
    Copy,
    Shim(PathBuf),
}

/// Instructions the middle process ran for one session whose prompt is answered by `count` frames.
fn count(middle: &Middle, frames: u64, size: usize, vary: bool, out_dir: &Path, tag: &str) -> u64 {
    let me = std::env::current_exe().expect("current exe");
    let out_file = out_dir.join(format!("callgrind.{tag}.{frames}"));
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg("--trace-children=no")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("-q");
    match middle {
        Middle::Copy => {
            cmd.arg(&me).env("CODA_BENCH_COPY", "1");
        }
        Middle::Shim(bin) => {
            cmd.arg(bin).arg("--agent-command").arg(shell_words::quote(&me.display().to_string()).into_owned());
            cmd.env("CODA_BENCH_AGENT", "1");
            // coda-kimi looks for the session's files there (and finds none): nothing of the user's is read.
            cmd.env("KIMI_CODE_HOME", out_dir.join("kimi-home"));
        }
    }
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn valgrind");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::with_capacity(1 << 20, child.stdout.take().expect("stdout"));
    let mut line = Vec::new();
    let ask = |stdin: &mut std::process::ChildStdin, id: u64, method: &str, params: serde_json::Value| {
        let frame = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{frame}").expect("write");
        stdin.flush().expect("flush");
    };
    let mut answer = |line: &mut Vec<u8>, want: &[u8]| -> u64 {
        let mut seen = 0;
        loop {
            line.clear();
            if out.read_until(b'\n', line).unwrap_or(0) == 0 {
                panic!("the middle process ended before its answer ({tag})");
            }
            if memchr::memmem::find(line, want).is_some() {
                return seen;
            }
            seen += 1;
        }
    };
    ask(&mut stdin, 1, "initialize", serde_json::json!({"protocolVersion": 1, "clientCapabilities": {}}));
    answer(&mut line, br#""id":1"#);
    let sp = serde_json::json!({"mode": "append", "content": [{"type": "text", "text": "Benchmark session."}]});
    ask(&mut stdin, 2, "session/new", serde_json::json!({"cwd": "/", "mcpServers": [], "systemPrompt": sp}));
    answer(&mut line, br#""id":2"#);
    ask(
        &mut stdin,
        3,
        "session/prompt",
        serde_json::json!({"sessionId": "load", "prompt": [{"type": "text", "text": "go"}],
            "_meta": {"load": {"count": frames, "size": size, "vary": vary}}}),
    );
    let seen = answer(&mut line, br#""stopReason""#);
    assert_eq!(seen, frames, "every frame reached the client ({tag})");
    drop(stdin);
    let status = child.wait().expect("wait for valgrind");
    assert!(status.success(), "valgrind ran {tag} to its end: {status}");
    let text = std::fs::read_to_string(&out_file).expect("callgrind's output");
    if let Some(keep) = std::env::var_os("CODA_BENCH_KEEP") {
        let _ = std::fs::copy(&out_file, Path::new(&keep).join(format!("callgrind.{tag}.{frames}")));
    }
    let _ = std::fs::remove_file(&out_file);
    text.lines()
        .find_map(|l| l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .expect("callgrind's total")
}

fn main() {
    if std::env::var_os("CODA_BENCH_AGENT").is_some() {
        return agent();
    }
    if std::env::var_os("CODA_BENCH_COPY").is_some() {
        return copy();
    }
    if Command::new("valgrind").arg("--version").stdout(Stdio::null()).status().map_or(true, |s| !s.success()) {
        println!("valgrind not found: nothing counted");
        return;
    }
    let floods: Vec<u64> = std::env::var("CODA_BENCH_FRAMES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .filter(|v: &Vec<u64>| v.len() == 2 && v[0] < v[1])
        .unwrap_or(vec![20_000, 60_000]);
    let size: usize = std::env::var("CODA_BENCH_SIZE").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let base = std::env::var_os("CODA_BENCH_BASELINE").map(PathBuf::from);
    if let Some(base) = &base {
        println!("baseline: {} (CODA_BENCH_BASELINE)", base.display());
    }
    let shims = std::env::var("CODA_BENCH_SHIMS").unwrap_or_default();
    let mut middles = vec![("raw line copy".to_owned(), Middle::Copy)];
    for agent in std::iter::once("opencode").chain(shims.split(',').map(str::trim).filter(|a| *a != "opencode")) {
        let bin = match agent {
            "opencode" => env!("CARGO_BIN_EXE_coda-opencode"),
            "codex" => env!("CARGO_BIN_EXE_coda-codex"),
            "grok" => env!("CARGO_BIN_EXE_coda-grok"),
            "kimi" => env!("CARGO_BIN_EXE_coda-kimi"),
            "" => continue,
            other => {
                println!("CODA_BENCH_SHIMS: no binary coda-{other}; left out");
                continue;
            }
        };
        middles.push((format!("coda-{agent}"), Middle::Shim(PathBuf::from(bin))));
        // The baseline names its coda-opencode; the other shims of that build are beside it.
        let old = base
            .as_ref()
            .map(|b| if agent == "opencode" { b.clone() } else { b.with_file_name(format!("coda-{agent}")) });
        if let Some(old) = old.filter(|o| o.is_file()) {
            middles.push((format!("baseline coda-{agent}"), Middle::Shim(old)));
        }
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    println!(
        "\n## Instructions per {size} B frame (callgrind; ({} - {} frames) / {})\n",
        floods[1],
        floods[0],
        floods[1] - floods[0]
    );
    println!(
        "Two floods each: streamed chunks, each the line before it up to its text (as an agent streams them), \
         and frames whose start differs (`_meta.t` counted up per frame).\n"
    );
    println!("| path | chunks: instructions per frame | / raw line copy | starts differ | / raw line copy |");
    println!("| --- | --- | --- | --- | --- |");
    let mut copy: Option<[f64; 2]> = None;
    for (i, (name, middle)) in middles.iter().enumerate() {
        let per = [false, true].map(|vary| {
            let tag = format!("m{i}{}", if vary { "v" } else { "" });
            let small = count(middle, floods[0], size, vary, dir.path(), &tag);
            let large = count(middle, floods[1], size, vary, dir.path(), &tag);
            large.saturating_sub(small) as f64 / (floods[1] - floods[0]) as f64
        });
        let base = *copy.get_or_insert(per);
        println!("| {name} | {:.0} | {:.2} | {:.0} | {:.2} |", per[0], per[0] / base[0], per[1], per[1] / base[1]);
    }
}

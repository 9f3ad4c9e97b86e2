//! Instructions per frame, counted by callgrind: a count a loaded machine does not move, printed next to a
//! raw line copy measured in the same run.
//!
//! Each path in the middle (a raw line copy, each shim binary, and the build named by env
//! `CODA_BENCH_BASELINE` when set: its `coda-<agent>` beside each) runs under `valgrind --tool=callgrind`
//! between this program (the client) and a load agent (this program again, env `CODA_BENCH_AGENT=1`, not
//! counted) that answers one prompt with N frames. The count of a small flood is taken from that of a large
//! one and the difference divided by the difference in frames: start-up and shut-down cancel out, what is
//! left is the cost of one frame.
//!
//! Two tables. Synthetic floods of 200 B `session/update` frames, each chunk with a text of its own (its last
//! bytes, up to 8, differ from frame to frame), three shapes: streamed chunks, each the one before it up to
//! its text (as agents stream them), chunks whose `_meta` (with a number counted up per frame) follows
//! `update` (as Grok stamps its chunks), and frames whose start differs (the same `_meta` first). Real
//! streams: for each binary, the agent-to-client notifications of its recorded fixtures (`fixtures/<agent>/*/trace.jsonl`: chunks, thoughts, tool calls and their updates, usage
//! and session info updates (Codex's AIR among them), Grok's `_x.ai/*` notifications), cycled, with the
//! values a real CLI changes per frame changed per frame (Grok's `eventId`, `agentTimestampMs`,
//! `chunkId`, a new `streamStartMs` every 40 frames and `turnStartMs` every 200, usage figures), the ids of
//! the run's own things new in each cycle (tool calls, subagents and their sessions, tasks, prompts,
//! messages: wherever they appear), the root session's id made the bench session's; the mix is printed.
//!
//! Run with `cargo bench --bench instructions` (needs valgrind). Env: `CODA_BENCH_FRAMES=<small>,<large>`
//! (default 10000,30000), `CODA_BENCH_SHIMS=codex,grok,kimi,opencode` (default all four),
//! `CODA_BENCH_FLOODS=chunks,meta,starts,real` (default all), `CODA_BENCH_KINDS=<kind>,...` (the recorded
//! streams' frames of those kinds alone, as the mix names them), `CODA_BENCH_KEEP=<dir>` keeps callgrind's
//! files there for `callgrind_annotate`. The shims run with `KIMI_CODE_HOME` pointing at an empty folder
//! (coda-kimi finds no session files there and reports no activity); coda-codex's version probe finds nothing
//! in the load agent. Nothing here asserts a count.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const AGENTS: [&str; 4] = ["codex", "grok", "kimi", "opencode"];

// ---------------------------------------------------------------- load agent

/// Answers `initialize`, `session/new`, and a `session/prompt` with `params._meta.load.count` frames of the
/// flood `params._meta.load.flood`, as fast as it can write them.
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
                let flood = load.get("flood").and_then(|v| v.as_str()).unwrap_or("chunks");
                match flood.strip_prefix("real:") {
                    Some(agent) => {
                        let stream = real_stream(agent);
                        let mut frame = String::new();
                        for n in 0..count {
                            let template = &stream[n as usize % stream.len()];
                            vary(template, n, n / stream.len() as u64, &mut frame);
                            let _ = out.write_all(frame.as_bytes());
                        }
                    }
                    None => {
                        let mut frame = synthetic_frame(flood, size).into_bytes();
                        // The stamp, as 19 digits: counted up per frame unless the flood is of plain chunks.
                        let t = memchr::memmem::find(&frame, STAMP.as_bytes()).filter(|_| flood != "chunks");
                        // The text's last bytes (up to 8): each frame's own, as a streamed reply's words are.
                        let text = memchr::memmem::rfind(&frame, b"\"text\":\"").map(|at| at + 8).and_then(|start| {
                            let end = start + memchr::memchr(b'"', &frame[start..])?;
                            Some(end - (end - start).min(8)..end)
                        });
                        for n in 0..count {
                            if let Some(t) = t {
                                frame[t..t + STAMP.len()]
                                    .copy_from_slice(format!("{:019}", STAMP_START + n).as_bytes());
                            }
                            if let Some(text) = text.clone() {
                                let words = format!("{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                                frame[text.clone()].copy_from_slice(&words.as_bytes()[16 - text.len()..]);
                            }
                            let _ = out.write_all(&frame);
                        }
                    }
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

/// One `session/update` of exactly `size` bytes with its `\n` (at least 190), of the flood's shape.
fn synthetic_frame(flood: &str, size: usize) -> String {
    let frame = |text: &str| {
        match flood {
            // The issue's shape and Grok's: `_meta` after `update`.
            "meta" => format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"load","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}},"_meta":{{"t":{STAMP}}}}}}}"#
            ),
            // `starts`: the start differs from frame to frame; `chunks`: the same frame (its stamp not counted).
            _ => format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"_meta":{{"t":{STAMP}}},"sessionId":"load","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
            ),
        }
    } + "\n";
    let bare = frame("").len();
    frame(&"x".repeat(size.saturating_sub(bare)))
}

// ---------------------------------------------------------------- real streams

/// One notification of a recorded stream: its text (the bench session's id in place of the recording's root
/// session) and what it is, for the mix.
struct Recorded {
    text: String,
    kind: String,
    /// Where the ids of the recorded run's own things (tool calls, subagents, tasks, prompts, messages,
    /// child sessions) are in `text`: each cycle through the stream has its own.
    ids: Vec<(usize, usize)>,
}

/// The keys whose values name a thing of the run's own: a new cycle gives each a new id, wherever it appears
/// (in a key's value, or inside another id or a text, as `task-completed-<task id>` does).
static IDS: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(
        r#""(toolCallId|tool_call_id|subagent_id|subagentId|child_session_id|childSessionId|parent_session_id|task_id|taskId|promptId|prompt_id|runningPromptId|messageId|sessionId)":"([^"\\]{6,})""#,
    )
    .expect("a regex")
});

/// The `session/update` kinds, and the other methods, a real stream of frames to the client is made of.
fn streamed(method: &str, update: Option<&str>) -> bool {
    match method {
        "session/update" => matches!(
            update,
            Some(
                "agent_message_chunk"
                    | "agent_thought_chunk"
                    | "tool_call"
                    | "tool_call_update"
                    | "usage_update"
                    | "session_info_update"
                    | "plan"
            )
        ),
        m => m.starts_with("_x.ai/"),
    }
}

/// The agent-to-client notifications of the recorded fixtures of `agent`, in the order recorded.
fn real_stream(agent: &str) -> Vec<Recorded> {
    #[derive(serde::Deserialize)]
    struct Record<'a> {
        dir: &'a str,
        #[serde(borrow)]
        frame: Option<&'a serde_json::value::RawValue>,
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(agent);
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| Some(e.ok()?.path().join("trace.jsonl")))
        .filter(|p| p.is_file())
        .collect();
    fixtures.sort();
    let placeholder = regex::Regex::new(r"\{\{[A-Z0-9_]+\}\}").expect("a regex");
    let mut stream = Vec::new();
    for fixture in fixtures {
        let text = std::fs::read_to_string(&fixture).expect("a fixture");
        // The root session: the first one a `session/new` (or load) answer names.
        let mut root: Option<String> = None;
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<Record>(line) else { continue };
            let Some(raw) = record.frame.filter(|_| record.dir == "agent->shim") else { continue };
            let frame: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or_default();
            if root.is_none()
                && let Some(id) = frame.pointer("/result/sessionId").and_then(|v| v.as_str())
            {
                root = Some(id.to_owned());
            }
            let Some(method) = frame.get("method").and_then(|m| m.as_str()) else { continue };
            let update = frame.pointer("/params/update/sessionUpdate").and_then(|v| v.as_str());
            if frame.get("id").is_some() || !streamed(method, update) {
                continue;
            }
            let mut text = placeholder.replace_all(raw.get(), "/bench").into_owned();
            if let Some(root) = &root {
                text = text.replace(&format!("\"{root}\""), "\"load\"");
            }
            let kind = match update {
                Some(u) if method == "session/update" => u.to_owned(),
                Some(u) => format!("{method} {u}"),
                None => method.to_owned(),
            };
            stream.push(Recorded { text, kind, ids: Vec::new() });
        }
    }
    // (`CODA_BENCH_KINDS`: the frames of those kinds alone, for the cost of one kind.)
    if let Ok(kinds) = std::env::var("CODA_BENCH_KINDS") {
        stream.retain(|r| kinds.split(',').any(|k| k.trim() == r.kind));
    }
    assert!(!stream.is_empty(), "no recorded stream for {agent}");
    // Every id the stream names (but the bench session's), the longest first where one holds another.
    let mut ids: Vec<String> = stream
        .iter()
        .flat_map(|r| IDS.captures_iter(&r.text).map(|c| c[2].to_owned()).collect::<Vec<_>>())
        .filter(|id| id != "load")
        .collect();
    ids.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    ids.dedup();
    if !ids.is_empty() {
        let any = ids.iter().map(|id| regex::escape(id)).collect::<Vec<_>>().join("|");
        let any = regex::Regex::new(&any).expect("a regex");
        for r in &mut stream {
            r.ids = any.find_iter(&r.text).map(|m| (m.start(), m.end())).collect();
        }
    }
    stream
}

/// The values a real CLI changes from frame to frame.
static VARIED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(
        r#""(agentTimestampMs|streamStartMs|turnStartMs|chunkId|totalTokens|used)":(\d+)|"(eventId)":"([^"\\]*)""#,
    )
    .expect("a regex")
});

/// `recorded` as frame `n` (of cycle `cycle` through the stream), with its `\n`.
fn vary(recorded: &Recorded, n: u64, cycle: u64, out: &mut String) {
    const T0: u64 = 1_796_186_871_643;
    // This cycle's ids.
    let mut with_ids = String::with_capacity(recorded.text.len() + 8 * recorded.ids.len());
    let mut last = 0;
    for &(_, end) in &recorded.ids {
        with_ids.push_str(&recorded.text[last..end]);
        with_ids.push_str(&format!("-c{cycle}"));
        last = end;
    }
    with_ids.push_str(&recorded.text[last..]);
    let template = with_ids.as_str();
    out.clear();
    let mut last = 0;
    for c in VARIED.captures_iter(template) {
        let whole = c.get(0).expect("a match");
        out.push_str(&template[last..whole.start()]);
        last = whole.end();
        let value = match (c.get(1).map(|k| k.as_str()), c.get(2)) {
            (Some("agentTimestampMs"), _) => (T0 + 7 * n).to_string(),
            (Some("streamStartMs"), _) => (T0 + 7 * (n / 40 * 40)).to_string(),
            (Some("turnStartMs"), _) => (T0 + 7 * (n / 200 * 200)).to_string(),
            (Some("chunkId"), _) => (n % 40 + 1).to_string(),
            (Some(_), Some(v)) => (v.as_str().parse::<u64>().unwrap_or(0) + n % 1000).to_string(),
            _ => {
                // `eventId`, `<session>-<n>`: counted per frame.
                let (key, value) = (&c[3], &c[4]);
                let value = format!("{}-{n}", value.rsplit_once('-').map_or(value, |(head, _)| head));
                out.push_str(&format!(r#""{key}":"{value}""#));
                continue;
            }
        };
        out.push_str(&format!(r#""{}":{value}"#, &c[1]));
    }
    out.push_str(&template[last..]);
    out.push('\n');
}

/// What a stream is made of: each kind's share of the frames, and the mean size of a frame.
fn mix(stream: &[Recorded]) -> (String, f64) {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for r in stream {
        *kinds.entry(r.kind.as_str()).or_default() += 1;
    }
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let named: Vec<String> =
        kinds.iter().map(|(k, n)| format!("{k} {:.0}%", 100.0 * *n as f64 / stream.len() as f64)).collect();
    let mut frame = String::new();
    let bytes: usize = stream
        .iter()
        .enumerate()
        .map(|(n, r)| {
            vary(r, n as u64, 0, &mut frame);
            frame.len()
        })
        .sum();
    (named.join(", "), bytes as f64 / stream.len() as f64)
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

/// The id of the prompt whose answer ends a flood: one no recorded frame carries.
const PROMPT: u64 = 7_000_001;

#[derive(Clone)]
enum Middle {
    Copy,
    Shim(PathBuf),
}

/// Instructions the middle process ran for one session whose prompt is answered by `frames` frames of
/// `flood`, and the frames that reached the client before the prompt's answer.
fn count(middle: &Middle, frames: u64, flood: &str, out_dir: &Path, tag: &str) -> (u64, u64) {
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
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn valgrind");
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
    // As Coda does, the client declares Coda's waits.
    let caps = serde_json::json!({"_meta": {"coda": {"waits": {}}}});
    ask(&mut stdin, 1, "initialize", serde_json::json!({"protocolVersion": 1, "clientCapabilities": caps}));
    answer(&mut line, br#""id":1,"#);
    let sp = serde_json::json!({"mode": "append", "content": [{"type": "text", "text": "Benchmark session."}]});
    ask(&mut stdin, 2, "session/new", serde_json::json!({"cwd": "/", "mcpServers": [], "systemPrompt": sp}));
    answer(&mut line, br#""id":2,"#);
    ask(
        &mut stdin,
        PROMPT,
        "session/prompt",
        serde_json::json!({"sessionId": "load", "prompt": [{"type": "text", "text": "go"}],
            "_meta": {"load": {"count": frames, "size": 200, "flood": flood}}}),
    );
    // The prompt's answer, by its id: a recorded notification may name a stop reason too.
    let seen = answer(&mut line, format!(r#""id":{PROMPT},"#).as_bytes());
    // Whatever the middle still writes is read (a middle blocked on a full pipe would never end).
    drop(stdin);
    let _ = std::io::copy(&mut out, &mut std::io::sink());
    let status = child.wait().expect("wait for valgrind");
    assert!(status.success(), "valgrind ran {tag} to its end: {status}");
    let text = std::fs::read_to_string(&out_file).expect("callgrind's output");
    if let Some(keep) = std::env::var_os("CODA_BENCH_KEEP") {
        let _ = std::fs::copy(&out_file, Path::new(&keep).join(format!("callgrind.{tag}.{frames}")));
    }
    let _ = std::fs::remove_file(&out_file);
    let total = text
        .lines()
        .find_map(|l| l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .expect("callgrind's total");
    (total, seen)
}

/// Instructions per frame of `flood` through `middle`, and the frames the client got of the large flood.
fn per_frame(middle: &Middle, floods: [u64; 2], flood: &str, dir: &Path, tag: &str) -> (f64, u64) {
    let (small, _) = count(middle, floods[0], flood, dir, tag);
    let (large, seen) = count(middle, floods[1], flood, dir, tag);
    (large.saturating_sub(small) as f64 / (floods[1] - floods[0]) as f64, seen)
}

fn binary(agent: &str) -> PathBuf {
    PathBuf::from(match agent {
        "codex" => env!("CARGO_BIN_EXE_coda-codex"),
        "grok" => env!("CARGO_BIN_EXE_coda-grok"),
        "kimi" => env!("CARGO_BIN_EXE_coda-kimi"),
        _ => env!("CARGO_BIN_EXE_coda-opencode"),
    })
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
        .unwrap_or(vec![10_000, 30_000]);
    let floods = [floods[0], floods[1]];
    let list = |var: &str, all: &[&'static str]| -> Vec<&'static str> {
        match std::env::var(var) {
            Ok(v) => all.iter().copied().filter(|a| v.split(',').any(|w| w.trim() == *a)).collect(),
            Err(_) => all.to_vec(),
        }
    };
    let agents = list("CODA_BENCH_SHIMS", &AGENTS);
    let kinds = list("CODA_BENCH_FLOODS", &["chunks", "meta", "starts", "real"]);
    let base = std::env::var_os("CODA_BENCH_BASELINE").map(PathBuf::from);
    if let Some(base) = &base {
        println!("baseline: {} (CODA_BENCH_BASELINE; its coda-<agent> beside it)", base.display());
    }
    let mut shims: Vec<(String, &str, Middle)> = Vec::new();
    for agent in &agents {
        shims.push((format!("coda-{agent}"), agent, Middle::Shim(binary(agent))));
        let old = base.as_ref().map(|b| b.with_file_name(format!("coda-{agent}"))).filter(|o| o.is_file());
        if let Some(old) = old {
            shims.push((format!("baseline coda-{agent}"), agent, Middle::Shim(old)));
        }
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let span = format!("({} - {} frames) / {}", floods[1], floods[0], floods[1] - floods[0]);

    let synthetic: Vec<&str> = kinds.iter().copied().filter(|k| *k != "real").collect();
    if !synthetic.is_empty() {
        println!("\n## Instructions per 200 B frame, synthetic floods (callgrind; {span})\n");
        println!(
            "Shapes (each chunk's text its own): `chunks`, streamed chunks the same up to their text; `meta`, \
             chunks whose `_meta` (a number counted up per frame) follows `update`, as Grok stamps its chunks; \
             `starts`, frames whose start differs (the same `_meta` first).\n"
        );
        let head: Vec<String> = synthetic.iter().map(|k| format!("{k} | / raw copy")).collect();
        println!("| path | {} |", head.join(" | "));
        println!("| --- |{}", " --- | --- |".repeat(synthetic.len()));
        let mut copy = Vec::new();
        let middles = std::iter::once(("raw line copy".to_owned(), Middle::Copy))
            .chain(shims.iter().map(|(name, _, m)| (name.clone(), m.clone())));
        for (i, (name, middle)) in middles.enumerate() {
            let per: Vec<f64> = synthetic
                .iter()
                .map(|flood| {
                    let (per, seen) = per_frame(&middle, floods, flood, dir.path(), &format!("s{i}{flood}"));
                    assert_eq!(seen, floods[1], "every frame reached the client ({name}, {flood})");
                    per
                })
                .collect();
            if copy.is_empty() {
                copy = per.clone();
            }
            let cells: Vec<String> = per.iter().zip(&copy).map(|(p, c)| format!("{p:.0} | {:.2}", p / c)).collect();
            println!("| {name} | {} |", cells.join(" | "));
        }
    }

    if kinds.contains(&"real") {
        println!("\n## Instructions per frame, each binary's recorded stream (callgrind; {span})\n");
        let mut mixes = Vec::new();
        println!(
            "| stream | bytes per frame | raw line copy | binary | / raw copy | binary per 200 B | frames out / in |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for agent in &agents {
            let stream = real_stream(agent);
            let (named, bytes) = mix(&stream);
            mixes.push(format!("- {agent} ({} frames recorded): {named}", stream.len()));
            let flood = format!("real:{agent}");
            let (copy, _) = per_frame(&Middle::Copy, floods, &flood, dir.path(), &format!("c{agent}"));
            for (name, _, middle) in shims.iter().filter(|s| s.1 == *agent) {
                let (per, seen) = per_frame(middle, floods, &flood, dir.path(), &format!("r{name}"));
                println!(
                    "| {name} | {bytes:.0} | {copy:.0} | {per:.0} | {:.2} | {:.0} | {seen} / {} |",
                    per / copy,
                    per * 200.0 / bytes,
                    floods[1]
                );
            }
        }
        println!("\nThe mixes:\n\n{}", mixes.join("\n"));
    }
}

//! A day-long trace made from the fixtures: every fixture of the four shims over and over with new session ids
//! and later times, and every few of them a streamed turn of many chunks (what a real session is mostly made
//! of). Shared by `tests/view_browser.rs` and `benches/view.rs` (included by path).
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Chunks in one streamed answer.
pub const STREAM_CHUNKS: usize = 1000;

fn fixture_traces() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut out = Vec::new();
    for agent in ["codex", "grok", "kimi", "opencode"] {
        let mut dirs: Vec<PathBuf> =
            std::fs::read_dir(root.join(agent)).unwrap().map(|e| e.unwrap().path().join("trace.jsonl")).collect();
        dirs.retain(|p| p.is_file());
        dirs.sort();
        out.extend(dirs);
    }
    out
}

fn session_ids(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k.ends_with("essionId")
                    && let Some(s) = x.as_str()
                    && !s.is_empty()
                    && !out.iter().any(|o| o == s)
                {
                    out.push(s.to_owned());
                }
                session_ids(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| session_ids(x, out)),
        _ => {}
    }
}

/// One fixture's records: `(t, dir, shim, body key, body)` with its sessions' ids.
struct Fixture {
    records: Vec<(f64, Value)>,
    ids: Vec<String>,
    len: f64,
}

fn load(path: &Path) -> Fixture {
    let mut records = Vec::new();
    let mut ids = Vec::new();
    for line in std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.trim().is_empty()) {
        let rec: Value = serde_json::from_str(line).unwrap();
        let t = rec["t"].as_f64().unwrap_or(0.0);
        if let Some(f) = rec.get("frame") {
            session_ids(f, &mut ids);
        }
        records.push((t, rec));
    }
    ids.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let len = records.iter().map(|r| r.0).fold(0.0, f64::max);
    Fixture { records, ids, len }
}

/// The records of one streamed turn in session `sid` starting at `t0`, through a shim (both sides).
fn streamed(sid: &str, id: u64, t0: f64, chunks: usize) -> Vec<(f64, Value)> {
    let prompt = json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":sid,
        "prompt":[{"type":"text","text":"Summarise the build log.\n\nKeep it short."}]}});
    let mut out = vec![
        (t0, json!({"t": t0, "dir": "client->shim", "frame": prompt})),
        (t0, json!({"t": t0, "dir": "shim->agent", "frame": prompt})),
    ];
    for k in 0..chunks {
        let t = t0 + 5.0 * (k + 1) as f64;
        let text = format!("word{k} ");
        let chunk = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":sid,"update":{
            "sessionUpdate":"agent_message_chunk","content":{"type":"text","text":text}}}});
        out.push((t, json!({"t": t, "dir": "agent->shim", "frame": chunk})));
        out.push((t, json!({"t": t, "dir": "shim->client", "frame": chunk})));
    }
    let t = t0 + 5.0 * (chunks + 1) as f64;
    let answer = json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}});
    out.push((t, json!({"t": t, "dir": "agent->shim", "frame": answer})));
    out.push((t, json!({"t": t, "dir": "shim->client", "frame": answer})));
    out
}

/// The text a streamed turn of `chunks` chunks joins to.
pub fn streamed_text(chunks: usize) -> String {
    (0..chunks).map(|k| format!("word{k} ")).collect()
}

/// What [`write`] made.
#[derive(Debug, Clone, Copy)]
pub struct Made {
    pub records: usize,
    pub bytes: u64,
    pub streamed_turns: usize,
}

/// Writes a trace of at least `records` records to `path`.
pub fn write(path: &Path, records: usize) -> Made {
    let fixtures: Vec<Fixture> = fixture_traces().iter().map(|p| load(p)).collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let (mut n, mut bytes, mut streams, mut round, mut t0) = (0usize, 0u64, 0usize, 0usize, 0.0f64);
    'all: loop {
        for (k, f) in fixtures.iter().enumerate() {
            let tag = format!("~r{round}");
            for (t, rec) in &f.records {
                let mut line = rec.to_string();
                for id in &f.ids {
                    line = line.replace(&format!("\"{id}\""), &format!("\"{id}{tag}\""));
                }
                let mut v: Value = serde_json::from_str(&line).unwrap();
                v["t"] = json!(t0 + t);
                let line = v.to_string();
                bytes += line.len() as u64 + 1;
                writeln!(out, "{line}").unwrap();
                n += 1;
            }
            t0 += f.len + 50.0;
            if k % 16 == 15 {
                let sid = format!("ses_stream{round}_{k}");
                for (t, rec) in streamed(&sid, 9_000_000 + n as u64, t0, STREAM_CHUNKS) {
                    let line = rec.to_string();
                    bytes += line.len() as u64 + 1;
                    writeln!(out, "{line}").unwrap();
                    n += 1;
                    t0 = t0.max(t);
                }
                t0 += 50.0;
                streams += 1;
            }
            if n >= records {
                break 'all;
            }
        }
        round += 1;
    }
    out.flush().unwrap();
    Made { records: n, bytes, streamed_turns: streams }
}

/// In-page: scrolls down, zooms in (ctrl + wheel) and scrolls right, a step per animation frame; returns each
/// step's frame time (between animation frames) and draw time, in ms.
pub const SCROLL_AND_ZOOM: &str = r#"(async () => {
  const v = window.acpView, sc = document.getElementById('scroll');
  const raf = () => new Promise(r => requestAnimationFrame(r));
  const out = { scroll: [], zoom: [], pan: [] };
  // From the input to the end of the animation frame that drew it (at most 10 frames), and the draw's own time.
  const step = async (list, act) => {
    await raf();
    const draws = v.draws;
    const before = performance.now();
    act();
    for (let k = 0; k < 10; k++) { await raf(); if (v.draws > draws) break; }
    list.push([performance.now() - before, v.draws > draws ? v.lastDraw : NaN]);
  };
  for (let k = 0; k < 40; k++) await step(out.scroll, () => { sc.scrollTop += 350; });
  sc.scrollTop = 0;
  const r = sc.getBoundingClientRect();
  for (let k = 0; k < 25; k++)
    await step(out.zoom, () => sc.dispatchEvent(new WheelEvent('wheel',
      { ctrlKey: true, deltaY: -100, clientX: r.left + r.width / 3, clientY: r.top + 100, cancelable: true })));
  for (let k = 0; k < 40; k++) await step(out.pan, () => { sc.scrollLeft += 300; });
  return out;
})()"#;

pub fn percentiles(name: &str, steps: &Value) -> String {
    let mut frame: Vec<f64> = steps.as_array().unwrap().iter().map(|s| s[0].as_f64().unwrap()).collect();
    let mut draw: Vec<f64> = steps.as_array().unwrap().iter().map(|s| s[1].as_f64().unwrap()).collect();
    frame.sort_by(f64::total_cmp);
    draw.sort_by(f64::total_cmp);
    let at = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    format!(
        "{name}: {} steps, frame p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms; draw p50 {:.1} ms, max {:.1} ms",
        frame.len(),
        at(&frame, 0.5),
        at(&frame, 0.95),
        at(&frame, 1.0),
        at(&draw, 0.5),
        at(&draw, 1.0)
    )
}

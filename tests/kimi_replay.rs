//! Replays Kimi's session-file writes recorded from the real CLI (`fixtures/kimi/*/files.jsonl`, the file
//! log of fixtures/README.md "Kimi session files", one scan of the shim's watcher per `ts`) through the
//! same parsing and translation the shim runs, and compares the client frames with `expected.txt`
//! beside the recording (checked by hand against the live run's frames, see the issue note).
//!
//! `expected.txt`: one line per frame, `wait <sessionId> <waitId> <state> [kind=…] [childSessionId=…]`
//! or `update <sessionId> <sessionUpdate> <text or toolCallId>`; `S` is the main session.
//! Regenerate after a deliberate change: `KIMI_REPLAY_BLESS=1 cargo test --test kimi_replay`.

#[path = "../adapters/kimi/translate.rs"]
#[allow(dead_code)]
mod translate;
#[path = "../adapters/kimi/wire.rs"]
#[allow(dead_code)]
mod wire;

use std::path::Path;

use coda_shim::frame::Frame;
use serde_json::Value;

fn show(f: &Frame, session: &str) -> String {
    let v = f.value().unwrap_or(Value::Null);
    let p = &v["params"];
    let sid = |x: &str| if x == session { "S".to_owned() } else { x.to_owned() };
    let s = |k: &str| p[k].as_str().unwrap_or("").to_owned();
    match v["method"].as_str() {
        Some("_coda/wait") => {
            let mut line = format!("wait {} {} {}", sid(&s("sessionId")), s("waitId"), s("state"));
            for k in ["kind", "childSessionId"] {
                if let Some(x) = p[k].as_str() {
                    line += &format!(" {k}={x}");
                }
            }
            line
        }
        _ => {
            let u = &p["update"];
            let what = u["content"]["text"].as_str().or(u["toolCallId"].as_str()).unwrap_or("");
            let what: String = what.chars().take(60).collect::<String>().replace('\n', " ");
            format!("update {} {} {what}", sid(&s("sessionId")), u["sessionUpdate"].as_str().unwrap_or(""))
        }
    }
}

/// Replays one recording; returns the client frames in the `expected.txt` notation.
fn replay(files: &str) -> Vec<String> {
    let mut out_lines = Vec::new();
    let mut session: Option<(String, wire::Feed, translate::Translator)> = None;
    let mut scan: Vec<Value> = Vec::new();
    let mut records: Vec<Value> = files
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("file log line"))
        .collect();
    records.push(Value::Null); // flushes the last scan
    let mut last_ts = None;
    for rec in records {
        let ts = rec["ts"].as_str().map(str::to_owned);
        if ts != last_ts && !scan.is_empty() {
            let chunks = std::mem::take(&mut scan);
            let mut lists = Vec::new();
            let mut out = Vec::new();
            for c in &chunks {
                let path = c["path"].as_str().unwrap_or("");
                // `{{KIMI_CODE_HOME}}/sessions/<wd>/<session>/<file>`
                let mut parts = path.splitn(5, '/');
                let (_, _, _, sid, file) = (parts.next(), parts.next(), parts.next(), parts.next(), parts.next());
                let (Some(sid), Some(file)) = (sid, file) else { continue };
                if session.is_none() {
                    let t = translate::Translator::new(sid, "{{SESSION_DIR}}", true);
                    session = Some((sid.to_owned(), wire::Feed::new(0), t));
                }
                let Some((_, feed, t)) = session.as_mut() else { continue };
                let data = c["data"].as_str().unwrap_or("").as_bytes();
                let op = c["op"].as_str().unwrap_or("");
                match feed.chunk(file, op == "write", op == "replace", data) {
                    wire::Fed::Task { agent, info } => t.task_file(&agent, &info),
                    wire::Fed::Entries { agent, entries } if !entries.is_empty() => {
                        let at = if agent == translate::MAIN { 0 } else { lists.len() };
                        lists.insert(at, (agent, entries.into()));
                    }
                    _ => {}
                }
            }
            if let Some((sid, _, t)) = session.as_mut() {
                for (agent, entry) in wire::merge(lists) {
                    t.entry(&agent, entry, &mut out);
                }
                t.drained(&mut out);
                out_lines.extend(out.iter().map(|f| show(f, sid)));
            }
        }
        last_ts = ts;
        if !rec.is_null() {
            scan.push(rec);
        }
    }
    out_lines
}

#[test]
fn kimi_recordings_replay_to_the_expected_frames() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kimi");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .map(|rd| rd.flatten().map(|d| d.path()).filter(|p| p.join("files.jsonl").is_file()).collect())
        .unwrap_or_default();
    dirs.sort();
    assert!(!dirs.is_empty(), "no Kimi recordings under {}", root.display());
    let bless = std::env::var_os("KIMI_REPLAY_BLESS").is_some();
    let mut failed = Vec::new();
    for dir in &dirs {
        let files = std::fs::read_to_string(dir.join("files.jsonl")).unwrap();
        let got = replay(&files).join("\n") + "\n";
        let expected_path = dir.join("expected.txt");
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != expected {
            failed.push(format!("{}:\n--- expected\n{expected}--- got\n{got}", dir.display()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

//! Kimi's session-file writes recorded from the real CLI, replayed through parsing and translation alone.
//!
//! The recordings (`fixtures/kimi/*/files.jsonl`, the watcher's file log of fixtures/README.md "Kimi session files", one scan per `ts`) through the shim's parsing and translation
//! alone (no processes, no timing), compared with `expected.txt`, which is what Coda received in the live run
//! (checked here against the fixture's own `trace.jsonl`). The whole binary replays the same fixtures in
//! `tests/replay.rs` (`kimi_fixtures_replay`), asserting every frame exactly.
//!
//! `expected.txt`: see tests/support/kimi_expected.rs (`answer` lines are the prompt answers, and `session_info_update`
//! lines Kimi's title rewritten by the title layer, which this layer-level replay does not produce). Regenerate from the traces: `KIMI_REPLAY_BLESS=1 cargo test --test kimi_replay`.

mod support;

use coda_shim::adapters::kimi::feed;
use coda_shim::adapters::kimi::translate;
use support::kimi_expected as kimi_common;

use coda_shim::frame::Frame;
use serde_json::Value;

fn show(f: &Frame, session: &str) -> String {
    kimi_common::show(&f.value().unwrap_or(Value::Null), true, session).unwrap_or_default()
}

/// Replays one recording; returns the client frames in the `expected.txt` notation.
fn replay(files: &str) -> Vec<String> {
    let mut out_lines = Vec::new();
    let mut session: Option<(String, feed::Feed, translate::Translator)> = None;
    let mut scan: Vec<Value> = Vec::new();
    let mut records: Vec<Value> = files
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("file log line"))
        .collect();
    records.push(Value::Null); // flushes the last scan
    // The session's state when the shim found it is history: the shim reads on from its end.
    records.retain(|r| r["at"] != "open");
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
                    let t = translate::Translator::new(sid, "{{SESSION_DIR}}");
                    session = Some((sid.to_owned(), feed::Feed::new(0), t));
                }
                let Some((_, feed, t)) = session.as_mut() else { continue };
                let data = c["data"].as_str().unwrap_or("").as_bytes();
                let op = c["op"].as_str().unwrap_or("");
                // `write`: the file was replaced and `data` is its whole content.
                if op == "write" {
                    feed.reread(file);
                }
                let fed = feed.piece(file, op == "replace", data);
                if op == "write" {
                    feed.caught_up(file);
                }
                match fed {
                    feed::Fed::Task { agent, info } => t.task_file(&agent, &info),
                    feed::Fed::Entries { agent, entries } if !entries.is_empty() => {
                        let at = if agent == translate::MAIN { 0 } else { lists.len() };
                        lists.insert(at, (agent, entries.into()));
                    }
                    _ => {}
                }
            }
            if let Some((sid, _, t)) = session.as_mut() {
                for (agent, entry) in feed::merge(lists) {
                    t.entry(&agent, entry, &mut out);
                }
                t.drained(std::time::Instant::now(), &mut out);
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
    let dirs = kimi_common::recordings();
    let bless = std::env::var_os("KIMI_REPLAY_BLESS").is_some();
    let mut failed = Vec::new();
    for dir in &dirs {
        let trace = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap();
        let received = kimi_common::summary(&trace).join("\n") + "\n";
        let expected_path = dir.join("expected.txt");
        if bless {
            std::fs::write(&expected_path, &received).unwrap();
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if received != expected {
            failed.push(format!("{}: expected.txt is not what the trace received:\n{received}", dir.display()));
        }
        let files = std::fs::read_to_string(dir.join("files.jsonl")).unwrap();
        let got = replay(&files).join("\n") + "\n";
        let want = kimi_common::activity_expected(&expected);
        if got != want {
            failed.push(format!("{}:\n--- expected\n{want}--- got\n{got}", dir.display()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

//! Kimi's session-file writes recorded from the real CLI, replayed through parsing and translation alone.
//!
//! The recordings (`fixtures/kimi/*/files.jsonl`, the watcher's file log of fixtures/README.md "Kimi session files", one scan per `ts`) through the shim's parsing and translation
//! alone (no processes, no timing), compared with `expected.txt`, which is what Coda received in the live run
//! (checked here against the fixture's own `trace.jsonl`). The whole binary replays the same fixtures in
//! `tests/replay.rs` (`kimi_fixtures_replay_*`), asserting every frame exactly.
//!
//! `expected.txt`: see tests/support/kimi_expected.rs (`answer` lines are the prompt answers, and `session_info_update`
//! lines Kimi's title rewritten by the title layer, which this layer-level replay does not produce). Regenerate from the traces: `KIMI_REPLAY_BLESS=1 cargo test --test all kimi_replay::`.

use crate::support;

use coda_shim::adapters::kimi::feed;
use coda_shim::adapters::kimi::translate;
use support::kimi_expected as kimi_common;

use coda_shim::frame::Frame;
use serde_json::{Value, json};

fn show(f: &Frame, session: &str) -> String {
    kimi_common::show(f.value(), true, session).unwrap_or_default()
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
        let got: String = replay(&files).iter().map(|l| format!("{l}\n")).collect();
        let want = kimi_common::activity_expected(&expected);
        if got != want {
            failed.push(format!("{}:\n--- expected\n{want}--- got\n{got}", dir.display()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The recorded frames and file reads of a Kimi fixture through the usage layer alone: what the layers above
/// it sent to Kimi (`shim->agent`), what Kimi answered (`agent->shim`) and its wire as the watch read it
/// (`files.jsonl`, one scan per `ts`), in the order of their times. Returns the `usage_update`s it sent
/// towards Coda.
fn replay_usage(dir: &std::path::Path) -> Vec<Value> {
    use coda_shim::adapters::kimi::{facts, usage};
    use coda_shim::layer::testing::Harness;
    let read = |name: &str| -> Vec<Value> {
        std::fs::read_to_string(dir.join(name))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let mut inputs: Vec<(String, Value)> = read("trace.jsonl")
        .into_iter()
        .filter(|r| r["dir"] == "shim->agent" || r["dir"] == "agent->shim")
        .map(|r| (r["ts"].as_str().unwrap_or("").to_owned(), r))
        .collect();
    inputs.extend(
        read("files.jsonl")
            .into_iter()
            .filter(|r| r["at"] != "open")
            .map(|r| (r["ts"].as_str().unwrap_or("").to_owned(), json!({"dir": "file", "file": r}))),
    );
    // RFC 3339 UTC times of one width: their text sorts as their time; a stable sort keeps each log's order.
    inputs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Harness::of(usage::layer(None));
    let mut feed = feed::Feed::new(0);
    let mut out = Vec::new();
    let mut i = 0;
    while i < inputs.len() {
        let (ts, r) = &inputs[i];
        if r["dir"] != "file" {
            let frame = serde_json::to_string(&r["frame"]).unwrap();
            let frame = coda_shim::frame::Frame::parse(frame.into_bytes()).expect("a recorded frame");
            if r["dir"] == "shim->agent" {
                h.client_frame(frame)
            } else {
                h.agent_frame(frame)
            }
            i += 1;
        } else {
            // One scan: the file reads of one time.
            let mut fed = Vec::new();
            let mut session = String::new();
            while i < inputs.len() && inputs[i].1["dir"] == "file" && &inputs[i].0 == ts {
                let c = &inputs[i].1["file"];
                let path = c["path"].as_str().unwrap_or("");
                let mut parts = path.splitn(5, '/');
                let (_, _, _, sid, file) = (parts.next(), parts.next(), parts.next(), parts.next(), parts.next());
                if let (Some(sid), Some(file)) = (sid, file) {
                    session = sid.to_owned();
                    fed.push(feed.piece(file, c["op"] == "replace", c["data"].as_str().unwrap_or("").as_bytes()));
                }
                i += 1;
            }
            if let Some(facts) = facts::pick(&session, &fed) {
                h.event(0, facts);
            }
        }
        out.extend(h.to_client().into_iter().filter(|v| v["params"]["update"]["sessionUpdate"] == "usage_update"));
    }
    out
}

/// Usage facts and compactions recorded from the real Kimi: the usage layer, fed the recording, sends Coda
/// exactly the `usage_update`s (Kimi's stamped, and the shim's own) the live run sent, whatever the day.
#[test]
fn kimi_usage_facts_replay_from_the_recorded_wire() {
    let mut checked = 0;
    for dir in kimi_common::recordings() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("compact-") || name.starts_with("usage-")) {
            continue;
        }
        let trace = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap();
        let sent: Vec<Value> = trace
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["dir"] == "shim->client" && r["frame"]["params"]["update"]["sessionUpdate"] == "usage_update")
            .map(|r| r["frame"].clone())
            .collect();
        assert!(!sent.is_empty(), "{name}: no usage_update recorded");
        for u in &sent {
            let coda = &u["params"]["update"]["_meta"]["coda"];
            assert!(coda["lastRequestAt"].is_string() && coda["contextTokens"].is_u64(), "{name}: {u}");
        }
        assert_eq!(replay_usage(&dir), sent, "{name}");
        checked += 1;
    }
    assert!(checked >= 4, "the compaction and usage recordings are missing");
}

/// Kimi's result text and the shim's `/compact` frames never reach Coda; the answer carries Kimi's estimates.
#[test]
fn kimi_compaction_recordings_show_coda_no_turn_of_the_shims() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kimi/compact-between-turns");
    let records: Vec<Value> = std::fs::read_to_string(dir.join("trace.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let to_coda: Vec<&Value> = records.iter().filter(|r| r["dir"] == "shim->client").map(|r| &r["frame"]).collect();
    let from_kimi: Vec<&Value> = records.iter().filter(|r| r["dir"] == "agent->shim").map(|r| &r["frame"]).collect();
    let text = |v: &&Value| v["params"]["update"]["content"]["text"].as_str().unwrap_or("").to_owned();
    assert!(from_kimi.iter().any(|v| text(v).starts_with("Compaction completed.")), "Kimi sent its result text");
    assert!(!to_coda.iter().any(|v| text(v).contains("ompaction")), "none of it reached Coda");
    let answer = to_coda.iter().find(|v| v["result"]["compacted"].is_boolean()).expect("the compact answer");
    let result = answer["result"].as_object().unwrap();
    assert_eq!(result.keys().collect::<Vec<_>>(), ["after", "before", "compacted"]);
}

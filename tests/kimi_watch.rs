//! coda-kimi's watch on the event sources of both platforms: inotify's and FSEvents' schedules replayed.
//!
//! The session-file writes recorded from the real CLI (`fixtures/kimi/*/files.jsonl`) are made again on disk, one recorded scan at a time, and a scripted
//! event source tells the watch about them the way inotify does (an event per write, at once) or the way macOS's
//! FSEvents does (late, coalesced, sometimes only for the folder, a rename as one event or two, events lost,
//! reordered). The watch's scans go through the real activity layer; every schedule must give what Coda received
//! in the live run (`expected.txt`, as in `tests/kimi_replay.rs`).

use crate::support;

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use coda_shim::adapters::kimi::{activity, events, watch};
use coda_shim::frame::Frame;
use coda_shim::layer::{Exits, Stack};
use serde_json::{Value, json};
use support::kimi_expected as kimi_common;

use events::{EventSource, Wake};
use watch::{Scan, Watch};

/// One file-system event as a backend reports it; the watch must not depend on any of it.
#[derive(Debug, Clone)]
struct FsEvent {
    #[allow(dead_code)]
    path: PathBuf,
    #[allow(dead_code)]
    what: &'static str,
}

#[derive(Default)]
struct FakeState {
    /// Delivered and not yet taken by the watch.
    delivered: VecDeque<FsEvent>,
    watched: Vec<PathBuf>,
}

/// A scripted event source: the test decides what is delivered and when.
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<FakeState>>);

impl EventSource for Fake {
    fn watch(&mut self, folder: &Path) -> Result<(), String> {
        self.0.lock().unwrap().watched.push(folder.to_path_buf());
        Ok(())
    }

    /// Like a backend's channel drained at once: every event delivered so far wakes the watch once.
    fn wait(&mut self, _timeout: Duration) -> Wake {
        let mut state = self.0.lock().unwrap();
        if state.delivered.is_empty() {
            return Wake::Quiet;
        }
        state.delivered.clear();
        Wake::Changed
    }
}

/// How the events of one recorded scan's writes reach the watch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Schedule {
    /// inotify: every event at once, each one waking the watch.
    EachAtOnce,
    /// FSEvents: held back, delivered with the next writes' events (coalesced, late).
    Late,
    /// Delivered now, all of them (and any held back) waking the watch once, in reverse order.
    Coalesced,
    /// Lost: no event at all for these writes.
    Lost,
}

/// A small deterministic generator (xorshift), so a failing schedule can be run again by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The events FSEvents may give for one write: for the file, or only its folder; a rename as one or two.
fn events_for(rec: &Value, path: &Path, rng: &mut Rng) -> Vec<FsEvent> {
    let folder = path.parent().unwrap_or(path).to_path_buf();
    let one = |p: &Path, what| FsEvent { path: p.to_path_buf(), what };
    match (rec["op"].as_str().unwrap_or(""), rng.next() % 3) {
        ("append", 0) => vec![one(&folder, "folder changed")],
        ("append", _) => vec![one(path, "modified")],
        (_, 0) => vec![one(&path.with_extension("json.tmp.replay"), "renamed"), one(path, "renamed")],
        (_, 1) => vec![one(path, "created, renamed, modified")],
        _ => vec![one(&folder, "folder changed")],
    }
}

/// Makes one recorded write on disk: an append, or an atomic replace (a temporary file renamed over the target).
fn write(home: &Path, rec: &Value) -> PathBuf {
    let rel = rec["path"].as_str().expect("path").strip_prefix("{{KIMI_CODE_HOME}}/").expect("under KIMI_CODE_HOME");
    let path = home.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let data = match (rec["data"].as_str(), rec["base64"].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).unwrap(),
        _ => panic!("a record without data: {rec}"),
    };
    match rec["op"].as_str() {
        Some("append") => {
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
            f.write_all(&data).unwrap();
        }
        Some("replace") => {
            let tmp = path.with_extension("json.tmp.replay");
            std::fs::write(&tmp, &data).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        }
        other => panic!("op {other:?} is not in the Kimi recordings"),
    }
    path
}

fn frame(v: Value) -> Frame {
    Frame::from_value(&v)
}

/// Replays one recording with the scripted source; returns what the client got, in `expected.txt` notation.
fn run(files: &str, seed: u64, inotify: bool) -> Vec<String> {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("kimi-home");
    let records: Vec<Value> =
        files.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
    let sid = records[0]["path"].as_str().unwrap().split('/').nth(3).unwrap().to_owned();
    // The session's files as the shim found them.
    for r in records.iter().filter(|r| r["at"] == "open") {
        write(&home, r);
    }
    let slot: Arc<Mutex<Option<Watch>>> = Arc::default();
    let opened = slot.clone();
    let root = home.clone();
    let starter: activity::Starter = Arc::new(move |session, cutoff| {
        let dir = watch::locate(Some(root.as_path()), session)?;
        let (w, started) = Watch::open(session, &dir, cutoff, false).map_err(watch::WatchError::Failed)?;
        *opened.lock().unwrap() = Some(w);
        Ok((started, None))
    });
    let mut stack = Stack::new(vec![Box::new(activity::Activity::with_starter(starter))]);
    let mut exits = Exits::default();
    let caps = json!({"_meta": {"coda": {"waits": {}}}});
    stack.from_client(
        frame(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":caps}})),
        &mut exits,
    );
    stack.from_agent(frame(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}})), &mut exits);
    stack.from_client(
        frame(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}})),
        &mut exits,
    );
    stack.from_agent(frame(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":sid}})), &mut exits);
    let mut watch = slot.lock().unwrap().take().expect("the layer opened the session");
    let mut source = Fake::default();

    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut held: Vec<FsEvent> = Vec::new();
    let step = |stack: &mut Stack, source: &mut Fake, watch: &mut Watch, exits: &mut Exits| {
        let mut scans = Vec::new();
        assert!(watch.step(source, Duration::ZERO, &mut |s: Scan| {
            scans.push(s);
            true
        }));
        for s in scans {
            stack.event(0, Box::new(s), exits);
        }
    };
    // First look of the watch thread: watches the folders.
    step(&mut stack, &mut source, &mut watch, &mut exits);
    let mut groups: Vec<Vec<&Value>> = Vec::new();
    let mut last_ts = None;
    for r in records.iter().filter(|r| r["at"] != "open") {
        if last_ts != Some(&r["ts"]) {
            groups.push(Vec::new());
        }
        last_ts = Some(&r["ts"]);
        groups.last_mut().unwrap().push(r);
    }
    for group in groups {
        let mut events = Vec::new();
        for r in group {
            let path = write(&home, r);
            events.extend(events_for(r, &path, &mut rng));
        }
        let schedule = if inotify {
            Schedule::EachAtOnce
        } else {
            [Schedule::EachAtOnce, Schedule::Late, Schedule::Coalesced, Schedule::Lost][(rng.next() % 4) as usize]
        };
        match schedule {
            Schedule::EachAtOnce => {
                for e in held.drain(..).chain(events) {
                    source.0.lock().unwrap().delivered.push_back(e);
                    step(&mut stack, &mut source, &mut watch, &mut exits);
                }
            }
            Schedule::Late => held.extend(events),
            Schedule::Coalesced => {
                held.extend(events);
                source.0.lock().unwrap().delivered.extend(held.drain(..).rev());
                step(&mut stack, &mut source, &mut watch, &mut exits);
            }
            Schedule::Lost => {}
        }
    }
    // Whatever is still held arrives; then the periodic look, with no event.
    source.0.lock().unwrap().delivered.extend(held.drain(..));
    step(&mut stack, &mut source, &mut watch, &mut exits);
    step(&mut stack, &mut source, &mut watch, &mut exits);

    let session_dir = home.join("sessions");
    for w in &source.0.lock().unwrap().watched {
        assert!(w.starts_with(&session_dir), "watched outside the session: {}", w.display());
    }
    exits.to_client.iter().filter_map(|f| kimi_common::show(f.value(), true, &sid)).collect()
}

fn fixtures() -> Vec<(PathBuf, String, String)> {
    kimi_common::recordings()
        .into_iter()
        .map(|d| {
            let files = std::fs::read_to_string(d.join("files.jsonl")).unwrap();
            let expected = std::fs::read_to_string(d.join("expected.txt")).unwrap();
            (d, files, kimi_common::activity_expected(&expected))
        })
        .collect()
}

#[test]
fn inotify_schedule_gives_the_recorded_reports() {
    let mut failed = Vec::new();
    for (dir, files, want) in fixtures() {
        let got: String = run(&files, 1, true).iter().map(|l| format!("{l}\n")).collect();
        if got != want {
            failed.push(format!("{}:\n--- expected\n{want}--- got\n{got}", dir.display()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn fsevents_schedules_give_the_same_reports() {
    let mut failed = Vec::new();
    for (dir, files, want) in fixtures() {
        for seed in 1..=24 {
            let got: String = run(&files, seed, false).iter().map(|l| format!("{l}\n")).collect();
            if got != want {
                failed.push(format!("{} (seed {seed}):\n--- expected\n{want}--- got\n{got}", dir.display()));
            }
        }
    }
    assert!(failed.is_empty(), "{} schedules differ:\n{}", failed.len(), failed.join("\n"));
}

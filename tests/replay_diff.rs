//! `acp-replay diff`: the CLI's side of a trace against Coda's lists exactly what the shim changed (checked
//! against the trace's own `shim` marks and bytes), a recording against a new run of it is alike, and two
//! different scenarios are not.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use coda_shim::replay::diff::{self, Change, Which};
use coda_shim::replay::view::read::Dir;

use crate::support;
use support::replay::{check_with_env, fixtures_root};

/// One fixture of each binary, with waits, a child session or the instruction.
const FIXTURES: [(&str, &str); 4] = [
    ("kimi", "subagent-background"),
    ("grok", "bg-task-wakes"),
    ("opencode", "task-foreground"),
    ("codex", "subagent-completes"),
];

fn side(path: &Path, which: Which) -> diff::Side {
    diff::side::read(std::io::BufReader::new(std::fs::File::open(path).unwrap()), which)
}

/// The trace written with `CODA_SHIM_TRACE` while the shim replays `fixture` (real `--trace-file` output).
fn new_run(agent: &str, fixture: &Path, dir: &Path) -> PathBuf {
    let trace = dir.join(format!("{agent}-{}.jsonl", fixture.file_name().unwrap().to_string_lossy()));
    check_with_env(agent, fixture, &[("CODA_SHIM_TRACE", trace.to_str().unwrap())])
        .unwrap_or_else(|e| panic!("replaying {}: {e}", fixture.display()));
    trace
}

/// Checks that the diff of the trace's agent side (A: as if Coda had talked to the CLI directly) against its
/// client side (B) lists exactly the frames the shim changed:
/// - every record the trace marks `shim: true` (made or edited by the shim) is listed;
/// - every listed frame is marked, is paired with a marked one, or is a peer's frame whose bytes the shim never
///   passed on (read by the test itself from the trace).
fn lists_exactly_what_the_shim_changed(trace: &Path) -> (usize, usize) {
    let name = trace.display().to_string();
    let (a, b) = (side(trace, Which::Agent), side(trace, Which::Client));
    let report = diff::compare(&a, &b);
    let text = std::fs::read_to_string(trace).unwrap();
    let records: Vec<serde_json::Value> =
        text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
    let raw = |r: &serde_json::Value| r.get("frame").map(|f| f.to_string());
    let passed_as_is = |from: &str, to: &str, bytes: &str| {
        let _ = from;
        records.iter().any(|r| r["dir"] == to && raw(r).as_deref() == Some(bytes))
    };
    let mut listed: BTreeSet<usize> = BTreeSet::new();
    let mut marked_pairs = 0;
    for ch in report.turns.iter().flat_map(|t| &t.changes) {
        match ch {
            Change::Differs(i, j, lines) => {
                let (fa, fb) = (&a.frames[*i], &b.frames[*j]);
                assert!(
                    fa.shim || fb.shim,
                    "{name}: lines {} and {} differ but neither is marked: {lines:?}",
                    fa.line,
                    fb.line
                );
                assert!(!lines.is_empty(), "{name}");
                listed.insert(fa.line);
                listed.insert(fb.line);
                marked_pairs += 1;
            }
            Change::Moved(i, j) => {
                // The shim held it back or sent it early: the same bytes on both sides.
                let (fa, fb) = (&a.frames[*i], &b.frames[*j]);
                let same = |f: &diff::side::Frame| serde_json::from_str::<serde_json::Value>(&f.raw).unwrap();
                assert_eq!(same(fa), same(fb), "{name}: lines {} and {} moved", fa.line, fb.line);
                listed.insert(fa.line);
                listed.insert(fb.line);
            }
            Change::OnlyA(i) => {
                let f = &a.frames[*i];
                let bytes = serde_json::from_str::<serde_json::Value>(&f.raw).unwrap().to_string();
                let held = f.dir == Dir::AgentToShim && !passed_as_is("agent->shim", "shim->client", &bytes);
                assert!(
                    f.shim || held,
                    "{name}: line {} ({}) only on the CLI's side, unmarked and passed on",
                    f.line,
                    f.label()
                );
                listed.insert(f.line);
            }
            Change::OnlyB(j) => {
                let f = &b.frames[*j];
                let bytes = serde_json::from_str::<serde_json::Value>(&f.raw).unwrap().to_string();
                let held = f.dir == Dir::ClientToShim && !passed_as_is("client->shim", "shim->agent", &bytes);
                assert!(
                    f.shim || held,
                    "{name}: line {} ({}) only on Coda's side, unmarked and passed on",
                    f.line,
                    f.label()
                );
                listed.insert(f.line);
            }
        }
    }
    let marked: BTreeSet<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r["shim"] == true && r.get("frame").is_some())
        .map(|(n, _)| n + 1)
        .collect();
    let missing: Vec<&usize> = marked.difference(&listed).collect();
    assert!(missing.is_empty(), "{name}: frames the shim marked but the diff does not list: lines {missing:?}");
    assert!(report.differs());
    (marked.len(), marked_pairs)
}

#[test]
fn the_clis_side_against_codas_lists_exactly_what_the_shim_changed() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for (agent, scenario) in FIXTURES {
        let fixture = fixtures_root().join(agent).join(scenario);
        for trace in [fixture.join("trace.jsonl"), new_run(agent, &fixture, dir.path())] {
            let (marked, edited) = lists_exactly_what_the_shim_changed(&trace);
            assert!(marked > 0 && edited > 0, "{}: {marked} marked, {edited} edited", trace.display());
            seen += 1;
        }
    }
    assert_eq!(seen, 8);
}

/// A recording against a new run of it (what Coda saw both times): alike, whatever the run's ids, times and
/// folders; the text says so and the exit status is 0. Two different scenarios differ, with status 1.
#[test]
fn a_recording_and_a_new_run_of_it_are_alike_and_two_scenarios_are_not() {
    let dir = tempfile::tempdir().unwrap();
    for (agent, scenario) in FIXTURES {
        let fixture = fixtures_root().join(agent).join(scenario);
        let run = new_run(agent, &fixture, dir.path());
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"))
            .arg("diff")
            .arg(&fixture)
            .arg(&run)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{agent}/{scenario}:\n{text}");
        assert!(text.contains(" 0 differ, 0 only in A, 0 only in B, 0 moved"), "{text}");
        let a = side(&fixture.join("trace.jsonl"), Which::Client);
        let r = diff::compare(&a, &side(&run, Which::Client));
        let alike: usize = r.turns.iter().map(|t| t.same).sum();
        assert_eq!(alike, a.frames.len(), "{agent}/{scenario}: every frame paired and alike");
        assert!(r.turns.iter().any(|t| t.turn > 0 && t.a.is_some() && t.b.is_some()), "turn timings on both sides");
    }
    let (x, y) = (fixtures_root().join("kimi/bg-fails"), fixtures_root().join("kimi/bg-stopped"));
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay")).arg("diff").arg(&x).arg(&y).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"))
        .args(["diff", "/nonexistent/trace.jsonl", "x"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// `--html`: the viewer's page with both sides' lanes, private, with a mark for each listed difference.
#[test]
fn the_html_page_has_both_sides_lanes_and_a_mark_per_difference() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixtures_root().join("kimi/subagent-background");
    let page = dir.path().join("diff.html");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"))
        .arg("diff")
        .arg(&fixture)
        .arg("--html")
        .arg(&page)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::metadata(&page).unwrap().permissions().mode() & 0o777, 0o600);
    let html = std::fs::read_to_string(&page).unwrap();
    let start = html.find(r#"<script type="application/json" id="model">"#).unwrap();
    let body = &html[start..];
    let json = &body[body.find('>').unwrap() + 1..body.find("</script>").unwrap()];
    let m: serde_json::Value = serde_json::from_str(json).unwrap();
    let lanes: Vec<&str> = m["lanes"].as_array().unwrap().iter().map(|l| l["session"].as_str().unwrap()).collect();
    let sid = "session_53ac1cc7-a747-4b71-a688-52409262cdcf";
    let (la, lb) = (
        lanes.iter().position(|l| *l == format!("A · {sid}")).expect("A's lane"),
        lanes.iter().position(|l| *l == format!("B · {sid}")).expect("B's lane"),
    );
    assert_eq!(lb, la + 1, "each session's B lane right under its A lane: {lanes:?}");
    let r = diff::compare(
        &side(&fixture.join("trace.jsonl"), Which::Agent),
        &side(&fixture.join("trace.jsonl"), Which::Client),
    );
    let (d, oa, ob, mv) = r.counts();
    let marks = m["items"].as_array().unwrap().iter().filter(|i| i["kind"] == "shim").count();
    assert_eq!(
        marks,
        2 * (d + mv) + oa + ob,
        "a mark on both lanes for a frame that differs, one for a frame on one side"
    );
    assert_eq!(
        m["frames"].as_u64().unwrap() as usize,
        r.turns.iter().map(|t| t.same * 2).sum::<usize>() + 2 * (d + mv) + oa + ob
    );
}

//! `acp-replay redact` on every fixture of the four shims, with secrets planted in texts and in places that are
//! kept (tool titles, `_meta`, paths), and on a hostile trace: nothing planted survives, with texts replaced or
//! kept (`--keep all`); the copy is private; `view` and `diff` read it as they read the trace.

use std::path::{Path, PathBuf};

use coda_shim::replay::diff::{self, Which};
use coda_shim::replay::view;
use serde_json::{Value, json};

use crate::support;
use support::replay::{fixtures, fixtures_root};

/// What is planted; none of it may be in a redacted copy (compared without case).
const PLANTED: [&str; 11] = [
    "sk-PLANTEDa1b2c3d4e5f6g7h8",
    "ghp_PLANTED0123456789abcdefghijABCD",
    "AKIAPLANTED012345678",
    "Bearer PLANTEDbearer.0123456789",
    "password=PLANTEDpw0123",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAPLANTEDkeybody\n-----END OPENSSH PRIVATE KEY-----",
    "/home/plantuser/.ssh/id_rsa",
    "PLANTEDlong0123456789abcdefghijklmnopqrstuvwxyzABCD",
    "xoxb-PLANTED-0123456789",
    "Authorization: Basic UExBTlRFRGJhc2ljMDEyMzQ1",
    "api_key: \"PLANTEDquoted\"",
];

/// Parts of the planted values that must not survive either (the secret part of each).
const MUST_GO: [&str; 4] = ["planted", "plantuser", "UExBTlRFRGJhc2lj", "b3BlbnNzaC1rZXktdjEAAAA"];

fn plant_in(v: &mut Value, k: &mut usize) {
    match v {
        Value::Object(o) => {
            for (key, x) in o.iter_mut() {
                if let Value::String(s) = x
                    && matches!(key.as_str(), "text" | "title" | "content" | "systemPrompt" | "data" | "message")
                {
                    s.push_str(&format!("\n{} and {}", PLANTED[*k % PLANTED.len()], PLANTED[(*k + 5) % PLANTED.len()]));
                    *k += 1;
                } else {
                    plant_in(x, k);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| plant_in(x, k)),
        _ => {}
    }
}

/// The fixture's trace with the planted values in its texts, its titles, a `_meta` of every request and its
/// session folder.
fn planted(trace: &Path, out: &Path) {
    let mut k = 0;
    let mut text = String::new();
    for line in std::fs::read_to_string(trace).unwrap().lines().filter(|l| !l.trim().is_empty()) {
        let line = line.replace("{{CWD}}", "/home/plantuser/project").replace("{{HOME}}", "/home/plantuser");
        let mut rec: Value = serde_json::from_str(&line).unwrap();
        if let Some(frame) = rec.get_mut("frame") {
            plant_in(frame, &mut k);
            if let Some(Value::Object(p)) = frame.get_mut("params") {
                p.entry("_meta").or_insert(json!({})).as_object_mut().map(|m| {
                    m.insert("apiKey".into(), json!(PLANTED[k % PLANTED.len()]));
                    m.insert("note".into(), json!(format!("see {}", PLANTED[(k + 3) % PLANTED.len()])))
                });
                k += 1;
            }
        }
        if let Some(file) = rec.get_mut("file") {
            plant_in(file, &mut k);
        }
        text.push_str(&rec.to_string());
        text.push('\n');
    }
    std::fs::write(out, text).unwrap();
}

fn redact(trace: &Path, out: &Path, keep: Option<&str>) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"));
    cmd.arg("redact").arg(trace).arg("-o").arg(out);
    if let Some(k) = keep {
        cmd.args(["--keep", k]);
    }
    cmd.output().unwrap()
}

fn assert_nothing_planted(text: &str, name: &str) {
    let lower = text.to_lowercase();
    // Every secret holds `PLANTED` (or is one of the base64 bodies); the user name is `plantuser`.
    for p in PLANTED.iter().copied().chain(MUST_GO) {
        if let Some(at) = lower.find(&p.to_lowercase()) {
            panic!("{name}: {p:?} survived: …{}…", &text[at.saturating_sub(80)..(at + 80).min(text.len())]);
        }
    }
}

fn side(path: &Path, which: Which) -> diff::Side {
    diff::side::read(std::io::BufReader::new(std::fs::File::open(path).unwrap()), which)
}

#[test]
fn every_fixture_redacted_keeps_nothing_planted_and_still_views_and_diffs() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for agent in ["codex", "grok", "kimi", "opencode"] {
        for fixture in fixtures(agent) {
            let name = fixture.display().to_string();
            let src = dir.path().join(format!("{agent}-{n}.jsonl"));
            planted(&fixture.join("trace.jsonl"), &src);
            let original = std::fs::read_to_string(&src).unwrap();
            assert!(original.contains("PLANTED") && original.contains("plantuser"), "{name}: planted");
            for keep in [None, Some("all")] {
                let out: PathBuf = dir.path().join(format!("{agent}-{n}-{}.jsonl", keep.unwrap_or("none")));
                let run = redact(&src, &out, keep);
                assert!(run.status.success(), "{name}: {}", String::from_utf8_lossy(&run.stderr));
                assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
                let text = std::fs::read_to_string(&out).unwrap();
                assert_nothing_planted(&text, &format!("{name} (keep {keep:?})"));

                // The view reads the copy as it reads the trace: the same records, lanes, marks and turns.
                let (a, b) = (view::model(original.as_bytes()), view::model(text.as_bytes()));
                assert!(b.bad.is_empty(), "{name}: {:?}", b.bad);
                assert_eq!(
                    (a.frames, a.lanes.len(), a.items.len()),
                    (b.frames, b.lanes.len(), b.items.len()),
                    "{name}"
                );
                let kinds = |m: &view::Model| m.items.iter().map(|i| (i.kind, i.t, i.end, i.lane)).collect::<Vec<_>>();
                assert_eq!(kinds(&a), kinds(&b), "{name}: marks at the same places");

                // And diff: Coda's side of the copy pairs with the trace's frame by frame; the shim's changes
                // in the copy are as many as in the trace.
                let r = diff::compare(&side(&src, Which::Client), &side(&out, Which::Client));
                let (_, only_a, only_b, moved) = r.counts();
                assert_eq!((only_a, only_b, moved), (0, 0, 0), "{name}: every frame pairs with its copy");
                if keep.is_some() {
                    assert!(!r.differs() || text.contains("[redacted]"), "{name}: only masks differ");
                }
                let shim = |p: &Path| diff::compare(&side(p, Which::Agent), &side(p, Which::Client)).counts();
                let (d0, a0, b0, m0) = shim(&src);
                let (d1, a1, b1, m1) = shim(&out);
                assert_eq!((a0 + d0 + m0, b0 + d0 + m0), (a1 + d1 + m1, b1 + d1 + m1), "{name}: the shim's changes");
            }
            n += 1;
        }
    }
    assert!(n >= 40, "{n} fixtures");
    // A symlink as the output is refused.
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(dir.path().join("target.jsonl"), &link).unwrap();
    let trace = fixtures_root().join("grok/bg-task-wakes/trace.jsonl");
    assert!(!redact(&trace, &link, None).status.success(), "a symlink is not followed");
    assert!(!dir.path().join("target.jsonl").exists());
}

#[test]
fn a_hostile_trace_keeps_nothing_planted() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("hostile.jsonl");
    let mut text: Vec<u8> = Vec::new();
    let mut push = |l: &[u8]| {
        text.extend_from_slice(l);
        text.push(b'\n');
    };
    let prompt = json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s-1","prompt":[
        {"type":"text","text": format!("# 标题 🙂\n\n- {}\n- {}", PLANTED[0], PLANTED[5])},
        {"type":"resource","resource":{"uri":"file:///home/plantuser/x.env","text": PLANTED[4]}}]}});
    push(json!({"t":0,"dir":"client->shim","frame":prompt}).to_string().as_bytes());
    // A secret spelled with JSON escapes, in a key name, in a tool's title and its raw input.
    push(br#"{"t":1,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"tool_call","toolCallId":"c1","title":"curl -H 'Authorization: Bearer PLANTEDbearer.0123456789'","rawInput":{"command":"export AWS=AKIAPLANTED012345678"},"\u0073k-PLANTEDa1b2c3d4e5f6g7h8":1}}}}"#);
    push(br#"{"t":2,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"x","params":{"v":"\u0073k-PLANTEDa1b2c3d4e5f6g7h8 at /Users/plantuser/a"}}}"#);
    // Not records: plain text, invalid UTF-8 around a secret, a line record, a file record.
    push(b"not json: ghp_PLANTED0123456789abcdefghijABCD");
    push(b"{\"t\":3,\"dir\":\"agent->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"a\":\"\xff xoxb-PLANTED-0123456789\"}}}");
    push(json!({"t":4,"dir":"agent->shim","line": format!("log: {}", PLANTED[9])}).to_string().as_bytes());
    push(
        json!({"t":5,"dir":"agent->file","file":{"op":"append","path":"/home/plantuser/.kimi/x","data": PLANTED[7]}})
            .to_string()
            .as_bytes(),
    );
    // Nested deeper than any frame is read, with a secret inside.
    let deep = format!("{}\"{}\"{}", "[".repeat(1500), PLANTED[1], "]".repeat(1500));
    push(format!(r#"{{"t":6,"dir":"agent->shim","frame":{deep}}}"#).as_bytes());
    // 1e400 and CJK kept; a last line cut short, holding a secret.
    push(br#"{"t":7,"dir":"shim->client","frame":{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn","n":1e400}}}"#);
    text.extend_from_slice(
        br#"{"t":8,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"y","params":{"token":"PLANTEDcut0123"#,
    );
    std::fs::write(&src, &text).unwrap();
    for keep in [None, Some("all")] {
        let out = dir.path().join(format!("out-{}.jsonl", keep.unwrap_or("none")));
        let run = redact(&src, &out, keep);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let copy = std::fs::read_to_string(&out).unwrap();
        assert_nothing_planted(&copy, &format!("hostile (keep {keep:?})"));
        assert!(!copy.contains("PLANTEDcut"));
        assert!(copy.contains("\"n\":1e400"), "numbers as written: {copy}");
        assert_eq!(copy.lines().count(), text.split(|&b| b == b'\n').count(), "a line for each line");
        // The view reads as many records and bad lines as in the trace (the deep frame, the plain text and
        // the cut line are bad lines of the same shape; the bad UTF-8 line is a record).
        let (m, before) = (view::model(copy.as_bytes()), view::model(&text));
        assert_eq!((m.frames, m.bad.len()), (before.frames, 3), "{:?}", m.bad);
        assert_eq!(before.bad.len(), 4, "{:?}", before.bad);
        if keep.is_some() {
            assert!(copy.contains("标题 🙂"), "kept text stays: {copy}");
        } else {
            assert!(!copy.contains("标题"), "{copy}");
        }
    }
}

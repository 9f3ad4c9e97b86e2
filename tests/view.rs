//! `acp-replay view`'s model and page, checked against what the recorded traces of the four shims say.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use coda_shim::replay::view::{self, Item, Kind, Model};
use serde_json::Value;

use crate::support;
use support::replay::{fixtures, fixtures_root};

/// A trace's records as the test reads them itself: `(ms since the first record, dir, frame)`.
fn records(path: &Path) -> Vec<(f64, String, Value)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut first = None;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let rec: Value = serde_json::from_str(line).unwrap();
        let at = match (rec.get("t"), rec.get("ts")) {
            (Some(t), _) => t.as_f64().unwrap(),
            (None, Some(ts)) => {
                let at = humantime::parse_rfc3339_weak(ts.as_str().unwrap()).unwrap();
                at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0
            }
            _ => panic!("no time in {line}"),
        };
        let t = at - *first.get_or_insert(at);
        if let Some(frame) = rec.get("frame") {
            out.push((t, rec["dir"].as_str().unwrap().to_owned(), frame.clone()));
        }
    }
    out
}

/// The frames a page holds: every chunk (`<script type="application/x-acp-frames">`, gzip in base64) read
/// back, one `[line, t, dir, text]` per record, in order.
fn page_frames(page: &str) -> Vec<Value> {
    use base64::Engine;
    use std::io::Read;
    let mut out = Vec::new();
    for (k, part) in page.split(r#"<script type="application/x-acp-frames" id="c"#).skip(1).enumerate() {
        let (id, rest) = part.split_once("\">").unwrap();
        assert_eq!(id, k.to_string(), "chunks in order");
        let b64 = &rest[..rest.find("</script>").unwrap()];
        let gz = base64::engine::general_purpose::STANDARD.decode(b64).unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut text).unwrap();
        out.extend(text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()));
    }
    out
}

fn model_of(path: &Path) -> Model {
    view::model(&std::fs::read(path).unwrap())
}

fn lane_of<'a>(m: &'a Model, session: &str) -> (usize, &'a view::Lane) {
    m.lanes.iter().enumerate().find(|(_, l)| l.session == session).unwrap_or_else(|| panic!("no lane for {session}"))
}

fn items(m: &Model, kind: Kind) -> Vec<&Item> {
    m.items.iter().filter(|i| i.kind == kind).collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer)?.as_str()
}

#[test]
fn a_kimi_background_subagent_reads_as_lanes_turns_waits_and_changed_frames() {
    let path = fixtures_root().join("kimi/subagent-background/trace.jsonl");
    let recs = records(&path);
    let m = model_of(&path);
    let parent = "session_53ac1cc7-a747-4b71-a688-52409262cdcf";

    // The child lane starts where the wait announced it.
    let announced = recs
        .iter()
        .find(|(_, dir, f)| dir == "shim->client" && str_at(f, "/params/childSessionId") == Some("agent-0"))
        .unwrap();
    let (p, _) = lane_of(&m, parent);
    let (c, child) = lane_of(&m, "agent-0");
    assert_eq!(child.parent, Some(p));
    assert_eq!(child.start, announced.0);

    // One turn of Coda's: from the prompt to its answer, end_turn.
    let prompt = recs.iter().find(|(_, d, f)| d == "client->shim" && f["method"] == "session/prompt").unwrap();
    let answer = recs
        .iter()
        .find(|(_, d, f)| d == "shim->client" && f["id"] == prompt.2["id"] && f.get("result").is_some())
        .unwrap();
    let turns = items(&m, Kind::Turn);
    assert_eq!(turns.len(), 1);
    assert_eq!((turns[0].lane, turns[0].t, turns[0].end), (p, prompt.0, Some(answer.0)));
    assert_eq!(turns[0].state, "end_turn");
    assert_eq!(turns[0].label, "[[subagent:[[text:sub done]]]]");

    // The wait: waiting → handling → done, with its kind and title; Kimi's own turn while it is handling.
    let states: Vec<(f64, &str)> = recs
        .iter()
        .filter(|(_, d, f)| d == "shim->client" && f["method"] == "_coda/wait")
        .map(|(t, _, f)| (*t, str_at(f, "/params/state").unwrap()))
        .collect();
    let waits = items(&m, Kind::Wait);
    assert_eq!(waits.len(), 1);
    let w = waits[0];
    assert_eq!((w.lane, w.wait.as_str(), w.label.as_str()), (p, "agent-qqvzhjwb", "worker_1 task"));
    assert!(w.text.starts_with("subagent "), "{}", w.text);
    assert_eq!(w.segs.iter().map(|(s, t)| (*t, s.as_str())).collect::<Vec<_>>(), states);
    assert_eq!((w.state.as_str(), w.end), ("done", Some(states[2].0)));
    let own = items(&m, Kind::Own);
    assert_eq!(own.len(), 1);
    assert_eq!((own[0].lane, own[0].t, own[0].end), (p, states[1].0, Some(states[2].0)));

    // The child's text is in its lane.
    let texts: Vec<&Item> = items(&m, Kind::Text).into_iter().filter(|i| i.lane == c).collect();
    assert_eq!(texts.len(), 1);
    assert_eq!(texts[0].text, "sub done");

    // Frames the shim changed: the instruction taken out of session/new and put before the first prompt,
    // the capability added to initialize's answer; both versions are linked.
    let shim = items(&m, Kind::Shim);
    let edited = |method: &str| {
        shim.iter()
            .find(|i| i.state == "edited" && i.method == method)
            .unwrap_or_else(|| panic!("no edited {method}: {shim:#?}"))
            .text
            .clone()
    };
    assert!(edited("session/new").contains("params.systemPrompt: removed"));
    let prompt_change = edited("session/prompt");
    assert!(prompt_change.contains("params.prompt: 1 put before the others"), "{prompt_change}");
    let init_answer = shim.iter().find(|i| i.state == "edited" && i.method.is_empty() && i.lane == 0).unwrap();
    assert!(init_answer.text.contains("result.agentCapabilities._meta: added"), "{}", init_answer.text);
    let pair = |f: u32| m.changed.iter().find(|c| c.0 == f as usize).map(|c| c.2);
    for it in shim.iter().filter(|i| i.state == "edited") {
        let [a, b] = it.frames[..] else { panic!("an edited frame shows both versions: {it:?}") };
        assert_eq!(pair(a), Some(b as i64));
        assert_eq!(pair(b), Some(a as i64));
    }
    assert!(turns[0].changed, "the prompt the agent got is not the one Coda sent");
    assert!(m.bad.is_empty());
}

/// Every fixture of every shim: a lane for each session Coda saw, a turn for each prompt with the answer's
/// stop reason or error, a wait for each `_coda/wait` id with all its states in order, and each frame of
/// the trace in the page.
#[test]
fn every_fixture_of_the_four_shims_is_drawn_as_its_trace_says() {
    let mut seen = BTreeMap::new();
    for agent in ["codex", "grok", "kimi", "opencode"] {
        for fixture in fixtures(agent) {
            let path = fixture.join("trace.jsonl");
            let recs = records(&path);
            let m = model_of(&path);
            let name = path.display().to_string();
            assert!(m.bad.is_empty(), "{name}: {:?}", m.bad);
            assert_eq!(m.frames, std::fs::read_to_string(&path).unwrap().lines().count(), "{name}");
            let lanes: BTreeSet<&str> = m.lanes.iter().map(|l| l.session.as_str()).collect();
            let mut waits: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
            let mut prompts = 0;
            for (t, dir, f) in &recs {
                if dir != "client->shim" && dir != "shim->client" {
                    continue;
                }
                if let Some(s) = str_at(f, "/params/sessionId") {
                    assert!(lanes.contains(s), "{name}: no lane for session {s}");
                }
                if dir == "shim->client" && f["method"] == "_coda/wait" {
                    let key = (
                        str_at(f, "/params/sessionId").unwrap().to_owned(),
                        str_at(f, "/params/waitId").unwrap().to_owned(),
                    );
                    let states = waits.entry(key).or_default();
                    let state = str_at(f, "/params/state").unwrap().to_owned();
                    if states.last() != Some(&state) {
                        states.push(state);
                    }
                }
                if dir == "client->shim" && f["method"] == "session/prompt" {
                    prompts += 1;
                    let answer = recs
                        .iter()
                        .find(|(_, d, a)| d == "shim->client" && a["id"] == f["id"] && a.get("method").is_none());
                    let turn = m
                        .items
                        .iter()
                        .find(|i| {
                            i.kind == Kind::Turn
                                && i.t == *t
                                && m.lanes[i.lane].session == str_at(f, "/params/sessionId").unwrap()
                        })
                        .unwrap_or_else(|| panic!("{name}: no turn at {t}"));
                    match answer {
                        Some((end, _, a)) => {
                            assert_eq!(turn.end, Some(*end), "{name}");
                            match (str_at(a, "/result/stopReason"), a.get("error")) {
                                (Some(stop), _) => assert_eq!(turn.state, stop, "{name}"),
                                (None, Some(_)) => assert!(turn.red, "{name}: an error answer is red"),
                                _ => {}
                            }
                        }
                        None => assert!(turn.open, "{name}: a turn without an answer is open"),
                    }
                }
            }
            assert_eq!(items(&m, Kind::Turn).len(), prompts, "{name}");
            let drawn: BTreeMap<(String, String), Vec<String>> = items(&m, Kind::Wait)
                .iter()
                .map(|w| {
                    ((m.lanes[w.lane].session.clone(), w.wait.clone()), w.segs.iter().map(|(s, _)| s.clone()).collect())
                })
                .collect();
            assert_eq!(drawn, waits, "{name}");
            for it in &m.items {
                assert!(it.frames.iter().all(|&f| (f as usize) < m.frames), "{name}");
                assert!(it.end.is_none_or(|e| e >= it.t), "{name}: {it:?}");
                assert!(it.row < m.lanes[it.lane].rows.len(), "{name}: {it:?}");
            }
            *seen.entry(agent).or_insert(0) += 1;
        }
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
}

/// Own turns are read from the waits, not from who the agent is: Grok's and Kimi's fixtures where a wait is
/// handled after the turn have one, Codex (which never reports `handling`) has none.
#[test]
fn own_turns_come_from_handling_outside_coda_turns() {
    let own = |f: &str| items(&model_of(&fixtures_root().join(f).join("trace.jsonl")), Kind::Own).len();
    assert_eq!(own("grok/bg-task-wakes"), 1);
    assert_eq!(own("kimi/bg-ends-after-turn"), 1);
    for fixture in fixtures("codex") {
        assert_eq!(items(&model_of(&fixture.join("trace.jsonl")), Kind::Own).len(), 0, "{}", fixture.display());
    }
}

/// A hostile trace: markup in text, CJK and emoji, line separators, invalid UTF-8, a huge number, deep
/// nesting, a line cut short. The page still renders, the text stays text, and every bad line is listed.
#[test]
fn a_hostile_trace_renders_with_its_bad_lines_listed() {
    let evil = "</script><script>alert(1)</script><!-- 中文 🙂 \u{2028}\u{2029}";
    let prompt = serde_json::json!({"jsonrpc":"2.0","id":7,"method":"session/prompt",
        "params":{"sessionId":"s-1","prompt":[{"type":"text","text": evil}]}});
    let mut trace = Vec::new();
    let push = |trace: &mut Vec<u8>, line: String| {
        trace.extend_from_slice(line.as_bytes());
        trace.push(b'\n');
    };
    push(&mut trace, format!(r#"{{"t":0,"dir":"client->shim","frame":{prompt}}}"#));
    push(&mut trace, r#"{"t":3,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"n = 1e400"}}},"x":1e400}}"#.into());
    let deep = format!("{}{}", "[".repeat(1500), "]".repeat(1500));
    push(&mut trace, format!(r#"{{"t":4,"dir":"agent->shim","frame":{deep}}}"#));
    let mut bad_utf8 =
        br#"{"t":5,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"x","params":{"sessionId":"s-1","a":""#
            .to_vec();
    bad_utf8.extend_from_slice(b"\xff\xfe\"}}}");
    trace.extend_from_slice(&bad_utf8);
    trace.push(b'\n');
    trace.extend_from_slice(
        b"{\"t\":9,\"dir\":\"shim->client\",\"frame\":{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"stopRea",
    );

    let (page, summary) = view::page(&trace, "hostile </title><b>x</b>.jsonl");
    assert_eq!(summary.bad_lines, 3, "the deep frame, the bad UTF-8, the cut line");
    assert!(!page.contains("<script>alert"), "markup from the trace ended up as markup");
    assert!(!page.contains("<b>x</b>"));
    assert!(!page.contains('\u{2028}') && !page.contains('\u{2029}'));
    // The model in the page is the model, text and numbers as they were.
    let start = page.find(r#"<script type="application/json" id="model">"#).unwrap();
    let body = &page[start..];
    let json = &body[body.find('>').unwrap() + 1..body.find("</script>").unwrap()];
    let m: Value = serde_json::from_str(json).unwrap();
    let turn = m["items"].as_array().unwrap().iter().find(|i| i["kind"] == "turn").unwrap();
    assert_eq!(turn["text"], evil);
    assert_eq!(turn["open"], true, "its answer was cut short");
    let frames = page_frames(&page);
    assert_eq!(frames.len(), m["frames"].as_u64().unwrap() as usize);
    assert!(frames[1][3].as_str().unwrap().ends_with(r#""x":1e400}"#), "{}", frames[1][3]);
    assert_eq!(frames[0][3].as_str().unwrap(), prompt.to_string(), "the frame's text, as recorded");
    assert_eq!(frames[0][2], "client->shim");
    let bad: Vec<&str> = m["bad"].as_array().unwrap().iter().map(|b| b["reason"].as_str().unwrap()).collect();
    assert!(bad[0].contains("nested deeper"), "{bad:?}");
    assert!(bad[1].starts_with("not valid UTF-8"), "{bad:?}");
    assert!(bad[2].starts_with("cut short"), "{bad:?}");
}

#[test]
fn the_view_command_writes_a_private_page() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("page.html");
    let fixture = fixtures_root().join("grok/subagent-background");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"))
        .arg("view")
        .arg(&fixture)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.starts_with("<!doctype html>"));
    assert!(page.contains("<title>subagent-background · acp-replay view</title>"));
    assert!(!page.contains("src=") && !page.contains("href="), "the page loads nothing");
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
    let link = dir.path().join("link.html");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"))
        .args(["view", fixture.to_str().unwrap(), "-o", link.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a symlink is not followed");
}

/// A compaction on the session's lane: Coda's `_coda/session/compact` as a span to its answer (compacted, with
/// before → after; refused, with the reason), the agent's `compaction_update`s as one span from `in_progress`
/// to `completed`; each `usage_update` a mark whose hover text (kind · state) and detail carry the facts.
#[test]
fn compactions_and_usage_facts_are_drawn_on_the_sessions_lane() {
    let path = fixtures_root().join("codex/compact-between-turns/trace.jsonl");
    let recs = records(&path);
    let m = model_of(&path);
    let sid = recs.iter().find_map(|(_, d, f)| (d == "shim->client").then(|| str_at(f, "/result/sessionId")).flatten());
    let (lane, l) = lane_of(&m, sid.expect("a session"));
    let asked: Vec<&Item> =
        items(&m, Kind::Compact).into_iter().filter(|i| i.method == "_coda/session/compact").collect();
    assert_eq!(asked.len(), 2, "{asked:#?}");
    let answer = |id: u64| {
        recs.iter().find(|(_, d, f)| d == "shim->client" && f["id"] == id && f.get("method").is_none()).unwrap()
    };
    let (end, _, a) = answer(4);
    assert_eq!((asked[0].lane, asked[0].end, asked[0].state.as_str()), (lane, Some(*end), "compacted"));
    // Codex says its context before a compaction in the model's measure, and none after in that measure.
    let before = a["result"]["before"].as_u64().expect("before");
    assert_eq!(a["result"].get("after"), None, "{a}");
    assert_eq!(asked[0].label, format!("compacted from {before} tokens"));
    assert!(asked[0].text.contains("\"compacted\": true"));
    assert_eq!(asked[1].state, "not compacted");
    assert!(asked[1].label.starts_with("not compacted: a turn is running"), "{}", asked[1].label);
    assert!(!asked[0].red && !asked[1].red, "a refusal is no error");
    // The agent's report: one span, inside Coda's request, in a row of its own.
    let reported: Vec<&Item> = items(&m, Kind::Compact).into_iter().filter(|i| i.method == "session/update").collect();
    assert_eq!(reported.len(), 1, "{reported:#?}");
    let r = reported[0];
    assert_eq!((r.lane, r.state.as_str(), r.open, r.frames.len()), (lane, "completed", false, 2));
    assert!(asked[0].t <= r.t && r.end.unwrap() <= asked[0].end.unwrap());
    assert_eq!(l.rows[r.row], "compact");
    assert_eq!(l.rows[asked[0].row], "turns");
    // Usage: one mark per update Coda got, its facts in the state (the hover) and the detail.
    let usage = items(&m, Kind::Usage);
    let sent: Vec<&Value> = recs
        .iter()
        .filter(|(_, d, f)| d == "shim->client" && f["params"]["update"]["sessionUpdate"] == "usage_update")
        .map(|(_, _, f)| f)
        .collect();
    assert_eq!(usage.len(), sent.len());
    for (mark, f) in usage.iter().zip(&sent) {
        let u = &f["params"]["update"];
        assert_eq!(mark.label, format!("usage {} / {}", u["used"], u["size"]));
        let facts = &u["_meta"]["coda"];
        assert!(mark.state.contains(&format!("contextTokens {}", facts["contextTokens"])), "{}", mark.state);
        assert!(mark.state.contains(&format!("lastRequestAt {}", facts["lastRequestAt"].as_str().unwrap())));
        let detail: Value = serde_json::from_str(&mark.text).unwrap();
        assert_eq!(&detail, facts);
    }
    assert!(usage.iter().any(|u| u.state.contains("compactedAt")));
}

/// Codex compacting by itself: the reported span sits inside the turn that ran it.
#[test]
fn an_automatic_compaction_is_drawn_inside_its_turn() {
    let m = model_of(&fixtures_root().join("codex/compact-automatic/trace.jsonl"));
    let reported = items(&m, Kind::Compact);
    assert_eq!(reported.len(), 1);
    let c = reported[0];
    let turn = items(&m, Kind::Turn).into_iter().find(|t| t.t <= c.t && c.end <= t.end).expect("a turn around it");
    assert_eq!((turn.lane, c.state.as_str()), (c.lane, "completed"));
}

/// Hostile compaction frames: no id, a status that is no string, facts that are no object, a failed
/// compaction, an error answer, a request never answered. Nothing panics; each is drawn as what it is.
#[test]
fn hostile_compaction_and_usage_frames_are_drawn_as_they_are() {
    let lines = [
        r#"{"t":0,"dir":"client->shim","frame":{"jsonrpc":"2.0","id":1,"method":"_coda/session/compact","params":{"sessionId":"s"}}}"#,
        r#"{"t":1,"dir":"shim->client","frame":{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}}"#,
        r#"{"t":2,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"compaction_update","status":{"x":1}}}}}"#,
        r#"{"t":3,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"compaction_update","compactionId":"k","status":"in_progress"}}}}"#,
        r#"{"t":4,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"compaction_update","compactionId":"k","status":"failed","error":"boom"}}}}"#,
        r#"{"t":5,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"usage_update","used":1e400,"size":"x","_meta":{"coda":"no"}}}}}"#,
        r#"{"t":6,"dir":"shim->client","frame":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"usage_update","_meta":{"coda":{"lastRequestAt":"<b>x</b>","contextTokens":[1,2]}}}}}}"#,
        r#"{"t":7,"dir":"client->shim","frame":{"jsonrpc":"2.0","id":2,"method":"_coda/session/compact","params":{"sessionId":"s"}}}"#,
    ];
    let m = view::model(lines.join("\n").as_bytes());
    let compact = items(&m, Kind::Compact);
    assert_eq!(compact.len(), 4, "{compact:#?}");
    assert!(compact[0].red && compact[0].state.starts_with("error"), "an error answer");
    assert_eq!((compact[1].state.as_str(), compact[1].open), ("", true), "a status that is no string");
    assert_eq!((compact[2].state.as_str(), compact[2].red, compact[2].text.as_str()), ("failed", true, "error: boom"));
    assert!(compact[3].open, "never answered");
    let usage = items(&m, Kind::Usage);
    assert_eq!(usage[0].label, "usage 1e+400 / \"x\"", "the number as the viewer reads it");
    assert!(usage[0].red);
    assert_eq!(usage[1].label, "usage ? / ?");
    assert!(usage[1].state.contains("lastRequestAt <b>x</b>") && usage[1].state.contains("contextTokens [1,2]"));
    let (page, _) = view::page(lines.join("\n").as_bytes(), "t");
    assert!(!page.contains("<b>x</b>"), "peer text never becomes markup");
}

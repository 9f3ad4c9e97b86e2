//! `acp-replay view` pages in a real headless Chromium: no console error, lanes, turns and waits where the trace says, a click opens the frame.
//!
//! The traces: what each of the four shims wrote with `CODA_SHIM_TRACE` while replaying one of its fixtures
//! (real `--trace-file` output, wall-clock times), one fixture as committed (relative times), and a hostile
//! trace; and a day-long trace of 100,000 records (first paint, scroll and zoom frame times printed). Skipped, loudly, only when Chromium is missing and `CODA_REQUIRE_BROWSER` is unset (`.ci/run` installs
//! it and sets it).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

#[path = "support/big_trace.rs"]
mod big_trace;
use crate::support;
use support::cdp::{self, Browser};
use support::replay::{check_with_env, fixtures_root};

/// Pixels of slack for a position: the page places items in % of the canvas.
const SLACK: f64 = 1.5;

fn browser() -> Option<PathBuf> {
    let found = cdp::chromium();
    if found.is_none() {
        if std::env::var_os("CODA_REQUIRE_BROWSER").is_some() {
            panic!("CODA_REQUIRE_BROWSER is set but there is no /usr/bin/chromium (or $CODA_CHROMIUM)");
        }
        eprintln!(
            "\n*** SKIPPED: no Chromium (/usr/bin/chromium or $CODA_CHROMIUM); the view pages were NOT tested in a browser ***\n"
        );
    }
    found
}

/// `(ms since the first record, 1-based line, dir, frame)` of every frame record, read by the test itself.
fn records(trace: &Path) -> Vec<(f64, usize, String, Value)> {
    let mut first = None;
    let mut out = Vec::new();
    for (n, line) in std::fs::read_to_string(trace).unwrap().lines().enumerate() {
        let Ok(rec) = serde_json::from_str::<Value>(line) else { continue };
        let at = match (rec.get("t"), rec.get("ts")) {
            (Some(t), _) => t.as_f64().unwrap(),
            (None, Some(ts)) => {
                let at = humantime::parse_rfc3339_weak(ts.as_str().unwrap()).unwrap();
                at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0
            }
            _ => continue,
        };
        let t = at - *first.get_or_insert(at);
        if let Some(frame) = rec.get("frame") {
            out.push((t, n + 1, rec["dir"].as_str().unwrap().to_owned(), frame.clone()));
        }
    }
    out
}

fn write_page(trace: &Path, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{}.html", trace.parent().unwrap().file_name().unwrap().to_string_lossy()));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"))
        .arg("view")
        .arg(trace)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    out
}

fn open(b: &mut Browser, page: &Path) -> String {
    b.open(page)
}

/// What the page drew, in pixels from the start of its time axis: the lanes' places and the marks of its last
/// draw (with the states a wait bar was painted in), as the page reports them (`window.acpView`).
const GEOMETRY: &str = r#"(() => {
  const v = window.acpView;
  const canvas = document.getElementById('canvas');
  return {
    width: +canvas.dataset.width, span: +canvas.dataset.span, lanes: v.lanes(),
    items: v.drawn.map(d => { const it = v.model.items[d.i];
      return { i: d.i, kind: d.kind, session: d.session, x: d.x, y: d.y, wait: it.wait || null,
               state: it.state || null, segs: d.painted }; }),
  };
})()"#;

fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= SLACK
}

/// Checks the drawing against the trace; returns how many turns and waits it checked.
fn check_page(b: &mut Browser, session: &str, trace: &Path) -> (usize, usize) {
    let name = trace.display().to_string();
    let errors = b.errors();
    assert!(errors.is_empty(), "{name}: the page logged errors: {errors:#?}");
    let g = b.eval(session, GEOMETRY);
    let recs = records(trace);
    let end = recs.iter().map(|r| r.0).fold(0.0, f64::max);
    let (width, span) = (g["width"].as_f64().unwrap(), g["span"].as_f64().unwrap());
    assert!((span - end.max(1.0) * 1.02).abs() < 1e-6, "{name}: the axis spans the trace ({span} vs {end})");
    let px = |t: f64| t / span * width;
    let lanes = g["lanes"].as_array().unwrap();
    let items = g["items"].as_array().unwrap();
    let lane = |s: &str| lanes.iter().find(|l| l["session"] == s).unwrap_or_else(|| panic!("{name}: no lane for {s}"));

    let (mut turns, mut waits) = (0, 0);
    let mut wait_states: Vec<(String, String, f64, Vec<String>)> = Vec::new();
    for (t, _, dir, f) in &recs {
        let sid = f.pointer("/params/sessionId").and_then(Value::as_str);
        if (dir == "client->shim" || dir == "shim->client")
            && let Some(s) = sid
        {
            lane(s);
        }
        if dir == "shim->client" && f["method"] == "_coda/wait" {
            let (s, w) = (sid.unwrap().to_owned(), f["params"]["waitId"].as_str().unwrap().to_owned());
            let state = f["params"]["state"].as_str().unwrap().to_owned();
            match wait_states.iter_mut().find(|e| e.0 == s && e.1 == w) {
                Some(e) if e.3.last() != Some(&state) => e.3.push(state),
                Some(_) => {}
                None => wait_states.push((s.clone(), w, *t, vec![state])),
            }
            // A child lane starts where it was announced, under the lane that announced it.
            if let Some(child) = f.pointer("/params/childSessionId").and_then(Value::as_str) {
                let (c, p) = (lane(child), lane(&s));
                if c["parent"] == json!(s) && c["life"].as_f64().is_some_and(|l| near(l, px(*t))) {
                    assert!(c["top"].as_f64() > p["top"].as_f64(), "{name}: child lane {child} drawn above its parent");
                } else {
                    // Announced again (a resumed child): the lane keeps its first announcement.
                    assert_eq!(c["parent"], json!(s), "{name}: {child}");
                }
            }
        }
        if dir == "client->shim" && f["method"] == "session/prompt" {
            let answer =
                recs.iter().find(|r| r.2 == "shim->client" && r.3["id"] == f["id"] && r.3.get("method").is_none());
            let want_end = answer.map_or(end, |a| a.0);
            let found = items.iter().any(|i| {
                let x = &i["x"];
                i["kind"] == "turn"
                    && i["session"] == json!(sid.unwrap())
                    && near(x[0].as_f64().unwrap(), px(*t))
                    && (near(x[1].as_f64().unwrap(), px(want_end)) || px(want_end) - px(*t) < 8.0)
            });
            assert!(found, "{name}: no turn drawn from {t} ms to {want_end} ms");
            turns += 1;
        }
    }
    for (s, w, t, states) in &wait_states {
        let bar = items
            .iter()
            .find(|i| i["kind"] == "wait" && i["session"] == json!(s) && i["wait"] == json!(w))
            .unwrap_or_else(|| panic!("{name}: no bar for wait {w}"));
        assert!(near(bar["x"][0].as_f64().unwrap(), px(*t)), "{name}: wait {w} starts at {t} ms: {bar}");
        assert_eq!(bar["segs"], json!(states), "{name}: wait {w}");
        assert_eq!(bar["state"], json!(states.last().unwrap()), "{name}: wait {w}");
        waits += 1;
    }
    (turns, waits)
}

/// Where mark `i` is on screen once the page has brought it into view: the point to click (viewport px), what
/// covers that point, and the canvas's pixel there (RGBA).
fn place_of(b: &mut Browser, session: &str, i: u64) -> Value {
    b.eval(
        session,
        &format!(
            r#"(() => {{
          const v = window.acpView;
          v.scrollToItem({i});
          const d = v.drawn.find(d => d.i === {i});
          if (!d) return null;
          const view = document.getElementById('view').getBoundingClientRect();
          const sc = document.getElementById('scroll');
          const x = view.left + v.labels + Math.min((d.x[0] + d.x[1]) / 2, d.x[0] + 3) - sc.scrollLeft;
          const y = view.top + v.axis + d.y - sc.scrollTop + 11;
          const hit = document.elementFromPoint(x, y);
          const c = document.getElementById('canvas');
          const dpr = window.devicePixelRatio || 1;
          const px = c.getContext('2d').getImageData(Math.round((x - view.left) * dpr), Math.round((y - view.top) * dpr), 1, 1).data;
          return {{ x, y, over: hit && (hit.id || hit.tagName), pixel: [...px], kind: d.kind }};
        }})()"#
        ),
    )
}

/// The page's background colour as the canvas paints it.
fn background(b: &mut Browser, session: &str) -> Value {
    b.eval(
        session,
        r#"(() => { const c = document.createElement('canvas').getContext('2d');
          c.fillStyle = getComputedStyle(document.documentElement).getPropertyValue('--bg').trim();
          c.fillRect(0, 0, 1, 1); return [...c.getImageData(0, 0, 1, 1).data]; })()"#,
    )
}

/// Clicks at `(x, y)` with the mouse and waits until the detail panel has read the mark's frames; returns the
/// panel's heading, meta lines, first frame's head and JSON, and joined text.
fn click(b: &mut Browser, session: &str, x: &Value, y: &Value) -> Value {
    for kind in ["mousePressed", "mouseReleased"] {
        let ev = json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1});
        b.call(Some(session), "Input.dispatchMouseEvent", ev);
    }
    b.eval(
        session,
        r#"new Promise(r => { const d = document.getElementById('detail');
          const f = () => { if (d.hidden || !d.dataset.loaded) return setTimeout(f, 20);
            const fr = d.querySelector('.frame'); const j = d.querySelector('pre.joined');
            r({hidden: d.hidden, h2: d.querySelector('h2').textContent,
               meta: [...d.querySelectorAll('.meta')].map(m => m.textContent),
               frames: d.querySelectorAll('.frame').length,
               head: fr && fr.querySelector('.fh').textContent, json: fr && fr.querySelector('pre').textContent,
               joined: j && j.textContent}); };
          f(); })"#,
    )
}

/// Clicks the first wait bar (else the first turn) with the mouse; the frame shown is its first frame.
fn click_opens_the_frame(b: &mut Browser, session: &str, trace: &Path) {
    let name = trace.display().to_string();
    let g = b.eval(session, GEOMETRY);
    let items = g["items"].as_array().unwrap();
    let target = items
        .iter()
        .find(|i| i["kind"] == "wait")
        .or_else(|| items.iter().find(|i| i["kind"] == "turn"))
        .unwrap_or_else(|| panic!("{name}: neither a wait nor a turn drawn"))
        .clone();
    let place = place_of(b, session, target["i"].as_u64().unwrap());
    assert_eq!(place["over"], json!("space"), "{name}: the mark is under something else: {place}");
    let bg = background(b, session);
    assert_ne!(place["pixel"], bg, "{name}: nothing painted where the mark is: {place}");
    assert_eq!(b.eval(session, "document.getElementById('detail').hidden"), json!(true));
    let shown = click(b, session, &place["x"], &place["y"]);
    assert_eq!(shown["hidden"], json!(false), "{name}: the click opened nothing");
    let recs = records(trace);
    let first = if let Some(w) = target["wait"].as_str() {
        recs.iter().find(|r| r.2 == "shim->client" && r.3["params"]["waitId"] == w).unwrap()
    } else {
        recs.iter().find(|r| r.2 == "client->shim" && r.3["method"] == "session/prompt").unwrap()
    };
    let head = shown["head"].as_str().unwrap();
    assert!(head.contains(&format!("line {} ", first.1)), "{name}: shows {head}, not line {}", first.1);
    // The frame as formatted JSON: the same value as the trace's.
    let shown_json: Value = serde_json::from_str(shown["json"].as_str().unwrap()).unwrap();
    assert_eq!(shown_json, first.3, "{name}");
    assert!(shown["json"].as_str().unwrap().contains("\n  \""), "{name}: the JSON is formatted");
}

#[test]
fn pages_of_the_four_shims_traces_load_cleanly_and_draw_what_the_trace_says() {
    let Some(chromium) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut traces = Vec::new();
    // Real --trace-file output of each binary, replaying a fixture with waits and a child session.
    for (agent, fixture) in [
        ("kimi", "subagent-background"),
        ("grok", "bg-task-wakes"),
        ("opencode", "task-foreground"),
        ("codex", "subagent-completes"),
    ] {
        let out = dir.path().join(format!("{agent}-{fixture}"));
        std::fs::create_dir(&out).unwrap();
        let trace = out.join("trace.jsonl");
        let fixture = fixtures_root().join(agent).join(fixture);
        check_with_env(agent, &fixture, &[("CODA_SHIM_TRACE", trace.to_str().unwrap())])
            .unwrap_or_else(|e| panic!("replaying {}: {e}", fixture.display()));
        traces.push(trace);
    }
    // And a fixture as committed (relative times, the agent's files).
    traces.push(fixtures_root().join("grok/subagent-foreground-then-resumed/trace.jsonl"));

    let mut b = Browser::launch(&chromium);
    let mut total = (0, 0);
    for trace in &traces {
        let page = write_page(trace, dir.path());
        let session = open(&mut b, &page);
        let (turns, waits) = check_page(&mut b, &session, trace);
        assert!(turns > 0, "{}: no turn checked", trace.display());
        click_opens_the_frame(&mut b, &session, trace);
        let errors = b.errors();
        assert!(errors.is_empty(), "{}: errors after the click: {errors:#?}", trace.display());
        total = (total.0 + turns, total.1 + waits);
    }
    assert!(total.1 >= 4, "waits checked: {total:?}");
}

#[test]
fn a_hostile_trace_runs_no_script_of_its_own_and_lists_its_bad_lines() {
    let Some(chromium) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("hostile").join("trace.jsonl");
    std::fs::create_dir(trace.parent().unwrap()).unwrap();
    let evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)> 中文 🙂 \u{2028}";
    let prompt = json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s<b>1","prompt":[{"type":"text","text":evil}]}});
    let mut text = format!("{}\n", json!({"t": 0, "dir": "client->shim", "frame": prompt})).into_bytes();
    text.extend_from_slice(b"{\"t\":2,\"dir\":\"shim->client\",\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"sessionId\":\"s<b>1\",\"v\":\"\xff\"}}}\n");
    text.extend_from_slice(
        b"not json at all\n{\"t\":5,\"dir\":\"shim->client\",\"frame\":{\"jsonrpc\":\"2.0\",\"id\":1,\"res",
    );
    std::fs::write(&trace, &text).unwrap();
    let page = write_page(&trace, dir.path());
    let mut b = Browser::launch(&chromium);
    let session = open(&mut b, &page);
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");
    let seen = b.eval(
        &session,
        r#"(() => ({
          scripts: [...document.scripts].map(s => s.type || 'javascript'), imgs: document.images.length,
          bad: [...document.querySelectorAll('#bad li')].map(li => li.textContent),
          badShown: !document.getElementById('bad').hidden,
          lane: window.acpView.lanes().map(l => l.session),
          turn: window.acpView.drawn.find(d => d.kind === 'turn').i }))()"#,
    );
    let scripts = seen["scripts"].as_array().unwrap();
    assert_eq!(
        scripts.iter().filter(|t| !t.as_str().unwrap().starts_with("application/")).count(),
        1,
        "the page's own script and nothing else runs: {scripts:?}"
    );
    assert_eq!(seen["imgs"], json!(0));
    assert_eq!(seen["badShown"], json!(true));
    let bad = seen["bad"].as_array().unwrap();
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(bad[0].as_str().unwrap().starts_with("line 2: not valid UTF-8"), "{bad:?}");
    assert!(bad[1].as_str().unwrap().starts_with("line 3: not a record"), "{bad:?}");
    assert!(bad[2].as_str().unwrap().starts_with("line 4: cut short"), "{bad:?}");
    assert!(seen["lane"].as_array().unwrap().contains(&json!("s<b>1")));
    // The turn's prompt is text on the canvas and in the panel, never markup.
    let place = place_of(&mut b, &session, seen["turn"].as_u64().unwrap());
    let shown = click(&mut b, &session, &place["x"], &place["y"]);
    assert!(shown["h2"].as_str().unwrap().contains("</script><script>alert(1)</script>"), "{shown}");
    assert_eq!(
        b.eval(&session, "document.images.length + document.querySelectorAll('#detail script').length"),
        json!(0)
    );
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// A day-long trace (100,000 records: the fixtures over and over, streamed turns of 1,000 chunks among them):
/// the page shows the whole time axis at once, scrolls and zooms, and a streamed answer is one span whose click
/// opens the joined text. The times are printed (the figures docs/performance.md gives), not asserted.
#[test]
fn a_day_long_trace_opens_whole_and_a_streamed_answer_is_one_span() {
    let Some(chromium) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let trace_dir = dir.path().join("day");
    std::fs::create_dir(&trace_dir).unwrap();
    let trace = trace_dir.join("trace.jsonl");
    let made = big_trace::write(&trace, 100_000);
    let written = std::time::Instant::now();
    let page = write_page(&trace, dir.path());
    eprintln!(
        "big trace: {} records, {} bytes -> page of {} bytes in {:?} (this build)",
        made.records,
        made.bytes,
        std::fs::metadata(&page).unwrap().len(),
        written.elapsed()
    );
    let mut b = Browser::launch(&chromium);
    let opened = std::time::Instant::now();
    let session = open(&mut b, &page);
    let wall = opened.elapsed();
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");
    let first = b.eval(
        &session,
        r#"(() => { const v = window.acpView; const sc = document.getElementById('scroll');
          return { readyAt: v.readyAt, lastDraw: v.lastDraw, fit: sc.clientWidth, frames: v.model.frames,
                   items: v.model.items.length, end: v.model.end }; })()"#,
    );
    eprintln!(
        "big trace: first paint {:.0} ms after navigation started ({wall:?} from the test's navigate to ready), first draw {:.1} ms",
        first["readyAt"].as_f64().unwrap(),
        first["lastDraw"].as_f64().unwrap()
    );
    assert_eq!(first["frames"].as_u64().unwrap() as usize, made.records);

    // The whole time axis at first paint: the canvas is the view's width, and the marks drawn reach from the
    // start of the trace to its end.
    let g = b.eval(&session, GEOMETRY);
    let (width, span) = (g["width"].as_f64().unwrap(), g["span"].as_f64().unwrap());
    assert_eq!(width, first["fit"].as_f64().unwrap(), "fitted to the view");
    let end = first["end"].as_f64().unwrap();
    let px = |t: f64| t / span * width;
    let items = g["items"].as_array().unwrap();
    assert!(!items.is_empty());
    assert!(items.len() < first["items"].as_u64().unwrap() as usize / 4, "only what is on screen is drawn");
    let lo = items.iter().map(|i| i["x"][0].as_f64().unwrap()).fold(f64::MAX, f64::min);
    let hi = items.iter().map(|i| i["x"][1].as_f64().unwrap()).fold(0.0, f64::max);
    assert!(lo < px(end) * 0.02 && hi > px(end) * 0.95, "marks drawn from {lo} to {hi} px of {}", px(end));

    let times = b.eval(&session, big_trace::SCROLL_AND_ZOOM);
    for part in ["scroll", "zoom", "pan"] {
        eprintln!("big trace: {}", big_trace::percentiles(part, &times[part]));
    }
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");

    // The last lane with marks, scrolled to at the whole trace's zoom, is drawn.
    let last = b.eval(
        &session,
        r#"(() => { const v = window.acpView; const sc = document.getElementById('scroll');
          document.getElementById('zoom-fit').click();
          sc.scrollTop = sc.scrollHeight;
          const used = new Set(v.model.items.map(i => v.model.lanes[i.lane].session));
          return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => {
            const lanes = v.lanes().filter(l => used.has(l.session)); const s = lanes[lanes.length - 1].session;
            r({ session: s, drawn: v.drawn.filter(d => d.session === s).length }); }))); })()"#,
    );
    assert!(last["drawn"].as_u64().unwrap() > 0, "the last lane is drawn once scrolled to: {last}");

    // A streamed answer: one span of all its chunks; a click opens the joined text and its frames.
    let span_item = b.eval(
        &session,
        &format!(
            "window.acpView.model.items.findIndex(i => i.kind === 'text' && i.frames.length === {})",
            big_trace::STREAM_CHUNKS
        ),
    );
    let n = span_item.as_i64().unwrap();
    assert!(n >= 0, "no span of {} chunks", big_trace::STREAM_CHUNKS);
    let texts = b.eval(
        &session,
        &format!("window.acpView.model.items.filter(i => i.kind === 'text' && i.frames.length > 1 && i.frames.length < {}).length", big_trace::STREAM_CHUNKS),
    );
    assert!(texts.as_u64().is_some());
    let place = place_of(&mut b, &session, n as u64);
    assert_eq!(place["over"], json!("space"), "{place}");
    let shown = click(&mut b, &session, &place["x"], &place["y"]);
    assert_eq!(shown["joined"], json!(big_trace::streamed_text(big_trace::STREAM_CHUNKS)));
    let meta: Vec<&str> = shown["meta"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    assert!(meta.contains(&format!("{} chunks, joined", big_trace::STREAM_CHUNKS).as_str()), "{meta:?}");
    assert!(meta.iter().any(|m| m.starts_with("… and ")), "{meta:?}");
    assert_eq!(shown["frames"], json!(40), "the first frames of the span are shown");
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// `acp-replay diff --html`: the viewer's page of both sides loads cleanly, each session's A lane right above
/// its B lane, every frame of no session in its side's own connection lane, and a click on a difference mark
/// shows both frames.
#[test]
fn the_diff_page_draws_both_sides_lanes_in_pairs() {
    let Some(chromium) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("diff.html");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_acp-replay"))
        .arg("diff")
        .arg(fixtures_root().join("kimi/subagent-background"))
        .arg("--html")
        .arg(&page)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1), "the shim changed frames");
    let mut b = Browser::launch(&chromium);
    let session = open(&mut b, &page);
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");
    let g = b.eval(&session, GEOMETRY);
    let lanes: Vec<&str> = g["lanes"].as_array().unwrap().iter().map(|l| l["session"].as_str().unwrap()).collect();
    assert_eq!(&lanes[..2], ["A · connection", "B · connection"], "{lanes:?}");
    let sid = "session_53ac1cc7-a747-4b71-a688-52409262cdcf";
    let a = lanes.iter().position(|l| *l == format!("A · {sid}")).unwrap();
    assert_eq!(lanes[a + 1], format!("B · {sid}"), "{lanes:?}");
    let items = g["items"].as_array().unwrap();
    let inits: Vec<&str> = items
        .iter()
        .filter(|i| i["kind"] == "request" && i["session"].as_str().unwrap().ends_with("connection"))
        .map(|i| i["session"].as_str().unwrap())
        .collect();
    assert!(inits.contains(&"A · connection") && inits.contains(&"B · connection"), "{inits:?}");
    let mark = items.iter().find(|i| i["kind"] == "shim" && i["state"] == "differs").expect("a difference mark");
    let place = place_of(&mut b, &session, mark["i"].as_u64().unwrap());
    let shown = click(&mut b, &session, &place["x"], &place["y"]);
    assert!(shown["h2"].as_str().unwrap().contains("differs"), "{shown}");
    assert_eq!(shown["frames"], json!(2), "both sides' frames: {shown}");
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// A compaction and the usage facts in the page: the compaction's span and each usage mark are drawn on the
/// session's lane; hovering a usage mark names its facts, clicking it shows them, clicking the compaction
/// shows how it ended.
#[test]
fn a_compaction_and_the_usage_facts_show_on_hover_and_click() {
    let Some(chromium) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let trace = fixtures_root().join("codex/compact-between-turns/trace.jsonl");
    let page = write_page(&trace, dir.path());
    let mut b = Browser::launch(&chromium);
    let session = open(&mut b, &page);
    let (turns, _) = check_page(&mut b, &session, &trace);
    assert_eq!(turns, 3);
    let model = b.eval(
        &session,
        "window.acpView.model.items.map((it, i) => ({i, kind: it.kind, state: it.state || '', method: it.method}))",
    );
    let items = model.as_array().unwrap();
    let first = |kind: &str, method: &str| {
        items.iter().find(|i| i["kind"] == kind && i["method"] == method).unwrap_or_else(|| panic!("no {kind}")).clone()
    };
    // Hover: the page's tooltip names the facts. Zoomed in, so that a usage mark is not on the pixel of the
    // update next to it.
    b.eval(&session, "window.acpView.zoom(40, 0)");
    let usage = first("usage", "session/update");
    let place = place_of(&mut b, &session, usage["i"].as_u64().unwrap());
    assert_eq!(place["kind"], "usage", "{place}");
    let ev = json!({"type": "mouseMoved", "x": place["x"], "y": place["y"]});
    b.call(Some(&session), "Input.dispatchMouseEvent", ev);
    let title = b.eval(&session, "document.getElementById('scroll').title");
    let title = title.as_str().unwrap();
    assert!(title.starts_with("usage · contextTokens ") && title.contains("lastRequestAt "), "{title}");
    // Click: the facts as JSON in the detail.
    let shown = click(&mut b, &session, &place["x"], &place["y"]);
    assert!(shown["h2"].as_str().unwrap().starts_with("usage"), "{shown}");
    let facts = b.eval(&session, "document.querySelector('#detail-body > pre').textContent");
    let facts: Value = serde_json::from_str(facts.as_str().unwrap()).unwrap();
    assert!(facts["contextTokens"].is_u64() && facts["lastRequestAt"].is_string(), "{facts}");
    // The agent's compaction: completed, on the same lane.
    let compaction = first("compact", "session/update");
    let place = place_of(&mut b, &session, compaction["i"].as_u64().unwrap());
    assert_eq!(place["kind"], "compact", "{place}");
    let shown = click(&mut b, &session, &place["x"], &place["y"]);
    assert_eq!(shown["h2"], "compact · completed: compaction", "{shown}");
    // Coda's request: compacted, before → after.
    let asked = first("compact", "_coda/session/compact");
    assert_eq!(asked["state"], "compacted");
    let errors = b.errors();
    assert!(errors.is_empty(), "{errors:#?}");
}

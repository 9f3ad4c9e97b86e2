//! `acp-replay diff --html`: the viewer's page with both sides, each session's lane of A right above its lane
//! of B, and a red mark in the `shim` row for each frame that differs or is on one side only.

use std::io::{self, Write};

use serde_json::Value;

use super::align::{Change, Report};
use super::side::{Frame, Side};
use crate::replay::view::Builder;
use crate::replay::view::html;
use crate::replay::view::read::{Dir, Line, Record};

fn lane_name(side: &str, session: &str) -> String {
    if session.is_empty() { format!("{side} · connection") } else { format!("{side} · {session}") }
}

/// The frame as the page's model reads it: its session ids put in the side's lanes.
fn record(f: &Frame, side: &str) -> Record {
    let mut frame = f.frame.clone();
    for ptr in ["/params/sessionId", "/result/sessionId", "/params/childSessionId"] {
        if let Some(Value::String(s)) = frame.pointer_mut(ptr) {
            *s = lane_name(side, s);
        }
    }
    // Frames of no session: in the side's own connection lane.
    if frame.get("method").is_some() && frame.pointer("/params/sessionId").is_none() {
        if !frame.get("params").is_some_and(Value::is_object) {
            frame["params"] = Value::Object(Default::default());
        }
        frame["params"]["sessionId"] = Value::String(lane_name(side, ""));
    }
    let dir = if f.sent { Dir::ClientToShim } else { Dir::ShimToClient };
    Record { line: f.line, t: f.t, dir, shim: false, raw: f.raw.clone(), frame: Some(frame), not_json: false }
}

/// Writes the page.
pub fn write(out: &mut impl Write, report: &Report, a: &Side, b: &Side, title: &str) -> io::Result<()> {
    let mut builder = Builder::without_links();
    // Lanes in pairs: A's then B's of each session; frames of no session in each side's connection lane.
    for (sa, sb) in &report.sessions {
        if let Some(s) = sa {
            builder.lane_for(&lane_name("A", s));
        }
        if let Some(s) = sb {
            builder.lane_for(&lane_name("B", s));
        }
    }
    let mut records = Vec::with_capacity(a.frames.len() + b.frames.len());
    for (side, name) in [(a, "A"), (b, "B")] {
        for f in &side.frames {
            let rec = record(f, name);
            builder.push(Line::Record(record(f, name)));
            records.push(rec);
        }
        builder.next_trace();
    }
    let off = a.frames.len();
    let session_of = |side: &str, f: &Frame, s: usize| {
        let sid = report.sessions[s].0.as_deref().filter(|_| side == "A");
        let sid = sid.or(report.sessions[s].1.as_deref().filter(|_| side == "B"));
        lane_name(side, sid.or(f.session()).unwrap_or_default())
    };
    // A frame on both sides: a mark in each lane, both frames in each.
    let pair = |builder: &mut Builder, session: usize, i: usize, j: usize, what: &str, text: String| {
        let (fa, fb) = (&a.frames[i], &b.frames[j]);
        let label = format!("{what}: {}", fa.label());
        let frames = [i, off + j];
        builder.add_mark(&session_of("A", fa, session), &frames, fa.t, label.clone(), what, text.clone());
        builder.add_mark(&session_of("B", fb, session), &frames, fb.t, label, what, text);
    };
    for t in &report.turns {
        for c in &t.changes {
            match c {
                Change::OnlyA(i) => {
                    let f = &a.frames[*i];
                    let label = format!("only in A: {}", f.label());
                    builder.add_mark(&session_of("A", f, t.session), &[*i], f.t, label, "only in A", String::new());
                }
                Change::OnlyB(j) => {
                    let f = &b.frames[*j];
                    let label = format!("only in B: {}", f.label());
                    builder.add_mark(
                        &session_of("B", f, t.session),
                        &[off + j],
                        f.t,
                        label,
                        "only in B",
                        String::new(),
                    );
                }
                Change::Moved(i, j) => pair(&mut builder, t.session, *i, *j, "moved", String::new()),
                Change::Differs(i, j, lines) => pair(&mut builder, t.session, *i, *j, "differs", lines.join("\n")),
            }
        }
    }
    let model = builder.finish(a.clock);
    html::write_model(out, &model, records.iter(), title)?;
    Ok(())
}

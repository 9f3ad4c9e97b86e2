//! The text `acp-replay diff` prints: per session and turn, each frame that differs or is on one side only,
//! what differs in it, and how long the turn took on each side.

use std::fmt::Write;

use super::align::{Change, Report};
use super::side::Side;

fn secs(ms: f64) -> String {
    if ms.abs() < 1000.0 { format!("{ms:.0} ms") } else { format!("{:.3} s", ms / 1000.0) }
}

/// The report as text; `a_name` and `b_name` say what each side is.
pub fn text(report: &Report, a: &Side, b: &Side, a_name: &str, b_name: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A: {a_name} ({} frames)", a.frames.len());
    let _ = writeln!(out, "B: {b_name} ({} frames)", b.frames.len());
    for (side, bad) in [("A", &a.bad), ("B", &b.bad)] {
        for l in bad {
            let _ = writeln!(out, "{side}: line {} not read: {}", l.line, l.reason);
        }
    }
    let mut last_session = usize::MAX;
    let mut alike = 0;
    for t in &report.turns {
        alike += t.same;
        if t.session != last_session {
            last_session = t.session;
            let (sa, sb) = &report.sessions[t.session];
            let name = |s: &Option<String>| match s.as_deref() {
                Some("") => "(no session)".to_owned(),
                Some(s) => s.to_owned(),
                None => "(none)".to_owned(),
            };
            if t.session == 0 {
                let _ = writeln!(out, "connection (frames of no session)");
            } else {
                let _ = writeln!(out, "session {}: A {} · B {}", t.session, name(sa), name(sb));
            }
        }
        let head =
            if t.turn == 0 { "before the first prompt".to_owned() } else { format!("turn {} {:?}", t.turn, t.label) };
        let timing = match (t.a, t.b) {
            (Some((_, da)), Some((_, db))) if t.turn > 0 => {
                format!(": A {}, B {} ({}{})", secs(da), secs(db), if db >= da { "+" } else { "" }, secs(db - da))
            }
            (Some(_), None) => ": only in A".to_owned(),
            (None, Some(_)) => ": only in B".to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(out, "  {head}{timing}; {} alike, {} not", t.same, t.changes.len());
        for c in &t.changes {
            match c {
                Change::OnlyA(i) => {
                    let f = &a.frames[*i];
                    let _ = writeln!(out, "    only A  line {}: {}", f.line, f.label());
                }
                Change::OnlyB(j) => {
                    let f = &b.frames[*j];
                    let _ = writeln!(out, "    only B  line {}: {}", f.line, f.label());
                }
                Change::Moved(i, j) => {
                    let (fa, fb) = (&a.frames[*i], &b.frames[*j]);
                    let _ = writeln!(
                        out,
                        "    moved   A line {}, B line {}: {} (alike, at another place)",
                        fa.line,
                        fb.line,
                        fa.label()
                    );
                }
                Change::Differs(i, j, lines) => {
                    let (fa, fb) = (&a.frames[*i], &b.frames[*j]);
                    let _ = writeln!(out, "    differs A line {}, B line {}: {}", fa.line, fb.line, fa.label());
                    for l in lines {
                        let _ = writeln!(out, "              {l}");
                    }
                }
            }
        }
    }
    let (d, oa, ob, mv) = report.counts();
    let _ = writeln!(out, "{alike} frames alike, {d} differ, {oa} only in A, {ob} only in B, {mv} moved");
    out
}

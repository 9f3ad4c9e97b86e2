//! Putting two sides side by side: sessions in the order they appear, turns (a `session/prompt` sent starts
//! the next) within each, and the frames of a turn aligned by what they are (direction, method, update kind),
//! then compared in their normalised form.

use crate::HashMap;

use serde_json::Value;

use super::side::{Frame, Side};
use crate::replay::view::changes;

/// What differs between the two sides at one place.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A frame (index in side A's frames) that B has not.
    OnlyA(usize),
    OnlyB(usize),
    /// Frames of the same kind at the same place, different once ids, times and paths are taken out; what
    /// differs, one line per place.
    Differs(usize, usize, Vec<String>),
    /// The same frame on both sides, at another place among the others of its turn (held back or sent early).
    Moved(usize, usize),
}

/// One turn of one session on both sides.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Index in [`Report::sessions`].
    pub session: usize,
    /// 0: before the first prompt; n: from the n-th `session/prompt` sent.
    pub turn: usize,
    /// The first line of the prompt (of side A, else B).
    pub label: String,
    /// Start (ms since the trace's first record) and length of the turn on each side: from the prompt to its
    /// answer (turn 0: from its first frame to its last).
    pub a: Option<(f64, f64)>,
    pub b: Option<(f64, f64)>,
    /// Frames alike on both sides.
    pub same: usize,
    pub changes: Vec<Change>,
}

/// Two sides compared.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Each session's id on side A and on side B (the connection, frames of no session, first: `("", "")`).
    pub sessions: Vec<(Option<String>, Option<String>)>,
    pub turns: Vec<Turn>,
}

impl Report {
    /// Whether any frame differs or is on one side only.
    pub fn differs(&self) -> bool {
        self.turns.iter().any(|t| !t.changes.is_empty())
    }

    /// Counts: frames that differ, only in A, only in B, moved.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for ch in self.turns.iter().flat_map(|t| &t.changes) {
            match ch {
                Change::Differs(..) => c.0 += 1,
                Change::OnlyA(_) => c.1 += 1,
                Change::OnlyB(_) => c.2 += 1,
                Change::Moved(..) => c.3 += 1,
            }
        }
        c
    }
}

/// Each frame's place: (session index on its side, turn).
fn places(side: &Side) -> (Vec<String>, Vec<(usize, usize)>) {
    let mut sessions: Vec<String> = vec![String::new()];
    let mut index: HashMap<String, usize> = HashMap::default();
    let mut turn: HashMap<usize, usize> = HashMap::default();
    // Requests by id (as text) and who sent them → the session they were of.
    let mut asked: HashMap<(bool, String), usize> = HashMap::default();
    let mut out = Vec::with_capacity(side.frames.len());
    for f in &side.frames {
        let id = f.frame.get("id").map(Value::to_string);
        let mut s = match f.session() {
            Some(sid) => *index.entry(sid.to_owned()).or_insert_with(|| {
                sessions.push(sid.to_owned());
                sessions.len() - 1
            }),
            None => 0,
        };
        if f.method().is_empty() {
            // An answer: in the session of its request (sent by the other peer).
            if let Some(id) = &id
                && let Some(&r) = asked.get(&(!f.sent, id.clone()))
            {
                s = r;
            }
        } else if let Some(id) = id {
            asked.insert((f.sent, id), s);
        }
        if let Some(sid) = f.frame.pointer("/result/sessionId").and_then(Value::as_str)
            && !index.contains_key(sid)
        {
            index.insert(sid.to_owned(), sessions.len());
            sessions.push(sid.to_owned());
        }
        if f.sent && f.method() == "session/prompt" {
            *turn.entry(s).or_default() += 1;
        }
        out.push((s, turn.get(&s).copied().unwrap_or(0)));
    }
    (sessions, out)
}

/// Cells of the aligning table above which a greedy alignment is used instead.
const MAX_CELLS: usize = 4_000_000;

/// Longest common subsequence of the keys: pairs `(i, j)` in order.
fn lcs(a: &[String], b: &[String]) -> Vec<(usize, usize)> {
    if a.len().saturating_mul(b.len()) > MAX_CELLS {
        return greedy(a, b);
    }
    let (n, m) = (a.len(), b.len());
    let mut t = vec![0u32; (n + 1) * (m + 1)];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            t[i * (m + 1) + j] = if a[i] == b[j] {
                t[(i + 1) * (m + 1) + j + 1] + 1
            } else {
                t[(i + 1) * (m + 1) + j].max(t[i * (m + 1) + j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n && j < m {
        if a[i] == b[j] {
            out.push((i, j));
            i += 1;
            j += 1;
        } else if t[(i + 1) * (m + 1) + j] >= t[i * (m + 1) + j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// For very long turns: walk both, skipping on one side to the nearest frame of the other's kind.
fn greedy(a: &[String], b: &[String]) -> Vec<(usize, usize)> {
    const LOOK: usize = 64;
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            out.push((i, j));
            i += 1;
            j += 1;
            continue;
        }
        let in_b = b[j..(j + LOOK).min(b.len())].iter().position(|k| *k == a[i]);
        let in_a = a[i..(i + LOOK).min(a.len())].iter().position(|k| *k == b[j]);
        match (in_a, in_b) {
            (Some(x), Some(y)) if x <= y => i += x,
            (_, Some(y)) => j += y,
            (Some(x), None) => i += x,
            (None, None) => {
                i += 1;
                j += 1;
            }
        }
    }
    out
}

fn prompt_label(f: &Frame) -> String {
    let text: String = match f.frame.pointer("/params/prompt") {
        Some(Value::Array(blocks)) => {
            blocks.iter().filter_map(|b| b.get("text")?.as_str()).collect::<Vec<_>>().join(" ")
        }
        _ => String::new(),
    };
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
    let mut out: String = line.chars().take(60).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

/// When a turn started and how long it took on one side.
fn timing(side: &Side, idx: &[usize], turn: usize) -> Option<(f64, f64)> {
    let first = side.frames.get(*idx.first()?)?;
    if turn == 0 {
        let last = &side.frames[*idx.last()?];
        return Some((first.t, last.t - first.t));
    }
    let prompt = idx.iter().map(|&i| &side.frames[i]).find(|f| f.sent && f.method() == "session/prompt")?;
    let id = prompt.frame.get("id");
    let end = idx
        .iter()
        .map(|&i| &side.frames[i])
        .find(|f| !f.sent && f.method().is_empty() && f.frame.get("id") == id)
        .map_or_else(|| side.frames[*idx.last().unwrap_or(&0)].t, |f| f.t);
    Some((prompt.t, end - prompt.t))
}

/// Frames on one side only whose twin is on the other side only too: the same frame at another place.
fn moved(changes: &mut Vec<Change>, a: &Side, b: &Side) {
    let mut k = 0;
    while k < changes.len() {
        if let Change::OnlyA(i) = changes[k] {
            let twin =
                changes.iter().position(|c| matches!(c, Change::OnlyB(j) if b.frames[*j].norm == a.frames[i].norm));
            if let Some(t) = twin {
                let Change::OnlyB(j) = changes.remove(t) else { unreachable!() };
                let k2 = if t < k { k - 1 } else { k };
                changes[k2] = Change::Moved(i, j);
                k = k2;
            }
        }
        k += 1;
    }
}

/// Compares side `a` with side `b`.
pub fn compare(a: &Side, b: &Side) -> Report {
    let (sa, pa) = places(a);
    let (sb, pb) = places(b);
    let mut report = Report::default();
    let n = sa.len().max(sb.len());
    for k in 0..n {
        report.sessions.push((sa.get(k).cloned(), sb.get(k).cloned()));
    }
    // Frames by (session, turn), in order.
    let mut groups: std::collections::BTreeMap<(usize, usize), (Vec<usize>, Vec<usize>)> = Default::default();
    for (i, p) in pa.iter().enumerate() {
        groups.entry(*p).or_default().0.push(i);
    }
    for (j, p) in pb.iter().enumerate() {
        groups.entry(*p).or_default().1.push(j);
    }
    for ((session, turn), (ia, ib)) in groups {
        let ka: Vec<String> = ia.iter().map(|&i| a.frames[i].key()).collect();
        let kb: Vec<String> = ib.iter().map(|&j| b.frames[j].key()).collect();
        let pairs = lcs(&ka, &kb);
        let mut changes = Vec::new();
        let mut same = 0;
        let (mut x, mut y) = (0, 0);
        for &(pi, pj) in pairs.iter().chain(std::iter::once(&(ia.len(), ib.len()))) {
            // Unpaired frames before the pair, in the order of their times.
            let mut lone: Vec<(f64, Change)> = Vec::new();
            lone.extend(ia[x..pi].iter().map(|&i| (a.frames[i].t, Change::OnlyA(i))));
            lone.extend(ib[y..pj].iter().map(|&j| (b.frames[j].t, Change::OnlyB(j))));
            lone.sort_by(|p, q| p.0.total_cmp(&q.0));
            changes.extend(lone.into_iter().map(|(_, c)| c));
            if pi < ia.len() && pj < ib.len() {
                let (i, j) = (ia[pi], ib[pj]);
                let (fa, fb) = (&a.frames[i], &b.frames[j]);
                if fa.norm == fb.norm {
                    same += 1;
                } else {
                    changes.push(Change::Differs(i, j, changes::diff(&fa.norm, &fb.norm)));
                }
            }
            (x, y) = (pi + 1, pj + 1);
        }
        moved(&mut changes, a, b);
        let label = [(&ia, a), (&ib, b)]
            .iter()
            .flat_map(|(idx, side)| idx.iter().map(move |&i| &side.frames[i]))
            .find(|f| f.sent && f.method() == "session/prompt")
            .map(prompt_label)
            .unwrap_or_default();
        report.turns.push(Turn {
            session,
            turn,
            label,
            a: timing(a, &ia, turn),
            b: timing(b, &ib, turn),
            same,
            changes,
        });
    }
    report
}

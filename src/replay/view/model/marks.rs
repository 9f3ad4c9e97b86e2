//! Marks in a lane's `shim` row: a frame the shim edited, made, or did not pass on (from the linker,
//! [`super::super::changes`]), and a difference `acp-replay diff` found ([`Builder::add_mark`]).

use serde_json::Value;

use super::super::changes::{Fate, Found};
use super::super::read::{Dir, Record};
use super::{Builder, Changed, Kind, str_at};

impl Builder {
    /// A mark for a frame the shim edited, made, or did not pass on, in the lane's `shim` row.
    pub(super) fn shim_mark(&mut self, found: Found, current: Option<&Record>) {
        let (i, pair, what, dir, t, frame, changes) = match found {
            Found::Edited { out, inp, changes } => {
                self.changed.push(Changed(inp, Fate::Edited.code(), out as i64, changes.clone()));
                self.changed.push(Changed(out, Fate::Edited.code(), inp as i64, changes.clone()));
                let Some(rec) = current else { return };
                if !matches!(rec.dir, Dir::ShimToAgent | Dir::ShimToClient) {
                    return;
                }
                (out, Some(inp), "edited", rec.dir, rec.t, rec.frame.as_ref(), changes)
            }
            Found::Made { out } => {
                self.changed.push(Changed(out, Fate::Made.code(), -1, Vec::new()));
                let Some(rec) = current else { return };
                if rec.frame.as_ref().and_then(|f| str_at(f, &["method"])) == Some("_coda/wait") {
                    return;
                }
                (out, None, "made by the shim", rec.dir, rec.t, rec.frame.as_ref(), Vec::new())
            }
            Found::NotPassed { inp, dir, t, frame } => {
                self.changed.push(Changed(inp, Fate::NotPassed.code(), -1, Vec::new()));
                self.not_passed_mark(inp, dir, t, frame.as_ref());
                return;
            }
        };
        self.mark(i, pair, what, dir, t, frame, changes);
    }

    fn not_passed_mark(&mut self, i: usize, dir: Dir, t: f64, frame: Option<&Value>) {
        self.mark(i, None, "not passed on", dir, t, frame, Vec::new());
    }

    #[allow(clippy::too_many_arguments)]
    fn mark(
        &mut self,
        i: usize,
        pair: Option<usize>,
        what: &str,
        dir: Dir,
        t: f64,
        frame: Option<&Value>,
        changes: Vec<String>,
    ) {
        let Some(frame) = frame else { return };
        let method = str_at(frame, &["method"]).unwrap_or_default().to_owned();
        if let Some(it) = self.item_of(i).or_else(|| pair.and_then(|p| self.item_of(p))) {
            self.items[it].changed = true;
        }
        let lane = str_at(frame, &["params", "sessionId"])
            .and_then(|s| self.lane_of.get(s).copied())
            .or_else(|| self.item_of(i).map(|it| self.items[it].lane))
            .or_else(|| pair.and_then(|p| self.item_of(p)).map(|it| self.items[it].lane))
            .unwrap_or(0);
        let name = if method.is_empty() { "answer" } else { method.as_str() };
        let label = format!("{what}: {name} ({})", dir.as_str());
        // The mark is not the record's own item: it must not take over `item_of` (or end a text span).
        let keep = self.item_of[i];
        let last_text = self.last_text.get(&lane).copied();
        let it = self.add(lane, Kind::Shim, i, t, label, &method);
        self.item_of[i] = keep;
        if let Some(l) = last_text {
            self.last_text.insert(lane, l);
        }
        self.items[it].state = what.to_owned();
        self.items[it].text = changes.join("\n");
        if let Some(p) = pair {
            self.items[it].frames.insert(0, p as u32);
        }
    }

    /// A mark of `kind` in `session`'s lane (made now when it is new) at `t`, for frames `frames` (record
    /// indexes), in the lane's `shim` row: a difference `acp-replay diff` found.
    pub fn add_mark(&mut self, session: &str, frames: &[usize], t: f64, label: String, state: &str, text: String) {
        let Some(&first) = frames.first() else { return };
        let lane = self.lane(session, t);
        let keep = self.item_of.get(first).copied();
        let last_text = self.last_text.get(&lane).copied();
        let it = self.add(lane, Kind::Shim, first, t, label, "");
        if let Some(k) = keep {
            self.item_of[first] = k;
        }
        if let Some(l) = last_text {
            self.last_text.insert(lane, l);
        }
        self.items[it].state = state.to_owned();
        self.items[it].text = text;
        self.items[it].red = true;
        self.items[it].frames = frames.iter().map(|&f| f as u32).collect();
        for &f in frames {
            if let Some(other) = self.item_of(f) {
                self.items[other].changed = true;
            }
        }
    }
}

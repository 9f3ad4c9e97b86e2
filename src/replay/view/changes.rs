//! Which frames the shim passed on as they came, which it edited (and what changed), which it made itself.
//!
//! The trace records both sides of the shim: what a peer sent (`client->shim`, `agent->shim`) and what the other
//! peer got (`shim->agent`, `shim->client`, with `shim: true` on frames the shim made or edited). A frame passed
//! on untouched appears twice with the same bytes; an edited one is paired with the frame it came from by its
//! method and session (a request or notification) or its id (an answer), searching back from the newest.

use crate::HashMap;
use std::collections::VecDeque;

use serde_json::Value;

use super::read::{Dir, Record};

/// What became of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Passed on unchanged (`pair` is the other copy), or nothing to say (files, lines).
    Passed,
    /// Edited by the shim: `pair` is the other version.
    Edited,
    /// Made by the shim, from no frame of the other side.
    Made,
    /// A peer's frame that did not reach the other peer as it came (held, dropped, or merged into one the
    /// shim made).
    NotPassed,
}

impl Fate {
    pub fn code(self) -> u8 {
        match self {
            Fate::Passed => 0,
            Fate::Edited => 1,
            Fate::Made => 2,
            Fate::NotPassed => 3,
        }
    }
}

/// A frame's fate, its other version and the differences between the two.
#[derive(Debug, Clone)]
pub struct Link {
    pub fate: Fate,
    pub pair: Option<usize>,
    pub changes: Vec<String>,
}

/// How far back an edited frame's origin is looked for.
const SEARCH_BACK: usize = 500;
/// Unmatched frames kept per side: only the newest [`SEARCH_BACK`] are searched for an edited frame's origin,
/// and a frame passed on as it came is found by its bytes among these.
const KEPT: usize = 4 * SEARCH_BACK;
/// Differences listed per edited frame.
const MAX_CHANGES: usize = 40;

/// Which side a direction carries frames from: 0 the client's, 1 the agent's.
fn side(dir: Dir) -> Option<(usize, bool)> {
    match dir {
        Dir::ClientToShim => Some((0, true)),
        Dir::ShimToAgent => Some((0, false)),
        Dir::AgentToShim => Some((1, true)),
        Dir::ShimToClient => Some((1, false)),
        Dir::AgentToFile | Dir::Shim => None,
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// Could `out` be an edited `inp`?
fn same_frame(inp: &Value, out: &Value) -> bool {
    match (inp.get("method"), out.get("method")) {
        (Some(a), Some(b)) => {
            a == b
                && str_at(inp, &["params", "sessionId"]) == str_at(out, &["params", "sessionId"])
                && str_at(inp, &["params", "update", "sessionUpdate"])
                    == str_at(out, &["params", "update", "sessionUpdate"])
                && (inp.get("id").is_none() == out.get("id").is_none())
        }
        (None, None) => inp.get("id").is_some() && inp.get("id") == out.get("id"),
        _ => false,
    }
}

/// What the linker found out about a frame, as soon as it knows.
#[derive(Debug, Clone)]
pub enum Found {
    /// `out` is `inp` edited by the shim.
    Edited { out: usize, inp: usize, changes: Vec<String> },
    /// `out` was made by the shim.
    Made { out: usize },
    /// `inp` did not reach the other peer as it came; `frame` is the frame.
    NotPassed { inp: usize, dir: Dir, t: f64, frame: Option<Value> },
}

/// A peer's frame not yet matched with what the shim passed on.
struct Waiting {
    i: usize,
    raw: String,
    frame: Option<Value>,
    dir: Dir,
    t: f64,
}

/// Links frames to their other version one record at a time, keeping only the newest unmatched frames of
/// each side (`KEPT`); a frame that falls out of that window unmatched was not passed on.
#[derive(Default)]
pub struct Linker {
    /// Per side: unmatched incoming frames, oldest first (`None`: matched since).
    open: [VecDeque<Option<Waiting>>; 2],
    /// Index in the global numbering of `open[s][0]`.
    base: [usize; 2],
    /// Per side: raw text → positions (global numbering of `open`) of unmatched frames with those bytes.
    exact: [HashMap<String, VecDeque<usize>>; 2],
    next: [usize; 2],
    /// Unmatched entries still in `open[s]`.
    live: [usize; 2],
}

impl Linker {
    /// Takes the next record (index `i` in the trace) and returns what it settles.
    pub fn push(&mut self, i: usize, rec: &Record) -> Vec<Found> {
        let mut found = Vec::new();
        let Some((s, incoming)) = side(rec.dir) else { return found };
        if rec.not_json {
            return found;
        }
        if incoming {
            let pos = self.next[s];
            self.next[s] += 1;
            self.exact[s].entry(rec.raw.clone()).or_default().push_back(pos);
            self.open[s].push_back(Some(Waiting {
                i,
                raw: rec.raw.clone(),
                frame: rec.frame.clone(),
                dir: rec.dir,
                t: rec.t,
            }));
            self.live[s] += 1;
            while self.live[s] > KEPT {
                if let Some(w) = self.pop_oldest(s) {
                    found.push(Found::NotPassed { inp: w.i, dir: w.dir, t: w.t, frame: w.frame });
                }
            }
            self.trim(s);
            return found;
        }
        if !rec.shim
            && let Some(queue) = self.exact[s].get_mut(rec.raw.as_str())
        {
            let pos = queue.pop_front();
            if queue.is_empty() {
                self.exact[s].remove(rec.raw.as_str());
            }
            if let Some(pos) = pos {
                self.take(s, pos);
                self.trim(s);
                return found;
            }
        }
        let origin = rec.frame.as_ref().and_then(|out| {
            let base = self.base[s];
            self.open[s]
                .iter()
                .enumerate()
                .rev()
                .filter_map(|(k, w)| w.as_ref().map(|w| (base + k, w)))
                .take(SEARCH_BACK)
                .find(|(_, w)| w.frame.as_ref().is_some_and(|inp| same_frame(inp, out)))
                .map(|(pos, _)| pos)
        });
        match origin {
            Some(pos) => {
                let w = self.take(s, pos).expect("a live entry");
                if let Some(q) = self.exact[s].get_mut(w.raw.as_str()) {
                    q.retain(|&p| p != pos);
                    if q.is_empty() {
                        self.exact[s].remove(w.raw.as_str());
                    }
                }
                let changes = match (&w.frame, &rec.frame) {
                    (Some(a), Some(b)) => diff(a, b),
                    _ => Vec::new(),
                };
                found.push(Found::Edited { out: i, inp: w.i, changes });
            }
            None => found.push(Found::Made { out: i }),
        }
        self.trim(s);
        found
    }

    /// The frames still unmatched at the end of the trace: none of them was passed on.
    pub fn finish(mut self) -> Vec<Found> {
        let mut found = Vec::new();
        for s in 0..2 {
            while let Some(entry) = self.open[s].pop_front() {
                if let Some(w) = entry {
                    found.push(Found::NotPassed { inp: w.i, dir: w.dir, t: w.t, frame: w.frame });
                }
            }
        }
        found.sort_by_key(|f| match f {
            Found::NotPassed { inp, .. } => *inp,
            _ => 0,
        });
        found
    }

    /// Takes the entry at `pos` out of the window (matched).
    fn take(&mut self, s: usize, pos: usize) -> Option<Waiting> {
        let k = pos.checked_sub(self.base[s])?;
        let w = self.open[s].get_mut(k)?.take();
        if w.is_some() {
            self.live[s] -= 1;
        }
        w
    }

    fn pop_oldest(&mut self, s: usize) -> Option<Waiting> {
        loop {
            let entry = self.open[s].pop_front()?;
            let pos = self.base[s];
            self.base[s] += 1;
            if let Some(w) = entry {
                self.live[s] -= 1;
                if let Some(q) = self.exact[s].get_mut(w.raw.as_str()) {
                    q.retain(|&p| p != pos);
                    if q.is_empty() {
                        self.exact[s].remove(w.raw.as_str());
                    }
                }
                return Some(w);
            }
        }
    }

    /// Drops matched entries at the front of the window.
    fn trim(&mut self, s: usize) {
        while matches!(self.open[s].front(), Some(None)) {
            self.open[s].pop_front();
            self.base[s] += 1;
        }
    }
}

/// Links every record of a trace read whole to its other version.
pub fn link(records: &[Record]) -> Vec<Link> {
    let mut links = vec![Link { fate: Fate::Passed, pair: None, changes: Vec::new() }; records.len()];
    let mut linker = Linker::default();
    let mut all = Vec::new();
    for (i, rec) in records.iter().enumerate() {
        all.extend(linker.push(i, rec));
    }
    all.extend(linker.finish());
    apply(&mut links, all);
    // Frames passed on as they came: paired by their bytes, in order.
    pair_passed(records, &mut links);
    links
}

/// Writes what the linker found into a table of links.
pub fn apply(links: &mut [Link], found: Vec<Found>) {
    for f in found {
        match f {
            Found::Edited { out, inp, changes } => {
                links[inp] = Link { fate: Fate::Edited, pair: Some(out), changes: changes.clone() };
                links[out] = Link { fate: Fate::Edited, pair: Some(inp), changes };
            }
            Found::Made { out } => links[out].fate = Fate::Made,
            Found::NotPassed { inp, .. } => links[inp].fate = Fate::NotPassed,
        }
    }
}

fn pair_passed(records: &[Record], links: &mut [Link]) {
    let mut waiting: [HashMap<&str, VecDeque<usize>>; 2] = [HashMap::default(), HashMap::default()];
    for (i, rec) in records.iter().enumerate() {
        let Some((s, incoming)) = side(rec.dir) else { continue };
        if rec.not_json || links[i].fate != Fate::Passed {
            continue;
        }
        if incoming {
            waiting[s].entry(rec.raw.as_str()).or_default().push_back(i);
        } else if let Some(j) = waiting[s].get_mut(rec.raw.as_str()).and_then(VecDeque::pop_front) {
            links[i].pair = Some(j);
            links[j].pair = Some(i);
        }
    }
}

/// What differs between two versions of a frame, one line per place (`params.prompt[0].text: changed`).
pub fn diff(a: &Value, b: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(a, b, &mut String::new(), &mut out);
    if out.len() > MAX_CHANGES {
        let more = out.len() - MAX_CHANGES;
        out.truncate(MAX_CHANGES);
        out.push(format!("… {more} more"));
    }
    out
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("text of {} chars", s.chars().count()),
        Value::Object(o) => format!("object of {} keys", o.len()),
        Value::Array(a) => format!("list of {}", a.len()),
        other => other.to_string().chars().take(40).collect(),
    }
}

fn walk(a: &Value, b: &Value, path: &mut String, out: &mut Vec<String>) {
    if out.len() > MAX_CHANGES {
        return;
    }
    let here = |p: &str| if p.is_empty() { "(frame)".to_owned() } else { p.to_owned() };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                match y.get(k) {
                    Some(vb) => walk(va, vb, path, out),
                    None => out.push(format!("{path}: removed ({})", describe(va))),
                }
                path.truncate(len);
            }
            for (k, vb) in y {
                if !x.contains_key(k) {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    out.push(format!("{p}: added ({})", describe(vb)));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if y.len() > x.len() && (y.ends_with(x) || y.starts_with(x)) => {
            let (n, at) = (y.len() - x.len(), if y.ends_with(x) { "before" } else { "after" });
            let first = y.iter().find(|v| !x.contains(v)).map(describe).unwrap_or_default();
            out.push(format!("{}: {n} put {at} the others ({first})", here(path)));
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                match (x.get(i), y.get(i)) {
                    (Some(va), Some(vb)) => walk(va, vb, path, out),
                    (Some(va), None) => out.push(format!("{path}: removed ({})", describe(va))),
                    (None, Some(vb)) => out.push(format!("{path}: added ({})", describe(vb))),
                    (None, None) => {}
                }
                path.truncate(len);
            }
        }
        (Value::String(x), Value::String(y)) if x != y => {
            let what = if y.ends_with(x.as_str()) {
                format!("text put before it ({} → {} chars)", x.chars().count(), y.chars().count())
            } else {
                format!("changed ({} → {} chars)", x.chars().count(), y.chars().count())
            };
            out.push(format!("{}: {what}", here(path)));
        }
        _ if a != b => out.push(format!("{}: changed ({} → {})", here(path), describe(a), describe(b))),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::view::read;

    #[test]
    fn passed_edited_made_and_held_frames() {
        let text = concat!(
            r#"{"t":0,"dir":"client->shim","frame":{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}}"#,
            "\n",
            r#"{"t":1,"dir":"shim->agent","frame":{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}}"#,
            "\n",
            r#"{"t":2,"dir":"agent->shim","frame":{"jsonrpc":"2.0","id":1,"result":{"agentCapabilities":{}}}}"#,
            "\n",
            r#"{"t":3,"dir":"shim->client","shim":true,"frame":{"jsonrpc":"2.0","id":1,"result":{"agentCapabilities":{"_meta":{"coda":{"waits":{}}}}}}}"#,
            "\n",
            r#"{"t":4,"dir":"shim->client","shim":true,"frame":{"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":"s","waitId":"w","state":"waiting"}}}"#,
            "\n",
            r#"{"t":5,"dir":"agent->shim","frame":{"jsonrpc":"2.0","id":"coda-shim-1-1","result":{}}}"#,
            "\n"
        );
        let trace = read::read(text.as_bytes());
        let links = link(&trace.records);
        let fates: Vec<Fate> = links.iter().map(|l| l.fate).collect();
        assert_eq!(fates, vec![Fate::Passed, Fate::Passed, Fate::Edited, Fate::Edited, Fate::Made, Fate::NotPassed]);
        assert_eq!(links[0].pair, Some(1));
        assert_eq!(links[3].pair, Some(2));
        assert_eq!(links[3].changes, vec!["result.agentCapabilities._meta: added (object of 1 keys)"]);
    }

    #[test]
    fn a_block_put_before_the_prompt_is_named() {
        let a: Value = serde_json::json!({"prompt": [{"text": "hi"}]});
        let b: Value = serde_json::json!({"prompt": [{"text": "<i>x</i>"}, {"text": "hi"}]});
        assert_eq!(diff(&a, &b), vec!["prompt: 1 put before the others (object of 1 keys)"]);
    }

    #[test]
    fn an_instruction_put_before_the_prompt_is_named() {
        let a: Value = serde_json::json!({"params": {"prompt": [{"text": "hi"}], "systemPrompt": "x"}});
        let b: Value = serde_json::json!({"params": {"prompt": [{"text": "<i>x</i>\n\nhi"}]}});
        assert_eq!(
            diff(&a, &b),
            vec![
                "params.prompt[0].text: text put before it (2 → 12 chars)",
                "params.systemPrompt: removed (text of 1 chars)"
            ]
        );
    }
}

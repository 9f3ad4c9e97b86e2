//! The shape of a stream's last line, to check the next one against: most frames of a stream are built
//! from one template (a chunk, Grok's stamped chunk, a tool call's update) and differ only inside values: a
//! chunk's text, an event id, a time. A line kept here is cut into its holes (the text of each string value,
//! each number) and what lies between them (keys, brackets, commas, the values that are literals). The next
//! line whose bytes between its holes are the same, and whose holes are a string's text and a number where
//! the kept line had them, is the same JSON text with other values in the same places: valid, with the same
//! envelope but for the positions of the strings it reads. That check compares bytes and finds each string's
//! end in one step; the walk it saves looks at every key.

use super::fast::{Hole, number, string};
use super::*;

/// Lines longer than this are not kept (the check is for frames, and a kept line is a copy).
pub(super) const KEPT: usize = 16 << 10;

/// The kept line, its holes, and where its envelope's strings are among them. The envelope's `jsonrpc`,
/// `method` and `sessionUpdate` are no holes: what a frame is seldom changes from one frame to the next, and
/// a line where it does is walked. Nor, once the next line has been checked against it, are the values that
/// line did not change (a session id, a content type, the start of Grok's turn): the skeleton is then kept
/// again from that line, with holes only where the two differed.
#[derive(Debug, Default)]
pub(super) struct Skeleton {
    line: Vec<u8>,
    holes: Vec<Hole>,
    env: Envelope,
    /// Which of the envelope's strings lie after the last hole (see [`Hole::moved`]).
    tail: u8,
    /// Whether a line is kept.
    kept: bool,
    /// Whether the kept line's holes are only those that changed from the line before.
    learnt: bool,
}

impl Skeleton {
    /// Keeps `line`, which is valid with `env` and has `holes` (among them every string value and number
    /// the envelope reads); a line this cannot check the next against (one with a lone surrogate escape, or
    /// an id that is not a string or a number) is not kept.
    pub(super) fn keep(&mut self, line: &[u8], holes: &[Hole], env: &Envelope) {
        (self.kept, self.learnt) = (false, false);
        if line.len() > KEPT || env.lone_surrogate {
            return;
        }
        // A string's hole starts after its quote; a number's where it does.
        let id = env.id.map(|(start, _)| start + usize::from(line[start] == b'"'));
        if id.is_some_and(|id| holes.binary_search_by_key(&id, |h| h.start).is_err()) {
            return;
        }
        let strings = [env.jsonrpc, env.method, env.update].map(|s| s.map(|s| s.start));
        self.holes.clear();
        self.holes.extend(holes.iter().filter(|h| !h.string || !strings.contains(&Some(h.start))).map(|h| Hole {
            id: Some(h.start) == id,
            moved: 0,
            ..*h
        }));
        // What lies between holes moves with the stretch it is in: the stretch before the first hole after it.
        self.tail = 0;
        let meta = [env.meta.map(|m| m.0), env.meta.map(|m| m.1)];
        for (at, bit) in strings.into_iter().chain(meta).zip([JSONRPC, METHOD, UPDATE, META_START, META_END]) {
            let Some(at) = at else { continue };
            match self.holes.iter_mut().find(|h| h.start > at) {
                Some(hole) => hole.moved |= bit,
                None => self.tail |= bit,
            }
        }
        self.line.clear();
        self.line.extend_from_slice(line);
        self.env = *env;
        self.kept = true;
    }

    /// `b`'s envelope when it is the kept line with other values in its holes; `bits` are `b`'s (see
    /// [`super::index`]). `None` when it is not (the walk then decides). The first line checked after one is
    /// kept is kept in its place, with holes where the two differ (`changed` is room for them).
    #[inline(never)]
    pub(super) fn check(&mut self, b: &[u8], bits: &[u64], changed: &mut Vec<Hole>) -> Option<Envelope> {
        if !self.kept {
            return None;
        }
        let (old, mut at, mut was) = (&self.line[..], 0, 0);
        let mut env = self.env;
        changed.clear();
        for hole in &self.holes {
            let between = &old[was..hole.start];
            if !same(b.get(at..at + between.len())?, between) {
                return None;
            }
            if hole.moved != 0 {
                moved(&mut env, hole.moved, at, was);
            }
            let start = at + between.len();
            let end = match hole.string {
                true => string(b, bits, start, &mut env.lone_surrogate)?.0,
                false => number(b, start)?,
            };
            if hole.id {
                env.id = Some((start - usize::from(hole.string), end + usize::from(hole.string)));
            }
            if !self.learnt && (hole.id || b[start..end] != old[hole.start..hole.end]) {
                changed.push(Hole { start, end, ..*hole });
            }
            (at, was) = (end, hole.end);
        }
        if !same(b.get(at..)?, &old[was..]) {
            return None;
        }
        if self.tail != 0 {
            moved(&mut env, self.tail, at, was);
        }
        if !self.learnt {
            if changed.len() < self.holes.len() {
                self.keep(b, changed, &env);
            }
            self.learnt = true;
        }
        Some(env)
    }
}

/// The envelope's strings that are no holes (see [`Hole::moved`]).
const JSONRPC: u8 = 1;
const METHOD: u8 = 2;
const UPDATE: u8 = 4;
/// The start and the end of `params._meta` (see [`Envelope::meta`]).
const META_START: u8 = 8;
const META_END: u8 = 16;

/// The envelope's strings (and ends of `_meta`) `which` of a stretch between holes that was at `was` in the
/// kept line and is at `at` in this one, moved with it.
fn moved(env: &mut Envelope, which: u8, at: usize, was: usize) {
    let by = |s: Option<Str>| s.map(|s| Str { start: s.start - was + at, end: s.end - was + at, ..s });
    if which & JSONRPC != 0 {
        env.jsonrpc = by(env.jsonrpc);
    }
    if which & METHOD != 0 {
        env.method = by(env.method);
    }
    if which & UPDATE != 0 {
        env.update = by(env.update);
    }
    if which & (META_START | META_END) != 0 {
        env.meta = env.meta.map(|(start, end)| match which & (META_START | META_END) {
            META_START => (start - was + at, end),
            META_END => (start, end - was + at),
            _ => (start - was + at, end - was + at),
        });
    }
}

/// Whether `a` and `b` are the same bytes, eight at a time (what lies between two values is a few dozen
/// bytes at most: a call to `memcmp` costs more than the comparison).
#[inline(always)]
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |x: &[u8], at: usize| u64::from_le_bytes(x[at..at + 8].try_into().unwrap_or_default());
    if n < 8 {
        return a == b;
    }
    let mut k = 0;
    while k + 8 < n {
        if word(a, k) != word(b, k) {
            return false;
        }
        k += 8;
    }
    // The last eight bytes (overlapping the words before when `n` is no multiple of eight).
    word(a, n - 8) == word(b, n - 8)
}

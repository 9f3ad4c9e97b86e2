//! The shapes of a stream's last lines, to check the next one against: the frames of a stream are built
//! from a few templates taking turns (a chunk, Grok's stamped chunk, a usage update, a tool call's update)
//! and differ only inside values: a chunk's text, an event id, a time. A line kept here is cut into its
//! holes (the text of each string value, each number) and what lies between them (keys, brackets, commas,
//! the values that are literals). The next line whose bytes between its holes are the same, and whose holes
//! are a string's text and a number where the kept line had them, is the same JSON text with other values in
//! the same places: valid, with the same envelope but for the positions of the strings it reads. That check
//! compares bytes and finds each string's end in one step; the walk it saves looks at every key.

use super::fast::{Hole, ROLE_ID, ROLE_SESSION, number, string};
use super::*;
use crate::json::same;

/// Lines longer than this are not kept (the check is for frames, and a kept line is a copy).
pub(super) const KEPT: usize = 16 << 10;

/// The kept line, its holes, and where its envelope's strings are among them. The envelope's `jsonrpc`,
/// `method` and `sessionUpdate` are no holes: what a frame is seldom changes from one frame to the next, and
/// a line where it does is walked. Nor, once the next line has been checked against it, are the values that
/// line did not change (a content type, the start of Grok's turn, the session of a stream that has stayed in
/// one): the skeleton is then kept again from that line, with holes only where the two differed (and at the
/// id, which the envelope reads and a request changes; and at the session id once the stream has had two, as a
/// CLI's subagents interleave with their parent: else each change of session would cost a walk). A later
/// line of the template with another value where the skeleton learnt none (a tool call's next status) is
/// walked, and its skeleton takes this one's place, with this one's holes and that value's
/// ([`Skeletons::keep`]).
#[derive(Debug, Default)]
pub(super) struct Skeleton {
    line: Vec<u8>,
    holes: Vec<Hole>,
    env: Envelope,
    /// Which of the envelope's strings lie after the last hole (see [`Hole::moved`]).
    tail: u8,
    /// Whether a line is kept.
    kept: bool,
    /// Whether the skeleton learns no more: its holes are those that changed from the line before (and, kept
    /// again for its template, those the skeleton it replaced had: see [`Skeletons::keep`]).
    learnt: bool,
    /// The number of the shape (see [`Skeletons`]).
    shape: u64,
    /// The [`template`] hash of the walked lines this was kept from: the template the shape's lines are made
    /// from (see [`Skeletons::keep`]).
    template: u64,
    /// The places (in [`Skeletons`]) of the skeletons the lines after this one's had, the last first: those
    /// tried first after a line of this (see [`Skeletons::check`]).
    next: [Option<u8>; NEXT],
}

impl Skeleton {
    /// Keeps `line`, which is valid with `env` and has `holes` (among them every string value and number
    /// the envelope reads); a line this cannot check the next against (one with a lone surrogate escape, or
    /// an id that is not a string or a number) is not kept. `sessions`: whether the stream has had two
    /// session ids (set here when `line`'s is not the one of the line this kept before).
    fn keep(&mut self, line: &[u8], holes: &[Hole], env: &Envelope, sessions: &mut bool) {
        (self.kept, self.learnt) = (false, false);
        if line.len() > KEPT || env.escapes.lone_surrogate {
            return;
        }
        // (The line kept before, if any, with its envelope: `line` and `env` are replaced together.)
        if let (false, Some(was), Some(now)) = (*sessions, self.env.session, env.session) {
            *sessions = self.line.get(was.range()) != line.get(now.range());
        }
        // A string's hole starts after its quote; a number's where it does.
        let id = id_start(line, env);
        let session = env.session.map(|s| s.range().start);
        let found = |at: Option<usize>| at.is_none_or(|at| holes.binary_search_by_key(&at, |h| h.start).is_ok());
        if !found(id) {
            return;
        }
        let strings = fixed(env);
        self.holes.clear();
        let mut session_hole = false;
        self.holes.extend(holes.iter().filter(|h| !h.string || !strings.contains(&Some(h.start))).map(|h| {
            let role = match Some(h.start) {
                at if at == id => ROLE_ID,
                at if at == session => {
                    session_hole = true;
                    ROLE_SESSION
                }
                _ => 0,
            };
            Hole { role, moved: 0, ..*h }
        }));
        // The session id is a hole where two lines had other ones; else it moves with the bytes around it.
        let session_fixed = session.filter(|_| !session_hole);
        // What lies between holes moves with the stretch it is in: the stretch before the first hole after it.
        self.tail = 0;
        let ends = |span: Option<Span>| span.map(range).map_or([None; 2], |r| [Some(r.start), Some(r.end)]);
        let (meta, update) = (ends(env.meta), ends(env.update_object));
        let bits = [JSONRPC, METHOD, UPDATE, META_START, META_END, OBJECT_START, OBJECT_END, SESSION];
        for (at, bit) in strings.into_iter().chain(meta).chain(update).chain([session_fixed]).zip(bits) {
            let Some(at) = at else { continue };
            // (Most places are near the line's start, among its first holes: a search from the start is short.)
            match self.holes.iter_mut().find(|h| h.start > at) {
                Some(hole) => hole.moved |= bit,
                None => self.tail |= bit,
            }
        }
        self.line.clear();
        self.line.extend_from_slice(line);
        self.env = *env;
        // Of the escapes, what every line of the shape has: a `\u` escape outside the holes (in a key, or a
        // value that is no hole), which is in the bytes a line is compared by. (A `\u` escape lies whole in one
        // string's text: in a hole or in what lies between two. Looked for only in a line that has one.)
        let mut from = 0;
        let fixed = env.escapes.unicode
            && self.holes.iter().map(|h| (h.start, h.end)).chain([(line.len(), line.len())]).any(|(start, end)| {
                let between = &line[from..start];
                from = end;
                memchr::memmem::find(between, br"\u").is_some()
            });
        self.env.escapes = Escapes { unicode: fixed, lone_surrogate: false };
        self.kept = true;
    }

    /// The holes of `line` (a walked line of this skeleton's template, with `holes` and `env`) the skeleton
    /// kept from it is to have, in `varied`: the values that were holes here, those whose text differs from
    /// the kept line's, the id, and the session id once the stream has had two (`sessions`), as
    /// [`Skeleton::matches`] learns them. `None` when `line` is not of the template after all (two templates
    /// with one [`template`] hash).
    #[cold]
    fn varied(
        &self,
        line: &[u8],
        holes: &[Hole],
        env: &Envelope,
        sessions: bool,
        varied: &mut Vec<Hole>,
    ) -> Option<()> {
        let old = &self.line[..];
        let strings = fixed(env);
        let id = id_start(line, env);
        let always = [id, env.session.filter(|_| sessions).map(|s| s.range().start)];
        varied.clear();
        let (mut at, mut was, mut kept) = (0, 0, self.holes.iter().peekable());
        for hole in holes.iter().filter(|h| !h.string || !strings.contains(&Some(h.start))) {
            // Where the value is in the kept line, and where it ends there.
            let between = &line[was..hole.start];
            let start = at + between.len();
            if old.get(at..start)? != between {
                return None;
            }
            let end = match hole.string {
                true => crate::json::string_end(old, start - 1)?,
                false => number(old, start)?,
            };
            while kept.next_if(|h| h.start < start).is_some() {}
            let was_hole = kept.next_if(|h| h.start == start).is_some();
            if was_hole || old[start..end] != line[hole.start..hole.end] || always.contains(&Some(hole.start)) {
                varied.push(*hole);
            }
            (at, was) = (end, hole.end);
        }
        (old.get(at..)? == &line[was..]).then_some(())
    }

    /// The bytes this holds (what its buffers took, not what they have now).
    fn held(&self) -> usize {
        self.line.capacity() + self.holes.capacity() * std::mem::size_of::<Hole>()
    }

    /// Whether `b` is the kept line with other values in its holes, and then its envelope in `out`; `bits`
    /// are `b`'s (see [`super::index`]). `None` when it is not (`out` is then left as it was). The first line
    /// checked after one is kept is kept in its place, with holes where the two differ (`changed` is room for
    /// them).
    #[inline(always)]
    fn matches(
        &mut self,
        b: &[u8],
        bits: &[u64],
        changed: &mut Vec<Hole>,
        out: &mut Envelope,
        sessions: &mut bool,
    ) -> Option<()> {
        if !self.kept {
            return None;
        }
        let old = &self.line[..];
        // What follows the last hole first: lines of other shapes mostly end otherwise, and are told apart
        // here before any hole is looked at.
        let tail = &old[self.holes.last().map_or(0, |h| h.end)..];
        let b_tail = b.len().checked_sub(tail.len())?;
        if !same(&b[b_tail..], tail) {
            return None;
        }
        // Where each stretch between holes is in `b` (`at`) and was in the kept line (`was`); how far each of
        // the envelope's strings that lie in one moved (by the bits of `Hole::moved`).
        let (mut at, mut was) = (0, 0);
        let mut by = [0u32; 8];
        let (mut id, mut session, mut notes) = (None, None, Escapes::default());
        changed.clear();
        for hole in &self.holes {
            let between = &old[was..hole.start];
            let start = at + between.len();
            if !same(b.get(at..start)?, between) {
                return None;
            }
            if hole.moved != 0 {
                moved(&mut by, hole.moved, at, was);
            }
            let (end, escaped) = match hole.string {
                true => string(b, bits, start, &mut notes)?,
                false => (number(b, start)?, false),
            };
            match hole.role {
                0 => {}
                ROLE_ID => id = Some(span(start - usize::from(hole.string), end + usize::from(hole.string))),
                _ => session = Some(Str::new(start, end, escaped)),
            }
            let always = hole.role == ROLE_ID || (hole.role == ROLE_SESSION && *sessions);
            if !self.learnt && (always || b[start..end] != old[hole.start..hole.end]) {
                changed.push(Hole { start, end, ..*hole });
            }
            (at, was) = (end, hole.end);
        }
        // (What follows is the tail, compared above.)
        if at != b_tail {
            return None;
        }
        if self.tail != 0 {
            moved(&mut by, self.tail, at, was);
        }
        *out = self.env;
        let env = out;
        let shift = |s: &mut Option<Str>, by: u32| {
            if let Some(s) = s {
                (s.start, s.end) = (s.start.wrapping_add(by), s.end.wrapping_add(by));
            }
        };
        shift(&mut env.jsonrpc, by[0]);
        shift(&mut env.method, by[1]);
        shift(&mut env.update, by[2]);
        if let Some((start, end)) = &mut env.meta {
            (*start, *end) = (start.wrapping_add(by[3]), end.wrapping_add(by[4]));
        }
        if let Some((start, end)) = &mut env.update_object {
            (*start, *end) = (start.wrapping_add(by[5]), end.wrapping_add(by[6]));
        }
        shift(&mut env.session, by[7]);
        if id.is_some() {
            env.id = id;
        }
        if session.is_some() {
            env.session = session;
        }
        // (What lies between the holes has the kept line's `\u` escapes; the holes, their own.)
        env.escapes = Escapes { unicode: env.escapes.unicode || notes.unicode, lone_surrogate: notes.lone_surrogate };
        if !self.learnt {
            if changed.len() < self.holes.len() {
                self.keep(b, changed, env, sessions);
            }
            self.learnt = true;
        }
        Some(())
    }
}

/// Where the id's value starts in `line` of `env`: after its quote when it is a string (as a hole does).
fn id_start(line: &[u8], env: &Envelope) -> Option<usize> {
    env.id.map(range).map(|id| id.start + usize::from(line[id.start] == b'"'))
}

/// The starts of the envelope's strings that are no holes of a skeleton: `jsonrpc`, `method` and
/// `sessionUpdate` (what a frame is).
fn fixed(env: &Envelope) -> [Option<usize>; 3] {
    [env.jsonrpc, env.method, env.update].map(|s| s.map(|s| s.range().start))
}

/// A hash of what lies between the values of `line` (`holes`, but the envelope's strings that are no
/// holes: what the frame is), and of which of them are strings: lines of one template have the same, whatever
/// their values. (Looked at only when a walked line is kept.)
fn template(line: &[u8], holes: &[Hole], env: &Envelope) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let strings = fixed(env);
    let mut hash = foldhash::fast::FixedState::with_seed(0).build_hasher();
    let mut from = 0;
    for h in holes.iter().filter(|h| !h.string || !strings.contains(&Some(h.start))) {
        hash.write(&line[from..h.start]);
        hash.write_u8(u8::from(h.string));
        from = h.end;
    }
    hash.write(&line[from..]);
    hash.finish()
}

/// How many shapes a stream's `Skeletons` keeps: the recorded streams of the four CLIs have 13 to 66 shapes
/// (Grok's, with its `_x.ai/*` notifications, the most), and each template has one skeleton (a walked line
/// of one kept takes its place: `Skeletons::keep`). A line is matched against those that followed the shape
/// before it first, then the others most recent first (`Skeletons::check`), each first by what follows its last
/// hole and then only up to the stretch where they differ: a line of none of them costs a few dozen comparisons
/// each before its walk.
pub const SHAPES: usize = 64;

/// How many shapes that followed one [`Skeleton`] it keeps, to try first after a line of it: the recorded
/// streams of the four CLIs need about 4.5 tries per line with four (Grok's; 15.8 without), 6.7 with two.
const NEXT: usize = 4;
const _: () = assert!(SHAPES <= 64, "a place of each shape has a bit in a word (`Skeletons::check`)");

/// The bytes the skeletons of a stream may hold (their lines and holes) beyond the last one kept: a peer
/// sending long lines of ever other shapes (each up to [`KEPT`] bytes, and a hole per value) makes them
/// let go of the ones had longest ago instead of holding 32 of them.
pub(super) const HELD: usize = 256 << 10;

/// The skeletons of the last [`SHAPES`] shapes a stream's walk kept, the one a line had last first: a
/// stream's frames take turns between a few templates (a chunk, a usage update, a tool call's update, a
/// status), and a line of any of them is checked, not walked. Each shape has its number (a new one for each
/// line kept from a walk), which stays with its skeleton when it is kept again from a line checked against
/// it.
#[derive(Debug, Default)]
pub(super) struct Skeletons {
    each: Vec<Skeleton>,
    /// Places in `each`, the skeleton kept or matched last first.
    order: Vec<u8>,
    /// Whether two lines kept had other session ids: the session id stays a hole from then on.
    sessions: bool,
    /// Shapes numbered so far.
    shapes: u64,
    /// Room for the holes of a line kept again for its template ([`Skeleton::varied`]).
    varied: Vec<Hole>,
    /// The place of the skeleton the last line matched or was kept as (see [`Skeletons::check`]).
    last: Option<u8>,
    /// Lines compared with a skeleton (the tests see how many a line takes).
    #[cfg(test)]
    tries: usize,
}

impl Skeletons {
    /// The shape of `b` when it is a kept line with other values in its holes, and then its envelope in
    /// `out`; `bits` are `b`'s (see [`super::index`]). `None` when it is none of them (the walk then decides;
    /// `out` is left as it was). See [`Skeleton::matches`].
    ///
    /// The skeletons tried first are those whose lines followed, the last [`NEXT`] times, a line of the
    /// skeleton the last line had: a stream's templates come in the same few orders again and again (a chunk
    /// after a chunk, a turn's end after its usage update, Grok's `_x.ai/*` notifications of a turn one after
    /// another), where the shapes had most recently are mostly those of the other steps of that order, each told
    /// apart only where the two lines differ. Then the others, most recent first.
    #[inline(always)]
    pub(super) fn check(&mut self, b: &[u8], bits: &[u64], changed: &mut Vec<Hole>, out: &mut Envelope) -> Option<u64> {
        // A line longer than any kept is checked against the shape had last only: a long string's end is
        // found in each skeleton that has a hole there before one tells it apart.
        let long = b.len() > KEPT;
        // Mostly the line is of the first successor (a chunk after a chunk): that one is tried here, with
        // nothing else around its compare, and the rest out of line.
        let first = match self.last {
            Some(last) if !long => self.each[usize::from(last)].next[0],
            _ => None,
        };
        if let Some(place) = first
            && let Some(shape) = self.try_one(place, b, bits, changed, out)
        {
            return Some(shape);
        }
        self.check_others(b, bits, changed, out, first, long)
    }

    /// [`Skeletons::check`] after the first successor (`first`, when there was one, did not match).
    #[inline(never)]
    fn check_others(
        &mut self,
        b: &[u8],
        bits: &[u64],
        changed: &mut Vec<Hole>,
        out: &mut Envelope,
        first: Option<u8>,
        long: bool,
    ) -> Option<u64> {
        let (next, tries) = match self.last {
            Some(last) if !long => (self.each[usize::from(last)].next, self.order.len()),
            _ => ([None; NEXT], self.order.len().min(1)),
        };
        // (A place is tried once: `tried` has a bit for each.)
        let mut tried = first.map_or(0u64, |place| 1 << place);
        for k in 0..NEXT + tries {
            let place = match next.get(k) {
                Some(&Some(place)) => place,
                Some(None) => continue,
                None => self.order[k - NEXT],
            };
            if tried >> place & 1 == 1 {
                continue;
            }
            tried |= 1 << place;
            if let Some(shape) = self.try_one(place, b, bits, changed, out) {
                return Some(shape);
            }
        }
        None
    }

    /// The shape of `b` when it matches the skeleton at `place` (see [`Skeleton::matches`]), which then moves
    /// to the front of the order and follows the last line's.
    #[inline(always)]
    fn try_one(
        &mut self,
        place: u8,
        b: &[u8],
        bits: &[u64],
        changed: &mut Vec<Hole>,
        out: &mut Envelope,
    ) -> Option<u64> {
        #[cfg(test)]
        {
            self.tries += 1;
        }
        let skeleton = &mut self.each[usize::from(place)];
        skeleton.matches(b, bits, changed, out, &mut self.sessions)?;
        let shape = skeleton.shape;
        if self.order[0] != place {
            let k = self.order.iter().position(|&k| k == place).unwrap_or(0);
            to_front(&mut self.order, k);
        }
        self.followed_by(place);
        Some(shape)
    }

    /// Notes that a line of the skeleton at `place` followed the last line.
    #[inline(always)]
    fn followed_by(&mut self, place: u8) {
        if let Some(last) = self.last {
            let next = &mut self.each[usize::from(last)].next;
            // (Mostly the first already: a shape follows one as it did the time before.)
            if next[0] != Some(place) {
                // The place moves to the front, those before it back one (the last one out, when it is new).
                let mut moved = Some(place);
                for n in next.iter_mut() {
                    moved = std::mem::replace(n, moved);
                    if moved == Some(place) {
                        break;
                    }
                }
            }
        }
        self.last = Some(place);
    }

    /// The bytes the skeletons hold, and the most one of them does.
    #[cfg(test)]
    pub(super) fn held(&self) -> (usize, usize) {
        let each = self.each.iter().map(Skeleton::held);
        (each.clone().sum(), each.max().unwrap_or(0))
    }

    /// Keeps `line`, which is valid with `env` and has `holes` (see [`Skeleton::keep`]), as a new shape: its
    /// number, `None` when it is not kept. A walked line of a template kept (the same bytes between its
    /// values: [`template`] picks the one to compare with) is one whose skeleton had learnt a value the line
    /// does not have (a tool call's status, a content's type): it takes that skeleton's place, with the holes
    /// that one had and those where the two lines differ, and learns no more (see [`Skeleton::varied`]). So a
    /// template's variants do not fill the places of other templates, and each value that changes costs one
    /// walk. Else the line takes the place of the one had longest ago once [`SHAPES`] are kept.
    pub(super) fn keep(&mut self, line: &[u8], holes: &[Hole], env: &Envelope) -> Option<u64> {
        let template = template(line, holes, env);
        let known = self.order.iter().position(|&k| {
            let skeleton = &self.each[usize::from(k)];
            skeleton.kept && skeleton.template == template
        });
        // A line of a kept template: its skeleton kept again, with the holes it had and the values that differ.
        let mut varied = std::mem::take(&mut self.varied);
        let merged = known.filter(|&k| {
            let skeleton = &self.each[usize::from(self.order[k])];
            skeleton.varied(line, holes, env, self.sessions, &mut varied).is_some()
        });
        match merged {
            Some(k) => to_front(&mut self.order, k),
            None => {
                if self.each.len() < SHAPES {
                    self.order.push(self.each.len() as u8);
                    self.each.push(Skeleton::default());
                }
                // The one had longest ago (or the new one) first.
                self.order.rotate_right(1);
            }
        }
        let skeleton = &mut self.each[usize::from(self.order[0])];
        skeleton.keep(line, if merged.is_some() { &varied } else { holes }, env, &mut self.sessions);
        self.varied = varied;
        if !skeleton.kept {
            // Left for the next line kept.
            self.order.rotate_left(1);
            return None;
        }
        // (Kept again for its template, a skeleton has learnt what it can.)
        skeleton.learnt = merged.is_some();
        skeleton.template = template;
        if merged.is_none() {
            skeleton.next = [None; NEXT];
        }
        self.shapes += 1;
        skeleton.shape = self.shapes;
        // The memory they hold stays under [`HELD`]: the ones had longest ago let go (but the one just kept).
        let mut held: usize = self.each.iter().map(Skeleton::held).sum();
        for &k in self.order[1..].iter().rev() {
            if held <= HELD {
                break;
            }
            let gone = std::mem::take(&mut self.each[usize::from(k)]);
            held -= gone.held();
        }
        self.followed_by(self.order[0]);
        Some(self.shapes)
    }
}

/// Moves the place at `k` of `order` to its front, those before it back one (`order[..=k].rotate_right(1)`):
/// the order of the kept shapes is moved on most lines (a line matches one of the few shapes before it), and
/// one of the first eight is moved by shifts of one word, where the rotation is a call and a copy.
fn to_front(order: &mut [u8], k: usize) {
    match order.get_mut(..8).and_then(|eight| <&mut [u8; 8]>::try_from(eight).ok()) {
        Some(eight) if k < 8 => {
            // The first lowest: the bytes below `k` shift up one, the one at `k` goes in front.
            let word = u64::from_le_bytes(*eight);
            let below = |n: usize| if n >= 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
            let moved = (word & !below(k + 1)) | (word & below(k)) << 8 | (word >> (8 * k) & 0xFF);
            *eight = moved.to_le_bytes();
        }
        _ => order[..=k].rotate_right(1),
    }
}

/// The envelope's strings that are no holes (see [`Hole::moved`]), and the starts and the ends of
/// `params._meta` and `params.update`, and the session id when it is no hole: bit `k` is entry `k` of the
/// shifts [`moved`] sets.
const JSONRPC: u8 = 1;
const METHOD: u8 = 2;
const UPDATE: u8 = 4;
const META_START: u8 = 8;
const META_END: u8 = 16;
/// The start and the end of `params.update` (see [`Envelope::update_object`]).
const OBJECT_START: u8 = 32;
const OBJECT_END: u8 = 64;
/// `params.sessionId`'s text, when the lines of a skeleton have had one session (see [`Skeleton`]).
const SESSION: u8 = 128;

/// Notes in `by` that the envelope's strings (and ends of `_meta`) `which` lie in a stretch between holes
/// that was at `was` in the kept line and is at `at` in this one: each moved by `at - was` (modulo 2^32, as
/// places in a line are: [`Span`]).
#[inline(always)]
fn moved(by: &mut [u32; 8], which: u8, at: usize, was: usize) {
    let mut which = which;
    while which != 0 {
        by[which.trailing_zeros() as usize % 8] = at.wrapping_sub(was) as u32;
        which &= which - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::Scanner;
    use super::to_front;

    /// The texts of the holes of the skeleton a scanner checked its last line against or kept from it.
    fn holes_of_last(scanner: &Scanner) -> Vec<String> {
        let skeletons = &scanner.skeletons;
        let last = &skeletons.each[usize::from(skeletons.order[0])];
        last.holes.iter().map(|h| String::from_utf8_lossy(&last.line[h.start..h.end]).into_owned()).collect()
    }

    /// A tool call's updates: the skeleton learns which values change from the first two, and when a value it
    /// learnt as none changes (the status), the walked line's skeleton has the holes the first had and that
    /// value, not every value of the line: the content's type and text stay compared as bytes.
    #[test]
    fn a_template_kept_again_has_the_holes_it_had_and_the_ones_that_changed() {
        let line = |n: u32, status: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"tool_call_update","toolCallId":"c{n}","status":"{status}","content":[{{"type":"content","content":{{"type":"text","text":"same"}}}}],"n":{n}}}}}}}"#
            )
        };
        let mut scanner = Scanner::default();
        for (n, status) in [(1, "pending"), (2, "pending")] {
            assert!(scanner.check(line(n, status).as_bytes()).is_ok());
        }
        assert_eq!(holes_of_last(&scanner), ["c2", "2"], "learnt from the first two lines");
        let shape = scanner.shape();
        // (The same call and number as the line kept: they stay holes as they were.)
        assert!(scanner.check(line(2, "completed").as_bytes()).is_ok());
        assert_ne!(scanner.shape(), shape, "the third line walked: a new shape");
        assert_eq!(holes_of_last(&scanner), ["c2", "completed", "2"], "kept again with the status");
        assert_eq!((scanner.skeletons.each.len(), scanner.skeletons.order.len()), (1, 1), "in the place of the first");
        // From then on every status is checked, and the skeleton learns no more.
        for (n, status) in [(4, "in_progress"), (5, "failed"), (6, "completed")] {
            assert!(scanner.check(line(n, status).as_bytes()).is_ok());
            assert_eq!(holes_of_last(&scanner), ["c2", "completed", "2"]);
        }
        assert_eq!(scanner.by_skeleton, 4);
    }

    /// The tries the lines of `templates` take in each round of them taking turns as `order` says (given the
    /// round and the step, the template), after three rounds to learn them.
    fn tries_in_turns(templates: usize, order: impl Fn(usize, usize) -> usize) -> Vec<usize> {
        let line = |t: usize, n: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"_x.ai/session_notification","params":{{"sessionId":"s","n":{n},"k{t}":"v{n}"}}}}"#
            )
        };
        let mut scanner = Scanner::default();
        let mut tries = Vec::new();
        for round in 0..7 {
            let before = scanner.skeletons.tries;
            for step in 0..templates {
                let line = line(order(round, step), round * 1000 + step);
                assert!(scanner.check(line.as_bytes()).is_ok());
            }
            tries.push(scanner.skeletons.tries - before);
        }
        // The first round is walked (each line tried against the skeletons of those before it); the second
        // round's lines teach each skeleton its holes, and the third's first line follows the last of the
        // second for the first time.
        tries.split_off(3)
    }

    /// Templates taking turns in one order, as a CLI's notifications of a turn follow one another: each line
    /// is tried against the skeleton of the line that followed its predecessor's the time before, and matches
    /// it (most recent first, the one sought would be the last of all).
    #[test]
    fn templates_taking_turns_in_one_order_take_a_try_a_line() {
        let templates = 40;
        assert_eq!(tries_in_turns(templates, |_, step| step), [templates; 4]);
    }

    /// Templates whose successors take turns: two orders, each round one of them. A line is tried against
    /// the skeletons of the lines that followed its predecessor's the last times: at most two tries a line.
    #[test]
    fn templates_with_two_successors_taking_turns_take_at_most_two_tries_a_line() {
        let templates = 40;
        // The even rounds in order, the odd ones with each pair of steps swapped.
        let order = |round: usize, step: usize| if round % 2 == 0 { step } else { step ^ 1 };
        for tries in tries_in_turns(templates, order) {
            assert!((templates..=2 * templates).contains(&tries), "{tries} tries for {templates} lines");
        }
    }

    /// Each place of orders of every length up to the most kept goes to the front as a rotation puts it there.
    #[test]
    fn a_place_goes_to_the_front_as_a_rotation_puts_it() {
        for len in 1..=super::SHAPES {
            let order: Vec<u8> = (100..100 + len as u8).collect();
            for k in 0..len {
                let (mut moved, mut rotated) = (order.clone(), order.clone());
                to_front(&mut moved, k);
                rotated[..=k].rotate_right(1);
                assert_eq!(moved, rotated, "place {k} of {len}");
            }
        }
    }
}

//! One session's files as a stream of wire records: lines split from appends, parsed, merged by time.

use crate::HashMap;
use std::collections::VecDeque;

use bytes::Bytes;

use crate::adapters::kimi::wire::{Entry, TaskInfo, parse_line};
use crate::lines::{Line, Lines};

/// The longest wire record read; a longer one is skipped with a warning. Kimi 2.1.0 bounds what it writes into
/// one record (read in Kimi 2.1.0's bundle): a prompt image is recompressed to at most 3.75 MiB (5 MiB as base64), an
/// MCP tool's binary part to 10 MiB (13.4 MiB as base64), `Read` returns at most 500,000 characters (1.5 MB of
/// UTF-8, 3 MB if every one were escaped) and other tool output is cut at 50,000 characters. 16 MiB holds the
/// largest of these with room for the rest of the record; a record beyond it is not one Kimi writes.
pub const RECORD_MAX: usize = 16 << 20;

/// Bytes handed to the engine's splitter at once: beyond a line of [`RECORD_MAX`], it holds at most this much.
const CHUNK: usize = 1 << 20;

/// Splits appended bytes into whole lines with the engine's splitter ([`Lines`], limit [`RECORD_MAX`]),
/// keeping a partial last line for the next append. A line over the limit is skipped in bounded memory (its
/// bytes dropped as they come, the buffer it grew freed) and counted in `skipped` once its end is read.
pub struct Splitter {
    lines: Lines,
    /// Lines dropped for their size since the last look.
    pub skipped: usize,
}

impl Default for Splitter {
    fn default() -> Splitter {
        Splitter { lines: Lines::new(RECORD_MAX), skipped: 0 }
    }
}

impl Splitter {
    /// The whole lines `bytes` ends, without their line end (`\r\n` or `\n`); blank lines are skipped.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Bytes> {
        let mut out = Vec::new();
        for chunk in bytes.chunks(CHUNK) {
            self.lines.push(chunk);
            while let Some(line) = self.lines.next_line() {
                match line {
                    Line::Text(mut line) => {
                        line.truncate(line.len() - 1);
                        out.push(line);
                    }
                    Line::TooLong { .. } => self.skipped += 1,
                }
            }
        }
        out
    }

    /// Forgets a partial line (the file was replaced).
    pub fn reset(&mut self) {
        self.lines = Lines::new(RECORD_MAX);
    }
}

/// One session's files as a stream of records: splits appended bytes into lines, parses them, skips
/// history and what a replaced file repeats, and warns once per malformed line.
pub struct Feed {
    /// Records older than this (ms) are history, when a replaced file is read again from its start.
    cutoff_ms: u64,
    files: HashMap<String, FileFeed>,
}

#[derive(Default)]
struct FileFeed {
    lines: Splitter,
    /// Where the records delivered from this file reached.
    delivered: Delivered,
    /// While the file is read again from its start after it was replaced (see [`Feed::reread`]): what of
    /// it was delivered before, still to be passed over.
    repeats: Option<Delivered>,
}

/// How far the records of one wire were delivered, in three numbers whatever its length: the latest
/// `time` delivered, how many records of that time, and how many without a time (the metadata line).
/// Kimi appends a wire's records in time order, so a replaced wire read again from its start repeats
/// what was delivered as its records before that time, the first `at_latest` of that time and the first
/// `untimed` without one; whatever follows is new, even when its text is the same as a record's before
/// (remembered by content, a repeat would be dropped and two records could be taken for one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Delivered {
    latest: u64,
    at_latest: usize,
    untimed: usize,
}

impl Delivered {
    fn add(&mut self, time: u64) {
        if time == 0 {
            self.untimed += 1;
        } else if time > self.latest {
            (self.latest, self.at_latest) = (time, 1);
        } else if time == self.latest {
            self.at_latest += 1;
        }
    }

    /// Whether a record of `time`, read again, is one of those delivered (and passes over it).
    fn repeats(&mut self, time: u64) -> bool {
        let left = match time {
            0 => &mut self.untimed,
            t if t < self.latest => return true,
            t if t == self.latest => &mut self.at_latest,
            _ => return false,
        };
        let repeat = *left > 0;
        *left = left.saturating_sub(1);
        repeat
    }
}

/// What a chunk of a session file turned into.
#[derive(Debug)]
pub enum Fed {
    Entries { agent: String, entries: Vec<Entry> },
    Task { agent: String, info: TaskInfo },
    Nothing,
}

/// `agents/<agent>/wire.jsonl` -> agent; `agents/<agent>/tasks/<id>.json` -> agent (task file).
pub fn classify_path(file: &str) -> Option<(&str, bool)> {
    let rest = file.strip_prefix("agents/")?;
    let (agent, tail) = rest.split_once('/')?;
    if agent.is_empty() {
        return None;
    }
    if tail == "wire.jsonl" {
        return Some((agent, false));
    }
    let name = tail.strip_prefix("tasks/")?;
    (!name.contains('/') && name.ends_with(".json") && !name.contains(".tmp.")).then_some((agent, true))
}

impl Feed {
    pub fn new(cutoff_ms: u64) -> Feed {
        Feed { cutoff_ms, files: HashMap::default() }
    }

    /// `file` was replaced: what follows ([`Feed::piece`]s) is its content from the start, until
    /// [`Feed::caught_up`]; lines already delivered and history are dropped from it.
    pub fn reread(&mut self, file: &str) {
        let state = self.files.entry(file.to_owned()).or_default();
        state.lines.reset();
        state.repeats = Some(state.delivered);
    }

    /// The re-read of `file` reached the end of what the file held.
    pub fn caught_up(&mut self, file: &str) {
        if let Some(state) = self.files.get_mut(file) {
            state.repeats = None;
        }
    }

    /// The next bytes of `file` (a task file: its whole content).
    pub fn piece(&mut self, file: &str, task_file: bool, bytes: &[u8]) -> Fed {
        let Some((agent, is_task)) = classify_path(file) else { return Fed::Nothing };
        if is_task || task_file {
            return match TaskInfo::parse_file(bytes) {
                Some(info) => Fed::Task { agent: agent.to_owned(), info },
                None => {
                    tracing::warn!("Kimi task file {file} is not a task record; skipped");
                    Fed::Nothing
                }
            };
        }
        let state = self.files.entry(file.to_owned()).or_default();
        let reread = state.repeats.is_some();
        let mut entries = Vec::new();
        let lines = state.lines.push(bytes);
        for _ in 0..std::mem::take(&mut state.lines.skipped) {
            tracing::warn!("skipped a record of Kimi's {file} longer than {RECORD_MAX} bytes (not read)");
        }
        for line in lines {
            match parse_line(&line) {
                Ok(e) if state.repeats.as_mut().is_some_and(|r| r.repeats(e.time)) => {}
                Ok(e) if reread && e.time != 0 && e.time < self.cutoff_ms => {}
                Ok(e) => {
                    state.delivered.add(e.time);
                    entries.push(e);
                }
                Err(why) => {
                    // The line may be anything (user data): where and how long at the default level, an
                    // excerpt only at debug.
                    tracing::warn!("skipped a malformed line of Kimi's {file} ({why}; {} bytes)", line.len());
                    let text = String::from_utf8_lossy(&line);
                    let excerpt: String = text.chars().take(120).collect();
                    tracing::debug!("the malformed line of Kimi's {file} starts: {excerpt}");
                }
            }
        }
        Fed::Entries { agent: agent.to_owned(), entries }
    }
}

/// Merges per-file record lists by `time`, keeping each file's own order (ties: earlier list first).
pub fn merge(mut lists: Vec<(String, VecDeque<Entry>)>) -> Vec<(String, Entry)> {
    let mut out = Vec::new();
    loop {
        let next = lists.iter().enumerate().filter_map(|(i, (_, l))| l.front().map(|e| (e.time, i))).min();
        let Some((_, i)) = next else { break };
        let (agent, list) = &mut lists[i];
        if let Some(e) = list.pop_front() {
            out.push((agent.clone(), e));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(fed: Fed) -> Vec<u64> {
        match fed {
            Fed::Entries { entries, .. } => entries.iter().map(|e| e.time).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_replaced_wire_repeats_nothing_and_loses_nothing_of_the_same_text() {
        const WIRE: &str = "agents/main/wire.jsonl";
        let rec = |t: u64| format!("{{\"type\":\"x.other\",\"agentId\":\"main\",\"time\":{t}}}\n");
        let meta = "{\"type\":\"metadata\",\"protocol_version\":\"1.5\"}\n";
        let mut feed = Feed::new(0);
        let before = format!("{meta}{}{}{}", rec(5), rec(7), rec(7));
        assert_eq!(times(feed.piece(WIRE, false, before.as_bytes())), [0, 5, 7, 7]);
        // Replaced: the same records again, then new ones, two of them with the very text of earlier ones
        // (Kimi may write one record twice in a millisecond): these are new and delivered.
        feed.reread(WIRE);
        let again = format!("{before}{}{}{}", rec(7), rec(7), rec(9));
        assert_eq!(times(feed.piece(WIRE, false, again.as_bytes())), [7, 7, 9]);
        feed.caught_up(WIRE);
        // After the re-read, a record like any before it is an append like any other.
        assert_eq!(times(feed.piece(WIRE, false, rec(5).as_bytes())), [5]);
        // What is kept per wire is three numbers, however many records it delivered.
        for t in 10..100_000 {
            feed.piece(WIRE, false, rec(t).as_bytes());
        }
        assert_eq!(feed.files[WIRE].delivered, Delivered { latest: 99_999, at_latest: 1, untimed: 1 });
    }

    #[test]
    fn lines_buffer_a_partial_last_line() {
        let mut l = Splitter::default();
        assert_eq!(l.push(b"{\"a\":1}\n{\"b\""), [&b"{\"a\":1}"[..]]);
        assert_eq!(l.push(b":2}\r\n\n \n"), [&b"{\"b\":2}"[..]]);
        assert!(l.push(b"").is_empty());
        // A replaced file: its partial line is forgotten.
        assert!(l.push(b"{\"c\"").is_empty());
        l.reset();
        assert_eq!(l.push(b"{\"d\":4}\n"), [&b"{\"d\":4}"[..]]);
    }

    #[test]
    fn a_line_over_the_limit_is_dropped_as_soon_as_it_is_over_and_the_next_one_is_read() {
        let mut l = Splitter::default();
        let piece = vec![b'x'; 1 << 20];
        assert_eq!(l.push(b"{\"a\":1}\n{\"huge\":\""), [&b"{\"a\":1}"[..]]);
        for _ in 0..(RECORD_MAX >> 20) + 2 {
            assert!(l.push(&piece).is_empty());
            let (held, room) = l.lines.held();
            assert!(held <= RECORD_MAX + 1, "kept {held} bytes");
            assert!(room <= RECORD_MAX + 2 * CHUNK, "kept room for {room} bytes");
        }
        // Once over, the bytes of the line are dropped as they come, and the memory it grew is given back.
        assert!(l.lines.held().1 <= CHUNK, "kept room for {} bytes", l.lines.held().1);
        // One whole piece larger than the limit as well.
        assert_eq!(l.push(b"\"}\n{\"b\":2}\n"), [&b"{\"b\":2}"[..]]);
        assert_eq!(l.skipped, 1);
        let mut whole = vec![b'y'; RECORD_MAX + CHUNK + 7];
        whole.extend_from_slice(b"\n{\"c\":3}\n");
        assert_eq!(l.push(&whole), [&b"{\"c\":3}"[..]]);
        assert_eq!(l.skipped, 2);
        // Exactly at the limit is kept; one byte more is not, also when the line ends in the same piece.
        let mut at_limit = vec![b' '; RECORD_MAX - 2];
        at_limit.splice(0..0, *b"{}");
        at_limit.push(b'\n');
        assert_eq!(l.push(&at_limit).len(), 1);
        let mut over = vec![b' '; RECORD_MAX - 1];
        over.splice(0..0, *b"{}");
        over.push(b'\n');
        assert!(l.push(&over).is_empty());
        assert_eq!(l.skipped, 3);
    }
}

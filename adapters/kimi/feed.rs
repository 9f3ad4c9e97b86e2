//! One session's files as a stream of wire records: lines split from appends, parsed, merged by time.

use std::collections::{HashMap, VecDeque};

use crate::adapters::kimi::wire::{Entry, TaskInfo, parse_line};

/// The longest wire record read; a longer one is skipped with a warning. Kimi 2.1.0 bounds what it writes into
/// one record (read in Kimi 2.1.0's bundle): a prompt image is recompressed to at most 3.75 MiB (5 MiB as base64), an
/// MCP tool's binary part to 10 MiB (13.4 MiB as base64), `Read` returns at most 500,000 characters (1.5 MB of
/// UTF-8, 3 MB if every one were escaped) and other tool output is cut at 50,000 characters. 16 MiB holds the
/// largest of these with room for the rest of the record; a record beyond it is not one Kimi writes.
pub const RECORD_MAX: usize = 16 << 20;

/// Splits appended bytes into whole lines, keeping a partial last line for the next append; a line over
/// [`RECORD_MAX`] is dropped as soon as it is known to be over (not kept until its end).
#[derive(Default)]
pub struct Splitter {
    partial: Vec<u8>,
    /// Inside a line over the limit: its bytes are dropped until its end.
    skipping: bool,
    /// Lines dropped for their size since the last look.
    pub skipped: usize,
}

impl Splitter {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while let Some(at) = memchr::memchr(b'\n', rest) {
            let piece = &rest[..at];
            rest = &rest[at + 1..];
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if self.partial.len() + piece.len() > RECORD_MAX {
                self.partial = Vec::new();
                self.skipped += 1;
                continue;
            }
            let mut line = std::mem::take(&mut self.partial);
            line.extend_from_slice(piece);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                out.push(line);
            }
        }
        if !self.skipping {
            if self.partial.len() + rest.len() > RECORD_MAX {
                // Freed, not cleared: the memory of a huge line goes back at once.
                self.partial = Vec::new();
                self.skipping = true;
                self.skipped += 1;
            } else {
                self.partial.extend_from_slice(rest);
            }
        }
        out
    }

    /// Forgets a partial line (the file was replaced).
    pub fn reset(&mut self) {
        self.partial = Vec::new();
        self.skipping = false;
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
        Feed { cutoff_ms, files: HashMap::new() }
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
        assert_eq!(l.push(b"{\"a\":1}\n{\"b\""), vec![b"{\"a\":1}".to_vec()]);
        assert_eq!(l.push(b":2}\n\n"), vec![b"{\"b\":2}".to_vec()]);
        assert!(l.push(b"").is_empty());
    }

    #[test]
    fn a_line_over_the_limit_is_dropped_as_soon_as_it_is_over_and_the_next_one_is_read() {
        let mut l = Splitter::default();
        let piece = vec![b'x'; 1 << 20];
        assert_eq!(l.push(b"{\"a\":1}\n{\"huge\":\""), vec![b"{\"a\":1}".to_vec()]);
        for _ in 0..(RECORD_MAX >> 20) + 2 {
            assert!(l.push(&piece).is_empty());
            assert!(l.partial.len() <= RECORD_MAX, "kept {} bytes", l.partial.len());
        }
        assert_eq!(l.skipped, 1);
        assert!(l.partial.capacity() == 0 && l.skipping);
        assert_eq!(l.push(b"\"}\n{\"b\":2}\n"), vec![b"{\"b\":2}".to_vec()]);
        assert_eq!(l.skipped, 1);
        // Exactly at the limit is kept; one byte more is not, also when the line ends in the same piece.
        let mut at_limit = vec![b' '; RECORD_MAX - 2];
        at_limit.splice(0..0, *b"{}");
        at_limit.push(b'\n');
        assert_eq!(l.push(&at_limit).len(), 1);
        let mut over = vec![b' '; RECORD_MAX - 1];
        over.splice(0..0, *b"{}");
        over.push(b'\n');
        assert!(l.push(&over).is_empty());
        assert_eq!(l.skipped, 2);
    }
}

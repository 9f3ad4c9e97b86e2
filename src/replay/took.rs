//! What the player waits on instead of a pause: the shim's own account of what it has taken in.
//!
//! Two logs, both appended to by the shim as it goes, read here from where the last look stopped:
//!
//! - the took log of a shim that watches session files (`CODA_KIMI_TOOK`, or `CODA_OPENCODE_TOOK` for the
//!   events file of OpenCode's server; given to the player as `ACP_REPLAY_TOOK`): `{"watch": DIR, "reads": [PATTERN…]}` when the shim starts watching a session folder
//!   (`{"unwatch": DIR}` when it then does not read it after all), then `{"took": PATH, "len": N}` for each file
//!   a scan read, once everything that scan made is handled
//!   (fixtures/README.md, "Waiting for the shim");
//! - the shim's trace (`CODA_SHIM_TRACE`): one `agent->shim` record per frame of the player's and one
//!   `client->shim` record per frame of the client's, written when the relay loop handles it.
//!
//! A write is taken in when the took log shows its file read up to the length the write left (after a whole
//! new content, `replace`/`write`, by a record that came after the write); a write of a file the shim does not
//! read (outside every watched folder, or matching none of its patterns) is not waited for.

use crate::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A file another process appends lines to, read on from where the last look stopped.
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    pub fn new(path: impl Into<PathBuf>) -> Tail {
        Tail { path: path.into(), offset: 0, partial: Vec::new() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole lines added since the last look (none while the file does not exist).
    pub fn lines(&mut self) -> Vec<Vec<u8>> {
        let Ok(mut f) = std::fs::File::open(&self.path) else { return Vec::new() };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        if let Ok(n) = f.read_to_end(&mut bytes) {
            self.offset += n as u64;
        }
        self.partial.extend_from_slice(&bytes);
        let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
        let rest = self.partial.split_off(last + 1);
        let whole = std::mem::replace(&mut self.partial, rest);
        whole.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect()
    }
}

/// Whether `rel` (`/`-separated) matches `pattern`: as many names, each equal or matching a `*` that stands
/// for any part of one name.
fn matches(pattern: &str, rel: &str) -> bool {
    let (p, r): (Vec<&str>, Vec<&str>) = (pattern.split('/').collect(), rel.split('/').collect());
    p.len() == r.len()
        && p.iter().zip(&r).all(|(p, r)| match p.split_once('*') {
            Some((head, tail)) => r.len() >= head.len() + tail.len() && r.starts_with(head) && r.ends_with(tail),
            None => p == r,
        })
}

/// `path` as the OS spells it: its folder with symbolic links resolved (as it is when that fails), so that a
/// path the shim names and the one the player wrote compare equal however each was reached.
pub fn os_spelling(path: &str) -> String {
    let p = Path::new(path);
    let canon = match (p.parent().filter(|d| !d.as_os_str().is_empty()), p.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir).map(|d| d.join(name)),
        _ => std::fs::canonicalize(p),
    };
    canon.map_or_else(|_| path.to_owned(), |c| c.to_string_lossy().into_owned())
}

/// What the took log has said so far.
#[derive(Default)]
pub struct Took {
    /// Watched folders and the patterns of the files the shim reads in them.
    watched: Vec<(String, Vec<String>)>,
    /// Path -> (length read, number of the record that said so).
    latest: HashMap<String, (u64, u64)>,
    /// Records read.
    seen: u64,
    /// Lines that were not records (reported once by the player).
    pub bad: usize,
}

/// A write the player waits to see taken in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// As [`os_spelling`] has it.
    pub path: String,
    /// The file's length after the write.
    pub len: u64,
    /// For a whole new content: the number of took records read before the write; a later record must show it.
    pub after: Option<u64>,
}

impl Took {
    /// Takes in the lines of the took log read since the last look.
    pub fn read(&mut self, lines: Vec<Vec<u8>>) {
        for line in lines {
            let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                self.bad += 1;
                continue;
            };
            if let Some(dir) = v.get("watch").and_then(Value::as_str) {
                let reads = v.get("reads").and_then(Value::as_array).into_iter().flatten();
                let reads = reads.filter_map(Value::as_str).map(str::to_owned).collect();
                self.watched.push((os_spelling(dir.trim_end_matches('/')), reads));
            } else if let Some(dir) = v.get("unwatch").and_then(Value::as_str) {
                let dir = os_spelling(dir.trim_end_matches('/'));
                self.watched.retain(|(d, _)| *d != dir);
            } else if let (Some(path), Some(len)) =
                (v.get("took").and_then(Value::as_str), v.get("len").and_then(Value::as_u64))
            {
                self.seen += 1;
                self.latest.insert(os_spelling(path), (len, self.seen));
            } else {
                self.bad += 1;
            }
        }
    }

    /// The number of took records read so far (for [`Written::after`]).
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Whether the shim reads `path`: inside a watched folder, matching one of its patterns.
    pub fn reads(&self, path: &str) -> bool {
        self.watched.iter().any(|(dir, reads)| {
            path.strip_prefix(dir.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|rel| reads.iter().any(|p| matches(p, rel)))
        })
    }

    /// Whether the shim has taken in the write `w` (one of a file it does not read counts as taken in).
    pub fn has_taken(&self, w: &Written) -> bool {
        if !self.reads(&w.path) {
            return true;
        }
        self.latest.get(&w.path).is_some_and(|&(len, at)| len >= w.len && w.after.is_none_or(|after| at > after))
    }
}

/// How many frames of the agent's and of the client's the shim's trace shows handled, counted from its lines
/// as they come.
#[derive(Default)]
pub struct Handled {
    pub agent: usize,
    pub client: usize,
}

impl Handled {
    pub fn read(&mut self, lines: Vec<Vec<u8>>) {
        // `{"ts":"…","dir":"agent->shim",…}`: the record's head, before the frame.
        let head = |l: &[u8], dir: &[u8]| contains(&l[..80.min(l.len())], dir);
        for l in lines {
            if head(&l, br#","dir":"agent->shim""#) {
                self.agent += 1;
            } else if head(&l, br#","dir":"client->shim""#) {
                self.client += 1;
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn patterns_stand_for_one_name_or_part_of_it() {
        assert!(matches("agents/*/wire.jsonl", "agents/main/wire.jsonl"));
        assert!(matches("agents/*/tasks/*.json", "agents/agent-0/tasks/bash-1.json"));
        assert!(!matches("agents/*/tasks/*.json", "agents/main/tasks/bash-1.json.tmp.replay"));
        assert!(!matches("agents/*/wire.jsonl", "agents/a/b/wire.jsonl"));
        assert!(!matches("agents/*/wire.jsonl", "agents/main/state.json"));
    }

    #[test]
    fn a_write_is_taken_in_once_a_scan_read_its_file_that_far() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("took.jsonl");
        let mut f = std::fs::File::create(&log).unwrap();
        let mut tail = Tail::new(&log);
        let mut took = Took::default();
        let wire = "/s/x/agents/main/wire.jsonl";
        let task = "/s/x/agents/main/tasks/t.json";
        let append = Written { path: wire.into(), len: 10, after: None };
        // Before the watch: not read, so not waited for.
        assert!(took.has_taken(&append));
        writeln!(f, r#"{{"watch":"/s/x","reads":["agents/*/wire.jsonl","agents/*/tasks/*.json"]}}"#).unwrap();
        // Half a line is not read yet.
        write!(f, r#"{{"took":"{wire}","#).unwrap();
        took.read(tail.lines());
        assert!(!took.has_taken(&append));
        assert!(took.has_taken(&Written { path: "/s/x/other.json".into(), len: 1, after: None }), "not read");
        writeln!(f, r#""len":6}}"#).unwrap();
        took.read(tail.lines());
        assert!(!took.has_taken(&append), "read to 6 of 10");
        writeln!(f, r#"{{"took":"{wire}","len":12}}"#).unwrap();
        writeln!(f, r#"{{"took":"{task}","len":3}}"#).unwrap();
        took.read(tail.lines());
        assert!(took.has_taken(&append));
        // A new content of the same length: only a record after the write shows it.
        let replace = Written { path: task.into(), len: 3, after: Some(took.seen()) };
        assert!(!took.has_taken(&replace));
        writeln!(f, "not json").unwrap();
        writeln!(f, r#"{{"took":"{task}","len":3}}"#).unwrap();
        took.read(tail.lines());
        assert!(took.has_taken(&replace));
        assert_eq!(took.bad, 1);
        // A folder announced and then left unread: its writes are not waited for.
        let later = Written { path: wire.into(), len: 20, after: None };
        assert!(!took.has_taken(&later));
        writeln!(f, r#"{{"unwatch":"/s/x"}}"#).unwrap();
        took.read(tail.lines());
        assert!(took.has_taken(&later));
    }

    #[test]
    fn a_folder_named_through_a_link_or_dot_dot_is_the_folder_it_reaches() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("tmp");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let mut took = Took::default();
        let watched = format!("{}/sub/../", link.display());
        took.read(vec![format!(r#"{{"watch":"{watched}","reads":["e.jsonl"]}}"#).into_bytes()]);
        let written = os_spelling(&real.join("e.jsonl").to_string_lossy());
        assert!(took.reads(&written));
        let w = Written { path: written, len: 5, after: None };
        assert!(!took.has_taken(&w));
        took.read(vec![format!(r#"{{"took":"{}/e.jsonl","len":5}}"#, link.display()).into_bytes()]);
        assert!(took.has_taken(&w));
    }

    #[test]
    fn handled_frames_are_the_traces_agent_and_client_records() {
        let mut h = Handled::default();
        h.read(vec![
            br#"{"ts":"2026-01-01T00:00:00.000001Z","dir":"agent->shim","frame":{}}"#.to_vec(),
            br#"{"ts":"2026-01-01T00:00:00.000001Z","dir":"shim->client","frame":{"x":",\"dir\":\"agent->shim\""}}"#
                .to_vec(),
            br#"{"ts":"2026-01-01T00:00:00.000001Z","dir":"agent->shim","line":"not json"}"#.to_vec(),
            br#"{"ts":"2026-01-01T00:00:00.000001Z","dir":"client->shim","frame":{}}"#.to_vec(),
        ]);
        assert_eq!((h.agent, h.client), (2, 1));
    }
}

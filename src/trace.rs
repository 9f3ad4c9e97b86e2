//! `--trace-file`: every frame both ways as JSONL, the way recordings are made.
//!
//! One record per frame and edge:
//! `{"ts":"<RFC 3339>","dir":"client->shim"|"shim->agent"|"agent->shim"|"shim->client","frame":<the frame>}`,
//! with `"shim":true` on frames the shim created or edited, and `"line":"<text>"` instead of `frame` for a
//! line that was not JSON-RPC. Frames are embedded as their exact bytes. The first record names the shim:
//! `{"ts":…,"dir":"shim","line":"coda-acp --profile qwen"}`, its binary and the arguments that chose its agent
//! (what `acp-replay check` runs a fixture with).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

/// Where a record was seen: the `"dir"` of a trace record (and of a fixture's, see `src/replay/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    ClientToShim,
    ShimToAgent,
    AgentToShim,
    ShimToClient,
    /// A session file written by the CLI: recordings merge these from a file log; the relay never traces one.
    AgentToFile,
    /// The shim itself: its binary and the arguments that chose its agent, as shell words (a `line`).
    Shim,
}

impl Dir {
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::ClientToShim => "client->shim",
            Dir::ShimToAgent => "shim->agent",
            Dir::AgentToShim => "agent->shim",
            Dir::ShimToClient => "shim->client",
            Dir::AgentToFile => "agent->file",
            Dir::Shim => "shim",
        }
    }

    /// The direction a record's `"dir"` names.
    pub fn parse(s: &str) -> Option<Dir> {
        [Dir::ClientToShim, Dir::ShimToAgent, Dir::AgentToShim, Dir::ShimToClient, Dir::AgentToFile, Dir::Shim]
            .into_iter()
            .find(|d| d.as_str() == s)
    }
}

pub struct Trace {
    file: Box<dyn Write + Send>,
    failed: bool,
}

impl Trace {
    pub fn open(path: &Path) -> std::io::Result<Trace> {
        // It holds every prompt and the session instruction: private (src/private_file.rs).
        let file = crate::private_file::open(path, crate::private_file::Write::Append)?;
        Ok(Trace { file: Box::new(file), failed: false })
    }

    /// Records to the process's own stdout (a duplicate of its descriptor: `/dev/stdout` is a symlink on
    /// Linux, which a trace path may not be).
    pub fn stdout() -> std::io::Result<Trace> {
        use std::os::fd::AsFd;
        let file = File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
        Ok(Trace { file: Box::new(file), failed: false })
    }

    /// Records to any writer (`relay::testing::Pair` keeps its trace in memory and checks it).
    pub fn to_writer(out: impl Write + Send + 'static) -> Trace {
        Trace { file: Box::new(out), failed: false }
    }

    /// Records a frame (`bytes` is a complete JSON value).
    pub fn frame(&mut self, dir: Dir, bytes: &[u8], shim: bool) {
        let mut rec = self.head(dir);
        if shim {
            rec.extend_from_slice(br#","shim":true"#);
        }
        rec.extend_from_slice(br#","frame":"#);
        rec.extend_from_slice(bytes);
        rec.extend_from_slice(b"}\n");
        self.write(&rec);
    }

    /// Records which shim this is: `binary` and the arguments that chose its agent (`--profile qwen`).
    pub fn shim(&mut self, binary: &str, args: &[&str]) {
        let words = std::iter::once(binary).chain(args.iter().copied());
        self.line(Dir::Shim, shell_words::join(words).as_bytes());
    }

    /// Records a line that was not a JSON-RPC frame.
    pub fn line(&mut self, dir: Dir, bytes: &[u8]) {
        let mut rec = self.head(dir);
        rec.extend_from_slice(br#","line":"#);
        rec.extend_from_slice(serde_json::Value::from(String::from_utf8_lossy(bytes)).to_string().as_bytes());
        rec.extend_from_slice(b"}\n");
        self.write(&rec);
    }

    fn head(&self, dir: Dir) -> Vec<u8> {
        let ts = humantime::format_rfc3339_micros(SystemTime::now());
        format!(r#"{{"ts":"{ts}","dir":"{}""#, dir.as_str()).into_bytes()
    }

    fn write(&mut self, rec: &[u8]) {
        // One write per record, so a killed shim leaves whole lines behind.
        if let Err(e) = self.file.write_all(rec)
            && !self.failed
        {
            self.failed = true;
            tracing::warn!("cannot write the trace file: {e}");
        }
    }
}

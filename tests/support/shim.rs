//! Runs a shim binary as Coda would, over pipes, with the scripted test agent (or any command) as child.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one frame or stderr line is waited for.
pub use super::wait::WITHIN as TIMEOUT;

/// The scripted ACP agent (`examples/test_agent.rs`), built by `cargo test` beside the binaries.
pub fn test_agent() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_coda-grok"));
    let agent = bin.parent().expect("target dir").join("examples/test_agent");
    assert!(agent.is_file(), "{} is missing: run `cargo build --examples` (cargo test builds it)", agent.display());
    // `cargo test --test x` does not rebuild examples: say so rather than test against an old agent.
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/test_agent.rs");
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(src), Some(bin)) = (modified(&source), modified(&agent)) {
        assert!(src <= bin, "{} is older than its source: run `cargo build --examples` first", agent.display());
    }
    agent
}

pub fn binary(agent: &str) -> PathBuf {
    PathBuf::from(match agent {
        "grok" => env!("CARGO_BIN_EXE_coda-grok"),
        "opencode" => env!("CARGO_BIN_EXE_coda-opencode"),
        "kimi" => env!("CARGO_BIN_EXE_coda-kimi"),
        "codex" => env!("CARGO_BIN_EXE_coda-codex"),
        "acp" => env!("CARGO_BIN_EXE_coda-acp"),
        other if other.starts_with("acp-") => env!("CARGO_BIN_EXE_coda-acp"),
        other => panic!("no binary for {other}"),
    })
}

pub struct Shim {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Receiver<String>,
    /// Every stderr line seen so far.
    pub stderr_lines: Vec<String>,
    /// The shim's trace, from where this run's records start, checked against ACP's schema when it ends.
    trace: Option<(PathBuf, u64)>,
    _trace_dir: Option<tempfile::TempDir>,
}

pub struct Builder {
    cmd: Command,
}

impl Builder {
    /// Any prepared command (e.g. a shim with a live CLI as child).
    pub fn from_command(cmd: Command) -> Builder {
        Builder { cmd }
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn env_remove(mut self, k: &str) -> Self {
        self.cmd.env_remove(k);
        self
    }

    /// Drops a `CODA_<AGENT>_COMMAND` the developer's environment may set, so the default lookup runs.
    pub fn env_remove_command(mut self) -> Self {
        for adapter in coda_shim::adapters::all() {
            self.cmd.env_remove(adapter.command_env());
        }
        self
    }

    /// Runs the shim as the leader of a process group of its own, as Coda does (its group can then be
    /// killed the way Coda kills it).
    pub fn own_group(mut self) -> Self {
        std::os::unix::process::CommandExt::process_group(&mut self.cmd, 0);
        self
    }

    pub fn arg(mut self, a: &str) -> Self {
        self.cmd.arg(a);
        self
    }

    pub fn start(mut self) -> Shim {
        let (trace, trace_dir) = self.trace();
        let mut child = self
            .cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the shim");
        let stdout = child.stdout.take().expect("stdout");
        let err_pipe = child.stderr.take().expect("stderr");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (etx, stderr) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err_pipe).lines() {
                let Ok(line) = line else { break };
                if etx.send(line).is_err() {
                    break;
                }
            }
        });
        Shim { stdin: child.stdin.take(), child, lines, stderr, stderr_lines: Vec::new(), trace, _trace_dir: trace_dir }
    }

    /// The trace this run writes (`--trace-file`, `CODA_SHIM_TRACE`, or one in a temp dir of its own when the
    /// shim relays: not for `--prompt`, `doctor`, `--help`, `--version`), and its length before the run.
    fn trace(&mut self) -> (Option<(PathBuf, u64)>, Option<tempfile::TempDir>) {
        let args: Vec<String> = self.cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let modes = ["--prompt", "--json", "doctor", "--doctor", "-V", "--version", "-h", "--help"];
        if args.iter().any(|a| modes.contains(&a.as_str()) || a.starts_with("--prompt=")) {
            return (None, None);
        }
        let given = args.iter().position(|a| a == "--trace-file").and_then(|i| args.get(i + 1)).map(PathBuf::from);
        let env = self.cmd.get_envs().find(|(k, _)| *k == "CODA_SHIM_TRACE").map(|(_, v)| v.map(PathBuf::from));
        let (path, dir) = match (given, env) {
            (Some(p), _) | (None, Some(Some(p))) => (p, None),
            (None, Some(None)) | (None, None) => {
                let dir = tempfile::tempdir().expect("a temp dir for the trace");
                let p = dir.path().join("trace.jsonl");
                self.cmd.env("CODA_SHIM_TRACE", &p);
                (p, Some(dir))
            }
        };
        let dir_of = |p: &PathBuf| self.cmd.get_current_dir().map(|d| d.join(p)).unwrap_or_else(|| p.clone());
        let path = dir_of(&path);
        let start = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        (Some((path, start)), dir)
    }
}

/// Checks the frames a shim wrote in its run against ACP's schema and Coda's shapes: panics on a break of the
/// shim's own; the peers' are listed on stderr (real CLIs break the schema in places).
pub fn check_trace(path: &std::path::Path, start: u64) {
    use std::io::{Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else { return };
    if file.seek(SeekFrom::Start(start)).is_err() {
        return;
    }
    let report = coda_shim::replay::validate::validate(BufReader::new(file));
    let (shims, peers): (Vec<_>, Vec<_>) = report.findings.iter().partition(|f| f.is_shims());
    // Each kind of break once, with how often: the CLI's are facts to report, not failures.
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for f in &peers {
        let kind = format!(
            "{} {} {} {}: {} [{}]",
            f.whose.as_str(),
            f.dir.as_str(),
            f.method.as_deref().unwrap_or("-"),
            f.at,
            f.message,
            f.rule
        );
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    for (kind, n) in &kinds {
        eprintln!("schema warning: {}: {n} x {kind}", path.display());
    }
    let list: Vec<String> = shims.iter().map(ToString::to_string).collect();
    assert!(
        list.is_empty(),
        "the shim wrote frames that break ACP's schema or Coda's shapes ({}, lines from byte {start}):\n{}",
        path.display(),
        list.join("\n")
    );
}

/// `coda-<agent> --agent-command <test agent>`.
pub fn with_test_agent(agent: &str) -> Builder {
    let mut cmd = Command::new(binary(agent));
    cmd.arg("--agent-command").arg(shell_words::quote(&test_agent().display().to_string()).into_owned());
    cmd.env_remove("CODA_SHIM_TRACE").env("CODA_SHIM_LOG", "warn");
    Builder { cmd }
}

pub fn command(agent: &str) -> Builder {
    let mut cmd = Command::new(binary(agent));
    cmd.env_remove("CODA_SHIM_TRACE");
    Builder { cmd }
}

impl Shim {
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).expect("write to shim");
        stdin.write_all(b"\n").expect("write to shim");
        stdin.flush().expect("flush");
    }

    /// Takes the shim's stdin, e.g. to write from another thread; see [`Shim::give_stdin`].
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.stdin.take().expect("stdin open")
    }

    pub fn give_stdin(&mut self, stdin: ChildStdin) {
        self.stdin = Some(stdin);
    }

    pub fn send_json(&mut self, v: &Value) {
        self.send(&v.to_string());
    }

    /// Sends a request and returns the response with that id, collecting what came before it.
    pub fn request(&mut self, id: i64, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.request_within(id, method, params, TIMEOUT)
    }

    /// [`Shim::request`] for an answer that may be slow, each frame waited for up to `wait` (a real CLI
    /// starting on a loaded machine).
    pub fn request_within(&mut self, id: i64, method: &str, params: Value, wait: Duration) -> (Value, Vec<Value>) {
        self.send_json(&serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut before = Vec::new();
        loop {
            let line = self
                .try_recv(wait)
                .unwrap_or_else(|| panic!("no frame from the shim within {wait:?}; stderr: {:?}", self.drain_stderr()));
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("shim wrote a line that is not JSON ({e}): {line}"));
            if v.get("id") == Some(&Value::from(id)) && v.get("method").is_none() {
                return (v, before);
            }
            before.push(v);
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    pub fn recv(&mut self) -> String {
        self.try_recv(TIMEOUT)
            .unwrap_or_else(|| panic!("no frame from the shim within {TIMEOUT:?}; stderr: {:?}", self.drain_stderr()))
    }

    pub fn try_recv(&mut self, wait: Duration) -> Option<String> {
        match self.lines.recv_timeout(wait) {
            Ok(line) => Some(line),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    pub fn recv_json(&mut self) -> Value {
        let line = self.recv();
        coda_shim::json::from_str(&line).unwrap_or_else(|e| panic!("shim wrote a line that is not JSON ({e}): {line}"))
    }

    /// Everything the shim writes until its stdout closes.
    pub fn rest(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(TIMEOUT) {
            out.push(line);
        }
        out
    }

    /// Every stderr line, once the shim has closed its stderr (it exited): nothing still on its way is missed.
    pub fn stderr_to_the_end(&mut self) -> Vec<String> {
        while let Ok(line) = self.stderr.recv_timeout(TIMEOUT) {
            self.stderr_lines.push(line);
        }
        self.stderr_lines.clone()
    }

    /// Waits (up to [`TIMEOUT`]) until the stderr lines so far satisfy `done`, and returns them. The shim's
    /// stderr is a pipe of its own, read on a thread: a warning written before a frame may arrive after it, so a
    /// test waits for the line it checks rather than looking at what has come so far.
    pub fn stderr_until(&mut self, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + TIMEOUT;
        self.drain_stderr();
        while !done(&self.stderr_lines) {
            match self.stderr.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => self.stderr_lines.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {what} on the shim's stderr within {TIMEOUT:?}; it wrote {:?}", self.stderr_lines)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("no {what} on the shim's stderr before it closed; it wrote {:?}", self.stderr_lines)
                }
            }
        }
        self.stderr_lines.clone()
    }

    /// Waits for a stderr line that contains `needle` (see [`Shim::stderr_until`]); returns all of stderr so far,
    /// one string.
    pub fn stderr_with(&mut self, needle: &str) -> String {
        self.stderr_until(&format!("{needle:?}"), |lines| lines.iter().any(|l| l.contains(needle))).join("\n")
    }

    /// The stderr lines that have arrived so far, for a failure message (not for a check: see
    /// [`Shim::stderr_until`] and [`Shim::stderr_to_the_end`]).
    pub fn drain_stderr(&mut self) -> Vec<String> {
        while let Ok(line) = self.stderr.try_recv() {
            self.stderr_lines.push(line);
        }
        self.stderr_lines.clone()
    }

    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "shim still running after {within:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((path, start)) = &self.trace
            && !std::thread::panicking()
        {
            check_trace(path, *start);
        }
    }
}

/// A `session/new` with Coda's instruction.
pub fn new_session_params(instruction: &str) -> Value {
    serde_json::json!({
        "cwd": "/tmp", "mcpServers": [],
        "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": instruction}]}
    })
}

pub fn prompt_params(session: &str, text: &str) -> Value {
    serde_json::json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// The prompt array the test agent reports it received (its agent_message_chunk).
pub fn received_prompt(before: &[Value]) -> Value {
    let chunk = before
        .iter()
        .rev()
        .find(|v| v.pointer("/params/update/sessionUpdate").and_then(Value::as_str) == Some("agent_message_chunk"))
        .expect("the agent reported the prompt it received");
    let report = chunk.pointer("/params/update/content/text").and_then(Value::as_str).expect("text");
    coda_shim::json::from_str(&report.replace("&lt;", "<")).expect("json")
}

/// Waits for the child (killing it after `within`) and returns what it wrote.
pub fn finish(mut child: Child, within: Duration) -> (ExitStatus, String, String) {
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the shim did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, out.join().unwrap_or_default(), err.join().unwrap_or_default())
}

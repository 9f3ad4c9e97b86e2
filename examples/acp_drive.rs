//! A small scripted ACP client for poking at agents by hand.
//!
//! Spawns an ACP agent, sends the steps of a script, prints every frame with a timestamp on stdout
//! (`->` sent, `<-` received) and answers the agent's own requests (permission requests are
//! approved, anything else gets "method not found").
//!
//! ```text
//! acp_drive --agent grok --base-url http://127.0.0.1:PORT/v1 --temp DIR [--shim PATH] STEPS...
//! acp_drive --cmd "some-agent --stdio" STEPS...
//! ```
//! With `--agent` the pinned CLI from `.live/` runs hermetically (see `tests/live-rig/src/live.rs`);
//! `--shim` runs our shim binary with that CLI as its child instead (`coda-acp` with `--profile <agent>`). Steps come from the arguments,
//! or one per line from `--script FILE`:
//!
//! | step | does |
//! | --- | --- |
//! | `initialize [JSON]` | `initialize` (JSON replaces the default params) |
//! | `new [@FILE]` | `session/new` in the work dir (with FILE's text as `systemPrompt`); remembers the session id |
//! | `list` | `session/list` of the work dir |
//! | `prompt TEXT` | `session/prompt` and waits for its answer |
//! | `prompt& TEXT` | `session/prompt` without waiting |
//! | `load` / `resume` | `session/load` / `session/resume` of the remembered session |
//! | `cancel` | `session/cancel` notification |
//! | `raw JSON` | any frame; `$SESSION` is replaced by the session id |
//! | `idle MS` | reads frames until none came for MS milliseconds |
//! | `sleep MS` | reads frames for MS milliseconds |
//! | `restart` | closes the agent and starts a fresh process |

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant, SystemTime};

use live_rig::live;
use serde_json::{Value, json};

struct Options {
    agent: Option<String>,
    base_url: Option<String>,
    temp: Option<PathBuf>,
    shim: Option<PathBuf>,
    cmd: Option<String>,
    timeout: Duration,
    steps: Vec<String>,
}

struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: Receiver<Value>,
}

struct Driver {
    command: Box<dyn Fn() -> Command>,
    cwd: String,
    agent: Agent,
    next_id: u64,
    session: Option<String>,
    start: Instant,
    timeout: Duration,
}

fn main() {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("acp_drive: {message}");
            std::process::exit(2);
        }
    };
    if let Err(message) = run(options) {
        eprintln!("acp_drive: {message}");
        std::process::exit(1);
    }
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        agent: None,
        base_url: None,
        temp: None,
        shim: None,
        cmd: None,
        timeout: Duration::from_secs(120),
        steps: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--agent" => options.agent = Some(value()?),
            "--base-url" => options.base_url = Some(value()?),
            "--temp" => options.temp = Some(PathBuf::from(value()?)),
            "--shim" => options.shim = Some(PathBuf::from(value()?)),
            "--cmd" => options.cmd = Some(value()?),
            "--timeout" => {
                options.timeout = Duration::from_secs(value()?.parse().map_err(|e| format!("--timeout: {e}"))?)
            }
            "--script" => {
                let file = value()?;
                let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
                options.steps.extend(
                    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from),
                );
            }
            _ => options.steps.push(arg),
        }
    }
    Ok(options)
}

fn run(options: Options) -> Result<(), String> {
    let (command, cwd): (Box<dyn Fn() -> Command>, String) = match (&options.agent, &options.cmd) {
        (Some(agent), _) => {
            let base_url = options.base_url.clone().ok_or("--agent needs --base-url")?;
            let temp = options.temp.clone().ok_or("--agent needs --temp")?;
            let live = live::prepare(agent, &base_url, &temp)?;
            eprintln!("acp_drive: {}", live.command_line());
            let cwd = live.workdir.to_string_lossy().into_owned();
            match options.shim.clone() {
                // `coda-acp` takes the agent's built-in profile and the hermetic command.
                Some(shim) if shim.file_name().is_some_and(|n| n == "coda-acp") => {
                    (Box::new(move || live.acp_command(&shim)), cwd)
                }
                Some(shim) => (Box::new(move || live.shim_command(&shim)), cwd),
                None => (Box::new(move || live.command()), cwd),
            }
        }
        (None, Some(cmd)) => {
            let words = shell_words::split(cmd).map_err(|e| format!("--cmd: {e}"))?;
            let (program, args) = words.split_first().ok_or("--cmd is empty")?;
            let (program, args) = (program.clone(), args.to_vec());
            let cwd = std::env::current_dir().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
            (
                Box::new(move || {
                    let mut command = Command::new(&program);
                    command.args(&args);
                    command
                }),
                cwd,
            )
        }
        (None, None) => return Err("give --agent or --cmd".into()),
    };
    let start = Instant::now();
    let agent = spawn(&command, start)?;
    let mut driver = Driver { command, cwd, agent, next_id: 0, session: None, start, timeout: options.timeout };
    for step in &options.steps {
        driver.step(step)?;
    }
    driver.close();
    Ok(())
}

fn spawn(command: &dyn Fn() -> Command, start: Instant) -> Result<Agent, String> {
    let mut command = command();
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("spawn {:?}: {e}", command.get_program()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (tx, frames) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<Value>(&line) {
                Ok(frame) => {
                    if tx.send(frame).is_err() {
                        break;
                    }
                }
                Err(_) => println!("{} <- (not JSON) {line}", stamp(start)),
            }
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{} stderr: {line}", stamp(start));
        }
    });
    let stdin = child.stdin.take();
    Ok(Agent { child, stdin, frames })
}

fn stamp(start: Instant) -> String {
    format!("{} +{:>7}ms", humantime::format_rfc3339_millis(SystemTime::now()), start.elapsed().as_millis())
}

impl Driver {
    fn step(&mut self, step: &str) -> Result<(), String> {
        let (verb, rest) = step.split_once(' ').unwrap_or((step, ""));
        let rest = rest.trim();
        match verb {
            "initialize" => {
                let params = if rest.is_empty() {
                    json!({"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":false,"writeTextFile":false},"terminal":false},
                           "clientInfo":{"name":"acp-drive","version":"0.1.0"}})
                } else {
                    serde_json::from_str(rest).map_err(|e| format!("initialize params: {e}"))?
                };
                self.request("initialize", params)?;
            }
            "new" => {
                let mut params = json!({"cwd":self.cwd,"mcpServers":[]});
                // `new @FILE`: with the file's text as Coda's session instruction.
                if let Some(path) = rest.strip_prefix('@') {
                    let text = std::fs::read_to_string(path).map_err(|e| format!("new {rest}: {e}"))?;
                    params["systemPrompt"] = json!({"mode":"append","content":[{"type":"text","text":text}]});
                }
                let result = self.request("session/new", params)?;
                self.session = result.get("sessionId").and_then(Value::as_str).map(String::from);
            }
            "list" => {
                self.request("session/list", json!({"cwd":self.cwd}))?;
            }
            "load" | "resume" => {
                let session = self.session.clone().ok_or("no session yet")?;
                self.request(&format!("session/{verb}"), json!({"sessionId":session,"cwd":self.cwd,"mcpServers":[]}))?;
            }
            "prompt" | "prompt&" => {
                let session = self.session.clone().ok_or("no session yet")?;
                let params = json!({"sessionId":session,"prompt":[{"type":"text","text":rest}]});
                if verb == "prompt" {
                    self.request("session/prompt", params)?;
                } else {
                    self.send_request("session/prompt", params)?;
                }
            }
            "cancel" => {
                let session = self.session.clone().ok_or("no session yet")?;
                self.send(json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":session}}))?;
            }
            "raw" => {
                let text = rest.replace("$SESSION", self.session.as_deref().unwrap_or(""));
                self.send(serde_json::from_str(&text).map_err(|e| format!("raw frame: {e}"))?)?;
            }
            "idle" => self.read_until_idle(Duration::from_millis(rest.parse().unwrap_or(1000)), Duration::MAX),
            "sleep" => {
                let total = Duration::from_millis(rest.parse().unwrap_or(1000));
                self.read_until_idle(total, total);
            }
            "restart" => {
                self.close();
                println!("{} -- restart", stamp(self.start));
                self.agent = spawn(&self.command, self.start)?;
            }
            other => return Err(format!("unknown step {other:?}")),
        }
        Ok(())
    }

    fn send(&mut self, frame: Value) -> Result<(), String> {
        println!("{} -> {frame}", stamp(self.start));
        let stdin = self.agent.stdin.as_mut().ok_or("agent stdin is closed")?;
        writeln!(stdin, "{frame}").and_then(|_| stdin.flush()).map_err(|e| format!("write to agent: {e}"))
    }

    fn send_request(&mut self, method: &str, params: Value) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))?;
        Ok(id)
    }

    /// Sends a request and reads frames until its answer; an error answer is printed, not fatal.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.send_request(method, params)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.agent.frames.recv_timeout(left) {
                Ok(frame) => {
                    let answered = frame.get("id") == Some(&json!(id)) && frame.get("method").is_none();
                    self.handle(&frame)?;
                    if answered {
                        return Ok(frame.get("result").cloned().unwrap_or(Value::Null));
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Err(format!("{method}: no answer within {:?}", self.timeout)),
                Err(RecvTimeoutError::Disconnected) => return Err(format!("{method}: agent closed its stdout")),
            }
        }
    }

    /// Reads frames until `quiet` passes without one, or `total` passes.
    fn read_until_idle(&mut self, quiet: Duration, total: Duration) {
        let end = Instant::now().checked_add(total);
        loop {
            let mut wait = quiet;
            if let Some(end) = end {
                wait = wait.min(end.saturating_duration_since(Instant::now()));
            }
            match self.agent.frames.recv_timeout(wait) {
                Ok(frame) => {
                    if let Err(e) = self.handle(&frame) {
                        eprintln!("acp_drive: {e}");
                    }
                }
                Err(_) => return,
            }
            if end.is_some_and(|end| Instant::now() >= end) {
                return;
            }
        }
    }

    /// Prints a received frame and answers the agent's requests.
    fn handle(&mut self, frame: &Value) -> Result<(), String> {
        println!("{} <- {frame}", stamp(self.start));
        let (Some(id), Some(method)) = (frame.get("id"), frame.get("method").and_then(Value::as_str)) else {
            return Ok(());
        };
        let reply = match method {
            "session/request_permission" => {
                let options = frame.pointer("/params/options").and_then(Value::as_array).cloned().unwrap_or_default();
                let pick = ["allow_once", "allow_always"]
                    .iter()
                    .find_map(|kind| options.iter().find(|o| o.get("kind").and_then(Value::as_str) == Some(kind)))
                    .or(options.first());
                match pick.and_then(|o| o.get("optionId")) {
                    Some(option) => {
                        json!({"jsonrpc":"2.0","id":id,"result":{"outcome":{"outcome":"selected","optionId":option}}})
                    }
                    None => json!({"jsonrpc":"2.0","id":id,"result":{"outcome":{"outcome":"cancelled"}}}),
                }
            }
            _ => {
                json!({"jsonrpc":"2.0","id":id,"error":{"code":-32601,"message":format!("Method not found: {method}")}})
            }
        };
        self.send(reply)
    }

    /// Closes the agent's stdin, waits a little, then kills it.
    fn close(&mut self) {
        self.agent.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            while let Ok(frame) = self.agent.frames.try_recv() {
                let _ = self.handle(&frame);
            }
            if let Ok(Some(status)) = self.agent.child.try_wait() {
                println!("{} -- agent exited: {status}", stamp(self.start));
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.agent.child.kill();
        let status = self.agent.child.wait();
        println!("{} -- agent killed after 5s: {status:?}", stamp(self.start));
    }
}

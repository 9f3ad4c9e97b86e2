//! What one binary is: which CLI it wraps, how it finds it, and which layers it stacks on the relay.
//! Also the command line shared by every binary.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::child::{self, AgentCommand};
use crate::cli::locate::{Located, Place};
use crate::layer::{EventSender, Layer, Stack};
use crate::lines::DEFAULT_MAX_LINE;
use crate::relay;
use crate::trace::Trace;

pub struct Adapter {
    /// Short name: `codex`, `kimi`, `grok`, `opencode`. The binary is `coda-<agent>`.
    pub agent: &'static str,
    /// The wrapped CLI as people know it ("Grok Build").
    pub cli_name: &'static str,
    /// How to install the CLI, for the not-found message.
    pub install_hint: &'static str,
    /// Finds the default command when no override is given.
    pub default_command: fn() -> Result<Found, String>,
    /// The wrapped CLI's version, for `--version` and agentInfo (runs off the critical path).
    pub version: fn(&AgentCommand) -> Option<String>,
    /// Environment set for the child unless the user's environment already sets it.
    pub env_defaults: &'static [(&'static str, &'static str)],
    /// Builds the layer stack, nearest the client first.
    pub layers: fn(&mut Setup),
}

/// A command found on this machine, with its version where finding it already told us.
pub struct Found {
    pub command: AgentCommand,
    pub version: Option<String>,
    /// Where it was found and why it was looked for there ("on PATH", "from --agent-command", …).
    pub how: String,
}

/// A started child with the adapter's layers, ready for [`crate::relay::run_with_client`].
pub(crate) struct Started {
    pub agent: child::Agent,
    pub stack: Stack,
    pub events: tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>,
}

/// Starts the child and stacks the adapter's layers over it: for the stdio relay in [`main`], and for an
/// in-process client (prompt mode, doctor). Call inside a tokio runtime.
pub(crate) fn start(adapter: &Adapter, found: &Found) -> std::io::Result<Started> {
    let env: Vec<(OsString, OsString)> = adapter
        .env_defaults
        .iter()
        .filter(|(k, _)| std::env::var_os(k).is_none())
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .chain(crate::cli::locate::child_path_var(&found.command.program))
        .collect();
    let agent = child::spawn(&found.command, &env)?;
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    let mut setup = Setup {
        command: &found.command,
        version: found.version.clone(),
        layers: vec![Box::new(crate::coda::waits::Waits::new())],
        events: tx,
    };
    (adapter.layers)(&mut setup);
    Ok(Started { agent, stack: Stack::new(setup.layers), events })
}

/// Handed to [`Adapter::layers`].
pub struct Setup<'a> {
    pub command: &'a AgentCommand,
    /// The wrapped CLI's version, when it was learnt while finding the command.
    pub version: Option<String>,
    layers: Vec<Box<dyn Layer>>,
    events: tokio::sync::mpsc::UnboundedSender<(usize, crate::layer::Event)>,
}

impl Setup<'_> {
    /// Adds a layer below the ones added so far; it gets a sender for its own events.
    pub fn add(&mut self, make: impl FnOnce(EventSender) -> Box<dyn Layer>) {
        let sender = EventSender::new(self.layers.len(), self.events.clone());
        self.layers.push(make(sender));
    }
}

impl Adapter {
    pub fn binary(&self) -> String {
        format!("coda-{}", self.agent)
    }

    pub fn command_env(&self) -> String {
        format!("CODA_{}_COMMAND", self.agent.to_ascii_uppercase())
    }

    /// The child command: `--agent-command`, else `CODA_<AGENT>_COMMAND`, else the adapter's default.
    pub fn resolve(&self, flag: Option<String>) -> Result<Found, String> {
        let env = self.command_env();
        let given = flag
            .map(|c| (c, "--agent-command".to_owned()))
            .or_else(|| std::env::var(&env).ok().filter(|c| !c.trim().is_empty()).map(|c| (c, env.clone())));
        let Some((line, source)) = given else {
            return (self.default_command)();
        };
        let words = shell_words::split(&line).map_err(|e| format!("cannot parse {source} {line:?}: {e}"))?;
        let Some((program, args)) = words.split_first() else {
            return Err(format!("{source} is empty"));
        };
        let found = find_program(program).ok_or_else(|| {
            format!("cannot find {program:?} (from {source}); check the path or install {}", self.cli_name)
        })?;
        let how = match found.how.as_str() {
            "" => format!("from {source}"),
            how => format!("from {source}, {how}"),
        };
        Ok(Found { command: AgentCommand { program: found.path, args: args.to_vec() }, version: None, how })
    }
}

/// Looks a program up like a shell would, without running one: a path with a `/` as is (`how` empty), else on
/// PATH or in the usual install places (src/locate.rs).
pub fn find_program(program: &str) -> Option<Located> {
    if program.contains('/') {
        let p = Path::new(program);
        return p.is_file().then(|| Located { path: p.to_path_buf(), how: String::new() });
    }
    crate::cli::locate::find(program, &[])
}

/// The usual default: `program args...` found on PATH, else in the usual install places.
pub fn installed(program: &str, args: &[&str], cli_name: &str, install_hint: &str) -> Result<Found, String> {
    match crate::cli::locate::find(program, &[]) {
        Some(found) => Ok(Found {
            command: AgentCommand { program: found.path, args: args.iter().map(|a| (*a).to_owned()).collect() },
            version: None,
            how: found.how,
        }),
        None => Err(not_found(program, cli_name, &[], install_hint)),
    }
}

/// "cannot find `kimi` (Kimi Code CLI) on PATH or in …; install it with: …".
pub fn not_found(program: &str, cli_name: &str, preferred: &[Place], install_hint: &str) -> String {
    format!(
        "cannot find `{program}` ({cli_name}) on PATH or in the usual install places ({}); install it with: {install_hint}",
        crate::cli::locate::searched(preferred)
    )
}

/// Runs `program args` with no stdin and returns its stdout, or `None` after `timeout` or on failure.
pub fn run_for_output(program: &Path, args: &[&str], timeout: Duration) -> Option<String> {
    let mut child = std::process::Command::new(program)
        .args(args)
        .envs(crate::cli::locate::child_path_var(program))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `<program> [script] --version`, taking the first line's last word ("1.18.33", "kimi, version 2.1.0").
/// Arguments before the `acp` subcommand are kept, so `node .../main.mjs acp` asks the script, not Node.
pub fn plain_version(cmd: &AgentCommand) -> Option<String> {
    let mut args: Vec<&str> = cmd.args.iter().map(String::as_str).take_while(|a| *a != "acp").collect();
    args.push("--version");
    let out = run_for_output(&cmd.program, &args, Duration::from_secs(10))?;
    out.lines().next()?.split_whitespace().last().map(str::to_owned)
}

struct Args {
    agent_command: Option<String>,
    trace_file: Option<PathBuf>,
    max_line: usize,
}

enum Parsed {
    Run(Args),
    Help,
    Version(Option<String>),
    /// `--prompt`: play Coda and print a transcript (src/prompt_mode.rs).
    Prompt(Args, crate::cli::prompt_mode::Options),
    /// `doctor` / `--doctor` (src/doctor.rs).
    Doctor(Option<String>),
}

fn parse_args(adapter: &Adapter) -> Result<Parsed, lexopt::Error> {
    use lexopt::prelude::*;
    let mut args = Args {
        agent_command: None,
        trace_file: std::env::var_os("CODA_SHIM_TRACE").filter(|p| !p.is_empty()).map(PathBuf::from),
        max_line: match std::env::var("CODA_SHIM_MAX_FRAME_BYTES") {
            Ok(v) => v
                .parse()
                .map_err(|_| lexopt::Error::from(format!("CODA_SHIM_MAX_FRAME_BYTES={v:?} is not a number")))?,
            Err(_) => DEFAULT_MAX_LINE,
        },
    };
    let mut version = false;
    let mut doctor = false;
    let mut prompt = crate::cli::prompt_mode::Args::default();
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Short('V') | Long("version") => version = true,
            Long("agent-command") => args.agent_command = Some(parser.value()?.string()?),
            Long("trace-file") => args.trace_file = Some(parser.value()?.into()),
            Long("max-frame-bytes") => args.max_line = parser.value()?.parse()?,
            Long("doctor") => doctor = true,
            Value(v) if v == "doctor" => doctor = true,
            Long(name) if crate::cli::prompt_mode::Args::takes(name) => {
                let name = name.to_owned();
                prompt.set(&name, &mut parser)?;
            }
            _ => return Err(arg.unexpected()),
        }
    }
    let _ = adapter;
    if version {
        return Ok(Parsed::Version(args.agent_command));
    }
    if doctor {
        return Ok(Parsed::Doctor(args.agent_command));
    }
    if let Some(options) = prompt.finish()? {
        return Ok(Parsed::Prompt(args, options));
    }
    Ok(Parsed::Run(args))
}

fn help(adapter: &Adapter) -> String {
    let bin = adapter.binary();
    let env = adapter.command_env();
    format!(
        "{bin} {version}: runs {cli} as an ACP agent that meets Coda's agent contract.

Coda (or any ACP client) talks newline-delimited JSON-RPC to {bin} on stdin/stdout; {bin} runs the
real CLI as a child and relays every frame, adding what {cli} lacks.

Usage: {bin} [OPTIONS]
       {bin} --prompt <TEXT> [PROMPT OPTIONS]   run one turn by hand, printing a transcript
       {bin} doctor                              check the wrapped CLI and its set-up

Options:
  --agent-command <CMD>    the child command and its arguments (split like a shell, never run by one)
                           [env: {env}]
  --trace-file <PATH>      append every frame, both ways, as JSONL [env: CODA_SHIM_TRACE]
  --max-frame-bytes <N>    longest frame accepted, in bytes [default: 67108864]
                           [env: CODA_SHIM_MAX_FRAME_BYTES]
  -V, --version            print this version and the wrapped CLI's
  -h, --help               print this help
{prompt_help}
Environment:
  CODA_SHIM_LOG            log filter for stderr (tracing EnvFilter syntax) [default: warn]

Exit status: the child's exit status (128 + signal when it was killed); 2 for a usage error;
127 when the CLI cannot be found.
",
        version = env!("CARGO_PKG_VERSION"),
        cli = adapter.cli_name,
        prompt_help = crate::cli::prompt_mode::HELP,
    )
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("CODA_SHIM_LOG") {
        Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("warning: CODA_SHIM_LOG={spec:?} is not a valid filter ({e}); using \"warn\"");
            EnvFilter::new("warn")
        }),
        Err(_) => EnvFilter::new("warn"),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        .init();
}

/// The whole program of one binary.
pub fn main(adapter: Adapter) -> ! {
    let bin = adapter.binary();
    let args = match parse_args(&adapter) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Help) => {
            let _ = std::io::Write::write_all(&mut std::io::stdout(), help(&adapter).as_bytes());
            std::process::exit(0)
        }
        Ok(Parsed::Version(flag)) => {
            use std::io::Write;
            // Written, not printed: a reader that stops after the first line (`| head -n 1`) is no panic.
            let mut out = std::io::stdout();
            let _ = writeln!(out, "{bin} {}", env!("CARGO_PKG_VERSION")).and_then(|()| out.flush());
            let line = match adapter.resolve(flag) {
                Ok(found) => {
                    let version = found.version.or_else(|| (adapter.version)(&found.command));
                    let version = version.unwrap_or_else(|| "version unknown".into());
                    format!("{} {version} ({})", adapter.cli_name, found.command.program.display())
                }
                Err(why) => format!("{}: not found: {why}", adapter.cli_name),
            };
            let _ = writeln!(out, "{line}");
            std::process::exit(0)
        }
        Ok(Parsed::Doctor(flag)) => {
            init_logging();
            std::process::exit(crate::cli::doctor::run(&adapter, flag))
        }
        Ok(Parsed::Prompt(args, options)) => {
            init_logging();
            std::process::exit(crate::cli::prompt_mode::main(
                &adapter,
                args.agent_command,
                args.trace_file,
                args.max_line,
                options,
            ))
        }
        Err(e) => {
            eprintln!("{bin}: {e}\nTry `{bin} --help`.");
            std::process::exit(2)
        }
    };
    init_logging();
    let found = match adapter.resolve(args.agent_command) {
        Ok(found) => found,
        Err(why) => {
            eprintln!("{bin}: {why}");
            std::process::exit(127)
        }
    };
    let trace = match &args.trace_file {
        None => None,
        Some(path) => match Trace::open(path) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("{bin}: cannot open trace file {}: {e}", path.display());
                std::process::exit(2)
            }
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{bin}: cannot start the async runtime: {e}");
            std::process::exit(1)
        }
    };
    let code = runtime.block_on(async move {
        let Started { agent, stack, events } = match start(&adapter, &found) {
            Ok(started) => started,
            Err(e) => {
                eprintln!("{bin}: cannot start {}: {e}", found.command.display());
                return 127;
            }
        };
        tracing::debug!(command = %found.command.display(), "started the agent");
        relay::run(stack, agent, events, relay::Options { max_line: args.max_line, trace }).await
    });
    // The blocking stdin reader cannot be cancelled; leave without waiting for it.
    runtime.shutdown_timeout(Duration::from_millis(50));
    std::process::exit(code)
}

//! The command line every binary shares: its options, what it is asked to do, and its `--help`.

use std::path::PathBuf;

use crate::cli::adapter::Adapter;
use crate::cli::prompt_options;
use crate::lines::DEFAULT_MAX_LINE;

/// The options every mode takes.
pub(crate) struct Args {
    pub agent_command: Option<String>,
    pub trace_file: Option<PathBuf>,
    pub max_line: usize,
}

/// What the binary is asked to do.
pub(crate) enum Parsed {
    Run(Args),
    Help,
    Version(Option<String>),
    /// `--prompt`: play Coda and print a transcript (`prompt_mode.rs`).
    Prompt(Args, prompt_options::Options),
    /// `doctor` / `--doctor` (`doctor.rs`).
    Doctor(Option<String>),
}

/// Reads the command line (and the variables that stand for options).
pub(crate) fn parse_args() -> Result<Parsed, lexopt::Error> {
    parse_args_from(std::env::args_os().skip(1).collect())
}

/// [`parse_args`] of `args` (the arguments after the program's name).
pub(crate) fn parse_args_from(argv: Vec<std::ffi::OsString>) -> Result<Parsed, lexopt::Error> {
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
    let mut prompt = prompt_options::Args::default();
    let mut parser = lexopt::Parser::from_args(argv);
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Short('V') | Long("version") => version = true,
            Long("agent-command") => args.agent_command = Some(parser.value()?.string()?),
            Long("trace-file") => args.trace_file = Some(parser.value()?.into()),
            Long("max-frame-bytes") => args.max_line = parser.value()?.parse()?,
            Long("doctor") => doctor = true,
            Value(v) if v == "doctor" => doctor = true,
            Long(name) if prompt_options::Args::takes(name) => {
                let name = name.to_owned();
                prompt.set(&name, &mut parser)?;
            }
            _ => return Err(arg.unexpected()),
        }
    }
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

/// `--help`.
pub(crate) fn help(adapter: &Adapter) -> String {
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
{prompt_help}{doctor_help}{prompt_exit}
Environment:
  CODA_SHIM_LOG            log filter for stderr (tracing EnvFilter syntax) [default: warn]

Exit status: the child's exit status (128 + signal when it was killed); 2 for a usage error;
127 when the CLI cannot be found.
",
        version = env!("CARGO_PKG_VERSION"),
        cli = adapter.cli_name,
        prompt_help = prompt_options::HELP,
        doctor_help = crate::cli::doctor::HELP,
        prompt_exit = prompt_options::EXIT_HELP,
    )
}

//! The whole program of one binary: reads its command line, then relays, runs prompt mode or runs doctor.

use std::time::Duration;

use crate::cli::adapter::{Adapter, Started, start};
use crate::cli::args::{Parsed, help, parse_args, parse_args_from};
use crate::cli::setup;
use crate::relay;

/// The whole program of one binary.
pub fn main(adapter: Adapter) -> ! {
    let parsed = parse_args();
    run(adapter, parsed, "")
}

/// [`main`] with the arguments the binary's own `main` left (`coda-acp` takes its profile first), and more text
/// for `--help`.
pub fn main_with(adapter: Adapter, args: Vec<std::ffi::OsString>, more_help: &str) -> ! {
    let parsed = parse_args_from(args);
    run(adapter, parsed, more_help)
}

fn run(adapter: Adapter, parsed: Result<Parsed, lexopt::Error>, more_help: &str) -> ! {
    let bin = adapter.binary();
    let args = match parsed {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Help) => {
            let text = help(&adapter) + more_help;
            let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
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
            setup::init_logging();
            std::process::exit(crate::cli::doctor::run(&adapter, flag))
        }
        Ok(Parsed::Prompt(args, options)) => {
            setup::init_logging();
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
    setup::init_logging();
    let found = match adapter.resolve(args.agent_command) {
        Ok(found) => found,
        Err(why) => {
            eprintln!("{bin}: {why}");
            std::process::exit(127)
        }
    };
    let trace = match &args.trace_file {
        None => None,
        Some(path) => match setup::open_trace(&bin, path) {
            Some(mut t) => {
                t.shim(&bin, adapter.manifest_args);
                Some(t)
            }
            None => std::process::exit(2),
        },
    };
    let relayed = setup::block_on(Duration::from_millis(50), async {
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
    match relayed {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            setup::no_runtime(&bin, &e);
            std::process::exit(1)
        }
    }
}

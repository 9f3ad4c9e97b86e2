//! Prompt mode's command line: its options, their `--help` text, and its exit statuses.

use std::path::PathBuf;
use std::time::Duration;

use lexopt::ValueExt;

/// Exit status of prompt mode (listed in `--help`).
pub mod exit {
    pub const END_TURN: i32 = 0;
    pub const PROMPT_ERROR: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const MAX_TOKENS: i32 = 3;
    pub const MAX_TURN_REQUESTS: i32 = 4;
    pub const REFUSAL: i32 = 5;
    pub const CANCELLED: i32 = 6;
    pub const UNKNOWN_STOP: i32 = 7;
    pub const NEEDS_LOGIN: i32 = 8;
    pub const AGENT_FAILED: i32 = 9;
    pub const WAITS_OPEN: i32 = 10;
    pub const NOT_COMPACTED: i32 = 11;
    pub const NOT_FOUND: i32 = 127;
    pub const INTERRUPTED: i32 = 130;
}

/// Prompt mode's part of `--help`.
pub const HELP: &str = "
Prompt mode (run one turn by hand; the binary plays Coda and prints a transcript):
  --prompt <TEXT>               initialize, open a session, send TEXT as the prompt
  --cwd <DIR>                   the session's working directory [default: the current directory]
  --system-prompt <TEXT|@FILE>  the session instruction (systemPrompt, append); @FILE reads it from FILE
  --load <SESSION_ID>           load this session (session/load) instead of opening a new one
  --json                        print every frame as JSONL (the --trace-file format) instead of a transcript
  --wait-timeout <DURATION>     how long to watch open _coda/wait items after the turn [default: 10m]
  --compact                     after the turn, ask _coda/session/compact (as Coda's compact-session does) and
                                print the answer
  Permission requests are asked y/n on a terminal and refused (outcome cancelled) otherwise.
  Ctrl-C sends session/cancel; a second Ctrl-C shuts the agent down.
";

/// The exit statuses in `--help`, after doctor's part.
pub const EXIT_HELP: &str = "
Prompt mode exit status:
  0 the turn ended with end_turn     1 the prompt was answered with an error other than -32000
  2 usage error                      3 stop reason max_tokens
  4 stop reason max_turn_requests    5 stop reason refusal
  6 stop reason cancelled            7 a stop reason ACP does not define
  8 the agent needs a login (-32000) 9 initialize or the session failed, or the agent exited
  10 _coda/wait items still open at --wait-timeout   11 --compact: not compacted (or compact not declared)
  127 the CLI cannot be found or started   130 stopped by a second Ctrl-C
";

/// Default for `--wait-timeout`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(600);

/// Prompt mode's options as given on the command line.
#[derive(Default)]
pub struct Args {
    prompt: Option<String>,
    cwd: Option<PathBuf>,
    system_prompt: Option<String>,
    load: Option<String>,
    json: bool,
    wait_timeout: Option<Duration>,
    compact: bool,
}

/// What prompt mode runs with.
#[derive(Debug, Clone)]
pub struct Options {
    pub prompt: String,
    pub cwd: Option<PathBuf>,
    /// The instruction text, or `@FILE`.
    pub system_prompt: Option<String>,
    pub load: Option<String>,
    pub json: bool,
    pub wait_timeout: Duration,
    /// Ask `_coda/session/compact` after the turn.
    pub compact: bool,
}

impl Args {
    /// Whether `--name` is one of prompt mode's options.
    pub(crate) fn takes(name: &str) -> bool {
        matches!(name, "prompt" | "cwd" | "system-prompt" | "load" | "json" | "wait-timeout" | "compact")
    }

    pub(crate) fn set(&mut self, name: &str, parser: &mut lexopt::Parser) -> Result<(), lexopt::Error> {
        match name {
            "prompt" => self.prompt = Some(parser.value()?.string()?),
            "cwd" => self.cwd = Some(parser.value()?.into()),
            "system-prompt" => self.system_prompt = Some(parser.value()?.string()?),
            "load" => self.load = Some(parser.value()?.string()?),
            "json" => self.json = true,
            "compact" => self.compact = true,
            "wait-timeout" => {
                let text = parser.value()?.string()?;
                self.wait_timeout = Some(parse_duration(&text).ok_or_else(|| {
                    lexopt::Error::from(format!("--wait-timeout {text:?} is not a duration (like 90s, 10m, 1h)"))
                })?);
            }
            other => return Err(lexopt::Error::from(format!("--{other} is not an option of prompt mode"))),
        }
        Ok(())
    }

    /// `Some` when `--prompt` was given; an error for prompt options without it.
    pub(crate) fn finish(self) -> Result<Option<Options>, lexopt::Error> {
        let Some(prompt) = self.prompt else {
            let stray = [
                (self.cwd.is_some(), "--cwd"),
                (self.system_prompt.is_some(), "--system-prompt"),
                (self.load.is_some(), "--load"),
                (self.json, "--json"),
                (self.wait_timeout.is_some(), "--wait-timeout"),
                (self.compact, "--compact"),
            ];
            return match stray.iter().find(|(given, _)| *given) {
                Some((_, name)) => Err(lexopt::Error::from(format!("{name} needs --prompt"))),
                None => Ok(None),
            };
        };
        Ok(Some(Options {
            prompt,
            cwd: self.cwd,
            system_prompt: self.system_prompt,
            load: self.load,
            json: self.json,
            wait_timeout: self.wait_timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT),
            compact: self.compact,
        }))
    }
}

/// `90s`, `10m`, `1h 30m` (humantime), or a bare number of seconds.
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    humantime::parse_duration(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_seconds() {
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("soon"), None);
    }
}

//! coda-acp: any ACP agent under Coda, configured by a profile (`--profile <name>`, `--profile-file <path>`) or
//! by its command alone (`--agent-command "<cmd>"`). See docs/coda-acp.md.
//!
//! What every agent gets, from the engine: the session instruction (passed on where the agent declares
//! `sessionCapabilities.systemPrompt`, else injected into the first real prompt: [`crate::coda::instruction`]),
//! `agentInfo` of the real agent ([`crate::coda::identity`]), and standard ACP subagent sessions as `_coda/wait`
//! ([`crate::coda::subagents`]). A profile adds only facts: how to find and install the agent, its version,
//! the slash commands it runs unadvertised, and whether it titles sessions with a cut-short first prompt
//! ([`titles`]). The facts behind the built-in profiles are in docs/acp-agents.md.

#[cfg(test)]
mod behaviour;
pub mod defaults_file;
pub mod failure;
pub mod profile;
pub mod qwen;
pub mod qwen_tasks;
pub mod titles;
pub mod usage;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::child::AgentCommand;
use crate::cli::adapter::{Adapter, DataHome, Setup, Tested};
use crate::cli::program::{FindError, Found, find_program, not_found, run_for_output};
use crate::coda::compact::Compaction;
use crate::coda::identity::{Identity, Policy};
use crate::coda::instruction::Instruction;
use crate::coda::slash_compact::SlashCompact;
use crate::coda::steering::{AsDeclared, Steering};
use crate::coda::subagents::Subagents;
use profile::{AgentInfoFrom, Profile, Reports, SteeringBy};

/// `&'static str` of a text the process keeps to its end (a profile is read once per process).
fn keep(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The profile of an agent given by `--agent-command` alone.
fn bare() -> Profile {
    Profile {
        name: "acp".into(),
        display_name: "the ACP agent".into(),
        command: String::new(),
        install: None,
        login: None,
        package: None,
        tested_version: None,
        agent_info_name: None,
        agent_info_from: None,
        builtin_commands: Vec::new(),
        env: Default::default(),
        data_home: None,
        truncated_titles: false,
        steering: profile::SteeringBy::AsDeclared,
        compaction: None,
        usage: None,
        failures: None,
        background: None,
        defaults_file: None,
    }
}

/// `claudeCodeVersion` of the `@anthropic-ai/claude-agent-sdk` that `command` runs with: the SDK's
/// `package.json` in a `node_modules` beside the command's script (npm hoists it, or nests it below the
/// adapter's own folder). The script is the program or any argument that names a file (a replay's player
/// plays a fixture with the SDK's manifest beside it: `fixtures/acp-claude/node_modules`).
pub fn claude_code_version(command: &AgentCommand) -> Option<String> {
    let paths = std::iter::once(command.program.clone()).chain(command.args.iter().map(PathBuf::from));
    for path in paths.filter_map(|p| std::fs::canonicalize(p).ok()) {
        for dir in path.ancestors().skip(1) {
            let manifest = dir.join("node_modules/@anthropic-ai/claude-agent-sdk/package.json");
            let Ok(text) = std::fs::read_to_string(&manifest) else { continue };
            let Ok(value) = serde_json::from_str::<Value>(&text) else { continue };
            if let Some(v) = value.get("claudeCodeVersion").and_then(Value::as_str) {
                return Some(v.to_owned());
            }
        }
    }
    None
}

/// The first word of `out`'s first line that looks like a version (`0.61.0`, `v1.2.3-beta`).
fn version_word(out: &str) -> Option<String> {
    out.lines().next()?.split_whitespace().map(|w| w.trim_start_matches('v')).find_map(|w| {
        let mut parts = w.split('.');
        let numeric = parts.next().is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
        (numeric && parts.next().is_some()).then(|| w.trim_end_matches([',', ')']).to_owned())
    })
}

/// The adapter of `coda-acp` for `profile` (`None`: an agent given by `--agent-command` alone).
pub fn adapter(profile: Option<Profile>) -> Adapter {
    adapter_for(profile, &[])
}

/// [`adapter`], with the arguments that chose the profile (for the manifest line `doctor` prints).
pub fn adapter_for(profile: Option<Profile>, chosen_by: &[String]) -> Adapter {
    adapter_with(profile, chosen_by, None)
}

/// [`adapter_for`], with one more variable for the agent (the profile's `defaults-file` of this run).
fn adapter_with(profile: Option<Profile>, chosen_by: &[String], defaults: Option<(String, String)>) -> Adapter {
    let manifest_args: &'static [&'static str] =
        Box::leak(chosen_by.iter().map(|a| keep(a.clone())).collect::<Vec<_>>().into_boxed_slice());
    let given = profile.is_some();
    let p = profile.unwrap_or_else(bare);
    let cli_name = keep(p.display_name.clone());
    let install =
        keep(p.install.clone().unwrap_or_else(|| format!("install {} (see its documentation)", p.display_name)));
    let package: Option<&'static str> = p.package.clone().map(keep);
    let tested = Tested {
        what: cli_name,
        version: keep(p.tested_version.clone().unwrap_or_default()),
        package,
        install: keep(match (&p.package, &p.tested_version) {
            (Some(package), Some(v)) => format!("npm install -g {package}@{v}"),
            _ => install.to_owned(),
        }),
    };
    let data_home = match &p.data_home {
        Some(h) => DataHome { var: keep(h.var.clone()), default: keep(h.default.clone()), sub: keep(h.sub.clone()) },
        // A profile that says nothing: `~/.<name>`, moved by no variable of its own.
        None => DataHome { var: "HOME", default: "", sub: keep(format!(".{}", p.name)) },
    };
    let env_defaults: &'static [(&'static str, &'static str)] = Box::leak(
        p.env
            .iter()
            .chain(defaults.iter().map(|(k, v)| (k, v)))
            .map(|(k, v)| (keep(k.clone()), keep(v.clone())))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    let words = if given { p.words().ok() } else { None };
    let default_command: &'static (dyn Fn() -> Result<Found, FindError> + Send + Sync) =
        Box::leak(Box::new(move || {
            let Some((program, args)) = &words else {
                return Err(FindError::NotFound(
                    "no agent to run: give --profile <name>, --profile-file <path> or --agent-command \"<cmd>\"".into(),
                ));
            };
            match find_program(program) {
                Some(found) => Ok(Found {
                    command: AgentCommand { program: found.path, args: args.clone() },
                    version: None,
                    how: found.how,
                }),
                None if program.contains('/') => Err(FindError::NotFound(format!(
                    "{program} does not exist (the profile's command); install {cli_name}: {install}"
                ))),
                None => Err(not_found(program, cli_name, &[], install)),
            }
        }));
    let from = p.agent_info_from;
    let version: &'static (dyn Fn(&AgentCommand) -> Option<String> + Send + Sync) =
        Box::leak(Box::new(move |command: &AgentCommand| {
            let own = package.and_then(|name| crate::cli::doctor::package_version_near(command, name)).or_else(|| {
                // A Node script given as `node script.js`: ask the script, not Node.
                let args: Vec<&str> = command
                    .args
                    .first()
                    .map(String::as_str)
                    .filter(|a| a.ends_with(".js") || a.ends_with(".mjs"))
                    .into_iter()
                    .chain(["--version"])
                    .collect();
                version_word(&run_for_output(&command.program, &args, Duration::from_secs(10))?)
            });
            match from {
                Some(AgentInfoFrom::ClaudeAgentSdk) => {
                    let real = claude_code_version(command).map(|v| format!("Claude Code {v}"));
                    match (own, real) {
                        (Some(own), Some(real)) => Some(format!("{own} ({real})")),
                        (own, real) => own.or(real),
                    }
                }
                None => own,
            }
        }));
    let info_name: &'static str = keep(p.agent_info_name.clone().unwrap_or_else(|| p.name.clone()));
    let builtins: &'static [&'static str] =
        Box::leak(p.builtin_commands.iter().map(|c| keep(c.clone())).collect::<Vec<_>>().into_boxed_slice());
    let truncated_titles = p.truncated_titles;
    let steering = p.steering;
    let own: Option<crate::coda::slash_compact::Own> = p.compaction.as_ref().and_then(|c| match c.reports {
        Reports::CompactionUpdate => None,
        Reports::QwenContextCompression => Some(qwen::compression as crate::coda::slash_compact::Own),
    });
    let compaction = p.compaction.as_ref().map(|c| (keep(c.command.clone()), own));
    let usage_by = p.usage.clone();
    let failures = p.failures;
    let background = p.background;
    let layers: &'static (dyn Fn(&mut Setup) + Send + Sync) = Box::leak(Box::new(move |setup: &mut Setup| {
        let identity = match from {
            Some(AgentInfoFrom::ClaudeAgentSdk) => {
                Identity::new(info_name, Policy::Replace, claude_code_version(setup.command))
            }
            None => Identity::new(info_name, Policy::FillIn, setup.version.clone()),
        };
        setup.add(|_| Box::new(identity));
        setup.add(|_| Box::new(Instruction::new(builtins)));
        if truncated_titles {
            setup.add(|_| Box::new(titles::TruncatedTitles));
        }
        match steering {
            SteeringBy::AsDeclared => setup.add(|_| Box::new(Steering::new(AsDeclared::default()))),
            SteeringBy::QwenDrain => setup.add(|_| Box::new(Steering::new(qwen::QwenSteering::new()))),
            SteeringBy::None => {}
        }
        // Below the instruction layer, so that its slash command is never the prompt an instruction joins.
        if let Some((command, own)) = compaction {
            setup.add(move |_| Box::new(Compaction::new(SlashCompact::new(cli_name, command, own))));
        }
        // Below the compaction layer: it sees the agent's reports of a compaction Coda asked for.
        let usage_by = usage_by.clone();
        let home = usage_by.as_ref().and_then(|u| u.at_load).map(|at| {
            let set = |name: &str| setup.var_os(name).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
            // Qwen Code keeps its sessions in its runtime folder, where one is set.
            let runtime = (at == profile::AtLoad::QwenChats).then(|| set("QWEN_RUNTIME_DIR")).flatten();
            runtime.unwrap_or_else(|| data_home.dir_with(|name| setup.var_os(name)))
        });
        setup.add(move |_| Box::new(usage::layer(usage_by.as_ref(), own, home)));
        setup.add(|_| Box::new(Subagents::new()));
        if background == Some(profile::BackgroundBy::QwenTasks) {
            setup.add(|_| Box::new(qwen_tasks::QwenTasks::new()));
        }
        // Next to the agent, as in the other binaries: every layer above sees Coda's answer.
        if let Some(failures) = failures {
            let patience = crate::coda::failure::retry_patience();
            setup.add(move |_| Box::new(failure::layer(failures, patience)));
        }
    }));
    Adapter {
        agent: "acp",
        cli_name,
        install_hint: install,
        tested,
        also_tested: &[],
        data_home,
        session_files: None,
        login_hint: keep(p.login.clone().unwrap_or_else(|| format!("log in as {} documents it", p.display_name))),
        default_command,
        version,
        env_defaults,
        layers,
        manifest_args,
    }
}

/// What `coda-acp --help` adds to the shared help.
pub fn help() -> String {
    format!(
        "
coda-acp runs any ACP agent; say which:
  --profile <NAME>         a built-in profile: {}
  --profile-file <PATH>    a profile of your own (TOML; see docs/coda-acp.md)
  --agent-command <CMD>    with a profile: the agent's command instead of the profile's;
                           alone: any ACP agent, with no profile
",
        profile::built_in_names().join(", ")
    )
}

/// `coda-acp`'s own options taken out of `args`: the profile it names (`None` for none), and the arguments
/// left for the shared parser. An `Err` is a usage error, said in full.
pub fn take_profile(args: Vec<std::ffi::OsString>) -> Result<(Option<Profile>, Vec<std::ffi::OsString>), String> {
    take_profile_with(args).map(|(p, rest, _)| (p, rest))
}

/// [`take_profile`], with the arguments that chose the profile as a manifest would pass them (a profile file
/// by its absolute path).
fn take_profile_with(args: Vec<std::ffi::OsString>) -> Result<Chosen, String> {
    let mut rest = Vec::new();
    let mut chosen: Option<Profile> = None;
    let mut chosen_by = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        let (flag, inline) = match text.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.to_owned())),
            _ => (text.clone(), None),
        };
        if flag != "--profile" && flag != "--profile-file" {
            rest.push(arg);
            continue;
        }
        if chosen.is_some() {
            return Err("give one profile: --profile or --profile-file, once".into());
        }
        let value = match inline {
            Some(v) => v,
            None => {
                args.next().map(|v| v.to_string_lossy().into_owned()).ok_or_else(|| format!("{flag} needs a value"))?
            }
        };
        chosen = Some(match flag.as_str() {
            "--profile" => profile::built_in(&value)?,
            _ => profile::read(Path::new(&value))?,
        });
        let value = match flag.as_str() {
            "--profile-file" => std::fs::canonicalize(&value).map_or(value, |p| p.display().to_string()),
            _ => value,
        };
        chosen_by = vec![flag, value];
    }
    Ok((chosen, rest, chosen_by))
}

/// A profile (if any), the arguments left, and the arguments that chose the profile.
type Chosen = (Option<Profile>, Vec<std::ffi::OsString>, Vec<String>);

/// The program of `coda-acp`.
pub fn main() -> ! {
    match take_profile_with(std::env::args_os().skip(1).collect()) {
        Ok((profile, rest, chosen_by)) => {
            // Before the file is prepared, so that what it says goes where every warning goes.
            crate::cli::setup::init_logging();
            let defaults =
                profile.as_ref().and_then(|p| p.defaults_file.as_ref()).and_then(defaults_file::for_this_run);
            crate::cli::binary::main_with(adapter_with(profile, &chosen_by, defaults), rest, &help())
        }
        Err(why) => {
            eprintln!("coda-acp: {why}\nTry `coda-acp --help`.");
            std::process::exit(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_a_first_line() {
        assert_eq!(version_word("0.61.0\n").as_deref(), Some("0.61.0"));
        assert_eq!(version_word("qwen v0.24.4 (abc)").as_deref(), Some("0.24.4"));
        assert_eq!(version_word("GitHub Copilot CLI 1.0.102,").as_deref(), Some("1.0.102"));
        assert_eq!(version_word("usage: x [--version]"), None);
        assert_eq!(version_word(""), None);
    }

    #[test]
    fn the_profile_options_are_taken_out_and_the_rest_left_in_order() {
        let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let (p, rest) = take_profile(os(&["--trace-file", "t", "--profile", "qwen", "doctor"])).unwrap();
        assert_eq!(p.map(|p| p.name).as_deref(), Some("qwen"));
        assert_eq!(rest, os(&["--trace-file", "t", "doctor"]));
        let (p, rest) = take_profile(os(&["--profile=gemini"])).unwrap();
        assert_eq!(p.map(|p| p.name).as_deref(), Some("gemini"));
        assert!(rest.is_empty());
        let (p, rest) = take_profile(os(&["--agent-command", "x --acp"])).unwrap();
        assert!(p.is_none());
        assert_eq!(rest, os(&["--agent-command", "x --acp"]));
        assert!(take_profile(os(&["--profile"])).unwrap_err().contains("needs a value"));
        assert!(take_profile(os(&["--profile", "qwen", "--profile", "gemini"])).unwrap_err().contains("once"));
        assert!(take_profile(os(&["--profile", "nope"])).unwrap_err().contains("no built-in profile"));
    }

    #[test]
    fn without_a_profile_or_command_the_error_says_what_to_give() {
        let a = adapter(None);
        assert_eq!(a.binary(), "coda-acp");
        assert_eq!(a.command_env(), "CODA_ACP_COMMAND");
        let err = (a.default_command)().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("--profile <name>") && err.contains("--agent-command"), "{err}");
    }

    #[test]
    fn a_missing_agent_says_how_to_install_it() {
        let mut p = profile::built_in("qwen").unwrap();
        p.command = "/nonexistent/qwen --acp".into();
        let err = (adapter(Some(p)).default_command)().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("@qwen-code/qwen-code@0.24.4"), "{err}");
    }

    #[test]
    fn claude_codes_version_is_read_from_the_sdk_beside_the_adapter() {
        let dir = tempfile::tempdir().unwrap();
        let modules = dir.path().join("node_modules");
        let script = modules.join("@agentclientprotocol/claude-agent-acp/dist/index.js");
        std::fs::create_dir_all(script.parent().unwrap()).unwrap();
        std::fs::write(&script, "").unwrap();
        let sdk = modules.join("@anthropic-ai/claude-agent-sdk");
        std::fs::create_dir_all(&sdk).unwrap();
        std::fs::write(sdk.join("package.json"), r#"{"version":"0.3.318","claudeCodeVersion":"2.1.318"}"#).unwrap();
        let command = AgentCommand { program: "/usr/bin/node".into(), args: vec![script.display().to_string()] };
        assert_eq!(claude_code_version(&command).as_deref(), Some("2.1.318"));
        let elsewhere = AgentCommand { program: "/nonexistent/node".into(), args: vec![] };
        assert_eq!(claude_code_version(&elsewhere), None);
    }
}

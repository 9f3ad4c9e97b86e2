//! What `coda-acp` knows of the agent it runs: a profile, built in (`profiles/<name>.toml`) or from a file.
//!
//! The format (TOML, documented in docs/coda-acp.md) is small and checked strictly: an unknown key, a missing
//! required one, a value of the wrong type or an empty command is an error that names the file, the key and,
//! from the TOML parser, the line. TOML rather than JSON because people write these files by hand and want
//! comments in them; the built-in profiles are written in the same format and read by the same code.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// One agent's facts, as a profile file writes them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Profile {
    /// Short name (`qwen`), for messages and `--profile`.
    pub name: String,
    /// The agent as people know it ("Qwen Code").
    pub display_name: String,
    /// The ACP command and its arguments, split like a shell (never run by one): `qwen --acp`.
    pub command: String,
    /// How to install it, for the not-found message and doctor.
    #[serde(default)]
    pub install: Option<String>,
    /// How to log in, when its own `authMethods` name no way a person can follow.
    #[serde(default)]
    pub login: Option<String>,
    /// The npm package whose `package.json` beside the command tells its version (doctor, `--version`).
    #[serde(default)]
    pub package: Option<String>,
    /// The version coda-acp was tested with (doctor compares it).
    #[serde(default)]
    pub tested_version: Option<String>,
    /// The `agentInfo.name` the client gets where the agent names none of its own.
    #[serde(default)]
    pub agent_info_name: Option<String>,
    /// Where the real agent's version comes from when the ACP command is an adapter over it:
    /// `claude-agent-sdk` (the Claude Code version its SDK bundles). Then `agentInfo` is replaced.
    #[serde(default)]
    pub agent_info_from: Option<AgentInfoFrom>,
    /// Slash commands the agent runs without advertising them (the instruction waits for the next prompt).
    #[serde(default)]
    pub builtin_commands: Vec<String>,
    /// Environment set for the agent unless the user's environment sets it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where the agent keeps its data.
    #[serde(default)]
    pub data_home: Option<DataHomeSpec>,
    /// The agent titles sessions with the start of the first prompt, cut short (Qwen Code): a title or preview
    /// that starts with the instruction block but lost its end is the instruction, and is blanked.
    #[serde(default)]
    pub truncated_titles: bool,
    /// How the agent takes a message into a running turn (Coda's steering); see [`SteeringBy`].
    #[serde(default)]
    pub steering: SteeringBy,
    /// The slash command the agent compacts with, and how it reports the compaction; absent: Coda's
    /// `_coda/session/compact` is not declared.
    #[serde(default)]
    pub compaction: Option<CompactionBy>,
    /// What the agent's `usage_update` says, for Coda's usage facts; absent: nothing but the compactions it
    /// reports.
    #[serde(default)]
    pub usage: Option<UsageBy>,
    /// Where the agent says why a turn failed, for Coda's failure kinds; absent: nowhere (no kind is given).
    #[serde(default)]
    pub failures: Option<FailuresBy>,
    /// Work the agent runs past a turn that coda-acp reports as `_coda/wait` from its own frames; absent: none
    /// (standard ACP subagent sessions are reported for every agent).
    #[serde(default)]
    pub background: Option<BackgroundBy>,
    /// Settings the agent gets as a layer of its own under the user's, through a file a variable names
    /// (`defaults_file`); absent: none.
    #[serde(default)]
    pub defaults_file: Option<DefaultsFile>,
}

/// Defaults for settings the agent takes from no flag or variable, as its lowest settings layer (see
/// `adapters/acp/defaults_file.rs`): coda-acp writes a file per run with the machine's own file of that layer and
/// `settings` over it, and names it to the agent in `var` (unless the user set `var`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DefaultsFile {
    /// The variable that names the layer's file to the agent (`QWEN_CODE_SYSTEM_DEFAULTS_PATH`).
    pub var: String,
    /// The machine's own file of that layer on Linux (absolute).
    #[serde(default)]
    pub linux: Option<String>,
    /// The machine's own file of that layer on macOS (absolute).
    #[serde(default)]
    pub macos: Option<String>,
    /// A variable naming a file whose folder holds the machine's file instead, where it is set.
    #[serde(default)]
    pub beside: Option<String>,
    /// The settings, a table written as JSON over the machine's (objects merged key by key).
    pub settings: serde_json::Value,
}

impl DefaultsFile {
    /// The file's name, from the machine's paths.
    pub fn file_name(&self) -> Option<&str> {
        let path = self.linux.as_deref().or(self.macos.as_deref())?;
        Path::new(path).file_name()?.to_str()
    }
}

/// How an agent reports its background work (see [`Profile::background`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackgroundBy {
    /// Qwen Code: background shell commands (`Background shell started.` results, `_meta.backgroundTask`) and
    /// its own turns for them (`_qwencode/start_turn`, `_qwencode/end_turn`).
    QwenTasks,
}

/// What an agent's usage reports say (see [`Profile::usage`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct UsageBy {
    /// What `used` of its `usage_update` counts.
    pub used: Used,
    /// Where it says when its main thread's model request began; absent: nowhere.
    #[serde(default)]
    pub request_start: Option<RequestStart>,
    /// Where it keeps the facts of a session, read when Coda loads it; absent: nowhere read.
    #[serde(default)]
    pub at_load: Option<AtLoad>,
}

/// Where an agent keeps a session's facts, under its data folder (see [`UsageBy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AtLoad {
    /// Qwen Code: `projects/<project>/chats/<session>.jsonl` (its response records and their telemetry).
    QwenChats,
    /// Claude Code: `projects/<project>/<session>.jsonl` (its compaction boundaries).
    ClaudeProjects,
}

/// What an agent's `usage_update` `used` counts (see [`UsageBy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Used {
    /// The input of its last main-thread model request, as the provider counted it (Qwen Code's
    /// `promptTokenCount`): Coda's `contextTokens`.
    RequestContext,
    /// That input and the response's output together (Claude Agent ACP): no fact of Coda's.
    ContextAndOutput,
}

/// Where an agent says when its model request began (see [`UsageBy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RequestStart {
    /// Qwen Code: the empty `agent_message_chunk` just before its `usage_update` has `_meta.durationMs`, the
    /// time since it began sending the request.
    QwenDuration,
}

/// Where an agent says why a turn failed (see [`Profile::failures`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailuresBy {
    /// Gemini CLI: a failed turn's error answer has the upstream's HTTP status as its code, and its own
    /// classification of the upstream's reason as its message.
    GeminiStatus,
    /// Claude Agent ACP: a failed turn's error answer has the Claude Agent SDK's classification of the
    /// upstream's error in `data.errorKind`.
    ClaudeErrorKind,
    /// Qwen Code: once its own retries are over, a failed turn's error answer is `-32603` with the upstream's
    /// status first in `data.details` (`503 …`), or the code 429 for a rate limit.
    QwenStatus,
}

/// How an agent steers (see [`Profile::steering`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SteeringBy {
    /// The agent's own `_session/steering`, where its `initialize` result declares it; else none.
    #[default]
    AsDeclared,
    /// Qwen Code's pull: it asks the client for queued messages after each tool batch
    /// (`craft/drainMidTurnQueue`), and coda-acp answers with Coda's steering message.
    QwenDrain,
    /// None: the agent has no way to take a message into a running turn (steering is not declared).
    None,
}

/// How an agent compacts on request (see [`Profile::compaction`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CompactionBy {
    /// The slash command, sent as a prompt of coda-acp's own (`/compact`).
    pub command: String,
    /// Where the agent reports the compaction.
    pub reports: Reports,
}

/// Where an agent reports a compaction (see [`CompactionBy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reports {
    /// ACP's `compaction_update` (`in_progress`, `completed`, `failed` with `error`).
    CompactionUpdate,
    /// Qwen Code's `agent_message_chunk`s with `_meta.contextCompression` (`done` with its token counts).
    QwenContextCompression,
}

/// Known sources of a real agent's version (see [`Profile::agent_info_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentInfoFrom {
    /// `claudeCodeVersion` in the `package.json` of `@anthropic-ai/claude-agent-sdk` beside the command.
    ClaudeAgentSdk,
}

/// `$<var>/<sub>`, else `$HOME/<default>/<sub>` (see [`crate::cli::adapter::DataHome`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataHomeSpec {
    pub var: String,
    pub default: String,
    #[serde(default)]
    pub sub: String,
}

/// The built-in profiles: (name, text).
pub const BUILT_IN: &[(&str, &str)] = &[
    ("qwen", include_str!("profiles/qwen.toml")),
    ("gemini", include_str!("profiles/gemini.toml")),
    ("claude", include_str!("profiles/claude.toml")),
    ("copilot", include_str!("profiles/copilot.toml")),
    ("auggie", include_str!("profiles/auggie.toml")),
    ("cline", include_str!("profiles/cline.toml")),
    ("openhands", include_str!("profiles/openhands.toml")),
    ("vibe", include_str!("profiles/vibe.toml")),
    ("goose", include_str!("profiles/goose.toml")),
    ("cursor", include_str!("profiles/cursor.toml")),
];

/// The names of the built-in profiles.
pub fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(name, _)| *name).collect()
}

/// The built-in profile `name`.
pub fn built_in(name: &str) -> Result<Profile, String> {
    let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name) else {
        return Err(format!("no built-in profile {name:?}; the built-in profiles are {}", built_in_names().join(", ")));
    };
    parse(text, &format!("built-in profile {name}"))
}

/// A profile file.
pub fn read(path: &Path) -> Result<Profile, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read profile file {}: {e}", path.display()))?;
    if text.len() > 64 * 1024 {
        return Err(format!("profile file {} is {} bytes; a profile is at most 64 KiB", path.display(), text.len()));
    }
    let text = String::from_utf8(text).map_err(|_| format!("profile file {} is not UTF-8", path.display()))?;
    parse(&text, &format!("profile file {}", path.display()))
}

/// Reads and checks a profile's text; `what` names it in errors.
pub fn parse(text: &str, what: &str) -> Result<Profile, String> {
    let profile: Profile = toml::from_str(text).map_err(|e| format!("{what}: {}", e.to_string().trim_end()))?;
    profile.check().map_err(|why| format!("{what}: {why}"))?;
    Ok(profile)
}

impl Profile {
    /// The command split into program and arguments.
    pub fn words(&self) -> Result<(String, Vec<String>), String> {
        let words =
            shell_words::split(&self.command).map_err(|e| format!("cannot split command {:?}: {e}", self.command))?;
        let (program, args) = words.split_first().ok_or("command is empty")?;
        Ok((program.clone(), args.to_vec()))
    }

    fn check(&self) -> Result<(), String> {
        let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !plain(&self.name) || self.name.len() > 40 {
            return Err(format!("name {:?} must be 1 to 40 letters, digits, '-' or '_'", self.name));
        }
        if self.display_name.trim().is_empty() {
            return Err("display-name is empty".into());
        }
        self.words()?;
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(format!("env has a variable name {key:?} that cannot be set"));
            }
        }
        if self.env.values().any(|v| v.contains('\0')) {
            return Err("env has a value with a NUL byte".into());
        }
        if let Some(home) = &self.data_home
            && (home.var.is_empty() || home.var.contains('='))
        {
            return Err(format!("data-home.var {:?} is not a variable name", home.var));
        }
        if let Some(c) = &self.compaction
            && (!c.command.starts_with('/') || c.command.len() < 2 || c.command.contains(char::is_whitespace))
        {
            return Err(format!("compaction.command {:?} must be one slash command, like \"/compact\"", c.command));
        }
        if let Some(d) = &self.defaults_file {
            let var = |v: &str| !v.is_empty() && !v.contains('=') && !v.contains('\0');
            if !var(&d.var) || d.beside.as_deref().is_some_and(|b| !var(b)) {
                return Err("defaults-file.var and defaults-file.beside must be variable names".into());
            }
            for path in [&d.linux, &d.macos].into_iter().flatten() {
                if !path.starts_with('/') || path.ends_with('/') || path.contains('\0') {
                    return Err(format!("defaults-file has {path:?}; write the absolute path of a file"));
                }
            }
            if d.settings.as_object().is_none_or(|o| o.is_empty()) {
                return Err("defaults-file.settings must be a table of settings".into());
            }
        }
        for command in &self.builtin_commands {
            if command.is_empty() || command.starts_with('/') || command.contains(char::is_whitespace) {
                return Err(format!("builtin-commands has {command:?}; write a command's name without '/'"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_profile_reads_and_is_named_for_itself() {
        for (name, _) in BUILT_IN {
            let profile = built_in(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(profile.name, *name);
            assert!(profile.install.is_some(), "{name} says how to install it");
        }
        assert_eq!(built_in("claude").unwrap().agent_info_from, Some(AgentInfoFrom::ClaudeAgentSdk));
        assert!(built_in("qwen").unwrap().truncated_titles);
        let err = built_in("nobody").unwrap_err();
        assert!(err.contains("qwen, gemini, claude"), "{err}");
    }

    /// Claude Code's retries (back-off 0.5 s doubling up to 32 s, at most a quarter more of jitter) end within
    /// Coda's patience with the retry count the claude profile sets, and it is the most that do (no blip is
    /// turned into a failure sooner than needed).
    #[test]
    fn the_claude_profile_bounds_claude_codes_retries_within_codas_minute() {
        let waits = |retries: u32| -> f64 { (1..=retries).map(|n| (0.5 * 2f64.powi(n as i32 - 1)).min(32.0)).sum() };
        let profile = built_in("claude").unwrap();
        let retries: u32 = profile.env.get("CLAUDE_CODE_MAX_RETRIES").expect("the bound").parse().unwrap();
        let patience = crate::coda::failure::RETRY_PATIENCE.as_secs_f64();
        assert!(waits(retries) * 1.25 < patience, "{retries} retries wait up to {} s", waits(retries) * 1.25);
        assert!(waits(retries + 1) > patience, "one more retry ({} s) would still fit", waits(retries + 1));
    }

    #[test]
    fn a_profile_file_is_checked_with_clear_errors() {
        let ok = "name = \"mine\"\ndisplay-name = \"Mine\"\ncommand = \"'/opt/my agent/bin/mine' --acp\"\n\
            [env]\nMINE_TELEMETRY = \"0\"\n";
        let profile = parse(ok, "test").unwrap();
        assert_eq!(profile.words().unwrap(), ("/opt/my agent/bin/mine".into(), vec!["--acp".into()]));
        assert_eq!(profile.env.get("MINE_TELEMETRY").map(String::as_str), Some("0"));
        for (text, want) in [
            ("display-name = \"M\"\ncommand = \"m\"", "missing field `name`"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\ncolour = 1", "unknown field `colour`"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"\"", "command is empty"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m 'unclosed\"", "cannot split command"),
            ("name = \"a b\"\ndisplay-name = \"M\"\ncommand = \"m\"", "must be 1 to 40"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = 3", "invalid type"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\nagent-info-from = \"x\"", "unknown variant"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\nbuiltin-commands = [\"/compact\"]", "without '/'"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\n[env]\n\"A=B\" = \"1\"", "cannot be set"),
            ("name = \"m\"\n\u{0}", "test:"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\nname = \"n\"", "duplicate key"),
            ("name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\ndefaults-file = { var = \"V\" }", "missing field"),
            (
                "name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\ndefaults-file = { var = \"V\", settings = 1 }",
                "must be a table",
            ),
            (
                "name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\n\
                 defaults-file = { var = \"V\", linux = \"etc/x.json\", settings = { a = 1 } }",
                "absolute path",
            ),
            (
                "name = \"m\"\ndisplay-name = \"M\"\ncommand = \"m\"\ndefaults-file = { var = \"A=B\", settings = { a = 1 } }",
                "variable names",
            ),
        ] {
            let err = parse(text, "test").unwrap_err();
            assert!(err.starts_with("test: ") && err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_profile_file_that_is_not_text_or_too_big_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("bin.toml");
        std::fs::write(&binary, b"name = \"\xff\"").unwrap();
        assert!(read(&binary).unwrap_err().contains("not UTF-8"));
        let big = dir.path().join("big.toml");
        std::fs::write(&big, "#".repeat(70_000)).unwrap();
        assert!(read(&big).unwrap_err().contains("at most 64 KiB"));
        assert!(read(&dir.path().join("none.toml")).unwrap_err().contains("cannot read profile file"));
    }
}

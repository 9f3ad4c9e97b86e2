//! What an adapter is: the CLI a binary wraps, the facts about it, how to find it, and the layers it stacks.
//!
//! The four binaries' adapters are constants of the program (functions and texts with `'static` lifetime);
//! `coda-acp` makes its adapter once per process from a profile, whose texts and closures it leaks to get the
//! same lifetime.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::child::{self, AgentCommand};
use crate::cli::program::{FindError, Found, find_program};
use crate::layer::{AnyLayer, EventSender, Layer, Layers, Stack};

pub struct Adapter {
    /// Short name: `codex`, `kimi`, `grok`, `opencode`. The binary is `coda-<agent>`.
    pub agent: &'static str,
    /// The wrapped CLI as people know it ("Grok Build").
    pub cli_name: &'static str,
    /// How to install the CLI, for the not-found message.
    pub install_hint: &'static str,
    /// The CLI version the shim was tested with (doctor compares it).
    pub tested: Tested,
    /// Further packages the shim was tested with, each checked only where it is found (codex-acp beside the
    /// Codex CLI it runs).
    pub also_tested: &'static [Tested],
    /// Where the CLI keeps its data (sessions, logins, settings).
    pub data_home: DataHome,
    /// The CLI's session files the shim reads from its data folder, if any (recordings and replays keep them).
    pub session_files: Option<SessionFiles>,
    /// How to log in, when the CLI's own `authMethods` name no way a person can follow.
    pub login_hint: &'static str,
    /// Finds the default command when no override is given.
    pub default_command: &'static (dyn Fn() -> Result<Found, FindError> + Send + Sync),
    /// The wrapped CLI's version, for `--version` and agentInfo (runs off the critical path).
    pub version: &'static (dyn Fn(&AgentCommand) -> Option<String> + Send + Sync),
    /// Environment set for the child unless the user's environment already sets it.
    pub env_defaults: &'static [(&'static str, &'static str)],
    /// Builds the layer stack, nearest the client first.
    pub layers: &'static (dyn Fn(&mut Setup) + Send + Sync),
    /// Arguments the plugin manifest's command passes the binary (`coda-acp`'s `--profile qwen`), for `doctor`.
    pub manifest_args: &'static [&'static str],
}

/// A version the shim was tested with, and how to install it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tested {
    /// What is compared, as people know it ("Codex CLI").
    pub what: &'static str,
    /// The version tested.
    pub version: &'static str,
    /// The npm package whose `package.json` beside the command tells its version best (asking `node <script>`
    /// for `--version` gets Node's own); `None` when that package is not the thing compared.
    pub package: Option<&'static str>,
    /// The install command for exactly this version.
    pub install: &'static str,
}

/// A CLI whose session files the shim reads: a recording writes their folder as the placeholder
/// `{{<data_home.var>}}`, and `acp-replay` re-creates the recorded writes there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionFiles {
    /// Parts of paths a recording's file log leaves out: files the CLI rewrites that the shim never reads.
    pub ignored: &'static [&'static str],
}

/// Where a CLI keeps its data: `$<var>/<sub>`, else `$HOME/<default>/<sub>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHome {
    /// The environment variable that moves it (`KIMI_CODE_HOME`, or a shared base such as `XDG_DATA_HOME`).
    pub var: &'static str,
    /// What `var` stands for when it is unset or empty, relative to `$HOME` (`.kimi-code`, `.local/share`).
    pub default: &'static str,
    /// The CLI's own folder inside the one `var` names: empty when `var` names the CLI's own folder.
    pub sub: &'static str,
}

impl DataHome {
    /// Whether `var` belongs to this CLI alone, so pointing it at a fresh folder isolates just this CLI.
    pub fn owns_var(&self) -> bool {
        self.sub.is_empty()
    }

    /// The folder, with `env` answering for the environment (empty values count as unset; no `HOME` gives `~`).
    pub fn dir_with(&self, env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
        let env = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let base =
            env(self.var).unwrap_or_else(|| env("HOME").unwrap_or_else(|| PathBuf::from("~")).join(self.default));
        if self.sub.is_empty() { base } else { base.join(self.sub) }
    }

    /// The folder in this process's environment.
    pub fn dir(&self) -> PathBuf {
        self.dir_with(|name| std::env::var_os(name))
    }
}

/// A started child with the adapter's layers, ready for [`crate::relay::run_with_client`].
pub(crate) struct Started {
    pub agent: child::Agent,
    pub stack: Stack,
    pub events: tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>,
}

/// Starts the child and stacks the adapter's layers over it: for the stdio relay (`binary.rs`), and for an
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
    let (stack, events) = adapter.stack(&found.command, found.version.clone());
    Ok(Started { agent, stack, events })
}

/// The environment as set-up reads it: a variable's value, or `None`.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// What a test hands an adapter's set-up instead of the process's ([`Adapter::stack_in`]).
pub struct Given<'a> {
    /// The environment set-up reads.
    pub env: Env<'a>,
    /// Parts the set-up takes instead of making its own ([`Setup::part`]): coda-kimi takes a
    /// `adapters::kimi::watch::Driven`, whose watches the test steps itself.
    pub parts: &'a [&'a (dyn std::any::Any + Sync)],
}

/// The engine's waits layer, then what `add` (an adapter's [`Adapter::layers`]) stacks under it.
fn stack_up(
    command: &AgentCommand,
    version: Option<String>,
    given: Option<&Given>,
    layers: &mut Layers,
    add: impl FnOnce(&mut Setup),
) {
    layers.push(Box::new(crate::coda::waits::Waits::new()));
    add(&mut Setup { command, version, given, layers });
}

/// The stack [`start`] builds, over no child: what `add` stacks for `found`, in a harness (tests of a
/// binary's whole stack).
#[cfg(test)]
pub(crate) fn harness(found: &Found, add: impl FnOnce(&mut Setup)) -> crate::layer::testing::Harness {
    crate::layer::testing::Harness::build(|layers| stack_up(&found.command, found.version.clone(), None, layers, add))
}

/// A found command that is nowhere (a probe of it finds nothing), for [`harness`].
#[cfg(test)]
pub(crate) fn nowhere(version: Option<&str>) -> Found {
    let command = AgentCommand { program: PathBuf::from("/nonexistent/agent"), args: Vec::new() };
    Found { command, version: version.map(str::to_owned), how: "a test's".into() }
}

/// `n` streamed chunks of `session`, messages and thoughts in turn, each with `meta` as its `params._meta`.
#[cfg(test)]
pub(crate) fn chunks(session: &str, n: usize, meta: &serde_json::Value) -> Vec<serde_json::Value> {
    use serde_json::json;
    let kinds = ["agent_message_chunk", "agent_thought_chunk"];
    (0..n)
        .map(|i| {
            let content = json!({"type": "text", "text": format!("wörd {i}\n")});
            let params = json!({"sessionId": session, "update": {"sessionUpdate": kinds[i % 2], "content": content},
                "_meta": meta});
            json!({"jsonrpc": "2.0", "method": "session/update", "params": params})
        })
        .collect()
}

/// Sends `frames` from the agent; what reached the client, byte for byte, and checks that nothing reached the
/// agent.
#[cfg(test)]
pub(crate) fn stream(h: &mut crate::layer::testing::Harness, frames: &[serde_json::Value]) -> Vec<Vec<u8>> {
    for f in frames {
        h.agent_frame(crate::frame::Frame::from_value(f));
    }
    let out = h.take();
    assert!(out.to_agent.is_empty(), "nothing goes to the agent for a chunk");
    out.to_client.iter().map(|f| f.bytes().to_vec()).collect()
}

/// `frames` as [`stream`] sends them.
#[cfg(test)]
pub(crate) fn bytes_of(frames: &[serde_json::Value]) -> Vec<Vec<u8>> {
    frames.iter().map(|f| crate::frame::Frame::from_value(f).bytes().to_vec()).collect()
}

/// Handed to [`Adapter::layers`].
pub struct Setup<'a> {
    pub command: &'a AgentCommand,
    /// The wrapped CLI's version, when it was learnt while finding the command.
    pub version: Option<String>,
    /// What a test handed in ([`Adapter::stack_in`]); the process's environment otherwise.
    given: Option<&'a Given<'a>>,
    layers: &'a mut Layers,
}

impl Setup<'_> {
    /// The environment variable `name` as set-up reads it: the process's, or the one a test handed in
    /// ([`Adapter::stack_in`]). Set-up reads the environment through this, once; the layers get values.
    pub fn var_os(&self, name: &str) -> Option<OsString> {
        match self.given {
            Some(given) => (given.env)(name),
            None => std::env::var_os(name),
        }
    }

    /// The file log named by the environment variable `var` (opened now, appended to), when it is set and not
    /// empty; None, with a warning, when it cannot be opened.
    pub fn log(&self, var: &str) -> Option<crate::file_log::FileLog> {
        let path = self.var_os(var).filter(|p| !p.is_empty())?;
        crate::file_log::FileLog::open(var, std::path::Path::new(&path))
    }

    /// The part of type `T` a test handed in ([`Given::parts`]), if it did.
    pub fn part<T: std::any::Any>(&self) -> Option<&T> {
        self.given?.parts.iter().find_map(|p| (*p as &dyn std::any::Any).downcast_ref::<T>())
    }

    /// Adds a layer below the ones added so far; it gets a sender of its own event type.
    pub fn add<L: Layer>(&mut self, make: impl FnOnce(EventSender<L::Event>) -> Box<L>) {
        self.layers.add(make);
    }

    /// Adds a layer that takes no events below the ones added so far.
    pub fn push(&mut self, layer: Box<dyn AnyLayer>) {
        self.layers.push(layer);
    }

    /// A sender of events to every layer that takes their type ([`crate::layer::Broadcast`]).
    pub fn broadcast<E: Clone + Send + 'static>(&self) -> crate::layer::Broadcast<E> {
        self.layers.broadcast()
    }
}

/// The stack [`Adapter::stack`] builds, with `add` as the adapter's layers (an adapter's stack over parts a
/// test supplies).
pub fn stack_with(
    command: &AgentCommand,
    version: Option<String>,
    add: impl FnOnce(&mut Setup),
) -> (Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>) {
    let (mut layers, events) = Layers::new();
    stack_up(command, version, None, &mut layers, add);
    (layers.stack(), events)
}

impl Adapter {
    /// The layers a binary stacks over a CLI run as `command` (nothing is started): the handshake's
    /// [`crate::coda::waits::Waits`] at the top, then the adapter's own; with the receiver of their events.
    /// What the relay runs (`start`), and what in-memory tests drive ([`crate::relay::testing`]).
    pub fn stack(
        &self,
        command: &AgentCommand,
        version: Option<String>,
    ) -> (Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>) {
        stack_with(command, version, self.layers)
    }

    /// [`Adapter::stack`] with what set-up reads given by a test instead of the process's ([`Given`]: the
    /// simulator runs many sessions at once, each over its own CLI data folder).
    pub fn stack_in(
        &self,
        command: &AgentCommand,
        version: Option<String>,
        given: &Given,
    ) -> (Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>) {
        let (mut layers, events) = Layers::new();
        stack_up(command, version, Some(given), &mut layers, self.layers);
        (layers.stack(), events)
    }

    pub fn binary(&self) -> String {
        format!("coda-{}", self.agent)
    }

    pub fn command_env(&self) -> String {
        format!("CODA_{}_COMMAND", self.agent.to_ascii_uppercase())
    }

    /// The child command: `--agent-command`, else `CODA_<AGENT>_COMMAND`, else the adapter's default.
    pub fn resolve(&self, flag: Option<String>) -> Result<Found, FindError> {
        let env = self.command_env();
        let given = flag
            .map(|c| (c, "--agent-command".to_owned()))
            .or_else(|| std::env::var(&env).ok().filter(|c| !c.trim().is_empty()).map(|c| (c, env.clone())));
        let Some((line, source)) = given else {
            return (self.default_command)();
        };
        let words = shell_words::split(&line)
            .map_err(|e| FindError::BadCommand(format!("cannot parse {source} {line:?}: {e}")))?;
        let Some((program, args)) = words.split_first() else {
            return Err(FindError::BadCommand(format!("{source} is empty")));
        };
        let found = find_program(program).ok_or_else(|| {
            FindError::NotFound(format!(
                "cannot find {program:?} (from {source}); check the path or install {}",
                self.cli_name
            ))
        })?;
        let how = match found.how.as_str() {
            "" => format!("from {source}"),
            how => format!("from {source}, {how}"),
        };
        Ok(Found { command: AgentCommand { program: found.path, args: args.to_vec() }, version: None, how })
    }
}

#[cfg(test)]
mod tests {
    use super::DataHome;
    use std::ffi::OsString;
    use std::path::PathBuf;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn a_data_home_is_its_variable_else_its_default_under_home() {
        let own = DataHome { var: "DEMO_HOME", default: ".demo", sub: "" };
        assert!(own.owns_var());
        assert_eq!(own.dir_with(env(&[("HOME", "/h"), ("DEMO_HOME", "/d")])), PathBuf::from("/d"));
        assert_eq!(own.dir_with(env(&[("HOME", "/h"), ("DEMO_HOME", "")])), PathBuf::from("/h/.demo"));
        assert_eq!(own.dir_with(env(&[])), PathBuf::from("~/.demo"));
        let shared = DataHome { var: "XDG_DATA_HOME", default: ".local/share", sub: "demo" };
        assert!(!shared.owns_var());
        assert_eq!(shared.dir_with(env(&[("HOME", "/h")])), PathBuf::from("/h/.local/share/demo"));
        assert_eq!(shared.dir_with(env(&[("XDG_DATA_HOME", "/x")])), PathBuf::from("/x/demo"));
    }
}

//! coda-opencode: OpenCode (`opencode acp`) with Coda's session instruction, its subagents as `_coda/wait`, and
//! Coda's steering through OpenCode's own server.
//!
//! The layers, nearest the client first: the session instruction; usage facts on root `usage_update`s
//! (`usage.rs`); `_coda/session/compact` (`compact.rs`, whose HTTP calls are `summarize.rs`'s); Coda's steering
//! (`steering.rs`, whose calls on OpenCode's server are `calls.rs`'s); the permission bridge (`permissions.rs`),
//! which resumes the children the activity layer announces and answers their permission requests; the
//! activity layer (`activity.rs`: `task` calls as waits, OpenCode's own turns, failed turns). The layers do no
//! I/O: each HTTP call, and the start of the reader of OpenCode's server (`server.rs`), is a job a layer asks
//! the engine for (`Cx::work`), run off the relay loop, its result one more input of that layer.
//!
//! This file is their set-up, and the one place of the adapter that reads the environment (once, while it
//! builds the stack: `Env::read`, `server::Server::from_args`); it owns the event record's file and its writer thread
//! (`record.rs`), and builds what the jobs run: the calls on the server, or a replay's stand-ins for them, and
//! the reader, whose events it routes to the layer that acts on them.
//!
//! `opencode acp` always starts OpenCode's HTTP server (default port 4096, else any). The default command
//! gives it a free port, so the activity layer can read the server's events (`server.rs`): the only place
//! that names a subagent's child session while it runs. An agent command with its own `--port` is read the
//! same way; one without runs without the server.
//!
//! The instruction block is marked `annotations.audience: ["assistant"]`: OpenCode stores it as a synthetic
//! part that still reaches the model and comes back marked on `session/load` (checked live on 1.18.33).

pub mod activity;
pub mod calls;
pub mod compact;
pub mod failure;
#[cfg(test)]
mod off_loop;
pub mod permissions;
pub mod record;
#[cfg(test)]
mod rig;
pub mod server;
pub mod steering;
pub mod summarize;
pub mod usage;

use crate::cli::adapter::{Adapter, DataHome, Setup, Tested};
use crate::cli::program::{FindError, Found, installed, plain_version};
use crate::coda::instruction::Instruction;

const INSTALL: &str = "npm install -g opencode-ai";

/// OpenCode runs `/compact` without advertising it.
const BUILTINS: &[&str] = &["compact"];

/// `opencode acp` on a port the shim knows, so that it can read OpenCode's own server (`server.rs`).
fn default_command() -> Result<Found, FindError> {
    let mut found = installed("opencode", &["acp"], "OpenCode", INSTALL)?;
    match free_port() {
        Ok(port) => {
            found.command.args.extend(["--hostname".into(), "127.0.0.1".into(), "--port".into(), port.to_string()])
        }
        // Without --port OpenCode picks 4096 or any port: the shim runs without its server then.
        Err(e) => {
            tracing::warn!("no free local port for OpenCode's server ({e}): subagent permission requests may hang")
        }
    }
    Ok(found)
}

/// A port nobody listens on now. OpenCode binds it a moment later and exits ("ServeError", seen live) if
/// someone took it meanwhile, so it is picked below the ephemeral ranges (Linux 32768 up, macOS 49152 up),
/// where outgoing connections never take one; the OS's own pick is the fallback.
fn free_port() -> std::io::Result<u16> {
    use std::hash::BuildHasher;
    // Randomly keyed hashes (std's) as the random source: two shims starting together pick apart.
    let random = std::collections::hash_map::RandomState::new();
    for i in 0..20u64 {
        let port = 20000 + (random.hash_one(i) % 12000) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l.local_addr()?.port());
        }
    }
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Env: read OpenCode's server events from this file instead of its server (replays).
pub const EVENTS_ENV: &str = "CODA_OPENCODE_EVENTS";
/// Env: the took log of a replay (fixtures/README.md, "Waiting for the shim"): a `watch` line for the events
/// file of [`EVENTS_ENV`] at set-up, then `{"took": <events file>, "len": N}` once the layers have handled
/// every event of its first N bytes. Only with [`EVENTS_ENV`].
pub const TOOK_ENV: &str = "CODA_OPENCODE_TOOK";
/// Env: log the server events the layers handled to this file, as `acp-replay record --files` takes them.
pub const RECORD_ENV: &str = "CODA_OPENCODE_RECORD";
/// Env, for live tests only: send the `session/resume` of a child this many milliseconds late, so that the
/// child asks for permission before OpenCode knows it (the race [`permissions::ASK_GRACE`] is there for).
pub const RESUME_DELAY_ENV: &str = "CODA_OPENCODE_RESUME_DELAY_MS";
/// Where a recording says the events were read from (relative to `$TMPDIR`, like the replay puts them).
pub const EVENTS_FILE: &str = "coda-opencode-events.jsonl";

// What the set-up below uses.
use crate::file_log as record_log;
use crate::layer::EventSender;
use record::Record;
use server::{FromServer, ServerEvent};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Everything the layers need from the environment, read once at set-up.
struct Env {
    /// [`EVENTS_ENV`]: the events file of a replay.
    events: Option<PathBuf>,
    /// [`RECORD_ENV`]: where to log the events handled.
    record: Option<PathBuf>,
    /// [`TOOK_ENV`]: the took log of a replay.
    took: Option<PathBuf>,
    resume_delay: Duration,
    retry_patience: Duration,
}

impl Env {
    fn read() -> Env {
        let path = |name| std::env::var_os(name).filter(|p| !p.is_empty()).map(PathBuf::from);
        Env {
            events: path(EVENTS_ENV),
            record: path(RECORD_ENV),
            took: path(TOOK_ENV),
            resume_delay: std::env::var(RESUME_DELAY_ENV)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(Duration::ZERO, Duration::from_millis),
            retry_patience: crate::coda::failure::retry_patience(),
        }
    }
}

/// Where the layers' server events go: every layer that takes them ([`crate::layer::Broadcast`]).
pub type ServerSend = Box<dyn Fn(FromServer) -> bool + Send>;

/// Whether the relay the layers' server events go to still runs: a reader that has nothing to send (no
/// connection yet) asks it before it tries again, and stops once it is false.
pub type RelayRuns = Box<dyn Fn() -> bool + Send>;

/// Starts reading the server's events: each goes to the [`ServerSend`] it gets, until the relay stops.
pub type StartRead = Box<dyn FnOnce(ServerSend, RelayRuns) + Send>;

/// What the layers call on OpenCode's server: made from it by the set-up (or from a replay's recording); a
/// test plays it.
pub struct ServerSide {
    /// The compaction's `POST /session/{id}/summarize` (none: the server is unknown).
    pub asker: Option<compact::Asker>,
    /// The steering calls (none: the server is unknown; steering is not declared).
    pub caller: Option<steering::Caller>,
    /// The permission bridge's answers.
    pub replier: permissions::Replier,
    /// Starts reading the server's events, each handed to the function it gets (none: no server).
    pub reader: Option<StartRead>,
    /// Reads what OpenCode keeps of a session Coda loads (none: no server, or a replay).
    pub history: Option<usage::History>,
}

fn layers(setup: &mut Setup) {
    let env = Env::read();
    let server = server::Server::from_args(&setup.command.args);
    let record = match &env.record {
        None => Record::off(),
        Some(log) => {
            let events_path = env.events.clone().unwrap_or_else(|| std::env::temp_dir().join(EVENTS_FILE));
            Record::to_file(RECORD_ENV, log, events_path.display().to_string()).unwrap_or_else(Record::off)
        }
    };
    // In a replay the calls' outcomes come from the recording's events file, each once the replayed layer
    // made its call (the gates).
    let replay_gate = env.events.is_some().then(summarize::ReplayGate::default);
    let steer_gate = env.events.is_some().then(calls::Gate::default);
    let asker = match (&replay_gate, &server) {
        (Some(gate), _) => Some(gate.asker()),
        (None, Some(s)) => Some(summarize::live(s.clone())),
        (None, None) => None,
    };
    let caller = match &steer_gate {
        Some(g) => Some(g.caller()),
        None => server.clone().map(calls::caller),
    };
    let replier = replier(server.clone());
    let took = took_log(&env);
    let history = match (&env.events, server.clone()) {
        (None, Some(s)) => Some(history(s)),
        _ => None,
    };
    let reader = reader(&env, server, steer_gate, took.is_some(), replay_gate);
    let side = ServerSide { asker, caller, replier, reader, history };
    stack(setup, side, record, took, env.resume_delay, env.retry_patience);
}

/// The layers over OpenCode's server side `side`. Each server event reaches every layer that takes them,
/// in stack order ([`crate::layer::Broadcast`]); each reads what it needs.
fn stack(
    setup: &mut Setup,
    side: ServerSide,
    record: Record,
    took: Option<(record_log::FileLog, String)>,
    resume_delay: Duration,
    retry_patience: Duration,
) {
    let ServerSide { asker, caller, replier, reader, history } = side;
    let bus = setup.broadcast::<FromServer>();
    // OpenCode reports its own agentInfo ("OpenCode", version): kept as it is.
    setup.add(|_| Box::new(Instruction::new(BUILTINS).with_audience(&["assistant"])));
    // Usage facts and `_coda/session/compact` (`usage.rs`, `compact.rs`; the HTTP side in `summarize.rs`).
    let usage_record = record.clone();
    setup.add(|_: EventSender<FromServer>| Box::new(usage::layer(usage_record, history)));
    let compact_record = record.clone();
    setup.add(|_: EventSender<FromServer>| {
        Box::new(crate::coda::compact::Compaction::new(compact::OpenCodeCompact::new(asker, compact_record)))
    });
    // Steering needs the server (or a replay's record of it): declared only then.
    let steer_record = record.clone();
    setup.add(|_: EventSender<FromServer>| {
        Box::new(crate::coda::steering::Steering::new(steering::OpenCodeSteering::new(caller, steer_record)))
    });
    let bridge_record = record.clone();
    setup.add(|_: EventSender<FromServer>| {
        Box::new(permissions::Permissions::new(replier, bridge_record, resume_delay))
    });
    let start = reader.map(|read| -> activity::StartReader {
        Box::new(move || {
            let runs = bus.clone();
            read(Box::new(move |e| bus.send(e)), Box::new(move || !runs.is_closed()))
        })
    });
    setup.add(|_: EventSender<FromServer>| {
        let activity = activity::OpenCodeActivity::new(start, record);
        Box::new(match took {
            Some((log, events)) => activity.with_took(log, events),
            None => activity,
        })
    });
    // Failure kinds, next to OpenCode: its answers reach them first.
    setup.add(|_: EventSender<FromServer>| Box::new(failure::layer(retry_patience)));
}

/// coda-opencode's stack with OpenCode's server side played by a test (no record, no took log).
#[cfg(test)]
pub(crate) fn test_stack(
    command: &crate::child::AgentCommand,
    side: ServerSide,
) -> (crate::layer::Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, crate::layer::Event)>) {
    crate::cli::adapter::stack_with(command, None, |setup| {
        stack(setup, side, Record::off(), None, Duration::ZERO, crate::coda::failure::RETRY_PATIENCE)
    })
}

/// The took log of a replay ([`TOOK_ENV`], with [`EVENTS_ENV`]) and the events file as it names it, its
/// `watch` line written (at set-up: before the shim answers anything, so before the player writes an event).
/// The folder is named as the OS spells it (symbolic links resolved), the player's writes likewise.
fn took_log(env: &Env) -> Option<(record_log::FileLog, String)> {
    let (Some(events), Some(took)) = (&env.events, &env.took) else { return None };
    let log = record_log::FileLog::open(TOOK_ENV, took)?;
    let dir = events.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let dir = std::fs::canonicalize(dir).or_else(|_| std::path::absolute(dir)).unwrap_or_else(|_| dir.to_owned());
    let name = events.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = dir.display().to_string();
    log.direct().record(&serde_json::json!({ "watch": dir, "reads": [name] }));
    Some((log, format!("{dir}/{name}")))
}

/// What starts reading OpenCode's server events (or a replay's events file), once its server is up. In a
/// replay the ask the compaction layer logged holds the reader until the replayed layer has asked too
/// (`summarize::ReplayGate`).
fn reader(
    env: &Env,
    server: Option<server::Server>,
    gate: Option<calls::Gate>,
    took: bool,
    replay: Option<summarize::ReplayGate>,
) -> Option<StartRead> {
    match (&env.events, server) {
        (Some(path), _) => {
            let path = path.clone();
            let gate = gate.unwrap_or_default();
            Some(Box::new(move |send: ServerSend, _: RelayRuns| {
                let send = move |e: FromServer| match e {
                    FromServer::Event(ServerEvent::SummarizeAsked { session }) => {
                        if let Some(replay) = &replay {
                            replay.wait(&session);
                        }
                        true
                    }
                    other => send(other),
                };
                server::tail(path, took, gate.gated(send))
            }))
        }
        (None, Some(s)) => Some(Box::new(move |send: ServerSend, runs: RelayRuns| server::follow(s, send, runs))),
        (None, None) => {
            tracing::warn!(
                "OpenCode's server port is unknown (no --port in the agent command): a permission request inside a \
                 foreground subagent cannot reach Coda, and OpenCode's own turns count as over after {}s of quiet",
                activity::QUIET.as_secs()
            );
            None
        }
    }
}

/// What OpenCode's server keeps of a session's facts (an HTTP request: the usage layer runs it as a job).
fn history(server: server::Server) -> usage::History {
    Arc::new(move |session: &str, directory: &str| match server.messages(directory, session) {
        Ok(messages) => usage::facts_of_messages(&messages),
        Err(e) => {
            tracing::warn!("cannot read OpenCode's messages of a loaded session: {e}");
            Default::default()
        }
    })
}

/// Answers a permission request on OpenCode's server (an HTTP request: the bridge runs it as a job).
fn replier(server: Option<server::Server>) -> permissions::Replier {
    match server {
        Some(s) => Arc::new(move |directory: &str, id: &str, reply: &str| s.reply_permission(directory, id, reply)),
        None => Arc::new(|_: &str, _: &str, _: &str| Err("OpenCode's server is unknown to the shim".to_owned())),
    }
}

/// What `coda-opencode` is: the CLI it wraps, how it finds it, and its layers.
pub fn adapter() -> Adapter {
    Adapter {
        agent: "opencode",
        cli_name: "OpenCode",
        install_hint: INSTALL,
        tested: Tested {
            what: "OpenCode",
            version: "1.18.33",
            package: Some("opencode-ai"),
            install: "npm install -g opencode-ai@1.18.33",
        },
        also_tested: &[],
        // OpenCode follows the XDG base directories: `$XDG_DATA_HOME/opencode`, else `~/.local/share/opencode`.
        data_home: DataHome { var: "XDG_DATA_HOME", default: ".local/share", sub: "opencode" },
        session_files: None,
        login_hint: "run `opencode auth login`",
        default_command: &default_command,
        version: &plain_version,
        env_defaults: &[],
        layers: &layers,
        manifest_args: &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_took_log_starts_with_the_watch_of_the_events_files_folder_as_the_os_spells_it() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("tmp")).expect("tmp");
        let took = dir.path().join("took.jsonl");
        let env = |took: Option<PathBuf>| Env {
            // Reached through another folder, as `../tmp/…` from the work dir.
            events: Some(dir.path().join("work/../tmp").join(EVENTS_FILE)),
            record: None,
            took,
            resume_delay: Duration::ZERO,
            retry_patience: Duration::ZERO,
        };
        std::fs::create_dir(dir.path().join("work")).expect("work");
        assert!(took_log(&env(None)).is_none(), "no took log without CODA_OPENCODE_TOOK");
        let (log, events) = took_log(&env(Some(took.clone()))).expect("a took log");
        let folder = std::fs::canonicalize(dir.path().join("tmp")).expect("canon").display().to_string();
        assert_eq!(events, format!("{folder}/{EVENTS_FILE}"));
        // On disk at once, before any line of the log's thread.
        let text = std::fs::read_to_string(&took).expect("read");
        let watch: serde_json::Value = serde_json::from_str(text.trim()).expect("json");
        assert_eq!(watch, serde_json::json!({"watch": folder, "reads": [EVENTS_FILE]}));
        drop(log);
    }
}

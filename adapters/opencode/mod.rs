//! coda-opencode: OpenCode (`opencode acp`) with Coda's session instruction and its subagents as
//! `_coda/wait` (see `activity.rs`).
//!
//! `opencode acp` always starts OpenCode's HTTP server (default port 4096, else any). The default command
//! gives it a free port, so the activity layer can read the server's events (`server.rs`): the only place
//! that names a subagent's child session while it runs. An agent command with its own `--port` is read the
//! same way; one without runs without the server.
//!
//! The instruction block is marked `annotations.audience: ["assistant"]`: OpenCode stores it as a synthetic
//! part that still reaches the model and comes back marked on `session/load` (checked live on 1.18.33).

pub mod activity;
pub mod failure;
pub mod server;

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

fn layers(setup: &mut Setup) {
    // OpenCode reports its own agentInfo ("OpenCode", version): kept as it is.
    setup.add(|_| Box::new(Instruction::new(BUILTINS).with_audience(&["assistant"])));
    let server = server::Server::from_args(&setup.command.args);
    setup.add(|events| Box::new(activity::OpenCodeActivity::new(events, server)));
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
        default_command,
        version: plain_version,
        env_defaults: &[],
        layers,
    }
}

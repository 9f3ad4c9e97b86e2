//! Replays recorded fixtures through the shim binaries, with `acp-replay` standing in for the CLI.
//!
//! A fixture is `fixtures/<agent>/<scenario>/trace.jsonl` (format and rules: `fixtures/README.md`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use coda_shim::replay::{self, CheckOptions, CheckReport};

/// Longest wait for one frame during a replay.
pub const TIMEOUT: Duration = Duration::from_secs(20);

pub fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The committed fixtures of `agent`, sorted by scenario.
pub fn fixtures(agent: &str) -> Vec<PathBuf> {
    let dir = fixtures_root().join(agent);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.join(replay::TRACE_FILE).is_file()).collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The `coda-<agent>` binary cargo built for the tests.
pub use super::shim::binary as shim_binary;

pub fn player() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_acp-replay"))
}

/// Environment a shim needs under the player: coda-codex reads Codex's version from `$CODEX_PATH -V`;
/// coda-opencode reads OpenCode's server events where the recording has the player write them
/// (`{{TMPDIR}}/coda-opencode-events.jsonl`, seen from the work dir the shim runs in).
fn agent_env(agent: &str, fixture: &Path) -> Vec<(String, String)> {
    let mut env = Vec::new();
    // A fixture recorded on another Codex CLI than codex-acp's own has its own stand-in beside it.
    let own = fixture.join("codex-cli");
    let codex = if own.is_file() { own } else { fixtures_root().join("codex/codex-cli") };
    env.extend(match agent {
        // coda-grok stops a turn Grok keeps retrying after a minute by its own timer (the other shims go by the
        // times the CLI recorded): the replay need not wait that minute.
        "grok" => vec![("CODA_SHIM_RETRY_PATIENCE_MS".into(), "1000".into())],
        "codex" => vec![("CODEX_PATH".into(), codex.to_string_lossy().into_owned())],
        // coda-opencode's took log says how far its layers have handled the events file, coda-kimi's how far it
        // has taken in each session file, and their traces which of the player's frames they have handled: the
        // player waits on them (not a pause) so that the shim handles each write and each frame in the recorded
        // order (fixtures/README.md, "Waiting for the shim").
        "opencode" => vec![
            ("CODA_OPENCODE_EVENTS".into(), "../tmp/coda-opencode-events.jsonl".into()),
            ("CODA_OPENCODE_TOOK".into(), "../tmp/opencode-took.jsonl".into()),
            ("ACP_REPLAY_TOOK".into(), "../tmp/opencode-took.jsonl".into()),
            ("CODA_SHIM_TRACE".into(), "../tmp/shim-trace.jsonl".into()),
        ],
        "kimi" => vec![
            ("CODA_KIMI_TOOK".into(), "../tmp/kimi-took.jsonl".into()),
            ("ACP_REPLAY_TOOK".into(), "../tmp/kimi-took.jsonl".into()),
            ("CODA_SHIM_TRACE".into(), "../tmp/shim-trace.jsonl".into()),
        ],
        // coda-acp keeps no took log: its trace alone says which client frames it handled, so that the agent's
        // next frame reaches it in the recorded order.
        a if a.starts_with("acp-") => vec![("CODA_SHIM_TRACE".into(), "../tmp/shim-trace.jsonl".into())],
        _ => Vec::new(),
    });
    env
}

/// Replays one fixture through `coda-<agent>`.
pub fn check(agent: &str, fixture: &Path) -> Result<CheckReport, String> {
    check_with_env(agent, fixture, &[])
}

/// [`check`] with more environment for the shim (`CODA_SHIM_TRACE` to keep a trace of the replay).
pub fn check_with_env(agent: &str, fixture: &Path, extra: &[(&str, &str)]) -> Result<CheckReport, String> {
    let mut env = agent_env(agent, fixture);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let opts =
        CheckOptions { shim: shim_binary(agent), player: player(), agent: agent.to_owned(), timeout: TIMEOUT, env };
    replay::check(fixture, &opts)
}

/// Replays every fixture of `agent`; panics listing every failure. Returns how many replayed.
pub fn check_all(agent: &str) -> usize {
    check_part(agent, 0, 1)
}

/// [`check_all`] of every `parts`-th fixture from the `part`-th on (0-based), so that the replays of a CLI with
/// many fixtures run as several tests, side by side.
pub fn check_part(agent: &str, part: usize, parts: usize) -> usize {
    let fixtures: Vec<PathBuf> = fixtures(agent).into_iter().skip(part).step_by(parts).collect();
    let mut failures = Vec::new();
    for f in &fixtures {
        match check(agent, f) {
            Ok(report) => eprintln!(
                "replayed {}: {} client frames, {} received, {:?}; {} frames of the client or the CLI break ACP's schema",
                f.display(),
                report.sent,
                report.received,
                report.elapsed,
                report.peer_breaks
            ),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} {agent} fixtures failed:\n\n{}",
        failures.len(),
        fixtures.len(),
        failures.join("\n\n")
    );
    fixtures.len()
}

/// The frames of one edge of a fixture's recording, as JSON (lines that were not JSON-RPC left out).
pub fn recorded_frames(fixture: &Path, edge: replay::Dir) -> Vec<serde_json::Value> {
    let records =
        replay::load(&fixture.join(replay::TRACE_FILE)).unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
    records
        .into_iter()
        .filter(|r| r.edge == edge)
        .filter_map(|r| match r.body {
            replay::Body::Frame(text) => serde_json::from_str(&text).ok(),
            _ => None,
        })
        .collect()
}

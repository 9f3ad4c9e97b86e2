//! A run's plan: the steps of both players, each with every choice it needs, drawn from a seed ([`generate`]).
//!
//! A plan is the whole input of a run: the Coda player's actions and the CLI's faults are steps, and what the CLI
//! does for a request (a turn's chunks and end, how it answers a compaction or a steering message) rides on the
//! Coda step that causes it. So removing a step (shrinking) leaves the others meaning what they meant, and a plan
//! printed with `{:?}` is Rust that rebuilds it (with `use coda_sim::dsl::*`).

use crate::rng::Rng;

/// One step, `gap` milliseconds of virtual time after the one before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed {
    pub gap: u32,
    pub step: Step,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Coda's `initialize`, with or without `clientCapabilities._meta.coda.waits`.
    Initialize { waits: bool },
    /// `session/new`, with Coda's instruction (`fixtures/coda-instruction.md`) or without.
    NewSession { instruction: bool },
    /// `session/load` of a session Coda opened before (by its index), with the instruction.
    LoadSession { session: u8 },
    /// A `session/prompt` (text `text` of [`crate::coda::TEXTS`]); the CLI runs `turn` for it. Coda sends none while
    /// its prompt of that session is open (it queues), as the real Coda does.
    Prompt { session: u8, text: u8, turn: Turn },
    /// `session/cancel` (Stop).
    Cancel { session: u8 },
    /// `_session/steering`; `hostile`: also when the binary declares no steering or Coda runs no turn there.
    Steering { session: u8, text: u8, hostile: bool, answer: SteerAnswer },
    /// `_coda/session/compact` (only to a binary that declares it); the CLI compacts as `how` says.
    Compaction { session: u8, how: CompactOutcome },
    /// `_coda/wait/stop` of a wait Coda was told of in that session (a made-up one when there is none).
    StopWait { session: u8 },
    /// Coda answers the oldest permission request still open (allow or reject).
    AnswerPermission { allow: bool },
    /// A frame a hostile client sends.
    Hostile { frame: HostileFrame },
    /// Coda closes the shim's stdin (the run ends there).
    CloseStdin,
    /// The CLI runs a turn of its own in a session (chunks outside Coda's turns).
    OwnTurn { session: u8, chunks: u8 },
    /// The CLI dies: its output ends.
    Die,
    /// Coda ends the process (closes its stdin), starts the binary again over the same CLI (its sessions,
    /// history and subagents kept, as on disk) and loads every session it had (`session/load` in a fresh process).
    Restart,
}

/// What the CLI does for a prompt: `chunks` streamed over `ms`, a permission request half way (the rest waits
/// for its answer), work it leaves running in the background (`work`), then `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub chunks: u8,
    pub ms: u32,
    pub permission: bool,
    pub end: End,
    pub work: Work,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `stopReason: end_turn`.
    EndTurn,
    /// An upstream failure, as the CLI reports it (its retries first, where it makes them).
    EndError(Failure),
    /// The CLI never answers the prompt.
    EndNever,
    /// The CLI answers the prompt twice.
    EndTwice,
}

/// An upstream failure, each as the CLIs' recordings (`fixtures/<agent>/upstream-failures`) show it: what the
/// upstream said, and how long the CLI goes on retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A failure with no upstream reason (`Internal error`, something broke).
    FailGeneric,
    /// 429 `insufficient_quota`: the quota is used up (an explicit reason).
    FailQuota,
    /// The same with a `Retry-After` of two hours: a CLI that honours it waits silently.
    FailQuotaWait,
    /// 429 `rate_limit_exceeded`.
    FailRate,
    /// The same with a `Retry-After` of 90 s.
    FailRateWait,
    /// 500 Internal Server Error.
    FailServer,
    /// 502 Bad Gateway (a page, no error object).
    FailGateway,
    /// 503 `server_is_overloaded`.
    FailService,
    /// 529 `overloaded_error`.
    FailOverloaded,
    /// The connection closed before the answer was complete.
    FailReset,
    /// 401: a login problem.
    FailAuth,
    /// Codex's sandbox refused a command (codex-acp files it under `service` with upstream outages).
    FailSandbox,
}

impl Failure {
    /// Every failure, in the order a plan draws from.
    pub const ALL: [Failure; 12] = {
        use Failure::*;
        [
            FailGeneric,
            FailQuota,
            FailQuotaWait,
            FailRate,
            FailRateWait,
            FailServer,
            FailGateway,
            FailService,
            FailOverloaded,
            FailReset,
            FailAuth,
            FailSandbox,
        ]
    };

    /// The failure kinds Coda may be told for it (section 执行失败: only from an explicit upstream reason; a
    /// temporary failure of the server may or may not be reported as one, a quota only as `quota_exhausted`,
    /// a login problem, a local error or no reason never).
    pub fn kinds(self) -> &'static [&'static str] {
        use Failure::*;
        match self {
            FailQuota | FailQuotaWait => &["quota_exhausted"],
            FailRate | FailRateWait | FailServer | FailGateway | FailService | FailOverloaded | FailReset => {
                &["service_unavailable"]
            }
            FailGeneric | FailAuth | FailSandbox => &[],
        }
    }
}

/// Work a turn leaves running in the background: a command or a subagent, ending `ms` after the turn started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    NoWork,
    /// A background command (Codex's AIR async task, Grok's `_x.ai/task_backgrounded`).
    Task(u32, WorkEnd),
    /// A subagent (Codex's AIR subagent, Grok's background `spawn_subagent`); `again`: the session's first
    /// subagent continued (Codex's `X:generation:N`, Grok's `resume_from`) when it has one that ended.
    Subagent {
        ms: u32,
        end: WorkEnd,
        again: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkEnd {
    WorkDone,
    WorkFailed,
    /// Runs until it is stopped or the process ends.
    WorkNever,
}

/// How the CLI answers the steering message the shim hands it (Codex's `_session/steering`, Grok's
/// `_x.ai/interject`; OpenCode's server takes it at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SteerAnswer {
    /// Taken, after this many ms.
    SteerTaken(u32),
    /// Never answered.
    SteerNever,
    /// An error.
    SteerRefused,
}

/// How the CLI's compaction ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompactOutcome {
    /// Compacted after this many ms.
    CompactOk(u32),
    /// Failed after this many ms.
    CompactFail(u32),
    /// Never ends (never answered).
    CompactNever,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostileFrame {
    /// A `session/prompt` whose params have the wrong types.
    BadParams,
    /// A prompt to the latest session whose text holds a lone surrogate escape.
    LoneSurrogate,
    /// A request whose params hold `1e400`.
    HugeNumber,
    /// A request nesting 2,000 levels.
    DeepNesting,
    /// A request reusing the id of a request still open (or 1).
    ReusedId,
    /// A request whose id is a string, a fraction, null, or an object.
    OddId,
    /// A line that is not JSON.
    NotJson,
    /// A prompt to a session nobody made.
    UnknownSession,
    /// A second prompt while Coda's prompt of that session is open.
    SecondPrompt,
}

/// Names for a pasted plan: `use coda_sim::dsl::*;` brings every step and choice into scope.
pub mod dsl {
    pub use super::CompactOutcome::*;
    pub use super::End::*;
    pub use super::Failure::*;
    pub use super::HostileFrame::*;
    pub use super::SteerAnswer::*;
    pub use super::Step::*;
    pub use super::Work::*;
    pub use super::WorkEnd::*;
    pub use super::{Timed, Turn};
}

/// A gap between steps: mostly short, sometimes past the shim's deadlines (the longest, compaction's, is 9 min).
fn gap(r: &mut Rng) -> u32 {
    match r.below(100) {
        0..60 => r.range(1, 500),
        60..90 => r.range(500, 10_000),
        90..98 => r.range(10_000, 120_000),
        _ => r.range(120_000, 700_000),
    }
}

/// The upstream failures each CLI's model plays. OpenCode reports its retries only on its server's event stream,
/// which is not modelled (docs/simulation.md): for it a failure the CLI waits on for long is left out. A sandbox
/// error is Codex's.
fn failure(r: &mut Rng, agent: &str) -> Failure {
    use Failure::*;
    let all = Failure::ALL;
    loop {
        let f = all[r.below(all.len() as u32) as usize];
        let ok = match f {
            FailSandbox => agent == "codex",
            FailQuotaWait | FailRateWait => agent != "opencode",
            _ => true,
        };
        if ok {
            return f;
        }
    }
}

/// Background work of a turn: commands and subagents where the model reports them (Codex and Grok over ACP,
/// Kimi's commands in its session files; Kimi's subagents and OpenCode's are not modelled).
fn work(r: &mut Rng, agent: &str) -> Work {
    if !matches!(agent, "codex" | "grok" | "kimi") || !r.chance(25) {
        return Work::NoWork;
    }
    let ms = if r.chance(20) { r.range(60_000, 900_000) } else { r.range(100, 30_000) };
    let end = match r.below(10) {
        0..7 => WorkEnd::WorkDone,
        7..9 => WorkEnd::WorkFailed,
        _ => WorkEnd::WorkNever,
    };
    if agent == "kimi" || r.chance(50) { Work::Task(ms, end) } else { Work::Subagent { ms, end, again: r.chance(50) } }
}

fn turn(r: &mut Rng, agent: &str) -> Turn {
    let end = match r.below(100) {
        0..72 => End::EndTurn,
        72..86 => End::EndError(failure(r, agent)),
        86..94 => End::EndNever,
        _ => End::EndTwice,
    };
    let ms = if r.chance(10) { r.range(30_000, 900_000) } else { r.range(0, 20_000) };
    Turn { chunks: r.below(6) as u8, ms, permission: r.chance(20), end, work: work(r, agent) }
}

fn compact_outcome(r: &mut Rng) -> CompactOutcome {
    let ms = if r.chance(10) { r.range(60_000, 700_000) } else { r.range(0, 20_000) };
    match r.below(10) {
        0..7 => CompactOutcome::CompactOk(ms),
        7..9 => CompactOutcome::CompactFail(ms),
        _ => CompactOutcome::CompactNever,
    }
}

fn hostile(r: &mut Rng) -> HostileFrame {
    use HostileFrame::*;
    [BadParams, LoneSurrogate, HugeNumber, DeepNesting, ReusedId, OddId, NotJson, UnknownSession, SecondPrompt]
        [r.below(9) as usize]
}

/// The plan of `seed` for `agent`'s binary: an `initialize` and a session first (mostly), then 20 to 80 steps.
pub fn generate(agent: &str, seed: u64) -> Vec<Timed> {
    let mut r = Rng::new(seed);
    let mut plan = Vec::new();
    let mut push = |r: &mut Rng, step: Step| plan.push(Timed { gap: gap(r), step });
    if !r.chance(3) {
        let step = Step::Initialize { waits: !r.chance(10) };
        push(&mut r, step);
    }
    if !r.chance(3) {
        let step = Step::NewSession { instruction: !r.chance(10) };
        push(&mut r, step);
    }
    let steps = r.range(20, 80);
    for _ in 0..steps {
        let session = if r.chance(85) { 0 } else { r.below(3) as u8 };
        let step = match r.below(100) {
            0..28 => Step::Prompt { session, text: r.below(8) as u8, turn: turn(&mut r, agent) },
            28..38 => Step::Cancel { session },
            38..48 => Step::Steering {
                session,
                text: r.below(8) as u8,
                hostile: r.chance(15),
                answer: match r.below(10) {
                    0..7 => SteerAnswer::SteerTaken(r.range(0, 3_000)),
                    7..9 => SteerAnswer::SteerNever,
                    _ => SteerAnswer::SteerRefused,
                },
            },
            48..60 => Step::Compaction { session, how: compact_outcome(&mut r) },
            60..63 => Step::StopWait { session },
            63..71 => Step::AnswerPermission { allow: r.chance(70) },
            71..77 => Step::Hostile { frame: hostile(&mut r) },
            77..80 => Step::NewSession { instruction: !r.chance(10) },
            80..82 => Step::LoadSession { session },
            82..87 => Step::OwnTurn { session, chunks: r.range(1, 4) as u8 },
            87..88 if r.chance(50) => Step::Die,
            87..88 => Step::Restart,
            88..89 => Step::CloseStdin,
            89..90 => Step::Initialize { waits: !r.chance(10) },
            // A quiet stretch: only time passes.
            _ => Step::AnswerPermission { allow: true },
        };
        push(&mut r, step);
    }
    plan
}

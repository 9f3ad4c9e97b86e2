//! The deterministic simulator (`tests/sim`, docs/simulation.md) in the suite: a seed is a run byte for byte, and
//! a fixed set of seeds per binary keeps every rule but the defects listed in [`KNOWN`], each of which these seeds
//! still find (a fix takes its line off the list, and its shrunk case below turns from `should_panic` to a plain
//! test).

use std::collections::BTreeSet;

use coda_sim::{AGENTS, check_plan, generate, run};

/// Seeds each binary runs in `cargo test` (any other range: `cargo run --release --example simulate`).
const SEEDS: std::ops::Range<u64> = 0..600;

/// Rules the binaries break on this main, found by the simulator: (binary, rule, the defect).
const KNOWN: &[(&str, &str, &str)] = &[];

#[test]
fn a_seed_is_a_run_byte_for_byte() {
    for agent in AGENTS {
        for seed in [3, 17, 1_000_001] {
            let plan = generate(agent, seed);
            let (a, b) = (run(agent, &plan), run(agent, &plan));
            assert!(a.transcript.len() > 10, "{agent} {seed}: a run of something");
            if let Some(i) =
                (0..a.transcript.len().max(b.transcript.len())).find(|i| a.transcript.get(*i) != b.transcript.get(*i))
            {
                panic!(
                    "coda-{agent} seed {seed}: the runs differ at line {i}:\n{:?}\n{:?}",
                    a.transcript.get(i),
                    b.transcript.get(i)
                );
            }
            assert_eq!(a.violation, b.violation);
        }
    }
}

/// Runs the fixed seeds on `agent`'s binary: a rule not in [`KNOWN`] fails with its shrunk plan as a test, and
/// every known rule of the binary must still be found.
fn fixed_seeds(agent: &str) {
    let mut found = BTreeSet::new();
    for seed in SEEDS {
        let plan = generate(agent, seed);
        let Some((v, _, _)) = run(agent, &plan).violation else { continue };
        if KNOWN.iter().any(|(a, rule, _)| *a == agent && *rule == v.rule) {
            found.insert(v.rule);
            continue;
        }
        let mut failed = check_plan(agent, &plan).expect_err("it failed once");
        failed.seed = Some(seed);
        panic!("{failed}");
    }
    let known: BTreeSet<&str> = KNOWN.iter().filter(|(a, ..)| *a == agent).map(|(_, r, _)| *r).collect();
    assert_eq!(found, known, "coda-{agent}: the known defects these seeds find (a fixed one leaves the list)");
}

#[test]
fn fixed_seeds_codex() {
    fixed_seeds("codex");
}

#[test]
fn fixed_seeds_grok() {
    fixed_seeds("grok");
}

#[test]
fn fixed_seeds_kimi() {
    fixed_seeds("kimi");
}

#[test]
fn fixed_seeds_opencode() {
    fixed_seeds("opencode");
}

// The shrunk cases of the defects the simulator found, as it printed them: a plain test once the defect is fixed,
// `should_panic` while it is in `KNOWN`.

/// Compact, send (held behind the compaction), Stop: the held prompt must end without reaching the CLI.
fn held_prompt_then_stop() -> Vec<coda_sim::Timed> {
    use coda_sim::dsl::*;
    vec![
        Timed { gap: 1, step: Initialize { waits: true } },
        Timed { gap: 1, step: NewSession { instruction: true } },
        Timed { gap: 2064, step: Compaction { session: 0, how: CompactOk(5240) } },
        Timed {
            gap: 1,
            step: Prompt { session: 0, text: 2, turn: Turn { chunks: 3, ms: 8370, permission: false, end: EndTurn } },
        },
        Timed { gap: 1, step: Cancel { session: 0 } },
    ]
}

#[test]
fn codex_held_prompt_then_stop() {
    coda_sim::assert_holds("codex", &held_prompt_then_stop());
}

#[test]
fn grok_held_prompt_then_stop() {
    coda_sim::assert_holds("grok", &held_prompt_then_stop());
}

#[test]
fn opencode_held_prompt_then_stop() {
    coda_sim::assert_holds("opencode", &held_prompt_then_stop());
}

#[test]
fn kimi_held_prompt_then_stop() {
    coda_sim::assert_holds("kimi", &held_prompt_then_stop());
}

/// Grok never answers `_x.ai/interject`: the turn's answer (and the steering answer) must still come.
#[test]
fn grok_interjection_never_answered() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "grok",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 319,
                step: Prompt {
                    session: 0,
                    text: 2,
                    turn: Turn { chunks: 3, ms: 19427, permission: false, end: EndTurn },
                },
            },
            Timed { gap: 1, step: Steering { session: 0, text: 2, hostile: false, answer: SteerNever } },
        ],
    );
}

/// Steering while the shim's own `/compact` runs must not reach codex-acp.
#[test]
fn codex_steering_during_the_shims_compaction() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "codex",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 545234, step: Compaction { session: 0, how: CompactNever } },
            Timed { gap: 1, step: Steering { session: 0, text: 5, hostile: true, answer: SteerNever } },
        ],
    );
}

/// A sandbox error (codex-acp's category `service`) is no upstream outage: no `service_unavailable`.
#[test]
fn codex_sandbox_error_is_not_service_unavailable() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "codex",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 349,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 4, ms: 2035, permission: false, end: EndError(FailSandbox) },
                },
            },
        ],
    );
}

/// A CLI that answers a prompt twice: Coda gets one answer.
#[test]
fn a_second_answer_never_reaches_coda_on_any_binary() {
    use coda_sim::dsl::*;
    let plan = [
        Timed { gap: 1, step: NewSession { instruction: true } },
        Timed {
            gap: 8121,
            step: Prompt { session: 0, text: 4, turn: Turn { chunks: 1, ms: 1942, permission: false, end: EndTwice } },
        },
    ];
    for agent in AGENTS {
        let v = run(agent, &plan).violation.map(|(v, _, _)| v.rule);
        assert_eq!(v, None, "coda-{agent}: the second answer is dropped");
    }
}

/// A turn of OpenCode's own after a compaction: its chunks must reach Coda.
#[test]
fn opencode_own_turn_after_a_compaction() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "opencode",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 394, step: Compaction { session: 0, how: CompactOk(12544) } },
            Timed { gap: 1, step: OwnTurn { session: 0, chunks: 1 } },
        ],
    );
}

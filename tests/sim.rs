//! The deterministic simulator (`tests/sim`, docs/simulation.md) in the suite: a seed is a run byte for byte, and
//! a fixed set of seeds per binary keeps every rule but the defects listed in [`KNOWN`], each of which these seeds
//! still find (a fix takes its line off the list, and its shrunk case below turns from `should_panic` to a plain
//! test).

use std::collections::BTreeSet;

use coda_sim::{AGENTS, check_plan, generate, run};

/// Seeds each binary runs in `cargo test` (any other range: `cargo run --release --example simulate`).
const SEEDS: std::ops::Range<u64> = 0..150;

/// Rules the binaries break on this main, found by the simulator: (binary, rule, the defect).
const KNOWN: &[(&str, &str, &str)] = &[
    ("codex", "held-cancel", "Stop of a prompt held behind a compaction goes to the CLI; the prompt runs after"),
    ("grok", "held-cancel", "Stop of a prompt held behind a compaction goes to the CLI; the prompt runs after"),
    ("opencode", "held-cancel", "Stop of a prompt held behind a compaction goes to the CLI; the prompt runs after"),
    ("grok", "answered", "a turn's answer (and the steering answer) held until Grok answers `_x.ai/interject`, forever"),
    ("codex", "steering-in-turn", "`_session/steering` forwarded while the shim's own `/compact` runs"),
    ("codex", "failure", "codex-acp's `service` category (sandbox errors too) reported as service_unavailable"),
    ("opencode", "frames", "a turn of OpenCode's own after a compaction loses its chunks (no server events)"),
    ("codex", "answer-once", "a CLI's second answer to one request reaches Coda"),
    ("grok", "answer-once", "a CLI's second answer to one request reaches Coda"),
    ("kimi", "answer-once", "a CLI's second answer to one request reaches Coda"),
    ("opencode", "answer-once", "a CLI's second answer to one request reaches Coda"),
];

#[test]
fn a_seed_is_a_run_byte_for_byte() {
    for agent in AGENTS {
        for seed in [3, 17, 1_000_001] {
            let plan = generate(agent, seed);
            let (a, b) = (run(agent, &plan), run(agent, &plan));
            assert!(a.transcript.len() > 10, "{agent} {seed}: a run of something");
            if let Some(i) = (0..a.transcript.len().max(b.transcript.len()))
                .find(|i| a.transcript.get(*i) != b.transcript.get(*i))
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

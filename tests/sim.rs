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
            step: Prompt {
                session: 0,
                text: 2,
                turn: Turn { chunks: 3, ms: 8370, permission: false, end: EndTurn, work: NoWork },
            },
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
                    turn: Turn { chunks: 3, ms: 19427, permission: false, end: EndTurn, work: NoWork },
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
                    turn: Turn { chunks: 4, ms: 2035, permission: false, end: EndError(FailSandbox), work: NoWork },
                },
            },
        ],
    );
}

/// A CLI that answers a prompt twice: Coda gets one answer (the engine drops the second).
#[test]
fn a_second_answer_never_reaches_coda_on_any_binary() {
    use coda_sim::dsl::*;
    let plan = [
        Timed { gap: 1, step: NewSession { instruction: true } },
        Timed {
            gap: 8121,
            step: Prompt {
                session: 0,
                text: 4,
                turn: Turn { chunks: 1, ms: 1942, permission: false, end: EndTwice, work: NoWork },
            },
        },
    ];
    for agent in AGENTS {
        coda_sim::assert_holds(agent, &plan);
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

/// Grok retries a 500 past a minute while a steering message waits for Grok's answer to `_x.ai/interject`: the
/// shim stops the run, and the failure waits for that answer no longer than the steering machine's hold.
#[test]
fn grok_retries_past_a_minute_with_an_interjection_unanswered() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "grok",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: false } },
            Timed {
                gap: 6740,
                step: Prompt {
                    session: 0,
                    text: 4,
                    turn: Turn { chunks: 0, ms: 15652, permission: false, end: EndError(FailServer), work: NoWork },
                },
            },
            Timed { gap: 1, step: Steering { session: 0, text: 7, hostile: false, answer: SteerNever } },
        ],
    );
}

/// Without the interjection the same retries are stopped after a minute and answered as the failure.
#[test]
fn grok_retries_past_a_minute_are_stopped_and_answered_as_the_failure() {
    use coda_sim::dsl::*;
    for failure in [FailServer, FailGateway, FailService, FailOverloaded, FailReset, FailQuotaWait, FailRateWait] {
        coda_sim::assert_holds(
            "grok",
            &[
                Timed { gap: 1, step: Initialize { waits: true } },
                Timed { gap: 1, step: NewSession { instruction: false } },
                Timed {
                    gap: 6740,
                    step: Prompt {
                        session: 0,
                        text: 4,
                        turn: Turn { chunks: 2, ms: 15652, permission: false, end: EndError(failure), work: NoWork },
                    },
                },
            ],
        );
    }
}

/// A second prompt open in the session (a hostile client's) while Grok retries the first past a minute: the
/// shim's stop of the first is answered as the failure, not `cancelled`.
#[test]
fn grok_retry_stop_with_a_second_prompt_open() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "grok",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 199,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 2, ms: 16528, permission: true, end: EndError(FailQuotaWait), work: NoWork },
                },
            },
            Timed { gap: 1071, step: AnswerPermission { allow: true } },
            Timed { gap: 1, step: Hostile { frame: SecondPrompt } },
            Timed {
                gap: 3539,
                step: Prompt {
                    session: 0,
                    text: 1,
                    turn: Turn { chunks: 4, ms: 18484, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 4302, step: Compaction { session: 0, how: CompactOk(3342) } },
        ],
    );
}

/// Coda steers its prompt while Grok still runs a turn of its own (Coda's prompt queued behind it): the
/// interjection must not join Grok's turn.
#[test]
fn grok_steering_while_grok_runs_its_own_turn() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "grok",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 100, step: OwnTurn { session: 0, chunks: 2 } },
            Timed {
                gap: 220,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 1, ms: 11472, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 1, step: Steering { session: 0, text: 6, hostile: false, answer: SteerTaken(1866) } },
        ],
    );
}

/// Kimi runs a turn of its own (only in its session files) when the shim's `/compact` comes (refused: a turn is
/// active): that turn's chunks still reach Coda, from the files.
#[test]
fn kimi_own_turn_while_the_shims_compact_is_refused() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: false } },
            Timed { gap: 100, step: OwnTurn { session: 0, chunks: 2 } },
            Timed { gap: 266, step: Compaction { session: 0, how: CompactOk(3030) } },
        ],
    );
}

/// Background work on the two stacks that report it over ACP: a command and a subagent of each kind, ending every
/// way, stopped, and the process restarted (its sessions loaded in the new one), keep every rule.
#[test]
fn background_work_and_a_restart_keep_the_rules() {
    use coda_sim::dsl::*;
    for agent in ["codex", "grok"] {
        for end in [WorkDone, WorkFailed, WorkNever] {
            for work in [
                Task(3_000, end),
                Subagent { ms: 3_000, end, again: false },
                Subagent { ms: 700_000, end, again: true },
            ] {
                let turn = |work| Turn { chunks: 2, ms: 4_000, permission: false, end: EndTurn, work };
                let plan = [
                    Timed { gap: 1, step: Initialize { waits: true } },
                    Timed { gap: 1, step: NewSession { instruction: true } },
                    Timed { gap: 100, step: Prompt { session: 0, text: 0, turn: turn(work.clone()) } },
                    Timed { gap: 20_000, step: Prompt { session: 0, text: 1, turn: turn(work.clone()) } },
                    Timed { gap: 5_000, step: StopWait { session: 0 } },
                    Timed { gap: 700_000, step: Restart },
                    Timed { gap: 1_000, step: Prompt { session: 0, text: 2, turn: turn(work) } },
                ];
                coda_sim::assert_holds(agent, &plan);
            }
        }
    }
}

/// Stop of a prompt held behind a compaction (answered by the shim, never at Kimi), then a turn Kimi retries past
/// a minute: the shim stops it and must answer with the failure.
#[test]
fn kimi_retries_after_a_held_prompt_was_stopped() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 1961, step: Compaction { session: 2, how: CompactOk(360113) } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 7,
                    turn: Turn { chunks: 5, ms: 11196, permission: false, end: EndTurn, work: Task(26502, WorkDone) },
                },
            },
            Timed { gap: 1, step: Cancel { session: 0 } },
            Timed {
                gap: 7336,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn {
                        chunks: 3,
                        ms: 19857,
                        permission: false,
                        end: EndError(FailOverloaded),
                        work: Task(8344, WorkDone),
                    },
                },
            },
        ],
    );
}

/// Coda steers just after its Stop, while the turn's answer is on its way but Grok already said the turn is over:
/// the message must not reach Grok (it would run it as a turn of its own).
#[test]
fn grok_steering_after_grok_said_the_stopped_turn_is_over() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "grok",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 113, step: Restart },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 1,
                    turn: Turn { chunks: 5, ms: 18385, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 1, step: Cancel { session: 0 } },
            Timed { gap: 5, step: Steering { session: 0, text: 1, hostile: false, answer: SteerTaken(421) } },
        ],
    );
}

/// Coda restarts the process while a chunk of its turn waits in coda-opencode's compaction window (no server
/// event names its message): the chunk must still reach Coda.
#[test]
fn opencode_a_chunk_held_after_a_compaction_when_the_process_ends() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "opencode",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 332, step: Compaction { session: 0, how: CompactOk(13084) } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 3, ms: 5303, permission: false, end: EndError(FailRate), work: NoWork },
                },
            },
            Timed { gap: 3030, step: Compaction { session: 0, how: CompactNever } },
            Timed { gap: 478, step: Restart },
        ],
    );
}

/// A second prompt (a hostile client's) while coda-opencode holds OpenCode's error answer to the first for its
/// `session.error`: the first must still be answered.
#[test]
fn opencode_a_second_prompt_while_an_error_answer_is_held() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "opencode",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 2339,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 3, ms: 3905, permission: false, end: EndError(FailService), work: NoWork },
                },
            },
            Timed { gap: 4559, step: Hostile { frame: SecondPrompt } },
        ],
    );
}

/// A slash command Kimi does not know (no turn), then a turn with a background command, then a turn of Kimi's
/// own: the next turn's chunks must not wait behind a usage_update for a turn end that never shows (and be
/// overtaken by Kimi's own turn, which the shim reports from the files).
#[test]
fn kimi_an_unknown_slash_command_then_turns() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: false } },
            Timed {
                gap: 293,
                step: Prompt {
                    session: 0,
                    text: 4,
                    turn: Turn { chunks: 1, ms: 9703, permission: false, end: EndNever, work: NoWork },
                },
            },
            Timed {
                gap: 8326,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 2, ms: 1071, permission: false, end: EndTurn, work: Task(7081, WorkFailed) },
                },
            },
            Timed { gap: 1669, step: Hostile { frame: SecondPrompt } },
            Timed { gap: 352, step: OwnTurn { session: 0, chunks: 2 } },
        ],
    );
}

/// Coda stops a turn of Kimi's own while a background command's result waits for the session: Kimi starts the
/// turn on that result only after the stopped turn's end is in its wire (turns of a session run one at a
/// time), and Coda's prompt, held by the shim meanwhile, goes to Kimi once both ended. Found by seed 7063122 of
/// coda-kimi (the CLI model started the next turn before the stopped one's end).
#[test]
fn kimi_stop_of_its_own_turn_while_a_result_waits() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 98604,
                step: Prompt {
                    session: 2,
                    text: 2,
                    turn: Turn { chunks: 4, ms: 584, permission: false, end: EndTurn, work: Task(4379, WorkDone) },
                },
            },
            Timed { gap: 4365, step: OwnTurn { session: 0, chunks: 2 } },
            Timed { gap: 351, step: Cancel { session: 0 } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 7,
                    turn: Turn { chunks: 0, ms: 7994, permission: false, end: EndTurn, work: Task(13861, WorkFailed) },
                },
            },
        ],
    );
}

/// The same order with more around it: Kimi's turn on a result, after Coda stopped its turn of its own, must
/// reach Coda (the shim reports it from the wire). Found by seed 7069364 of coda-kimi.
#[test]
fn kimi_turn_on_a_result_after_a_stopped_turn_of_its_own() {
    use coda_sim::dsl::*;
    let turn = |chunks, ms, permission, end, work| Turn { chunks, ms, permission, end, work };
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 245,
                step: Prompt { session: 0, text: 3, turn: turn(3, 18615, false, EndTurn, Task(11962, WorkDone)) },
            },
            Timed { gap: 198, step: AnswerPermission { allow: true } },
            Timed { gap: 5470, step: AnswerPermission { allow: true } },
            Timed {
                gap: 368,
                step: Prompt { session: 0, text: 6, turn: turn(5, 19005, false, EndTurn, Task(11382, WorkDone)) },
            },
            Timed {
                gap: 7882,
                step: Prompt { session: 0, text: 7, turn: turn(1, 5382, false, EndError(FailGateway), NoWork) },
            },
            Timed { gap: 146, step: Prompt { session: 0, text: 4, turn: turn(0, 13082, false, EndNever, NoWork) } },
            Timed { gap: 494, step: Hostile { frame: UnknownSession } },
            Timed { gap: 235, step: OwnTurn { session: 0, chunks: 2 } },
            Timed {
                gap: 356,
                step: Prompt { session: 0, text: 0, turn: turn(4, 9471, true, EndError(FailOverloaded), NoWork) },
            },
            Timed { gap: 491, step: Cancel { session: 0 } },
            Timed { gap: 104, step: AnswerPermission { allow: true } },
            Timed { gap: 290, step: OwnTurn { session: 0, chunks: 3 } },
            Timed { gap: 81, step: AnswerPermission { allow: false } },
            Timed { gap: 316, step: OwnTurn { session: 0, chunks: 3 } },
            Timed { gap: 5, step: AnswerPermission { allow: true } },
            Timed { gap: 4558, step: OwnTurn { session: 2, chunks: 1 } },
            Timed { gap: 30, step: Steering { session: 0, text: 1, hostile: false, answer: SteerNever } },
            Timed { gap: 36, step: Hostile { frame: SecondPrompt } },
            Timed { gap: 205, step: Cancel { session: 0 } },
        ],
    );
}

/// Coda's prompt waits behind a compaction of coda-opencode's whose settling ends at the very instant Coda's
/// Stop arrives: the shim sent the prompt on before it read the Stop, which then goes to OpenCode right after
/// it and stops the turn there (answered `cancelled`), as the contract asks of a Stop of a prompt the CLI has.
/// Found by seed 7056144 of coda-opencode (the check took it for a held prompt sent after its Stop).
#[test]
fn opencode_stop_at_the_instant_a_compaction_ends() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "opencode",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 9097,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 3, ms: 12621, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 1, step: Compaction { session: 0, how: CompactOk(390314) } },
            Timed { gap: 79991, step: Compaction { session: 0, how: CompactNever } },
            Timed { gap: 1210, step: AnswerPermission { allow: true } },
            Timed { gap: 423, step: AnswerPermission { allow: false } },
            Timed {
                gap: 205,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 0, ms: 1778, permission: true, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 162, step: Cancel { session: 0 } },
        ],
    );
}

/// Requests with ids ACP does not allow (a fraction, a hostile client's), then the CLI dies: the shim answers
/// them with the ids they came with, as JSON-RPC requires, and that break is the client's, not the shim's.
#[test]
fn an_odd_id_answered_when_the_cli_dies() {
    use coda_sim::dsl::*;
    for agent in AGENTS {
        coda_sim::assert_holds(
            agent,
            &[
                Timed { gap: 1, step: Hostile { frame: OddId } },
                Timed { gap: 1, step: Hostile { frame: OddId } },
                Timed { gap: 1, step: Die },
            ],
        );
    }
}

/// A prompt of a session the CLI does not know (refused), then a request under the same id, of another method:
/// the CLI's answer to it must reach Coda (the failure machine took it for a second answer to the prompt).
#[test]
fn a_reused_id_after_a_refused_prompt() {
    use coda_sim::dsl::*;
    for agent in coda_sim::AGENTS {
        coda_sim::assert_holds(
            agent,
            &[
                Timed { gap: 1, step: Hostile { frame: LoneSurrogate } },
                Timed { gap: 81, step: Hostile { frame: ReusedId } },
            ],
        );
    }
}

/// Coda steers (a hostile client: no turn of its own runs yet) and loads its session again while its prompt runs
/// with the steering message in flight: codex-acp answers the prompt, replays the history (a subagent spawned and
/// completed in the earlier process) and answers the load. The turn's answer waits for the steering answer, and
/// with it what codex-acp wrote of the session after it; the load's answer must wait too, or the replayed
/// subagent reaches the AIR layer after the load and is reported as running again after its terminal state.
#[test]
fn codex_a_load_answer_never_overtakes_its_replay_behind_a_held_turn_answer() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "codex",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 439,
                step: Prompt {
                    session: 0,
                    text: 4,
                    turn: Turn {
                        chunks: 3,
                        ms: 7967,
                        permission: false,
                        end: EndError(FailRate),
                        work: Subagent { ms: 14510, end: WorkDone, again: true },
                    },
                },
            },
            Timed { gap: 92963, step: Cancel { session: 0 } },
            Timed { gap: 1, step: Restart },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 2,
                    text: 7,
                    turn: Turn {
                        chunks: 0,
                        ms: 7715,
                        permission: false,
                        end: EndTurn,
                        work: Subagent { ms: 588, end: WorkFailed, again: false },
                    },
                },
            },
            Timed { gap: 1, step: Steering { session: 0, text: 3, hostile: true, answer: SteerTaken(1763) } },
            Timed { gap: 1, step: Cancel { session: 0 } },
            Timed { gap: 1, step: LoadSession { session: 0 } },
        ],
    );
}

/// Grok runs a turn of its own, Coda's prompt waits in Grok's queue behind it (reference lifecycle.md: Grok
/// queues a prompt sent while a turn runs; its `_x.ai/queue/changed` lists it under `entries`), and a steering
/// message sent then must not reach Grok while its own turn runs: the queue says Coda's turn runs only when it
/// names Coda's entry as running. Found by seed 7054231 of coda-grok (4 of 100,000).
#[test]
fn grok_steering_while_coda_prompt_waits_behind_groks_own_turn() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "grok",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 83521, step: OwnTurn { session: 1, chunks: 3 } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 3,
                    turn: Turn { chunks: 2, ms: 12835, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 1, step: Steering { session: 0, text: 5, hostile: true, answer: SteerNever } },
        ],
    );
}

/// A prompt Kimi never answers, a second prompt Kimi refuses (`turn.agent_busy`, held behind the first turn's
/// end), a second `initialize`, then a restart before the hold ran out: the refusal and the chunk Kimi wrote after
/// it still reach Coda as the process ends (nothing the hold waits for comes any more). Seed 7029023 of coda-kimi.
#[test]
fn kimi_chunk_after_a_refused_second_prompt_then_a_restart() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 285,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 5, ms: 14182, permission: false, end: EndNever, work: NoWork },
                },
            },
            Timed { gap: 1733, step: Hostile { frame: SecondPrompt } },
            Timed { gap: 389, step: Initialize { waits: false } },
            Timed { gap: 479, step: Restart },
        ],
    );
}

/// Coda opens a second session while Kimi compacts the first (its compaction never ends) and a prompt held
/// behind it was stopped: the stopped prompt's answer does not wait for a turn end Kimi never records (it never
/// reached Kimi), so the second session's answer is not held behind it and its watch starts at once; a turn of
/// Kimi's own there (only in its wire) reaches Coda. Seed 7004033 of coda-kimi.
#[test]
fn kimi_own_turn_in_a_session_opened_while_another_compacts() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 1540, step: Compaction { session: 0, how: CompactNever } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 1,
                    turn: Turn { chunks: 3, ms: 1453, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 1, step: Cancel { session: 0 } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 319, step: OwnTurn { session: 1, chunks: 1 } },
        ],
    );
}

/// Stop while one prompt waits behind a compaction and another behind a turn of Kimi's own (a background task's
/// result, during the compaction): both end `cancelled` and neither reaches Kimi. Seed 7125187 of coda-kimi.
#[test]
fn kimi_stop_ends_prompts_held_behind_a_compaction_and_behind_kimis_own_turn() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 44451,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 4, ms: 7398, permission: false, end: EndTurn, work: Task(24883, WorkDone) },
                },
            },
            Timed {
                gap: 6784,
                step: Prompt {
                    session: 0,
                    text: 4,
                    turn: Turn { chunks: 5, ms: 14593, permission: false, end: EndTwice, work: NoWork },
                },
            },
            Timed {
                gap: 465,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 3, ms: 3111, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 258, step: Steering { session: 1, text: 7, hostile: false, answer: SteerNever } },
            Timed { gap: 8652, step: AnswerPermission { allow: true } },
            Timed { gap: 3319, step: Cancel { session: 0 } },
            Timed { gap: 231, step: AnswerPermission { allow: true } },
            Timed { gap: 128, step: Compaction { session: 0, how: CompactOk(13574) } },
            Timed {
                gap: 8685,
                step: Prompt {
                    session: 0,
                    text: 7,
                    turn: Turn { chunks: 1, ms: 122593, permission: false, end: EndTurn, work: Task(26772, WorkDone) },
                },
            },
            Timed { gap: 82, step: Hostile { frame: SecondPrompt } },
            Timed { gap: 1, step: Cancel { session: 0 } },
        ],
    );
}

/// A request of Coda's whose id is `null`, then a line that is not JSON: the shim's parse error (id `null`, as
/// JSON-RPC has it) answers no request, and Kimi's answer to the `null` one is not held behind a prompt stopped
/// behind a compaction. Seed 7074552 of coda-kimi.
#[test]
fn kimi_a_null_id_then_a_line_that_is_not_json_after_a_stop_behind_a_compaction() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 223,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 2, ms: 73878, permission: true, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 74082, step: AnswerPermission { allow: true } },
            Timed { gap: 51148, step: Compaction { session: 0, how: CompactNever } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 3, ms: 15090, permission: true, end: EndTurn, work: Task(20699, WorkNever) },
                },
            },
            Timed { gap: 1, step: Hostile { frame: DeepNesting } },
            Timed { gap: 1, step: Cancel { session: 0 } },
            Timed { gap: 1, step: Hostile { frame: OddId } },
            Timed { gap: 1, step: Hostile { frame: NotJson } },
            Timed { gap: 1, step: Steering { session: 0, text: 7, hostile: false, answer: SteerRefused } },
        ],
    );
}

/// A Stop ends Kimi's turn before its answer: no `usage_update` of that turn comes later, in the next one (Kimi
/// sends it right after the answer). The next turn retries a 503 for minutes: the shim stops it within the minute.
/// Seed 7748592 of coda-kimi.
#[test]
fn kimi_a_retried_turn_after_a_stopped_one_is_stopped_within_the_minute() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: false } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 3925,
                step: Prompt {
                    session: 0,
                    text: 2,
                    turn: Turn { chunks: 4, ms: 10167, permission: false, end: EndTurn, work: Task(297940, WorkNever) },
                },
            },
            Timed { gap: 3243, step: AnswerPermission { allow: true } },
            Timed { gap: 3895, step: Hostile { frame: NotJson } },
            Timed { gap: 389, step: Cancel { session: 0 } },
            Timed {
                gap: 179,
                step: Prompt {
                    session: 0,
                    text: 3,
                    turn: Turn {
                        chunks: 5,
                        ms: 3060,
                        permission: false,
                        end: EndError(FailService),
                        work: Task(4311, WorkDone),
                    },
                },
            },
            Timed { gap: 1, step: Compaction { session: 1, how: CompactOk(6125) } },
            Timed { gap: 9262, step: Steering { session: 0, text: 3, hostile: false, answer: SteerTaken(1905) } },
        ],
    );
}

/// A stopped turn's answer is its last frame: a second session opened while the next turn runs is watched at
/// once, and a turn of Kimi's own there (only in its wire) reaches Coda. Seed 7927323 of coda-kimi.
#[test]
fn kimi_own_turn_in_a_session_opened_after_a_stop() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 502340,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 3, ms: 14146, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed {
                gap: 3874,
                step: Prompt {
                    session: 0,
                    text: 3,
                    turn: Turn { chunks: 2, ms: 15288, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed {
                gap: 349,
                step: Prompt {
                    session: 0,
                    text: 7,
                    turn: Turn { chunks: 2, ms: 17802, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 147, step: Cancel { session: 0 } },
            Timed {
                gap: 301,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 1, ms: 15638, permission: false, end: EndTurn, work: Task(23012, WorkNever) },
                },
            },
            Timed { gap: 4311, step: AnswerPermission { allow: true } },
            Timed { gap: 62, step: AnswerPermission { allow: true } },
            Timed { gap: 5090, step: NewSession { instruction: true } },
            Timed { gap: 266, step: Compaction { session: 0, how: CompactOk(9737) } },
            Timed { gap: 1, step: OwnTurn { session: 1, chunks: 1 } },
        ],
    );
}

/// After a stopped turn, Kimi's next client turn streams over ACP while a turn of its own (a background task's
/// result) follows in its wire: Coda gets the chunks in the order Kimi wrote them. Seed 7993867 of coda-kimi.
#[test]
fn kimi_chunks_in_order_after_a_stop_and_a_turn_of_kimis_own() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 3405,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 0, ms: 14519, permission: true, end: EndTurn, work: Task(17621, WorkDone) },
                },
            },
            Timed { gap: 54775, step: AnswerPermission { allow: true } },
            Timed {
                gap: 160,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 2, ms: 11122, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 483, step: Steering { session: 1, text: 4, hostile: false, answer: SteerTaken(210) } },
            Timed { gap: 260, step: Hostile { frame: HugeNumber } },
            Timed { gap: 212, step: AnswerPermission { allow: true } },
            Timed { gap: 2702, step: AnswerPermission { allow: true } },
            Timed {
                gap: 467,
                step: Prompt {
                    session: 0,
                    text: 7,
                    turn: Turn { chunks: 3, ms: 768, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed {
                gap: 5788,
                step: Prompt {
                    session: 1,
                    text: 6,
                    turn: Turn { chunks: 2, ms: 11884, permission: false, end: EndTurn, work: Task(843469, WorkDone) },
                },
            },
            Timed { gap: 1604, step: Hostile { frame: ReusedId } },
            Timed {
                gap: 445,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 3, ms: 4309, permission: false, end: EndTurn, work: Task(12125, WorkDone) },
                },
            },
            Timed { gap: 347, step: Cancel { session: 0 } },
            Timed { gap: 351, step: NewSession { instruction: false } },
            Timed {
                gap: 438,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 4, ms: 6118, permission: false, end: EndTurn, work: NoWork },
                },
            },
        ],
    );
}

/// A background command that ends after Kimi wrote its turn's end but before the turn's answer is out: Kimi is
/// idle, so it takes the result in a turn of its own (only in its files); Coda's wait goes `handling`, then
/// `done` once that turn ends. Found by seed 7446012 of coda-kimi (the CLI model injected the result into the
/// ended turn and ran no turn on it, so the wait stayed `handling`: 14 of 1,000,000 seeds).
#[test]
fn kimi_result_after_the_turn_end_before_its_answer() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 1852,
                step: Prompt {
                    session: 0,
                    text: 1,
                    turn: Turn { chunks: 1, ms: 13022, permission: false, end: EndTurn, work: Task(6512, WorkDone) },
                },
            },
        ],
    );
}

/// A background command that ends as Coda's prompt starts a turn, its end written to Kimi's wire before the turn's
/// start: the shim reads it as ending outside a turn (`handling`) and settles it when the turn its result is
/// injected into ends; that turn never ends here, so the wait stays `handling`. Found by seed 11022618 of
/// coda-kimi (the CLI model called the work over at once because its turn had begun inside the model, though not
/// yet in the wire).
#[test]
fn kimi_result_ending_as_a_client_turn_starts_waits_for_that_turn() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 2301, step: Restart },
            Timed { gap: 1, step: Compaction { session: 0, how: CompactOk(14832) } },
            Timed { gap: 1, step: Compaction { session: 0, how: CompactOk(7849) } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 1, ms: 11221, permission: true, end: EndTurn, work: Task(11811, WorkDone) },
                },
            },
            Timed {
                gap: 544619,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 2, ms: 7664, permission: true, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 1, step: AnswerPermission { allow: true } },
            Timed {
                gap: 61,
                step: Prompt {
                    session: 0,
                    text: 3,
                    turn: Turn { chunks: 4, ms: 6416, permission: false, end: EndError(FailGateway), work: NoWork },
                },
            },
            Timed {
                gap: 379,
                step: Prompt {
                    session: 0,
                    text: 4,
                    turn: Turn {
                        chunks: 3,
                        ms: 10098,
                        permission: false,
                        end: EndError(FailService),
                        work: Task(17342, WorkDone),
                    },
                },
            },
            Timed {
                gap: 90,
                step: Prompt {
                    session: 0,
                    text: 7,
                    turn: Turn { chunks: 2, ms: 500046, permission: false, end: EndError(FailServer), work: NoWork },
                },
            },
            Timed { gap: 310, step: AnswerPermission { allow: true } },
            Timed {
                gap: 209,
                step: Prompt {
                    session: 2,
                    text: 0,
                    turn: Turn { chunks: 3, ms: 16018, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed {
                gap: 366,
                step: Prompt {
                    session: 0,
                    text: 5,
                    turn: Turn { chunks: 1, ms: 6724, permission: true, end: EndError(FailReset), work: NoWork },
                },
            },
            Timed { gap: 5348, step: Compaction { session: 0, how: CompactOk(238923) } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 1,
                    turn: Turn { chunks: 3, ms: 2560, permission: true, end: EndTurn, work: NoWork },
                },
            },
        ],
    );
}

/// A background command that ends as Kimi starts a turn of its own: Kimi injects the result into that turn
/// (kimi.md §3.3 case 2, "client turn or agent-initiated") and its end settles the wait. Found by seed 11045577
/// of coda-kimi (the CLI model queued a second turn of Kimi's own on the result after the first, so the shim's
/// `done` at the first turn's end looked early).
#[test]
fn kimi_result_ending_as_a_turn_of_its_own_starts_is_handled_in_it() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 377264,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn {
                        chunks: 3,
                        ms: 8037,
                        permission: false,
                        end: EndError(FailGeneric),
                        work: Task(6421, WorkDone),
                    },
                },
            },
            Timed {
                gap: 253,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 3, ms: 610, permission: false, end: EndNever, work: Task(509158, WorkDone) },
                },
            },
            Timed { gap: 790, step: OwnTurn { session: 0, chunks: 2 } },
            Timed {
                gap: 4789,
                step: Prompt {
                    session: 0,
                    text: 7,
                    turn: Turn {
                        chunks: 1,
                        ms: 707,
                        permission: true,
                        end: EndError(FailService),
                        work: Task(9112, WorkFailed),
                    },
                },
            },
            Timed { gap: 167, step: StopWait { session: 0 } },
            Timed {
                gap: 202,
                step: Prompt {
                    session: 0,
                    text: 4,
                    turn: Turn { chunks: 5, ms: 12207, permission: false, end: EndTurn, work: Task(24835, WorkDone) },
                },
            },
            Timed { gap: 120, step: AnswerPermission { allow: true } },
            Timed { gap: 3480, step: Hostile { frame: OddId } },
            Timed { gap: 188, step: OwnTurn { session: 0, chunks: 3 } },
            Timed {
                gap: 277,
                step: Prompt {
                    session: 2,
                    text: 5,
                    turn: Turn { chunks: 3, ms: 17049, permission: false, end: EndNever, work: NoWork },
                },
            },
            Timed { gap: 171, step: OwnTurn { session: 0, chunks: 2 } },
            Timed {
                gap: 140,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 1, ms: 8471, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed {
                gap: 46,
                step: Prompt {
                    session: 0,
                    text: 1,
                    turn: Turn { chunks: 5, ms: 15881, permission: true, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 221, step: Compaction { session: 0, how: CompactOk(5013) } },
        ],
    );
}

/// Coda's Stop reaching Kimi as its turn on a background result is about to end: the turn ends `cancelled` and
/// the result is settled with it. Found by seed 20233493 of coda-kimi (the CLI model's own turn ended on its
/// schedule despite the Stop, so the Stop's end found no turn and the work stayed running in the model: 3 of
/// 1,000,000 seeds).
#[test]
fn kimi_a_stop_as_a_turn_on_a_result_ends_settles_the_result() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 87,
                step: Prompt {
                    session: 0,
                    text: 1,
                    turn: Turn { chunks: 0, ms: 11811, permission: false, end: EndTurn, work: Task(9403, WorkDone) },
                },
            },
            Timed { gap: 209, step: StopWait { session: 0 } },
            Timed { gap: 6360, step: Compaction { session: 0, how: CompactOk(19750) } },
            Timed { gap: 8486, step: AnswerPermission { allow: true } },
            Timed { gap: 344, step: Compaction { session: 0, how: CompactNever } },
            Timed { gap: 309, step: Cancel { session: 0 } },
        ],
    );
}

/// A request whose id is an object is refused with an Invalid Request error whose id is null; that error
/// answers none of Coda's requests, not even one whose id is null. Found by seed 20210705 of coda-kimi (the Coda
/// model took the refusal as the answer to its null-id request and counted one open request too few).
#[test]
fn refusal_of_an_odd_id_answers_no_request_with_the_id_null() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 1, step: Hostile { frame: UnknownSession } },
            Timed { gap: 163, step: LoadSession { session: 0 } },
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: Hostile { frame: HugeNumber } },
            Timed {
                gap: 1,
                step: Prompt {
                    session: 0,
                    text: 6,
                    turn: Turn { chunks: 4, ms: 18435, permission: false, end: EndNever, work: NoWork },
                },
            },
            Timed { gap: 1, step: Steering { session: 0, text: 3, hostile: true, answer: SteerNever } },
            Timed { gap: 1, step: Compaction { session: 1, how: CompactOk(18250) } },
            Timed { gap: 1, step: Compaction { session: 0, how: CompactOk(4700) } },
            Timed { gap: 1, step: Hostile { frame: SecondPrompt } },
            Timed { gap: 1, step: Hostile { frame: UnknownSession } },
            Timed { gap: 1, step: Compaction { session: 0, how: CompactOk(6034) } },
            Timed { gap: 1, step: Hostile { frame: SecondPrompt } },
            Timed { gap: 1, step: Hostile { frame: OddId } },
            Timed { gap: 1, step: Hostile { frame: OddId } },
            Timed { gap: 1, step: Compaction { session: 0, how: CompactOk(2323) } },
        ],
    );
}

/// A background command that ends in the very millisecond Kimi's turn of its own ends, its end written first: its
/// result is injected into that turn before the turn's end, which settles it. Found by seed 21192693 of coda-kimi
/// (the CLI model wrote the injected result after the turn's end and called it settled by that turn; the shim
/// rightly kept it `handling`: 1 of 1,000,000 seeds).
#[test]
fn kimi_result_ending_as_a_turn_of_its_own_ends_is_injected_before_that_end() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed {
                gap: 30681,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 2, ms: 1691, permission: false, end: EndTurn, work: Task(23960, WorkDone) },
                },
            },
            Timed { gap: 294, step: OwnTurn { session: 0, chunks: 3 } },
            Timed { gap: 4139, step: AnswerPermission { allow: true } },
            Timed { gap: 378, step: Steering { session: 0, text: 1, hostile: true, answer: SteerRefused } },
            Timed { gap: 5903, step: Hostile { frame: DeepNesting } },
            Timed {
                gap: 443,
                step: Prompt {
                    session: 0,
                    text: 2,
                    turn: Turn { chunks: 4, ms: 8426, permission: false, end: EndTurn, work: Task(9835, WorkFailed) },
                },
            },
        ],
    );
}

/// A background command that ends in the very millisecond Coda's Stop ends the client turn, its end written first:
/// it ended inside that turn, so it is over for Coda at once, as the shim reads it. Found by seed 22083495 of
/// coda-kimi (the CLI model took the turn's end, due but not yet written, as already over, and sent the result to
/// a turn of Kimi's own: the shim's `done` looked early: 1 of 953,410 seeds).
#[test]
fn kimi_result_ending_as_a_stop_ends_the_client_turn_is_over_at_once() {
    use coda_sim::dsl::*;
    coda_sim::assert_holds(
        "kimi",
        &[
            Timed { gap: 1, step: Initialize { waits: true } },
            Timed { gap: 1, step: NewSession { instruction: true } },
            Timed {
                gap: 5873,
                step: Prompt {
                    session: 0,
                    text: 4,
                    turn: Turn { chunks: 4, ms: 13130, permission: false, end: EndTurn, work: Task(2241, WorkDone) },
                },
            },
            Timed {
                gap: 2427,
                step: Prompt {
                    session: 0,
                    text: 0,
                    turn: Turn { chunks: 0, ms: 6065, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed {
                gap: 6206,
                step: Prompt {
                    session: 0,
                    text: 3,
                    turn: Turn { chunks: 4, ms: 381704, permission: false, end: EndTurn, work: NoWork },
                },
            },
            Timed { gap: 170, step: Cancel { session: 0 } },
            Timed { gap: 112, step: Cancel { session: 0 } },
        ],
    );
}

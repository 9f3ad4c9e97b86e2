//! The recorded fixtures, read for what the client saw of the session instruction: no frame the shim sent
//! to the client holds any part of it (the recordings use Coda's real-size instruction,
//! `fixtures/coda-instruction.md`), the recorded prompts carried it, and Kimi's title is the one Kimi
//! makes from the user's own first prompt. `tests/replay.rs` replays the same fixtures through the binaries.

use crate::support;

use support::{coda_text, replay as replay_support};

use serde_json::Value;

/// `(dir, frame)` of every record of a fixture's trace.
fn frames(agent: &str, scenario: &str) -> Vec<(String, Value)> {
    let path = replay_support::fixtures_root().join(agent).join(scenario).join("trace.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a trace line"))
        .filter_map(|r| Some((r["dir"].as_str()?.to_owned(), r.get("frame")?.clone())))
        .collect()
}

#[test]
fn no_client_frame_of_any_fixture_shows_the_instruction() {
    let mut checked = 0;
    for agent in ["codex", "grok", "kimi", "opencode"] {
        for fixture in replay_support::fixtures(agent) {
            let scenario = fixture.file_name().and_then(|n| n.to_str()).expect("a scenario name").to_owned();
            for (dir, frame) in frames(agent, &scenario) {
                if dir == "shim->client" {
                    assert_eq!(coda_text::leak(&frame), None, "{agent}/{scenario}: {frame}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} client frames found");
}

#[test]
fn the_instruction_fixtures_carry_the_real_size_instruction() {
    let wanted = serde_json::json!(coda_text::INSTRUCTION);
    for agent in ["codex", "grok", "kimi", "opencode"] {
        let frames = frames(agent, "instruction-command-first");
        let new = frames
            .iter()
            .find(|(dir, f)| dir == "client->shim" && f["method"] == "session/new")
            .expect("a session/new");
        assert_eq!(new.1["params"]["systemPrompt"]["content"][0]["text"], wanted, "{agent}");
        assert!(coda_text::INSTRUCTION.len() >= 2048);
        // Once to the model: codex-acp takes it natively; the others get it in the first real prompt only.
        let carried = frames
            .iter()
            .filter(|(dir, f)| dir == "shim->agent" && f.to_string().contains(coda_text::MARK))
            .map(|(_, f)| f["method"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>();
        let want = if agent == "codex" { "session/new" } else { "session/prompt" };
        assert_eq!(carried, [want], "{agent}: what carried the instruction to the CLI");
    }
}

#[test]
fn kimis_title_in_the_recording_is_made_from_the_users_prompt() {
    let frames = frames("kimi", "instruction-command-first");
    let title = |dir: &str| {
        frames
            .iter()
            .filter(|(d, f)| {
                d == dir && f.pointer("/params/update/sessionUpdate") == Some(&"session_info_update".into())
            })
            .map(|(_, f)| f["params"]["update"]["title"].clone())
            .collect::<Vec<_>>()
    };
    let from_kimi = title("agent->shim");
    assert!(from_kimi[0].as_str().is_some_and(|t| t.starts_with("<coda-session-instruction> # Coda client")));
    // The title Kimi 2.1.0 made live for this prompt in a session without instruction.
    let own = "Could you look at the failing build? It broke after yesterday's merge: - the iPhone target stops at \
               link time - 测试都通过了 Start with the log. [[text:hi there]]";
    assert_eq!(title("shim->client"), [Value::from(own)]);
}

//! 插话 on every binary that declares it: a message joining Coda's running turn, the answers `injected`,
//! `promptRequired` and unknown and when each may be given, one in flight, the turn's answer held for the
//! steering answer (with a deadline), a steer while the prompt waits behind a compaction, hostile params, and a
//! CLI that never answers, answers twice or takes the message after the turn.

use serde_json::{Value, json};

use super::fake::Compacts;
use super::{INSTRUCTION, STEERING, Shim, answer, answers, every, methods};

/// What Coda steers in: several paragraphs, Markdown, Chinese, as a user types it (Coda's own instruction is
/// a real-size one).
fn steer_text() -> String {
    format!(
        "STEER-7c1d: leave the tests alone.\n\n先别改测试,只看实现:\n- the link step\n- `build.rs`\n\n{INSTRUCTION}"
    )
}

fn steering(session: &str, prompt: Value) -> Value {
    json!({"sessionId": session, "prompt": prompt, "_meta": {"steering": {"idleBehavior": "promptRequired"}}})
}

fn steer(shim: &mut Shim, text: &str) -> i64 {
    let params = steering(&shim.session, json!([{"type": "text", "text": text}]));
    shim.send("_session/steering", params)
}

/// Where in what the client got the answer to `id` is.
fn at(got: &[Value], id: i64) -> Option<usize> {
    got.iter().position(|v| v["id"] == id && v.get("method").is_none())
}

/// The methods a CLI steers with.
fn steered_the_cli(methods: &[String]) -> bool {
    methods.iter().any(|m| m == "_session/steering" || m == "_x.ai/interject")
}

/// Coda's rule for each answer: `injected` only for a message that joined Coda's turn, `promptRequired` only
/// for one that did not and that the CLI runs nowhere else.
fn outcome_is_true(shim: &Shim, text: &str, outcome: &Value) {
    let state = shim.fake.state();
    let joined = state.joined.iter().any(|j| j.contains(text) || j.starts_with("msg_u"));
    match outcome["outcome"].as_str() {
        Some("injected") => assert!(joined, "{}: injected, but the message never joined the turn", shim.agent),
        Some("promptRequired") => {
            assert!(!joined && state.fallbacks == 0, "{}: promptRequired, but the CLI took the message", shim.agent)
        }
        _ => {}
    }
}

#[tokio::test(start_paused = true)]
async fn a_steer_during_codas_turn_joins_it_and_is_answered_once_before_the_turn_ends() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let turn = shim.prompt("build it [[open]]");
        shim.drive().await;
        let text = steer_text();
        let steer = steer(&mut shim, &text);
        let mut got = shim.drive().await.client_json();
        got.extend(shim.fake("_fake/step").await.client_json());
        got.extend(shim.fake("_fake/end").await.client_json());
        assert_eq!(got.iter().filter(|v| v["id"] == steer && v.get("method").is_none()).count(), 1, "{got:?}");
        let outcome = &got[at(&got, steer).expect("answered")]["result"];
        assert_eq!(outcome, &json!({"outcome": "injected"}), "{agent}");
        assert!(at(&got, steer) < at(&got, turn), "the steering answer comes before the turn's: {got:?}");
        assert!(!got.iter().any(|v| v["method"] == "_x.ai/session/interjection"), "the CLI's echo is the shim's");
        assert_eq!(shim.fake.state().fallbacks, 0);
        outcome_is_true(&shim, "STEER-7c1d", outcome);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn between_turns_the_answer_is_prompt_required_and_the_cli_runs_nothing() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let turn = shim.prompt("a short turn");
        shim.drive().await;
        let _ = turn;
        let steer = steer(&mut shim, "after the turn");
        let got = shim.drive().await;
        let outcome = answer(&got, steer).expect("answered");
        assert_eq!(outcome["result"], json!({"outcome": "promptRequired", "reason": "noRunningTurn"}), "{outcome}");
        let state = shim.fake.state();
        assert!(state.joined.is_empty() && state.fallbacks == 0, "the CLI took nothing");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_steer_while_the_prompt_waits_behind_a_compaction_never_reaches_the_compaction() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let compact = shim.send("_coda/session/compact", json!({"sessionId": shim.session}));
        let prompt = shim.prompt("held behind the compaction");
        shim.drive().await;
        let steer = steer(&mut shim, "STEER-held: and the iPhone target");
        let got = shim.drive().await;
        assert!(!steered_the_cli(&methods(&got)), "nothing goes into the compaction: {:?}", got.to_agent);
        let outcome = answer(&got, steer).expect("answered while the prompt waits");
        let got = shim.fake("_fake/compacted").await;
        assert_eq!(answer(&got, compact).expect("answered")["result"]["compacted"], true);
        let sent = got.agent_json().into_iter().find(|(_, v)| v["id"] == prompt).map(|(_, v)| v);
        let sent = sent.expect("the held prompt goes on");
        let carried = sent["params"]["prompt"].to_string().contains("STEER-held");
        match outcome["result"]["outcome"].as_str() {
            Some("injected") => assert!(carried, "{agent}: injected, so the held prompt carries it: {sent}"),
            Some("promptRequired") => assert!(!carried, "{agent}: promptRequired, so nothing carries it"),
            other => panic!("{agent}: {other:?} for a message the shim holds"),
        }
        assert!(!shim.fake.state().joined.iter().any(|j| j.contains("STEER-held")) || carried);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_steer_while_the_session_compacts_and_no_prompt_waits_is_prompt_required_and_reaches_no_one() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Never).await;
        shim.send("_coda/session/compact", json!({"sessionId": shim.session}));
        shim.drive().await;
        let steer = steer(&mut shim, "STEER-compacting: nothing of Coda's runs");
        let got = shim.drive().await;
        assert!(!steered_the_cli(&methods(&got)), "{agent}: nothing goes into the compaction: {:?}", got.to_agent);
        let outcome = answer(&got, steer).expect("answered at once");
        assert_eq!(outcome["result"], json!({"outcome": "promptRequired", "reason": "noRunningTurn"}), "{outcome}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_message_the_cli_takes_after_the_turns_last_safe_point_is_never_answered_injected() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let turn = shim.prompt("build it [[open]]");
        shim.drive().await;
        let mut got = shim.fake("_fake/final").await.client_json();
        let steer = steer(&mut shim, "STEER-late: one more thing");
        got.extend(shim.drive().await.client_json());
        got.extend(shim.fake("_fake/end").await.client_json());
        let outcome = got[at(&got, steer).expect("answered")]["result"].clone();
        assert!(at(&got, steer) < at(&got, turn), "{got:?}");
        outcome_is_true(&shim, "STEER-late", &outcome);
        if shim.fake.state().fallbacks > 0 {
            assert_ne!(outcome["outcome"], "injected", "{agent}: the CLI ran it as a turn of its own");
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn the_turns_answer_waits_for_the_steering_answer_but_never_for_ever() {
    // Not Qwen: it asks for queued messages itself, so a turn that ends before it asked is certainly
    // `promptRequired` (adapters/acp/qwen.rs), answered before the turn's answer.
    let pushed: Vec<&'static str> = STEERING.into_iter().filter(|a| *a != "acp-qwen").collect();
    every(&pushed, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        shim.fake.state().steer_silent = true;
        let turn = shim.prompt("build it [[open]]");
        shim.drive().await;
        let steer = steer(&mut shim, "STEER-silent: the CLI never answers this");
        let mut got = shim.drive().await.client_json();
        got.extend(shim.fake("_fake/end").await.client_json());
        got.extend(shim.drive().await.client_json());
        let turn_at = at(&got, turn).unwrap_or_else(|| panic!("{agent}: the turn's answer never came: {got:?}"));
        let steer_at = at(&got, steer).unwrap_or_else(|| panic!("{agent}: the steering was never answered"));
        assert!(steer_at < turn_at);
        assert_ne!(got[steer_at]["result"]["outcome"], "injected", "nothing said it joined");
        assert_ne!(got[steer_at]["result"]["outcome"], "promptRequired", "the CLI may have taken it");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn one_steer_in_flight_and_one_answer_to_each() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        shim.fake.state().steer_silent = true;
        shim.prompt("build it [[open]]");
        shim.drive().await;
        let first = steer(&mut shim, "STEER-1");
        let second = steer(&mut shim, "STEER-2");
        let got = shim.drive().await;
        let refused = answer(&got, second).expect("the second is answered at once");
        assert_eq!(refused["error"]["code"], -32600, "{refused}");
        assert_eq!(answers(&got, first), 0, "the first still waits for the CLI");
        // A CLI that answers a steering call twice: Coda gets one answer.
        shim.fake.state().steer_silent = false;
        shim.fake.state().steer_twice = true;
        let got = shim.fake("_fake/end").await;
        assert_eq!(answers(&got, first), 1, "{:?}", got.to_client);
        shim.prompt("again [[open]]");
        shim.drive().await;
        let third = steer(&mut shim, "STEER-3");
        let mut got = shim.drive().await.client_json();
        got.extend(shim.fake("_fake/step").await.client_json());
        got.extend(shim.fake("_fake/end").await.client_json());
        assert_eq!(got.iter().filter(|v| v["id"] == third && v.get("method").is_none()).count(), 1, "{got:?}");
        let stray = got.iter().find(|v| v["id"].as_str().is_some_and(|i| i.starts_with("coda-shim")));
        assert!(stray.is_none(), "{stray:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_prompt_that_is_no_list_of_content_blocks_is_invalid_params_in_a_turn_or_not() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        let bad = [
            json!("a string, not content blocks"),
            json!({"type": "text", "text": "one block, not a list"}),
            json!([]),
            json!([{"text": "no type"}]),
            json!([1]),
            json!(null),
        ];
        for during in [false, true] {
            if during {
                shim.prompt("build it [[open]]");
                shim.drive().await;
            }
            for prompt in &bad {
                let answered = shim.call("_session/steering", steering(&shim.session.clone(), prompt.clone())).await;
                assert_eq!(answered["error"]["code"], -32602, "{agent}, during a turn: {during}, {prompt}: {answered}");
            }
            let no_session = shim.call("_session/steering", json!({"prompt": [{"type": "text", "text": "x"}]})).await;
            assert_eq!(no_session["error"]["code"], -32602, "{no_session}");
        }
        assert!(shim.fake.state().joined.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_steer_before_the_cli_said_the_turn_runs_waits_for_it() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Ends).await;
        shim.fake.state().late_busy = true;
        let turn = shim.prompt("build it [[open]]");
        shim.drive().await;
        let steer = steer(&mut shim, "STEER-early: before the server said busy");
        // A second later (well inside the wait) the CLI says the turn runs.
        let mut got = shim.pair.drive_for(std::time::Duration::from_secs(1)).await.client_json();
        got.extend(shim.fake("_fake/busy").await.client_json());
        got.extend(shim.fake("_fake/step").await.client_json());
        got.extend(shim.fake("_fake/end").await.client_json());
        let outcome = got[at(&got, steer).expect("answered")]["result"].clone();
        assert_eq!(outcome["outcome"], "injected", "{agent}: {got:?}");
        assert!(at(&got, steer) < at(&got, turn));
        outcome_is_true(&shim, "STEER-early", &outcome);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cli_that_dies_while_a_steer_is_in_flight_leaves_nothing_unanswered() {
    every(&STEERING, |agent| async move {
        let mut shim = Shim::start(agent, Compacts::Dies).await;
        shim.fake.state().steer_silent = true;
        let turn = shim.prompt("build it [[open]]");
        shim.drive().await;
        let steer = steer(&mut shim, "STEER-dies");
        shim.drive().await;
        shim.send("_fake/compacted", json!({"sessionId": shim.session}));
        let got = shim.drive().await;
        assert!(answer(&got, steer).is_some(), "{agent}: the steer is answered: {:?}", got.to_client);
        assert!(answer(&got, turn).is_some(), "{agent}: the turn is answered");
        assert_eq!(shim.pair.close().await, 0);
    })
    .await;
}

//! The four CLIs' failure signals and usage facts, scripted for the failure and usage suites, each in the
//! frames (and, for Kimi and OpenCode, the wire records and server events) the recordings in `fixtures/` show;
//! everything else is [`super::fake`]'s.
//!
//! A prompt whose text holds a marker is the script's:
//! - `[[fail:quota]]`, `[[fail:service]]`, `[[fail:unclear]]`: the run fails at once, the CLI naming a quota, a
//!   temporary failure of the service, or something that names neither (a sandbox error, a 500 without a
//!   code, a 502 page).
//! - `[[retry]]`: the run retries a failed model request, one report per `_fake/retry {sessionId, waitMs}`,
//!   until `session/cancel` (then it answers `cancelled`; with `[[deaf]]` too it never answers, with
//!   `[[twice]]` it answers twice).
//! - `[[turn:N]]`: a turn of one model request whose context is N tokens, with the CLI's usage facts.
//!
//! `_fake/emit {line}` writes `line` as it is. `_fake/compact_alone {sessionId}` is a compaction the CLI runs by itself between turns (the summarising
//! request's context is 9999 tokens, the estimate after it 50). Times on the CLIs' own clocks start at
//! [`CLI_CLOCK`] and move one second per step.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::fake::{Cli, Compacts, Fake, Read, read, text_of};
use super::{Shim, system_prompt};
use crate::adapters::kimi::facts::{Tap, WireFacts};
use crate::adapters::kimi::wire::parse_line;
use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::adapters::opencode::usage::Step;
use crate::relay::testing::{HANG_UP, Pair};

/// Where the CLIs' own clocks start (ms since the epoch: 2026-12-02T04:40:00Z).
pub const CLI_CLOCK: u64 = 1_796_186_400_000;

/// The context window the scripted CLIs report.
pub const WINDOW: u64 = 32_000;

/// Codex's title for its overloaded server.
const CODEX_OVERLOADED: &str = "Selected model is at capacity. Please try a different model.";

/// A run the script holds open.
struct Held {
    session: String,
    /// The prompt's id, as JSON text.
    id: String,
    deaf: bool,
    twice: bool,
    attempt: u64,
}

struct Script {
    cli: Cli,
    /// Kimi's wire: the records go to the layers through this tap.
    tap: Tap,
    held: Vec<Held>,
    /// The CLI's clock (ms).
    clock: u64,
    /// Kimi's turn ids.
    turns: i64,
    /// OpenCode's assistant messages.
    messages: u64,
    /// Kimi: the wire shows records only when the test says (`end_turn`), and those waiting; OpenCode: the
    /// server says no failure.
    late: bool,
    waiting: Vec<(String, Vec<Value>)>,
    /// Kimi: the sessions whose watch has begun.
    watched: Vec<String>,
}

/// A fake CLI ([`Fake`]) with the script's failures and usage facts.
#[derive(Clone)]
pub struct Scripted {
    pub fake: Fake,
    script: Arc<Mutex<Script>>,
}

fn result(id: &str, result: Value) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

fn error(id: &str, error: Value) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#)
}

fn update(session: &str, update: Value) -> String {
    json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":update}}).to_string()
}

fn grok_note(session: &str, update: Value, at: u64) -> String {
    json!({"jsonrpc":"2.0","method":"_x.ai/session_notification","params":{"sessionId":session,
        "_meta":{"agentTimestampMs":at},"update":update}})
    .to_string()
}

fn usage(session: &str, used: u64) -> String {
    update(session, json!({"sessionUpdate":"usage_update","used":used,"size":WINDOW}))
}

/// The marker `[[name:value]]` of a prompt's text.
fn marker<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("[[{name}:"))? + name.len() + 3;
    let end = text[start..].find("]]")?;
    Some(&text[start..start + end])
}

impl Script {
    fn tick(&mut self) -> u64 {
        self.clock += 1000;
        self.clock
    }

    fn wire(&mut self, session: &str, records: &[Value]) {
        if self.late {
            return self.waiting.push((session.to_owned(), records.to_vec()));
        }
        self.show(session, records);
    }

    fn show(&self, session: &str, records: &[Value]) {
        let entries = records.iter().map(|r| parse_line(r.to_string().as_bytes()).expect("a wire record")).collect();
        self.tap.send(Some(WireFacts { session: session.to_owned(), entries }));
    }

    /// A Kimi turn begins in the wire: its id.
    fn kimi_turn(&mut self, session: &str) -> i64 {
        self.turns += 1;
        let (turn, at) = (self.turns, self.tick());
        self.wire(
            session,
            &[json!({"type":"turn.prompt","agentId":"main","turnId":turn,"origin":{"kind":"user"},"time":at})],
        );
        turn
    }

    fn opencode_step(&mut self, fake: &Fake, session: &str, tokens: Option<u64>, summary: bool) -> u64 {
        self.messages += 1;
        let created = self.tick();
        let message = format!("msg_s{}", self.messages);
        let step = |completed: Option<u64>| Step {
            session: session.to_owned(),
            message: message.clone(),
            created_ms: created,
            completed_ms: completed,
            tokens: completed.and(tokens),
            output: completed.map(|_| 5),
            summary,
            provider: Some("fake".into()),
            model: Some("fake-model".into()),
            parent: None,
            agent: Some("build".into()),
            variant: None,
        };
        fake.state().event(FromServer::Event(ServerEvent::Step(Box::new(step(None)))));
        let done = self.tick();
        fake.state().event(FromServer::Event(ServerEvent::Step(Box::new(step(Some(done))))));
        created
    }

    /// A failed run of prompt `id`: what the CLI writes (and records) for it.
    fn fail(&mut self, fake: &Fake, id: &str, session: &str, what: &str) -> Vec<String> {
        match self.cli {
            Cli::Acp | Cli::Qwen | Cli::Claude => panic!("signals are scripted for the four wrapped CLIs"),
            Cli::Codex => {
                let (category, actions, title) = match what {
                    "quota" => ("limit", json!([]), "You’ve hit your usage limit."),
                    "service" => ("service", json!(["retry"]), CODEX_OVERLOADED),
                    _ => ("service", json!(["retry"]), "sandbox error: command was killed by a signal"),
                };
                let failure = json!({"id":"t:error","revision":1,"category":category,"severity":"error",
                    "title":title,"actions":actions});
                vec![result(
                    id,
                    json!({"stopReason":"end_turn","_meta":{"jetbrains":{"air":{"sessionFailure":failure}}}}),
                )]
            }
            Cli::Grok => {
                let data = match what {
                    "quota" => {
                        "API error (status 429 Too Many Requests): insufficient_quota: You exceeded your current quota."
                    }
                    "service" => "API error (status 429 Too Many Requests): rate_limit_exceeded: Rate limit reached.",
                    _ => "API error (status 429 Too Many Requests): slow down",
                };
                vec![error(id, json!({"code":-32003,"message":"Rate limited","data":data}))]
            }
            Cli::Kimi => {
                let turn = self.kimi_turn(session);
                let (name, code) = match what {
                    "quota" => ("APIProviderQuotaExhaustedError", "provider.api_error"),
                    "service" => ("APIProviderRateLimitError", "provider.rate_limit"),
                    _ => ("APIStatusError", "provider.api_error"),
                };
                let at = self.tick();
                self.wire(
                    session,
                    &[json!({"type":"turn.ended","agentId":"main","turnId":turn,"reason":"failed",
                    "error":{"code":code,"message":format!("{name}: upstream said no"),"name":name,
                    "details":{"statusCode":429},"retryable":false},"time":at})],
                );
                vec![result(id, json!({"stopReason":"end_turn"}))]
            }
            Cli::OpenCode => {
                let (code, status) = match what {
                    "quota" => (Some("insufficient_quota"), 429),
                    "service" => (Some("rate_limit_exceeded"), 429),
                    _ => (None, 502),
                };
                let failed = ServerEvent::Failed {
                    session: session.to_owned(),
                    name: "APIError".into(),
                    message: "upstream said no".into(),
                    status: Some(status),
                    code: code.map(str::to_owned),
                };
                // With `late` the server's record of the failure never comes (its event stream is lost).
                if !self.late {
                    fake.state().event(FromServer::Event(failed));
                }
                let error_v = json!({"code":-32603,"message":"Internal error: upstream said no",
                    "data":{"service":"session","errorName":"APIError"}});
                vec![error(id, error_v)]
            }
        }
    }

    /// One retry report of the run held for `session`, the CLI planning `wait_ms` before its next attempt.
    fn retry(&mut self, fake: &Fake, session: &str, wait_ms: u64) -> Vec<String> {
        let Some(at) = self.held.iter().position(|h| h.session == session) else { return Vec::new() };
        self.held[at].attempt += 1;
        let attempt = self.held[at].attempt;
        let reason = "API error (status 503 Service Unavailable): the engine is overloaded";
        match self.cli {
            Cli::Acp | Cli::Qwen | Cli::Claude => panic!("signals are scripted for the four wrapped CLIs"),
            Cli::Codex => {
                let failure = json!({"id":"t:error","revision":attempt,"category":"connection","severity":"warning",
                    "title":format!("Reconnecting... {attempt}/5"),"actions":[]});
                vec![update(
                    session,
                    json!({"sessionUpdate":"session_info_update",
                    "_meta":{"jetbrains":{"air":{"sessionFailure":failure}}}}),
                )]
            }
            Cli::Grok => {
                let at = self.tick();
                vec![grok_note(
                    session,
                    json!({"sessionUpdate":"retry_state","type":"retrying","attempt":attempt,
                    "max_retries":15,"reason":reason,"error_type":"api"}),
                    at,
                )]
            }
            Cli::Kimi => {
                let (turn, at) = (self.turns, self.tick());
                self.wire(
                    session,
                    &[json!({"type":"turn.step.retrying","agentId":"main","turnId":turn,"step":1,
                    "failedAttempt":attempt,"nextAttempt":attempt + 1,"maxAttempts":10,"delayMs":wait_ms,
                    "errorName":"APIProviderOverloadedError","errorMessage":reason,"statusCode":503,"time":at})],
                );
                Vec::new()
            }
            Cli::OpenCode => {
                let at = self.tick();
                let message = "Service Unavailable: the engine is overloaded".to_owned();
                let retry = ServerEvent::Retry {
                    session: session.to_owned(),
                    attempt,
                    message,
                    at_ms: at,
                    wait_ms: Some(wait_ms),
                };
                fake.state().event(FromServer::Event(retry));
                Vec::new()
            }
        }
    }

    /// A turn of one model request with `context` tokens, answered.
    fn turn(&mut self, fake: &Fake, id: &str, session: &str, context: u64) -> Vec<String> {
        let done = result(id, json!({"stopReason":"end_turn"}));
        match self.cli {
            Cli::Acp | Cli::Qwen | Cli::Claude => panic!("signals are scripted for the four wrapped CLIs"),
            Cli::Codex => vec![
                update(
                    session,
                    json!({"sessionUpdate":"agent_message_chunk",
                "content":{"type":"text","text":"done"}}),
                ),
                usage(session, context),
                done,
            ],
            Cli::Grok => {
                let start = self.tick();
                let stream = self.tick();
                let chunk = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
                    "_meta":{"agentTimestampMs":stream,"streamStartMs":stream,"turnStartMs":start},
                    "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"done"}}}});
                let end = self.tick();
                vec![
                    chunk.to_string(),
                    grok_note(
                        session,
                        json!({"sessionUpdate":"response_completed",
                        "usage":{"input_tokens":context,"output_tokens":5}}),
                        end,
                    ),
                    done,
                    grok_note(session, json!({"sessionUpdate":"turn_completed","stop_reason":"end_turn"}), end),
                ]
            }
            Cli::Kimi => {
                let turn = self.kimi_turn(session);
                let (request, answer, end) = (self.tick(), self.tick(), self.tick());
                self.wire(
                    session,
                    &[
                        json!({"type":"llm.request","agentId":"main","kind":"loop","maxTokens":WINDOW,"time":request}),
                        json!({"type":"usage.record","agentId":"main","usage":{"inputOther":context,"output":5,
                        "inputCacheRead":0,"inputCacheCreation":0},"time":answer}),
                        json!({"type":"token_counting.measured","agentId":"main","tokens":context + 5,"time":answer}),
                        json!({"type":"turn.ended","agentId":"main","turnId":turn,"reason":"completed","time":end}),
                    ],
                );
                vec![done, usage(session, context + 5)]
            }
            Cli::OpenCode => {
                // The server says the session busy, the turn's step, then idle just before the answer.
                let status = |busy| FromServer::Event(ServerEvent::Status { session: session.to_owned(), busy });
                fake.state().event(status(true));
                self.opencode_step(fake, session, Some(context), false);
                fake.state().event(status(false));
                vec![usage(session, context), done]
            }
        }
    }

    /// A compaction the CLI runs by itself between turns.
    fn compact_alone(&mut self, fake: &Fake, session: &str) -> Vec<String> {
        match self.cli {
            Cli::Acp | Cli::Qwen | Cli::Claude => panic!("signals are scripted for the four wrapped CLIs"),
            Cli::Codex => {
                let status = |s: &str| {
                    update(session, json!({"sessionUpdate":"compaction_update","compactionId":"k","status":s}))
                };
                vec![status("in_progress"), usage(session, 9999), usage(session, 50), status("completed")]
            }
            Cli::Grok => {
                let at = self.tick();
                vec![grok_note(
                    session,
                    json!({"sessionUpdate":"auto_compact_completed","tokens_before":9999,
                    "tokens_after":50}),
                    at,
                )]
            }
            Cli::Kimi => {
                self.compacted(session, "auto");
                Vec::new()
            }
            Cli::OpenCode => {
                self.opencode_step(fake, session, Some(9999), true);
                fake.state().event(FromServer::Event(ServerEvent::Compacted { session: session.to_owned() }));
                Vec::new()
            }
        }
    }
}

impl Script {
    /// Kimi's wire records of a compaction (`source`: `manual` for `/compact`, `auto` for its own).
    fn compacted(&mut self, session: &str, source: &str) {
        let (begin, request, answer, applied) = (self.tick(), self.tick(), self.tick(), self.tick());
        self.wire(session, &[
            json!({"type":"full_compaction.begin","source":source,"agentId":"main","time":begin}),
            json!({"type":"llm.request","agentId":"main","kind":"compaction","maxTokens":WINDOW,"time":request}),
            json!({"type":"usage.record","agentId":"main","usage":{"inputOther":9999,"output":5},"time":answer}),
            json!({"type":"context.apply_compaction","agentId":"main","tokensBefore":9999,"tokensAfter":50,"time":applied}),
            json!({"type":"token_counting.rebased","agentId":"main","tokens":50,"time":applied}),
            json!({"type":"full_compaction.complete","agentId":"main","time":applied}),
        ]);
    }
}

impl Scripted {
    pub fn new(cli: Cli, tap: Tap) -> Scripted {
        let script = Script {
            cli,
            tap,
            held: Vec::new(),
            clock: CLI_CLOCK,
            turns: 0,
            messages: 0,
            late: false,
            waiting: Vec::new(),
            watched: Vec::new(),
        };
        Scripted { fake: Fake::new(cli, Compacts::Ends), script: Arc::new(Mutex::new(script)) }
    }

    /// From now on (`true`) Kimi's wire shows a session's records only at [`Scripted::end_turn`], and OpenCode's
    /// server never says a failure.
    pub fn late_ends(&self, late: bool) {
        self.script.lock().expect("lock").late = late;
    }

    /// Kimi: the wire shows what `session` recorded so far (then the records show as they come again).
    pub fn end_turn(&self, session: &str) {
        let mut s = self.script.lock().expect("lock");
        let (now, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut s.waiting).into_iter().partition(|(sid, _)| sid == session);
        s.waiting = later;
        for (sid, records) in now {
            s.show(&sid, &records);
        }
    }

    /// What the CLI writes for one line it reads.
    pub fn answer(&self, line: &str) -> Vec<String> {
        let Some(Read { method, id, params, session }) = read(line) else { return Vec::new() };
        let mut s = self.script.lock().expect("lock");
        match (method.as_str(), id) {
            ("session/prompt", Some(id)) => {
                // Kimi: coda-kimi's watch of the session has begun (with no record read yet), as its activity
                // layer tells the layers below once the session is open.
                if s.cli == Cli::Kimi && !s.watched.contains(&session) {
                    s.watched.push(session.clone());
                    s.tap.send(Some(WireFacts { session: session.clone(), entries: Vec::new() }));
                }
                // Kimi refuses a second prompt while a turn runs (Grok queues it, this script runs it at once).
                if s.cli == Cli::Kimi && s.held.iter().any(|h| h.session == session) {
                    return vec![error(&id, json!({"code":-32600,"message":"turn.agent_busy"}))];
                }
                let text = text_of(params.get("prompt").unwrap_or(&Value::Null));
                if let Some(what) = marker(&text, "fail") {
                    return s.fail(&self.fake, &id, &session, what);
                }
                if let Some(n) = marker(&text, "turn").and_then(|n| n.parse().ok()) {
                    return s.turn(&self.fake, &id, &session, n);
                }
                if text.contains("[[retry]]") {
                    if s.cli == Cli::Kimi {
                        s.kimi_turn(&session);
                    }
                    let (deaf, twice) = (text.contains("[[deaf]]"), text.contains("[[twice]]"));
                    s.held.push(Held { session, id, deaf, twice, attempt: 0 });
                    return Vec::new();
                }
            }
            ("session/cancel", None) => {
                if let Some(at) = s.held.iter().position(|h| h.session == session) {
                    let held = s.held.remove(at);
                    if held.deaf {
                        return Vec::new();
                    }
                    if s.cli == Cli::Kimi {
                        let (turn, at) = (s.turns, s.tick());
                        s.wire(
                            &session,
                            &[json!({"type":"turn.ended","agentId":"main","turnId":turn,
                            "reason":"cancelled","time":at})],
                        );
                    }
                    let cancelled = result(&held.id, json!({"stopReason":"cancelled"}));
                    return if held.twice { vec![cancelled.clone(), cancelled] } else { vec![cancelled] };
                }
            }
            ("_fake/retry", Some(id)) => {
                let wait = params.get("waitMs").and_then(Value::as_u64).unwrap_or(1000);
                let mut out = s.retry(&self.fake, &session, wait);
                out.push(result(&id, json!({})));
                return out;
            }
            // Kimi's wire shows the compaction it was asked for (`/compact`) as it ends.
            ("_fake/compacted", Some(_)) if s.cli == Cli::Kimi => {
                s.compacted(&session, "manual");
            }
            ("_fake/compact_alone", Some(id)) => {
                let mut out = s.compact_alone(&self.fake, &session);
                out.push(result(&id, json!({})));
                return out;
            }
            ("_fake/die", Some(_)) => return vec![HANG_UP.to_owned()],
            // A session the CLI does not have.
            ("session/load", Some(id)) if session == "gone" => {
                return vec![error(&id, json!({"code":-32603,"message":"Resource not found: gone"}))];
            }

            ("_fake/emit", Some(id)) => {
                let line = params.get("line").and_then(Value::as_str).unwrap_or_default().to_owned();
                return vec![line, result(&id, json!({}))];
            }
            ("session/new" | "session/load" | "session/resume", Some(_)) if s.cli == Cli::Grok => {
                drop(s);
                // Grok names each model's window in its answer to `session/new`, `load` and `resume`.
                return self
                    .fake
                    .answer(line)
                    .into_iter()
                    .map(|l| match crate::json::from_str::<Value>(&l) {
                        Ok(mut v) if v.get("result").is_some_and(Value::is_object) => {
                            v["result"]["models"] = json!({"currentModelId":"fake","availableModels":[
                                {"modelId":"fake","_meta":{"totalContextTokens":WINDOW}}]});
                            v.to_string()
                        }
                        _ => l,
                    })
                    .collect();
            }
            _ => {}
        }
        drop(s);
        self.fake.answer(line)
    }
}

impl Shim {
    /// `coda-<agent>` over a scripted CLI ([`Scripted`]), initialized as Coda initializes; `home` is the CLI's
    /// data folder, where a load reads what it keeps of a session (OpenCode's is its server: [`super::fake::State::kept`]).
    pub async fn scripted_with(agent: &'static str, home: Option<std::path::PathBuf>) -> (Shim, Scripted) {
        let tap = Tap::default();
        let scripted = Scripted::new(Cli::by_agent(agent), tap.clone());
        let command = crate::child::AgentCommand { program: "fake-cli".into(), args: Vec::new() };
        let (stack, events) = match agent {
            "kimi" => crate::adapters::kimi::test_stack(&command, tap, home),
            _ => super::stack(agent, &scripted.fake, home),
        };
        let s = scripted.clone();
        let pair = Pair::with(stack, events, crate::lines::DEFAULT_MAX_LINE, move |line: &str| s.answer(line));
        let shim = Shim::initialized(agent, pair, scripted.fake.clone()).await;
        (shim, scripted)
    }

    /// [`Shim::scripted_with`], with a session made with Coda's instruction.
    pub async fn scripted(agent: &'static str) -> (Shim, Scripted) {
        let (mut shim, scripted) = Shim::scripted_with(agent, None).await;
        let new = shim
            .call("session/new", json!({"cwd": "/work/app", "mcpServers": [], "systemPrompt": system_prompt()}))
            .await;
        shim.session = new["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{agent}: {new}")).to_owned();
        (shim, scripted)
    }
}

//! The feature suites: the same scenarios of Coda's contract on every binary's stack that declares the
//! feature, the real relay loop on in-memory pipes and virtual time ([`crate::relay::testing::Pair`]), with a
//! scripted stand-in for each CLI ([`fake`]) that behaves as the real one does in the recordings.
//!
//! - [`compact`]: 压缩上下文 on the four binaries and coda-acp's Qwen Code and Claude Agent ACP (`acp-<profile>`).
//! - [`failure`]: 执行失败 on the four binaries, and [`usage`]: 用量里的数据 on the four, over the CLIs' signals
//!   as [`signals`] scripts them.
//! - [`steering`]: 插话 on those that declare it (coda-kimi does not: Kimi cannot steer over ACP; nor coda-acp's
//!   Gemini CLI).
//! - [`cancel`]: ACP's `$/cancel_request` where a layer holds, answers or makes a request, on every binary.
//! - [`close`]: `session/close` ends the session's work in the shim too, on every binary.
//! - [`instruction`]: `systemPrompt` as ACP now specifies it, on every binary.

pub mod fake;

mod cancel;
mod close;
mod compact;
mod failure;
mod instruction;
pub mod signals;
mod steering;
mod usage;

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::child::AgentCommand;
use crate::layer::{Event, Stack};
use crate::relay::testing::{Driven, Pair};
use fake::{Cli, Compacts, Fake};

/// Coda's real-size session instruction.
pub const INSTRUCTION: &str = include_str!("../../../fixtures/coda-instruction.md");

/// Every binary (coda-acp over an agent with the standard methods only).
pub const EVERY: [&str; 5] = ["codex", "kimi", "grok", "opencode", "acp"];
/// The binaries that declare compaction, and steering.
pub const COMPACTING: [&str; 6] = ["codex", "kimi", "grok", "opencode", "acp-qwen", "acp-claude"];
pub const STEERING: [&str; 5] = ["codex", "grok", "opencode", "acp-qwen", "acp-claude"];

/// A binary's stack over a fake CLI, with Coda's side driven by the test.
pub struct Shim {
    pub agent: &'static str,
    pub pair: Pair,
    pub fake: Fake,
    /// The session opened by [`Shim::start`].
    pub session: String,
    /// The answer to Coda's `initialize`.
    pub init: Value,
    next_id: i64,
}

/// The stack of `coda-<agent>` over `fake` (for coda-opencode, its server side too). What the CLI keeps of its
/// sessions is read under `home` (Codex's, Grok's data folder; Kimi's is [`signals`]'), or from the fake's
/// server (OpenCode's): never this machine's own.
fn stack(
    agent: &str,
    fake: &Fake,
    home: Option<PathBuf>,
) -> (Stack, tokio::sync::mpsc::UnboundedReceiver<(usize, Event)>) {
    let command = AgentCommand { program: "fake-cli".into(), args: Vec::new() };
    match agent {
        "opencode" => crate::adapters::opencode::test_stack(&command, opencode_side(fake)),
        "codex" => crate::adapters::codex::test_stack(&command, home),
        "grok" => crate::adapters::grok::test_stack(&command, home),
        "kimi" => crate::adapters::kimi::test_stack(&command, Default::default(), None),
        "acp" => crate::adapters::acp::adapter(None).stack(&command, None),
        profile if profile.starts_with("acp-") => {
            let profile =
                crate::adapters::acp::profile::built_in(&profile["acp-".len()..]).expect("a built-in profile");
            crate::adapters::acp::adapter(Some(profile)).stack(&command, None)
        }
        other => panic!("no stack for {other}"),
    }
}

/// OpenCode's server, played by `fake`.
fn opencode_side(fake: &Fake) -> crate::adapters::opencode::ServerSide {
    use std::sync::Arc;
    let (f1, f2, f3, f4) = (fake.clone(), fake.clone(), fake.clone(), fake.clone());
    crate::adapters::opencode::ServerSide {
        asker: Some(Arc::new(move |ask: crate::adapters::opencode::compact::Ask| f1.state().summarize(&ask.session))),
        caller: Some(Arc::new(move |call| f2.state().steer_call(call))),
        replier: Arc::new(|_: &str, _: &str, _: &str| Ok(())),
        reader: Some(Box::new(move |send, _| f3.state().read_by(send))),
        history: Some(Arc::new(move |session: &str, _: &str| {
            crate::adapters::opencode::usage::facts_of_messages(&f4.state().messages(session))
        })),
    }
}

impl Shim {
    /// Initialized as Coda initializes, with no session yet.
    pub async fn bare(agent: &'static str, compacts: Compacts) -> Shim {
        Shim::bare_with(agent, compacts, None).await
    }

    /// [`Shim::bare`] over a CLI whose `initialize` result is `init` (else its own).
    pub async fn bare_with(agent: &'static str, compacts: Compacts, init: Option<Value>) -> Shim {
        let fake = Fake::new(Cli::by_agent(agent), compacts);
        fake.state().init = init;
        let (stack, events) = stack(agent, &fake, None);
        let f = fake.clone();
        let pair = Pair::with(stack, events, crate::lines::DEFAULT_MAX_LINE, move |line: &str| f.answer(line));
        Shim::initialized(agent, pair, fake).await
    }

    /// `pair` (a binary's stack over `fake`), initialized as Coda initializes, with no session yet.
    pub async fn initialized(agent: &'static str, pair: Pair, fake: Fake) -> Shim {
        let mut shim = Shim { agent, pair, fake, session: String::new(), init: Value::Null, next_id: 100 };
        let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
            "session": {"compaction": true}, "_meta": {"coda": {"waits": {}}}});
        let init = shim
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": caps,
                "clientInfo": {"name": "coda", "version": "1.0.0"}}),
            )
            .await;
        assert!(init.get("result").is_some(), "{agent}: {init}");
        shim.init = init;
        shim
    }

    /// Initialized, with a session made with Coda's instruction.
    pub async fn start(agent: &'static str, compacts: Compacts) -> Shim {
        let mut shim = Shim::bare(agent, compacts).await;
        let new = shim
            .call("session/new", json!({"cwd": "/work/app", "mcpServers": [], "systemPrompt": system_prompt()}))
            .await;
        shim.session = new["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{agent}: {new}")).to_owned();
        shim
    }

    /// A fresh process that loads `session` (made by another process) with Coda's instruction.
    pub async fn loading(agent: &'static str, compacts: Compacts, session: &str) -> Shim {
        let mut shim = Shim::bare(agent, compacts).await;
        let params =
            json!({"sessionId": session, "cwd": "/work/app", "mcpServers": [], "systemPrompt": system_prompt()});
        let load = shim.call("session/load", params).await;
        assert!(load.get("result").is_some(), "{agent}: {load}");
        shim.session = session.to_owned();
        shim
    }

    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends a request as Coda does; its id.
    pub fn send(&mut self, method: &str, params: Value) -> i64 {
        let id = self.id();
        self.pair.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.pair.send_json(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request and drives the session until it is idle; the answer (panics without one).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        let got = self.pair.drive().await;
        answer(&got, id).unwrap_or_else(|| panic!("{}: no answer to {method}: {:?}", self.agent, got.to_client))
    }

    /// A `session/prompt` of the session with `text`; its id.
    pub fn prompt(&mut self, text: &str) -> i64 {
        let params = json!({"sessionId": self.session, "prompt": [{"type": "text", "text": text}]});
        self.send("session/prompt", params)
    }

    /// Asks the fake CLI to do `what` (`_fake/end`, `_fake/compacted`, …) in the session, and drives.
    pub async fn fake(&mut self, what: &str) -> Driven {
        let params = json!({"sessionId": self.session});
        self.send(what, params);
        self.pair.drive().await
    }

    pub async fn drive(&mut self) -> Driven {
        self.pair.drive().await
    }
}

/// `systemPrompt` as Coda sends it.
pub fn system_prompt() -> Value {
    json!({"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]})
}

/// The answer to request `id` among what the client got.
pub fn answer(got: &Driven, id: i64) -> Option<Value> {
    got.client_json().into_iter().find(|v| v.get("id") == Some(&json!(id)) && v.get("method").is_none())
}

/// How many answers to request `id` the client got.
pub fn answers(got: &Driven, id: i64) -> usize {
    got.client_json().iter().filter(|v| v.get("id") == Some(&json!(id)) && v.get("method").is_none()).count()
}

/// Whether the CLI received request `id` of the client's.
pub fn reached(got: &Driven, id: i64) -> bool {
    got.agent_json().iter().any(|(_, v)| v.get("id") == Some(&json!(id)) && v.get("method").is_some())
}

/// The methods the CLI received.
pub fn methods(got: &Driven) -> Vec<String> {
    got.agent_json().iter().filter_map(|(_, v)| v.get("method").and_then(Value::as_str).map(str::to_owned)).collect()
}

/// Runs `scenario` for each of `agents` in turn; fails naming every agent whose scenario failed (each failure
/// is printed as it happens).
pub async fn every<F, Fut>(agents: &[&'static str], scenario: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut failed = Vec::new();
    for agent in agents {
        if (CatchUnwind(Box::pin(scenario(agent)))).await.is_err() {
            failed.push(*agent);
        }
    }
    assert!(failed.is_empty(), "failed on {failed:?}");
}

/// A future whose panic is its output (`Err`), so that one agent's failure does not hide the others'.
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(_) => std::task::Poll::Ready(Err(())),
        }
    }
}

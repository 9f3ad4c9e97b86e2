//! One run: a binary's real stack ([`coda_shim::Adapter::stack`]) in the real relay loop on in-memory pipes and
//! tokio's paused clock ([`Pair`]), the Coda player on its client side and the CLI model on its agent side, the
//! plan's steps at their virtual times, the checks after every step, then a drain (an hour of virtual time with
//! Coda idle), the end-of-run checks, and Coda closing the shim's stdin.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use coda_shim::child::AgentCommand;
use coda_shim::relay::testing::Pair;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::check::{Checker, Violation};
use crate::cli::{Flavor, Model};
use crate::coda::Coda;
use crate::plan::{Step, Timed, Turn};
use crate::server::Server;

/// How long the run goes on after its last step with Coda idle: past every deadline of the shim's (the longest,
/// compaction's, is 9 minutes; Coda's own wait for a compaction 10).
pub const DRAIN: Duration = Duration::from_secs(3600);

/// What a run did: every line each side got or wrote, with its virtual time, and the first broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub transcript: Vec<String>,
    /// The broken rule, the index of the step after which it was seen (the plan's length: in the drain or at the
    /// end) and the virtual time.
    pub violation: Option<(Violation, usize, u64)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `plan` against the stack of `coda-<agent>`.
pub fn run(agent: &str, plan: &[Timed]) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("a runtime");
    rt.block_on(run_async(agent, plan))
}

struct Sim {
    pair: Pair,
    coda: Coda,
    checker: Checker,
    model: Arc<Mutex<Model>>,
    log: Arc<Mutex<Vec<String>>>,
    notify: Arc<Notify>,
    start: Instant,
}

impl Sim {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Takes what Coda received since the last look and checks it, then what the CLI saw.
    async fn collect(&mut self) -> Option<Violation> {
        let now = self.now();
        let got = self.pair.drive_for(Duration::ZERO).await;
        for line in got.to_client {
            lock(&self.log).push(format!("{now} >C {line}"));
            let v = self.checker.client_line(&mut self.coda, &lock(&self.model).truth, &line);
            if v.is_some() {
                return v;
            }
        }
        self.checker.cli_side(&mut lock(&self.model).truth)
    }

    fn send(&mut self, line: &str) {
        let now = self.now();
        let sent = self.pair.try_send(line);
        let gone = if sent { "" } else { " (not read: the shim has ended)" };
        lock(&self.log).push(format!("{now} C> {line}{gone}"));
    }

    /// One step at `now`; true when Coda closed its output (the run ends).
    fn step(&mut self, step: &Step) -> bool {
        let now = self.now();
        match step {
            Step::OwnTurn { session, chunks } => lock(&self.model).own_turn(*session, *chunks, now),
            Step::Die => lock(&self.model).die(),
            step => {
                let Some(sent) = self.coda.step(step, now) else { return false };
                {
                    let mut m = lock(&self.model);
                    match (step, sent.marker) {
                        (Step::Prompt { turn, .. }, Some(marker)) => m.expect_prompt(marker, turn.clone()),
                        (Step::Steering { answer, .. }, Some(marker)) => m.expect_steer(marker, answer.clone()),
                        (Step::Compaction { how, .. }, _) => {
                            m.expect_compact(sent.session.as_deref().unwrap_or(""), how.clone())
                        }
                        (Step::Hostile { .. }, Some(marker)) => m.expect_prompt(
                            marker,
                            Turn { chunks: 1, ms: 100, permission: false, end: crate::plan::End::EndTurn },
                        ),
                        _ => {}
                    }
                    if let (Step::Cancel { .. }, Some(s)) = (step, &sent.session) {
                        self.checker.cancelled(&self.coda, &m.truth, s);
                    }
                }
                for line in &sent.lines {
                    self.send(line);
                }
                if self.coda.closed {
                    return true;
                }
            }
        }
        self.notify.notify_one();
        false
    }
}

/// The one event a stack's set-up threads send by themselves: coda-codex's probe of the Codex version. It is
/// waited for (in real time) before the session starts, so it is handled first at virtual time 0 rather than
/// whenever its thread gets to it.
fn settle_set_up(agent: &str, events: &tokio::sync::mpsc::UnboundedReceiver<(usize, coda_shim::layer::Event)>) {
    if agent != "codex" {
        return;
    }
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while events.is_empty() && std::time::Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(1));
    }
}

async fn run_async(agent: &str, plan: &[Timed]) -> Report {
    let flavor = Flavor::of(agent);
    let model = Arc::new(Mutex::new(Model::new(flavor)));
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let server =
        (flavor == Flavor::OpenCode).then(|| Server::start(model.clone(), log.clone()).expect("the OpenCode server"));
    let args = match &server {
        Some(s) => ["acp", "--hostname", "127.0.0.1", "--port", &s.port.to_string()].map(str::to_owned).to_vec(),
        None => Vec::new(),
    };
    let command = AgentCommand { program: PathBuf::from("/nonexistent/coda-sim-agent"), args };
    let adapter = coda_shim::adapters::by_agent(agent).unwrap_or_else(|| panic!("no binary coda-{agent}"));
    let (stack, events) = adapter.stack(&command, None);
    settle_set_up(agent, &events);
    let (pair, agent_end) = Pair::with_agent_end(stack, events, coda_shim::lines::DEFAULT_MAX_LINE);
    let start = Instant::now();
    let notify = Arc::new(Notify::new());
    let (read, mut write) = tokio::io::split(agent_end);
    let at = move || start.elapsed().as_millis() as u64;
    let (m, l, n) = (model.clone(), log.clone(), notify.clone());
    tokio::spawn(async move {
        let mut lines = BufReader::new(read).split(b'\n');
        while let Ok(Some(line)) = lines.next_segment().await {
            let line = String::from_utf8_lossy(&line).into_owned();
            lock(&l).push(format!("{} >A {line}", at()));
            lock(&m).on_line(&line, at());
            n.notify_one();
        }
        // Its stdin closed: the CLI exits.
        lock(&m).die();
        n.notify_one();
    });
    let (m, l, n) = (model.clone(), log.clone(), notify.clone());
    tokio::spawn(async move {
        loop {
            let (due, dead) = {
                let m = lock(&m);
                (m.next_due(), m.dead)
            };
            if dead {
                let _ = write.shutdown().await;
                return;
            }
            match due {
                Some(due) => tokio::select! {
                    biased;
                    () = n.notified() => {}
                    () = tokio::time::sleep_until(start + Duration::from_millis(due)) => {}
                },
                None => n.notified().await,
            }
            let now = at();
            let lines = lock(&m).take_due(now);
            for line in lines {
                lock(&l).push(format!("{now} A> {line}"));
                if write.write_all(format!("{line}\n").as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    });

    let mut sim = Sim { pair, coda: Coda::default(), checker: Checker::default(), model, log, notify, start };
    let mut violation = None;
    let mut closed = false;
    for (i, t) in plan.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(t.gap as u64)).await;
        if let Some(v) = sim.collect().await {
            violation = Some((v, i, sim.now()));
            break;
        }
        if sim.step(&t.step) {
            closed = true;
            break;
        }
    }
    if violation.is_none() && !closed {
        for line in sim.coda.cancel_permissions() {
            sim.send(&line);
        }
        for _ in 0..DRAIN.as_secs() / 60 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            if let Some(v) = sim.collect().await {
                violation = Some((v, plan.len(), sim.now()));
                break;
            }
        }
        if violation.is_none() && !sim.coda.reused_open_id {
            let truth = &lock(&sim.model).truth;
            let lost = if sim.pair.relay_ended() { None } else { sim.checker.answered(&sim.coda, truth) };
            if let Some(v) = lost.or_else(|| sim.checker.chunks(truth)) {
                violation = Some((v, plan.len(), sim.now()));
            }
        }
    }
    let ended = sim.pair.end().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    if let Some(v) = sim.collect().await
        && violation.is_none()
    {
        violation = Some((v, plan.len(), sim.now()));
    }
    if let Err(e) = ended
        && violation.is_none()
    {
        violation = Some((Violation { rule: "panic", detail: e }, plan.len(), sim.now()));
    }
    drop(server);
    let transcript = std::mem::take(&mut *lock(&sim.log));
    Report { transcript, violation }
}

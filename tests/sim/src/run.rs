//! One run: a binary's real stack ([`coda_shim::Adapter::stack`]) in the real relay loop on in-memory pipes and
//! tokio's paused clock ([`Pair`]), the Coda player on its client side and the CLI model on its agent side, the
//! plan's steps at their virtual times, the checks after every step, then a drain (an hour of virtual time with
//! Coda idle), the end-of-run checks, and Coda closing the shim's stdin. A restart ends the process and starts
//! the binary again over the same CLI model (its disk), with Coda loading its sessions in the new one.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use coda_shim::adapters::kimi::watch::Driven;
use coda_shim::child::AgentCommand;
use coda_shim::layer::Sizes;
use coda_shim::relay::testing::Pair;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::check::{Checker, Violation};
use crate::cli::{FileOp, Flavor, Model, Output};
use crate::coda::Coda;
use crate::plan::{Step, Timed, Turn};
use crate::server::Server;

/// How long the run goes on after its last step with Coda idle: past every deadline of the shim's (the longest,
/// compaction's, is 9 minutes; Coda's own wait for a compaction 10; Codex's wait for a turn's subagents 10).
pub const DRAIN: Duration = Duration::from_secs(3600);

/// What a run did: every line each side got or wrote, with its virtual time, and the first broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub transcript: Vec<String>,
    /// The broken rule, the index of the step after which it was seen (the plan's length: in the drain or at the
    /// end) and the virtual time.
    pub violation: Option<(Violation, usize, u64)>,
    /// What the relay logged (from `DEBUG` up), each process's after the other: to read with the transcript.
    pub logs: Vec<String>,
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
    agent: String,
    pair: Pair,
    coda: Coda,
    checker: Checker,
    model: Arc<Mutex<Model>>,
    log: Arc<Mutex<Vec<String>>>,
    notify: Arc<Notify>,
    start: Instant,
    /// The shim's tables, as its stack says after each input.
    sizes: Arc<Mutex<Sizes>>,
    server: Option<Server>,
    /// The CLI's session files (Kimi's).
    files: Option<Arc<Files>>,
    /// The relays' logs of the processes before this one.
    logs: Vec<String>,
}

/// The CLI's session files of a run (Kimi's): a folder of the run's own, and the shim's watches of it, which the
/// CLI's writer steps after each write ([`Driven`]): the shim reads every write before the CLI goes on, on the
/// virtual clock, with no thread and no real time in between.
struct Files {
    dir: tempfile::TempDir,
    watches: Driven,
    /// Held by the CLI's writer while the shim takes in a write, and by Coda's player while what it sends is
    /// handled: the shim never gets a frame of Coda's between a write and its scan.
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Files {
    fn new() -> Option<Arc<Files>> {
        // In memory where the system has a place for it (Linux's /dev/shm): a run makes and deletes hundreds of
        // files, which on a disk's file system (a busy one above all) costs far more than the run itself.
        let builder = tempfile::Builder::new().prefix("coda-sim-").clone();
        let shm = std::path::Path::new("/dev/shm");
        let dir = shm.is_dir().then(|| builder.tempdir_in(shm).ok()).flatten().or_else(|| builder.tempdir().ok())?;
        std::fs::create_dir_all(dir.path().join("home")).ok()?;
        Some(Arc::new(Files { dir, watches: Driven::default(), gate: Arc::default() }))
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The environment the binary's set-up reads: Kimi's data folder in the run's folder, and no more (a run
    /// depends on nothing of the machine's).
    fn env(&self, name: &str) -> Option<std::ffi::OsString> {
        match name {
            "KIMI_CODE_HOME" => Some(self.home().into_os_string()),
            "HOME" => Some(self.dir.path().as_os_str().to_owned()),
            _ => None,
        }
    }

    /// `text` with the run's folder written as `{{KIMI_CODE_HOME}}`, so a transcript is the same in every run.
    fn neutral(&self, text: &str) -> String {
        text.replace(&self.home().to_string_lossy().into_owned(), "{{KIMI_CODE_HOME}}")
    }

    /// Writes `op` (an append, or a whole new content put in place by a rename, as Kimi does), then has the shim's
    /// watches look at what changed.
    fn write(&self, op: &FileOp) -> std::io::Result<()> {
        use std::io::Write;
        if op.replace {
            let tmp = op.path.with_extension("json.tmp.sim");
            std::fs::write(&tmp, &op.bytes)?;
            std::fs::rename(&tmp, &op.path)?;
        } else {
            std::fs::OpenOptions::new().append(true).open(&op.path)?.write_all(&op.bytes)?;
        }
        self.watches.look();
        Ok(())
    }
}

/// The binary's stack over the CLI model, on a new pair of pipes: the relay, and the two tasks that play the
/// CLI (one reads what the shim writes it, one writes what the model says when it is due).
fn start_process(
    agent: &str,
    model: &Arc<Mutex<Model>>,
    log: &Arc<Mutex<Vec<String>>>,
    notify: &Arc<Notify>,
    start: Instant,
    server: Option<&Server>,
    files: &Option<Arc<Files>>,
) -> (Pair, Arc<Mutex<Sizes>>) {
    let args = match server {
        Some(s) => ["acp", "--hostname", "127.0.0.1", "--port", &s.port.to_string()].map(str::to_owned).to_vec(),
        None => Vec::new(),
    };
    let command = AgentCommand { program: PathBuf::from("/nonexistent/coda-sim-agent"), args };
    let adapter = coda_shim::adapters::by_agent(agent).unwrap_or_else(|| panic!("no binary coda-{agent}"));
    // The CLI's version as the adapter was tested with: no set-up probes it (in real time).
    let version = Some(adapter.tested.version.to_owned());
    let from_files = |name: &str| files.as_ref().and_then(|f| f.env(name));
    let watches = files.as_ref().map(|f| f.watches.clone());
    let parts: Vec<&(dyn std::any::Any + Sync)> = watches.iter().map(|w| w as _).collect();
    let given = coda_shim::cli::adapter::Given { env: &from_files, parts: &parts };
    let (mut stack, events) = adapter.stack_in(&command, version, &given);
    let sizes = stack.gauge();
    let (pair, agent_end) = Pair::with_agent_end(stack, events, coda_shim::lines::DEFAULT_MAX_LINE);
    play_cli(agent_end, model.clone(), log.clone(), notify.clone(), start, files.clone());
    (pair, sizes)
}

fn play_cli(
    agent_end: DuplexStream,
    model: Arc<Mutex<Model>>,
    log: Arc<Mutex<Vec<String>>>,
    notify: Arc<Notify>,
    start: Instant,
    files: Option<Arc<Files>>,
) {
    let (read, mut write) = tokio::io::split(agent_end);
    let at = move || start.elapsed().as_millis() as u64;
    let process = lock(&model).process;
    let (m, l, n, files_r) = (model.clone(), log.clone(), notify.clone(), files.clone());
    tokio::spawn(async move {
        let mut lines = BufReader::new(read).split(b'\n');
        while let Ok(Some(line)) = lines.next_segment().await {
            let line = String::from_utf8_lossy(&line).into_owned();
            let mut m = lock(&m);
            if m.process != process {
                return;
            }
            let shown = neutral(&files_r, &line);
            lock(&l).push(format!("{} >A {shown}", at()));
            m.on_line(&line, at());
            n.notify_one();
        }
        // Its stdin closed: the CLI exits.
        let mut m = lock(&m);
        if m.process == process {
            m.die();
        }
        n.notify_one();
    });
    let (m, l, n) = (model, log, notify);
    tokio::spawn(async move {
        loop {
            let (due, dead, now_process) = {
                let m = lock(&m);
                (m.next_due(), m.dead, m.process)
            };
            if dead || now_process != process {
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
            let lines = {
                let mut m = lock(&m);
                if m.process != process {
                    continue;
                }
                m.take_due(now)
            };
            for out in lines {
                match out {
                    Output::Line(line) => {
                        lock(&l).push(format!("{now} A> {line}"));
                        if write.write_all(format!("{line}\n").as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    Output::File(op) => {
                        let Some(files) = &files else { continue };
                        let rel = op.path.strip_prefix(files.home()).unwrap_or(&op.path).display().to_string();
                        lock(&l).push(format!("{now} F> {rel} {}", String::from_utf8_lossy(&op.bytes).trim_end()));
                        let _gate = files.gate.lock().await;
                        // What the CLI wrote before must be the shim's before it reads this write.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if let Err(e) = files.write(&op) {
                            lock(&m).truth.broken.push(("files", format!("the CLI's write of {rel} failed: {e}")));
                        }
                        // What the shim made of it (queued by the watches' look) reaches its peers before the CLI
                        // goes on: the clock moves only once every task is idle.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
        }
    });
}

/// A line as the transcript keeps it: the run's folder written as a placeholder.
fn neutral(files: &Option<Arc<Files>>, line: &str) -> String {
    match files {
        Some(f) => f.neutral(line),
        None => line.to_owned(),
    }
}

impl Sim {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The relay's log so far (of this process), into the run's.
    fn keep_logs(&mut self) {
        let mut logs = self.pair.logs();
        self.logs.append(&mut logs);
    }

    fn sizes(&self) -> Sizes {
        *lock(&self.sizes)
    }

    /// With the CLI's files: Coda's turn to send, while the shim reads no write of the CLI's ([`Sim::ungate`]).
    async fn gate(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match &self.files {
            Some(f) => Some(f.gate.clone().lock_owned().await),
            None => None,
        }
    }

    /// What Coda sent is handled (the relay idle again, a millisecond on) before the shim reads a write of the
    /// CLI's: the two never race in real time.
    async fn ungate(&self, gate: Option<tokio::sync::OwnedMutexGuard<()>>) {
        if gate.is_some() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Takes what Coda received since the last look and checks it, then what the CLI saw and the shim holds.
    async fn collect(&mut self) -> Option<Violation> {
        let now = self.now();
        let got = match self.pair.try_drive_for(Duration::ZERO).await {
            Ok(got) => got,
            Err(broken) => return Some(Violation { rule: "schema", detail: broken }),
        };
        for line in got.to_client {
            lock(&self.log).push(format!("{now} >C {}", neutral(&self.files, &line)));
            let v = self.checker.client_line(&mut self.coda, &lock(&self.model).truth, &line, now);
            if v.is_some() {
                return v;
            }
        }
        let (sizes, alive) = (self.sizes(), !self.pair.relay_ended());
        self.checker.cli_side(&self.coda, &mut lock(&self.model).truth, sizes, now, alive)
    }

    fn send(&mut self, line: &str) {
        let now = self.now();
        let sent = self.pair.try_send(line);
        let gone = if sent { "" } else { " (not read: the shim has ended)" };
        lock(&self.log).push(format!("{now} C> {line}{gone}"));
    }

    /// One step at `now`; true when Coda closed its output (the run ends).
    async fn step(&mut self, step: &Step) -> Result<bool, Violation> {
        let now = self.now();
        match step {
            Step::OwnTurn { session, chunks } => lock(&self.model).own_turn(*session, *chunks, now),
            Step::Die => lock(&self.model).die(),
            Step::Restart => return self.restart().await.map(|()| false),
            step => {
                // Coda's turn: the CLI's side is what it will be when the shim reads this step's frames.
                let gate = self.gate().await;
                let now = self.now();
                let Some(sent) = self.coda.step(step, now) else { return Ok(false) };
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
                            Turn {
                                chunks: 1,
                                ms: 100,
                                permission: false,
                                end: crate::plan::End::EndTurn,
                                work: crate::plan::Work::NoWork,
                            },
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
                self.ungate(gate).await;
                if self.coda.closed {
                    return Ok(true);
                }
            }
        }
        self.notify.notify_one();
        Ok(false)
    }

    /// Coda ends the process (closes its stdin; the relay ends, the CLI with it), then starts the binary again
    /// over the same CLI and loads its sessions, as Coda does with its sessions after a restart.
    async fn restart(&mut self) -> Result<(), Violation> {
        let ended = self.pair.end().await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        if let Some(v) = self.collect().await {
            return Err(v);
        }
        if let Err(e) = ended {
            return Err(ended_badly(e));
        }
        self.keep_logs();
        lock(&self.log).push(format!("{} -- restart: a new process over the same CLI", self.now()));
        lock(&self.model).restart();
        self.checker.restart();
        self.coda.restart();
        let (pair, sizes) = start_process(
            &self.agent,
            &self.model,
            &self.log,
            &self.notify,
            self.start,
            self.server.as_ref(),
            &self.files,
        );
        (self.pair, self.sizes) = (pair, sizes);
        let waits = self.coda.waits.unwrap_or(true);
        let mut steps = vec![Step::Initialize { waits }];
        steps.extend((0..self.coda.sessions.len() as u8).map(|session| Step::LoadSession { session }));
        for step in steps {
            Box::pin(self.step(&step)).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Some(v) = self.collect().await {
                return Err(v);
            }
        }
        Ok(())
    }
}

/// What a relay that did not end cleanly broke: a frame against the schema, else a panic (or no end at all).
fn ended_badly(e: String) -> Violation {
    let rule = if e.starts_with("the shim wrote frames that break") { "schema" } else { "panic" };
    Violation { rule, detail: e }
}

async fn run_async(agent: &str, plan: &[Timed]) -> Report {
    let flavor = Flavor::of(agent);
    let model = Arc::new(Mutex::new(Model::new(flavor)));
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let server =
        (flavor == Flavor::OpenCode).then(|| Server::start(model.clone(), log.clone()).expect("the OpenCode server"));
    let files = if flavor == Flavor::Kimi { Files::new() } else { None };
    if let Some(f) = &files {
        lock(&model).set_kimi_root(f.home());
    }
    let start = Instant::now();
    let notify = Arc::new(Notify::new());
    let (pair, sizes) = start_process(agent, &model, &log, &notify, start, server.as_ref(), &files);
    let mut sim = Sim {
        agent: agent.to_owned(),
        pair,
        coda: Coda::default(),
        checker: Checker::default(),
        model,
        log,
        notify,
        start,
        sizes,
        server,
        files,
        logs: Vec::new(),
    };
    let mut violation = None;
    let mut closed = false;
    for (i, t) in plan.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(t.gap as u64)).await;
        if let Some(v) = sim.collect().await {
            violation = Some((v, i, sim.now()));
            break;
        }
        match sim.step(&t.step).await {
            Ok(true) => {
                closed = true;
                break;
            }
            Ok(false) => {}
            Err(v) => {
                violation = Some((v, i, sim.now()));
                break;
            }
        }
    }
    if violation.is_none() && !closed {
        let gate = sim.gate().await;
        for line in sim.coda.cancel_permissions() {
            sim.send(&line);
        }
        sim.ungate(gate).await;
        for _ in 0..DRAIN.as_secs() / 60 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            if let Some(v) = sim.collect().await {
                violation = Some((v, plan.len(), sim.now()));
                break;
            }
        }
        if violation.is_none() {
            let truth = &lock(&sim.model).truth;
            let sizes = *lock(&sim.sizes);
            // What the process owes is only checked while it runs (its end answers and ends the rest).
            let alive = !sim.pair.relay_ended();
            let found = alive
                .then(|| sim.checker.answered(&sim.coda, truth))
                .flatten()
                .or_else(|| sim.checker.chunks(truth))
                .or_else(|| alive.then(|| sim.checker.waits_end(&sim.coda, truth)).flatten())
                .or_else(|| alive.then(|| sim.checker.tables(&sim.coda, truth, sizes)).flatten());
            if let Some(v) = found {
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
        violation = Some((ended_badly(e), plan.len(), sim.now()));
    }
    drop(sim.server.take());
    sim.keep_logs();
    let transcript = std::mem::take(&mut *lock(&sim.log));
    Report { transcript, violation, logs: sim.logs }
}

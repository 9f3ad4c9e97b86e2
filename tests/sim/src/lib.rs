//! coda-sim: whole sessions of each coda-shim binary under deterministic simulation (docs/simulation.md).
//!
//! A seed gives a plan ([`plan::generate`]): the steps of the Coda player (handshakes, sessions with the real
//! instruction, CJK prompts, Stop, steering, compaction, answers to permission requests, hostile frames, closing
//! stdin) and of the CLI (its own turns, its death), each carrying what the CLI does for it (a turn's chunks,
//! permission request and end; how it answers a compaction or a steering message; failures; requests never
//! answered or answered twice) and the virtual time before it. [`run`] plays the plan against the binary's real
//! stack in the real relay loop on virtual time and checks Coda's contract after every step ([`check`]); the same
//! plan gives the same run, byte for byte. A failing plan is shrunk ([`shrink`]) to the fewest steps that still
//! break the same rule, and printed as a test to paste ([`Failed::as_test`]).

pub mod check;
pub mod cli;
pub mod coda;
pub mod plan;
pub mod rng;
mod run;
mod server;

pub use plan::{Timed, dsl, generate};
pub use run::{DRAIN, Report, run};

/// The binaries, by agent.
pub const AGENTS: [&str; 4] = ["codex", "grok", "kimi", "opencode"];

/// How many runs shrinking may take.
pub const SHRINK_RUNS: usize = 400;

/// A seed (or a plan) that broke a rule: the rule, what broke it, and the shrunk plan.
#[derive(Debug, Clone)]
pub struct Failed {
    pub agent: String,
    pub seed: Option<u64>,
    pub rule: &'static str,
    pub detail: String,
    /// Steps of the plan before shrinking.
    pub original: usize,
    pub plan: Vec<Timed>,
}

impl Failed {
    /// The shrunk plan as a test for `tests/sim.rs`.
    pub fn as_test(&self) -> String {
        let name = match self.seed {
            Some(seed) => format!("{}_seed_{seed}", self.agent),
            None => format!("{}_plan", self.agent),
        };
        let mut out = format!(
            "/// {}: {}\n#[test]\nfn {name}() {{\n    use coda_sim::dsl::*;\n    coda_sim::assert_holds(\"{}\", &[\n",
            self.rule,
            self.detail.replace('\n', " "),
            self.agent
        );
        for t in &self.plan {
            out.push_str(&format!("        {t:?},\n"));
        }
        out.push_str("    ]);\n}\n");
        out
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seed = self.seed.map(|s| format!(" seed {s}")).unwrap_or_default();
        writeln!(f, "coda-{}{seed}: rule `{}` broken: {}", self.agent, self.rule, self.detail)?;
        writeln!(f, "shrunk from {} steps to {}; as a test:\n", self.original, self.plan.len())?;
        write!(f, "{}", self.as_test())
    }
}

/// Runs the plan of `seed` on `coda-<agent>`; a broken rule comes back shrunk.
pub fn check_seed(agent: &str, seed: u64) -> Result<(), Box<Failed>> {
    let plan = generate(agent, seed);
    check_plan(agent, &plan).map_err(|mut f| {
        f.seed = Some(seed);
        f
    })
}

/// Runs `plan` on `coda-<agent>`; a broken rule comes back shrunk.
pub fn check_plan(agent: &str, plan: &[Timed]) -> Result<(), Box<Failed>> {
    let Some((v, _, _)) = run(agent, plan).violation else { return Ok(()) };
    let shrunk = shrink(agent, plan, v.rule);
    let detail = run(agent, &shrunk).violation.map(|(v, _, _)| v.detail).unwrap_or(v.detail);
    Err(Box::new(Failed { agent: agent.into(), seed: None, rule: v.rule, detail, original: plan.len(), plan: shrunk }))
}

/// Panics, printing the broken rule and the transcript's tail, unless `plan` keeps every rule on `coda-<agent>`.
pub fn assert_holds(agent: &str, plan: &[Timed]) {
    let report = run(agent, plan);
    if let Some((v, step, at)) = report.violation {
        let tail = report.transcript.len().saturating_sub(40);
        panic!(
            "coda-{agent}: rule `{}` broken after step {step} at {at} ms: {}\n--- the run's last lines:\n{}",
            v.rule,
            v.detail,
            report.transcript[tail..].iter().map(|l| format!("{l:.400}")).collect::<Vec<_>>().join("\n")
        );
    }
}

/// The shortest plan found (delta debugging: chunks, then single steps, then gaps of 1 ms) that still breaks
/// `rule` on `coda-<agent>`.
pub fn shrink(agent: &str, plan: &[Timed], rule: &str) -> Vec<Timed> {
    let mut runs = 0;
    let mut fails = |p: &[Timed]| {
        runs += 1;
        runs <= SHRINK_RUNS && run(agent, p).violation.is_some_and(|(v, _, _)| v.rule == rule)
    };
    let mut cur = plan.to_vec();
    let mut parts = 2;
    while cur.len() >= 2 {
        let size = cur.len().div_ceil(parts);
        let mut reduced = false;
        for at in (0..cur.len()).step_by(size) {
            let mut candidate = cur.clone();
            candidate.drain(at..(at + size).min(cur.len()));
            if fails(&candidate) {
                cur = candidate;
                parts = (parts - 1).max(2);
                reduced = true;
                break;
            }
        }
        if !reduced {
            if parts >= cur.len() {
                break;
            }
            parts = (parts * 2).min(cur.len());
        }
    }
    for i in 0..cur.len() {
        if cur[i].gap > 1 {
            let mut candidate = cur.clone();
            candidate[i].gap = 1;
            if fails(&candidate) {
                cur = candidate;
            }
        }
    }
    cur
}

/// Prints the transcript of `plan` (for a quick look while writing the simulator).
pub fn print_run(agent: &str, plan: &[Timed]) {
    let report = run(agent, plan);
    for l in &report.transcript {
        println!("{l:.300}");
    }
    println!("== {:?}", report.violation);
}

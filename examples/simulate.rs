//! Runs the deterministic simulator (docs/simulation.md) on a range of seeds, or for a while, on every binary
//! or one; exits 1 after printing each broken rule with its seed and shrunk plan as a test to paste.
//!
//! ```text
//! cargo run --release --example simulate -- --seeds 1000000..1010000 [--agent grok] [--for 10m] [--keep-going]
//! cargo run --release --example simulate -- --seeds 42 --agent kimi --transcript [--shrunk]
//! cargo run --release --example simulate -- --seeds 0..100000 --keep-going --no-shrink   # seeds/s, no shrinking
//! cargo run --release --example simulate -- --seeds 0..100000 --agent kimi --jobs 8       # runs side by side
//! ```
//!
//! `--jobs N` runs N seeds at a time, each on a thread of its own (a run is one thread and its own virtual
//! clock, so it is the same run however many go at once): worth it for coda-kimi, whose runs mostly wait for the
//! shim to read the CLI's files in real time.

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coda_sim::{AGENTS, check_seed, generate, run};

struct Args {
    seeds: std::ops::Range<u64>,
    agents: Vec<String>,
    duration: Option<Duration>,
    transcript: bool,
    shrunk: bool,
    keep_going: bool,
    no_shrink: bool,
    jobs: usize,
}

fn parse() -> Result<Args, lexopt::Error> {
    use lexopt::prelude::*;
    let mut args = Args {
        seeds: 0..100,
        agents: Vec::new(),
        duration: None,
        transcript: false,
        shrunk: false,
        keep_going: false,
        no_shrink: false,
        jobs: 1,
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("seeds") => {
                let text: String = parser.value()?.parse()?;
                args.seeds = match text.split_once("..") {
                    Some((a, b)) => {
                        a.parse().map_err(|_| "a seed range: START..END")?
                            ..b.parse().map_err(|_| "a seed range: START..END")?
                    }
                    None => {
                        let one: u64 = text.parse().map_err(|_| "a seed or START..END")?;
                        one..one + 1
                    }
                };
            }
            Long("agent") => {
                let agent: String = parser.value()?.parse()?;
                if !AGENTS.contains(&agent.as_str()) {
                    return Err(format!("--agent is one of {AGENTS:?}").into());
                }
                args.agents.push(agent);
            }
            Long("for") => {
                let text: String = parser.value()?.parse()?;
                args.duration = Some(humantime::parse_duration(&text).map_err(|e| format!("--for {text}: {e}"))?);
            }
            Long("transcript") => args.transcript = true,
            Long("shrunk") => args.shrunk = true,
            Long("keep-going") => args.keep_going = true,
            Long("no-shrink") => args.no_shrink = true,
            Long("jobs") => {
                let text: String = parser.value()?.parse()?;
                args.jobs =
                    text.parse().ok().filter(|n| *n > 0).ok_or("--jobs is a number of runs at a time, 1 or more")?;
            }
            Long("help") | Short('h') => {
                println!(
                    "simulate [--seeds N | START..END] [--agent codex|grok|kimi|opencode]... [--for 10m] [--jobs N] [--keep-going] [--no-shrink] [--transcript [--shrunk]]"
                );
                std::process::exit(0);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    if args.agents.is_empty() {
        args.agents = AGENTS.iter().map(|a| (*a).to_owned()).collect();
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("simulate: {e}");
            return ExitCode::from(2);
        }
    };
    if args.transcript {
        for agent in &args.agents {
            for seed in args.seeds.clone() {
                let mut plan = generate(agent, seed);
                if args.shrunk
                    && let Err(failed) = check_seed(agent, seed)
                {
                    plan = failed.plan;
                }
                let report = run(agent, &plan);
                println!("== coda-{agent} seed {seed}");
                for line in &report.transcript {
                    println!("{line}");
                }
                println!("== {:?}", report.violation);
            }
        }
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let mut failed = 0;
    for agent in &args.agents {
        let begun = Instant::now();
        let budget = args.duration.map(|d| d / args.agents.len() as u32);
        let (next, count, stop) = (AtomicU64::new(args.seeds.start), AtomicU64::new(0), AtomicBool::new(false));
        let found = Mutex::new(0u64);
        std::thread::scope(|scope| {
            for _ in 0..args.jobs {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        if budget.is_some_and(|b| begun.elapsed() >= b) {
                            break;
                        }
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if budget.is_none() && seed >= args.seeds.end {
                            break;
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                        let broken = if args.no_shrink {
                            run(agent, &generate(agent, seed)).violation.map(|(v, step, at)| {
                                format!(
                                    "coda-{agent} seed {seed}: rule `{}` broken after step {step} at {at} ms: {}",
                                    v.rule, v.detail
                                )
                            })
                        } else {
                            check_seed(agent, seed).err().map(|f| f.to_string())
                        };
                        if let Some(text) = broken {
                            *found.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                            println!("{text}");
                            if !args.keep_going {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        let count = count.into_inner();
        failed += found.into_inner().unwrap_or_else(|p| p.into_inner());
        let secs = begun.elapsed().as_secs_f64();
        eprintln!(
            "coda-{agent}: {count} seeds from {} in {secs:.1} s ({:.1} seeds/s, {} at a time)",
            args.seeds.start,
            count as f64 / secs.max(1e-9),
            args.jobs
        );
    }
    eprintln!("{failed} failing seeds; {:.1} s in all", started.elapsed().as_secs_f64());
    if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

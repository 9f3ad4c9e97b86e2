//! Runs the deterministic simulator (docs/simulation.md) on a range of seeds, or for a while, on every binary
//! or one; exits 1 after printing each broken rule with its seed and shrunk plan as a test to paste.
//!
//! ```text
//! cargo run --release --example simulate -- --seeds 1000000..1010000 [--agent grok] [--for 10m] [--keep-going]
//! cargo run --release --example simulate -- --seeds 42 --agent kimi --transcript [--shrunk]
//! cargo run --release --example simulate -- --seeds 0..100000 --keep-going --no-shrink   # seeds/s, no shrinking
//! cargo run --release --example simulate -- --seeds 0..100000 --agent kimi --jobs 1       # one run at a time
//! ```
//!
//! `--jobs N` (default: the machine's cores) runs N seeds at a time, each on a thread of its own: job j runs the
//! seeds START + j, START + j + N, ... A run is one thread on its own virtual clock, so it is the same run however
//! many go at once, and what is printed is the same too: the broken rules in seed order (without `--keep-going`
//! only the lowest failing seed's, as one job would find it).

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
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
        jobs: std::thread::available_parallelism().map_or(1, usize::from),
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
                println!("== the relay's log");
                for line in &report.logs {
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
        let jobs = args.jobs as u64;
        // The lowest failing seed so far (without --keep-going a job stops once past it), and every failure.
        let lowest = AtomicU64::new(u64::MAX);
        let found: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
        // Per job, the seeds it ran: job j runs start + j, start + j + N, ... (the same split every time).
        let ran: Vec<AtomicU64> = (0..jobs).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|scope| {
            for job in 0..jobs {
                let (lowest, found, ran) = (&lowest, &found, &ran[job as usize]);
                scope.spawn(move || {
                    let mut seed = args.seeds.start + job;
                    loop {
                        if budget.is_some_and(|b| begun.elapsed() >= b)
                            || (budget.is_none() && seed >= args.seeds.end)
                            || (!args.keep_going && seed > lowest.load(Ordering::Relaxed))
                        {
                            break;
                        }
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
                        ran.fetch_add(1, Ordering::Relaxed);
                        if let Some(text) = broken {
                            lowest.fetch_min(seed, Ordering::Relaxed);
                            found.lock().unwrap_or_else(|p| p.into_inner()).push((seed, text));
                        }
                        seed += jobs;
                    }
                });
            }
        });
        let mut found = found.into_inner().unwrap_or_else(|p| p.into_inner());
        // In seed order, whatever the jobs: without --keep-going only the lowest, as one job would have found it.
        found.sort_by_key(|(seed, _)| *seed);
        if !args.keep_going {
            found.truncate(1);
        }
        for (_, text) in &found {
            println!("{text}");
        }
        failed += found.len();
        let ran: Vec<u64> = ran.iter().map(|r| r.load(Ordering::Relaxed)).collect();
        let count: u64 = ran.iter().sum();
        // Every seed below `through` ran (job j ran its first ran[j] seeds).
        let mut through =
            (0..jobs).map(|j| args.seeds.start + j + ran[j as usize] * jobs).min().unwrap_or(args.seeds.start);
        if budget.is_none() {
            through = through.min(args.seeds.end);
        }
        let secs = begun.elapsed().as_secs_f64();
        eprintln!(
            "coda-{agent}: {count} seeds ({}..{through} all run) in {secs:.1} s ({:.1} seeds/s, {jobs} at a time)",
            args.seeds.start,
            count as f64 / secs.max(1e-9),
        );
    }
    eprintln!("{failed} failing seeds; {:.1} s in all", started.elapsed().as_secs_f64());
    if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

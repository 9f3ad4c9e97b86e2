//! Runs the deterministic simulator (docs/simulation.md) on a range of seeds, or for a while, on every binary
//! or one; exits 1 after printing each broken rule with its seed and shrunk plan as a test to paste.
//!
//! ```text
//! cargo run --release --example simulate -- --seeds 1000000..1010000 [--agent grok] [--for 10m] [--keep-going]
//! cargo run --release --example simulate -- --seeds 42 --agent kimi --transcript
//! cargo run --release --example simulate -- --seeds 0..100000 --keep-going --no-shrink   # seeds/s, no shrinking
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use coda_sim::{AGENTS, check_seed, generate, run};

struct Args {
    seeds: std::ops::Range<u64>,
    agents: Vec<String>,
    duration: Option<Duration>,
    transcript: bool,
    keep_going: bool,
    no_shrink: bool,
}

fn parse() -> Result<Args, lexopt::Error> {
    use lexopt::prelude::*;
    let mut args = Args {
        seeds: 0..100,
        agents: Vec::new(),
        duration: None,
        transcript: false,
        keep_going: false,
        no_shrink: false,
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
            Long("keep-going") => args.keep_going = true,
            Long("no-shrink") => args.no_shrink = true,
            Long("help") | Short('h') => {
                println!(
                    "simulate [--seeds N | START..END] [--agent codex|grok|kimi|opencode]... [--for 10m] [--keep-going] [--no-shrink] [--transcript]"
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
                let report = run(agent, &generate(agent, seed));
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
        let mut count = 0u64;
        let mut seed = args.seeds.start;
        loop {
            let done = match args.duration {
                Some(d) => begun.elapsed() >= d / args.agents.len() as u32,
                None => seed >= args.seeds.end,
            };
            if done {
                break;
            }
            count += 1;
            if args.no_shrink {
                if let Some((v, step, at)) = run(agent, &generate(agent, seed)).violation {
                    failed += 1;
                    println!(
                        "coda-{agent} seed {seed}: rule `{}` broken after step {step} at {at} ms: {}",
                        v.rule, v.detail
                    );
                    if !args.keep_going {
                        break;
                    }
                }
            } else if let Err(f) = check_seed(agent, seed) {
                failed += 1;
                println!("{f}");
                if !args.keep_going {
                    break;
                }
            }
            seed += 1;
        }
        let secs = begun.elapsed().as_secs_f64();
        eprintln!(
            "coda-{agent}: {count} seeds from {} in {secs:.1} s ({:.1} seeds/s)",
            args.seeds.start,
            count as f64 / secs.max(1e-9)
        );
    }
    eprintln!("{failed} failing seeds; {:.1} s in all", started.elapsed().as_secs_f64());
    if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

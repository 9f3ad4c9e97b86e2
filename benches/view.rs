//! `cargo bench --bench view`: `acp-replay view` on day-long traces (100,000 and 1,000,000 records, made from the
//! fixtures by `tests/support/big_trace.rs`), with the figures docs/performance.md ("The trace viewer") gives.
//!
//! For each size, in one run: the command's wall time and peak memory (the child's own `ru_maxrss`), the page's
//! size, and in headless Chromium (when there is one) the first paint after navigation and the frame and draw
//! times of scrolling, zooming and panning. Ratios against two baselines measured in the same run: `gzip -1` of
//! the trace (the floor for any writer that keeps every frame compressed), and with `CODA_VIEW_BASELINE=<an older
//! acp-replay>` that build on the same trace (skipped above 200,000 records: the viewer before issue 26 needs
//! about 10 GB there). `-- --quick`: 100,000 records only; `CODA_BENCH_SIZES=N,M` picks the sizes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../tests/support/big_trace.rs"]
mod big_trace;
#[path = "../tests/support/cdp.rs"]
mod cdp;

struct Run {
    wall: Duration,
    max_rss_kib: i64,
    page_bytes: u64,
}

/// Runs `cmd` to the end; its wall time and peak resident memory (from wait4).
fn measure(mut cmd: Command) -> (Duration, i64, bool) {
    let started = Instant::now();
    let child = cmd.spawn().expect("the command starts");
    let pid = child.id() as nix::libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our own child, not yet waited for; both pointers point to live locals.
    let rc = unsafe { nix::libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    (started.elapsed(), usage.ru_maxrss, nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0)
}

fn view(binary: &Path, trace: &Path, page: &Path) -> Run {
    let mut cmd = Command::new(binary);
    cmd.arg("view").arg(trace).arg("-o").arg(page).stderr(std::process::Stdio::null());
    let (wall, max_rss_kib, ok) = measure(cmd);
    assert!(ok, "{} view failed", binary.display());
    Run { wall, max_rss_kib, page_bytes: std::fs::metadata(page).unwrap().len() }
}

fn gzip_floor(trace: &Path) -> Run {
    let mut cmd = Command::new("gzip");
    cmd.arg("-1").arg("-c").arg(trace).stdout(std::process::Stdio::null());
    let (wall, max_rss_kib, ok) = measure(cmd);
    assert!(ok, "gzip failed");
    Run { wall, max_rss_kib, page_bytes: 0 }
}

/// First paint (ms after navigation started) and the scroll/zoom/pan lines, in Chromium.
fn in_browser(chromium: &Path, page: &Path, with_frames: bool) -> Vec<String> {
    let mut b = cdp::Browser::launch(chromium);
    let opened = Instant::now();
    let session = b.open(page);
    let wall = opened.elapsed();
    let ready = b.eval(&session, "window.acpView ? window.acpView.readyAt : performance.now()");
    let mut out = vec![format!(
        "first paint {:.0} ms after navigation ({:.2} s from navigate to ready over CDP)",
        ready.as_f64().unwrap_or(f64::NAN),
        wall.as_secs_f64()
    )];
    if with_frames {
        let times = b.eval(&session, big_trace::SCROLL_AND_ZOOM);
        for part in ["scroll", "zoom", "pan"] {
            out.push(big_trace::percentiles(part, &times[part]));
        }
    }
    let errors = b.errors();
    if !errors.is_empty() {
        out.push(format!("page errors: {errors:?}"));
    }
    out
}

fn mib(kib: i64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes: Vec<usize> = match std::env::var("CODA_BENCH_SIZES") {
        Ok(v) => v.split(',').map(|s| s.trim().parse().expect("CODA_BENCH_SIZES: numbers")).collect(),
        Err(_) if quick => vec![100_000],
        Err(_) => vec![100_000, 1_000_000],
    };
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_acp-replay"));
    let baseline = std::env::var_os("CODA_VIEW_BASELINE").map(PathBuf::from);
    let chromium = cdp::chromium();
    if chromium.is_none() {
        println!("(no Chromium: /usr/bin/chromium or $CODA_CHROMIUM; browser figures skipped)");
    }
    let dir = tempfile::tempdir().unwrap();
    for n in sizes {
        let folder = dir.path().join(format!("day-{n}"));
        std::fs::create_dir(&folder).unwrap();
        let trace = folder.join("trace.jsonl");
        let made = big_trace::write(&trace, n);
        println!(
            "\n## {} records ({:.1} MB trace, {} streamed turns of {} chunks)",
            made.records,
            made.bytes as f64 / 1e6,
            made.streamed_turns,
            big_trace::STREAM_CHUNKS
        );
        let floor = gzip_floor(&trace);
        let page = dir.path().join(format!("day-{n}.html"));
        let new = view(&binary, &trace, &page);
        println!(
            "acp-replay view: {:.2} s, peak RSS {:.1} MiB, page {:.1} MB ({:.3} of the trace)",
            new.wall.as_secs_f64(),
            mib(new.max_rss_kib),
            new.page_bytes as f64 / 1e6,
            new.page_bytes as f64 / made.bytes as f64
        );
        println!(
            "gzip -1 of the trace: {:.2} s, peak RSS {:.1} MiB; view/gzip time {:.2}",
            floor.wall.as_secs_f64(),
            mib(floor.max_rss_kib),
            new.wall.as_secs_f64() / floor.wall.as_secs_f64()
        );
        if let Some(chromium) = &chromium {
            for line in in_browser(chromium, &page, true) {
                println!("  this build, Chromium: {line}");
            }
        }
        if let Some(old) = baseline.as_ref().filter(|_| n <= 200_000) {
            let old_page = dir.path().join(format!("day-{n}-baseline.html"));
            let before = view(old, &trace, &old_page);
            println!(
                "baseline {}: {:.2} s, peak RSS {:.1} MiB, page {:.1} MB; new/baseline: time {:.2}, memory {:.3}, page {:.3}",
                old.display(),
                before.wall.as_secs_f64(),
                mib(before.max_rss_kib),
                before.page_bytes as f64 / 1e6,
                new.wall.as_secs_f64() / before.wall.as_secs_f64(),
                new.max_rss_kib as f64 / before.max_rss_kib as f64,
                new.page_bytes as f64 / before.page_bytes as f64
            );
            if let Some(chromium) = &chromium {
                for line in in_browser(chromium, &old_page, false) {
                    println!("  baseline, Chromium: {line}");
                }
            }
            let _ = std::fs::remove_file(&old_page);
        }
        let _ = std::fs::remove_file(&page);
        let _ = std::fs::remove_file(&trace);
    }
}

//! The set-up every mode of a binary shares: logging to stderr, the async runtime, the trace file.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use crate::trace::Trace;

/// Logs to stderr, filtered by `CODA_SHIM_LOG` (default `warn`; a bad filter is warned about and ignored).
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("CODA_SHIM_LOG") {
        Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("warning: CODA_SHIM_LOG={spec:?} is not a valid filter ({e}); using \"warn\"");
            EnvFilter::new("warn")
        }),
        Err(_) => EnvFilter::new("warn"),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        // Once per process: a binary that logs before its shared start (coda-acp) has set it up already.
        .try_init()
        .ok();
}

/// Runs `work` on a fresh runtime (two workers, timers and I/O), then leaves after at most `grace`: the
/// blocking stdin reader cannot be cancelled, so nothing waits for it. An error: the runtime did not start.
pub fn block_on<F: Future>(grace: Duration, work: F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let out = runtime.block_on(work);
    runtime.shutdown_timeout(grace);
    Ok(out)
}

/// Opens the `--trace-file`; on failure says why on stderr as `<bin>: cannot open trace file …`.
pub fn open_trace(bin: &str, path: &Path) -> Option<Trace> {
    match Trace::open(path) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("{bin}: cannot open trace file {}: {e}", path.display());
            None
        }
    }
}

/// Prints that the runtime did not start; the caller exits 1.
pub fn no_runtime(bin: &str, e: &std::io::Error) {
    eprintln!("{bin}: cannot start the async runtime: {e}");
}

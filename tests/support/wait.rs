//! Waiting for what a test checks: the event is polled for with a deadline, never "sleep, then look".
//!
//! A test runs on a loaded machine: a file, a process's end or a line on a pipe may come late. A fixed sleep
//! before looking fails when the event is later than the sleep and wastes the sleep when it is earlier.

use std::time::{Duration, Instant};

/// How long a test waits for something that normally takes milliseconds (a loaded 2-core machine).
pub const WITHIN: Duration = Duration::from_secs(15);

/// Polls `check` every 10 ms until it gives a value, and returns that value; once `within` has passed, panics
/// with `what()` (say what was waited for and what was seen instead).
pub fn until<T>(within: Duration, mut check: impl FnMut() -> Option<T>, what: impl FnOnce() -> String) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("not within {within:?}: {}", what());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` runs (a zombie waiting for a reaper that is not us does not count); `ps`, so that it means
/// the same on Linux and macOS.
pub fn runs(pid: i32) -> bool {
    let out = std::process::Command::new("ps").args(["-o", "stat=", "-p", &pid.to_string()]).output().expect("ps");
    let stat = String::from_utf8_lossy(&out.stdout);
    !stat.trim().is_empty() && !stat.trim().starts_with('Z')
}

/// Waits until `pid` no longer runs; panics after `within`.
pub fn gone(pid: i32, within: Duration) {
    until(within, || (!runs(pid)).then_some(()), || format!("process {pid} still runs"));
}

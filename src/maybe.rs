//! Waits that may have nothing to wait for, for `select!` arms: without a thing to wait for, they never end.

use tokio::signal::unix::Signal;
use tokio::time::Instant;

/// Sleeps until `at`; never ends without one.
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A signal's next delivery; never, when there is no handler (the caller does not handle signals).
pub async fn signal(sig: &mut Option<Signal>) {
    match sig {
        Some(sig) => {
            sig.recv().await;
        }
        None => std::future::pending().await,
    }
}

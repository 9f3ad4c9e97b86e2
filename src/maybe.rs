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

/// The next message on a channel that may be absent; never, without one or once its senders are gone.
pub async fn recv<T>(rx: &mut Option<tokio::sync::mpsc::Receiver<T>>) -> T {
    if let Some(r) = rx.as_mut()
        && let Some(v) = r.recv().await
    {
        return v;
    }
    *rx = None;
    std::future::pending().await
}

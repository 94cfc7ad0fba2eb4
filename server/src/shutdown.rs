//! The stop signal of a running server: one `watch` flag, set once by `Server::shutdown`,
//! read by every long-running task (HTTP, gRPC, sweeper, listener, sync sessions).

use tokio::sync::watch;

/// A new stop flag, not set: the sender stops, the receiver is cloned into each task.
pub fn channel() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(false)
}

/// Resolves once the stop flag is set (or its sender is gone).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// A stop flag that is never set, for state built outside a running server (router tests):
/// its sender lives as long as the process, so waiting on it never ends.
pub fn never() -> watch::Receiver<bool> {
    static NEVER: std::sync::OnceLock<watch::Sender<bool>> = std::sync::OnceLock::new();
    NEVER.get_or_init(|| watch::channel(false).0).subscribe()
}

/// Whether the stop flag is set.
pub fn is_stopped(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow()
}

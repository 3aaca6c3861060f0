//! Closing Kafka clients without hanging a stop.
//!
//! Dropping a consumer closes it: it leaves the group, runs the revoke callback and may commit.
//! With the cluster unreachable librdkafka's close can block indefinitely (rust-rdkafka #453).
//! So a stage closes its clients on a plain thread of its own and waits a bounded time
//! ([`CLOSE_WAIT`]); past it the thread is left behind and the stop goes on. A plain thread,
//! not `spawn_blocking`: a tokio runtime waits for its blocking tasks when it is dropped, so a
//! hung close there would hang the process exit (or the test) instead.

use std::time::Duration;

/// Longest a stop waits for a client to close.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Runs `close` on a thread of its own and waits at most [`CLOSE_WAIT`] for it, from async code.
/// True if it finished in time.
pub async fn close(what: &str, close: impl FnOnce() + Send + 'static) -> bool {
    close_within(what, CLOSE_WAIT, close).await
}

async fn close_within(what: &str, wait: Duration, close: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if spawn(what, move || {
        close();
        let _ = tx.send(());
    }) {
        if tokio::time::timeout(wait, rx).await.is_ok() {
            return true;
        }
        warn(what, wait);
    }
    false
}

/// [`close`] for a blocking caller (a stage that runs on a thread of its own).
pub fn close_blocking(what: &str, close: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    if spawn(what, move || {
        close();
        let _ = tx.send(());
    }) {
        if rx.recv_timeout(CLOSE_WAIT).is_ok() {
            return true;
        }
        warn(what, CLOSE_WAIT);
    }
    false
}

fn spawn(what: &str, f: impl FnOnce() + Send + 'static) -> bool {
    match std::thread::Builder::new()
        .name("kafka-close".into())
        .spawn(f)
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(client = what, error = %e, "cannot spawn a thread to close a Kafka client; leaving it");
            false
        }
    }
}

fn warn(what: &str, wait: Duration) {
    tracing::warn!(
        client = what,
        wait = ?wait,
        "closing a Kafka client did not finish in time (cluster unreachable?); leaving it behind"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_quick_close_is_waited_for() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        assert!(close("test", move || d.store(true, Ordering::SeqCst)).await);
        assert!(done.load(Ordering::SeqCst));
        let d = done.clone();
        assert!(close_blocking("test", move || d.store(false, Ordering::SeqCst)));
        assert!(!done.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_hung_close_is_left_behind() {
        let (_hold, wait) = std::sync::mpsc::channel::<()>();
        // Never returns while `_hold` lives.
        let closed = close_within("test", Duration::from_millis(50), move || {
            let _ = wait.recv();
        });
        assert!(!closed.await);
    }
}

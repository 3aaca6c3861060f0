//! The stage B watchdog: names a blocking Kafka call that hangs, and fails the stage.
//!
//! librdkafka can block a transactional call far past the timeout handed to it (e.g.
//! `send_offsets_to_transaction` while the group coordinator is down). The stage's thread arms
//! the watchdog around each such call with the call's name; the stage's async side polls
//! [`Watchdog::hung`] and, once one call has run past the deadline, returns an error naming it.
//! The hung thread is left behind (it is a plain thread, not a runtime task, so nothing waits for
//! it); the process exits non-zero and the orchestrator restarts it. A library user (a test, a
//! process running several stages) gets the error instead of a killed process.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One armed call: its name and when it started.
type Armed = Option<(&'static str, Instant)>;

#[derive(Clone, Default)]
pub struct Watchdog {
    armed: Arc<Mutex<Armed>>,
}

/// A call that ran past the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hung {
    pub op: &'static str,
    pub elapsed: Duration,
}

impl std::fmt::Display for Hung {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the Kafka call `{}` has blocked for {:.0?} (watchdog deadline {:.0?}); \
             stopping the dedupe stage so the process restarts",
            self.op, self.elapsed, DEADLINE
        )
    }
}

/// A blocking call running longer than this fails the stage.
pub const DEADLINE: Duration = Duration::from_secs(90);

impl Watchdog {
    /// Runs `f` (one blocking call named `op`) armed.
    pub fn guard<T>(&self, op: &'static str, f: impl FnOnce() -> T) -> T {
        self.set(Some((op, Instant::now())));
        let out = f();
        self.set(None);
        out
    }

    fn set(&self, armed: Armed) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = armed;
    }

    /// The armed call, if it has run longer than `deadline`.
    pub fn hung_past(&self, deadline: Duration) -> Option<Hung> {
        let armed = *self.armed.lock().unwrap_or_else(|e| e.into_inner());
        let (op, since) = armed?;
        let elapsed = since.elapsed();
        (elapsed > deadline).then_some(Hung { op, elapsed })
    }

    /// Resolves once a call has run past `deadline` (checked twice a second).
    pub async fn hung(&self, deadline: Duration) -> Hung {
        loop {
            if let Some(h) = self.hung_past(deadline) {
                return h;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_armed_call_past_the_deadline_is_hung() {
        let w = Watchdog::default();
        assert_eq!(w.hung_past(Duration::ZERO), None, "nothing armed");
        let seen = w.guard("committing", || {
            std::thread::sleep(Duration::from_millis(20));
            (
                w.hung_past(Duration::from_millis(5)),
                w.hung_past(Duration::from_secs(60)),
            )
        });
        let (past, within) = seen;
        assert_eq!(past.map(|h| h.op), Some("committing"));
        assert_eq!(within, None);
        assert_eq!(w.hung_past(Duration::ZERO), None, "disarmed after the call");
    }

    #[tokio::test]
    async fn hung_names_the_call_from_another_thread() {
        let w = Watchdog::default();
        let armed = w.clone();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            armed.guard("sending offsets to the dedupe transaction", || {
                let _ = release_rx.recv();
            })
        });
        let h = tokio::time::timeout(Duration::from_secs(5), w.hung(Duration::from_millis(50)))
            .await
            .expect("the watchdog fires");
        assert_eq!(h.op, "sending offsets to the dedupe transaction");
        assert!(h.to_string().contains("sending offsets"), "{h}");
        release_tx.send(()).unwrap();
        t.join().unwrap();
    }
}

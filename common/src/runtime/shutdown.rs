//! Graceful shutdown: one `tokio_util` [`CancellationToken`] cancelled by SIGTERM/SIGINT (or by a
//! test), observed by every stage loop. Dropping the last [`ShutdownTrigger`] also stops (a test
//! that drops its handle stops its stages); a [`Shutdown::child`] is a stop signal of its own that
//! also fires when its parent does (every tier stops when one fails or the process stops).

use std::sync::Arc;

use tokio_util::sync::{CancellationToken, DropGuard};

/// Cloneable handle that tells a stage to stop. Stages select on [`Shutdown::wait`].
#[derive(Clone, Debug)]
pub struct Shutdown {
    token: CancellationToken,
}

/// The sending side, held by whoever decides to stop (signal handler, test).
#[derive(Clone, Debug)]
pub struct ShutdownTrigger {
    token: CancellationToken,
    /// Cancels the token when the last clone of the trigger is dropped.
    _last: Arc<DropGuard>,
}

pub fn channel() -> (ShutdownTrigger, Shutdown) {
    trigger_of(CancellationToken::new())
}

fn trigger_of(token: CancellationToken) -> (ShutdownTrigger, Shutdown) {
    let trigger = ShutdownTrigger {
        token: token.clone(),
        _last: Arc::new(token.clone().drop_guard()),
    };
    (trigger, Shutdown { token })
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        self.token.cancel();
    }
    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            token: self.token.clone(),
        }
    }
}

impl Shutdown {
    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }
    /// Resolves once shutdown is requested (or every trigger is dropped).
    pub async fn wait(&mut self) {
        self.token.cancelled().await;
    }
    /// A stop signal of its own, that also fires when this one does.
    pub fn child(&self) -> (ShutdownTrigger, Shutdown) {
        trigger_of(self.token.child_token())
    }
}

/// Triggers shutdown on SIGTERM or SIGINT.
pub fn on_signals(trigger: ShutdownTrigger) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot install SIGTERM handler");
                        let _ = ctrl_c.await;
                        trigger.trigger();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => tracing::info!("SIGINT received, shutting down"),
                _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
        trigger.trigger();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_child_stops_with_its_parent_and_alone() {
        let (parent, mut shutdown) = channel();
        let (child, mut stop) = shutdown.child();
        child.trigger();
        stop.wait().await;
        assert!(!shutdown.is_triggered(), "the child alone");
        let (_other, mut other) = shutdown.child();
        parent.trigger();
        other.wait().await;
        shutdown.wait().await;
    }

    #[tokio::test]
    async fn dropping_the_last_trigger_stops() {
        let (trigger, mut shutdown) = channel();
        let clone = trigger.clone();
        drop(trigger);
        assert!(!shutdown.is_triggered(), "a clone is left");
        drop(clone);
        shutdown.wait().await;
    }
}

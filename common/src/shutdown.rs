//! Graceful shutdown: one watch channel flipped by SIGTERM/SIGINT (or by a test), observed by
//! every stage loop.

use tokio::sync::watch;

/// Cloneable handle that tells a stage to stop. Stages select on [`Shutdown::wait`].
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The sending side, held by whoever decides to stop (signal handler, test).
#[derive(Clone, Debug)]
pub struct ShutdownTrigger {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (
        ShutdownTrigger {
            tx: std::sync::Arc::new(tx),
        },
        Shutdown { rx },
    )
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }
    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }
    /// Resolves once shutdown is requested (or the trigger is dropped).
    pub async fn wait(&mut self) {
        let _ = self.rx.wait_for(|v| *v).await;
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

//! The operations HTTP server every process runs: `/metrics` (Prometheus text), `/healthz`
//! (process alive), `/readyz` (every stage has its Kafka clients up and partitions assigned).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::shutdown::Shutdown;

/// Readiness flags, one per stage; ready when all are set.
#[derive(Clone, Default)]
pub struct Readiness {
    flags: Arc<std::sync::Mutex<Vec<StageFlag>>>,
}

/// A stage name and its ready flag.
type StageFlag = (String, Arc<AtomicBool>);

impl Readiness {
    /// Registers a stage; it starts not ready.
    pub fn register(&self, stage: &str) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut flags) = self.flags.lock() {
            flags.push((stage.to_string(), flag.clone()));
        }
        flag
    }
    /// `Ok` when ready, else the names of the stages not ready.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let flags = match self.flags.lock() {
            Ok(f) => f,
            Err(_) => return Err(vec!["(poisoned)".into()]),
        };
        let not_ready: Vec<String> = flags
            .iter()
            .filter(|(_, f)| !f.load(Ordering::Relaxed))
            .map(|(n, _)| n.clone())
            .collect();
        if flags.is_empty() {
            return Err(vec!["(no stage)".into()]);
        }
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(not_ready)
        }
    }
}

#[derive(Clone)]
struct OpsState {
    registry: Registry,
    readiness: Readiness,
}

/// Binds `addr` and serves until shutdown. Returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    mut shutdown: Shutdown,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the ops server to {addr} (server.listen)"))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(OpsState {
            registry,
            readiness,
        });
    let handle = tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "ops server failed");
        }
    });
    tracing::info!(addr = %bound, "ops server listening (/metrics, /healthz, /readyz)");
    Ok((bound, handle))
}

async fn metrics(State(state): State<OpsState>) -> (StatusCode, String) {
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&state.registry.gather(), &mut buf) {
        Ok(()) => (StatusCode::OK, String::from_utf8(buf).unwrap_or_default()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn ready(State(state): State<OpsState>) -> (StatusCode, String) {
    match state.readiness.check() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(waiting) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", waiting.join(", ")),
        ),
    }
}

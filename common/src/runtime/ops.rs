//! The operations HTTP server every process runs: `/metrics` (Prometheus text), `/healthz`
//! (liveness: every running stage's loop has turned lately) and `/readyz` (readiness: every
//! stage has its partitions), and the per-stage probe state they report.
//!
//! Each stage registers a [`StageProbe`] and:
//! - marks itself ready once its consumer group gave it an assignment (an empty one included: an
//!   idle standby in a group with more members than partitions is healthy and must not block a
//!   rolling update) and, for deduper stage B, every assigned partition's state is restored;
//!   unready while restoring, after losing its assignment (evicted, session expired), and once
//!   stopped;
//! - stamps a heartbeat on every turn of its loop. `/healthz` fails (503, naming the stage) when
//!   a stage that has started turning has not turned for `server.liveness_bound`: a stuck loop,
//!   which only a restart mends. A stage still starting or already stopped is not judged
//!   (readiness covers those).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::runtime::shutdown::Shutdown;

/// `server.liveness_bound` when none is configured.
pub const DEFAULT_LIVENESS_BOUND: Duration = Duration::from_secs(60);

/// The probe state of every stage of this process, behind `/readyz` and `/healthz`.
#[derive(Clone)]
pub struct Readiness {
    stages: Arc<Mutex<Vec<StageProbe>>>,
    liveness_bound: Duration,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::new(DEFAULT_LIVENESS_BOUND)
    }
}

impl Readiness {
    /// `liveness_bound`: how long a stage's loop may go without a turn before `/healthz` fails.
    pub fn new(liveness_bound: Duration) -> Self {
        Readiness {
            stages: Arc::default(),
            liveness_bound,
        }
    }

    /// Registers a stage; it starts not ready and not yet judged for liveness.
    pub fn register(&self, stage: &str) -> StageProbe {
        let probe = StageProbe(Arc::new(ProbeState {
            name: stage.to_string(),
            ready: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            last_turn_ms: AtomicU64::new(0),
        }));
        self.lock().push(probe.clone());
        probe
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<StageProbe>> {
        self.stages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Ok` when every stage is ready, else why not, one entry per stage (`dispatcher`,
    /// `deduper.dedupe (stopped)`).
    pub fn check(&self) -> Result<(), Vec<String>> {
        let stages = self.lock();
        if stages.is_empty() {
            return Err(vec!["(no stage)".into()]);
        }
        let not_ready: Vec<String> = stages
            .iter()
            .filter(|p| !p.is_ready())
            .map(|p| {
                if p.0.stopped.load(Ordering::Relaxed) {
                    format!("{} (stopped)", p.0.name)
                } else {
                    p.0.name.clone()
                }
            })
            .collect();
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(not_ready)
        }
    }

    /// `Ok` when no running stage's loop has gone `liveness_bound` without a turn at `now`, else
    /// the stuck ones (`dispatcher: no loop turn for 75s (bound 60s)`).
    pub fn check_live_at(&self, now: Instant) -> Result<(), Vec<String>> {
        let now_ms = millis_since_epoch(now);
        let bound_ms = self.liveness_bound.as_millis() as u64;
        let stuck: Vec<String> = self
            .lock()
            .iter()
            .filter(|p| !p.0.stopped.load(Ordering::Relaxed))
            .filter_map(|p| {
                let last = p.0.last_turn_ms.load(Ordering::Relaxed);
                // 0: the loop has not turned yet (still starting).
                let idle = now_ms.saturating_sub(last);
                (last != 0 && idle > bound_ms).then(|| {
                    format!(
                        "{}: no loop turn for {}s (bound {}s)",
                        p.0.name,
                        idle / 1000,
                        self.liveness_bound.as_secs()
                    )
                })
            })
            .collect();
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(stuck)
        }
    }
}

/// One stage's readiness and heartbeat; cheap to clone into consumer contexts and tasks.
#[derive(Clone)]
pub struct StageProbe(Arc<ProbeState>);

struct ProbeState {
    name: String,
    ready: AtomicBool,
    stopped: AtomicBool,
    /// Milliseconds since [`EPOCH`] (+1) of the loop's last turn; 0 = none yet.
    last_turn_ms: AtomicU64,
}

/// The process-wide origin of heartbeat times (monotonic, unlike the wall clock).
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn millis_since_epoch(at: Instant) -> u64 {
    let epoch = *EPOCH.get_or_init(Instant::now);
    at.saturating_duration_since(epoch).as_millis() as u64 + 1
}

impl StageProbe {
    /// A probe not registered anywhere (tests, tools that run a stage's code alone).
    pub fn detached(stage: &str) -> Self {
        Readiness::default().register(stage)
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The stage has its assignment (and restored state) — or lost it (`false`).
    pub fn set_ready(&self, ready: bool) {
        self.0.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Relaxed) && !self.0.stopped.load(Ordering::Relaxed)
    }

    /// Stamps a turn of the stage's loop (liveness).
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    fn beat_at(&self, at: Instant) {
        self.0
            .last_turn_ms
            .store(millis_since_epoch(at), Ordering::Relaxed);
    }

    /// The stage's loop is over (stopping or stopped): not ready, no longer judged for liveness.
    pub fn stopped(&self) {
        self.0.stopped.store(true, Ordering::Relaxed);
        self.0.ready.store(false, Ordering::Relaxed);
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
        .route("/healthz", get(live))
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

async fn live(State(state): State<OpsState>) -> (StatusCode, String) {
    match state.readiness.check_live_at(Instant::now()) {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(stuck) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stuck: {}\n", stuck.join(", ")),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_every_stage_is_and_not_once_one_stops() {
        let r = Readiness::default();
        assert_eq!(r.check(), Err(vec!["(no stage)".to_string()]));
        let a = r.register("a");
        let b = r.register("b");
        assert_eq!(r.check(), Err(vec!["a".to_string(), "b".to_string()]));
        a.set_ready(true);
        b.set_ready(true);
        assert_eq!(r.check(), Ok(()));
        b.set_ready(false); // assignment lost
        assert_eq!(r.check(), Err(vec!["b".to_string()]));
        b.set_ready(true);
        a.stopped();
        assert_eq!(r.check(), Err(vec!["a (stopped)".to_string()]));
        a.set_ready(true); // a late callback cannot make a stopped stage ready
        assert_eq!(r.check(), Err(vec!["a (stopped)".to_string()]));
    }

    #[test]
    fn a_loop_without_a_turn_within_the_bound_is_stuck() {
        let r = Readiness::new(Duration::from_secs(30));
        let loop_a = r.register("a");
        let loop_b = r.register("b");
        let _ = millis_since_epoch(Instant::now()); // the epoch precedes t0
        let t0 = Instant::now();
        // Still starting (no turn yet): not judged.
        assert_eq!(r.check_live_at(t0 + Duration::from_secs(300)), Ok(()));
        loop_a.beat_at(t0);
        loop_b.beat_at(t0);
        assert_eq!(r.check_live_at(t0 + Duration::from_secs(29)), Ok(()));
        // b keeps turning, a is stuck.
        loop_b.beat_at(t0 + Duration::from_secs(40));
        let stuck = r
            .check_live_at(t0 + Duration::from_secs(45))
            .expect_err("a is stuck");
        assert_eq!(stuck.len(), 1);
        assert!(stuck[0].starts_with("a: no loop turn for 45s"), "{stuck:?}");
        // It turns again: alive.
        loop_a.beat_at(t0 + Duration::from_secs(46));
        assert_eq!(r.check_live_at(t0 + Duration::from_secs(47)), Ok(()));
        // A stopped stage is not judged.
        loop_a.stopped();
        assert_eq!(
            r.check_live_at(t0 + Duration::from_secs(400))
                .map_err(|e| e.len()),
            Err(1)
        );
        loop_b.stopped();
        assert_eq!(r.check_live_at(t0 + Duration::from_secs(400)), Ok(()));
    }
}

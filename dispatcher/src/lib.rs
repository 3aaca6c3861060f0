//! hookline dispatcher: delivers events from `<p>.dispatch` to the endpoints they fan out to.
//!
//! Module map:
//! - [`consumer`]: the stage itself — consume `<p>.dispatch`, fan out, first attempts through
//!   the shared delivery path (`hookline-delivery`), per-partition windows and contiguous
//!   offsets, rebalances, graceful drain.
//! - `window`: the per-partition window (unfinished events, span cap, resume at half).
//! - `metrics`: Prometheus metrics of the stage (`hookline_dispatcher_*`); attempts are counted
//!   by the delivery path (`hookline_delivery_*{stage="dispatcher"}`).

pub mod consumer;
mod metrics;
mod window;

use std::sync::Arc;

use hookline_common::config::Config;
use hookline_common::ops::Readiness;
use hookline_common::shutdown::Shutdown;
use hookline_control::Plane;

/// Runs the dispatcher stage until shutdown (SIGTERM: drain, commit, `Ok`). An error means the
/// stage could not go on safely (a fatal produce error, startup failed): exit non-zero. Starts
/// its own control plane (live endpoints, delivery log); see [`run_with`] to share one.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let plane = Plane::from_env(&config, &registry).await?;
    let result = run_with(config, registry, readiness, shutdown, plane.clone()).await;
    plane.close().await;
    result
}

/// [`run`] on the process's control plane: deliveries go to the registry's endpoints as they
/// are now, and every attempt is written to the delivery log.
pub async fn run_with(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    plane: Plane,
) -> anyhow::Result<()> {
    let probe = readiness.register(consumer::STAGE);
    let result = consumer::run(config, registry, probe.clone(), shutdown, &plane).await;
    probe.stopped();
    result
}

//! hookline dispatcher: delivers events from `<p>.dispatch` to the endpoints they fan out to.
//!
//! Module map:
//! - [`consumer`]: the stage loop — consume `<p>.dispatch`, fan out, first attempts through the
//!   shared delivery path (`hookline-delivery`), flow control of full partitions, graceful drain.
//! - `deliveries`: one (event, endpoint) delivery — attempt 1 and its hand-off through the
//!   delivery path, counted where it went, the event completed by its last delivery; the
//!   quarantine of a record without the event headers (`bad_delivery_record`).
//! - `window`: the per-partition window and the owned partitions' state machine (begun events,
//!   held records, pauses), pure logic with unit tests.
//! - `partitions`: that state shared by the loop, the delivery tasks and the callbacks, applied
//!   to the consumer (offsets stored, partitions paused and resumed).
//! - `rebalance`: the consumer's rebalance callbacks (`hookline_common::kafka::rebalance`).
//! - `metrics`: Prometheus metrics of the stage (`hookline_dispatcher_*`); attempts are counted
//!   by the delivery path (`hookline_delivery_*{stage="dispatcher"}`).

pub mod consumer;
mod deliveries;
mod metrics;
mod partitions;
mod rebalance;
mod window;

use std::sync::Arc;

use hookline_common::config::Config;
use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown::Shutdown;
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
    Plane::run_own(&config.clone(), &registry.clone(), |plane| {
        run_with(config, registry, readiness, shutdown, plane)
    })
    .await
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

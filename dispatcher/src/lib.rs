//! hookline dispatcher: delivers events from `<p>.dispatch` to the endpoints they fan out to.
//!
//! Module map:
//! - [`engine`]: the HTTP delivery engine shared with the retry tiers — one signed `POST` per
//!   attempt, bounded in time, response size and per-endpoint concurrency, returning an
//!   [`AttemptOutcome`].
//! - [`signing`]: Standard Webhooks v1 signatures (`webhook-signature`), and their verification
//!   for tests and the reference receiver.
//! - [`ssrf`]: the SSRF guard — blocked address ranges, the allow-list, and the DNS resolver that
//!   checks the addresses actually connected to.
//! - [`fanout`]: which endpoints an event goes to (tenant + event-type globs), lookup by id.
//! - [`handoff`]: the next hop of a failed delivery on the fixed schedule (tier or DLQ) and the
//!   delivery record's headers.
//! - [`handoff_write`]: writing a delivery record to its hop; a record that does not fit is
//!   trimmed, dead-lettered or quarantined as `record_too_large`, never a reason to stop.
//! - [`consumer`]: the stage itself — consume `<p>.dispatch`, fan out, first attempts, hand-off
//!   of failures, per-partition windows and contiguous offsets, rebalances, graceful drain.
//! - `metrics`: Prometheus metrics of the crate (`hookline_dispatcher_*`).

pub mod consumer;
pub mod engine;
pub mod fanout;
pub mod handoff;
pub mod handoff_write;
mod metrics;
pub mod signing;
pub mod ssrf;
mod window;

pub use engine::{AttemptOutcome, AttemptResult, Engine, FailureClass};

use std::sync::Arc;

use hookline_common::config::Config;
use hookline_common::ops::Readiness;
use hookline_common::shutdown::Shutdown;

/// Runs the dispatcher stage until shutdown (SIGTERM: drain, commit, `Ok`). An error means the
/// stage could not go on safely (a fatal produce error, startup failed): exit non-zero.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let probe = readiness.register(consumer::STAGE);
    let result = consumer::run(config, registry, probe.clone(), shutdown).await;
    probe.stopped();
    result
}

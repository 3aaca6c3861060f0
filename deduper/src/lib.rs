//! The deduper: turns the producers' `<p>.events` into exactly one `<p>.dispatch` record per
//! dedupe key per window.
//!
//! - [`validate`] (stage A): validate, quarantine bad input to `<p>.invalid`, re-partition valid
//!   events by our hash of the dedupe key onto `<p>.dedupe`; [`headers`]: its reading of a
//!   record's headers (at most [`headers::MAX_HEADERS`], UTF-8 names, parseable).
//! - [`dedupe`] (stage B): per-partition 24h seen-set, exactly-once forwarding of first
//!   sightings to `<p>.dispatch`, changelog `<p>.dedupe-state`, restore on assignment. With
//!   `dedupe.direct` (the default) it reads `<p>.events` itself, judging each record with stage
//!   A's [`validate::Admission`], and stage A does not run.
//! - `rebalance`: stage B's rebalance callbacks (commit before a revoke, restore on assign).
//! - `restore`: rebuilding a partition's seen-set from the changelog; `txn`: stage B's
//!   transactional calls retried and classified.
//! - [`seen`]: the compact seen-set (128-bit hash + coarse time, expiry by time buckets).
//! - [`metrics`]: counters of both stages.

pub mod dedupe;
pub mod headers;
pub mod metrics;
mod rebalance;
mod restore;
pub mod seen;
mod txn;
pub mod validate;
pub mod watchdog;

use std::sync::Arc;

use hookline_common::config::Config;
use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown::Shutdown;

/// Runs every deduper stage until shutdown; the first stage to fail stops the process.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    // `dedupe.direct`: stage B reads `<p>.events` itself and stage A does not run.
    let probe_a = (!config.dedupe.direct).then(|| readiness.register(validate::STAGE));
    let probe_b = readiness.register(dedupe::STAGE);
    // One family for both stages: `hookline_deduper_produce_errors_total{class}`.
    let produce_errors =
        hookline_common::kafka::produce::ProduceErrors::register(&registry, "deduper")?;
    let a = async {
        let Some(probe_a) = probe_a else {
            return Ok(());
        };
        let result = validate::run(
            config.clone(),
            registry.clone(),
            probe_a.clone(),
            produce_errors.clone(),
            shutdown.clone(),
        )
        .await;
        probe_a.stopped();
        result
    };
    let b = async {
        let result = dedupe::run(
            config.clone(),
            registry.clone(),
            probe_b.clone(),
            produce_errors.clone(),
            shutdown.clone(),
        )
        .await;
        probe_b.stopped();
        result
    };
    // Either failing stops both: the process exits non-zero and is restarted.
    tokio::try_join!(a, b).map(|_| ())
}

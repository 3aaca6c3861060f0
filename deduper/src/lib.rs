//! The deduper: turns the producers' `<p>.events` into exactly one `<p>.dispatch` record per
//! dedupe key per window.
//!
//! - [`validate`] (stage A): validate, quarantine bad input to `<p>.invalid`, re-partition valid
//!   events by our hash of the dedupe key onto `<p>.dedupe`.
//! - [`metrics`]: counters of both stages.

pub mod metrics;
pub mod seen;
pub mod validate;

use std::sync::Arc;

use hookline_common::config::Config;
use hookline_common::ops::Readiness;
use hookline_common::shutdown::Shutdown;

/// Runs every deduper stage until shutdown; the first stage to fail stops the process.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let ready_a = readiness.register(validate::STAGE);
    validate::run(config, registry, ready_a, shutdown).await
}

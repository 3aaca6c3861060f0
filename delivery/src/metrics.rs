//! Prometheus metrics of every delivery attempt, one family for the dispatcher, every tier and
//! replay, told apart by the `stage` label (`dispatcher`, `retry.<tier>`, `replay`):
//! - `hookline_delivery_attempts_total{stage, result="delivered|failed", class="ok|<failure class>", endpoint}`;
//! - `hookline_delivery_attempt_duration_seconds{stage, endpoint}`: connect, headers and the kept body;
//! - `hookline_delivery_dead_letters_total{stage, reason, endpoint}`: deliveries written to `<p>.dlq`;
//! - `hookline_delivery_throttled_total{stage, endpoint}`: deliveries to a rate-limited endpoint
//!   handed to `<p>.throttle` to wait for its budget (the wait itself: `hookline_throttle_*`);
//! - `hookline_delivery_filtered_total{stage, result="no_match|error", endpoint}`: events an
//!   endpoint's payload filter kept from it (at fan-out; on a later attempt the delivery is also
//!   dead-lettered as `endpoint_unsubscribed`);
//! - `hookline_delivery_inflight_requests{stage}`: requests on the wire, per engine (`dispatcher`,
//!   `retry` — one engine for every tier of a process — or `replay`);
//! - `hookline_delivery_stale_connection_retries_total{stage}`, per engine: requests sent again
//!   at once on a new connection because the reused pooled connection they went out on was
//!   closed by the endpoint before any byte of a response arrived (not the endpoint's failure,
//!   not an attempt of its own; see `conn`).
//!
//! `stage` is a constant label of each registration, so the dispatcher, the tiers and replay
//! register the same family on one registry (`run all`). Label values are closed sets: stage
//! names come from the code and `retry.schedule`, classes from [`FailureClass::ALL`], reasons
//! from `DeadReason`, and `endpoint` is the endpoint id only while the process has at most
//! `control.metrics_endpoint_limit` endpoints (default 100) — above that every series says
//! [`ALL_ENDPOINTS`], so a large installation cannot blow up the series count. Series appear
//! with an endpoint's first attempt.

use std::sync::Arc;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

use crate::outcome::{AttemptOutcome, AttemptResult, FailureClass};

/// Name of the attempt counter family.
pub const ATTEMPTS_TOTAL: &str = "hookline_delivery_attempts_total";
/// Name of the attempt duration histogram.
pub const ATTEMPT_DURATION: &str = "hookline_delivery_attempt_duration_seconds";
/// Name of the dead-letter counter.
pub const DEAD_LETTERS_TOTAL: &str = "hookline_delivery_dead_letters_total";
/// Name of the counter of deliveries handed to the rate limiter.
pub const THROTTLED_TOTAL: &str = "hookline_delivery_throttled_total";
/// Name of the payload-filter counter.
pub const FILTERED_TOTAL: &str = "hookline_delivery_filtered_total";
/// The `endpoint` label value when per-endpoint series are off (too many endpoints).
pub const ALL_ENDPOINTS: &str = "_all";

/// Name of the in-flight request gauge.
pub const INFLIGHT_REQUESTS: &str = "hookline_delivery_inflight_requests";
/// Name of the counter of requests sent again on a new connection.
pub const STALE_CONNECTION_RETRIES: &str = "hookline_delivery_stale_connection_retries_total";

/// The attempt series of one stage (`dispatcher`, `retry.5m`, `replay`). Cheap to clone.
#[derive(Clone)]
pub struct AttemptMetrics {
    stage: Arc<str>,
    attempts: IntCounterVec,
    duration: HistogramVec,
    dead: IntCounterVec,
    filtered: IntCounterVec,
    throttled: IntCounterVec,
}

impl AttemptMetrics {
    /// Registers the stage's series on `registry`, every one created up front (zeros, not gaps).
    pub fn register(registry: &Registry, stage: &str) -> prometheus::Result<Self> {
        let attempts = IntCounterVec::new(
            Opts::new(
                ATTEMPTS_TOTAL,
                "Delivery attempts by stage, result and failure class",
            )
            .const_label("stage", stage),
            &["result", "class", "endpoint"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                ATTEMPT_DURATION,
                "Duration of one delivery attempt (connect, headers, kept body)",
            )
            .const_label("stage", stage)
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["endpoint"],
        )?;
        let dead = IntCounterVec::new(
            Opts::new(
                DEAD_LETTERS_TOTAL,
                "Deliveries written to the dead-letter topic, by stage, reason and endpoint",
            )
            .const_label("stage", stage),
            &["reason", "endpoint"],
        )?;
        let filtered = IntCounterVec::new(
            Opts::new(
                FILTERED_TOTAL,
                "Events an endpoint's payload filter did not admit, by stage, result and endpoint",
            )
            .const_label("stage", stage),
            &["result", "endpoint"],
        )?;
        registry.register(Box::new(filtered.clone()))?;
        let throttled = IntCounterVec::new(
            Opts::new(
                THROTTLED_TOTAL,
                "Deliveries to rate-limited endpoints handed to <p>.throttle to wait for their budget",
            )
            .const_label("stage", stage),
            &["endpoint"],
        )?;
        registry.register(Box::new(throttled.clone()))?;
        registry.register(Box::new(attempts.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(dead.clone()))?;
        Ok(AttemptMetrics {
            stage: stage.into(),
            attempts,
            duration,
            dead,
            filtered,
            throttled,
        })
    }

    /// The `stage` label of these series.
    pub fn stage(&self) -> &str {
        &self.stage
    }

    /// Counts one finished attempt to `endpoint` (an id, or [`ALL_ENDPOINTS`]).
    pub fn observe(&self, outcome: &AttemptOutcome, endpoint: &str) {
        let (result, class) = match &outcome.result {
            AttemptResult::Delivered { .. } => ("delivered", "ok"),
            AttemptResult::Failed { class, .. } => ("failed", class.as_str()),
        };
        self.attempts
            .with_label_values(&[result, class, endpoint])
            .inc();
        // Attempts refused before reaching the endpoint would only drag the latency down.
        if !matches!(
            outcome.result,
            AttemptResult::Failed {
                class: FailureClass::Blocked | FailureClass::InvalidUrl,
                ..
            }
        ) {
            self.duration
                .with_label_values(&[endpoint])
                .observe(outcome.duration.as_secs_f64());
        }
    }

    /// Counts one event a filter did not admit (`result`: `no_match` or `error`).
    pub fn filtered(&self, result: &str, endpoint: &str) {
        self.filtered.with_label_values(&[result, endpoint]).inc();
    }

    /// Counts one delivery handed to the rate limiter (`<p>.throttle`).
    pub fn throttled(&self, endpoint: &str) {
        self.throttled.with_label_values(&[endpoint]).inc();
    }

    /// Counts one delivery written to the dead-letter topic.
    pub fn dead_lettered(&self, reason: &str, endpoint: &str) {
        self.dead.with_label_values(&[reason, endpoint]).inc();
    }
}

/// The in-flight request gauge of one engine.
pub(crate) fn inflight_requests(registry: &Registry, stage: &str) -> prometheus::Result<IntGauge> {
    let gauge = IntGauge::with_opts(
        Opts::new(
            INFLIGHT_REQUESTS,
            "HTTP requests to endpoints currently in flight",
        )
        .const_label("stage", stage),
    )?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

/// The counter of one engine's requests sent again on a new connection.
pub(crate) fn stale_connection_retries(
    registry: &Registry,
    stage: &str,
) -> prometheus::Result<IntCounter> {
    let counter = IntCounter::with_opts(
        Opts::new(
            STALE_CONNECTION_RETRIES,
            "Requests sent again on a new connection: the reused connection they went out on was closed by the endpoint before any response byte",
        )
        .const_label("stage", stage),
    )?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}

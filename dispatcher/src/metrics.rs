//! Prometheus metrics of the dispatcher crate.
//!
//! Engine metrics: one attempt counter by result and failure class, an attempt duration
//! histogram and an in-flight gauge. Label values are closed sets (never URLs, endpoint ids or
//! error text), so series count stays fixed.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};

use crate::engine::{AttemptOutcome, AttemptResult, FailureClass};

/// Metrics of the HTTP delivery engine.
#[derive(Clone)]
pub(crate) struct EngineMetrics {
    /// `hookline_dispatcher_attempts_total{result="delivered|failed", class="ok|<failure class>"}`.
    attempts: IntCounterVec,
    /// Time of one attempt that went to the network: connect, headers and the kept body.
    duration: Histogram,
    /// Requests currently on the wire (holding an endpoint concurrency permit).
    pub(crate) inflight: IntGauge,
}

impl EngineMetrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let attempts = IntCounterVec::new(
            Opts::new(
                "hookline_dispatcher_attempts_total",
                "Delivery attempts by result and failure class",
            ),
            &["result", "class"],
        )?;
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "hookline_dispatcher_attempt_duration_seconds",
                "Duration of one delivery attempt (connect, headers, kept body)",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
        )?;
        let inflight = IntGauge::new(
            "hookline_dispatcher_inflight_requests",
            "HTTP requests to endpoints currently in flight",
        )?;
        registry.register(Box::new(attempts.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        // Every series exists from the start, so rates and alerts see zeros, not gaps.
        attempts.with_label_values(&["delivered", "ok"]);
        for class in FailureClass::ALL {
            attempts.with_label_values(&["failed", class.as_str()]);
        }
        Ok(EngineMetrics {
            attempts,
            duration,
            inflight,
        })
    }

    /// Counts one finished attempt.
    pub(crate) fn observe(&self, outcome: &AttemptOutcome) {
        let (result, class) = match &outcome.result {
            AttemptResult::Delivered { .. } => ("delivered", "ok"),
            AttemptResult::Failed { class, .. } => ("failed", class.as_str()),
        };
        self.attempts.with_label_values(&[result, class]).inc();
        // Attempts refused before reaching the endpoint would only drag the latency down.
        if !matches!(
            outcome.result,
            AttemptResult::Failed {
                class: FailureClass::Blocked | FailureClass::InvalidUrl,
                ..
            }
        ) {
            self.duration.observe(outcome.duration.as_secs_f64());
        }
    }
}

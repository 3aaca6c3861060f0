//! Deduper metrics. Each internal event has one `emit` that logs and counts, so logs and metrics
//! never drift.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use hookline_common::envelope::{Invalid, InvalidReason};

/// Stage A (validation) counters.
#[derive(Clone)]
pub struct ValidateMetrics {
    valid: IntCounter,
    invalid: IntCounterVec,
}

impl ValidateMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let valid = IntCounter::with_opts(Opts::new(
            "hookline_deduper_valid_events_total",
            "Events that passed validation and were forwarded to <p>.dedupe",
        ))?;
        let invalid = IntCounterVec::new(
            Opts::new(
                "hookline_deduper_invalid_events_total",
                "Records quarantined to <p>.invalid, by reason",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(valid.clone()))?;
        registry.register(Box::new(invalid.clone()))?;
        // Pre-create every label so dashboards show zeros rather than gaps.
        for r in InvalidReason::ALL {
            invalid.with_label_values(&[r.as_str()]);
        }
        Ok(ValidateMetrics { valid, invalid })
    }

    pub fn emit_valid(&self) {
        self.valid.inc();
    }

    pub fn emit_invalid(&self, partition: i32, offset: i64, why: &Invalid) {
        tracing::warn!(
            partition,
            offset,
            reason = why.reason.as_str(),
            detail = %why.detail,
            "event quarantined to the invalid topic"
        );
        self.invalid.with_label_values(&[why.reason.as_str()]).inc();
    }
}

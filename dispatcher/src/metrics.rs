//! Prometheus metrics of the dispatcher stage: events taken from `<p>.dispatch` by result,
//! hand-offs by target, deferrals, events in flight. Attempts are counted by the delivery path
//! (`hookline_delivery_attempts_total{stage="dispatcher"}`). Label values are closed sets (never URLs,
//! endpoint ids or error text), so series count stays fixed.
//!
//! Each internal event of the consumer has one `emit_…` method that logs *and* counts, so logs
//! and metrics never drift.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Where a failed first attempt was handed: the first retry tier, or the dead-letter topic when
/// the schedule has a single attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffTarget {
    Retry,
    Dlq,
    /// Did not fit the tier: dead-lettered with reason `record_too_large`.
    DlqRecordTooLarge,
    /// Fit neither the tier nor the DLQ: quarantined on `<p>.invalid`.
    InvalidRecordTooLarge,
    /// Refused even as a bounded quarantine record: nothing written.
    Dropped,
}

impl HandoffTarget {
    const ALL: [HandoffTarget; 5] = [
        HandoffTarget::Retry,
        HandoffTarget::Dlq,
        HandoffTarget::DlqRecordTooLarge,
        HandoffTarget::InvalidRecordTooLarge,
        HandoffTarget::Dropped,
    ];

    fn as_str(self) -> &'static str {
        match self {
            HandoffTarget::Retry => "retry",
            HandoffTarget::Dlq => "dlq",
            HandoffTarget::DlqRecordTooLarge => "dlq_record_too_large",
            HandoffTarget::InvalidRecordTooLarge => "invalid_record_too_large",
            HandoffTarget::Dropped => "dropped",
        }
    }
}

/// Metrics of the dispatcher's consumer loop.
#[derive(Clone)]
pub(crate) struct ConsumerMetrics {
    /// `hookline_dispatcher_events_total{result="fanned_out|no_endpoint|malformed"}`.
    events: IntCounterVec,
    /// `hookline_dispatcher_handoffs_total{target="retry|dlq"}`.
    handoffs: IntCounterVec,
    /// `hookline_dispatcher_deferred_total`: deliveries whose attempt 1 was not made because the
    /// endpoint was saturated, handed to the first tier.
    deferred: IntCounter,
    /// Events taken from `<p>.dispatch` whose deliveries are not all delivered or handed off.
    inflight: IntGauge,
}

impl ConsumerMetrics {
    const EVENT_RESULTS: [&'static str; 3] = ["fanned_out", "no_endpoint", "malformed"];

    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let events = IntCounterVec::new(
            Opts::new(
                "hookline_dispatcher_events_total",
                "Events read from <p>.dispatch, by what the dispatcher did with them",
            ),
            &["result"],
        )?;
        let handoffs = IntCounterVec::new(
            Opts::new(
                "hookline_dispatcher_handoffs_total",
                "Failed first attempts handed off, by where the record went (retry, dlq, dlq_record_too_large, invalid_record_too_large, dropped)",
            ),
            &["target"],
        )?;
        let deferred = IntCounter::new(
            "hookline_dispatcher_deferred_total",
            "Deliveries deferred to the first retry tier without an attempt (endpoint saturated)",
        )?;
        let inflight = IntGauge::new(
            "hookline_dispatcher_inflight_events",
            "Events whose deliveries are not all delivered or handed off yet",
        )?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(handoffs.clone()))?;
        registry.register(Box::new(deferred.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        for result in Self::EVENT_RESULTS {
            events.with_label_values(&[result]);
        }
        for target in HandoffTarget::ALL {
            handoffs.with_label_values(&[target.as_str()]);
        }
        Ok(ConsumerMetrics {
            events,
            handoffs,
            deferred,
            inflight,
        })
    }

    /// An event went out to `endpoints` deliveries.
    pub(crate) fn emit_fanned_out(&self, partition: i32, offset: i64, endpoints: usize) {
        tracing::trace!(partition, offset, endpoints, "event fanned out");
        self.events.with_label_values(&["fanned_out"]).inc();
        self.inflight.inc();
    }

    /// Every delivery of a fanned-out event is delivered or handed off.
    pub(crate) fn emit_event_done(&self) {
        self.inflight.dec();
    }

    /// No enabled endpoint subscribes to the event: it is complete at once.
    pub(crate) fn emit_no_endpoint(&self, partition: i32, offset: i64, event_type: &str) {
        tracing::debug!(
            partition,
            offset,
            event_type,
            "no endpoint subscribes to the event"
        );
        self.events.with_label_values(&["no_endpoint"]).inc();
    }

    /// A record without the envelope headers the deduper writes (or without a value): a bug
    /// upstream, or a record not written by the deduper. It is parked on `<p>.invalid` as
    /// `bad_delivery_record` and completed once Kafka acknowledged the copy (never retried
    /// forever, never lost silently).
    pub(crate) fn emit_malformed(&self, partition: i32, offset: i64, problem: &str) {
        tracing::error!(
            partition,
            offset,
            problem,
            "malformed dispatch record quarantined to the invalid topic as bad_delivery_record \
             (written by something other than the deduper?)"
        );
        self.events.with_label_values(&["malformed"]).inc();
    }

    /// A delivery to a saturated endpoint was acknowledged on the first tier without an attempt.
    /// Logged at debug only: a hanging endpoint defers every delivery (the engine logs the
    /// endpoint's saturation once).
    pub(crate) fn emit_deferred(&self, endpoint: &str, event: &str, busy: usize) {
        tracing::debug!(
            endpoint,
            event,
            busy,
            "endpoint saturated, delivery deferred to the retry tier"
        );
        self.deferred.inc();
    }

    /// A failed first attempt was acknowledged by Kafka on its next hop.
    pub(crate) fn emit_handed_off(
        &self,
        endpoint: &str,
        event: &str,
        attempt: u32,
        class: &str,
        target: HandoffTarget,
    ) {
        match target {
            HandoffTarget::Retry => tracing::warn!(
                endpoint,
                event,
                attempt,
                class,
                "delivery failed, handed to retry tier"
            ),
            HandoffTarget::Dlq => tracing::warn!(
                endpoint,
                event,
                attempt,
                class,
                "delivery failed, dead-lettered (the schedule has a single attempt)"
            ),
            HandoffTarget::DlqRecordTooLarge => tracing::error!(
                endpoint,
                event,
                attempt,
                class,
                "delivery failed and its record is too large for the retry tier: dead-lettered \
                 with reason record_too_large"
            ),
            HandoffTarget::InvalidRecordTooLarge => tracing::error!(
                endpoint,
                event,
                attempt,
                class,
                "delivery failed and its record fits neither the tier nor the DLQ: quarantined \
                 as record_too_large"
            ),
            HandoffTarget::Dropped => tracing::error!(
                endpoint,
                event,
                attempt,
                class,
                "delivery failed and its record could not be written anywhere: dropped"
            ),
        }
        self.handoffs.with_label_values(&[target.as_str()]).inc();
    }
}

//! Prometheus metrics of the tier workers, `hookline_retry_*`. Label values are closed sets: the
//! tier names come from `retry.schedule` (and the orphan tier topics found at start), outcomes are
//! a fixed list. Attempts are counted by the delivery path, in
//! `hookline_delivery_attempts_total{stage="retry.<tier>"}`.
//!
//! Each internal event has one `emit_…` method that logs *and* counts, so logs and metrics never
//! drift.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use hookline_common::contract::delivery::{DeadReason, DeliveryMeta};
use hookline_delivery::{AttemptMetrics, AttemptOutcome, Written};

/// What a tier worker did with one record (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Delivered,
    NextTier,
    /// Not attempted: the endpoint was saturated; moved to the next slot's tier.
    Deferred,
    Dead(DeadReason),
    Invalid,
    /// Fit neither the next tier nor the DLQ: quarantined as `record_too_large`.
    InvalidTooLarge,
    /// Refused even as a bounded quarantine record: nothing written.
    Dropped,
}

impl Outcome {
    const ALL: [Outcome; 11] = [
        Outcome::Delivered,
        Outcome::NextTier,
        Outcome::Deferred,
        Outcome::Dead(DeadReason::Exhausted),
        Outcome::Dead(DeadReason::EndpointRemoved),
        Outcome::Dead(DeadReason::EndpointDisabled),
        Outcome::Dead(DeadReason::EndpointUnsubscribed),
        Outcome::Dead(DeadReason::RecordTooLarge),
        Outcome::Invalid,
        Outcome::InvalidTooLarge,
        Outcome::Dropped,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::NextTier => "next_tier",
            Outcome::Deferred => "deferred",
            Outcome::Dead(DeadReason::Exhausted) => "dead_exhausted",
            Outcome::Dead(DeadReason::EndpointRemoved) => "dead_endpoint_removed",
            Outcome::Dead(DeadReason::EndpointDisabled) => "dead_endpoint_disabled",
            Outcome::Dead(DeadReason::EndpointUnsubscribed) => "dead_endpoint_unsubscribed",
            Outcome::Dead(DeadReason::RecordTooLarge) => "dead_record_too_large",
            Outcome::Invalid => "invalid",
            Outcome::InvalidTooLarge => "invalid_record_too_large",
            Outcome::Dropped => "dropped",
        }
    }
}

/// Metric families shared by every tier of the process.
#[derive(Clone)]
pub(crate) struct Metrics {
    /// Where each tier registers its attempt series (`hookline_delivery_*{stage="retry.<tier>"}`).
    registry: Registry,
    records: IntCounterVec,
    lateness: HistogramVec,
    due_skew: HistogramVec,
    waiting: IntGaugeVec,
    inflight: IntGaugeVec,
    paused: IntGaugeVec,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let records = IntCounterVec::new(
            Opts::new(
                "hookline_retry_records_total",
                "Tier records finished, by outcome (delivered, next tier, dead by reason, invalid)",
            ),
            &["tier", "outcome"],
        )?;
        let lateness = HistogramVec::new(
            HistogramOpts::new(
                "hookline_retry_lateness_seconds",
                "How late an attempt started after its due time",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                1800.0,
            ]),
            &["tier"],
        )?;
        let due_skew = HistogramVec::new(
            HistogramOpts::new(
                "hookline_retry_due_skew_seconds",
                "How far a record's due time was beyond record timestamp + the tier's delay (a \
                 producing host's clock running fast); observed for each due time capped",
            )
            .buckets(vec![
                5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
            ]),
            &["tier"],
        )?;
        let waiting = IntGaugeVec::new(
            Opts::new(
                "hookline_retry_waiting_records",
                "Records read from a tier and held in memory until they are due",
            ),
            &["tier"],
        )?;
        let inflight = IntGaugeVec::new(
            Opts::new(
                "hookline_retry_inflight_records",
                "Tier records being attempted or handed off",
            ),
            &["tier"],
        )?;
        let paused = IntGaugeVec::new(
            Opts::new(
                "hookline_retry_paused_partitions",
                "Tier partitions paused (head not due yet, or enough records held)",
            ),
            &["tier"],
        )?;
        registry.register(Box::new(records.clone()))?;
        registry.register(Box::new(lateness.clone()))?;
        registry.register(Box::new(due_skew.clone()))?;
        registry.register(Box::new(waiting.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        registry.register(Box::new(paused.clone()))?;
        Ok(Metrics {
            registry: registry.clone(),
            records,
            lateness,
            due_skew,
            waiting,
            inflight,
            paused,
        })
    }

    /// The metrics of one tier, every series created up front (zeros, not gaps). Its attempt
    /// series are registered here: once per tier and registry.
    pub(crate) fn tier(&self, tier: &str) -> prometheus::Result<TierMetrics> {
        // The rate limiter's attempts are `stage="throttle"`; a tier's `retry.<tier>`.
        let stage = if tier == crate::THROTTLE {
            tier.to_string()
        } else {
            format!("retry.{tier}")
        };
        let attempts = AttemptMetrics::register(&self.registry, &stage)?;
        Ok(TierMetrics {
            tier: tier.to_string(),
            attempts,
            records: Outcome::ALL
                .iter()
                .map(|o| (*o, self.records.with_label_values(&[tier, o.as_str()])))
                .collect(),
            lateness: self.lateness.with_label_values(&[tier]),
            due_skew: self.due_skew.with_label_values(&[tier]),
            skew_warned: Arc::new(AtomicBool::new(false)),
            waiting: self.waiting.with_label_values(&[tier]),
            inflight: self.inflight.with_label_values(&[tier]),
            paused: self.paused.with_label_values(&[tier]),
        })
    }
}

/// The series of one tier.
#[derive(Clone)]
pub(crate) struct TierMetrics {
    tier: String,
    /// `hookline_delivery_attempts_total{stage="retry.<tier>"}`, counted by the delivery path.
    pub(crate) attempts: AttemptMetrics,
    records: Vec<(Outcome, IntCounter)>,
    lateness: Histogram,
    due_skew: Histogram,
    skew_warned: Arc<AtomicBool>,
    pub(crate) waiting: IntGauge,
    pub(crate) inflight: IntGauge,
    pub(crate) paused: IntGauge,
}

impl TierMetrics {
    fn count(&self, outcome: Outcome) {
        if let Some((_, c)) = self.records.iter().find(|(o, _)| *o == outcome) {
            c.inc();
        }
    }

    /// An attempt due at `due_ms` finished (the delivery path counted it): how late it started.
    pub(crate) fn emit_attempt(&self, meta: &DeliveryMeta, due_ms: i64, outcome: &AttemptOutcome) {
        let lateness_ms = (outcome.started_at_ms - due_ms).max(0);
        self.lateness.observe(lateness_ms as f64 / 1000.0);
        let class = outcome
            .result
            .failure_class()
            .map_or("ok", |class| class.as_str());
        tracing::debug!(
            tier = %self.tier,
            endpoint = %meta.endpoint_id,
            event_id = %meta.event_id,
            attempt = outcome.attempt,
            class,
            lateness_ms,
            "retry attempt finished"
        );
    }

    /// A record's due time was beyond what its tier allows by `skew_ms`; it is due at
    /// `due_ms` instead.
    pub(crate) fn emit_due_capped(&self, partition: i32, offset: i64, skew_ms: i64, due_ms: i64) {
        self.due_skew.observe(skew_ms as f64 / 1000.0);
        // A host with a fast clock skews every record it writes: one warning per tier worker,
        // the rest at debug level; the histogram counts them all.
        if !self.skew_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                tier = %self.tier,
                partition,
                offset,
                skew_ms,
                due_ms,
                "due time later than the tier allows (a producing host's clock runs fast?); capped, further ones are logged at debug level"
            );
        } else {
            tracing::debug!(
                tier = %self.tier,
                partition,
                offset,
                skew_ms,
                due_ms,
                "due time later than the tier allows; capped"
            );
        }
    }

    pub(crate) fn emit_delivered(&self, meta: &DeliveryMeta, attempt: u32) {
        tracing::info!(
            tier = %self.tier,
            endpoint = %meta.endpoint_id,
            event_id = %meta.event_id,
            attempt,
            "delivered on retry"
        );
        self.count(Outcome::Delivered);
    }

    pub(crate) fn emit_next_tier(&self, meta: &DeliveryMeta, topic: &str) {
        tracing::debug!(
            tier = %self.tier,
            endpoint = %meta.endpoint_id,
            event_id = %meta.event_id,
            next_attempt = meta.attempt,
            due_ms = meta.due_ms,
            topic,
            "retry failed, handed to the next tier"
        );
        self.count(Outcome::NextTier);
    }

    /// Debug only: a saturated endpoint defers every record beyond its slots (the engine logs
    /// the saturation once).
    pub(crate) fn emit_deferred(&self, meta: &DeliveryMeta, topic: &str) {
        tracing::debug!(
            tier = %self.tier,
            endpoint = %meta.endpoint_id,
            event_id = %meta.event_id,
            attempt = meta.attempt,
            deferrals = meta.deferrals,
            due_ms = meta.due_ms,
            topic,
            "endpoint saturated, attempt deferred to the next tier"
        );
        self.count(Outcome::Deferred);
    }

    pub(crate) fn emit_dead(&self, meta: &DeliveryMeta, reason: DeadReason) {
        tracing::warn!(
            tier = %self.tier,
            endpoint = %meta.endpoint_id,
            event_id = %meta.event_id,
            reason = reason.as_str(),
            attempts = meta.history.last().map_or(0, |a| a.n),
            "delivery is dead, moved to the dead-letter topic"
        );
        self.count(Outcome::Dead(reason));
    }

    pub(crate) fn emit_invalid(&self, partition: i32, offset: i64, problem: &str) {
        tracing::error!(
            tier = %self.tier,
            partition,
            offset,
            problem,
            "tier record without readable delivery metadata, parked on the invalid topic"
        );
        self.count(Outcome::Invalid);
    }

    /// Where a delivery record went when it could not be written as planned.
    pub(crate) fn emit_rerouted(&self, meta: &DeliveryMeta, written: Written) {
        match written {
            Written::AsPlanned => {}
            Written::DeadTooLarge => self.emit_dead(meta, DeadReason::RecordTooLarge),
            Written::Quarantined => {
                tracing::error!(
                    tier = %self.tier,
                    endpoint = %meta.endpoint_id,
                    event_id = %meta.event_id,
                    "delivery record fits neither the next tier nor the DLQ; quarantined as record_too_large"
                );
                self.count(Outcome::InvalidTooLarge);
            }
            Written::Dropped => {
                tracing::error!(
                    tier = %self.tier,
                    endpoint = %meta.endpoint_id,
                    event_id = %meta.event_id,
                    "delivery record could not be written anywhere; dropped"
                );
                self.count(Outcome::Dropped);
            }
        }
    }
}

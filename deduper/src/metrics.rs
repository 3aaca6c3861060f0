//! Deduper metrics. Each internal event has one `emit` that logs and counts, so logs and metrics
//! never drift.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use hookline_common::contract::envelope::{Invalid, InvalidReason};

/// Stage A (validation) counters.
#[derive(Clone)]
pub struct ValidateMetrics {
    valid: IntCounter,
    invalid: IntCounterVec,
    dropped: IntCounter,
}

impl ValidateMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let valid = IntCounter::with_opts(Opts::new(
            "hookline_deduper_valid_events_total",
            "Events that passed validation (by stage A, or by stage B reading <p>.events with dedupe.direct)",
        ))?;
        let invalid = IntCounterVec::new(
            Opts::new(
                "hookline_deduper_invalid_events_total",
                "Records quarantined to <p>.invalid, by reason",
            ),
            &["reason"],
        )?;
        let dropped = IntCounter::with_opts(Opts::new(
            "hookline_deduper_dropped_records_total",
            "Input records that could be written nowhere, not even as a bounded quarantine record",
        ))?;
        registry.register(Box::new(valid.clone()))?;
        registry.register(Box::new(invalid.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        // Pre-create every label so dashboards show zeros rather than gaps.
        for r in InvalidReason::ALL {
            invalid.with_label_values(&[r.as_str()]);
        }
        Ok(ValidateMetrics {
            valid,
            invalid,
            dropped,
        })
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

    /// Kafka refused even the bounded `record_too_large` quarantine record of an input (the
    /// invalid topic's limit is absurdly small): nothing was written; the stage moves on.
    pub fn emit_dropped(&self, partition: i32, offset: i64, error: &rdkafka::error::KafkaError) {
        tracing::error!(
            partition,
            offset,
            error = %error,
            "record refused even as a bounded quarantine record; dropped"
        );
        self.dropped.inc();
    }
}

/// Stage B (dedupe) metrics.
#[derive(Clone)]
pub struct DedupeMetrics {
    forwarded: IntCounter,
    too_large: IntCounter,
    duplicates: IntCounter,
    unkeyed: IntCounter,
    rekeyed: IntCounter,
    transactions: IntCounterVec,
    batch_records: prometheus::Histogram,
    restore_seconds: prometheus::Histogram,
    restored_records: IntCounter,
    seen_keys: prometheus::IntGauge,
    seen_bytes: prometheus::IntGauge,
}

impl DedupeMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let forwarded = IntCounter::with_opts(Opts::new(
            "hookline_deduper_forwarded_total",
            "First sightings forwarded to <p>.dispatch (committed or about to be)",
        ))?;
        let too_large = IntCounter::with_opts(Opts::new(
            "hookline_deduper_too_large_total",
            "First sightings too large for <p>.dispatch, quarantined as record_too_large",
        ))?;
        let duplicates = IntCounter::with_opts(Opts::new(
            "hookline_deduper_duplicates_total",
            "Records dropped because their dedupe key was seen within the window",
        ))?;
        let unkeyed = IntCounter::with_opts(Opts::new(
            "hookline_deduper_unkeyed_total",
            "Records on <p>.dedupe without a dedupe key header (forwarded, not deduped)",
        ))?;
        let rekeyed = IntCounter::with_opts(Opts::new(
            "hookline_deduper_rekeyed_total",
            "Events read from <p>.events on another partition than their dedupe key's, forwarded \
             to <p>.dedupe (dedupe.direct; producers that place events by key make this 0)",
        ))?;
        let transactions = IntCounterVec::new(
            Opts::new(
                "hookline_deduper_transactions_total",
                "Dedupe transactions by result",
            ),
            &["result"],
        )?;
        let batch_records = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "hookline_deduper_transaction_records",
                "Input records per committed transaction",
            )
            .buckets(prometheus::exponential_buckets(1.0, 4.0, 9)?),
        )?;
        let restore_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "hookline_deduper_restore_duration_seconds",
                "Time to rebuild one partition's seen-set from the changelog",
            )
            .buckets(prometheus::exponential_buckets(0.01, 4.0, 9)?),
        )?;
        let restored_records = IntCounter::with_opts(Opts::new(
            "hookline_deduper_restored_records_total",
            "Changelog records read while restoring",
        ))?;
        let seen_keys = prometheus::IntGauge::new(
            "hookline_deduper_seen_keys",
            "Keys held in the seen-sets of this process",
        )?;
        let seen_bytes = prometheus::IntGauge::new(
            "hookline_deduper_seen_bytes",
            "Bytes held by the seen-set tables of this process",
        )?;
        registry.register(Box::new(forwarded.clone()))?;
        registry.register(Box::new(too_large.clone()))?;
        registry.register(Box::new(duplicates.clone()))?;
        registry.register(Box::new(unkeyed.clone()))?;
        registry.register(Box::new(rekeyed.clone()))?;
        registry.register(Box::new(transactions.clone()))?;
        registry.register(Box::new(batch_records.clone()))?;
        registry.register(Box::new(restore_seconds.clone()))?;
        registry.register(Box::new(restored_records.clone()))?;
        registry.register(Box::new(seen_keys.clone()))?;
        registry.register(Box::new(seen_bytes.clone()))?;
        for r in ["committed", "aborted", "recovered"] {
            transactions.with_label_values(&[r]);
        }
        Ok(DedupeMetrics {
            forwarded,
            too_large,
            duplicates,
            unkeyed,
            rekeyed,
            transactions,
            batch_records,
            restore_seconds,
            restored_records,
            seen_keys,
            seen_bytes,
        })
    }

    pub fn emit_forwarded(&self) {
        self.forwarded.inc();
    }

    /// A first sighting that cannot be forwarded was quarantined as `record_too_large`.
    pub fn emit_too_large(&self, partition: i32, offset: i64, problem: &str) {
        tracing::warn!(
            partition,
            offset,
            problem,
            "dedupe record too large to forward; quarantined to the invalid topic"
        );
        self.too_large.inc();
    }

    pub fn emit_duplicate(&self) {
        self.duplicates.inc();
    }

    pub fn emit_unkeyed(&self, partition: i32, offset: i64) {
        tracing::error!(
            partition,
            offset,
            "record on the dedupe topic has no dedupe key header; forwarding it undeduped"
        );
        self.unkeyed.inc();
    }

    /// An event read on another partition than its key's, forwarded to `<p>.dedupe`. Counted,
    /// not logged: a producer that places events by its own rule makes this every event.
    pub fn emit_rekeyed(&self) {
        self.rekeyed.inc();
    }

    pub fn emit_commit(&self, records: usize) {
        self.transactions.with_label_values(&["committed"]).inc();
        self.batch_records.observe(records as f64);
    }

    pub fn emit_abort(&self) {
        tracing::warn!("dedupe transaction aborted; partitions rewound and restored");
        self.transactions.with_label_values(&["aborted"]).inc();
    }

    /// The transactional producer was replaced (its transaction state could not be trusted).
    pub fn emit_recovered(&self, error: &anyhow::Error) {
        tracing::warn!(
            error = %error,
            "dedupe transaction state lost; transactional producer replaced (the old one fenced), partitions rewound and restored"
        );
        self.transactions.with_label_values(&["recovered"]).inc();
    }

    pub fn emit_restored(
        &self,
        partition: i32,
        records: u64,
        keys: usize,
        elapsed: std::time::Duration,
    ) {
        tracing::info!(
            partition,
            records,
            keys,
            elapsed_ms = elapsed.as_millis() as u64,
            "dedupe state restored"
        );
        self.restore_seconds.observe(elapsed.as_secs_f64());
        self.restored_records.inc_by(records);
    }

    pub fn set_seen(&self, keys: usize, bytes: usize) {
        self.seen_keys.set(keys as i64);
        self.seen_bytes.set(bytes as i64);
    }
}

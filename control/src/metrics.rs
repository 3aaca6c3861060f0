//! Control-plane metrics, `hookline_control_<thing>_<unit>`, every label a closed set.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::endpoint::EndpointSet;

/// The registry's families.
#[derive(Clone)]
pub struct RegistryMetrics {
    endpoints: IntGaugeVec,
    records: IntCounterVec,
    writes: IntCounterVec,
    transactions: IntCounterVec,
    transaction_records: Histogram,
    write_steps: HistogramVec,
}

/// Steps of `hookline_control_registry_write_seconds{step}`: per write, `join` (waiting for the
/// writer, i.e. for the transaction before it to commit), `transaction` (joined until its
/// transaction ended), `read_back` (until this process's registry read it); per transaction,
/// `acks` (its records acknowledged) and `commit` (`commit_transaction`).
pub const WRITE_STEPS: &[&str] = &["join", "transaction", "read_back", "acks", "commit"];

/// Label values of `hookline_control_registry_writes_total{op}`.
pub const WRITE_OPS: &[&str] = &[
    "create",
    "update",
    "enable",
    "disable",
    "delete",
    "rotate_secret",
    "reencrypt",
    "auto_disable",
    "import",
];
const WRITE_RESULTS: &[&str] = &[
    "ok",
    "conflict",
    "not_found",
    "file_managed",
    "invalid",
    "error",
];
const RECORD_RESULTS: &[&str] = &["applied", "tombstone", "unreadable"];
const STATES: &[&str] = &["enabled", "disabled", "unusable"];

impl RegistryMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let endpoints = IntGaugeVec::new(
            Opts::new(
                "hookline_control_endpoints",
                "Endpoints in this process's registry by state (unusable: a secret cannot be opened)",
            ),
            &["state"],
        )?;
        let records = IntCounterVec::new(
            Opts::new(
                "hookline_control_registry_records_total",
                "Records of <p>.endpoints read by this process, by result",
            ),
            &["result"],
        )?;
        let writes = IntCounterVec::new(
            Opts::new(
                "hookline_control_registry_writes_total",
                "Registry operations of this process by operation and result",
            ),
            &["op", "result"],
        )?;
        let transactions = IntCounterVec::new(
            Opts::new(
                "hookline_control_registry_transactions_total",
                "Transactions of this process's registry writer by result (one carries every write waiting when it began)",
            ),
            &["result"],
        )?;
        let transaction_records = Histogram::with_opts(
            HistogramOpts::new(
                "hookline_control_registry_transaction_records",
                "Endpoint records per committed registry transaction",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0,
            ]),
        )?;
        registry.register(Box::new(endpoints.clone()))?;
        registry.register(Box::new(records.clone()))?;
        registry.register(Box::new(writes.clone()))?;
        let write_steps = HistogramVec::new(
            HistogramOpts::new(
                "hookline_control_registry_write_seconds",
                "Where a registry write's time goes, by step (join, transaction, read_back per write; acks, commit per transaction)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
                1.0, 4.0,
            ]),
            &["step"],
        )?;
        registry.register(Box::new(write_steps.clone()))?;
        for s in WRITE_STEPS {
            write_steps.with_label_values(&[s]);
        }
        registry.register(Box::new(transactions.clone()))?;
        registry.register(Box::new(transaction_records.clone()))?;
        for r in ["committed", "aborted"] {
            transactions.with_label_values(&[r]);
        }
        for s in STATES {
            endpoints.with_label_values(&[s]);
        }
        for r in RECORD_RESULTS {
            records.with_label_values(&[r]);
        }
        for op in WRITE_OPS {
            for r in WRITE_RESULTS {
                writes.with_label_values(&[op, r]);
            }
        }
        Ok(RegistryMetrics {
            endpoints,
            records,
            writes,
            transactions,
            transaction_records,
            write_steps,
        })
    }

    pub(crate) fn record(&self, result: &'static str) {
        self.records.with_label_values(&[result]).inc();
    }

    pub(crate) fn write(&self, op: &'static str, result: &'static str) {
        self.writes.with_label_values(&[op, result]).inc();
    }

    /// One step of a write took `d` (a [`WRITE_STEPS`] name).
    pub(crate) fn write_step(&self, step: &str, d: std::time::Duration) {
        self.write_steps
            .with_label_values(&[step])
            .observe(d.as_secs_f64());
    }

    /// A registry transaction ended: `Some(records)` committed, `None` aborted.
    pub(crate) fn transaction(&self, committed: Option<usize>) {
        match committed {
            Some(n) => {
                self.transactions.with_label_values(&["committed"]).inc();
                self.transaction_records.observe(n as f64);
            }
            None => self.transactions.with_label_values(&["aborted"]).inc(),
        }
    }

    pub(crate) fn set_endpoints(&self, set: &EndpointSet) {
        let (mut on, mut off, mut bad) = (0, 0, 0);
        for e in set.iter() {
            match crate::set::State::of(e) {
                crate::set::State::Unusable => bad += 1,
                crate::set::State::Enabled => on += 1,
                crate::set::State::Disabled => off += 1,
            }
        }
        self.endpoints.with_label_values(&["enabled"]).set(on);
        self.endpoints.with_label_values(&["disabled"]).set(off);
        self.endpoints.with_label_values(&["unusable"]).set(bad);
    }
}

/// The delivery log writer's families.
#[derive(Clone)]
pub struct AttemptLogMetrics {
    pub(crate) records: IntCounterVec,
}

impl AttemptLogMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let records = IntCounterVec::new(
            Opts::new(
                "hookline_control_attempt_log_records_total",
                "Attempt records of the delivery log: written (acknowledged), dropped (buffer \
                 full or closed: never stalls a delivery), failed (Kafka refused them)",
            ),
            &["result"],
        )?;
        registry.register(Box::new(records.clone()))?;
        for r in ["written", "dropped", "failed"] {
            records.with_label_values(&[r]);
        }
        Ok(AttemptLogMetrics { records })
    }
}

/// The health tracker's families.
#[derive(Clone)]
pub struct HealthMetrics {
    pub(crate) auto_disabled: IntCounter,
    /// Failing / recovered marks this process wrote, by kind.
    marks: IntCounterVec,
}

impl HealthMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let auto_disabled = IntCounter::new(
            "hookline_control_endpoints_auto_disabled_total",
            "Endpoints this process disabled automatically after uninterrupted failure",
        )?;
        registry.register(Box::new(auto_disabled.clone()))?;
        let marks = IntCounterVec::new(
            Opts::new(
                "hookline_control_endpoint_health_marks_total",
                "Endpoints this process marked failing or recovered (kind = endpoint.failing, endpoint.recovered)",
            ),
            &["kind"],
        )?;
        registry.register(Box::new(marks.clone()))?;
        for k in [crate::operational::FAILING, crate::operational::RECOVERED] {
            marks.with_label_values(&[k]);
        }
        Ok(HealthMetrics {
            auto_disabled,
            marks,
        })
    }

    pub(crate) fn marked(&self, kind: &str) {
        self.marks.with_label_values(&[kind]).inc();
    }
}

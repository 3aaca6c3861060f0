//! The delivery log: one small JSON record per attempt on `<p>.attempts` (delete policy,
//! `control.attempts_retention`, default 7 d), keyed by event id and written to the partition
//! [`partition_of`] picks from that key, so `hookline trace` reads exactly one partition.
//!
//! [`AttemptLog::record`] never blocks a delivery: it puts the attempt into a bounded channel
//! (`control.attempt_log_buffer`); when the channel is full the attempt is dropped and counted
//! (`hookline_control_attempt_log_records_total{result="dropped"}`). A writer task drains the
//! channel in batches into a librdkafka producer that batches again (`linger.ms` 50, lz4);
//! acknowledgements and failures are counted from the delivery callback. [`AttemptLog::close`]
//! flushes what is buffered (bounded).

use std::time::Duration;

use anyhow::Context as _;
use rdkafka::client::ClientContext;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use hookline_common::config::Config;
use hookline_common::contract::keyhash::{key_hash, partition_for};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::{producer_config, require_topics, TOPICS_WAIT};

use crate::metrics::AttemptLogMetrics;

/// Longest [`AttemptLog::close`] waits for buffered records to be acknowledged.
const FLUSH_WAIT: Duration = Duration::from_secs(10);
/// Longest `error` kept in a record.
pub const MAX_ERROR: usize = 256;

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// A 2xx.
    Delivered,
    Failed,
}

/// One attempt of one (event, endpoint) delivery: the value of a `<p>.attempts` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub event_id: String,
    pub endpoint_id: String,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub event_type: Option<String>,
    /// Attempt number, 1-based (`webhook-attempt`).
    pub attempt: u32,
    /// Who made it: `dispatcher`, `retry.<tier>` (e.g. `retry.5m`), `replay`.
    pub stage: String,
    pub outcome: Outcome,
    /// HTTP status, when a response arrived.
    #[serde(default)]
    pub status: Option<u16>,
    /// `ok`, or the failure class (`http_status`, `timeout`, `connect`, `tls`, `io`, `blocked`, …).
    pub class: String,
    /// Start of the error or response text (at most [`MAX_ERROR`] bytes).
    #[serde(default)]
    pub error: Option<String>,
    pub duration_ms: u64,
    /// Unix ms when it started.
    pub at_ms: i64,
    /// Where the delivery went next: a tier (`retry.5m`), `dlq`, or nothing (delivered).
    #[serde(default)]
    pub next: Option<String>,
    /// The process that made it (`kafka.instance_id` or the host name).
    pub instance: String,
    /// How long the endpoint's rate limit held the delivery back before this attempt: set on
    /// throttled attempts only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waited_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Attempt {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| unreachable!("plain data serializes"))
    }
}

/// Cuts `text` to at most [`MAX_ERROR`] bytes on a character boundary.
pub fn bounded_error(text: &str) -> String {
    let mut end = text.len().min(MAX_ERROR);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The `<p>.attempts` partition of an event's attempts.
pub fn partition_of(event_id: &str, partitions: i32) -> i32 {
    partition_for(key_hash(event_id), partitions)
}

struct LogContext {
    metrics: AttemptLogMetrics,
}

impl ClientContext for LogContext {}

impl ProducerContext for LogContext {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.metrics.records.with_label_values(&["written"]).inc(),
            Err((e, _)) => {
                let failed = self.metrics.records.with_label_values(&["failed"]);
                if failed.get().is_multiple_of(1000) {
                    tracing::warn!(error = %e, "delivery log record not written (logged once per 1000)");
                }
                failed.inc();
            }
        }
    }
}

/// The delivery log's writer of one process.
pub struct AttemptLog {
    tx: mpsc::Sender<Attempt>,
    metrics: AttemptLogMetrics,
    task: tokio::task::JoinHandle<()>,
    instance: String,
}

impl AttemptLog {
    /// Checks `<p>.attempts` exists and starts the writer task.
    pub async fn start(config: &Config, registry: &prometheus::Registry) -> anyhow::Result<Self> {
        let topic = Topics::new(&config.topics.prefix).attempts();
        let partitions = *require_topics(config, vec![topic.clone()], TOPICS_WAIT)
            .await?
            .get(&topic)
            .context("the delivery log topic has no partitions")?;
        let metrics = AttemptLogMetrics::register(registry)?;
        let producer: ThreadedProducer<LogContext> = producer_config(config)
            .set("linger.ms", "50")
            .set("compression.type", "lz4")
            .create_with_context(LogContext {
                metrics: metrics.clone(),
            })
            .context("creating the delivery log producer")?;
        let (tx, rx) = mpsc::channel(config.control.attempt_log_buffer);
        let task = tokio::spawn(write_loop(rx, producer, topic, partitions, metrics.clone()));
        Ok(AttemptLog {
            tx,
            metrics,
            task,
            instance: crate::operational::instance_name(config),
        })
    }

    /// This process's name, for [`Attempt::instance`].
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Hands an attempt to the writer; never waits. Dropped (and counted) when the buffer is
    /// full or the log is closed.
    pub fn record(&self, attempt: Attempt) {
        if self.tx.try_send(attempt).is_err() {
            self.metrics.records.with_label_values(&["dropped"]).inc();
        }
    }

    /// Stops taking records and waits (bounded) until the buffered ones are acknowledged.
    pub async fn close(self) {
        drop(self.tx);
        if tokio::time::timeout(FLUSH_WAIT * 2, self.task)
            .await
            .is_err()
        {
            tracing::warn!("the delivery log did not flush in time; buffered attempts may be lost");
        }
    }
}

async fn write_loop(
    mut rx: mpsc::Receiver<Attempt>,
    producer: ThreadedProducer<LogContext>,
    topic: String,
    partitions: i32,
    metrics: AttemptLogMetrics,
) {
    let mut batch = Vec::with_capacity(512);
    while rx.recv_many(&mut batch, 512).await > 0 {
        for a in batch.drain(..) {
            let value = a.to_bytes();
            let record = BaseRecord::to(&topic)
                .key(a.event_id.as_bytes())
                .payload(&value)
                .partition(partition_of(&a.event_id, partitions));
            // Never wait for room: a full producer queue drops, like a full channel.
            if producer.send(record).is_err() {
                metrics.records.with_label_values(&["dropped"]).inc();
            }
        }
    }
    // Closed: flush on a plain thread, bounded (an unreachable cluster must not hang a stop).
    hookline_common::kafka::closing::close("delivery log producer", move || {
        if let Err(e) = producer.flush(FLUSH_WAIT) {
            tracing::warn!(error = %e, "delivery log flush incomplete");
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_small_json_and_errors_bounded() {
        let a = Attempt {
            event_id: "evt_1".into(),
            endpoint_id: "crm".into(),
            tenant: Some("acme".into()),
            event_type: Some("order.paid".into()),
            attempt: 2,
            stage: "retry.1m".into(),
            outcome: Outcome::Failed,
            status: Some(503),
            class: "http_status".into(),
            error: Some(bounded_error(&"é".repeat(300))),
            duration_ms: 12,
            at_ms: 1_000,
            next: Some("retry.5m".into()),
            instance: "pod-1".into(),
            waited_ms: 0,
        };
        assert!(a.error.as_ref().is_some_and(|e| e.len() <= MAX_ERROR));
        let v: serde_json::Value = serde_json::from_slice(&a.to_bytes()).expect("json");
        assert_eq!(v["outcome"], "failed");
        assert_eq!(v["stage"], "retry.1m");
        let back: Attempt = serde_json::from_value(v).expect("back");
        assert_eq!(back, a);
        assert_eq!(partition_of("evt_1", 6), partition_of("evt_1", 6));
    }
}

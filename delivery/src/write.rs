//! Writing a delivery record to its next hop so that a record that can never be written there
//! never stops a stage. One path for the dispatcher (attempt 1), the tiers (attempts 2..) and
//! replay.
//!
//! Stage A admits an event only if it fits every hop with room for a full history, so a hop is
//! normally written as planned. When it is not (a topic's `max.message.bytes` lowered after the
//! event was admitted, or Kafka refuses the record as too large), in this order:
//! 1. the attempt history is trimmed (oldest attempts after the first, then snippets) until the
//!    record fits its topic;
//! 2. still too large for a tier: the delivery is dead-lettered whole on `<p>.dlq` with reason
//!    `record_too_large` (visible in `dead list`, replayable once the limit is fixed);
//! 3. too large for the DLQ too (or refused as invalid): quarantined on `<p>.invalid` as
//!    `record_too_large` with bounded prefixes, the delivery headers and the original sizes;
//! 4. refused even so: logged and counted as dropped (`…_handoffs_total{target="dropped"}`).
//!
//! Transient produce errors are retried (see `hookline_common::kafka::produce`); only a fatal one is an
//! error, and shutdown during a retry abandons the write (the input offset is not stored).
//!
//! An unreadable record ([`HopWriter::park`], a tier record without delivery metadata) is parked
//! on `<p>.invalid` whole, or as a bounded `record_too_large` quarantine record when it does not
//! fit there.
//!
//! Every write, fallbacks and retries included, goes through the caller's [`WriteGate`]: the
//! ownership claim of the partition the work came from (dispatcher, tiers), so work of a revoked
//! partition never writes ([`HopError::Revoked`]), or [`Ungated`](hookline_common::kafka::produce::Ungated)
//! for replay.

use std::sync::Arc;

use rdkafka::message::Headers;
use rdkafka::producer::FutureProducer;

use hookline_common::contract::delivery::{DeadReason, DeliveryMeta};
use hookline_common::contract::quarantine::{self, Source};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::{
    self, Acked, OwnedRecord, ProduceErrors, SendError, WriteGate,
};
use hookline_common::kafka::recordsize::Limits;
use hookline_common::runtime::shutdown::Shutdown;

use crate::hop;

/// Times a record refused as too large, but within its topic's limit on its own, is sent again.
const BATCH_RETRIES: u32 = 3;

/// Where a delivery record ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// On the planned topic (a tier or the DLQ).
    AsPlanned,
    /// Too large for its tier: dead-lettered whole with reason `record_too_large`.
    DeadTooLarge,
    /// Too large for the DLQ too: quarantined on `<p>.invalid` as `record_too_large`.
    Quarantined,
    /// Refused even as a bounded quarantine record: logged and counted, nothing written.
    Dropped,
}

/// Why a hop was not written.
#[derive(Debug, thiserror::Error)]
pub enum HopError {
    /// The producer can write nothing any more: the stage stops.
    #[error("fatal produce error on {topic}: {error}")]
    Fatal {
        topic: String,
        error: rdkafka::error::KafkaError,
    },
    /// Shutdown came while a transient error was being retried: nothing written, the input
    /// record must be processed again by the next run (its offset is not stored).
    #[error("write to {0} abandoned at shutdown")]
    Abandoned(String),
    /// The partition the work came from was revoked: nothing written, the new owner handles the
    /// input record (its offset is not stored).
    #[error("write to {0} not made: the partition was revoked")]
    Revoked(String),
}

/// Writes delivery records; shared by every task of a stage.
#[derive(Clone)]
pub struct HopWriter {
    pub producer: FutureProducer,
    pub limits: Arc<Limits>,
    pub topics: Topics,
    pub errors: ProduceErrors,
    pub shutdown: Shutdown,
    /// Partitions of `<p>.throttle` (`topics.partitions`): a rate-limited endpoint's deliveries
    /// all go to its one partition there.
    pub throttle_partitions: i32,
}

impl HopWriter {
    /// A writer for a stage: reads the size limits of every topic a delivery record may be
    /// written to (see [`HopWriter::topics_written`]) from the broker.
    pub async fn connect(
        config: &hookline_common::config::Config,
        producer: FutureProducer,
        errors: ProduceErrors,
        shutdown: Shutdown,
    ) -> anyhow::Result<HopWriter> {
        use anyhow::Context as _;
        let topics = Topics::new(&config.topics.prefix);
        let written = HopWriter::topics_written(&topics, &config.retry.schedule);
        let limits = Limits::fetch(config, written)
            .await
            .context("reading topic size limits")?;
        Ok(HopWriter {
            producer,
            limits: Arc::new(limits),
            topics,
            errors,
            shutdown,
            throttle_partitions: config.topics.partitions,
        })
    }

    /// Every topic a delivery record may be written to (tiers, DLQ, invalid), for [`Limits`].
    pub fn topics_written(topics: &Topics, schedule: &[std::time::Duration]) -> Vec<String> {
        let mut out: Vec<String> = schedule.iter().skip(1).map(|o| topics.retry(*o)).collect();
        out.push(topics.throttle());
        out.push(topics.dlq());
        out.push(topics.invalid());
        out
    }

    /// Writes the delivery `meta` (key, value: the event) to `topic` and waits for the
    /// acknowledgement, falling back as the module documents. `meta` is updated to what was
    /// written (trimmed history, dead reason).
    #[allow(clippy::too_many_arguments)]
    pub async fn write(
        &self,
        gate: &dyn WriteGate,
        topic: &str,
        meta: &mut DeliveryMeta,
        key: Option<&[u8]>,
        value: &[u8],
        dedupe_key: Option<&str>,
        source: Source<'_>,
    ) -> Result<Written, HopError> {
        let dlq = self.topics.dlq();
        let mut target = topic.to_string();
        let mut written = Written::AsPlanned;
        let mut batch_retries = 0;
        let refused = loop {
            let record = self.fitted(&target, meta, key, value, dedupe_key);
            let limit = self.limits.limit(&target);
            let problem = if record.size() <= limit {
                match self.send(gate, &record).await? {
                    Ok(acked) => {
                        // Where each hop landed: with `hookline_delivery::write=debug` a delivery
                        // can be followed record by record (the fault suite logs it).
                        tracing::debug!(
                            endpoint = %meta.endpoint_id,
                            event = %meta.event_id,
                            attempt = meta.attempt,
                            topic = %target,
                            partition = acked.partition,
                            offset = acked.offset,
                            "delivery record acknowledged"
                        );
                        return Ok(written);
                    }
                    Err((error, true)) => {
                        self.limits.refresh().await;
                        // Still fits alone: its batch was too large (a topic limit below the
                        // producer's batch size). Send it again; batching differs next time.
                        if record.size() <= self.limits.limit(&target)
                            && batch_retries < BATCH_RETRIES
                        {
                            batch_retries += 1;
                            continue;
                        }
                        format!("kafka refused the record for {target} as too large: {error}")
                    }
                    // Refused for another reason (invalid record): a dead letter would be too.
                    Err((error, false)) => break format!("kafka refused the record: {error}"),
                }
            } else {
                format!(
                    "the delivery record is {} bytes, the limit of {target} is {limit}",
                    record.size()
                )
            };
            if target == dlq {
                break problem;
            }
            tracing::warn!(
                endpoint = %meta.endpoint_id,
                event = %meta.event_id,
                topic = %target,
                problem = %problem,
                "delivery record does not fit its tier; dead-lettering it"
            );
            hop::mark_dead(meta, DeadReason::RecordTooLarge);
            target = dlq.clone();
            written = Written::DeadTooLarge;
        };

        let invalid = self.topics.invalid();
        let headers: Vec<(String, Option<Vec<u8>>)> = meta
            .kafka_headers(dedupe_key)
            .iter()
            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
            .collect();
        let record = quarantine::too_large(
            &invalid,
            key,
            Some(value),
            &headers,
            &refused,
            source,
            self.limits.limit(&invalid),
        );
        match self.send(gate, &record).await? {
            Ok(_) => {
                tracing::error!(
                    endpoint = %meta.endpoint_id,
                    event = %meta.event_id,
                    problem = %refused,
                    "delivery record fits no topic; quarantined as record_too_large"
                );
                Ok(Written::Quarantined)
            }
            Err((error, _)) => {
                tracing::error!(
                    endpoint = %meta.endpoint_id,
                    event = %meta.event_id,
                    problem = %refused,
                    error = %error,
                    "delivery record refused even as a bounded quarantine record; dropped"
                );
                Ok(Written::Dropped)
            }
        }
    }

    /// Parks a record that cannot be a delivery record (`record`: its own key, value and
    /// headers plus the quarantine headers, addressed to `<p>.invalid`) whole or, if it does not
    /// fit there, as a bounded `record_too_large` quarantine record; refused even so, it is
    /// logged and dropped.
    pub async fn park(
        &self,
        gate: &dyn WriteGate,
        record: OwnedRecord,
        problem: &str,
        source: Source<'_>,
    ) -> Result<(), HopError> {
        let limit = self.limits.limit(&record.topic);
        let bounded = |detail: &str| {
            quarantine::too_large(
                &record.topic,
                record.key.as_deref(),
                record.value.as_deref(),
                &record.header_pairs(),
                detail,
                source,
                limit,
            )
        };
        let mut current = if record.size() <= limit {
            record.clone()
        } else {
            bounded(problem)
        };
        loop {
            match self.send(gate, &current).await? {
                Ok(_) => return Ok(()),
                Err((error, _)) if current.size() == record.size() => {
                    current = bounded(&format!("{problem}; kafka refused it whole: {error}"));
                }
                Err((error, _)) => {
                    tracing::error!(
                        partition = source.partition,
                        offset = source.offset,
                        error = %error,
                        "unreadable record refused even as a bounded quarantine record; dropped"
                    );
                    return Ok(());
                }
            }
        }
    }

    /// The record for `target`, its history trimmed (if need be) so that it fits.
    fn fitted(
        &self,
        target: &str,
        meta: &mut DeliveryMeta,
        key: Option<&[u8]>,
        value: &[u8],
        dedupe_key: Option<&str>,
    ) -> OwnedRecord {
        let partition = (target == self.topics.throttle()).then(|| {
            hookline_common::contract::topics::throttle_partition(
                &meta.endpoint_id,
                self.throttle_partitions,
            )
        });
        let build = |meta: &DeliveryMeta| OwnedRecord {
            topic: target.to_string(),
            partition,
            key: key.map(<[u8]>::to_vec),
            value: Some(value.to_vec()),
            headers: meta.kafka_headers(dedupe_key),
        };
        let record = build(meta);
        let limit = self.limits.limit(target);
        if record.size() <= limit {
            return record;
        }
        let over = record.size() - limit;
        let before = meta.history.len();
        meta.shrink_history(meta.history_bytes().saturating_sub(over));
        tracing::warn!(
            endpoint = %meta.endpoint_id,
            event = %meta.event_id,
            topic = target,
            attempts_kept = meta.history.len(),
            attempts_before = before,
            "attempt history trimmed so the delivery record fits its topic"
        );
        build(meta)
    }

    /// `Ok(Ok(acked))`: acknowledged at `acked`; `Ok(Err((error, is_size)))`: refused for good.
    async fn send(
        &self,
        gate: &dyn WriteGate,
        record: &OwnedRecord,
    ) -> Result<Result<Acked, (rdkafka::error::KafkaError, bool)>, HopError> {
        let sent =
            produce::send_acked_through(&self.producer, record, &self.errors, &self.shutdown, gate)
                .await;
        match sent {
            Ok(acked) => Ok(Ok(acked)),
            Err(SendError::Permanent { error, size }) => Ok(Err((error, size))),
            Err(SendError::Fatal(error)) => Err(HopError::Fatal {
                topic: record.topic.clone(),
                error,
            }),
            Err(SendError::Stopped) => Err(HopError::Abandoned(record.topic.clone())),
            Err(SendError::Revoked) => Err(HopError::Revoked(record.topic.clone())),
        }
    }
}

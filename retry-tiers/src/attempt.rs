//! What a tier worker does with one due record: attempt it with the current endpoint config and,
//! on failure, hand it to its next hop (next tier or `<p>.dlq`), the produce acknowledged before
//! the record counts as done.
//!
//! - endpoint removed from the config → `<p>.dlq` with reason `endpoint_removed`, no attempt;
//! - endpoint disabled → `<p>.dlq` with reason `endpoint_disabled`, no attempt;
//! - endpoint no longer subscribed to the event's tenant and type (the dispatcher's fan-out
//!   rule, asked again at every attempt) → `<p>.dlq` with reason `endpoint_unsubscribed`, no
//!   attempt: its URL and secret may now belong to someone else;
//! - waiting for an attempt the current schedule does not have (it was shortened) →
//!   `<p>.dlq` with reason `exhausted`, no attempt;
//! - a record whose delivery headers cannot be read → parked on `<p>.invalid` with the reason
//!   `bad_delivery_record` and the source position (never dropped silently, never retried
//!   forever). It has no endpoint or attempt number, so it cannot be a dead letter;
//! - endpoint saturated (its concurrency slots busy with slow requests) and a later slot left in
//!   the schedule → not attempted: deferred to the next slot's tier, attempt number unchanged
//!   ([`handoff::defer`]); on the last slot the attempt waits for a concurrency slot.
//!
//! Every write (next tier, dead letter, quarantine) is enqueued through the partition's
//! ownership gate ([`Gate`]): once the partition is revoked, its work writes nothing, so a
//! rebalance never forks a retry chain.

use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio::sync::watch;

use hookline_common::config::Config;
use hookline_common::delivery::{DeadReason, DeliveryMeta};
use hookline_common::headers as h;
use hookline_common::ownership::Ownership;
use hookline_common::topics::Topics;
use hookline_dispatcher::engine::Admission;
use hookline_dispatcher::fanout::{self, Endpoints};
use hookline_dispatcher::handoff::{self, Hop};
use hookline_dispatcher::Engine;

use crate::metrics::TierMetrics;
use crate::tier::Completion;

/// `hookline-invalid-reason` of a tier record whose delivery metadata cannot be read.
pub const BAD_DELIVERY_RECORD: &str = "bad_delivery_record";

/// What every tier of the process shares.
pub(crate) struct Stage {
    pub(crate) config: Arc<Config>,
    pub(crate) topics: Topics,
    pub(crate) engine: Engine,
    /// The endpoints as configured now: retries use the current URL, secrets and timeout.
    pub(crate) endpoints: Endpoints,
    pub(crate) producer: FutureProducer,
}

/// A tier record, decoded when it is received and kept until it is due.
#[derive(Debug)]
pub(crate) struct Pending {
    key: Option<Vec<u8>>,
    value: Option<Bytes>,
    dedupe_key: Option<String>,
    /// The delivery metadata, or why it cannot be read.
    meta: Result<DeliveryMeta, String>,
    /// The record's own headers, kept only when the metadata cannot be read (to park it as is).
    raw_headers: Option<OwnedHeaders>,
}

impl Pending {
    /// Decodes a record; returns it with its due time (a malformed record is due at once).
    pub(crate) fn from_message<M: Message>(m: &M) -> (i64, Pending) {
        let meta =
            DeliveryMeta::from_headers(|name| header_str(m, name)).map_err(|e| e.to_string());
        let meta = match (meta, m.payload()) {
            (Ok(_), None) => Err("the record has no value (the event bytes)".to_string()),
            (meta, _) => meta,
        };
        let due_ms = meta.as_ref().map_or(0, |m| m.due_ms);
        let raw_headers = match (&meta, m.headers()) {
            (Err(_), Some(hs)) => Some(hs.iter().fold(OwnedHeaders::new(), |out, hd| {
                out.insert(Header {
                    key: hd.key,
                    value: hd.value,
                })
            })),
            _ => None,
        };
        let pending = Pending {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(Bytes::copy_from_slice),
            dedupe_key: header_str(m, h::DEDUPE_KEY).map(str::to_string),
            meta,
            raw_headers,
        };
        (due_ms, pending)
    }

    /// The due time written in the record, if its metadata is readable.
    pub(crate) fn recorded_due(&self) -> Option<i64> {
        self.meta.as_ref().ok().map(|m| m.due_ms)
    }

    /// The attempt the record waits for, if its metadata is readable.
    pub(crate) fn attempt(&self) -> Option<u32> {
        self.meta.as_ref().ok().map(|m| m.attempt)
    }
}

/// The UTF-8 value of the first header named `name`.
pub(crate) fn header_str<'a, M: Message>(m: &'a M, name: &str) -> Option<&'a str> {
    m.headers()?
        .iter()
        .find(|hd| hd.key == name)
        .and_then(|hd| hd.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// Where the record was read, for logs and the invalid topic's headers.
pub(crate) struct Source<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

/// The ownership gate of the record's partition, in the generation the record was read in.
pub(crate) struct Gate<'a> {
    pub(crate) ownership: &'a Ownership<Completion>,
    pub(crate) generation: u64,
}

/// How a record's handling ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    /// Delivered, or its next record acknowledged: the offset may be stored.
    Done,
    /// Its partition was revoked before it could write: nothing written, offset not stored (the
    /// new owner handles the record).
    Revoked,
}

/// Handles one due record to completion. An error means Kafka refused a write after its own
/// retries: the record's offset must not be stored, and the stage stops. `cutoff` turns true when
/// the shutdown grace is over: an attempt still running is cut short, recorded as a `timeout`,
/// and handed off like any failure.
pub(crate) async fn process(
    stage: &Stage,
    metrics: &TierMetrics,
    source: Source<'_>,
    gate: Gate<'_>,
    pending: Pending,
    cutoff: watch::Receiver<bool>,
) -> anyhow::Result<Finished> {
    let write = |topic: String, key: Option<Vec<u8>>, value: Option<Bytes>, headers| {
        produce_gated(
            &gate,
            source.partition,
            &stage.producer,
            topic,
            key,
            value,
            headers,
        )
    };
    let (mut meta, value) = match (pending.meta, pending.value) {
        (Ok(meta), Some(value)) => (meta, value),
        (meta, value) => {
            let problem = meta
                .err()
                .unwrap_or_else(|| "the record has no value (the event bytes)".to_string());
            metrics.emit_invalid(source.partition, source.offset, &problem);
            let headers = invalid_headers(pending.raw_headers.as_ref(), &problem, &source);
            return write(stage.topics.invalid(), pending.key, value, headers).await;
        }
    };
    let dedupe_key = pending.dedupe_key.as_deref();
    let key = pending.key;

    let endpoint = match stage.endpoints.get(&meta.endpoint_id) {
        Some(ep) if ep.enabled => ep,
        found => {
            let reason = if found.is_none() {
                DeadReason::EndpointRemoved
            } else {
                DeadReason::EndpointDisabled
            };
            return dead_letter(
                stage,
                metrics,
                &gate,
                source.partition,
                &mut meta,
                reason,
                key,
                value,
                dedupe_key,
            )
            .await;
        }
    };
    if !fanout::subscribes(&endpoint, meta.tenant.as_deref(), &meta.event_type) {
        let reason = DeadReason::EndpointUnsubscribed;
        return dead_letter(
            stage,
            metrics,
            &gate,
            source.partition,
            &mut meta,
            reason,
            key,
            value,
            dedupe_key,
        )
        .await;
    }
    if !handoff::has_slot(&meta, &stage.config.retry.schedule) {
        // Written under a longer schedule: the current one allows no further attempt.
        let reason = DeadReason::Exhausted;
        return dead_letter(
            stage,
            metrics,
            &gate,
            source.partition,
            &mut meta,
            reason,
            key,
            value,
            dedupe_key,
        )
        .await;
    }

    let attempt = meta.attempt;
    let schedule = &stage.config.retry.schedule;
    let body = value.clone();
    let admission = if handoff::can_defer(&meta, schedule) {
        stage
            .engine
            .deliver_unless_saturated(&endpoint, &meta.event_id, body, attempt, cutoff)
            .await
    } else {
        // The last slot: nothing to defer to, the attempt waits for a concurrency slot.
        let outcome = stage
            .engine
            .deliver_or_cut(&endpoint, &meta.event_id, body, attempt, cutoff)
            .await;
        Admission::Attempted(outcome)
    };
    let outcome = match admission {
        Admission::Attempted(outcome) => outcome,
        Admission::Saturated { busy } => {
            let hop = handoff::defer(&mut meta, busy, &stage.topics, schedule);
            let (Hop::Retry { topic, .. } | Hop::Dead { topic }) = hop;
            let headers = handoff::headers(&meta, dedupe_key);
            let finished = write(topic.clone(), key, Some(value), headers).await?;
            if finished == Finished::Done {
                metrics.emit_deferred(&meta, &topic);
            }
            return Ok(finished);
        }
    };
    metrics.emit_attempt(&meta, &outcome);
    if outcome.result.is_delivered() {
        metrics.emit_delivered(&meta, attempt);
        return Ok(Finished::Done);
    }
    let hop = handoff::after_failure(&mut meta, &outcome, &stage.topics, schedule);
    let headers = handoff::headers(&meta, dedupe_key);
    let (Hop::Retry { topic, .. } | Hop::Dead { topic }) = hop.clone();
    let finished = write(topic.clone(), key, Some(value), headers).await?;
    if finished == Finished::Done {
        match hop {
            Hop::Retry { .. } => metrics.emit_next_tier(&meta, &topic),
            Hop::Dead { .. } => metrics.emit_dead(&meta, DeadReason::Exhausted),
        }
    }
    Ok(finished)
}

/// Writes one record through the ownership gate of the partition it came from and waits for
/// Kafka's acknowledgement. [`Finished::Revoked`]: the partition was revoked, nothing written.
// `send_result` hands the record back in its error (to enqueue it again when the queue is full):
// a large `Err` by rdkafka's design.
#[allow(clippy::result_large_err)]
async fn produce_gated(
    gate: &Gate<'_>,
    partition: i32,
    producer: &FutureProducer,
    topic: String,
    key: Option<Vec<u8>>,
    value: Option<Bytes>,
    headers: OwnedHeaders,
) -> anyhow::Result<Finished> {
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic).headers(headers);
    if let Some(k) = &key {
        record = record.key(&k[..]);
    }
    if let Some(v) = &value {
        record = record.payload(&v[..]);
    }
    let (ownership, generation) = (gate.ownership, gate.generation);
    // The ownership check and the enqueue under one lock (a revoke closes the gate under it);
    // the acknowledgement is awaited outside it.
    let delivery = loop {
        match ownership.enqueue(partition, generation, || producer.send_result(record)) {
            None => return Ok(Finished::Revoked),
            Some(Ok(delivery)) => break delivery,
            Some(Err((e, back))) => {
                ownership.acked(partition, generation);
                if !matches!(
                    e,
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull
                    )
                ) {
                    return Err(anyhow::Error::new(e))
                        .with_context(|| format!("kafka refused a write to {topic}"));
                }
                record = back;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    let acked = delivery.await;
    ownership.acked(partition, generation);
    match acked {
        Ok(Ok(_)) => Ok(Finished::Done),
        Ok(Err((e, _))) => {
            Err(anyhow::Error::new(e)).with_context(|| format!("kafka refused a write to {topic}"))
        }
        Err(_) => anyhow::bail!("kafka refused a write to {topic}: the producer dropped it"),
    }
}

/// Ends a delivery without an attempt: `<p>.dlq` with `reason`, written through the partition's
/// ownership gate and acknowledged before it counts.
#[allow(clippy::too_many_arguments)]
async fn dead_letter(
    stage: &Stage,
    metrics: &TierMetrics,
    gate: &Gate<'_>,
    partition: i32,
    meta: &mut DeliveryMeta,
    reason: DeadReason,
    key: Option<Vec<u8>>,
    value: Bytes,
    dedupe_key: Option<&str>,
) -> anyhow::Result<Finished> {
    handoff::mark_dead(meta, reason);
    let headers = handoff::headers(meta, dedupe_key);
    let topic = stage.topics.dlq();
    let finished = produce_gated(
        gate,
        partition,
        &stage.producer,
        topic,
        key,
        Some(value),
        headers,
    )
    .await?;
    if finished == Finished::Done {
        metrics.emit_dead(meta, reason);
    }
    Ok(finished)
}

/// The parked record's headers: its own (minus any quarantine headers it carried) plus the
/// quarantine contract's reason, detail and source position.
fn invalid_headers(raw: Option<&OwnedHeaders>, problem: &str, source: &Source<'_>) -> OwnedHeaders {
    let ours = [
        h::INVALID_REASON,
        h::INVALID_DETAIL,
        h::SOURCE_TOPIC,
        h::SOURCE_PARTITION,
        h::SOURCE_OFFSET,
    ];
    let mut out = OwnedHeaders::new();
    if let Some(raw) = raw {
        for hd in raw.iter().filter(|hd| !ours.contains(&hd.key)) {
            out = out.insert(Header {
                key: hd.key,
                value: hd.value,
            });
        }
    }
    let partition = source.partition.to_string();
    let offset = source.offset.to_string();
    for (key, value) in [
        (h::INVALID_REASON, BAD_DELIVERY_RECORD),
        (h::INVALID_DETAIL, problem),
        (h::SOURCE_TOPIC, source.topic),
        (h::SOURCE_PARTITION, partition.as_str()),
        (h::SOURCE_OFFSET, offset.as_str()),
    ] {
        out = out.insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    }
    out
}

/// Produces one record and waits for Kafka's acknowledgement (after the producer's own retries).
pub(crate) async fn produce(
    producer: &FutureProducer,
    topic: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: OwnedHeaders,
) -> anyhow::Result<()> {
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
    if let Some(k) = key {
        record = record.key(k);
    }
    if let Some(v) = value {
        record = record.payload(v);
    }
    producer
        .send(record, Timeout::Never)
        .await
        .map(|_| ())
        .map_err(|(e, _)| anyhow::Error::new(e))
        .with_context(|| format!("kafka refused a write to {topic}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;

    fn message(headers: &[(&str, &str)], value: Option<&[u8]>) -> OwnedMessage {
        let mut hs = OwnedHeaders::new();
        for (k, v) in headers {
            hs = hs.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        OwnedMessage::new(
            value.map(<[u8]>::to_vec),
            Some(b"k".to_vec()),
            "p.retry.1m".into(),
            Timestamp::NotAvailable,
            0,
            7,
            Some(hs),
        )
    }

    fn meta() -> DeliveryMeta {
        DeliveryMeta {
            endpoint_id: "ep".into(),
            event_id: "evt".into(),
            event_type: "t".into(),
            tenant: None,
            attempt: 2,
            deferrals: 0,
            first_attempt_ms: 1_000,
            due_ms: 61_000,
            history: vec![],
            dead_reason: None,
            dead_at_ms: None,
            replay_key: None,
        }
    }

    #[test]
    fn decodes_a_delivery_record_with_its_due_time() {
        let hs: Vec<(&str, String)> = meta().to_headers();
        let mut pairs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pairs.push((h::DEDUPE_KEY, "dk"));
        let (due, p) = Pending::from_message(&message(&pairs, Some(b"{}")));
        assert_eq!(due, 61_000);
        assert_eq!(p.meta.as_ref().ok(), Some(&meta()));
        assert_eq!(p.dedupe_key.as_deref(), Some("dk"));
        assert!(p.raw_headers.is_none());
    }

    #[test]
    fn unreadable_metadata_is_due_at_once_and_keeps_its_headers() {
        let (due, p) = Pending::from_message(&message(&[("x-trace", "t")], Some(b"{}")));
        assert_eq!(due, 0);
        let problem = p.meta.expect_err("no metadata");
        assert!(problem.contains("hookline-attempt"), "{problem}");
        let headers = invalid_headers(
            p.raw_headers.as_ref(),
            &problem,
            &Source {
                topic: "p.retry.1m",
                partition: 0,
                offset: 7,
            },
        );
        let got: Vec<(String, String)> = headers
            .iter()
            .map(|hd| {
                (
                    hd.key.to_string(),
                    String::from_utf8_lossy(hd.value.unwrap_or_default()).into_owned(),
                )
            })
            .collect();
        assert_eq!(got[0], ("x-trace".into(), "t".into()));
        assert!(got.contains(&(h::INVALID_REASON.into(), BAD_DELIVERY_RECORD.into())));
        assert!(got.contains(&(h::SOURCE_OFFSET.into(), "7".into())));
    }

    #[test]
    fn a_record_without_value_is_unreadable() {
        let hs: Vec<(&str, String)> = meta().to_headers();
        let pairs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (due, p) = Pending::from_message(&message(&pairs, None));
        assert_eq!(due, 0);
        assert!(p.meta.is_err());
    }
}

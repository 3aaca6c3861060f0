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
//!   forever). It has no endpoint or attempt number, so it cannot be a dead letter.

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
use hookline_common::topics::Topics;
use hookline_dispatcher::fanout::{self, Endpoints};
use hookline_dispatcher::handoff::{self, Hop};
use hookline_dispatcher::Engine;

use crate::metrics::TierMetrics;

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

/// Handles one due record to completion. An error means Kafka refused a write after its own
/// retries: the record's offset must not be stored, and the stage stops. `cutoff` turns true when
/// the shutdown grace is over: an attempt still running is cut short, recorded as a `timeout`,
/// and handed off like any failure.
pub(crate) async fn process(
    stage: &Stage,
    metrics: &TierMetrics,
    source: Source<'_>,
    pending: Pending,
    cutoff: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (mut meta, value) = match (pending.meta, pending.value) {
        (Ok(meta), Some(value)) => (meta, value),
        (meta, value) => {
            let problem = meta
                .err()
                .unwrap_or_else(|| "the record has no value (the event bytes)".to_string());
            metrics.emit_invalid(source.partition, source.offset, &problem);
            let headers = invalid_headers(pending.raw_headers.as_ref(), &problem, &source);
            let topic = stage.topics.invalid();
            return produce(
                &stage.producer,
                &topic,
                pending.key.as_deref(),
                value.as_deref(),
                headers,
            )
            .await;
        }
    };
    let dedupe_key = pending.dedupe_key.as_deref();
    let key = pending.key.as_deref();

    let endpoint = match stage.endpoints.get(&meta.endpoint_id) {
        Some(ep) if ep.enabled => ep,
        found => {
            let reason = if found.is_none() {
                DeadReason::EndpointRemoved
            } else {
                DeadReason::EndpointDisabled
            };
            return dead_letter(stage, metrics, &mut meta, reason, key, &value, dedupe_key).await;
        }
    };
    if !fanout::subscribes(&endpoint, meta.tenant.as_deref(), &meta.event_type) {
        let reason = DeadReason::EndpointUnsubscribed;
        return dead_letter(stage, metrics, &mut meta, reason, key, &value, dedupe_key).await;
    }
    if meta.attempt as usize > stage.config.retry.schedule.len() {
        // Written under a longer schedule: the current one allows no further attempt.
        let reason = DeadReason::Exhausted;
        return dead_letter(stage, metrics, &mut meta, reason, key, &value, dedupe_key).await;
    }

    let attempt = meta.attempt;
    let outcome = stage
        .engine
        .deliver_or_cut(&endpoint, &meta.event_id, value.clone(), attempt, cutoff)
        .await;
    metrics.emit_attempt(&meta, &outcome);
    if outcome.result.is_delivered() {
        metrics.emit_delivered(&meta, attempt);
        return Ok(());
    }
    let hop = handoff::after_failure(
        &mut meta,
        &outcome,
        &stage.topics,
        &stage.config.retry.schedule,
    );
    let headers = handoff::headers(&meta, dedupe_key);
    match hop {
        Hop::Retry { topic, .. } => {
            produce(&stage.producer, &topic, key, Some(&value), headers).await?;
            metrics.emit_next_tier(&meta, &topic);
        }
        Hop::Dead { topic } => {
            produce(&stage.producer, &topic, key, Some(&value), headers).await?;
            metrics.emit_dead(&meta, DeadReason::Exhausted);
        }
    }
    Ok(())
}

/// Ends a delivery without an attempt: `<p>.dlq` with `reason`, acknowledged before it counts.
async fn dead_letter(
    stage: &Stage,
    metrics: &TierMetrics,
    meta: &mut DeliveryMeta,
    reason: DeadReason,
    key: Option<&[u8]>,
    value: &[u8],
    dedupe_key: Option<&str>,
) -> anyhow::Result<()> {
    handoff::mark_dead(meta, reason);
    let topic = stage.topics.dlq();
    let headers = handoff::headers(meta, dedupe_key);
    produce(&stage.producer, &topic, key, Some(value), headers).await?;
    metrics.emit_dead(meta, reason);
    Ok(())
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

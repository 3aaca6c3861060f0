//! What a tier worker does with one due record: decode it and hand it to the delivery path
//! ([`DeliveryPath::attempt`], shared with the dispatcher and replay), which attempts it with the
//! current endpoint config and, on failure, writes its next hop (next tier or `<p>.dlq`), the
//! produce acknowledged before the record counts as done.
//!
//! What the delivery path decides (see `hookline_delivery::attempt`): an endpoint removed,
//! disabled or no longer subscribed to the event → `<p>.dlq` with that reason, no attempt; an
//! attempt the current schedule no longer has → `<p>.dlq` as `exhausted`; a saturated endpoint
//! with a later slot left → deferred to the next slot's tier, attempt number unchanged.
//!
//! What is the tier's own: a record whose delivery headers cannot be read is parked on
//! `<p>.invalid` with the reason `bad_delivery_record` and the source position (never dropped
//! silently, never retried forever). It has no endpoint or attempt number, so it cannot be a
//! dead letter.
//!
//! Every write (next tier, dead letter, quarantine) is enqueued through the partition's
//! ownership gate ([`Gate`]): once the partition is revoked, its work writes nothing, so a
//! rebalance never forks a retry chain.

use std::sync::Arc;

use bytes::Bytes;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::FutureProducer;
use tokio::sync::watch;

use hookline_common::config::Config;
use hookline_common::contract::delivery::{DeadReason, DeliveryMeta};
use hookline_common::contract::quarantine::{Quarantine, Source};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::ownership::{Claim, Ownership};
use hookline_common::kafka::produce::{OwnedRecord, WriteGate};
use hookline_delivery::{Delivery, DeliveryPath, Hop, HopError, Next, Origin, Turn, Why, Written};

use crate::metrics::TierMetrics;
use crate::pacer::Pacer;
use crate::tier::Completion;

/// `hookline-invalid-reason` of a tier record whose delivery metadata cannot be read.
pub const BAD_DELIVERY_RECORD: &str = "bad_delivery_record";

/// What every tier of the process shares.
pub(crate) struct Stage {
    pub(crate) config: Arc<Config>,
    pub(crate) topics: Topics,
    /// Attempts, next hops and writes; retries use the current URL, secrets and timeout.
    pub(crate) path: DeliveryPath,
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
    raw_headers: Option<Vec<(String, Option<Vec<u8>>)>>,
}

impl Pending {
    /// Decodes a record; returns it with its due time (a malformed record is due at once).
    pub(crate) fn from_message<M: Message>(m: &M) -> (i64, Pending) {
        let meta = DeliveryMeta::from_message(m).map_err(|e| e.to_string());
        let meta = match (meta, m.payload()) {
            (Ok(_), None) => Err("the record has no value (the event bytes)".to_string()),
            (meta, _) => meta,
        };
        let due_ms = meta.as_ref().map_or(0, |m| m.due_ms);
        let raw_headers = match (&meta, m.headers()) {
            (Err(_), Some(hs)) => Some(
                hs.iter()
                    .map(|hd| (hd.key.to_string(), hd.value.map(<[u8]>::to_vec)))
                    .collect(),
            ),
            _ => None,
        };
        let pending = Pending {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(Bytes::copy_from_slice),
            dedupe_key: DeliveryMeta::dedupe_key_of(m),
            meta,
            raw_headers,
        };
        (due_ms, pending)
    }

    /// The due time written in the record, if its metadata is readable.
    pub(crate) fn recorded_due(&self) -> Option<i64> {
        self.meta.as_ref().ok().map(|m| m.due_ms)
    }

    /// The endpoint of the delivery, if its metadata is readable.
    pub(crate) fn endpoint_id(&self) -> Option<&str> {
        self.meta.as_ref().ok().map(|m| m.endpoint_id.as_str())
    }

    /// The attempt the record waits for, if its metadata is readable.
    pub(crate) fn attempt(&self) -> Option<u32> {
        self.meta.as_ref().ok().map(|m| m.attempt)
    }
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

/// Handles one due record to completion. An error means the record's offset must not be stored:
/// a fatal produce error (the stage stops) or a write abandoned at shutdown ([`HopError::Abandoned`],
/// the stage goes on stopping normally). A record that can never be written as planned is
/// rerouted (see `hookline_delivery::write`), never an error; every write goes through the
/// partition's ownership gate ([`Finished::Revoked`] once it is revoked). `cutoff` turns true when
/// the shutdown grace is over (or the partition is revoked): an attempt still running is cut
/// short, recorded as a `timeout`, and handed off like any failure.
pub(crate) async fn process(
    stage: &Stage,
    metrics: &TierMetrics,
    source: Source<'_>,
    gate: Gate<'_>,
    pending: Pending,
    cutoff: watch::Receiver<bool>,
    pacer: Option<(&Pacer, u64)>,
) -> Result<Finished, HopError> {
    let claim = Claim {
        ownership: gate.ownership,
        partition: source.partition,
        generation: gate.generation,
    };
    let result = handle(stage, metrics, &source, &claim, pending, cutoff, pacer).await;
    match result {
        Ok(()) => Ok(Finished::Done),
        Err(HopError::Revoked(_)) => Ok(Finished::Revoked),
        Err(e) => Err(e),
    }
}

/// The wait on a tier as a span (`hookline.retry`): from the hand-off (the end of the last
/// attempt) until now, when the tier takes it up; a child of the attempt that failed, parent of
/// the next one. Returns its context for that attempt.
fn tier_span(meta: &DeliveryMeta, topic: &str) -> Option<String> {
    use hookline_common::runtime::traces::{at_ms, Kind, Span};
    let handed_ms = meta.history.last().map(|a| a.at_ms + a.duration_ms as i64);
    let mut span = Span::start(
        "hookline.retry",
        Kind::Internal,
        meta.trace.as_deref(),
        handed_ms.map(at_ms),
    );
    span.str("hookline.event.id", meta.event_id.as_str());
    span.str("hookline.endpoint.id", meta.endpoint_id.as_str());
    span.str("hookline.tier.topic", topic);
    span.int("hookline.attempt", i64::from(meta.attempt));
    span.int("hookline.due_ms", meta.due_ms);
    span.int(
        "hookline.late_ms",
        hookline_common::runtime::clock::now_ms() - meta.due_ms,
    );
    span.traceparent()
}

async fn handle(
    stage: &Stage,
    metrics: &TierMetrics,
    source: &Source<'_>,
    claim: &dyn WriteGate,
    pending: Pending,
    cutoff: watch::Receiver<bool>,
    pacer: Option<(&Pacer, u64)>,
) -> Result<(), HopError> {
    let (meta, value) = match (pending.meta, pending.value) {
        (Ok(meta), Some(value)) => (meta, value),
        (meta, value) => {
            let problem = meta
                .err()
                .unwrap_or_else(|| "the record has no value (the event bytes)".to_string());
            metrics.emit_invalid(source.partition, source.offset, &problem);
            let record = parked(
                &stage.topics.invalid(),
                pending.key.as_deref(),
                pending.raw_headers.as_deref().unwrap_or_default(),
                value.as_deref(),
                &problem,
                *source,
            );
            return stage
                .path
                .writer()
                .park(claim, record, &problem, *source)
                .await;
        }
    };
    let due_ms = meta.due_ms;
    let mut meta = meta;
    if hookline_common::runtime::traces::enabled() {
        meta.trace = tier_span(&meta, source.topic);
    }
    let delivery = Delivery {
        meta,
        key: pending.key.map(Bytes::from),
        body: value,
        dedupe_key: pending.dedupe_key,
    };
    let origin = Origin {
        source: *source,
        gate: claim,
        cutoff: Some(cutoff),
    };
    // The rate limiter's owner attempts now (the slot is taken); a tier hands a rate-limited
    // endpoint's due retry to it.
    let turn = match pacer {
        Some((_, waited_ms)) => Turn::Paced { waited_ms },
        None => Turn::Scheduled,
    };
    let report = stage
        .path
        .attempt(&metrics.attempts, delivery, turn, origin)
        .await?;
    let meta = &report.meta;
    if let (Some((pacer, _)), Some(after)) =
        (pacer, report.outcome.as_ref().and_then(|o| o.retry_after))
    {
        let applied = pacer.pause(&meta.endpoint_id, after, tokio::time::Instant::now());
        tracing::info!(
            endpoint = %meta.endpoint_id,
            retry_after_s = after.as_secs_f64(),
            paused_s = applied.as_secs_f64(),
            "the endpoint asked to slow down (Retry-After): its new deliveries wait"
        );
    }
    if let Some(outcome) = &report.outcome {
        metrics.emit_attempt(meta, due_ms, outcome);
    }
    match &report.next {
        Next::Delivered => {
            let attempt = report.outcome.as_ref().map_or(meta.attempt, |o| o.attempt);
            metrics.emit_delivered(meta, attempt);
        }
        // Only a replay skips.
        Next::Skipped(_) => {}
        Next::Handed {
            why,
            hop,
            written: Written::AsPlanned,
        } => match (why, hop) {
            (Why::Deferred { .. }, _) => metrics.emit_deferred(meta, hop.topic()),
            (Why::Dead(reason), _) => metrics.emit_dead(meta, *reason),
            (Why::Failed, Hop::Retry { topic, .. }) => metrics.emit_next_tier(meta, topic),
            (Why::Failed, Hop::Dead { .. }) => metrics.emit_dead(meta, DeadReason::Exhausted),
            (Why::Failed, Hop::Throttle { .. }) | (Why::Throttled, _) => tracing::debug!(
                endpoint = %meta.endpoint_id,
                event = %meta.event_id,
                attempt = meta.attempt,
                "due retry handed to the rate limiter"
            ),
        },
        Next::Handed { written, .. } => metrics.emit_rerouted(meta, *written),
    }
    Ok(())
}

/// An unreadable tier record as parked on `<p>.invalid`: whole, with its own headers and the
/// quarantine headers (`bad_delivery_record`, the problem, the source position).
fn parked(
    invalid_topic: &str,
    key: Option<&[u8]>,
    headers: &[(String, Option<Vec<u8>>)],
    value: Option<&[u8]>,
    problem: &str,
    source: Source<'_>,
) -> OwnedRecord {
    let quarantine = Quarantine {
        reason: BAD_DELIVERY_RECORD,
        detail: problem,
        source,
    };
    quarantine.whole(invalid_topic, key, value, headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_common::contract::headers as h;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
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
            trace: None,
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
        let problem = p.meta.as_ref().expect_err("no metadata").clone();
        assert!(problem.contains("hookline-attempt"), "{problem}");
        let record = parked(
            "p.invalid",
            p.key.as_deref(),
            p.raw_headers.as_deref().unwrap_or_default(),
            Some(b"{}"),
            &problem,
            Source {
                topic: "p.retry.1m",
                partition: 0,
                offset: 7,
            },
        );
        let got: Vec<(String, String)> = record
            .headers
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

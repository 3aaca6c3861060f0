//! Stage A: consume `<p>.events`, validate each record, and either forward it to `<p>.dedupe` on
//! the partition owned by its dedupe key, or quarantine it on `<p>.invalid` with the reason.
//! It runs only with `dedupe.direct = false`; otherwise stage B reads `<p>.events` and judges
//! each record with the same [`Admission`].
//!
//! Headers first: before anything else a record's headers are read through the librdkafka C API
//! (`crate::headers`); more than `MAX_HEADERS` (1,000), a name that is not UTF-8, or headers
//! librdkafka cannot parse → quarantined as `bad_headers` with key and value whole and none of
//! its headers (so the copy can never hit librdkafka's 100,000-header limit).
//!
//! At-least-once: a record's offset is stored only after its output is acknowledged by Kafka,
//! in the order records were received (so the stored offset is always a contiguous prefix).
//! A crash re-sends at most the unacknowledged tail; stage B collapses those copies.
//!
//! Sizes: an event is admitted only if its key is within `input.max_key_bytes` and key + value +
//! producer headers + the room reserved for hookline's own headers fit the smallest
//! `max.message.bytes` of every topic it may travel to (read from the broker at start), so every
//! later hop fits by construction. Anything else is quarantined as `record_too_large` with
//! bounded prefixes; a record Kafka still refuses for good is quarantined the same way. A
//! record that can never be written never stops the stage (see `hookline_common::kafka::produce`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, Message};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::util::Timeout;
use rdkafka::TopicPartitionList;

use hookline_common::config::Config;
use hookline_common::contract::envelope::{Invalid, InvalidReason, Validator};
use hookline_common::contract::event_headers::EventHeaders;
use hookline_common::contract::keyhash::{key_hash, partition_for};
use hookline_common::contract::quarantine::{self, Quarantine, Source};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::{self, owned_headers, OwnedRecord, ProduceErrors, SendError};
use hookline_common::kafka::recordsize::{self, Limits};
use hookline_common::kafka::{pipeline_consumer_config, producer_config, AssignmentProbe};
use hookline_common::runtime::ops::StageProbe;
use hookline_common::runtime::shutdown::Shutdown;

use crate::headers;
use crate::metrics::ValidateMetrics;

/// Records forwarded but not yet acknowledged, across all partitions, before reading pauses.
const MAX_IN_FLIGHT: usize = 10_000;

/// The consumer group of stage A.
pub const STAGE: &str = "deduper.validate";

/// Every topic a record admitted by stage A may be written to later (its own output, the
/// quarantine, stage B's output, every tier, the DLQ): admission checks the smallest limit.
pub(crate) fn downstream_topics(config: &Config, topics: &Topics) -> Vec<String> {
    let mut out = vec![topics.dedupe(), topics.invalid(), topics.dispatch()];
    out.extend(
        config
            .retry
            .schedule
            .iter()
            .skip(1)
            .map(|offset| topics.retry(*offset)),
    );
    out.push(topics.dlq());
    out
}

/// What became of one input record.
enum Done {
    /// Its output (or its quarantine record) is acknowledged: store its offset.
    Written,
    /// Shutdown came while a transient error was being retried: store nothing from here on.
    Stopped,
}

/// The judgement of one `<p>.events` record: stage A's, and stage B's when it reads `<p>.events`
/// itself (`dedupe.direct`). Reads the headers through the C API first (see `crate::headers`),
/// then admits by size and validates the envelope; counts the verdict.
pub(crate) struct Admission {
    pub(crate) validator: Validator,
    pub(crate) limits: Arc<Limits>,
    /// Every topic an admitted record may travel to ([`downstream_topics`]).
    pub(crate) downstream: Vec<String>,
    pub(crate) max_key_bytes: usize,
    pub(crate) dedupe_topic: String,
    pub(crate) invalid_topic: String,
    pub(crate) events_topic: String,
    /// Partitions of `<p>.dedupe` (key placement).
    pub(crate) partitions: i32,
    pub(crate) metrics: ValidateMetrics,
}

/// What becomes of one `<p>.events` record.
pub(crate) enum Admitted {
    /// Valid: its record for `<p>.dedupe`, on the partition its dedupe key hashes to (the
    /// record's `partition`), with the event headers; `hash` is the dedupe key's hash.
    Valid { record: OwnedRecord, hash: u128 },
    /// Its quarantine record for `<p>.invalid` (whole, or the bounded `record_too_large` one).
    Invalid(OwnedRecord),
}

impl Admission {
    pub(crate) fn judge(&self, msg: &BorrowedMessage<'_>) -> Admitted {
        let (partition, offset) = (msg.partition(), msg.offset());
        let source = Source {
            topic: &self.events_topic,
            partition,
            offset,
        };
        // The headers first: read through the C API, never trusted (see `headers`).
        let (carried, verdict, dropped_headers) = match headers::read(msg) {
            Ok(all) => {
                // Producers cannot spoof our metadata headers.
                let carried: Vec<(String, Option<Vec<u8>>)> = all
                    .into_iter()
                    .filter(|(k, _)| !k.starts_with("hookline-"))
                    .collect();
                let carried_bytes = recordsize::headers_bytes(
                    carried
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_ref().map_or(0, Vec::len))),
                );
                let admitted = recordsize::admit(
                    msg.key().map_or(0, <[u8]>::len),
                    msg.payload().map_or(0, <[u8]>::len),
                    carried_bytes,
                    self.max_key_bytes,
                    self.limits
                        .min_limit(self.downstream.iter().map(String::as_str)),
                );
                let verdict = admitted.and_then(|()| self.validator.validate(msg.payload()));
                (carried, verdict, None)
            }
            Err(bad) => {
                let why = Invalid {
                    reason: InvalidReason::BadHeaders,
                    detail: bad.detail,
                };
                (Vec::new(), Err(why), bad.bytes)
            }
        };
        match verdict {
            Ok(ev) => {
                self.metrics.emit_valid();
                let hash = key_hash(&ev.dedupe_key);
                let facts = EventHeaders {
                    id: ev.id,
                    event_type: ev.event_type,
                    tenant: ev.tenant,
                    dedupe_key: Some(ev.dedupe_key),
                };
                let mut headers: Vec<(&str, Option<&[u8]>)> = carried
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_deref()))
                    .collect();
                headers.extend(facts.pairs().into_iter().map(|(k, v)| (k, Some(v))));
                let record = OwnedRecord {
                    topic: self.dedupe_topic.clone(),
                    partition: Some(partition_for(hash, self.partitions)),
                    key: msg.key().map(<[u8]>::to_vec),
                    value: msg.payload().map(<[u8]>::to_vec),
                    headers: owned_headers(headers),
                };
                Admitted::Valid { record, hash }
            }
            Err(why) => {
                self.metrics.emit_invalid(partition, offset, &why);
                let copy = Kept {
                    carried: &carried,
                    dropped_headers,
                };
                Admitted::Invalid(quarantine_record(
                    &self.invalid_topic,
                    msg,
                    copy,
                    &why,
                    source,
                    &self.limits,
                ))
            }
        }
    }
}

/// Runs stage A until shutdown. A record that can never be written is quarantined (or, if even
/// that is impossible, logged and counted) and never stops the stage; transient produce errors
/// are retried; only a fatal one (fenced, not authorised, topic gone) returns an error.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    probe: StageProbe,
    produce_errors: ProduceErrors,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let metrics = ValidateMetrics::new(&registry).context("registering stage A metrics")?;
    // Ready once the group assigned this member its partitions (see `AssignmentProbe`).
    let consumer: StreamConsumer<AssignmentProbe> = pipeline_consumer_config(&config, STAGE)
        .create_with_context(AssignmentProbe::new(probe.clone()))
        .context("creating the stage A consumer")?;
    let producer: FutureProducer = producer_config(&config)
        .create()
        .context("creating the stage A producer")?;
    let dedupe_topic = topics.dedupe();
    let invalid_topic = topics.invalid();
    let events_topic = topics.events();
    let partitions =
        check_partitions(&config, &[&events_topic, &dedupe_topic, &invalid_topic]).await?;
    let downstream = downstream_topics(&config, &topics);
    let limits = Arc::new(
        Limits::fetch(&config, downstream.clone())
            .await
            .context("reading topic size limits")?,
    );
    let admission = Admission {
        validator: Validator::new(&config.input, &config.dedupe.keys),
        limits: limits.clone(),
        downstream,
        max_key_bytes: config.input.max_key_bytes,
        dedupe_topic: dedupe_topic.clone(),
        invalid_topic: invalid_topic.clone(),
        events_topic: events_topic.clone(),
        partitions,
        metrics: metrics.clone(),
    };
    consumer
        .subscribe(&[&events_topic])
        .with_context(|| format!("subscribing to {events_topic}"))?;
    tracing::info!(topic = %events_topic, "validation stage started");

    // What every record's write needs, shared: one reference count per record, not a clone of
    // each part (two topic names, the producer, the metrics) per record.
    let fallback = Arc::new(Fallback {
        producer: producer.clone(),
        errors: produce_errors.clone(),
        shutdown: shutdown.clone(),
        limits: limits.clone(),
        metrics: metrics.clone(),
        invalid_topic: invalid_topic.clone(),
        events_topic: events_topic.clone(),
    });

    let mut pending: FuturesOrdered<_> = FuturesOrdered::new();
    // The loop turns at least once a second, so its heartbeat means "not stuck" even when idle.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut stopped = false;
    loop {
        probe.beat();
        let can_read = pending.len() < MAX_IN_FLIGHT;
        tokio::select! {
            biased;
            _ = shutdown.wait() => break,
            _ = tick.tick() => {}
            Some((partition, offset, result)) = pending.next(), if !pending.is_empty() => {
                stopped |= finish(&consumer, &events_topic, partition, offset, result, stopped)?;
            }
            msg = consumer.recv(), if can_read => {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "consumer error on the events topic");
                        continue;
                    }
                };
                let (partition, offset) = (msg.partition(), msg.offset());
                let record = match admission.judge(&msg) {
                    Admitted::Valid { record, .. } | Admitted::Invalid(record) => record,
                };
                let first = produce::enqueue(&producer, &record).await;
                let ctx = fallback.clone();
                pending.push_back(async move {
                    let result = ctx.write(record, first, partition, offset).await;
                    (partition, offset, result)
                });
            }
        }
    }

    tracing::info!(in_flight = pending.len(), "validation stage draining");
    while let Some((partition, offset, result)) = pending.next().await {
        stopped |= finish(&consumer, &events_topic, partition, offset, result, stopped)?;
    }
    // The final commit, the flush and the close block their thread (the close can block for
    // good with the cluster unreachable): bounded, off the runtime.
    hookline_common::kafka::closing::close("the events consumer", move || {
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(())
            | Err(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::NoOffset,
            )) => {}
            Err(e) => {
                tracing::warn!(error = %e, "final offset commit failed; the tail will be re-validated")
            }
        }
        let _ = producer.flush(Timeout::After(Duration::from_secs(5)));
        drop(consumer);
    })
    .await;
    tracing::info!("validation stage stopped");
    Ok(())
}

/// What the quarantine copy of an input keeps of its headers.
struct Kept<'a> {
    /// The input's own headers (none for `bad_headers`).
    carried: &'a [(String, Option<Vec<u8>>)],
    /// `bad_headers`: the bytes of the original headers, all dropped, when librdkafka could read
    /// them (`hookline-original-headers-bytes` of the whole copy).
    dropped_headers: Option<usize>,
}

/// The quarantine record of an input: whole with the reason, or, when the input is too large
/// to be written whole, the bounded `record_too_large` record.
fn quarantine_record<M: Message>(
    invalid_topic: &str,
    msg: &M,
    copy: Kept<'_>,
    why: &Invalid,
    source: Source<'_>,
    limits: &Limits,
) -> OwnedRecord {
    let limit = limits.limit(invalid_topic);
    let bounded = || {
        quarantine::too_large(
            invalid_topic,
            msg.key(),
            msg.payload(),
            copy.carried,
            &why.detail,
            source,
            limit,
        )
    };
    // Never copy a record known to be too large (it may be many megabytes).
    if why.reason == InvalidReason::RecordTooLarge {
        return bounded();
    }
    let quarantine = Quarantine {
        reason: why.reason.as_str(),
        detail: &why.detail,
        source,
    };
    let mut whole = quarantine.whole(invalid_topic, msg.key(), msg.payload(), copy.carried);
    if let Some(bytes) = copy.dropped_headers {
        whole.headers = whole.headers.insert(Header {
            key: hookline_common::contract::headers::ORIGINAL_HEADERS_BYTES,
            value: Some(bytes.to_string().as_bytes()),
        });
    }
    if whole.size() > limit {
        return bounded();
    }
    whole
}

/// What a pending write needs to finish on its own: wait for the acknowledgement, retry
/// transient errors, and reroute a record Kafka refuses for good.
struct Fallback {
    producer: FutureProducer,
    errors: ProduceErrors,
    shutdown: Shutdown,
    limits: Arc<Limits>,
    metrics: ValidateMetrics,
    invalid_topic: String,
    events_topic: String,
}

impl Fallback {
    /// Waits for `record` (enqueued as `first`). Refused for good: re-reads the size limits and
    /// quarantines a bounded `record_too_large` record instead; refused again: logs and counts
    /// it as dropped. Never an error for this record's sake: only a fatal error stops the stage.
    async fn write(
        &self,
        record: OwnedRecord,
        first: Result<rdkafka::producer::DeliveryFuture, rdkafka::error::KafkaError>,
        partition: i32,
        offset: i64,
    ) -> Result<Done, SendError> {
        let mut first = first;
        let mut batch_retries = 0;
        let refused = loop {
            match produce::await_acked(&self.producer, &record, first, &self.errors, &self.shutdown)
                .await
            {
                Ok(()) => return Ok(Done::Written),
                Err(SendError::Stopped) => return Ok(Done::Stopped),
                Err(SendError::Permanent { error, size }) => {
                    if size {
                        self.limits.refresh().await;
                        // Fits alone: its batch was too large (a topic limit below the
                        // producer's batch size). Send it again; batching differs next time.
                        if record.size() <= self.limits.limit(&record.topic) && batch_retries < 3 {
                            batch_retries += 1;
                            first = produce::enqueue(&self.producer, &record).await;
                            continue;
                        }
                    }
                    break error;
                }
                Err(fatal) => return Err(fatal),
            }
        };
        let source = Source {
            topic: &self.events_topic,
            partition,
            offset,
        };
        let why = Invalid {
            reason: InvalidReason::RecordTooLarge,
            detail: format!(
                "kafka refused the record ({} bytes) for {}: {refused}",
                record.size(),
                record.topic
            ),
        };
        self.metrics.emit_invalid(partition, offset, &why);
        let fallback = quarantine::too_large(
            &self.invalid_topic,
            record.key.as_deref(),
            record.value.as_deref(),
            &record.header_pairs(),
            &why.detail,
            source,
            self.limits.limit(&self.invalid_topic),
        );
        match produce::send_acked(&self.producer, &fallback, &self.errors, &self.shutdown).await {
            Ok(()) => Ok(Done::Written),
            Err(SendError::Stopped) => Ok(Done::Stopped),
            Err(SendError::Permanent { error, .. }) => {
                self.metrics.emit_dropped(partition, offset, &error);
                Ok(Done::Written)
            }
            Err(fatal) => Err(fatal),
        }
    }
}

/// Stores the offset of a record whose output Kafka acknowledged; fails on a fatal produce
/// error. Returns true once a write was abandoned at shutdown: from then on nothing is stored,
/// so the abandoned record is read again by the next run.
fn finish(
    consumer: &StreamConsumer<AssignmentProbe>,
    topic: &str,
    partition: i32,
    offset: i64,
    result: Result<Done, SendError>,
    stopped: bool,
) -> anyhow::Result<bool> {
    match result {
        Ok(Done::Written) if !stopped => {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset + 1))
                .context("building offset list")?;
            if let Err(e) = consumer.store_offsets(&tpl) {
                // Partition revoked meanwhile: its new owner re-reads from the committed offset.
                tracing::debug!(partition, offset, error = %e, "offset not stored");
            }
            Ok(false)
        }
        Ok(Done::Written) => Ok(true),
        Ok(Done::Stopped) => {
            tracing::warn!(
                partition,
                offset,
                "write abandoned at shutdown; the next run re-reads it"
            );
            Ok(true)
        }
        Err(e) => bail!("kafka refused a write for events {partition}@{offset}: {e}"),
    }
}

/// Waits for the stage's topics and insists `<p>.dedupe` has `topics.partitions` partitions: key
/// placement depends on it.
async fn check_partitions(config: &Config, names: &[&str]) -> anyhow::Result<i32> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let found = hookline_common::kafka::require_topics(
        config,
        names.clone(),
        hookline_common::kafka::TOPICS_WAIT,
    )
    .await?;
    let dedupe = &names[1];
    let actual = found.get(dedupe).copied().unwrap_or(0);
    dedupe_matches_config(dedupe, actual, config.topics.partitions)?;
    Ok(actual)
}

/// Refuses a `<p>.dedupe` whose partition count is not `topics.partitions`: keys are placed by it.
pub(crate) fn dedupe_matches_config(
    dedupe: &str,
    actual: i32,
    configured: i32,
) -> anyhow::Result<()> {
    if actual != configured {
        bail!(
            "topic {dedupe} has {actual} partitions but topics.partitions = {configured}; \
             dedupe keys are placed by partition count, so they must agree"
        );
    }
    Ok(())
}

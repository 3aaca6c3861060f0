//! Stage A: consume `<p>.events`, validate each record, and either forward it to `<p>.dedupe` on
//! the partition owned by its dedupe key, or quarantine it on `<p>.invalid` with the reason.
//!
//! At-least-once: a record's offset is stored only after its output is acknowledged by Kafka,
//! in the order records were received (so the stored offset is always a contiguous prefix).
//! A crash re-sends at most the unacknowledged tail; stage B collapses those copies.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::TopicPartitionList;

use hookline_common::config::Config;
use hookline_common::envelope::Validator;
use hookline_common::headers as h;
use hookline_common::kafka::{consumer_config, producer_config, AssignmentProbe};
use hookline_common::keyhash::{key_hash, partition_for};
use hookline_common::ops::StageProbe;
use hookline_common::shutdown::Shutdown;
use hookline_common::topics::Topics;

use crate::metrics::ValidateMetrics;

/// Records forwarded but not yet acknowledged, across all partitions, before reading pauses.
const MAX_IN_FLIGHT: usize = 10_000;

/// The consumer group of stage A.
pub const STAGE: &str = "deduper.validate";

/// Runs stage A until shutdown. Returns an error (process exits non-zero) if Kafka refuses a
/// write after its own retries: offsets are never stored past a record whose output was lost.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    probe: StageProbe,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let metrics = ValidateMetrics::new(&registry).context("registering stage A metrics")?;
    let validator = Validator::new(&config.input, &config.dedupe.keys);
    // Ready once the group assigned this member its partitions (see `AssignmentProbe`).
    let consumer: StreamConsumer<AssignmentProbe> = consumer_config(&config, STAGE)
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
    consumer
        .subscribe(&[&events_topic])
        .with_context(|| format!("subscribing to {events_topic}"))?;
    tracing::info!(topic = %events_topic, "validation stage started");

    let mut pending: FuturesOrdered<_> = FuturesOrdered::new();
    // The loop turns at least once a second, so its heartbeat means "not stuck" even when idle.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        probe.beat();
        let can_read = pending.len() < MAX_IN_FLIGHT;
        tokio::select! {
            biased;
            _ = shutdown.wait() => break,
            _ = tick.tick() => {}
            Some((partition, offset, result)) = pending.next(), if !pending.is_empty() => {
                finish(&consumer, &events_topic, partition, offset, result)?;
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
                let mut headers = OwnedHeaders::new();
                if let Some(src) = msg.headers() {
                    // Producers cannot spoof our metadata headers.
                    for hd in src.iter().filter(|hd| !hd.key.starts_with("hookline-")) {
                        headers = headers.insert(Header { key: hd.key, value: hd.value });
                    }
                }
                let (topic, target_partition, headers) = match validator.validate(msg.payload()) {
                    Ok(ev) => {
                        metrics.emit_valid();
                        let headers = headers
                            .insert(Header { key: h::EVENT_ID, value: Some(ev.id.as_bytes()) })
                            .insert(Header { key: h::EVENT_TYPE, value: Some(ev.event_type.as_bytes()) })
                            .insert(Header { key: h::DEDUPE_KEY, value: Some(ev.dedupe_key.as_bytes()) });
                        let headers = match &ev.tenant {
                            Some(t) => headers.insert(Header { key: h::TENANT, value: Some(t.as_bytes()) }),
                            None => headers,
                        };
                        let p = partition_for(key_hash(&ev.dedupe_key), partitions);
                        (&dedupe_topic, Some(p), headers)
                    }
                    Err(why) => {
                        metrics.emit_invalid(partition, offset, &why);
                        let offset_s = offset.to_string();
                        let partition_s = partition.to_string();
                        let headers = headers
                            .insert(Header { key: h::INVALID_REASON, value: Some(why.reason.as_str()) })
                            .insert(Header { key: h::INVALID_DETAIL, value: Some(why.detail.as_str()) })
                            .insert(Header { key: h::SOURCE_TOPIC, value: Some(events_topic.as_str()) })
                            .insert(Header { key: h::SOURCE_PARTITION, value: Some(partition_s.as_str()) })
                            .insert(Header { key: h::SOURCE_OFFSET, value: Some(offset_s.as_str()) });
                        (&invalid_topic, None, headers)
                    }
                };
                let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
                if let Some(p) = target_partition {
                    record = record.partition(p);
                }
                if let Some(k) = msg.key() {
                    record = record.key(k);
                }
                if let Some(v) = msg.payload() {
                    record = record.payload(v);
                }
                let delivery = enqueue(&producer, record).await?;
                pending.push_back(async move {
                    (partition, offset, delivery.await)
                });
            }
        }
    }

    tracing::info!(in_flight = pending.len(), "validation stage draining");
    while let Some((partition, offset, result)) = pending.next().await {
        finish(&consumer, &events_topic, partition, offset, result)?;
    }
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(())
        | Err(rdkafka::error::KafkaError::ConsumerCommit(
            rdkafka::types::RDKafkaErrorCode::NoOffset,
        )) => {}
        Err(e) => {
            tracing::warn!(error = %e, "final offset commit failed; the tail will be re-validated")
        }
    }
    let _ = producer.flush(Timeout::After(Duration::from_secs(10)));
    tracing::info!("validation stage stopped");
    Ok(())
}

/// Hands a record to the producer, waiting while its queue is full (back-pressure).
async fn enqueue(
    producer: &FutureProducer,
    mut record: FutureRecord<'_, [u8], [u8]>,
) -> anyhow::Result<DeliveryFuture> {
    loop {
        match producer.send_result(record) {
            Ok(d) => return Ok(d),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) => {
                record = r;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err((e, _)) => bail!("producing a record: {e}"),
        }
    }
}

/// Stores the offset of a record whose output Kafka acknowledged; fails on a lost output.
fn finish(
    consumer: &StreamConsumer<AssignmentProbe>,
    topic: &str,
    partition: i32,
    offset: i64,
    result: Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
) -> anyhow::Result<()> {
    match result {
        Ok(Ok(_)) => {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset + 1))
                .context("building offset list")?;
            if let Err(e) = consumer.store_offsets(&tpl) {
                // Partition revoked meanwhile: its new owner re-reads from the committed offset.
                tracing::debug!(partition, offset, error = %e, "offset not stored");
            }
            Ok(())
        }
        Ok(Err((e, _))) => bail!("kafka refused a write for events {partition}@{offset}: {e}"),
        Err(_) => bail!("producer dropped a delivery for events {partition}@{offset}"),
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
    let configured = config.topics.partitions;
    if actual != configured {
        bail!(
            "topic {dedupe} has {actual} partitions but topics.partitions = {configured}; \
             dedupe keys are placed by partition count, so they must agree"
        );
    }
    Ok(actual)
}

//! Reading a topic from given offsets up to the end it had when reading started (the high
//! watermarks fetched first), by assignment (no group membership, no commits): `dead list/show` and `replay` read
//! `<p>.dlq` and `<p>.replays` this way. Records appended while reading (a failed replay's new
//! dead letter, for one) are not read.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};

use hookline_common::config::Config;
use hookline_common::kafka::{base_config, EofQuietContext};

/// How long reading may go without a record or an end-of-partition before it gives up.
const IDLE_LIMIT: Duration = Duration::from_secs(30);
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Which part of a topic to read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Range {
    /// Only these partitions (all when `None`).
    pub(crate) partitions: Option<Vec<i32>>,
    /// First offset to read in each partition.
    pub(crate) from_offset: Option<i64>,
    /// Last offset to read in each partition (inclusive).
    pub(crate) to_offset: Option<i64>,
}

/// A bounded read of one topic (reaching a partition's end is how it ends, not an error:
/// `EofQuietContext` keeps those ends out of the log).
pub(crate) struct TopicReader {
    consumer: Arc<StreamConsumer<EofQuietContext>>,
    topic: String,
    /// Exclusive end per partition: the high watermark at start, or `to_offset + 1`.
    ends: HashMap<i32, i64>,
    /// Partitions not read to their end yet.
    open: BTreeSet<i32>,
}

impl TopicReader {
    /// Fetches the watermarks of `topic` and assigns the partitions of `range` (read_committed).
    pub(crate) async fn open(config: &Config, topic: &str, range: &Range) -> anyhow::Result<Self> {
        // librdkafka wants a group id even for `assign`; this one never joins (no subscribe) and
        // never commits.
        let consumer: StreamConsumer<EofQuietContext> = base_config(config)
            .set("group.id", config.group_id("reader"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .create_with_context(EofQuietContext("topic reader"))
            .with_context(|| format!("creating a reader of {topic}"))?;
        let consumer = Arc::new(consumer);
        let plan = {
            let (consumer, topic, range) = (consumer.clone(), topic.to_string(), range.clone());
            // Metadata and watermark requests block: not on the async runtime.
            tokio::task::spawn_blocking(move || read_plan(&consumer, &topic, &range))
                .await
                .context("watermark task")??
        };
        let mut tpl = TopicPartitionList::new();
        let mut ends = HashMap::new();
        for (partition, start, end) in &plan {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*start))
                .context("building the assignment")?;
            ends.insert(*partition, *end);
        }
        consumer
            .assign(&tpl)
            .with_context(|| format!("assigning {topic}"))?;
        Ok(TopicReader {
            consumer,
            topic: topic.to_string(),
            open: ends.keys().copied().collect(),
            ends,
        })
    }

    /// The next record in range, `None` once every partition was read to its end.
    pub(crate) async fn next(&mut self) -> anyhow::Result<Option<OwnedMessage>> {
        while !self.open.is_empty() {
            let received = match tokio::time::timeout(IDLE_LIMIT, self.consumer.recv()).await {
                Ok(received) => received,
                Err(_) => bail!(
                    "reading {} made no progress for {}s (partitions {:?} not read to their end)",
                    self.topic,
                    IDLE_LIMIT.as_secs(),
                    self.open
                ),
            };
            match received {
                Ok(m) => {
                    let (partition, offset) = (m.partition(), m.offset());
                    let Some(&end) = self.ends.get(&partition) else {
                        continue;
                    };
                    if offset + 1 >= end {
                        self.open.remove(&partition);
                    }
                    if offset < end {
                        return Ok(Some(m.detach()));
                    }
                }
                Err(KafkaError::PartitionEOF(partition)) => {
                    self.open.remove(&partition);
                }
                Err(e) => tracing::warn!(topic = %self.topic, error = %e, "error while reading"),
            }
        }
        Ok(None)
    }
}

/// (partition, first offset, exclusive end) of every partition with something to read.
fn read_plan(
    consumer: &StreamConsumer<EofQuietContext>,
    topic: &str,
    range: &Range,
) -> anyhow::Result<Vec<(i32, i64, i64)>> {
    let md = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .context("fetching metadata (is Kafka reachable at kafka.bootstrap_servers?)")?;
    let partitions: Vec<i32> = md
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        bail!("topic {topic} does not exist: run `hookline topics apply` first");
    }
    if let Some(wanted) = &range.partitions {
        if let Some(p) = wanted.iter().find(|p| !partitions.contains(p)) {
            bail!(
                "topic {topic} has no partition {p} (it has {})",
                partitions.len()
            );
        }
    }
    let mut plan = Vec::new();
    for partition in partitions {
        if range
            .partitions
            .as_ref()
            .is_some_and(|w| !w.contains(&partition))
        {
            continue;
        }
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
            .with_context(|| format!("fetching the watermarks of {topic}/{partition}"))?;
        let start = low.max(range.from_offset.unwrap_or(0));
        let end = match range.to_offset {
            Some(last) => high.min(last.saturating_add(1)),
            None => high,
        };
        if start < end {
            plan.push((partition, start, end));
        }
    }
    Ok(plan)
}

//! Stage B's restore: rebuilding a partition's seen-set from the changelog `<p>.dedupe-state`
//! when the partition is assigned (restart, rebalance, scale-out), on a thread of its own. See
//! `crate::dedupe` for why reading the committed offset first makes the end of the changelog the
//! right place to stop.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use hookline_common::config::Config;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::{
    base_config, retry_transient, retry_transient_known, EofQuietContext,
};

use crate::dedupe::{unix_secs, STAGE};
use crate::seen::SeenSet;

/// Longest a restore waits at the last stable offset for the commit markers of transactions
/// below the high watermark (normally milliseconds; the transaction timeout bounds an
/// abandoned one at 10 s).
const MARKER_WAIT: Duration = Duration::from_secs(30);

/// A restore that finished.
pub(crate) struct Restored {
    pub(crate) partition: i32,
    pub(crate) generation: u64,
    pub(crate) seen: SeenSet,
    /// The group's committed offset of the input partition (stable), to rewind to.
    pub(crate) committed: Offset,
    /// `dedupe.direct`: where to read events partition `partition` from.
    pub(crate) events_committed: Option<Offset>,
    pub(crate) records: u64,
    pub(crate) elapsed: Duration,
}

/// Rebuilds the seen-set of `partition` from the changelog. See the module docs for why reading
/// the committed offset first makes the end of the changelog the right place to stop.
pub(crate) fn restore(
    config: &Config,
    partition: i32,
    generation: u64,
) -> anyhow::Result<Restored> {
    let started = Instant::now();
    let topics = Topics::new(&config.topics.prefix);
    let mut c: ClientConfig = base_config(config);
    c.set("group.id", config.group_id(STAGE))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // The end of the log is signalled by an empty fetch: don't let the broker hold it.
        .set("fetch.wait.max.ms", "10")
        // Large fetches: the changelog is read start to end as fast as possible.
        .set("max.partition.fetch.bytes", "16777216")
        .set("fetch.max.bytes", "67108864")
        .set("queued.min.messages", "1000000")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer<EofQuietContext> = c
        .create_with_context(EofQuietContext("dedupe restore"))
        .context("creating the restore consumer")?;
    let end_reader: BaseConsumer<EofQuietContext> = base_config(config)
        .set("isolation.level", "read_uncommitted")
        .set("enable.auto.commit", "false")
        .create_with_context(EofQuietContext("dedupe restore"))
        .context("creating the restore's watermark client")?;

    let mut input = TopicPartitionList::new();
    input.add_partition(&topics.dedupe(), partition);
    let direct = config.dedupe.direct;
    if direct {
        // A transaction that wrote this changelog partition consumed dedupe partition `n`, events
        // partition `n`, or both: the committed offsets of both must be stable.
        input.add_partition(&topics.events(), partition);
    }
    // Not stable yet (a transaction is pending: `UnstableOffsetCommit`), or the coordinator is
    // moving: transient, retried.
    let found = retry_transient(
        &format!("committed offset of dedupe partition {partition}"),
        || consumer.committed_offsets(input.clone(), Duration::from_secs(15)),
    )
    .with_context(|| format!("reading committed offsets of dedupe partition {partition}"))?;
    let offset_of = |topic: &str| {
        found
            .find_partition(topic, partition)
            .map(|e| e.offset())
            .unwrap_or(Offset::Invalid)
    };
    let committed = offset_of(&topics.dedupe());
    let events_committed = if direct {
        Some(match offset_of(&topics.events()) {
            Offset::Offset(o) => Offset::Offset(o),
            // Never read by stage B yet: where stage A stopped reading it (a switch from
            // `dedupe.direct = false`), else from the beginning, as stage A starts.
            _ => stage_a_position(config, partition)?,
        })
    } else {
        None
    };

    let window = config.dedupe.window.as_secs().max(1);
    let mut seen = SeenSet::new(window);
    let state_topic = topics.dedupe_state();
    // The changelog's true end, its high watermark: asked by a `read_uncommitted` client, since
    // a `read_committed` one is answered the last stable offset, which stops before a
    // transaction whose commit marker has not reached this partition yet — even when the
    // committed offsets read above already include that transaction (the coordinator writes
    // each partition's marker on its own). Stopping there lost the previous owner's last keys:
    // their later copies were dispatched again (`dedupe::scale_in_mid_stream_keeps_exactly_once`,
    // under load). Reading with `read_committed` up to the high watermark waits for every
    // transaction written before it to be resolved.
    let (low, high) = retry_transient_known(
        &format!("watermarks of {state_topic}[{partition}]"),
        Duration::from_secs(15),
        || end_reader.fetch_watermarks(&state_topic, partition, Duration::from_secs(15)),
    )
    .with_context(|| format!("watermarks of {state_topic}[{partition}]"))?;
    let mut records = 0u64;
    if high > low {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&state_topic, partition, Offset::Beginning)
            .context("restore assignment")?;
        consumer.assign(&tpl).context("assigning the changelog")?;
        let now = unix_secs();
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut eof_since: Option<Instant> = None;
        loop {
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    records += 1;
                    let (Some(k), Some(v)) = (m.key(), m.payload()) else {
                        continue;
                    };
                    let (Ok(k), Ok(v)) = (<[u8; 16]>::try_from(k), <[u8; 4]>::try_from(v)) else {
                        continue;
                    };
                    let t = u32::from_be_bytes(v);
                    if u64::from(now.saturating_sub(t)) < window {
                        seen.insert(u128::from_be_bytes(k), t);
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    // At the last stable offset: done once that is the high watermark read above
                    // (every transaction before it resolved), else wait for the markers.
                    let at = consumer
                        .position()
                        .ok()
                        .and_then(|tpl| {
                            tpl.find_partition(&state_topic, partition)
                                .and_then(|e| e.offset().to_raw())
                        })
                        .unwrap_or(-1);
                    if at >= high {
                        break;
                    }
                    let waiting = *eof_since.get_or_insert_with(Instant::now);
                    if waiting.elapsed() > MARKER_WAIT {
                        // A marker this late is a broker problem; say so and go on rather than
                        // hold the partition (the keys of that transaction may pass again).
                        tracing::warn!(
                            partition,
                            position = at,
                            high_watermark = high,
                            "changelog restore stopped before the high watermark: a transaction \
                             there stayed unresolved"
                        );
                        break;
                    }
                }
                Some(Err(e)) => tracing::warn!(partition, error = %e, "restore read error"),
                None => {}
            }
            if Instant::now() > deadline {
                bail!("restoring dedupe partition {partition} took longer than 600s");
            }
        }
    }
    Ok(Restored {
        partition,
        generation,
        seen,
        committed,
        events_committed,
        records,
        elapsed: started.elapsed(),
    })
}

/// Stage A's committed offset of events partition `partition` (group `deduper.validate`), or
/// the beginning when it has none. Everything before it was written to `<p>.dedupe` and is
/// stage B's already; anything after that stage A also wrote is collapsed as a duplicate.
fn stage_a_position(config: &Config, partition: i32) -> anyhow::Result<Offset> {
    let topics = Topics::new(&config.topics.prefix);
    let consumer: BaseConsumer<EofQuietContext> = base_config(config)
        .set("group.id", config.group_id(crate::validate::STAGE))
        .set("enable.auto.commit", "false")
        .create_with_context(EofQuietContext("dedupe restore"))
        .context("creating a consumer to read stage A's committed offsets")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&topics.events(), partition);
    let found = retry_transient(
        &format!("stage A's committed offset of events partition {partition}"),
        || consumer.committed_offsets(tpl.clone(), Duration::from_secs(15)),
    )
    .with_context(|| {
        format!("reading stage A's committed offset of events partition {partition}")
    })?;
    Ok(
        match found
            .find_partition(&topics.events(), partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(o)) => Offset::Offset(o),
            _ => Offset::Beginning,
        },
    )
}

/// What a restore did, for the benchmark harness.
#[derive(Debug, Clone, Copy)]
pub struct RestoreStats {
    pub records: u64,
    pub keys: usize,
    pub bytes: usize,
    pub elapsed: Duration,
}

/// Restores one partition's seen-set from the changelog and reports what it took (benchmarks).
pub fn restore_for_bench(config: &Config, partition: i32) -> anyhow::Result<RestoreStats> {
    let r = restore(config, partition, 0)?;
    Ok(RestoreStats {
        records: r.records,
        keys: r.seen.len(),
        bytes: r.seen.bytes(),
        elapsed: r.elapsed,
    })
}

//! Where an event's latency goes, hop by hop, from the Kafka record timestamps the stages leave
//! behind: every fresh event keeps its id as record key on `<p>.events`, `<p>.dedupe` and
//! `<p>.dispatch`, and each record's CreateTime is the moment the writing client produced it
//! (the bench, stage A, stage B). So, per event:
//!
//! - `produce`: scheduled send → CreateTime on `<p>.events` (the bench's producer falling behind);
//! - `validate`: `<p>.events` → `<p>.dedupe` (stage A's fetch and processing);
//! - `dedupe`: `<p>.dedupe` → `<p>.dispatch` (stage A's linger and produce, stage B's fetch and
//!   processing; stage B's transaction is still open when this record is stamped). An event
//!   stage B read in place on `<p>.events` (`dedupe.direct`) has no `validate` hop and its
//!   `dedupe` hop is `<p>.events` → `<p>.dispatch`;
//! - `dispatch`: `<p>.dispatch` → receipt at the sink (stage B's transaction interval and commit,
//!   read_committed visibility, the dispatcher's fetch and the POST).
//!
//! Timestamps are in ms and come from one clock (one machine), so hop figures are ±1 ms. Only the
//! run's records are read: from the high watermarks taken when the run started to those at its
//! end, `read_uncommitted` (markers and aborted records are simply skipped or unmatched).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use hookline_common::config::Config;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::base_config;

/// The hops, in pipeline order (names of [`HopLatency::hop`]).
pub const HOPS: [&str; 4] = ["produce", "validate", "dedupe", "dispatch"];

/// Per-partition high watermarks of the three pipeline topics at one moment.
#[derive(Debug, Clone, Default)]
pub struct Marks {
    /// topic → partition → offset.
    offsets: HashMap<String, HashMap<i32, i64>>,
}

/// One hop's latency over a run's fresh events.
#[derive(Debug, Clone, Serialize, Default)]
pub struct HopLatency {
    pub hop: String,
    pub samples: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

fn reader(config: &Config) -> anyhow::Result<BaseConsumer> {
    Ok(base_config(config)
        .set(
            "group.id",
            format!("{}.bench-hop-reader", config.topics.prefix),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted")
        .set("fetch.wait.max.ms", "50")
        .create()?)
}

fn pipeline_topics(config: &Config) -> [String; 3] {
    let t = Topics::new(&config.topics.prefix);
    [t.events(), t.dedupe(), t.dispatch()]
}

/// The high watermarks now (blocking).
pub fn marks(config: &Config, partitions: i32) -> anyhow::Result<Marks> {
    let consumer = reader(config)?;
    let timeout = Duration::from_secs(10);
    let mut out = Marks::default();
    for topic in pipeline_topics(config) {
        let mut parts = HashMap::new();
        for p in 0..partitions {
            let (_, high) = consumer
                .fetch_watermarks(&topic, p, timeout)
                .with_context(|| format!("watermarks of {topic}[{p}]"))?;
            parts.insert(p, high);
        }
        out.offsets.insert(topic, parts);
    }
    Ok(out)
}

/// Record timestamps (unix ms) of the run's keys (`<tag>-…`) on `topic` between two marks.
fn stamps(
    consumer: &BaseConsumer,
    topic: &str,
    from: &HashMap<i32, i64>,
    to: &HashMap<i32, i64>,
    tag: &str,
) -> anyhow::Result<HashMap<String, i64>> {
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for (p, start) in from {
        let end = to.get(p).copied().unwrap_or(*start);
        if end > *start {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*start))?;
            ends.insert(*p, end);
        }
    }
    let prefix = format!("{tag}-");
    let mut out = HashMap::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ends.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "reading {topic} took over 120 s");
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            // Only transaction markers may be left before the end: check positions.
            let pos = consumer.position()?;
            ends.retain(|p, end| {
                !matches!(pos.find_partition(topic, *p).map(|e| e.offset()),
                    Some(Offset::Offset(o)) if o >= *end)
            });
            continue;
        };
        let m = m.with_context(|| format!("reading {topic}"))?;
        if m.offset() + 1 >= ends.get(&m.partition()).copied().unwrap_or(0) {
            ends.remove(&m.partition());
        }
        let (Some(key), Some(ts)) = (m.key(), m.timestamp().to_millis()) else {
            continue;
        };
        if let Ok(k) = std::str::from_utf8(key) {
            if k.starts_with(&prefix) {
                out.entry(k.to_string()).or_insert(ts);
            }
        }
    }
    consumer.unassign()?;
    Ok(out)
}

/// Per-hop latency of a run (blocking): `receipts` are (event id, scheduled ns, first receipt
/// ns) of its fresh events' healthy deliveries.
pub fn measure(
    config: &Config,
    from: &Marks,
    to: &Marks,
    tag: &str,
    receipts: &[(String, u64, u64)],
) -> anyhow::Result<Vec<HopLatency>> {
    let consumer = reader(config)?;
    let empty = HashMap::new();
    let mut per_topic = Vec::new();
    for topic in pipeline_topics(config) {
        let f = from.offsets.get(&topic).unwrap_or(&empty);
        let t = to.offsets.get(&topic).unwrap_or(&empty);
        per_topic.push(stamps(&consumer, &topic, f, t, tag)?);
    }
    let mut hists = Vec::new();
    for _ in HOPS {
        hists.push(Histogram::<u64>::new_with_bounds(1, 3_600_000, 3)?);
    }
    for (id, sched_ns, recv_ns) in receipts {
        let points = [
            Some((*sched_ns / 1_000_000) as i64),
            per_topic[0].get(id).copied(),
            per_topic[1].get(id).copied(),
            per_topic[2].get(id).copied(),
            Some((*recv_ns / 1_000_000) as i64),
        ];
        for (i, h) in hists.iter_mut().enumerate() {
            // Read in place by stage B (`dedupe.direct`): no `<p>.dedupe` record, and its
            // `dedupe` hop starts on `<p>.events`.
            let from = if i == 2 {
                points[2].or(points[1])
            } else {
                points[i]
            };
            if let (Some(a), Some(b)) = (from, points[i + 1]) {
                // Clamped at 1 ms: ms stamps from clients that round differently.
                h.saturating_record((b - a).max(1) as u64);
            }
        }
    }
    Ok(HOPS
        .iter()
        .zip(hists)
        .map(|(hop, h)| HopLatency {
            hop: hop.to_string(),
            samples: h.len(),
            p50_ms: h.value_at_quantile(0.5) as f64,
            p99_ms: h.value_at_quantile(0.99) as f64,
            max_ms: h.max() as f64,
        })
        .collect())
}

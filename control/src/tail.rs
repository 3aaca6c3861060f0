//! Tailing topics by assignment — no consumer group, no commits — as every control-plane reader
//! does (the registry, the health tracker): every process reads every partition itself, so every
//! process arrives at the same state.
//!
//! The tail tracks its position per partition from the consumer's own position (which moves past
//! transaction markers, which a record count would not) and publishes it on a `watch` channel, so
//! callers can wait until it has read up to an offset ("caught up" to the end a topic had, or a
//! write of their own made visible).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use hookline_common::config::Config;
use hookline_common::kafka::{base_config, retry_transient_known, EofQuietContext};

const TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle tail refreshes its positions (they move past transaction markers).
const IDLE_TICK: Duration = Duration::from_millis(10);
/// How long a record's successor is waited for before [`Tail::next`] reports idle: what it
/// adds to the moment a record is published (a write's read-back waits for it), small enough
/// for that, long enough that a fetch's records come one after another without it.
const AFTER_RECORD: Duration = Duration::from_millis(1);

/// (topic, partition) → next offset to read.
pub type Positions = BTreeMap<(String, i32), i64>;

/// Where to start reading a topic.
#[derive(Debug, Clone, Copy)]
pub enum StartAt {
    Beginning,
    /// The first record at or after this unix ms time.
    Time(i64),
}

/// One topic to read.
#[derive(Debug, Clone)]
pub struct Source {
    pub topic: String,
    pub start: StartAt,
    /// Only this partition (all when `None`).
    pub only_partition: Option<i32>,
}

impl Source {
    /// Every partition of `topic` from `start`.
    pub fn all(topic: impl Into<String>, start: StartAt) -> Source {
        Source {
            topic: topic.into(),
            start,
            only_partition: None,
        }
    }
}

/// A reader of some topics from given starts.
pub struct Tail {
    consumer: Arc<StreamConsumer<EofQuietContext>>,
    positions: watch::Sender<Positions>,
    /// The last call returned a record.
    busy: std::sync::atomic::AtomicBool,
}

impl Tail {
    /// Assigns every partition of `topics` (read_committed) at its start; returns the tail and
    /// the ends the topics have now (their high watermarks).
    pub async fn open(
        config: &Config,
        name: &str,
        topics: &[Source],
    ) -> anyhow::Result<(Tail, Positions)> {
        // librdkafka wants a group id even for `assign`; this one never joins and never commits.
        let consumer: StreamConsumer<EofQuietContext> = base_config(config)
            .set("group.id", config.group_id(&format!("control.{name}")))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "20")
            // librdkafka's prefetch (64 MiB by default) was most of the ~80 MiB a dispatcher's
            // RSS rose above its settled size while loading 100,000 endpoints (issue 35).
            .set("queued.max.messages.kbytes", "8192")
            .create_with_context(EofQuietContext("control-plane reader"))
            .with_context(|| format!("creating the {name} reader"))?;
        let consumer = Arc::new(consumer);
        let (tpl, starts, ends) = {
            let (c, t) = (consumer.clone(), topics.to_vec());
            tokio::task::spawn_blocking(move || plan(&c, &t))
                .await
                .context("reader metadata task")??
        };
        consumer
            .assign(&tpl)
            .with_context(|| format!("assigning the {name} reader"))?;
        let (positions, _) = watch::channel(starts);
        Ok((
            Tail {
                consumer,
                positions,
                busy: std::sync::atomic::AtomicBool::new(false),
            },
            ends,
        ))
    }

    /// Receives positions as they move.
    pub fn positions(&self) -> watch::Receiver<Positions> {
        self.positions.subscribe()
    }

    /// The next record; `None` after an idle tick (positions were refreshed meanwhile).
    pub async fn next(&self) -> Option<OwnedMessage> {
        use std::sync::atomic::Ordering::Relaxed;
        let wait = if self.busy.load(Relaxed) {
            AFTER_RECORD
        } else {
            IDLE_TICK
        };
        let got = tokio::time::timeout(wait, self.consumer.recv()).await;
        self.busy.store(matches!(got, Ok(Ok(_))), Relaxed);
        let msg = match got {
            Ok(Ok(m)) => Some(m.detach()),
            Ok(Err(KafkaError::PartitionEOF(_))) | Err(_) => None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "control-plane reader error");
                None
            }
        };
        self.refresh(msg.as_ref());
        msg
    }

    fn refresh(&self, msg: Option<&OwnedMessage>) {
        let now = self.consumer.position().ok();
        self.positions.send_if_modified(|p| {
            let mut changed = false;
            let mut advance = |key: (String, i32), to: i64| {
                let at = p.entry(key).or_insert(0);
                if to > *at {
                    *at = to;
                    changed = true;
                }
            };
            if let Some(m) = msg {
                use rdkafka::message::Message as _;
                advance((m.topic().to_string(), m.partition()), m.offset() + 1);
            }
            for e in now.iter().flat_map(|tpl| tpl.elements()) {
                if let Offset::Offset(o) = e.offset() {
                    advance((e.topic().to_string(), e.partition()), o);
                }
            }
            changed
        });
    }
}

/// [`retry_transient_known`] for up to [`TIMEOUT`]: also riding out the seconds after a topic
/// was created, or its broker restarted, when its partitions may still be unknown to it.
fn retry<T>(op: &str, call: impl FnMut() -> Result<T, KafkaError>) -> Result<T, KafkaError> {
    retry_transient_known(op, TIMEOUT, call)
}

/// Whether `positions` reached every offset in `ends`.
pub fn covers(positions: &Positions, ends: &Positions) -> bool {
    ends.iter()
        .all(|(k, end)| positions.get(k).is_some_and(|at| at >= end))
}

/// The high watermarks of every partition of `topic` now.
pub async fn ends_of(config: &Config, topic: &str) -> anyhow::Result<Positions> {
    let consumer: rdkafka::consumer::BaseConsumer = base_config(config)
        .create()
        .context("creating a metadata client")?;
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let mut out = Positions::new();
        for p in partitions(&consumer, &topic)? {
            let (_, high) = watermarks(&consumer, &topic, p)?;
            out.insert((topic.clone(), p), high);
        }
        Ok(out)
    })
    .await
    .context("watermark task")?
}

fn partitions<C: ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
) -> anyhow::Result<Vec<i32>> {
    hookline_common::kafka::topic_partitions(consumer.client(), topic, TIMEOUT)
}

fn watermarks<C: ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
    p: i32,
) -> anyhow::Result<(i64, i64)> {
    retry(&format!("watermarks of {topic}[{p}]"), || {
        consumer.fetch_watermarks(topic, p, TIMEOUT)
    })
    .with_context(|| format!("watermarks of {topic}[{p}]"))
}

/// The assignment, the start positions and the ends.
fn plan(
    consumer: &StreamConsumer<EofQuietContext>,
    topics: &[Source],
) -> anyhow::Result<(TopicPartitionList, Positions, Positions)> {
    let base = consumer.client();
    let mut tpl = TopicPartitionList::new();
    let (mut starts, mut ends) = (Positions::new(), Positions::new());
    for Source {
        topic,
        start,
        only_partition,
    } in topics
    {
        let ps = hookline_common::kafka::topic_partitions(base, topic, TIMEOUT)?;
        let ps: Vec<i32> = match only_partition {
            Some(p) if ps.contains(p) => vec![*p],
            Some(p) => anyhow::bail!("topic {topic} has no partition {p}"),
            None => ps,
        };
        let by_time = match start {
            StartAt::Time(ms) => {
                let mut q = TopicPartitionList::new();
                for p in &ps {
                    q.add_partition_offset(topic, *p, Offset::Offset(*ms))?;
                }
                Some(
                    retry(&format!("offsets for times on {topic}"), || {
                        consumer.offsets_for_times(q.clone(), TIMEOUT)
                    })
                    .with_context(|| format!("finding where to start on {topic}"))?,
                )
            }
            StartAt::Beginning => None,
        };
        for p in ps {
            let (low, high) = retry(&format!("watermarks of {topic}[{p}]"), || {
                base.fetch_watermarks(topic, p, TIMEOUT)
            })
            .with_context(|| format!("watermarks of {topic}[{p}]"))?;
            let from = match by_time
                .as_ref()
                .and_then(|f| f.find_partition(topic, p))
                .map(|e| e.offset())
            {
                None => low,
                Some(Offset::Offset(o)) => o.max(low),
                // No record at or after the time: start at the end.
                Some(_) => high,
            };
            tpl.add_partition_offset(topic, p, Offset::Offset(from))?;
            starts.insert((topic.clone(), p), from);
            ends.insert((topic.clone(), p), high);
        }
    }
    Ok((tpl, starts, ends))
}

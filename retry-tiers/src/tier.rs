//! One retry tier's worker: consumer group `<group_prefix>.retry.<tier>` on `<p>.retry.<tier>`.
//!
//! Per partition, records are held in memory from the moment they are received until they are
//! due ([`crate::waiting`]); a partition whose head is not due yet is paused and resumed when it
//! is, by a timer in this loop. The loop never sleeps and never stops polling the consumer (a
//! tick at most [`TICK`] apart keeps it polling while every partition is paused), so the consumer
//! is never evicted for exceeding `max.poll.interval.ms`. Due records are attempted concurrently
//! (up to `tiers.max_in_flight_per_partition` per partition) as tasks; the offset stored is
//! the contiguous completed prefix, committed in the background.
//!
//! Stopping: fetching stops, records not started are forgotten (never stored, so re-read), the
//! in-flight ones finish within `tiers.shutdown_grace`; attempts still running then are cut
//! short, recorded as a `timeout` and handed off; then offsets are committed.
//!
//! Rebalances (`crate::rebalance`, the one way every consumer stage handles them): the callbacks
//! resume assigned partitions, run the bounded revoke protocol and post the changes; the loop
//! applies them right after `recv()`. A revoked partition's held records and timer are dropped
//! (the state is keyed by an assignment generation, so a late completion or a timer never touches
//! a partition this worker no longer owns or owns again since). A rebalance never forks a retry
//! chain: every write of a record's handling (next tier, dead letter) goes through its
//! partition's ownership gate ([`Ownership`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookline_common::kafka::ownership::Ownership;
use hookline_common::kafka::progress::PartitionProgress;
use hookline_common::kafka::rebalance::{self, Inbox, Rebalanced};

use anyhow::Context as _;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use hookline_common::kafka::consumer_config;
use hookline_common::runtime::clock::now_ms;

use crate::pacer::DEFAULT_BURST;
use hookline_common::runtime::ops::StageProbe;
use hookline_common::runtime::shutdown::Shutdown;
use hookline_delivery::HopError;

use crate::attempt::{self, Finished, Gate, Pending, Stage};
use crate::due::DueBound;
use crate::metrics::TierMetrics;
use crate::paced::PacedWaiting;
use crate::pacer::Pacer;
use crate::rebalance::{TierContext, REVOKE_WAIT_CAP};
use crate::waiting::{PartitionWaiting, LOOKAHEAD_MS};
use hookline_common::contract::quarantine::Source;

/// Records a rate-limiter partition holds in memory before it is paused (resumed under half).
pub(crate) const THROTTLE_HELD_PER_PARTITION: usize = 10_000;

/// Longest the loop goes without polling the consumer (rebalance callbacks, liveness).
pub(crate) const TICK: Duration = Duration::from_millis(500);

/// After the shutdown grace, how long cut-short attempts get to be acknowledged on their next
/// hop before the worker gives up on them (they are then attempted again after the restart).
const HANDOFF_DRAIN: Duration = Duration::from_secs(10);

/// What the record tasks of one owned partition completed, kept under the ownership lock so the
/// revoke callback can store it while the loop waits inside `recv()`.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    progress: PartitionProgress,
    /// The rate limiter's records received and not started (begun in `progress` on receipt):
    /// not counted as unfinished work a revoke waits for.
    waiting: usize,
    /// Offset to store: end of the contiguous completed prefix, once it moved.
    next: Option<i64>,
}

impl Completion {
    /// Records begun and not completed.
    pub(crate) fn unfinished(&self) -> usize {
        self.progress.unfinished().saturating_sub(self.waiting)
    }

    /// The offset to store, once the completed prefix moved.
    pub(crate) fn next(&self) -> Option<i64> {
        self.next
    }
}

/// One tier: its name (`5m`) and topic (`<p>.retry.5m`).
#[derive(Debug, Clone)]
pub(crate) struct Tier {
    pub(crate) name: String,
    pub(crate) topic: String,
    /// What bounds its records' due times (a fast clock) and the current schedule's length.
    pub(crate) bound: DueBound,
    /// Not in the current schedule: its records are drained (see `crate::orphans`).
    pub(crate) orphan: bool,
    /// Set for `<p>.throttle`: the rate limiter, whose records start when their endpoint's
    /// bucket allows (see `crate::pacer`), not at a due time.
    pub(crate) pacer: Option<Arc<Pacer>>,
}

impl Tier {
    /// The consumer group's stage name: `retry.<tier>`, or `throttle`.
    pub(crate) fn group(&self) -> String {
        if self.pacer.is_some() {
            "throttle".to_string()
        } else {
            format!("retry.{}", self.name)
        }
    }
}

/// A partition's records not started yet: held until due (a tier), or until their endpoint's
/// budget allows (the rate limiter).
#[derive(Debug)]
enum Waiting {
    Due(PartitionWaiting<Pending>),
    Paced(PacedWaiting<Pending>),
}

impl Waiting {
    fn complete(&mut self, offset: i64) -> Option<i64> {
        match self {
            Waiting::Due(w) => w.complete(offset),
            Waiting::Paced(w) => w.complete(offset),
        }
    }
    fn drop_waiting(&mut self) -> usize {
        match self {
            Waiting::Due(w) => w.drop_waiting(),
            Waiting::Paced(w) => w.drop_waiting(),
        }
    }
    fn set_paused(&mut self) {
        match self {
            Waiting::Due(w) => w.set_paused(),
            Waiting::Paced(w) => w.set_paused(),
        }
    }
    fn waiting(&self) -> usize {
        match self {
            Waiting::Due(w) => w.waiting(),
            Waiting::Paced(w) => w.waiting(),
        }
    }
    fn in_flight(&self) -> usize {
        match self {
            Waiting::Due(w) => w.in_flight(),
            Waiting::Paced(w) => w.in_flight(),
        }
    }
    fn is_paused(&self) -> bool {
        match self {
            Waiting::Due(w) => w.is_paused(),
            Waiting::Paced(w) => w.is_paused(),
        }
    }
}

/// A partition this worker owns, for one assignment generation.
struct Part {
    generation: u64,
    waiting: Waiting,
}

/// A finished record task.
struct Done {
    partition: i32,
    generation: u64,
    offset: i64,
    result: Result<Finished, HopError>,
}

/// What woke the loop.
enum Wake {
    Stop,
    Finished(Result<Done, tokio::task::JoinError>),
    /// A due time, the tick, or a rebalance: re-evaluate.
    Recheck,
    Received(Result<Box<Received>, KafkaError>),
}

/// A record as received: partition, offset, due time, decoded record.
struct Received {
    partition: i32,
    offset: i64,
    due_ms: i64,
    /// The recorded due time was beyond the tier's bound by this much (ms) and was capped.
    capped_by_ms: Option<i64>,
    pending: Pending,
}

/// Runs one tier until shutdown (or a write Kafka refuses).
pub(crate) async fn run(
    stage: Arc<Stage>,
    tier: Tier,
    metrics: TierMetrics,
    ready: StageProbe,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let config = stage.config.clone();
    let ownership = Arc::new(Ownership::default());
    let context = TierContext {
        tier: tier.name.clone(),
        topic: tier.topic.clone(),
        inbox: Inbox::default(),
        probe: ready.clone(),
        ownership: ownership.clone(),
        revoke_wait: config.tiers.shutdown_grace.min(REVOKE_WAIT_CAP),
        closing: AtomicBool::new(false),
    };
    let consumer: StreamConsumer<TierContext> = consumer_config(&config, &tier.group())
        .create_with_context(context)
        .with_context(|| format!("creating the consumer of tier {}", tier.name))?;
    consumer
        .subscribe(&[&tier.topic])
        .with_context(|| format!("subscribing to {}", tier.topic))?;
    tracing::info!(tier = %tier.name, topic = %tier.topic, orphan = tier.orphan, "retry tier started");

    let mut worker = Worker {
        stage,
        tier: Arc::new(tier),
        metrics,
        consumer,
        cap: config.tiers.max_in_flight_per_partition.max(1),
        held_cap: THROTTLE_HELD_PER_PARTITION,
        parts: HashMap::new(),
        ownership,
        tasks: JoinSet::new(),
        cut: false,
        ready,
    };
    let result = worker.run(shutdown, config.tiers.shutdown_grace).await;
    worker.tasks.shutdown().await;
    worker
        .consumer
        .context()
        .closing
        .store(true, Ordering::Relaxed);
    worker.metrics.waiting.set(0);
    worker.metrics.inflight.set(0);
    worker.metrics.paused.set(0);
    let tier = worker.tier.name.clone();
    let consumer = worker.consumer;
    // A sync commit and the consumer's close block their thread (the close can block for good
    // with the cluster unreachable): bounded, off the runtime.
    let tier_name = tier.clone();
    hookline_common::kafka::closing::close("a tier consumer", move || {
        if let Err(e) = rebalance::commit(&consumer) {
            tracing::warn!(
                tier = %tier_name,
                error = %e,
                "final offset commit failed; finished records after the last commit will be attempted again"
            );
        }
        drop(consumer);
    })
    .await;
    tracing::info!(tier = %tier, "retry tier stopped");
    result.with_context(|| format!("retry tier {tier}"))
}

struct Worker {
    stage: Arc<Stage>,
    tier: Arc<Tier>,
    metrics: TierMetrics,
    consumer: StreamConsumer<TierContext>,
    /// Records in flight per partition.
    cap: usize,
    /// Records held per rate-limiter partition before it is paused (bounded memory).
    held_cap: usize,
    parts: HashMap<i32, Part>,
    /// Generations, gates, cut signals and completions of the owned partitions (shared with the
    /// rebalance callbacks and the record tasks).
    ownership: Arc<Ownership<Completion>>,
    tasks: JoinSet<Done>,
    /// Whether the shutdown grace is over and attempts still running were cut short.
    cut: bool,
    /// Ready from the first assignment (an empty one too: a standby); heartbeat per loop turn.
    ready: StageProbe,
}

impl Worker {
    async fn run(&mut self, mut shutdown: Shutdown, grace: Duration) -> anyhow::Result<()> {
        let mut stop_by: Option<Instant> = None;
        loop {
            self.ready.beat();
            if stop_by.is_none() {
                self.start_due();
            }
            self.update_gauges();
            if let Some(deadline) = stop_by {
                if self.tasks.is_empty() {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    if self.cut {
                        tracing::warn!(
                            tier = %self.tier.name,
                            records = self.tasks.len(),
                            "hand-offs not acknowledged in time; these records are attempted again after the restart"
                        );
                        return Ok(());
                    }
                    tracing::warn!(
                        tier = %self.tier.name,
                        records = self.tasks.len(),
                        "shutdown grace is over; attempts still running are cut short and handed off"
                    );
                    self.cut = true;
                    self.ownership.cut_all();
                    stop_by = Some(Instant::now() + HANDOFF_DRAIN);
                }
            }
            let wake_at = self.next_wake(stop_by);
            let bound = self.tier.bound;
            let wake = tokio::select! {
                biased;
                _ = shutdown.wait(), if stop_by.is_none() => Wake::Stop,
                Some(finished) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    Wake::Finished(finished)
                }
                _ = tokio::time::sleep_until(wake_at) => Wake::Recheck,
                () = self.consumer.context().inbox.posted() => Wake::Recheck,
                received = self.consumer.recv() => Wake::Received(received.map(|m| {
                    let (_, pending) = Pending::from_message(&m);
                    let due = bound.due(
                        pending.recorded_due(),
                        pending.attempt(),
                        m.timestamp().to_millis(),
                        now_ms(),
                    );
                    Box::new(Received {
                        partition: m.partition(),
                        offset: m.offset(),
                        due_ms: due.due_ms,
                        capped_by_ms: due.capped_by_ms,
                        pending,
                    })
                })),
            };
            // Callbacks ran inside `recv()`: apply them before acting on anything.
            self.apply_rebalances();
            match wake {
                Wake::Stop => {
                    stop_by = Some(Instant::now() + grace);
                    self.stop_fetching();
                }
                Wake::Finished(Ok(done)) => self.finish(done)?,
                Wake::Finished(Err(e)) if e.is_cancelled() => {}
                Wake::Finished(Err(e)) => anyhow::bail!("a record task panicked: {e}"),
                Wake::Recheck => {}
                Wake::Received(Ok(received)) => {
                    if stop_by.is_some() {
                        continue;
                    }
                    let Received {
                        partition,
                        offset,
                        due_ms,
                        capped_by_ms,
                        pending,
                    } = *received;
                    if let Some(skew_ms) = capped_by_ms {
                        self.metrics
                            .emit_due_capped(partition, offset, skew_ms, due_ms);
                    }
                    match self.parts.get_mut(&partition) {
                        Some(Part {
                            waiting: Waiting::Due(w),
                            ..
                        }) => w.push(offset, due_ms, pending),
                        Some(Part {
                            waiting: Waiting::Paced(w),
                            generation,
                        }) => {
                            // Begun on receipt: records start out of offset order.
                            self.ownership.with(partition, *generation, |c| {
                                c.progress.begin(offset);
                                c.waiting += 1;
                            });
                            let endpoint = pending.endpoint_id().unwrap_or_default().to_string();
                            w.push(offset, &endpoint, pending, Instant::now());
                        }
                        None => tracing::debug!(
                            tier = %self.tier.name,
                            partition,
                            offset,
                            "record of a partition not owned any more, ignored"
                        ),
                    }
                }
                Wake::Received(Err(e)) => {
                    tracing::warn!(tier = %self.tier.name, error = %e, "consumer error");
                }
            }
        }
    }

    /// Starts every due record (up to the cap) and pauses or resumes partitions as needed.
    fn start_due(&mut self) {
        let now = now_ms();
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        let instant = Instant::now();
        let endpoints = self.stage.path.endpoints().current();
        let limit = |id: &str| {
            let e = endpoints.get(id)?;
            Some((e.rate_limit?, e.burst.unwrap_or(DEFAULT_BURST)))
        };
        for (&partition, part) in &mut self.parts {
            let started: Vec<(i64, Pending, u64)> = match (&mut part.waiting, &self.tier.pacer) {
                (Waiting::Due(w), _) => w
                    .take_due(now, self.cap)
                    .into_iter()
                    .map(|(offset, pending)| (offset, pending, 0))
                    .collect(),
                (Waiting::Paced(w), Some(pacer)) => {
                    w.take_due(instant, self.cap, limit, |e, rate, burst| {
                        pacer.try_take(e, rate, burst, instant)
                    })
                }
                (Waiting::Paced(w), None) => {
                    w.take_due(instant, self.cap, |_| None, |_, _, _| Ok(()))
                }
            };
            for (offset, pending, waited_ms) in started {
                let stage = self.stage.clone();
                let tier = self.tier.clone();
                let metrics = self.metrics.clone();
                let generation = part.generation;
                let ownership = self.ownership.clone();
                let paced = matches!(part.waiting, Waiting::Paced(_));
                ownership.with(partition, generation, |c| {
                    if paced {
                        c.waiting = c.waiting.saturating_sub(1);
                    } else {
                        c.progress.begin(offset);
                    }
                });
                let cutoff = ownership
                    .cutoff(partition, generation)
                    .unwrap_or_else(|| watch::channel(false).1);
                self.tasks.spawn(async move {
                    let source = Source {
                        topic: &tier.topic,
                        partition,
                        offset,
                    };
                    let gate = Gate {
                        ownership: &ownership,
                        generation,
                    };
                    let result = attempt::process(
                        &stage,
                        &metrics,
                        source,
                        gate,
                        pending,
                        cutoff,
                        tier.pacer.as_deref().map(|p| (p, waited_ms)),
                    )
                    .await;
                    if let Ok(Finished::Done) = result {
                        // Here, not in the loop: a revoke callback (the loop waits inside it)
                        // stores what is complete.
                        ownership.with(partition, generation, |c| {
                            if let Some(next) = c.progress.complete(offset) {
                                c.next = Some(next);
                            }
                        });
                    }
                    ownership.notify();
                    Done {
                        partition,
                        generation,
                        offset,
                        result,
                    }
                });
            }
            let change = match &mut part.waiting {
                Waiting::Due(w) => w.pause_change(now, self.cap),
                Waiting::Paced(w) => w.pause_change(self.held_cap),
            };
            match change {
                Some(true) => {
                    pause.add_partition(&self.tier.topic, partition);
                }
                Some(false) => {
                    resume.add_partition(&self.tier.topic, partition);
                }
                None => {}
            }
        }
        if pause.count() > 0 {
            if let Err(e) = self.consumer.pause(&pause) {
                tracing::warn!(tier = %self.tier.name, error = %e, "pausing partitions failed");
            }
        }
        if resume.count() > 0 {
            if let Err(e) = self.consumer.resume(&resume) {
                tracing::warn!(tier = %self.tier.name, error = %e, "resuming partitions failed");
            }
        }
    }

    /// A record task finished: store the offset when the completed prefix advanced.
    fn finish(&mut self, done: Done) -> anyhow::Result<()> {
        let Done {
            partition,
            generation,
            offset,
            result,
        } = done;
        match result {
            Ok(Finished::Done) => {}
            // Revoked before it could write: nothing written, the new owner handles it.
            Ok(Finished::Revoked) => return Ok(()),
            // Shutdown while a transient produce error was being retried: the record is not
            // done, its offset is not stored, the next run attempts it again.
            Err(HopError::Abandoned(topic)) => {
                tracing::warn!(tier = %self.tier.name, partition, offset, topic, "write abandoned at shutdown");
                return Ok(());
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("record {partition}@{offset}")))
            }
        }
        let Some(part) = self.parts.get_mut(&partition) else {
            return Ok(());
        };
        if part.generation != generation {
            return Ok(());
        }
        if let Some(next) = part.waiting.complete(offset) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&self.tier.topic, partition, Offset::Offset(next))
                .context("building an offset list")?;
            if let Err(e) = self.consumer.store_offsets(&tpl) {
                // Revoked meanwhile: the new owner resumes from the committed offset.
                tracing::debug!(tier = %self.tier.name, partition, offset, error = %e, "offset not stored");
            }
        }
        Ok(())
    }

    fn apply_rebalances(&mut self) {
        for change in self.consumer.context().inbox.take() {
            match change {
                Rebalanced::Assigned(assigned) => {
                    for (partition, generation) in assigned {
                        let waiting = if self.tier.pacer.is_some() {
                            Waiting::Paced(PacedWaiting::default())
                        } else {
                            Waiting::Due(PartitionWaiting::new(LOOKAHEAD_MS))
                        };
                        self.parts.insert(
                            partition,
                            Part {
                                generation,
                                waiting,
                            },
                        );
                    }
                }
                Rebalanced::Revoked(list) => {
                    for &partition in &list {
                        if let Some(part) = self.parts.remove(&partition) {
                            tracing::info!(
                                tier = %self.tier.name,
                                partition,
                                waiting = part.waiting.waiting(),
                                in_flight = part.waiting.in_flight(),
                                "partition revoked; its unfinished records are left to the new owner"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Shutdown: pause every partition, forget records not started (their offsets were never
    /// stored), let the in-flight ones finish.
    fn stop_fetching(&mut self) {
        let mut all = TopicPartitionList::new();
        let mut dropped = 0;
        for (&partition, part) in &mut self.parts {
            dropped += part.waiting.drop_waiting();
            part.waiting.set_paused();
            all.add_partition(&self.tier.topic, partition);
        }
        if all.count() > 0 {
            if let Err(e) = self.consumer.pause(&all) {
                tracing::debug!(tier = %self.tier.name, error = %e, "pausing for shutdown failed");
            }
        }
        tracing::info!(
            tier = %self.tier.name,
            in_flight = self.tasks.len(),
            not_started = dropped,
            "retry tier stopping: finishing in-flight records"
        );
    }

    /// The earliest of: a partition's next wake (resume ahead of its head, or its head's due
    /// time), the shutdown deadline, the next tick.
    fn next_wake(&self, stop_by: Option<Instant>) -> Instant {
        let now = Instant::now();
        let mut wake = now + TICK;
        if let Some(deadline) = stop_by {
            return wake.min(deadline);
        }
        let now_ms = now_ms();
        for part in self.parts.values() {
            match &part.waiting {
                Waiting::Due(w) => {
                    if let Some(at) = w.next_wake(now_ms) {
                        let delay = Duration::from_millis(u64::try_from(at - now_ms).unwrap_or(0));
                        wake = wake.min(now + delay);
                    }
                }
                Waiting::Paced(w) => {
                    if let Some(at) = w.next_wake() {
                        wake = wake.min(at.max(now));
                    }
                }
            }
        }
        wake
    }

    fn update_gauges(&self) {
        let (mut waiting, mut paused) = (0, 0);
        for part in self.parts.values() {
            waiting += part.waiting.waiting();
            paused += usize::from(part.waiting.is_paused());
        }
        self.metrics.waiting.set(waiting as i64);
        self.metrics.inflight.set(self.tasks.len() as i64);
        self.metrics.paused.set(paused as i64);
    }
}

//! Stage B: exactly-once dedupe of `<p>.dedupe` into `<p>.dispatch`.
//!
//! Per `<p>.dedupe` partition a [`SeenSet`] holds the keys first seen within the window. A first
//! sighting is forwarded to `<p>.dispatch` (same partition number) and appended to the changelog
//! `<p>.dedupe-state` (same partition number: key = 16-byte key hash, value = 4-byte first-seen
//! unix seconds); later sightings are dropped and counted.
//!
//! Exactly-once: the dispatch records, the changelog records and the consumed offsets of a batch
//! are committed in one Kafka transaction (KIP-447 `send_offsets_to_transaction` with the
//! consumer's current group metadata). Everything runs on one dedicated thread: librdkafka's
//! transactional calls block, and rebalance callbacks run inside `poll` on that same thread, so
//! the callback can commit the open transaction before partitions are revoked.
//!
//! Restore: when a partition is assigned it is paused, and a restore thread first asks for the
//! group's committed offset of that partition with `read_committed` (the broker answers only once
//! no transaction touching it is pending, so every changelog record that matters is committed),
//! then reads the changelog partition to its end, skipping entries older than the window. The
//! partition resumes when its state is installed; other partitions keep flowing meanwhile.
//!
//! Failure handling: retriable transactional errors (and transient cluster errors: a leader or
//! coordinator moving, a broker restarting) retry the call with backoff
//! ([`hookline_common::kafka::retry_transient`]), in the transactions as in the restore;
//! abortable ones abort, drop all uncommitted state (every partition is paused, rewound to its
//! committed offset and restored); fatal ones (fenced) stop the stage with an error so the process
//! exits non-zero. An error exit always aborts the open transaction, never commits it: it may hold
//! a dispatch record whose changelog record was never sent. A watchdog ([`crate::watchdog`]) fails
//! the stage, naming the call, if a transactional call hangs past its deadline (librdkafka can hang
//! in `send_offsets_to_transaction` when the group coordinator is down).
//!
//! Startup: `<p>.dedupe-state` must have exactly as many partitions as `<p>.dedupe` (partition
//! `n` of the changelog holds the state of input partition `n`), and `<p>.dispatch` at least as
//! many; otherwise the stage refuses to start.
//!
//! Probes: ready once the group gave this member its assignment and every assigned partition is
//! restored; unready while any is restoring, after the assignment is lost, and once stopped. The
//! loop stamps a heartbeat on every turn.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use hookline_common::config::Config;
use hookline_common::event_headers::EventHeaders;
use hookline_common::kafka::{
    base_config, consumer_config, is_transient, producer_config, require_topics, retry_transient,
    TOPICS_WAIT,
};
use hookline_common::keyhash::key_hash;
use hookline_common::ops::StageProbe;
use hookline_common::produce::{classify, OwnedRecord, ProduceErrorClass, ProduceErrors};
use hookline_common::quarantine::{self, Source};
use hookline_common::recordsize::Limits;
use hookline_common::shutdown::Shutdown;
use hookline_common::topics::Topics;

use crate::metrics::DedupeMetrics;
use crate::seen::SeenSet;
use crate::watchdog::{self, Watchdog};

/// The consumer group of stage B.
pub const STAGE: &str = "deduper.dedupe";

/// Kafka's transaction timeout for stage B: how long a crashed instance's open transaction can
/// block its partitions. Below the consumer session timeout (45 s).
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout handed to each transactional call.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The seen-set's coarse time: unix seconds (at least 1: 0 marks an empty slot).
fn unix_secs() -> u32 {
    u32::try_from(hookline_common::clock::now_secs())
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Runs stage B until shutdown, on a dedicated thread.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    probe: StageProbe,
    produce_errors: ProduceErrors,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let metrics = DedupeMetrics::new(&registry).context("registering stage B metrics")?;
    check_partitions(&config).await?;
    let topics = Topics::new(&config.topics.prefix);
    let limits = Limits::fetch(&config, vec![topics.dispatch(), topics.invalid()])
        .await
        .context("reading topic size limits")?;
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let thread_stop = stop.clone();
    let watchdog = Watchdog::default();
    let thread_watchdog = watchdog.clone();
    std::thread::Builder::new()
        .name("dedupe-txn".into())
        .spawn(move || {
            let result = run_blocking(
                config,
                metrics,
                limits,
                produce_errors,
                probe,
                thread_stop,
                thread_watchdog,
            );
            let _ = done_tx.send(result);
        })
        .context("spawning the dedupe thread")?;
    // Dropping this future (e.g. stage A failed first) stops the thread too.
    let _stop_on_drop = StopOnDrop(stop.clone());
    let mut done_rx = done_rx;
    let died = || Err(anyhow::anyhow!("dedupe thread died"));
    tokio::select! {
        result = &mut done_rx => return result.unwrap_or_else(|_| died()),
        hung = watchdog.hung(watchdog::DEADLINE) => return Err(anyhow::anyhow!("{hung}")),
        _ = shutdown.wait() => {}
    }
    stop.store(true, Ordering::Relaxed);
    // The final commit is a transactional call too: a hang there fails the stop the same way.
    tokio::select! {
        result = done_rx => result.unwrap_or_else(|_| died()),
        hung = watchdog.hung(watchdog::DEADLINE) => Err(anyhow::anyhow!("{hung}")),
    }
}

/// Refuses to start unless `<p>.dedupe-state` has as many partitions as `<p>.dedupe` (the state
/// of input partition `n` lives in changelog partition `n`: with fewer, a partition could not be
/// restored nor its first sightings recorded; with more, state would be split from its input)
/// and `<p>.dispatch` at least as many (first sightings keep their partition number).
async fn check_partitions(config: &Config) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let (dedupe, state, dispatch) = (topics.dedupe(), topics.dedupe_state(), topics.dispatch());
    let found = require_topics(
        config,
        vec![dedupe.clone(), state.clone(), dispatch.clone()],
        TOPICS_WAIT,
    )
    .await?;
    partition_counts_agree(&found, &dedupe, &state, &dispatch)
}

fn partition_counts_agree(
    found: &BTreeMap<String, i32>,
    dedupe: &str,
    state: &str,
    dispatch: &str,
) -> anyhow::Result<()> {
    let count = |t: &str| found.get(t).copied().unwrap_or(0);
    let (n_dedupe, n_state, n_dispatch) = (count(dedupe), count(state), count(dispatch));
    if n_state != n_dedupe {
        bail!(
            "{state} has {n_state} partitions but {dedupe} has {n_dedupe}: the changelog must have \
             exactly as many partitions as the topic whose state it holds; recreate {state} with \
             {n_dedupe} partitions (state is rebuilt from an empty changelog: keys seen before are \
             forgotten)"
        );
    }
    if n_dispatch < n_dedupe {
        bail!(
            "{dispatch} has {n_dispatch} partitions but {dedupe} has {n_dedupe}: first sightings \
             keep their partition number, so {dispatch} needs at least {n_dedupe}"
        );
    }
    Ok(())
}

struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// State of one assigned partition.
enum PartState {
    /// Paused; the restore thread of this generation is rebuilding its seen-set.
    Restoring {
        generation: u64,
    },
    Ready(SeenSet),
}

/// A restore that finished.
struct Restored {
    partition: i32,
    generation: u64,
    seen: SeenSet,
    /// The group's committed offset of the input partition (stable), to rewind to.
    committed: Offset,
    records: u64,
    elapsed: Duration,
}

/// Everything the poll loop and the rebalance callbacks share.
struct Core {
    config: Arc<Config>,
    topics: Topics,
    producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    metrics: DedupeMetrics,
    /// Size limits of `<p>.dispatch` and `<p>.invalid`: a record that does not fit is
    /// quarantined, never sent to fail the transaction over and over.
    limits: Limits,
    produce_errors: ProduceErrors,
    parts: HashMap<i32, PartState>,
    next_generation: u64,
    restore_tx: mpsc::Sender<anyhow::Result<Restored>>,
    /// Offsets (next to read) of records consumed in the open transaction.
    batch: HashMap<i32, i64>,
    batch_records: usize,
    txn_open: bool,
    txn_started: Instant,
    /// Set by a callback that hit a fatal error; the loop returns it.
    fatal: Option<anyhow::Error>,
    /// Set once the stage is exiting with an error: the open transaction may be half-written
    /// (a dispatch record without its changelog record), so nothing may commit it any more —
    /// not even the revoke callback that runs while the consumer closes.
    failed: bool,
    /// The group gave this member an assignment (possibly empty) that it has not lost since.
    joined: bool,
    probe: StageProbe,
    watchdog: Watchdog,
    /// Partitions whose restore finished and that must be rewound and resumed by the loop.
    to_resume: Vec<(i32, Offset)>,
}

struct DedupeContext {
    core: Arc<Mutex<Core>>,
}

impl ClientContext for DedupeContext {}

impl ConsumerContext for DedupeContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut core = lock(&self.core);
            // Commit what was processed while we still own the partitions (generation valid).
            let lost = consumer.assignment_lost();
            if let Err(e) = core.commit(consumer, !lost) {
                core.fatal.get_or_insert(e);
            }
            for el in tpl.elements() {
                core.parts.remove(&el.partition());
                core.batch.remove(&el.partition());
            }
            if lost {
                core.joined = false;
            }
            core.update_ready();
            tracing::info!(
                partitions = ?tpl.elements().iter().map(|e| e.partition()).collect::<Vec<_>>(),
                lost,
                "dedupe partitions revoked"
            );
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut core = lock(&self.core);
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                core.joined = true;
                if partitions.is_empty() {
                    core.update_ready();
                    return;
                }
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!(error = %e, "pausing newly assigned partitions failed");
                }
                for p in &partitions {
                    core.start_restore(*p);
                }
                core.update_ready();
                tracing::info!(partitions = ?partitions, "dedupe partitions assigned, restoring state");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::error!(error = %e, "dedupe rebalance error"),
        }
    }
}

fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

impl Core {
    /// Ready: joined, and every assigned partition restored.
    fn update_ready(&self) {
        let restored = self
            .parts
            .values()
            .all(|s| matches!(s, PartState::Ready(_)));
        self.probe.set_ready(self.joined && restored);
    }

    fn start_restore(&mut self, partition: i32) {
        self.next_generation += 1;
        let generation = self.next_generation;
        self.parts
            .insert(partition, PartState::Restoring { generation });
        let config = self.config.clone();
        let tx = self.restore_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("dedupe-restore-{partition}"))
            .spawn(move || {
                let _ = tx.send(restore(&config, partition, generation));
            });
        if let Err(e) = spawned {
            self.fatal
                .get_or_insert(anyhow::anyhow!("spawning a restore thread: {e}"));
        }
    }

    /// Installs a finished restore if it is still current.
    fn install(&mut self, r: Restored) {
        match self.parts.get(&r.partition) {
            Some(PartState::Restoring { generation }) if *generation == r.generation => {}
            _ => return, // revoked or superseded meanwhile
        }
        self.metrics
            .emit_restored(r.partition, r.records, r.seen.len(), r.elapsed);
        self.to_resume.push((r.partition, r.committed));
        self.parts.insert(r.partition, PartState::Ready(r.seen));
        self.update_ready();
    }

    fn begin_if_needed(&mut self) -> anyhow::Result<()> {
        if !self.txn_open {
            self.guarded("begin_transaction", |p| p.begin_transaction())
                .context("beginning a transaction")?;
            self.txn_open = true;
            self.txn_started = Instant::now();
        }
        Ok(())
    }

    /// Runs a blocking transactional call, named `op`, under the watchdog.
    fn guarded<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(
            &ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
        ) -> Result<T, KafkaError>,
    ) -> Result<T, KafkaError> {
        self.watchdog.guard(op, || f(&self.producer))
    }

    /// Handles one record of `<p>.dedupe`.
    fn process(
        &mut self,
        consumer: &BaseConsumer<DedupeContext>,
        msg: &BorrowedMessage<'_>,
    ) -> anyhow::Result<()> {
        let partition = msg.partition();
        let offset = msg.offset();
        let now = unix_secs();
        if !matches!(self.parts.get(&partition), Some(PartState::Ready(_))) {
            // Fetched before the pause took effect: rewind and wait for the restore.
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(msg.topic(), partition);
            let _ = consumer.pause(&tpl);
            if let Err(e) = consumer.seek(
                msg.topic(),
                partition,
                Offset::Offset(offset),
                Duration::from_secs(5),
            ) {
                tracing::debug!(partition, offset, error = %e, "rewind of a restoring partition failed");
            }
            return Ok(());
        }
        let key = EventHeaders::seen_key(msg);
        let first = match (&key, self.parts.get_mut(&partition)) {
            (Some(k), Some(PartState::Ready(seen))) => seen.check_and_insert(key_hash(k), now),
            _ => {
                // Not written by stage A: never drop what we cannot judge.
                self.metrics.emit_unkeyed(partition, offset);
                true
            }
        };
        self.begin_if_needed()?;
        if first {
            let mut headers = OwnedHeaders::new();
            if let Some(src) = msg.headers() {
                for hd in src.iter() {
                    headers = headers.insert(Header {
                        key: hd.key,
                        value: hd.value,
                    });
                }
            }
            let dispatch = self.topics.dispatch();
            let size = hookline_common::recordsize::record_bytes(
                msg.key().map_or(0, <[u8]>::len),
                msg.payload().map_or(0, <[u8]>::len),
                hookline_common::recordsize::headers_bytes(
                    headers
                        .iter()
                        .map(|hd| (hd.key, hd.value.map_or(0, <[u8]>::len))),
                ),
            );
            let limit = self.limits.limit(&dispatch);
            let refused = if size > limit {
                Some(format!(
                    "the record is {size} bytes, the limit of {dispatch} is {limit}"
                ))
            } else {
                let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&dispatch)
                    .partition(partition)
                    .headers(headers);
                if let Some(k) = msg.key() {
                    rec = rec.key(k);
                }
                if let Some(v) = msg.payload() {
                    rec = rec.payload(v);
                }
                self.send(rec)?
                    .map(|e| format!("kafka refused the record for {dispatch}: {e}"))
            };
            if let Some(problem) = refused {
                // Not written by stage A (which admits only what fits every hop), or a limit
                // lowered since: quarantine it inside this transaction and move on.
                self.quarantine_too_large(msg, &problem)?;
            }
            if let Some(k) = &key {
                let state_topic = self.topics.dedupe_state();
                let hash = key_hash(k).to_be_bytes();
                let at = now.to_be_bytes();
                let rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&state_topic)
                    .partition(partition)
                    .key(&hash[..])
                    .payload(&at[..]);
                self.send(rec)?;
            }
            self.metrics.emit_forwarded();
        } else {
            self.metrics.emit_duplicate();
        }
        self.batch.insert(partition, offset + 1);
        self.batch_records += 1;
        Ok(())
    }

    /// Enqueues a record in the open transaction. `Ok(Some(e))`: refused for good (e.g. larger
    /// than the producer's `message.max.bytes`), the caller reroutes it.
    fn send(&self, mut rec: BaseRecord<'_, [u8], [u8]>) -> anyhow::Result<Option<KafkaError>> {
        loop {
            match self.producer.send(rec) {
                Ok(()) => return Ok(None),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, r)) => {
                    let class = classify(&e);
                    self.produce_errors.emit(r.topic, class, &e);
                    if class == ProduceErrorClass::Permanent {
                        return Ok(Some(e));
                    }
                    bail!("producing in the dedupe transaction: {e}")
                }
            }
        }
    }

    /// Writes the bounded `record_too_large` quarantine record of a `<p>.dedupe` record that
    /// cannot be forwarded, in the open transaction.
    fn quarantine_too_large(&self, msg: &BorrowedMessage<'_>, problem: &str) -> anyhow::Result<()> {
        let invalid = self.topics.invalid();
        let headers: Vec<(String, Option<Vec<u8>>)> = msg
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|hd| (hd.key.to_string(), hd.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        let record: OwnedRecord = quarantine::too_large(
            &invalid,
            msg.key(),
            msg.payload(),
            &headers,
            problem,
            Source {
                topic: msg.topic(),
                partition: msg.partition(),
                offset: msg.offset(),
            },
            self.limits.limit(&invalid),
        );
        self.metrics
            .emit_too_large(msg.partition(), msg.offset(), problem);
        let mut rec: BaseRecord<'_, [u8], [u8]> =
            BaseRecord::to(&invalid).headers(record.headers.clone());
        if let Some(k) = &record.key {
            rec = rec.key(&k[..]);
        }
        if let Some(v) = &record.value {
            rec = rec.payload(&v[..]);
        }
        if let Some(e) = self.send(rec)? {
            tracing::error!(
                partition = msg.partition(),
                offset = msg.offset(),
                error = %e,
                "record refused even as a bounded quarantine record; dropped"
            );
        }
        Ok(())
    }

    fn batch_due(&self) -> bool {
        self.txn_open
            && (self.batch_records >= self.config.dedupe.batch_max_records
                || self.txn_started.elapsed() >= self.config.dedupe.batch_interval)
    }

    /// Commits the open transaction (outputs + offsets). On an abortable error, aborts and
    /// schedules every partition for rewind + restore. `owned`: false when the assignment was
    /// lost (the commit would be fenced): abort directly.
    fn commit(
        &mut self,
        consumer: &BaseConsumer<DedupeContext>,
        owned: bool,
    ) -> anyhow::Result<()> {
        if !self.txn_open {
            return Ok(());
        }
        if self.failed {
            return self.abort_open();
        }
        if owned {
            match self.try_commit(consumer) {
                Ok(()) => {
                    self.metrics.emit_commit(self.batch_records);
                    self.txn_open = false;
                    self.batch.clear();
                    self.batch_records = 0;
                    return Ok(());
                }
                Err(TxnFailure::Fatal(e)) => return Err(e),
                Err(TxnFailure::Abortable(e)) => {
                    tracing::warn!(error = %e, "dedupe transaction failed; aborting and restoring state");
                    // A record refused as too large fails the whole transaction, and librdkafka
                    // does not say which: re-read the limits (a topic's may have been lowered),
                    // so the replayed batch quarantines what no longer fits instead of failing
                    // again and again.
                    futures::executor::block_on(self.limits.refresh_now());
                }
            }
        }
        self.abort_and_rewind(consumer)
    }

    fn try_commit(&mut self, consumer: &BaseConsumer<DedupeContext>) -> Result<(), TxnFailure> {
        let started = Instant::now();
        let result = self.try_commit_inner(consumer);
        let took = started.elapsed();
        if took > Duration::from_secs(1) {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                records = self.batch_records,
                "slow dedupe transaction commit"
            );
        } else {
            tracing::debug!(
                took_ms = took.as_millis() as u64,
                records = self.batch_records,
                "dedupe transaction committed"
            );
        }
        result
    }

    fn try_commit_inner(
        &mut self,
        consumer: &BaseConsumer<DedupeContext>,
    ) -> Result<(), TxnFailure> {
        let mut tpl = TopicPartitionList::new();
        let dedupe = self.topics.dedupe();
        for (p, o) in &self.batch {
            tpl.add_partition_offset(&dedupe, *p, Offset::Offset(*o))
                .map_err(|e| TxnFailure::Fatal(e.into()))?;
        }
        if tpl.count() > 0 {
            let cgm = consumer.group_metadata().ok_or_else(|| {
                TxnFailure::Abortable(anyhow::anyhow!("consumer has no group metadata"))
            })?;
            retry_txn("sending offsets to the dedupe transaction", || {
                self.guarded("send_offsets_to_transaction", |p| {
                    p.send_offsets_to_transaction(&tpl, &cgm, TXN_CALL_TIMEOUT)
                })
            })?;
        }
        retry_txn("committing the dedupe transaction", || {
            self.guarded("commit_transaction", |p| {
                p.commit_transaction(TXN_CALL_TIMEOUT)
            })
        })
    }

    /// Aborts the open transaction, if any, retrying transient errors. Its outputs are never
    /// visible to `read_committed` readers; its input offsets stay uncommitted.
    fn abort_open(&mut self) -> anyhow::Result<()> {
        if self.txn_open {
            retry_transient("aborting the dedupe transaction", || {
                self.guarded("abort_transaction", |p| {
                    p.abort_transaction(TXN_CALL_TIMEOUT)
                })
            })
            .map_err(|e| anyhow::anyhow!("aborting the dedupe transaction failed: {e}"))?;
            self.txn_open = false;
            self.metrics.emit_abort();
        }
        self.batch.clear();
        self.batch_records = 0;
        Ok(())
    }

    /// The stage is exiting with an error: abort the open transaction (it may hold a dispatch
    /// record whose changelog record was never sent) and make sure nothing commits afterwards.
    fn abort_on_error_exit(&mut self) {
        self.failed = true;
        let open = self.txn_open;
        match self.abort_open() {
            Ok(()) if open => {
                tracing::warn!("dedupe stage failing: open transaction aborted, nothing committed")
            }
            Ok(()) => {}
            // Not committed either way: Kafka aborts it after the transaction timeout.
            Err(e) => tracing::error!(error = %e, "dedupe stage failing: the abort failed too"),
        }
    }

    /// Aborts the open transaction and drops every partition's uncommitted state: all partitions
    /// are paused, restored, then rewound to their committed offsets and resumed.
    fn abort_and_rewind(&mut self, consumer: &BaseConsumer<DedupeContext>) -> anyhow::Result<()> {
        if self.txn_open {
            self.abort_open()?;
        } else {
            self.metrics.emit_abort();
        }
        let assigned: Vec<i32> = self.parts.keys().copied().collect();
        let mut tpl = TopicPartitionList::new();
        for p in &assigned {
            tpl.add_partition(&self.topics.dedupe(), *p);
        }
        let _ = consumer.pause(&tpl);
        for p in assigned {
            self.start_restore(p);
        }
        self.update_ready();
        Ok(())
    }
}

enum TxnFailure {
    Abortable(anyhow::Error),
    Fatal(anyhow::Error),
}

/// Retries a transactional call while librdkafka says it is retriable (or the cluster is briefly
/// unavailable), a bounded number of times (~5.5 s); classifies the rest. A call that stays
/// "retriable" longer is treated as abortable: e.g. a commit whose transaction holds a record the
/// broker refuses keeps answering retriable errors, and only the abort (which re-reads the topic
/// limits and replays the batch) gets the stage going again. The abort and the restore that follow
/// retry transient errors for as long as a broker restart takes.
fn retry_txn(op: &str, mut call: impl FnMut() -> Result<(), KafkaError>) -> Result<(), TxnFailure> {
    let mut tries = 0u64;
    loop {
        match call() {
            Ok(()) => return Ok(()),
            Err(KafkaError::Transaction(e)) if e.is_fatal() => {
                return Err(TxnFailure::Fatal(anyhow::anyhow!(
                    "fatal transaction error (fenced by a newer instance?): {e}"
                )))
            }
            Err(e) if is_transient(&e) && tries < TXN_RETRIES => {
                tries += 1;
                tracing::warn!(op, error = %e, tries, "transient error in a transactional call; retrying");
                std::thread::sleep(Duration::from_millis(100 * tries));
            }
            Err(e) => return Err(TxnFailure::Abortable(anyhow::anyhow!("{op}: {e}"))),
        }
    }
}

/// Retries of a transactional call before it counts as abortable (100 ms, 200 ms, … ≈ 5.5 s).
const TXN_RETRIES: u64 = 10;

fn transactional_id(config: &Config) -> String {
    let group = config.group_id(STAGE);
    match &config.kafka.instance_id {
        // Stable: a restarted instance fences its predecessor's open transaction at once.
        Some(id) => format!("{group}.{id}"),
        None => format!(
            "{group}.{}.{}",
            std::process::id(),
            hookline_common::clock::now_ms()
        ),
    }
}

fn run_blocking(
    config: Arc<Config>,
    metrics: DedupeMetrics,
    limits: Limits,
    produce_errors: ProduceErrors,
    probe: StageProbe,
    stop: Arc<AtomicBool>,
    watchdog: Watchdog,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let mut pcfg = producer_config(&config);
    pcfg.set("transactional.id", transactional_id(&config)).set(
        "transaction.timeout.ms",
        TRANSACTION_TIMEOUT.as_millis().to_string(),
    );
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = pcfg
        .create()
        .context("creating the transactional producer")?;
    // Armed per call: the retries of a broker that is still starting may take longer than the
    // deadline in total, but no single call may.
    retry_transient("initialising transactions", || {
        watchdog.guard("init_transactions", || {
            producer.init_transactions(TXN_CALL_TIMEOUT)
        })
    })
    .context("initialising transactions (does the broker allow them? transaction.state.log.replication.factor)")?;

    let (restore_tx, restore_rx) = mpsc::channel();
    let core = Arc::new(Mutex::new(Core {
        config: config.clone(),
        topics: topics.clone(),
        producer,
        metrics,
        limits,
        produce_errors,
        parts: HashMap::new(),
        next_generation: 0,
        restore_tx,
        batch: HashMap::new(),
        batch_records: 0,
        txn_open: false,
        txn_started: Instant::now(),
        fatal: None,
        failed: false,
        joined: false,
        probe: probe.clone(),
        watchdog,
        to_resume: Vec::new(),
    }));
    let mut ccfg = consumer_config(&config, STAGE);
    // Offsets are committed inside the transactions, never by the consumer.
    ccfg.set("enable.auto.commit", "false");
    let consumer: BaseConsumer<DedupeContext> = ccfg
        .create_with_context(DedupeContext { core: core.clone() })
        .context("creating the stage B consumer")?;
    let dedupe_topic = topics.dedupe();
    consumer
        .subscribe(&[&dedupe_topic])
        .with_context(|| format!("subscribing to {dedupe_topic}"))?;
    tracing::info!(topic = %dedupe_topic, window = ?config.dedupe.window, "dedupe stage started");

    let mut last_expire = Instant::now();
    let result = (|| -> anyhow::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            probe.beat();
            // Install finished restores, then rewind and resume those partitions.
            while let Ok(r) = restore_rx.try_recv() {
                let r = r?;
                lock(&core).install(r);
            }
            let to_resume = std::mem::take(&mut lock(&core).to_resume);
            for (p, committed) in to_resume {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&dedupe_topic, p);
                let target = match committed {
                    Offset::Offset(o) => Offset::Offset(o),
                    _ => Offset::Beginning,
                };
                // Paused already; seek (after pause) drops anything fetched past the commit. If
                // it fails we cannot know where the fetch position is: stop rather than skip.
                consumer
                    .seek(&dedupe_topic, p, target, Duration::from_secs(10))
                    .with_context(|| {
                        format!("rewinding dedupe partition {p} to its committed offset before resuming")
                    })?;
                consumer
                    .resume(&tpl)
                    .with_context(|| format!("resuming partition {p}"))?;
            }
            let polled = consumer.poll(Duration::from_millis(20));
            let mut core = lock(&core);
            if let Some(e) = core.fatal.take() {
                return Err(e);
            }
            match polled {
                Some(Ok(msg)) => core.process(&consumer, &msg)?,
                Some(Err(e)) => tracing::warn!(error = %e, "consumer error on the dedupe topic"),
                None => {}
            }
            if core.batch_due() {
                core.commit(&consumer, true)?;
            }
            if last_expire.elapsed() >= Duration::from_secs(1) {
                last_expire = Instant::now();
                let now = unix_secs();
                let (mut keys, mut bytes) = (0, 0);
                for state in core.parts.values_mut() {
                    if let PartState::Ready(seen) = state {
                        seen.expire(now);
                        keys += seen.len();
                        bytes += seen.bytes();
                    }
                }
                core.metrics.set_seen(keys, bytes);
            }
        }
        let mut core = lock(&core);
        core.commit(&consumer, true)
    })();
    probe.stopped();
    if result.is_err() {
        lock(&core).abort_on_error_exit();
    }
    // Leave the group cleanly; the revoke callback finds nothing left to commit (after an error,
    // it may not commit at all). With the cluster unreachable the close can block for good:
    // bounded, on a thread of its own.
    hookline_common::closing::close_blocking("the stage B consumer", move || {
        consumer.unsubscribe();
        drop(consumer);
    });
    stop.store(true, Ordering::Relaxed);
    if result.is_ok() {
        tracing::info!("dedupe stage stopped");
    }
    result
}

/// Rebuilds the seen-set of `partition` from the changelog. See the module docs for why reading
/// the committed offset first makes the end of the changelog the right place to stop.
fn restore(config: &Config, partition: i32, generation: u64) -> anyhow::Result<Restored> {
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
    let consumer: BaseConsumer = c.create().context("creating the restore consumer")?;

    let mut input = TopicPartitionList::new();
    input.add_partition(&topics.dedupe(), partition);
    // Not stable yet (a transaction is pending: `UnstableOffsetCommit`), or the coordinator is
    // moving: transient, retried.
    let committed = retry_transient(
        &format!("committed offset of dedupe partition {partition}"),
        || consumer.committed_offsets(input.clone(), Duration::from_secs(15)),
    )
    .with_context(|| format!("reading committed offsets of dedupe partition {partition}"))?
    .find_partition(&topics.dedupe(), partition)
    .map(|e| e.offset())
    .unwrap_or(Offset::Invalid);

    let window = config.dedupe.window.as_secs().max(1);
    let mut seen = SeenSet::new(window);
    let state_topic = topics.dedupe_state();
    let (low, high) = retry_transient(&format!("watermarks of {state_topic}[{partition}]"), || {
        consumer.fetch_watermarks(&state_topic, partition, Duration::from_secs(15))
    })
    .with_context(|| format!("watermarks of {state_topic}[{partition}]"))?;
    let mut records = 0u64;
    if high > low {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&state_topic, partition, Offset::Beginning)
            .context("restore assignment")?;
        consumer.assign(&tpl).context("assigning the changelog")?;
        let now = unix_secs();
        let deadline = Instant::now() + Duration::from_secs(600);
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
                Some(Err(KafkaError::PartitionEOF(_))) => break,
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
        records,
        elapsed: started.elapsed(),
    })
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

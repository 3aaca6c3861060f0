//! Stage B: exactly-once dedupe of `<p>.dedupe` (and, with `dedupe.direct`, `<p>.events`) into
//! `<p>.dispatch`.
//!
//! Per `<p>.dedupe` partition a [`SeenSet`] holds the keys first seen within the window. A first
//! sighting is forwarded to `<p>.dispatch` (same partition number) and appended to the changelog
//! `<p>.dedupe-state` (same partition number: key = 16-byte key hash, value = 4-byte first-seen
//! unix seconds); later sightings are dropped and counted.
//!
//! Direct (`dedupe.direct`, see [`Direct`]): events partition `n` is read with dedupe partition
//! `n` and judged by stage A's rules; an event whose key hashes to `n` meets seen-set `n` at once,
//! any other is forwarded to `<p>.dedupe` on its key's partition, an invalid record quarantined —
//! each in the open transaction, whose offsets then cover both topics. The restore reads the
//! committed offsets of both partitions (stable), since a transaction writing changelog `n` may
//! have consumed either.
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
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use hookline_common::config::Config;
use hookline_common::contract::envelope::Validator;
use hookline_common::contract::event_headers::EventHeaders;
use hookline_common::contract::headers as h;
use hookline_common::contract::keyhash::key_hash;
use hookline_common::contract::quarantine::{self, Source};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::{classify, OwnedRecord, ProduceErrorClass, ProduceErrors};
use hookline_common::kafka::recordsize::Limits;
use hookline_common::kafka::{
    pipeline_consumer_config, producer_config, require_topics, TOPICS_WAIT,
};
use hookline_common::runtime::ops::StageProbe;
use hookline_common::runtime::shutdown::Shutdown;
use hookline_common::runtime::traces::{self, Kind, Span, TRACEPARENT, TRACE_HEADER};

use crate::metrics::{DedupeMetrics, ValidateMetrics};
use crate::rebalance::DedupeContext;
use crate::restore::{restore, Restored};
use crate::txn::{transactional_id, transactional_producer, TxnProducer};
use crate::validate::{downstream_topics, Admission, Admitted};

pub use crate::restore::{restore_for_bench, RestoreStats};
use crate::seen::SeenSet;
use crate::watchdog::{self, Watchdog};

/// The consumer group of stage B.
pub const STAGE: &str = "deduper.dedupe";

/// Kafka's transaction timeout for stage B: how long a crashed instance's open transaction can
/// block its partitions. Below the consumer session timeout (45 s).
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout handed to each transactional call.
pub(crate) const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The dedupe span of one event (nothing while tracing is off): a child of the producer's
/// `traceparent`, or the root of a new trace; `kept` or `dropped`. Returns the context a first
/// sighting's dispatch record carries (`hookline-trace`) for its attempts.
fn dedupe_span(parent: Option<&str>, event_id: Option<&str>, first: bool) -> Option<String> {
    if !traces::enabled() {
        return None;
    }
    let mut span = Span::start("hookline.dedupe", Kind::Consumer, parent, None);
    if let Some(id) = event_id {
        span.str("hookline.event.id", id);
    }
    span.str(
        "hookline.dedupe.outcome",
        if first { "kept" } else { "dropped" },
    );
    span.traceparent()
}

/// A header of a record being built, as text.
fn owned_header<'a>(headers: &'a OwnedHeaders, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|hd| hd.key == name)
        .and_then(|hd| hd.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// The seen-set's coarse time: unix seconds (at least 1: 0 marks an empty slot).
pub(crate) fn unix_secs() -> u32 {
    u32::try_from(hookline_common::runtime::clock::now_secs())
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
    // Reading `<p>.events` itself, stage B admits events by size the way stage A does: against
    // every topic an event may travel to.
    let limited = if config.dedupe.direct {
        downstream_topics(&config, &topics)
    } else {
        vec![topics.dispatch(), topics.invalid()]
    };
    let limits = Arc::new(
        Limits::fetch(&config, limited)
            .await
            .context("reading topic size limits")?,
    );
    let validate_metrics = if config.dedupe.direct {
        Some(ValidateMetrics::new(&registry).context("registering validation metrics")?)
    } else {
        None
    };
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
                validate_metrics,
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
///
/// Reading `<p>.events` itself (`dedupe.direct`), it also needs `<p>.events` and `<p>.dedupe` to
/// have `topics.partitions` partitions: events partition `n` is read by the owner of dedupe
/// partition `n`, and an event is already in place when its key hashes to `n`.
async fn check_partitions(config: &Config) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let (dedupe, state, dispatch) = (topics.dedupe(), topics.dedupe_state(), topics.dispatch());
    let mut wanted = vec![dedupe.clone(), state.clone(), dispatch.clone()];
    if config.dedupe.direct {
        wanted.push(topics.events());
    }
    let found = require_topics(config, wanted, TOPICS_WAIT).await?;
    partition_counts_agree(&found, &dedupe, &state, &dispatch)?;
    if config.dedupe.direct {
        direct_partitions_agree(&found, &topics.events(), &dedupe, config.topics.partitions)?;
    }
    Ok(())
}

fn direct_partitions_agree(
    found: &BTreeMap<String, i32>,
    events: &str,
    dedupe: &str,
    configured: i32,
) -> anyhow::Result<()> {
    let count = |t: &str| found.get(t).copied().unwrap_or(0);
    let (n_events, n_dedupe) = (count(events), count(dedupe));
    crate::validate::dedupe_matches_config(dedupe, n_dedupe, configured)?;
    if n_events != n_dedupe {
        bail!(
            "{events} has {n_events} partitions but {dedupe} has {n_dedupe}: with \
             dedupe.direct = true stage B reads {events} partition n with {dedupe} partition n, \
             so they must have as many; set dedupe.direct = false (stage A re-partitions every \
             event) or give {events} {n_dedupe} partitions"
        );
    }
    Ok(())
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
pub(crate) enum PartState {
    /// Paused; the restore thread of this generation is rebuilding its seen-set.
    Restoring {
        generation: u64,
    },
    Ready(SeenSet),
}

/// The two topics stage B may read: partition `n` of each belongs to seen-set `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Input {
    Dedupe,
    Events,
}

/// Stage B reading `<p>.events` itself (`dedupe.direct`): the hop through stage A and
/// `<p>.dedupe` skipped for every event already on the partition its dedupe key hashes to.
///
/// Events partition `n` goes with dedupe partition `n`, whatever the group's assignor does: it is
/// read by a second consumer, assigned by hand exactly while this member owns dedupe partition
/// `n` and its seen-set is restored, from the position the restore read (the group's committed
/// offset of events `n`, committed in stage B's transactions with dedupe `n`'s). That consumer
/// never joins the group and never commits.
pub(crate) struct Direct {
    pub(crate) admission: Admission,
    pub(crate) reader: Arc<BaseConsumer>,
    /// Events partitions assigned to the reader → offset of the next record to process (a
    /// record below it was fetched before a rewind: skipped).
    pub(crate) next: HashMap<i32, i64>,
}

/// Everything the poll loop and the rebalance callbacks share.
pub(crate) struct Core {
    pub(crate) config: Arc<Config>,
    pub(crate) topics: Topics,
    pub(crate) producer: TxnProducer,
    /// What the producer was made from (its transactional id included), to replace it.
    pub(crate) producer_config: rdkafka::config::ClientConfig,
    /// When the producer was replaced, within the recovery window.
    pub(crate) recoveries: Vec<Instant>,
    pub(crate) metrics: DedupeMetrics,
    /// Size limits of `<p>.dispatch` and `<p>.invalid` (and, reading `<p>.events`, of every topic
    /// an event may travel to): a record that does not fit is quarantined, never sent to fail the
    /// transaction over and over.
    pub(crate) limits: Arc<Limits>,
    pub(crate) produce_errors: ProduceErrors,
    pub(crate) parts: HashMap<i32, PartState>,
    pub(crate) next_generation: u64,
    pub(crate) restore_tx: mpsc::Sender<anyhow::Result<Restored>>,
    /// Offsets (next to read) of records consumed in the open transaction, per input partition.
    pub(crate) batch: HashMap<(Input, i32), i64>,
    /// Reading `<p>.events` itself (`dedupe.direct`).
    pub(crate) direct: Option<Direct>,
    pub(crate) batch_records: usize,
    pub(crate) txn_open: bool,
    pub(crate) txn_started: Instant,
    /// Set by a callback that hit a fatal error; the loop returns it.
    pub(crate) fatal: Option<anyhow::Error>,
    /// Set once the stage is exiting with an error: the open transaction may be half-written
    /// (a dispatch record without its changelog record), so nothing may commit it any more —
    /// not even the revoke callback that runs while the consumer closes.
    pub(crate) failed: bool,
    /// The open transaction is in librdkafka's abortable-error state (a record of it was
    /// refused, e.g. larger than a topic's lowered limit): later sends in it fail with
    /// `State`. The batch is due at once; its commit fails and aborts, rewinds and replays it.
    pub(crate) doomed: bool,
    /// The group gave this member an assignment (possibly empty) that it has not lost since.
    pub(crate) joined: bool,
    pub(crate) probe: StageProbe,
    pub(crate) watchdog: Watchdog,
    /// Partitions whose restore finished and that must be rewound and resumed by the loop.
    pub(crate) to_resume: Vec<(i32, Offset)>,
}

pub(crate) fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

impl Core {
    /// Ready: joined, and every assigned partition restored.
    pub(crate) fn update_ready(&self) {
        let restored = self
            .parts
            .values()
            .all(|s| matches!(s, PartState::Ready(_)));
        self.probe.set_ready(self.joined && restored);
    }

    pub(crate) fn start_restore(&mut self, partition: i32) {
        self.events_detach(partition);
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
        if let Some(at) = r.events_committed {
            self.events_attach(r.partition, at);
        }
        self.update_ready();
    }

    /// Starts reading events partition `partition` at `at` (its seen-set is restored).
    fn events_attach(&mut self, partition: i32, at: Offset) {
        // Never two positions for one partition: start over from `at`.
        self.events_detach(partition);
        let Some(direct) = &mut self.direct else {
            return;
        };
        let events = self.topics.events();
        let mut tpl = TopicPartitionList::new();
        let added = tpl
            .add_partition_offset(&events, partition, at)
            .and_then(|()| direct.reader.incremental_assign(&tpl));
        match added {
            Ok(()) => {
                let next = match at {
                    Offset::Offset(o) => o,
                    _ => 0,
                };
                direct.next.insert(partition, next);
                tracing::debug!(partition, offset = ?at, "reading events partition");
            }
            Err(e) => {
                self.fatal.get_or_insert(anyhow::anyhow!(
                    "assigning {events} partition {partition} at {at:?} to the events reader: {e}"
                ));
            }
        }
    }

    /// Stops reading events partition `partition` (its seen-set is revoked or being restored).
    pub(crate) fn events_detach(&mut self, partition: i32) {
        let Some(direct) = &mut self.direct else {
            return;
        };
        if direct.next.remove(&partition).is_none() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topics.events(), partition);
        if let Err(e) = direct.reader.incremental_unassign(&tpl) {
            self.fatal.get_or_insert(anyhow::anyhow!(
                "unassigning events partition {partition} from the events reader: {e}"
            ));
        }
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
        let trace = dedupe_span(h::get(msg, TRACEPARENT), h::get(msg, h::EVENT_ID), first);
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
            if let Some(t) = &trace {
                headers = headers.insert(Header {
                    key: TRACE_HEADER,
                    value: Some(t.as_bytes()),
                });
            }
            let hash = key.as_deref().map(key_hash);
            self.forward_first(msg, hash, now, msg.key(), msg.payload(), headers)?;
        } else {
            self.metrics.emit_duplicate();
        }
        self.batch.insert((Input::Dedupe, partition), offset + 1);
        self.batch_records += 1;
        Ok(())
    }

    /// Handles one record of `<p>.events` (`dedupe.direct`): judged as stage A would; an event on
    /// the partition its key hashes to is deduped here, any other is forwarded to `<p>.dedupe`,
    /// an invalid record quarantined, all in the open transaction.
    fn process_event(&mut self, msg: &BorrowedMessage<'_>) -> anyhow::Result<()> {
        let (partition, offset) = (msg.partition(), msg.offset());
        let Some(direct) = &self.direct else {
            return Ok(());
        };
        // Fetched before a rewind or a revoke: its partition is read again from the position the
        // restore finds, or by its new owner.
        let current = direct
            .next
            .get(&partition)
            .is_some_and(|next| offset >= *next);
        if !current || !matches!(self.parts.get(&partition), Some(PartState::Ready(_))) {
            return Ok(());
        }
        let admitted = direct.admission.judge(msg);
        self.begin_if_needed()?;
        match admitted {
            Admitted::Valid { record, hash } if record.partition == Some(partition) => {
                let now = unix_secs();
                let first = match self.parts.get_mut(&partition) {
                    Some(PartState::Ready(seen)) => seen.check_and_insert(hash, now),
                    _ => true,
                };
                let trace = dedupe_span(
                    h::get(msg, TRACEPARENT),
                    owned_header(&record.headers, h::EVENT_ID),
                    first,
                );
                if first {
                    let headers = match &trace {
                        Some(t) => record.headers.insert(Header {
                            key: TRACE_HEADER,
                            value: Some(t.as_bytes()),
                        }),
                        None => record.headers,
                    };
                    self.forward_first(
                        msg,
                        Some(hash),
                        now,
                        record.key.as_deref(),
                        record.value.as_deref(),
                        headers,
                    )?;
                } else {
                    self.metrics.emit_duplicate();
                }
            }
            Admitted::Valid { record, .. } => {
                // On another partition than its key's: its seen-set is dedupe partition
                // `record.partition`'s, reached through `<p>.dedupe`.
                if let Some(e) = self.send_owned(&record)? {
                    let problem = format!("kafka refused the record for {}: {e}", record.topic);
                    self.quarantine_too_large(msg, &problem)?;
                }
                self.metrics.emit_rekeyed();
            }
            Admitted::Invalid(record) => {
                if let Some(e) = self.send_owned(&record)? {
                    if let Some(direct) = &self.direct {
                        direct.admission.metrics.emit_dropped(partition, offset, &e);
                    }
                }
            }
        }
        if let Some(direct) = &mut self.direct {
            direct.next.insert(partition, offset + 1);
        }
        self.batch.insert((Input::Events, partition), offset + 1);
        self.batch_records += 1;
        Ok(())
    }

    /// Writes a first sighting to `<p>.dispatch` (same partition as `msg`) and, when it has a
    /// key, its changelog record, in the open transaction. A record that does not fit is
    /// quarantined as `record_too_large` instead.
    fn forward_first(
        &mut self,
        msg: &BorrowedMessage<'_>,
        hash: Option<u128>,
        now: u32,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: OwnedHeaders,
    ) -> anyhow::Result<()> {
        let partition = msg.partition();
        let dispatch = self.topics.dispatch();
        let size = hookline_common::kafka::recordsize::record_bytes(
            key.map_or(0, <[u8]>::len),
            payload.map_or(0, <[u8]>::len),
            hookline_common::kafka::recordsize::headers_bytes(
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
            if let Some(k) = key {
                rec = rec.key(k);
            }
            if let Some(v) = payload {
                rec = rec.payload(v);
            }
            self.send(rec)?
                .map(|e| format!("kafka refused the record for {dispatch}: {e}"))
        };
        if let Some(problem) = refused {
            // Not admitted by stage A's rules (which admit only what fits every hop), or a
            // limit lowered since: quarantine it inside this transaction and move on.
            self.quarantine_too_large(msg, &problem)?;
        }
        if let Some(hash) = hash {
            let state_topic = self.topics.dedupe_state();
            let hash = hash.to_be_bytes();
            let at = now.to_be_bytes();
            let rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&state_topic)
                .partition(partition)
                .key(&hash[..])
                .payload(&at[..]);
            self.send(rec)?;
        }
        self.metrics.emit_forwarded();
        Ok(())
    }

    /// Enqueues `record` in the open transaction (see [`Core::send`]).
    fn send_owned(&mut self, record: &OwnedRecord) -> anyhow::Result<Option<KafkaError>> {
        self.send(record.base_record())
    }

    /// Enqueues a record in the open transaction. `Ok(Some(e))`: refused for good (e.g. larger
    /// than the producer's `message.max.bytes`), the caller reroutes it.
    fn send(&mut self, mut rec: BaseRecord<'_, [u8], [u8]>) -> anyhow::Result<Option<KafkaError>> {
        loop {
            match self.producer.send(rec) {
                Ok(()) => return Ok(None),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::State), _))
                    if self.txn_open =>
                {
                    // The transaction already failed (a record of it was refused); nothing
                    // more can join it. Not this record's fault: the abort replays it.
                    if !self.doomed {
                        tracing::warn!(
                            "the dedupe transaction is in an abortable error; aborting and replaying its batch"
                        );
                    }
                    self.doomed = true;
                    return Ok(None);
                }
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
    fn quarantine_too_large(
        &mut self,
        msg: &BorrowedMessage<'_>,
        problem: &str,
    ) -> anyhow::Result<()> {
        let invalid = self.topics.invalid();
        let headers = quarantine::header_pairs(msg.headers());
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
        if let Some(e) = self.send_owned(&record)? {
            tracing::error!(
                partition = msg.partition(),
                offset = msg.offset(),
                error = %e,
                "record refused even as a bounded quarantine record; dropped"
            );
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn run_blocking(
    config: Arc<Config>,
    metrics: DedupeMetrics,
    validate_metrics: Option<ValidateMetrics>,
    limits: Arc<Limits>,
    produce_errors: ProduceErrors,
    probe: StageProbe,
    stop: Arc<AtomicBool>,
    watchdog: Watchdog,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let mut pcfg = producer_config(&config);
    // One transactional id for the process's life: a replacement producer fences its predecessor.
    pcfg.set("transactional.id", transactional_id(&config)).set(
        "transaction.timeout.ms",
        TRANSACTION_TIMEOUT.as_millis().to_string(),
    );
    // The commit is the acknowledgement (it waits for every record of the transaction), so
    // successful delivery reports would only wake the polling thread to be thrown away.
    pcfg.set("delivery.report.only.error", "true");
    let producer = transactional_producer(&pcfg, &watchdog)?;

    let direct = match validate_metrics {
        Some(metrics) => Some(direct_reader(&config, &topics, &limits, metrics)?),
        None => None,
    };
    let reader = direct.as_ref().map(|d| d.reader.clone());
    let (restore_tx, restore_rx) = mpsc::channel();
    let core = Arc::new(Mutex::new(Core {
        config: config.clone(),
        topics: topics.clone(),
        producer,
        producer_config: pcfg,
        recoveries: Vec::new(),
        metrics,
        limits,
        produce_errors,
        parts: HashMap::new(),
        next_generation: 0,
        restore_tx,
        batch: HashMap::new(),
        direct,
        batch_records: 0,
        txn_open: false,
        txn_started: Instant::now(),
        fatal: None,
        failed: false,
        doomed: false,
        joined: false,
        probe: probe.clone(),
        watchdog,
        to_resume: Vec::new(),
    }));
    let mut ccfg = pipeline_consumer_config(&config, STAGE);
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
    // Restored partitions to rewind and resume.
    let mut unstarted: HashMap<i32, Unstarted> = HashMap::new();
    let result = (|| -> anyhow::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            probe.beat();
            // Install finished restores, then rewind and resume those partitions.
            while let Ok(r) = restore_rx.try_recv() {
                let r = r?;
                lock(&core).install(r);
            }
            // Reading `<p>.events` too: the group consumer (forwarded events, rebalances) is only
            // looked at, the events reader waited on.
            let (to_resume, reading_events) = {
                let mut core = lock(&core);
                let reading = core.direct.as_ref().is_some_and(|d| !d.next.is_empty());
                (std::mem::take(&mut core.to_resume), reading)
            };
            for (p, committed) in to_resume {
                unstarted.insert(
                    p,
                    Unstarted {
                        committed,
                        since: Instant::now(),
                        logged: false,
                        reassigned: false,
                    },
                );
            }
            if !unstarted.is_empty() {
                resume_restored(&consumer, &core, &dedupe_topic, &mut unstarted)?;
            }
            let mut idle = true;
            for i in 0..BURST {
                let wait = if i == 0 && !reading_events { 20 } else { 0 };
                let polled = consumer.poll(Duration::from_millis(wait));
                let mut core = lock(&core);
                if let Some(e) = core.fatal.take() {
                    return Err(e);
                }
                match polled {
                    Some(Ok(msg)) => core.process(&consumer, &msg)?,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "consumer error on the dedupe topic");
                        break;
                    }
                    None => break,
                }
                idle = false;
                if core.batch_due() {
                    break;
                }
            }
            let mut core = lock(&core);
            if let Some(e) = core.fatal.take() {
                return Err(e);
            }
            if let (Some(reader), true) = (&reader, reading_events) {
                for i in 0..BURST {
                    let wait = Duration::from_millis(if i == 0 && idle { 10 } else { 0 });
                    match reader.poll(wait) {
                        Some(Ok(msg)) => core.process_event(&msg)?,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "consumer error on the events topic");
                            break;
                        }
                        None => break,
                    }
                    if core.batch_due() || core.fatal.is_some() {
                        break;
                    }
                }
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
    hookline_common::kafka::closing::close_blocking("the stage B consumer", move || {
        consumer.unsubscribe();
        drop(consumer);
    });
    drop(reader);
    let direct = lock(&core).direct.take();
    if let Some(direct) = direct {
        hookline_common::kafka::closing::close_blocking("the events reader", move || drop(direct));
    }
    stop.store(true, Ordering::Relaxed);
    if result.is_ok() {
        tracing::info!("dedupe stage stopped");
    }
    result
}

/// Records handled per loop turn at most from each consumer (the group's, the events reader)
/// before the other is looked at.
const BURST: usize = 500;

/// The events reader and stage A's judgement, for `dedupe.direct`.
fn direct_reader(
    config: &Config,
    topics: &Topics,
    limits: &Arc<Limits>,
    metrics: ValidateMetrics,
) -> anyhow::Result<Direct> {
    let mut rcfg = pipeline_consumer_config(config, STAGE);
    // Assigned by hand, never subscribed nor committing: a group id of its own (librdkafka wants
    // one for assignments) keeps it apart from stage B's group.
    rcfg.set(
        "group.id",
        format!("{}.events-reader", config.group_id(STAGE)),
    )
    .set("enable.auto.commit", "false")
    .remove("group.instance.id");
    let reader: BaseConsumer = rcfg.create().context("creating the events reader")?;
    let admission = Admission {
        validator: Validator::new(&config.input, &config.dedupe.keys),
        limits: limits.clone(),
        downstream: downstream_topics(config, topics),
        max_key_bytes: config.input.max_key_bytes,
        dedupe_topic: topics.dedupe(),
        invalid_topic: topics.invalid(),
        events_topic: topics.events(),
        partitions: config.topics.partitions,
        metrics,
    };
    Ok(Direct {
        admission,
        reader: Arc::new(reader),
        next: HashMap::new(),
    })
}

/// How long a restored partition may wait for librdkafka to start fetching it before stage B
/// assigns it again itself, at the committed offset the restore read.
const REASSIGN_AFTER: Duration = Duration::from_secs(10);

/// How long a restored partition may wait for librdkafka to start fetching it before stage B
/// stops (the orchestrator's restart then gets a fresh assignment): the last resort, after
/// [`REASSIGN_AFTER`]'s re-assignment did not start it either.
const FETCH_START_LIMIT: Duration = Duration::from_secs(120);

/// A restored partition not rewound and resumed yet.
struct Unstarted {
    /// The group's committed offset read by the restore.
    committed: Offset,
    /// When the restore was installed.
    since: Instant,
    /// Whether the wait for its fetcher was logged.
    logged: bool,
    /// Whether stage B assigned it again itself ([`REASSIGN_AFTER`]).
    reassigned: bool,
}

/// Rewinds each restored partition of `unstarted` to its committed offset and resumes it.
///
/// A partition whose fetcher librdkafka has not started yet refuses the rewind (`__STATE`): it is
/// still fetching the partition's committed offset, e.g. from a group coordinator that has just
/// moved (the restore reads the changelog on a consumer of its own and can finish first). Such a
/// partition stays paused and is tried again on the next turn; the fetcher will start at the
/// committed offset, where the rewind points. One still unstarted after [`REASSIGN_AFTER`] is
/// assigned again by stage B at the committed offset the restore read (librdkafka's query for it
/// may never come back). Revoked partitions are dropped. Any other error, or
/// a partition still unstarted after [`FETCH_START_LIMIT`], stops the stage: without the rewind it
/// cannot know where the fetch position is, and it never skips.
fn resume_restored(
    consumer: &BaseConsumer<DedupeContext>,
    core: &Mutex<Core>,
    topic: &str,
    unstarted: &mut HashMap<i32, Unstarted>,
) -> anyhow::Result<()> {
    let ready: Vec<i32> = {
        let core = lock(core);
        unstarted
            .keys()
            .copied()
            .filter(|p| matches!(core.parts.get(p), Some(PartState::Ready(_))))
            .collect()
    };
    unstarted.retain(|p, _| ready.contains(p));
    for p in ready {
        let Some(u) = unstarted.get_mut(&p) else {
            continue;
        };
        let target = match u.committed {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        // Paused already; seek (after pause) drops anything fetched past the commit.
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, target)
            .with_context(|| format!("rewinding dedupe partition {p}: offset {target:?}"))?;
        let sought = consumer
            .seek_partitions(tpl, Duration::from_secs(10))
            .with_context(|| {
                format!("rewinding dedupe partition {p} to its committed offset before resuming")
            })?;
        let error = sought.elements().first().and_then(|e| e.error().err());
        match error {
            None => {}
            Some(KafkaError::OffsetFetch(RDKafkaErrorCode::State))
                if u.since.elapsed() < FETCH_START_LIMIT =>
            {
                if !u.logged {
                    u.logged = true;
                    tracing::info!(
                        partition = p,
                        "restored dedupe partition not fetched yet (its committed offset is still \
                         being fetched); rewinding and resuming it once it is"
                    );
                }
                if u.reassigned || u.since.elapsed() < REASSIGN_AFTER {
                    continue;
                }
                // librdkafka's query for the committed offset never came back: start the
                // fetcher at the offset the restore read (the same place the rewind points).
                u.reassigned = true;
                let waited_ms = u.since.elapsed().as_millis() as u64;
                match hookline_common::kafka::rebalance::reassign_at(consumer, topic, p, target) {
                    Ok(()) => {
                        tracing::warn!(
                            partition = p,
                            offset = ?target,
                            waited_ms,
                            "restored dedupe partition still not fetched: librdkafka never got \
                             its committed offset; assigned it again at the committed offset the \
                             restore read"
                        );
                        unstarted.remove(&p);
                    }
                    Err(e) => tracing::warn!(
                        partition = p,
                        error = %e,
                        "assigning a restored dedupe partition again failed; waiting for \
                         librdkafka to start it"
                    ),
                }
                continue;
            }
            Some(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "rewinding dedupe partition {p} to its committed offset before resuming \
                         ({:.0}s after its restore)",
                        u.since.elapsed().as_secs_f64()
                    )
                })
            }
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, p);
        consumer
            .resume(&tpl)
            .with_context(|| format!("resuming partition {p}"))?;
        unstarted.remove(&p);
    }
    Ok(())
}

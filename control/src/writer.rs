//! Writes to `<p>.endpoints` with optimistic concurrency that holds across processes, without a
//! database: every writer uses the same transactional id, so a writer's `init_transactions`
//! fences whichever writer initialised before it. A process's writer
//!
//! 1. initialises its transactional producer (fencing every writer initialised before) and
//!    reads the registry up to the topic's end (watermarks fetched *after* initialising) —
//!    once, then again only after a failed transaction;
//! 2. decides each write on that state plus its own writes not read back yet (the overlay);
//! 3. writes the records (with their operational events on `<p>.operational`) in a
//!    transaction shared by every write waiting at that moment (group commit), and commits.
//!
//! A commit succeeds only if no other writer initialised since step 1 — and any writer that
//! committed before that is in what step 1 read, while every commit since is this producer's
//! own (in the overlay until read back). So a decision is never made on a stale state: two
//! racing writers never both succeed, and the loser's records are aborted (invisible to the
//! `read_committed` readers, and compaction-proof). A fenced writer initialises anew, reads,
//! and decides again (a few times); the expected-version check then answers the caller. A
//! write returns once its transaction committed and this process's registry has read it.
//!
//! Where the time went before (issue 35): one fresh producer per write, so every write paid
//! `init_transactions` (~55 ms) and, right after the previous commit, Kafka's "concurrent
//! transactions" answer until that commit's markers were written (up to ~0.5 s); writes of one
//! process were serialised end to end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use tokio::sync::watch;

use hookline_common::config::Config;
use hookline_common::contract::delivery::now_ms;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::producer_config;

use crate::endpoint::Endpoint;
use crate::operational::OperationalEvent;
use crate::registry::Registry;
use crate::tail::{ends_of, Positions};

const TXN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a write waits for the registry to read up to the topic's end, or its own record.
const READ_WAIT: Duration = Duration::from_secs(15);
/// Tries of one write when it is fenced by a concurrent writer or Kafka errs.
const TRIES: u32 = 5;

/// What a write decided for one endpoint.
pub(crate) enum Change {
    /// Nothing to write (the state already is what was asked).
    Nothing,
    Put(Box<Endpoint>),
    Delete,
}

/// What a write decided: the records (in order) and the operational events.
pub(crate) type Decision = (Vec<(String, Change)>, Vec<OperationalEvent>);

/// The state a write decides on: the registry as read, plus this writer's own writes not read
/// back yet.
pub(crate) type View<'a> = &'a dyn Fn(&str) -> Option<&'a Endpoint>;

/// The writer of this process, behind the registry's mutex.
pub(crate) struct Writer {
    transactional_id: String,
    /// Initialised, and the registry read to its end since (`None`: do that first).
    producer: Option<Arc<FutureProducer>>,
    /// Endpoints this producer wrote (or is writing) that the registry may not have read yet.
    overlay: BTreeMap<String, Pending>,
    /// The transaction writes are joining now.
    open: Option<Txn>,
}

struct Pending {
    value: Option<Endpoint>,
    /// Where its record is, once committed (`None`: in the open transaction).
    at: Option<(i32, i64)>,
}

struct Txn {
    /// The endpoint records, in order.
    records: Vec<(String, DeliveryFuture)>,
    events: Vec<DeliveryFuture>,
    /// A record could not be queued: the transaction is aborted.
    failed: Option<String>,
    done: watch::Sender<Option<Result<Positions, String>>>,
}

impl Writer {
    pub(crate) fn new(config: &Config) -> Writer {
        Writer {
            transactional_id: config.group_id("control.endpoints-writer"),
            producer: None,
            overlay: BTreeMap::new(),
            open: None,
        }
    }

    /// Forgets the producer and what it wrote: the next write initialises and reads anew.
    fn reset(&mut self) -> Option<Arc<FutureProducer>> {
        self.overlay.clear();
        self.producer.take()
    }
}

async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, rdkafka::error::KafkaError> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .with_context(|| format!("{what} task"))?
        .with_context(|| what.to_string())
}

/// Drops a producer off the async threads (its destructor waits for librdkafka's threads).
fn dispose(producer: Option<Arc<FutureProducer>>) {
    if let Some(p) = producer {
        tokio::task::spawn_blocking(move || drop(p));
    }
}

impl Registry {
    /// Decides on the current state of endpoint `id` and writes the outcome; returns the
    /// endpoint after the write (`None`: deleted or absent). `decide` may run several times.
    pub(crate) async fn write<E: From<anyhow::Error> + From<crate::crypto::CryptoError>>(
        &self,
        id: &str,
        mut decide: impl FnMut(Option<&Endpoint>, i64) -> Result<(Change, Option<OperationalEvent>), E>,
    ) -> Result<Option<Endpoint>, E> {
        let ids = [id.to_string()];
        let mut out = self
            .write_many(&ids, |view, now| -> Result<Decision, E> {
                let (change, event) = decide(view(id), now)?;
                Ok((vec![(id.to_string(), change)], event.into_iter().collect()))
            })
            .await?;
        Ok(out.pop().flatten())
    }

    /// Decides on the current state of the endpoints `ids` and writes every change in one
    /// transaction (all or nothing); returns each endpoint after the write, in `ids` order.
    /// `decide` may run several times.
    pub(crate) async fn write_many<E: From<anyhow::Error> + From<crate::crypto::CryptoError>>(
        &self,
        ids: &[String],
        mut decide: impl FnMut(View<'_>, i64) -> Result<Decision, E>,
    ) -> Result<Vec<Option<Endpoint>>, E> {
        let inner = &self.inner;
        let mut last_error = None;
        for attempt in 0..TRIES {
            if attempt > 0 {
                // Jittered, so two processes fencing each other fall out of step.
                let jitter = rand::random::<u64>() % (100 << attempt);
                tokio::time::sleep(Duration::from_millis((50 << attempt) + jitter)).await;
            }
            let asked = std::time::Instant::now();
            let mut writer = inner.writer.lock().await;
            if writer.producer.is_none() {
                if let Err(e) = self.initialise(&mut writer).await {
                    last_error = Some(e);
                    continue;
                }
            }
            let snapshot = inner.snapshot.borrow().clone();
            // Own writes the registry has read are its to answer for now.
            writer.overlay.retain(|_, p| match p.at {
                None => true,
                Some((partition, offset)) => snapshot
                    .positions
                    .get(&(inner.topic.clone(), partition))
                    .is_none_or(|read| *read <= offset),
            });
            let now = now_ms();
            let (changes, events) = {
                let overlay = &writer.overlay;
                let set = &snapshot.set;
                let view = |id: &str| match overlay.get(id) {
                    Some(p) => p.value.as_ref(),
                    None => set.get(id),
                };
                decide(&view, now)?
            };
            if changes.iter().all(|(_, c)| matches!(c, Change::Nothing)) {
                return Ok(ids
                    .iter()
                    .map(|id| match writer.overlay.get(id) {
                        Some(p) => p.value.clone(),
                        None => snapshot.set.get(id).cloned(),
                    })
                    .collect());
            }
            let mut records = Vec::with_capacity(changes.len());
            for (id, change) in changes {
                let value = match change {
                    Change::Nothing => continue,
                    Change::Put(e) => Some(*e),
                    Change::Delete => None,
                };
                let bytes = match &value {
                    Some(e) => Some(e.to_record(&inner.keyring)?.to_bytes()),
                    None => None,
                };
                records.push((id, value, bytes));
            }
            let leader = match self.join(&mut writer, records, events).await {
                Ok(leader) => leader,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            let Some(txn) = writer.open.as_ref() else {
                continue;
            };
            let mut done = txn.done.subscribe();
            drop(writer);
            let joined = std::time::Instant::now();
            inner.metrics.write_step("join", joined - asked);
            if leader {
                // Its own task: a caller that goes away must not leave the others waiting.
                let r = self.clone();
                tokio::spawn(async move { r.commit_open().await });
            }
            let outcome = tokio::time::timeout(TXN_TIMEOUT * 3, done.wait_for(Option::is_some))
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "the registry transaction did not end within {:?}",
                        TXN_TIMEOUT * 3
                    )
                })
                .and_then(|r| {
                    r.map_err(|_| anyhow::anyhow!("the registry writer went away"))
                        .map(|v| v.clone().unwrap_or_else(|| Err("no outcome".into())))
                });
            match outcome {
                Ok(Ok(ends)) => {
                    let ended = std::time::Instant::now();
                    inner.metrics.write_step("transaction", ended - joined);
                    self.wait_for_positions(&ends, READ_WAIT)
                        .await
                        .context("reading back the write")?;
                    inner.metrics.write_step("read_back", ended.elapsed());
                    return Ok(ids.iter().map(|id| self.get(id)).collect());
                }
                Ok(Err(e)) => {
                    tracing::warn!(
                        endpoints = ids.len(),
                        first = ids.first().map(String::as_str).unwrap_or_default(),
                        attempt,
                        error = %e,
                        "endpoint registry write not committed; retrying"
                    );
                    last_error = Some(anyhow::anyhow!(e));
                }
                Err(e) => last_error = Some(e),
            }
        }
        let what = match ids {
            [one] => format!("writing endpoint `{one}` to {}", inner.topic),
            many => format!("writing {} endpoints to {}", many.len(), inner.topic),
        };
        Err(last_error
            .unwrap_or_else(|| anyhow::anyhow!("no attempt made"))
            .context(what)
            .into())
    }

    /// Step 1: a fresh producer (fencing every writer before), then the registry read to the
    /// topic's end as it is after that.
    async fn initialise(&self, writer: &mut Writer) -> anyhow::Result<()> {
        let inner = &self.inner;
        dispose(writer.reset());
        let producer = fresh_producer(&inner.config, &writer.transactional_id).await?;
        let ends = ends_of(&inner.config, &inner.topic).await;
        let read = match ends {
            Ok(ends) => self.wait_for_positions(&ends, READ_WAIT).await,
            Err(e) => Err(e),
        };
        if let Err(e) = read {
            dispose(Some(producer));
            return Err(e.context("reading the registry to its end before a write"));
        }
        writer.producer = Some(producer);
        Ok(())
    }

    /// Queues the records and events in the open transaction (beginning one if none is open);
    /// `Ok(true)`: this write began it, and has its commit started.
    async fn join(
        &self,
        writer: &mut Writer,
        records: Vec<(String, Option<Endpoint>, Option<Vec<u8>>)>,
        events: Vec<OperationalEvent>,
    ) -> anyhow::Result<bool> {
        let inner = &self.inner;
        let producer = writer.producer.clone().context("no producer")?;
        let leader = writer.open.is_none();
        if leader {
            let p = producer.clone();
            if let Err(e) = blocking("begin_transaction", move || p.begin_transaction()).await {
                dispose(writer.reset());
                return Err(e);
            }
            writer.open = Some(Txn {
                records: Vec::new(),
                events: Vec::new(),
                failed: None,
                done: watch::channel(None).0,
            });
        }
        let op_topic = Topics::new(&inner.config.topics.prefix).operational();
        let Writer { overlay, open, .. } = writer;
        let txn = open.as_mut().context("no open transaction")?;
        for (id, value, bytes) in records {
            let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&inner.topic).key(&id);
            if let Some(v) = &bytes {
                record = record.payload(v);
            }
            match producer.send_result(record) {
                Ok(f) => txn.records.push((id.clone(), f)),
                Err((e, _)) => {
                    txn.failed
                        .get_or_insert_with(|| format!("queueing the endpoint record: {e}"));
                }
            }
            overlay.insert(id, Pending { value, at: None });
        }
        for event in events {
            let bytes = event.to_bytes();
            let record = FutureRecord::<str, [u8]>::to(&op_topic)
                .key(&event.endpoint_id)
                .payload(&bytes);
            match producer.send_result(record) {
                Ok(f) => txn.events.push(f),
                Err((e, _)) => {
                    txn.failed
                        .get_or_insert_with(|| format!("queueing the operational event: {e}"));
                }
            }
        }
        Ok(leader)
    }

    /// Commits the open transaction once the writes waiting now have joined it.
    async fn commit_open(&self) {
        // The mutex is fair: every write queued before this point joins first.
        tokio::task::yield_now().await;
        let mut writer = self.inner.writer.lock().await;
        let Some(txn) = writer.open.take() else {
            return;
        };
        let Some(producer) = writer.producer.clone() else {
            let _ = txn.done.send(Some(Err("the writer was reset".into())));
            return;
        };
        // Every record acknowledged first: rust-rdkafka's commit flushes, and a flush with
        // records in flight waits in 100 ms polls another thread answers (measured: every
        // commit took 102 ms).
        let committed_records = txn.records.len();
        let started = std::time::Instant::now();
        let mut ends = Positions::new();
        let mut outcome = match txn.failed {
            Some(e) => Err(anyhow::anyhow!(e)),
            None => Ok(()),
        };
        for (id, f) in txn.records {
            match tokio::time::timeout(TXN_TIMEOUT, f).await {
                Ok(Ok(Ok(d))) => {
                    if let Some(p) = writer.overlay.get_mut(&id) {
                        p.at = Some((d.partition, d.offset));
                    }
                    let end = ends
                        .entry((self.inner.topic.clone(), d.partition))
                        .or_default();
                    *end = (*end).max(d.offset + 1);
                }
                Ok(Ok(Err((e, _)))) => {
                    outcome = Err(anyhow::anyhow!(e).context("writing the endpoint record"));
                }
                Ok(Err(_)) => {
                    outcome = Err(anyhow::anyhow!("the endpoint record's delivery was lost"))
                }
                Err(_) => {
                    outcome = Err(anyhow::anyhow!(
                        "the endpoint record was not acknowledged within {TXN_TIMEOUT:?}"
                    ))
                }
            }
        }
        for f in txn.events {
            match tokio::time::timeout(TXN_TIMEOUT, f).await {
                Ok(Ok(Ok(_))) => {}
                Ok(Ok(Err((e, _)))) => {
                    outcome = Err(anyhow::anyhow!(e).context("writing the operational event"));
                }
                _ => {
                    outcome = Err(anyhow::anyhow!(
                        "the operational event was not acknowledged"
                    ))
                }
            }
        }
        if outcome.is_ok() {
            let acked = std::time::Instant::now();
            self.inner.metrics.write_step("acks", acked - started);
            let p = producer.clone();
            outcome = blocking("commit_transaction", move || {
                p.commit_transaction(TXN_TIMEOUT)
            })
            .await;
            self.inner.metrics.write_step("commit", acked.elapsed());
        }
        match outcome {
            Ok(()) => {
                self.inner.metrics.transaction(Some(committed_records));
                let _ = txn.done.send(Some(Ok(ends)));
            }
            Err(e) => {
                self.inner.metrics.transaction(None);
                // An open transaction would hold every reader's position until it timed out.
                let p = producer.clone();
                let _ = blocking("abort_transaction", move || {
                    p.abort_transaction(TXN_TIMEOUT)
                })
                .await;
                // Not committed (aborted above, else by the next writer's initialisation): the
                // next write initialises anew and reads what the other writer committed.
                dispose(writer.reset());
                let _ = txn.done.send(Some(Err(format!("{e:#}"))));
            }
        }
    }
}

/// A transactional producer, initialised: from here on, every writer that initialised before is
/// fenced.
async fn fresh_producer(
    config: &Config,
    transactional_id: &str,
) -> anyhow::Result<Arc<FutureProducer>> {
    let producer: FutureProducer = producer_config(config)
        .set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", "30000")
        .set("linger.ms", "0")
        // An import is one transaction: a record and an event per endpoint, queued at once.
        .set("queue.buffering.max.messages", "2000000")
        // Right after a commit, Kafka answers "concurrent transactions" until that commit's
        // markers are written (a few ms): to the next transaction's first record
        // (AddPartitionsToTxn: a fixed 20 ms retry before patch 5 of vendor/rdkafka-sys, 3.2 ms
        // mean and ≤ 32 ms p99 of every write's acks) and to a new writer's initialisation.
        // Retry soon.
        .set("retry.backoff.ms", "2")
        .set("retry.backoff.max.ms", "50")
        .create()
        .context("creating the endpoint registry's writer")?;
    let producer = Arc::new(producer);
    let p = producer.clone();
    blocking("init_transactions", move || {
        p.init_transactions(TXN_TIMEOUT)
    })
    .await?;
    Ok(producer)
}

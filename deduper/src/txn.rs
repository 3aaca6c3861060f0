//! Stage B's transactions: the open batch's begin, commit (outputs + input offsets) and abort
//! with rewind; each blocking call retried a bounded time when retriable and classified
//! otherwise (abortable: abort, rewind, replay the batch; fatal: the stage stops); the
//! transactional id that fences a predecessor.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use hookline_common::config::Config;
use hookline_common::kafka::produce::flush_acked;
use hookline_common::kafka::{is_transient, retry_transient};

use crate::dedupe::{Core, Input, STAGE, TXN_CALL_TIMEOUT};
use crate::rebalance::DedupeContext;
use crate::watchdog::Watchdog;

pub(crate) type TxnProducer = ThreadedProducer<DefaultProducerContext>;

/// Producer replacements allowed within [`RECOVERY_WINDOW`] before the stage gives up: a broker
/// failover costs one or two; more means something else is wrong (e.g. two processes with one
/// `kafka.instance_id` fencing each other), which a restart by the orchestrator should surface.
const MAX_RECOVERIES: usize = 5;
const RECOVERY_WINDOW: Duration = Duration::from_secs(300);

/// Creates stage B's transactional producer with `txn_id` and initialises its transactions.
/// `init_transactions` fences any earlier producer with the same id and waits until the
/// coordinator has finished (committed or aborted) that producer's open transaction.
pub(crate) fn transactional_producer(
    pcfg: &ClientConfig,
    watchdog: &Watchdog,
) -> anyhow::Result<TxnProducer> {
    let producer: TxnProducer = pcfg
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
    Ok(producer)
}

pub(crate) enum TxnFailure {
    Abortable(anyhow::Error),
    Fatal(anyhow::Error),
}

/// Retries a transactional call while librdkafka says it is retriable (or the cluster is briefly
/// unavailable), a bounded number of times (~5.5 s); classifies the rest. A call that stays
/// "retriable" longer is treated as abortable: e.g. a commit whose transaction holds a record the
/// broker refuses keeps answering retriable errors, and only the abort (which re-reads the topic
/// limits and replays the batch) gets the stage going again. The abort and the restore that follow
/// retry transient errors for as long as a broker restart takes.
pub(crate) fn retry_txn(
    op: &str,
    mut call: impl FnMut() -> Result<(), KafkaError>,
) -> Result<(), TxnFailure> {
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

pub(crate) fn transactional_id(config: &Config) -> String {
    let group = config.group_id(STAGE);
    match &config.kafka.instance_id {
        // Stable: a restarted instance fences its predecessor's open transaction at once.
        Some(id) => format!("{group}.{id}"),
        None => format!(
            "{group}.{}.{}",
            std::process::id(),
            hookline_common::runtime::clock::now_ms()
        ),
    }
}

/// The transaction of the open batch: begin, commit (outputs + input offsets), abort.
impl Core {
    pub(crate) fn begin_if_needed(&mut self) -> anyhow::Result<()> {
        if !self.txn_open {
            if let Err(e) = self.guarded("begin_transaction", |p| p.begin_transaction()) {
                // No transaction is open, so nothing uncommitted is at stake: a producer in an
                // error state is replaced and the begin tried once more.
                self.recover_producer(anyhow::anyhow!("beginning a transaction: {e}"))?;
                self.guarded("begin_transaction", |p| p.begin_transaction())
                    .context("beginning a transaction with a new producer")?;
            }
            self.txn_open = true;
            self.txn_started = Instant::now();
        }
        Ok(())
    }

    /// Replaces the transactional producer the way Kafka Streams recovers one whose transaction
    /// state it can no longer trust (an abort the coordinator refuses after it moved, a fatal
    /// error such as an epoch bumped when a transaction timed out during a broker outage): a new
    /// producer with the same transactional id, whose `init_transactions` fences the old one and
    /// lets the coordinator finish its open transaction one way or the other. Whatever it decided,
    /// the caller then rewinds every partition to its committed offset and restores its seen-set
    /// from the changelog, so the state again matches what is committed. Gives up (an error: the
    /// stage stops) after [`MAX_RECOVERIES`] within [`RECOVERY_WINDOW`].
    pub(crate) fn recover_producer(&mut self, why: anyhow::Error) -> anyhow::Result<()> {
        let now = Instant::now();
        self.recoveries
            .retain(|t| now.duration_since(*t) < RECOVERY_WINDOW);
        if self.recoveries.len() >= MAX_RECOVERIES {
            return Err(why.context(format!(
                "the transactional producer was replaced {MAX_RECOVERIES} times within {}s and still fails",
                RECOVERY_WINDOW.as_secs()
            )));
        }
        self.recoveries.push(now);
        self.metrics.emit_recovered(&why);
        let fresh = transactional_producer(&self.producer_config, &self.watchdog)
            .context("replacing the transactional producer")?;
        let old = std::mem::replace(&mut self.producer, fresh);
        // Fenced already; its close may wait on an unreachable broker: bounded, off this thread.
        hookline_common::kafka::closing::close_blocking(
            "the replaced transactional producer",
            move || drop(old),
        );
        self.txn_open = false;
        self.doomed = false;
        self.batch.clear();
        self.batch_records = 0;
        Ok(())
    }

    /// Runs a blocking transactional call, named `op`, under the watchdog.
    pub(crate) fn guarded<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(
            &ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
        ) -> Result<T, KafkaError>,
    ) -> Result<T, KafkaError> {
        self.watchdog.guard(op, || f(&self.producer))
    }

    pub(crate) fn batch_due(&self) -> bool {
        self.txn_open
            && (self.doomed
                || self.batch_records >= self.config.dedupe.batch_max_records
                || self.txn_started.elapsed() >= self.config.dedupe.batch_interval)
    }

    /// Commits the open transaction (outputs + offsets). On an abortable error, aborts and
    /// schedules every partition for rewind + restore. `owned`: false when the assignment was
    /// lost (the commit would be fenced): abort directly.
    pub(crate) fn commit(
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
                    self.doomed = false;
                    self.batch.clear();
                    self.batch_records = 0;
                    return Ok(());
                }
                Err(TxnFailure::Fatal(e)) => {
                    self.recover_producer(e)?;
                    return self.abort_and_rewind(consumer);
                }
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

    pub(crate) fn try_commit(
        &mut self,
        consumer: &BaseConsumer<DedupeContext>,
    ) -> Result<(), TxnFailure> {
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

    pub(crate) fn try_commit_inner(
        &mut self,
        consumer: &BaseConsumer<DedupeContext>,
    ) -> Result<(), TxnFailure> {
        let mut tpl = TopicPartitionList::new();
        let (dedupe, events) = (self.topics.dedupe(), self.topics.events());
        for ((input, p), o) in &self.batch {
            let topic = match input {
                Input::Dedupe => &dedupe,
                Input::Events => &events,
            };
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o))
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
                // Not rust-rdkafka's flush: it costs 100 ms per commit (see `flush_acked`).
                flush_acked(p.client(), TXN_CALL_TIMEOUT)?;
                p.commit_transaction(TXN_CALL_TIMEOUT)
            })
        })
    }

    /// Aborts the open transaction, if any, retrying transient errors. Its outputs are never
    /// visible to `read_committed` readers; its input offsets stay uncommitted.
    pub(crate) fn abort_open(&mut self) -> anyhow::Result<()> {
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
        self.doomed = false;
        Ok(())
    }

    /// The stage is exiting with an error: abort the open transaction (it may hold a dispatch
    /// record whose changelog record was never sent) and make sure nothing commits afterwards.
    pub(crate) fn abort_on_error_exit(&mut self) {
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
    pub(crate) fn abort_and_rewind(
        &mut self,
        consumer: &BaseConsumer<DedupeContext>,
    ) -> anyhow::Result<()> {
        if self.txn_open {
            if let Err(e) = self.abort_open() {
                if self.failed {
                    return Err(e);
                }
                self.recover_producer(e)?;
            }
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

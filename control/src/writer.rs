//! Writes to `<p>.endpoints` with optimistic concurrency that holds across processes, without a
//! database: every writer uses the same transactional id, so a writer's `init_transactions`
//! fences whichever writer initialised before it. A write then
//!
//! 1. initialises a fresh transactional producer (fencing every writer initialised before),
//! 2. reads the registry up to the topic's end (watermarks fetched *after* it was initialised),
//! 3. decides on that state (expected version, file-managed, …) what to write,
//! 4. writes it in a transaction (with an operational event on `<p>.operational` if any) and
//!    commits.
//!
//! A commit succeeds only if no other writer initialised since step 1 — and any writer that
//! committed before that is in what step 2 read. So a decision is never made on a stale state:
//! two racing writers never both succeed, and the loser's records are aborted (invisible to the
//! `read_committed` readers, and compaction-proof). A fenced writer starts over from step 1
//! (a few times) and the expected-version check then answers the caller. Writes of one process
//! are serialised by a mutex, so they never fence each other.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use hookline_common::config::Config;
use hookline_common::contract::delivery::now_ms;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::producer_config;

use crate::endpoint::Endpoint;
use crate::operational::OperationalEvent;
use crate::registry::Registry;
use crate::tail::ends_of;

const TXN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a write waits for the registry to read up to the topic's end, or its own record.
const READ_WAIT: Duration = Duration::from_secs(15);
/// Tries of one write when it is fenced by a concurrent writer or Kafka errs.
const TRIES: u32 = 5;

/// What a write decided.
pub(crate) enum Change {
    /// Nothing to write (the state already is what was asked).
    Nothing,
    Put(Box<Endpoint>),
    Delete,
}

/// The writer of this process: its transactional id, behind the mutex that serialises writes.
pub(crate) struct Writer {
    transactional_id: String,
}

impl Writer {
    pub(crate) fn new(config: &Config) -> Writer {
        Writer {
            transactional_id: config.group_id("control.endpoints-writer"),
        }
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

impl Registry {
    /// Decides on the current state of endpoint `id` and writes the outcome; returns the
    /// endpoint after the write (`None`: deleted or absent). `decide` may run several times.
    pub(crate) async fn write<E: From<anyhow::Error> + From<crate::crypto::CryptoError>>(
        &self,
        id: &str,
        mut decide: impl FnMut(Option<&Endpoint>, i64) -> Result<(Change, Option<OperationalEvent>), E>,
    ) -> Result<Option<Endpoint>, E> {
        let inner = &self.inner;
        let writer = inner.writer.lock().await;
        let mut last_error = None;
        for attempt in 0..TRIES {
            if attempt > 0 {
                // Jittered, so two processes fencing each other fall out of step.
                let jitter = rand::random::<u64>() % (100 << attempt);
                tokio::time::sleep(Duration::from_millis((50 << attempt) + jitter)).await;
            }
            let producer = match fresh_producer(&inner.config, &writer.transactional_id).await {
                Ok(p) => p,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            // Step 2: everything committed before our fence is read.
            let read = async {
                let ends = ends_of(&inner.config, &inner.topic).await?;
                self.wait_for_positions(&ends, READ_WAIT).await
            };
            if let Err(e) = read.await {
                last_error = Some(e.context("reading the registry to its end before a write"));
                continue;
            }
            let current = self.current();
            let now = now_ms();
            let (change, event) = decide(current.get(id), now)?;
            let value = match &change {
                Change::Nothing => return Ok(current.get(id).cloned()),
                Change::Put(e) => Some(e.to_record(&inner.keyring)?.to_bytes()),
                Change::Delete => None,
            };
            let written = transact(&inner.config, &producer, &inner.topic, id, value, event).await;
            if written.is_err() {
                // An open transaction would hold every reader's position until it timed out.
                let p = producer.clone();
                let _ = blocking("abort_transaction", move || {
                    p.abort_transaction(TXN_TIMEOUT)
                })
                .await;
            }
            // One producer per write: the next write initialises anew (fencing whoever wrote
            // in between) instead of discovering on commit that it was fenced.
            let _ = tokio::task::spawn_blocking(move || drop(producer)).await;
            match written {
                Ok(end) => {
                    let mut wanted = crate::tail::Positions::new();
                    wanted.insert((inner.topic.clone(), end.0), end.1 + 1);
                    self.wait_for_positions(&wanted, READ_WAIT)
                        .await
                        .context("reading back the write")?;
                    return Ok(self.get(id));
                }
                Err(e) => {
                    tracing::warn!(
                        endpoint = id,
                        attempt,
                        error = format!("{e:#}"),
                        "endpoint registry write not committed; retrying"
                    );
                    // Not committed (aborted above, else by the next writer's initialisation);
                    // the next try initialises anew.
                    last_error = Some(e);
                }
            }
        }
        Err(last_error
            .unwrap_or_else(|| anyhow::anyhow!("no attempt made"))
            .context(format!("writing endpoint `{id}` to {}", inner.topic))
            .into())
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
        // Initialising right after another writer's commit is answered "concurrent
        // transactions" until its markers are written: retry soon rather than after 500 ms.
        .set("retry.backoff.ms", "10")
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

/// Writes the record (and the event) in one transaction; returns the record's (partition,
/// offset).
async fn transact(
    config: &Config,
    producer: &Arc<FutureProducer>,
    topic: &str,
    id: &str,
    value: Option<Vec<u8>>,
    event: Option<OperationalEvent>,
) -> anyhow::Result<(i32, i64)> {
    let p = producer.clone();
    blocking("begin_transaction", move || p.begin_transaction()).await?;
    let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic).key(id);
    if let Some(v) = &value {
        record = record.payload(v);
    }
    let delivered = producer
        .send(record, TXN_TIMEOUT)
        .await
        .map_err(|(e, _)| e)
        .context("writing the endpoint record")?;
    if let Some(event) = event {
        let op_topic = Topics::new(&config.topics.prefix).operational();
        let bytes = event.to_bytes();
        producer
            .send(
                FutureRecord::<str, [u8]>::to(&op_topic)
                    .key(&event.endpoint_id)
                    .payload(&bytes),
                TXN_TIMEOUT,
            )
            .await
            .map_err(|(e, _)| e)
            .context("writing the operational event")?;
    }
    let p = producer.clone();
    blocking("commit_transaction", move || {
        p.commit_transaction(TXN_TIMEOUT)
    })
    .await?;
    Ok((delivered.partition, delivered.offset))
}

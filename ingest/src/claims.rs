//! Which request body an `Idempotency-Key` belongs to — the same answer on every ingest process.
//!
//! The id of a keyed event is derived from (tenant, key) ([`crate::id`]), so a repeated key can
//! never deliver twice: that rests on the deduper's window alone. What the id cannot tell is
//! whether a repeat carries the same body. For that, each request with a key writes a *claim*
//! (key → body fingerprint) to `<p>.idempotency` and every ingest process tails that topic into
//! an index of the **first** claim per key within the dedupe window. A request whose key is
//! already claimed with another fingerprint is refused (Stripe's answer to a key reused with
//! other parameters). A request whose key is not in the index writes its claim, waits until its
//! own tail has read past it, and then reads the first claim: concurrent requests with one key on
//! different processes all see the same first claim, because they read the same log in the same
//! order.
//!
//! Limits, by design: the index keeps at most `cap` keys (about 55 bytes each); past that the
//! oldest are forgotten (counted in `hookline_ingest_idempotency_evicted_total`) and a reused key
//! among them is no longer checked for its body — it still cannot deliver twice.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use hookline_common::config::Config;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::{base_config, retry_transient_known};
use prometheus::{IntCounter, IntGauge, Registry};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Message, Offset, TopicPartitionList};
use sha2::{Digest as _, Sha256};
use tokio::sync::Notify;

/// Keys the index holds before it forgets the oldest.
pub const DEFAULT_CAP: usize = 1_000_000;
/// Longest a request waits for its own claim to come back through the tail.
const CLAIM_WAIT: Duration = Duration::from_secs(5);
/// Longest [`Claims::start`] waits to read the window's claims.
const CATCH_UP_WAIT: Duration = Duration::from_secs(120);

/// A key's first claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    fingerprint: u64,
    at_s: u32,
}

type KeyHash = [u8; 16];

#[derive(Default)]
struct Index {
    first: HashMap<KeyHash, Claim>,
    /// Keys in the order their first claim was read, for expiry and the cap.
    order: VecDeque<(u32, KeyHash)>,
    /// Next offset to read, per partition.
    positions: HashMap<i32, i64>,
}

/// What a request's key says about its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// First use of the key, or a repeat with the same body.
    Same,
    /// The key was first used with another body.
    Reused,
}

/// The claims index of one process.
pub struct Claims {
    index: Arc<Mutex<Index>>,
    advanced: Arc<Notify>,
    producer: FutureProducer,
    topic: String,
    tail: tokio::task::JoinHandle<()>,
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.tail.abort();
    }
}

/// The hash a key is indexed by: (tenant, key), length-prefixed.
fn key_hash(tenant: Option<&str>, key: &str) -> KeyHash {
    hash_record_key(record_key(tenant, key).as_bytes())
}

fn hash_record_key(bytes: &[u8]) -> KeyHash {
    let mut out = [0u8; 16];
    out.copy_from_slice(&Sha256::digest(bytes)[..16]);
    out
}

/// The claim record's key: `lp(tenant)|lp(key)` (`-` without a tenant), readable in tools.
fn record_key(tenant: Option<&str>, key: &str) -> String {
    match tenant {
        Some(t) => format!("{}:{t}|{}:{key}", t.len(), key.len()),
        None => format!("-|{}:{key}", key.len()),
    }
}

/// The fingerprint of a request body.
pub fn fingerprint(body: &[u8]) -> u64 {
    let digest = Sha256::digest(body);
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

impl Claims {
    /// Starts tailing `<p>.idempotency` from one dedupe window ago and returns once the index
    /// holds every claim written before the call.
    pub async fn start(config: &Config, cap: usize, registry: &Registry) -> anyhow::Result<Claims> {
        let topic = Topics::new(&config.topics.prefix).idempotency();
        let window = config.dedupe.window;
        let consumer: StreamConsumer = base_config(config)
            .set("group.id", config.group_id("ingest.claims"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10")
            .create()
            .context("creating the idempotency claims consumer")?;
        let consumer = Arc::new(consumer);
        let (start, starts, ends) = {
            let (c, t) = (consumer.clone(), topic.clone());
            tokio::task::spawn_blocking(move || start_positions(&c, &t, window))
                .await
                .context("reading the claims topic's positions")??
        };
        consumer
            .assign(&start)
            .with_context(|| format!("assigning {topic}"))?;
        let evicted = IntCounter::new(
            "hookline_ingest_idempotency_evicted_total",
            "Idempotency keys forgotten by the claims index before their window ended (cap reached)",
        )?;
        let keys = IntGauge::new(
            "hookline_ingest_idempotency_keys",
            "Idempotency keys in this process's claims index",
        )?;
        registry.register(Box::new(evicted.clone()))?;
        registry.register(Box::new(keys.clone()))?;
        let index = Arc::new(Mutex::new(Index {
            positions: starts.into_iter().collect(),
            ..Index::default()
        }));
        let advanced = Arc::new(Notify::new());
        let tail = tokio::spawn(tail(
            consumer,
            index.clone(),
            advanced.clone(),
            Limits {
                cap,
                window,
                evicted,
                keys,
            },
        ));
        let producer = hookline_common::kafka::producer_config(config)
            .set("message.timeout.ms", CLAIM_WAIT.as_millis().to_string())
            .create()
            .context("creating the idempotency claims producer")?;
        let claims = Claims {
            index,
            advanced,
            producer,
            topic: topic.clone(),
            tail,
        };
        let caught_up = async {
            for (partition, end) in ends {
                claims.reached(partition, end).await;
            }
        };
        tokio::time::timeout(CATCH_UP_WAIT, caught_up)
            .await
            .map_err(|_| {
                anyhow::anyhow!("reading the claims on {topic} took over {CATCH_UP_WAIT:?}")
            })?;
        Ok(claims)
    }

    /// Claims `key` for a body with `fingerprint`; says whether the key's first claim has it.
    /// `Err` when Kafka did not take or return the claim in time (answer 503).
    pub async fn claim(
        &self,
        tenant: Option<&str>,
        key: &str,
        fingerprint: u64,
    ) -> Result<Verdict, String> {
        let hash = key_hash(tenant, key);
        if let Some(first) = self.first(&hash) {
            return Ok(verdict(first, fingerprint));
        }
        let value = serde_json::json!({ "fingerprint": format!("{fingerprint:016x}") }).to_string();
        let rkey = record_key(tenant, key);
        let record = FutureRecord::to(&self.topic).key(&rkey).payload(&value);
        let delivered = self
            .producer
            .send(record, Timeout::After(Duration::ZERO))
            .await
            .map_err(|(e, _)| format!("writing the idempotency claim failed: {e}"))?;
        let (partition, offset) = (delivered.partition, delivered.offset);
        tokio::time::timeout(CLAIM_WAIT, self.reached(partition, offset + 1))
            .await
            .map_err(|_| "the idempotency claim did not come back in time".to_string())?;
        match self.first(&hash) {
            Some(first) => Ok(verdict(first, fingerprint)),
            // Read, then already forgotten (the cap): nothing left to compare with.
            None => Ok(Verdict::Same),
        }
    }

    fn first(&self, hash: &KeyHash) -> Option<Claim> {
        lock(&self.index).first.get(hash).copied()
    }

    /// Resolves once the tail's position on `partition` is at least `offset`.
    async fn reached(&self, partition: i32, offset: i64) {
        loop {
            let notified = self.advanced.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if lock(&self.index)
                .positions
                .get(&partition)
                .is_some_and(|p| *p >= offset)
            {
                return;
            }
            notified.await;
        }
    }
}

fn verdict(first: Claim, fingerprint: u64) -> Verdict {
    if first.fingerprint == fingerprint {
        Verdict::Same
    } else {
        Verdict::Reused
    }
}

fn lock(index: &Mutex<Index>) -> std::sync::MutexGuard<'_, Index> {
    index.lock().unwrap_or_else(|e| e.into_inner())
}

/// (partition, offset) pairs.
type Positions = Vec<(i32, i64)>;

/// Where the tail starts (the first offset of the window per partition) and where "caught up"
/// is (the high watermarks now).
fn start_positions(
    consumer: &StreamConsumer,
    topic: &str,
    window: Duration,
) -> anyhow::Result<(TopicPartitionList, Positions, Positions)> {
    let timeout = Duration::from_secs(10);
    let partitions = hookline_common::kafka::topic_partitions(consumer.client(), topic, timeout)?;
    let since = hookline_common::runtime::clock::now_ms() - window.as_millis() as i64;
    let mut query = TopicPartitionList::new();
    for p in &partitions {
        query.add_partition_offset(topic, *p, Offset::Offset(since))?;
    }
    // The partitions were just read from the metadata: "unknown partition" here is a broker
    // that has not loaded them yet (it just restarted), not a missing topic.
    let found = retry_transient_known(&format!("offsets for times on {topic}"), timeout, || {
        consumer.offsets_for_times(query.clone(), timeout)
    })
    .with_context(|| format!("finding the start of the window on {topic}"))?;
    let mut start = TopicPartitionList::new();
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    for p in &partitions {
        let (_, high) =
            retry_transient_known(&format!("watermarks of {topic}[{p}]"), timeout, || {
                consumer.fetch_watermarks(topic, *p, timeout)
            })
            .with_context(|| format!("watermarks of {topic}[{p}]"))?;
        // No record at or after `since`: start at the end.
        let offset = match found.find_partition(topic, *p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => high,
        };
        start.add_partition_offset(topic, *p, Offset::Offset(offset))?;
        starts.push((*p, offset));
        ends.push((*p, high));
    }
    Ok((start, starts, ends))
}

struct Limits {
    cap: usize,
    window: Duration,
    evicted: IntCounter,
    keys: IntGauge,
}

/// Reads claims into the index for as long as the process runs.
async fn tail(
    consumer: Arc<StreamConsumer>,
    index: Arc<Mutex<Index>>,
    advanced: Arc<Notify>,
    limits: Limits,
) {
    let mut stream = consumer.stream();
    while let Some(next) = stream.next().await {
        let msg = match next {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "reading idempotency claims");
                continue;
            }
        };
        let at_ms = msg.timestamp().to_millis().unwrap_or(0);
        let fingerprint = msg
            .payload()
            .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
            .and_then(|v| v["fingerprint"].as_str().map(str::to_string))
            .and_then(|f| u64::from_str_radix(&f, 16).ok());
        let hash = msg.key().map(hash_record_key);
        {
            let mut ix = lock(&index);
            if let (Some(hash), Some(fingerprint)) = (hash, fingerprint) {
                insert(&mut ix, hash, fingerprint, (at_ms / 1000) as u32, &limits);
            }
            ix.positions.insert(msg.partition(), msg.offset() + 1);
            limits.keys.set(ix.first.len() as i64);
        }
        advanced.notify_waiters();
    }
}

/// Records a key's first claim; forgets keys past the window, and the oldest past the cap.
fn insert(ix: &mut Index, hash: KeyHash, fingerprint: u64, at_s: u32, limits: &Limits) {
    let now_s = hookline_common::runtime::clock::now_secs() as u32;
    let horizon = now_s.saturating_sub(limits.window.as_secs() as u32);
    if at_s < horizon {
        return;
    }
    if let std::collections::hash_map::Entry::Vacant(e) = ix.first.entry(hash) {
        e.insert(Claim { fingerprint, at_s });
        ix.order.push_back((at_s, hash));
    }
    while let Some((at, h)) = ix.order.front().copied() {
        let full = ix.first.len() > limits.cap;
        if at >= horizon && !full {
            break;
        }
        ix.order.pop_front();
        ix.first.remove(&h);
        if full && at >= horizon {
            limits.evicted.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cap: usize) -> Limits {
        Limits {
            cap,
            window: Duration::from_secs(86_400),
            evicted: IntCounter::new("e", "e").unwrap(),
            keys: IntGauge::new("k", "k").unwrap(),
        }
    }

    fn now_s() -> u32 {
        hookline_common::runtime::clock::now_secs() as u32
    }

    #[test]
    fn the_first_claim_wins_and_old_or_excess_keys_are_forgotten() {
        let l = limits(2);
        let mut ix = Index::default();
        let (a, b, c) = ([1u8; 16], [2u8; 16], [3u8; 16]);
        insert(&mut ix, a, 10, now_s(), &l);
        insert(&mut ix, a, 11, now_s(), &l);
        assert_eq!(ix.first[&a].fingerprint, 10, "first claim kept");
        insert(&mut ix, b, 20, now_s() - 90_000, &l);
        assert!(
            !ix.first.contains_key(&b),
            "a claim older than the window is ignored"
        );
        insert(&mut ix, b, 20, now_s(), &l);
        insert(&mut ix, c, 30, now_s(), &l);
        assert!(
            !ix.first.contains_key(&a),
            "past the cap the oldest is forgotten"
        );
        assert_eq!(l.evicted.get(), 1);
        assert_eq!(ix.first.len(), 2);
    }

    #[test]
    fn keys_are_namespaced_by_tenant_and_length_prefixed() {
        assert_ne!(key_hash(Some("a"), "k"), key_hash(Some("b"), "k"));
        assert_ne!(key_hash(None, "k"), key_hash(Some("-"), "k"));
        assert_ne!(key_hash(Some("ab"), "c"), key_hash(Some("a"), "bc"));
        assert_eq!(record_key(Some("acme"), "k1"), "4:acme|2:k1");
        assert_eq!(fingerprint(b"x"), fingerprint(b"x"));
        assert_ne!(fingerprint(b"x"), fingerprint(b"y"));
    }
}

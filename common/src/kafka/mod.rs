//! Kafka client builders shared by every stage, `topics apply`, and the one way every stage
//! tells a transient Kafka error (retry with backoff) from one that must stop it.
//!
//! Every client gets `kafka.bootstrap_servers` plus the `kafka.options` passthrough (TLS, SASL…);
//! the stage-specific settings that correctness depends on are set here, after the passthrough,
//! so a config file cannot silently turn them off.
//!
//! Transient errors: a leader election, a rolling broker restart or a coordinator moving answers
//! "not leader", "coordinator loading", "request timed out", "all brokers down" for a few seconds.
//! [`retry_transient`] retries such a call with capped exponential backoff and a log line per retry;
//! any other error is returned at once, and only those stop a stage.

//!
//! The Kafka plumbing every stage shares lives in this module and its children:
//! - [`produce`]: produce errors classified (permanent / transient / fatal) and acknowledged sends;
//!   [`recordsize`]: record sizes and topic size limits;
//! - [`rebalance`]: the one way consumer stages handle rebalances (bounded revoke protocol, changes
//!   posted to the loop); [`ownership`]: per-partition assignment generations and the gate every
//!   hand-off or dead letter passes, so work of a revoked partition never writes; [`progress`]:
//!   out-of-order completion, contiguous offsets to store;
//! - [`closing`]: every client close bounded, on a thread of its own;
//! - [`access`]: the login check every Kafka command runs first (a refused SASL or TLS login
//!   named, with an exit code of its own, instead of a transport error after two minutes).

pub mod access;
pub mod closing;
pub mod ownership;
pub mod produce;
pub mod progress;
pub mod rebalance;
pub mod recordsize;

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::config::Config;
use crate::contract::topics::{drift, orphan_tiers, plan, Drift, OrphanTier, TopicSpec};
use crate::runtime::ops::StageProbe;

/// Base client configuration: bootstrap servers and the operator's passthrough options.
pub fn base_config(config: &Config) -> ClientConfig {
    with_passthrough(ClientConfig::new(), config)
}

/// A consumer for at-least-once processing: offsets are stored by the application only once the
/// work for a record is done, and committed in the background. librdkafka's fetch defaults
/// (the retry tiers: their records wait minutes anyway, and an idle fetch every 500 ms is cheap).
pub fn consumer_config(config: &Config, stage: &str) -> ClientConfig {
    consumer_config_tuned(config, stage, &[])
}

/// [`consumer_config`] for the hot path (stage A, stage B, the dispatcher), fetching in
/// [`PIPELINE_CONSUMER_TUNING`]'s batches.
pub fn pipeline_consumer_config(config: &Config, stage: &str) -> ClientConfig {
    consumer_config_tuned(config, stage, PIPELINE_CONSUMER_TUNING)
}

fn consumer_config_tuned(config: &Config, stage: &str, tuning: &[(&str, &str)]) -> ClientConfig {
    let mut c = latency_tuned(ClientConfig::new(), tuning);
    c = with_passthrough(c, config);
    c.set("group.id", config.group_id(stage))
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("enable.partition.eof", "false");
    if let Some(id) = &config.kafka.instance_id {
        c.set("group.instance.id", format!("{id}.{stage}"));
    }
    c
}

/// An idempotent producer (no duplicates or reordering from its own retries).
pub fn producer_config(config: &Config) -> ClientConfig {
    let mut c = latency_tuned(ClientConfig::new(), PRODUCER_TUNING);
    c = with_passthrough(c, config);
    c.set("enable.idempotence", "true").set("acks", "all").set(
        "message.max.bytes",
        crate::contract::topics::MAX_MESSAGE_BYTES.to_string(),
    );
    c
}

/// Batching settings of the hot-path consumers. Set before the `kafka.options` passthrough so an
/// operator (or `hookline-bench --stage-kafka-option`) can tune them; correctness settings come
/// after it. The broker answers a fetch once 64 KiB are ready or after 10 ms: at a trickle,
/// fewer and fuller fetches. Measured at 4,000 events/s (docs/performance.md, run 4): deduper
/// CPU per record 80 → 48 µs and the whole machine's CPU -20%, for +10–20 ms p99 end to end.
/// Idle, each consumer then fetches every 10 ms instead of every 500 ms: ~0.3% of a core
/// in the stage and ~1.2% in the broker per consumer (measured), why the tiers keep the defaults.
///
/// Prefetch is capped at 16 MiB per consumer (librdkafka's default is 64 MiB): ~0.6 s of records
/// at the max rate measured here, and what a backlog drain leaves resident in the process. Same
/// drain rate measured (docs/performance.md, "10k in flight").
pub const PIPELINE_CONSUMER_TUNING: &[(&str, &str)] = &[
    ("fetch.min.bytes", "65536"),
    ("fetch.wait.max.ms", "10"),
    ("queued.max.messages.kbytes", "16384"),
];

/// Latency settings of every producer; overridable like [`PIPELINE_CONSUMER_TUNING`]. A 10 ms
/// linger (librdkafka's default is 5) fills batches at a trickle: deduper CPU per record a
/// further −15% for +5 ms per produce hop (run 4).
pub const PRODUCER_TUNING: &[(&str, &str)] = &[("linger.ms", "10"), ("compression.type", "lz4")];

fn latency_tuned(mut c: ClientConfig, tuning: &[(&str, &str)]) -> ClientConfig {
    for (k, v) in tuning {
        c.set(*k, *v);
    }
    c
}

/// Bootstrap servers, client id and the passthrough over `c`.
fn with_passthrough(mut c: ClientConfig, config: &Config) -> ClientConfig {
    c.set("bootstrap.servers", &config.kafka.bootstrap_servers);
    c.set("client.id", "hookline");
    for (k, v) in &config.kafka.options {
        c.set(k, v);
    }
    c
}

/// What `topics apply` did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub created: Vec<String>,
    pub unchanged: Vec<String>,
    pub drift: Vec<Drift>,
    /// Retry tier topics no longer in `retry.schedule`: listed, drained by the tier workers,
    /// never deleted or counted as drift.
    pub orphans: Vec<OrphanStatus>,
}

/// An orphan tier and how many of its records its consumer group has not processed yet.
#[derive(Debug)]
pub struct OrphanStatus {
    pub tier: OrphanTier,
    /// Records after the group's committed offsets (all of them if it never committed), or why
    /// that could not be read.
    pub unprocessed: Result<i64, String>,
}

impl std::fmt::Display for OrphanStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: tier {} is not in retry.schedule; its records are being drained by the retry tier \
             workers (attempted when due, then moved on by the current schedule); ",
            self.tier.topic, self.tier.name
        )?;
        match &self.unprocessed {
            Ok(0) => write!(
                f,
                "nothing left to process: it may be deleted by hand once no process with an older \
                 schedule writes to it"
            ),
            Ok(n) => write!(f, "{n} record(s) not processed yet; not deleted"),
            Err(e) => write!(f, "unprocessed records unknown ({e}); not deleted"),
        }
    }
}

/// Creates every missing topic of the plan; describes the existing ones and reports drift.
/// Never alters an existing topic: partition counts in particular decide where dedupe keys live.
pub async fn apply_topics(config: &Config, timeout: Duration) -> anyhow::Result<ApplyReport> {
    let admin: AdminClient<DefaultClientContext> = base_config(config)
        .create()
        .context("creating the Kafka admin client")?;
    let specs = plan(config);
    let existing = existing_topics(&admin, timeout)?;
    let opts = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let mut report = ApplyReport::default();

    let missing: Vec<&TopicSpec> = specs
        .iter()
        .filter(|s| !existing.contains_key(&s.name))
        .collect();
    if !missing.is_empty() {
        let new_topics: Vec<NewTopic> = missing
            .iter()
            .map(|s| {
                let mut t = NewTopic::new(
                    &s.name,
                    s.partitions,
                    TopicReplication::Fixed(s.replication_factor),
                );
                for (k, v) in &s.configs {
                    t = t.set(k, v);
                }
                t
            })
            .collect();
        for result in admin
            .create_topics(new_topics.iter(), &opts)
            .await
            .context("creating topics")?
        {
            match result {
                Ok(name) => report.created.push(name),
                // Created concurrently by another `apply`: describe it like any existing topic.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => bail!("creating topic {name}: {code}"),
            }
        }
    }

    // CreateTopics returns before every broker's metadata shows the topic: wait until it does,
    // so a stage started right after `topics apply` finds its topics.
    if !report.created.is_empty() {
        require_topics(config, report.created.clone(), timeout).await?;
    }
    let existing = existing_topics(&admin, timeout)?;
    let to_describe: Vec<&TopicSpec> = specs
        .iter()
        .filter(|s| !report.created.contains(&s.name))
        .collect();
    if !to_describe.is_empty() {
        let resources: Vec<ResourceSpecifier> = to_describe
            .iter()
            .map(|s| ResourceSpecifier::Topic(&s.name))
            .collect();
        let described = admin
            .describe_configs(resources.iter(), &opts)
            .await
            .context("describing topic configs")?;
        for (spec, result) in to_describe.iter().zip(described) {
            let resource =
                result.map_err(|code| anyhow::anyhow!("describing topic {}: {code}", spec.name))?;
            let configs: BTreeMap<String, String> = resource
                .entries
                .iter()
                .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
                .collect();
            let (partitions, rf) = existing.get(&spec.name).copied().unwrap_or((0, 0));
            let d = drift(spec, partitions, rf, &configs);
            if d.is_empty() {
                report.unchanged.push(spec.name.clone());
            }
            report.drift.extend(d);
        }
    }
    report.orphans = orphan_statuses(config, existing.keys().map(String::as_str), timeout).await;
    Ok(report)
}

/// The orphan retry tiers on the broker now (see [`orphan_tiers`]).
pub async fn find_orphan_tiers(
    config: &Config,
    timeout: Duration,
) -> anyhow::Result<Vec<OrphanTier>> {
    let names = topic_names(config, timeout).await?;
    Ok(orphan_tiers(config, names.iter().map(String::as_str)))
}

/// `topics describe`: the orphan tiers on the broker and what is left on each.
pub async fn describe_orphans(
    config: &Config,
    timeout: Duration,
) -> anyhow::Result<Vec<OrphanStatus>> {
    let names = topic_names(config, timeout).await?;
    Ok(orphan_statuses(config, names.iter().map(String::as_str), timeout).await)
}

async fn orphan_statuses<'a>(
    config: &Config,
    existing: impl IntoIterator<Item = &'a str>,
    timeout: Duration,
) -> Vec<OrphanStatus> {
    let mut out = Vec::new();
    for tier in orphan_tiers(config, existing) {
        let unprocessed = unprocessed_records(config, &tier, timeout)
            .await
            .map_err(|e| format!("{e:#}"));
        out.push(OrphanStatus { tier, unprocessed });
    }
    out
}

/// Every topic name in the cluster's metadata.
pub async fn topic_names(
    config: &Config,
    timeout: Duration,
) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let client: BaseConsumer = base_config(config)
        .create()
        .context("creating a Kafka metadata client")?;
    // A metadata request blocks: keep it off the async workers.
    tokio::task::spawn_blocking(move || {
        retry_transient("fetching cluster metadata", || {
            client.fetch_metadata(None, timeout)
        })
        .map(|md| {
            md.topics()
                .iter()
                .map(|t| t.name().to_string())
                .collect::<std::collections::BTreeSet<String>>()
        })
    })
    .await
    .context("metadata task")?
    .context("fetching cluster metadata (is Kafka reachable at kafka.bootstrap_servers?)")
}

/// Records of a tier topic after its consumer group's committed offsets (from the start of the
/// log where the group never committed). Reading committed offsets does not join the group.
async fn unprocessed_records(
    config: &Config,
    tier: &OrphanTier,
    timeout: Duration,
) -> anyhow::Result<i64> {
    let mut c = base_config(config);
    c.set("group.id", config.group_id(&format!("retry.{}", tier.name)))
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = c.create().context("creating an offsets client")?;
    let topic = tier.topic.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<i64> {
        let md = retry_transient(&format!("metadata of {topic}"), || {
            consumer.fetch_metadata(Some(&topic), timeout)
        })
        .with_context(|| format!("metadata of {topic}"))?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for t in md.topics() {
            for p in t.partitions() {
                tpl.add_partition(&topic, p.id());
            }
        }
        let committed = retry_transient(&format!("committed offsets of {topic}"), || {
            consumer.committed_offsets(tpl.clone(), timeout)
        })
        .with_context(|| format!("committed offsets of {topic}"))?;
        let mut total = 0;
        for e in committed.elements() {
            let (low, high) = retry_transient_known(
                &format!("watermarks of {topic}[{}]", e.partition()),
                timeout,
                || consumer.fetch_watermarks(&topic, e.partition(), timeout),
            )
            .with_context(|| format!("watermarks of {topic}[{}]", e.partition()))?;
            let from = match e.offset() {
                rdkafka::Offset::Offset(o) => o.max(low),
                _ => low,
            };
            total += (high - from).max(0);
        }
        Ok(total)
    })
    .await
    .context("offsets task")?
}

/// Topic name → (partitions, replication factor of partition 0).
fn existing_topics(
    admin: &AdminClient<DefaultClientContext>,
    timeout: Duration,
) -> anyhow::Result<BTreeMap<String, (i32, i32)>> {
    let md = retry_transient("fetching cluster metadata", || {
        admin.inner().fetch_metadata(None, timeout)
    })
    .context("fetching cluster metadata (is Kafka reachable at kafka.bootstrap_servers?)")?;
    Ok(md
        .topics()
        .iter()
        .map(|t| {
            let rf = t
                .partitions()
                .first()
                .map(|p| p.replicas().len() as i32)
                .unwrap_or(0);
            (t.name().to_string(), (t.partitions().len() as i32, rf))
        })
        .collect())
}

/// How long a stage waits at startup for its topics (a `topics apply` just before it, or
/// partitions without a leader yet) before failing.
pub const TOPICS_WAIT: Duration = Duration::from_secs(15);

/// Waits until every topic in `names` exists with partitions, for at most `wait`; returns their
/// partition counts. Fails with a message telling the operator to run `hookline topics apply`.
pub async fn require_topics(
    config: &Config,
    names: Vec<String>,
    wait: Duration,
) -> anyhow::Result<BTreeMap<String, i32>> {
    let client: Arc<BaseConsumer> = Arc::new(
        base_config(config)
            .create()
            .context("creating a Kafka metadata client")?,
    );
    let started = tokio::time::Instant::now();
    loop {
        let c = client.clone();
        // A metadata request blocks: keep it off the async workers.
        let existing = tokio::task::spawn_blocking(move || {
            retry_transient("fetching cluster metadata", || {
                c.fetch_metadata(None, Duration::from_secs(10))
            })
            .map(|md| {
                md.topics()
                    .iter()
                    .filter(|t| !t.partitions().is_empty())
                    .map(|t| (t.name().to_string(), t.partitions().len() as i32))
                    .collect::<BTreeMap<String, i32>>()
            })
        })
        .await
        .context("metadata task")?
        .context("fetching cluster metadata (is Kafka reachable at kafka.bootstrap_servers?)")?;
        let missing: Vec<&str> = names
            .iter()
            .filter(|n| !existing.contains_key(*n))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(existing
                .into_iter()
                .filter(|(n, _)| names.contains(n))
                .collect());
        }
        if started.elapsed() >= wait {
            bail!(
                "topic(s) {} do not exist: run `hookline topics apply` first",
                missing.join(", ")
            );
        }
        tracing::debug!(missing = ?missing, "waiting for topics to appear");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long [`retry_transient`] keeps retrying one call: a leader election or a broker restart
/// is over well within it; an outage longer than this stops the stage (the orchestrator restarts
/// the process, which waits again).
pub const TRANSIENT_RETRY_BUDGET: Duration = Duration::from_secs(120);
/// First wait between two tries; doubled after each, up to [`TRANSIENT_BACKOFF_CAP`].
const TRANSIENT_BACKOFF_FIRST: Duration = Duration::from_millis(100);
const TRANSIENT_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Whether a Kafka error is the cluster being briefly unable to answer (a leader or coordinator
/// moving, a broker restarting, a request timing out) rather than a problem with the request:
/// retrying the same call later is expected to succeed. A transactional error counts only when
/// librdkafka says the same call may be retried (never when the transaction must be aborted, never
/// a fatal one).
pub fn is_transient(e: &KafkaError) -> bool {
    if let KafkaError::Transaction(t) = e {
        if t.is_fatal() || t.txn_requires_abort() {
            return false;
        }
        if t.is_retriable() {
            return true;
        }
    }
    e.rdkafka_error_code().is_some_and(is_transient_code)
}

/// The error codes of [`is_transient`]: Kafka's retriable broker errors that mean "not now", and
/// librdkafka's local ones for an unreachable or slow cluster.
fn is_transient_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::NotLeaderForPartition
            | C::LeaderNotAvailable
            | C::PreferredLeaderNotAvailable
            | C::EligibleLeadersNotAvailable
            | C::FencedLeaderEpoch
            | C::UnknownLeaderEpoch
            | C::OffsetNotAvailable
            | C::NotCoordinator
            | C::CoordinatorLoadInProgress
            | C::CoordinatorNotAvailable
            | C::RequestTimedOut
            | C::NetworkException
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend
            | C::KafkaStorageError
            | C::UnstableOffsetCommit
            | C::RebalanceInProgress
            | C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::DestroyBroker
            | C::OperationTimedOut
            | C::TimedOutQueue
            | C::WaitingForCoordinator
            | C::Resolve
            | C::Retry
    )
}

/// The partition ids of `topic` from a metadata request. Transient errors are retried, and so,
/// for up to `timeout`, is a topic not known yet (the seconds after `topics apply` created it);
/// then an error naming `topics apply`.
pub fn topic_partitions<C: ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<i32>> {
    let started = Instant::now();
    loop {
        let ids = match retry_transient(&format!("metadata of {topic}"), || {
            client.fetch_metadata(Some(topic), timeout)
        }) {
            Ok(md) => md
                .topics()
                .iter()
                .filter(|t| t.name() == topic)
                .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                .collect(),
            Err(e) if is_unknown_partition(&e) => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("reading the metadata of {topic}")),
        };
        if !ids.is_empty() {
            return Ok(ids);
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "topic {topic} does not exist: run `hookline topics apply` first"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn retry_transient<T>(
    op: &str,
    mut call: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    let started = Instant::now();
    let mut wait = TRANSIENT_BACKOFF_FIRST;
    let mut retries = 0u32;
    loop {
        match call() {
            Ok(v) => {
                if retries > 0 {
                    tracing::info!(op, retries, "kafka call succeeded after transient errors");
                }
                return Ok(v);
            }
            Err(e) if is_transient(&e) && started.elapsed() + wait < TRANSIENT_RETRY_BUDGET => {
                retries += 1;
                tracing::warn!(
                    op,
                    error = %e,
                    retry = retries,
                    wait_ms = wait.as_millis() as u64,
                    "transient kafka error; retrying"
                );
                std::thread::sleep(wait);
                wait = (wait * 2).min(TRANSIENT_BACKOFF_CAP);
            }
            Err(e) => return Err(e),
        }
    }
}

/// [`retry_transient`] for a call on a topic known to exist (checked at start, or just read
/// from the metadata): "unknown topic or partition" is retried too, for up to `unknown_for`. A
/// broker that just restarted, or one that did not see a topic created seconds ago yet, answers
/// it until it has loaded the partition; a topic that really is gone still fails after that.
pub fn retry_transient_known<T>(
    op: &str,
    unknown_for: Duration,
    mut call: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    let started = Instant::now();
    let mut logged = false;
    loop {
        match retry_transient(op, &mut call) {
            Err(e) if is_unknown_partition(&e) && started.elapsed() < unknown_for => {
                if !logged {
                    tracing::info!(op, error = %e, "partition not known to the broker yet; retrying");
                    logged = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// "Unknown topic or partition", in librdkafka's local and the broker's forms.
fn is_unknown_partition(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
        )
    )
}

/// The context of readers that stop at the end of a partition (`enable.partition.eof`):
/// librdkafka also reports every end reached as a client error — as `PartitionEOF` or as a
/// `Global` error with that code, which the default context logs at ERROR on every restore or
/// read. This one drops those and logs the other client errors as warnings, naming the reader.
pub struct EofQuietContext(pub &'static str);

/// Is this librdkafka's "end of partition reached" (in either of its shapes)?
pub fn is_partition_eof(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
    )
}

impl ClientContext for EofQuietContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if !is_partition_eof(&error) {
            tracing::warn!(error = %error, reason, reader = self.0, "kafka client error");
        }
    }
}

impl ConsumerContext for EofQuietContext {}

/// The consumer context of a stage that has no rebalance logic of its own: it reports the
/// group's assignment to the stage's readiness. Ready once the group has given this member its
/// assignment (an empty one included: a standby member of a group with more members than
/// partitions is healthy); not ready again when the assignment is lost (evicted, session
/// expired) until the next one.
pub struct AssignmentProbe {
    probe: StageProbe,
}

impl AssignmentProbe {
    pub fn new(probe: StageProbe) -> Self {
        AssignmentProbe { probe }
    }
}

impl ClientContext for AssignmentProbe {}

impl ConsumerContext for AssignmentProbe {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Revoke(_)) && consumer.assignment_lost() {
            self.probe.set_ready(false);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Assign(_)) {
            self.probe.set_ready(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_coordinator_timeout_and_network_errors_are_transient() {
        for code in [
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::LeaderNotAvailable,
            RDKafkaErrorCode::CoordinatorLoadInProgress,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::NetworkException,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::OperationTimedOut,
        ] {
            assert!(is_transient(&KafkaError::MetadataFetch(code)), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidProducerEpoch,
        ] {
            assert!(!is_transient(&KafkaError::MetadataFetch(code)), "{code:?}");
        }
        assert!(!is_transient(&KafkaError::ClientCreation("x".into())));
    }

    #[test]
    fn transient_errors_are_retried_others_returned_at_once() {
        let mut calls = 0;
        let r = retry_transient("test op", || {
            calls += 1;
            if calls < 3 {
                Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::NotLeaderForPartition,
                ))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.ok(), Some(3));
        let mut calls = 0;
        let r: Result<(), _> = retry_transient("test op", || {
            calls += 1;
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::TopicAuthorizationFailed,
            ))
        });
        assert!(r.is_err());
        assert_eq!(calls, 1, "a non-transient error is not retried");
    }

    #[test]
    fn an_unknown_partition_of_a_known_topic_is_retried_for_a_bounded_time() {
        let unknown = || KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition);
        assert!(
            !is_transient(&unknown()),
            "elsewhere it means: no such topic"
        );
        let mut calls = 0;
        let r = retry_transient_known("test op", Duration::from_secs(5), || {
            calls += 1;
            match calls {
                1 => Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::BrokerTransportFailure,
                )),
                2 | 3 => Err(unknown()),
                _ => Ok(calls),
            }
        });
        assert_eq!(
            r.ok(),
            Some(4),
            "transport failure, then unknown twice, then an answer"
        );
        let started = Instant::now();
        let r: Result<(), _> =
            retry_transient_known("test op", Duration::from_millis(300), || Err(unknown()));
        assert!(is_unknown_partition(&r.expect_err("still unknown")));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "bounded by unknown_for"
        );
    }

    /// `kafka.options` may tune latency (linger, fetch waits) but never turn off what
    /// correctness depends on: those settings are applied after the passthrough.
    #[test]
    fn passthrough_tunes_latency_but_cannot_override_correctness_settings() {
        let toml = "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n\n[kafka.options]\n\
                    \"linger.ms\" = \"0\"\n\"fetch.wait.max.ms\" = \"50\"\n\"acks\" = \"1\"\n\
                    \"enable.idempotence\" = \"false\"\n\"isolation.level\" = \"read_uncommitted\"\n\
                    \"enable.auto.offset.store\" = \"true\"\n";
        let config = Config::from_toml_with_env(toml, "t", Vec::new()).expect("config");
        let p = producer_config(&config);
        assert_eq!(p.get("linger.ms"), Some("0"));
        assert_eq!(p.get("compression.type"), Some("lz4"), "default kept");
        assert_eq!(p.get("acks"), Some("all"));
        assert_eq!(p.get("enable.idempotence"), Some("true"));
        let c = consumer_config(&config, "dispatcher");
        assert_eq!(c.get("fetch.wait.max.ms"), Some("50"));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        assert_eq!(c.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(c.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        let hot = pipeline_consumer_config(&config, "dispatcher");
        assert_eq!(
            hot.get("fetch.wait.max.ms"),
            Some("50"),
            "the operator's value wins"
        );
        assert_eq!(hot.get("fetch.min.bytes"), Some("65536"), "default kept");
        assert_eq!(
            hot.get("queued.max.messages.kbytes"),
            Some("16384"),
            "prefetch capped"
        );
        assert_eq!(hot.get("isolation.level"), Some("read_committed"));
        let default = Config::from_toml_with_env(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n",
            "t",
            Vec::new(),
        )
        .expect("config");
        let tier = consumer_config(&default, "retry.1m");
        assert_eq!(
            tier.get("fetch.wait.max.ms"),
            None,
            "the tiers keep librdkafka's fetch"
        );
        assert_eq!(producer_config(&default).get("linger.ms"), Some("10"));
    }

    /// Managed Kafka needs TLS and SASL PLAIN/SCRAM (and often OAUTHBEARER/OIDC): the linked
    /// librdkafka must have them built in, not just accept the option names.
    #[test]
    fn librdkafka_has_tls_and_sasl_built_in() {
        let native = rdkafka::config::ClientConfig::new()
            .create_native_config()
            .expect("native config");
        let features = native.get("builtin.features").expect("builtin.features");
        for wanted in [
            "ssl",
            "sasl_plain",
            "sasl_scram",
            "sasl_oauthbearer",
            "oidc",
            "zstd",
            "lz4",
        ] {
            assert!(
                features.split(',').any(|f| f == wanted),
                "librdkafka lacks `{wanted}`: {features}"
            );
        }
    }
}

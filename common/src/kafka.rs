//! Kafka client builders shared by every stage, and `topics apply`.
//!
//! Every client gets `kafka.bootstrap_servers` plus the `kafka.options` passthrough (TLS, SASL…);
//! the stage-specific settings that correctness depends on are set here, after the passthrough,
//! so a config file cannot silently turn them off.

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;

use crate::config::Config;
use crate::topics::{drift, orphan_tiers, plan, Drift, OrphanTier, TopicSpec};

/// Base client configuration: bootstrap servers and the operator's passthrough options.
pub fn base_config(config: &Config) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.kafka.bootstrap_servers);
    c.set("client.id", "hookline");
    for (k, v) in &config.kafka.options {
        c.set(k, v);
    }
    c
}

/// A consumer for at-least-once processing: offsets are stored by the application only once the
/// work for a record is done, and committed in the background.
pub fn consumer_config(config: &Config, stage: &str) -> ClientConfig {
    let mut c = base_config(config);
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
    let mut c = base_config(config);
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set(
            "message.max.bytes",
            crate::topics::MAX_MESSAGE_BYTES.to_string(),
        );
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
        client.fetch_metadata(None, timeout).map(|md| {
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
        let md = consumer
            .fetch_metadata(Some(&topic), timeout)
            .with_context(|| format!("metadata of {topic}"))?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for t in md.topics() {
            for p in t.partitions() {
                tpl.add_partition(&topic, p.id());
            }
        }
        let committed = consumer
            .committed_offsets(tpl, timeout)
            .with_context(|| format!("committed offsets of {topic}"))?;
        let mut total = 0;
        for e in committed.elements() {
            let (low, high) = consumer
                .fetch_watermarks(&topic, e.partition(), timeout)
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
    let md = admin
        .inner()
        .fetch_metadata(None, timeout)
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
            c.fetch_metadata(None, Duration::from_secs(10)).map(|md| {
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

#[cfg(test)]
mod tests {
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

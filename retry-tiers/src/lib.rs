//! hookline retry tiers: the delayed re-attempts of failed deliveries, the dead-letter topic, and
//! the tools around it.
//!
//! Module map:
//! - [`tier`] (via [`run`]): one worker per tier topic `<p>.retry.<tier>`, one consumer group
//!   per tier; waits for each record's due time without sleeping in the poll loop, attempts due
//!   records concurrently with the dispatcher's engine, hands failures to the next tier or
//!   `<p>.dlq`.
//! - `waiting`: per-partition bookkeeping of a tier worker (held records, head barrier, pause
//!   decisions, contiguous completed offsets), pure logic.
//! - `attempt`: what happens to one due record (attempt, next hop, dead letter, quarantine).
//! - [`dead`]: reading the dead-letter topic, filters, `hookline dead list/show`.
//! - [`replay`]: `hookline replay`, idempotent by replay key (`dlq:<partition>:<offset>`) recorded
//!   on the compacted `<p>.replays`.
//! - [`cli`]: the command-line arguments of `replay` and `dead`.
//! - `read`: reading a topic from given offsets up to the end it had when reading started.
//! - `metrics`: `hookline_retry_*`.

mod attempt;
pub mod cli;
pub mod dead;
mod metrics;
mod read;
pub mod replay;
mod tier;
mod waiting;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::util::Timeout;
use tokio::task::JoinSet;

use hookline_common::config::{tier_name, Config};
use hookline_common::kafka::producer_config;
use hookline_common::ops::Readiness;
use hookline_common::produce::ProduceErrors;
use hookline_common::recordsize::Limits;
use hookline_common::shutdown::{self, Shutdown};
use hookline_common::topics::Topics;
use hookline_dispatcher::fanout::Endpoints;
use hookline_dispatcher::handoff_write::HopWriter;
use hookline_dispatcher::Engine;

pub use attempt::BAD_DELIVERY_RECORD;

use crate::attempt::Stage;
use crate::metrics::Metrics;
use crate::tier::Tier;

/// Runs the worker of every tier of `retry.schedule` (or only the tiers named in `tiers`, e.g.
/// `["5m"]`) until shutdown: stop fetching, let in-flight attempts finish and hand off within
/// `dispatcher.shutdown_grace`, commit, return. The first tier to fail stops the others and its
/// error is returned.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    tiers: Option<Vec<String>>,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let selected = select_tiers(&config, tiers.as_deref())?;
    if selected.is_empty() {
        tracing::info!("retry.schedule has a single attempt: no retry tier to run");
        return Ok(());
    }
    let mut needed: Vec<String> = selected.iter().map(|t| t.topic.clone()).collect();
    needed.extend([topics.dlq(), topics.invalid()]);
    hookline_common::kafka::require_topics(&config, needed, hookline_common::kafka::TOPICS_WAIT)
        .await?;

    let metrics = Metrics::register(&registry).context("registering retry tier metrics")?;
    // The engine counts its attempts in `hookline_dispatcher_*`; the dispatcher registers those
    // names when it runs in the same process (`run all`), so the tiers' engine gets a registry of
    // its own and the tiers count their attempts in `hookline_retry_attempts_total`.
    let engine = Engine::new(
        &config.http,
        config.dispatcher.endpoint_concurrency,
        &prometheus::Registry::new(),
    )
    .context("building the delivery engine")?;
    let producer: FutureProducer = producer_config(&config)
        .create()
        .context("creating the retry tier producer")?;
    let written = HopWriter::topics_written(&topics, &config.retry.schedule);
    let writer = HopWriter {
        producer: producer.clone(),
        limits: Arc::new(
            Limits::fetch(&config, written)
                .await
                .context("reading topic size limits")?,
        ),
        topics: topics.clone(),
        errors: ProduceErrors::register(&registry, "retry")
            .context("registering produce error metrics")?,
        shutdown: shutdown.clone(),
    };
    let stage = Arc::new(Stage {
        endpoints: Endpoints::new(&config.endpoints),
        config: config.clone(),
        topics,
        engine,
        producer,
        writer,
    });

    // One stop signal for every tier: the process's shutdown, or the first tier that fails.
    let (stop_all, stop) = shutdown::channel();
    let forward = {
        let (mut shutdown, stop_all) = (shutdown, stop_all.clone());
        tokio::spawn(async move {
            shutdown.wait().await;
            stop_all.trigger();
        })
    };
    let mut workers = JoinSet::new();
    for tier in selected {
        let ready = readiness.register(&format!("retry.{}", tier.name));
        let tier_metrics = metrics.tier(&tier.name);
        workers.spawn(tier::run(
            stage.clone(),
            tier,
            tier_metrics,
            ready,
            stop.clone(),
        ));
    }
    let mut failed = None;
    while let Some(joined) = workers.join_next().await {
        let result = joined
            .map_err(|e| anyhow::anyhow!("a retry tier task panicked: {e}"))
            .and_then(|r| r);
        if let Err(e) = result {
            tracing::error!(
                error = format!("{e:#}"),
                "retry tier failed; stopping every tier"
            );
            stop_all.trigger();
            failed.get_or_insert(e);
        }
    }
    forward.abort();
    let producer = stage.producer.clone();
    let _ = tokio::task::spawn_blocking(move || {
        producer.flush(Timeout::After(Duration::from_secs(10)))
    })
    .await;
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The tiers of the schedule (every offset after the first), or the named subset.
fn select_tiers(config: &Config, names: Option<&[String]>) -> anyhow::Result<Vec<Tier>> {
    let topics = Topics::new(&config.topics.prefix);
    let all: Vec<Tier> = config
        .retry
        .schedule
        .iter()
        .skip(1)
        .map(|offset| Tier {
            name: tier_name(*offset),
            topic: topics.retry(*offset),
        })
        .collect();
    let Some(names) = names else {
        return Ok(all);
    };
    if names.is_empty() {
        bail!("name at least one tier (--tier)");
    }
    let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    for name in &wanted {
        if !all.iter().any(|t| t.name == *name) {
            let known: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
            bail!(
                "unknown retry tier `{name}`: the tiers of retry.schedule are {}",
                known.join(", ")
            );
        }
    }
    Ok(all
        .into_iter()
        .filter(|t| wanted.contains(t.name.as_str()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_toml_with_env(
            "[kafka]\nbootstrap_servers = \"x:1\"\n[topics]\nprefix = \"p\"\n[retry]\nschedule = [\"0s\", \"2s\", \"1m\"]\n",
            "t",
            Vec::new(),
        )
        .expect("config")
    }

    #[test]
    fn every_tier_or_the_named_ones() {
        let c = config();
        let all = select_tiers(&c, None).expect("all");
        let names: Vec<(&str, &str)> = all
            .iter()
            .map(|t| (t.name.as_str(), t.topic.as_str()))
            .collect();
        assert_eq!(names, [("2s", "p.retry.2s"), ("1m", "p.retry.1m")]);
        let one = select_tiers(&c, Some(&["1m".to_string()])).expect("one");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].topic, "p.retry.1m");
        let err = select_tiers(&c, Some(&["5m".to_string()])).expect_err("unknown");
        assert!(err.to_string().contains("2s, 1m"), "{err}");
        assert!(select_tiers(&c, Some(&[])).is_err());
    }
}

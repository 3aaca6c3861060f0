//! hookline retry tiers: the delayed re-attempts of failed deliveries, up to the dead-letter
//! topic. (The operator tools on the dead-letter topic — `dead list/show`, replay — are the
//! `hookline-tools` crate.)
//!
//! Module map:
//! - [`tier`] (via [`run`]): one worker per tier topic `<p>.retry.<tier>`, one consumer group
//!   per tier; waits for each record's due time without sleeping in the poll loop, attempts due
//!   records concurrently through the shared delivery path (`hookline-delivery`), which hands
//!   failures to the next tier or `<p>.dlq`.
//! - `rebalance`: a tier consumer's rebalance callbacks (`hookline_common::kafka::rebalance`).
//! - `waiting`: per-partition bookkeeping of a tier worker (held records, head barrier, pause
//!   decisions, contiguous completed offsets), pure logic.
//! - `attempt`: one due record — decoded and given to the delivery path, or parked on
//!   `<p>.invalid` when unreadable.
//! - `due`: when a record is due (its recorded due time, capped against a fast clock).
//! - `orphans`: tier topics no longer in `retry.schedule`, found on the broker and drained.
//! - `metrics`: `hookline_retry_*`.

mod attempt;
mod due;
mod metrics;
mod orphans;
mod paced;
mod pacer;
mod rebalance;
mod tier;
mod waiting;

/// The rate limiter's name among the tiers (`run retry-tier --tier throttle`), its consumer
/// group's stage and its metrics' `tier` / `stage` label.
pub const THROTTLE: &str = "throttle";

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::util::Timeout;
use tokio::task::JoinSet;

use hookline_common::config::{tier_name, Config};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::ProduceErrors;
use hookline_common::kafka::producer_config;
use hookline_common::runtime::ops::{Readiness, StageProbe};
use hookline_common::runtime::shutdown::Shutdown;
use hookline_control::Plane;
use hookline_delivery::{DeliveryPath, Engine, HopWriter};

pub use attempt::BAD_DELIVERY_RECORD;

use crate::attempt::Stage;
use crate::due::DueBound;
use crate::metrics::Metrics;
use crate::tier::Tier;

/// Runs the retry tiers (all, or the `tiers` named) until shutdown, on a control plane of
/// their own; see [`run_with`] to share the process's.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    tiers: Option<Vec<String>>,
) -> anyhow::Result<()> {
    Plane::run_own(&config.clone(), &registry.clone(), |plane| {
        run_with(config, registry, readiness, shutdown, tiers, plane)
    })
    .await
}

/// Runs the worker of every tier of `retry.schedule` and of every orphan tier (a
/// `<p>.retry.<tier>` topic the schedule no longer has, found at start and every minute), or only
/// the tiers named in `tiers` (e.g. `["5m"]`, an orphan's name included), until shutdown: stop
/// fetching, let in-flight attempts finish and hand off within `tiers.shutdown_grace`,
/// commit, return. The first tier to fail stops the others and its error is returned.
pub async fn run_with(
    config: Arc<Config>,
    registry: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    tiers: Option<Vec<String>>,
    plane: Plane,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let orphans = orphans::discover(&config)
        .await
        .context("looking for orphan retry tiers")?;
    let named = tiers.is_some();
    let selected = select_tiers(&config, tiers.as_deref(), &orphans)?;
    if selected.is_empty() {
        tracing::info!(
            "retry.schedule has a single attempt and no orphan tier: no retry tier to run"
        );
        return Ok(());
    }
    let mut needed: Vec<String> = selected
        .iter()
        .filter(|t| !t.orphan)
        .map(|t| t.topic.clone())
        .collect();
    needed.extend([topics.dlq(), topics.invalid()]);
    hookline_common::kafka::require_topics(&config, needed, hookline_common::kafka::TOPICS_WAIT)
        .await?;

    let metrics = Metrics::register(&registry).context("registering retry tier metrics")?;
    // One engine for every tier of the process (`stage="retry"` on its in-flight gauge); each
    // tier counts its attempts as `stage="retry.<tier>"`.
    let engine = Engine::new(
        &config.http,
        config.tiers.endpoint_concurrency,
        &registry,
        "retry",
    )
    .context("building the delivery engine")?;
    let producer: FutureProducer = producer_config(&config)
        .create()
        .context("creating the retry tier producer")?;
    let errors =
        ProduceErrors::register(&registry, "retry").context("registering produce error metrics")?;
    let writer = HopWriter::connect(&config, producer.clone(), errors, shutdown.clone()).await?;
    let stage = Arc::new(Stage {
        path: DeliveryPath::new(
            engine,
            plane.live_endpoints(),
            writer,
            &config.retry.schedule,
        )
        .with_observer(plane.observer())
        .with_endpoint_label_limit(config.control.metrics_endpoint_limit),
        config: config.clone(),
        topics,
        producer,
    });

    // One stop signal for every tier: the process's shutdown, or the first tier that fails.
    let (stop_all, stop) = shutdown.child();
    let mut workers = JoinSet::new();
    let mut running = BTreeSet::new();
    for tier in selected {
        if tier.orphan {
            tracing::warn!(
                tier = %tier.name,
                topic = %tier.topic,
                "orphan retry tier (not in retry.schedule): draining it by the current schedule"
            );
        }
        // An orphan found by itself does not gate readiness (it is drained in the background);
        // a tier named on the command line does.
        let name = tier.group();
        let probe = if tier.orphan && !named {
            StageProbe::detached(&name)
        } else {
            readiness.register(&name)
        };
        running.insert(tier.name.clone());
        let tier_metrics = metrics
            .tier(&tier.name)
            .with_context(|| format!("registering the metrics of tier {}", tier.name))?;
        let worker = tier::run(
            stage.clone(),
            tier,
            tier_metrics,
            probe.clone(),
            stop.clone(),
        );
        workers.spawn(async move {
            let result = worker.await;
            probe.stopped();
            result
        });
    }
    let mut rescans = (!named).then(|| orphans::rescans(config.clone(), stop.clone()));
    let mut failed = None;
    loop {
        tokio::select! {
            joined = workers.join_next() => {
                let Some(joined) = joined else { break };
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
            Some(found) = next_rescan(&mut rescans), if !stop.is_triggered() => {
                for tier in found {
                    if stop.is_triggered() || !running.insert(tier.name.clone()) {
                        continue;
                    }
                    tracing::warn!(
                        tier = %tier.name,
                        topic = %tier.topic,
                        "new orphan retry tier (not in retry.schedule): draining it by the current schedule"
                    );
                    let tier_metrics = match metrics.tier(&tier.name) {
                        Ok(m) => m,
                        Err(e) => {
                            tracing::warn!(tier = %tier.name, error = %e, "registering the metrics of a new orphan tier failed; not draining it");
                            continue;
                        }
                    };
                    let probe = StageProbe::detached(&format!("retry.{}", tier.name));
                    workers.spawn(tier::run(
                        stage.clone(),
                        tier,
                        tier_metrics,
                        probe,
                        stop.clone(),
                    ));
                }
            }
        }
    }
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

/// The next rescan's orphan tiers; pending for ever without rescans (`--tier` named).
async fn next_rescan(
    rescans: &mut Option<tokio::sync::mpsc::Receiver<Vec<Tier>>>,
) -> Option<Vec<Tier>> {
    match rescans {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The tiers of the schedule (every offset after the first) followed by the orphan tiers, or
/// the named subset of both.
fn select_tiers(
    config: &Config,
    names: Option<&[String]>,
    orphans: &[Tier],
) -> anyhow::Result<Vec<Tier>> {
    let topics = Topics::new(&config.topics.prefix);
    let schedule = &config.retry.schedule;
    // The rate limiter: run with the tiers (every process running them takes part in pacing
    // rate-limited endpoints, one owner per endpoint).
    let throttle = Tier {
        name: THROTTLE.to_string(),
        topic: topics.throttle(),
        bound: DueBound::of_tier(schedule, 0),
        orphan: false,
        pacer: Some(Arc::new(pacer::Pacer::default())),
    };
    let all: Vec<Tier> = schedule
        .iter()
        .enumerate()
        .skip(1)
        .map(|(index, offset)| Tier {
            name: tier_name(*offset),
            topic: topics.retry(*offset),
            bound: DueBound::of_tier(schedule, index),
            orphan: false,
            pacer: None,
        })
        .chain(orphans.iter().cloned())
        .chain([throttle])
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
                "unknown retry tier `{name}`: the tiers of retry.schedule (and orphan tier topics) are {}",
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
        let orphan = Tier {
            name: "5m".into(),
            topic: "p.retry.5m".into(),
            bound: DueBound::of_orphan(&c.retry.schedule, Duration::from_secs(300)),
            orphan: true,
            pacer: None,
        };
        let with_orphan = select_tiers(&c, None, std::slice::from_ref(&orphan)).expect("all");
        assert_eq!(
            with_orphan.len(),
            4,
            "two tiers, the orphan, the rate limiter"
        );
        assert!(with_orphan[2].orphan);
        assert!(with_orphan[3].pacer.is_some());
        assert_eq!(with_orphan[3].topic, "p.throttle");
        assert_eq!(with_orphan[1].bound.max_delay_ms, 58_000, "1m - 2s");
        let named = select_tiers(&c, Some(&["5m".to_string()]), &[orphan]).expect("orphan");
        assert_eq!(named[0].topic, "p.retry.5m");
        let all = select_tiers(&c, None, &[]).expect("all");
        let names: Vec<(&str, &str)> = all
            .iter()
            .map(|t| (t.name.as_str(), t.topic.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("2s", "p.retry.2s"),
                ("1m", "p.retry.1m"),
                ("throttle", "p.throttle")
            ]
        );
        let one = select_tiers(&c, Some(&["1m".to_string()]), &[]).expect("one");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].topic, "p.retry.1m");
        let err = select_tiers(&c, Some(&["5m".to_string()]), &[]).expect_err("unknown");
        assert!(err.to_string().contains("2s, 1m, throttle"), "{err}");
        assert!(select_tiers(&c, Some(&[]), &[]).is_err());
    }
}

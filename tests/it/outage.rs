//! `hookline run all` on a single broker that goes away: down while the process starts, then
//! stopped for 10 s mid-stream under load. Every stage — deduper, dispatcher, retry tiers, the
//! admin process and the control plane — rides it out through the transient-retry path; the
//! process never exits, nothing is lost and nothing is dispatched twice (issue 39, defect 2).
//! On a broker of its own (`DedicatedBroker`), never the shared one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown;

use crate::harness::*;
use crate::receiver::Receiver;
use crate::resilience::{id_counts, produce_ids, read_from, DedicatedBroker};

/// The process is still running; else the test fails with the end of its log.
fn assert_alive(pipeline: &mut Hookline, log: &std::path::Path, when: &str) {
    if let Some(status) = pipeline.child.try_wait().expect("try_wait") {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        panic!(
            "`run all` exited ({status}) {when}; log tail:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_rides_out_a_single_broker_stopped_at_start_and_for_10s_mid_stream() {
    let broker = DedicatedBroker::start_new("outage");
    let bootstrap = broker.bootstrap();
    let prefix = unique_prefix("outage");
    let rx = Receiver::start().await;
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{bootstrap}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [http]\nallow_cidrs = [\"127.0.0.0/8\"]\n[log]\nlevel = \"info\"\n\
         [retry]\nschedule = [\"0s\", \"1s\", \"2s\"]\n\
         [[endpoints]]\nid = \"ep\"\nurl = \"{}\"\n",
        rx.url("ep")
    );
    let config_path = dir.join("hookline.toml");
    std::fs::write(&config_path, &text).expect("write config");
    let config = hookline_common::config::Config::from_toml_with_env(&text, "test", Vec::new())
        .expect("config");
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let log = dir.join("run-all.log");

    // Down while every stage starts: metadata, orphan tiers, restores, transactions, the
    // idempotency window, the control plane's tails.
    broker.run("stop");
    let mut pipeline = Hookline::start(&config_path, &["run", "all"], &[], &log);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_alive(&mut pipeline, &log, "while the broker was down at start-up");
    broker.run("start");

    // Under load: waves of 100 ids (25 of them sent twice), one every 500 ms, while the broker
    // is stopped for 10 s after the third wave.
    let waves = 12;
    let producer = {
        let (bootstrap, events) = (bootstrap.clone(), events.clone());
        tokio::spawn(async move {
            for w in 0..waves {
                let mut ids: Vec<String> = (0..100).map(|i| format!("w{w:02}-{i:03}")).collect();
                ids.extend((0..25).map(|i| format!("w{w:02}-{i:03}")));
                produce_ids(&bootstrap, &events, &ids).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let first = Instant::now();
    while rx.requests("ep").len() < 300 && first.elapsed() < Duration::from_secs(120) {
        assert_alive(&mut pipeline, &log, "before the mid-stream outage");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    broker.run("stop");
    let stopped = Instant::now();
    while stopped.elapsed() < Duration::from_secs(10) {
        assert_alive(&mut pipeline, &log, "while the broker was stopped");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    broker.run("start");
    producer.await.expect("producer task");

    let expected = waves * 100;
    let start = Instant::now();
    let distinct = |rx: &Receiver| -> BTreeMap<String, usize> {
        let mut by_id = BTreeMap::new();
        for r in rx.requests("ep") {
            *by_id.entry(r.headers["webhook-id"].clone()).or_default() += 1;
        }
        by_id
    };
    while distinct(&rx).len() < expected && start.elapsed() < Duration::from_secs(180) {
        assert_alive(&mut pipeline, &log, "after the broker came back");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let received = distinct(&rx);
    assert_eq!(received.len(), expected, "every event delivered");
    assert_alive(&mut pipeline, &log, "at the end");

    // Exactly one dispatch per id (the deduper's transactions through the outage).
    let dispatched = read_from(
        &bootstrap,
        &format!("{prefix}.dispatch"),
        Duration::from_secs(60),
        |r| id_counts(r).len() >= expected,
    );
    let counts = id_counts(&dispatched);
    assert_eq!(counts.len(), expected, "every id on {prefix}.dispatch");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "dispatched more than once: {twice:?}");
    let again: Vec<_> = received.iter().filter(|(_, n)| **n > 1).collect();
    println!(
        "outage: {expected} events delivered, {} received more than once (at-least-once redelivery)",
        again.len()
    );
    // Nothing dead: the endpoint answered 200 throughout.
    let dead = read_from(
        &bootstrap,
        &format!("{prefix}.dlq"),
        Duration::from_secs(3),
        |_| false,
    );
    assert!(dead.is_empty(), "{} dead letters", dead.len());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("stage failed"),
        "a stage failed: {}",
        text.lines()
            .filter(|l| l.contains("stage failed"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(pipeline);
    drop(broker);
}

/// The moment `run all` is most exposed: its control plane is up, and the broker goes away just
/// as the stages start (orphan-tier discovery, topic checks, restores, transactions, the
/// idempotency window). Every stage waits for it instead of failing its start, and delivers
/// once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stage_starts_through_a_stopped_single_broker() {
    let broker = DedicatedBroker::start_new("startdown");
    let bootstrap = broker.bootstrap();
    let prefix = unique_prefix("startdown");
    let rx = Receiver::start().await;
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{bootstrap}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [http]\nallow_cidrs = [\"127.0.0.0/8\"]\n[retry]\nschedule = [\"0s\", \"1s\"]\n\
         [[endpoints]]\nid = \"ep\"\nurl = \"{}\"\n",
        rx.url("ep")
    );
    let config = Arc::new(
        hookline_common::config::Config::from_toml_with_env(&text, "test", Vec::new())
            .expect("config"),
    );
    apply_topics(&config).await;
    let registry = prometheus::Registry::new();
    let readiness = Readiness::default();
    let plane =
        hookline_control::Plane::start(&config, hookline_control::Keyring::empty(), &registry)
            .await
            .expect("control plane");

    broker.run("stop");
    let (trigger, stop) = shutdown::channel();
    let mut stages = tokio::task::JoinSet::new();
    let named = |name: &'static str, f: BoxedStage| async move { (name, f.await) };
    stages.spawn(named(
        "deduper",
        Box::pin(hookline_deduper::run(
            config.clone(),
            registry.clone(),
            readiness.clone(),
            stop.clone(),
        )),
    ));
    stages.spawn(named(
        "dispatcher",
        Box::pin(hookline_dispatcher::run_with(
            config.clone(),
            registry.clone(),
            readiness.clone(),
            stop.clone(),
            plane.clone(),
        )),
    ));
    stages.spawn(named(
        "retry-tiers",
        Box::pin(hookline_retry_tiers::run_with(
            config.clone(),
            registry.clone(),
            readiness.clone(),
            stop.clone(),
            None,
            plane.clone(),
        )),
    ));
    stages.spawn(named(
        "admin",
        Box::pin(hookline_admin::run_with(
            config.clone(),
            registry.clone(),
            readiness.clone(),
            stop.clone(),
            true,
            plane.clone(),
        )),
    ));
    // Longer than any single Kafka request's timeout (10 s): a start-up call that is not retried
    // fails in this time.
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(15) {
        if let Some(Ok((name, result))) = stages.try_join_next() {
            panic!("stage {name} ended while the broker was down: {result:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    broker.run("start");

    let ids: Vec<String> = (0..200).map(|i| format!("sd-{i:03}")).collect();
    produce_ids(&bootstrap, &format!("{prefix}.events"), &ids).await;
    let started = Instant::now();
    loop {
        if let Some(Ok((name, result))) = stages.try_join_next() {
            panic!("stage {name} ended after the broker came back: {result:?}");
        }
        let got: std::collections::BTreeSet<String> = rx
            .requests("ep")
            .iter()
            .map(|r| r.headers["webhook-id"].clone())
            .collect();
        if got.len() == ids.len() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "{} of {} delivered",
            got.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    trigger.trigger();
    while let Some(joined) = stages.join_next().await {
        let (name, result) = joined.expect("stage panicked");
        result.unwrap_or_else(|e| panic!("stage {name} stopped with an error: {e:#}"));
    }
    plane.close().await;
    drop(broker);
}

type BoxedStage = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

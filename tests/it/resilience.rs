//! Stages that stay up, say when they are ready and alive, and never half-commit:
//! - deduper stage B aborts its open transaction on an error exit and refuses mismatched
//!   partition counts (issue 8, item 8);
//! - `/readyz` means assigned (and restored), `/healthz` means the stage loops turn (item 13);
//! - a broker bounce is retried through, not a reason to exit (item 14), on a dedicated broker.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::TopicPartitionList;

use hookline_common::config::Config;
use hookline_common::contract::headers as h;
use hookline_common::runtime::ops::{self, Readiness};
use hookline_common::runtime::shutdown;

use crate::harness::*;

/// Event id header of each record → how many times it was seen.
pub(crate) fn id_counts(records: &[OwnedMessage]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for m in records {
        if let Some(id) = header(m, h::EVENT_ID) {
            *counts.entry(id.to_string()).or_default() += 1;
        }
    }
    counts
}

fn event(id: &str) -> String {
    format!(r#"{{"id":"{id}","type":"order.paid","data":{{}}}}"#)
}

/// Waits for a stage's task to end (it is expected to fail) and returns its result.
async fn wait_for_exit(running: &mut Running, deadline: Duration) -> anyhow::Result<()> {
    let handle = running.handle.take().expect("stage handle");
    tokio::time::timeout(deadline, handle)
        .await
        .expect("the stage did not exit")
        .expect("the stage panicked")
}

/// Creates the deduper's topics by hand (`(suffix, partitions)`), starts it and returns the error
/// it must refuse to start with.
async fn refusal(config: &hookline_common::config::Config, topics: &[(&str, i32)]) -> String {
    let prefix = &config.topics.prefix;
    let names: Vec<(String, i32)> = topics
        .iter()
        .map(|(t, n)| (format!("{prefix}.{t}"), *n))
        .collect();
    let new: Vec<NewTopic> = names
        .iter()
        .map(|(name, n)| NewTopic::new(name, *n, TopicReplication::Fixed(1)))
        .collect();
    for r in admin()
        .create_topics(new.iter(), &admin_opts())
        .await
        .expect("create topics")
    {
        r.expect("topic created");
    }
    let mut running = start_deduper(config);
    let err = wait_for_exit(&mut running, Duration::from_secs(90))
        .await
        .expect_err("stage B must refuse to start");
    format!("{err:#}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_b_refuses_a_changelog_with_another_partition_count() {
    require_kafka();
    let prefix = unique_prefix("partmismatch");
    let config = test_config(&prefix, "");
    // By hand: every topic with 3 partitions but the changelog, which has 2.
    let msg = refusal(
        &config,
        &[
            ("events", 3),
            ("invalid", 3),
            ("dedupe", 3),
            ("dispatch", 3),
            ("dedupe-state", 2),
        ],
    )
    .await;
    assert!(
        msg.contains(&format!("{prefix}.dedupe-state has 2 partitions"))
            && msg.contains(&format!("{prefix}.dedupe has 3")),
        "the error names both topics and their counts: {msg}"
    );
}

/// With `dedupe.direct` (the default) events partition `n` is read with dedupe partition `n`:
/// `<p>.events` with another partition count is refused, naming the setting that avoids it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_stage_b_refuses_events_with_another_partition_count() {
    require_kafka();
    let prefix = unique_prefix("directmismatch");
    let config = test_config(&prefix, "");
    let msg = refusal(
        &config,
        &[
            ("invalid", 3),
            ("dedupe", 3),
            ("dedupe-state", 3),
            ("dispatch", 3),
            ("events", 5),
        ],
    )
    .await;
    assert!(
        msg.contains(&format!("{prefix}.events has 5 partitions"))
            && msg.contains(&format!("{prefix}.dedupe has 3"))
            && msg.contains("dedupe.direct = false"),
        "the error names both topics, their counts and the setting: {msg}"
    );
}

/// A failure between the dispatch send and the changelog send (here: the changelog topic was
/// deleted under the running stage, so the changelog send fails at once) must abort the open
/// transaction: the dispatch record is never committed without its changelog record and offset,
/// so after the restart the event is dispatched exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_exit_aborts_the_open_transaction() {
    require_kafka();
    let prefix = unique_prefix("abortexit");
    // The stage's producer learns within a second that the deleted changelog is gone (instead
    // of librdkafka's 30 s allowance for metadata propagation), so a send to it fails at once.
    let config = test_config(
        &prefix,
        "[kafka.options]\n\"topic.metadata.refresh.interval.ms\" = \"500\"\n\
         \"topic.metadata.propagation.max.ms\" = \"100\"\n",
    );
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let dispatch = format!("{prefix}.dispatch");
    let state = format!("{prefix}.dedupe-state");
    let p = producer();
    let mut running = start_deduper(&config);
    produce(
        &p,
        &events,
        Some(0),
        None,
        Some(event("e1").as_bytes()),
        &[],
    )
    .await;
    let out = read_until(&dispatch, Duration::from_secs(60), |r| {
        id_counts(r).contains_key("e1")
    });
    assert_eq!(id_counts(&out).get("e1"), Some(&1), "e1 dispatched");

    for r in admin()
        .delete_topics(&[&state], &admin_opts())
        .await
        .expect("delete the changelog")
    {
        r.expect("changelog deleted");
    }
    // Not waiting for a result: giving the stage's producer a few metadata refreshes to learn
    // that the changelog is gone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    produce(
        &p,
        &events,
        Some(0),
        None,
        Some(event("e2").as_bytes()),
        &[],
    )
    .await;
    let result = wait_for_exit(&mut running, Duration::from_secs(60)).await;
    assert!(result.is_err(), "the changelog send fails, the stage stops");
    let after_exit = read_until(&dispatch, Duration::from_secs(5), |_| false);
    assert_eq!(
        id_counts(&after_exit).get("e2"),
        None,
        "no committed dispatch record of e2 without its changelog record and offset"
    );

    // The operator recreates the changelog; the restarted stage dispatches e2 exactly once.
    apply_topics(&config).await;
    let running = start_deduper(&config);
    let out = read_until(&dispatch, Duration::from_secs(90), |r| {
        id_counts(r).contains_key("e2")
    });
    assert!(
        id_counts(&out).contains_key("e2"),
        "e2 dispatched after the restart"
    );
    let settled = read_until(&dispatch, Duration::from_secs(3), |_| false);
    let counts = id_counts(&settled);
    assert_eq!(counts.get("e1"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("e2"), Some(&1), "{counts:?}");
    running.stop().await.expect("clean stop");
}

/// GETs an ops endpoint: (status, body).
async fn probe(client: &reqwest::Client, addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    match client.get(format!("http://{addr}{path}")).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

fn histogram_count(registry: &prometheus::Registry, name: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .map(|m| m.get_histogram().get_sample_count())
        .sum()
}

/// Every stage in one process (as `run all`) behind one ops server: `/readyz` answers 503 naming
/// the stages until each has its assignment and stage B has restored all 3 partitions, then 200;
/// `/healthz` is 200 while the loops turn; once the stages stop, `/readyz` is 503 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_means_assigned_and_restored_and_healthz_that_loops_turn() {
    require_kafka();
    let prefix = unique_prefix("probes");
    let config = test_config(&prefix, "[retry]\nschedule = [\"0s\", \"2s\"]\n");
    apply_topics(&config).await;
    let config = Arc::new(config);
    let registry = prometheus::Registry::new();
    let readiness = Readiness::default();
    // The ops server outlives the stages: its own shutdown.
    let (ops_trigger, ops_shutdown) = shutdown::channel();
    let (addr, _ops) = ops::serve(
        config.server.listen,
        registry.clone(),
        readiness.clone(),
        ops_shutdown,
    )
    .await
    .expect("ops server");
    let (trigger, stop) = shutdown::channel();
    let mut stages = tokio::task::JoinSet::new();
    stages.spawn(hookline_deduper::run(
        config.clone(),
        registry.clone(),
        readiness.clone(),
        stop.clone(),
    ));
    // One control plane for the process, as `run all` has.
    let plane =
        hookline_control::Plane::start(&config, hookline_control::Keyring::empty(), &registry)
            .await
            .expect("control plane");
    stages.spawn(hookline_dispatcher::run_with(
        config.clone(),
        registry.clone(),
        readiness.clone(),
        stop.clone(),
        plane.clone(),
    ));
    stages.spawn(hookline_retry_tiers::run_with(
        config.clone(),
        registry.clone(),
        readiness.clone(),
        stop.clone(),
        None,
        plane,
    ));

    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut first_unready = None;
    let restored_when_ready = loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "never ready; last: {first_unready:?}"
        );
        let (status, body) = probe(&client, addr, "/readyz").await;
        if status == 200 {
            break histogram_count(&registry, "hookline_deduper_restore_duration_seconds");
        }
        first_unready.get_or_insert((status, body));
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (status, body) = first_unready.expect("/readyz answered 503 before the assignment");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("deduper.dedupe"), "names the stages: {body}");
    assert_eq!(
        restored_when_ready, 3,
        "ready only once stage B has restored every partition"
    );
    let (status, body) = probe(&client, addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    trigger.trigger();
    while let Some(r) = stages.join_next().await {
        r.expect("stage panicked").expect("stage stopped cleanly");
    }
    let (status, body) = probe(&client, addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("(stopped)"), "{body}");
    let (status, _) = probe(&client, addr, "/healthz").await;
    assert_eq!(status, 200, "a stopped stage is not judged stuck");
    ops_trigger.trigger();
}

/// A broker of this test's own, on free ports, bounced by the project's script. Never the shared
/// broker: other tests run against it in parallel.
pub(crate) struct DedicatedBroker {
    port: u16,
    controller_port: u16,
    data_dir: PathBuf,
    /// More of deploy/local/kafka's settings (the secured listeners).
    env: Vec<(String, String)>,
}

/// A port nothing listens on right now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl DedicatedBroker {
    pub(crate) fn start_new(name: &str) -> Self {
        Self::start_with(name, Vec::new())
    }

    /// [`DedicatedBroker::start_new`] with more of deploy/local/kafka's environment.
    pub(crate) fn start_with(name: &str, env: Vec<(String, String)>) -> Self {
        let port = free_port();
        let mut controller_port = free_port();
        while controller_port == port {
            controller_port = free_port();
        }
        let broker = DedicatedBroker {
            port,
            controller_port,
            data_dir: std::env::temp_dir().join(unique_prefix(name)),
            env,
        };
        broker.run("start");
        broker
    }

    pub(crate) fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    pub(crate) fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub(crate) fn run(&self, command: &str) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/local/kafka");
        let out = Command::new(script)
            .arg(command)
            .env("KAFKA_PORT", self.port.to_string())
            .env("KAFKA_CONTROLLER_PORT", self.controller_port.to_string())
            .env("KAFKA_DATA_DIR", &self.data_dir)
            // A small heap: the machine is shared.
            .env("KAFKA_HEAP", "-Xmx512m -Xms256m")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("run deploy/local/kafka");
        assert!(
            out.status.success(),
            "kafka {command} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for DedicatedBroker {
    fn drop(&mut self) {
        // Stops it and deletes its data.
        self.run("reset");
    }
}

pub(crate) fn dedicated_config(bootstrap: &str, prefix: &str) -> Config {
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{bootstrap}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n"
    );
    Config::from_toml_with_env(&text, "test", Vec::new()).expect("config")
}

pub(crate) async fn produce_ids(bootstrap: &str, topic: &str, ids: &[String]) {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let sends = ids.iter().enumerate().map(|(i, id)| {
        let value = event(id);
        let p = p.clone();
        async move {
            p.send(
                FutureRecord::<[u8], [u8]>::to(topic)
                    .partition((i % 3) as i32)
                    .payload(value.as_bytes()),
                Duration::from_secs(60),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
        }
    });
    futures::future::join_all(sends).await;
}

/// Reads `topic` on `bootstrap` (read_committed) until `done` or the deadline.
pub(crate) fn read_from(
    bootstrap: &str,
    topic: &str,
    deadline: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool,
) -> Vec<OwnedMessage> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique_prefix("reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < deadline && !done(&out) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            out.push(m.detach());
        }
    }
    out
}

/// The deduper keeps running through a broker outage at startup (metadata, transactions,
/// restore) and a broker bounce mid-stream, and every event is still dispatched exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deduper_rides_out_broker_restarts_exactly_once() {
    let broker = DedicatedBroker::start_new("bounce");
    let bootstrap = broker.bootstrap();
    let prefix = unique_prefix("bounce");
    let config = dedicated_config(&bootstrap, &prefix);
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let dispatch = format!("{prefix}.dispatch");
    // 300 ids, 100 of them sent twice.
    let wave = |tag: &str| -> Vec<String> {
        let mut ids: Vec<String> = (0..300).map(|i| format!("{tag}-{i}")).collect();
        ids.extend((0..100).map(|i| format!("{tag}-{i}")));
        ids
    };
    produce_ids(&bootstrap, &events, &wave("w1")).await;

    // The broker is down while the stages start: metadata, init_transactions and restore meet
    // "all brokers down" / timeouts.
    broker.run("stop");
    let running = start_deduper(&config);
    tokio::time::sleep(Duration::from_secs(3)).await; // the stages are now retrying
    broker.run("start");
    let out = read_from(&bootstrap, &dispatch, Duration::from_secs(180), |r| {
        id_counts(r).len() >= 300
    });
    assert!(
        !running.handle.as_ref().is_some_and(|h| h.is_finished()),
        "the deduper exited during the outage"
    );
    assert_eq!(id_counts(&out).len(), 300, "first wave dispatched");

    // Mid-stream: a second wave, and the broker bounces while it flows.
    produce_ids(&bootstrap, &events, &wave("w2")).await;
    broker.run("stop");
    broker.run("start");
    let out = read_from(&bootstrap, &dispatch, Duration::from_secs(180), |r| {
        id_counts(r).len() >= 600
    });
    assert!(
        !running.handle.as_ref().is_some_and(|h| h.is_finished()),
        "the deduper exited after the bounce"
    );
    assert_eq!(id_counts(&out).len(), 600, "second wave dispatched");
    let settled = read_from(&bootstrap, &dispatch, Duration::from_secs(5), |_| false);
    let dups: Vec<_> = id_counts(&settled)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(dups.is_empty(), "dispatched more than once: {dups:?}");
    running.stop().await.expect("clean stop");
}

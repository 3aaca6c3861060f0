//! Rebalances never fork a retry chain (issue 8 item 7): members of the dispatcher and retry-tier
//! groups join and leave repeatedly while slow failing attempts are in flight, and afterwards
//! every (event, endpoint) has exactly one chain: at most one record per (event, endpoint,
//! attempt) on each tier topic and exactly one dead letter.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_common::config::Config;
use hookline_common::contract::headers as h;
use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown;

use crate::harness::*;
use crate::receiver::{Behavior, Receiver};

const EVENTS: usize = 60;

/// A dispatcher and every retry tier, in this process, waiting until the tiers are assigned.
struct Member {
    dispatcher: Running,
    tiers: Running,
}

async fn start_member(config: &Config) -> Member {
    let dispatcher = start_dispatcher(config);
    let (trigger, shutdown) = shutdown::channel();
    let registry = prometheus::Registry::new();
    let readiness = Readiness::default();
    let handle = tokio::spawn(hookline_retry_tiers::run(
        Arc::new(config.clone()),
        registry.clone(),
        readiness.clone(),
        shutdown,
        None,
    ));
    let start = Instant::now();
    while readiness.check().is_err() {
        assert!(!handle.is_finished(), "retry tiers exited early");
        assert!(start.elapsed() < Duration::from_secs(60), "tiers not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Member {
        dispatcher,
        tiers: Running {
            trigger,
            handle: Some(handle),
            registry,
        },
    }
}

impl Member {
    async fn stop(self) {
        let (d, t) = futures::join!(self.dispatcher.stop(), self.tiers.stop());
        d.expect("dispatcher stops cleanly");
        t.expect("tiers stop cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_rebalances_never_fork_a_retry_chain() {
    require_kafka();
    let rx = Receiver::start().await;
    // Slow failures: attempts are in flight whenever a rebalance happens.
    rx.default("down", Behavior::Delay(Duration::from_millis(1500), 500));
    let prefix = unique_prefix("rebal-fork");
    let extra = format!(
        "[kafka.options]\n\"heartbeat.interval.ms\" = \"300\"\n\
         [retry]\nschedule = [\"0s\", \"3s\", \"6s\", \"9s\"]\n\
         [dispatcher]\nshutdown_grace = \"1s\"\nmax_in_flight_per_partition = 8\n\
         [[endpoints]]\nid = \"down\"\nurl = \"{}\"\n",
        rx.url("down")
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    let dispatch = format!("{prefix}.dispatch");
    for i in 0..EVENTS {
        let id = format!("ev-{i:03}");
        let body = format!("{{\"id\":\"{id}\",\"type\":\"order.paid\",\"data\":{{}}}}");
        produce(
            &p,
            &dispatch,
            Some(i as i32 % 3),
            Some(id.as_bytes()),
            Some(body.as_bytes()),
            &[(h::EVENT_ID, id.as_str()), (h::EVENT_TYPE, "order.paid")],
        )
        .await;
    }

    let first = start_member(&config).await;
    // A second member joins and leaves four times while attempts are in flight.
    for round in 0..4 {
        let before = rx.requests("down").len();
        rx.wait_for("down", before + 5, Duration::from_secs(30))
            .await;
        let second = start_member(&config).await;
        let joined = rx.requests("down").len();
        rx.wait_for("down", joined + 5, Duration::from_secs(30))
            .await;
        second.stop().await;
        println!(
            "rebalance round {round}: {} requests so far",
            rx.requests("down").len()
        );
    }

    // Every delivery dies after its 4 attempts.
    let dlq_topic = format!("{prefix}.dlq");
    let dead = read_all_quiet(
        &dlq_topic,
        EVENTS,
        Duration::from_secs(120),
        Duration::from_secs(4),
    );
    first.stop().await;
    let mut forks = Vec::new();
    for tier in ["3s", "6s", "9s"] {
        let topic = format!("{prefix}.retry.{tier}");
        let records = read_until(&topic, Duration::from_secs(5), |_| false);
        let mut seen: BTreeMap<(String, String, String), usize> = BTreeMap::new();
        for m in &records {
            let key = (
                header(m, h::EVENT_ID).unwrap_or("?").to_string(),
                header(m, "hookline-endpoint-id").unwrap_or("?").to_string(),
                header(m, "hookline-attempt").unwrap_or("?").to_string(),
            );
            *seen.entry(key).or_default() += 1;
        }
        for (key, n) in seen {
            if n > 1 {
                forks.push(format!("{topic}: {key:?} x{n}"));
            }
        }
    }
    let mut dead_per: BTreeMap<String, usize> = BTreeMap::new();
    for m in &dead {
        *dead_per
            .entry(header(m, h::EVENT_ID).unwrap_or("?").to_string())
            .or_default() += 1;
    }
    for (event, n) in &dead_per {
        if *n > 1 {
            forks.push(format!("{dlq_topic}: {event} x{n}"));
        }
    }
    assert!(forks.is_empty(), "forked retry chains: {forks:#?}");
    assert_eq!(
        dead_per.len(),
        EVENTS,
        "every delivery ended in exactly one dead letter"
    );
}

/// `reassign_at` (stage B's way out when librdkafka never starts fetching a restored partition):
/// outside any rebalance callback, a paused partition of a group member is assigned again at a
/// given offset and fetched from exactly there, and the member keeps its other partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_assigned_again_is_fetched_from_the_given_offset() {
    use rdkafka::admin::{NewTopic, TopicReplication};
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    require_kafka();
    let topic = format!("{}.reassign", unique_prefix("reassign"));
    admin()
        .create_topics(
            [&NewTopic::new(&topic, 2, TopicReplication::Fixed(1))],
            &admin_opts(),
        )
        .await
        .expect("create topic");
    let p = producer();
    for i in 0..10u8 {
        produce(&p, &topic, Some(0), None, Some(&[i]), &[]).await;
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("{topic}.group"))
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("auto.offset.reset", "latest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer.assignment().map_or(0, |a| a.count()) < 2 {
        assert!(Instant::now() < deadline, "never assigned both partitions");
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            panic!("read offset {} before any record was due", m.offset());
        }
    }
    // Paused, as stage B holds a partition until its seen-set is restored.
    let mut p0 = TopicPartitionList::new();
    p0.add_partition(&topic, 0);
    consumer.pause(&p0).expect("pause");

    hookline_common::kafka::rebalance::reassign_at(&consumer, &topic, 0, Offset::Offset(3))
        .expect("reassign_at");

    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 7 {
        assert!(Instant::now() < deadline, "read only offsets {got:?}");
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consume");
            assert_eq!(m.partition(), 0);
            got.push(m.offset());
        }
    }
    assert_eq!(got, (3..10).collect::<Vec<i64>>());
    let assigned = consumer.assignment().expect("assignment");
    assert_eq!(assigned.count(), 2, "the member kept its other partition");
}

//! Retry tiers, dead letters and replay against the real broker and a recording receiver, with
//! the schedule compressed to seconds: attempts at +0, 2, 4, 6, 8, 10, 12 s (seven attempts, the
//! default schedule's shape).
//!
//! A chain starts the way the dispatcher starts it: attempt 1 is made with the real delivery
//! engine against the receiver, and its failure is handed to the first tier with
//! `hop::after_failure` + the delivery record headers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use hookline_common::config::Config;
use hookline_common::contract::delivery::{now_ms, AttemptRecord, DeadReason, DeliveryMeta};
use hookline_common::contract::headers as h;
use hookline_common::contract::secret::decode_secret;
use hookline_common::contract::topics::Topics;
use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown;
use hookline_delivery::hop::{self, Hop};
use hookline_delivery::{signing, Endpoints, Engine};

use crate::harness::*;
use crate::receiver::{Behavior, Receiver, Recorded};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SCHEDULE: &str =
    "[retry]\nschedule = [\"0s\", \"2s\", \"4s\", \"6s\", \"8s\", \"10s\", \"12s\"]\n[dispatcher]\nshutdown_grace = \"5s\"\n";
/// Offsets of attempts 1..=7 from the first attempt.
const OFFSETS_MS: [i64; 7] = [0, 2_000, 4_000, 6_000, 8_000, 10_000, 12_000];

fn endpoint_toml(id: &str, url: &str, extra: &str) -> String {
    format!("[[endpoints]]\nid = \"{id}\"\nurl = \"{url}\"\nsecrets = [\"{SECRET}\"]\n{extra}\n")
}

/// Runs the retry tiers in this process and waits until every selected tier has its partitions.
pub async fn start_tiers(config: &Config, tiers: Option<Vec<String>>) -> Running {
    let (trigger, shutdown) = shutdown::channel();
    let registry = prometheus::Registry::new();
    let readiness = Readiness::default();
    let handle = tokio::spawn(hookline_retry_tiers::run(
        Arc::new(config.clone()),
        registry.clone(),
        readiness.clone(),
        shutdown,
        tiers,
    ));
    let start = Instant::now();
    while readiness.check().is_err() {
        if handle.is_finished() {
            let result = handle.await.expect("tiers task");
            panic!("retry tiers exited before being ready: {result:?}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "retry tiers not ready after 60s: {:?}",
            readiness.check()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Running {
        trigger,
        handle: Some(handle),
        registry,
    }
}

fn test_engine(config: &Config) -> Engine {
    Engine::new(&config.http, 64, &prometheus::Registry::new(), "test").expect("engine")
}

/// A delivery whose first attempt failed and was handed to the first tier.
struct Started {
    event_id: String,
    body: Vec<u8>,
    /// The metadata as handed off (attempt = 2, history = attempt 1).
    meta: DeliveryMeta,
}

fn event_body(event_id: &str, event_type: &str) -> Vec<u8> {
    // Non-ASCII and odd spacing: the endpoint must get these exact bytes on every attempt.
    format!(
        "{{\"id\":\"{event_id}\", \"type\":\"{event_type}\",\"tenant\":\"acme\",\"data\":{{\"text\":\"h\u{e9}llo\"}}}}"
    )
    .into_bytes()
}

/// Attempt 1 with the real engine, then the hand-off to the first tier, as the dispatcher does.
async fn start_delivery(
    config: &Config,
    engine: &Engine,
    producer: &FutureProducer,
    endpoint: &str,
    event_id: &str,
) -> Started {
    let ep = Endpoints::new(&config.endpoints)
        .get(endpoint)
        .expect("endpoint is configured");
    let body = event_body(event_id, "message.created");
    let outcome = engine.deliver(&ep, event_id, body.clone().into(), 1).await;
    assert!(
        !outcome.result.is_delivered(),
        "attempt 1 of {event_id} must fail to start a retry chain"
    );
    let mut meta = DeliveryMeta::new(
        endpoint,
        event_id,
        "message.created",
        Some("acme"),
        outcome.started_at_ms,
    );
    let topics = Topics::new(&config.topics.prefix);
    let Hop::Retry { topic, .. } =
        hop::after_failure(&mut meta, &outcome, &topics, &config.retry.schedule)
    else {
        panic!("the schedule has tiers");
    };
    let headers = meta.to_headers();
    let mut pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.push((h::DEDUPE_KEY, event_id));
    produce(
        producer,
        &topic,
        None,
        Some(event_id.as_bytes()),
        Some(&body),
        &pairs,
    )
    .await;
    Started {
        event_id: event_id.to_string(),
        body,
        meta,
    }
}

fn attempt_of(r: &Recorded) -> u32 {
    r.headers
        .get("webhook-attempt")
        .and_then(|a| a.parse().ok())
        .expect("webhook-attempt header")
}

/// Checks a delivery's requests: attempts 1..=n in arrival order, the same `webhook-id`, the same
/// bytes, a valid and fresh signature each time, each attempt at its offset from the first (not
/// early, under 3 s late). Returns the lateness (ms) of attempts 2..=n.
fn check_attempts(reqs: &[Recorded], s: &Started, n: usize) -> Vec<i64> {
    assert_eq!(
        reqs.len(),
        n,
        "{}: expected {n} attempts, got {:?}",
        s.event_id,
        reqs.iter().map(attempt_of).collect::<Vec<_>>()
    );
    let key = decode_secret(SECRET).expect("secret");
    let mut lateness = Vec::new();
    let mut signatures = BTreeSet::new();
    for (i, r) in reqs.iter().enumerate() {
        let n = i + 1;
        assert_eq!(attempt_of(r) as usize, n, "{}: attempt order", s.event_id);
        assert_eq!(r.headers["webhook-id"], s.event_id);
        assert_eq!(
            r.body, s.body,
            "{}: body must be byte-identical",
            s.event_id
        );
        let ts: i64 = r.headers["webhook-timestamp"].parse().expect("timestamp");
        let sig = &r.headers["webhook-signature"];
        assert!(
            signing::verify(&key, &s.event_id, ts, &r.body, sig),
            "{}: attempt {n} signature does not verify",
            s.event_id
        );
        signatures.insert(sig.clone());
        if n > 1 {
            let due = s.meta.first_attempt_ms + OFFSETS_MS[i];
            let late = r.at_ms - due;
            assert!(
                late >= 0,
                "{}: attempt {n} came {}ms early",
                s.event_id,
                -late
            );
            assert!(
                late < 3_000,
                "{}: attempt {n} came {late}ms late",
                s.event_id
            );
            lateness.push(late);
        }
    }
    assert_eq!(signatures.len(), n, "a fresh signature per attempt");
    lateness
}

fn print_lateness(what: &str, mut ms: Vec<i64>) {
    ms.sort_unstable();
    if ms.is_empty() {
        return;
    }
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: lateness over {} retry attempts: min {} ms, p50 {} ms, p99 {} ms, max {} ms",
        ms.len(),
        ms[0],
        at(0.5),
        at(0.99),
        ms[ms.len() - 1]
    );
}

/// Polls for `quiet`: fails as soon as a path gets more requests than expected.
async fn assert_quiet(rx: &Receiver, expected: &[(&str, usize)], quiet: Duration) {
    let start = Instant::now();
    while start.elapsed() < quiet {
        for (path, n) in expected {
            let got = rx.requests(path).len();
            assert!(
                got <= *n,
                "{path}: {got} requests, expected {n} and no more"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `read_until` on a blocking thread (the tiers under test share this runtime).
async fn read_topic(
    topic: String,
    deadline: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool + Send + 'static,
) -> Vec<OwnedMessage> {
    tokio::task::spawn_blocking(move || read_until(&topic, deadline, done))
        .await
        .expect("reader thread")
}

fn meta_of(m: &OwnedMessage) -> DeliveryMeta {
    DeliveryMeta::from_headers(|k| header(m, k)).expect("delivery metadata headers")
}

fn gauge(registry: &prometheus::Registry, name: &str) -> i64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .map(|m| m.get_gauge().get_value() as i64)
        .sum()
}

async fn wait_until(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_k_times_then_succeeding_gets_k_plus_one_attempts_on_schedule() {
    require_kafka();
    let prefix = unique_prefix("retryk");
    let rx = Receiver::start().await;
    let mut endpoints = String::new();
    for k in 1..=6 {
        endpoints += &endpoint_toml(&format!("ep{k}"), &rx.url(&format!("k{k}")), "");
        rx.script(&format!("k{k}"), vec![Behavior::Status(500); k]);
    }
    let config = test_config(&prefix, &format!("{SCHEDULE}{endpoints}"));
    apply_topics(&config).await;
    let tiers = start_tiers(&config, None).await;
    let engine = test_engine(&config);
    let p = producer();

    // Delivery k fails k times (attempt 1 included), then succeeds: k = 1..=6 covers every tier.
    let names: Vec<(String, String)> = (1..=6)
        .map(|k| (format!("ep{k}"), format!("evt-k{k}")))
        .collect();
    let started = join_all(
        names
            .iter()
            .map(|(ep, id)| start_delivery(&config, &engine, &p, ep, id)),
    )
    .await;
    let mut lateness = Vec::new();
    for (i, s) in started.iter().enumerate() {
        let k = i + 1;
        let got = rx
            .wait_for(&format!("k{k}"), k + 1, Duration::from_secs(60))
            .await;
        lateness.extend(check_attempts(&got, s, k + 1));
    }
    // Delivered: the next tier's offset passes without another request.
    let expected: Vec<(String, usize)> = (1..=6).map(|k| (format!("k{k}"), k + 1)).collect();
    let expected: Vec<(&str, usize)> = expected.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    assert_quiet(&rx, &expected, Duration::from_millis(2_500)).await;
    assert_eq!(
        counter(
            &tiers.registry,
            "hookline_retry_records_total",
            Some(("outcome", "delivered"))
        ),
        6.0
    );
    let dlq = read_topic(format!("{prefix}.dlq"), Duration::from_secs(1), |_| false).await;
    assert!(dlq.is_empty(), "nothing is dead");
    tiers.stop().await.expect("graceful stop");
    print_lateness("k failures then success", lateness);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_failing_endpoint_gets_seven_attempts_then_exactly_one_dead_letter() {
    require_kafka();
    let prefix = unique_prefix("retrydead");
    let rx = Receiver::start().await;
    rx.default("down", Behavior::Status(503));
    let config = test_config(
        &prefix,
        &format!("{SCHEDULE}{}", endpoint_toml("down", &rx.url("down"), "")),
    );
    apply_topics(&config).await;
    let tiers = start_tiers(&config, None).await;
    let s = start_delivery(
        &config,
        &test_engine(&config),
        &producer(),
        "down",
        "evt-down",
    )
    .await;

    let got = rx.wait_for("down", 7, Duration::from_secs(60)).await;
    print_lateness("always failing", check_attempts(&got, &s, 7));
    let dlq_topic = format!("{prefix}.dlq");
    let dlq = read_topic(dlq_topic.clone(), Duration::from_secs(30), |r| {
        !r.is_empty()
    })
    .await;
    assert_eq!(dlq.len(), 1);
    let m = &dlq[0];
    let meta = meta_of(m);
    assert_eq!(meta.dead_reason, Some(DeadReason::Exhausted));
    assert_eq!(meta.attempt, 8, "the next attempt that will never happen");
    let ns: Vec<u32> = meta.history.iter().map(|a| a.n).collect();
    assert_eq!(ns, [1, 2, 3, 4, 5, 6, 7], "every attempt in the history");
    assert!(meta
        .history
        .iter()
        .all(|a| a.class == "http_status" && a.status == Some(503)));
    assert_eq!(meta.first_attempt_ms, s.meta.first_attempt_ms);
    let last = meta.history.last().map(|a| a.at_ms).unwrap_or_default();
    assert!(meta.dead_at_ms.is_some_and(|d| d >= last));
    assert_eq!(
        (meta.endpoint_id.as_str(), meta.event_id.as_str()),
        ("down", "evt-down")
    );
    assert_eq!(meta.tenant.as_deref(), Some("acme"));
    assert_eq!(m.payload(), Some(&s.body[..]), "original bytes");
    assert_eq!(m.key(), Some(&b"evt-down"[..]), "original key");
    assert_eq!(header(m, h::DEDUPE_KEY), Some("evt-down"));

    // No further automatic retries: nothing more is sent, nothing more is dead-lettered.
    assert_quiet(&rx, &[("down", 7)], Duration::from_secs(3)).await;
    let dlq = tokio::task::spawn_blocking(move || {
        read_all_quiet(
            &dlq_topic,
            1,
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
    })
    .await
    .expect("reader");
    assert_eq!(dlq.len(), 1, "exactly one dead letter");
    tiers.stop().await.expect("graceful stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_refused_connections_walk_the_tiers_into_the_dlq() {
    require_kafka();
    let prefix = unique_prefix("retryto");
    let rx = Receiver::start().await;
    rx.default("hang", Behavior::Hang);
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let endpoints = format!(
        "{}{}",
        endpoint_toml("hang", &rx.url("hang"), "timeout = \"300ms\""),
        endpoint_toml("closed", &format!("http://127.0.0.1:{closed_port}/x"), "")
    );
    let config = test_config(&prefix, &format!("{SCHEDULE}{endpoints}"));
    apply_topics(&config).await;
    let tiers = start_tiers(&config, None).await;
    let (engine, p) = (test_engine(&config), producer());
    let (hang, _closed) = futures::join!(
        start_delivery(&config, &engine, &p, "hang", "evt-hang"),
        start_delivery(&config, &engine, &p, "closed", "evt-closed"),
    );

    let dlq = read_topic(format!("{prefix}.dlq"), Duration::from_secs(60), |r| {
        r.len() >= 2
    })
    .await;
    assert_eq!(dlq.len(), 2, "both deliveries end dead");
    let by_endpoint: BTreeMap<String, DeliveryMeta> = dlq
        .iter()
        .map(meta_of)
        .map(|m| (m.endpoint_id.clone(), m))
        .collect();
    for (endpoint, class) in [("hang", "timeout"), ("closed", "connect")] {
        let meta = &by_endpoint[endpoint];
        let classes: Vec<&str> = meta.history.iter().map(|a| a.class.as_str()).collect();
        assert_eq!(classes, [class; 7], "{endpoint}");
        assert_eq!(meta.dead_reason, Some(DeadReason::Exhausted));
    }
    assert!(by_endpoint["hang"]
        .history
        .iter()
        .all(|a: &AttemptRecord| a.duration_ms >= 300 && a.duration_ms < 2_000));
    // Each timed-out request did reach the endpoint, one per attempt, on schedule.
    let got = rx.requests("hang");
    check_attempts(&got, &hang, 7);
    tiers.stop().await.expect("graceful stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_or_disabled_endpoints_and_unreadable_records_never_block_a_tier() {
    require_kafka();
    let prefix = unique_prefix("retryrm");
    let rx = Receiver::start().await;
    rx.default("going", Behavior::Status(500));
    rx.default("off", Behavior::Status(500));
    let before = test_config(
        &prefix,
        &format!(
            "{SCHEDULE}{}{}",
            endpoint_toml("going", &rx.url("going"), ""),
            endpoint_toml("off", &rx.url("off"), "")
        ),
    );
    apply_topics(&before).await;
    let tiers = start_tiers(&before, None).await;
    let (engine, p) = (test_engine(&before), producer());
    futures::join!(
        start_delivery(&before, &engine, &p, "going", "evt-going"),
        start_delivery(&before, &engine, &p, "off", "evt-off"),
    );
    // Attempt 2 happens with the endpoints configured; then the config changes.
    rx.wait_for("going", 2, Duration::from_secs(30)).await;
    rx.wait_for("off", 2, Duration::from_secs(30)).await;
    tiers.stop().await.expect("graceful stop");

    let after = test_config(
        &prefix,
        &format!(
            "{SCHEDULE}{}",
            endpoint_toml("off", &rx.url("off"), "enabled = false")
        ),
    );
    // A record without delivery metadata on the first tier, ahead of nothing in particular.
    let tier2 = format!("{prefix}.retry.2s");
    produce(
        &p,
        &tier2,
        Some(0),
        Some(b"k"),
        Some(b"{\"id\":\"x\"}"),
        &[("x-trace", "t1")],
    )
    .await;
    let tiers = start_tiers(&after, None).await;

    let dlq = read_topic(format!("{prefix}.dlq"), Duration::from_secs(30), |r| {
        r.len() >= 2
    })
    .await;
    let by_endpoint: BTreeMap<String, DeliveryMeta> = dlq
        .iter()
        .map(meta_of)
        .map(|m| (m.endpoint_id.clone(), m))
        .collect();
    assert_eq!(by_endpoint.len(), 2, "{by_endpoint:?}");
    for (endpoint, reason) in [
        ("going", DeadReason::EndpointRemoved),
        ("off", DeadReason::EndpointDisabled),
    ] {
        let meta = &by_endpoint[endpoint];
        assert_eq!(meta.dead_reason, Some(reason), "{endpoint}");
        assert_eq!(meta.attempt, 3, "{endpoint}: attempt 3 was never made");
        let ns: Vec<u32> = meta.history.iter().map(|a| a.n).collect();
        assert_eq!(ns, [1, 2], "{endpoint}");
    }
    let invalid = read_topic(format!("{prefix}.invalid"), Duration::from_secs(30), |r| {
        !r.is_empty()
    })
    .await;
    assert_eq!(invalid.len(), 1);
    let m = &invalid[0];
    assert_eq!(
        header(m, h::INVALID_REASON),
        Some(hookline_retry_tiers::BAD_DELIVERY_RECORD)
    );
    assert_eq!(header(m, h::SOURCE_TOPIC), Some(tier2.as_str()));
    assert_eq!(header(m, h::SOURCE_PARTITION), Some("0"));
    assert_eq!(header(m, "x-trace"), Some("t1"));
    assert_eq!(m.payload(), Some(&b"{\"id\":\"x\"}"[..]));
    assert_quiet(&rx, &[("going", 2), ("off", 2)], Duration::from_secs(1)).await;
    tiers.stop().await.expect("graceful stop");
}

/// Headers of a delivery record due at `due_ms` on a tier (attempt 1 failed at `first_ms`).
fn tier_record(event_id: &str, endpoint: &str, first_ms: i64, due_ms: i64) -> DeliveryMeta {
    DeliveryMeta {
        endpoint_id: endpoint.into(),
        event_id: event_id.into(),
        event_type: "message.created".into(),
        tenant: None,
        attempt: 2,
        deferrals: 0,
        first_attempt_ms: first_ms,
        due_ms,
        history: vec![AttemptRecord {
            n: 1,
            at_ms: first_ms,
            duration_ms: 5,
            status: Some(503),
            class: "http_status".into(),
            snippet: String::new(),
        }],
        dead_reason: None,
        dead_at_ms: None,
        replay_key: None,
        trace: None,
    }
}

async fn produce_meta(p: &FutureProducer, topic: &str, partition: i32, meta: &DeliveryMeta) {
    let headers = meta.to_headers();
    let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let body = event_body(&meta.event_id, &meta.event_type);
    produce(
        p,
        topic,
        Some(partition),
        Some(meta.event_id.as_bytes()),
        Some(&body),
        &pairs,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_backlog_due_at_once_drains_concurrently_within_the_cap() {
    require_kafka();
    let prefix = unique_prefix("retrybacklog");
    let rx = Receiver::start().await;
    rx.default("slow", Behavior::Delay(Duration::from_millis(300), 200));
    let config = test_config(
        &prefix,
        &format!(
            "{SCHEDULE}max_in_flight_per_partition = 8\n{}",
            endpoint_toml("slow", &rx.url("slow"), "")
        ),
    );
    apply_topics(&config).await;
    // 40 deliveries on one partition, all overdue (the tier worker was down).
    let p = producer();
    let now = now_ms();
    let tier = format!("{prefix}.retry.2s");
    for i in 0..40 {
        let meta = tier_record(&format!("evt-b{i}"), "slow", now - 3_000, now - 1_000);
        produce_meta(&p, &tier, 0, &meta).await;
    }
    let tiers = start_tiers(&config, Some(vec!["2s".into()])).await;
    let got = rx.wait_for("slow", 40, Duration::from_secs(60)).await;
    assert_eq!(got.len(), 40);
    let ids: BTreeSet<&str> = got
        .iter()
        .map(|r| r.headers["webhook-id"].as_str())
        .collect();
    assert_eq!(ids.len(), 40, "each once");
    let at: Vec<i64> = got.iter().map(|r| r.at_ms).collect();
    let span = at[at.len() - 1] - at[0];
    // A request is in flight for at least 300 ms after it arrives: arrivals within any 300 ms
    // window are in flight together.
    let overlap = at
        .iter()
        .map(|t| at.iter().filter(|u| *u <= t && *u > &(t - 300)).count())
        .max()
        .unwrap_or(0);
    println!(
        "backlog of 40 (300 ms each, cap 8): drained in {span} ms, {overlap} in flight at most"
    );
    assert!(
        overlap <= 8,
        "cap of 8 in flight per partition exceeded: {overlap}"
    );
    assert!(overlap >= 4, "attempts were not concurrent: {overlap}");
    assert!(
        span < 6_000,
        "one at a time would take 12 s; took {span} ms"
    );
    assert_quiet(&rx, &[("slow", 40)], Duration::from_millis(500)).await;
    tiers.stop().await.expect("graceful stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_partition_revoked_and_assigned_back_is_resumed_and_attempted_once() {
    require_kafka();
    let prefix = unique_prefix("retryrb");
    let rx = Receiver::start().await;
    // The 12s tier comes 10 s after the previous one: a record may wait up to that long (plus
    // the clock slack) after it was written, which the rebalances below need.
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"2s\", \"12s\"]\n[dispatcher]\nshutdown_grace = \"5s\"\n{}",
            endpoint_toml("rb", &rx.url("rb"), "")
        ),
    );
    apply_topics(&config).await;
    let a = start_tiers(&config, Some(vec!["12s".into()])).await;
    let p = producer();
    let tier = format!("{prefix}.retry.12s");
    let now = now_ms();
    let due = now + 15_000;
    for partition in 0..3 {
        let meta = tier_record(&format!("evt-rb{partition}"), "rb", now, due);
        produce_meta(&p, &tier, partition, &meta).await;
    }
    // A holds every head and has paused every partition.
    wait_until(
        "A to pause its 3 partitions",
        Duration::from_secs(20),
        || {
            gauge(&a.registry, "hookline_retry_waiting_records") == 3
                && gauge(&a.registry, "hookline_retry_paused_partitions") == 3
        },
    )
    .await;
    // B joins the group: at least one paused partition moves to B.
    let b = start_tiers(&config, Some(vec!["12s".into()])).await;
    wait_until("B to take a partition", Duration::from_secs(30), || {
        gauge(&b.registry, "hookline_retry_waiting_records") >= 1
    })
    .await;
    wait_until(
        "A to drop the revoked head",
        Duration::from_secs(10),
        || gauge(&a.registry, "hookline_retry_waiting_records") < 3,
    )
    .await;
    // B leaves: its partitions come back to A, which paused them before they were revoked.
    b.stop().await.expect("graceful stop of B");
    wait_until(
        "A to hold all 3 heads again",
        Duration::from_secs(30),
        || gauge(&a.registry, "hookline_retry_waiting_records") == 3,
    )
    .await;
    assert!(
        now_ms() < due,
        "the rebalances took longer than the test allows"
    );
    let got = rx.wait_for("rb", 3, Duration::from_secs(40)).await;
    assert_quiet(&rx, &[("rb", 3)], Duration::from_secs(2)).await;
    let ids: BTreeSet<&str> = got
        .iter()
        .map(|r| r.headers["webhook-id"].as_str())
        .collect();
    assert_eq!(ids.len(), 3, "each delivery attempted exactly once");
    assert!(got.iter().all(|r| r.at_ms >= due), "none early");
    a.stop().await.expect("graceful stop of A");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_cuts_a_hanging_attempt_short_and_hands_it_off() {
    require_kafka();
    let prefix = unique_prefix("retrystop");
    let rx = Receiver::start().await;
    rx.default("hang", Behavior::Hang);
    let config = test_config(
        &prefix,
        &format!(
            "{}\n{}",
            SCHEDULE.replace("shutdown_grace = \"5s\"", "shutdown_grace = \"1s\""),
            endpoint_toml("hang", &rx.url("hang"), "timeout = \"60s\"")
        ),
    );
    apply_topics(&config).await;
    let tiers = start_tiers(&config, Some(vec!["2s".into()])).await;
    let now = now_ms();
    let meta = tier_record("evt-stop", "hang", now - 2_000, now);
    produce_meta(&producer(), &format!("{prefix}.retry.2s"), 0, &meta).await;
    rx.wait_for("hang", 1, Duration::from_secs(30)).await;

    let stopping = Instant::now();
    tiers.stop().await.expect("graceful stop");
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(8), "stop took {took:?}");
    let next = read_topic(format!("{prefix}.retry.4s"), Duration::from_secs(10), |r| {
        !r.is_empty()
    })
    .await;
    assert_eq!(
        next.len(),
        1,
        "the interrupted attempt is handed to the next tier"
    );
    let handed = meta_of(&next[0]);
    assert_eq!(handed.attempt, 3);
    let last = handed.history.last().expect("history");
    assert_eq!((last.n, last.class.as_str()), (2, "timeout"));
    assert!(
        last.snippet.contains("interrupted by shutdown"),
        "{}",
        last.snippet
    );
    assert_eq!(rx.requests("hang").len(), 1);
}

// ---- through the binary -------------------------------------------------------------------

/// The TOML of a test config (as `test_config` builds it), with `[kafka]` additions and the ops
/// server address.
fn config_text(prefix: &str, kafka_extra: &str, listen: &str, extra: &str) -> String {
    format!(
        "[kafka]\nbootstrap_servers = \"{bs}\"\n{kafka_extra}\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"{listen}\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n[log]\nlevel = \"info\"\n{extra}\n",
        bs = bootstrap()
    )
}

/// Writes the config to a temp dir; returns it parsed and its path.
fn config_file(prefix: &str, text: &str) -> (Config, PathBuf) {
    let config = Config::from_toml_with_env(text, "test", Vec::new()).expect("valid config");
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("hookline.toml");
    std::fs::write(&path, text).expect("write config");
    (config, path)
}

/// `hookline` with a clean `HOOKLINE_*` environment (the test runner's `HOOKLINE_TEST_KAFKA`
/// would be read as a config override).
fn hookline(config: &PathBuf) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOOKLINE_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("--config").arg(config);
    cmd
}

async fn run_hookline(config: &PathBuf, args: &[&str]) -> Output {
    let mut cmd = hookline(config);
    cmd.args(args);
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("thread")
        .expect("run hookline")
}

fn stdout_of(out: &Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "hookline {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A dead letter as the tiers write it: seven failed attempts, `exhausted`.
fn dead_letter(event_id: &str, endpoint: &str, event_type: &str) -> DeliveryMeta {
    let first = now_ms() - 20_000;
    let mut meta = tier_record(event_id, endpoint, first, first);
    meta.event_type = event_type.into();
    meta.tenant = Some("acme".into());
    for n in 2..=7 {
        meta.push_attempt(AttemptRecord {
            n,
            at_ms: first + OFFSETS_MS[n as usize - 1],
            duration_ms: 4,
            status: Some(500),
            class: "http_status".into(),
            snippet: "down".into(),
        });
    }
    meta.attempt = 8;
    meta.dead_reason = Some(DeadReason::Exhausted);
    meta.dead_at_ms = Some(first + 12_010);
    meta
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_through_the_binary_sends_a_dead_delivery_once() {
    require_kafka();
    let prefix = unique_prefix("replay");
    let rx = Receiver::start().await;
    rx.default("fail", Behavior::Status(500));
    let endpoints = format!(
        "{}{}",
        endpoint_toml("ep-ok", &rx.url("ok"), ""),
        endpoint_toml("ep-fail", &rx.url("fail"), "")
    );
    let (config, path) = config_file(
        &prefix,
        &config_text(
            &prefix,
            "",
            "127.0.0.1:0",
            &format!("{SCHEDULE}{endpoints}"),
        ),
    );
    apply_topics(&config).await;
    let p = producer();
    let dlq = format!("{prefix}.dlq");
    let a = dead_letter("evt-a", "ep-ok", "message.created");
    let b = dead_letter("evt-b", "ep-fail", "message.created");
    let c = dead_letter("evt-c", "ep-ok", "call.started");
    for meta in [&a, &b, &c] {
        produce_meta(&p, &dlq, 0, meta).await;
    }
    let written = read_topic(dlq.clone(), Duration::from_secs(20), |r| r.len() >= 3).await;
    let pos: BTreeMap<String, String> = written
        .iter()
        .map(|m| {
            (
                meta_of(m).event_id,
                format!("{}:{}", m.partition(), m.offset()),
            )
        })
        .collect();

    // --dry-run lists and sends nothing.
    let args = [
        "replay",
        "--dry-run",
        "--endpoint",
        "ep-ok",
        "--type",
        "message.*",
    ];
    let out = stdout_of(&run_hookline(&path, &args).await, &args);
    assert!(
        out.contains(&format!(
            "would replay {} endpoint=ep-ok event=evt-a type=message.created reason=exhausted attempts=7",
            pos["evt-a"]
        )),
        "{out}"
    );
    assert!(
        !out.contains("evt-c"),
        "the type filter excludes evt-c: {out}"
    );
    assert!(rx.all_requests().is_empty(), "a dry run sends nothing");

    // The replay sends once: attempt 8, same id, same bytes, a valid signature.
    let args = ["replay", "--endpoint", "ep-ok", "--type", "message.*"];
    let out = stdout_of(&run_hookline(&path, &args).await, &args);
    assert!(out.contains("result=delivered status=200"), "{out}");
    let got = rx.requests("ok");
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(attempt_of(r), 8);
    assert_eq!(r.headers["webhook-id"], "evt-a");
    assert_eq!(r.body, event_body("evt-a", "message.created"));
    let ts: i64 = r.headers["webhook-timestamp"].parse().expect("timestamp");
    let key = decode_secret(SECRET).expect("secret");
    assert!(signing::verify(
        &key,
        "evt-a",
        ts,
        &r.body,
        &r.headers["webhook-signature"]
    ));

    // The same replay again: already replayed, nothing sent.
    let out = stdout_of(&run_hookline(&path, &args).await, &args);
    assert!(out.contains("0 delivered"), "{out}");
    assert!(out.contains("1 already replayed"), "{out}");
    assert_eq!(
        rx.requests("ok").len(),
        1,
        "the same replay twice sends once"
    );

    // A failing replay returns to the DLQ with the new attempt and the replay key; not
    // everything was delivered, so it exits 4.
    let args = ["replay", "--endpoint", "ep-fail"];
    let out = run_hookline(&path, &args).await;
    assert_eq!(out.status.code(), Some(4), "a failed replay exits 4");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.contains(&format!(
            "result=failed class=http_status status=500 returned_to={dlq}"
        )),
        "{out}"
    );
    assert_eq!(rx.requests("fail").len(), 1);
    let all = read_topic(dlq.clone(), Duration::from_secs(20), |r| r.len() >= 4).await;
    assert_eq!(all.len(), 4);
    let back = all
        .iter()
        .map(meta_of)
        .find(|m| m.replay_key.is_some())
        .expect("the returned dead letter");
    assert_eq!(back.event_id, "evt-b");
    assert_eq!(
        back.replay_key.as_deref(),
        Some(format!("dlq:{}", pos["evt-b"]).as_str())
    );
    assert_eq!(back.history.len(), 8);
    assert_eq!(back.history.last().map(|a| a.n), Some(8));
    assert_eq!(back.attempt, 9);
    assert_eq!(back.dead_reason, Some(DeadReason::Exhausted));

    // `dead list` / `dead show` see it all.
    let args = ["dead", "list", "--endpoint", "ep-fail", "--format", "json"];
    let out = stdout_of(&run_hookline(&path, &args).await, &args);
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    let returned = rows
        .iter()
        .find(|r| !r["replay_key"].is_null())
        .expect("the returned dead letter is listed");
    assert_eq!(returned["replay_key"], format!("dlq:{}", pos["evt-b"]));
    assert_eq!(returned["attempts"], 8);
    let args = ["dead", "list"];
    let out = stdout_of(&run_hookline(&path, &args).await, &args);
    assert!(out.starts_with("POSITION"), "{out}");
    assert!(out.contains("4 dead deliveries"), "{out}");
    let args = ["dead", "show", pos["evt-a"].as_str()];
    let out = stdout_of(&run_hookline(&path, &args).await, &args);
    assert!(
        out.contains("evt-a") && out.contains("replayed     delivered at"),
        "{out}"
    );
    assert!(out.contains("h\u{e9}llo"), "body preview: {out}");

    // Replaying everything needs --all.
    let out = run_hookline(&path, &["replay"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all"));
    assert_eq!(rx.all_requests().len(), 2, "ok once, fail once");
}

/// A `hookline run retry-tiers` child process, killed on drop.
struct Proc {
    child: Child,
}

impl Proc {
    fn spawn(config: &PathBuf, log_name: &str) -> Proc {
        let log = std::fs::File::create(config.with_file_name(log_name)).expect("log file");
        let child = hookline(config)
            .args(["run", "retry-tiers"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn hookline");
        Proc { child }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; the exit code once it exits (within 30 s).
    async fn sigterm(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Polls `GET /readyz` until it answers 200.
async fn wait_ready(port: u16, deadline: Duration) {
    let start = Instant::now();
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            let _ = s
                .write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
            if buf.starts_with(b"HTTP/1.1 200") {
                return;
            }
        }
        assert!(
            start.elapsed() < deadline,
            "hookline not ready on port {port}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_of_a_tier_worker_loses_no_delivery_and_skips_no_tier() {
    require_kafka();
    let prefix = unique_prefix("retrykill");
    let rx = Receiver::start().await;
    // Every attempt takes 700 ms and fails: at any moment records are waiting or in flight.
    rx.default("slow", Behavior::Delay(Duration::from_millis(700), 500));
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    // Static membership: the restarted process takes over the killed one's partitions at once.
    let (config, path) = config_file(
        &prefix,
        &config_text(
            &prefix,
            "instance_id = \"k0\"",
            &format!("127.0.0.1:{port}"),
            &format!("{SCHEDULE}{}", endpoint_toml("slow", &rx.url("slow"), "")),
        ),
    );
    apply_topics(&config).await;
    let mut proc_ = Proc::spawn(&path, "run0.log");
    wait_ready(port, Duration::from_secs(60)).await;

    let (engine, p) = (test_engine(&config), producer());
    let ids: Vec<String> = (0..6).map(|i| format!("evt-kill{i}")).collect();
    // Two batches ~0.7 s apart (attempt 1 takes 0.7 s).
    for batch in ids.chunks(3) {
        join_all(
            batch
                .iter()
                .map(|id| start_delivery(&config, &engine, &p, "slow", id)),
        )
        .await;
    }
    // Attempts 1-2 of both batches and attempt 3 of the first have reached the endpoint: the
    // first batch's attempts 3 are in flight, the second's wait in memory until due. kill -9.
    rx.wait_for("slow", 15, Duration::from_secs(30)).await;
    proc_.kill9();
    let killed_at = rx.requests("slow").len();
    let mut proc_ = Proc::spawn(&path, "run1.log");
    wait_ready(port, Duration::from_secs(60)).await;

    let dlq = read_topic(format!("{prefix}.dlq"), Duration::from_secs(90), move |r| {
        r.iter()
            .map(|m| header(m, h::EVENT_ID).unwrap_or_default().to_string())
            .collect::<BTreeSet<_>>()
            .len()
            >= 6
    })
    .await;
    let requests = rx.requests("slow");
    let mut duplicates = 0;
    for id in &ids {
        let attempts: Vec<u32> = requests
            .iter()
            .filter(|r| r.headers["webhook-id"] == *id)
            .map(attempt_of)
            .collect();
        let distinct: BTreeSet<u32> = attempts.iter().copied().collect();
        assert_eq!(
            distinct,
            (1..=7).collect::<BTreeSet<u32>>(),
            "{id}: no tier skipped, none lost: {attempts:?}"
        );
        // First sightings in order: attempt n never before attempt n - 1.
        let mut firsts: Vec<u32> = Vec::new();
        for a in &attempts {
            if !firsts.contains(a) {
                firsts.push(*a);
            }
        }
        assert_eq!(firsts, (1..=7).collect::<Vec<u32>>(), "{id}: {attempts:?}");
        duplicates += attempts.len() - 7;
        let dead: Vec<DeliveryMeta> = dlq
            .iter()
            .filter(|m| header(m, h::EVENT_ID) == Some(id.as_str()))
            .map(meta_of)
            .collect();
        assert!(!dead.is_empty(), "{id} reached the DLQ");
        for meta in dead {
            let ns: Vec<u32> = meta.history.iter().map(|a| a.n).collect();
            assert_eq!(ns, [1, 2, 3, 4, 5, 6, 7], "{id}: history");
        }
    }
    println!(
        "kill -9 after {killed_at} requests: 6 deliveries complete, {duplicates} attempts repeated after the restart"
    );
    assert_eq!(proc_.sigterm().await, Some(0), "graceful stop exits 0");
}

//! Retry tiers and replay when the world changed under a queued delivery (real broker, recording
//! receiver): a schedule that dropped a tier (orphan tiers drained by the current schedule, and
//! listed by `topics describe/apply`), an endpoint whose tenant or event types changed (dead
//! letter `endpoint_unsubscribed`, replay skipped), a due time written by a fast clock (capped),
//! and `replay`'s exit code.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;

use hookline_common::config::Config;
use hookline_common::contract::delivery::{now_ms, AttemptRecord, DeliveryMeta};
use hookline_common::contract::headers as h;
use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown;

use crate::harness::*;
use crate::receiver::{Behavior, Receiver, Recorded};

const DEAD_REASON: &str = "hookline-dead-reason";

fn endpoint(id: &str, url: &str, extra: &str) -> String {
    format!("[[endpoints]]\nid = \"{id}\"\nurl = \"{url}\"\n{extra}\n")
}

fn schedule(offsets: &[&str]) -> String {
    let list: Vec<String> = offsets.iter().map(|o| format!("\"{o}\"")).collect();
    format!(
        "[retry]\nschedule = [{}]\n[dispatcher]\nshutdown_grace = \"5s\"\n",
        list.join(", ")
    )
}

/// Runs the retry tiers in this process; waits until every tier that gates readiness has its
/// partitions.
async fn start_tiers(config: &Config) -> Running {
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

/// A delivery record waiting for attempt `attempt` (attempts 1..attempt already failed).
fn waiting(
    event_id: &str,
    endpoint: &str,
    tenant: Option<&str>,
    attempt: u32,
    first_ms: i64,
    due_ms: i64,
) -> DeliveryMeta {
    let history = (1..attempt)
        .map(|n| AttemptRecord {
            n,
            at_ms: first_ms,
            duration_ms: 3,
            status: Some(500),
            class: "http_status".into(),
            snippet: String::new(),
        })
        .collect();
    DeliveryMeta {
        endpoint_id: endpoint.into(),
        event_id: event_id.into(),
        event_type: "message.created".into(),
        tenant: tenant.map(str::to_string),
        attempt,
        first_attempt_ms: first_ms,
        due_ms,
        history,
        deferrals: 0,
        dead_reason: None,
        dead_at_ms: None,
        replay_key: None,
        trace: None,
    }
}

fn body(event_id: &str) -> Vec<u8> {
    format!("{{\"id\":\"{event_id}\",\"type\":\"message.created\",\"data\":{{}}}}").into_bytes()
}

async fn put(p: &FutureProducer, topic: &str, partition: i32, meta: &DeliveryMeta) {
    let headers = meta.to_headers();
    let mut pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.push((h::DEDUPE_KEY, meta.event_id.as_str()));
    produce(
        p,
        topic,
        Some(partition),
        Some(meta.event_id.as_bytes()),
        Some(&body(&meta.event_id)),
        &pairs,
    )
    .await;
}

async fn read_topic(
    topic: String,
    deadline: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool + Send + 'static,
) -> Vec<OwnedMessage> {
    tokio::task::spawn_blocking(move || read_until(&topic, deadline, done))
        .await
        .expect("reader thread")
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

fn histogram_count(registry: &prometheus::Registry, name: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .map(|m| m.get_histogram().get_sample_count())
        .sum()
}

async fn wait_until(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn attempts(reqs: &[Recorded]) -> Vec<(String, u32)> {
    reqs.iter()
        .map(|r| {
            (
                r.headers["webhook-id"].clone(),
                r.headers["webhook-attempt"].parse().expect("attempt"),
            )
        })
        .collect()
}

/// Dead letters by event id: (reason, attempt header, attempt numbers in the history).
fn dead_by_event(dlq: &[OwnedMessage]) -> BTreeMap<String, (String, String, Vec<u32>)> {
    dlq.iter()
        .map(|m| {
            let history: Vec<AttemptRecord> =
                serde_json::from_str(header(m, "hookline-history").unwrap_or("[]"))
                    .expect("history");
            (
                header(m, h::EVENT_ID).unwrap_or_default().to_string(),
                (
                    header(m, DEAD_REASON).unwrap_or_default().to_string(),
                    header(m, "hookline-attempt")
                        .unwrap_or_default()
                        .to_string(),
                    history.iter().map(|a| a.n).collect(),
                ),
            )
        })
        .collect()
}

/// Schedule X = 0s, 1s, 8s, 10s (4 attempts) is replaced by Y = 0s, 1s, 2s (3 attempts): the
/// records waiting on X's tiers 8s and 10s are processed by Y's workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_on_a_tier_the_schedule_dropped_are_attempted_and_moved_on_by_the_current_one() {
    require_kafka();
    let prefix = unique_prefix("orphan");
    let rx = Receiver::start().await;
    rx.default("ep", Behavior::Status(500));
    let ep = endpoint("ep", &rx.url("ep"), "");
    let x = test_config(
        &prefix,
        &format!("{}{ep}", schedule(&["0s", "1s", "8s", "10s"])),
    );
    apply_topics(&x).await;
    let tiers_x = start_tiers(&x).await;

    // Waiting under X when the schedule changes: due in a few seconds.
    let p = producer();
    let t = now_ms();
    let due = t + 10_000;
    let first = t + 3_000;
    // a: waits for attempt 2 on tier 8s; attempt 3 is then Y's (tier 2s), then dead.
    let a = waiting("evt-a", "ep", None, 2, first, due);
    // b: waits for attempt 3; Y has no attempt 4, so dead after it.
    let b = waiting("evt-b", "ep", None, 3, first, due);
    // c: waits for attempt 4 on tier 10s, which Y does not have: dead at once, never sent.
    let c_due = t + 7_000;
    let c = waiting("evt-c", "ep", None, 4, first, c_due);
    put(&p, &format!("{prefix}.retry.8s"), 0, &a).await;
    put(&p, &format!("{prefix}.retry.8s"), 1, &b).await;
    put(&p, &format!("{prefix}.retry.10s"), 0, &c).await;
    wait_until("X to hold the 3 records", Duration::from_secs(20), || {
        gauge(&tiers_x.registry, "hookline_retry_waiting_records") == 3
    })
    .await;
    tiers_x.stop().await.expect("graceful stop of X");
    assert!(
        rx.all_requests().is_empty() && now_ms() < c_due,
        "X must stop before the records are due"
    );

    let y = test_config(&prefix, &format!("{}{ep}", schedule(&["0s", "1s", "2s"])));
    apply_topics(&y).await;
    let tiers_y = start_tiers(&y).await;

    let dlq = read_topic(format!("{prefix}.dlq"), Duration::from_secs(60), |r| {
        r.len() >= 3
    })
    .await;
    let dead = dead_by_event(&dlq);
    assert_eq!(dead.len(), 3, "three dead letters: {dead:?}");
    assert_eq!(
        dead["evt-a"],
        ("exhausted".into(), "4".into(), vec![1, 2, 3]),
        "a: attempt 2 on the orphan tier 8s, attempt 3 on Y's tier 2s"
    );
    assert_eq!(
        dead["evt-b"],
        ("exhausted".into(), "4".into(), vec![1, 2, 3])
    );
    assert_eq!(
        dead["evt-c"],
        ("exhausted".into(), "4".into(), vec![1, 2, 3]),
        "c: past the end of Y, dead without an attempt"
    );
    let got = rx.requests("ep");
    let mut sent = attempts(&got);
    sent.sort();
    assert_eq!(
        sent,
        [
            ("evt-a".to_string(), 2),
            ("evt-a".to_string(), 3),
            ("evt-b".to_string(), 3)
        ]
    );
    assert!(
        got.iter().all(|r| r.at_ms >= due),
        "attempted when due, never early"
    );
    assert_eq!(
        counter(
            &tiers_y.registry,
            "hookline_retry_records_total",
            Some(("tier", "8s"))
        ),
        2.0,
        "the orphan tier 8s finished a and b"
    );
    tiers_y.stop().await.expect("graceful stop of Y");
}

// ---- through the binary -------------------------------------------------------------------

fn config_file(prefix: &str, name: &str, extra: &str) -> (Config, PathBuf) {
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{bs}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n[log]\nlevel = \"warn\"\n{extra}\n",
        bs = bootstrap()
    );
    let config = Config::from_toml_with_env(&text, "test", Vec::new()).expect("valid config");
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    (config, path)
}

/// `hookline --config <path> <args>` with a clean `HOOKLINE_*` environment.
async fn hookline(config: &PathBuf, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOOKLINE_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("--config").arg(config).args(args);
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("thread")
        .expect("run hookline")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_describe_and_apply_list_orphan_tiers_as_being_drained() {
    require_kafka();
    let prefix = unique_prefix("orphantopics");
    let (x, _) = config_file(&prefix, "x.toml", &schedule(&["0s", "1s", "3s", "5s"]));
    apply_topics(&x).await;
    let p = producer();
    let t = now_ms();
    put(
        &p,
        &format!("{prefix}.retry.5s"),
        0,
        &waiting("evt-o", "ep", None, 4, t, t),
    )
    .await;
    let (_, y) = config_file(&prefix, "y.toml", &schedule(&["0s", "1s", "2s"]));

    let out = hookline(&y, &["topics", "describe"]).await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let orphan_3s = format!("ORPHAN    {prefix}.retry.3s: tier 3s is not in retry.schedule");
    let orphan_5s = format!("ORPHAN    {prefix}.retry.5s: tier 5s is not in retry.schedule");
    assert!(text.contains(&orphan_3s), "{text}");
    assert!(text.contains(&orphan_5s), "{text}");
    assert!(text.contains("being drained"), "{text}");
    assert!(text.contains("1 record(s) not processed yet"), "{text}");
    assert!(
        text.contains(&format!("{prefix}.retry.2s")),
        "the plan has Y's tier: {text}"
    );
    assert!(
        !text.contains(&format!("ORPHAN    {prefix}.retry.1s")),
        "1s is in both schedules: {text}"
    );

    let out = hookline(&y, &["topics", "apply"]).await;
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "orphans are not drift: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("created   {prefix}.retry.2s")),
        "{text}"
    );
    assert!(
        text.contains(&orphan_3s) && text.contains(&orphan_5s),
        "{text}"
    );
    assert!(!text.contains("DRIFT"), "{text}");
    // Nothing is deleted.
    let out = hookline(&y, &["topics", "describe"]).await;
    assert!(stdout(&out).contains(&orphan_5s));
}

/// A retry queued for an endpoint whose tenant (or event types) changed before it was due: no
/// request, a dead letter `endpoint_unsubscribed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_retry_for_an_endpoint_that_no_longer_subscribes_is_dead_lettered_unsent() {
    require_kafka();
    let prefix = unique_prefix("unsub");
    let rx = Receiver::start().await;
    rx.default("tenant", Behavior::Status(500));
    rx.default("types", Behavior::Status(500));
    let sched = schedule(&["0s", "2s", "10s"]);
    let before = test_config(
        &prefix,
        &format!(
            "{sched}{}{}{}",
            endpoint("ep-tenant", &rx.url("tenant"), "tenant = \"acme\""),
            endpoint(
                "ep-types",
                &rx.url("types"),
                "event_types = [\"message.*\"]"
            ),
            endpoint("ep-same", &rx.url("same"), "tenant = \"acme\""),
        ),
    );
    apply_topics(&before).await;
    let tiers = start_tiers(&before).await;
    let p = producer();
    let t = now_ms();
    let due = t + 10_000;
    let tier = format!("{prefix}.retry.10s");
    for (i, (id, ep)) in [
        ("evt-tenant", "ep-tenant"),
        ("evt-types", "ep-types"),
        ("evt-same", "ep-same"),
    ]
    .into_iter()
    .enumerate()
    {
        let meta = waiting(id, ep, Some("acme"), 3, t - 1_000, due);
        put(&p, &tier, i as i32, &meta).await;
    }
    wait_until(
        "the queued retries to be held",
        Duration::from_secs(20),
        || gauge(&tiers.registry, "hookline_retry_waiting_records") == 3,
    )
    .await;
    tiers.stop().await.expect("graceful stop");
    assert!(now_ms() < due, "stopped before the retries were due");

    // The endpoint moved to another tenant; another stopped taking message.* events.
    let after = test_config(
        &prefix,
        &format!(
            "{sched}{}{}{}",
            endpoint("ep-tenant", &rx.url("tenant"), "tenant = \"globex\""),
            endpoint("ep-types", &rx.url("types"), "event_types = [\"call.*\"]"),
            endpoint("ep-same", &rx.url("same"), "tenant = \"acme\""),
        ),
    );
    let tiers = start_tiers(&after).await;
    let got = rx.wait_for("same", 1, Duration::from_secs(40)).await;
    assert_eq!(
        attempts(&got),
        [("evt-same".to_string(), 3)],
        "still subscribed"
    );
    let dlq = read_topic(format!("{prefix}.dlq"), Duration::from_secs(30), |r| {
        r.len() >= 2
    })
    .await;
    let dead = dead_by_event(&dlq);
    for id in ["evt-tenant", "evt-types"] {
        assert_eq!(
            dead.get(id),
            Some(&("endpoint_unsubscribed".into(), "3".into(), vec![1, 2])),
            "{id}: dead without attempt 3: {dead:?}"
        );
    }
    // Nothing more reaches the endpoints that left.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        rx.requests("tenant").is_empty(),
        "the new tenant's URL got nothing"
    );
    assert!(rx.requests("types").is_empty());
    assert_eq!(
        counter(
            &tiers.registry,
            "hookline_retry_records_total",
            Some(("outcome", "dead_endpoint_unsubscribed"))
        ),
        2.0
    );
    tiers.stop().await.expect("graceful stop");
}

/// A due time one hour ahead of its record's timestamp on a 1 s tier (a producing host's clock
/// one hour fast) is attempted within seconds, and the skew is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_time_from_a_fast_clock_is_capped_by_the_record_timestamp() {
    require_kafka();
    let prefix = unique_prefix("skew");
    let rx = Receiver::start().await;
    let config = test_config(
        &prefix,
        &format!(
            "{}{}",
            schedule(&["0s", "1s"]),
            endpoint("ep", &rx.url("ep"), "")
        ),
    );
    apply_topics(&config).await;
    let tiers = start_tiers(&config).await;
    let p = producer();
    let hour = 3_600_000;
    let fast_now = now_ms() + hour;
    let meta = waiting("evt-skew", "ep", None, 2, fast_now - 5, fast_now + 1_000);
    let produced = Instant::now();
    put(&p, &format!("{prefix}.retry.1s"), 0, &meta).await;
    let got = rx.wait_for("ep", 1, Duration::from_secs(30)).await;
    assert_eq!(
        attempts(&got),
        [("evt-skew".to_string(), 2)],
        "attempted within seconds, not in an hour"
    );
    println!(
        "record due 1 h ahead of its timestamp attempted {} ms after it was produced",
        got[0].at.duration_since(produced).as_millis()
    );
    assert!(
        histogram_count(&tiers.registry, "hookline_retry_due_skew_seconds") >= 1,
        "the skew is counted"
    );
    tiers.stop().await.expect("graceful stop");
}

/// `replay` skips dead letters whose endpoint no longer subscribes (nothing sent), reports them,
/// and exits non-zero unless every selected dead letter was delivered or already replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_skips_unsubscribed_endpoints_and_exits_non_zero_unless_all_delivered() {
    require_kafka();
    let prefix = unique_prefix("replayguard");
    let rx = Receiver::start().await;
    rx.default("fail", Behavior::Status(500));
    let (config, path) = config_file(
        &prefix,
        "hookline.toml",
        &format!(
            "{}{}{}{}",
            schedule(&["0s", "1s"]),
            endpoint("ep-ok", &rx.url("ok"), "tenant = \"acme\""),
            endpoint("ep-fail", &rx.url("fail"), ""),
            // Once acme's, now globex's: acme's dead letters must not go there.
            endpoint("ep-moved", &rx.url("moved"), "tenant = \"globex\""),
        ),
    );
    apply_topics(&config).await;
    let p = producer();
    let dlq = format!("{prefix}.dlq");
    let t = now_ms() - 10_000;
    for (id, ep) in [
        ("evt-ok", "ep-ok"),
        ("evt-fail", "ep-fail"),
        ("evt-moved", "ep-moved"),
    ] {
        let mut meta = waiting(id, ep, Some("acme"), 3, t, t);
        meta.dead_reason = Some(hookline_common::contract::delivery::DeadReason::Exhausted);
        meta.dead_at_ms = Some(t + 2_000);
        put(&p, &dlq, 0, &meta).await;
    }
    let written = read_topic(dlq.clone(), Duration::from_secs(20), |r| r.len() >= 3).await;
    let pos: BTreeMap<String, String> = written
        .iter()
        .map(|m| {
            (
                header(m, h::EVENT_ID).unwrap_or_default().to_string(),
                format!("{}:{}", m.partition(), m.offset()),
            )
        })
        .collect();

    // Delivered: exit 0; the same replay again is a no-op: exit 0.
    for _ in 0..2 {
        let out = hookline(&path, &["replay", "--endpoint", "ep-ok"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
        assert!(stdout(&out).contains("result: ok"), "{}", stdout(&out));
    }
    assert_eq!(rx.requests("ok").len(), 1);

    // The endpoint moved to another tenant: skipped, reported, nothing sent, exit 4.
    let out = hookline(&path, &["replay", "--endpoint", "ep-moved", "--dry-run"]).await;
    let text = stdout(&out);
    assert!(text.contains("no longer subscribes"), "{text}");
    assert_eq!(out.status.code(), Some(4), "{text}");
    let out = hookline(&path, &["replay", "--endpoint", "ep-moved"]).await;
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "skipped {}: endpoint ep-moved no longer subscribes to this event (tenant=acme type=message.created)",
            pos["evt-moved"]
        )),
        "{text}"
    );
    assert!(text.contains("1 skipped (1 unsubscribed)"), "{text}");
    assert!(
        text.contains("result: not everything selected was delivered"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(
        rx.requests("moved").is_empty(),
        "nothing sent to the moved endpoint"
    );

    // A failed attempt: exit 4, and the summary says why.
    let out = hookline(&path, &["replay", "--endpoint", "ep-fail"]).await;
    let text = stdout(&out);
    assert!(text.contains("1 failed again"), "{text}");
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert_eq!(rx.requests("fail").len(), 1);
}

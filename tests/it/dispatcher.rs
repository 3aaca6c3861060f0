//! The dispatcher against a real broker and a real HTTP receiver: fan-out, signed byte-identical
//! POSTs, hand-off of failures to the first retry tier, timeouts, concurrency past a hanging
//! endpoint, the SSRF guard, and offsets across `kill -9` and SIGTERM of the real binary.
//!
//! Tests produce straight to `<p>.dispatch` with the headers the deduper writes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use sha2::Sha256;

use hookline_common::config::Config;
use hookline_common::contract::delivery::{self as d, AttemptRecord};
use hookline_common::contract::headers as h;

use crate::harness::*;
use crate::receiver::{Behavior, Receiver, Recorded};

/// The Standard Webhooks reference secret, and a second one (rotation: both sign).
const SECRET_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SECRET_B: &str = "whsec_dGhpcyBpcyBhIHNlY29uZCB0ZXN0IHNlY3JldCE=";

/// Generous waits: tests share a 2-core machine with the broker and each other.
const WAIT: Duration = Duration::from_secs(40);
/// How long nothing more may arrive before "exactly once" is asserted.
const QUIET: Duration = Duration::from_millis(1500);

/// An event body with odd spacing and non-ASCII text, to catch any re-serialisation.
fn body(id: &str, event_type: &str, tenant: Option<&str>) -> Vec<u8> {
    let tenant = tenant
        .map(|t| format!(r#", "tenant" :"{t}""#))
        .unwrap_or_default();
    let data = "{\"text\":\"h\u{e9}llo \u{2603}\",\"n\":1.50}";
    format!("{{\"id\":\"{id}\",  \"type\":\"{event_type}\"{tenant},\n \"data\":{data}}}")
        .into_bytes()
}

/// Produces one event to `<p>.dispatch` the way the deduper does (key = id, envelope headers).
async fn produce_event(
    p: &FutureProducer,
    prefix: &str,
    partition: Option<i32>,
    id: &str,
    event_type: &str,
    tenant: Option<&str>,
) -> Vec<u8> {
    let value = body(id, event_type, tenant);
    let dedupe_key = format!("dk-{id}");
    let mut headers = vec![
        (h::EVENT_ID, id),
        (h::EVENT_TYPE, event_type),
        (h::DEDUPE_KEY, dedupe_key.as_str()),
    ];
    if let Some(t) = tenant {
        headers.push((h::TENANT, t));
    }
    produce(
        p,
        &format!("{prefix}.dispatch"),
        partition,
        Some(id.as_bytes()),
        Some(&value),
        &headers,
    )
    .await;
    value
}

/// Produces many events concurrently (round-robin over 3 partitions); returns their ids.
async fn produce_many(p: &FutureProducer, prefix: &str, tag: &str, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("{tag}-{i:04}")).collect();
    for chunk in ids.chunks(50) {
        futures::future::join_all(
            chunk.iter().enumerate().map(|(i, id)| {
                produce_event(p, prefix, Some(i as i32 % 3), id, "fast.thing", None)
            }),
        )
        .await;
    }
    ids
}

/// One `[[endpoints]]` table signed with `SECRET_A`; `extra` adds keys.
fn endpoint(id: &str, url: &str, extra: &str) -> String {
    endpoint_with(id, url, &[SECRET_A], extra)
}

fn endpoint_with(id: &str, url: &str, secrets: &[&str], extra: &str) -> String {
    let secrets: Vec<String> = secrets.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[[endpoints]]\nid = \"{id}\"\nurl = \"{url}\"\nsecrets = [{}]\n{extra}\n",
        secrets.join(", ")
    )
}

/// `test_config` without the loopback allow-list: the SSRF guard is fully on.
fn guarded_config(prefix: &str, extra: &str) -> Config {
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = []\n{extra}",
        bootstrap()
    );
    Config::from_toml_with_env(&text, "test", Vec::new()).expect("guarded test config")
}

/// Checks a `webhook-signature` value with an HMAC computed here, independently of the crate.
pub(crate) fn signature_valid(secret: &str, r: &Recorded) -> bool {
    let key = STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .expect("secret is base64");
    let id = &r.headers["webhook-id"];
    let ts = &r.headers["webhook-timestamp"];
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("hmac key");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&r.body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    r.headers["webhook-signature"]
        .split(' ')
        .any(|s| s == expected)
}

/// Event ids whose attempt 1 was deferred to the first tier (`<prefix>.retry.1m`: the endpoint
/// counted as saturated, e.g. on a starved CPU). These tests run the dispatcher alone, so a
/// deferred delivery is not lost: it waits on the tier.
fn deferred_ids(prefix: &str) -> BTreeSet<String> {
    read_until(
        &format!("{prefix}.retry.1m"),
        Duration::from_secs(3),
        |_| false,
    )
    .iter()
    .filter_map(|m| header(m, h::EVENT_ID).map(str::to_string))
    .collect()
}

fn ids_of(requests: &[Recorded]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in requests {
        *out.entry(r.headers["webhook-id"].clone()).or_default() += 1;
    }
    out
}

fn history(m: &OwnedMessage) -> Vec<AttemptRecord> {
    serde_json::from_str(header(m, d::HISTORY).expect("history header")).expect("history json")
}

fn num(m: &OwnedMessage, name: &str) -> i64 {
    header(m, name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .parse()
        .expect("integer header")
}

fn events_counter(running: &Running, result: &str) -> f64 {
    counter(
        &running.registry,
        "hookline_dispatcher_events_total",
        Some(("result", result)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_reaches_each_matching_endpoint_once_signed_and_byte_identical() {
    require_kafka();
    let rx = Receiver::start().await;
    let prefix = unique_prefix("dsp-fanout");
    let extra = format!(
        "{}{}",
        endpoint("all", &rx.url("all"), ""),
        endpoint_with(
            "messages",
            &rx.url("messages"),
            &[SECRET_A, SECRET_B],
            "event_types = [\"message.*\"]"
        )
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    // A record without the envelope headers first: counted, quarantined, never blocking the rest.
    produce(
        &p,
        &format!("{prefix}.dispatch"),
        Some(0),
        None,
        Some(b"{}"),
        &[],
    )
    .await;
    let mut sent = BTreeMap::new();
    for i in 0..8 {
        let (id, ty) = (
            format!("evt-{i}"),
            if i % 2 == 0 {
                "message.created"
            } else {
                "call.ended"
            },
        );
        let value = produce_event(&p, &prefix, Some(i % 3), &id, ty, Some("acme")).await;
        sent.insert(id, (ty, value));
    }

    let running = start_dispatcher(&config);
    let all = rx.wait_for("all", 8, WAIT).await;
    let messages = rx.wait_for("messages", 4, WAIT).await;
    assert_eq!(all.len(), 8, "every event reached the catch-all endpoint");
    assert_eq!(
        messages.len(),
        4,
        "message.* events reached the filtered one"
    );
    tokio::time::sleep(QUIET).await;
    let all = rx.requests("all");
    let messages = rx.requests("messages");
    assert!(ids_of(&all).values().all(|n| *n == 1), "{:?}", ids_of(&all));
    assert_eq!(ids_of(&all).len(), 8);
    let want_messages: BTreeSet<&String> = sent
        .iter()
        .filter(|(_, (ty, _))| ty.starts_with("message."))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        ids_of(&messages).keys().collect::<BTreeSet<_>>(),
        want_messages
    );
    assert!(ids_of(&messages).values().all(|n| *n == 1));

    for r in all.iter().chain(messages.iter()) {
        let id = &r.headers["webhook-id"];
        let (_, value) = &sent[id];
        assert_eq!(&r.body, value, "body byte-identical for {id}");
        assert_eq!(r.headers["webhook-attempt"], "1");
        assert_eq!(r.headers["content-type"], "application/json");
        assert!(signature_valid(SECRET_A, r), "signature of {id}");
    }
    for r in &messages {
        assert!(
            signature_valid(SECRET_B, r),
            "rotation: the second secret signs too"
        );
        assert_eq!(r.headers["webhook-signature"].split(' ').count(), 2);
    }
    assert_eq!(events_counter(&running, "fanned_out"), 8.0);
    assert_eq!(events_counter(&running, "malformed"), 1.0);
    // The malformed record is parked on `<p>.invalid`, never lost silently.
    let parked = read_until(&format!("{prefix}.invalid"), WAIT, |r| !r.is_empty());
    assert_eq!(parked.len(), 1, "the malformed record quarantined");
    let m = &parked[0];
    assert_eq!(header(m, h::INVALID_REASON), Some("bad_delivery_record"));
    assert_eq!(
        header(m, h::INVALID_DETAIL),
        Some("missing hookline-event-id header")
    );
    let dispatch = format!("{prefix}.dispatch");
    assert_eq!(header(m, h::SOURCE_TOPIC), Some(dispatch.as_str()));
    assert_eq!(header(m, h::SOURCE_PARTITION), Some("0"));
    assert_eq!(m.payload(), Some(&b"{}"[..]), "value whole");
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_endpoint_goes_to_the_first_tier_and_the_healthy_one_gets_one_post() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("failing", Behavior::Status(500));
    let prefix = unique_prefix("dsp-handoff");
    let extra = format!(
        "[retry]\nschedule = [\"0s\", \"30s\", \"60s\"]\n{}{}",
        endpoint("healthy", &rx.url("healthy"), ""),
        endpoint("failing", &rx.url("failing"), "")
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    let value = produce_event(&p, &prefix, None, "evt-h1", "message.created", Some("acme")).await;

    let running = start_dispatcher(&config);
    let tier = format!("{prefix}.retry.30s");
    let records = read_until(&tier, WAIT, |r| !r.is_empty());
    assert_eq!(records.len(), 1, "one delivery record on {tier}");
    tokio::time::sleep(QUIET).await;
    let healthy = rx.requests("healthy");
    let failing = rx.requests("failing");
    assert_eq!(
        healthy.len(),
        1,
        "the healthy endpoint gets exactly one POST"
    );
    assert_eq!(failing.len(), 1, "the dispatcher makes only attempt 1");

    let m = &records[0];
    assert_eq!(m.payload(), Some(&value[..]), "value byte-identical");
    assert_eq!(m.key(), Some(&b"evt-h1"[..]), "original key");
    assert_eq!(header(m, d::ENDPOINT_ID), Some("failing"));
    assert_eq!(header(m, h::EVENT_ID), Some("evt-h1"));
    assert_eq!(header(m, h::EVENT_TYPE), Some("message.created"));
    assert_eq!(header(m, h::TENANT), Some("acme"));
    assert_eq!(header(m, h::DEDUPE_KEY), Some("dk-evt-h1"));
    assert_eq!(header(m, d::ATTEMPT), Some("2"));
    let first = num(m, d::FIRST_ATTEMPT_MS);
    let arrived = failing[0].at_ms;
    assert!(
        (first..first + 2_000).contains(&arrived),
        "first attempt at {first}, arrival at {arrived}"
    );
    assert_eq!(num(m, d::DUE_MS), first + 30_000);
    let hist = history(m);
    assert_eq!(hist.len(), 1, "{hist:?}");
    assert_eq!(hist[0].n, 1);
    assert_eq!(hist[0].class, "http_status");
    assert_eq!(hist[0].status, Some(500));
    assert_eq!(hist[0].at_ms, first);
    assert!(header(m, d::DEAD_REASON).is_none());
    assert_eq!(
        counter(
            &running.registry,
            "hookline_dispatcher_handoffs_total",
            Some(("target", "retry"))
        ),
        1.0
    );
    running.stop().await.expect("clean stop");
    assert!(
        read_until(&format!("{prefix}.dlq"), Duration::from_secs(2), |_| false).is_empty(),
        "nothing dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_and_type_rules_pick_the_endpoints() {
    require_kafka();
    let rx = Receiver::start().await;
    let prefix = unique_prefix("dsp-tenants");
    let extra = format!(
        "{}{}{}",
        endpoint("acme", &rx.url("acme"), "tenant = \"acme\""),
        endpoint(
            "globex",
            &rx.url("globex"),
            "tenant = \"globex\"\nevent_types = [\"invoice.*\"]"
        ),
        endpoint("msgs", &rx.url("msgs"), "event_types = [\"message.*\"]"),
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    let events = [
        ("e1", "message.created", Some("acme")),   // acme, msgs
        ("e2", "message.created", Some("globex")), // msgs (globex wants invoice.*)
        ("e3", "invoice.paid", Some("globex")),    // globex
        ("e4", "invoice.paid", None),              // nobody: counted as no_endpoint
        ("e5", "invoice.paid", Some("acme")),      // acme
        ("e6", "call.ended", Some("initech")),     // nobody
    ];
    for (id, ty, tenant) in events {
        produce_event(&p, &prefix, None, id, ty, tenant).await;
    }
    let running = start_dispatcher(&config);
    rx.wait_for("acme", 2, WAIT).await;
    rx.wait_for("globex", 1, WAIT).await;
    rx.wait_for("msgs", 2, WAIT).await;
    tokio::time::sleep(QUIET).await;
    let got = |path: &str| -> Vec<String> { ids_of(&rx.requests(path)).into_keys().collect() };
    assert_eq!(
        got("acme"),
        ["e1", "e5"],
        "tenant B's events never reach tenant A"
    );
    assert_eq!(got("globex"), ["e3"]);
    assert_eq!(got("msgs"), ["e1", "e2"]);
    assert_eq!(rx.all_requests().len(), 5, "no extra POSTs");
    assert_eq!(events_counter(&running, "no_endpoint"), 2.0);
    assert_eq!(events_counter(&running, "fanned_out"), 4.0);
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_endpoint_is_recorded_as_a_timeout_at_about_its_timeout() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("hang", Behavior::Hang);
    let prefix = unique_prefix("dsp-timeout");
    let extra = format!(
        "[retry]\nschedule = [\"0s\", \"30s\"]\n{}",
        endpoint("hang", &rx.url("hang"), "timeout = \"500ms\"")
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    produce_event(&p, &prefix, None, "evt-t1", "message.created", None).await;
    let running = start_dispatcher(&config);
    let records = read_until(&format!("{prefix}.retry.30s"), WAIT, |r| !r.is_empty());
    assert_eq!(records.len(), 1);
    let hist = history(&records[0]);
    assert_eq!(hist.len(), 1);
    assert_eq!(hist[0].class, "timeout", "{hist:?}");
    assert_eq!(hist[0].status, None);
    println!(
        "timeout recorded after {} ms (timeout 500 ms)",
        hist[0].duration_ms
    );
    assert!(
        (450..2_500).contains(&hist[0].duration_ms),
        "duration {} ms",
        hist[0].duration_ms
    );
    assert_eq!(
        rx.requests("hang").len(),
        1,
        "the request did reach the endpoint"
    );
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_keep_flowing_while_one_endpoint_hangs() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("slow", Behavior::Hang);
    let prefix = unique_prefix("dsp-flow");
    let timeout = Duration::from_secs(6);
    let extra = format!(
        "[retry]\nschedule = [\"0s\", \"30s\"]\n[dispatcher]\nshutdown_grace = \"2s\"\n{}{}",
        endpoint(
            "slow",
            &rx.url("slow"),
            "event_types = [\"slow.*\"]\ntimeout = \"6s\""
        ),
        endpoint("fast", &rx.url("fast"), "event_types = [\"fast.*\"]"),
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    // A hanging delivery at the head of every partition, then 200 events to the healthy endpoint.
    for partition in 0..3 {
        let id = format!("slow-{partition}");
        produce_event(&p, &prefix, Some(partition), &id, "slow.thing", None).await;
    }
    let fast_ids = produce_many(&p, &prefix, "fast", 200).await;

    let running = start_dispatcher(&config);
    let fast = rx.wait_for("fast", 200, WAIT).await;
    let slow = rx.requests("slow");
    assert_eq!(fast.len(), 200, "all fast deliveries arrived");
    assert_eq!(ids_of(&fast).len(), 200);
    assert_eq!(
        ids_of(&fast).into_keys().collect::<Vec<_>>(),
        fast_ids,
        "each fast event exactly once"
    );
    assert!(!slow.is_empty(), "the hanging endpoint was called");
    let first_slow = slow.iter().map(|r| r.at).min().expect("slow request");
    let first_fast = fast.iter().map(|r| r.at).min().expect("fast request");
    let last_fast = fast.iter().map(|r| r.at).max().expect("fast request");
    let first_timeout_fires = first_slow + timeout;
    println!(
        "concurrency: 200 deliveries in {} ms (first fast {} ms after the first hanging request, \
         last fast {} ms after it; the first timeout fires at {} ms)",
        last_fast.duration_since(first_fast).as_millis(),
        first_fast.saturating_duration_since(first_slow).as_millis(),
        last_fast.saturating_duration_since(first_slow).as_millis(),
        timeout.as_millis()
    );
    assert!(
        last_fast < first_timeout_fires,
        "every fast delivery arrived before the hanging endpoint's first timeout"
    );
    // The hanging deliveries still end as hand-offs recorded as timeouts (at their timeout, or
    // cut short by the 2 s shutdown grace).
    running.stop().await.expect("clean stop");
    let records = read_until(&format!("{prefix}.retry.30s"), WAIT, |r| r.len() >= 3);
    assert_eq!(records.len(), 3);
    for m in &records {
        assert_eq!(header(m, d::ENDPOINT_ID), Some("slow"));
        assert_eq!(history(m)[0].class, "timeout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_stuck_behind_a_full_window_pauses_and_resumes() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("slow", Behavior::Hang);
    let prefix = unique_prefix("dsp-window");
    let timeout = Duration::from_secs(3);
    let extra = format!(
        "[retry]\nschedule = [\"0s\", \"30s\"]\n\
         [dispatcher]\nmax_in_flight_per_partition = 2\n{}{}",
        endpoint(
            "slow",
            &rx.url("slow"),
            "event_types = [\"slow.*\"]\ntimeout = \"3s\""
        ),
        endpoint("fast", &rx.url("fast"), "event_types = [\"fast.*\"]"),
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    // Partition 0: two hanging events at its head (the window counts unfinished events: two fill
    // it), then 20 more; partitions 1 and 2: 20 each.
    produce_event(&p, &prefix, Some(0), "slow-0", "slow.thing", None).await;
    produce_event(&p, &prefix, Some(0), "slow-0b", "slow.thing", None).await;
    let mut behind = Vec::new();
    let mut others = Vec::new();
    for i in 0..20 {
        for partition in 0..3 {
            let id = format!("fast-{partition}-{i:02}");
            produce_event(&p, &prefix, Some(partition), &id, "fast.thing", None).await;
            if partition == 0 {
                behind.push(id)
            } else {
                others.push(id)
            }
        }
    }

    let running = start_dispatcher(&config);
    let slow = rx.wait_for("slow", 2, WAIT).await;
    let first_timeout = slow.first().expect("the hanging request").at + timeout;
    // The window of partition 0 is full (the two hanging events): the others flow meanwhile.
    let flowing = rx.wait_for("fast", 41, WAIT).await;
    let arrived_early: BTreeSet<String> = flowing
        .iter()
        .filter(|r| r.at < first_timeout)
        .map(|r| r.headers["webhook-id"].clone())
        .collect();
    for id in &others {
        assert!(
            arrived_early.contains(id),
            "{id} waited for the stuck partition"
        );
    }
    let early_behind = behind
        .iter()
        .filter(|id| arrived_early.contains(*id))
        .count();
    assert!(
        early_behind <= 1,
        "partition 0 took {early_behind} events past a full window"
    );
    // After the timeout the head is handed off, partition 0 resumes and drains.
    let all = rx.wait_for("fast", 60, WAIT).await;
    tokio::time::sleep(QUIET).await;
    let got = ids_of(&rx.requests("fast"));
    assert_eq!(all.len(), 60);
    assert!(got.values().all(|n| *n == 1), "each once: {got:?}");
    assert_eq!(got.len(), 60);
    let last = all.iter().map(|r| r.at).max().expect("requests");
    println!(
        "window 2: partitions 1-2 done before the 3 s timeout; partition 0 drained {} ms after it",
        last.saturating_duration_since(first_timeout).as_millis()
    );
    let tier = read_until(&format!("{prefix}.retry.30s"), WAIT, |r| r.len() >= 2);
    let mut handed: Vec<&str> = tier.iter().filter_map(|m| header(m, h::EVENT_ID)).collect();
    handed.sort_unstable();
    assert_eq!(handed, ["slow-0", "slow-0b"]);
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_mid_stream_hands_partitions_over_without_loss_or_duplicates() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("ep", Behavior::Delay(Duration::from_millis(50), 200));
    let prefix = unique_prefix("dsp-rebalance");
    let extra = format!(
        "[kafka.options]\n\"heartbeat.interval.ms\" = \"300\"\n\
         [dispatcher]\nmax_in_flight_per_partition = 4\n{}",
        endpoint("ep", &rx.url("ep"), "max_concurrency = 4")
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let ids = produce_many(&producer(), &prefix, "r", 300).await;

    let first = start_dispatcher(&config);
    let before = rx.wait_for("ep", 40, WAIT).await.len();
    assert!(before >= 40);
    // A second member joins: the first is revoked some partitions (cooperative rebalance), waits
    // for their in-flight deliveries, commits, and the second continues from there.
    let second = start_dispatcher(&config);
    let all = rx.wait_for("ep", ids.len(), Duration::from_secs(50)).await;
    if all.len() < ids.len() {
        let got = ids_of(&all);
        let deferred = deferred_ids(&prefix);
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| !got.contains_key(*id) && !deferred.contains(*id))
            .collect();
        assert!(
            missing.is_empty(),
            "only {} of 300 arrived and {} were deferred; lost e.g. {:?}",
            all.len(),
            deferred.len(),
            &missing[..missing.len().min(5)]
        );
    }
    tokio::time::sleep(QUIET).await;
    let got = ids_of(&rx.requests("ep"));
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), ids, "none lost");
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    let second_took = counter(
        &second.registry,
        "hookline_dispatcher_events_total",
        Some(("result", "fanned_out")),
    );
    println!(
        "rebalance after {before} POSTs: the new member delivered {second_took} events; \
         {} sent twice",
        twice.len()
    );
    assert!(second_took > 0.0, "the second member got partitions");
    assert!(
        twice.is_empty(),
        "sent twice across the rebalance: {twice:?}"
    );
    first.stop().await.expect("first stops cleanly");
    second.stop().await.expect("second stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_partition_does_not_set_the_pace_of_the_others() {
    require_kafka();
    // Which partition's batch librdkafka queues first varies: put the slow one on each in turn.
    for slow_partition in 0..3 {
        slow_partition_scenario(slow_partition).await;
    }
}

/// Partition `slow_partition`: 100 events to an endpoint doing ~33/s (60 ms, 2 at a time, a
/// window of 2: room appears every ~30 ms, never a 100 ms stall); the other two: 100 events each
/// to a fast endpoint. The fast ones must not wait for the slow batch (~3 s).
async fn slow_partition_scenario(slow_partition: i32) {
    let rx = Receiver::start().await;
    rx.default("slow", Behavior::Delay(Duration::from_millis(60), 200));
    let prefix = unique_prefix(&format!("dsp-pace{slow_partition}"));
    let extra = format!(
        "[dispatcher]\nmax_in_flight_per_partition = 2\n{}{}",
        endpoint(
            "slow",
            &rx.url("slow"),
            "event_types = [\"slow.*\"]\nmax_concurrency = 2"
        ),
        endpoint("fast", &rx.url("fast"), "event_types = [\"fast.*\"]"),
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    let (a, b) = ((slow_partition + 1) % 3, (slow_partition + 2) % 3);
    for i in 0..100 {
        let (slow, fast1, fast2) = (format!("s-{i}"), format!("f1-{i}"), format!("f2-{i}"));
        futures::join!(
            produce_event(&p, &prefix, Some(slow_partition), &slow, "slow.thing", None),
            produce_event(&p, &prefix, Some(a), &fast1, "fast.thing", None),
            produce_event(&p, &prefix, Some(b), &fast2, "fast.thing", None),
        );
    }
    let running = start_dispatcher(&config);
    let fast = rx.wait_for("fast", 200, WAIT).await;
    assert_eq!(fast.len(), 200);
    let slow_done = rx.requests("slow").len();
    let first = rx
        .all_requests()
        .iter()
        .map(|r| r.at)
        .min()
        .expect("requests");
    let fast_last = fast.iter().map(|r| r.at).max().expect("fast");
    println!(
        "slow partition {slow_partition}: the 200 fast events took {} ms while the slow endpoint \
         got {slow_done} of its 100 (it needs ~3 s for them)",
        fast_last.duration_since(first).as_millis()
    );
    assert!(
        slow_done < 50,
        "partition {slow_partition}: the fast partitions waited for the slow one \
         ({slow_done} slow deliveries first)"
    );
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_address_never_gets_a_connection_and_is_handed_off_as_blocked() {
    require_kafka();
    let rx = Receiver::start().await;
    let prefix = unique_prefix("dsp-ssrf");
    let by_name = format!("http://localhost:{}/by-name", rx.addr.port());
    let extra = format!(
        "[retry]\nschedule = [\"0s\", \"30s\"]\n{}{}",
        endpoint("literal", &rx.url("literal"), ""),
        endpoint("by-name", &by_name, ""),
    );
    let config = guarded_config(&prefix, &extra);
    apply_topics(&config).await;
    let p = producer();
    produce_event(&p, &prefix, None, "evt-s1", "message.created", None).await;
    let running = start_dispatcher(&config);
    let records = read_until(&format!("{prefix}.retry.30s"), WAIT, |r| r.len() >= 2);
    assert_eq!(records.len(), 2);
    let mut endpoints = Vec::new();
    for m in &records {
        let hist = history(m);
        assert_eq!(hist[0].class, "blocked", "{hist:?}");
        endpoints.push(header(m, d::ENDPOINT_ID).expect("endpoint").to_string());
    }
    endpoints.sort();
    assert_eq!(endpoints, ["by-name", "literal"]);
    assert!(rx.all_requests().is_empty(), "the receiver got nothing");
    running.stop().await.expect("clean stop");
}

/// The real `hookline` binary running `run dispatcher`, killed on drop.
struct Process {
    child: Child,
}

impl Process {
    fn start(config_file: &PathBuf, log: &PathBuf) -> Process {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_hookline"))
            .arg("--config")
            .arg(config_file)
            .args(["run", "dispatcher"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start hookline");
        Process { child }
    }

    fn sigkill(&mut self) {
        self.child.kill().expect("kill -9");
        let _ = self.child.wait();
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
    }

    /// Polls for the exit status until the deadline.
    async fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config file for the binary in a fresh temp dir: one slow-ish endpoint (4 requests at a
/// time), a window of 4 events per partition (so a stop lands mid-stream and partitions pause
/// and resume), a short session timeout so a killed member leaves the group quickly.
fn binary_setup(prefix: &str, rx: &Receiver) -> (Config, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{bs}\"\n\
         [kafka.options]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n\
         [topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
         [server]\nlisten = \"127.0.0.1:0\"\n\
         [http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
         [dispatcher]\nmax_in_flight_per_partition = 4\n\
         [log]\nlevel = \"info\"\n\
         {ep}",
        bs = bootstrap(),
        ep = endpoint("ep", &rx.url("ep"), "max_concurrency = 4"),
    );
    let file = dir.join("hookline.toml");
    std::fs::write(&file, &text).expect("write config");
    let config = Config::from_toml_with_env(&text, "test", Vec::new()).expect("binary config");
    (config, file, dir.join("hookline.log"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_loses_nothing() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("ep", Behavior::Delay(Duration::from_millis(50), 200));
    let prefix = unique_prefix("dsp-kill");
    let (config, file, log) = binary_setup(&prefix, &rx);
    apply_topics(&config).await;
    let ids = produce_many(&producer(), &prefix, "k", 300).await;

    let mut first = Process::start(&file, &log);
    let before = rx.wait_for("ep", 60, WAIT).await.len();
    assert!(
        before >= 60,
        "the first process delivered ({before}); log: {}",
        log.display()
    );
    first.sigkill();
    let at_kill = rx.requests("ep").len();
    assert!(
        at_kill < 300,
        "killed mid-stream ({at_kill} of 300 arrived)"
    );

    let mut second = Process::start(&file, &log);
    let start = Instant::now();
    let deadline = Duration::from_secs(50);
    let mut got = ids_of(&rx.requests("ep"));
    while got.len() < ids.len() && start.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = ids_of(&rx.requests("ep"));
    }
    let deferred = deferred_ids(&prefix);
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !got.contains_key(*id) && !deferred.contains(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "lost {} events after kill -9, e.g. {:?}; log: {}",
        missing.len(),
        &missing[..missing.len().min(5)],
        log.display()
    );
    let total = rx.requests("ep").len();
    println!(
        "kill -9 after {at_kill} POSTs; all 300 events arrived {} ms after the restart; \
         {} POSTs in all ({} re-sent: at-least-once)",
        start.elapsed().as_millis(),
        total,
        total - ids.len()
    );
    second.sigterm();
    let status = second.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "log: {}",
        log.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_sends_nothing_twice_and_loses_nothing() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("ep", Behavior::Delay(Duration::from_millis(50), 200));
    let prefix = unique_prefix("dsp-term");
    let (config, file, log) = binary_setup(&prefix, &rx);
    apply_topics(&config).await;
    let ids = produce_many(&producer(), &prefix, "s", 300).await;

    let mut first = Process::start(&file, &log);
    let before = rx.wait_for("ep", 60, WAIT).await.len();
    assert!(
        before >= 60,
        "the first process delivered ({before}); log: {}",
        log.display()
    );
    let term_at = Instant::now();
    first.sigterm();
    let status = first.wait_exit(Duration::from_secs(40)).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit code after SIGTERM; log: {}",
        log.display()
    );
    let at_exit = rx.requests("ep").len();
    println!(
        "SIGTERM after {before} POSTs; exited 0 after {} ms with {at_exit} delivered",
        term_at.elapsed().as_millis()
    );
    assert!(
        at_exit < 300,
        "stopped mid-stream ({at_exit} of 300 arrived)"
    );

    let mut second = Process::start(&file, &log);
    let restart = Instant::now();
    let all = rx.wait_for("ep", ids.len(), Duration::from_secs(50)).await;
    assert!(all.len() >= ids.len(), "only {} of 300 arrived", all.len());
    let rest: Vec<Instant> = all[at_exit..].iter().map(|r| r.at).collect();
    if let (Some(first), Some(last)) = (rest.first(), rest.last()) {
        println!(
            "restarted process: first POST {} ms after start, the other {} in {} ms",
            first.duration_since(restart).as_millis(),
            rest.len(),
            last.duration_since(*first).as_millis()
        );
    }
    tokio::time::sleep(QUIET).await;
    let got = ids_of(&rx.requests("ep"));
    let twice: Vec<(&String, &usize)> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} events were POSTed more than once, e.g. {:?}; log: {}",
        twice.len(),
        &twice[..twice.len().min(5)],
        log.display()
    );
    assert_eq!(got.into_keys().collect::<Vec<_>>(), ids, "none lost");
    second.sigterm();
    let status = second.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "log: {}",
        log.display()
    );
}

/// Every first attempt lands in the delivery log `<p>.attempts`, unless `control.delivery_log`
/// is off: then the same deliveries happen and the log stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_attempts_are_logged_unless_the_delivery_log_is_off() {
    require_kafka();
    let rx = Receiver::start().await;
    let p = producer();
    for (name, extra, logged) in [
        ("on", "", 3usize),
        ("off", "[control]\ndelivery_log = false\n", 0),
    ] {
        let prefix = unique_prefix(&format!("dsp-log-{name}"));
        let path = format!("log-{name}");
        let config = test_config(
            &prefix,
            &format!("{extra}{}", endpoint(&path, &rx.url(&path), "")),
        );
        apply_topics(&config).await;
        for i in 0..3 {
            produce_event(
                &p,
                &prefix,
                Some(i % 3),
                &format!("{name}-{i}"),
                "t.x",
                None,
            )
            .await;
        }
        let running = start_dispatcher(&config);
        assert_eq!(
            rx.wait_for(&path, 3, WAIT).await.len(),
            3,
            "{name}: delivered"
        );
        running.stop().await.expect("dispatcher stops");
        let attempts = read_all_quiet(
            &format!("{prefix}.attempts"),
            logged,
            WAIT,
            Duration::from_secs(2),
        );
        assert_eq!(attempts.len(), logged, "{name}: delivery log records");
    }
}

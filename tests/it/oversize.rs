//! Records that can never be written are never a reason to exit (issue 8, item 1).
//!
//! - Stage A: a zstd producer puts an ~8 MB value and a ~3 MB key on `<p>.events` (tiny on the
//!   wire, far beyond what hookline may write). Each is quarantined with `record_too_large`, its
//!   bytes cut to a bounded prefix and its original sizes in headers; the events behind it on the
//!   same partition are deduped and dispatched; the stage keeps running.
//! - Hand-off: a delivery record larger than its tier topic's `max.message.bytes` (lowered by the
//!   test, as an operator might) is dead-lettered with reason `record_too_large`; the dispatcher
//!   keeps running and hands the next failure to the tier as usual.

use std::time::Duration;

use rdkafka::admin::{AlterConfig, ResourceSpecifier};
use rdkafka::config::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;

use hookline_common::config::Config;
use hookline_common::contract::delivery as d;
use hookline_common::contract::headers as h;

use crate::harness::*;
use crate::receiver::{Behavior, Receiver};

/// Generous waits: tests share a 2-core machine with the broker and each other.
const WAIT: Duration = Duration::from_secs(60);

/// A producer that may write huge records: zstd makes them small on the wire.
fn zstd_producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("compression.type", "zstd")
        .set("message.max.bytes", "20000000")
        .set("linger.ms", "2")
        .create()
        .expect("zstd producer")
}

/// Sets `max.message.bytes` of one topic of the plan, keeping the plan's other configs (the
/// legacy AlterConfigs call replaces the whole set).
async fn set_max_message_bytes(config: &Config, topic: &str, bytes: usize) {
    let spec = hookline_common::contract::topics::plan(config)
        .into_iter()
        .find(|s| s.name == topic)
        .expect("topic in the plan");
    let value = bytes.to_string();
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (k, v) in &spec.configs {
        if k != "max.message.bytes" {
            alter = alter.set(k, v);
        }
    }
    alter = alter.set("max.message.bytes", &value);
    let results = admin()
        .alter_configs([&alter], &admin_opts())
        .await
        .expect("alter configs");
    for r in results {
        r.expect("alter topic config");
    }
}

/// A valid event body with `n` hex digits of pseudo-random data (incompressible, so the broker's
/// limit, which applies to the compressed batch, really is exceeded).
fn incompressible_event(id: &str, n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut data = String::with_capacity(n);
    while data.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.push_str(&format!("{x:016x}"));
    }
    data.truncate(n);
    format!(r#"{{"id":"{id}","type":"big.thing","data":"{data}"}}"#).into_bytes()
}

/// Fails (with the stage's own error) if the stage has stopped.
async fn assert_running(running: &mut Running, what: &str) {
    if running.handle.as_ref().is_some_and(|h| h.is_finished()) {
        let stopped = match running.handle.take() {
            Some(h) => format!("{:?}", h.await),
            None => "unknown".to_string(),
        };
        panic!("{what} must keep running; it stopped with {stopped}");
    }
}

fn event(id: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","type":"message.created","data":{{}}}}"#).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_value_and_huge_key_are_quarantined_and_the_partition_flows() {
    require_kafka();
    let prefix = unique_prefix("oversize-a");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let p = zstd_producer();

    produce(
        &p,
        &events,
        Some(0),
        Some(b"k-before"),
        Some(&event("e-before")),
        &[],
    )
    .await;
    // ~8 MB value (compressible: tiny on the wire, far beyond hookline's 5 MiB).
    let huge_value = format!(
        r#"{{"id":"e-huge-value","type":"a","data":"{}"}}"#,
        "x".repeat(8_000_000)
    );
    produce(
        &p,
        &events,
        Some(0),
        Some(b"k-huge-value"),
        Some(huge_value.as_bytes()),
        &[("x-trace", "t1")],
    )
    .await;
    // ~3 MB key with a small, valid value.
    let huge_key = vec![b'k'; 3_000_000];
    produce(
        &p,
        &events,
        Some(0),
        Some(&huge_key),
        Some(&event("e-huge-key")),
        &[],
    )
    .await;
    for id in ["e-after-1", "e-after-2"] {
        produce(
            &p,
            &events,
            Some(0),
            Some(id.as_bytes()),
            Some(&event(id)),
            &[],
        )
        .await;
    }

    let mut running = start_deduper(&config);
    let invalid = read_until(&format!("{prefix}.invalid"), WAIT, |r| r.len() >= 2);
    let dispatch = read_until(&format!("{prefix}.dispatch"), WAIT, |r| r.len() >= 3);
    assert_running(&mut running, "stage A").await;

    let mut ids: Vec<&str> = dispatch
        .iter()
        .map(|m| header(m, h::EVENT_ID).expect("event id"))
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["e-after-1", "e-after-2", "e-before"],
        "the events around the huge ones are dispatched"
    );

    assert_eq!(invalid.len(), 2, "both huge records quarantined");
    for m in &invalid {
        assert_eq!(header(m, h::INVALID_REASON), Some("record_too_large"));
        assert!(header(m, h::INVALID_DETAIL).is_some_and(|d| !d.is_empty()));
        assert_eq!(header(m, h::SOURCE_TOPIC), Some(events.as_str()));
        assert_eq!(header(m, h::SOURCE_PARTITION), Some("0"));
        assert!(m.payload().map_or(0, |v| v.len()) <= 64 * 1024, "value cut");
        assert!(m.key().map_or(0, |k| k.len()) <= 1024, "key cut");
    }
    let by_value = invalid
        .iter()
        .find(|m| m.key() == Some(&b"k-huge-value"[..]))
        .expect("the huge value is quarantined with its (small) key");
    assert_eq!(
        header(by_value, h::ORIGINAL_VALUE_BYTES),
        Some(huge_value.len().to_string().as_str())
    );
    assert_eq!(header(by_value, h::ORIGINAL_KEY_BYTES), Some("12"));
    assert_eq!(
        header(by_value, "x-trace"),
        Some("t1"),
        "small headers kept"
    );
    assert!(huge_value
        .as_bytes()
        .starts_with(by_value.payload().expect("a value prefix")));
    let by_key = invalid
        .iter()
        .find(|m| header(m, h::ORIGINAL_KEY_BYTES) == Some("3000000"))
        .expect("the huge key is quarantined with its original size");
    assert_eq!(
        by_key.key().map(|k| k.len()),
        Some(1024),
        "key cut to 1 KiB"
    );
    assert_eq!(
        by_key.payload(),
        Some(&event("e-huge-key")[..]),
        "a small value is kept whole"
    );
    assert_eq!(
        counter(
            &running.registry,
            "hookline_deduper_invalid_events_total",
            Some(("reason", "record_too_large"))
        ),
        2.0
    );
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_too_large_for_its_tier_is_dead_lettered_and_the_dispatcher_goes_on() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("failing", Behavior::Status(500));
    let prefix = unique_prefix("oversize-b");
    let extra = format!(
        "[retry]\nschedule = [\"0s\", \"30s\", \"60s\"]\n\
         [[endpoints]]\nid = \"failing\"\nurl = \"{}\"\n",
        rx.url("failing")
    );
    let config = test_config(&prefix, &extra);
    apply_topics(&config).await;
    let tier = format!("{prefix}.retry.30s");
    // An operator lowered the tier's limit below records already admitted (or a history grew).
    set_max_message_bytes(&config, &tier, 100_000).await;

    let p = producer();
    let dispatch = format!("{prefix}.dispatch");
    let big = incompressible_event("e-big", 200_000);
    let small = event("e-small");
    for (id, value) in [("e-big", &big), ("e-small", &small)] {
        let dk = format!("id:{id}");
        produce(
            &p,
            &dispatch,
            Some(0),
            Some(id.as_bytes()),
            Some(value),
            &[
                (h::EVENT_ID, id),
                (h::EVENT_TYPE, "big.thing"),
                (h::DEDUPE_KEY, dk.as_str()),
            ],
        )
        .await;
    }

    let mut running = start_dispatcher(&config);
    let dead = read_until(&format!("{prefix}.dlq"), WAIT, |r| !r.is_empty());
    let retried = read_until(&tier, WAIT, |r| !r.is_empty());
    assert_running(&mut running, "the dispatcher").await;
    assert_eq!(dead.len(), 1, "the big delivery is dead-lettered");
    let m = &dead[0];
    assert_eq!(header(m, h::EVENT_ID), Some("e-big"));
    assert_eq!(header(m, d::DEAD_REASON), Some("record_too_large"));
    assert_eq!(header(m, d::ENDPOINT_ID), Some("failing"));
    assert_eq!(m.payload(), Some(&big[..]), "the DLQ keeps the whole event");
    assert_eq!(retried.len(), 1, "the small failure still goes to the tier");
    assert_eq!(header(&retried[0], h::EVENT_ID), Some("e-small"));
    assert_eq!(
        counter(
            &running.registry,
            "hookline_dispatcher_handoffs_total",
            Some(("target", "dlq_record_too_large"))
        ),
        1.0
    );
    running.stop().await.expect("clean stop");
}

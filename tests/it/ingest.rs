//! REST ingest's core against the real broker: idempotency keys give one id and one delivery
//! under concurrency and across ingest restarts, per tenant; bad input is refused naming the
//! field; an unreachable Kafka is a 503 to retry.

use std::sync::Arc;
use std::time::Duration;

use hookline_ingest::{Ingest, Publish, Rejected};

use crate::harness::*;
use crate::receiver::Receiver;

async fn publish(
    ingest: &Ingest,
    scope: Option<&str>,
    key: Option<&str>,
    body: &str,
) -> Result<String, Rejected> {
    ingest
        .publish(Publish {
            tenant_scope: scope,
            idempotency_key: key,
            body: body.as_bytes(),
        })
        .await
        .map(|a| a.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_is_one_event_and_one_delivery_across_requests_and_restarts() {
    require_kafka();
    let rx = Receiver::start().await;
    let prefix = unique_prefix("ingest");
    let config = test_config(
        &prefix,
        &format!(
            "[[endpoints]]\nid = \"acme\"\nurl = \"{}\"\ntenant = \"acme\"\n\
             [[endpoints]]\nid = \"globex\"\nurl = \"{}\"\ntenant = \"globex\"\n",
            rx.url("acme"),
            rx.url("globex")
        ),
    );
    apply_topics(&config).await;
    let stages = [start_deduper(&config), start_dispatcher(&config)];

    // 50 concurrent requests with one key, from a tenant token.
    let ingest = Arc::new(Ingest::new(&config, &prometheus::Registry::new()).expect("ingest"));
    let body = r#"{"type":"order.paid","data":{"order":42}}"#;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let ingest = ingest.clone();
        tasks.spawn(async move { publish(&ingest, Some("acme"), Some("order-42"), body).await });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(r) = tasks.join_next().await {
        ids.insert(r.expect("task").expect("accepted"));
    }
    assert_eq!(ids.len(), 1, "every response carries the same id: {ids:?}");
    let id = ids.into_iter().next().unwrap();

    // A new ingest (a restarted process: nothing remembered) answers the same id.
    drop(ingest);
    let restarted = Ingest::new(&config, &prometheus::Registry::new()).expect("ingest");
    let again = publish(&restarted, Some("acme"), Some("order-42"), body).await;
    assert_eq!(again.as_deref(), Ok(id.as_str()));
    // Another tenant with the same key is its own event (admin token naming the tenant).
    let other = publish(
        &restarted,
        None,
        Some("order-42"),
        r#"{"type":"order.paid","tenant":"globex","data":{"order":42}}"#,
    )
    .await
    .expect("accepted");
    assert_ne!(other, id);

    let got = rx.wait_for("globex", 1, Duration::from_secs(60)).await;
    assert_eq!(got.len(), 1, "globex's event is delivered");
    assert_eq!(got[0].headers.get("webhook-id"), Some(&other));
    let got = rx.wait_for("acme", 1, Duration::from_secs(60)).await;
    assert_eq!(got.len(), 1, "acme's event is delivered");
    assert_eq!(got[0].headers.get("webhook-id"), Some(&id));
    let sent: serde_json::Value = serde_json::from_slice(&got[0].body).expect("json body");
    assert_eq!(sent["id"], id.as_str());
    assert_eq!(sent["tenant"], "acme", "the token's tenant is filled in");
    assert_eq!(sent["data"]["order"], 42);
    // The 50 + 1 copies on <p>.events stay one delivery (the deduper's window).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.requests("acme").len(), 1, "one delivery for one key");
    for s in stages {
        s.stop().await.expect("clean stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_naming_the_field_and_nothing_is_written() {
    require_kafka();
    let prefix = unique_prefix("ingest-bad");
    let config = test_config(&prefix, "[input]\nmax_payload_bytes = 1024\n");
    apply_topics(&config).await;
    let ingest = Ingest::new(&config, &prometheus::Registry::new()).expect("ingest");
    let refused = |r: Result<String, Rejected>| r.expect_err("refused");

    let r = refused(publish(&ingest, None, None, r#"{"data":{}}"#).await);
    assert_eq!((r.status(), r.field()), (400, Some("type")), "{r:?}");
    let r = refused(publish(&ingest, None, None, r#"{"id":"a b","type":"x"}"#).await);
    assert_eq!((r.status(), r.field()), (400, Some("id")), "{r:?}");
    let r = refused(publish(&ingest, None, None, "[]").await);
    assert_eq!((r.status(), r.field()), (400, Some("body")), "{r:?}");
    let r = refused(publish(&ingest, None, Some(""), r#"{"type":"x"}"#).await);
    assert_eq!(
        (r.status(), r.field()),
        (400, Some("Idempotency-Key")),
        "{r:?}"
    );
    let big = format!(r#"{{"type":"x","data":"{}"}}"#, "a".repeat(2000));
    assert_eq!(
        refused(publish(&ingest, None, None, &big).await).status(),
        413
    );
    // A tenant token may not publish for another tenant, nor without one.
    let r = refused(
        publish(
            &ingest,
            Some("acme"),
            None,
            r#"{"type":"x","tenant":"globex"}"#,
        )
        .await,
    );
    assert_eq!(r.status(), 403, "{r:?}");
    let r = refused(publish(&ingest, Some("acme"), None, r#"{"type":"x","tenant":null}"#).await);
    assert_eq!(r.status(), 403, "{r:?}");

    // One good event, then the topic holds exactly it.
    let id = publish(&ingest, None, None, r#"{"type":"x","data":{}}"#)
        .await
        .expect("accepted");
    let id_of = |m: &rdkafka::message::OwnedMessage| {
        let v: serde_json::Value =
            serde_json::from_slice(rdkafka::Message::payload(m).unwrap_or_default())
                .unwrap_or_default();
        v["id"].as_str().map(str::to_string)
    };
    let records = read_until(&format!("{prefix}.events"), Duration::from_secs(20), |ms| {
        ms.iter().any(|m| id_of(m).as_deref() == Some(id.as_str()))
    });
    let ids: Vec<_> = records.iter().map(id_of).collect();
    assert_eq!(
        ids,
        vec![Some(id.clone())],
        "only the accepted event was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_kafka_is_a_503_to_retry() {
    let mut config = test_config(&unique_prefix("ingest-down"), "");
    // Nothing listens there.
    config.kafka.bootstrap_servers = "127.0.0.1:1".into();
    let ingest = Ingest::new(&config, &prometheus::Registry::new()).expect("ingest");
    let started = std::time::Instant::now();
    let r = publish(&ingest, None, Some("k1"), r#"{"type":"x"}"#)
        .await
        .expect_err("no broker");
    assert_eq!(r.status(), 503, "{r:?}");
    assert!(matches!(r, Rejected::Unavailable { .. }));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "answered within the produce timeout, not hung: {:?}",
        started.elapsed()
    );
}

//! REST ingest's core against the real broker: bad input is refused naming the field; an
//! unreachable Kafka is a 503 to retry; a key reused with another body is refused on every
//! process. (One key under 50 concurrent requests and across restarts, over HTTP through the
//! admin process: `admin.rs`.)

use std::sync::Arc;
use std::time::Duration;

use hookline_ingest::{Ingest, Publish, Rejected};

use crate::harness::*;

async fn start_ingest(config: &hookline_common::config::Config) -> Ingest {
    Ingest::start(config, &prometheus::Registry::new(), 1000)
        .await
        .expect("ingest starts")
}

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
            traceparent: None,
            body: body.as_bytes(),
        })
        .await
        .map(|a| a.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_naming_the_field_and_nothing_is_written() {
    require_kafka();
    let prefix = unique_prefix("ingest-bad");
    let config = test_config(&prefix, "[input]\nmax_payload_bytes = 1024\n");
    apply_topics(&config).await;
    let ingest = start_ingest(&config).await;
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

/// Its own broker, stopped under a running ingest: every request is a 503 to retry, answered
/// within the produce timeout, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_going_away_is_a_503_to_retry() {
    let broker = crate::resilience::DedicatedBroker::start_new("ingest-down");
    let config =
        crate::resilience::dedicated_config(&broker.bootstrap(), &unique_prefix("ingest-down"));
    apply_topics(&config).await;
    let ingest = start_ingest(&config).await;
    publish(&ingest, None, Some("k0"), r#"{"type":"x"}"#)
        .await
        .expect("accepted while the broker runs");
    broker.run("stop");
    for key in [None, Some("k1")] {
        let started = std::time::Instant::now();
        let r = publish(&ingest, None, key, r#"{"type":"x"}"#)
            .await
            .expect_err("no broker");
        assert_eq!((r.status(), r.code()), (503, "kafka_unavailable"), "{r:?}");
        assert!(
            matches!(r, Rejected::Unavailable { retry_after, .. } if retry_after > Duration::ZERO)
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "answered within the produce timeout, not hung: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_body_is_refused_on_every_process_and_after_restarts() {
    require_kafka();
    let prefix = unique_prefix("ingest-reuse");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    // Two processes' ingests, racing 20 requests each with one key and two different bodies.
    let a = Arc::new(start_ingest(&config).await);
    let b = Arc::new(start_ingest(&config).await);
    let bodies = [
        r#"{"type":"x","data":{"n":1}}"#,
        r#"{"type":"x","data":{"n":2}}"#,
    ];
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let ingest = if i % 2 == 0 { a.clone() } else { b.clone() };
        let body = bodies[(i / 2) % 2];
        tasks.spawn(async move {
            (
                body,
                publish(&ingest, Some("acme"), Some("k-1"), body).await,
            )
        });
    }
    let mut accepted = std::collections::BTreeSet::new();
    let mut ids = std::collections::BTreeSet::new();
    let mut reused = 0;
    while let Some(r) = tasks.join_next().await {
        match r.expect("task") {
            (body, Ok(id)) => {
                accepted.insert(body);
                ids.insert(id);
            }
            (_, Err(Rejected::KeyReused { .. })) => reused += 1,
            (_, Err(e)) => panic!("unexpected refusal: {e:?}"),
        }
    }
    assert_eq!(
        accepted.len(),
        1,
        "one body owns the key on both processes: {accepted:?}"
    );
    assert_eq!(ids.len(), 1);
    assert_eq!(reused, 20, "every request with the other body is refused");
    let owner = *accepted.iter().next().unwrap();
    let other = bodies.iter().find(|b| **b != owner).unwrap();

    // A process started later reads the claims: same answers, and another tenant is free.
    drop((a, b));
    let c = start_ingest(&config).await;
    let r = publish(&c, Some("acme"), Some("k-1"), other)
        .await
        .expect_err("reused");
    assert_eq!(
        (r.status(), r.code()),
        (422, "idempotency_key_reused"),
        "{r:?}"
    );
    assert!(r.message().contains("k-1"), "{r:?}");
    assert_eq!(
        publish(&c, Some("acme"), Some("k-1"), owner).await.ok(),
        ids.into_iter().next()
    );
    assert!(publish(&c, Some("globex"), Some("k-1"), other)
        .await
        .is_ok());
}

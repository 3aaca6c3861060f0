//! Stages that stay up, say when they are ready and alive, and never half-commit:
//! - deduper stage B aborts its open transaction on an error exit and refuses mismatched
//!   partition counts (issue 8, item 8);
//! - `/readyz` means assigned (and restored), `/healthz` means the stage loops turn (item 13);
//! - a broker bounce is retried through, not a reason to exit (item 14), on a dedicated broker.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::message::OwnedMessage;

use hookline_common::headers as h;

use crate::harness::*;

/// Event id header of each record → how many times it was seen.
fn id_counts(records: &[OwnedMessage]) -> BTreeMap<String, usize> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_b_refuses_a_changelog_with_another_partition_count() {
    require_kafka();
    let prefix = unique_prefix("partmismatch");
    let config = test_config(&prefix, "");
    // By hand: every topic with 3 partitions but the changelog, which has 2.
    let topics: Vec<(String, i32)> = ["events", "invalid", "dedupe", "dispatch"]
        .iter()
        .map(|t| (format!("{prefix}.{t}"), 3))
        .chain([(format!("{prefix}.dedupe-state"), 2)])
        .collect();
    let new: Vec<NewTopic> = topics
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
    let mut running = start_deduper(&config);
    let err = wait_for_exit(&mut running, Duration::from_secs(90))
        .await
        .expect_err("stage B must refuse to start");
    let msg = format!("{err:#}");
    assert!(
        msg.contains(&format!("{prefix}.dedupe-state has 2 partitions"))
            && msg.contains(&format!("{prefix}.dedupe has 3")),
        "the error names both topics and their counts: {msg}"
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

#[allow(dead_code)]
fn _unused(_: Instant) {}

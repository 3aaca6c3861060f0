//! The whole pipeline in one process, as `hookline run all` wires it: producers' events with
//! duplicates go in at `<p>.events`; each unique event reaches each subscribed endpoint, a flaky
//! endpoint is retried on the schedule until it succeeds, a dead one ends in the DLQ, and bad
//! input is quarantined.

use std::collections::BTreeMap;
use std::time::Duration;

use hookline_common::contract::delivery::DeliveryMeta;
use hookline_common::contract::headers as h;
use hookline_common::contract::secret::decode_secret;
use hookline_delivery::signing::verify;

use crate::harness::*;
use crate::receiver::{Behavior, Receiver};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_flow_through_dedupe_delivery_retries_and_dead_letters() {
    require_kafka();
    let rx = Receiver::start().await;
    // `flaky` fails its first two requests, `dead` always fails.
    rx.script("flaky", vec![Behavior::Status(503), Behavior::Status(500)]);
    rx.default("dead", Behavior::Status(500));
    let prefix = unique_prefix("pipeline");
    let endpoint = |id: &str, path: &str, types: &str| {
        format!(
            "[[endpoints]]\nid = \"{id}\"\nurl = \"{}\"\nsecrets = [\"{SECRET}\"]\nevent_types = [{types}]\n",
            rx.url(path)
        )
    };
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"2s\", \"4s\"]\n{}{}{}",
            endpoint("all", "all", ""),
            endpoint("flaky", "flaky", "\"order.*\""),
            endpoint("dead", "dead", "\"refund.*\""),
        ),
    );
    apply_topics(&config).await;
    let stages = [
        start_stage(&config, hookline_deduper::run),
        start_stage(&config, hookline_dispatcher::run),
        start_stage(&config, |c, r, rd, s| {
            hookline_retry_tiers::run(c, r, rd, s, None)
        }),
    ];

    let events = format!("{prefix}.events");
    let p = producer();
    let mut produced: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 0..20 {
        let id = format!("evt-{i}");
        let ty = if i == 0 {
            "order.paid"
        } else if i == 1 {
            "refund.issued"
        } else {
            "message.created"
        };
        // Every event is produced three times with different bytes and keys: one passes.
        for copy in 0..3 {
            let body = format!(r#"{{"id":"{id}","type":"{ty}","data":{{"copy":{copy}}}}}"#);
            produce(
                &p,
                &events,
                Some(copy % 3),
                Some(format!("k{copy}").as_bytes()),
                Some(body.as_bytes()),
                &[],
            )
            .await;
            if copy == 0 {
                produced.insert(id.clone(), body.into_bytes());
            }
        }
    }
    produce(&p, &events, Some(0), None, Some(b"not json"), &[]).await;

    // Every unique event reaches the catch-all endpoint once, signed, with one copy's bytes.
    let all = rx.wait_for("all", 20, Duration::from_secs(60)).await;
    let key = decode_secret(SECRET).expect("secret");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in &all {
        let id = r.headers["webhook-id"].clone();
        let ts: i64 = r.headers["webhook-timestamp"].parse().expect("timestamp");
        assert!(
            verify(&key, &id, ts, &r.body, &r.headers["webhook-signature"]),
            "signature of {id}"
        );
        let body = std::str::from_utf8(&r.body).expect("utf8");
        assert!(body.contains(&format!("\"id\":\"{id}\"")), "{body}");
        *seen.entry(id).or_default() += 1;
    }
    assert_eq!(seen.len(), 20, "every unique event delivered");

    // The flaky endpoint: attempts 1 and 2 fail, attempt 3 (on the 4s tier) succeeds.
    let flaky = rx.wait_for("flaky", 3, Duration::from_secs(60)).await;
    assert_eq!(flaky.len(), 3);
    let attempts: Vec<&str> = flaky
        .iter()
        .map(|r| r.headers["webhook-attempt"].as_str())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    assert!(flaky
        .iter()
        .all(|r| r.headers["webhook-id"] == "evt-0" && r.body == flaky[0].body));
    let offset_ms = flaky[2].at_ms - flaky[0].at_ms;
    assert!(
        (3_900..9_000).contains(&offset_ms),
        "attempt 3 at +{offset_ms} ms (due +4000)"
    );

    // The dead endpoint: three attempts, then one dead letter with the whole history.
    let dlq = read_until(&format!("{prefix}.dlq"), Duration::from_secs(60), |r| {
        !r.is_empty()
    });
    assert_eq!(dlq.len(), 1);
    let meta = DeliveryMeta::from_headers(|k| header(&dlq[0], k)).expect("dead letter headers");
    assert_eq!(meta.endpoint_id, "dead");
    assert_eq!(meta.event_id, "evt-1");
    assert_eq!(meta.history.len(), 3);
    assert_eq!(rx.requests("dead").len(), 3);

    // Bad input was quarantined, not dropped.
    let invalid = read_until(&format!("{prefix}.invalid"), Duration::from_secs(30), |r| {
        !r.is_empty()
    });
    assert_eq!(header(&invalid[0], h::INVALID_REASON), Some("not_json"));

    // Quiet period: nothing is sent twice, and nothing more to the dead endpoint.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.requests("all").len(), 20, "no duplicate deliveries");
    assert_eq!(rx.requests("flaky").len(), 3);
    assert_eq!(rx.requests("dead").len(), 3);
    for s in stages {
        s.stop().await.expect("clean stop");
    }
}

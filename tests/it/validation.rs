//! Stage A: every bad-input class lands on `<p>.invalid` with its reason and original bytes,
//! while valid records behind them (same partition) still reach `<p>.dedupe` on the partition
//! owned by their dedupe key.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::message::Message;

use hookline_common::headers as h;
use hookline_common::keyhash::{key_hash, partition_for};

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_quarantined_and_valid_ones_flow() {
    require_kafka();
    let prefix = unique_prefix("validate");
    let config = test_config(
        &prefix,
        "[input]\nmax_payload_bytes = 2048\n[[dedupe.keys]]\ntype = \"email.inbound\"\npointers = [\"/data/messageId\"]\n",
    );
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let p = producer();
    let big = format!(r#"{{"id":"big","type":"a","data":"{}"}}"#, "x".repeat(4096));
    let long_id = format!(r#"{{"id":"{}","type":"a"}}"#, "x".repeat(300));
    let bad: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("payload_too_large", Some(big.into_bytes())),
        ("not_json", Some(b"{not json".to_vec())),
        ("not_json", None),
        ("not_object", Some(b"[1,2,3]".to_vec())),
        ("missing_id", Some(br#"{"type":"a","data":{}}"#.to_vec())),
        ("bad_id", Some(long_id.into_bytes())),
        ("bad_id", Some(br#"{"id":"","type":"a"}"#.to_vec())),
        (
            "missing_type",
            Some(br#"{"id":"e-no-type","data":{}}"#.to_vec()),
        ),
        (
            "bad_tenant",
            Some(br#"{"id":"e-bt","type":"a","tenant":42}"#.to_vec()),
        ),
        (
            "missing_dedupe_field",
            Some(br#"{"id":"e-md","type":"email.inbound","data":{}}"#.to_vec()),
        ),
    ];
    // Interleave: bad, valid, bad, valid … all on partition 0 so valid ones sit behind bad ones.
    let mut valid_ids = Vec::new();
    for (i, (_, value)) in bad.iter().enumerate() {
        produce(
            &p,
            &events,
            Some(0),
            Some(format!("k{i}").as_bytes()),
            value.as_deref(),
            &[("x-trace", "t1"), (h::INVALID_REASON, "spoofed")],
        )
        .await;
        let id = format!("evt-{i}");
        let body = format!(
            r#"{{"id":"{id}","type":"message.created","tenant":"acme","data":{{"n":{i}}}}}"#
        );
        produce(
            &p,
            &events,
            Some(0),
            Some(b"any-key"),
            Some(body.as_bytes()),
            &[],
        )
        .await;
        valid_ids.push(id);
    }

    let running = start_deduper(&config);
    let invalid = read_until(&format!("{prefix}.invalid"), Duration::from_secs(60), |r| {
        r.len() >= bad.len()
    });
    let dedupe = read_until(&format!("{prefix}.dedupe"), Duration::from_secs(60), |r| {
        r.len() >= valid_ids.len()
    });

    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    for (reason, _) in &bad {
        *want.entry(reason.to_string()).or_default() += 1;
    }
    let mut got: BTreeMap<String, usize> = BTreeMap::new();
    for m in &invalid {
        let reason = header(m, h::INVALID_REASON)
            .expect("reason header")
            .to_string();
        assert!(header(m, h::INVALID_DETAIL).is_some_and(|d| !d.is_empty()));
        assert_eq!(header(m, "x-trace"), Some("t1"), "original headers kept");
        assert_eq!(header(m, h::SOURCE_TOPIC), Some(events.as_str()));
        *got.entry(reason).or_default() += 1;
    }
    assert_eq!(
        got, want,
        "each bad input class quarantined with its reason"
    );
    // Original bytes and key are kept: the oversize one is byte-identical.
    let big_rec = invalid
        .iter()
        .find(|m| header(m, h::INVALID_REASON) == Some("payload_too_large"))
        .expect("big");
    assert_eq!(
        big_rec.payload().map(|p| p.len()),
        bad[0].1.as_ref().map(|v| v.len())
    );
    assert_eq!(big_rec.key(), Some(&b"k0"[..]));
    // Spoofed hookline headers from the producer never pass through.
    assert!(invalid
        .iter()
        .all(|m| headers_map(m).get(h::INVALID_REASON).map(|s| s.as_str()) != Some("spoofed")));

    let mut ids: Vec<String> = dedupe
        .iter()
        .map(|m| header(m, h::EVENT_ID).expect("event id header").to_string())
        .collect();
    ids.sort();
    let mut want_ids = valid_ids.clone();
    want_ids.sort();
    assert_eq!(
        ids, want_ids,
        "every valid record behind a bad one is processed"
    );
    for m in &dedupe {
        let key = header(m, h::DEDUPE_KEY).expect("dedupe key");
        assert_eq!(
            m.partition(),
            partition_for(key_hash(key), 3),
            "placed by key hash"
        );
        assert_eq!(header(m, h::EVENT_TYPE), Some("message.created"));
        assert_eq!(header(m, h::TENANT), Some("acme"));
    }

    assert_eq!(
        counter(
            &running.registry,
            "hookline_deduper_invalid_events_total",
            Some(("reason", "not_json"))
        ),
        2.0
    );
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_refuses_to_start_without_topics() {
    require_kafka();
    let prefix = unique_prefix("notopics");
    let config = test_config(&prefix, "");
    let running = start_deduper(&config);
    let err = running.stop().await.expect_err("must fail without topics");
    assert!(err.to_string().contains("topics apply"), "{err:#}");
}

//! Validation (stage A's rules, applied by stage A or, with `dedupe.direct`, by stage B): every
//! bad-input class lands on `<p>.invalid` with its reason and original bytes, while valid records
//! behind them (same partition) still reach `<p>.dispatch` on the partition owned by their dedupe
//! key.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::message::{Headers, Message};

use hookline_common::contract::headers as h;
use hookline_common::contract::keyhash::{key_hash, partition_for};

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_quarantined_and_valid_ones_flow() {
    quarantine_and_flow(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_quarantined_and_valid_ones_flow_through_stage_a() {
    quarantine_and_flow(false).await;
}

async fn quarantine_and_flow(direct: bool) {
    require_kafka();
    let prefix = unique_prefix(if direct { "validate" } else { "validatea" });
    let config = test_config(
        &prefix,
        &format!(
            "[input]\nmax_payload_bytes = 2048\n[dedupe]\ndirect = {direct}\n\
             [[dedupe.keys]]\ntype = \"email.inbound\"\npointers = [\"/data/messageId\"]\n"
        ),
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
    let dispatch = read_until(
        &format!("{prefix}.dispatch"),
        Duration::from_secs(60),
        |r| r.len() >= valid_ids.len(),
    );

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

    let mut ids: Vec<String> = dispatch
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
    for m in &dispatch {
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

/// A header as bytes: name, value.
type RawHeader<'a> = (&'a [u8], &'a [u8]);

/// Produces one record to partition 0 whose headers are added with librdkafka's C API
/// (`rd_kafka_header_add`): names are raw bytes, as any producer outside Rust may write them
/// (`Header::key` is a `&str`).
async fn produce_raw_headers(
    p: &rdkafka::producer::FutureProducer,
    topic: &str,
    key: &[u8],
    value: &[u8],
    headers: &[RawHeader<'_>],
) {
    use rdkafka::bindings as rdsys;
    let owned = rdkafka::message::OwnedHeaders::new_with_capacity(headers.len());
    // `as_borrowed` is the librdkafka headers list `owned` owns, cast; librdkafka copies the name
    // and the value.
    let raw = owned.as_borrowed() as *const rdkafka::message::BorrowedHeaders
        as *mut rdsys::rd_kafka_headers_t;
    for (name, value) in headers {
        let err = unsafe {
            rdsys::rd_kafka_header_add(
                raw,
                name.as_ptr().cast(),
                name.len() as isize,
                value.as_ptr().cast(),
                value.len() as isize,
            )
        };
        assert_eq!(err, rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    let rec = rdkafka::producer::FutureRecord::to(topic)
        .partition(0)
        .key(key)
        .payload(value)
        .headers(owned);
    p.send(rec, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// Found by the hostile-input fault test (F2, F3): a header name that is not UTF-8 crashed stage A
/// (rust-rdkafka's `to_str().unwrap()`), a poison pill on every restart; a record with more
/// headers than librdkafka parses (100,000) read as having none, and an admitted event near that
/// limit reached the dispatcher without its event headers and was skipped. Now each such record is
/// quarantined as `bad_headers` (key and value whole, none of its headers), a record at the limit
/// of 1,000 flows with all of them, and the events behind them are dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_headers_are_quarantined_and_the_stage_goes_on() {
    require_kafka();
    let prefix = unique_prefix("badheaders");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let p = producer();
    let ev = |id: &str| format!(r#"{{"id":"{id}","type":"message.created","data":{{}}}}"#);
    let many = |n: usize| -> Vec<RawHeader<'static>> { vec![(b"h", b"v"); n] };
    let name: Vec<RawHeader<'_>> = vec![(b"x-trace", b"t1"), (b"x-\xff\xfe", b"v"), (b"ok", b"1")];

    // All on partition 0, in this order: the good ones sit behind the bad ones.
    let bad: [(&str, Vec<RawHeader>, &str); 3] = [
        (
            "evt-bad-name",
            name,
            r#"header 2 of 3: its name is not UTF-8 ("x-\xff\xfe")"#,
        ),
        (
            "evt-1001",
            many(1_001),
            "1,001 headers, over the limit of 1,000",
        ),
        (
            "evt-100001",
            many(100_001),
            "librdkafka cannot parse the headers",
        ),
    ];
    for (id, headers, _) in &bad {
        let key = format!("k-{id}");
        produce_raw_headers(&p, &events, key.as_bytes(), ev(id).as_bytes(), headers).await;
    }
    produce_raw_headers(
        &p,
        &events,
        b"k-1000",
        ev("evt-1000").as_bytes(),
        &many(1_000),
    )
    .await;
    produce(
        &p,
        &events,
        Some(0),
        Some(b"k-after"),
        Some(ev("evt-after").as_bytes()),
        &[],
    )
    .await;

    let running = start_deduper(&config);
    let invalid = read_until(&format!("{prefix}.invalid"), Duration::from_secs(60), |r| {
        r.len() >= bad.len()
    });
    let dispatch = read_until(
        &format!("{prefix}.dispatch"),
        Duration::from_secs(60),
        |r| r.len() >= 2,
    );

    assert_eq!(invalid.len(), bad.len(), "one quarantine copy each");
    for (id, headers, detail) in &bad {
        let m = invalid
            .iter()
            .find(|m| m.key() == Some(format!("k-{id}").as_bytes()))
            .unwrap_or_else(|| panic!("{id} quarantined"));
        assert_eq!(header(m, h::INVALID_REASON), Some("bad_headers"), "{id}");
        let got = header(m, h::INVALID_DETAIL).expect("detail");
        assert!(got.starts_with(detail), "{id}: {got}");
        assert_eq!(m.payload(), Some(ev(id).as_bytes()), "value whole");
        let names: Vec<String> = headers_map(m).into_keys().collect();
        assert!(
            names.iter().all(|n| n.starts_with("hookline-")),
            "{id}: none of the original headers: {names:?}"
        );
        // The bytes of the dropped headers, when librdkafka could read them.
        let bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 10).sum();
        let want = (*id != "evt-100001").then(|| bytes.to_string());
        assert_eq!(
            header(m, h::ORIGINAL_HEADERS_BYTES).map(str::to_string),
            want,
            "{id}"
        );
        assert_eq!(header(m, h::SOURCE_TOPIC), Some(events.as_str()));
    }

    let mut ids: Vec<&str> = dispatch
        .iter()
        .map(|m| header(m, h::EVENT_ID).expect("event id"))
        .collect();
    ids.sort();
    assert_eq!(ids, ["evt-1000", "evt-after"], "the stage went on");
    let at_limit = dispatch
        .iter()
        .find(|m| header(m, h::EVENT_ID) == Some("evt-1000"))
        .expect("evt-1000");
    let carried = at_limit
        .headers()
        .map_or(0, |hs| hs.iter().filter(|hd| hd.key == "h").count());
    assert_eq!(
        carried, 1_000,
        "a record at the limit keeps all its headers"
    );

    assert_eq!(
        counter(
            &running.registry,
            "hookline_deduper_invalid_events_total",
            Some(("reason", "bad_headers"))
        ),
        3.0
    );
    running.stop().await.expect("clean stop");
}

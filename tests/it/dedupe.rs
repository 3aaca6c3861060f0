//! Deduper stage B: exactly one `<p>.dispatch` record per dedupe key per window, through
//! duplicates, per-type keys, window expiry, kill -9 and a scale-in.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::join_all;
use rand::{Rng, SeedableRng};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};

use hookline_common::contract::headers as h;

use crate::harness::*;

/// Produces many records concurrently; each `(partition, key, value)`.
async fn produce_many(p: &FutureProducer, topic: &str, records: &[(i32, String, String)]) {
    for chunk in records.chunks(2_000) {
        let sends = chunk.iter().map(|(part, key, value)| {
            p.send(
                FutureRecord::to(topic)
                    .partition(*part)
                    .key(key.as_bytes())
                    .payload(value.as_bytes()),
                Duration::from_secs(30),
            )
        });
        for r in join_all(sends).await {
            r.map_err(|(e, _)| e).expect("produce");
        }
    }
}

/// Event id header of each dispatch record, and the ids seen more than once.
fn ids_of(records: &[OwnedMessage]) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for m in records {
        let id = header(m, h::EVENT_ID).expect("event id").to_string();
        *counts.entry(id).or_default() += 1;
    }
    let dups = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| k.clone())
        .collect();
    (counts, dups)
}

fn event(id: &str, n: usize) -> String {
    // Same id, different payload bytes on every copy.
    format!(
        r#"{{"id":"{id}","type":"order.paid","data":{{"copy":{n},"at":"{}"}}}}"#,
        n * 7
    )
}

/// A workload: `unique` ids, `dups` extra copies, random partitions and keys.
fn workload(seed: u64, unique: usize, dups: usize, partitions: i32) -> Vec<(i32, String, String)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out: Vec<(i32, String, String)> = (0..unique)
        .map(|i| {
            (
                rng.gen_range(0..partitions),
                format!("k{}", rng.gen::<u32>()),
                event(&format!("evt-{i}"), 0),
            )
        })
        .collect();
    for n in 0..dups {
        let i = rng.gen_range(0..unique);
        let at = rng.gen_range(0..=out.len());
        out.insert(
            at,
            (
                rng.gen_range(0..partitions),
                format!("k{}", rng.gen::<u32>()),
                event(&format!("evt-{i}"), n + 1),
            ),
        );
    }
    out
}

fn assert_exactly_once(records: &[OwnedMessage], unique: usize) {
    let (counts, dups) = ids_of(records);
    assert!(
        dups.is_empty(),
        "dispatched more than once: {:?}",
        &dups[..dups.len().min(10)]
    );
    assert_eq!(counts.len(), unique, "every unique key dispatched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_with_duplicates_dispatch_each_key_once() {
    require_kafka();
    let prefix = unique_prefix("dedupe10k");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let p = producer();
    // 7,000 unique ids + 3,000 copies (30%); copies interleaved now, more copies later.
    let all = workload(7, 7_000, 2_000, 3);
    produce_many(&p, &events, &all).await;
    let running = start_deduper(&config);
    let dispatch = format!("{prefix}.dispatch");
    let first = read_until(&dispatch, Duration::from_secs(120), |r| r.len() >= 7_000);
    assert_eq!(first.len(), 7_000, "first wave");
    // A later wave of copies, seconds after the originals were dispatched.
    let late = workload(8, 7_000, 1_000, 3)
        .into_iter()
        .filter(|(_, _, v)| !v.contains("\"copy\":0"))
        .collect::<Vec<_>>();
    assert_eq!(late.len(), 1_000);
    produce_many(&p, &events, &late).await;
    let dup_metric =
        |r: &prometheus::Registry| counter(r, "hookline_deduper_duplicates_total", None);
    let start = Instant::now();
    while dup_metric(&running.registry) < 3_000.0 && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        dup_metric(&running.registry),
        3_000.0,
        "every copy judged a duplicate"
    );
    let all_dispatch = read_until(&dispatch, Duration::from_secs(3), |_| false);
    assert_exactly_once(&all_dispatch, 7_000);
    // The bytes dispatched are one of the producer's copies, unchanged.
    let sample = &all_dispatch[0];
    let body = std::str::from_utf8(sample.payload().expect("payload")).expect("utf8");
    assert!(body.starts_with("{\"id\":\"evt-"), "{body}");
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_type_keys_collapse_different_ids() {
    require_kafka();
    let prefix = unique_prefix("dedupetype");
    let config = test_config(
        &prefix,
        "[[dedupe.keys]]\ntype = \"email.inbound\"\npointers = [\"/data/messageId\"]\n\
         [[dedupe.keys]]\ntype = \"call.*\"\npointers = [\"/data/callId\", \"/data/event\"]\n",
    );
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let p = producer();
    let recs = [
        r#"{"id":"e1","type":"email.inbound","data":{"messageId":"m-1"}}"#,
        r#"{"id":"e2","type":"email.inbound","data":{"messageId":"m-1"}}"#,
        r#"{"id":"e3","type":"email.inbound","data":{"messageId":"m-2"}}"#,
        r#"{"id":"c1","type":"call.updated","data":{"callId":"k","event":"ringing"}}"#,
        r#"{"id":"c2","type":"call.updated","data":{"callId":"k","event":"ringing"}}"#,
        r#"{"id":"c3","type":"call.updated","data":{"callId":"k","event":"answered"}}"#,
    ];
    for (i, r) in recs.iter().enumerate() {
        produce(
            &p,
            &events,
            Some((i % 3) as i32),
            None,
            Some(r.as_bytes()),
            &[],
        )
        .await;
    }
    let running = start_deduper(&config);
    let out = read_until(
        &format!("{prefix}.dispatch"),
        Duration::from_secs(60),
        |r| r.len() >= 4,
    );
    let quiet = read_until(
        &format!("{prefix}.dispatch"),
        Duration::from_secs(3),
        |_| false,
    );
    let (counts, _) = ids_of(&quiet);
    assert_eq!(out.len(), 4);
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.contains_key("e3") && counts.contains_key("c3"));
    assert_eq!(
        ["e1", "e2"]
            .iter()
            .filter(|id| counts.contains_key(**id))
            .count(),
        1,
        "same messageId collapses"
    );
    assert_eq!(
        ["c1", "c2"]
            .iter()
            .filter(|id| counts.contains_key(**id))
            .count(),
        1,
        "same callId + event collapses"
    );
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_passes_again_after_the_window() {
    require_kafka();
    const WINDOW: Duration = Duration::from_secs(6);
    let prefix = unique_prefix("dedupewin");
    let config = test_config(&prefix, "[dedupe]\nwindow = \"6s\"\n");
    apply_topics(&config).await;
    let events = format!("{prefix}.events");
    let dispatch = format!("{prefix}.dispatch");
    let p = producer();
    let running = start_deduper(&config);
    let dups = |n: f64| {
        let registry = running.registry.clone();
        async move {
            let start = Instant::now();
            while counter(&registry, "hookline_deduper_duplicates_total", None) < n
                && start.elapsed() < Duration::from_secs(30)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            counter(&registry, "hookline_deduper_duplicates_total", None)
        }
    };
    produce(
        &p,
        &events,
        Some(0),
        None,
        Some(event("w1", 0).as_bytes()),
        &[],
    )
    .await;
    assert_eq!(
        read_until(&dispatch, Duration::from_secs(60), |r| !r.is_empty()).len(),
        1
    );
    let first_seen = Instant::now();
    produce(
        &p,
        &events,
        Some(1),
        None,
        Some(event("w1", 1).as_bytes()),
        &[],
    )
    .await;
    assert_eq!(
        dups(1.0).await,
        1.0,
        "a copy inside the window is a duplicate"
    );
    // Let the window pass (time itself is the condition), with a margin for the 1 s resolution.
    let wait = (WINDOW + Duration::from_millis(1_500)).saturating_sub(first_seen.elapsed());
    tokio::time::sleep(wait).await;
    produce(
        &p,
        &events,
        Some(2),
        None,
        Some(event("w1", 2).as_bytes()),
        &[],
    )
    .await;
    assert_eq!(
        read_until(&dispatch, Duration::from_secs(60), |r| r.len() >= 2).len(),
        2,
        "passes after the window"
    );
    produce(
        &p,
        &events,
        Some(0),
        None,
        Some(event("w1", 3).as_bytes()),
        &[],
    )
    .await;
    assert_eq!(dups(2.0).await, 2.0, "and is remembered again");
    assert_eq!(
        read_until(&dispatch, Duration::from_secs(1), |_| false).len(),
        2
    );
    running.stop().await.expect("clean stop");
}

/// A `hookline run deduper` child process with its own config file.
struct Proc {
    child: Child,
}

fn spawn_deduper(config: &PathBuf, log_name: &str) -> Proc {
    let log = std::fs::File::create(config.with_file_name(log_name)).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["run", "deduper"])
        .env("HOOKLINE_CONFIG", config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn hookline");
    Proc { child }
}

impl Proc {
    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    fn sigterm(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_mid_stream_keeps_exactly_once() {
    require_kafka();
    let prefix = unique_prefix("dedupekill");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    // Static membership + a stable transactional id: a restart takes over at once and fences
    // the killed instance's open transaction.
    let path = write_config(&prefix, "instance_id = \"d0\"");
    let events = format!("{prefix}.events");
    let p = producer();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let unique = 3_000;
    let all = workload(99, unique, 3_000, 3);
    let dispatch = format!("{prefix}.dispatch");
    let mut proc_ = spawn_deduper(&path, "run0.log");
    // Stream in slices; once the deduper is visibly making progress on a slice, kill -9 it at a
    // random moment, restart it, repeat.
    let slices: Vec<_> = all.chunks(all.len() / 6 + 1).map(|c| c.to_vec()).collect();
    let mut kills = 0;
    for (i, slice) in slices.iter().enumerate() {
        let before = read_until(&dispatch, Duration::from_secs(2), |_| false).len();
        produce_many(&p, &events, slice).await;
        if i < 4 {
            let progressed = read_until(&dispatch, Duration::from_secs(60), |r| {
                r.len() > before + 50
            });
            assert!(
                progressed.len() > before,
                "deduper made no progress on slice {i}"
            );
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..400))).await;
            proc_.kill9();
            kills += 1;
            proc_ = spawn_deduper(&path, &format!("run{}.log", i + 1));
        }
    }
    assert_eq!(kills, 4);
    let out = read_until(&dispatch, Duration::from_secs(180), |r| {
        ids_of(r).0.len() >= unique
    });
    let (counts, _) = ids_of(&out);
    assert_eq!(
        counts.len(),
        unique,
        "none missing after 4 kill -9 restarts"
    );
    // Let anything late show up, then insist on exactly once.
    let settled = read_until(&dispatch, Duration::from_secs(4), |_| false);
    assert_exactly_once(&settled, unique);
    assert_eq!(proc_.sigterm(), Some(0), "graceful stop exits 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_mid_stream_keeps_exactly_once() {
    require_kafka();
    let prefix = unique_prefix("dedupescale");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let path = write_config(&prefix, "");
    let events = format!("{prefix}.events");
    let p = producer();
    let unique = 2_000;
    let all = workload(5, unique, 2_000, 3);
    let mut a = spawn_deduper(&path, "a.log");
    let mut b = spawn_deduper(&path, "b.log");
    let half = all.len() / 2;
    produce_many(&p, &events, &all[..half]).await;
    let dispatch = format!("{prefix}.dispatch");
    let _ = read_until(&dispatch, Duration::from_secs(60), |r| r.len() >= 300);
    assert_eq!(b.sigterm(), Some(0), "the stopped member exits cleanly");
    produce_many(&p, &events, &all[half..]).await;
    let out = read_until(&dispatch, Duration::from_secs(120), |r| {
        ids_of(r).0.len() >= unique
    });
    assert_eq!(ids_of(&out).0.len(), unique, "none missing after scale-in");
    let settled = read_until(&dispatch, Duration::from_secs(4), |_| false);
    assert_exactly_once(&settled, unique);
    let ids: HashSet<String> = ids_of(&settled).0.into_keys().collect();
    assert_eq!(ids.len(), unique);
    assert_eq!(a.sigterm(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transactions_rewind_and_recover_exactly_once() {
    use rdkafka::admin::{AlterConfig, ResourceSpecifier};
    require_kafka();
    let prefix = unique_prefix("dedupeabort");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let dispatch = format!("{prefix}.dispatch");
    let set_max = |bytes: &'static str| {
        let dispatch = dispatch.clone();
        async move {
            let alter = AlterConfig::new(ResourceSpecifier::Topic(&dispatch))
                .set("max.message.bytes", bytes)
                .set("retention.ms", "604800000")
                .set("cleanup.policy", "delete");
            admin()
                .alter_configs([&alter], &admin_opts())
                .await
                .expect("alter")
                .into_iter()
                .for_each(|r| {
                    r.expect("altered");
                });
        }
    };
    let running = start_deduper(&config);
    let events = format!("{prefix}.events");
    let p = producer();
    // Both stages read the topic limits at start: a first event through the pipeline shows that
    // they have. Then an operator lowers the dispatch topic's limit under them.
    produce_many(&p, &events, &[(0, "kw".into(), event("ab-warm", 0))]).await;
    let warm = read_until(&dispatch, Duration::from_secs(60), |r| !r.is_empty());
    assert_eq!(warm.len(), 1, "warm-up event dispatched");
    set_max("100000").await;
    let mut batch: Vec<(i32, String, String)> = (0..300)
        .map(|i| (i % 3, format!("k{i}"), event(&format!("ab-{i}"), 0)))
        .collect();
    // 200 KB of hex digits: incompressible, so the broker refuses it under the new limit and the
    // transaction holding it must abort.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let pad: String = (0..12_500)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect();
    let big = format!(r#"{{"id":"ab-big","type":"order.paid","data":{{"pad":"{pad}"}}}}"#);
    batch.insert(150, (1, "kb".into(), big));
    // Duplicates of the first keys, so a bad rewind/restore would show up as double dispatch.
    batch.extend((0..100).map(|i| (i % 3, format!("d{i}"), event(&format!("ab-{i}"), 1))));
    produce_many(&p, &events, &batch).await;
    let start = Instant::now();
    while counter(
        &running.registry,
        "hookline_deduper_transactions_total",
        Some(("result", "aborted")),
    ) < 1.0
        && start.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        counter(
            &running.registry,
            "hookline_deduper_transactions_total",
            Some(("result", "aborted"))
        ) >= 1.0,
        "the oversized record makes a transaction abort"
    );
    // The stage recovers by itself (issue 8 item 1): after the abort it re-reads the limits and
    // quarantines the record that no longer fits; every other key is dispatched once.
    let out = read_until(&dispatch, Duration::from_secs(90), |r| {
        ids_of(r).0.len() >= 301
    });
    let mut running = running;
    if ids_of(&out).0.len() != 301 && running.handle.as_ref().is_some_and(|h| h.is_finished()) {
        let ended = running.handle.take().expect("handle").await;
        panic!(
            "the deduper stopped after the abort ({} of 301 dispatched): {ended:?}",
            ids_of(&out).0.len()
        );
    }
    assert_eq!(
        ids_of(&out).0.len(),
        301,
        "the warm-up and the 300 small keys dispatched after recovery"
    );
    let settled = read_until(&dispatch, Duration::from_secs(3), |_| false);
    assert_exactly_once(&settled, 301);
    let invalid = read_until(&format!("{prefix}.invalid"), Duration::from_secs(30), |r| {
        !r.is_empty()
    });
    assert_eq!(invalid.len(), 1, "the oversized record is quarantined once");
    assert_eq!(
        header(
            &invalid[0],
            hookline_common::contract::headers::INVALID_REASON
        ),
        Some("record_too_large")
    );
    running.stop().await.expect("clean stop");
}

/// `dedupe.direct`: events a producer placed by their dedupe key are deduped where they are and
/// never written to `<p>.dedupe`; copies on any other partition are forwarded there and still
/// collapse with the originals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_placed_by_key_skip_the_dedupe_topic() {
    use hookline_common::contract::keyhash::Placement;
    require_kafka();
    let prefix = unique_prefix("dedupedirect");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let placement = Placement::new(&config).expect("dedupe.direct is the default");
    let events = format!("{prefix}.events");
    let p = producer();
    let unique = 600;
    let mut records = Vec::new();
    let mut elsewhere = 0;
    for i in 0..unique {
        let value = event(&format!("evt-{i}"), 0);
        let home = placement.partition(value.as_bytes()).expect("valid event");
        records.push((home, format!("k{i}"), value));
        if i % 3 == 0 {
            // A copy on another partition, as a producer with its own partitioner writes it.
            let copy = event(&format!("evt-{i}"), 1);
            records.push(((home + 1) % 3, format!("c{i}"), copy));
            elsewhere += 1;
        }
    }
    produce_many(&p, &events, &records).await;
    let running = start_deduper(&config);
    let dispatch = format!("{prefix}.dispatch");
    let out = read_until(&dispatch, Duration::from_secs(120), |r| {
        ids_of(r).0.len() >= unique
    });
    assert_eq!(ids_of(&out).0.len(), unique, "every event dispatched");
    let metric = |name: &str| counter(&running.registry, name, None);
    let start = Instant::now();
    while metric("hookline_deduper_duplicates_total") < elsewhere as f64
        && start.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric("hookline_deduper_rekeyed_total"),
        elsewhere as f64,
        "only the copies on another partition were forwarded"
    );
    assert_eq!(
        metric("hookline_deduper_duplicates_total"),
        elsewhere as f64,
        "every copy collapsed with its original"
    );
    let settled = read_until(&dispatch, Duration::from_secs(3), |_| false);
    assert_exactly_once(&settled, unique);
    // `<p>.dedupe` holds the forwarded copies and nothing else (read_committed).
    let dedupe = read_until(&format!("{prefix}.dedupe"), Duration::from_secs(5), |r| {
        r.len() > elsewhere
    });
    assert_eq!(
        dedupe.len(),
        elsewhere,
        "only the forwarded copies crossed <p>.dedupe"
    );
    assert!(
        dedupe
            .iter()
            .all(|m| m.key().is_some_and(|k| k.starts_with(b"c"))),
        "what crossed <p>.dedupe is the copies"
    );
    running.stop().await.expect("clean stop");
}

/// Turning `dedupe.direct` on takes over `<p>.events` where stage A stopped: nothing stage A had
/// already handled is read again, and nothing after it is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_to_direct_reads_on_from_where_stage_a_stopped() {
    require_kafka();
    let prefix = unique_prefix("dedupeswitch");
    let split = test_config(&prefix, "[dedupe]\ndirect = false");
    apply_topics(&split).await;
    let events = format!("{prefix}.events");
    let dispatch = format!("{prefix}.dispatch");
    let p = producer();
    let first = workload(11, 300, 0, 3);
    produce_many(&p, &events, &first).await;
    let running = start_deduper(&split);
    let out = read_until(&dispatch, Duration::from_secs(120), |r| r.len() >= 300);
    assert_eq!(out.len(), 300, "split mode dispatched the first wave");
    // Stage A commits its offsets every second and on a graceful stop.
    running.stop().await.expect("clean stop");

    let direct = test_config(&prefix, "");
    let second: Vec<_> = workload(12, 300, 0, 3)
        .into_iter()
        .map(|(p, k, v)| (p, k, v.replace("evt-", "second-")))
        .collect();
    produce_many(&p, &events, &second).await;
    let running = start_deduper(&direct);
    let out = read_until(&dispatch, Duration::from_secs(120), |r| r.len() >= 600);
    assert_eq!(out.len(), 600, "direct mode dispatched the second wave");
    let metric = |name: &str| counter(&running.registry, name, None);
    assert_eq!(
        metric("hookline_deduper_valid_events_total"),
        300.0,
        "direct mode read only what stage A had not"
    );
    assert_eq!(metric("hookline_deduper_duplicates_total"), 0.0);
    let settled = read_until(&dispatch, Duration::from_secs(3), |_| false);
    assert_exactly_once(&settled, 600);
    running.stop().await.expect("clean stop");
}

//! A group coordinator that has just moved: every consumer group of `run all` asks for its
//! partitions' committed offsets (`OffsetFetch`) and gets a request-level `NOT_COORDINATOR`, on
//! every try, for the first seconds of the stream — what a consumer gets when its group's
//! coordinator moves away during a broker's shutdown, made to happen on demand. The diverting
//! proxies (tests/faults/proxy.rs) answer each `OffsetFetch` from a broker that is not the
//! group's coordinator; the brokers themselves stay up.
//!
//! Found by the rolling restart: librdkafka left the partitions of such an answer assigned and
//! never fetched (confluentinc/librdkafka#5586), so a retry tier sat on 713 retries for good
//! while its process stayed alive and in its group. vendor/rdkafka-sys/PATCHED.md (change 3) has
//! the fix: the partitions are queried again. No delivery is repeated, so the bound is 0.

use std::time::Instant;

use crate::procs::{watch, Hookline};
use crate::proxy::{Proxies, OFFSET_FETCH};
use crate::scenario::{env_or, Options, Scenario};
use crate::stream::Stream;

/// How long every `OffsetFetch` is answered by a stale coordinator.
const STALE: f64 = 8.0;

#[test]
fn committed_offsets_refused_by_a_moved_coordinator_stall_no_consumer() {
    crate::require_cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let proxies = Proxies::start_diverting(OFFSET_FETCH);
    let sc = Scenario::new(
        "coord",
        &rt,
        Options {
            bootstrap: Some(proxies.bootstrap()),
            ..Options::default()
        },
    );
    let rate: f64 = env_or("HOOKLINE_TEST_FAULT_RATE", 80.0);
    coordinators_ready(&sc.prefix);
    proxies.divert(true);
    let stale_at = Instant::now();
    let mut hookline = Hookline::all(&sc.config);
    let stream = Stream::for_secs(&sc.prefix, 20.0, rate, 30);
    let (ids, invalid) = (stream.ids.clone(), stream.invalid);
    sc.say(&format!(
        "hookline run all through diverting proxies ({}): every OffsetFetch answered by a broker \
         that is not the group's coordinator for {STALE} s; {} events ({} records) at {rate}/s",
        proxies.bootstrap(),
        ids.len(),
        stream.len()
    ));
    let producing = stream.start(&sc.prefix, rate);
    watch(&mut [&mut hookline], "the stale coordinator", STALE);
    proxies.divert(false);
    let diverted = proxies.diverted();
    sc.say(&format!(
        "coordinator answers again after {:.1}s: {diverted} OffsetFetch requests were refused \
         with NOT_COORDINATOR",
        stale_at.elapsed().as_secs_f64()
    ));
    // Stage A, stage B, the dispatcher and six tiers each fetch committed offsets for their group.
    assert!(
        diverted >= 9,
        "only {diverted} OffsetFetch requests went through the diverting proxies: the fault did \
         not happen (are all nine consumer groups still fetching committed offsets?)"
    );
    sc.finish(producing, hookline, &ids, invalid, 0);
}

/// Waits until the cluster answers a group's committed-offset query (directly, not through the
/// proxies). On a cluster no group has used yet, the first query creates `__consumer_offsets`
/// (50 partitions, three replicas), which takes longer than the fault's 8 s: the groups would
/// spend the window finding their coordinator, not being refused by it.
fn coordinators_ready(prefix: &str) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, TopicPartitionList};
    use std::time::Duration;

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", crate::harness::bootstrap())
        .set("group.id", format!("{prefix}.warm-up"))
        .create()
        .expect("warm-up consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&format!("{prefix}.events"), 0);
    let deadline = Instant::now() + Duration::from_secs(90);
    while let Err(e) = consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
        assert!(
            Instant::now() < deadline,
            "no group coordinator answered within 90 s: {e}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

//! The load: which records a run produces (fresh events, re-sent duplicates, invalid records) and
//! producing them on an open-model schedule.
//!
//! Open model: record `i` is due at `start + i / rate` whatever happened to the records before it,
//! and carries that scheduled time in `data.sched_ns`. Latency is measured from it, so a producer
//! or a broker that falls behind shows up as latency instead of silently slowing the load
//! (no coordinated omission). Without a rate the records go out as fast as the producer takes
//! them, each stamped with its actual send time.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::stream::{FuturesUnordered, StreamExt};
use hookline_common::contract::keyhash::Placement;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::sink::unix_ns;

/// The event type of every event; events that also go to the failing endpoint use `FAIL_TYPE`.
pub const OK_TYPE: &str = "bench.ok";
pub const FAIL_TYPE: &str = "bench.fail";

/// What one produced record is.
#[derive(Debug, Clone)]
pub enum Planned {
    /// A new event id; `tenant` indexes the run's tenants.
    Fresh {
        id: String,
        tenant: usize,
        failing: bool,
    },
    /// The same id as an earlier fresh record, with different bytes and record key.
    Duplicate { of: usize },
    /// Not JSON: the deduper quarantines it.
    Invalid,
}

/// The mix of a run.
#[derive(Debug, Clone)]
pub struct Mix {
    pub duplicate_ratio: f64,
    pub failing_fraction: f64,
    pub invalid_fraction: f64,
    pub payload_bytes: usize,
}

/// The records of a run, deterministic for a seed. Ids are `<tag>-<n>`; tenants are assigned
/// round-robin over `tenants` fresh events.
pub fn plan(tag: &str, n: usize, tenants: usize, mix: &Mix, seed: u64) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    let mut fresh_positions: Vec<usize> = Vec::new();
    for i in 0..n {
        let roll: f64 = rng.gen();
        let rec = if roll < mix.invalid_fraction {
            Planned::Invalid
        } else if roll < mix.invalid_fraction + mix.duplicate_ratio && !fresh_positions.is_empty() {
            Planned::Duplicate {
                of: fresh_positions[rng.gen_range(0..fresh_positions.len())],
            }
        } else {
            let k = fresh_positions.len();
            fresh_positions.push(i);
            Planned::Fresh {
                id: format!("{tag}-{k}"),
                tenant: k % tenants.max(1),
                failing: rng.gen::<f64>() < mix.failing_fraction,
            }
        };
        out.push(rec);
    }
    out
}

/// A JSON event body padded to `size` bytes, with the scheduled send time in `data.sched_ns`.
pub fn event_body(
    id: &str,
    ty: &str,
    tenant: &str,
    sched_ns: u64,
    copy: usize,
    size: usize,
) -> Vec<u8> {
    let head = format!(
        r#"{{"id":"{id}","type":"{ty}","tenant":"{tenant}","data":{{"sched_ns":{sched_ns},"copy":{copy},"pad":""#
    );
    let tail = "\"}}";
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut body = Vec::with_capacity(head.len() + pad + tail.len());
    body.extend_from_slice(head.as_bytes());
    body.resize(body.len() + pad, b'x');
    body.extend_from_slice(tail.as_bytes());
    body
}

/// What producing a run did.
#[derive(Debug, Clone, Default)]
pub struct Produced {
    pub records: usize,
    /// Unix ns of the first record's scheduled (or actual) send time.
    pub first_sched_ns: u64,
    pub last_sched_ns: u64,
    /// How far behind its schedule the producer fell at worst.
    pub max_behind: Duration,
}

/// Produces `plan` to `topic` at `rate` records/s (None: as fast as possible) and waits for every
/// acknowledgement. `tenants` names the tenant indices of the plan.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    plan: &[Planned],
    tenants: &[String],
    rate: Option<f64>,
    payload_bytes: usize,
    placement: Option<&Placement>,
) -> anyhow::Result<Produced> {
    let start = Instant::now() + Duration::from_millis(20);
    let start_ns = unix_ns() + 20_000_000;
    let mut acks = FuturesUnordered::new();
    let mut out = Produced::default();
    for (i, rec) in plan.iter().enumerate() {
        let sched_ns = match rate {
            Some(r) => {
                let offset = Duration::from_secs_f64(i as f64 / r);
                let due = start + offset;
                let now = Instant::now();
                if due > now {
                    tokio::time::sleep_until(due.into()).await;
                } else {
                    out.max_behind = out.max_behind.max(now - due);
                }
                start_ns + offset.as_nanos() as u64
            }
            None => unix_ns(),
        };
        if i == 0 {
            out.first_sched_ns = sched_ns;
        }
        out.last_sched_ns = sched_ns;
        let (key, value) = match rec {
            Planned::Fresh {
                id,
                tenant,
                failing,
            } => {
                let ty = if *failing { FAIL_TYPE } else { OK_TYPE };
                let t = tenants.get(*tenant).map(String::as_str).unwrap_or("main");
                (
                    id.clone(),
                    event_body(id, ty, t, sched_ns, 0, payload_bytes),
                )
            }
            Planned::Duplicate { of } => match plan.get(*of) {
                Some(Planned::Fresh {
                    id,
                    tenant,
                    failing,
                }) => {
                    let ty = if *failing { FAIL_TYPE } else { OK_TYPE };
                    let t = tenants.get(*tenant).map(String::as_str).unwrap_or("main");
                    (
                        format!("dup-{i}"),
                        event_body(id, ty, t, sched_ns, i, payload_bytes),
                    )
                }
                _ => anyhow::bail!("plan record {i} duplicates {of}, which is not fresh"),
            },
            Planned::Invalid => (format!("bad-{i}"), format!("not json {i}").into_bytes()),
        };
        let mut record = FutureRecord::to(topic).key(&key).payload(&value);
        // Placed by dedupe key, as a producer that follows docs/delivery.md does.
        if let Some(p) = placement.and_then(|p| p.partition(&value)) {
            record = record.partition(p);
        }
        loop {
            match producer.send_result(record) {
                Ok(ack) => {
                    acks.push(ack);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    // The local queue is full: let acknowledgements drain it.
                    if let Some(done) = acks.next().await {
                        check_ack(done)?;
                    } else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                Err((e, _)) => return Err(e).context("producing a bench event"),
            }
        }
        // Reap finished acknowledgements without waiting, so the set stays small.
        while let Some(Some(done)) = futures::FutureExt::now_or_never(acks.next()) {
            check_ack(done)?;
        }
        out.records += 1;
    }
    while let Some(done) = acks.next().await {
        check_ack(done)?;
    }
    Ok(out)
}

fn check_ack(
    done: Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
) -> anyhow::Result<()> {
    match done {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(e).context("a bench event was not acknowledged"),
        Err(_) => anyhow::bail!("the producer dropped a bench event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix() -> Mix {
        Mix {
            duplicate_ratio: 0.2,
            failing_fraction: 0.1,
            invalid_fraction: 0.05,
            payload_bytes: 1024,
        }
    }

    #[test]
    fn bodies_have_the_requested_size_and_stamp() {
        let b = event_body("r-1", OK_TYPE, "main", 42, 0, 1024);
        assert_eq!(b.len(), 1024);
        let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
        assert_eq!(v["data"]["sched_ns"], 42);
        assert_eq!(v["id"], "r-1");
    }

    #[test]
    fn plan_mixes_as_asked_and_duplicates_point_at_fresh_records() {
        let p = plan("r", 10_000, 3, &mix(), 7);
        let fresh = p
            .iter()
            .filter(|r| matches!(r, Planned::Fresh { .. }))
            .count();
        let dups = p
            .iter()
            .filter(|r| matches!(r, Planned::Duplicate { .. }))
            .count();
        let bad = p.iter().filter(|r| matches!(r, Planned::Invalid)).count();
        assert_eq!(fresh + dups + bad, 10_000);
        assert!((1_700..2_300).contains(&dups), "{dups}");
        assert!((350..650).contains(&bad), "{bad}");
        for r in &p {
            if let Planned::Duplicate { of } = r {
                assert!(matches!(p[*of], Planned::Fresh { .. }));
            }
        }
        assert_eq!(plan("r", 100, 3, &mix(), 7).len(), 100);
    }
}

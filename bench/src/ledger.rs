//! The ledger every run must balance before its numbers count:
//!
//! `produced = delivered + deduplicated + dead + invalid`, in records on `<p>.events`, where
//! - `delivered`: fresh events every subscribed healthy endpoint received (2xx at the sink) and
//!   that have no dead letter;
//! - `dead`: fresh events with a dead letter on `<p>.dlq` (read from the topic);
//! - `deduplicated`, `invalid`: the deduper's `hookline_deduper_duplicates_total` and
//!   `hookline_deduper_invalid_events_total` over the run (from its `/metrics`).
//!
//! On top of the sum, the sources must agree with what the bench produced: as many duplicates
//! and invalid records as it sent, every expected delivery either received or dead, and exactly
//! the expected dead letters. Anything else makes the run INVALID and lists why.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use hookline_common::config::Config;
use hookline_common::contract::headers::EVENT_ID;
use hookline_common::kafka::base_config;

use crate::load::Planned;
use crate::sink::Book;

/// Where a fresh event should end up.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// Sink endpoint indices that must receive it.
    pub healthy: Vec<u16>,
    /// Deliveries that must end as dead letters.
    pub dead: usize,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Ledger {
    pub produced: u64,
    pub delivered: u64,
    pub deduplicated: u64,
    pub dead: u64,
    pub invalid: u64,
    pub balanced: bool,
    pub deliveries_expected: u64,
    pub deliveries_received: u64,
    pub dead_letters: u64,
    pub problems: Vec<String>,
}

/// What the stages' metrics said over the run.
#[derive(Debug, Clone, Copy, Default)]
pub struct StageCounts {
    pub deduplicated: u64,
    pub invalid: u64,
}

/// Healthy deliveries received so far and the total expected (healthy + dead), for the wait.
pub fn progress(book: &Book, plan: &[Planned], expect: &dyn Fn(&Planned) -> Expect) -> (u64, u64) {
    let (mut received, mut expected) = (0u64, 0u64);
    for rec in plan {
        if let Planned::Fresh { id, .. } = rec {
            let e = expect(rec);
            expected += (e.healthy.len() + e.dead) as u64;
            if let Some(rs) = book.by_id.get(id) {
                received += rs
                    .iter()
                    .filter(|r| e.healthy.contains(&r.endpoint))
                    .count() as u64;
            }
        }
    }
    (received, expected)
}

pub fn settle(
    plan: &[Planned],
    expect: &dyn Fn(&Planned) -> Expect,
    book: &Book,
    dead_letters: &HashMap<String, usize>,
    counts: StageCounts,
) -> Ledger {
    let mut l = Ledger {
        produced: plan.len() as u64,
        deduplicated: counts.deduplicated,
        invalid: counts.invalid,
        ..Ledger::default()
    };
    let planned_dups = plan
        .iter()
        .filter(|r| matches!(r, Planned::Duplicate { .. }))
        .count() as u64;
    let planned_invalid = plan
        .iter()
        .filter(|r| matches!(r, Planned::Invalid))
        .count() as u64;
    let (mut missing, mut dead_expected) = (0u64, 0u64);
    for rec in plan {
        let Planned::Fresh { id, .. } = rec else {
            continue;
        };
        let e = expect(rec);
        let received = book
            .by_id
            .get(id)
            .map(|rs| {
                rs.iter()
                    .filter(|r| e.healthy.contains(&r.endpoint))
                    .count()
            })
            .unwrap_or(0);
        let dead = dead_letters.get(id).copied().unwrap_or(0);
        l.deliveries_expected += (e.healthy.len() + e.dead) as u64;
        l.deliveries_received += received as u64;
        l.dead_letters += dead as u64;
        dead_expected += e.dead as u64;
        missing += (e.healthy.len() - received) as u64;
        if dead > 0 {
            l.dead += 1;
        } else if received == e.healthy.len() {
            l.delivered += 1;
        }
    }
    let sum = l.delivered + l.deduplicated + l.dead + l.invalid;
    if sum != l.produced {
        l.problems.push(format!(
            "produced {} != delivered {} + deduplicated {} + dead {} + invalid {} = {sum}",
            l.produced, l.delivered, l.deduplicated, l.dead, l.invalid
        ));
    }
    if missing > 0 {
        l.problems.push(format!(
            "{missing} healthy deliveries never reached the sink"
        ));
    }
    if l.dead_letters != dead_expected {
        l.problems.push(format!(
            "{} dead letters on the DLQ, {dead_expected} expected",
            l.dead_letters
        ));
    }
    if l.deduplicated != planned_dups {
        l.problems.push(format!(
            "deduper dropped {} duplicates, the bench sent {planned_dups}",
            l.deduplicated
        ));
    }
    if l.invalid != planned_invalid {
        l.problems.push(format!(
            "deduper quarantined {} records, the bench sent {planned_invalid} invalid",
            l.invalid
        ));
    }
    l.balanced = l.problems.is_empty();
    l
}

/// Dead letters on `topic` whose event id starts with `tag-`, counted per event id.
pub fn read_dead_letters(
    config: &Config,
    topic: &str,
    tag: &str,
) -> anyhow::Result<HashMap<String, usize>> {
    let consumer: BaseConsumer = base_config(config)
        .set(
            "group.id",
            format!("{}.bench-dlq-reader", config.topics.prefix),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let timeout = Duration::from_secs(10);
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("metadata of {topic}"))?;
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for t in md.topics() {
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), timeout)?;
            if high > low {
                ends.insert(p.id(), high);
                tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
            }
        }
    }
    let prefix = format!("{tag}-");
    let mut out: HashMap<String, usize> = HashMap::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ends.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "reading {topic} took over 60 s");
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            // Only transaction markers may be left before the end: check positions.
            let pos = consumer.position()?;
            ends.retain(|p, end| {
                !matches!(pos.find_partition(topic, *p).map(|e| e.offset()),
                    Some(Offset::Offset(o)) if o >= *end)
            });
            continue;
        };
        let m = m.context("reading the dlq")?;
        if m.offset() + 1 >= ends.get(&m.partition()).copied().unwrap_or(0) {
            ends.remove(&m.partition());
        }
        let id = m
            .headers()
            .and_then(|hs| hs.iter().find(|h| h.key == EVENT_ID))
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok());
        if let Some(id) = id.filter(|id| id.starts_with(&prefix)) {
            *out.entry(id.to_string()).or_default() += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Receipt;

    fn fresh(id: &str, failing: bool) -> Planned {
        Planned::Fresh {
            id: id.into(),
            tenant: 0,
            failing,
        }
    }

    fn expect(r: &Planned) -> Expect {
        match r {
            Planned::Fresh { failing, .. } => Expect {
                healthy: vec![0],
                dead: usize::from(*failing),
            },
            _ => Expect::default(),
        }
    }

    fn got(book: &mut Book, id: &str) {
        book.by_id.entry(id.into()).or_default().push(Receipt {
            endpoint: 0,
            recv_ns: 1,
            sched_ns: 0,
        });
    }

    #[test]
    fn balances_when_everything_is_accounted_for() {
        let plan = vec![
            fresh("r-0", false),
            fresh("r-1", true),
            Planned::Duplicate { of: 0 },
            Planned::Invalid,
        ];
        let mut book = Book::default();
        got(&mut book, "r-0");
        got(&mut book, "r-1");
        let dead = HashMap::from([("r-1".to_string(), 1)]);
        let counts = StageCounts {
            deduplicated: 1,
            invalid: 1,
        };
        let l = settle(&plan, &expect, &book, &dead, counts);
        assert!(l.balanced, "{:?}", l.problems);
        assert_eq!(
            (l.delivered, l.dead, l.deduplicated, l.invalid),
            (1, 1, 1, 1)
        );
        assert_eq!(progress(&book, &plan, &expect), (2, 3));
    }

    #[test]
    fn a_lost_delivery_or_a_double_dispatch_is_invalid() {
        let plan = vec![fresh("r-0", false), fresh("r-1", false)];
        let mut book = Book::default();
        got(&mut book, "r-0");
        let l = settle(
            &plan,
            &expect,
            &book,
            &HashMap::new(),
            StageCounts::default(),
        );
        assert!(!l.balanced);
        assert!(
            l.problems.iter().any(|p| p.contains("never reached")),
            "{:?}",
            l.problems
        );

        got(&mut book, "r-1");
        let counts = StageCounts {
            deduplicated: 1,
            invalid: 0,
        };
        let l = settle(&plan, &expect, &book, &HashMap::new(), counts);
        assert!(!l.balanced, "a duplicate the bench never sent");
    }
}

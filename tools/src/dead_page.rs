//! Dead letters a page at a time, newest first, for the admin API and the dashboard.
//!
//! The DLQ has no index: a page reads the topic to the high watermarks it had when the read
//! began (like `dead list`) and keeps only the `limit + 1` newest records after the cursor, with
//! their bodies dropped — memory is bounded by the page size, whatever the DLQ holds. The cost is
//! one read of the DLQ per page; a position filter (`partition`, offsets) narrows it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use hookline_common::contract::replays::ReplayRecord;

use hookline_common::config::Config;

use crate::dead::{scan, DeadFilter, DeadRecord, DlqPosition};

/// Where a page ends: (dead-at ms, partition, offset) of its last record. The next page starts
/// after it. Written `<dead_at_ms>.<partition>.<offset>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    key: (Reverse<i64>, i32, i64),
}

impl Cursor {
    fn of(r: &DeadRecord) -> Cursor {
        let dead_at = r.meta.as_ref().ok().and_then(|m| m.dead_at_ms).unwrap_or(0);
        Cursor {
            key: (Reverse(dead_at), r.partition, r.offset),
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (Reverse(t), p, o) = self.key;
        write!(f, "{t}.{p}.{o}")
    }
}

impl FromStr for Cursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Cursor, String> {
        let bad = || format!("`{s}` is not a cursor from a previous page");
        let mut parts = s.split('.');
        let (Some(t), Some(p), Some(o), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(Cursor {
            key: (
                Reverse(t.parse().map_err(|_| bad())?),
                p.parse().map_err(|_| bad())?,
                o.parse().map_err(|_| bad())?,
            ),
        })
    }
}

/// One page: records newest first (bodies dropped), and the cursor of the next page if any.
#[derive(Debug, Default)]
pub struct Page {
    pub records: Vec<DeadRecord>,
    pub next: Option<Cursor>,
}

/// The `limit` newest dead letters matching `filter` after `after`.
pub async fn page(
    config: &Config,
    filter: &DeadFilter,
    after: Option<Cursor>,
    limit: usize,
) -> anyhow::Result<Page> {
    let limit = limit.max(1);
    let mut kept: BTreeMap<Cursor, DeadRecord> = BTreeMap::new();
    scan(config, filter, |mut r| {
        let at = Cursor::of(&r);
        if after.is_some_and(|a| at <= a) {
            return Ok(());
        }
        r.value = Bytes::new();
        kept.insert(at, r);
        if kept.len() > limit + 1 {
            kept.pop_last();
        }
        Ok(())
    })
    .await?;
    let more = kept.len() > limit;
    let records: Vec<DeadRecord> = kept.into_values().take(limit).collect();
    let next = more.then(|| records.last().map(Cursor::of)).flatten();
    Ok(Page { records, next })
}

/// One dead letter with its body, or `None` if there is none at `at`.
pub async fn one(config: &Config, at: DlqPosition) -> anyhow::Result<Option<DeadRecord>> {
    let filter = DeadFilter {
        partition: Some(at.partition),
        from_offset: Some(at.offset),
        to_offset: Some(at.offset),
        ..DeadFilter::default()
    };
    let mut found = None;
    scan(config, &filter, |r| {
        if r.offset == at.offset {
            found = Some(r);
        }
        Ok(())
    })
    .await?;
    Ok(found)
}

/// Dead letters per endpoint among those matching `filter`, leaving out the ones a replay
/// delivered (`replays`: [`crate::replay::finished`]). What the dashboard warns about.
pub async fn open_by_endpoint(
    config: &Config,
    filter: &DeadFilter,
    replays: &HashMap<String, ReplayRecord>,
) -> anyhow::Result<HashMap<String, u64>> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    scan(config, filter, |r| {
        let delivered = replays
            .get(&r.replay_key())
            .is_some_and(ReplayRecord::delivered);
        if let (Ok(m), false) = (&r.meta, delivered) {
            *counts.entry(m.endpoint_id.clone()).or_default() += 1;
        }
        Ok(())
    })
    .await?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_order_newest_first() {
        let c: Cursor = "1700000000000.2.15".parse().unwrap();
        assert_eq!(c.to_string(), "1700000000000.2.15");
        let older: Cursor = "1600000000000.0.1".parse().unwrap();
        assert!(c < older, "newer sorts first");
        assert!("1.2".parse::<Cursor>().is_err());
        assert!("a.b.c".parse::<Cursor>().is_err());
        assert!("1.2.3.4".parse::<Cursor>().is_err());
    }
}

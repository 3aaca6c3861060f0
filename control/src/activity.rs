//! What the health tracker keeps per endpoint for the dashboard, in bounded memory (issue 35: at
//! 100,000 endpoints a BTreeMap leaf per endpoint and 1,440 minute counts each were gigabytes):
//!
//! - [`Counts`]: attempts per minute for the last [`MINUTE_BUCKETS`] minutes, per hour before
//!   that, back to [`COUNT_MINUTES`]: at most 60 + 25 buckets of 24 bytes (≈ 2 KiB) per endpoint,
//!   whatever the traffic;
//! - [`Recent`]: the latest [`RECENT`] attempts, stored compact ([`Stored`]: the endpoint id
//!   left out, repeated strings — tenant, type, stage, class, next hop, instance — shared through
//!   an [`Interner`]): ≈ 200 bytes an attempt instead of ≈ 550, in a vector grown one at a time.

use std::collections::HashSet;
use std::sync::Arc;

use crate::attempts::{Attempt, Outcome};

/// Minutes of per-endpoint counts kept (the dashboard's 24 h chart); as far back as the tail
/// reads (`control.health_lookback`, 24 h).
pub const COUNT_MINUTES: i64 = 24 * 60;

/// The last minutes counted per minute; older ones are counted per hour.
pub const MINUTE_BUCKETS: i64 = 60;

/// Attempts kept per endpoint for the dashboard's list.
pub const RECENT: usize = 50;

/// (delivered, failed, throttled) attempts that started in `[start, start + width)` minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    start: i64,
    delivered: u32,
    failed: u32,
    throttled: u32,
}

impl Bucket {
    fn new(start: i64) -> Bucket {
        Bucket {
            start,
            delivered: 0,
            failed: 0,
            throttled: 0,
        }
    }
    fn add(&mut self, other: &Bucket) {
        self.delivered = self.delivered.saturating_add(other.delivered);
        self.failed = self.failed.saturating_add(other.failed);
        self.throttled = self.throttled.saturating_add(other.throttled);
    }
}

/// Per-minute counts of the last hour and per-hour counts of the day before, each sorted by start.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    minutes: Vec<Bucket>,
    hours: Vec<Bucket>,
}

fn hour_of(minute: i64) -> i64 {
    minute - minute.rem_euclid(60)
}

/// Adds `b` into the sorted `v` (its bucket of the same start, or a new one in place).
fn add_into(v: &mut Vec<Bucket>, b: Bucket) {
    match v.binary_search_by_key(&b.start, |x| x.start) {
        Ok(i) => v[i].add(&b),
        Err(i) => {
            v.reserve_exact(1);
            v.insert(i, b);
        }
    }
}

impl Counts {
    /// Counts one attempt that started in `minute` (unix ms / 60,000), `now` being the current
    /// minute.
    pub fn add(&mut self, minute: i64, outcome: Outcome, throttled: bool, now: i64) {
        self.roll(now);
        if minute <= now - COUNT_MINUTES {
            return;
        }
        let mut b = Bucket::new(minute);
        match outcome {
            Outcome::Delivered => b.delivered = 1,
            Outcome::Failed => b.failed = 1,
        }
        b.throttled = u32::from(throttled);
        if minute > now - MINUTE_BUCKETS {
            add_into(&mut self.minutes, b);
        } else {
            b.start = hour_of(minute);
            add_into(&mut self.hours, b);
        }
    }

    /// Folds minutes that left the last hour into their hour, drops hours past the horizon.
    fn roll(&mut self, now: i64) {
        let cutoff = now - MINUTE_BUCKETS;
        let old = self.minutes.partition_point(|b| b.start <= cutoff);
        if old > 0 {
            for mut b in self.minutes.drain(..old).collect::<Vec<_>>() {
                b.start = hour_of(b.start);
                add_into(&mut self.hours, b);
            }
        }
        let gone = self
            .hours
            .partition_point(|b| b.start + 60 <= now - COUNT_MINUTES);
        if gone > 0 {
            self.hours.drain(..gone);
        }
        if self.minutes.capacity() > self.minutes.len() + 8 {
            self.minutes.shrink_to_fit();
        }
    }

    /// (start minute, delivered, failed, throttled) of every bucket with attempts in the last
    /// `minutes` minutes, oldest first: one per minute within the last hour; asked for more than
    /// the last hour, also one per hour (at its first minute) overlapping the rest.
    pub fn buckets(&mut self, minutes: i64, now: i64) -> Vec<(i64, u64, u64, u64)> {
        self.roll(now);
        let minutes = minutes.clamp(1, COUNT_MINUTES);
        let from = now - minutes + 1;
        let hours = if minutes > MINUTE_BUCKETS {
            &self.hours[..]
        } else {
            &[]
        };
        let row = |b: &Bucket| {
            (
                b.start,
                u64::from(b.delivered),
                u64::from(b.failed),
                u64::from(b.throttled),
            )
        };
        hours
            .iter()
            .filter(|b| b.start + 59 >= from)
            .chain(self.minutes.iter().filter(|b| b.start >= from))
            .map(row)
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.minutes.is_empty() && self.hours.is_empty()
    }
}

/// Strings the tracker stores many times (tenants, event types, stages, classes, hops,
/// instances), kept once. Bounded: past [`Interner::MAX`] distinct strings, new ones are stored
/// unshared.
#[derive(Debug, Default)]
pub struct Interner(HashSet<Arc<str>>);

impl Interner {
    pub const MAX: usize = 200_000;

    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        if self.0.len() < Self::MAX {
            self.0.insert(a.clone());
        }
        a
    }
}

/// One attempt as the tracker keeps it (the endpoint id is the map's key).
#[derive(Debug, Clone)]
pub struct Stored {
    at_ms: i64,
    event_id: Box<str>,
    attempt: u32,
    tenant: Option<Arc<str>>,
    event_type: Option<Arc<str>>,
    stage: Arc<str>,
    outcome: Outcome,
    status: Option<u16>,
    class: Arc<str>,
    error: Option<Box<str>>,
    duration_ms: u64,
    next: Option<Arc<str>>,
    instance: Arc<str>,
    waited_ms: u64,
}

impl Stored {
    pub fn of(a: &Attempt, i: &mut Interner) -> Stored {
        Stored {
            at_ms: a.at_ms,
            event_id: a.event_id.as_str().into(),
            attempt: a.attempt,
            tenant: a.tenant.as_deref().map(|s| i.get(s)),
            event_type: a.event_type.as_deref().map(|s| i.get(s)),
            stage: i.get(&a.stage),
            outcome: a.outcome,
            status: a.status,
            class: i.get(&a.class),
            error: a.error.as_deref().map(Into::into),
            duration_ms: a.duration_ms,
            next: a.next.as_deref().map(|s| i.get(s)),
            instance: i.get(&a.instance),
            waited_ms: a.waited_ms,
        }
    }

    pub fn to_attempt(&self, endpoint_id: &str) -> Attempt {
        Attempt {
            event_id: self.event_id.to_string(),
            endpoint_id: endpoint_id.to_string(),
            tenant: self.tenant.as_deref().map(str::to_string),
            event_type: self.event_type.as_deref().map(str::to_string),
            attempt: self.attempt,
            stage: self.stage.to_string(),
            outcome: self.outcome,
            status: self.status,
            class: self.class.to_string(),
            error: self.error.as_deref().map(str::to_string),
            duration_ms: self.duration_ms,
            at_ms: self.at_ms,
            next: self.next.as_deref().map(str::to_string),
            instance: self.instance.to_string(),
            waited_ms: self.waited_ms,
        }
    }

    fn key(&self) -> (i64, &str, u32) {
        (self.at_ms, &self.event_id, self.attempt)
    }
}

/// The latest [`RECENT`] attempts of an endpoint, sorted by (time, event id, attempt); the same
/// attempt read twice is kept once.
#[derive(Debug, Clone, Default)]
pub struct Recent(Vec<Stored>);

impl Recent {
    pub fn insert(&mut self, s: Stored) {
        match self.0.binary_search_by(|x| x.key().cmp(&s.key())) {
            Ok(i) => self.0[i] = s,
            Err(0) if self.0.len() >= RECENT => {} // older than everything kept
            Err(i) => {
                if self.0.len() >= RECENT {
                    self.0.remove(0);
                    self.0.insert(i - 1, s);
                } else {
                    self.0.reserve_exact(1);
                    self.0.insert(i, s);
                }
            }
        }
    }

    /// Newest first.
    pub fn newest_first(&self, endpoint_id: &str) -> Vec<Attempt> {
        self.0
            .iter()
            .rev()
            .map(|s| s.to_attempt(endpoint_id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(event: &str, at_ms: i64) -> Attempt {
        Attempt {
            event_id: event.into(),
            endpoint_id: "ep".into(),
            tenant: Some("acme".into()),
            event_type: Some("order.created".into()),
            attempt: 1,
            stage: "dispatcher".into(),
            outcome: Outcome::Delivered,
            status: Some(200),
            class: "ok".into(),
            error: None,
            duration_ms: 3,
            at_ms,
            next: None,
            instance: "pod-1".into(),
            waited_ms: 0,
        }
    }

    #[test]
    fn the_last_hour_per_minute_the_day_before_per_hour() {
        let now = 100_000; // a minute
        let mut c = Counts::default();
        // An attempt every minute of the last 24 h, two of them failed.
        for m in (now - COUNT_MINUTES + 1)..=now {
            c.add(m, Outcome::Delivered, false, now);
        }
        c.add(now, Outcome::Failed, true, now);
        c.add(now - 600, Outcome::Failed, false, now);
        c.add(now - COUNT_MINUTES, Outcome::Failed, false, now); // past the horizon
        assert!(c.minutes.len() <= MINUTE_BUCKETS as usize && c.hours.len() <= 25);
        let day = c.buckets(COUNT_MINUTES, now);
        let (d, f, t) = day
            .iter()
            .fold((0, 0, 0), |(d, f, t), b| (d + b.1, f + b.2, t + b.3));
        // The oldest hour bucket may start before the 24 h edge; its minutes all count.
        assert_eq!((d, f, t), (COUNT_MINUTES as u64, 2, 1));
        let hour = c.buckets(60, now);
        assert_eq!(hour.len(), 60);
        assert!(hour.iter().all(|b| b.0 > now - 60));
        assert_eq!(hour.last(), Some(&(now, 1, 1, 1)));
        // The older buckets are hours, at their first minute.
        assert!(day
            .iter()
            .filter(|b| b.0 <= now - 60)
            .all(|b| b.0 % 60 == 0));
    }

    #[test]
    fn minutes_fold_into_their_hour_as_time_passes() {
        let mut c = Counts::default();
        for m in 6_000..6_030 {
            c.add(m, Outcome::Delivered, false, 6_030);
        }
        assert_eq!(c.minutes.len(), 30);
        let later = 6_030 + 120;
        let b = c.buckets(COUNT_MINUTES, later);
        assert_eq!(b, vec![(6_000, 30, 0, 0)]);
        assert!(c.minutes.is_empty());
        assert!(c
            .buckets(COUNT_MINUTES, later + COUNT_MINUTES + 60)
            .is_empty());
        assert!(c.is_empty());
    }

    #[test]
    fn recent_keeps_the_newest_once_each_sorted() {
        let mut i = Interner::default();
        let mut r = Recent::default();
        for n in (0..200).rev() {
            r.insert(Stored::of(&attempt(&format!("e{n:03}"), n), &mut i));
        }
        r.insert(Stored::of(&attempt("e199", 199), &mut i)); // read twice
        let got = r.newest_first("ep");
        assert_eq!(got.len(), RECENT);
        assert_eq!(got[0], attempt("e199", 199));
        assert_eq!(got[RECENT - 1].at_ms, 200 - RECENT as i64);
        assert!(got.windows(2).all(|w| w[0].at_ms > w[1].at_ms));
        // An old attempt arriving late is not kept past the newest RECENT.
        r.insert(Stored::of(&attempt("late", 1), &mut i));
        assert!(r.newest_first("ep").iter().all(|a| a.event_id != "late"));
        // The shared strings are stored once.
        assert_eq!(i.0.len(), 5, "{:?}", i.0);
    }
}

//! Per-endpoint health from the attempts of the delivery log — pure, no Kafka, so every process
//! that reads the same records gives the same answer whatever order its partitions arrive in:
//! every figure is defined on attempt times, not on arrival order.
//!
//! - recent success rate: over the most recent `health_window_attempts` attempts (by time) that
//!   started within the last `health_window`;
//! - last attempt (time, status/class), last error (the latest failure), last success;
//! - consecutive failures and failing-since: the failures after the latest success. Records may
//!   arrive out of time order by up to [`REORDER_HORIZON_MS`] (partitions read at different
//!   speeds); failures older than that are folded into a count and their first time.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use crate::attempts::{Attempt, Outcome};

/// How far out of time order attempts of one endpoint may arrive and still be placed exactly.
pub const REORDER_HORIZON_MS: i64 = 5 * 60 * 1000;

/// The windows of the recent success rate.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub period: Duration,
    pub attempts: usize,
}

/// The last attempt, or the last failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Seen {
    pub at_ms: i64,
    pub status: Option<u16>,
    pub class: String,
    pub error: Option<String>,
    pub stage: String,
    /// How long the endpoint's rate limit held this delivery back (throttled); absent if not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// (event id, attempt): ties on time are broken by it, the same everywhere.
    #[serde(skip)]
    order: (String, u32),
}

impl Seen {
    fn of(a: &Attempt) -> Seen {
        Seen {
            at_ms: a.at_ms,
            status: a.status,
            class: a.class.clone(),
            error: a.error.clone(),
            stage: a.stage.clone(),
            waited_ms: (a.waited_ms > 0).then_some(a.waited_ms),
            order: (a.event_id.clone(), a.attempt),
        }
    }
    fn later_than(&self, other: &Option<Seen>) -> bool {
        other
            .as_ref()
            .is_none_or(|o| (self.at_ms, &self.order) > (o.at_ms, &o.order))
    }
}

/// (time, event id, attempt): how attempts are ordered, the same everywhere.
type AttemptKey = (i64, Box<str>, u32);

/// What one endpoint's attempts say.
#[derive(Debug, Clone, Default)]
pub struct EndpointHealth {
    /// The most recent attempts, sorted: ((time, event id, attempt), (delivered, throttled)). A
    /// vector grown one at a time: a tree's first leaf alone was ~0.5 KiB per endpoint.
    recent: Vec<(AttemptKey, (bool, bool))>,
    last: Option<Seen>,
    last_failure: Option<Seen>,
    last_success_ms: Option<i64>,
    /// Failures after the last success within the reorder horizon: time → count.
    streak: BTreeMap<i64, u64>,
    /// Failures after the last success older than the horizon: count, first and last time.
    folded: Option<(u64, i64, i64)>,
    latest_ms: i64,
    total: u64,
    /// Deliveries waiting in a retry tier: event id → (attempt number, when that attempt
    /// handed it to the tier). At most [`PENDING_CAP`]; the oldest stay (they are the answer).
    pending: HashMap<String, (u32, i64)>,
}

/// Most waiting deliveries tracked per endpoint for [`HealthReport::oldest_pending_retry_ms`].
pub const PENDING_CAP: usize = 100_000;

/// Health of one endpoint at a time (`hookline endpoints health`, the admin API).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthReport {
    pub endpoint_id: String,
    /// `healthy`, `throttled` (healthy, but its latest attempt had waited for the endpoint's
    /// rate limit: deliveries are queuing behind it), `degraded` (recent success rate under
    /// 90 %), `failing` (the latest attempt failed), `unknown` (no attempt read).
    pub status: &'static str,
    pub attempts_in_window: usize,
    pub successes_in_window: usize,
    /// Attempts in the window that had waited for the endpoint's rate limit.
    pub throttled_in_window: usize,
    pub success_rate: Option<f64>,
    pub last_attempt: Option<Seen>,
    pub last_error: Option<Seen>,
    pub last_success_at_ms: Option<i64>,
    pub consecutive_failures: u64,
    pub failing_since_ms: Option<i64>,
    /// Deliveries waiting in a retry tier after a failed attempt (read since the lookback).
    pub pending_retries: u64,
    /// When the longest-waiting of them was handed to its tier.
    pub oldest_pending_retry_ms: Option<i64>,
    /// Dead letters of this endpoint on `<p>.dlq`.
    pub dead: u64,
    /// Attempts read (since the tracker's lookback).
    pub attempts_read: u64,
}

impl EndpointHealth {
    /// Takes one attempt into account.
    pub fn observe(&mut self, a: &Attempt, window: &Window) {
        self.total += 1;
        // Waiting in a tier after this attempt, unless a later attempt was already seen. (An
        // event's attempts arrive in order: its records share a partition, keyed by event id.)
        let later_seen = self
            .pending
            .get(&a.event_id)
            .is_some_and(|(n, _)| *n > a.attempt);
        if !later_seen {
            let to_tier = a.next.as_deref().is_some_and(|n| n.starts_with("retry."));
            if to_tier {
                if self.pending.len() < PENDING_CAP || self.pending.contains_key(&a.event_id) {
                    self.pending
                        .insert(a.event_id.clone(), (a.attempt, a.at_ms));
                }
            } else {
                self.pending.remove(&a.event_id);
            }
        }
        self.latest_ms = self.latest_ms.max(a.at_ms);
        let ok = a.outcome == Outcome::Delivered;
        let key = (a.at_ms, Box::<str>::from(a.event_id.as_str()), a.attempt);
        match self.recent.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => self.recent[i].1 = (ok, a.waited_ms > 0),
            Err(i) => {
                if self.recent.len() < window.attempts {
                    self.recent.reserve_exact(1);
                }
                self.recent.insert(i, (key, (ok, a.waited_ms > 0)));
            }
        }
        if self.recent.len() > window.attempts {
            let extra = self.recent.len() - window.attempts;
            self.recent.drain(..extra);
        }
        let seen = Seen::of(a);
        if seen.later_than(&self.last) {
            self.last = Some(seen.clone());
        }
        if ok {
            if self.last_success_ms.is_none_or(|s| a.at_ms > s) {
                self.last_success_ms = Some(a.at_ms);
                self.streak = self.streak.split_off(&(a.at_ms + 1));
                if self.folded.is_some_and(|(_, _, last)| last <= a.at_ms) {
                    self.folded = None;
                }
            }
        } else {
            if seen.later_than(&self.last_failure) {
                self.last_failure = Some(seen);
            }
            if self.last_success_ms.is_none_or(|s| a.at_ms > s) {
                *self.streak.entry(a.at_ms).or_default() += 1;
            }
        }
        // Fold what is beyond the reorder horizon.
        let edge = self.latest_ms - REORDER_HORIZON_MS;
        while let Some((&at, &n)) = self.streak.first_key_value() {
            if at >= edge {
                break;
            }
            self.streak.pop_first();
            self.folded = Some(match self.folded {
                None => (n, at, at),
                Some((c, first, last)) => (c + n, first.min(at), last.max(at)),
            });
        }
    }

    /// The report at `now_ms`.
    pub fn report(
        &self,
        endpoint_id: &str,
        now_ms: i64,
        window: &Window,
        dead: u64,
    ) -> HealthReport {
        let since = now_ms - i64::try_from(window.period.as_millis()).unwrap_or(i64::MAX);
        let in_window: Vec<(bool, bool)> = self
            .recent
            .iter()
            .filter(|((at, _, _), _)| *at >= since)
            .map(|(_, v)| *v)
            .collect();
        let successes = in_window.iter().filter(|(ok, _)| *ok).count();
        let throttled = in_window.iter().filter(|(_, t)| *t).count();
        let rate = (!in_window.is_empty()).then(|| successes as f64 / in_window.len() as f64);
        let consecutive = self.folded.map_or(0, |(c, _, _)| c) + self.streak.values().sum::<u64>();
        let failing_since = self
            .folded
            .map(|(_, first, _)| first)
            .or_else(|| self.streak.keys().next().copied());
        let last_failed = self
            .last
            .as_ref()
            .is_some_and(|l| l.class != "ok" && l.status.is_none_or(|s| !(200..300).contains(&s)));
        let last_throttled = self.last.as_ref().is_some_and(|l| l.waited_ms.is_some());
        let status = match (&self.last, rate) {
            (None, _) => "unknown",
            _ if last_failed && consecutive > 0 => "failing",
            (_, Some(r)) if r < 0.9 => "degraded",
            _ if last_throttled => "throttled",
            _ => "healthy",
        };
        HealthReport {
            endpoint_id: endpoint_id.to_string(),
            status,
            attempts_in_window: in_window.len(),
            successes_in_window: successes,
            throttled_in_window: throttled,
            success_rate: rate,
            last_attempt: self.last.clone(),
            last_error: self.last_failure.clone(),
            last_success_at_ms: self.last_success_ms,
            consecutive_failures: consecutive,
            pending_retries: self.pending.len() as u64,
            oldest_pending_retry_ms: self.pending.values().map(|(_, at)| *at).min(),
            failing_since_ms: failing_since,
            dead,
            attempts_read: self.total,
        }
    }
}

/// The report of an endpoint with no attempt read.
pub fn unknown(endpoint_id: &str, dead: u64) -> HealthReport {
    EndpointHealth::default().report(
        endpoint_id,
        0,
        &Window {
            period: Duration::ZERO,
            attempts: 1,
        },
        dead,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Window = Window {
        period: Duration::from_secs(900),
        attempts: 100,
    };

    fn attempt(event: &str, at_ms: i64, ok: bool) -> Attempt {
        Attempt {
            event_id: event.into(),
            endpoint_id: "crm".into(),
            tenant: None,
            event_type: None,
            attempt: 1,
            stage: "dispatcher".into(),
            outcome: if ok {
                Outcome::Delivered
            } else {
                Outcome::Failed
            },
            status: Some(if ok { 200 } else { 503 }),
            class: if ok { "ok" } else { "http_status" }.into(),
            error: (!ok).then(|| "unavailable".into()),
            duration_ms: 3,
            at_ms,
            next: None,
            instance: "p".into(),
            waited_ms: 0,
        }
    }

    #[test]
    fn a_healthy_endpoint_held_back_by_its_rate_limit_is_throttled() {
        let mut h = EndpointHealth::default();
        h.observe(&attempt("a", 1_000, true), &W);
        assert_eq!(h.report("crm", 2_000, &W, 0).status, "healthy");
        let waited = Attempt {
            waited_ms: 1_500,
            ..attempt("b", 1_500, true)
        };
        h.observe(&waited, &W);
        let r = h.report("crm", 2_000, &W, 0);
        assert_eq!((r.status, r.throttled_in_window), ("throttled", 1));
        assert_eq!(r.last_attempt.and_then(|l| l.waited_ms), Some(1_500));
        // Failing wins over throttled; an attempt that did not wait ends it.
        h.observe(&attempt("c", 1_600, true), &W);
        assert_eq!(h.report("crm", 2_000, &W, 0).status, "healthy");
    }

    #[test]
    fn pending_retries_are_deliveries_whose_latest_attempt_went_to_a_tier() {
        let retry = |event: &str, n: u32, at: i64, next: Option<&str>| Attempt {
            attempt: n,
            next: next.map(str::to_string),
            ..attempt(event, at, next.is_none())
        };
        let mut h = EndpointHealth::default();
        for a in [
            retry("e1", 1, 1_000, Some("retry.1m")),
            retry("e2", 1, 2_000, Some("retry.1m")),
            retry("e2", 2, 62_000, Some("retry.5m")),
            retry("e3", 1, 3_000, Some("retry.1m")),
            retry("e3", 2, 63_000, None), // delivered
            // An event's attempts are read in order (one partition: the key is the event id).
            retry("e4", 1, 4_000, Some("retry.1m")),
            retry("e4", 2, 64_000, Some("dlq")),
        ] {
            h.observe(&a, &W);
        }
        let r = h.report("crm", 70_000, &W, 0);
        assert_eq!(
            r.pending_retries, 2,
            "e1 and e2 wait; e3 delivered, e4 dead"
        );
        assert_eq!(r.oldest_pending_retry_ms, Some(1_000));
    }

    fn report(attempts: &[Attempt], now: i64) -> HealthReport {
        let mut h = EndpointHealth::default();
        for a in attempts {
            h.observe(a, &W);
        }
        h.report("crm", now, &W, 0)
    }

    #[test]
    fn streaks_rates_and_last_seen() {
        let base = 10_000_000;
        let mut xs = vec![attempt("e1", base, true)];
        for i in 1..=4 {
            xs.push(attempt(&format!("f{i}"), base + i * 1000, false));
        }
        let r = report(&xs, base + 5_000);
        assert_eq!(r.status, "failing");
        assert_eq!(r.consecutive_failures, 4);
        assert_eq!(r.failing_since_ms, Some(base + 1000));
        assert_eq!(r.last_success_at_ms, Some(base));
        assert_eq!(r.success_rate, Some(0.2));
        assert_eq!(r.last_error.as_ref().map(|e| e.at_ms), Some(base + 4000));
        // A later success ends the streak.
        xs.push(attempt("e2", base + 6_000, true));
        let r = report(&xs, base + 7_000);
        assert_eq!(
            (r.status, r.consecutive_failures, r.failing_since_ms),
            ("degraded", 0, None)
        );
        // Outside the window, nothing counts towards the rate.
        let r = report(&xs, base + 7_000 + 900_000);
        assert_eq!(r.success_rate, None);
        assert_eq!(unknown("x", 3).status, "unknown");
        assert_eq!(unknown("x", 3).dead, 3);
    }

    #[test]
    fn the_answer_does_not_depend_on_arrival_order() {
        let base = 50_000_000;
        let xs: Vec<Attempt> = (0..40)
            .map(|i| attempt(&format!("e{i}"), base + i * 777, i % 7 == 3 || i < 5))
            .collect();
        let forward = report(&xs, base + 40_000);
        let mut shuffled = xs.clone();
        shuffled.reverse();
        shuffled.swap(3, 17);
        let backward = report(&shuffled, base + 40_000);
        assert_eq!(forward, backward);
        assert!(forward.consecutive_failures > 0);
    }

    #[test]
    fn long_streaks_fold_beyond_the_horizon() {
        let base = 1_000_000_000;
        let xs: Vec<Attempt> = (0..100)
            .map(|i| attempt(&format!("f{i}"), base + i * 60_000, false))
            .collect();
        let r = report(&xs, base + 100 * 60_000);
        assert_eq!(r.consecutive_failures, 100);
        assert_eq!(r.failing_since_ms, Some(base));
        let mut h = EndpointHealth::default();
        for a in &xs {
            h.observe(a, &W);
        }
        assert!(h.streak.len() <= 6, "only the horizon is kept exactly");
        h.observe(&attempt("ok", base + 101 * 60_000, true), &W);
        assert_eq!(
            h.report("crm", base + 102 * 60_000, &W, 0)
                .consecutive_failures,
            0
        );
    }
}

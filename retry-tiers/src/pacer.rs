//! Rate limits: the token bucket of every rate-limited endpoint whose `<p>.throttle` partition
//! this process owns. An endpoint's deliveries all go to one partition of `<p>.throttle`
//! (`topics::throttle_partition`), so exactly one consumer in the cluster paces it: the limit
//! holds for the whole cluster without any shared store, whatever the number of dispatcher and
//! tier processes.
//!
//! The bucket holds up to `burst` slots (default 1: strictly paced) and gains `rate_limit` per
//! second; a delivery takes one slot when it starts. In any one-second window an endpoint thus
//! receives at most `rate_limit + burst` requests. A 429 or 503 answer with `Retry-After` empties
//! the bucket until then (at most [`RETRY_AFTER_CAP`]): the endpoint's next deliveries wait, the
//! failed one follows the retry schedule as usual. A rebalance gives the partition a new owner
//! whose bucket starts full: at most one burst more in that second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The longest a `Retry-After` pauses an endpoint (a longer one is capped, and logged).
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// Deliveries that may start at once after an idle spell, unless the endpoint sets `burst`.
pub const DEFAULT_BURST: u32 = 1;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
    paused_until: Option<Instant>,
}

/// The buckets of the endpoints this process paces.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Pacer {
    /// Takes a slot of `endpoint` (limited to `rate` per second, `burst`) at `now`; otherwise
    /// says when the next one comes.
    pub(crate) fn try_take(
        &self,
        endpoint: &str,
        rate: f64,
        burst: u32,
        now: Instant,
    ) -> Result<(), Instant> {
        let burst = f64::from(burst.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(endpoint.to_string()).or_insert(Bucket {
            tokens: burst,
            updated: now,
            paused_until: None,
        });
        if let Some(until) = bucket.paused_until {
            if now < until {
                return Err(until);
            }
            bucket.paused_until = None;
            bucket.tokens = 0.0;
            bucket.updated = until;
        }
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(now + Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }

    /// The endpoint answered 429/503 with `Retry-After: after`: no new delivery starts before
    /// `now + after` (capped). Returns the pause applied.
    pub(crate) fn pause(&self, endpoint: &str, after: Duration, now: Instant) -> Duration {
        let applied = after.min(RETRY_AFTER_CAP);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(endpoint.to_string()).or_insert(Bucket {
            tokens: 0.0,
            updated: now,
            paused_until: None,
        });
        let until = now + applied;
        bucket.paused_until = Some(bucket.paused_until.map_or(until, |u| u.max(until)));
        bucket.tokens = 0.0;
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_rate_plus_burst_in_any_second() {
        let pacer = Pacer::default();
        let start = Instant::now();
        // Ask every millisecond for 3 s: count what starts in each 1 s window.
        let mut started = Vec::new();
        for ms in 0..3_000 {
            let now = start + Duration::from_millis(ms);
            if pacer.try_take("e", 50.0, 1, now).is_ok() {
                started.push(ms);
            }
        }
        let max_window = (0..2_000)
            .map(|from| {
                started
                    .iter()
                    .filter(|&&t| t >= from && t < from + 1_000)
                    .count()
            })
            .max()
            .unwrap_or(0);
        assert!(max_window <= 51, "{max_window}");
        assert!(
            started.len() >= 149,
            "keeps up with the rate: {}",
            started.len()
        );
        // Another endpoint has its own bucket.
        assert!(pacer.try_take("other", 1.0, 1, start).is_ok());
    }

    #[test]
    fn burst_then_paced_and_the_next_slot_is_named() {
        let pacer = Pacer::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            assert!(pacer.try_take("e", 10.0, 5, t0).is_ok());
        }
        let next = pacer.try_take("e", 10.0, 5, t0).expect_err("empty");
        assert_eq!(next - t0, Duration::from_millis(100));
        assert!(pacer.try_take("e", 10.0, 5, next).is_ok());
    }

    #[test]
    fn retry_after_pauses_capped() {
        let pacer = Pacer::default();
        let t0 = Instant::now();
        assert_eq!(
            pacer.pause("e", Duration::from_secs(5), t0),
            Duration::from_secs(5)
        );
        assert_eq!(
            pacer.try_take("e", 50.0, 1, t0 + Duration::from_secs(1)),
            Err(t0 + Duration::from_secs(5))
        );
        // After the pause: paced from zero, not a burst.
        let after = t0 + Duration::from_secs(5);
        assert!(pacer.try_take("e", 50.0, 10, after).is_err());
        assert!(pacer
            .try_take("e", 50.0, 10, after + Duration::from_millis(20))
            .is_ok());
        assert_eq!(
            pacer.pause("e", Duration::from_secs(3600), t0),
            RETRY_AFTER_CAP
        );
    }
}

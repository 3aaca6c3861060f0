//! The max *sustainable* rate: a bisection over open-model input rates (records/s) between 0 and
//! the backlog-drain rate. A backlog drain batches at every hop and so overstates what the
//! pipeline keeps up with when records trickle in on a schedule; the latency runs at 50% and 90%
//! are taken of the rate found here.
//!
//! A probe is sustained when its ledger balanced, its deliveries came at ≥ 90% of the rate they
//! were due (the run's `kept_up`), and every hop's consumer lag stayed below [`LAG_BOUND`] worth
//! of input: a pipeline that falls behind grows its lag for as long as the run lasts, one that
//! keeps up holds it at a few batches (plus the dispatcher's 1 s auto-commit trail).

use std::time::Duration;

use serde::Serialize;

use crate::report::RunResult;

/// Most input a hop may have queued (committed offsets behind the log end) for a probe to count
/// as sustained, in seconds of the probe's rate.
pub const LAG_BOUND: Duration = Duration::from_secs(3);

/// Whether a probe at `rate` records/s kept up.
pub fn sustained(r: &RunResult, rate: f64) -> bool {
    let lag = r.max_lag.values().copied().max().unwrap_or(0) as f64;
    r.ledger.balanced && r.kept_up == Some(true) && lag <= rate * LAG_BOUND.as_secs_f64()
}

/// One probe of the search.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub rate: f64,
    pub sustained: bool,
}

/// What the search found.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// Records/s: the fastest probe that kept up; when none did (or no probe ran), an
    /// unverified guess below every failed probe (or the drain rate).
    pub rate: f64,
    /// True when `rate` is a probe that kept up.
    pub verified: bool,
    /// The backlog drain's input rate, the search's upper bound.
    pub drain_rate: f64,
    pub probes: Vec<Probe>,
}

/// Bisection state: `lo` kept up (0: nothing yet), `hi` did not (starts at the drain rate).
#[derive(Debug, Clone)]
pub struct Bisection {
    lo: f64,
    hi: f64,
    drain: f64,
    probes: Vec<Probe>,
}

impl Bisection {
    pub fn new(drain_rate: f64) -> Bisection {
        Bisection {
            lo: 0.0,
            hi: drain_rate,
            drain: drain_rate,
            probes: Vec::new(),
        }
    }

    /// The next rate to probe: the middle of what is still unknown.
    pub fn next_rate(&self) -> f64 {
        (self.lo + self.hi) / 2.0
    }

    pub fn record(&mut self, rate: f64, sustained: bool) {
        if sustained {
            self.lo = self.lo.max(rate);
        } else {
            self.hi = self.hi.min(rate);
        }
        self.probes.push(Probe { rate, sustained });
    }

    pub fn result(&self) -> Found {
        let (rate, verified) = if self.lo > 0.0 {
            (self.lo, true)
        } else if self.probes.is_empty() {
            (self.drain, false)
        } else {
            (self.hi / 2.0, false)
        };
        Found {
            rate,
            verified,
            drain_rate: self.drain,
            probes: self.probes.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bisection_converges_on_the_highest_rate_that_keeps_up() {
        let mut b = Bisection::new(16_000.0);
        // The pipeline keeps up to 7,000 records/s.
        for _ in 0..4 {
            let r = b.next_rate();
            b.record(r, r <= 7_000.0);
        }
        let rates: Vec<f64> = b.result().probes.iter().map(|p| p.rate).collect();
        assert_eq!(rates, [8_000.0, 4_000.0, 6_000.0, 7_000.0]);
        let f = b.result();
        assert!(f.verified);
        assert_eq!(f.rate, 7_000.0);
    }

    #[test]
    fn without_a_passing_probe_the_rate_is_an_unverified_guess() {
        let b = Bisection::new(10_000.0);
        let f = b.result();
        assert_eq!((f.rate, f.verified), (10_000.0, false));
        let mut b = Bisection::new(10_000.0);
        b.record(b.next_rate(), false);
        let f = b.result();
        assert_eq!((f.rate, f.verified), (2_500.0, false));
    }
}

//! One `<p>.throttle` partition's records between "received" and "offset stored": a queue per
//! endpoint (its deliveries in arrival order), each drained as its endpoint's bucket allows
//! ([`crate::pacer`]), so a slow endpoint never holds back another. Pure logic: the worker loop
//! applies the decisions.
//!
//! Memory is bounded like a tier partition's: at `cap` records held the partition is paused,
//! and resumed under `cap / 2`. An endpoint whose backlog alone exceeds that holds back the
//! rate-limited endpoints sharing its partition until it drains below half (unlimited endpoints
//! never come here); the backlog itself waits on Kafka, not in memory.

use std::collections::{BTreeMap, VecDeque};

use tokio::time::Instant;

use hookline_common::kafka::progress::PartitionProgress;

/// How one endpoint is paced now: `Some((rate, burst))`, or `None` when it is no longer
/// rate-limited (or gone): its waiting deliveries then start at once (the delivery path then
/// attempts, or dead-letters them).
pub(crate) type Limit = Option<(f64, u32)>;

/// Per-partition state of the rate limiter.
#[derive(Debug)]
pub(crate) struct PacedWaiting<T> {
    /// Endpoint id → its waiting records (offset, item), oldest first. Records whose endpoint
    /// cannot be read wait under "" (started at once).
    queues: BTreeMap<String, VecDeque<(i64, Instant, T)>>,
    /// Endpoint → the newest offset waiting when it was last refused a slot: its records up to
    /// there were held back by the limit (throttled).
    refused_through: BTreeMap<String, i64>,
    held: usize,
    /// Every record from the moment it is received (records start out of offset order: the
    /// stored offset never passes one still waiting).
    progress: PartitionProgress,
    /// Records started and not completed.
    started: usize,
    paused: bool,
    /// The earliest moment a waiting endpoint gets its next slot (set by [`Self::take_due`]).
    next_slot: Option<Instant>,
}

impl<T> Default for PacedWaiting<T> {
    fn default() -> Self {
        PacedWaiting {
            queues: BTreeMap::new(),
            refused_through: BTreeMap::new(),
            held: 0,
            progress: PartitionProgress::default(),
            started: 0,
            paused: false,
            next_slot: None,
        }
    }
}

impl<T> PacedWaiting<T> {
    /// A record arrived (in offset order) for `endpoint` at `now`.
    pub(crate) fn push(&mut self, offset: i64, endpoint: &str, item: T, now: Instant) {
        self.queues
            .entry(endpoint.to_string())
            .or_default()
            .push_back((offset, now, item));
        self.progress.begin(offset);
        self.held += 1;
    }

    /// Starts, endpoint by endpoint and in arrival order, every record whose endpoint has a slot
    /// now, while fewer than `cap` are in flight. `slot(endpoint, limit)` takes a slot or says
    /// when the next comes; `limit(endpoint)` is the endpoint's current limit. Each started
    /// record comes with how long the limit held it back (ms; 0 when it never waited for a slot).
    pub(crate) fn take_due(
        &mut self,
        now: Instant,
        cap: usize,
        limit: impl Fn(&str) -> Limit,
        slot: impl Fn(&str, f64, u32) -> Result<(), Instant>,
    ) -> Vec<(i64, T, u64)> {
        let mut out = Vec::new();
        let mut next_slot: Option<Instant> = None;
        for (endpoint, queue) in &mut self.queues {
            let paced = if endpoint.is_empty() {
                None
            } else {
                limit(endpoint)
            };
            while !queue.is_empty() && self.started < cap {
                if let Some((rate, burst)) = paced {
                    if let Err(at) = slot(endpoint, rate, burst) {
                        next_slot = Some(next_slot.map_or(at, |n| n.min(at)));
                        if let Some((newest, _, _)) = queue.back() {
                            self.refused_through.insert(endpoint.clone(), *newest);
                        }
                        break;
                    }
                }
                if let Some((offset, received, item)) = queue.pop_front() {
                    self.started += 1;
                    self.held -= 1;
                    let held_back = self
                        .refused_through
                        .get(endpoint)
                        .is_some_and(|through| offset <= *through);
                    let waited = if held_back {
                        u64::try_from(now.saturating_duration_since(received).as_millis())
                            .unwrap_or(u64::MAX)
                            .max(1)
                    } else {
                        0
                    };
                    out.push((offset, item, waited));
                }
            }
        }
        self.queues.retain(|_, q| !q.is_empty());
        let queues = &self.queues;
        self.refused_through.retain(|e, _| queues.contains_key(e));
        self.next_slot = next_slot.filter(|at| *at > now);
        out
    }

    /// When the loop must look again: the earliest next slot of a waiting endpoint.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.next_slot
    }

    /// An in-flight record is done; returns the offset to store when the prefix advanced.
    pub(crate) fn complete(&mut self, offset: i64) -> Option<i64> {
        self.started = self.started.saturating_sub(1);
        self.progress.complete(offset)
    }

    /// `Some(pause?)` when the pause state must change (held records against `cap`, with
    /// hysteresis), recording the new state.
    pub(crate) fn pause_change(&mut self, cap: usize) -> Option<bool> {
        let held = self.held + self.started;
        let want = if self.paused {
            held > cap / 2
        } else {
            held >= cap
        };
        if want == self.paused {
            return None;
        }
        self.paused = want;
        Some(want)
    }

    /// Forgets the records not started (shutdown, revoke): read again by the next owner.
    pub(crate) fn drop_waiting(&mut self) -> usize {
        let n = self.held;
        self.queues.clear();
        self.refused_through.clear();
        self.held = 0;
        n
    }

    pub(crate) fn waiting(&self) -> usize {
        self.held
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.started
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    pub(crate) fn set_paused(&mut self) {
        self.paused = true;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_slow_endpoint_never_holds_back_another_and_order_is_kept() {
        let mut w = PacedWaiting::default();
        let now = Instant::now();
        for (offset, ep) in [
            (0, "slow"),
            (1, "slow"),
            (2, "fast"),
            (3, "slow"),
            (4, "fast"),
        ] {
            w.push(offset, ep, offset, now);
        }
        w.push(5, "", 5, now);
        let granted: RefCell<HashMap<String, u32>> = RefCell::default();
        let limit = |e: &str| Some(if e == "slow" { (1.0, 1) } else { (100.0, 10) });
        // "slow" has one slot; "fast" all it wants; "" (unreadable) starts at once.
        let slot = |e: &str, _r: f64, burst: u32| {
            let mut g = granted.borrow_mut();
            let n = g.entry(e.to_string()).or_default();
            if *n < burst {
                *n += 1;
                Ok(())
            } else {
                Err(now + Duration::from_secs(1))
            }
        };
        let started: Vec<(i64, u64)> = w
            .take_due(now, 100, limit, slot)
            .into_iter()
            .map(|(o, _, waited)| (o, waited))
            .collect();
        assert_eq!(
            started,
            [(5, 0), (2, 0), (4, 0), (0, 0)],
            "by endpoint, each in arrival order; none held back yet"
        );
        assert_eq!(w.waiting(), 2);
        assert_eq!(w.next_wake(), Some(now + Duration::from_secs(1)));
        // Offsets are stored as a contiguous prefix only, never past a waiting record.
        assert_eq!(w.complete(2), None);
        assert_eq!(w.complete(0), Some(1), "1 still waits");
        assert_eq!(w.complete(4), None);
        assert_eq!(w.complete(5), None);
        // The slow endpoint's next records were refused a slot: throttled when they start.
        granted.borrow_mut().clear();
        let later = now + Duration::from_millis(1500);
        let next: Vec<(i64, u64)> = w
            .take_due(later, 100, limit, slot)
            .into_iter()
            .map(|(o, _, waited)| (o, waited))
            .collect();
        assert_eq!(next, [(1, 1500)]);
    }

    #[test]
    fn unlimited_now_starts_at_once_and_memory_is_bounded() {
        let mut w = PacedWaiting::default();
        for offset in 0..10 {
            w.push(offset, "e", (), Instant::now());
        }
        assert_eq!(w.pause_change(10), Some(true));
        assert_eq!(w.pause_change(10), None);
        let all = w.take_due(Instant::now(), 100, |_| None, |_, _, _| Err(Instant::now()));
        assert_eq!(all.len(), 10, "no longer limited: every one starts");
        for (o, (), _) in all {
            w.complete(o);
        }
        assert_eq!(w.pause_change(10), Some(false));
    }
}

//! When a tier record is due, as the tier worker decides it (pure logic, no Kafka).
//!
//! A due time is written by the host that made the previous attempt (`first attempt + offset`,
//! on its own clock). A host whose clock runs an hour fast writes due times an hour late, and as
//! the head of a partition is a barrier, every record behind it would wait too. So the due time
//! is capped by what the schedule allows: a record is produced after the previous attempt
//! started, so an honest due time is at most `record timestamp + (tier's offset − previous
//! tier's offset)`. The bound adds [`CLOCK_SLACK_MS`] for the ordinary skew between honest
//! clocks; beyond it the due time is replaced by the bound and the skew is counted.
//!
//! The timestamp is the broker's (tier topics use `message.timestamp.type=LogAppendTime`); the
//! time the record was received is used when it is earlier or when the record has none (a
//! topic still on CreateTime whose producer's clock is fast), since a record cannot have been
//! produced after it was received.
//!
//! A record waiting for an attempt the current schedule does not have (the schedule was
//! shortened) is due at once: it is dead-lettered without waiting.

use std::time::Duration;

/// Skew between honest clocks tolerated before a due time is capped.
pub(crate) const CLOCK_SLACK_MS: i64 = 5_000;

/// The due time a tier worker uses for one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Due {
    pub(crate) due_ms: i64,
    /// When the recorded due time was beyond the bound: by how much (ms).
    pub(crate) capped_by_ms: Option<i64>,
}

/// What bounds the due times of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DueBound {
    /// Longest honest wait between a record's production and its due time: the tier's offset
    /// minus the previous tier's (the whole offset for an orphan tier, whose place in the
    /// schedule that wrote it is unknown).
    pub(crate) max_delay_ms: i64,
    /// Attempts in the current schedule: a record waiting for a later one is past its end.
    pub(crate) attempts: usize,
}

impl DueBound {
    /// The bound of the tier at `index` in `schedule` (1 = the first tier).
    pub(crate) fn of_tier(schedule: &[Duration], index: usize) -> DueBound {
        let offset = schedule.get(index).copied().unwrap_or_default();
        let previous = index
            .checked_sub(1)
            .and_then(|i| schedule.get(i))
            .copied()
            .unwrap_or_default();
        DueBound {
            max_delay_ms: ms(offset.saturating_sub(previous)),
            attempts: schedule.len(),
        }
    }

    /// The bound of an orphan tier (offset from its name) under the current schedule.
    pub(crate) fn of_orphan(schedule: &[Duration], offset: Duration) -> DueBound {
        DueBound {
            max_delay_ms: ms(offset),
            attempts: schedule.len(),
        }
    }

    /// The due time of a record: `recorded_ms` from its header (`None` if unreadable: due at
    /// once), `attempt` the attempt it waits for, `timestamp_ms` its Kafka timestamp if any,
    /// `received_ms` when this worker read it.
    pub(crate) fn due(
        &self,
        recorded_ms: Option<i64>,
        attempt: Option<u32>,
        timestamp_ms: Option<i64>,
        received_ms: i64,
    ) -> Due {
        let at_once = Due {
            due_ms: 0,
            capped_by_ms: None,
        };
        let Some(recorded_ms) = recorded_ms else {
            return at_once;
        };
        if attempt.is_some_and(|n| n as usize > self.attempts) {
            return at_once;
        }
        let produced_by = timestamp_ms
            .filter(|t| *t > 0)
            .map_or(received_ms, |t| t.min(received_ms));
        let bound = produced_by.saturating_add(self.max_delay_ms);
        if recorded_ms > bound.saturating_add(CLOCK_SLACK_MS) {
            Due {
                due_ms: bound,
                capped_by_ms: Some(recorded_ms - bound),
            }
        } else {
            Due {
                due_ms: recorded_ms,
                capped_by_ms: None,
            }
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Vec<Duration> {
        [0, 60, 300, 1_800]
            .into_iter()
            .map(Duration::from_secs)
            .collect()
    }

    #[test]
    fn a_tier_waits_at_most_its_gap_from_the_previous_tier() {
        let s = schedule();
        assert_eq!(DueBound::of_tier(&s, 1).max_delay_ms, 60_000);
        assert_eq!(DueBound::of_tier(&s, 2).max_delay_ms, 240_000);
        assert_eq!(DueBound::of_tier(&s, 3).max_delay_ms, 1_500_000);
        let orphan = DueBound::of_orphan(&s, Duration::from_secs(120));
        assert_eq!(orphan.max_delay_ms, 120_000);
        assert_eq!(orphan.attempts, 4);
    }

    #[test]
    fn an_honest_due_time_is_kept() {
        let b = DueBound::of_tier(&schedule(), 2);
        // Attempt 2 at +60 s failed after 10 s; due = first + 300 s.
        let first = 1_000_000;
        let produced = first + 70_000;
        let due = b.due(Some(first + 300_000), Some(3), Some(produced), produced + 5);
        assert_eq!(due.due_ms, first + 300_000);
        assert_eq!(due.capped_by_ms, None);
        // Within the slack: kept.
        let due = b.due(Some(produced + 244_000), Some(3), Some(produced), produced);
        assert_eq!(due.capped_by_ms, None);
    }

    #[test]
    fn a_fast_clock_due_time_is_capped_and_the_skew_reported() {
        let b = DueBound::of_tier(&[Duration::ZERO, Duration::from_secs(1)], 1);
        let ts = 5_000_000;
        let due = b.due(Some(ts + 3_600_000), Some(2), Some(ts), ts + 10);
        assert_eq!(due.due_ms, ts + 1_000);
        assert_eq!(due.capped_by_ms, Some(3_599_000));
    }

    #[test]
    fn a_future_timestamp_is_bounded_by_the_receive_time() {
        let b = DueBound::of_tier(&[Duration::ZERO, Duration::from_secs(1)], 1);
        let now = 5_000_000;
        // CreateTime from a clock one hour fast, due computed on it.
        let due = b.due(Some(now + 3_601_000), Some(2), Some(now + 3_600_000), now);
        assert_eq!(due.due_ms, now + 1_000);
        // No timestamp at all.
        let due = b.due(Some(now + 3_601_000), Some(2), None, now);
        assert_eq!(due.due_ms, now + 1_000);
    }

    #[test]
    fn past_the_schedule_or_unreadable_is_due_at_once() {
        let b = DueBound::of_orphan(&schedule(), Duration::from_secs(7_200));
        let now = 5_000_000;
        assert_eq!(b.due(Some(now + 60_000), Some(5), Some(now), now).due_ms, 0);
        assert_eq!(
            b.due(Some(now + 60_000), Some(4), Some(now), now).due_ms,
            now + 60_000
        );
        assert_eq!(b.due(None, None, Some(now), now).due_ms, 0);
    }
}

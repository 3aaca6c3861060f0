//! One tier partition's records between "received from Kafka" and "offset stored": the in-memory
//! queue of records not started yet, the head barrier, the in-flight attempts, and whether the
//! partition should be paused. Pure logic, no Kafka: the tier loop applies the decisions.
//!
//! Records on a tier partition are nearly sorted by due time (they were produced in failure order
//! and due = first attempt + the tier's fixed offset), so the head is a barrier: nothing behind a
//! not-yet-due head is started. Lateness stays within the spread of failure times, and records
//! are started in offset order, which keeps the stored offset a contiguous completed prefix.
//!
//! A paused partition is resumed [`LOOKAHEAD_MS`] before its head is due, so the records behind
//! the head are fetched (and held) by the time it is due: a resumed partition otherwise waits for
//! the consumer's in-flight fetch (up to `fetch.wait.max.ms`) before its records arrive.
//!
//! Why records are kept in memory instead of seeking back: pausing a partition in librdkafka
//! drops its prefetched records and resumes fetching after the last record handed to us. Every
//! record handed to us is therefore kept here until it is started, and none is skipped when the
//! partition resumes. There is no seek, so the pause/seek ordering trap does not apply.

use std::collections::VecDeque;

use hookline_common::kafka::progress::PartitionProgress;

/// How long before the head is due a paused partition is resumed.
pub(crate) const LOOKAHEAD_MS: i64 = 1_000;

/// A received record that has not been started.
#[derive(Debug)]
struct Held<T> {
    offset: i64,
    due_ms: i64,
    item: T,
}

/// Per-partition state of a tier worker.
#[derive(Debug)]
pub(crate) struct PartitionWaiting<T> {
    queue: VecDeque<Held<T>>,
    progress: PartitionProgress,
    /// What the tier loop last told librdkafka.
    paused: bool,
    /// Resume this long before the head is due.
    lookahead_ms: i64,
}

impl<T> PartitionWaiting<T> {
    pub(crate) fn new(lookahead_ms: i64) -> Self {
        PartitionWaiting {
            queue: VecDeque::new(),
            progress: PartitionProgress::default(),
            paused: false,
            lookahead_ms,
        }
    }

    /// A record arrived from Kafka (in offset order).
    pub(crate) fn push(&mut self, offset: i64, due_ms: i64, item: T) {
        self.queue.push_back(Held {
            offset,
            due_ms,
            item,
        });
    }

    /// Takes the due records from the head, in order, while fewer than `cap` are in flight; each
    /// taken record is in flight until [`complete`](Self::complete).
    pub(crate) fn take_due(&mut self, now_ms: i64, cap: usize) -> Vec<(i64, T)> {
        let mut out = Vec::new();
        while self.progress.in_flight() < cap {
            match self.queue.front() {
                Some(head) if head.due_ms <= now_ms => {}
                _ => break,
            }
            if let Some(head) = self.queue.pop_front() {
                self.progress.begin(head.offset);
                out.push((head.offset, head.item));
            }
        }
        out
    }

    /// An in-flight record is done; returns the offset to store when the prefix advanced.
    pub(crate) fn complete(&mut self, offset: i64) -> Option<i64> {
        self.progress.complete(offset)
    }

    /// Due time of the head, if a record is waiting.
    pub(crate) fn head_due(&self) -> Option<i64> {
        self.queue.front().map(|h| h.due_ms)
    }

    /// When this partition next needs the loop: its head's due time, or the moment to resume
    /// ahead of it. `None` when nothing waits, or the head is due but held back by the cap (a
    /// finishing record wakes the loop then).
    pub(crate) fn next_wake(&self, now_ms: i64) -> Option<i64> {
        let due = self.head_due().filter(|due| *due > now_ms)?;
        let resume_at = due - self.lookahead_ms;
        Some(if self.paused && resume_at > now_ms {
            resume_at
        } else {
            due
        })
    }

    /// Whether the partition should be paused now: its head is not due within the lookahead
    /// (barrier), or enough records are held (`cap` to pause, back under `cap / 2` to resume, so
    /// a busy partition does not flap between the two).
    pub(crate) fn wants_pause(&self, now_ms: i64, cap: usize) -> bool {
        if self
            .head_due()
            .is_some_and(|due| due - self.lookahead_ms > now_ms)
        {
            return true;
        }
        let held = self.queue.len() + self.progress.in_flight();
        if self.paused {
            held > cap / 2
        } else {
            held >= cap
        }
    }

    /// `Some(pause?)` when the pause state must change, recording the new state.
    pub(crate) fn pause_change(&mut self, now_ms: i64, cap: usize) -> Option<bool> {
        let want = self.wants_pause(now_ms, cap);
        if want == self.paused {
            return None;
        }
        self.paused = want;
        Some(want)
    }

    /// Forgets the records not started (shutdown): their offsets were never stored, so they are
    /// read again by whoever owns the partition next.
    pub(crate) fn drop_waiting(&mut self) -> usize {
        let n = self.queue.len();
        self.queue.clear();
        n
    }

    pub(crate) fn waiting(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.progress.in_flight()
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    /// Records that librdkafka was told to pause (shutdown pauses every partition).
    pub(crate) fn set_paused(&mut self) {
        self.paused = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(v: &[(i64, &str)]) -> Vec<i64> {
        v.iter().map(|(o, _)| *o).collect()
    }

    #[test]
    fn head_is_a_barrier_for_records_behind_it() {
        let mut w = PartitionWaiting::new(0);
        w.push(10, 1_000, "a");
        w.push(11, 900, "b"); // due earlier, but behind a not-yet-due head
        assert!(w.take_due(950, 8).is_empty());
        assert!(w.wants_pause(950, 8));
        assert_eq!(w.head_due(), Some(1_000));
        assert_eq!(offsets(&w.take_due(1_000, 8)), [10, 11]);
        assert!(!w.wants_pause(1_000, 8));
    }

    #[test]
    fn pauses_at_the_barrier_and_resumes_when_due() {
        let mut w: PartitionWaiting<()> = PartitionWaiting::new(0);
        assert_eq!(w.pause_change(0, 8), None, "empty: keep fetching");
        w.push(1, 500, ());
        assert_eq!(w.pause_change(100, 8), Some(true));
        assert_eq!(w.pause_change(200, 8), None, "already paused");
        assert!(w.take_due(499, 8).is_empty());
        assert_eq!(w.take_due(500, 8).len(), 1);
        assert_eq!(w.pause_change(500, 8), Some(false), "head started: resume");
    }

    #[test]
    fn in_flight_cap_holds_due_records_and_pauses_with_hysteresis() {
        let mut w = PartitionWaiting::new(0);
        for o in 0..10 {
            w.push(o, 0, ());
        }
        assert_eq!(w.take_due(0, 4).len(), 4);
        assert_eq!(w.in_flight(), 4);
        assert_eq!(w.waiting(), 6);
        assert_eq!(w.pause_change(0, 4), Some(true), "10 held >= cap 4");
        for o in 0..4 {
            w.complete(o);
        }
        assert_eq!(w.take_due(0, 4).len(), 4);
        // 2 waiting + 4 in flight = 6 > 4 / 2: stay paused.
        assert_eq!(w.pause_change(0, 4), None);
        for o in 4..7 {
            w.complete(o);
        }
        // 2 waiting + 1 in flight = 3, still above cap / 2.
        assert_eq!(w.pause_change(0, 4), None);
        w.complete(7);
        assert_eq!(
            w.pause_change(0, 4),
            Some(false),
            "2 held = cap / 2: resume"
        );
    }

    #[test]
    fn stored_offset_is_the_contiguous_completed_prefix() {
        let mut w = PartitionWaiting::new(0);
        for o in [5, 6, 8] {
            w.push(o, 0, ());
        }
        assert_eq!(w.take_due(0, 8).len(), 3);
        assert_eq!(w.complete(8), None);
        assert_eq!(w.complete(6), None);
        assert_eq!(w.complete(5), Some(9));
    }

    #[test]
    fn resumes_ahead_of_the_head_but_starts_it_only_when_due() {
        let mut w = PartitionWaiting::new(1_000);
        w.push(1, 10_000, ());
        assert_eq!(w.pause_change(0, 8), Some(true));
        assert_eq!(w.next_wake(0), Some(9_000), "wake to resume ahead");
        assert_eq!(w.pause_change(9_000, 8), Some(false));
        assert_eq!(w.next_wake(9_000), Some(10_000), "then wake when due");
        w.push(2, 10_005, ());
        assert!(w.take_due(9_999, 8).is_empty());
        assert_eq!(
            w.take_due(10_005, 8).len(),
            2,
            "the record behind is already here"
        );
        assert_eq!(w.next_wake(10_005), None);
    }

    #[test]
    fn shutdown_drops_only_records_not_started() {
        let mut w = PartitionWaiting::new(0);
        w.push(1, 0, ());
        w.push(2, i64::MAX, ());
        assert_eq!(w.take_due(0, 8).len(), 1);
        assert_eq!(w.drop_waiting(), 1);
        assert_eq!(w.in_flight(), 1);
        assert_eq!(w.complete(1), Some(2), "offset 2 is never passed");
    }
}

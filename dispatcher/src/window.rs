//! The per-partition window of the dispatcher: how much of a `<p>.dispatch` partition may be in
//! flight before the consumer takes no more of it, and the state machine of the partitions this
//! member owns ([`PartitionWindows`]: begun events, held records, pauses). Pure logic, no Kafka:
//! it says what to store, pause and resume, and `crate::partitions` does it.
//!
//! Two bounds, because they limit different things:
//! - **unfinished events** (`dispatcher.max_in_flight_per_partition`, 256): events with a
//!   delivery still running or being handed off — the work and the memory of payloads in flight.
//!   Events that finished behind an unfinished one do not count, so one stuck event (a delivery
//!   hanging until its timeout) takes one place in the window, not all of them.
//! - **span** ([`SPAN_PER_WINDOW_PLACE`] × that, 65,536 by default): every event from the oldest
//!   unfinished one on, finished or not. The offset stored is the end of the contiguous finished
//!   prefix, so finished events behind a stuck one stay tracked (16 bytes each: at most ~1 MiB
//!   per partition by default) and would be re-sent after a crash. The cap bounds both; a
//!   partition reaching it waits for its oldest event like a full window.
//!
//! A full partition that had to be paused resumes at half of both bounds, so a stuck partition
//! that recovers does not flap (each pause drops librdkafka's prefetched records).
//!
//! A record that arrives for a full partition is *held* (never skipped: nothing of its partition
//! begins before it) and taken again, in order, once there is room — or, if the partition had to
//! be paused, once half its window drained (then it is resumed). Each assignment of a partition
//! has a generation: a completion from an older one (a delivery that outlived a revoke) changes
//! nothing.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use hookline_common::kafka::progress::{PartitionProgress, Progress};

/// A partition that received a record (or was assigned) this recently may have more records
/// queued behind a full partition's batch in librdkafka's single consumer queue.
pub(crate) const RECENTLY_ACTIVE: Duration = Duration::from_secs(2);

/// Span cap as a multiple of the unfinished-events bound. Large enough that a partition flowing
/// at thousands of events/s keeps flowing past an event stuck for a whole 10 s timeout.
pub(crate) const SPAN_PER_WINDOW_PLACE: usize = 256;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    max_unfinished: usize,
    max_span: usize,
}

impl Window {
    /// `max_unfinished` = `dispatcher.max_in_flight_per_partition` (at least 1).
    pub(crate) fn new(max_unfinished: usize) -> Self {
        let max_unfinished = max_unfinished.max(1);
        Window {
            max_unfinished,
            max_span: max_unfinished.saturating_mul(SPAN_PER_WINDOW_PLACE),
        }
    }

    /// Whether one more event may begin.
    pub(crate) fn has_room(&self, progress: Option<&PartitionProgress>) -> bool {
        progress
            .is_none_or(|p| p.unfinished() < self.max_unfinished && p.in_flight() < self.max_span)
    }

    /// Whether a partition paused for being full may resume: half of both bounds drained.
    pub(crate) fn may_resume(&self, progress: Option<&PartitionProgress>) -> bool {
        progress.is_none_or(|p| {
            p.unfinished() <= self.max_unfinished / 2 && p.in_flight() <= self.max_span / 2
        })
    }
}

/// Progress, held records and pause state of the partitions this member owns; `T` is a held
/// record.
#[derive(Debug)]
pub(crate) struct PartitionWindows<T> {
    window: Window,
    progress: Progress,
    owned: HashMap<i32, Owned<T>>,
}

#[derive(Debug)]
struct Owned<T> {
    generation: u64,
    paused: bool,
    /// When it last received a record (or was assigned).
    last_seen: Instant,
    /// The record that found the window full (in practice at most one: a pause drops the
    /// partition's later fetched records), taken before any later record of the partition.
    held: VecDeque<T>,
}

/// Whether an event may begin.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Begun, in this generation of its partition.
    Started(u64),
    /// The window is full (or earlier records are held): hold the record.
    Full,
    NotOwned,
}

/// What a completion changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Completed {
    /// The new end of the contiguous completed prefix: the offset to store.
    pub(crate) store: Option<i64>,
    /// The partition's held record may be taken now.
    pub(crate) ready: bool,
}

impl<T> PartitionWindows<T> {
    /// `max_unfinished` = `dispatcher.max_in_flight_per_partition`.
    pub(crate) fn new(max_unfinished: usize) -> Self {
        PartitionWindows {
            window: Window::new(max_unfinished),
            progress: Progress::default(),
            owned: HashMap::new(),
        }
    }

    /// A partition was assigned in `generation`: nothing begun, nothing held, not paused.
    pub(crate) fn assign(&mut self, partition: i32, generation: u64) {
        self.progress.remove(partition);
        self.owned.insert(
            partition,
            Owned {
                generation,
                paused: false,
                last_seen: Instant::now(),
                held: VecDeque::new(),
            },
        );
    }

    /// Forgets revoked partitions (and their held records); returns how many of their events
    /// were unfinished.
    pub(crate) fn forget(&mut self, ids: &[i32]) -> usize {
        let abandoned = self.unfinished(ids);
        for p in ids {
            self.progress.remove(*p);
            self.owned.remove(p);
        }
        abandoned
    }

    /// Events of these partitions begun and not completed.
    pub(crate) fn unfinished(&self, ids: &[i32]) -> usize {
        ids.iter().map(|p| self.progress.unfinished(*p)).sum()
    }

    /// Starts tracking an event, unless its partition is not ours, or its window is full, or it
    /// holds earlier records (which must begin first: an offset never begun could otherwise be
    /// skipped by the stored prefix).
    pub(crate) fn begin(&mut self, partition: i32, offset: i64) -> Begin {
        let Some(owned) = self.owned.get_mut(&partition) else {
            return Begin::NotOwned;
        };
        owned.last_seen = Instant::now();
        if !owned.held.is_empty() || !self.window.has_room(self.progress.get(partition)) {
            return Begin::Full;
        }
        self.progress.begin(partition, offset);
        Begin::Started(owned.generation)
    }

    /// Keeps a record that found its partition full; returns whether it may be taken at once
    /// (room appeared meanwhile).
    pub(crate) fn hold(&mut self, partition: i32, record: T) -> bool {
        let Some(owned) = self.owned.get_mut(&partition) else {
            return false;
        };
        owned.held.push_back(record);
        ready(&self.window, owned, self.progress.get(partition))
    }

    pub(crate) fn holds(&self, partition: i32) -> bool {
        self.owned
            .get(&partition)
            .is_some_and(|o| !o.held.is_empty())
    }

    /// Takes the held records whose partitions have room again, in offset order; returns them
    /// and the paused partitions to resume.
    pub(crate) fn release_held(&mut self) -> (Vec<T>, Vec<i32>) {
        let (mut out, mut resume) = (Vec::new(), Vec::new());
        for (&p, owned) in self.owned.iter_mut() {
            if !ready(&self.window, owned, self.progress.get(p)) {
                continue;
            }
            if owned.paused {
                owned.paused = false;
                resume.push(p);
            }
            out.extend(owned.held.drain(..));
        }
        (out, resume)
    }

    /// Whether another partition may have records queued behind this full one's: it is not
    /// paused, has room, and was active lately. Then pausing the full one lets them through;
    /// otherwise holding its record for a moment costs nobody anything.
    pub(crate) fn others_may_wait(&self, partition: i32) -> bool {
        self.owned.iter().any(|(&q, o)| {
            q != partition
                && !o.paused
                && o.held.is_empty()
                && self.window.has_room(self.progress.get(q))
                && o.last_seen.elapsed() < RECENTLY_ACTIVE
        })
    }

    /// Marks a full partition paused; `Some(unfinished events)` when it was not paused yet (the
    /// caller pauses it).
    pub(crate) fn pause(&mut self, partition: i32) -> Option<usize> {
        let unfinished = self.progress.unfinished(partition);
        let owned = self.owned.get_mut(&partition)?;
        if owned.paused {
            return None;
        }
        owned.paused = true;
        Some(unfinished)
    }

    /// Marks an event done. Ignored when the partition was revoked since the event began.
    pub(crate) fn complete(&mut self, partition: i32, generation: u64, offset: i64) -> Completed {
        let Some(owned) = self
            .owned
            .get(&partition)
            .filter(|o| o.generation == generation)
        else {
            return Completed::default();
        };
        let store = self.progress.complete(partition, offset);
        Completed {
            store,
            ready: ready(&self.window, owned, self.progress.get(partition)),
        }
    }
}

/// Whether a partition's held record may be taken now: room in the window, or, when paused,
/// half of the window drained.
fn ready<T>(window: &Window, owned: &Owned<T>, progress: Option<&PartitionProgress>) -> bool {
    !owned.held.is_empty()
        && if owned.paused {
            window.may_resume(progress)
        } else {
            window.has_room(progress)
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_event_takes_one_place_not_the_window() {
        let w = Window::new(4);
        let mut p = PartitionProgress::default();
        p.begin(0); // stuck
        for o in 1..100 {
            assert!(w.has_room(Some(&p)), "room for {o}");
            p.begin(o);
            p.complete(o);
        }
        assert_eq!(p.unfinished(), 1);
        for o in 100..103 {
            p.begin(o);
        }
        assert!(!w.has_room(Some(&p)), "4 unfinished: full");
        assert!(!w.may_resume(Some(&p)));
        p.complete(101);
        p.complete(102);
        assert!(w.may_resume(Some(&p)) == (p.in_flight() <= 4 * SPAN_PER_WINDOW_PLACE / 2));
    }

    #[test]
    fn the_span_behind_a_stuck_event_is_capped() {
        let w = Window::new(1);
        let mut p = PartitionProgress::default();
        p.begin(0);
        assert!(!w.has_room(Some(&p)), "one unfinished fills a window of 1");
        let w = Window::new(2);
        let mut o = 1;
        while w.has_room(Some(&p)) {
            p.begin(o);
            p.complete(o);
            o += 1;
        }
        assert_eq!(p.in_flight(), 2 * SPAN_PER_WINDOW_PLACE, "span cap reached");
        assert_eq!(p.unfinished(), 1);
        assert!(!w.may_resume(Some(&p)));
        assert_eq!(p.complete(0), Some(o), "the head frees the whole span");
        assert!(w.has_room(Some(&p)) && w.may_resume(Some(&p)));
        assert!(w.has_room(None));
    }

    fn started(b: Begin) -> u64 {
        match b {
            Begin::Started(generation) => generation,
            other => panic!("expected a start, got {other:?}"),
        }
    }

    fn paused<T>(w: &PartitionWindows<T>, partition: i32) -> bool {
        w.owned.get(&partition).is_some_and(|o| o.paused)
    }

    #[test]
    fn records_of_unowned_partitions_are_not_taken() {
        let mut w: PartitionWindows<i64> = PartitionWindows::new(4);
        assert_eq!(w.begin(0, 10), Begin::NotOwned);
        w.assign(0, 1);
        assert_eq!(started(w.begin(0, 10)), 1);
        assert_eq!(w.unfinished(&[0]), 1);
    }

    #[test]
    fn full_window_holds_the_record_until_there_is_room() {
        let mut w = PartitionWindows::new(2);
        w.assign(0, 1);
        w.assign(1, 2);
        let generation = started(w.begin(0, 0));
        started(w.begin(0, 1));
        assert_eq!(w.begin(0, 2), Begin::Full);
        started(w.begin(1, 0));
        assert!(!w.hold(0, 2), "still full");
        assert!(w.holds(0));
        assert_eq!(
            w.begin(0, 3),
            Begin::Full,
            "nothing overtakes a held record"
        );
        assert!(w.release_held().0.is_empty(), "still full");
        // The head completes: room for the held record, not paused, so no resume needed.
        let done = w.complete(0, generation, 0);
        assert_eq!(
            done,
            Completed {
                store: Some(1),
                ready: true
            }
        );
        assert_eq!(w.release_held(), (vec![2], vec![]));
        assert!(!w.holds(0));
        started(w.begin(0, 2));
    }

    #[test]
    fn paused_partition_resumes_at_half_its_window() {
        let mut w = PartitionWindows::new(4);
        w.assign(0, 7);
        for o in 0..4 {
            started(w.begin(0, o));
        }
        assert_eq!(w.begin(0, 4), Begin::Full);
        w.hold(0, 4);
        assert_eq!(w.pause(0), Some(4), "paused with 4 unfinished");
        assert_eq!(w.pause(0), None, "already paused");
        assert!(paused(&w, 0));
        // Out of order: 3 done while the head (0) still runs: 3 unfinished.
        w.complete(0, 7, 3);
        assert_eq!(w.unfinished(&[0]), 3, "0, 1 and 2 unfinished");
        assert!(
            w.release_held().0.is_empty(),
            "3 > half the window: stays paused"
        );
        assert!(paused(&w, 0));
        // 1 done behind the still running head: only unfinished events count.
        w.complete(0, 7, 1);
        assert_eq!(w.unfinished(&[0]), 2);
        assert_eq!(
            w.release_held(),
            (vec![4], vec![0]),
            "resumed at half the window"
        );
        assert!(!paused(&w, 0));
        assert_eq!(w.progress.in_flight(0), 4, "0..=3 still tracked");
        w.complete(0, 7, 0);
        assert_eq!(
            w.complete(0, 7, 2).store,
            Some(4),
            "the head released the rest"
        );
        assert_eq!(w.progress.in_flight(0), 0);
    }

    #[test]
    fn a_stuck_event_takes_one_place_in_the_window() {
        let mut w: PartitionWindows<i64> = PartitionWindows::new(2);
        w.assign(0, 1);
        started(w.begin(0, 0));
        for o in 1..50 {
            started(w.begin(0, o));
            assert_eq!(w.complete(0, 1, o).store, None, "behind the stuck head");
        }
        assert_eq!(w.unfinished(&[0]), 1);
        started(w.begin(0, 50));
        assert_eq!(w.begin(0, 51), Begin::Full, "two unfinished");
    }

    #[test]
    fn only_an_active_partition_with_room_counts_as_waiting() {
        let mut w = PartitionWindows::new(1);
        w.assign(0, 1);
        assert!(!w.others_may_wait(0), "alone: nobody to let through");
        w.assign(1, 2);
        assert!(w.others_may_wait(0), "1 was just assigned and has room");
        started(w.begin(1, 0));
        assert!(!w.others_may_wait(0), "1 is full");
        assert_eq!(w.begin(1, 1), Begin::Full);
        w.hold(1, 1);
        w.pause(1);
        w.progress.remove(1);
        assert!(!w.others_may_wait(0), "1 is paused");
        w.assign(2, 3);
        let long_ago = Instant::now().checked_sub(RECENTLY_ACTIVE).expect("uptime");
        w.owned.get_mut(&2).expect("owned").last_seen = long_ago;
        assert!(!w.others_may_wait(0), "2 has been idle");
    }

    #[test]
    fn completions_from_before_a_revoke_are_ignored() {
        let mut w = PartitionWindows::new(8);
        w.assign(0, 1);
        started(w.begin(0, 5));
        w.hold(0, 6);
        assert_eq!(w.forget(&[0]), 1, "one event abandoned");
        w.assign(0, 2);
        assert!(!w.holds(0), "held records go with the revoke");
        assert_eq!(started(w.begin(0, 5)), 2);
        assert_eq!(
            w.complete(0, 1, 5),
            Completed::default(),
            "stale: nothing changes"
        );
        assert_eq!(w.unfinished(&[0]), 1);
        assert_eq!(w.complete(0, 2, 5).store, Some(6));
        assert_eq!(w.unfinished(&[0]), 0);
    }

    #[test]
    fn out_of_order_completion_waits_for_the_head() {
        let mut w: PartitionWindows<i64> = PartitionWindows::new(8);
        w.assign(0, 1);
        started(w.begin(0, 1));
        started(w.begin(0, 2));
        assert_eq!(w.complete(0, 1, 2).store, None);
        assert_eq!(w.unfinished(&[0]), 1, "1 unfinished");
        assert_eq!(w.progress.in_flight(0), 2, "2 waits behind 1");
        assert_eq!(w.complete(0, 1, 1).store, Some(3));
        assert_eq!(w.progress.in_flight(0), 0);
    }
}

//! The per-partition window of the dispatcher: how much of a `<p>.dispatch` partition may be in
//! flight before the consumer takes no more of it. Pure rules over [`PartitionProgress`], no
//! Kafka.
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

use hookline_common::progress::PartitionProgress;

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
}

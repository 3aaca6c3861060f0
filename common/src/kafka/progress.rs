//! Out-of-order completion, in-order offsets: per partition, the records taken in flight and the
//! contiguous completed prefix that may be stored as the consumer's position.
//!
//! Offsets are not contiguous in Kafka (transaction markers take offsets), so progress is tracked
//! by the offsets actually received, never by `last + 1` arithmetic.
//!
//! Two sizes matter and are reported separately, because they bound different things:
//! - [`unfinished`](PartitionProgress::unfinished): records begun and not done: the work (and the
//!   memory of their payloads) in flight;
//! - [`in_flight`](PartitionProgress::in_flight) (the span): every record from the oldest
//!   unfinished one on, done or not: what a crash would re-send, and the memory of this
//!   bookkeeping (16 bytes a record). One stuck record pins the span, not the unfinished count.

use std::collections::{HashMap, VecDeque};

/// Records of one partition from the oldest unfinished one on, in offset order.
#[derive(Debug, Default)]
pub struct PartitionProgress {
    /// (offset, done?), ascending offsets: records are begun in the order they were received.
    span: VecDeque<(i64, bool)>,
    /// Entries of `span` not done.
    unfinished: usize,
}

impl PartitionProgress {
    /// Starts tracking `offset`, which must be above every offset begun before (records of a
    /// partition are taken in order); an offset out of order is ignored, never stored past.
    pub fn begin(&mut self, offset: i64) {
        if self.span.back().is_some_and(|(last, _)| *last >= offset) {
            return;
        }
        self.span.push_back((offset, false));
        self.unfinished += 1;
    }

    /// Marks `offset` done. Returns the offset to store (last of the completed prefix + 1) when
    /// the prefix advanced.
    pub fn complete(&mut self, offset: i64) -> Option<i64> {
        if let Ok(i) = self.span.binary_search_by_key(&offset, |(o, _)| *o) {
            if !self.span[i].1 {
                self.span[i].1 = true;
                self.unfinished -= 1;
            }
        }
        let mut next = None;
        while let Some(&(o, true)) = self.span.front() {
            self.span.pop_front();
            next = Some(o + 1);
        }
        next
    }

    /// Records tracked: from the oldest unfinished one on, done or not (the span).
    pub fn in_flight(&self) -> usize {
        self.span.len()
    }

    /// Records begun and not done.
    pub fn unfinished(&self) -> usize {
        self.unfinished
    }

    pub fn is_empty(&self) -> bool {
        self.span.is_empty()
    }
}

/// Progress of every partition of one topic held by a consumer.
#[derive(Debug, Default)]
pub struct Progress {
    parts: HashMap<i32, PartitionProgress>,
}

impl Progress {
    pub fn begin(&mut self, partition: i32, offset: i64) {
        self.parts.entry(partition).or_default().begin(offset);
    }
    pub fn complete(&mut self, partition: i32, offset: i64) -> Option<i64> {
        self.parts.get_mut(&partition)?.complete(offset)
    }
    /// The span of a partition (see [`PartitionProgress::in_flight`]).
    pub fn in_flight(&self, partition: i32) -> usize {
        self.parts.get(&partition).map_or(0, |p| p.in_flight())
    }
    /// Records of a partition begun and not done.
    pub fn unfinished(&self, partition: i32) -> usize {
        self.parts.get(&partition).map_or(0, |p| p.unfinished())
    }
    pub fn get(&self, partition: i32) -> Option<&PartitionProgress> {
        self.parts.get(&partition)
    }
    pub fn total_in_flight(&self) -> usize {
        self.parts.values().map(|p| p.in_flight()).sum()
    }
    /// Forgets a revoked partition (its new owner resumes from the committed offset).
    pub fn remove(&mut self, partition: i32) {
        self.parts.remove(&partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_only_the_contiguous_prefix() {
        let mut p = PartitionProgress::default();
        for o in [10, 11, 13, 14] {
            p.begin(o);
        }
        assert_eq!(p.complete(11), None, "10 still in flight");
        assert_eq!(p.complete(13), None);
        // 12 was never received (a transaction marker): 10, 11, 13 done, 14 still in flight.
        assert_eq!(p.complete(10), Some(14));
        assert_eq!(p.complete(14), Some(15));
        assert!(p.is_empty());
    }

    #[test]
    fn one_stuck_record_pins_the_span_not_the_unfinished_count() {
        let mut p = PartitionProgress::default();
        for o in 0..100 {
            p.begin(o);
        }
        for o in 1..100 {
            assert_eq!(p.complete(o), None, "0 is stuck");
        }
        assert_eq!(p.unfinished(), 1);
        assert_eq!(p.in_flight(), 100);
        // A repeated or unknown completion changes nothing.
        assert_eq!(p.complete(5), None);
        assert_eq!(p.complete(1000), None);
        assert_eq!(p.unfinished(), 1);
        assert_eq!(p.complete(0), Some(100));
        assert_eq!((p.unfinished(), p.in_flight()), (0, 0));
    }

    #[test]
    fn an_offset_begun_out_of_order_is_ignored() {
        let mut p = PartitionProgress::default();
        p.begin(5);
        p.begin(3);
        assert_eq!(p.in_flight(), 1);
        assert_eq!(p.complete(3), None);
        assert_eq!(p.complete(5), Some(6));
    }
}

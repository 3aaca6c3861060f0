//! Out-of-order completion, in-order offsets: per partition, the records taken in flight and the
//! contiguous completed prefix that may be stored as the consumer's position.
//!
//! Offsets are not contiguous in Kafka (transaction markers take offsets), so progress is tracked
//! by the offsets actually received, never by `last + 1` arithmetic.

use std::collections::{BTreeMap, HashMap};

/// In-flight records of one partition.
#[derive(Debug, Default)]
pub struct PartitionProgress {
    /// offset → done?
    inflight: BTreeMap<i64, bool>,
}

impl PartitionProgress {
    pub fn begin(&mut self, offset: i64) {
        self.inflight.insert(offset, false);
    }

    /// Marks `offset` done. Returns the offset to store (last of the completed prefix + 1) when
    /// the prefix advanced.
    pub fn complete(&mut self, offset: i64) -> Option<i64> {
        if let Some(done) = self.inflight.get_mut(&offset) {
            *done = true;
        }
        let mut next = None;
        while let Some((&o, &done)) = self.inflight.first_key_value() {
            if !done {
                break;
            }
            self.inflight.remove(&o);
            next = Some(o + 1);
        }
        next
    }

    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty()
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
    pub fn in_flight(&self, partition: i32) -> usize {
        self.parts.get(&partition).map_or(0, |p| p.in_flight())
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
}

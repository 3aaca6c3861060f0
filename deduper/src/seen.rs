//! The seen-set of one `<p>.dedupe` partition: which dedupe keys were first seen within the
//! window, stored compactly.
//!
//! Each key is a 128-bit hash ([`hookline_common::keyhash::key_hash`]) and a first-seen time in
//! whole seconds. Keys live in *generations*, one per time bucket (`window / 8`, at least 1 s) of
//! first-seen time; a generation is dropped whole once everything in it is older than the window,
//! so expiry is O(1) amortised and never scans keys. Each generation is an open-addressing table
//! of 16-byte slots (linear probing, grown ×2 past 3/4 load): 96 bits of the hash are stored for
//! equality and pick the slot (a false "seen" needs a 96-bit collision), and a
//! `u32` holds the time. That is 21–43 bytes per key depending on fill (≈27 at 10M keys), against
//! 80+ for a Redis `SETNX` key.

use std::collections::VecDeque;

const EMPTY: u32 = 0;
const MIN_CAPACITY: usize = 1024;

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Slot {
    hi: u64,
    mid: u32,
    /// First-seen unix seconds; `EMPTY` (0) marks a free slot.
    t: u32,
}

struct Table {
    slots: Vec<Slot>,
    len: usize,
}

impl Table {
    fn new() -> Self {
        Table {
            slots: vec![Slot::default(); MIN_CAPACITY],
            len: 0,
        }
    }

    fn split(h: u128) -> (usize, u64, u32) {
        let (hi, mid) = ((h >> 64) as u64, (h >> 32) as u32);
        (slot_index(hi, mid), hi, mid)
    }

    /// First-seen time of `h`, if stored.
    fn get(&self, h: u128) -> Option<u32> {
        let (idx, hi, mid) = Self::split(h);
        let mask = self.slots.len() - 1;
        let mut i = idx & mask;
        loop {
            let s = &self.slots[i];
            if s.t == EMPTY {
                return None;
            }
            if s.hi == hi && s.mid == mid {
                return Some(s.t);
            }
            i = (i + 1) & mask;
        }
    }

    /// Stores `h` with time `t` (overwriting the time if present).
    fn put(&mut self, h: u128, t: u32) {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let (idx, hi, mid) = Self::split(h);
        let mask = self.slots.len() - 1;
        let mut i = idx & mask;
        loop {
            let s = &mut self.slots[i];
            if s.t == EMPTY {
                *s = Slot { hi, mid, t };
                self.len += 1;
                return;
            }
            if s.hi == hi && s.mid == mid {
                s.t = s.t.max(t);
                return;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let doubled = vec![Slot::default(); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        let mask = self.slots.len() - 1;
        for s in old.into_iter().filter(|s| s.t != EMPTY) {
            let mut i = slot_index(s.hi, s.mid) & mask;
            loop {
                if self.slots[i].t == EMPTY {
                    self.slots[i] = s;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }

    fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }
}

/// Home slot of an entry, derived only from stored bits so tables can grow. The low bits come
/// from `mid`: `hi` is not uniform within a partition (it chose the partition).
fn slot_index(hi: u64, mid: u32) -> usize {
    (u64::from(mid) | ((hi >> 32) << 32)) as usize
}

struct Generation {
    /// Start of the time bucket (unix seconds) this generation covers.
    start: u32,
    table: Table,
}

/// Seen dedupe keys of one partition within the window.
pub struct SeenSet {
    window: u32,
    bucket: u32,
    /// Oldest first.
    gens: VecDeque<Generation>,
}

impl SeenSet {
    /// A set remembering keys for `window_secs` seconds (at least 1).
    pub fn new(window_secs: u64) -> Self {
        let window = window_secs.clamp(1, u64::from(u32::MAX / 4)) as u32;
        SeenSet {
            window,
            bucket: (window / 8).max(1),
            gens: VecDeque::new(),
        }
    }

    /// True if `h` was first seen within the window before `now` (unix seconds).
    pub fn contains(&self, h: u128, now: u32) -> bool {
        self.gens.iter().rev().any(|g| {
            g.table
                .get(h)
                .is_some_and(|t| now.saturating_sub(t) < self.window)
        })
    }

    /// Records `h` as first seen at `t` (unix seconds). Used for live inserts and restore.
    pub fn insert(&mut self, h: u128, t: u32) {
        let t = t.max(1);
        let start = t - t % self.bucket;
        let pos = self.gens.iter().rposition(|g| g.start == start);
        let gen = match pos {
            Some(i) => &mut self.gens[i],
            None => {
                // Keep generations ordered by start; restore may go slightly back in time.
                let at = self
                    .gens
                    .iter()
                    .position(|g| g.start > start)
                    .unwrap_or(self.gens.len());
                self.gens.insert(
                    at,
                    Generation {
                        start,
                        table: Table::new(),
                    },
                );
                &mut self.gens[at]
            }
        };
        gen.table.put(h, t);
    }

    /// First sighting within the window? Inserts it if so. The hot path of stage B.
    pub fn check_and_insert(&mut self, h: u128, now: u32) -> bool {
        if self.contains(h, now) {
            return false;
        }
        self.insert(h, now);
        true
    }

    /// Drops generations whose every key is older than the window.
    pub fn expire(&mut self, now: u32) {
        while let Some(g) = self.gens.front() {
            if u64::from(g.start) + u64::from(self.bucket) + u64::from(self.window)
                <= u64::from(now)
            {
                self.gens.pop_front();
            } else {
                break;
            }
        }
    }

    /// Number of keys held (including not yet expired stale ones).
    pub fn len(&self) -> usize {
        self.gens.iter().map(|g| g.table.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held by the tables.
    pub fn bytes(&self) -> usize {
        self.gens.iter().map(|g| g.table.bytes()).sum()
    }

    pub fn window_secs(&self) -> u32 {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_common::keyhash::key_hash;

    #[test]
    fn first_sighting_then_duplicate() {
        let mut s = SeenSet::new(86_400);
        let h = key_hash("id:a");
        assert!(s.check_and_insert(h, 1_000_000));
        assert!(!s.check_and_insert(h, 1_000_010));
        assert!(s.check_and_insert(key_hash("id:b"), 1_000_010));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn key_passes_again_after_window() {
        let mut s = SeenSet::new(10);
        let h = key_hash("id:a");
        assert!(s.check_and_insert(h, 100));
        assert!(!s.check_and_insert(h, 109));
        assert!(s.check_and_insert(h, 110), "window elapsed: passes again");
        assert!(!s.check_and_insert(h, 111));
    }

    #[test]
    fn expiry_drops_whole_generations() {
        let mut s = SeenSet::new(80);
        for i in 0..1000u32 {
            s.insert(key_hash(&format!("k{i}")), 1_000 + i / 10);
        }
        assert_eq!(s.len(), 1000);
        s.expire(1_000 + 100 + 80 + 10);
        assert_eq!(s.len(), 0);
        let mut s2 = SeenSet::new(80);
        s2.insert(key_hash("old"), 1_000);
        s2.insert(key_hash("new"), 1_070);
        s2.expire(1_095);
        assert!(!s2.contains(key_hash("old"), 1_095));
        assert!(s2.contains(key_hash("new"), 1_095));
    }

    #[test]
    fn growth_keeps_every_key() {
        let mut s = SeenSet::new(86_400);
        for i in 0..200_000u32 {
            assert!(s.check_and_insert(key_hash(&format!("id:{i}")), 5_000));
        }
        for i in 0..200_000u32 {
            assert!(s.contains(key_hash(&format!("id:{i}")), 5_001), "lost {i}");
        }
        assert!(!s.contains(key_hash("id:nope"), 5_001));
        let per_key = s.bytes() as f64 / s.len() as f64;
        assert!(per_key <= 48.0, "{per_key} bytes/key");
    }
}

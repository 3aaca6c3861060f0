//! The seen-set of one `<p>.dedupe` partition: which dedupe keys were first seen within the
//! window, stored compactly.
//!
//! Each key is a 128-bit hash ([`hookline_common::contract::keyhash::key_hash`]) and a first-seen time in
//! whole seconds, in one open-addressing table of 16-byte slots (linear probing, grown ×2 past 3/4
//! load): 96 bits of the hash are stored for equality and pick the slot (a false "seen" needs a
//! 96-bit collision), a `u32` holds the time. That is 21–43 bytes per key depending on fill
//! (≈27 at 10M keys), against 80+ for a Redis `SETNX` key and ≈55 for a `HashMap<u128, u32>`.
//!
//! Expiry works by time buckets: a lookup ignores entries older than the window, and once per
//! bucket (`window / 8`, at least 1 s) a sweep deletes them in place (backward-shift deletion,
//! no tombstones, no extra memory). Every key is visited by at most ~8 sweeps in its life, so
//! expiry is O(1) amortised per key, and a lookup is a single probe sequence.

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

/// Home slot of an entry, derived only from stored bits so the table can grow. The low bits come
/// from `mid`: `hi` is not uniform within a partition (it chose the partition).
fn slot_index(hi: u64, mid: u32) -> usize {
    (u64::from(mid) | ((hi >> 32) << 32)) as usize
}

fn split(h: u128) -> (u64, u32) {
    ((h >> 64) as u64, (h >> 32) as u32)
}

/// Seen dedupe keys of one partition within the window.
pub struct SeenSet {
    window: u32,
    bucket: u32,
    slots: Vec<Slot>,
    len: usize,
    last_sweep: u32,
}

impl SeenSet {
    /// A set remembering keys for `window_secs` seconds (at least 1).
    pub fn new(window_secs: u64) -> Self {
        let window = window_secs.clamp(1, u64::from(u32::MAX / 4)) as u32;
        SeenSet {
            window,
            bucket: (window / 8).max(1),
            slots: vec![Slot::default(); MIN_CAPACITY],
            len: 0,
            last_sweep: 0,
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Position of `h` in the table, if present.
    fn find(&self, hi: u64, mid: u32) -> Option<usize> {
        let mask = self.mask();
        let mut i = slot_index(hi, mid) & mask;
        loop {
            let s = &self.slots[i];
            if s.t == EMPTY {
                return None;
            }
            if s.hi == hi && s.mid == mid {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// True if `h` was first seen within the window before `now` (unix seconds).
    pub fn contains(&self, h: u128, now: u32) -> bool {
        let (hi, mid) = split(h);
        self.find(hi, mid)
            .is_some_and(|i| now.saturating_sub(self.slots[i].t) < self.window)
    }

    /// Records `h` as first seen at `t` (unix seconds); a later time replaces an earlier one.
    /// Used for live inserts and restore.
    pub fn insert(&mut self, h: u128, t: u32) {
        let t = t.max(1);
        let (hi, mid) = split(h);
        if let Some(i) = self.find(hi, mid) {
            let s = &mut self.slots[i];
            s.t = s.t.max(t);
            return;
        }
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.mask();
        let mut i = slot_index(hi, mid) & mask;
        while self.slots[i].t != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = Slot { hi, mid, t };
        self.len += 1;
    }

    /// First sighting within the window? Records it if so. The hot path of stage B.
    pub fn check_and_insert(&mut self, h: u128, now: u32) -> bool {
        if self.contains(h, now) {
            return false;
        }
        self.insert(h, now);
        true
    }

    fn grow(&mut self) {
        let doubled = vec![Slot::default(); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        let mask = self.mask();
        for s in old.into_iter().filter(|s| s.t != EMPTY) {
            let mut i = slot_index(s.hi, s.mid) & mask;
            while self.slots[i].t != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = s;
        }
    }

    /// Deletes entries older than the window, at most once per time bucket.
    pub fn expire(&mut self, now: u32) {
        if now < self.last_sweep.saturating_add(self.bucket) {
            return;
        }
        self.last_sweep = now;
        let mut i = 0;
        while i < self.slots.len() {
            let s = self.slots[i];
            if s.t != EMPTY && now.saturating_sub(s.t) >= self.window {
                // The shift may move another entry into `i`: look at it again.
                self.delete_at(i);
            } else {
                i += 1;
            }
        }
    }

    /// Backward-shift deletion: keeps every probe sequence unbroken without tombstones.
    fn delete_at(&mut self, i: usize) {
        let mask = self.mask();
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while self.slots[j].t != EMPTY {
            let home = slot_index(self.slots[j].hi, self.slots[j].mid) & mask;
            // The entry at j may fill the hole if the hole lies on its probe path (home..=j).
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.slots[hole] = Slot::default();
        self.len -= 1;
    }

    /// Number of keys held (including stale ones not swept yet).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes held by the table.
    pub fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }

    pub fn window_secs(&self) -> u32 {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_common::contract::keyhash::key_hash;

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
    fn expiry_sweeps_old_keys() {
        let mut s = SeenSet::new(80);
        for i in 0..1000u32 {
            s.insert(key_hash(&format!("k{i}")), 1_000 + i / 10);
        }
        assert_eq!(s.len(), 1000);
        s.expire(1_000 + 100 + 80);
        assert_eq!(s.len(), 0);
        let mut s2 = SeenSet::new(80);
        s2.insert(key_hash("old"), 1_000);
        s2.insert(key_hash("new"), 1_070);
        s2.expire(1_095);
        assert!(!s2.contains(key_hash("old"), 1_095));
        assert!(s2.contains(key_hash("new"), 1_095));
    }

    #[test]
    fn sweep_keeps_probe_chains_intact() {
        // Many keys, half expired: after the sweep every fresh key is still found.
        let mut s = SeenSet::new(100);
        for i in 0..50_000u32 {
            s.insert(
                key_hash(&format!("k{i}")),
                if i % 2 == 0 { 1_000 } else { 1_090 },
            );
        }
        s.expire(1_100);
        assert_eq!(s.len(), 25_000);
        for i in 0..50_000u32 {
            assert_eq!(
                s.contains(key_hash(&format!("k{i}")), 1_100),
                i % 2 == 1,
                "key {i}"
            );
        }
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

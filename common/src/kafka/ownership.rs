//! Ownership of the partitions a consumer was assigned, as seen by the work still running for
//! them: a hand-off or dead letter written by work whose partition was revoked would fork the
//! delivery's retry chain (the new owner re-reads the record and writes its own), so every such
//! write is *enqueued through the gate* of its partition.
//!
//! Per partition, an assignment gets a new **generation**. Work started under a generation may
//! enqueue a write ([`Ownership::enqueue`]) only while its partition is owned in that generation
//! and its gate is open; the check and the enqueue (a non-blocking hand-over to the producer's
//! queue) happen under one lock, and every enqueued write is counted until it is acknowledged
//! ([`Ownership::acked`]). A revoke [closes](Ownership::close) the gate under the same lock,
//! then [waits](Ownership::wait_acked) for the writes already enqueued before offsets are stored
//! and committed. After a revoke returns, no write of the old owner can appear, and every write
//! it had acknowledged is covered by the offsets it committed — provided its work was finished or
//! handed off before the gate closed (the stages wait for it, then cut attempts short, see the
//! docs/delivery.md).
//!
//! Each partition also has a **cut** signal: set at a revoke (or shutdown) so attempts still
//! running end at once as `timeout` and hand off while the gate is still open.
//!
//! `S` is per-partition state a stage keeps under the same lock (the retry tiers keep their
//! completion progress here, so a revoke callback can store it; the dispatcher keeps nothing).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::DeliveryFuture;
use tokio::sync::watch;

use crate::kafka::produce::WriteGate;

/// A write's claim on its partition: the gate of `partition` in the generation the work was read
/// in. Writes made through it ([`crate::kafka::produce::send_acked_through`]) happen only while the
/// partition is still owned in that generation.
pub struct Claim<'a, S> {
    pub ownership: &'a Ownership<S>,
    pub partition: i32,
    pub generation: u64,
}

impl<S: Default + Send> WriteGate for Claim<'_, S> {
    fn enqueue(
        &self,
        send: &mut dyn FnMut() -> Result<DeliveryFuture, KafkaError>,
    ) -> Option<Result<DeliveryFuture, KafkaError>> {
        self.ownership
            .enqueue(self.partition, self.generation, send)
    }
    fn acked(&self) {
        self.ownership.acked(self.partition, self.generation);
    }
}

/// The gate and state of every partition a consumer owns.
pub struct Ownership<S> {
    state: Mutex<State<S>>,
    /// Notified on every acknowledgement and every [`Ownership::notify`].
    changed: Condvar,
}

struct State<S> {
    parts: HashMap<i32, Owned<S>>,
    next_generation: u64,
}

struct Owned<S> {
    generation: u64,
    open: bool,
    /// Writes enqueued and not acknowledged (or failed) yet.
    unacked: usize,
    cut: watch::Sender<bool>,
    stage: S,
}

impl<S: Default> Default for Ownership<S> {
    fn default() -> Self {
        Ownership {
            state: Mutex::new(State {
                parts: HashMap::new(),
                next_generation: 0,
            }),
            changed: Condvar::new(),
        }
    }
}

impl<S: Default> Ownership<S> {
    fn lock(&self) -> MutexGuard<'_, State<S>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A partition was assigned: a new generation, an open gate, fresh state. Returns the
    /// generation.
    pub fn assign(&self, partition: i32) -> u64 {
        let mut st = self.lock();
        st.next_generation += 1;
        let generation = st.next_generation;
        st.parts.insert(
            partition,
            Owned {
                generation,
                open: true,
                unacked: 0,
                cut: watch::channel(false).0,
                stage: S::default(),
            },
        );
        generation
    }

    /// The current generation of an owned partition.
    pub fn generation(&self, partition: i32) -> Option<u64> {
        self.lock().parts.get(&partition).map(|o| o.generation)
    }

    /// The cut signal of a partition's current generation, for an attempt about to start.
    pub fn cutoff(&self, partition: i32, generation: u64) -> Option<watch::Receiver<bool>> {
        let st = self.lock();
        let owned = st.parts.get(&partition)?;
        (owned.generation == generation).then(|| owned.cut.subscribe())
    }

    /// Runs `f` on the partition's state when it is owned in `generation` (open or not).
    pub fn with<T>(
        &self,
        partition: i32,
        generation: u64,
        f: impl FnOnce(&mut S) -> T,
    ) -> Option<T> {
        let mut st = self.lock();
        let owned = st.parts.get_mut(&partition)?;
        (owned.generation == generation).then(|| f(&mut owned.stage))
    }

    /// Runs `f` on every owned partition's state.
    pub fn for_each(&self, mut f: impl FnMut(i32, u64, &mut S)) {
        let mut st = self.lock();
        for (&p, owned) in st.parts.iter_mut() {
            f(p, owned.generation, &mut owned.stage);
        }
    }

    /// Enqueues a write (`enqueue` must only hand it to the producer's queue, not wait for the
    /// acknowledgement) when the partition is owned in `generation` and its gate is open, and
    /// counts it until [`Ownership::acked`]. `None`: the partition was revoked since the work
    /// began; the write must not happen.
    pub fn enqueue<T>(
        &self,
        partition: i32,
        generation: u64,
        enqueue: impl FnOnce() -> T,
    ) -> Option<T> {
        let mut st = self.lock();
        let owned = st.parts.get_mut(&partition)?;
        if owned.generation != generation || !owned.open {
            return None;
        }
        owned.unacked += 1;
        Some(enqueue())
    }

    /// A write enqueued under `generation` was acknowledged, or failed.
    pub fn acked(&self, partition: i32, generation: u64) {
        let mut st = self.lock();
        if let Some(owned) = st.parts.get_mut(&partition) {
            if owned.generation == generation {
                owned.unacked = owned.unacked.saturating_sub(1);
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Wakes [`Ownership::wait_until`] callers (some state `S` changed).
    pub fn notify(&self) {
        self.changed.notify_all();
    }

    /// Sets the cut signal of these partitions: attempts running for them end at once.
    pub fn cut(&self, ids: &[i32]) {
        let st = self.lock();
        for p in ids {
            if let Some(owned) = st.parts.get(p) {
                owned.cut.send_replace(true);
            }
        }
    }

    /// Sets the cut signal of every partition (shutdown).
    pub fn cut_all(&self) {
        let st = self.lock();
        for owned in st.parts.values() {
            owned.cut.send_replace(true);
        }
    }

    /// Closes the gate of these partitions: no write of their current generation is enqueued
    /// from now on.
    pub fn close(&self, ids: &[i32]) {
        let mut st = self.lock();
        for p in ids {
            if let Some(owned) = st.parts.get_mut(p) {
                owned.open = false;
            }
        }
    }

    /// Waits up to `limit` until `done(partition, state)` holds for every one of `ids` that is
    /// still owned; returns whether it does.
    pub fn wait_until(&self, ids: &[i32], limit: Duration, done: impl Fn(&S) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut st = self.lock();
        loop {
            let all = ids
                .iter()
                .all(|p| st.parts.get(p).is_none_or(|o| done(&o.stage)));
            let now = Instant::now();
            if all || now >= deadline {
                return all;
            }
            st = match self.changed.wait_timeout(st, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Waits up to `limit` for the writes enqueued for these partitions to be acknowledged;
    /// returns how many are still unacknowledged.
    pub fn wait_acked(&self, ids: &[i32], limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut st = self.lock();
        loop {
            let unacked: usize = ids
                .iter()
                .filter_map(|p| st.parts.get(p))
                .map(|o| o.unacked)
                .sum();
            let now = Instant::now();
            if unacked == 0 || now >= deadline {
                return unacked;
            }
            st = match self.changed.wait_timeout(st, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Forgets revoked partitions; returns their state.
    pub fn remove(&self, ids: &[i32]) -> Vec<(i32, S)> {
        let mut st = self.lock();
        ids.iter()
            .filter_map(|p| st.parts.remove(p).map(|o| (*p, o.stage)))
            .collect()
    }
}

/// Whether this thread may block in a rebalance callback (to wait for work of the revoked
/// partitions): a multi-thread runtime's worker (via `tokio::task::block_in_place`) or a thread
/// outside any runtime. A current-thread runtime would stall the very work being waited for.
pub fn can_block_here() -> bool {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_closed_gate_refuses_writes_and_a_new_generation_ignores_old_work() {
        let o: Ownership<()> = Ownership::default();
        let g1 = o.assign(0);
        assert_eq!(o.enqueue(0, g1, || 1), Some(1));
        assert_eq!(o.enqueue(1, g1, || 1), None, "not owned");
        o.close(&[0]);
        assert_eq!(o.enqueue(0, g1, || 2), None, "closed");
        o.remove(&[0]);
        let g2 = o.assign(0);
        assert_ne!(g1, g2);
        assert_eq!(o.enqueue(0, g1, || 3), None, "older generation");
        assert_eq!(o.enqueue(0, g2, || 4), Some(4));
        o.acked(0, g1);
        assert_eq!(
            o.wait_acked(&[0], Duration::ZERO),
            1,
            "an old ack does not count"
        );
        o.acked(0, g2);
        assert_eq!(o.wait_acked(&[0], Duration::ZERO), 0);
    }

    #[test]
    fn a_revoke_waits_for_enqueued_writes_to_be_acknowledged() {
        let o: Arc<Ownership<()>> = Arc::new(Ownership::default());
        let g = o.assign(3);
        o.enqueue(3, g, || ()).expect("open");
        let acker = {
            let o = o.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                o.acked(3, g);
            })
        };
        o.close(&[3]);
        assert_eq!(o.wait_acked(&[3], Duration::from_secs(10)), 0);
        acker.join().expect("acker");
        assert!(o.enqueue(3, g, || ()).is_none(), "closed");
        assert_eq!(o.wait_acked(&[3], Duration::from_millis(50)), 0);
    }

    #[test]
    fn cut_signals_the_current_generation() {
        let o: Ownership<u32> = Ownership::default();
        let g = o.assign(0);
        let rx = o.cutoff(0, g).expect("owned");
        assert!(!*rx.borrow());
        o.cut(&[0]);
        assert!(*rx.borrow());
        assert!(o.cutoff(0, g + 1).is_none());
        assert_eq!(
            o.with(0, g, |s| {
                *s += 1;
                *s
            }),
            Some(1)
        );
        assert!(o.wait_until(&[0], Duration::ZERO, |s| *s == 1));
    }
}

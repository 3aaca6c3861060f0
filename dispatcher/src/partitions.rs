//! The `<p>.dispatch` partitions this member owns, shared by the consumer loop (begins events,
//! holds, pauses, resumes), the delivery tasks (complete events and store offsets) and the
//! rebalance callbacks (revoke waits): the pure [`PartitionWindows`] under a lock, its decisions
//! applied to the consumer here (store offsets, pause, resume).
//!
//! Each assignment of a partition has a generation ([`Ownership`]); a completion from an older
//! one (a delivery that outlived a revoke) is ignored, so it can never store an offset for the
//! new owner's turn, and its hand-off is refused by the ownership gate.

use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::message::OwnedMessage;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, warn};

use hookline_common::kafka::ownership::Ownership;
#[cfg(test)]
use hookline_common::kafka::rebalance::{self, Revoked, Waits};

use crate::window::{Begin, PartitionWindows};

pub(crate) struct Partitions {
    pub(crate) topic: String,
    /// Generations, hand-off gates and cut signals of the owned partitions.
    pub(crate) ownership: Ownership<()>,
    windows: Mutex<PartitionWindows<OwnedMessage>>,
    /// Notified on every completion, so a revoke can wait for its partitions to drain.
    changed: Condvar,
    /// Notified when a partition holding a record has room for it again.
    pub(crate) room: tokio::sync::Notify,
    /// Set once the delivery tasks are gone (closing): a revoke has nothing left to wait for.
    pub(crate) closing: AtomicBool,
}

impl Partitions {
    /// `window` = `dispatcher.max_in_flight_per_partition`.
    pub(crate) fn new(topic: String, window: usize) -> Self {
        Partitions {
            topic,
            ownership: Ownership::default(),
            windows: Mutex::new(PartitionWindows::new(window)),
            changed: Condvar::new(),
            room: tokio::sync::Notify::new(),
            closing: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PartitionWindows<OwnedMessage>> {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Assigned partitions, in the generations the rebalance callback gave them.
    pub(crate) fn assign(&self, assigned: &[(i32, u64)]) {
        let mut windows = self.lock();
        for &(partition, generation) in assigned {
            windows.assign(partition, generation);
        }
    }

    /// Forgets revoked partitions and their held records; returns their unfinished events.
    pub(crate) fn forget(&self, ids: &[i32]) -> usize {
        self.lock().forget(ids)
    }

    /// Events of these partitions begun and not completed.
    pub(crate) fn unfinished(&self, ids: &[i32]) -> usize {
        self.lock().unfinished(ids)
    }

    pub(crate) fn begin(&self, partition: i32, offset: i64) -> Begin {
        self.lock().begin(partition, offset)
    }

    /// Keeps a record that found its partition full, to be taken when there is room.
    pub(crate) fn hold(&self, partition: i32, record: OwnedMessage) {
        if self.lock().hold(partition, record) {
            // Room appeared between `begin` and now: make sure the loop looks again.
            self.room.notify_one();
        }
    }

    pub(crate) fn holds(&self, partition: i32) -> bool {
        self.lock().holds(partition)
    }

    /// Takes the held records whose partitions have room again, in offset order, resuming the
    /// paused partitions.
    pub(crate) fn release_held<C: ConsumerContext, K: Consumer<C>>(
        &self,
        consumer: &K,
    ) -> Vec<OwnedMessage> {
        let (records, resume) = self.lock().release_held();
        for partition in resume {
            self.set_paused(consumer, partition, false);
        }
        records
    }

    pub(crate) fn others_may_wait(&self, partition: i32) -> bool {
        self.lock().others_may_wait(partition)
    }

    /// Pauses a full partition: the others are read again meanwhile.
    pub(crate) fn pause<C: ConsumerContext, K: Consumer<C>>(&self, consumer: &K, partition: i32) {
        let mut windows = self.lock();
        if let Some(unfinished) = windows.pause(partition) {
            // Under the lock, so a resume of the partition cannot overtake the pause.
            self.set_paused(consumer, partition, true);
            debug!(partition, unfinished, "partition window full, paused");
        }
    }

    /// Marks an event done and stores the new prefix end. Ignored when the partition was
    /// revoked since the event began.
    pub(crate) fn complete<C: ConsumerContext, K: Consumer<C>>(
        &self,
        consumer: &K,
        partition: i32,
        generation: u64,
        offset: i64,
    ) {
        let mut windows = self.lock();
        let done = windows.complete(partition, generation, offset);
        if let Some(next) = done.store {
            // Under the lock, so stores of one partition never go backwards.
            self.store(consumer, partition, next);
        }
        drop(windows);
        self.changed.notify_all();
        if done.ready {
            self.room.notify_one();
        }
    }

    /// The bounded revoke protocol ([`rebalance::revoke`]) for these partitions, waiting for
    /// their unfinished events (what the revoke callback runs, off the runtime); their window
    /// state stays until the loop forgets it.
    #[cfg(test)]
    pub(crate) fn revoke(&self, ids: &[i32], waits: Option<Waits>) -> Revoked<()> {
        rebalance::revoke(&self.ownership, ids, waits, |ids, limit| {
            self.wait_unfinished(ids, limit)
        })
    }

    /// Waits up to `limit` until these partitions have no unfinished event; returns whether so.
    pub(crate) fn wait_unfinished(&self, ids: &[i32], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut windows = self.lock();
        loop {
            let now = Instant::now();
            if windows.unfinished(ids) == 0 {
                return true;
            }
            if now >= deadline {
                return false;
            }
            windows = match self.changed.wait_timeout(windows, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    fn store<C: ConsumerContext, K: Consumer<C>>(&self, consumer: &K, partition: i32, next: i64) {
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl.add_partition_offset(&self.topic, partition, Offset::Offset(next)) {
            warn!(partition, error = %e, "cannot build an offset list");
            return;
        }
        if let Err(e) = consumer.store_offsets(&tpl) {
            // ERR__STATE: the partition is being revoked; its new owner reads from the commit.
            debug!(partition, offset = next, error = %e, "offset not stored");
        }
    }

    fn set_paused<C: ConsumerContext, K: Consumer<C>>(
        &self,
        consumer: &K,
        partition: i32,
        pause: bool,
    ) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        let result = if pause {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        if let Err(e) = result {
            warn!(partition, pause, error = %e, "cannot pause/resume a partition");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, DefaultConsumerContext};

    /// A consumer that never talks to a broker (no group): store calls fail and are logged,
    /// which is enough to exercise the bookkeeping.
    fn consumer() -> BaseConsumer<DefaultConsumerContext> {
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create()
            .expect("consumer")
    }

    fn waits(drain: Duration) -> Option<Waits> {
        Some(Waits {
            drain,
            after_cut: drain,
            acks: Duration::from_secs(10),
        })
    }

    fn assigned(p: &Partitions, partition: i32) -> u64 {
        let generation = p.ownership.assign(partition);
        p.assign(&[(partition, generation)]);
        generation
    }

    fn started(b: Begin) -> u64 {
        match b {
            Begin::Started(generation) => generation,
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[test]
    fn a_revoked_partition_hands_off_nothing_and_waits_for_enqueued_hand_offs() {
        let p = Arc::new(Partitions::new("t".into(), 8));
        assigned(&p, 0);
        let generation = started(p.begin(0, 1));
        let cutoff = p.ownership.cutoff(0, generation).expect("owned");
        // A hand-off enqueued before the revoke, acknowledged 100 ms into it.
        assert_eq!(p.ownership.enqueue(0, generation, || ()), Some(()));
        let acker = {
            let p = p.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                p.ownership.acked(0, generation);
            })
        };
        let revoked = p.revoke(&[0], waits(Duration::from_millis(50)));
        acker.join().expect("acker");
        assert_eq!(revoked.unacked, 0, "the enqueued hand-off was waited for");
        assert!(
            revoked.cut && *cutoff.borrow(),
            "the running attempt was cut short"
        );
        assert_eq!(
            p.ownership.enqueue(0, generation, || ()),
            None,
            "no hand-off after"
        );
        assigned(&p, 0);
        assert_eq!(
            p.ownership.enqueue(0, generation, || ()),
            None,
            "nor under a new owner"
        );
    }

    #[test]
    fn revoke_waits_for_in_flight_events_up_to_its_bound() {
        let p = Arc::new(Partitions::new("t".into(), 8));
        let c = Arc::new(consumer());
        let generation = assigned(&p, 0);
        started(p.begin(0, 1));
        let finisher = {
            let (p, c) = (p.clone(), c.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                p.complete(&*c, 0, generation, 1);
            })
        };
        let start = Instant::now();
        let revoked = p.revoke(&[0], waits(Duration::from_secs(10)));
        assert!(revoked.drained && !revoked.cut, "drained");
        assert!(start.elapsed() < Duration::from_secs(5));
        finisher.join().expect("finisher");
        assert_eq!(p.forget(&[0]), 0);

        assigned(&p, 0);
        started(p.begin(0, 2));
        let start = Instant::now();
        let revoked = p.revoke(&[0], waits(Duration::from_millis(200)));
        assert!(!revoked.drained && revoked.cut, "cut short, then gave up");
        assert_eq!(p.forget(&[0]), 1, "one event abandoned");
        assert!(
            start.elapsed() >= Duration::from_millis(400),
            "waited, then waited after the cut"
        );
    }

    #[test]
    fn a_completion_that_frees_room_for_a_held_record_wakes_the_loop() {
        let p = Partitions::new("t".into(), 1);
        let c = consumer();
        let generation = assigned(&p, 0);
        started(p.begin(0, 0));
        assert_eq!(p.begin(0, 1), Begin::Full);
        p.hold(
            0,
            OwnedMessage::new(
                None,
                None,
                "t".into(),
                rdkafka::Timestamp::NotAvailable,
                0,
                1,
                None,
            ),
        );
        p.complete(&c, 0, generation, 0);
        let notified = p.room.notified();
        tokio::pin!(notified);
        assert!(
            futures_ready(notified.as_mut()),
            "the room notification is pending"
        );
        assert_eq!(p.release_held(&c).len(), 1);
        assert!(!p.holds(0));
    }

    /// Whether a future is ready at its first poll.
    fn futures_ready<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.poll(&mut cx).is_ready()
    }
}

//! Rebalances, handled one way by every consumer stage that hands work off (the dispatcher, the
//! retry tiers): librdkafka's callbacks run inside the loop's `recv()` and
//! 1. on **assign**: give each new partition a generation ([`Ownership::assign`]), resume it
//!    (pause state survives a rebalance in librdkafka), and post [`Rebalanced::Assigned`] for
//!    the loop;
//! 2. on **revoke**: run the bounded revoke protocol ([`revoke`]: wait for the partitions' work,
//!    cut what still runs, close the gates, wait for the enqueued writes), store and commit
//!    (unless the assignment was lost), and post [`Rebalanced::Revoked`];
//! 3. the loop applies the posted changes to its own per-partition state right after `recv()`
//!    returns, before it acts on anything ([`Inbox::take`]).
//!
//! So the generation, the gates and the commit change inside the callback (they must, before
//! librdkafka hands the partition on), and everything else changes in the loop, in order.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::TopicPartitionList;
use tokio::sync::Notify;

use crate::kafka::ownership::{can_block_here, Ownership};

/// An assignment change seen by a callback, for the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebalanced {
    /// Newly assigned partitions and their generations.
    Assigned(Vec<(i32, u64)>),
    Revoked(Vec<i32>),
}

/// Where the callbacks post [`Rebalanced`] changes and the loop takes them.
#[derive(Debug, Default)]
pub struct Inbox {
    changes: Mutex<Vec<Rebalanced>>,
    posted: Notify,
}

impl Inbox {
    /// Posts a change (from a callback) and wakes the loop.
    pub fn post(&self, change: Rebalanced) {
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(change);
        self.posted.notify_one();
    }

    /// The changes posted since the last call, in order.
    pub fn take(&self) -> Vec<Rebalanced> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Resolves when a change was posted (the callback itself does not end `recv()`).
    pub async fn posted(&self) {
        self.posted.notified().await;
    }
}

/// How long a revoke waits, at most, at each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// For the partitions' work to finish or hand off.
    pub drain: Duration,
    /// After cutting the attempts still running short, for their hand-offs.
    pub after_cut: Duration,
    /// After closing the gates, for the enqueued writes to be acknowledged.
    pub acks: Duration,
}

/// What a revoke left behind.
#[derive(Debug)]
pub struct Revoked<S> {
    /// The assignment was lost (someone else owns it already): nothing waited for or committed.
    pub lost: bool,
    /// Whether the work finished (or handed off) within the waits.
    pub drained: bool,
    /// Whether attempts had to be cut short.
    pub cut: bool,
    /// Writes enqueued but not acknowledged when the wait ended.
    pub unacked: usize,
    /// The revoked partitions' ownership state.
    pub states: Vec<(i32, S)>,
}

/// The bounded revoke protocol, so that no write of the partitions' work appears afterwards and
/// every acknowledged one is covered by the offsets committed next:
/// 1. waits up to `waits.drain` until `wait_idle` says the work of `ids` is done;
/// 2. else cuts the attempts still running short (handed off as `timeout`) and waits up to
///    `waits.after_cut` again;
/// 3. closes the gates: from now on their work writes nothing;
/// 4. waits up to `waits.acks` for the writes already enqueued;
/// 5. forgets the partitions' ownership.
///
/// With `waits` `None` (a lost assignment, a closing stage, a thread that may not block) the
/// gates close at once and nothing is waited for. `wait_idle(ids, limit)` waits up to `limit`
/// and returns whether the work is done.
pub fn revoke<S: Default>(
    ownership: &Ownership<S>,
    ids: &[i32],
    waits: Option<Waits>,
    mut wait_idle: impl FnMut(&[i32], Duration) -> bool,
) -> Revoked<S> {
    let (mut drained, mut cut, mut unacked) = (false, false, 0);
    match waits {
        None => ownership.close(ids),
        Some(waits) => {
            drained = wait_idle(ids, waits.drain);
            if !drained {
                cut = true;
                ownership.cut(ids);
                drained = wait_idle(ids, waits.after_cut);
            }
            ownership.close(ids);
            unacked = ownership.wait_acked(ids, waits.acks);
        }
    }
    Revoked {
        lost: false,
        drained,
        cut,
        unacked,
        states: ownership.remove(ids),
    }
}

/// The revoke callback's part every stage shares: [`revoke`] with `waits`, unless the assignment
/// was lost, the stage is `closing` (its work is gone) or this thread may not block; the waits
/// run off the async runtime's worker slot (`block_in_place`).
pub fn on_revoke<S: Default, C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    ownership: &Ownership<S>,
    ids: &[i32],
    waits: Waits,
    closing: bool,
    wait_idle: impl FnMut(&[i32], Duration) -> bool,
) -> Revoked<S> {
    let lost = consumer.assignment_lost();
    let mut revoked = if lost || closing || !can_block_here() {
        revoke(ownership, ids, None, wait_idle)
    } else {
        tokio::task::block_in_place(|| revoke(ownership, ids, Some(waits), wait_idle))
    };
    revoked.lost = lost;
    revoked
}

/// Gives each newly assigned partition of `ids` that is not owned yet a generation (an
/// incremental assign lists new partitions only; one listed again keeps its generation and its
/// work).
pub fn assign<S: Default>(ownership: &Ownership<S>, ids: &[i32]) -> Vec<(i32, u64)> {
    ids.iter()
        .filter(|p| ownership.generation(**p).is_none())
        .map(|&p| (p, ownership.assign(p)))
        .collect()
}

/// The partitions of `topic` in a rebalance list.
pub fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements_for_topic(topic)
        .iter()
        .map(|e| e.partition())
        .collect()
}

/// A synchronous commit of the stored offsets; "nothing to commit" is not an error.
pub fn commit<C: ConsumerContext, K: Consumer<C>>(consumer: &K) -> Result<(), KafkaError> {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Assigns `partition` of `topic` to this group member again, starting at `offset`, and resumes
/// it: for a partition librdkafka never started fetching. Outside a rebalance callback the
/// incremental (un)assign is local to this consumer (the group's assignment does not change and
/// no callback runs); an assignment with an explicit offset needs no `OffsetFetch`, so the
/// fetcher starts at once. Seen once in the network fault test: after a session timeout and a
/// rejoin over a slow network, librdkafka kept one partition's committed-offset query pending
/// for good (no error, no retry) while the others started.
pub fn reassign_at<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    offset: rdkafka::Offset,
) -> Result<(), KafkaError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    consumer.incremental_unassign(&tpl)?;
    let mut at = TopicPartitionList::new();
    at.add_partition_offset(topic, partition, offset)?;
    consumer.incremental_assign(&at)?;
    consumer.resume(&tpl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoke_waits_cuts_closes_and_forgets() {
        let ownership: Ownership<u32> = Ownership::default();
        let generation = ownership.assign(0);
        let cutoff = ownership.cutoff(0, generation).expect("owned");
        let mut waited = Vec::new();
        let waits = Waits {
            drain: Duration::from_millis(5),
            after_cut: Duration::from_millis(7),
            acks: Duration::from_millis(1),
        };
        let revoked = revoke(&ownership, &[0], Some(waits), |_, limit| {
            waited.push(limit);
            false
        });
        assert_eq!(
            waited,
            [Duration::from_millis(5), Duration::from_millis(7)],
            "drain, then again after the cut"
        );
        assert!(revoked.cut && !revoked.drained && *cutoff.borrow());
        assert_eq!(revoked.states.len(), 1);
        assert_eq!(ownership.enqueue(0, generation, || ()), None, "gate closed");
        assert_eq!(ownership.generation(0), None, "forgotten");
    }

    #[test]
    fn without_waits_the_gates_close_at_once() {
        let ownership: Ownership<()> = Ownership::default();
        let generation = ownership.assign(3);
        let revoked = revoke(&ownership, &[3], None, |_, _| panic!("no wait"));
        assert!(!revoked.cut);
        assert_eq!(ownership.enqueue(3, generation, || ()), None);
    }

    #[test]
    fn an_owned_partition_listed_again_keeps_its_generation() {
        let ownership: Ownership<()> = Ownership::default();
        let first = assign(&ownership, &[0, 1]);
        assert_eq!(first.len(), 2);
        let again = assign(&ownership, &[1, 2]);
        assert_eq!(again.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [2]);
        assert_eq!(ownership.generation(1), Some(first[1].1));
    }

    #[tokio::test]
    async fn the_loop_takes_changes_in_order() {
        let inbox = Inbox::default();
        inbox.post(Rebalanced::Assigned(vec![(0, 1)]));
        inbox.post(Rebalanced::Revoked(vec![0]));
        inbox.posted().await;
        assert_eq!(
            inbox.take(),
            [
                Rebalanced::Assigned(vec![(0, 1)]),
                Rebalanced::Revoked(vec![0])
            ]
        );
        assert!(inbox.take().is_empty());
    }
}

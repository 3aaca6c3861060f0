//! A tier worker's rebalance callbacks, the way every consumer stage handles rebalances
//! (`hookline_common::kafka::rebalance`): they run inside `recv()` on the loop's task and post what
//! changed for the loop, which applies it right after `recv()` returns. Only a revoke blocks, a
//! bounded time, off the async runtime's worker slot.
//!
//! - assign: new partitions get a generation, are resumed explicitly (librdkafka keeps a
//!   partition's pause state across a rebalance: one paused before would never be fetched
//!   again), and are posted to the loop, which opens their waiting queues;
//! - revoke: wait for the partitions' in-flight records, cut the rest short (handed off as
//!   `timeout`), close their gates, wait for the enqueued writes, store the completed prefix
//!   (tracked by the record tasks themselves in [`Completion`], since the loop is inside the
//!   callback) and commit; then post them to the loop, which drops their held records. So the
//!   new owner re-attempts only records whose handling wrote nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{Offset, TopicPartitionList};

use hookline_common::kafka::ownership::Ownership;
use hookline_common::kafka::rebalance::{self, Inbox, Rebalanced, Waits};
use hookline_common::runtime::ops::StageProbe;

use crate::tier::Completion;

/// Longest a revoke waits for the revoked partitions' in-flight records (also bounded by
/// `tiers.shutdown_grace`), and then again for the ones cut short to hand off. The group's
/// other members wait for this member meanwhile; well below the session timeout.
pub(crate) const REVOKE_WAIT_CAP: Duration = Duration::from_secs(10);

/// At a revoke, after the gate closed: how long enqueued writes get to be acknowledged.
const REVOKE_ACK_WAIT: Duration = Duration::from_secs(10);

/// The consumer's context of one tier.
pub(crate) struct TierContext {
    pub(crate) tier: String,
    pub(crate) topic: String,
    /// Assignment changes for the loop.
    pub(crate) inbox: Inbox,
    /// Ready from the first assignment (an empty one too: a standby); unready at once when the
    /// assignment is lost.
    pub(crate) probe: StageProbe,
    pub(crate) ownership: Arc<Ownership<Completion>>,
    /// `min(dispatcher.shutdown_grace, REVOKE_WAIT_CAP)`.
    pub(crate) revoke_wait: Duration,
    /// Set once the record tasks are gone (closing): a revoke has nothing left to wait for.
    pub(crate) closing: AtomicBool,
}

impl ClientContext for TierContext {}

impl ConsumerContext for TierContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let ids = rebalance::partitions_of(tpl, &self.topic);
            self.on_revoke(consumer, &ids);
            self.inbox.post(Rebalanced::Revoked(ids));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.probe.set_ready(true);
                let ids = rebalance::partitions_of(tpl, &self.topic);
                let assigned = rebalance::assign(&self.ownership, &ids);
                // A partition paused before it was revoked would otherwise come back paused and
                // never be fetched again.
                if tpl.count() > 0 {
                    if let Err(e) = consumer.resume(tpl) {
                        tracing::warn!(tier = %self.tier, error = %e, "resuming assigned partitions failed");
                    }
                }
                tracing::info!(tier = %self.tier, partitions = ?ids, "partitions assigned");
                self.inbox.post(Rebalanced::Assigned(assigned));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(tier = %self.tier, error = %e, "rebalance error");
            }
        }
    }
}

impl TierContext {
    /// The revoke protocol (see the module doc). A lost assignment (or a closing worker) closes
    /// the gates at once; a lost one commits nothing.
    fn on_revoke(&self, consumer: &BaseConsumer<Self>, ids: &[i32]) {
        if ids.is_empty() {
            return;
        }
        let waits = Waits {
            drain: self.revoke_wait,
            after_cut: self.revoke_wait,
            acks: REVOKE_ACK_WAIT,
        };
        let closing = self.closing.load(Ordering::Relaxed);
        let idle = |c: &Completion| c.unfinished() == 0;
        let revoked = rebalance::on_revoke(
            consumer,
            &self.ownership,
            ids,
            waits,
            closing,
            |ids, limit| self.ownership.wait_until(ids, limit, idle),
        );
        if revoked.lost {
            self.probe.set_ready(false);
            tracing::warn!(tier = %self.tier, partitions = ?ids, "partitions lost; their unfinished records are left to the new owner");
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (partition, completion) in &revoked.states {
            if let Some(next) = completion.next() {
                if let Err(e) =
                    tpl.add_partition_offset(&self.topic, *partition, Offset::Offset(next))
                {
                    tracing::warn!(tier = %self.tier, partition, error = %e, "cannot build an offset list");
                }
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.store_offsets(&tpl) {
                tracing::debug!(tier = %self.tier, error = %e, "offsets not stored at revoke");
            }
        }
        if let Err(e) = rebalance::commit(consumer) {
            tracing::warn!(tier = %self.tier, error = %e, "commit on revoke failed");
        }
        // A closing stage waits for nothing (`drained` stays false): what was left is the count
        // of records begun and not completed, which is zero on an idle tier's clean stop.
        let unfinished: usize = revoked.states.iter().map(|(_, c)| c.unfinished()).sum();
        if (revoked.drained || unfinished == 0) && revoked.unacked == 0 {
            tracing::info!(tier = %self.tier, partitions = ?ids, "partitions revoked");
        } else {
            tracing::warn!(
                tier = %self.tier,
                partitions = ?ids,
                unfinished,
                unacknowledged = revoked.unacked,
                "partitions revoked with records unfinished; the new owner attempts them again"
            );
        }
    }
}

//! The dispatcher's rebalance callbacks, the way every consumer stage handles rebalances
//! (`hookline_common::kafka::rebalance`): they run inside the consumer loop's `recv()` (on its thread)
//! and stay short; only a revoke blocks, a bounded time, after moving off the async runtime's
//! worker slot.
//!
//! - assign: new partitions get a generation, are resumed (pause state survives an
//!   unassign/assign in librdkafka) and are posted to the loop, which opens their windows;
//! - revoke: stop taking work for the partitions (the loop is inside this callback, and
//!   librdkafka drops their remaining fetched records), wait for their deliveries, cut the ones
//!   still running short (handed off as `timeout`), close their gates, wait for the enqueued
//!   hand-offs, commit what is stored, and post them to the loop, which forgets their windows.
//!   Every acknowledged hand-off is covered by the committed offset, so the new owner does not
//!   send those events again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::TopicPartitionList;
use tracing::{info, warn};

use hookline_common::kafka::rebalance::{self, Inbox, Rebalanced, Waits};
use hookline_common::runtime::ops::StageProbe;

use crate::partitions::Partitions;

/// Longest a revoke waits for the revoked partitions' deliveries (also bounded by
/// `dispatcher.shutdown_grace`). Well below the default session timeout (45 s); the group's
/// other members wait for this member during a rebalance.
pub(crate) const REVOKE_WAIT_CAP: Duration = Duration::from_secs(10);

/// At a revoke, after the wait for deliveries: how long the ones cut short get to be handed off
/// before the partition's gate closes.
const REVOKE_CUT_WAIT: Duration = Duration::from_secs(5);

/// At a revoke, after the gate closed: how long enqueued hand-offs get to be acknowledged before
/// the offsets are committed anyway.
const REVOKE_ACK_WAIT: Duration = Duration::from_secs(10);

/// librdkafka callbacks of the dispatcher's consumer.
pub(crate) struct DispatchContext {
    pub(crate) partitions: Arc<Partitions>,
    /// Assignment changes for the consumer loop.
    pub(crate) inbox: Inbox,
    /// `min(dispatcher.shutdown_grace, REVOKE_WAIT_CAP)`.
    pub(crate) revoke_wait: Duration,
    /// Ready once the group gave this member its assignment (an empty one too: a standby);
    /// unready when the assignment is lost.
    pub(crate) probe: StageProbe,
}

impl ClientContext for DispatchContext {}

impl ConsumerContext for DispatchContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(_) => {}
            Rebalance::Revoke(tpl) => self.on_revoke(consumer, tpl),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.probe.set_ready(true);
            let ids = rebalance::partitions_of(tpl, &self.partitions.topic);
            if ids.is_empty() {
                return;
            }
            let assigned = rebalance::assign(&self.partitions.ownership, &ids);
            // Pause state survives an unassign/assign in librdkafka: a partition paused under a
            // previous assignment would otherwise stay silent forever.
            if let Err(e) = consumer.resume(tpl) {
                warn!(error = %e, "cannot resume newly assigned partitions");
            }
            self.inbox.post(Rebalanced::Assigned(assigned));
            info!(partitions = ?ids, "partitions assigned");
        }
    }
}

impl DispatchContext {
    fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let ids = rebalance::partitions_of(tpl, &self.partitions.topic);
        if ids.is_empty() {
            return;
        }
        let waits = Waits {
            drain: self.revoke_wait,
            after_cut: REVOKE_CUT_WAIT.min(self.revoke_wait),
            acks: REVOKE_ACK_WAIT,
        };
        let closing = self.partitions.closing.load(Ordering::Relaxed);
        let partitions = &self.partitions;
        // A lost assignment (session timeout, eviction) is already someone else's: the gates
        // close at once, nothing is waited for or committed.
        let revoked = rebalance::on_revoke(
            consumer,
            &partitions.ownership,
            &ids,
            waits,
            closing,
            |ids, limit| partitions.wait_unfinished(ids, limit),
        );
        if revoked.lost {
            self.probe.set_ready(false);
        }
        let abandoned = partitions.unfinished(&ids);
        if abandoned > 0 || revoked.unacked > 0 {
            warn!(
                partitions = ?ids,
                lost = revoked.lost,
                abandoned,
                unacknowledged = revoked.unacked,
                "partitions revoked with deliveries unfinished; their events will be sent again \
                 by the new owner"
            );
        } else {
            info!(partitions = ?ids, cut_short = revoked.cut, "partitions revoked");
        }
        self.inbox.post(Rebalanced::Revoked(ids));
        if revoked.lost {
            return;
        }
        if let Err(e) = rebalance::commit(consumer) {
            warn!(error = %e, "commit on revoke failed");
        }
    }
}

//! Stage B's rebalance callbacks. Stage B owns no hand-off gates (its writes are transactional):
//! a revoke commits what was processed while the partitions are still owned (or, when the
//! assignment was lost, aborts) and forgets their seen-sets; an assign pauses the new partitions
//! and restores their seen-sets from the changelog before the loop reads them.

use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::ClientContext;

use crate::dedupe::{lock, Core, Input};

/// The consumer's context: the state the loop and the callbacks share.
pub(crate) struct DedupeContext {
    pub(crate) core: Arc<Mutex<Core>>,
}

impl ClientContext for DedupeContext {}

impl ConsumerContext for DedupeContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut core = lock(&self.core);
            // Commit what was processed while we still own the partitions (generation valid).
            let lost = consumer.assignment_lost();
            if let Err(e) = core.commit(consumer, !lost) {
                core.fatal.get_or_insert(e);
            }
            for el in tpl.elements() {
                let p = el.partition();
                core.parts.remove(&p);
                core.batch.remove(&(Input::Dedupe, p));
                core.batch.remove(&(Input::Events, p));
                // Events partition `p` goes with dedupe partition `p` (`dedupe.direct`).
                core.events_detach(p);
            }
            if lost {
                core.joined = false;
            }
            core.update_ready();
            tracing::info!(
                partitions = ?tpl.elements().iter().map(|e| e.partition()).collect::<Vec<_>>(),
                lost,
                "dedupe partitions revoked"
            );
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut core = lock(&self.core);
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                core.joined = true;
                if partitions.is_empty() {
                    core.update_ready();
                    return;
                }
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!(error = %e, "pausing newly assigned partitions failed");
                }
                for p in &partitions {
                    core.start_restore(*p);
                }
                core.update_ready();
                tracing::info!(partitions = ?partitions, "dedupe partitions assigned, restoring state");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::error!(error = %e, "dedupe rebalance error"),
        }
    }
}

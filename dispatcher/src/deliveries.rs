//! One (event, endpoint) delivery of the dispatcher: attempt 1 (or its deferral) and the hand-off
//! of a failure through the shared delivery path ([`DeliveryPath::attempt`](hookline_delivery::DeliveryPath::attempt)),
//! counted and logged where it went; the last delivery of an event to finish completes its
//! offset. Also the quarantine of a record that cannot be delivered ([`Dispatcher::park`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::anyhow;
use bytes::Bytes;
use tokio::sync::watch;
use tracing::{debug, warn};

use hookline_common::config::EndpointConfig;
use hookline_common::contract::delivery::DeliveryMeta;
use hookline_common::contract::quarantine::Source;
use hookline_common::kafka::ownership::Claim;
use hookline_common::kafka::produce::OwnedRecord;
use hookline_common::runtime::clock::now_ms;
use hookline_delivery::{Delivery, Hop, HopError, Next, Origin, Report, Turn, Why, Written};

use crate::consumer::Dispatcher;
use crate::metrics::HandoffTarget;

/// One event read from `<p>.dispatch`, shared by its deliveries.
pub(crate) struct Event {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    /// The partition's assignment generation when the event was read (see [`Ownership`]).
    pub(crate) generation: u64,
    /// Set when the shutdown grace is over or the partition is being revoked: attempts still
    /// running are cut short and handed off.
    pub(crate) cutoff: watch::Receiver<bool>,
    pub(crate) id: String,
    pub(crate) event_type: String,
    pub(crate) tenant: Option<String>,
    pub(crate) dedupe_key: Option<String>,
    /// The dedupe span's context (`hookline-trace`), while tracing is on.
    pub(crate) trace: Option<String>,
    pub(crate) key: Option<Bytes>,
    /// The producer's exact bytes, sent unchanged.
    pub(crate) body: Bytes,
    /// Deliveries neither delivered nor handed off yet.
    pub(crate) pending: AtomicUsize,
}

impl Dispatcher {
    /// One (event, endpoint) delivery: attempt 1 (or its deferral) and the hand-off of a failure
    /// or deferral, through the delivery path; the last delivery of the event to finish
    /// completes its offset.
    pub(crate) async fn deliver(self: Arc<Self>, event: Arc<Event>, endpoint: Arc<EndpointConfig>) {
        // The delivery path starts the schedule when attempt 1 starts (or is deferred).
        let mut meta = DeliveryMeta::new(
            &endpoint.id,
            &event.id,
            &event.event_type,
            event.tenant.as_deref(),
            now_ms(),
        );
        meta.trace.clone_from(&event.trace);
        let delivery = Delivery {
            meta,
            key: event.key.clone(),
            body: event.body.clone(),
            dedupe_key: event.dedupe_key.clone(),
        };
        let claim = Claim {
            ownership: &self.partitions.ownership,
            partition: event.partition,
            generation: event.generation,
        };
        let origin = Origin {
            source: Source {
                topic: &self.partitions.topic,
                partition: event.partition,
                offset: event.offset,
            },
            gate: &claim,
            cutoff: Some(event.cutoff.clone()),
        };
        let turn = self
            .path
            .attempt(&self.attempts, delivery, Turn::Scheduled, origin)
            .await;
        match turn {
            Ok(report) => self.count(&report),
            // The partition was revoked meanwhile: the new owner sends the event again.
            Err(HopError::Revoked(_)) => {
                debug!(
                    endpoint = %endpoint.id,
                    event = %event.id,
                    partition = event.partition,
                    "partition revoked before the hand-off, left to the new owner"
                );
                return;
            }
            // Shutdown while retrying a transient error: the event never completes, so no
            // offset is stored past it and the next owner delivers it again.
            Err(HopError::Abandoned(topic)) => {
                warn!(event = %event.id, endpoint = %endpoint.id, topic, "hand-off abandoned at shutdown");
                return;
            }
            Err(e @ HopError::Fatal { .. }) => {
                // The event never completes, so no offset is stored past it.
                let _ = self.fatal.send(anyhow!(
                    "the hand-off of event {} for endpoint {} (dispatch {}@{}) failed: {e}",
                    event.id,
                    endpoint.id,
                    event.partition,
                    event.offset
                ));
                return;
            }
        }
        if event.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.metrics.emit_event_done();
            self.partitions.complete(
                &self.consumer,
                event.partition,
                event.generation,
                event.offset,
            );
        }
    }

    /// Parks a dispatch record that cannot be delivered (`record`, see `Dispatcher::quarantined`)
    /// on `<p>.invalid` through the partition's ownership gate, and completes it once Kafka
    /// acknowledged the copy (or refused even its bounded form: logged, dropped). Like a
    /// delivery: revoked → left to the new owner; abandoned at shutdown → never completed.
    pub(crate) async fn park(
        self: Arc<Self>,
        record: OwnedRecord,
        problem: &'static str,
        partition: i32,
        offset: i64,
        generation: u64,
    ) {
        let claim = Claim {
            ownership: &self.partitions.ownership,
            partition,
            generation,
        };
        let source = Source {
            topic: &self.partitions.topic,
            partition,
            offset,
        };
        match self
            .path
            .writer()
            .park(&claim, record, problem, source)
            .await
        {
            Ok(()) => self
                .partitions
                .complete(&self.consumer, partition, generation, offset),
            Err(HopError::Revoked(_)) => {}
            Err(HopError::Abandoned(topic)) => {
                warn!(partition, offset, topic, "quarantine abandoned at shutdown")
            }
            Err(e @ HopError::Fatal { .. }) => {
                let _ = self.fatal.send(anyhow!(
                    "the quarantine of dispatch {partition}@{offset} failed: {e}"
                ));
            }
        }
    }

    /// Logs and counts where a delivery went after attempt 1.
    fn count(&self, report: &Report) {
        let meta = &report.meta;
        let Next::Handed { why, hop, written } = &report.next else {
            return;
        };
        if *why == Why::Throttled {
            // Counted by the delivery path (`hookline_delivery_throttled_total`).
            debug!(endpoint = %meta.endpoint_id, event = %meta.event_id, "handed to the rate limiter");
            return;
        }
        let target = match (written, hop) {
            (Written::AsPlanned, Hop::Retry { .. } | Hop::Throttle { .. }) => HandoffTarget::Retry,
            (Written::AsPlanned, Hop::Dead { .. }) => HandoffTarget::Dlq,
            (Written::DeadTooLarge, _) => HandoffTarget::DlqRecordTooLarge,
            (Written::Quarantined, _) => HandoffTarget::InvalidRecordTooLarge,
            (Written::Dropped, _) => HandoffTarget::Dropped,
        };
        match why {
            Why::Deferred { busy } => {
                self.metrics
                    .emit_deferred(&meta.endpoint_id, &meta.event_id, *busy)
            }
            Why::Failed => {
                let (attempt, class) = report.outcome.as_ref().map_or((1, "-"), |o| {
                    (
                        o.attempt,
                        o.result.failure_class().map_or("ok", |c| c.as_str()),
                    )
                });
                self.metrics.emit_handed_off(
                    &meta.endpoint_id,
                    &meta.event_id,
                    attempt,
                    class,
                    target,
                )
            }
            Why::Throttled => {}
            Why::Dead(reason) => self.metrics.emit_handed_off(
                &meta.endpoint_id,
                &meta.event_id,
                meta.attempt,
                reason.as_str(),
                target,
            ),
        }
    }
}

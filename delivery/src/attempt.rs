//! The one delivery path: attempt a delivery, decide its next hop and write it. The dispatcher
//! (attempt 1 of every fanned-out delivery), every retry tier (attempts 2..) and replay call
//! [`DeliveryPath::attempt`]; nothing else makes attempts or writes hand-offs.
//!
//! In order:
//! 1. the endpoint is read from the current set ([`LiveEndpoints`]): removed, disabled or no
//!    longer subscribed to the event's tenant and type → no attempt; on the schedule the
//!    delivery is dead-lettered with that reason, a replay skips it (nothing written);
//! 2. on the schedule, a delivery waiting for an attempt the current schedule no longer has (it
//!    was shortened) is dead-lettered as `exhausted`, no attempt;
//! 3. the attempt, cut short as a `timeout` when the caller's cut signal fires (shutdown grace
//!    over, partition revoked). On the schedule, while a later slot is left, a saturated
//!    endpoint refuses it and the delivery is *deferred* to the next slot's tier, attempt number
//!    unchanged ([`hop::defer`]); a replay always attempts;
//! 4. the attempt is counted (`hookline_delivery_attempts_total{stage}`) and told to the
//!    [`AttemptObserver`];
//! 5. delivered: done. Failed: the next hop — the next tier or `<p>.dlq` on the schedule; for a
//!    replay the DLQ again, or a fresh schedule's first tier (`--with-retries`) — written through
//!    the caller's gate ([`HopWriter::write`], which reroutes a record that does not fit).
//!
//! A delivery with no history (the dispatcher's) starts its schedule when attempt 1 starts, or
//! when it is deferred.
//!
//! Traces (while `traces.enabled`): each attempt is a `hookline.attempt` span, child of the
//! delivery's `hookline-trace` (the dedupe span, a tier wait, a replay), whose `traceparent`
//! goes on the request; a replay adds a `hookline.replay` span before its attempt, a dead letter
//! a `hookline.dead_letter` span; the record handed on carries the last of them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hookline_common::contract::delivery::{DeadReason, DeliveryMeta};
use hookline_common::contract::quarantine::Source;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::WriteGate;
use hookline_common::runtime::clock::now_ms;
use hookline_common::runtime::traces::{self, Kind, Span};
use tokio::sync::watch;

use crate::endpoints::LiveEndpoints;
use crate::engine::Engine;
use crate::filter::{ErrorLog, EventView, Verdict};
use crate::hop::{self, Hop};
use crate::metrics::AttemptMetrics;
use crate::metrics::ALL_ENDPOINTS;
use crate::observer::{AttemptEvent, AttemptObserver, NoObserver};
use crate::outcome::{Admission, AttemptOutcome};
use crate::write::{HopError, HopWriter, Written};
use hookline_common::config::EndpointConfig;

/// What every attempt of a stage shares: the engine, the endpoint set, the hop writer, the
/// schedule and the observer. Cheap to clone.
#[derive(Clone)]
pub struct DeliveryPath {
    engine: Engine,
    endpoints: LiveEndpoints,
    writer: HopWriter,
    schedule: Arc<[Duration]>,
    observer: Arc<dyn AttemptObserver>,
    /// Per-endpoint metric series while the set has at most this many endpoints.
    label_limit: usize,
    filter_errors: Arc<ErrorLog>,
}

/// [`DeliveryPath::with_endpoint_label_limit`]'s default (`control.metrics_endpoint_limit`).
pub const DEFAULT_LABEL_LIMIT: usize = 100;

/// One (event, endpoint) delivery about to be attempted.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Its metadata; `attempt` is the number of the attempt to make.
    pub meta: DeliveryMeta,
    /// The original record key.
    pub key: Option<Bytes>,
    /// The producer's exact bytes, sent unchanged.
    pub body: Bytes,
    pub dedupe_key: Option<String>,
}

/// How the attempt is made and where a failure goes.
#[derive(Debug, Clone)]
pub enum Turn {
    /// On the retry schedule: the dispatcher's attempt 1, a tier's attempt n. A rate-limited
    /// endpoint's delivery is handed to `<p>.throttle` instead ([`Why::Throttled`]).
    Scheduled,
    /// The rate limiter's owner of the endpoint granted it a slot: attempted now. `waited_ms`:
    /// how long it was held back by the endpoint's rate limit (0: not at all), for the
    /// delivery log ("throttled").
    Paced { waited_ms: u64 },
    /// A replay of the dead letter named `replay_key`: attempted now, whatever the schedule.
    Replay {
        replay_key: String,
        /// A fresh full schedule: the attempt is attempt 1 of it, a failure goes to the first
        /// tier. Otherwise a failure goes back to the DLQ.
        with_retries: bool,
    },
}

/// Where the delivery was read and what guards its writes.
pub struct Origin<'a> {
    /// The record it came from (quarantine headers name it).
    pub source: Source<'a>,
    /// Every write passes it: the ownership claim of the source partition, or `Ungated`.
    pub gate: &'a dyn WriteGate,
    /// Cuts a running attempt short (reported as `timeout`); `None`: never.
    pub cutoff: Option<watch::Receiver<bool>>,
}

/// Why a delivery was handed to a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The attempt failed.
    Failed,
    /// No attempt: the endpoint was saturated (`busy` slots taken); deferred to the next slot.
    Deferred { busy: usize },
    /// No attempt: dead-lettered for this reason (endpoint unusable, schedule exhausted).
    Dead(DeadReason),
    /// No attempt: the endpoint is rate-limited; handed to `<p>.throttle`, whose owner of the
    /// endpoint attempts it when its budget allows.
    Throttled,
}

/// What became of the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Delivered,
    /// A replay whose endpoint may not receive the event: nothing sent, nothing written.
    Skipped(DeadReason),
    /// Written to `hop` (or, when it did not fit, where `written` says).
    Handed {
        why: Why,
        hop: Hop,
        written: Written,
    },
}

/// The delivery after its turn.
#[derive(Debug, Clone)]
pub struct Report {
    /// The metadata as written (or as it was, when nothing was written).
    pub meta: DeliveryMeta,
    /// The attempt, when one was made.
    pub outcome: Option<AttemptOutcome>,
    pub next: Next,
}

impl DeliveryPath {
    pub fn new(
        engine: Engine,
        endpoints: LiveEndpoints,
        writer: HopWriter,
        schedule: &[Duration],
    ) -> Self {
        DeliveryPath {
            engine,
            endpoints,
            writer,
            schedule: schedule.into(),
            observer: Arc::new(NoObserver),
            label_limit: DEFAULT_LABEL_LIMIT,
            filter_errors: Arc::default(),
        }
    }

    /// Per-endpoint metric series only while the set has at most `limit` endpoints (see
    /// [`crate::metrics`]).
    pub fn with_endpoint_label_limit(mut self, limit: usize) -> Self {
        self.label_limit = limit;
        self
    }

    /// The `endpoint` label of an attempt to `id`.
    fn label<'a>(&self, id: &'a str) -> &'a str {
        if self.endpoints.current().len() <= self.label_limit {
            id
        } else {
            ALL_ENDPOINTS
        }
    }

    /// The endpoints an event fans out to: enabled, subscribed to its tenant and type, and
    /// admitted by their payload filters (evaluated on one parse of the body).
    pub fn fan_out(
        &self,
        stage: &AttemptMetrics,
        view: &EventView<'_>,
        tenant: Option<&str>,
        event_type: &str,
    ) -> Vec<Arc<EndpointConfig>> {
        let mut endpoints = self.endpoints.current().matching(tenant, event_type);
        if endpoints.iter().any(|e| e.filter.is_some()) {
            endpoints.retain(|e| self.admits(stage, e, view));
        }
        endpoints
    }

    /// Whether `endpoint`'s payload filter (if any) admits the event; what it keeps out is
    /// counted (`hookline_delivery_filtered_total`), an evaluation error also logged once per
    /// endpoint and minute.
    pub fn admits(
        &self,
        stage: &AttemptMetrics,
        endpoint: &EndpointConfig,
        view: &EventView<'_>,
    ) -> bool {
        let Some(filter) = &endpoint.filter else {
            return true;
        };
        let verdict = view.evaluate(filter);
        if verdict.admits() {
            return true;
        }
        stage.filtered(verdict.label(), self.label(&endpoint.id));
        if let Verdict::Error(why) = &verdict {
            if self.filter_errors.first_this_minute(&endpoint.id, now_ms()) {
                tracing::warn!(
                    endpoint = %endpoint.id,
                    stage = stage.stage(),
                    error = %why,
                    "the endpoint's payload filter could not be evaluated on an event: not \
                     delivered to it (counted in hookline_delivery_filtered_total, result error; \
                     logged once per endpoint and minute)"
                );
            }
        }
        false
    }

    /// The same path, telling every attempt to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn AttemptObserver>) -> Self {
        self.observer = observer;
        self
    }

    pub fn endpoints(&self) -> &LiveEndpoints {
        &self.endpoints
    }

    pub fn writer(&self) -> &HopWriter {
        &self.writer
    }

    pub fn topics(&self) -> &Topics {
        &self.writer.topics
    }

    /// Attempts `delivery` and writes its next hop (see the module doc). `stage` labels the
    /// attempt's metrics and observer call. An error means nothing more may be written for it:
    /// a fatal produce error, a write abandoned at shutdown, or the source partition revoked
    /// ([`HopError::Revoked`]: nothing written, the new owner handles the record).
    pub async fn attempt(
        &self,
        stage: &AttemptMetrics,
        d: Delivery,
        turn: Turn,
        origin: Origin<'_>,
    ) -> Result<Report, HopError> {
        let report = self.attempt_and_hand(stage, d, turn, origin).await?;
        let dead = match &report.next {
            Next::Handed { hop, written, .. } => {
                matches!(hop, Hop::Dead { .. }) || *written == Written::DeadTooLarge
            }
            Next::Delivered | Next::Skipped(_) => false,
        };
        if dead {
            let reason = report.meta.dead_reason.map_or("unknown", |r| r.as_str());
            stage.dead_lettered(reason, self.label(&report.meta.endpoint_id));
        }
        Ok(report)
    }

    async fn attempt_and_hand(
        &self,
        stage: &AttemptMetrics,
        mut d: Delivery,
        turn: Turn,
        origin: Origin<'_>,
    ) -> Result<Report, HopError> {
        let replay = matches!(turn, Turn::Replay { .. });
        if let Turn::Replay { replay_key, .. } = &turn {
            if traces::enabled() {
                let mut span = Span::start(
                    "hookline.replay",
                    Kind::Internal,
                    d.meta.trace.as_deref(),
                    None,
                );
                span.str("hookline.replay.key", replay_key.as_str());
                span.str("hookline.event.id", d.meta.event_id.as_str());
                span.str("hookline.endpoint.id", d.meta.endpoint_id.as_str());
                d.meta.trace = span.traceparent();
            }
        }
        let waited_ms = match turn {
            Turn::Paced { waited_ms } => waited_ms,
            _ => 0,
        };
        let fresh = d.meta.history.is_empty() && d.meta.attempt == 1 && d.meta.deferrals == 0;
        let usable = self.endpoints.current().usable_for(&d.meta).and_then(|e| {
            // The filter is part of the subscription: re-checked on every attempt after the
            // first (fan-out has just evaluated it for that one).
            if fresh && matches!(turn, Turn::Scheduled) {
                return Ok(e);
            }
            if self.admits(stage, &e, &EventView::of_delivery(&d.meta, &d.body)) {
                Ok(e)
            } else {
                Err(DeadReason::EndpointUnsubscribed)
            }
        });
        let endpoint = match usable {
            Ok(endpoint) => endpoint,
            Err(reason) if replay => return Ok(report(d.meta, None, Next::Skipped(reason))),
            Err(reason) => return self.dead_letter(d, reason, &origin).await,
        };
        if !replay && !hop::has_slot(&d.meta, &self.schedule) {
            // Written under a longer schedule: the current one allows no further attempt.
            return self.dead_letter(d, DeadReason::Exhausted, &origin).await;
        }

        if endpoint.rate_limit.is_some() && matches!(turn, Turn::Scheduled) {
            // Waiting for the budget is not an attempt: the record goes as it is.
            stage.throttled(self.label(&endpoint.id));
            let hop = Hop::Throttle {
                topic: self.topics().throttle(),
            };
            return self.hand(d, None, Why::Throttled, hop, &origin).await;
        }
        let (attempt, body) = (d.meta.attempt, d.body.clone());
        // A dropped sender never fires: "never cut".
        let cutoff = origin
            .cutoff
            .clone()
            .unwrap_or_else(|| watch::channel(false).1);
        let mut span = Span::start(
            "hookline.attempt",
            Kind::Client,
            d.meta.trace.as_deref(),
            None,
        );
        let propagated = span
            .traceparent()
            .filter(|_| traces::propagate() && endpoint.trace_context);
        if span.is_live() {
            span.str("hookline.event.id", d.meta.event_id.as_str());
            span.str("hookline.endpoint.id", endpoint.id.as_str());
            span.int("hookline.attempt", i64::from(attempt));
            span.str("hookline.stage", stage.stage());
        }
        let attempted = async {
            if !replay && hop::can_defer(&d.meta, &self.schedule) {
                self.engine
                    .deliver_unless_saturated(&endpoint, &d.meta.event_id, body, attempt, cutoff)
                    .await
            } else {
                // The last slot, or a replay: nothing to defer to, the attempt waits for a slot.
                let outcome = self
                    .engine
                    .deliver_or_cut(&endpoint, &d.meta.event_id, body, attempt, cutoff)
                    .await;
                Admission::Attempted(outcome)
            }
        };
        let admission = match propagated {
            Some(tp) => crate::engine::TRACEPARENT.scope(tp, attempted).await,
            None => attempted.await,
        };
        let outcome = match admission {
            Admission::Attempted(outcome) => outcome,
            Admission::Saturated { busy } => {
                span.str("hookline.outcome", "deferred");
                if fresh {
                    d.meta.first_attempt_ms = now_ms();
                }
                let hop = hop::defer(&mut d.meta, busy, self.topics(), &self.schedule);
                return self
                    .hand(d, None, Why::Deferred { busy }, hop, &origin)
                    .await;
            }
        };
        stage.observe(&outcome, self.label(&d.meta.endpoint_id));
        if fresh {
            d.meta.first_attempt_ms = outcome.started_at_ms;
        }
        if span.is_live() {
            span_outcome(&mut span, &outcome);
            d.meta.trace = span.traceparent();
        }
        if outcome.result.is_delivered() {
            self.observe(stage, &d.meta, &outcome, None, waited_ms);
            return Ok(report(d.meta, Some(outcome), Next::Delivered));
        }
        let hop = match turn {
            Turn::Scheduled | Turn::Paced { .. } => {
                hop::after_failure(&mut d.meta, &outcome, self.topics(), &self.schedule)
            }
            Turn::Replay {
                replay_key,
                with_retries,
            } => {
                d.meta.replay_key = Some(replay_key);
                hop::after_replay(
                    &mut d.meta,
                    &outcome,
                    with_retries,
                    self.topics(),
                    &self.schedule,
                )
            }
        };
        self.observe(
            stage,
            &d.meta,
            &outcome,
            Some(hop.label(self.topics())),
            waited_ms,
        );
        if span.is_live() {
            span.str("hookline.next", hop.label(self.topics()));
            if let Hop::Retry { due_ms, .. } = &hop {
                span.int("hookline.next.due_ms", *due_ms);
            }
        }
        drop(span);
        self.hand(d, Some(outcome), Why::Failed, hop, &origin).await
    }

    /// Tells the observer about an attempt and where the delivery goes next.
    fn observe(
        &self,
        stage: &AttemptMetrics,
        meta: &DeliveryMeta,
        outcome: &AttemptOutcome,
        next: Option<&str>,
        waited_ms: u64,
    ) {
        self.observer.attempted(&AttemptEvent {
            event_id: &meta.event_id,
            endpoint_id: &meta.endpoint_id,
            tenant: meta.tenant.as_deref(),
            event_type: &meta.event_type,
            stage: stage.stage(),
            outcome,
            next,
            waited_ms,
        });
    }

    /// Ends a delivery without an attempt: `<p>.dlq` with `reason`.
    async fn dead_letter(
        &self,
        mut d: Delivery,
        reason: DeadReason,
        origin: &Origin<'_>,
    ) -> Result<Report, HopError> {
        hop::mark_dead(&mut d.meta, reason);
        let hop = Hop::Dead {
            topic: self.topics().dlq(),
        };
        self.hand(d, None, Why::Dead(reason), hop, origin).await
    }

    /// Writes the delivery record to `hop` through the origin's gate and waits for the
    /// acknowledgement.
    async fn hand(
        &self,
        mut d: Delivery,
        outcome: Option<AttemptOutcome>,
        why: Why,
        hop: Hop,
        origin: &Origin<'_>,
    ) -> Result<Report, HopError> {
        if let (Hop::Dead { .. }, true) = (&hop, traces::enabled()) {
            let mut span = Span::start(
                "hookline.dead_letter",
                Kind::Internal,
                d.meta.trace.as_deref(),
                None,
            );
            span.str("hookline.event.id", d.meta.event_id.as_str());
            span.str("hookline.endpoint.id", d.meta.endpoint_id.as_str());
            if let Some(r) = d.meta.dead_reason {
                span.str("hookline.dead.reason", r.as_str());
            }
            span.int(
                "hookline.attempts",
                i64::from(d.meta.attempt.saturating_sub(1)),
            );
            span.error("dead letter");
            d.meta.trace = span.traceparent();
        }
        let written = self
            .writer
            .write(
                origin.gate,
                hop.topic(),
                &mut d.meta,
                d.key.as_deref(),
                &d.body,
                d.dedupe_key.as_deref(),
                origin.source,
            )
            .await?;
        Ok(report(d.meta, outcome, Next::Handed { why, hop, written }))
    }
}

/// An attempt span's result: the status or the failure class, and how long the request took.
fn span_outcome(span: &mut Span, outcome: &AttemptOutcome) {
    span.int(
        "hookline.attempt.duration_ms",
        outcome.duration.as_millis() as i64,
    );
    match &outcome.result {
        crate::outcome::AttemptResult::Delivered { status } => {
            span.int("http.response.status_code", i64::from(*status));
            span.str("hookline.outcome", "delivered");
        }
        crate::outcome::AttemptResult::Failed { class, status, .. } => {
            if let Some(status) = status {
                span.int("http.response.status_code", i64::from(*status));
            }
            span.str("hookline.failure.class", class.as_str());
            span.str("hookline.outcome", "failed");
            span.error(match status {
                Some(s) => format!("{} {s}", class.as_str()),
                None => class.as_str().to_string(),
            });
        }
    }
}

fn report(meta: DeliveryMeta, outcome: Option<AttemptOutcome>, next: Next) -> Report {
    Report {
        meta,
        outcome,
        next,
    }
}

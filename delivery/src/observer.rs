//! The attempt hook: one call per delivery attempt, from every stage that makes them (the
//! dispatcher, every retry tier, replay), with what a delivery log or per-endpoint health needs.
//! The default observes nothing; the control plane's delivery log implements it.
//!
//! It is called on the attempt's task right after the attempt and its next-hop decision, before
//! the hand-off is written, so it must not block: an implementation that writes somewhere
//! queues the write.

use crate::outcome::{AttemptOutcome, AttemptResult, FailureClass};

/// One attempt, as the hook sees it.
#[derive(Debug, Clone, Copy)]
pub struct AttemptEvent<'a> {
    pub event_id: &'a str,
    pub endpoint_id: &'a str,
    pub tenant: Option<&'a str>,
    pub event_type: &'a str,
    /// The stage that made it: `dispatcher`, `retry.<tier>` or `replay` (the metrics' label).
    pub stage: &'a str,
    /// Attempt number, duration, start time and result.
    pub outcome: &'a AttemptOutcome,
    /// Where the delivery goes next: `retry.<tier>` or `dlq`; `None` when delivered.
    pub next: Option<&'a str>,
    /// How long the endpoint's rate limit held the delivery back before this attempt (0: not).
    pub waited_ms: u64,
}

impl AttemptEvent<'_> {
    /// The `webhook-attempt` number.
    pub fn attempt(&self) -> u32 {
        self.outcome.attempt
    }

    /// The response status, when one arrived.
    pub fn status(&self) -> Option<u16> {
        match &self.outcome.result {
            AttemptResult::Delivered { status } => Some(*status),
            AttemptResult::Failed { status, .. } => *status,
        }
    }

    /// The failure class, `None` when delivered.
    pub fn failure(&self) -> Option<FailureClass> {
        self.outcome.result.failure_class()
    }
}

/// Told about every attempt. Implementations must be cheap and never block.
pub trait AttemptObserver: Send + Sync {
    fn attempted(&self, event: &AttemptEvent<'_>);
}

/// The default observer: observes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl AttemptObserver for NoObserver {
    fn attempted(&self, _event: &AttemptEvent<'_>) {}
}

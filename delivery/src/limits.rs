//! Per-endpoint concurrency: at most `max_concurrency` requests to one endpoint at a time
//! (`dispatcher.endpoint_concurrency` or `tiers.endpoint_concurrency` for an endpoint that sets none).
//!
//! A caller that can put a delivery off ([`SlotWait::Bounded`]: the dispatcher, the tiers before
//! the last slot) never waits long for a slot. The delivery is refused (the caller defers it to a
//! retry tier) when no slot is free and either
//! - the endpoint is *saturated*: none of its slots freed during a whole [`PERMIT_WAIT`] (a
//!   hanging endpoint; set by a waiter whose wait saw no slot free, cleared by the endpoint's next
//!   completed request), or
//! - the queue ahead is longer than the endpoint's pace clears within [`QUEUE_WAIT`] (waiters ×
//!   its mean request time / its slots: a slow endpoint).
//!
//! So a hanging or slow endpoint keeps its own slots busy and costs the others almost no waiting,
//! while a busy endpoint that keeps up (its slots turn over every few ms) queues as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookline_common::config::EndpointConfig;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

use crate::engine::lock;

/// Longest a deferrable delivery waits for an endpoint's concurrency slot before the endpoint
/// counts as saturated. Well above the slot wait of a busy endpoint that keeps up (its requests
/// take milliseconds) — a healthy endpoint deferred by mistake waits a whole tier delay — and
/// far below any timeout. Only the first waiters pay it, once per hanging period: once
/// saturated, deliveries are deferred at once until one of the endpoint's requests completes
/// (with a 10 s timeout, a hanging endpoint costs the others ~250 ms in 10 s).
pub const PERMIT_WAIT: Duration = Duration::from_millis(250);

/// Longest expected queueing for a slot (waiters ahead × mean request time / slots) before a
/// deferrable delivery to a slow endpoint is refused instead of queued.
pub const QUEUE_WAIT: Duration = Duration::from_secs(1);

/// How a delivery waits for the endpoint's concurrency slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotWait {
    /// As long as it takes (nothing to defer to).
    Unbounded,
    /// Up to [`PERMIT_WAIT`], and not at all while the endpoint is saturated.
    Bounded,
}

/// The concurrency limits of every endpoint an engine delivered to.
pub(crate) struct EndpointLimits {
    default_concurrency: usize,
    /// Per endpoint id; bounded by the number of configured endpoints.
    by_id: Mutex<HashMap<String, EndpointLimit>>,
}

#[derive(Clone)]
pub(crate) struct EndpointLimit {
    pub(crate) max: usize,
    semaphore: Arc<Semaphore>,
    /// Set when a bounded slot wait saw no slot free for [`PERMIT_WAIT`]; cleared when a request
    /// of the endpoint completes. While set, a deferrable delivery that finds no free slot is
    /// refused without waiting.
    saturated: Arc<AtomicBool>,
    /// Deferrable deliveries waiting for a slot.
    waiting: Arc<AtomicUsize>,
    /// Mean duration of the endpoint's requests, µs (moving average; 0 = none yet).
    mean_us: Arc<AtomicU64>,
    /// When a request of the endpoint last completed (freeing a slot), ms since `started`.
    last_release_ms: Arc<AtomicU64>,
    started: Instant,
}

impl EndpointLimits {
    pub(crate) fn new(default_concurrency: usize) -> Self {
        EndpointLimits {
            default_concurrency: default_concurrency.max(1),
            by_id: Mutex::new(HashMap::new()),
        }
    }

    /// The endpoint's concurrency limit.
    pub(crate) fn of(&self, endpoint: &EndpointConfig) -> EndpointLimit {
        let max = endpoint
            .max_concurrency
            .unwrap_or(self.default_concurrency)
            .clamp(1, Semaphore::MAX_PERMITS);
        let mut limits = lock(&self.by_id);
        match limits.get(&endpoint.id) {
            Some(limit) if limit.max == max => limit.clone(),
            // New endpoint, or its limit changed: requests holding permits of the old
            // semaphore finish undisturbed, new ones use the new limit.
            _ => {
                let limit = EndpointLimit {
                    max,
                    semaphore: Arc::new(Semaphore::new(max)),
                    saturated: Arc::new(AtomicBool::new(false)),
                    waiting: Arc::new(AtomicUsize::new(0)),
                    mean_us: Arc::new(AtomicU64::new(0)),
                    last_release_ms: Arc::new(AtomicU64::new(0)),
                    started: Instant::now(),
                };
                limits.insert(endpoint.id.clone(), limit.clone());
                limit
            }
        }
    }
}

impl EndpointLimit {
    /// A slot, waiting as `wait` says; `None` when a bounded wait refuses (see the module doc).
    pub(crate) async fn acquire(
        &self,
        endpoint_id: &str,
        wait: SlotWait,
    ) -> Option<OwnedSemaphorePermit> {
        match wait {
            // The semaphore is never closed, so this is always `Some`.
            SlotWait::Unbounded => self.semaphore.clone().acquire_owned().await.ok(),
            SlotWait::Bounded => self.bounded_permit(endpoint_id).await,
        }
    }

    fn since_release(&self) -> Duration {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(now.saturating_sub(self.last_release_ms.load(Ordering::Relaxed)))
    }

    /// A request finished: a slot frees, the mean moves, the endpoint is not hanging.
    pub(crate) fn released(&self, duration: Duration) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_release_ms.store(now, Ordering::Relaxed);
        let sample = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        let mean = self.mean_us.load(Ordering::Relaxed);
        let next = if mean == 0 {
            sample
        } else {
            // 1/8 weight: follows a change within ~10 requests, ignores one outlier.
            mean - mean / 8 + sample / 8
        };
        self.mean_us.store(next.max(1), Ordering::Relaxed);
        self.saturated.store(false, Ordering::Relaxed);
    }

    /// Expected wait of one more waiter for a slot, from the endpoint's pace.
    fn expected_wait(&self) -> Duration {
        let ahead = self.waiting.load(Ordering::Relaxed) as u64 + 1;
        let mean = self.mean_us.load(Ordering::Relaxed);
        Duration::from_micros(ahead.saturating_mul(mean) / self.max.max(1) as u64)
    }

    /// A free slot at once; else, unless the endpoint is saturated or its queue too long for its
    /// pace, a slot as soon as one frees, as long as slots keep freeing (one within every
    /// [`PERMIT_WAIT`]); else `None` (and, when no slot freed, the endpoint is saturated).
    async fn bounded_permit(&self, endpoint_id: &str) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.semaphore.clone().try_acquire_owned() {
            return Some(permit);
        }
        if self.saturated.load(Ordering::Relaxed) || self.expected_wait() > QUEUE_WAIT {
            return None;
        }
        let _waiting = Waiting::enter(&self.waiting);
        loop {
            match tokio::time::timeout(PERMIT_WAIT, self.semaphore.clone().acquire_owned()).await {
                Ok(Ok(permit)) => return Some(permit),
                // Its slots turn over (a busy endpoint that keeps up): keep waiting.
                _ if self.since_release() < PERMIT_WAIT => continue,
                _ => break,
            }
        }
        if !self.saturated.swap(true, Ordering::Relaxed) {
            warn!(
                endpoint = %endpoint_id,
                busy = self.max,
                wait_ms = PERMIT_WAIT.as_millis() as u64,
                "endpoint saturated: no concurrency slot freed in time, deliveries to it are \
                 deferred to the retry tiers until one of its requests completes"
            );
        }
        None
    }
}

/// Counts a deferrable delivery as waiting for a slot while it exists.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

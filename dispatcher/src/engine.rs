//! The HTTP delivery engine: one signed `POST` of an event to an endpoint, bounded in time, in
//! response size and in per-endpoint concurrency, returning what happened as an
//! [`AttemptOutcome`]. The dispatcher and the retry tiers share it; deciding what to do with a
//! failure (next tier, dead letter) is theirs.
//!
//! Contract (DESIGN.md, "Delivery to an endpoint"): body = the producer's bytes; headers
//! `content-type: application/json`, `webhook-id`, `webhook-timestamp` (per attempt),
//! `webhook-signature` (one `v1,` per secret), `webhook-attempt`; redirects are not followed.
//!
//! The status is the acknowledgement: success = a 2xx status line within the timeout (connect,
//! request, response headers). The body is diagnostics only: at most `max_response_body_bytes`
//! of it are read, for at most [`BODY_GRACE`] and never past the timeout, and how it ends (slow,
//! cut, reset) never turns a 2xx into a failure nor a non-2xx into another class. So an endpoint
//! that acknowledges at once and then trickles its body is delivered, not retried.
//!
//! Per-endpoint concurrency: at most `max_concurrency` requests to one endpoint at a time. A
//! caller that can put a delivery off ([`Engine::deliver_unless_saturated`]: the dispatcher, the
//! tiers before the last slot) never waits long for a slot. The delivery is refused (the caller
//! defers it to a retry tier) when no slot is free and either
//! - the endpoint is *saturated*: none of its slots freed during a whole [`PERMIT_WAIT`] (a
//!   hanging endpoint; set by a waiter whose wait saw no slot free, cleared by the endpoint's next
//!   completed request), or
//! - the queue ahead is longer than the endpoint's pace clears within [`QUEUE_WAIT`] (waiters ×
//!   its mean request time / its slots: a slow endpoint).
//!
//! So a hanging or slow endpoint keeps its own slots busy and costs the others almost no waiting,
//! while a busy endpoint that keeps up (its slots turn over every few ms) queues as before.

use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hookline_common::config::{EndpointConfig, HttpConfig};
use hookline_common::secret::decode_secret;
use prometheus::Registry;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};
use url::Url;

use crate::metrics::EngineMetrics;
use crate::signing;
use crate::ssrf::{BlockedAddress, GuardedResolver, SsrfGuard};

const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const WEBHOOK_ATTEMPT: HeaderName = HeaderName::from_static("webhook-attempt");

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// TCP keepalive on endpoint connections, to notice dead peers on pooled connections.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);
/// After the status line, how long the kept part of the body may take (also capped by what is
/// left of the timeout). Long enough for any body sent with its headers, short enough that a
/// trickling endpoint cannot hold a concurrency slot for long.
pub const BODY_GRACE: Duration = Duration::from_secs(1);

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

/// What one delivery attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// The attempt number sent as `webhook-attempt` (1 for the first).
    pub attempt: u32,
    /// When the request started (after the endpoint concurrency permit was granted), unix ms.
    pub started_at_ms: i64,
    /// Connect + headers + the kept body's grace; the wait for a concurrency permit is not
    /// included.
    pub duration: Duration,
    pub result: AttemptResult,
}

/// Delivered (any 2xx) or failed, with what the failure was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    Delivered {
        status: u16,
    },
    Failed {
        class: FailureClass,
        /// The response status when headers arrived.
        status: Option<u16>,
        /// Lossy UTF-8 of the kept response body, or the error text; at most
        /// `max_response_body_bytes` bytes. Never contains the endpoint URL.
        snippet: String,
    },
}

impl AttemptResult {
    pub fn is_delivered(&self) -> bool {
        matches!(self, AttemptResult::Delivered { .. })
    }
}

/// What [`Engine::deliver_unless_saturated`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The attempt was made (or refused before the network: blocked, invalid URL).
    Attempted(AttemptOutcome),
    /// No attempt: every one of the endpoint's `busy` concurrency slots is taken by requests that
    /// do not finish quickly. The caller defers the delivery.
    Saturated { busy: usize },
}

/// Why an attempt failed; a closed set used as a metric label and in delivery records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// A response arrived with a status other than 2xx (3xx included: redirects are not followed).
    HttpStatus,
    /// No response status line (connect, request, headers) within the timeout.
    Timeout,
    /// The connection could not be established (refused, unreachable, DNS failure).
    Connect,
    /// The TLS handshake failed (bad certificate, not TLS, protocol mismatch).
    Tls,
    /// Any other transport error (reset, malformed response, body error).
    Io,
    /// The endpoint's address is refused by the SSRF guard.
    Blocked,
    /// The endpoint URL is not an absolute http(s) URL with a host.
    InvalidUrl,
}

impl FailureClass {
    pub const ALL: [FailureClass; 7] = [
        FailureClass::HttpStatus,
        FailureClass::Timeout,
        FailureClass::Connect,
        FailureClass::Tls,
        FailureClass::Io,
        FailureClass::Blocked,
        FailureClass::InvalidUrl,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::HttpStatus => "http_status",
            FailureClass::Timeout => "timeout",
            FailureClass::Connect => "connect",
            FailureClass::Tls => "tls",
            FailureClass::Io => "io",
            FailureClass::Blocked => "blocked",
            FailureClass::InvalidUrl => "invalid_url",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The delivery engine. Cheap to clone: clones share the connection pool, the per-endpoint
/// concurrency limits and the metrics.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    /// One pooled client for every endpoint: no redirects, no proxy, the guarded resolver.
    client: reqwest::Client,
    guard: Arc<SsrfGuard>,
    timeout: Duration,
    max_response_body_bytes: usize,
    default_endpoint_concurrency: usize,
    /// Per endpoint id; bounded by the number of configured endpoints.
    limits: Mutex<HashMap<String, EndpointLimit>>,
    /// Endpoint ids already warned about, so a misconfigured endpoint logs once, not per event.
    warned_blocked: Mutex<HashSet<String>>,
    warned_bad_secret: Mutex<HashSet<String>>,
    metrics: EngineMetrics,
}

#[derive(Clone)]
struct EndpointLimit {
    max: usize,
    semaphore: Arc<Semaphore>,
    /// Set when a bounded slot wait saw no slot free for [`PERMIT_WAIT`]; cleared when a request
    /// of the endpoint completes. While set, a deferrable delivery that finds no free slot is
    /// refused without waiting.
    saturated: Arc<AtomicBool>,
    /// Deferrable deliveries waiting for a slot.
    waiting: Arc<AtomicUsize>,
    /// Mean duration of the endpoint's requests, µs (moving average; 0 = none yet).
    mean_us: Arc<AtomicU64>,
    /// When a request of the endpoint last completed (freeing a slot), ms since `epoch`.
    last_release_ms: Arc<AtomicU64>,
    epoch: Instant,
}

impl EndpointLimit {
    fn since_release(&self) -> Duration {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(now.saturating_sub(self.last_release_ms.load(Ordering::Relaxed)))
    }

    /// A request finished: a slot frees, the mean moves, the endpoint is not hanging.
    fn released(&self, duration: Duration) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
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

/// How a delivery waits for the endpoint's concurrency slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotWait {
    /// As long as it takes (nothing to defer to).
    Unbounded,
    /// Up to [`PERMIT_WAIT`], and not at all while the endpoint is saturated.
    Bounded,
}

impl Engine {
    /// Builds the engine; its metrics are registered on `registry`.
    ///
    /// `default_endpoint_concurrency` caps concurrent requests to an endpoint that does not set
    /// `max_concurrency` (`dispatcher.endpoint_concurrency`).
    pub fn new(
        http: &HttpConfig,
        default_endpoint_concurrency: usize,
        registry: &Registry,
    ) -> anyhow::Result<Engine> {
        let guard = Arc::new(SsrfGuard::new(&http.allow_cidrs).map_err(anyhow::Error::msg)?);
        let default_endpoint_concurrency = default_endpoint_concurrency.max(1);
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .redirect(reqwest::redirect::Policy::none())
            // A proxy from the environment would make the resolver check the proxy, not the
            // endpoint, and route deliveries somewhere the operator did not configure.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver::new(guard.clone())))
            .user_agent(http.user_agent.as_str())
            .connect_timeout(http.timeout)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(default_endpoint_concurrency)
            .tcp_keepalive(TCP_KEEPALIVE)
            .tcp_nodelay(true)
            .referer(false)
            .build()?;
        let metrics = EngineMetrics::register(registry)?;
        Ok(Engine {
            inner: Arc::new(Inner {
                client,
                guard,
                timeout: http.timeout,
                max_response_body_bytes: http.max_response_body_bytes,
                default_endpoint_concurrency,
                limits: Mutex::new(HashMap::new()),
                warned_blocked: Mutex::new(HashSet::new()),
                warned_bad_secret: Mutex::new(HashSet::new()),
                metrics,
            }),
        })
    }

    /// [`Engine::deliver`], unless `cutoff` turns true first (a graceful stop whose grace ran
    /// out, or a revoke of the record's partition): then the attempt is abandoned and reported
    /// as a `timeout` failure, so the caller hands it off like any failed attempt.
    pub async fn deliver_or_cut(
        &self,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: Bytes,
        attempt: u32,
        cutoff: watch::Receiver<bool>,
    ) -> AttemptOutcome {
        let run = self.run(endpoint, event_id, body, attempt, SlotWait::Unbounded);
        match self.cut_short(run, attempt, cutoff).await {
            Admission::Attempted(outcome) => outcome,
            Admission::Saturated { .. } => unreachable!("an unbounded slot wait never refuses"),
        }
    }

    /// Like [`Engine::deliver_or_cut`], but refuses the delivery ([`Admission::Saturated`], no
    /// request made) when no concurrency slot is free and the endpoint is saturated (none freed
    /// during [`PERMIT_WAIT`]) or its queue is longer than its pace clears within
    /// [`QUEUE_WAIT`] (see the module doc). For callers that can defer the delivery.
    pub async fn deliver_unless_saturated(
        &self,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: Bytes,
        attempt: u32,
        cutoff: watch::Receiver<bool>,
    ) -> Admission {
        let run = self.run(endpoint, event_id, body, attempt, SlotWait::Bounded);
        self.cut_short(run, attempt, cutoff).await
    }

    async fn cut_short(
        &self,
        run: impl std::future::Future<Output = Admission>,
        attempt: u32,
        mut cutoff: watch::Receiver<bool>,
    ) -> Admission {
        let started_at_ms = unix_ms_now();
        let start = Instant::now();
        let cut = async move {
            if cutoff.wait_for(|cut| *cut).await.is_err() {
                // The sender is gone without cutting: never fires.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            admission = run => admission,
            () = cut => {
                let duration = start.elapsed();
                Admission::Attempted(AttemptOutcome {
                    attempt,
                    started_at_ms,
                    duration,
                    result: AttemptResult::Failed {
                        class: FailureClass::Timeout,
                        status: None,
                        snippet: format!(
                            "attempt interrupted by shutdown or rebalance after {} ms",
                            duration.as_millis()
                        ),
                    },
                })
            }
        }
    }

    /// Makes one delivery attempt of `body` (sent unchanged) for event `event_id` to `endpoint`.
    ///
    /// Waits for a concurrency permit of the endpoint first; that wait is not part of the
    /// timeout (`endpoint.timeout`, else `http.timeout`), which bounds the exchange itself.
    /// Never panics on anything the endpoint does; every failure is an [`AttemptResult::Failed`].
    pub async fn deliver(
        &self,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: Bytes,
        attempt: u32,
    ) -> AttemptOutcome {
        match self
            .run(endpoint, event_id, body, attempt, SlotWait::Unbounded)
            .await
        {
            Admission::Attempted(outcome) => outcome,
            Admission::Saturated { .. } => unreachable!("an unbounded slot wait never refuses"),
        }
    }

    async fn run(
        &self,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: Bytes,
        attempt: u32,
        wait: SlotWait,
    ) -> Admission {
        let url = match self.target(endpoint) {
            Ok(url) => url,
            Err(result) => {
                let outcome = AttemptOutcome {
                    attempt,
                    started_at_ms: unix_ms_now(),
                    duration: Duration::ZERO,
                    result,
                };
                return Admission::Attempted(self.finish(endpoint, outcome));
            }
        };

        let limit = self.limit(endpoint);
        let _permit = match wait {
            // The semaphore is never closed, so this is always `Some`.
            SlotWait::Unbounded => limit.semaphore.clone().acquire_owned().await.ok(),
            SlotWait::Bounded => match Self::bounded_permit(endpoint, &limit).await {
                Some(permit) => Some(permit),
                None => return Admission::Saturated { busy: limit.max },
            },
        };
        let started_at_ms = unix_ms_now();
        let start = Instant::now();
        let _inflight = InflightGuard::enter(&self.inner.metrics.inflight);
        let timeout = endpoint.timeout.unwrap_or(self.inner.timeout);
        let result = self
            .exchange(endpoint, url, event_id, body, attempt, timeout)
            .await;
        let outcome = AttemptOutcome {
            attempt,
            started_at_ms,
            duration: start.elapsed(),
            result,
        };
        limit.released(outcome.duration);
        Admission::Attempted(self.finish(endpoint, outcome))
    }

    /// The endpoint URL, parsed and, when its host is an IP literal, checked by the guard
    /// (reqwest only calls the guarded resolver for names).
    fn target(&self, endpoint: &EndpointConfig) -> Result<Url, AttemptResult> {
        let invalid = |reason: &str| AttemptResult::Failed {
            class: FailureClass::InvalidUrl,
            status: None,
            snippet: self.cap(reason.to_string()),
        };
        let url = match Url::parse(&endpoint.url) {
            Ok(url) => url,
            Err(e) => return Err(invalid(&format!("endpoint url is not a url: {e}"))),
        };
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(invalid(
                "endpoint url must be http:// or https:// with a host",
            ));
        }
        if let Err(blocked) = self.inner.guard.check_url(&url) {
            return Err(AttemptResult::Failed {
                class: FailureClass::Blocked,
                status: None,
                snippet: self.cap(blocked.to_string()),
            });
        }
        Ok(url)
    }

    /// The request, bounded by `timeout` until its status line, then the bounded read of the
    /// kept part of its body.
    async fn exchange(
        &self,
        endpoint: &EndpointConfig,
        url: Url,
        event_id: &str,
        body: Bytes,
        attempt: u32,
        timeout: Duration,
    ) -> AttemptResult {
        let deadline = tokio::time::Instant::now() + timeout;
        let Ok(id_value) = HeaderValue::from_str(event_id) else {
            // The deduper rejects such ids; reaching here is a bug upstream, not the endpoint's.
            return AttemptResult::Failed {
                class: FailureClass::Io,
                status: None,
                snippet: self.cap("event id is not a valid http header value".into()),
            };
        };
        let timestamp = unix_secs_now();
        let mut headers = HeaderMap::with_capacity(5);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(WEBHOOK_ID, id_value);
        headers.insert(WEBHOOK_TIMESTAMP, HeaderValue::from(timestamp));
        headers.insert(WEBHOOK_ATTEMPT, HeaderValue::from(attempt));
        let keys = self.keys(endpoint);
        if !keys.is_empty() {
            let signature = signing::sign(&keys, event_id, timestamp, &body);
            if let Ok(value) = HeaderValue::from_str(&signature) {
                headers.insert(WEBHOOK_SIGNATURE, value);
            }
        }

        // `send` resolves when the status line and headers arrived.
        let sent = tokio::time::timeout_at(
            deadline,
            self.inner
                .client
                .post(url)
                .headers(headers)
                .body(body)
                .send(),
        )
        .await;
        let mut response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => return self.transport_failure(err, None),
            Err(_elapsed) => {
                return AttemptResult::Failed {
                    class: FailureClass::Timeout,
                    status: None,
                    snippet: self.cap(format!(
                        "no response status within {} ms",
                        timeout.as_millis()
                    )),
                }
            }
        };
        let status = response.status().as_u16();

        // The status decided the result; the body is diagnostics. Read only what is kept, within
        // the grace, then drop the response: the rest is never buffered. When the body ends
        // within the cap (the usual empty or small body) the connection is reused.
        let grace = BODY_GRACE.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let kept = read_kept(&mut response, self.inner.max_response_body_bytes, grace).await;
        drop(response);

        if (200..300).contains(&status) {
            AttemptResult::Delivered { status }
        } else {
            AttemptResult::Failed {
                class: FailureClass::HttpStatus,
                status: Some(status),
                snippet: self.cap(String::from_utf8_lossy(&kept).into_owned()),
            }
        }
    }

    /// Classifies a reqwest error and keeps its text (without the URL, which may carry tokens).
    fn transport_failure(&self, err: reqwest::Error, status: Option<u16>) -> AttemptResult {
        let err = err.without_url();
        let class = classify(&err);
        if class == FailureClass::Blocked {
            if let Some(blocked) = find_in_chain::<BlockedAddress>(&err) {
                // The resolver's error is the useful text; reqwest's wrapping adds nothing.
                return AttemptResult::Failed {
                    class,
                    status,
                    snippet: self.cap(blocked.to_string()),
                };
            }
        }
        AttemptResult::Failed {
            class,
            status,
            snippet: self.cap(error_text(&err)),
        }
    }

    /// The decoded keys of the endpoint's secrets; an undecodable one is skipped and warned
    /// about once (config validation rejects them, so this is a safety net).
    fn keys(&self, endpoint: &EndpointConfig) -> Vec<Vec<u8>> {
        let mut keys = Vec::with_capacity(endpoint.secrets.len());
        for (index, secret) in endpoint.secrets.iter().enumerate() {
            match decode_secret(secret) {
                Ok(key) => keys.push(key),
                Err(reason) => {
                    if first_time(&self.inner.warned_bad_secret, &endpoint.id) {
                        warn!(
                            endpoint = %endpoint.id,
                            index,
                            %reason,
                            "endpoint secret cannot be decoded, signing without it"
                        );
                    }
                }
            }
        }
        keys
    }

    /// The endpoint's concurrency limit.
    fn limit(&self, endpoint: &EndpointConfig) -> EndpointLimit {
        let max = endpoint
            .max_concurrency
            .unwrap_or(self.inner.default_endpoint_concurrency)
            .clamp(1, Semaphore::MAX_PERMITS);
        let mut limits = lock(&self.inner.limits);
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
                    epoch: Instant::now(),
                };
                limits.insert(endpoint.id.clone(), limit.clone());
                limit
            }
        }
    }

    /// A free slot at once; else, unless the endpoint is saturated or its queue too long for its
    /// pace, a slot as soon as one frees, as long as slots keep freeing (one within every
    /// [`PERMIT_WAIT`]); else `None` (and, when no slot freed, the endpoint is saturated).
    async fn bounded_permit(
        endpoint: &EndpointConfig,
        limit: &EndpointLimit,
    ) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = limit.semaphore.clone().try_acquire_owned() {
            return Some(permit);
        }
        if limit.saturated.load(Ordering::Relaxed) || limit.expected_wait() > QUEUE_WAIT {
            return None;
        }
        let _waiting = Waiting::enter(&limit.waiting);
        loop {
            match tokio::time::timeout(PERMIT_WAIT, limit.semaphore.clone().acquire_owned()).await {
                Ok(Ok(permit)) => return Some(permit),
                // Its slots turn over (a busy endpoint that keeps up): keep waiting.
                _ if limit.since_release() < PERMIT_WAIT => continue,
                _ => break,
            }
        }
        if !limit.saturated.swap(true, Ordering::Relaxed) {
            warn!(
                endpoint = %endpoint.id,
                busy = limit.max,
                wait_ms = PERMIT_WAIT.as_millis() as u64,
                "endpoint saturated: no concurrency slot freed in time, deliveries to it are \
                 deferred to the retry tiers until one of its requests completes"
            );
        }
        None
    }

    /// Counts the outcome and logs what must be logged.
    fn finish(&self, endpoint: &EndpointConfig, outcome: AttemptOutcome) -> AttemptOutcome {
        self.inner.metrics.observe(&outcome);
        let duration_ms = u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX);
        match &outcome.result {
            AttemptResult::Delivered { status } => {
                debug!(
                    endpoint = %endpoint.id,
                    attempt = outcome.attempt,
                    status,
                    duration_ms,
                    "delivery attempt succeeded"
                );
            }
            AttemptResult::Failed { class, status, .. } => {
                if *class == FailureClass::Blocked
                    && first_time(&self.inner.warned_blocked, &endpoint.id)
                {
                    warn!(endpoint = %endpoint.id, "endpoint address blocked by the SSRF guard");
                }
                debug!(
                    endpoint = %endpoint.id,
                    attempt = outcome.attempt,
                    class = class.as_str(),
                    status,
                    duration_ms,
                    "delivery attempt failed"
                );
            }
        }
        outcome
    }

    /// Cuts `text` to at most `max_response_body_bytes` bytes, on a character boundary.
    fn cap(&self, text: String) -> String {
        truncate_utf8(text, self.inner.max_response_body_bytes)
    }
}

/// Up to `max` bytes of the response body, whatever arrived within `grace`; a body that is slow,
/// endless or broken just ends the read early.
async fn read_kept(response: &mut reqwest::Response, max: usize, grace: Duration) -> Vec<u8> {
    let mut kept: Vec<u8> = Vec::new();
    let read = async {
        while kept.len() < max {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let take = chunk.len().min(max - kept.len());
                    kept.extend_from_slice(&chunk[..take]);
                }
                Ok(None) | Err(_) => break,
            }
        }
    };
    // Elapsed: what arrived so far is what is kept.
    let _ = tokio::time::timeout(grace, read).await;
    kept
}

/// Keeps the in-flight gauge right even when the delivery future is dropped mid-flight.
struct InflightGuard<'a>(&'a prometheus::IntGauge);

impl<'a> InflightGuard<'a> {
    fn enter(gauge: &'a prometheus::IntGauge) -> Self {
        gauge.inc();
        InflightGuard(gauge)
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn classify(err: &reqwest::Error) -> FailureClass {
    if err.is_timeout() {
        FailureClass::Timeout
    } else if find_in_chain::<BlockedAddress>(err).is_some() {
        FailureClass::Blocked
    } else if find_in_chain::<rustls::Error>(err).is_some() {
        FailureClass::Tls
    } else if err.is_connect() {
        FailureClass::Connect
    } else {
        FailureClass::Io
    }
}

/// Finds an error of type `T` in the `source()` chain of `err`, looking inside
/// `std::io::Error`s: their `source()` skips the error they wrap, and TLS failures arrive as a
/// `rustls::Error` inside an `io::Error` (tokio-rustls) inside another `io::Error` (the connector).
fn find_in_chain<'a, T: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

/// `outer: cause: root cause`, skipping repeats.
fn error_text(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut last = text.clone();
    let mut current = err.source();
    while let Some(e) = current {
        let part = e.to_string();
        if part != last && !last.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        last = part;
        current = e.source();
    }
    text
}

fn truncate_utf8(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

/// Inserts `id` into `set`, telling whether it was new.
fn first_time(set: &Mutex<HashSet<String>>, id: &str) -> bool {
    let mut set = lock(set);
    if set.contains(id) {
        false
    } else {
        set.insert(id.to_string());
        true
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_ms_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn unix_secs_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::Body;
    use axum::extract::State;
    use axum::http::{HeaderMap as AxumHeaders, StatusCode};
    use axum::routing::{any, post};
    use axum::Router;
    use tokio::io::AsyncWriteExt;

    const SECRET_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SECRET_B: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const KEEP: usize = 1024;

    fn http_config(allow_loopback: bool) -> HttpConfig {
        HttpConfig {
            timeout: Duration::from_secs(5),
            max_response_body_bytes: KEEP,
            allow_cidrs: if allow_loopback {
                vec!["127.0.0.0/8".to_string()]
            } else {
                Vec::new()
            },
            user_agent: "hookline-test/1".to_string(),
        }
    }

    fn engine_with(http: &HttpConfig) -> (Engine, Registry) {
        let registry = Registry::new();
        let engine = Engine::new(http, 8, &registry).expect("engine");
        (engine, registry)
    }

    fn engine() -> Engine {
        engine_with(&http_config(true)).0
    }

    fn endpoint(url: String) -> EndpointConfig {
        EndpointConfig {
            id: "ep-1".to_string(),
            url,
            secrets: Vec::new(),
            tenant: None,
            event_types: Vec::new(),
            enabled: true,
            timeout: None,
            max_concurrency: None,
        }
    }

    async fn serve(router: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        addr
    }

    fn body(text: &'static str) -> Bytes {
        Bytes::from_static(text.as_bytes())
    }

    fn failed(outcome: &AttemptOutcome) -> (FailureClass, Option<u16>, &str) {
        match &outcome.result {
            AttemptResult::Failed {
                class,
                status,
                snippet,
            } => (*class, *status, snippet.as_str()),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    /// What the recording receiver saw.
    #[derive(Default)]
    struct Recorded {
        requests: Mutex<Vec<(AxumHeaders, Bytes)>>,
    }

    async fn record(
        State(rec): State<Arc<Recorded>>,
        headers: AxumHeaders,
        body: Bytes,
    ) -> StatusCode {
        lock(&rec.requests).push((headers, body));
        StatusCode::OK
    }

    #[tokio::test]
    async fn delivered_with_exact_body_headers_and_verifiable_signatures() {
        let rec = Arc::new(Recorded::default());
        let addr = serve(
            Router::new()
                .route("/hook", post(record))
                .with_state(rec.clone()),
        )
        .await;
        let mut ep = endpoint(format!("http://{addr}/hook"));
        ep.secrets = vec![SECRET_A.to_string(), SECRET_B.to_string()];
        let payload =
            body("{\"id\":\"evt_1\",  \"type\":\"t\",\"data\":{\"s\":\"h\u{e9}llo \\u00e9\"}}\n");

        let before = unix_secs_now();
        let outcome = engine().deliver(&ep, "evt_1", payload.clone(), 3).await;
        assert_eq!(outcome.result, AttemptResult::Delivered { status: 200 });
        assert_eq!(outcome.attempt, 3);
        assert!(outcome.started_at_ms >= before * 1000);

        let requests = lock(&rec.requests);
        assert_eq!(requests.len(), 1);
        let (headers, got) = &requests[0];
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("missing header {name}"))
                .to_string()
        };
        assert_eq!(got, &payload, "body must be byte-identical");
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(header("webhook-id"), "evt_1");
        assert_eq!(header("webhook-attempt"), "3");
        assert_eq!(header("user-agent"), "hookline-test/1");
        let timestamp: i64 = header("webhook-timestamp").parse().expect("timestamp");
        assert!((before..=unix_secs_now()).contains(&timestamp));
        let signature = header("webhook-signature");
        assert_eq!(signature.split(' ').count(), 2, "{signature}");
        for secret in [SECRET_A, SECRET_B] {
            let key = decode_secret(secret).expect("key");
            assert!(signing::verify(&key, "evt_1", timestamp, got, &signature));
        }
    }

    #[tokio::test]
    async fn no_secrets_means_no_signature_header_and_bad_secrets_are_skipped() {
        let rec = Arc::new(Recorded::default());
        let addr = serve(
            Router::new()
                .route("/", post(record))
                .with_state(rec.clone()),
        )
        .await;
        let engine = engine();
        let mut ep = endpoint(format!("http://{addr}/"));
        let outcome = engine.deliver(&ep, "evt_2", body("{}"), 1).await;
        assert!(outcome.result.is_delivered(), "{outcome:?}");
        ep.secrets = vec!["whsec_!!!".to_string(), SECRET_A.to_string()];
        let outcome = engine.deliver(&ep, "evt_2", body("{}"), 2).await;
        assert!(outcome.result.is_delivered(), "{outcome:?}");

        let requests = lock(&rec.requests);
        assert!(requests[0].0.get("webhook-signature").is_none());
        let signature = requests[1].0["webhook-signature"].to_str().expect("ascii");
        assert_eq!(
            signature.split(' ').count(),
            1,
            "only the decodable secret signs"
        );
    }

    #[tokio::test]
    async fn server_error_is_an_http_status_failure_with_the_body_snippet() {
        let router = Router::new().route(
            "/",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom: database down") }),
        );
        let addr = serve(router).await;
        let outcome = engine()
            .deliver(&endpoint(format!("http://{addr}/")), "evt", body("{}"), 1)
            .await;
        assert_eq!(
            failed(&outcome),
            (FailureClass::HttpStatus, Some(500), "boom: database down")
        );
    }

    #[tokio::test]
    async fn redirect_is_a_failure_and_is_not_followed() {
        let target_hits = Arc::new(AtomicUsize::new(0));
        let hits = target_hits.clone();
        let router = Router::new()
            .route(
                "/",
                post(|| async { (StatusCode::FOUND, [("location", "/target")], "moved") }),
            )
            .route(
                "/target",
                any(move || {
                    hits.fetch_add(1, Ordering::SeqCst);
                    async { StatusCode::OK }
                }),
            );
        let addr = serve(router).await;
        let outcome = engine()
            .deliver(&endpoint(format!("http://{addr}/")), "evt", body("{}"), 1)
            .await;
        assert_eq!(
            failed(&outcome),
            (FailureClass::HttpStatus, Some(302), "moved")
        );
        assert_eq!(
            target_hits.load(Ordering::SeqCst),
            0,
            "redirect was followed"
        );
    }

    #[tokio::test]
    async fn slow_endpoint_times_out_near_its_timeout() {
        let router = Router::new().route(
            "/",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                StatusCode::OK
            }),
        );
        let addr = serve(router).await;
        let mut ep = endpoint(format!("http://{addr}/"));
        let timeout = Duration::from_millis(300);
        ep.timeout = Some(timeout);
        let outcome = engine().deliver(&ep, "evt", body("{}"), 1).await;
        assert_eq!(failed(&outcome).0, FailureClass::Timeout);
        assert!(outcome.duration >= timeout, "{:?}", outcome.duration);
        assert!(
            outcome.duration < timeout + Duration::from_secs(1),
            "{:?}",
            outcome.duration
        );
    }

    #[tokio::test]
    async fn refused_connection_is_a_connect_failure() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("addr").port()
        };
        let outcome = engine()
            .deliver(
                &endpoint(format!("http://127.0.0.1:{port}/")),
                "evt",
                body("{}"),
                1,
            )
            .await;
        let (class, status, snippet) = failed(&outcome);
        assert_eq!((class, status), (FailureClass::Connect, None), "{snippet}");
        assert!(
            !snippet.contains("127.0.0.1"),
            "the url stays out: {snippet}"
        );
    }

    #[tokio::test]
    async fn loopback_is_blocked_without_the_allow_list_and_never_connected() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let (engine, registry) = engine_with(&http_config(false));
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://2130706433:{port}/"),
            format!("http://0x7f000001:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            // A name: blocked by the resolver, inside the HTTP client.
            format!("http://localhost:{port}/"),
        ] {
            let outcome = engine
                .deliver(&endpoint(url.clone()), "evt", body("{}"), 1)
                .await;
            let (class, _, snippet) = failed(&outcome);
            assert_eq!(class, FailureClass::Blocked, "{url}: {snippet}");
            assert!(snippet.contains("blocked"), "{url}: {snippet}");
        }
        // A connection attempt would have completed its handshake in the accept queue before
        // deliver returned; none is there.
        match listener.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the guarded server received a connection: {other:?}"),
        }
        assert_eq!(counter(&registry, "failed", "blocked"), 5.0);
    }

    #[tokio::test]
    async fn allow_listed_name_resolves_through_the_guarded_resolver() {
        let rec = Arc::new(Recorded::default());
        let addr = serve(
            Router::new()
                .route("/", post(record))
                .with_state(rec.clone()),
        )
        .await;
        let url = format!("http://localhost:{}/", addr.port());
        let outcome = engine().deliver(&endpoint(url), "evt", body("{}"), 1).await;
        assert_eq!(outcome.result, AttemptResult::Delivered { status: 200 });
        assert_eq!(lock(&rec.requests).len(), 1);
    }

    #[tokio::test]
    async fn large_response_body_is_cut_to_the_kept_size() {
        let router = Router::new().route(
            "/",
            post(|| async { (StatusCode::BAD_REQUEST, "x".repeat(1024 * 1024)) }),
        );
        let addr = serve(router).await;
        let outcome = engine()
            .deliver(&endpoint(format!("http://{addr}/")), "evt", body("{}"), 1)
            .await;
        let (class, status, snippet) = failed(&outcome);
        assert_eq!((class, status), (FailureClass::HttpStatus, Some(400)));
        assert_eq!(snippet.len(), KEEP);
        assert!(snippet.bytes().all(|b| b == b'x'));
        assert!(
            outcome.duration < Duration::from_secs(2),
            "{:?}",
            outcome.duration
        );
    }

    #[tokio::test]
    async fn body_beyond_the_kept_part_is_never_waited_for() {
        // 1 MiB, then a body that never ends: reading it all would hit the 5 s timeout.
        let router = Router::new().route(
            "/",
            post(|| async {
                let first = futures::stream::once(async {
                    Ok::<_, std::io::Error>(Bytes::from(vec![b'y'; 1024 * 1024]))
                });
                let stream = futures::StreamExt::chain(first, futures::stream::pending());
                (StatusCode::SERVICE_UNAVAILABLE, Body::from_stream(stream))
            }),
        );
        let addr = serve(router).await;
        let outcome = engine()
            .deliver(&endpoint(format!("http://{addr}/")), "evt", body("{}"), 1)
            .await;
        let (class, status, snippet) = failed(&outcome);
        assert_eq!((class, status), (FailureClass::HttpStatus, Some(503)));
        assert_eq!(snippet.len(), KEEP);
        assert!(
            outcome.duration < Duration::from_secs(2),
            "{:?}",
            outcome.duration
        );
    }

    /// A response with `status` at once, then one `.` every 50 ms, forever.
    fn trickling(status: StatusCode) -> Router {
        Router::new().route(
            "/",
            post(move || async move {
                let stream = futures::stream::unfold((), |()| async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Some((Ok::<_, std::io::Error>(Bytes::from_static(b".")), ()))
                });
                (status, Body::from_stream(stream))
            }),
        )
    }

    #[tokio::test]
    async fn ok_status_is_delivered_however_slow_its_body() {
        let addr = serve(trickling(StatusCode::OK)).await;
        let mut ep = endpoint(format!("http://{addr}/"));
        let timeout = Duration::from_millis(600);
        ep.timeout = Some(timeout);
        let outcome = engine().deliver(&ep, "evt", body("{}"), 1).await;
        assert_eq!(outcome.result, AttemptResult::Delivered { status: 200 });
        // The body read is cut at the timeout at the latest (grace = min(1 s, time left)).
        assert!(
            outcome.duration < timeout + Duration::from_millis(400),
            "{:?}",
            outcome.duration
        );
    }

    #[tokio::test]
    async fn error_status_keeps_what_its_body_sent_within_the_grace() {
        let addr = serve(trickling(StatusCode::SERVICE_UNAVAILABLE)).await;
        // Timeout 5 s: the grace (1 s) is the bound, not the timeout.
        let outcome = engine()
            .deliver(&endpoint(format!("http://{addr}/")), "evt", body("{}"), 1)
            .await;
        let (class, status, snippet) = failed(&outcome);
        assert_eq!((class, status), (FailureClass::HttpStatus, Some(503)));
        assert!(
            !snippet.is_empty() && snippet.bytes().all(|b| b == b'.'),
            "{snippet:?}"
        );
        assert!(
            outcome.duration >= BODY_GRACE && outcome.duration < BODY_GRACE * 2,
            "{:?}",
            outcome.duration
        );
    }

    #[tokio::test]
    async fn ok_status_with_a_broken_body_is_still_delivered() {
        // Status line and a content-length the server never honours: the body ends in an error.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut request).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort")
                    .await;
                // Closed with 95 bytes missing.
            }
        });
        let outcome = engine()
            .deliver(&endpoint(format!("http://{addr}/")), "evt", body("{}"), 1)
            .await;
        assert_eq!(outcome.result, AttemptResult::Delivered { status: 200 });
    }

    #[derive(Default)]
    struct Concurrency {
        current: AtomicUsize,
        max: AtomicUsize,
    }

    async fn slow_counting(State(c): State<Arc<Concurrency>>) -> StatusCode {
        let now = c.current.fetch_add(1, Ordering::SeqCst) + 1;
        c.max.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(150)).await;
        c.current.fetch_sub(1, Ordering::SeqCst);
        StatusCode::OK
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn endpoint_concurrency_is_capped() {
        let seen = Arc::new(Concurrency::default());
        let addr = serve(
            Router::new()
                .route("/", post(slow_counting))
                .with_state(seen.clone()),
        )
        .await;
        let engine = engine();
        let mut ep = endpoint(format!("http://{addr}/"));
        ep.max_concurrency = Some(2);
        let deliveries = (0..6).map(|i| {
            let engine = engine.clone();
            let ep = ep.clone();
            tokio::spawn(async move {
                engine
                    .deliver(&ep, &format!("evt_{i}"), body("{}"), 1)
                    .await
            })
        });
        for outcome in futures::future::join_all(deliveries).await {
            let outcome = outcome.expect("task");
            assert!(outcome.result.is_delivered(), "{outcome:?}");
        }
        assert_eq!(
            seen.max.load(Ordering::SeqCst),
            2,
            "at most 2, and the cap is used"
        );
    }

    #[tokio::test]
    async fn tls_handshake_failure_is_a_tls_failure() {
        // A plain HTTP speaker: the TLS client gets "HTTP/1.1 400" where a ServerHello belongs.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
                // Keep it open until the client gives up.
                let mut sink = [0u8; 1024];
                let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut sink).await;
            }
        });
        let outcome = engine()
            .deliver(&endpoint(format!("https://{addr}/")), "evt", body("{}"), 1)
            .await;
        let (class, _, snippet) = failed(&outcome);
        assert_eq!(class, FailureClass::Tls, "{snippet}");
    }

    #[tokio::test]
    async fn unusable_urls_are_invalid_url_failures() {
        let engine = engine();
        for url in [
            "not a url",
            "ftp://example.com/hook",
            "mailto:ops@example.com",
        ] {
            let outcome = engine
                .deliver(&endpoint(url.to_string()), "evt", body("{}"), 1)
                .await;
            assert_eq!(failed(&outcome).0, FailureClass::InvalidUrl, "{url}");
        }
    }

    #[tokio::test]
    async fn snippets_are_cut_on_character_boundaries() {
        assert_eq!(truncate_utf8("h\u{e9}llo".to_string(), 2), "h");
        assert_eq!(truncate_utf8("abc".to_string(), 3), "abc");
        assert_eq!(truncate_utf8("abc".to_string(), 0), "");
    }

    fn counter(registry: &Registry, result: &str, class: &str) -> f64 {
        registry
            .gather()
            .iter()
            .filter(|family| family.name() == "hookline_dispatcher_attempts_total")
            .flat_map(|family| family.get_metric().iter())
            .filter(|m| {
                let label = |n: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == n)
                        .map(|l| l.value().to_string())
                };
                label("result").as_deref() == Some(result)
                    && label("class").as_deref() == Some(class)
            })
            .map(|m| m.get_counter().get_value())
            .sum()
    }

    #[tokio::test]
    async fn metrics_count_attempts_by_result_and_class() {
        let router = Router::new()
            .route("/ok", post(|| async { StatusCode::NO_CONTENT }))
            .route("/bad", post(|| async { StatusCode::BAD_GATEWAY }));
        let addr = serve(router).await;
        let (engine, registry) = engine_with(&http_config(true));
        let ok = engine
            .deliver(&endpoint(format!("http://{addr}/ok")), "evt", body("{}"), 1)
            .await;
        assert_eq!(ok.result, AttemptResult::Delivered { status: 204 });
        let bad = engine
            .deliver(
                &endpoint(format!("http://{addr}/bad")),
                "evt",
                body("{}"),
                1,
            )
            .await;
        assert_eq!(failed(&bad).0, FailureClass::HttpStatus);

        assert_eq!(counter(&registry, "delivered", "ok"), 1.0);
        assert_eq!(counter(&registry, "failed", "http_status"), 1.0);
        assert_eq!(counter(&registry, "failed", "timeout"), 0.0);
        let families = registry.gather();
        let find = |name: &str| {
            families
                .iter()
                .find(|f| f.name() == name)
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        let histogram = find("hookline_dispatcher_attempt_duration_seconds").get_metric()[0]
            .get_histogram()
            .get_sample_count();
        assert_eq!(histogram, 2);
        let inflight = find("hookline_dispatcher_inflight_requests").get_metric()[0]
            .get_gauge()
            .get_value();
        assert_eq!(inflight, 0.0);
    }
}

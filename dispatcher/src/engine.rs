//! The HTTP delivery engine: one signed `POST` of an event to an endpoint, bounded in time, in
//! response size and in per-endpoint concurrency, returning what happened as an
//! [`AttemptOutcome`]. The dispatcher and the retry tiers share it; deciding what to do with a
//! failure (next tier, dead letter) is theirs.
//!
//! Contract (DESIGN.md, "Delivery to an endpoint"): body = the producer's bytes; headers
//! `content-type: application/json`, `webhook-id`, `webhook-timestamp` (per attempt),
//! `webhook-signature` (one `v1,` per secret), `webhook-attempt`; success = any 2xx within the
//! timeout, which covers connect, headers and the kept part of the body; redirects are not
//! followed; at most `max_response_body_bytes` of the response are read.

use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hookline_common::config::{EndpointConfig, HttpConfig};
use hookline_common::secret::decode_secret;
use prometheus::Registry;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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

/// What one delivery attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// The attempt number sent as `webhook-attempt` (1 for the first).
    pub attempt: u32,
    /// When the request started (after the endpoint concurrency permit was granted), unix ms.
    pub started_at_ms: i64,
    /// Connect + headers + kept body; the wait for a concurrency permit is not included.
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

/// Why an attempt failed; a closed set used as a metric label and in delivery records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// A response arrived with a status other than 2xx (3xx included: redirects are not followed).
    HttpStatus,
    /// No complete response (connect, headers, kept body) within the timeout.
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

struct EndpointLimit {
    max: usize,
    semaphore: Arc<Semaphore>,
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
        let url = match self.target(endpoint) {
            Ok(url) => url,
            Err(result) => {
                let outcome = AttemptOutcome {
                    attempt,
                    started_at_ms: unix_ms_now(),
                    duration: Duration::ZERO,
                    result,
                };
                return self.finish(endpoint, outcome);
            }
        };

        let _permit = self.permit(endpoint).await;
        let started_at_ms = unix_ms_now();
        let start = Instant::now();
        let _inflight = InflightGuard::enter(&self.inner.metrics.inflight);
        let timeout = endpoint.timeout.unwrap_or(self.inner.timeout);
        let mut status_seen = None;
        let exchanged = tokio::time::timeout(
            timeout,
            self.exchange(endpoint, url, event_id, body, attempt, &mut status_seen),
        )
        .await;
        let result = exchanged.unwrap_or_else(|_elapsed| AttemptResult::Failed {
            class: FailureClass::Timeout,
            status: status_seen,
            snippet: self.cap(format!(
                "no complete response within {} ms",
                timeout.as_millis()
            )),
        });
        let outcome = AttemptOutcome {
            attempt,
            started_at_ms,
            duration: start.elapsed(),
            result,
        };
        self.finish(endpoint, outcome)
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
            return Err(invalid("endpoint url must be http:// or https:// with a host"));
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

    /// The request and the capped read of its response; `status_seen` is set as soon as the
    /// headers arrive so a timeout during the body read still reports the status.
    async fn exchange(
        &self,
        endpoint: &EndpointConfig,
        url: Url,
        event_id: &str,
        body: Bytes,
        attempt: u32,
        status_seen: &mut Option<u16>,
    ) -> AttemptResult {
        let Ok(id_value) = HeaderValue::from_str(event_id) else {
            // The deduper rejects such ids; reaching here is a bug upstream, not the endpoint's.
            return AttemptResult::Failed {
                class: FailureClass::Io,
                status: None,
                snippet: "event id is not a valid http header value".into(),
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

        let sent = self
            .inner
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(err) => return self.transport_failure(endpoint, err, None),
        };
        let status = response.status().as_u16();
        *status_seen = Some(status);

        // Read only what is kept, then drop the response: the rest is never buffered. When the
        // body ends within the cap (the usual empty or small body) the connection is reused.
        let max = self.inner.max_response_body_bytes;
        let mut kept: Vec<u8> = Vec::new();
        while kept.len() < max {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let take = chunk.len().min(max - kept.len());
                    kept.extend_from_slice(&chunk[..take]);
                }
                Ok(None) => break,
                Err(err) => return self.transport_failure(endpoint, err, Some(status)),
            }
        }
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
    fn transport_failure(
        &self,
        endpoint: &EndpointConfig,
        err: reqwest::Error,
        status: Option<u16>,
    ) -> AttemptResult {
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
                        warn!(endpoint = %endpoint.id, index, %reason, "endpoint secret cannot be decoded, signing without it");
                    }
                }
            }
        }
        keys
    }

    /// Waits for a concurrency permit of the endpoint.
    async fn permit(&self, endpoint: &EndpointConfig) -> Option<OwnedSemaphorePermit> {
        let max = endpoint
            .max_concurrency
            .unwrap_or(self.inner.default_endpoint_concurrency)
            .clamp(1, Semaphore::MAX_PERMITS);
        let semaphore = {
            let mut limits = lock(&self.inner.limits);
            match limits.get(&endpoint.id) {
                Some(limit) if limit.max == max => limit.semaphore.clone(),
                // New endpoint, or its limit changed: requests holding permits of the old
                // semaphore finish undisturbed, new ones use the new limit.
                _ => {
                    let semaphore = Arc::new(Semaphore::new(max));
                    limits.insert(
                        endpoint.id.clone(),
                        EndpointLimit {
                            max,
                            semaphore: semaphore.clone(),
                        },
                    );
                    semaphore
                }
            }
        };
        // The semaphore is never closed, so this is always `Some`.
        semaphore.acquire_owned().await.ok()
    }

    /// Counts the outcome and logs what must be logged.
    fn finish(&self, endpoint: &EndpointConfig, outcome: AttemptOutcome) -> AttemptOutcome {
        self.inner.metrics.observe(&outcome);
        match &outcome.result {
            AttemptResult::Delivered { status } => {
                debug!(endpoint = %endpoint.id, attempt = outcome.attempt, status, duration_ms = outcome.duration.as_millis() as u64, "delivery attempt succeeded");
            }
            AttemptResult::Failed { class, status, .. } => {
                if *class == FailureClass::Blocked
                    && first_time(&self.inner.warned_blocked, &endpoint.id)
                {
                    warn!(endpoint = %endpoint.id, "endpoint address blocked by the SSRF guard");
                }
                debug!(endpoint = %endpoint.id, attempt = outcome.attempt, class = class.as_str(), status, duration_ms = outcome.duration.as_millis() as u64, "delivery attempt failed");
            }
        }
        outcome
    }

    /// Cuts `text` to at most `max_response_body_bytes` bytes, on a character boundary.
    fn cap(&self, text: String) -> String {
        truncate_utf8(text, self.inner.max_response_body_bytes)
    }
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

/// Finds an error of type `T` in the `source()` chain of `err`. Also looks inside
/// `std::io::Error`s, whose `source()` skips the error they wrap (tokio-rustls reports TLS
/// failures as an `io::Error` wrapping a `rustls::Error`).
fn find_in_chain<T: StdError + 'static>(err: &(dyn StdError + 'static)) -> Option<&T> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(found) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<T>())
        {
            return Some(found);
        }
        current = e.source();
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


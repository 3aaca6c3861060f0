//! The HTTP delivery engine: one signed `POST` of an event to an endpoint, bounded in time, in
//! response size and in per-endpoint concurrency ([`crate::limits`]), returning what happened as
//! an [`AttemptOutcome`]. Deciding what to do with the outcome (next tier, dead letter) is the
//! delivery path's ([`crate::attempt`]).
//!
//! Contract (DESIGN.md, "Delivery to an endpoint"): body = the producer's bytes; headers from
//! [`crate::request`]; redirects are not followed.
//!
//! The status is the acknowledgement: success = a 2xx status line within the timeout (connect,
//! request, response headers). The body is diagnostics only: at most `max_response_body_bytes`
//! of it are read, for at most [`BODY_GRACE`] and never past the timeout, and how it ends (slow,
//! cut, reset) never turns a 2xx into a failure nor a non-2xx into another class. So an endpoint
//! that acknowledges at once and then trickles its body is delivered, not retried.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hookline_common::config::{EndpointConfig, HttpConfig};
use hookline_common::runtime::clock::{now_ms, now_secs};
use http::header::{HeaderValue, USER_AGENT};
use http::{Method, Request};
use prometheus::{IntCounter, IntGauge, Registry};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::client::{self, truncate_utf8};
use crate::conn;
use crate::limits::{EndpointLimits, SlotWait};
use crate::metrics;
use crate::outcome::{Admission, AttemptOutcome, AttemptResult, FailureClass};
use crate::request::webhook_headers;
use crate::ssrf::SsrfGuard;

/// After the status line, how long the kept part of the body may take (also capped by what is
/// left of the timeout). Long enough for any body sent with its headers, short enough that a
/// trickling endpoint cannot hold a concurrency slot for long.
pub const BODY_GRACE: Duration = Duration::from_secs(1);

tokio::task_local! {
    /// The W3C `traceparent` of the attempt's span, sent with the request: set by the delivery
    /// path around an attempt it traces (never while tracing is off).
    pub static TRACEPARENT: String;
}

/// The delivery engine. Cheap to clone: clones share the connection pool, the per-endpoint
/// concurrency limits and the in-flight gauge.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    /// One pooled client for every endpoint (no redirects, no proxy, the guarded resolver), and
    /// its never-pooling twin for a request that went stale on a reused connection.
    clients: client::Clients,
    /// The `user-agent` of every request (`http.user_agent`).
    user_agent: HeaderValue,
    guard: Arc<SsrfGuard>,
    timeout: Duration,
    max_response_body_bytes: usize,
    limits: EndpointLimits,
    /// Endpoint ids already warned about, so a misconfigured endpoint logs once, not per event.
    warned_blocked: Mutex<HashSet<String>>,
    /// Requests on the wire (holding an endpoint concurrency permit).
    inflight: IntGauge,
    /// Requests sent again on a new connection (`hookline_delivery_stale_connection_retries_total`).
    stale_retries: IntCounter,
}

impl Engine {
    /// Builds the engine of `stage` (`dispatcher`, `retry`, `replay`); its in-flight gauge and
    /// its stale-connection counter are registered on `registry`
    /// (`hookline_delivery_inflight_requests{stage}`,
    /// `hookline_delivery_stale_connection_retries_total{stage}`).
    ///
    /// `default_endpoint_concurrency` caps concurrent requests to an endpoint that does not set
    /// `max_concurrency`.
    pub fn new(
        http: &HttpConfig,
        default_endpoint_concurrency: usize,
        registry: &Registry,
        stage: &str,
    ) -> anyhow::Result<Engine> {
        let guard = Arc::new(SsrfGuard::new(&http.allow_cidrs).map_err(anyhow::Error::msg)?);
        let limits = EndpointLimits::new(default_endpoint_concurrency);
        let clients = client::build(http, guard.clone(), default_endpoint_concurrency.max(1))?;
        let user_agent = HeaderValue::from_str(&http.user_agent).map_err(|_| {
            anyhow::anyhow!(
                "http.user_agent is not a valid header value: {:?}",
                http.user_agent
            )
        })?;
        let inflight = metrics::inflight_requests(registry, stage)?;
        let stale_retries = metrics::stale_connection_retries(registry, stage)?;
        Ok(Engine {
            inner: Arc::new(Inner {
                clients,
                user_agent,
                guard,
                timeout: http.timeout,
                max_response_body_bytes: http.max_response_body_bytes,
                limits,
                warned_blocked: Mutex::new(HashSet::new()),
                inflight,
                stale_retries,
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
        unbounded(self.cut_short(run, attempt, cutoff).await)
    }

    /// Like [`Engine::deliver_or_cut`], but refuses the delivery ([`Admission::Saturated`], no
    /// request made) when no concurrency slot is free and the endpoint is saturated or its queue
    /// is longer than its pace clears (see [`crate::limits`]). For callers that can defer the
    /// delivery.
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
        let started_at_ms = now_ms();
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
                    retry_after: None,
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
        unbounded(
            self.run(endpoint, event_id, body, attempt, SlotWait::Unbounded)
                .await,
        )
    }

    async fn run(
        &self,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: Bytes,
        attempt: u32,
        wait: SlotWait,
    ) -> Admission {
        if let Err(result) = self.check_target(endpoint) {
            let outcome = AttemptOutcome {
                attempt,
                started_at_ms: now_ms(),
                duration: Duration::ZERO,
                result,
                retry_after: None,
            };
            return Admission::Attempted(self.finish(endpoint, outcome));
        }

        let limit = self.inner.limits.of(endpoint);
        let Some(_permit) = limit.acquire(&endpoint.id, wait).await else {
            return Admission::Saturated { busy: limit.max };
        };
        let started_at_ms = now_ms();
        let start = Instant::now();
        let _inflight = InflightGuard::enter(&self.inner.inflight);
        let timeout = endpoint.timeout.unwrap_or(self.inner.timeout);
        let (result, retry_after) = self
            .exchange(endpoint, event_id, body, attempt, timeout)
            .await;
        let outcome = AttemptOutcome {
            attempt,
            started_at_ms,
            duration: start.elapsed(),
            result,
            retry_after,
        };
        limit.released(outcome.duration);
        Admission::Attempted(self.finish(endpoint, outcome))
    }

    /// The endpoint URL (parsed at config load) checked by the guard when its host is an IP
    /// literal (the client only calls the guarded resolver for names).
    fn check_target(&self, endpoint: &EndpointConfig) -> Result<(), AttemptResult> {
        self.inner
            .guard
            .check_url(endpoint.url.as_url())
            .map_err(|blocked| AttemptResult::Failed {
                class: FailureClass::Blocked,
                status: None,
                snippet: self.cap(blocked.to_string()),
            })
    }

    /// The request, bounded by `timeout` until its status line, then the bounded read of the
    /// kept part of its body.
    async fn exchange(
        &self,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: Bytes,
        attempt: u32,
        timeout: Duration,
    ) -> (AttemptResult, Option<Duration>) {
        let deadline = tokio::time::Instant::now() + timeout;
        let request = match self.request(endpoint, event_id, &body, attempt) {
            Ok(request) => request,
            Err(failed) => return (failed, None),
        };

        // `send` resolves when the status line and headers arrived.
        let sent = tokio::time::timeout_at(
            deadline,
            self.send(request, endpoint, event_id, &body, attempt),
        )
        .await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => {
                let (class, text) = client::transport_failure(err);
                let failed = AttemptResult::Failed {
                    class,
                    status: None,
                    snippet: self.cap(text),
                };
                return (failed, None);
            }
            Err(_elapsed) => {
                let failed = AttemptResult::Failed {
                    class: FailureClass::Timeout,
                    status: None,
                    snippet: self.cap(format!(
                        "no response status within {} ms",
                        timeout.as_millis()
                    )),
                };
                return (failed, None);
            }
        };
        let status = response.status().as_u16();
        let retry_after = matches!(status, 429 | 503)
            .then(|| retry_after(response.headers(), hookline_common::runtime::clock::now()))
            .flatten();

        // The status decided the result; the body is diagnostics. Read only what is kept, within
        // the grace, then drop the response: the rest is never buffered. When the body ends
        // within the cap (the usual empty or small body) the connection is reused.
        let grace = BODY_GRACE.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let mut body = response.into_body();
        let kept = client::read_kept(&mut body, self.inner.max_response_body_bytes, grace).await;
        drop(body);

        let result = if (200..300).contains(&status) {
            AttemptResult::Delivered { status }
        } else {
            AttemptResult::Failed {
                class: FailureClass::HttpStatus,
                status: Some(status),
                snippet: self.cap(String::from_utf8_lossy(&kept).into_owned()),
            }
        };
        (result, retry_after)
    }

    /// The signed `POST` of `body` to `endpoint`.
    fn request(
        &self,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: &Bytes,
        attempt: u32,
    ) -> Result<Request<client::Body>, AttemptResult> {
        let Some(mut headers) =
            webhook_headers(event_id, now_secs(), attempt, &endpoint.secrets, body)
        else {
            // The deduper rejects such ids; reaching here is a bug upstream, not the endpoint's.
            return Err(AttemptResult::Failed {
                class: FailureClass::Io,
                status: None,
                snippet: self.cap("event id is not a valid http header value".into()),
            });
        };
        headers.insert(USER_AGENT, self.inner.user_agent.clone());
        // The attempt's span, when the delivery path traces this attempt.
        if let Ok(Ok(tp)) = TRACEPARENT.try_with(|t| http::HeaderValue::from_str(t)) {
            headers.insert(http::header::HeaderName::from_static("traceparent"), tp);
        }
        // The endpoint's own headers, after ours: the config refuses names that would replace
        // a webhook-*, content-* or connection header; a `user-agent` of its own wins.
        for h in &endpoint.headers {
            let mut value = h.value.clone();
            value.set_sensitive(h.secret);
            headers.insert(h.name.clone(), value);
        }
        let mut request = Request::new(client::Body::new(body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = endpoint.url.as_uri().clone();
        *request.headers_mut() = headers;
        Ok(request)
    }

    /// Sends `request` on the pooled client. When it went out on a reused connection that the
    /// endpoint closed before any byte of a response arrived (RFC 9112 §9.3.1: the server never
    /// read it), it is built again and sent once more at once on a new connection, counted in
    /// `hookline_delivery_stale_connection_retries_total`: not the endpoint's failure.
    async fn send(
        &self,
        request: Request<client::Body>,
        endpoint: &EndpointConfig,
        event_id: &str,
        body: &Bytes,
        attempt: u32,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match self.inner.clients.pooled.request(request).await {
            Err(err) if conn::went_stale(&err) => {
                self.inner.stale_retries.inc();
                debug!(
                    endpoint = %endpoint.id,
                    attempt,
                    error = %err,
                    "request lost on a reused connection the endpoint had closed; sending it again on a new one"
                );
                // The first build succeeded, so this one does too.
                let Ok(again) = self.request(endpoint, event_id, body, attempt) else {
                    return Err(err);
                };
                self.inner.clients.fresh.request(again).await
            }
            sent => sent,
        }
    }

    /// Logs what must be logged (the delivery path counts the attempt).
    fn finish(&self, endpoint: &EndpointConfig, outcome: AttemptOutcome) -> AttemptOutcome {
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

/// A `Retry-After` header: delay-seconds, or an HTTP date (then the time from `now` until it;
/// zero if it is past). `None` when absent or unreadable.
pub fn retry_after(headers: &http::HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let text = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The outcome of an attempt that waited for its slot as long as it took (so was never refused).
fn unbounded(admission: Admission) -> AttemptOutcome {
    match admission {
        Admission::Attempted(outcome) => outcome,
        Admission::Saturated { .. } => unreachable!("an unbounded slot wait never refuses"),
    }
}

/// Keeps the in-flight gauge right even when the delivery future is dropped mid-flight.
struct InflightGuard<'a>(&'a IntGauge);

impl<'a> InflightGuard<'a> {
    fn enter(gauge: &'a IntGauge) -> Self {
        gauge.inc();
        InflightGuard(gauge)
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Inserts `id` into `set`, telling whether it was new.
fn first_time(set: &Mutex<HashSet<String>>, id: &str) -> bool {
    lock(set).insert(id.to_string())
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

//! What one delivery attempt did: delivered (any 2xx) or failed with a closed [`FailureClass`],
//! when it started and how long it took. The engine returns it; the delivery path turns it into
//! a history entry ([`attempt_record`]), metrics and the observer's call.

use std::time::Duration;

use hookline_common::contract::delivery::AttemptRecord;

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
    /// A 429 or 503 answer's `Retry-After` (seconds, or an HTTP date from now), as sent: the
    /// rate limiter pauses the endpoint for it (capped); the retry schedule ignores it.
    pub retry_after: Option<Duration>,
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

    /// The failure class, `None` when delivered.
    pub fn failure_class(&self) -> Option<FailureClass> {
        match self {
            AttemptResult::Delivered { .. } => None,
            AttemptResult::Failed { class, .. } => Some(*class),
        }
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
    /// The endpoint URL is not an absolute http(s) URL with a host. URLs are checked when the
    /// config is loaded, so the engine no longer reports it; kept in the closed set for metrics
    /// series and for histories written before.
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
/// The attempt record kept in the delivery's history.
pub fn attempt_record(outcome: &AttemptOutcome) -> AttemptRecord {
    let (status, class, snippet) = match &outcome.result {
        AttemptResult::Delivered { status } => (Some(*status), "ok".to_string(), String::new()),
        AttemptResult::Failed {
            class,
            status,
            snippet,
        } => (*status, class.as_str().to_string(), snippet.clone()),
    };
    AttemptRecord {
        n: outcome.attempt,
        at_ms: outcome.started_at_ms,
        duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
        status,
        class,
        snippet,
    }
}

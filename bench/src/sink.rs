//! The benchmark's webhook sink: an axum server on 127.0.0.1 that answers at once and books what
//! arrived, so throughput, latency and the ledger are measured where a user would see them.
//!
//! Paths (the endpoint index is the number in the path):
//! - `/e/{n}`: 204, booked as a delivery to endpoint `n`;
//! - `/fail/{n}`: 500 (the failing endpoint: its deliveries go through the tiers to the DLQ);
//! - `/hang/{n}`: while hanging is switched on, never answers (the client gives up at its
//!   timeout and hyper drops the request); otherwise like `/e/{n}`;
//! - `/slow/{n}`: like `/e/{n}` after holding the request for the slow delay (the in-flight
//!   run: the dispatcher holds every delivery open that long);
//! - `/v1/traces`: an OTLP/HTTP trace export (the traces-cost runs): 200, its bytes counted;
//! - `/fleet/{n}`: 204, booked apart by (`webhook-id`, `n`) with `n` up to 2^32 (the many-endpoints
//!   phase, [`crate::fleet`]: only counts and re-sends, no receipts).
//!
//! A delivery is keyed by (`webhook-id`, endpoint): the first 2xx is booked with its receipt time
//! and the `data.sched_ns` stamp found in the body; later copies count as redeliveries. The HTTP
//! ceiling client posts to `/e/0` too, so it pays for exactly the same bookkeeping.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;

/// One booked delivery.
#[derive(Debug, Clone, Copy)]
pub struct Receipt {
    pub endpoint: u16,
    /// Unix ns when the request reached the handler.
    pub recv_ns: u64,
    /// Unix ns the event was scheduled to be sent (`data.sched_ns`), 0 when absent.
    pub sched_ns: u64,
}

/// What the sink received, by event id.
#[derive(Default)]
pub struct Book {
    pub by_id: HashMap<String, Vec<Receipt>>,
    /// Requests for a (id, endpoint) already booked (at-least-once re-sends).
    pub redelivered: u64,
}

#[derive(Default)]
struct SinkState {
    book: Mutex<Book>,
    /// 2xx answers given (monotonic; the progress bars read it).
    delivered: AtomicU64,
    /// 500s given on `/fail`.
    failed: AtomicU64,
    /// Requests held on `/hang` (each ends at the client's timeout).
    hung: AtomicU64,
    hang: AtomicBool,
    /// How long `/slow` holds a request, in ms.
    slow_ms: AtomicU64,
    /// Requests being held on `/slow` right now.
    slow_open: AtomicU64,
    relayed: AtomicU64,
    /// OTLP trace exports received, and their bytes.
    otlp_requests: AtomicU64,
    otlp_bytes: AtomicU64,
    /// (`webhook-id`, endpoint) pairs answered on `/fleet`, and the copies of one already there.
    fleet: Mutex<HashSet<(Box<str>, u32)>>,
    fleet_delivered: AtomicU64,
    fleet_redelivered: AtomicU64,
}

/// A running sink; stops when dropped.
pub struct Sink {
    pub addr: SocketAddr,
    state: Arc<SinkState>,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    pub async fn start() -> anyhow::Result<Sink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(SinkState::default());
        let app = Router::new()
            .route("/e/{n}", post(deliver))
            .route("/fail/{n}", post(fail))
            .route("/hang/{n}", post(hang))
            .route("/slow/{n}", post(slow))
            .route("/relay/{n}", post(relay))
            .route("/v1/traces", post(otlp))
            .route("/fleet/{n}", post(fleet))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("bench sink stopped: {e}");
            }
        });
        Ok(Sink { addr, state, task })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// OTLP trace exports received so far, and their bytes.
    pub fn otlp_received(&self) -> (u64, u64) {
        (
            self.state.otlp_requests.load(Ordering::Relaxed),
            self.state.otlp_bytes.load(Ordering::Relaxed),
        )
    }

    /// Switches the `/hang` paths between hanging and answering 204.
    pub fn set_hanging(&self, on: bool) {
        self.state.hang.store(on, Ordering::SeqCst);
    }

    /// How long `/slow` holds each request.
    pub fn set_slow_delay(&self, d: std::time::Duration) {
        self.state
            .slow_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Requests held on `/slow` right now.
    pub fn slow_open(&self) -> u64 {
        self.state.slow_open.load(Ordering::Relaxed)
    }

    pub fn delivered_total(&self) -> u64 {
        self.state.delivered.load(Ordering::Relaxed)
    }

    /// POSTs answered on `/relay/*` (the references of [`crate::relays`]).
    pub fn relayed_total(&self) -> u64 {
        self.state.relayed.load(Ordering::Relaxed)
    }

    pub fn failed_total(&self) -> u64 {
        self.state.failed.load(Ordering::Relaxed)
    }

    /// Distinct (event, endpoint) deliveries answered on `/fleet`, and re-sends of those.
    pub fn fleet_received(&self) -> (u64, u64) {
        (
            self.state.fleet_delivered.load(Ordering::Relaxed),
            self.state.fleet_redelivered.load(Ordering::Relaxed),
        )
    }

    pub fn hung_total(&self) -> u64 {
        self.state.hung.load(Ordering::Relaxed)
    }

    /// The book, locked (a poisoned lock still holds consistent counts: recover it).
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.state
            .book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn deliver(
    State(state): State<Arc<SinkState>>,
    Path(n): Path<u16>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    book(&state, n, &headers, &body)
}

/// A reference relay's POST: counted, nothing booked (its records carry no webhook id).
async fn relay(State(state): State<Arc<SinkState>>, _body: Bytes) -> StatusCode {
    state.relayed.fetch_add(1, Ordering::Relaxed);
    StatusCode::NO_CONTENT
}

async fn otlp(State(state): State<Arc<SinkState>>, body: Bytes) -> StatusCode {
    state.otlp_requests.fetch_add(1, Ordering::Relaxed);
    state
        .otlp_bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    StatusCode::OK
}

async fn fleet(
    State(state): State<Arc<SinkState>>,
    Path(n): Path<u32>,
    headers: HeaderMap,
) -> StatusCode {
    let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    let fresh = state
        .fleet
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert((id.into(), n));
    let counter = if fresh {
        &state.fleet_delivered
    } else {
        &state.fleet_redelivered
    };
    counter.fetch_add(1, Ordering::Relaxed);
    StatusCode::NO_CONTENT
}

async fn fail(State(state): State<Arc<SinkState>>, Path(_n): Path<u16>) -> StatusCode {
    state.failed.fetch_add(1, Ordering::Relaxed);
    StatusCode::INTERNAL_SERVER_ERROR
}

async fn hang(
    State(state): State<Arc<SinkState>>,
    Path(n): Path<u16>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if state.hang.load(Ordering::SeqCst) {
        state.hung.fetch_add(1, Ordering::Relaxed);
        // Never answers: the dispatcher's timeout ends the exchange and hyper drops this.
        std::future::pending::<()>().await;
    }
    book(&state, n, &headers, &body)
}

async fn slow(
    State(state): State<Arc<SinkState>>,
    Path(n): Path<u16>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    state.slow_open.fetch_add(1, Ordering::Relaxed);
    let hold = state.slow_ms.load(Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(hold)).await;
    state.slow_open.fetch_sub(1, Ordering::Relaxed);
    book(&state, n, &headers, &body)
}

fn book(state: &SinkState, endpoint: u16, headers: &HeaderMap, body: &[u8]) -> StatusCode {
    let recv_ns = unix_ns();
    let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    let receipt = Receipt {
        endpoint,
        recv_ns,
        sched_ns: sched_ns(body).unwrap_or(0),
    };
    {
        let mut book = state
            .book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = book.by_id.entry(id.to_string()).or_default();
        if entry.iter().any(|r| r.endpoint == endpoint) {
            book.redelivered += 1;
        } else {
            entry.push(receipt);
        }
    }
    state.delivered.fetch_add(1, Ordering::Relaxed);
    StatusCode::NO_CONTENT
}

/// The `"sched_ns":<digits>` stamp of a body, found without parsing the JSON (the sink must stay
/// cheap next to what it measures).
pub fn sched_ns(body: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"sched_ns\":";
    let at = body.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits = body[at..].iter().take_while(|b| b.is_ascii_digit());
    let mut v: u64 = 0;
    let mut any = false;
    for d in digits {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        any = true;
    }
    any.then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_schedule_stamp() {
        assert_eq!(
            sched_ns(br#"{"id":"a","data":{"sched_ns":1234,"pad":"x"}}"#),
            Some(1234)
        );
        assert_eq!(sched_ns(br#"{"id":"a"}"#), None);
        assert_eq!(sched_ns(br#"{"sched_ns":"x"}"#), None);
    }
}

//! A real HTTP receiver for tests: records every request (path, headers, exact body, arrival
//! time) and answers per path from a script (status codes, delays, hangs).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

/// How the receiver answers one request.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)]
pub enum Behavior {
    Status(u16),
    /// Wait, then answer with the status.
    Delay(Duration, u16),
    /// Never answer (until the client gives up).
    Hang,
    /// Answer with the status and `Retry-After: <seconds>`.
    RetryAfter(u16, u64),
}

/// One request as received.
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct Recorded {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    pub at: Instant,
    /// Unix ms at arrival.
    pub at_ms: i64,
}

#[derive(Default)]
struct Inner {
    scripts: HashMap<String, Vec<Behavior>>,
    defaults: HashMap<String, Behavior>,
    requests: Vec<Recorded>,
}

#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

#[allow(dead_code)]
impl Receiver {
    pub async fn start() -> Receiver {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/{*path}", post(handle))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, inner }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    /// Answers the next requests to `path` in this order, then the default (200).
    pub fn script(&self, path: &str, behaviors: Vec<Behavior>) {
        self.lock().scripts.insert(norm(path), behaviors);
    }

    /// Answer every request to `path` this way (after any script).
    pub fn default(&self, path: &str, behavior: Behavior) {
        self.lock().defaults.insert(norm(path), behavior);
    }

    pub fn requests(&self, path: &str) -> Vec<Recorded> {
        let p = norm(path);
        self.lock()
            .requests
            .iter()
            .filter(|r| r.path == p)
            .cloned()
            .collect()
    }

    /// Arrival times of the requests to `path` whose `webhook-id` starts with `id_prefix`,
    /// read under the lock without copying them (a test polling this while tens of thousands of
    /// requests arrive must not slow the run it measures).
    pub fn arrivals(&self, path: &str, id_prefix: &str) -> Vec<Instant> {
        let path = norm(path);
        self.lock()
            .requests
            .iter()
            .filter(|r| {
                r.path == path
                    && r.headers
                        .get("webhook-id")
                        .is_some_and(|id| id.starts_with(id_prefix))
            })
            .map(|r| r.at)
            .collect()
    }

    pub fn all_requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Polls until `path` got at least `n` requests or the deadline passes; returns what arrived.
    pub async fn wait_for(&self, path: &str, n: usize, deadline: Duration) -> Vec<Recorded> {
        let start = Instant::now();
        loop {
            let got = self.requests(path);
            if got.len() >= n || start.elapsed() >= deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn norm(path: &str) -> String {
    format!("/{}", path.trim_start_matches('/'))
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap) {
    let path = norm(&path);
    let behavior = {
        let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
        g.requests.push(Recorded {
            path: path.clone(),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: body.to_vec(),
            at: Instant::now(),
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
        });
        let scripted = g.scripts.get_mut(&path).and_then(|s| {
            if s.is_empty() {
                None
            } else {
                Some(s.remove(0))
            }
        });
        scripted
            .or_else(|| g.defaults.get(&path).copied())
            .unwrap_or(Behavior::Status(200))
    };
    let mut out = HeaderMap::new();
    let code = match behavior {
        Behavior::Status(c) => c,
        Behavior::RetryAfter(c, seconds) => {
            out.insert(axum::http::header::RETRY_AFTER, seconds.into());
            c
        }
        Behavior::Delay(d, c) => {
            tokio::time::sleep(d).await;
            c
        }
        Behavior::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            200
        }
    };
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        out,
    )
}

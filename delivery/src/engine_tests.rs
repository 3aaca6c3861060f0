//! Unit tests of the engine against local axum receivers and raw sockets.

use super::*;
use crate::metrics::{AttemptMetrics, ATTEMPTS_TOTAL, ATTEMPT_DURATION, INFLIGHT_REQUESTS};
use crate::outcome::AttemptOutcome;
use crate::signing;
use hookline_common::config::{EndpointUrl, Secret};
use hookline_common::contract::secret::decode_secret;
use hookline_common::runtime::clock::now_secs as unix_secs_now;
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
    let engine = Engine::new(http, 8, &registry, "test").expect("engine");
    (engine, registry)
}

fn engine() -> Engine {
    engine_with(&http_config(true)).0
}

fn endpoint(url: String) -> EndpointConfig {
    EndpointConfig {
        id: "ep-1".to_string(),
        url: EndpointUrl::parse(&url).expect("a usable test url"),
        secrets: Vec::new(),
        tenant: None,
        event_types: Vec::new(),
        enabled: true,
        timeout: None,
        max_concurrency: None,
        headers: Vec::new(),
        filter: None,
        rate_limit: None,
        burst: None,
        trace_context: true,
    }
}

fn secret(text: &str) -> Secret {
    Secret::parse(text).expect("a valid test secret")
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

async fn record(State(rec): State<Arc<Recorded>>, headers: AxumHeaders, body: Bytes) -> StatusCode {
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
    ep.secrets = vec![secret(SECRET_A), secret(SECRET_B)];
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
async fn custom_headers_go_out_with_the_request_and_outside_the_signature() {
    let rec = Arc::new(Recorded::default());
    let addr = serve(
        Router::new()
            .route("/", post(record))
            .with_state(rec.clone()),
    )
    .await;
    let mut ep = endpoint(format!("http://{addr}/"));
    ep.secrets = vec![secret(SECRET_A)];
    let header = |n: &str, v: &str, secret: bool| {
        hookline_common::config::CustomHeader::parse(n, v, secret).expect("a valid header")
    };
    ep.headers = vec![
        header("X-Api-Key", "k1", false),
        header("Authorization", "Bearer tok", true),
        header("User-Agent", "acme-gateway/2", false),
    ];
    let outcome = engine().deliver(&ep, "evt_h", body("{}"), 1).await;
    assert!(outcome.result.is_delivered(), "{outcome:?}");
    let requests = lock(&rec.requests);
    let (headers, got) = &requests[0];
    assert_eq!(headers["x-api-key"], "k1");
    assert_eq!(headers["authorization"], "Bearer tok");
    assert_eq!(
        headers["user-agent"], "acme-gateway/2",
        "the endpoint's own wins"
    );
    let timestamp: i64 = headers["webhook-timestamp"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("timestamp");
    let key = decode_secret(SECRET_A).expect("key");
    let signature = headers["webhook-signature"].to_str().expect("ascii");
    assert!(signing::verify(&key, "evt_h", timestamp, got, signature));
}

#[tokio::test]
async fn no_secrets_means_no_signature_header_and_each_secret_signs() {
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
    // An undecodable secret never gets this far: the config load refuses it (config tests).
    ep.secrets = vec![secret(SECRET_A)];
    let outcome = engine.deliver(&ep, "evt_2", body("{}"), 2).await;
    assert!(outcome.result.is_delivered(), "{outcome:?}");

    let requests = lock(&rec.requests);
    assert!(requests[0].0.get("webhook-signature").is_none());
    let signature = requests[1].0["webhook-signature"].to_str().expect("ascii");
    assert_eq!(signature.split(' ').count(), 1, "one secret, one signature");
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
    let metrics = AttemptMetrics::register(&registry, "test").expect("metrics");
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
        metrics.observe(&outcome, "ep");
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
async fn snippets_are_cut_on_character_boundaries() {
    assert_eq!(truncate_utf8("h\u{e9}llo".to_string(), 2), "h");
    assert_eq!(truncate_utf8("abc".to_string(), 3), "abc");
    assert_eq!(truncate_utf8("abc".to_string(), 0), "");
}

fn counter(registry: &Registry, result: &str, class: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == ATTEMPTS_TOTAL)
        .flat_map(|family| family.get_metric().iter())
        .filter(|m| {
            let label = |n: &str| {
                m.get_label()
                    .iter()
                    .find(|l| l.name() == n)
                    .map(|l| l.value().to_string())
            };
            label("result").as_deref() == Some(result) && label("class").as_deref() == Some(class)
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
    let metrics = AttemptMetrics::register(&registry, "test").expect("metrics");
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
    metrics.observe(&ok, "ep");
    metrics.observe(&bad, "ep");

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
    let histogram = find(ATTEMPT_DURATION).get_metric()[0]
        .get_histogram()
        .get_sample_count();
    assert_eq!(histogram, 2);
    let inflight = find(INFLIGHT_REQUESTS).get_metric()[0]
        .get_gauge()
        .get_value();
    assert_eq!(inflight, 0.0);
}

/// Reads one HTTP/1 request (head + `content-length` body) from `socket`; `None` at EOF first.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap_or(0));
            if data.len() >= end + 4 + length {
                return Some(data);
            }
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => data.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A server that reads exactly one request per connection, answers `answer`, keeps the
/// connection open for `linger` without reading again (no `Connection: close`), then closes it
/// (a request written meanwhile is unread: the close resets the connection). Counts the
/// requests it read.
async fn one_request_per_connection(
    answer: &'static [u8],
    linger: Duration,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let read = Arc::new(AtomicUsize::new(0));
    let counted = read.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                if read_request(&mut socket).await.is_none() {
                    return;
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = socket.write_all(answer).await;
                tokio::time::sleep(linger).await;
                drop(socket);
            });
        }
    });
    (addr, read)
}

fn stale_retries(registry: &Registry) -> f64 {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == metrics::STALE_CONNECTION_RETRIES)
        .map_or(0.0, |f| f.get_metric()[0].get_counter().get_value())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_lost_on_a_pooled_connection_the_endpoint_closed_goes_out_again_on_a_new_one() {
    let (addr, read) = one_request_per_connection(
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        Duration::from_millis(150),
    )
    .await;
    let (engine, registry) = engine_with(&http_config(true));
    let ep = endpoint(format!("http://{addr}/hook"));
    // Sequential deliveries: each one after the first finds the connection the previous one
    // left in the pool, which the server will close unread.
    for i in 0..20 {
        let outcome = engine
            .deliver(&ep, &format!("evt-{i}"), body("{}"), 1)
            .await;
        assert!(
            matches!(outcome.result, AttemptResult::Delivered { status: 200 }),
            "delivery {i}: {:?}",
            outcome.result
        );
    }
    // And concurrent ones, over the connections left behind.
    let ids: Vec<String> = (20..60).map(|i| format!("evt-{i}")).collect();
    let outcomes =
        futures::future::join_all(ids.iter().map(|id| engine.deliver(&ep, id, body("{}"), 1)))
            .await;
    for (i, outcome) in outcomes.iter().enumerate() {
        assert!(
            matches!(outcome.result, AttemptResult::Delivered { status: 200 }),
            "concurrent delivery {i}: {:?}",
            outcome.result
        );
    }
    assert_eq!(
        read.load(Ordering::SeqCst),
        60,
        "every request read exactly once"
    );
    let again = stale_retries(&registry);
    println!("requests sent again on a new connection: {again} of 60");
    assert!(
        again >= 1.0,
        "the pooled connections were reused and went stale: {again}"
    );
    assert!(again <= 60.0);
}

#[tokio::test]
async fn a_reset_after_part_of_a_response_is_not_sent_again() {
    // The first request on a connection is answered; the second is read, half answered, cut.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let read = Arc::new(AtomicUsize::new(0));
    let counted = read.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                if read_request(&mut socket).await.is_none() {
                    return;
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
                if read_request(&mut socket).await.is_none() {
                    return;
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = socket.write_all(b"HTTP/1.1 20").await;
                let _ = socket.flush().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
        }
    });
    let (engine, registry) = engine_with(&http_config(true));
    let ep = endpoint(format!("http://{addr}/hook"));
    let first = engine.deliver(&ep, "evt-1", body("{}"), 1).await;
    assert!(
        matches!(first.result, AttemptResult::Delivered { .. }),
        "{:?}",
        first.result
    );
    let second = engine.deliver(&ep, "evt-2", body("{}"), 1).await;
    assert!(
        matches!(
            second.result,
            AttemptResult::Failed {
                class: FailureClass::Io,
                ..
            }
        ),
        "the endpoint read it and began answering: its failure, {:?}",
        second.result
    );
    assert_eq!(read.load(Ordering::SeqCst), 2);
    assert_eq!(stale_retries(&registry), 0.0);
}

#[tokio::test]
async fn a_reset_on_a_new_connection_is_not_sent_again() {
    // Reads the request, then closes without a byte: on a fresh connection that is the
    // endpoint's failure.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = read_request(&mut socket).await;
            });
        }
    });
    let (engine, registry) = engine_with(&http_config(true));
    let ep = endpoint(format!("http://{addr}/hook"));
    let outcome = engine.deliver(&ep, "evt-1", body("{}"), 1).await;
    assert!(
        matches!(
            outcome.result,
            AttemptResult::Failed {
                class: FailureClass::Io,
                ..
            }
        ),
        "{:?}",
        outcome.result
    );
    assert_eq!(stale_retries(&registry), 0.0);
}

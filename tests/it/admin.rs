//! The admin process over HTTP against the real broker: every route needs a token, a tenant
//! token sees only its tenant (another tenant's resource is a 404), errors name the field, the
//! OpenAPI document lists exactly the routes served; `POST /v1/events` with one
//! `Idempotency-Key` is one event and one delivery under 50 concurrent requests and across a
//! restart of the admin process; a test send reports the receiver's answer or the failure class,
//! over the API and on the command line.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use hookline_common::config::Config;
use hookline_common::runtime::ops::StageProbe;
use hookline_common::runtime::shutdown;

use crate::harness::*;
use crate::receiver::{Behavior, Receiver};

pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const ACME_TOKEN: &str = "test-acme-token";
pub const GLOBEX_TOKEN: &str = "test-globex-token";

fn sha(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `[admin]` on port 0 with an admin token and one token per tenant (acme, globex).
pub fn admin_section() -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[admin.tokens]]\nname = \"ops\"\nsha256 = \"{}\"\nscope = \"admin\"\n\
         [[admin.tokens]]\nname = \"acme\"\nsha256 = \"{}\"\nscope = \"tenant:acme\"\n\
         [[admin.tokens]]\nname = \"globex\"\nsha256 = \"{}\"\nscope = \"tenant:globex\"\n",
        sha(ADMIN_TOKEN),
        sha(ACME_TOKEN),
        sha(GLOBEX_TOKEN)
    )
}

/// A running admin process (in-process, like the stages in other tests).
pub struct Admin {
    pub addr: SocketAddr,
    trigger: shutdown::ShutdownTrigger,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Admin {
    pub async fn start(config: &Config) -> Admin {
        let config = Arc::new(config.clone());
        let keyring =
            hookline_control::Keyring::from_base64(Some(&secrets_key()), &[]).expect("secrets key");
        let metrics = prometheus::Registry::new();
        let plane = hookline_control::Plane::start(&config, keyring, &metrics)
            .await
            .expect("control plane");
        let bound = hookline_admin::Bound::bind(config, &metrics, false, plane)
            .await
            .expect("admin binds and starts");
        let addr = bound.addr;
        let (trigger, shutdown) = shutdown::channel();
        let handle =
            tokio::spawn(
                async move { bound.serve(&StageProbe::detached("admin"), shutdown).await },
            );
        Admin {
            addr,
            trigger,
            handle,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn stop(self) {
        self.trigger.trigger();
        self.handle
            .await
            .expect("admin task")
            .expect("admin stops cleanly");
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

pub async fn call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = client().request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub async fn get(url: &str, token: Option<&str>) -> (StatusCode, Value) {
    call(reqwest::Method::GET, url, token, None).await
}

pub async fn post(url: &str, token: Option<&str>, body: Value) -> (StatusCode, Value) {
    call(reqwest::Method::POST, url, token, Some(body)).await
}

/// Polls the dead-letter list (admin token) until it holds `n` items.
pub async fn wait_dead(admin: &Admin, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, page) = get(&admin.url("/v1/dead-letters"), Some(ADMIN_TOKEN)).await;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if status == StatusCode::OK && items.len() >= n {
            return items;
        }
        assert!(
            Instant::now() < deadline,
            "{n} dead letters expected, have {status} {page}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn position_of(items: &[Value], tenant: &str) -> String {
    items
        .iter()
        .find(|i| i["tenant"] == tenant)
        .and_then(|i| i["position"].as_str())
        .unwrap_or_else(|| panic!("a dead letter of {tenant} in {items:?}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_a_token_and_a_tenant_token_sees_only_its_tenant() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("acme", Behavior::Status(500));
    rx.default("globex", Behavior::Status(500));
    let prefix = unique_prefix("admin-auth");
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\"]\n{}\
             [[endpoints]]\nid = \"acme\"\nurl = \"{}\"\ntenant = \"acme\"\n\
             [[endpoints]]\nid = \"globex\"\nurl = \"{}\"\ntenant = \"globex\"\n",
            admin_section(),
            rx.url("acme"),
            rx.url("globex")
        ),
    );
    apply_topics(&config).await;
    let stages = [start_deduper(&config), start_dispatcher(&config)];
    let admin = Admin::start(&config).await;

    // The OpenAPI document is public and lists exactly the routes served; every one of them
    // answers 401 without a token and with a wrong one.
    let (status, doc) = get(&admin.url("/openapi.json"), None).await;
    assert_eq!(status, StatusCode::OK);
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let expected: BTreeSet<(String, String)> = [
        ("POST", "/v1/events"),
        ("GET", "/v1/events/{id}/attempts"),
        ("GET", "/v1/endpoints"),
        ("POST", "/v1/endpoints"),
        ("POST", "/v1/endpoints:batch"),
        ("GET", "/v1/endpoints/{id}"),
        ("PATCH", "/v1/endpoints/{id}"),
        ("DELETE", "/v1/endpoints/{id}"),
        ("POST", "/v1/endpoints/{id}/rotate-secret"),
        ("GET", "/v1/endpoints/{id}/health"),
        ("POST", "/v1/endpoints/{id}/test"),
        ("GET", "/v1/dead-letters"),
        ("POST", "/v1/dead-letters/replay"),
        ("GET", "/v1/dead-letters/{position}"),
        ("POST", "/v1/dead-letters/{position}/replay"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    assert_eq!(documented, expected, "the document lists the routes served");
    for (method, path) in &documented {
        let url = admin.url(&path.replace("{position}", "0:0").replace("{id}", "x"));
        let m: reqwest::Method = method.parse().expect("method");
        for token in [None, Some("not-a-token")] {
            let (status, body) = call(m.clone(), &url, token, Some(json!({}))).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}: {body}"
            );
            assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        }
    }

    // Publishing: a tenant token only for its tenant; bad bodies name the field.
    let events = admin.url("/v1/events");
    let (status, body) = post(
        &events,
        Some(ACME_TOKEN),
        json!({"type": "order.paid", "tenant": "globex"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = post(&events, Some(ACME_TOKEN), json!({"data": {}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "type", "{body}");
    let (status, acme) = post(
        &events,
        Some(ACME_TOKEN),
        json!({"type": "order.paid", "data": {"n": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{acme}");
    assert_eq!(acme["tenant"], "acme");
    let (status, globex) = post(
        &events,
        Some(ADMIN_TOKEN),
        json!({"type": "order.paid", "tenant": "globex", "data": {"n": 2}}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{globex}");

    // Both endpoints answer 500 and the schedule has no retries: two dead letters.
    let items = wait_dead(&admin, 2).await;
    let (acme_dead, globex_dead) = (position_of(&items, "acme"), position_of(&items, "globex"));

    // Lists are scoped to the token's tenant, whatever the query asks.
    for query in ["", "?tenant=globex"] {
        let (status, page) = get(
            &admin.url(&format!("/v1/dead-letters{query}")),
            Some(ACME_TOKEN),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let tenants: Vec<&Value> = page["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| &i["tenant"])
            .collect();
        assert!(
            tenants.iter().all(|t| *t == "acme"),
            "acme sees only acme: {page}"
        );
    }
    // Another tenant's dead letter is a 404, to show and to replay; the admin sees it.
    let (status, body) = get(
        &admin.url(&format!("/v1/dead-letters/{globex_dead}")),
        Some(ACME_TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        !body.to_string().contains("globex"),
        "no data of globex leaks: {body}"
    );
    let (status, _) = post(
        &admin.url(&format!("/v1/dead-letters/{globex_dead}/replay")),
        Some(ACME_TOKEN),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, shown) = get(
        &admin.url(&format!("/v1/dead-letters/{globex_dead}")),
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["event_id"], globex["id"]);
    assert_eq!(shown["endpoint_id"], "globex");

    // Bad input names the field.
    for (url, field) in [
        ("/v1/dead-letters?limit=0", "limit"),
        ("/v1/dead-letters?cursor=nope", "cursor"),
        ("/v1/dead-letters/nope", "position"),
    ] {
        let (status, body) = get(&admin.url(url), Some(ADMIN_TOKEN)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {body}");
        assert_eq!(body["error"]["field"], field, "{url}: {body}");
    }
    let replay_all = admin.url("/v1/dead-letters/replay");
    let (status, body) = post(&replay_all, Some(ADMIN_TOKEN), json!({})).await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (StatusCode::BAD_REQUEST, json!("all")),
        "{body}"
    );
    let (status, body) = post(
        &replay_all,
        Some(ADMIN_TOKEN),
        json!({"endpoint": "acme", "bogus": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Replay: acme's token replays acme's dead letter once; the second call sends nothing.
    rx.default("acme", Behavior::Status(204));
    let url = admin.url(&format!("/v1/dead-letters/{acme_dead}/replay"));
    let (status, first) = post(&url, Some(ACME_TOKEN), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(
        (first["selected"].as_u64(), first["delivered"].as_u64()),
        (Some(1), Some(1)),
        "{first}"
    );
    let (status, second) = post(&url, Some(ACME_TOKEN), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["already_replayed"].as_u64(), Some(1), "{second}");
    assert_eq!(
        rx.requests("acme").len(),
        2,
        "the failed attempt and one replay"
    );
    // `all` for a tenant token is all of its own: acme's only dead letter is replayed already,
    // globex's is not touched.
    let (status, mine) = post(&replay_all, Some(ACME_TOKEN), json!({"all": true})).await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    assert_eq!(
        (mine["selected"].as_u64(), mine["already_replayed"].as_u64()),
        (Some(1), Some(1)),
        "{mine}"
    );
    assert_eq!(
        rx.requests("globex").len(),
        1,
        "globex's dead letter was not replayed"
    );

    admin.stop().await;
    for s in stages {
        s.stop().await.expect("clean stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_posts_with_one_key_are_one_delivery_across_admin_restarts() {
    require_kafka();
    let rx = Receiver::start().await;
    let prefix = unique_prefix("admin-ingest");
    let config = test_config(
        &prefix,
        &format!(
            "{}[[endpoints]]\nid = \"acme\"\nurl = \"{}\"\ntenant = \"acme\"\n\
             [[endpoints]]\nid = \"globex\"\nurl = \"{}\"\ntenant = \"globex\"\n",
            admin_section(),
            rx.url("acme"),
            rx.url("globex")
        ),
    );
    apply_topics(&config).await;
    let stages = [start_deduper(&config), start_dispatcher(&config)];
    let admin = Admin::start(&config).await;

    let body = json!({"type": "order.paid", "data": {"order": 42}});
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (url, body) = (admin.url("/v1/events"), body.clone());
        tasks.spawn(async move {
            let resp = client()
                .post(url)
                .bearer_auth(ACME_TOKEN)
                .header("Idempotency-Key", "order-42")
                .json(&body)
                .send()
                .await
                .expect("sent");
            (resp.status(), resp.json::<Value>().await.expect("json"))
        });
    }
    let mut ids = BTreeSet::new();
    while let Some(r) = tasks.join_next().await {
        let (status, answer) = r.expect("task");
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
        ids.insert(answer["id"].as_str().expect("id").to_string());
    }
    assert_eq!(ids.len(), 1, "every response carries the same id: {ids:?}");
    let id = ids.into_iter().next().expect("one id");

    // A restarted admin process (nothing remembered in memory) answers the same id.
    admin.stop().await;
    let admin = Admin::start(&config).await;
    let send = |token: &'static str, body: Value| {
        let url = admin.url("/v1/events");
        async move {
            let resp = client()
                .post(url)
                .bearer_auth(token)
                .header("Idempotency-Key", "order-42")
                .json(&body)
                .send()
                .await
                .expect("sent");
            (resp.status(), resp.json::<Value>().await.expect("json"))
        }
    };
    let (status, again) = send(ACME_TOKEN, body.clone()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(
        again["id"],
        id.as_str(),
        "same key after a restart: same id"
    );
    // The same key with another body is refused, as Stripe does.
    let (status, reused) = send(
        ACME_TOKEN,
        json!({"type": "order.paid", "data": {"order": 43}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reused}");
    assert_eq!(reused["error"]["code"], "idempotency_key_reused");
    // Another tenant with the same key gets its own event.
    let (status, other) = send(GLOBEX_TOKEN, body.clone()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{other}");
    assert_ne!(other["id"], id.as_str());

    let got = rx.wait_for("globex", 1, Duration::from_secs(60)).await;
    assert_eq!(
        got[0].headers.get("webhook-id").map(String::as_str),
        other["id"].as_str()
    );
    let got = rx.wait_for("acme", 1, Duration::from_secs(60)).await;
    assert_eq!(got[0].headers.get("webhook-id"), Some(&id));
    let sent: Value = serde_json::from_slice(&got[0].body).expect("json body");
    assert_eq!(sent["tenant"], "acme", "the token's tenant is filled in");
    // The 51 accepted copies on <p>.events stay one delivery (the deduper's window).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.requests("acme").len(), 1, "one delivery for one key");

    admin.stop().await;
    for s in stages {
        s.stop().await.expect("clean stop");
    }
}

pub async fn send(
    method: reqwest::Method,
    admin: &Admin,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call(method, &admin.url(path), Some(token), body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_are_managed_through_the_api_within_the_token_scope() {
    use reqwest::Method;
    require_kafka();
    let prefix = unique_prefix("admin-endpoints");
    let config = test_config(
        &prefix,
        &format!(
            "{}[[endpoints]]\nid = \"from-file\"\nurl = \"https://file.example/hook\"\n",
            admin_section()
        ),
    );
    apply_topics(&config).await;
    let admin = Admin::start(&config).await;

    // Create: a tenant token's endpoint gets its tenant; the generated secret is shown once.
    let (status, made) = send(Method::POST, &admin, "/v1/endpoints", ACME_TOKEN,
        Some(json!({"id": "acme-crm", "url": "https://crm.example/hook", "event_types": ["order.*"]}))).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["endpoint"]["tenant"], "acme");
    assert_eq!(made["endpoint"]["trace_context"], true, "on by default");
    assert!(
        made["secret"]
            .as_str()
            .is_some_and(|s| s.starts_with("whsec_")),
        "{made}"
    );
    assert!(
        !made["endpoint"].to_string().contains("whsec_"),
        "no secret in the endpoint view"
    );
    let version = made["endpoint"]["version"].as_u64().expect("version");

    // Refusals name the problem.
    let (status, body) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ACME_TOKEN,
        Some(json!({"id": "x1", "url": "https://a.example", "tenant": "globex"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ADMIN_TOKEN,
        Some(json!({"id": "x2", "url": "ftp://a.example"})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (StatusCode::BAD_REQUEST, json!("url")),
        "{body}"
    );
    let (status, body) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ADMIN_TOKEN,
        Some(json!({"id": "x3", "url": "https://a.example", "colour": "red"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ADMIN_TOKEN,
        Some(json!({"id": "acme-crm", "url": "https://a.example"})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::CONFLICT, json!("already_exists")),
        "{body}"
    );
    let (status, body) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/from-file",
        ADMIN_TOKEN,
        Some(json!({"url": "https://other.example"})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::CONFLICT, json!("file_managed")),
        "{body}"
    );

    // Scope: globex neither lists nor reads nor changes acme's endpoint; the admin sees all.
    let ids = |v: &Value| -> BTreeSet<String> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|e| e["id"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let (_, mine) = send(Method::GET, &admin, "/v1/endpoints", ACME_TOKEN, None).await;
    assert_eq!(
        ids(&mine),
        BTreeSet::from(["acme-crm".to_string()]),
        "{mine}"
    );
    let (_, theirs) = send(Method::GET, &admin, "/v1/endpoints", GLOBEX_TOKEN, None).await;
    assert!(ids(&theirs).is_empty(), "{theirs}");
    let (_, all) = send(Method::GET, &admin, "/v1/endpoints", ADMIN_TOKEN, None).await;
    assert_eq!(
        ids(&all),
        BTreeSet::from(["acme-crm".to_string(), "from-file".to_string()])
    );
    for (method, path, body) in [
        (Method::GET, "/v1/endpoints/acme-crm", None),
        (Method::GET, "/v1/endpoints/acme-crm/health", None),
        (
            Method::PATCH,
            "/v1/endpoints/acme-crm",
            Some(json!({"enabled": false})),
        ),
        (
            Method::POST,
            "/v1/endpoints/acme-crm/rotate-secret",
            Some(json!({})),
        ),
        (Method::DELETE, "/v1/endpoints/acme-crm", None),
    ] {
        let (status, answer) = send(method.clone(), &admin, path, GLOBEX_TOKEN, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
        assert!(
            !answer.to_string().contains("crm.example"),
            "no data leaks: {answer}"
        );
    }

    // Update with a stale version is a 409; with the current one it applies.
    let (status, body) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/acme-crm",
        ACME_TOKEN,
        Some(json!({"event_types": ["order.paid"], "version": version + 5})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::CONFLICT, json!("version_conflict")),
        "{body}"
    );
    let (status, updated) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/acme-crm",
        ACME_TOKEN,
        Some(json!({
            "event_types": ["order.paid"],
            "enabled": false,
            "trace_context": false,
            "version": version,
        })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["event_types"], json!(["order.paid"]));
    assert_eq!(updated["enabled"], false);
    assert_eq!(updated["trace_context"], false);
    let (status, body) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/acme-crm",
        ACME_TOKEN,
        Some(json!({"trace_context": "no"})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (StatusCode::BAD_REQUEST, json!("trace_context")),
        "{body}"
    );
    let (status, body) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/acme-crm",
        ACME_TOKEN,
        Some(json!({"tenant": "globex"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // Rotation: the new secret is returned once, and two secrets sign during the grace period.
    let (status, rotated) = send(
        Method::POST,
        &admin,
        "/v1/endpoints/acme-crm/rotate-secret",
        ACME_TOKEN,
        Some(json!({"grace": "1h"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    assert_ne!(rotated["secret"], made["secret"]);
    let signing = rotated["endpoint"]["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .filter(|s| s["signing"] == true)
        .count();
    assert_eq!(signing, 2, "{rotated}");

    // A second admin process sees the same registry, and health answers for a fresh endpoint.
    let second = Admin::start(&config).await;
    let (status, seen) = send(
        Method::GET,
        &second,
        "/v1/endpoints/acme-crm",
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["enabled"], false);
    assert_eq!(seen["trace_context"], false, "read back from the registry");
    let (status, h) = send(
        Method::GET,
        &second,
        "/v1/endpoints/acme-crm/health",
        ACME_TOKEN,
        None,
    )
    .await;
    assert_eq!(
        (status, h["status"].clone()),
        (StatusCode::OK, json!("unknown")),
        "{h}"
    );
    let (status, _) = send(
        Method::GET,
        &second,
        "/v1/events/evt_none/attempts",
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Delete: gone on both processes.
    let (status, _) = send(
        Method::DELETE,
        &admin,
        "/v1/endpoints/acme-crm",
        ACME_TOKEN,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = send(
            Method::GET,
            &second,
            "/v1/endpoints/acme-crm",
            ADMIN_TOKEN,
            None,
        )
        .await;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the delete reached the other process"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    second.stop().await;
    admin.stop().await;
}

/// A test send (`POST /v1/endpoints/{id}/test`, `hookline endpoints test ID`): one signed
/// `hookline.test` event, the outcome the answer — a 200 from a healthy receiver, the failure
/// class from a dead one (nothing listens on its port) — within the token's tenant, logged in the
/// delivery log, never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_send_reports_the_receivers_answer_or_the_failure_class() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("ok", Behavior::Status(200));
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    // A port nothing listens on: bound, then released.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let prefix = unique_prefix("admin-test-send");
    let endpoints = format!(
        "[[endpoints]]\nid = \"ok\"\nurl = \"{}\"\ntenant = \"acme\"\nsecrets = [\"{secret}\"]\n\
         [[endpoints]]\nid = \"down\"\nurl = \"http://127.0.0.1:{dead_port}/down\"\ntenant = \"acme\"\n\
         enabled = false\n",
        rx.url("ok")
    );
    let config = test_config(&prefix, &format!("{}{endpoints}", admin_section()));
    apply_topics(&config).await;
    let admin = Admin::start(&config).await;

    let (status, ok) = post(
        &admin.url("/v1/endpoints/ok/test"),
        Some(ACME_TOKEN),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{ok}");
    assert_eq!(
        (
            ok["delivered"].as_bool(),
            ok["status"].as_u64(),
            ok["failure_class"].is_null(),
            ok["event_type"].as_str()
        ),
        (Some(true), Some(200), true, Some("hookline.test")),
        "{ok}"
    );
    let event_id = ok["event_id"].as_str().expect("event id").to_string();
    let got = rx.wait_for("ok", 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "one request, no retry");
    assert_eq!(got[0].headers["webhook-id"], event_id);
    assert!(
        crate::dispatcher::signature_valid(secret, &got[0]),
        "signed with the endpoint's secret"
    );
    let body: Value = serde_json::from_slice(&got[0].body).expect("json body");
    assert_eq!(
        (
            body["id"].as_str(),
            body["type"].as_str(),
            body["tenant"].as_str()
        ),
        (Some(event_id.as_str()), Some("hookline.test"), Some("acme"))
    );

    // A dead endpoint (disabled too: a test send checks it before it is enabled): the class.
    let (status, down) = post(
        &admin.url("/v1/endpoints/down/test"),
        Some(ADMIN_TOKEN),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{down}");
    assert_eq!(
        (
            down["delivered"].as_bool(),
            down["failure_class"].as_str(),
            down["status"].is_null()
        ),
        (Some(false), Some("connect"), true),
        "{down}"
    );

    // Another tenant's endpoint and an unknown one are 404s.
    for (path, token) in [
        ("/v1/endpoints/ok/test", GLOBEX_TOKEN),
        ("/v1/endpoints/nope/test", ADMIN_TOKEN),
    ] {
        let (status, body) = post(&admin.url(path), Some(token), json!({})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }

    // The test send is in the delivery log, with its stage.
    let deadline = Instant::now() + Duration::from_secs(20);
    let attempts = loop {
        let (status, v) = get(
            &admin.url(&format!("/v1/events/{event_id}/attempts")),
            Some(ADMIN_TOKEN),
        )
        .await;
        let n = v["attempts"].as_array().map_or(0, Vec::len);
        if status == StatusCode::OK && n > 0 {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the test send never reached the delivery log: {status} {v}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(attempts["attempts"][0]["stage"], "test", "{attempts}");
    admin.stop().await;

    // The command line (its config file lists the file-managed endpoints, as every process's
    // does): the same outcome, exit 0 when delivered and 4 when not.
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("cli.toml");
    std::fs::write(
        &path,
        format!(
            "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
             [http]\nallow_cidrs = [\"127.0.0.0/8\"]\n{endpoints}",
            bootstrap()
        ),
    )
    .expect("write config");
    let run = |id: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
            .arg("--config")
            .arg(&path)
            .args(["endpoints", "test", id, "--json"])
            .env("HOOKLINE_SECRETS_KEY", secrets_key())
            .output()
            .expect("run hookline")
    };
    let out = run("ok");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).expect("json line");
    assert_eq!(
        (v["delivered"].as_bool(), v["status"].as_u64()),
        (Some(true), Some(200))
    );
    assert_eq!(rx.wait_for("ok", 2, Duration::from_secs(10)).await.len(), 2);
    let out = run("down");
    let v: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("json line");
    assert_eq!(out.status.code(), Some(4), "{v}");
    assert_eq!(v["failure_class"], "connect", "{v}");
}

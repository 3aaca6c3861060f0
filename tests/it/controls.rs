//! Delivery controls against the real broker, the whole pipeline (stages A and B, the
//! dispatcher, the retry tiers, the admin process) and a recording receiver: custom headers
//! arrive on every attempt — the first, each retry and a replay from the DLQ — from an endpoint
//! made through the API (a secret value sealed, kept on an edit without re-typing it) and from
//! the config file; forbidden ones are a 400 naming the field.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::admin::{admin_section, get, send, wait_dead, Admin, ACME_TOKEN, ADMIN_TOKEN};
use crate::harness::*;
use crate::receiver::{Behavior, Receiver, Recorded};

/// The dispatcher and every retry tier on one control plane that opens what the admin process
/// sealed (the test binary's secrets key).
async fn start_delivering(config: &hookline_common::config::Config) -> [Running; 2] {
    let keyring =
        hookline_control::Keyring::from_base64(Some(&secrets_key()), &[]).expect("secrets key");
    let plane = hookline_control::Plane::start(config, keyring, &prometheus::Registry::new())
        .await
        .expect("control plane");
    let p = plane.clone();
    [
        start_stage(config, move |c, r, rd, s| {
            hookline_dispatcher::run_with(c, r, rd, s, p)
        }),
        start_stage(config, move |c, r, rd, s| {
            hookline_retry_tiers::run_with(c, r, rd, s, None, plane)
        }),
    ]
}

fn header<'a>(r: &'a Recorded, name: &str) -> &'a str {
    r.headers
        .get(name)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("no `{name}` in {:?}", r.headers.keys()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_headers_arrive_on_every_attempt_and_forbidden_ones_are_refused() {
    require_kafka();
    let rx = Receiver::start().await;
    // Two failures, then success: attempts 1, 2 and 3 of one delivery.
    rx.script(
        "api",
        vec![
            Behavior::Status(500),
            Behavior::Status(503),
            Behavior::Status(200),
        ],
    );
    rx.default("api", Behavior::Status(200));
    rx.default("file", Behavior::Status(200));
    rx.default("dead", Behavior::Status(500));
    let prefix = unique_prefix("controls-headers");
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"1s\", \"2s\"]\n{}\
             [[endpoints]]\nid = \"file\"\nurl = \"{}\"\nevent_types = [\"order.*\"]\n\
             headers = [{{ name = \"X-From-File\", value = \"f1\" }}, \
                        {{ name = \"Authorization\", value = \"Bearer file-tok\", secret = true }}]\n",
            admin_section(),
            rx.url("file"),
        ),
    );
    apply_topics(&config).await;
    let [dispatcher, tiers] = start_delivering(&config).await;
    let stages = [start_deduper(&config), dispatcher, tiers];
    let admin = Admin::start(&config).await;

    // Forbidden headers: a 400 naming the field, nothing created.
    let refused = [
        (
            json!([{"name": "Webhook-Signature", "value": "x"}]),
            "headers[0].name",
        ),
        (
            json!([{"name": "Content-Type", "value": "text/plain"}]),
            "headers[0].name",
        ),
        (
            json!([{"name": "Host", "value": "evil.example"}]),
            "headers[0].name",
        ),
        (
            json!([{"name": "Transfer-Encoding", "value": "chunked"}]),
            "headers[0].name",
        ),
        (
            json!([{"name": "X-Ok", "value": "1"}, {"name": "X-Inject", "value": "a\r\nX-Evil: 1"}]),
            "headers[1].value",
        ),
        (
            json!([{"name": "X-A", "value": "1"}, {"name": "x-a", "value": "2"}]),
            "headers[1].name",
        ),
        (json!([{"name": "X-Secret"}]), "headers[0].value"),
        (
            json!((0..3)
                .map(|i| json!({"name": format!("X-{i}"), "value": "v".repeat(3000)}))
                .collect::<Vec<_>>()),
            "headers",
        ),
    ];
    for (headers, field) in refused {
        let (status, body) = send(
            Method::POST,
            &admin,
            "/v1/endpoints",
            ACME_TOKEN,
            Some(json!({"id": "bad", "url": rx.url("api"), "headers": headers})),
        )
        .await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (reqwest::StatusCode::BAD_REQUEST, Some(field)),
            "{headers}: {body}"
        );
        assert!(!body.to_string().contains("X-Evil"), "{body}");
    }
    let (status, _) = get(&admin.url("/v1/endpoints/bad"), Some(ADMIN_TOKEN)).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);

    // An endpoint with a plain and a secret header; the secret value is never shown.
    let (status, made) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ACME_TOKEN,
        Some(
            json!({"id": "api", "url": rx.url("api"), "event_types": ["order.*"],
            "headers": [{"name": "X-Api-Key", "value": "k1"},
                        {"name": "Authorization", "value": "Bearer tok-api-1", "secret": true}]}),
        ),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{made}");
    assert_eq!(
        made["endpoint"]["headers"],
        json!([{"name": "x-api-key", "value": "k1", "secret": false},
               {"name": "authorization", "value": null, "secret": true}])
    );
    let (_, shown) = get(&admin.url("/v1/endpoints/api"), Some(ACME_TOKEN)).await;
    assert!(!shown.to_string().contains("tok-api-1"), "{shown}");
    // A dead endpoint with headers, for the replay.
    let (status, made) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ACME_TOKEN,
        Some(
            json!({"id": "dead", "url": rx.url("dead"), "event_types": ["order.*"],
            "headers": [{"name": "Authorization", "value": "Bearer tok-dead", "secret": true}]}),
        ),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{made}");
    // Every process sees them within about a second (the registry on <p>.endpoints).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (status, event) = send(
        Method::POST,
        &admin,
        "/v1/events",
        ACME_TOKEN,
        Some(json!({"type": "order.paid", "data": {"n": 1}})),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{event}");
    let id = event["id"].as_str().expect("event id").to_string();

    // Attempts 1 (500), 2 (503) and 3 (200): every one carries both headers.
    let got = rx.wait_for("api", 3, Duration::from_secs(60)).await;
    assert_eq!(got.len(), 3);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(header(r, "webhook-id"), id);
        assert_eq!(header(r, "webhook-attempt"), (i + 1).to_string());
        assert_eq!(header(r, "x-api-key"), "k1");
        assert_eq!(header(r, "authorization"), "Bearer tok-api-1");
    }
    // The file's endpoint: its headers from the config file.
    let got = rx.wait_for("file", 1, Duration::from_secs(30)).await;
    assert_eq!(header(&got[0], "x-from-file"), "f1");
    assert_eq!(header(&got[0], "authorization"), "Bearer file-tok");

    // The dead endpoint's three attempts, then its dead letter replayed to a healthy receiver.
    let items = wait_dead(&admin, 1).await;
    let position = items[0]["position"].as_str().expect("position").to_string();
    rx.default("dead", Behavior::Status(200));
    let (status, body) = send(
        Method::POST,
        &admin,
        &format!("/v1/dead-letters/{position}/replay"),
        ADMIN_TOKEN,
        Some(json!({})),
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    let got = rx.wait_for("dead", 4, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 4, "three attempts and the replay");
    assert!(got
        .iter()
        .all(|r| header(r, "authorization") == "Bearer tok-dead"));

    // An edit: the secret header kept without its value, the plain one changed.
    let (status, edited) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/api",
        ACME_TOKEN,
        Some(json!({"headers": [{"name": "X-Api-Key", "value": "k2"},
                                {"name": "Authorization", "secret": true}]})),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{edited}");
    let (status, body) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/api",
        ACME_TOKEN,
        Some(json!({"headers": [{"name": "Content-Length", "value": "1"}]})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (reqwest::StatusCode::BAD_REQUEST, json!("headers[0].name")),
        "{body}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, _) = send(
        Method::POST,
        &admin,
        "/v1/events",
        ACME_TOKEN,
        Some(json!({"type": "order.paid", "data": {"n": 2}})),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    let got = rx.wait_for("api", 4, Duration::from_secs(30)).await;
    assert_eq!(header(&got[3], "x-api-key"), "k2");
    assert_eq!(header(&got[3], "authorization"), "Bearer tok-api-1");

    // The record on <p>.endpoints holds the secret value sealed, never in the clear.
    let records = read_all_quiet(
        &format!("{prefix}.endpoints"),
        3,
        Duration::from_secs(20),
        Duration::from_secs(2),
    );
    let raw: String = records
        .iter()
        .filter_map(|m| rdkafka::Message::payload(m))
        .map(String::from_utf8_lossy)
        .collect();
    assert!(
        raw.contains("\"sealed\"") && !raw.contains("tok-api-1"),
        "{raw}"
    );
    assert!(
        !raw.contains("file-tok"),
        "a file-managed endpoint's headers stay in its file"
    );

    admin.stop().await;
    for s in stages {
        s.stop().await.expect("stage stops cleanly");
    }
}

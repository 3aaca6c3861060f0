//! The control plane wired into the delivery path, against the real broker: an endpoint made
//! through the admin API receives deliveries within seconds on two dispatcher processes with no
//! restart; an update, a disable and a delete take effect; a rotated secret signs beside the new
//! one during its grace period and not after; `hookline trace` shows every attempt of an event
//! retried twice and then delivered, made by two processes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use hookline_common::config::Config;
use hookline_common::contract::secret::decode_secret;
use hookline_control::{Keyring, Plane};
use hookline_delivery::signing::verify;

use crate::admin::{admin_section, Admin, ACME_TOKEN};
use crate::harness::*;
use crate::receiver::{Behavior, Receiver, Recorded};

/// A stage on a control plane of its own with the test binary's secrets key, named `instance`
/// (its delivery log records say which process made an attempt).
async fn keyed(config: &Config, instance: &str) -> (Config, Plane) {
    let mut config = config.clone();
    config.kafka.instance_id = Some(instance.into());
    let keyring = Keyring::from_base64(Some(&secrets_key()), &[]).expect("key");
    let plane = Plane::start(&config, keyring, &prometheus::Registry::new())
        .await
        .expect("control plane");
    (config, plane)
}

async fn dispatcher(config: &Config, instance: &str) -> (Running, Plane) {
    let (config, plane) = keyed(config, instance).await;
    let p = plane.clone();
    let running = start_stage(&config, move |c, r, rd, s| {
        hookline_dispatcher::run_with(c, r, rd, s, p)
    });
    (running, plane)
}

async fn tiers(config: &Config, instance: &str) -> (Running, Plane) {
    let (config, plane) = keyed(config, instance).await;
    let p = plane.clone();
    let running = start_stage(&config, move |c, r, rd, s| {
        hookline_retry_tiers::run_with(c, r, rd, s, None, p)
    });
    (running, plane)
}

/// Polls until every process's registry shows endpoint `id` as `check` wants (a change is live on a
/// process once its registry has it; the write returned when the admin's had it).
async fn everywhere(
    planes: &[&Plane],
    id: &str,
    what: &str,
    check: impl Fn(Option<hookline_control::Endpoint>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let started = Instant::now();
    while !planes.iter().all(|p| check(p.registry.get(id))) {
        assert!(
            Instant::now() < deadline,
            "{what} did not reach every process within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "live endpoint: {what} on every process {} ms after the write returned",
        started.elapsed().as_millis()
    );
}

async fn api(admin: &Admin, method: reqwest::Method, path: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .request(method.clone(), admin.url(path))
        .bearer_auth(ACME_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("sent");
    let status = resp.status();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{method} {path}: {status} {v}");
    v
}

async fn publish(admin: &Admin, n: usize, tag: &str) -> BTreeSet<String> {
    publish_type(admin, n, tag, "order.paid").await
}

async fn publish_type(admin: &Admin, n: usize, tag: &str, ty: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let v = api(
            admin,
            reqwest::Method::POST,
            "/v1/events",
            json!({"type": ty, "data": {"tag": tag, "i": i}}),
        )
        .await;
        ids.insert(v["id"].as_str().expect("id").to_string());
    }
    ids
}

/// The signatures of a request that verify with `secret`.
pub(crate) fn verifies(r: &Recorded, secret: &str) -> bool {
    let key = decode_secret(secret).expect("secret");
    let ts: i64 = r.headers["webhook-timestamp"].parse().expect("timestamp");
    verify(
        &key,
        &r.headers["webhook-id"],
        ts,
        &r.body,
        &r.headers["webhook-signature"],
    )
}

fn signatures(r: &Recorded) -> usize {
    r.headers["webhook-signature"].split_whitespace().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_made_through_the_api_are_live_on_every_process_and_traced() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.script(
        "flaky",
        vec![
            Behavior::Status(503),
            Behavior::Status(500),
            Behavior::Status(204),
        ],
    );
    let prefix = unique_prefix("live");
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"1s\", \"2s\"]\n{}",
            admin_section()
        ),
    );
    apply_topics(&config).await;
    let deduper = start_deduper(&config);
    let (pod_a, plane_a) = dispatcher(&config, "pod-a").await;
    let (pod_b, plane_b) = dispatcher(&config, "pod-b").await;
    let (pod_c, plane_c) = tiers(&config, "pod-c").await;
    let planes = [&plane_a, &plane_b, &plane_c];
    let admin = Admin::start(&config).await;

    // Created through the API while every stage runs: delivered within seconds, by both
    // dispatchers (the events spread over the partitions), signed with the returned secret.
    let made = api(
        &admin,
        reqwest::Method::POST,
        "/v1/endpoints",
        json!({"id": "crm", "url": rx.url("crm"), "event_types": ["order.*"]}),
    )
    .await;
    let created = Instant::now();
    let secret = made["secret"].as_str().expect("secret").to_string();
    everywhere(&planes, "crm", "the create", |e| e.is_some()).await;
    // Both dispatchers hold partitions once the group settles: publish until each delivered.
    let by = |reg: &prometheus::Registry| {
        counter(
            reg,
            "hookline_delivery_attempts_total",
            Some(("result", "delivered")),
        )
    };
    let mut ids = publish(&admin, 12, "first").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = rx.wait_for("crm", ids.len(), Duration::from_secs(30)).await;
        assert_eq!(got.len(), ids.len(), "every event delivered");
        if ids.len() == 12 {
            println!(
                "live endpoint: created → 12 deliveries in {} ms",
                created.elapsed().as_millis()
            );
        }
        if by(&pod_a.registry) > 0.0 && by(&pod_b.registry) > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both dispatchers deliver to it: a {} b {}",
            by(&pod_a.registry),
            by(&pod_b.registry)
        );
        ids.extend(publish(&admin, 6, "more").await);
    }
    let got = rx.requests("crm");
    let delivered: BTreeSet<String> = got
        .iter()
        .map(|r| r.headers["webhook-id"].clone())
        .collect();
    assert_eq!(delivered, ids);
    assert!(got
        .iter()
        .all(|r| verifies(r, &secret) && signatures(r) == 1));
    let first_batch = got.len();
    // Which endpoint: the attempt metrics carry it (few endpoints: per-endpoint series).
    let to_crm = |reg: &prometheus::Registry| {
        counter(
            reg,
            "hookline_delivery_attempts_total",
            Some(("endpoint", "crm")),
        )
    };
    // The receiver records a request before its answer reaches the dispatcher, which counts
    // the attempt then: wait for the count (seen once in CI: 59 of 60 at the first look).
    let counted_by = Instant::now() + Duration::from_secs(10);
    while to_crm(&pod_a.registry) + to_crm(&pod_b.registry) < first_batch as f64
        && Instant::now() < counted_by
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        to_crm(&pod_a.registry) + to_crm(&pod_b.registry),
        first_batch as f64,
        "endpoint=\"crm\" counts every attempt to it"
    );

    // Update: the URL moves; the next events go to the new one.
    api(
        &admin,
        reqwest::Method::PATCH,
        "/v1/endpoints/crm",
        json!({"url": rx.url("crm-v2")}),
    )
    .await;
    let v2 = rx.url("crm-v2");
    everywhere(&planes, "crm", "the update", |e| {
        e.is_some_and(|e| e.url == v2)
    })
    .await;
    let moved = publish(&admin, 4, "moved").await;
    let got = rx.wait_for("crm-v2", 4, Duration::from_secs(30)).await;
    assert_eq!(
        got.iter()
            .map(|r| r.headers["webhook-id"].clone())
            .collect::<BTreeSet<_>>(),
        moved
    );

    // Rotation with a 4 s grace: two signatures (old and new secret) now, one (new) after.
    let rotated = api(
        &admin,
        reqwest::Method::POST,
        "/v1/endpoints/crm/rotate-secret",
        json!({"grace": "4s"}),
    )
    .await;
    let new_secret = rotated["secret"].as_str().expect("new secret").to_string();
    let rotated_at = Instant::now();
    everywhere(&planes, "crm", "the rotation", |e| {
        e.is_some_and(|e| e.secrets.len() == 2)
    })
    .await;
    publish(&admin, 1, "during-grace").await;
    let got = rx.wait_for("crm-v2", 5, Duration::from_secs(30)).await;
    let during = &got[4];
    assert!(
        rotated_at.elapsed() < Duration::from_secs(4),
        "still within the grace period"
    );
    assert_eq!(
        signatures(during),
        2,
        "{:?}",
        during.headers["webhook-signature"]
    );
    assert!(verifies(during, &secret) && verifies(during, &new_secret));
    tokio::time::sleep(
        Duration::from_secs(4).saturating_sub(rotated_at.elapsed()) + Duration::from_millis(500),
    )
    .await;
    publish(&admin, 1, "after-grace").await;
    let got = rx.wait_for("crm-v2", 6, Duration::from_secs(30)).await;
    let after = &got[5];
    assert_eq!(
        signatures(after),
        1,
        "{:?}",
        after.headers["webhook-signature"]
    );
    assert!(verifies(after, &new_secret) && !verifies(after, &secret));

    // Disable: nothing more is sent; delete: still nothing.
    api(
        &admin,
        reqwest::Method::PATCH,
        "/v1/endpoints/crm",
        json!({"enabled": false}),
    )
    .await;
    everywhere(&planes, "crm", "the disable", |e| {
        e.is_some_and(|e| !e.enabled)
    })
    .await;
    publish(&admin, 3, "disabled").await;
    api(
        &admin,
        reqwest::Method::DELETE,
        "/v1/endpoints/crm",
        Value::Null,
    )
    .await;
    everywhere(&planes, "crm", "the delete", |e| e.is_none()).await;
    publish(&admin, 3, "deleted").await;

    // A retried event, traced: attempt 1 by a dispatcher, 2 and 3 by the tiers (pod-c).
    api(
        &admin,
        reqwest::Method::POST,
        "/v1/endpoints",
        json!({"id": "flaky", "url": rx.url("flaky"), "event_types": ["audit.*"]}),
    )
    .await;
    everywhere(&planes, "flaky", "the second create", |e| e.is_some()).await;
    let traced = publish_type(&admin, 1, "traced", "audit.checked")
        .await
        .into_iter()
        .next()
        .expect("id");
    rx.wait_for("flaky", 3, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rx.requests("crm-v2").len(),
        6,
        "nothing sent once disabled or deleted"
    );
    assert_eq!(
        rx.requests("crm").len(),
        first_batch,
        "nothing more to the old URL"
    );

    // `hookline trace` (the binary) shows the three attempts, from two processes.
    let file = write_config(&prefix, "");
    let deadline = Instant::now() + Duration::from_secs(30);
    let lines: Vec<Value> = loop {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
            .arg("--config")
            .arg(&file)
            .args(["trace", &traced, "--json"])
            .env_remove("HOOKLINE_CONFIG")
            .output()
            .expect("hookline trace");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.len() >= 3 || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let summary: Vec<(u64, String, String, String)> = lines
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap_or(0),
                a["stage"].as_str().unwrap_or("").to_string(),
                a["outcome"].as_str().unwrap_or("").to_string(),
                a["instance"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(summary.len(), 3, "{summary:?}");
    assert_eq!(
        summary
            .iter()
            .map(|s| (s.0, s.1.as_str(), s.2.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (1, "dispatcher", "failed"),
            (2, "retry.1s", "failed"),
            (3, "retry.2s", "delivered"),
        ],
        "{summary:?}"
    );
    assert!(
        ["pod-a", "pod-b"].contains(&summary[0].3.as_str()),
        "{summary:?}"
    );
    assert_eq!(
        (summary[1].3.as_str(), summary[2].3.as_str()),
        ("pod-c", "pod-c")
    );
    assert_eq!(lines[0]["next"], "retry.1s");
    assert_eq!(lines[1]["next"], "retry.2s");
    // The same over HTTP, scoped: acme's token reads the three attempts, globex's gets a 404.
    let trace_url = admin.url(&format!("/v1/events/{traced}/attempts"));
    let mine = api(
        &admin,
        reqwest::Method::GET,
        &format!("/v1/events/{traced}/attempts"),
        Value::Null,
    )
    .await;
    assert_eq!(mine["attempts"].as_array().map(Vec::len), Some(3), "{mine}");
    let theirs = reqwest::Client::new()
        .get(&trace_url)
        .bearer_auth(crate::admin::GLOBEX_TOKEN)
        .send()
        .await
        .expect("sent");
    assert_eq!(theirs.status(), reqwest::StatusCode::NOT_FOUND);

    admin.stop().await;
    for s in [pod_a, pod_b, pod_c, deduper] {
        s.stop().await.expect("clean stop");
    }
}

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

/// Event `i` of the filter test: amounts 0..1000, regions eu-/us- alternating, every tenth
/// without a region (the filter cannot be evaluated on it: a no-match, counted as an error).
fn mixed_event(prefix: &str, i: usize) -> (String, String) {
    let id = format!("{prefix}-f{i}");
    let region = match i % 10 {
        0 => String::new(),
        r if r % 2 == 1 => r#","region":"eu-west""#.to_string(),
        _ => r#","region":"us-east""#.to_string(),
    };
    let body = format!(
        r#"{{"id":"{id}","type":"order.paid","tenant":"acme","data":{{"amount":{amount}{region}}}}}"#,
        amount = (i * 7) % 1000
    );
    (id, body)
}

fn filter_matches(i: usize) -> bool {
    i % 2 == 1 && (i * 7) % 1000 > 500
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_delivers_exactly_the_matching_subset_also_after_a_retry() {
    require_kafka();
    let rx = Receiver::start().await;
    // The first 40 requests fail: those deliveries are retried by the first tier, their filter
    // evaluated again there.
    rx.script("f", vec![Behavior::Status(503); 40]);
    rx.default("f", Behavior::Status(200));
    rx.default("g", Behavior::Status(500));
    let prefix = unique_prefix("controls-filter");
    let filter = "data.region.startsWith('eu-') && data.amount > 500";
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"3s\", \"6s\"]\n{}\
             [[endpoints]]\nid = \"f\"\nurl = \"{}\"\nfilter = \"{filter}\"\n",
            admin_section(),
            rx.url("f"),
        ),
    );
    apply_topics(&config).await;
    let [dispatcher, tiers] = start_delivering(&config).await;
    let stages = [start_deduper(&config), dispatcher, tiers];
    let admin = Admin::start(&config).await;

    // A bad filter is a 400 naming the field and the position.
    let (status, body) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ADMIN_TOKEN,
        Some(json!({"id": "bad", "url": rx.url("g"), "filter": "data.amount >"})),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "filter", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("at 1:")),
        "{body}"
    );

    let events: Vec<(String, String)> = (0..1000).map(|i| mixed_event(&prefix, i)).collect();
    produce_events(&prefix, &events).await;
    let expected: std::collections::BTreeSet<String> = (0..1000)
        .filter(|i| filter_matches(*i))
        .map(|i| events[i].0.clone())
        .collect();
    assert!(expected.len() > 100, "a real subset: {}", expected.len());

    // Every matching event delivered (40 of them after a failed first attempt), nothing else.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let got = loop {
        let got = rx.requests("f");
        let all: std::collections::BTreeSet<String> = got
            .iter()
            .map(|r| header(r, "webhook-id").to_string())
            .collect();
        if all == expected && got.len() >= expected.len() + 40 {
            break got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} matching events delivered; {} not matching: {:?}",
            all.intersection(&expected).count(),
            expected.len(),
            all.difference(&expected).count(),
            all.difference(&expected).take(5).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let retried: Vec<&Recorded> = got
        .iter()
        .filter(|r| header(r, "webhook-attempt") == "2")
        .collect();
    assert_eq!(
        retried.len(),
        40,
        "the 40 failed first attempts retried once each"
    );
    // Give stragglers a moment: nothing more arrives.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rx.requests("f").len(),
        expected.len() + 40,
        "no duplicate, no extra"
    );
    let filtered = |result: &str| {
        counter(
            &stages[1].registry,
            "hookline_delivery_filtered_total",
            Some(("result", result)),
        )
    };
    // CEL's `&&` absorbs an error when the other side is false: only the region-less events
    // with an amount over 500 are errors.
    let errors = (0..1000)
        .filter(|&i: &usize| i.is_multiple_of(10) && (i * 7) % 1000 > 500)
        .count();
    assert_eq!(filtered("error") as usize, errors);
    assert_eq!(
        (filtered("no_match") + filtered("error")) as usize,
        1000 - expected.len()
    );

    // A filter changed between attempts is honoured: the retries of an endpoint whose filter
    // no longer matches end in the DLQ as endpoint_unsubscribed, never sent again.
    let (status, made) = send(
        Method::POST,
        &admin,
        "/v1/endpoints",
        ADMIN_TOKEN,
        Some(json!({"id": "g", "url": rx.url("g"), "tenant": "acme", "filter": "data.n >= 0"})),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{made}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in 0..3 {
        let (status, _) = send(
            Method::POST,
            &admin,
            "/v1/events",
            ACME_TOKEN,
            Some(json!({"type": "order.paid", "data": {"n": n}})),
        )
        .await;
        assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    }
    let first = rx.wait_for("g", 3, Duration::from_secs(30)).await;
    assert_eq!(first.len(), 3, "three first attempts (500)");
    let (status, body) = send(
        Method::PATCH,
        &admin,
        "/v1/endpoints/g",
        ADMIN_TOKEN,
        Some(json!({"filter": "data.n > 100"})),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert_eq!(body["filter"], "data.n > 100");
    let dead = wait_dead(&admin, 3).await;
    let reasons: Vec<&str> = dead
        .iter()
        .filter(|d| d["endpoint_id"] == "g")
        .filter_map(|d| d["dead_reason"].as_str())
        .collect();
    assert_eq!(reasons, vec!["endpoint_unsubscribed"; 3], "{dead:?}");
    assert_eq!(rx.requests("g").len(), 3, "no retry was sent");

    admin.stop().await;
    for s in stages {
        s.stop().await.expect("stage stops cleanly");
    }
}

/// The most requests in any one-second window (sliding, at every arrival).
fn max_per_second(arrivals: &[std::time::Instant]) -> usize {
    let mut at: Vec<std::time::Instant> = arrivals.to_vec();
    at.sort();
    let mut best = 0;
    let mut from = 0;
    for to in 0..at.len() {
        while at[to].duration_since(at[from]) >= Duration::from_secs(1) {
            from += 1;
        }
        best = best.max(to - from + 1);
    }
    best
}

/// Produces `(id, body)` events to `<prefix>.events`, all at once (keyed by id); returns when
/// the first was sent.
async fn produce_events(prefix: &str, events: &[(String, String)]) -> std::time::Instant {
    let producer = producer();
    let topic = format!("{prefix}.events");
    let start = std::time::Instant::now();
    futures::future::join_all(events.iter().map(|(id, body)| {
        produce(
            &producer,
            &topic,
            None,
            Some(id.as_bytes()),
            Some(body.as_bytes()),
            &[],
        )
    }))
    .await;
    start
}

/// Produces `n` events of `event_type` (ids `<prefix>-<tag>-<i>`), all at once.
async fn burst(prefix: &str, tag: &str, event_type: &str, n: usize) -> std::time::Instant {
    let events: Vec<(String, String)> = (0..n)
        .map(|i| {
            let id = format!("{prefix}-{tag}-{i}");
            let body = format!(r#"{{"id":"{id}","type":"{event_type}","data":{{"i":{i}}}}}"#);
            (id, body)
        })
        .collect();
    produce_events(prefix, &events).await
}

/// Waits until `path` has `n` requests whose `webhook-id` starts with `<prefix>-<tag>-`; returns
/// their arrival times.
async fn arrivals(
    rx: &Receiver,
    path: &str,
    prefix: &str,
    tag: &str,
    n: usize,
    deadline: Duration,
) -> Vec<std::time::Instant> {
    let want = format!("{prefix}-{tag}-");
    let until = std::time::Instant::now() + deadline;
    loop {
        let got = rx.arrivals(path, &want);
        if got.len() >= n || std::time::Instant::now() >= until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_across_three_dispatchers_without_slowing_a_neighbour() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.default("limited", Behavior::Status(200));
    rx.default("free", Behavior::Status(200));
    let prefix = unique_prefix("controls-rate");
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"5s\"]\n\
             [[endpoints]]\nid = \"limited\"\nurl = \"{}\"\nevent_types = [\"burst.*\"]\nrate_limit = 50\n\
             [[endpoints]]\nid = \"free\"\nurl = \"{}\"\n",
            rx.url("limited"),
            rx.url("free"),
        ),
    );
    apply_topics(&config).await;
    // Three dispatchers and two processes of tiers (the rate limiter's group has two members:
    // one of them owns the endpoint's partition of <p>.throttle).
    let mut stages = vec![
        start_deduper(&config),
        start_dispatcher(&config),
        start_dispatcher(&config),
        start_dispatcher(&config),
    ];
    stages.push(crate::retry::start_tiers(&config, None).await);
    stages.push(crate::retry::start_tiers(&config, None).await);

    // The delivery log's health tracker, running through every measurement alike.
    let health =
        hookline_control::tracker::Health::start(&config, None, &prometheus::Registry::new())
            .await
            .expect("health tracker");

    // The neighbour: `n` events only it receives, produced at once, until the last arrives.
    // Its throughput beside the drain is measured by the benchmark (`make bench`, the
    // "neighbour" line: release build, alternating pairs); here it must simply not be held back.
    let n = 8000;
    let neighbour = |tag: String| {
        let (rx, prefix) = (&rx, &prefix);
        async move {
            let start = burst(prefix, &tag, "solo.created", n).await;
            let got = arrivals(rx, "free", prefix, &tag, n, Duration::from_secs(120)).await;
            assert_eq!(got.len(), n, "{tag}");
            n as f64
                / got
                    .iter()
                    .max()
                    .expect("arrivals")
                    .duration_since(start)
                    .as_secs_f64()
        }
    };
    let alone = neighbour("alone".into()).await; // also: groups joined, connections open

    // 2,000 events both receive: the limited endpoint gets them at 50/s, ~40 s.
    let burst_start = burst(&prefix, "burst", "burst.created", 2000).await;
    let got = arrivals(
        &rx,
        "free",
        &prefix,
        "burst",
        2000,
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(got.len(), 2000);
    // While the limited endpoint's backlog drains, every one of the neighbour's events arrives.
    let beside = neighbour("beside".into()).await;
    let limited_then = arrivals(&rx, "limited", &prefix, "burst", 0, Duration::ZERO)
        .await
        .len();
    assert!(
        limited_then < 1900,
        "the neighbour was measured while the limited endpoint drained ({limited_then} of 2000)"
    );

    // Health, from the delivery log: the limited endpoint shows "throttled" while it drains.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        health
            .wait_caught_up(Duration::from_secs(30))
            .await
            .expect("caught up");
        let status = health.report("limited").status;
        if status == "throttled" || std::time::Instant::now() >= deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(status, "throttled", "health while the backlog drains");
    assert_eq!(health.report("free").status, "healthy");

    let limited = arrivals(
        &rx,
        "limited",
        &prefix,
        "burst",
        2000,
        Duration::from_secs(120),
    )
    .await;
    let drained = burst_start.elapsed();
    assert_eq!(limited.len(), 2000, "every event arrives");
    let requests = rx.requests("limited");
    assert_eq!(requests.len(), 2000, "once each");
    assert!(
        requests.iter().all(|r| header(r, "webhook-attempt") == "1"),
        "waiting never counts as an attempt"
    );
    let ids: std::collections::BTreeSet<&str> =
        requests.iter().map(|r| header(r, "webhook-id")).collect();
    assert_eq!(ids.len(), 2000, "no duplicate");
    let peak = max_per_second(&limited);
    println!(
        "rate limit 50/s: 2,000 deliveries in {:.1} s, at most {peak} in any 1 s window; \
         neighbour {alone:.0}/s alone, {beside:.0}/s beside the drain (debug build, one run each)",
        drained.as_secs_f64(),
    );
    assert!(peak <= 55, "at most 55 in any 1 s window, saw {peak}");
    // The chart's counts: nearly every one of the 2,000 waited for the limit.
    health
        .wait_caught_up(Duration::from_secs(30))
        .await
        .expect("caught up");
    let throttled: u64 = health
        .per_minute("limited", 60)
        .iter()
        .map(|(_, _, _, t)| t)
        .sum();
    println!("throttled attempts in the delivery log: {throttled} of 2000");
    assert!(throttled >= 1900, "{throttled} throttled attempts counted");
    for s in stages {
        s.stop().await.expect("stage stops cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_pauses_the_endpoints_new_deliveries() {
    require_kafka();
    let rx = Receiver::start().await;
    rx.script("slow", vec![Behavior::RetryAfter(429, 5)]);
    rx.default("slow", Behavior::Status(200));
    let prefix = unique_prefix("controls-retry-after");
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"2s\"]\n\
             [[endpoints]]\nid = \"slow\"\nurl = \"{}\"\nrate_limit = 20\n",
            rx.url("slow"),
        ),
    );
    apply_topics(&config).await;
    let mut stages = vec![start_deduper(&config), start_dispatcher(&config)];
    stages.push(crate::retry::start_tiers(&config, None).await);

    // One event first: its attempt is answered 429, Retry-After: 5.
    burst(&prefix, "first", "order.created", 1).await;
    let first = arrivals(&rx, "slow", &prefix, "first", 1, Duration::from_secs(60)).await;
    assert_eq!(first.len(), 1);
    let t0 = first[0];
    // Ten more right away: they wait out the pause, then go at 20/s; the 429'd one is retried
    // by its schedule (2 s), through the same pause.
    burst(&prefix, "next", "order.created", 10).await;
    let next = arrivals(&rx, "slow", &prefix, "next", 10, Duration::from_secs(60)).await;
    assert_eq!(next.len(), 10);
    let retried = arrivals(&rx, "slow", &prefix, "first", 2, Duration::from_secs(60)).await;
    assert_eq!(
        retried.len(),
        2,
        "the 429'd delivery retried on its schedule"
    );
    let earliest = next
        .iter()
        .chain(retried.iter().skip(1))
        .min()
        .expect("arrivals")
        .duration_since(t0);
    println!(
        "Retry-After: 5 → the next request came {:.2} s later",
        earliest.as_secs_f64()
    );
    assert!(
        earliest >= Duration::from_millis(4800) && earliest <= Duration::from_secs(8),
        "paused for ~5 s, got {earliest:?}"
    );
    let attempts: Vec<String> = rx
        .requests("slow")
        .iter()
        .filter(|r| header(r, "webhook-id").ends_with("-first-0"))
        .map(|r| header(r, "webhook-attempt").to_string())
        .collect();
    assert_eq!(
        attempts,
        ["1", "2"],
        "the failed attempt followed the schedule"
    );
    for s in stages {
        s.stop().await.expect("stage stops cleanly");
    }
}

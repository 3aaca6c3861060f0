//! Review fixes (issue 8, items 2, 4, 10, 11): Kubernetes service-link variables through the real
//! binary, dedupe keys namespaced by rule and tenant through the real deduper, a 2xx whose body
//! trickles past the timeout through the real dispatcher, and `min.insync.replicas` in the topic
//! plan against the real broker.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use hookline_common::contract::headers as h;

use crate::harness::*;

/// What Kubernetes injects for Services `hookline` (port 9464 named `metrics`) and
/// `hookline-admin` (port 8080 named `http-api`) in the pod's namespace.
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("HOOKLINE_SERVICE_HOST", "10.0.0.11"),
    ("HOOKLINE_SERVICE_PORT", "9464"),
    ("HOOKLINE_SERVICE_PORT_METRICS", "9464"),
    ("HOOKLINE_PORT", "tcp://10.0.0.11:9464"),
    ("HOOKLINE_PORT_9464_TCP", "tcp://10.0.0.11:9464"),
    ("HOOKLINE_PORT_9464_TCP_PROTO", "tcp"),
    ("HOOKLINE_PORT_9464_TCP_PORT", "9464"),
    ("HOOKLINE_PORT_9464_TCP_ADDR", "10.0.0.11"),
    ("HOOKLINE_ADMIN_SERVICE_HOST", "10.0.0.12"),
    ("HOOKLINE_ADMIN_SERVICE_PORT", "8080"),
    ("HOOKLINE_ADMIN_SERVICE_PORT_HTTP_API", "8080"),
    ("HOOKLINE_ADMIN_PORT", "tcp://10.0.0.12:8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP", "tcp://10.0.0.12:8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_PROTO", "tcp"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_PORT", "8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_ADDR", "10.0.0.12"),
];

fn hookline(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run hookline")
}

/// Item 2: a pod in a namespace with `hookline…` Services starts (config check and a command
/// that initialises logging), naming the ignored variables once; a mistyped override still fails
/// with exit 2 naming the key it meant.
#[test]
fn kubernetes_service_links_do_not_stop_the_process() {
    let prefix = unique_prefix("k8s-env");
    let config = write_config(&prefix, "");
    let config = config.to_str().expect("utf-8 path");

    let check = hookline(&["config", "check", config], SERVICE_LINKS);
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(0), "config check: {stderr}");
    for (k, _) in SERVICE_LINKS {
        assert!(stderr.contains(k), "config check must name {k}: {stderr}");
    }

    // A command that starts logging like a stage does (and needs no broker).
    let describe = hookline(&["--config", config, "topics", "describe"], SERVICE_LINKS);
    let stderr = String::from_utf8_lossy(&describe.stderr);
    assert_eq!(describe.status.code(), Some(0), "topics describe: {stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("HOOKLINE_SERVICE_HOST"))
        .collect();
    assert_eq!(lines.len(), 1, "one log line naming them: {stderr}");
    for (k, _) in SERVICE_LINKS {
        assert!(
            lines[0].contains(k),
            "the log line must name {k}: {}",
            lines[0]
        );
    }

    let mut mistyped = SERVICE_LINKS.to_vec();
    mistyped.push(("HOOKLINE_KAFKA_BOOTSTRAP_SERVERS", "10.0.0.1:9092"));
    let bad = hookline(&["config", "check", config], &mistyped);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(
        bad.status.code(),
        Some(2),
        "a mistyped override fails: {stderr}"
    );
    assert!(
        stderr.contains("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS"),
        "the error names the intended key: {stderr}"
    );
}

/// `min.insync.replicas` of `topic` on the broker, and whether it is set on the topic itself
/// (rather than inherited from the broker default).
async fn min_insync(topic: &str) -> (String, bool) {
    use rdkafka::admin::{ConfigSource, ResourceSpecifier};
    let res = admin()
        .describe_configs([&ResourceSpecifier::Topic(topic)], &admin_opts())
        .await
        .expect("describe configs");
    let resource = res
        .into_iter()
        .next()
        .expect("one resource")
        .expect("described");
    let entry = resource
        .entries
        .into_iter()
        .find(|e| e.name == "min.insync.replicas")
        .expect("min.insync.replicas is described");
    (
        entry.value.unwrap_or_default(),
        matches!(entry.source, ConfigSource::DynamicTopic),
    )
}

/// Item 11: `topics apply` sets `min.insync.replicas` on every topic it creates (1 with the test
/// broker's replication factor 1), and reports a topic with another value as drift (exit 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_apply_sets_min_insync_replicas_and_reports_drift() {
    use rdkafka::admin::{NewTopic, TopicReplication};
    require_kafka();
    let prefix = unique_prefix("isr");
    let config = test_config(&prefix, "[retry]\nschedule = [\"0s\", \"2s\"]\n");
    // Someone created the DLQ by hand, with a min.insync.replicas the plan does not want.
    let dlq = format!("{prefix}.dlq");
    let t = NewTopic::new(&dlq, 3, TopicReplication::Fixed(1))
        .set("retention.ms", "-1")
        .set("cleanup.policy", "delete")
        .set("max.message.bytes", "5242880")
        .set("min.insync.replicas", "2");
    for r in admin()
        .create_topics([&t], &admin_opts())
        .await
        .expect("create")
    {
        r.expect("created");
    }
    let report = hookline_common::kafka::apply_topics(&config, std::time::Duration::from_secs(30))
        .await
        .expect("apply");
    for spec in hookline_common::contract::topics::plan(&config) {
        if spec.name == dlq {
            continue;
        }
        let (value, on_topic) = min_insync(&spec.name).await;
        assert_eq!(value, "1", "{} min.insync.replicas", spec.name);
        assert!(
            on_topic,
            "{}: min.insync.replicas must be set by apply, not inherited",
            spec.name
        );
    }
    let drift: Vec<String> = report.drift.iter().map(|d| d.to_string()).collect();
    assert_eq!(
        drift,
        [format!("{dlq}: min.insync.replicas is 2 (expected 1)")],
        "exactly the hand-made difference"
    );
    // And the CLI exits 3 naming it.
    let out = hookline(
        &["topics", "apply"],
        &[
            ("HOOKLINE_CONFIG", "config/hookline.example.toml"),
            ("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", &bootstrap()),
            ("HOOKLINE_TOPICS__PREFIX", &prefix),
            ("HOOKLINE_TOPICS__PARTITIONS", "3"),
            ("HOOKLINE_RETRY__SCHEDULE", "[\"0s\", \"2s\"]"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "stdout: {stdout}");
    assert!(
        stdout.contains(&format!(
            "DRIFT     {dlq}: min.insync.replicas is 2 (expected 1)"
        )),
        "{stdout}"
    );
}

/// Item 4: dedupe keys live in the namespace of their rule and their tenant, and JSON numbers are
/// keyed by their exact text. Through the real deduper: events that only share a value pass,
/// copies of the same (rule or id, tenant, value) are still dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedupe_keys_are_namespaced_by_rule_and_tenant_and_numbers_are_exact() {
    require_kafka();
    let prefix = unique_prefix("dkeys");
    let config = test_config(
        &prefix,
        "[[dedupe.keys]]\ntype = \"email.inbound\"\npointers = [\"/data/messageId\"]\n\
         [[dedupe.keys]]\ntype = \"email.delivery.*\"\npointers = [\"/data/deliveryId\"]\n\
         [[dedupe.keys]]\ntype = \"order.*\"\npointers = [\"/data/orderNo\"]\n",
    );
    apply_topics(&config).await;
    // (event, passes?) in produce order, all on one input partition so the first copy wins.
    let events: &[(&str, bool)] = &[
        (
            r#"{"id":"a1","type":"email.inbound","data":{"messageId":"42"}}"#,
            true,
        ),
        // Another rule, the same value: its own namespace.
        (
            r#"{"id":"a2","type":"email.delivery.sent","data":{"deliveryId":"42"}}"#,
            true,
        ),
        // Same id, three tenants (one of them none): one tenant never suppresses another.
        (
            r#"{"id":"same-1","type":"x.y","tenant":"acme","data":{}}"#,
            true,
        ),
        (
            r#"{"id":"same-1","type":"x.y","tenant":"globex","data":{}}"#,
            true,
        ),
        (r#"{"id":"same-1","type":"x.y","data":{}}"#, true),
        // Integers beyond u64 that the same f64 would round together.
        (
            r#"{"id":"b1","type":"order.paid","data":{"orderNo":18446744073709551617}}"#,
            true,
        ),
        (
            r#"{"id":"b2","type":"order.paid","data":{"orderNo":18446744073709551618}}"#,
            true,
        ),
        // Copies: same rule + value, same id + tenant, same big number. Dropped.
        (
            r#"{"id":"a3","type":"email.inbound","data":{"messageId":"42"}}"#,
            false,
        ),
        (
            r#"{"id":"same-1","type":"x.y","tenant":"acme","data":{"copy":2}}"#,
            false,
        ),
        (
            r#"{"id":"b3","type":"order.paid","data":{"orderNo":18446744073709551617}}"#,
            false,
        ),
    ];
    let p = producer();
    for (event, _) in events {
        produce(
            &p,
            &format!("{prefix}.events"),
            Some(0),
            None,
            Some(event.as_bytes()),
            &[],
        )
        .await;
    }
    let running = start_deduper(&config);
    let passing = events.iter().filter(|(_, pass)| *pass).count();
    let dropped = events.len() - passing;
    let start = Instant::now();
    while counter(&running.registry, "hookline_deduper_duplicates_total", None) < dropped as f64
        && start.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dispatch = format!("{prefix}.dispatch");
    let out = read_all_quiet(
        &dispatch,
        passing,
        Duration::from_secs(60),
        Duration::from_secs(3),
    );
    let mut got: BTreeMap<(String, String), usize> = BTreeMap::new();
    for m in &out {
        let id = header(m, h::EVENT_ID).expect("event id").to_string();
        let tenant = header(m, h::TENANT).unwrap_or("-").to_string();
        *got.entry((id, tenant)).or_default() += 1;
    }
    let want: BTreeMap<(String, String), usize> = [
        ("a1", "-"),
        ("a2", "-"),
        ("same-1", "acme"),
        ("same-1", "globex"),
        ("same-1", "-"),
        ("b1", "-"),
        ("b2", "-"),
    ]
    .into_iter()
    .map(|(id, t)| ((id.to_string(), t.to_string()), 1))
    .collect();
    assert_eq!(got, want, "one dispatch per (namespace, tenant, value)");
    assert_eq!(
        counter(&running.registry, "hookline_deduper_duplicates_total", None),
        dropped as f64,
        "the copies are still duplicates"
    );
    running.stop().await.expect("clean stop");
}

/// An endpoint that acknowledges at once (`200` and its headers) and then trickles its body, one
/// byte every 200 ms for `trickle`; counts the requests it got.
async fn trickling_endpoint(
    trickle: Duration,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use axum::body::Body;
    use axum::routing::post;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().route(
        "/hook",
        post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let ticks = (trickle.as_millis() / 200) as usize;
                let stream = futures::stream::unfold(0usize, move |n| async move {
                    if n >= ticks {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Some((
                        Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b".")),
                        n + 1,
                    ))
                });
                (axum::http::StatusCode::OK, Body::from_stream(stream))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits)
}

/// Item 10: the status is the acknowledgement. An endpoint answering 200 at once and then
/// trickling its body for 6 s, with a 1 s timeout, is delivered once: no timeout, no hand-off to
/// the retry tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_status_with_a_slow_body_is_delivered_once_and_never_retried() {
    require_kafka();
    let (addr, hits) = trickling_endpoint(Duration::from_secs(6)).await;
    let prefix = unique_prefix("slowbody");
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\", \"2s\"]\n\
             [[endpoints]]\nid = \"trickle\"\nurl = \"http://{addr}/hook\"\ntimeout = \"1s\"\n"
        ),
    );
    apply_topics(&config).await;
    let p = producer();
    produce(
        &p,
        &format!("{prefix}.dispatch"),
        Some(0),
        Some(b"slow-1"),
        Some(br#"{"id":"slow-1","type":"x.y","data":{}}"#),
        &[
            (h::EVENT_ID, "slow-1"),
            (h::EVENT_TYPE, "x.y"),
            (h::DEDUPE_KEY, "k"),
        ],
    )
    .await;
    let running = start_dispatcher(&config);
    let attempts = |result: &str| {
        counter(
            &running.registry,
            "hookline_delivery_attempts_total",
            Some(("result", result)),
        )
    };
    let start = Instant::now();
    while attempts("delivered") + attempts("failed") < 1.0
        && start.elapsed() < Duration::from_secs(40)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tier = read_all_quiet(
        &format!("{prefix}.retry.2s"),
        1,
        Duration::from_secs(4),
        Duration::from_secs(1),
    );
    assert_eq!(
        (attempts("delivered"), attempts("failed")),
        (1.0, 0.0),
        "the 200 is a delivery, whatever the body does"
    );
    assert!(
        tier.is_empty(),
        "nothing handed to the retry tier: {} record(s)",
        tier.len()
    );
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "sent once"
    );
    running.stop().await.expect("clean stop");
}

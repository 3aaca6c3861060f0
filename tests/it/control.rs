//! The control plane against the real broker: the live endpoint registry (writes visible on a
//! second process within a bound, optimistic concurrency across processes, file-managed
//! endpoints seeded and protected, secrets sealed on the topic, secret rotation), the delivery
//! log (batched writer, `trace`), per-endpoint health and auto-disable, and the CLI.

use std::time::{Duration, Instant};

use hookline_common::config::{Config, EndpointConfig};
use hookline_common::contract::delivery::now_ms;
use hookline_control::attempts::{Attempt, AttemptLog, Outcome};
use hookline_control::trace::trace;
use hookline_control::tracker::Health;
use hookline_control::{EndpointUpdate, Keyring, Registry, WriteError};

use crate::harness::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn keyring(key: &str) -> Keyring {
    Keyring::from_base64(Some(key), &[]).expect("key")
}

fn def(id: &str, url: &str) -> EndpointConfig {
    EndpointConfig {
        id: id.into(),
        url: hookline_common::config::EndpointUrl::parse(url).expect("url"),
        secrets: vec![hookline_common::config::Secret::parse(SECRET).expect("secret")],
        tenant: Some("acme".into()),
        event_types: vec!["order.*".into()],
        enabled: true,
        timeout: None,
        max_concurrency: None,
        headers: vec![],
        filter: None,
        rate_limit: None,
        burst: None,
        trace_context: true,
    }
}

pub(crate) async fn registry(config: &Config, key: &str, seed: bool) -> Registry {
    Registry::start(config, keyring(key), &prometheus::Registry::new(), seed)
        .await
        .expect("registry starts")
}

/// Waits until `check` holds on `r`'s current set; returns how long it took.
async fn visible(r: &Registry, what: &str, check: impl Fn(&Registry) -> bool) -> Duration {
    let start = Instant::now();
    while !check(r) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: not visible on the second registry within 10s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_writes_reach_a_second_process_with_concurrency_and_file_rules() {
    require_kafka();
    let prefix = unique_prefix("registry");
    let config = test_config(
        &prefix,
        &format!(
            "[[endpoints]]\nid = \"from-file\"\nurl = \"https://file.example/hook\"\nsecrets = [\"{SECRET}\"]\n"
        ),
    );
    apply_topics(&config).await;
    let key = Keyring::generate_key();
    let a = registry(&config, &key, true).await;
    let b = registry(&config, &key, false).await;

    // The file's endpoint is seeded, file-managed, and refuses API edits.
    let seeded = b.get("from-file").expect("seeded endpoint visible");
    assert_eq!(seeded.managed_by.as_str(), "file");
    assert_eq!(seeded.signing_secrets_at(now_ms()), [SECRET]);
    let refused = a.set_enabled("from-file", false, None).await;
    assert!(
        matches!(refused, Err(WriteError::FileManaged { .. })),
        "{refused:?}"
    );
    // A second seeding process with the same file writes nothing new.
    let again = registry(&config, &key, true).await;
    assert_eq!(again.get("from-file").map(|e| e.version), Some(1));
    drop(again);

    // Create on A, visible on B; measure the propagation delay of each kind of write.
    // Each entry: (the write's own latency, call → visible on the other process).
    let mut delays: Vec<(Duration, Duration)> = Vec::new();
    let t0 = Instant::now();
    let (created, seen) = tokio::join!(
        async {
            let r = a.create(def("crm", "https://crm.example/a")).await;
            (r, t0.elapsed())
        },
        visible(&b, "create", |r| r.get("crm").is_some())
    );
    let (created, took) = created;
    assert_eq!(created.expect("create").version, 1);
    delays.push((took, seen));
    let dup = a.create(def("crm", "https://crm.example/a")).await;
    assert!(
        matches!(dup, Err(WriteError::AlreadyExists { .. })),
        "{dup:?}"
    );

    let t0 = Instant::now();
    let (updated, seen) = tokio::join!(
        async {
            let change = EndpointUpdate {
                url: Some("https://crm.example/b".into()),
                ..Default::default()
            };
            (b.update("crm", change, Some(1)).await, t0.elapsed())
        },
        visible(&a, "update", |r| {
            r.get("crm")
                .is_some_and(|e| e.url == "https://crm.example/b")
        })
    );
    assert_eq!(updated.0.expect("update on B").version, 2);
    delays.push((updated.1, seen));
    // A stale version is a conflict; a bad field is named.
    let stale = a.set_enabled("crm", false, Some(1)).await;
    assert!(
        matches!(
            stale,
            Err(WriteError::Conflict {
                expected: 1,
                actual: 2,
                ..
            })
        ),
        "{stale:?}"
    );
    let bad = a
        .update(
            "crm",
            EndpointUpdate {
                url: Some("ftp://nope".into()),
                ..Default::default()
            },
            None,
        )
        .await;
    match bad {
        Err(WriteError::Invalid(f)) => assert_eq!(f.field, "url"),
        other => panic!("expected an invalid url, got {other:?}"),
    }

    let t0 = Instant::now();
    let (disabled, seen) = tokio::join!(
        async { (a.set_enabled("crm", false, Some(2)).await, t0.elapsed()) },
        visible(&b, "disable", |r| r.get("crm").is_some_and(|e| !e.enabled))
    );
    disabled.0.expect("disable");
    delays.push((disabled.1, seen));
    assert!(!b.current().configs_at(now_ms())[0..]
        .iter()
        .any(|c| c.id == "crm" && c.enabled));

    // Two processes racing on the same version: exactly one wins.
    let (ra, rb) = tokio::join!(
        a.set_enabled("crm", true, Some(3)),
        b.update(
            "crm",
            EndpointUpdate {
                tenant: Some(Some("globex".into())),
                ..Default::default()
            },
            Some(3)
        )
    );
    let wins = [ra.is_ok(), rb.is_ok()];
    assert_eq!(
        wins.iter().filter(|w| **w).count(),
        1,
        "exactly one of two racing writes wins: {ra:?} / {rb:?}"
    );
    let loser = if ra.is_ok() { rb.err() } else { ra.err() };
    assert!(
        matches!(loser, Some(WriteError::Conflict { .. })),
        "{loser:?}"
    );
    visible(&b, "race winner", |r| {
        r.get("crm").is_some_and(|e| e.version == 4)
    })
    .await;
    assert_eq!(
        a.get("crm"),
        b.get("crm"),
        "both processes hold the same state"
    );

    // Rotation: two signing secrets during the grace period, one after.
    let rotated = a
        .rotate_secret("crm", None, Some(Duration::from_secs(3)), None)
        .await
        .expect("rotate");
    let now = now_ms();
    let signing = rotated.signing_secrets_at(now);
    assert_eq!(signing.len(), 2, "new + old during the grace period");
    assert_eq!(signing[1], SECRET);
    assert_eq!(
        rotated.signing_secrets_at(now + 3_500).len(),
        1,
        "old one expired"
    );
    visible(&b, "rotate", |r| {
        r.get("crm").is_some_and(|e| e.secrets.len() == 2)
    })
    .await;

    // On the topic, secrets are sealed: no plaintext, a key id, and a record per write.
    let topic = format!("{prefix}.endpoints");
    let records = read_until(&topic, Duration::from_secs(10), |r| r.len() >= 7);
    for m in &records {
        use rdkafka::message::Message as _;
        let text = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        assert!(
            !text.contains("MfKQ9r8"),
            "plaintext secret on the topic: {text}"
        );
        assert!(
            !text.contains("whsec_"),
            "plaintext secret on the topic: {text}"
        );
    }

    // PUT semantics: replaces the definition of an existing endpoint, creates a missing one.
    let mut full = def("crm", "https://crm.example/put");
    full.secrets.clear();
    let put = a.put(full, None).await.expect("put existing");
    assert_eq!(put.url, "https://crm.example/put");
    assert_eq!(put.secrets.len(), 2, "secrets are kept by put");
    let fresh = a
        .put(def("crm-2", "https://crm.example/2"), None)
        .await
        .expect("put new");
    assert_eq!(fresh.version, 1);

    // Delete: a tombstone; gone on both.
    let t0 = Instant::now();
    let (deleted, seen) = tokio::join!(
        async { (a.delete("crm", None).await, t0.elapsed()) },
        visible(&b, "delete", |r| r.get("crm").is_none())
    );
    deleted.0.expect("delete");
    delays.push((deleted.1, seen));
    let missing = a.delete("crm", None).await;
    assert!(
        matches!(missing, Err(WriteError::NotFound { .. })),
        "{missing:?}"
    );

    let ms: Vec<(u128, u128)> = delays
        .iter()
        .map(|(w, v)| (w.as_millis(), v.as_millis()))
        .collect();
    println!(
        "registry (create, update, disable, delete): (write call → returned, write call → \
         visible on the other process) ms: {ms:?}"
    );
    assert!(
        delays.iter().all(|(_, v)| *v < Duration::from_secs(5)),
        "{ms:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeding_follows_the_file_and_a_missing_key_disables_api_endpoints_rather_than_sends_unsigned(
) {
    require_kafka();
    let prefix = unique_prefix("seed");
    let with = |url: &str| {
        test_config(
            &prefix,
            &format!(
                "[[endpoints]]\nid = \"f1\"\nurl = \"{url}\"\nsecrets = [\"{SECRET}\"]\n\
                 [[endpoints]]\nid = \"f2\"\nurl = \"https://two.example/\"\n"
            ),
        )
    };
    let config = with("https://one.example/");
    apply_topics(&config).await;
    let key = Keyring::generate_key();
    let r = registry(&config, &key, true).await;
    let api = r
        .create(def("api-made", "https://api.example/"))
        .await
        .expect("create");
    assert_eq!(api.managed_by.as_str(), "api");
    drop(r);

    // The file changes: f1's URL, f2 gone. The next seeding start applies exactly that and leaves
    // the API-made endpoint alone.
    let changed = test_config(
        &prefix,
        &format!("[[endpoints]]\nid = \"f1\"\nurl = \"https://one.example/v2\"\nsecrets = [\"{SECRET}\"]\n"),
    );
    let r = registry(&changed, &key, true).await;
    let f1 = r.get("f1").expect("f1");
    assert_eq!((f1.url.as_str(), f1.version), ("https://one.example/v2", 2));
    assert!(r.get("f2").is_none(), "dropped from the file: deleted");
    assert!(
        r.get("api-made").is_some(),
        "API endpoints are not the file's business"
    );

    // A process without the key: file-managed endpoints sign with its own file's secrets (they
    // never go to the topic, so no key is needed for them); an API endpoint's sealed secret
    // cannot be opened, so that endpoint is treated as disabled — never sent unsigned.
    let blind = Registry::start(
        &changed,
        Keyring::empty(),
        &prometheus::Registry::new(),
        true,
    )
    .await
    .expect("starts and seeds without a key");
    let f1 = blind.get("f1").expect("visible");
    assert_eq!(f1.problem, None);
    let f1_now = f1.config_at(now_ms()).expect("parses");
    assert_eq!(
        f1_now.secrets,
        vec![hookline_common::config::Secret::parse(SECRET).expect("secret")]
    );
    assert!(f1_now.enabled);
    let api = blind.get("api-made").expect("visible");
    assert!(
        api.problem
            .as_deref()
            .is_some_and(|p| p.contains("HOOKLINE_SECRETS_KEY")),
        "{:?}",
        api.problem
    );
    assert!(!api.config_at(now_ms()).expect("parses").enabled);
    let no_key = blind.create(def("x", "https://x.example/")).await;
    assert!(matches!(no_key, Err(WriteError::Crypto(_))), "{no_key:?}");
}

fn attempt(event: &str, endpoint: &str, n: u32, stage: &str, ok: bool, at_ms: i64) -> Attempt {
    Attempt {
        event_id: event.into(),
        endpoint_id: endpoint.into(),
        tenant: Some("acme".into()),
        event_type: Some("order.paid".into()),
        attempt: n,
        stage: stage.into(),
        outcome: if ok {
            Outcome::Delivered
        } else {
            Outcome::Failed
        },
        status: Some(if ok { 200 } else { 503 }),
        class: if ok { "ok" } else { "http_status" }.into(),
        error: (!ok).then(|| "service unavailable".into()),
        duration_ms: 4,
        at_ms,
        next: None,
        instance: String::new(),
        waited_ms: 0,
    }
}

/// The CPU time of this process so far (user + system), from /proc.
fn process_cpu() -> Duration {
    cpu_of("self")
}

/// CPU time (user + system) of process `pid` ("self": this one) so far.
pub(crate) fn cpu_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    let after = stat.rsplit(')').next().expect("stat fields");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_log_traces_attempts_of_two_processes_and_health_auto_disables() {
    require_kafka();
    let prefix = unique_prefix("attempts");
    let extra = "[control]\nauto_disable_after = \"3s\"\nhealth_window = \"1m\"\n";
    let config = test_config(&prefix, extra);
    apply_topics(&config).await;
    let mut pod_a = config.clone();
    pod_a.kafka.instance_id = Some("pod-a".into());
    let mut pod_b = config.clone();
    pod_b.kafka.instance_id = Some("pod-b".into());
    let log_a = AttemptLog::start(&pod_a, &prometheus::Registry::new())
        .await
        .expect("log a");
    let log_b = AttemptLog::start(&pod_b, &prometheus::Registry::new())
        .await
        .expect("log b");

    // An event retried twice, then delivered; attempts made by two processes.
    let t = now_ms();
    let with = |mut a: Attempt, log: &AttemptLog, next: Option<&str>| {
        a.instance = log.instance().to_string();
        a.next = next.map(str::to_string);
        a
    };
    log_a.record(with(
        attempt("evt-1", "crm", 1, "dispatcher", false, t),
        &log_a,
        Some("retry.1m"),
    ));
    log_b.record(with(
        attempt("evt-1", "crm", 2, "retry.1m", false, t + 60_000),
        &log_b,
        Some("retry.5m"),
    ));
    log_a.record(with(
        attempt("evt-1", "crm", 3, "retry.5m", true, t + 300_000),
        &log_a,
        None,
    ));
    log_b.record(with(
        attempt("evt-2", "crm", 1, "dispatcher", true, t),
        &log_b,
        None,
    ));
    log_a.close().await;
    log_b.close().await;
    let attempts = trace(&config, "evt-1", None).await.expect("trace");
    let got: Vec<(u32, &str, &str, Outcome)> = attempts
        .iter()
        .map(|a| (a.attempt, a.stage.as_str(), a.instance.as_str(), a.outcome))
        .collect();
    assert_eq!(
        got,
        [
            (1, "dispatcher", "pod-a", Outcome::Failed),
            (2, "retry.1m", "pod-b", Outcome::Failed),
            (3, "retry.5m", "pod-a", Outcome::Delivered)
        ]
    );

    // `hookline trace` through the binary: the table and --json.
    let path = write_config(&prefix, "");
    let out = cli(&path, &[], &["trace", "evt-1"]);
    assert!(out.contains("3 attempt(s) of event evt-1"), "{out}");
    assert!(
        out.contains("http_status 503") && out.contains("pod-b"),
        "{out}"
    );
    let json = cli(&path, &[], &["trace", "evt-1", "--json"]);
    assert_eq!(json.lines().count(), 3, "{json}");

    // Health: an endpoint failing for longer than auto_disable_after is disabled, once, with an
    // operational event; its dead letter is counted.
    let key = Keyring::generate_key();
    let registry = registry(&config, &key, false).await;
    registry
        .create(def("flaky", "https://flaky.example/"))
        .await
        .expect("create");
    let log = AttemptLog::start(&config, &prometheus::Registry::new())
        .await
        .expect("log");
    let now = now_ms();
    log.record(attempt("e0", "flaky", 1, "dispatcher", true, now - 9_000));
    for i in 1..=5 {
        log.record(attempt(
            &format!("e{i}"),
            "flaky",
            1,
            "dispatcher",
            false,
            now - 8_000 + i * 1_000,
        ));
    }
    log.close().await;
    produce(
        &producer(),
        &format!("{prefix}.dlq"),
        None,
        Some(b"e1"),
        Some(b"{}"),
        &[("hookline-endpoint-id", "flaky")],
    )
    .await;
    let health = Health::start(
        &config,
        Some(registry.clone()),
        &prometheus::Registry::new(),
    )
    .await
    .expect("health");
    health
        .wait_caught_up(Duration::from_secs(30))
        .await
        .expect("caught up");
    let r = health.report("flaky");
    assert_eq!(r.status, "failing", "{r:?}");
    assert_eq!(r.consecutive_failures, 5);
    assert_eq!(r.failing_since_ms, Some(now - 7_000));
    assert_eq!(r.last_success_at_ms, Some(now - 9_000));
    assert_eq!(r.dead, 1);
    let disabled = Instant::now();
    while registry.get("flaky").is_some_and(|e| e.enabled) {
        assert!(
            disabled.elapsed() < Duration::from_secs(20),
            "not auto-disabled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = registry.get("flaky").expect("still there");
    assert!(
        e.disabled_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("auto:")),
        "{e:?}"
    );
    let events = read_until(
        &format!("{prefix}.operational"),
        Duration::from_secs(10),
        |r| r.len() >= 2,
    );
    let kinds: Vec<serde_json::Value> = events
        .iter()
        .map(|m| {
            serde_json::from_slice(rdkafka::message::Message::payload(m).unwrap_or_default())
                .expect("json")
        })
        .collect();
    assert_eq!(
        kinds.iter().map(|v| v["kind"].clone()).collect::<Vec<_>>(),
        vec!["endpoint.created", "endpoint_auto_disabled"],
        "one event per change"
    );
    let v = &kinds[1];
    assert_eq!(v["kind"], "endpoint_auto_disabled");
    assert_eq!(v["endpoint_id"], "flaky");
    assert_eq!(v["consecutive_failures"], 5);

    // `hookline endpoints health` through the binary.
    let out = cli(
        &path,
        &[("HOOKLINE_SECRETS_KEY", &key)],
        &["endpoints", "health", "flaky", "--json"],
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json line");
    assert_eq!(
        (v["status"].as_str(), v["dead"].as_u64()),
        (Some("failing"), Some(1)),
        "{out}"
    );
}

/// Runs the `hookline` binary with `config`, returns stdout; fails on a non-zero exit.
fn cli(config: &std::path::Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HOOKLINE_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("--config").arg(config).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run hookline");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "hookline {args:?} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_cli_manages_the_registry_against_kafka() {
    require_kafka();
    let prefix = unique_prefix("endpoints-cli");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let path = write_config(&prefix, "");
    let key = Keyring::generate_key();
    let env = [("HOOKLINE_SECRETS_KEY", key.as_str())];
    let run = |args: &[&str]| cli(&path, &env, args);

    let out = run(&[
        "endpoints",
        "add",
        "crm",
        "--url",
        "https://crm.example/h",
        "--tenant",
        "acme",
        "--event-type",
        "order.*",
    ]);
    assert!(out.contains("created crm (version 1)"), "{out}");
    let secret = out
        .lines()
        .find_map(|l| l.strip_prefix("secret: "))
        .expect("the generated secret is shown once")
        .to_string();
    assert!(hookline_common::contract::secret::decode_secret(&secret).is_ok());

    let list = run(&["endpoints", "list"]);
    assert!(
        list.contains("crm") && list.contains("enabled") && list.contains("order.*"),
        "{list}"
    );
    assert!(!list.contains(&secret), "secret values are never listed");
    run(&[
        "endpoints",
        "update",
        "crm",
        "--url",
        "https://crm.example/v2",
        "--if-version",
        "1",
    ]);
    run(&["endpoints", "disable", "crm"]);
    let rotated = run(&["endpoints", "rotate-secret", "crm", "--json"]);
    let v: serde_json::Value = serde_json::from_str(rotated.trim()).expect("json");
    assert_eq!(v["version"], 4);
    assert_eq!(v["secrets"].as_array().map(Vec::len), Some(2));
    assert_ne!(v["new_secret"].as_str(), Some(secret.as_str()));
    let json = run(&["endpoints", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    assert_eq!(
        (v["url"].as_str(), v["enabled"].as_bool()),
        (Some("https://crm.example/v2"), Some(false))
    );

    // A stale version is refused (exit 1) naming the versions.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
        .arg("--config")
        .arg(&path)
        .args(["endpoints", "enable", "crm", "--if-version", "1"])
        .env("HOOKLINE_SECRETS_KEY", &key)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("version 4, not the expected 1"), "{err}");

    // Custom headers: set, shown without the secret value, the secret kept by a bare name on an
    // update; a forbidden one refused naming the field.
    let out = run(&[
        "endpoints",
        "update",
        "crm",
        "--header",
        "X-Api-Key: k1",
        "--secret-header",
        "Authorization: Bearer cli-tok",
    ]);
    assert!(
        out.contains("header x-api-key: k1") && out.contains("header authorization: (secret)"),
        "{out}"
    );
    assert!(!out.contains("cli-tok"), "{out}");
    let json = run(&[
        "endpoints",
        "update",
        "crm",
        "--header",
        "X-Api-Key: k2",
        "--secret-header",
        "Authorization",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    assert_eq!(
        v["headers"],
        serde_json::json!([{"name": "x-api-key", "value": "k2", "secret": false},
                           {"name": "authorization", "value": null, "secret": true}])
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
        .arg("--config")
        .arg(&path)
        .args(["endpoints", "update", "crm", "--header", "Webhook-Id: x"])
        .env("HOOKLINE_SECRETS_KEY", &key)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("headers[0].name") && err.contains("webhook-*"),
        "{err}"
    );
    // A payload filter: set and shown; a bad one refused naming the field and position.
    let out = run(&[
        "endpoints",
        "update",
        "crm",
        "--filter",
        "data.amount > 100",
    ]);
    assert!(out.contains("filter: data.amount > 100"), "{out}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
        .arg("--config")
        .arg(&path)
        .args(["endpoints", "update", "crm", "--filter", "data.amount >"])
        .env("HOOKLINE_SECRETS_KEY", &key)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`filter`") && err.contains("at 1:"), "{err}");
    let unfiltered = run(&["endpoints", "update", "crm", "--no-filter", "--json"]);
    assert!(unfiltered.contains("\"filter\":null"), "{unfiltered}");
    let cleared = run(&["endpoints", "update", "crm", "--no-headers", "--json"]);
    assert!(cleared.contains("\"headers\":[]"), "{cleared}");
    // Trace context: on by default, switched off and on again.
    let out = run(&["endpoints", "update", "crm", "--no-trace-context"]);
    assert!(out.contains("trace context: off"), "{out}");
    assert!(
        run(&["endpoints", "list"]).contains("crm: trace context: off"),
        "listed"
    );
    let on = run(&["endpoints", "update", "crm", "--trace-context", "--json"]);
    let v: serde_json::Value = serde_json::from_str(on.trim()).expect("json");
    assert_eq!(v["trace_context"], true, "{on}");
    let out = run(&[
        "endpoints",
        "add",
        "quiet",
        "--url",
        "https://quiet.example/h",
        "--no-secret",
        "--no-trace-context",
    ]);
    assert!(out.contains("trace context: off"), "{out}");
    run(&["endpoints", "delete", "quiet"]);

    run(&["endpoints", "delete", "crm"]);
    assert!(run(&["endpoints", "list"]).contains("0 endpoint(s)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_log_writer_is_cheap() {
    require_kafka();
    let prefix = unique_prefix("attempts-cost");
    let config = test_config(&prefix, "[control]\nattempt_log_buffer = 100000\n");
    apply_topics(&config).await;
    let metrics = prometheus::Registry::new();
    let log = AttemptLog::start(&config, &metrics).await.expect("log");
    let n: u64 = 100_000;
    let t0 = now_ms();
    let (wall, cpu) = (Instant::now(), process_cpu());
    let mut call = Duration::ZERO;
    for i in 0..n {
        let a = attempt(&format!("evt-{i}"), "crm", 1, "dispatcher", i % 10 != 0, t0);
        let started = Instant::now();
        log.record(a);
        call += started.elapsed();
        if i % 20_000 == 19_999 {
            // The delivery path keeps going; give the writer a breath like real traffic would.
            tokio::task::yield_now().await;
        }
    }
    let written = || {
        counter(
            &metrics,
            "hookline_control_attempt_log_records_total",
            Some(("result", "written")),
        )
    };
    let dropped = || {
        counter(
            &metrics,
            "hookline_control_attempt_log_records_total",
            Some(("result", "dropped")),
        )
    };
    while written() + dropped() < n as f64 {
        assert!(
            wall.elapsed() < Duration::from_secs(60),
            "written {} dropped {}",
            written(),
            dropped()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (wall, cpu) = (wall.elapsed(), process_cpu() - cpu);
    log.close().await;
    println!(
        "delivery log writer: {n} records in {:.2}s = {:.0} records/s acknowledged; \
         CPU {:.1} µs per record (whole test process: serialize, channel, librdkafka); \
         record() call {:.2} µs mean; dropped {}",
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64(),
        cpu.as_micros() as f64 / n as f64,
        call.as_nanos() as f64 / n as f64 / 1000.0,
        dropped()
    );
    assert_eq!(dropped(), 0.0, "a 100k buffer takes a 100k burst");
}

/// Every change of an API-managed endpoint is one event on `<p>.operational`, written in the
/// change's own transaction by whichever process made it: two registries ("pods") take turns,
/// then race to disable the same endpoint, and the topic holds each change once, in order,
/// with the version it produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_change_is_one_operational_event_across_processes() {
    require_kafka();
    let prefix = unique_prefix("opevents");
    let config = test_config(&prefix, "");
    apply_topics(&config).await;
    let key = Keyring::generate_key();
    let a = registry(&config, &key, false).await;
    let b = registry(&config, &key, false).await;
    a.create(def("crm", "https://crm.example/h"))
        .await
        .expect("create");
    visible(&b, "created", |r| r.get("crm").is_some()).await;
    b.update(
        "crm",
        EndpointUpdate {
            url: Some("https://crm.example/v2".into()),
            ..Default::default()
        },
        Some(1),
    )
    .await
    .expect("update");
    visible(&a, "updated", |r| {
        r.get("crm").is_some_and(|e| e.version == 2)
    })
    .await;
    // Both pods disable it at once: one wins, one event.
    let (x, y) = tokio::join!(
        a.set_enabled("crm", false, None),
        b.set_enabled("crm", false, None)
    );
    x.expect("a's disable");
    y.expect("b's disable");
    visible(&b, "disabled", |r| r.get("crm").is_some_and(|e| !e.enabled)).await;
    b.set_enabled("crm", true, None).await.expect("enable");
    visible(&a, "enabled", |r| r.get("crm").is_some_and(|e| e.enabled)).await;
    a.rotate_secret("crm", None, None, None)
        .await
        .expect("rotate");
    visible(&b, "rotated", |r| {
        r.get("crm").is_some_and(|e| e.version == 5)
    })
    .await;
    b.delete("crm", None).await.expect("delete");

    let events = read_until(
        &format!("{prefix}.operational"),
        Duration::from_secs(15),
        |r| r.len() >= 6,
    );
    // Settle: nothing more arrives.
    let settled = read_until(
        &format!("{prefix}.operational"),
        Duration::from_secs(2),
        |_| false,
    );
    assert_eq!(settled.len(), events.len().max(6), "no extra events");
    let seen: Vec<(String, u64, String)> = settled
        .iter()
        .map(|m| {
            let v: serde_json::Value =
                serde_json::from_slice(rdkafka::message::Message::payload(m).unwrap_or_default())
                    .expect("json");
            assert_eq!(v["endpoint_id"], "crm");
            assert_eq!(v["tenant"], "acme");
            (
                v["kind"].as_str().unwrap_or_default().to_string(),
                v["version"].as_u64().unwrap_or_default(),
                v["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, u64, String)> = [
        ("endpoint.created", 1, "created"),
        ("endpoint.updated", 2, "definition changed"),
        ("endpoint.disabled", 3, "manual"),
        ("endpoint.enabled", 4, "manual"),
        ("endpoint.updated", 5, "secret rotated"),
        ("endpoint.deleted", 5, "deleted"),
    ]
    .iter()
    .map(|(k, v, r)| (k.to_string(), *v, r.to_string()))
    .collect();
    assert_eq!(seen, expected);
}

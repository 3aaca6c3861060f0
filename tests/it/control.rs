//! The control plane against the real broker: the live endpoint registry (writes visible on a
//! second process within a bound, optimistic concurrency across processes, file-managed
//! endpoints seeded and protected, secrets sealed on the topic, secret rotation), the delivery
//! log (batched writer, `trace`), per-endpoint health and auto-disable, and the CLI.

use std::time::{Duration, Instant};

use hookline_common::config::{Config, EndpointConfig};
use hookline_common::delivery::now_ms;
use hookline_control::{EndpointUpdate, Keyring, Registry, WriteError};

use crate::harness::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn keyring(key: &str) -> Keyring {
    Keyring::from_base64(Some(key), &[]).expect("key")
}

fn def(id: &str, url: &str) -> EndpointConfig {
    EndpointConfig {
        id: id.into(),
        url: url.into(),
        secrets: vec![SECRET.into()],
        tenant: Some("acme".into()),
        event_types: vec!["order.*".into()],
        enabled: true,
        timeout: None,
        max_concurrency: None,
    }
}

async fn registry(config: &Config, key: &str, seed: bool) -> Registry {
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
async fn seeding_follows_the_file_and_a_missing_key_disables_rather_than_sends_unsigned() {
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

    // A process without the key reads the set but never sends unsigned.
    let blind = Registry::start(
        &changed,
        Keyring::empty(),
        &prometheus::Registry::new(),
        false,
    )
    .await
    .expect("starts without a key");
    let f1 = blind.get("f1").expect("visible");
    assert!(
        f1.problem
            .as_deref()
            .is_some_and(|p| p.contains("HOOKLINE_SECRETS_KEY")),
        "{:?}",
        f1.problem
    );
    assert!(!f1.config_at(now_ms()).enabled);
    let no_key = blind.create(def("x", "https://x.example/")).await;
    assert!(matches!(no_key, Err(WriteError::Crypto(_))), "{no_key:?}");
}

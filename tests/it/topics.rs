//! `topics apply`: creates the plan with the configured partitions and retention, a second apply
//! changes nothing, and drift on an existing topic is reported rather than ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};

use hookline_common::contract::topics::plan;
use hookline_common::kafka::apply_topics;

use crate::harness::*;

fn describe(topic: &str) -> (usize, BTreeMap<String, String>) {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("consumer");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions = md.topics()[0].partitions().len();
    let rt = tokio::runtime::Handle::current();
    let configs = tokio::task::block_in_place(|| {
        rt.block_on(async {
            let admin = admin();
            let res = admin
                .describe_configs([&ResourceSpecifier::Topic(topic)], &admin_opts())
                .await
                .expect("describe");
            let r = res.into_iter().next().expect("one").expect("ok");
            r.entries
                .into_iter()
                .filter_map(|e| e.value.map(|v| (e.name, v)))
                .collect::<BTreeMap<_, _>>()
        })
    });
    (partitions, configs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_plan_and_second_apply_changes_nothing() {
    require_kafka();
    let prefix = unique_prefix("topics");
    let config = test_config(&prefix, "[retry]\nschedule = [\"0s\", \"2s\", \"5s\"]\n");
    let first = apply_topics(&config, Duration::from_secs(30))
        .await
        .expect("first apply");
    let expected: Vec<String> = plan(&config).into_iter().map(|t| t.name).collect();
    let mut created = first.created.clone();
    created.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(created, want, "first apply creates every planned topic");
    assert!(first.drift.is_empty());

    for spec in plan(&config) {
        let (partitions, configs) = describe(&spec.name);
        assert_eq!(
            partitions, spec.partitions as usize,
            "{} partitions",
            spec.name
        );
        assert_eq!(
            configs.get("retention.ms"),
            spec.configs.get("retention.ms"),
            "{} retention",
            spec.name
        );
    }
    let (_, dlq) = describe(&format!("{prefix}.dlq"));
    assert_eq!(dlq["retention.ms"], "-1", "dlq kept forever");
    let (_, invalid) = describe(&format!("{prefix}.invalid"));
    assert_eq!(invalid["retention.ms"], "-1", "invalid kept forever");
    let (_, state) = describe(&format!("{prefix}.dedupe-state"));
    let state_ms: u64 = state["retention.ms"].parse().expect("number");
    assert!(
        state_ms >= 86_400_000 + 3_600_000,
        "state retention ≥ window + margin"
    );

    let second = apply_topics(&config, Duration::from_secs(30))
        .await
        .expect("second apply");
    assert!(
        second.created.is_empty(),
        "second apply created {:?}",
        second.created
    );
    assert!(
        second.drift.is_empty(),
        "second apply drift {:?}",
        second.drift
    );
    assert_eq!(second.unchanged.len(), expected.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_on_existing_topic_is_reported() {
    require_kafka();
    let prefix = unique_prefix("drift");
    let config = test_config(&prefix, "");
    // Someone created the dispatch topic by hand with other settings.
    let name = format!("{prefix}.dispatch");
    let t = NewTopic::new(&name, 1, TopicReplication::Fixed(1)).set("retention.ms", "60000");
    admin()
        .create_topics([&t], &admin_opts())
        .await
        .expect("create")
        .into_iter()
        .for_each(|r| {
            r.expect("created");
        });
    let report = apply_topics(&config, Duration::from_secs(30))
        .await
        .expect("apply");
    let drift: Vec<String> = report.drift.iter().map(|d| d.to_string()).collect();
    assert!(
        drift
            .iter()
            .any(|d| d.contains(&name) && d.contains("partitions is 1 (expected 3)")),
        "{drift:?}"
    );
    assert!(
        drift.iter().any(|d| d.contains("retention.ms is 60000")),
        "{drift:?}"
    );
    assert!(!report.created.contains(&name));
    // And the CLI exits 3 on drift.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["topics", "apply"])
        .env("HOOKLINE_CONFIG", "config/hookline.example.toml")
        .env("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", bootstrap())
        .env("HOOKLINE_TOPICS__PREFIX", &prefix)
        .env("HOOKLINE_TOPICS__PARTITIONS", "3")
        .output()
        .expect("run hookline");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "stdout: {stdout}");
    assert!(stdout.contains("DRIFT"), "{stdout}");
}

#[test]
fn config_check_names_the_bad_field() {
    let dir = std::env::temp_dir().join(unique_prefix("cfg"));
    std::fs::create_dir_all(&dir).expect("tmp");
    let cases = [
        ("[kafka]\nbootstrap_servers = \"x:1\"\n[topics]\npartitions = -1\n", "topics.partitions"),
        ("[kafka]\nbootstrap_servers = \"x:1\"\nbogus = 1\n", "bogus"),
        (
            "[kafka]\nbootstrap_servers = \"x:1\"\n[[endpoints]]\nid = \"a\"\nurl = \"not a url\"\n",
            "endpoints[0].url",
        ),
        ("[kafka]\nbootstrap_servers = \"x:1\"\n[http]\ntimeout = \"soon\"\n", "http.timeout"),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let f = dir.join(format!("c{i}.toml"));
        std::fs::write(&f, text).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
            .args(["config", "check"])
            .arg(&f)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(
            stderr.contains(field),
            "{text}: expected `{field}` in: {stderr}"
        );
    }
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["config", "check", "config/hookline.example.toml"])
        .output()
        .expect("run");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

//! The demo commands through the real binary: `hookline receiver` (signature, tolerance, dedupe,
//! `--fail-every`) over HTTP, and `hookline demo produce` against the real broker.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::message::Message;

use hookline_common::contract::secret::decode_secret;
use hookline_delivery::signing;

use crate::harness::{
    apply_topics, read_until, require_kafka, test_config, unique_prefix, write_config,
};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A `hookline …` child with no inherited `HOOKLINE_*` variables.
fn hookline() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HOOKLINE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOOKLINE_SECRETS_KEY", crate::harness::secrets_key());
    cmd
}

/// A running `hookline receiver`, killed on drop.
struct ReceiverProc {
    child: Child,
    url: String,
}

impl ReceiverProc {
    fn start(extra: &[&str]) -> ReceiverProc {
        let mut child = hookline()
            .args(["receiver", "--listen", "127.0.0.1:0", "--secret", SECRET])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn hookline receiver");
        let stdout = child.stdout.take().expect("receiver stdout");
        let mut first = String::new();
        BufReader::new(stdout)
            .read_line(&mut first)
            .expect("read the bound address");
        let addr = first.trim();
        assert!(!addr.is_empty(), "the receiver printed no address");
        ReceiverProc {
            child,
            url: format!("http://{addr}/webhooks"),
        }
    }
}

impl Drop for ReceiverProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// POSTs `body` as `id`, signed with `SECRET` unless `signature` is given; returns status and
/// the JSON `status` field.
async fn post(
    url: &str,
    id: &str,
    timestamp: i64,
    body: &str,
    signature: Option<&str>,
) -> (u16, String) {
    let key = decode_secret(SECRET).expect("secret");
    let signed = signing::sign(&[key], id, timestamp, body.as_bytes());
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature.unwrap_or(&signed))
        .header("webhook-attempt", "1")
        .body(body.to_string())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("post to the receiver");
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    (status, json["status"].as_str().unwrap_or("").to_string())
}

#[tokio::test]
async fn receiver_verifies_signatures_and_dedupes_by_webhook_id() {
    let r = ReceiverProc::start(&[]);
    let body = r#"{"id":"evt_1","type":"order.paid","data":{}}"#;
    let ok = (200, "ok".to_string());
    let dup = (200, "duplicate".to_string());

    assert_eq!(post(&r.url, "evt_1", now(), body, None).await, ok);
    // Same id, new timestamp and bytes (a redelivery): answered 200, not processed again.
    assert_eq!(
        post(&r.url, "evt_1", now(), r#"{"id":"evt_1","x":1}"#, None).await,
        dup
    );
    let bad = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    assert_eq!(post(&r.url, "evt_2", now(), body, Some(bad)).await.0, 401);
    // Correctly signed, but 10 minutes old (and 10 minutes ahead).
    assert_eq!(post(&r.url, "evt_3", now() - 600, body, None).await.0, 401);
    assert_eq!(post(&r.url, "evt_3", now() + 600, body, None).await.0, 401);
    // The rejected ids were not remembered.
    assert_eq!(post(&r.url, "evt_2", now(), body, None).await, ok);
    assert_eq!(post(&r.url, "evt_3", now(), body, None).await, ok);
    // Missing headers: 400.
    let status = reqwest::Client::new()
        .post(&r.url)
        .body(body)
        .send()
        .await
        .expect("post")
        .status()
        .as_u16();
    assert_eq!(status, 400);
}

#[tokio::test]
async fn receiver_fail_every_answers_503_then_the_retry_succeeds() {
    let r = ReceiverProc::start(&["--fail-every", "2"]);
    let body = r#"{"id":"x","type":"message.created"}"#;
    assert_eq!(
        post(&r.url, "evt_a", now(), body, None).await,
        (200, "ok".into())
    );
    let (status, _) = post(&r.url, "evt_b", now(), body, None).await;
    assert_eq!(status, 503, "every 2nd fresh request fails on purpose");
    // The failed id was not remembered: its retry is fresh and succeeds.
    assert_eq!(
        post(&r.url, "evt_b", now(), body, None).await,
        (200, "ok".into())
    );
    assert_eq!(
        post(&r.url, "evt_b", now(), body, None).await,
        (200, "duplicate".into())
    );
    // A body over 1 MiB: 413.
    let big = "x".repeat((1 << 20) + 1);
    assert_eq!(post(&r.url, "evt_c", now(), &big, None).await.0, 413);
}

#[tokio::test]
async fn demo_produce_sends_count_distinct_ids_plus_resent_duplicates() {
    require_kafka();
    let prefix = unique_prefix("demo-produce");
    apply_topics(&test_config(&prefix, "")).await;
    let path = write_config(&prefix, "");
    let out = hookline()
        .arg("--config")
        .arg(&path)
        .args([
            "demo",
            "produce",
            "--count",
            "10",
            "--duplicate-rate",
            "0.5",
            "--rate",
            "200",
        ])
        .output()
        .expect("run hookline demo produce");
    assert!(
        out.status.success(),
        "demo produce failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let topic = format!("{prefix}.events");
    let records = tokio::task::spawn_blocking(move || {
        // Read a little past 10 so re-sent duplicates are included.
        let records = read_until(&topic, Duration::from_secs(20), |r| r.len() >= 10);
        let more = read_until(&topic, Duration::from_secs(3), |_| false);
        if more.len() > records.len() {
            more
        } else {
            records
        }
    })
    .await
    .expect("reader");
    assert!(records.len() >= 10, "only {} records", records.len());
    let mut ids = HashSet::new();
    for m in &records {
        let value: serde_json::Value =
            serde_json::from_slice(m.payload().expect("value")).expect("json value");
        assert_eq!(value["tenant"], "demo");
        assert!(value["type"].is_string());
        ids.insert(value["id"].as_str().expect("id").to_string());
    }
    assert_eq!(ids.len(), 10, "ids: {ids:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("sent {} records", records.len())),
        "stdout: {stdout}"
    );
}

/// `make run`'s demo: with `--watch` the producer shows the pipeline's progress (read from its
/// /metrics) until every event is delivered or dead, then a summary with the dead-letter commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_produce_watch_waits_for_deliveries_and_dead_letters_then_prints_the_commands() {
    require_kafka();
    let prefix = unique_prefix("demo-watch");
    let r = ReceiverProc::start(&["--fail-every", "3"]);
    let schedule = "[retry]\nschedule = [\"0s\", \"1s\", \"2s\"]\n";
    apply_topics(&test_config(&prefix, schedule)).await;
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let config = dir.join("hookline.toml");
    std::fs::write(
        &config,
        format!(
            "[kafka]\nbootstrap_servers = \"{bs}\"\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
             [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\
             [log]\nformat = \"json\"\n{schedule}\
             [[endpoints]]\nid = \"demo\"\nurl = \"{url}\"\nsecrets = [\"{SECRET}\"]\n\
             [[endpoints]]\nid = \"always-down\"\nurl = \"http://127.0.0.1:9/webhooks\"\nevent_types = [\"order.*\"]\n",
            bs = crate::harness::bootstrap(),
            url = r.url,
        ),
    )
    .expect("write config");
    let log = dir.join("pipeline.log");
    let mut pipeline = hookline()
        .arg("--config")
        .arg(&config)
        .args(["run", "all"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start the pipeline");
    let start = std::time::Instant::now();
    let addr = loop {
        if let Some(addr) = crate::harness::ops_addr(&log) {
            break addr;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no ops address");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let out = hookline()
        .arg("--config")
        .arg(&config)
        .args(["demo", "produce", "--count", "6", "--duplicate-rate", "0.5"])
        .args(["--rate", "50", "--watch", "--watch-timeout", "120"])
        .args(["--metrics-url", &format!("http://{addr}/metrics")])
        .output()
        .expect("run demo produce --watch");
    let _ = pipeline.kill();
    let _ = pipeline.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo produce --watch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("demo finished: every event is delivered or dead"),
        "{stdout}"
    );
    // Events 1 and 4 of 6 are order.paid: the always-down endpoint makes exactly 2 dead letters.
    assert!(stdout.contains("dead          2 deliveries"), "{stdout}");
    assert!(stdout.contains("produced      6 events"), "{stdout}");
    for command in ["dead list", "dead show", "replay --all --dry-run"] {
        assert!(stdout.contains(command), "no `{command}` in {stdout}");
    }
    // The summary's numbers are real: the receiver got all 6 events.
    let delivered: u64 = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("delivered"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(delivered >= 6, "{stdout}");
}

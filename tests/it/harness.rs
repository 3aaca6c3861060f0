//! Test harness: a real Kafka broker (never mocked), a unique topic prefix per test, and helpers
//! that wait by polling with deadlines.
//!
//! The broker address comes from `HOOKLINE_TEST_KAFKA` (default `127.0.0.1:9092`). A missing
//! broker fails the test loudly: start one with `deploy/local/kafka start` (`make test` does).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::TopicPartitionList;

use hookline_common::config::Config;
use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown::{self, ShutdownTrigger};

pub fn bootstrap() -> String {
    std::env::var("HOOKLINE_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Fails the test unless a broker answers a metadata request.
pub fn require_kafka() {
    let bs = bootstrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .create()
        .expect("create probe consumer");
    if let Err(e) = consumer.fetch_metadata(None, Duration::from_secs(15)) {
        panic!(
            "Kafka is not reachable at {bs} ({e}). Integration tests need a real broker: \
             run `deploy/local/kafka start` or `make test`."
        );
    }
}

/// A unique prefix per test so tests run in parallel on one broker.
pub fn unique_prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("t-{name}-{:x}-{}", nanos & 0xffff_ffff, std::process::id())
}

/// A config for tests: 3 partitions, the given prefix, loopback allowed through the SSRF guard,
/// ops server on an ephemeral port; `extra` is appended TOML.
pub fn test_config(prefix: &str, extra: &str) -> Config {
    let text = format!(
        r#"
[kafka]
bootstrap_servers = "{bs}"
[topics]
prefix = "{prefix}"
partitions = 3
[server]
listen = "127.0.0.1:0"
[http]
allow_cidrs = ["127.0.0.0/8"]
{extra}
"#,
        bs = bootstrap()
    );
    Config::from_toml_with_env(&text, "test", Vec::new()).expect("test config must be valid")
}

/// Creates the topics of `config` (the same path `hookline topics apply` takes).
pub async fn apply_topics(config: &Config) {
    let report = hookline_common::kafka::apply_topics(config, Duration::from_secs(30))
        .await
        .expect("topics apply");
    assert!(
        report.drift.is_empty(),
        "unexpected drift: {:?}",
        report.drift
    );
}

pub fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client")
}

pub fn admin_opts() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))
}

pub fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .create()
        .expect("producer")
}

/// Produces one record and waits for the broker's acknowledgement.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, &str)],
) {
    let mut hs = OwnedHeaders::new();
    for (k, v) in headers {
        hs = hs.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(hs);
    if let Some(p) = partition {
        rec = rec.partition(p);
    }
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    producer
        .send(rec, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// A read_committed consumer assigned to every partition of `topic` from the beginning (`assign`:
/// it never joins a group), its prefetch bounded to 16 MiB (topics may hold multi-MB records).
pub fn reader_from_start(topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("reader-{}", unique_prefix("r")))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("queued.max.messages.kbytes", "16384")
        .create()
        .expect("reader");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("metadata");
    let mut tpl = TopicPartitionList::new();
    for t in md.topics() {
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning)
                .expect("tpl");
        }
    }
    consumer.assign(&tpl).expect("assign");
    consumer
}

/// Reads `topic` from the beginning (read_committed) until `done(&records)` or the deadline.
/// Returns what was read; the caller asserts on it.
pub fn read_until(
    topic: &str,
    deadline: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool,
) -> Vec<OwnedMessage> {
    let consumer = reader_from_start(topic);
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < deadline {
        if done(&out) {
            return out;
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            out.push(m.detach());
        }
    }
    out
}

/// Reads `topic` for `quiet` after the last record arrived (to assert that nothing more comes).
#[allow(dead_code)]
pub fn read_all_quiet(
    topic: &str,
    expected_at_least: usize,
    deadline: Duration,
    quiet: Duration,
) -> Vec<OwnedMessage> {
    let mut out = read_until(topic, deadline, |r| r.len() >= expected_at_least);
    let more = read_until(topic, quiet, |_| false);
    if more.len() > out.len() {
        out = more;
    }
    out
}

pub fn header<'a>(m: &'a OwnedMessage, key: &str) -> Option<&'a str> {
    m.headers()?
        .iter()
        .find(|h| h.key == key)
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

pub fn headers_map(m: &OwnedMessage) -> HashMap<String, String> {
    m.headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A stage running in this test process; stopped (gracefully) on drop or by `stop`.
pub struct Running {
    pub trigger: ShutdownTrigger,
    pub handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub registry: prometheus::Registry,
}

impl Running {
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.trigger.trigger();
        match self.handle.take() {
            Some(h) => tokio::time::timeout(Duration::from_secs(60), h)
                .await
                .expect("stage did not stop within 60s")
                .expect("stage panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.trigger.trigger();
    }
}

/// Starts a stage's `run(config, registry, readiness, shutdown)` in-process.
pub fn start_stage<F, Fut>(config: &Config, run: F) -> Running
where
    F: FnOnce(Arc<Config>, prometheus::Registry, Readiness, shutdown::Shutdown) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (trigger, shutdown) = shutdown::channel();
    let registry = prometheus::Registry::new();
    let handle = tokio::spawn(run(
        Arc::new(config.clone()),
        registry.clone(),
        Readiness::default(),
        shutdown,
    ));
    Running {
        trigger,
        handle: Some(handle),
        registry,
    }
}

/// Starts the deduper stages in-process.
pub fn start_deduper(config: &Config) -> Running {
    start_stage(config, hookline_deduper::run)
}

/// Value of a counter (summed over labels matching `label`) in a registry.
pub fn counter(registry: &prometheus::Registry, name: &str, label: Option<(&str, &str)>) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| match label {
            None => true,
            Some((k, v)) => m
                .get_label()
                .iter()
                .any(|l| l.name() == k && l.value() == v),
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// Starts the dispatcher stage in-process.
#[allow(dead_code)]
pub fn start_dispatcher(config: &Config) -> Running {
    start_stage(config, hookline_dispatcher::run)
}

/// Writes a config file for a `hookline` child process (3 partitions, ephemeral ops port) in a
/// temp dir named after the prefix; `kafka_extra` is appended to the `[kafka]` section.
pub fn write_config(prefix: &str, kafka_extra: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("hookline.toml");
    std::fs::write(
        &path,
        format!(
            "[kafka]\nbootstrap_servers = \"{}\"\n{kafka_extra}\n[topics]\nprefix = \"{prefix}\"\npartitions = 3\n\
             [server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[log]\nlevel = \"info\"\n",
            bootstrap()
        ),
    )
    .expect("write config");
    path
}

/// The ops server address a `hookline run …` child logged (`[log] format = "json"`) to `log`.
pub fn ops_addr(log: &std::path::Path) -> Option<String> {
    logged_addr(log, "ops server listening")
}

/// The `addr` of the first JSON log line whose message starts with `message`.
pub fn logged_addr(log: &std::path::Path, message: &str) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        if !v["message"].as_str()?.starts_with(message) {
            return None;
        }
        v["addr"].as_str().map(str::to_string)
    })
}

/// One endpoint secrets key (`HOOKLINE_SECRETS_KEY`) for every process of the test binary: a
/// second process must open what the first sealed.
pub fn secrets_key() -> String {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(hookline_control::Keyring::generate_key)
        .clone()
}

/// The `hookline` binary the tests run: this build's, or the one `HOOKLINE_IT_BINARY` names
/// (e.g. `target/release/hookline`, to read a test's printed figures at release speed).
pub(crate) fn binary() -> std::path::PathBuf {
    std::env::var_os("HOOKLINE_IT_BINARY")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_hookline").into())
}

/// A `hookline` child with no inherited `HOOKLINE_*` or TLS trust variables, killed on drop.
pub(crate) struct Hookline {
    pub(crate) child: Child,
}

impl Hookline {
    pub(crate) fn start(
        config: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Hookline {
        let mut cmd = Command::new(binary());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("HOOKLINE_") || k == "SSL_CERT_FILE" || k == "SSL_CERT_DIR" {
                cmd.env_remove(k);
            }
        }
        let stderr = std::fs::File::create(log).expect("log file");
        let child = cmd
            .arg("--config")
            .arg(config)
            .args(args)
            .env("HOOKLINE_SECRETS_KEY", secrets_key())
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start hookline");
        Hookline { child }
    }
}

impl Drop for Hookline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

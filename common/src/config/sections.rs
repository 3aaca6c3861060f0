//! The sections of the configuration, one struct each. Each default is written once, in the
//! section's `Default` (fields missing from the file take it: `#[serde(default)]` on the
//! section), and each section validates its own fields, naming them.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{tier_name, ConfigError};

/// Largest event Kafka accepts on our topics by default (`max.message.bytes` we set is above it).
pub const MAX_PAYLOAD_LIMIT: usize = 4 * 1024 * 1024;
/// Upper bound of `input.max_key_bytes`.
pub const MAX_KEY_LIMIT: usize = 1024 * 1024;

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port…]`.
    pub bootstrap_servers: String,
    /// Passed verbatim to every librdkafka client (TLS, SASL, tuning). Values are never logged.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// Prefix of every consumer group id: `<group_prefix>.<stage>`. Defaults to the topic prefix.
    #[serde(default)]
    pub group_prefix: Option<String>,
    /// Optional static membership id (`group.instance.id`), e.g. the pod name.
    #[serde(default)]
    pub instance_id: Option<String>,
}

/// `options` by key only: they hold `sasl.password`, `ssl.key.password`, `ssl.key.pem`…
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field(
                "options",
                &format_args!(
                    "[{} redacted]",
                    self.options.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
            .field("group_prefix", &self.group_prefix)
            .field("instance_id", &self.instance_id)
            .finish()
    }
}

impl KafkaConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::field(
                "kafka.bootstrap_servers",
                "must not be empty",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicsConfig {
    pub prefix: String,
    /// Partitions of every pipeline topic (events, dedupe, dedupe-state, dispatch, tiers, dlq).
    pub partitions: i32,
    pub replication_factor: i32,
    /// `min.insync.replicas` of every topic: how many replicas must have an acknowledged record
    /// (producers use `acks=all`). Default: 2 when `replication_factor` >= 3, else 1; see
    /// [`TopicsConfig::min_insync_replicas`].
    pub min_insync_replicas: Option<i32>,
    /// Retention of the flow topics (events, dedupe, dispatch).
    #[serde(with = "humantime_serde")]
    pub flow_retention: Duration,
    /// Extra retention of each retry tier beyond its delay, to survive an outage.
    #[serde(with = "humantime_serde")]
    pub tier_retention_margin: Duration,
    /// Extra retention of the dedupe changelog beyond the dedupe window.
    #[serde(with = "humantime_serde")]
    pub dedupe_state_retention_margin: Duration,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            prefix: "webhooks".into(),
            partitions: 6,
            replication_factor: 1,
            min_insync_replicas: None,
            flow_retention: Duration::from_secs(7 * 86_400),
            tier_retention_margin: Duration::from_secs(7 * 86_400),
            dedupe_state_retention_margin: Duration::from_secs(86_400),
        }
    }
}

impl TopicsConfig {
    /// The `min.insync.replicas` the topic plan sets: the configured value, else 2 when the
    /// replication factor is 3 or more (an acknowledged record survives the loss of one disk
    /// while one broker may be down for maintenance), else 1 (2 of 2 would stop every write
    /// whenever one broker restarts).
    pub fn min_insync_replicas(&self) -> i32 {
        self.min_insync_replicas
            .unwrap_or(if self.replication_factor >= 3 { 2 } else { 1 })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let prefix = &self.prefix;
        if prefix.is_empty()
            || prefix.len() > 200
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(ConfigError::field(
                "topics.prefix",
                "must be 1..=200 characters of [a-zA-Z0-9._-]",
            ));
        }
        if !(1..=10_000).contains(&self.partitions) {
            return Err(ConfigError::field(
                "topics.partitions",
                "must be between 1 and 10000",
            ));
        }
        if !(1..=32).contains(&self.replication_factor) {
            return Err(ConfigError::field(
                "topics.replication_factor",
                "must be between 1 and 32",
            ));
        }
        if let Some(isr) = self.min_insync_replicas {
            if !(1..=self.replication_factor).contains(&isr) {
                return Err(ConfigError::field(
                    "topics.min_insync_replicas",
                    format!(
                        "must be between 1 and topics.replication_factor ({}); more would refuse every write",
                        self.replication_factor
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InputConfig {
    /// Largest accepted event value in bytes; larger ones go to `<p>.invalid`.
    pub max_payload_bytes: usize,
    /// Largest accepted record key in bytes; a larger one is quarantined as `record_too_large`
    /// (the key travels on every hop; hookline partitions by its own hash, not by the key).
    pub max_key_bytes: usize,
}

impl Default for InputConfig {
    fn default() -> Self {
        InputConfig {
            max_payload_bytes: 512 * 1024,
            max_key_bytes: 16 * 1024,
        }
    }
}

impl InputConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_LIMIT {
            return Err(ConfigError::field(
                "input.max_payload_bytes",
                format!("must be between 1 and {MAX_PAYLOAD_LIMIT}"),
            ));
        }
        if self.max_key_bytes == 0 || self.max_key_bytes > MAX_KEY_LIMIT {
            return Err(ConfigError::field(
                "input.max_key_bytes",
                format!("must be between 1 and {MAX_KEY_LIMIT}"),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DedupeConfig {
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Per event type dedupe keys; the first rule whose glob matches `type` wins, else `/id`.
    pub keys: Vec<DedupeKeyRule>,
    /// How long stage B collects records before committing one transaction: the longest a
    /// record waits in stage B before the dispatcher can read it. 25 ms: p99 end to end 103–108 ms
    /// at 7,500 events/s vs 129–140 ms at 50 ms, for ~7% more machine CPU (the broker's share of
    /// 40 transactions/s instead of 20; docs/performance.md, run 12).
    #[serde(with = "humantime_serde")]
    pub batch_interval: Duration,
    pub batch_max_records: usize,
    /// Stage B reads `<p>.events` itself (one hop fewer): an event already on the partition its
    /// dedupe key hashes to is deduped and written to `<p>.dispatch` directly; any other is
    /// forwarded to `<p>.dedupe` in the same transaction. Stage A does not run. Needs
    /// `<p>.events` to have as many partitions as `<p>.dedupe`. `false`: stage A validates and
    /// re-partitions every event onto `<p>.dedupe` first (docs/delivery.md).
    pub direct: bool,
}

impl Default for DedupeConfig {
    fn default() -> Self {
        DedupeConfig {
            window: Duration::from_secs(86_400),
            keys: Vec::new(),
            batch_interval: Duration::from_millis(25),
            batch_max_records: 5_000,
            direct: true,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupeKeyRule {
    /// Glob on the event type (`*` matches any run of characters), e.g. `call.*`.
    #[serde(rename = "type")]
    pub type_glob: String,
    /// JSON pointers (RFC 6901) whose values are joined into the key, e.g. `/data/callId`.
    pub pointers: Vec<String>,
}

impl DedupeConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.window < Duration::from_secs(1) {
            return Err(ConfigError::field("dedupe.window", "must be at least 1s"));
        }
        if self.batch_interval.is_zero() || self.batch_interval > Duration::from_secs(10) {
            return Err(ConfigError::field(
                "dedupe.batch_interval",
                "must be between 1ms and 10s (it must stay far below the transaction timeout)",
            ));
        }
        if self.batch_max_records == 0 {
            return Err(ConfigError::field(
                "dedupe.batch_max_records",
                "must be at least 1",
            ));
        }
        for (i, rule) in self.keys.iter().enumerate() {
            if rule.type_glob.is_empty() {
                return Err(ConfigError::field(
                    format!("dedupe.keys[{i}].type"),
                    "must not be empty",
                ));
            }
            if rule.pointers.is_empty() {
                return Err(ConfigError::field(
                    format!("dedupe.keys[{i}].pointers"),
                    "must list at least one JSON pointer",
                ));
            }
            for (j, p) in rule.pointers.iter().enumerate() {
                if !p.starts_with('/') {
                    return Err(ConfigError::field(
                        format!("dedupe.keys[{i}].pointers[{j}]"),
                        format!("`{p}` is not a JSON pointer (must start with `/`)"),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempt times as offsets from the first attempt; the first must be 0.
    #[serde(with = "humantime_vec")]
    pub schedule: Vec<Duration>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            schedule: default_schedule(),
        }
    }
}

/// The spec's table: +0, +1m, +5m, +30m, +2h, +6h, +24h from the first attempt.
pub fn default_schedule() -> Vec<Duration> {
    [0, 60, 300, 1_800, 7_200, 21_600, 86_400]
        .into_iter()
        .map(Duration::from_secs)
        .collect()
}

impl RetryConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.schedule;
        if s.is_empty() {
            return Err(ConfigError::field(
                "retry.schedule",
                "must list at least the first attempt (\"0s\")",
            ));
        }
        if !s[0].is_zero() {
            return Err(ConfigError::field(
                "retry.schedule[0]",
                "the first attempt is immediate: must be \"0s\"",
            ));
        }
        for i in 1..s.len() {
            if s[i] <= s[i - 1] {
                return Err(ConfigError::field(
                    format!("retry.schedule[{i}]"),
                    "offsets from the first attempt must strictly increase",
                ));
            }
            if !s[i].subsec_nanos().is_multiple_of(1_000_000) {
                return Err(ConfigError::field(
                    format!("retry.schedule[{i}]"),
                    "must be a whole number of milliseconds",
                ));
            }
        }
        let names: HashSet<String> = s[1..].iter().map(|d| tier_name(*d)).collect();
        if names.len() != s.len() - 1 {
            return Err(ConfigError::field(
                "retry.schedule",
                "two offsets give the same tier name",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Timeout of connect + request + the response status line and headers; the body is then
    /// read for at most min(1 s, what is left of it) and never changes the result.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Bytes of the response body kept for diagnostics; the rest is discarded unread.
    pub max_response_body_bytes: usize,
    /// CIDRs exempt from the SSRF guard (e.g. `127.0.0.0/8` for local development).
    pub allow_cidrs: Vec<String>,
    pub user_agent: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout: Duration::from_secs(10),
            max_response_body_bytes: 4096,
            allow_cidrs: Vec::new(),
            user_agent: concat!("hookline/", env!("CARGO_PKG_VERSION")).into(),
        }
    }
}

impl HttpConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(300) {
            return Err(ConfigError::field(
                "http.timeout",
                "must be between 1ms and 5m",
            ));
        }
        if self.max_response_body_bytes > 1024 * 1024 {
            return Err(ConfigError::field(
                "http.max_response_body_bytes",
                "must be at most 1 MiB",
            ));
        }
        for (i, cidr) in self.allow_cidrs.iter().enumerate() {
            if cidr.parse::<ipnet::IpNet>().is_err() {
                return Err(ConfigError::field(
                    format!("http.allow_cidrs[{i}]"),
                    format!("`{cidr}` is not a CIDR like 127.0.0.0/8"),
                ));
            }
        }
        Ok(())
    }
}

/// How a consuming stage that makes attempts runs: `[dispatcher]`, and the retry tiers'
/// resolved `[tiers]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StageLimits {
    /// Records in flight per partition before the partition takes no more.
    pub max_in_flight_per_partition: usize,
    /// Concurrent requests per endpoint unless the endpoint sets its own.
    pub endpoint_concurrency: usize,
    /// How long a graceful shutdown waits for in-flight work.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

/// `[dispatcher]`.
pub type DispatcherConfig = StageLimits;

impl Default for StageLimits {
    fn default() -> Self {
        StageLimits {
            max_in_flight_per_partition: 256,
            endpoint_concurrency: 64,
            shutdown_grace: Duration::from_secs(20),
        }
    }
}

impl StageLimits {
    fn validate(&self, section: &str) -> Result<(), ConfigError> {
        if self.max_in_flight_per_partition == 0 {
            return Err(ConfigError::field(
                format!("{section}.max_in_flight_per_partition"),
                "must be at least 1",
            ));
        }
        if self.endpoint_concurrency == 0 {
            return Err(ConfigError::field(
                format!("{section}.endpoint_concurrency"),
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// `[tiers]` as written: every key optional; an unset one takes the `[dispatcher]` value (the
/// tiers read those before they had a section of their own), resolved at load into
/// [`Config::tiers`](super::Config::tiers).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct TiersSection {
    /// Due records attempted at once per tier partition.
    max_in_flight_per_partition: Option<usize>,
    /// Concurrent requests per endpoint of the tiers' engine (and replay's).
    endpoint_concurrency: Option<usize>,
    /// How long a graceful stop waits for in-flight attempts.
    #[serde(with = "humantime_serde")]
    shutdown_grace: Option<Duration>,
}

impl TiersSection {
    pub(super) fn resolve(&self, dispatcher: &DispatcherConfig) -> StageLimits {
        StageLimits {
            max_in_flight_per_partition: self
                .max_in_flight_per_partition
                .unwrap_or(dispatcher.max_in_flight_per_partition),
            endpoint_concurrency: self
                .endpoint_concurrency
                .unwrap_or(dispatcher.endpoint_concurrency),
            shutdown_grace: self.shutdown_grace.unwrap_or(dispatcher.shutdown_grace),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of `/metrics`, `/healthz`, `/readyz`.
    pub listen: SocketAddr,
    /// `/healthz` fails when a running stage's loop has not turned for this long (every loop
    /// turns at least once a second; a single Kafka call is bounded at 30 s).
    #[serde(with = "humantime_serde")]
    pub liveness_bound: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            liveness_bound: crate::runtime::ops::DEFAULT_LIVENESS_BOUND,
        }
    }
}

impl ServerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        // Every stage loop turns at least once a second: a shorter bound would flap.
        if self.liveness_bound < Duration::from_secs(5) {
            return Err(ConfigError::field(
                "server.liveness_bound",
                "must be at least 5s",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// `tracing` filter directive, e.g. `info,hookline_dispatcher=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Pretty,
            level: "info".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// Validates every section, each naming its own fields.
pub(super) fn validate(config: &super::Config) -> Result<(), ConfigError> {
    config.kafka.validate()?;
    config.server.validate()?;
    config.topics.validate()?;
    config.input.validate()?;
    config.dedupe.validate()?;
    config.retry.validate()?;
    config.http.validate()?;
    config.dispatcher.validate("dispatcher")?;
    config.tiers.validate("tiers")?;
    config.admin.validate()?;
    config.control.validate()?;
    config.traces.validate()?;
    super::endpoints::validate(&config.endpoints)
}

mod humantime_vec {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let raw = Vec::<String>::deserialize(d)?;
        raw.iter()
            .map(|s| {
                humantime::parse_duration(s)
                    .map_err(|e| serde::de::Error::custom(format!("`{s}` is not a duration: {e}")))
            })
            .collect()
    }
}

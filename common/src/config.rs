//! Configuration: one TOML file, overridden by `HOOKLINE_…` environment variables, validated once
//! at startup. Every error names the field (`endpoints[1].url`) and the reason.
//!
//! Environment overrides: `HOOKLINE_<SECTION>__<KEY>` sets `section.key` (double underscore
//! between levels, case-insensitive), e.g. `HOOKLINE_KAFKA__BOOTSTRAP_SERVERS=host:9092`,
//! `HOOKLINE_TOPICS__PARTITIONS=12`, `HOOKLINE_RETRY__SCHEDULE='["0s","2s","4s"]'`.
//! Under `kafka.options` single underscores become dots so librdkafka properties can be set:
//! `HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD=…` sets `sasl.password`.
//! Values are read as TOML when they parse as a TOML value (numbers, booleans, arrays), otherwise
//! as strings.
//!
//! Kubernetes injects "service link" variables for every Service of the pod's namespace; a
//! Service named `hookline` or `hookline-<svc>` yields `HOOKLINE_SERVICE_HOST`, `HOOKLINE_PORT`,
//! `HOOKLINE_<SVC>_PORT_9464_TCP_ADDR`, …. They share our prefix but are not overrides: they are
//! ignored and returned in [`Config::ignored_env`] so the process can name them in one log line.
//! Any other `HOOKLINE_…` variable without `__` is an error, naming the key it probably meant.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// A configuration problem, always naming the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: String, message: String },
    #[error("invalid config: field `{field}`: {reason}")]
    Field { field: String, reason: String },
}

impl ConfigError {
    pub(crate) fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Field {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The whole configuration of a hookline process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub topics: TopicsConfig,
    #[serde(default)]
    pub input: InputConfig,
    #[serde(default)]
    pub dedupe: DedupeConfig,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub http: HttpConfig,
    #[serde(default)]
    pub dispatcher: DispatcherConfig,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
    /// The admin process: API, `/v1/events`, dashboard (`common/src/admin_config.rs`).
    #[serde(default)]
    pub admin: crate::admin_config::AdminConfig,
    /// The control plane (`[control]`, see `control_config.rs`).
    #[serde(default)]
    pub control: crate::control_config::ControlConfig,
    /// Kubernetes service-link variables (`HOOKLINE_SERVICE_HOST`, …) that were ignored, sorted;
    /// not configuration: the binary names them in one log line at startup.
    #[serde(skip)]
    pub ignored_env: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsConfig {
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Partitions of every pipeline topic (events, dedupe, dedupe-state, dispatch, tiers, dlq).
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    #[serde(default = "default_replication")]
    pub replication_factor: i32,
    /// `min.insync.replicas` of every topic: how many replicas must have an acknowledged record
    /// (producers use `acks=all`). Default: 2 when `replication_factor` >= 3, else 1; see
    /// [`TopicsConfig::min_insync_replicas`].
    #[serde(default)]
    pub min_insync_replicas: Option<i32>,
    /// Retention of the flow topics (events, dedupe, dispatch).
    #[serde(default = "default_flow_retention", with = "humantime_serde")]
    pub flow_retention: Duration,
    /// Extra retention of each retry tier beyond its delay, to survive an outage.
    #[serde(default = "default_tier_margin", with = "humantime_serde")]
    pub tier_retention_margin: Duration,
    /// Extra retention of the dedupe changelog beyond the dedupe window.
    #[serde(default = "default_state_margin", with = "humantime_serde")]
    pub dedupe_state_retention_margin: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputConfig {
    /// Largest accepted event value in bytes; larger ones go to `<p>.invalid`.
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: usize,
    /// Largest accepted record key in bytes; a larger one is quarantined as `record_too_large`
    /// (the key travels on every hop; hookline partitions by its own hash, not by the key).
    #[serde(default = "default_max_key")]
    pub max_key_bytes: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupeConfig {
    #[serde(default = "default_window", with = "humantime_serde")]
    pub window: Duration,
    /// Per event type dedupe keys; the first rule whose glob matches `type` wins, else `/id`.
    #[serde(default)]
    pub keys: Vec<DedupeKeyRule>,
    /// How long stage B collects records before committing one transaction.
    #[serde(default = "default_batch_interval", with = "humantime_serde")]
    pub batch_interval: Duration,
    #[serde(default = "default_batch_max")]
    pub batch_max_records: usize,
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempt times as offsets from the first attempt; the first must be 0.
    #[serde(default = "default_schedule", with = "humantime_vec")]
    pub schedule: Vec<Duration>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Timeout of connect + request + the response status line and headers; the body is then
    /// read for at most min(1 s, what is left of it) and never changes the result.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Bytes of the response body kept for diagnostics; the rest is discarded unread.
    #[serde(default = "default_response_keep")]
    pub max_response_body_bytes: usize,
    /// CIDRs exempt from the SSRF guard (e.g. `127.0.0.0/8` for local development).
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    #[serde(default = "default_user_agent")]
    pub user_agent: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatcherConfig {
    /// Events in flight per partition before the partition is paused.
    #[serde(default = "default_in_flight")]
    pub max_in_flight_per_partition: usize,
    /// Concurrent requests per endpoint unless the endpoint sets its own.
    #[serde(default = "default_endpoint_concurrency")]
    pub endpoint_concurrency: usize,
    /// How long a graceful shutdown waits for in-flight deliveries.
    #[serde(default = "default_drain", with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of `/metrics`, `/healthz`, `/readyz`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// `/healthz` fails when a running stage's loop has not turned for this long (every loop
    /// turns at least once a second; a single Kafka call is bounded at 30 s).
    #[serde(default = "default_liveness_bound", with = "humantime_serde")]
    pub liveness_bound: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default)]
    pub format: LogFormat,
    /// `tracing` filter directive, e.g. `info,hookline_dispatcher=debug`.
    #[serde(default = "default_log_level")]
    pub level: String,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// One receiver of webhooks.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub id: String,
    pub url: String,
    /// `whsec_…` secrets; every one signs each request (several while rotating).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Only events of this tenant; `None` receives every tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Globs on the event type; empty means every type.
    #[serde(default)]
    pub event_types: Vec<String>,
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub max_concurrency: Option<usize>,
}

impl fmt::Debug for EndpointConfig {
    // Secrets never reach a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("id", &self.id)
            .field("url", &self.url)
            .field(
                "secrets",
                &format_args!("[{} redacted]", self.secrets.len()),
            )
            .field("tenant", &self.tenant)
            .field("event_types", &self.event_types)
            .field("enabled", &self.enabled)
            .field("timeout", &self.timeout)
            .field("max_concurrency", &self.max_concurrency)
            .finish()
    }
}

fn default_prefix() -> String {
    "webhooks".into()
}
const fn default_partitions() -> i32 {
    6
}
const fn default_replication() -> i32 {
    1
}
const fn default_flow_retention() -> Duration {
    Duration::from_secs(7 * 86_400)
}
const fn default_tier_margin() -> Duration {
    Duration::from_secs(7 * 86_400)
}
const fn default_state_margin() -> Duration {
    Duration::from_secs(86_400)
}
const fn default_max_payload() -> usize {
    512 * 1024
}
const fn default_max_key() -> usize {
    16 * 1024
}
const fn default_window() -> Duration {
    Duration::from_secs(86_400)
}
const fn default_batch_interval() -> Duration {
    Duration::from_millis(100)
}
const fn default_batch_max() -> usize {
    5_000
}
/// The spec's table: +0, +1m, +5m, +30m, +2h, +6h, +24h from the first attempt.
pub fn default_schedule() -> Vec<Duration> {
    [0, 60, 300, 1_800, 7_200, 21_600, 86_400]
        .into_iter()
        .map(Duration::from_secs)
        .collect()
}
const fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
const fn default_response_keep() -> usize {
    4096
}
fn default_user_agent() -> String {
    concat!("hookline/", env!("CARGO_PKG_VERSION")).into()
}
const fn default_in_flight() -> usize {
    256
}
const fn default_endpoint_concurrency() -> usize {
    64
}
const fn default_drain() -> Duration {
    Duration::from_secs(20)
}
const fn default_liveness_bound() -> Duration {
    crate::ops::DEFAULT_LIVENESS_BOUND
}
fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}
fn default_log_level() -> String {
    "info".into()
}
const fn default_true() -> bool {
    true
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
}

macro_rules! default_section {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {
        impl Default for $ty {
            fn default() -> Self {
                $ty { $($field: $value),* }
            }
        }
    };
}
default_section!(TopicsConfig {
    prefix: default_prefix(),
    partitions: default_partitions(),
    replication_factor: default_replication(),
    min_insync_replicas: None,
    flow_retention: default_flow_retention(),
    tier_retention_margin: default_tier_margin(),
    dedupe_state_retention_margin: default_state_margin(),
});
default_section!(InputConfig {
    max_payload_bytes: default_max_payload(),
    max_key_bytes: default_max_key()
});
default_section!(DedupeConfig {
    window: default_window(),
    keys: Vec::new(),
    batch_interval: default_batch_interval(),
    batch_max_records: default_batch_max(),
});
default_section!(RetryConfig {
    schedule: default_schedule()
});
default_section!(HttpConfig {
    timeout: default_timeout(),
    max_response_body_bytes: default_response_keep(),
    allow_cidrs: Vec::new(),
    user_agent: default_user_agent(),
});
default_section!(DispatcherConfig {
    max_in_flight_per_partition: default_in_flight(),
    endpoint_concurrency: default_endpoint_concurrency(),
    shutdown_grace: default_drain(),
});
default_section!(ServerConfig {
    listen: default_listen(),
    liveness_bound: default_liveness_bound(),
});
default_section!(LogConfig {
    format: LogFormat::Pretty,
    level: default_log_level(),
});

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

/// Largest event Kafka accepts on our topics by default (`max.message.bytes` we set is above it).
pub const MAX_PAYLOAD_LIMIT: usize = 4 * 1024 * 1024;
/// Upper bound of `input.max_key_bytes`.
pub const MAX_KEY_LIMIT: usize = 1024 * 1024;

impl Config {
    /// Reads `path`, applies `HOOKLINE_…` overrides from the process environment, validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_with_env(&text, &path.display().to_string(), std::env::vars())
    }

    /// Parses TOML text with the given environment overrides, then validates.
    pub fn from_toml_with_env(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut root: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: origin.to_string(),
            message: e.message().to_string(),
        })?;
        let ours: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("HOOKLINE_") && !is_reserved_env(k))
            .collect();
        let (mut service_links, mut overrides): (Vec<_>, Vec<_>) = ours
            .into_iter()
            .partition(|(k, _)| is_kubernetes_service_link(k));
        overrides.sort();
        for (key, value) in overrides {
            apply_env_override(&mut root, &key, &value)?;
        }
        service_links.sort();
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(root))
            .map_err(|e| {
                let field = e.path().to_string();
                ConfigError::field(
                    if field == "." { "(root)".into() } else { field },
                    e.into_inner().message().to_string(),
                )
            })?;
        config.validate()?;
        config.ignored_env = service_links.into_iter().map(|(k, _)| k).collect();
        Ok(config)
    }

    /// Cross-field checks that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::field(
                "kafka.bootstrap_servers",
                "must not be empty",
            ));
        }
        // Every stage loop turns at least once a second: a shorter bound would flap.
        if self.server.liveness_bound < Duration::from_secs(5) {
            return Err(ConfigError::field(
                "server.liveness_bound",
                "must be at least 5s",
            ));
        }
        let prefix = &self.topics.prefix;
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
        if !(1..=10_000).contains(&self.topics.partitions) {
            return Err(ConfigError::field(
                "topics.partitions",
                "must be between 1 and 10000",
            ));
        }
        if !(1..=32).contains(&self.topics.replication_factor) {
            return Err(ConfigError::field(
                "topics.replication_factor",
                "must be between 1 and 32",
            ));
        }
        if let Some(isr) = self.topics.min_insync_replicas {
            if !(1..=self.topics.replication_factor).contains(&isr) {
                return Err(ConfigError::field(
                    "topics.min_insync_replicas",
                    format!(
                        "must be between 1 and topics.replication_factor ({}); more would refuse every write",
                        self.topics.replication_factor
                    ),
                ));
            }
        }
        if self.input.max_payload_bytes == 0 || self.input.max_payload_bytes > MAX_PAYLOAD_LIMIT {
            return Err(ConfigError::field(
                "input.max_payload_bytes",
                format!("must be between 1 and {MAX_PAYLOAD_LIMIT}"),
            ));
        }
        if self.input.max_key_bytes == 0 || self.input.max_key_bytes > MAX_KEY_LIMIT {
            return Err(ConfigError::field(
                "input.max_key_bytes",
                format!("must be between 1 and {MAX_KEY_LIMIT}"),
            ));
        }
        if self.dedupe.window < Duration::from_secs(1) {
            return Err(ConfigError::field("dedupe.window", "must be at least 1s"));
        }
        if self.dedupe.batch_interval.is_zero()
            || self.dedupe.batch_interval > Duration::from_secs(10)
        {
            return Err(ConfigError::field(
                "dedupe.batch_interval",
                "must be between 1ms and 10s (it must stay far below the transaction timeout)",
            ));
        }
        if self.dedupe.batch_max_records == 0 {
            return Err(ConfigError::field(
                "dedupe.batch_max_records",
                "must be at least 1",
            ));
        }
        for (i, rule) in self.dedupe.keys.iter().enumerate() {
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
        self.validate_schedule()?;
        if self.http.timeout.is_zero() || self.http.timeout > Duration::from_secs(300) {
            return Err(ConfigError::field(
                "http.timeout",
                "must be between 1ms and 5m",
            ));
        }
        if self.http.max_response_body_bytes > 1024 * 1024 {
            return Err(ConfigError::field(
                "http.max_response_body_bytes",
                "must be at most 1 MiB",
            ));
        }
        for (i, cidr) in self.http.allow_cidrs.iter().enumerate() {
            if cidr.parse::<ipnet::IpNet>().is_err() {
                return Err(ConfigError::field(
                    format!("http.allow_cidrs[{i}]"),
                    format!("`{cidr}` is not a CIDR like 127.0.0.0/8"),
                ));
            }
        }
        if self.dispatcher.max_in_flight_per_partition == 0 {
            return Err(ConfigError::field(
                "dispatcher.max_in_flight_per_partition",
                "must be at least 1",
            ));
        }
        if self.dispatcher.endpoint_concurrency == 0 {
            return Err(ConfigError::field(
                "dispatcher.endpoint_concurrency",
                "must be at least 1",
            ));
        }
        self.admin.validate()?;
        self.control.validate()?;
        self.validate_endpoints()
    }

    fn validate_schedule(&self) -> Result<(), ConfigError> {
        let s = &self.retry.schedule;
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

    fn validate_endpoints(&self) -> Result<(), ConfigError> {
        let mut seen = HashSet::new();
        for (i, ep) in self.endpoints.iter().enumerate() {
            let at = |f: &str| format!("endpoints[{i}].{f}");
            if ep.id.is_empty()
                || ep.id.len() > 128
                || !ep
                    .id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
            {
                return Err(ConfigError::field(
                    at("id"),
                    "must be 1..=128 characters of [a-zA-Z0-9_.:-]",
                ));
            }
            if !seen.insert(ep.id.as_str()) {
                return Err(ConfigError::field(
                    at("id"),
                    format!("`{}` is used by two endpoints", ep.id),
                ));
            }
            match url::Url::parse(&ep.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
                    if !u.username().is_empty() || u.password().is_some() {
                        return Err(ConfigError::field(
                            at("url"),
                            "must not carry credentials (user:pass@)",
                        ));
                    }
                }
                Ok(_) => {
                    return Err(ConfigError::field(
                        at("url"),
                        "must be an http:// or https:// URL with a host",
                    ))
                }
                Err(e) => return Err(ConfigError::field(at("url"), format!("not a URL: {e}"))),
            }
            for (j, secret) in ep.secrets.iter().enumerate() {
                if let Err(reason) = crate::secret::decode_secret(secret) {
                    return Err(ConfigError::field(
                        format!("endpoints[{i}].secrets[{j}]"),
                        reason,
                    ));
                }
            }
            if let Some(t) = &ep.tenant {
                if t.is_empty() {
                    return Err(ConfigError::field(
                        at("tenant"),
                        "must not be empty (omit it to receive every tenant)",
                    ));
                }
            }
            for (j, g) in ep.event_types.iter().enumerate() {
                if g.is_empty() {
                    return Err(ConfigError::field(
                        format!("endpoints[{i}].event_types[{j}]"),
                        "must not be empty",
                    ));
                }
            }
            if let Some(t) = ep.timeout {
                if t.is_zero() || t > Duration::from_secs(300) {
                    return Err(ConfigError::field(
                        at("timeout"),
                        "must be between 1ms and 5m",
                    ));
                }
            }
            if ep.max_concurrency == Some(0) {
                return Err(ConfigError::field(
                    at("max_concurrency"),
                    "must be at least 1",
                ));
            }
        }
        Ok(())
    }

    /// The consumer group of one stage: `<group_prefix>.<stage>`.
    pub fn group_id(&self, stage: &str) -> String {
        let prefix = self
            .kafka
            .group_prefix
            .as_deref()
            .unwrap_or(&self.topics.prefix);
        format!("{prefix}.{stage}")
    }
}

/// Name of the tier whose attempts happen `offset` after the first attempt: `1m`, `2h`, `3s`, `500ms`.
pub fn tier_name(offset: Duration) -> String {
    let ms = offset.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = offset.as_secs();
    if s.is_multiple_of(86_400) && s / 86_400 > 1 {
        format!("{}d", s / 86_400)
    } else if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// `HOOKLINE_…` variables that are not config overrides: the config path, the demo switch of
/// `make run`, and the test and benchmark harnesses' settings.
fn is_reserved_env(key: &str) -> bool {
    key == "HOOKLINE_CONFIG"
        || key == "HOOKLINE_DEMO"
        || key.starts_with("HOOKLINE_TEST_")
        || key.starts_with("HOOKLINE_BENCH_")
        || crate::control_config::is_reserved_env(key)
}

/// Whether `key` is a variable Kubernetes injects for a Service named `hookline` or
/// `hookline-<svc>` (`enableServiceLinks`, on by default):
/// `HOOKLINE_[<SVC>_]SERVICE_HOST`, `…SERVICE_PORT[_<PORT NAME>]`, `…PORT`,
/// `…PORT_<n>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]`. No config key ends like these, and overrides
/// always contain `__`, which a service link never does.
fn is_kubernetes_service_link(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("HOOKLINE_") else {
        return false;
    };
    if rest.contains("__") {
        return false;
    }
    let parts: Vec<&str> = rest.split('_').collect();
    let word = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    };
    if !parts.iter().all(|p| word(p)) {
        return false;
    }
    // `i` is where the part after the service name starts (0 for the Service `hookline`).
    (0..parts.len()).any(|i| match &parts[i..] {
        ["SERVICE", "HOST"] | ["SERVICE", "PORT", ..] | ["PORT"] => true,
        ["PORT", number, proto, suffix @ ..] => {
            number.chars().all(|c| c.is_ascii_digit())
                && matches!(*proto, "TCP" | "UDP" | "SCTP")
                && matches!(suffix, [] | ["PROTO" | "PORT" | "ADDR"])
        }
        _ => false,
    })
}

/// Top-level sections an environment override can address (`HOOKLINE_<SECTION>__<KEY>`); used
/// to tell which key a single-underscore variable meant.
const OVERRIDE_SECTIONS: &[&str] = &[
    "kafka",
    "topics",
    "input",
    "dedupe",
    "retry",
    "http",
    "dispatcher",
    "server",
    "log",
    "admin",
    "control",
];

/// The override a single-underscore variable most likely meant:
/// `HOOKLINE_KAFKA_BOOTSTRAP_SERVERS` → `HOOKLINE_KAFKA__BOOTSTRAP_SERVERS`.
fn intended_override(key: &str) -> Option<String> {
    let rest = key.strip_prefix("HOOKLINE_")?;
    let lower = rest.to_ascii_lowercase();
    if let Some(option) = lower.strip_prefix("kafka_options_") {
        return Some(format!(
            "HOOKLINE_KAFKA__OPTIONS__{}",
            option.to_ascii_uppercase()
        ));
    }
    OVERRIDE_SECTIONS.iter().find_map(|section| {
        let field = lower.strip_prefix(section)?.strip_prefix('_')?;
        (!field.is_empty()).then(|| {
            format!(
                "HOOKLINE_{}__{}",
                section.to_ascii_uppercase(),
                field.to_ascii_uppercase()
            )
        })
    })
}

fn apply_env_override(root: &mut toml::Table, key: &str, value: &str) -> Result<(), ConfigError> {
    if !key.contains("__") {
        let shape = "environment overrides look like HOOKLINE_<SECTION>__<KEY> (double underscore between levels)";
        return Err(ConfigError::field(
            key,
            match intended_override(key) {
                Some(intended) => format!("did you mean {intended}? {shape}"),
                None => shape.to_string(),
            },
        ));
    }
    let path: Vec<String> = key["HOOKLINE_".len()..]
        .split("__")
        .map(|p| p.to_ascii_lowercase())
        .collect();
    if path.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::field(
            key,
            "environment override has an empty path segment",
        ));
    }
    let is_kafka_option = path.len() == 3 && path[0] == "kafka" && path[1] == "options";
    let parsed = if is_kafka_option {
        toml::Value::String(value.to_string())
    } else {
        parse_env_value(value)
    };
    let mut table = root;
    for (depth, segment) in path.iter().enumerate() {
        let last = depth == path.len() - 1;
        let segment = if is_kafka_option && last {
            segment.replace('_', ".")
        } else {
            segment.clone()
        };
        if last {
            table.insert(segment, parsed);
            return Ok(());
        }
        let entry = table
            .entry(segment.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(ConfigError::field(
                    path[..=depth].join("."),
                    format!("{key} overrides inside a value that is not a table"),
                ))
            }
        };
    }
    Ok(())
}

fn parse_env_value(value: &str) -> toml::Value {
    // `x = <value>` parses only if value is a TOML literal (number, bool, array, inline table).
    match toml::from_str::<toml::Table>(&format!("x = {value}")) {
        Ok(mut t) => t
            .remove("x")
            .unwrap_or_else(|| toml::Value::String(value.into())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(text, "test.toml", Vec::new())
    }

    fn field_of(err: ConfigError) -> String {
        match err {
            ConfigError::Field { field, .. } => field,
            other => panic!("expected a field error, got {other}"),
        }
    }

    #[test]
    fn minimal_config_gets_spec_defaults() {
        let c = load(MIN).expect("minimal config");
        assert_eq!(c.topics.prefix, "webhooks");
        assert_eq!(c.http.timeout, Duration::from_secs(10));
        assert_eq!(c.dedupe.window, Duration::from_secs(86_400));
        let names: Vec<String> = c.retry.schedule[1..]
            .iter()
            .map(|d| tier_name(*d))
            .collect();
        assert_eq!(names, ["1m", "5m", "30m", "2h", "6h", "24h"]);
    }

    #[test]
    fn example_file_is_valid() {
        let text = include_str!("../../config/hookline.example.toml");
        load(text).expect("example config must validate");
    }

    #[test]
    fn unknown_key_names_the_field() {
        let err = load(&format!("{MIN}[topics]\npartitons = 3\n")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("topics"), "{msg}");
        assert!(msg.contains("partitons"), "{msg}");
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases = [
            ("[topics]\npartitions = 0\n", "topics.partitions"),
            ("[topics]\npartitions = \"six\"\n", "topics.partitions"),
            ("[http]\ntimeout = \"ten seconds\"\n", "http.timeout"),
            ("[retry]\nschedule = [\"1m\"]\n", "retry.schedule[0]"),
            ("[retry]\nschedule = [\"0s\", \"5m\", \"1m\"]\n", "retry.schedule[2]"),
            ("[http]\nallow_cidrs = [\"localhost\"]\n", "http.allow_cidrs[0]"),
            (
                "[[endpoints]]\nid = \"a\"\nurl = \"ftp://x\"\n",
                "endpoints[0].url",
            ),
            (
                "[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nsecrets = [\"nope\"]\n",
                "endpoints[0].secrets[0]",
            ),
            (
                "[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\n[[endpoints]]\nid = \"a\"\nurl = \"https://y\"\n",
                "endpoints[1].id",
            ),
            (
                "[[dedupe.keys]]\ntype = \"call.*\"\npointers = [\"data/callId\"]\n",
                "dedupe.keys[0].pointers[0]",
            ),
        ];
        for (extra, field) in cases {
            let err = load(&format!("{MIN}{extra}")).expect_err(extra);
            assert_eq!(field_of(err), field, "for {extra:?}");
        }
    }

    #[test]
    fn min_insync_replicas_defaults_to_two_from_replication_three() {
        let isr = |extra: &str| {
            load(&format!("{MIN}[topics]\n{extra}"))
                .expect(extra)
                .topics
                .min_insync_replicas()
        };
        assert_eq!(isr(""), 1, "default replication factor 1");
        assert_eq!(isr("replication_factor = 2\n"), 1);
        assert_eq!(isr("replication_factor = 3\n"), 2);
        assert_eq!(isr("replication_factor = 5\n"), 2);
        assert_eq!(isr("replication_factor = 5\nmin_insync_replicas = 3\n"), 3);
        assert_eq!(isr("replication_factor = 3\nmin_insync_replicas = 1\n"), 1);
        for bad in [
            "replication_factor = 3\nmin_insync_replicas = 4\n",
            "min_insync_replicas = 2\n",
            "replication_factor = 3\nmin_insync_replicas = 0\n",
        ] {
            let err = load(&format!("{MIN}[topics]\n{bad}")).expect_err(bad);
            assert_eq!(field_of(err), "topics.min_insync_replicas", "{bad}");
        }
    }

    #[test]
    fn env_overrides_apply_and_are_typed() {
        let env = vec![
            ("HOOKLINE_TOPICS__PARTITIONS".to_string(), "12".to_string()),
            ("HOOKLINE_TOPICS__PREFIX".to_string(), "t1".to_string()),
            (
                "HOOKLINE_RETRY__SCHEDULE".to_string(),
                "[\"0s\", \"2s\"]".to_string(),
            ),
            (
                "HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD".to_string(),
                "123".to_string(),
            ),
            ("HOOKLINE_CONFIG".to_string(), "ignored".to_string()),
            ("HOOKLINE_TEST_KAFKA".to_string(), "ignored".to_string()),
        ];
        let c = Config::from_toml_with_env(MIN, "t", env).expect("overrides");
        assert_eq!(c.topics.partitions, 12);
        assert_eq!(c.topics.prefix, "t1");
        assert_eq!(c.retry.schedule.len(), 2);
        assert_eq!(c.kafka.options["sasl.password"], "123");
    }

    #[test]
    fn env_override_of_unknown_key_is_rejected() {
        let env = vec![("HOOKLINE_TOPICS__NOPE".to_string(), "1".to_string())];
        let err = Config::from_toml_with_env(MIN, "t", env).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn env_override_without_double_underscore_is_rejected() {
        let env = vec![(
            "HOOKLINE_KAFKA_BOOTSTRAP_SERVERS".to_string(),
            "x:1".to_string(),
        )];
        let err = Config::from_toml_with_env(MIN, "t", env).unwrap_err();
        assert!(
            err.to_string().contains("HOOKLINE_KAFKA_BOOTSTRAP_SERVERS"),
            "{err}"
        );
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What Kubernetes injects into every pod of a namespace with Services `hookline` (ports
    /// 9464/TCP named `metrics`) and `hookline-admin` / `hookline-dispatcher`.
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
        ("HOOKLINE_DISPATCHER_SERVICE_HOST", "10.0.0.13"),
        ("HOOKLINE_DISPATCHER_PORT_9464_UDP_ADDR", "10.0.0.13"),
        (
            "HOOKLINE_DISPATCHER_PORT_9464_SCTP",
            "sctp://10.0.0.13:9464",
        ),
    ];

    #[test]
    fn kubernetes_service_links_are_ignored_and_named() {
        let mut vars = env(SERVICE_LINKS);
        vars.push(("HOOKLINE_TOPICS__PARTITIONS".into(), "12".into()));
        let c = Config::from_toml_with_env(MIN, "t", vars).expect("service links are not errors");
        assert_eq!(c.topics.partitions, 12, "real overrides still apply");
        let mut want: Vec<String> = SERVICE_LINKS.iter().map(|(k, _)| k.to_string()).collect();
        want.sort();
        assert_eq!(c.ignored_env, want);
    }

    #[test]
    fn mistyped_override_names_the_intended_key() {
        let cases = [
            (
                "HOOKLINE_KAFKA_BOOTSTRAP_SERVERS",
                "HOOKLINE_KAFKA__BOOTSTRAP_SERVERS",
            ),
            ("HOOKLINE_TOPICS_PARTITIONS", "HOOKLINE_TOPICS__PARTITIONS"),
            (
                "HOOKLINE_KAFKA_OPTIONS_SASL_PASSWORD",
                "HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD",
            ),
            ("HOOKLINE_SERVER_LISTEN", "HOOKLINE_SERVER__LISTEN"),
        ];
        for (typed, intended) in cases {
            let err = Config::from_toml_with_env(MIN, "t", env(&[(typed, "1")]))
                .expect_err(typed)
                .to_string();
            assert!(err.contains(typed), "{typed}: {err}");
            assert!(
                err.contains(&format!("did you mean {intended}")),
                "{typed}: {err}"
            );
        }
        // Not a service link and not a section: still an error, without a guess.
        let err = Config::from_toml_with_env(MIN, "t", env(&[("HOOKLINE_NOPE", "1")]))
            .expect_err("unknown variable");
        assert!(err.to_string().contains("HOOKLINE_NOPE"), "{err}");
    }

    #[test]
    fn override_sections_are_real_sections() {
        // MIN opens `[kafka]` already; every other section must be accepted as an empty table.
        for section in OVERRIDE_SECTIONS.iter().filter(|s| **s != "kafka") {
            load(&format!("{MIN}[{section}]\n"))
                .unwrap_or_else(|e| panic!("`{section}` is not a config section: {e}"));
        }
    }

    #[test]
    fn secrets_are_not_in_debug_output() {
        let c = load(&format!(
            "{MIN}[[endpoints]]\nid = \"a\"\nurl = \"https://x\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n"
        ))
        .expect("valid");
        let dbg = format!("{:?}", c.endpoints[0]);
        assert!(!dbg.contains("MfKQ9r8"), "{dbg}");
    }

    #[test]
    fn tier_names() {
        assert_eq!(tier_name(Duration::from_secs(60)), "1m");
        assert_eq!(tier_name(Duration::from_secs(86_400)), "24h");
        assert_eq!(tier_name(Duration::from_secs(3)), "3s");
        assert_eq!(tier_name(Duration::from_millis(1500)), "1500ms");
        assert_eq!(tier_name(Duration::from_secs(2 * 86_400)), "2d");
    }
}

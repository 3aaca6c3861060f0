//! Configuration: one TOML file, overridden by `HOOKLINE_…` environment variables, validated once
//! at startup. Every error names the field (`endpoints[1].url`) and the reason.
//!
//! Environment overrides ([`env`](self::env)): `HOOKLINE_<SECTION>__<KEY>` sets `section.key`
//! (double underscore between levels, case-insensitive), e.g.
//! `HOOKLINE_KAFKA__BOOTSTRAP_SERVERS=host:9092`, `HOOKLINE_TOPICS__PARTITIONS=12`,
//! `HOOKLINE_RETRY__SCHEDULE='["0s","2s","4s"]'`. Under `kafka.options` single underscores
//! become dots so librdkafka properties can be set: `HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD=…`
//! sets `sasl.password`. Values are read as TOML when they parse as a TOML value (numbers,
//! booleans, arrays), otherwise as strings.
//!
//! Kubernetes injects "service link" variables for every Service of the pod's namespace; a
//! Service named `hookline` or `hookline-<svc>` yields `HOOKLINE_SERVICE_HOST`, `HOOKLINE_PORT`,
//! `HOOKLINE_<SVC>_PORT_9464_TCP_ADDR`, …. They share our prefix but are not overrides: they are
//! ignored and returned in [`Config::ignored_env`] so the process can name them in one log line.
//! Any other `HOOKLINE_…` variable without `__` is an error, naming the key it probably meant.
//!
//! Module map: [`sections`](self::sections) (one struct per section, each default written once,
//! each section validating its fields), [`endpoints`](self::endpoints) (endpoints with typed URL
//! and secrets), `env` (overrides).

pub mod admin;
pub mod control;
mod endpoints;
mod env;
pub mod filter;
pub mod glob;
mod sections;
pub mod traces;

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use endpoints::{CustomHeader, EndpointConfig, EndpointUrl, Secret, CUSTOM_HEADERS_MAX_BYTES};
pub use sections::{
    default_schedule, DedupeConfig, DedupeKeyRule, DispatcherConfig, HttpConfig, InputConfig,
    KafkaConfig, LogConfig, LogFormat, RetryConfig, ServerConfig, StageLimits, TopicsConfig,
    MAX_KEY_LIMIT, MAX_PAYLOAD_LIMIT,
};

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
    /// `[tiers]` as written; read [`Config::tiers`].
    #[serde(default, rename = "tiers")]
    tiers_section: sections::TiersSection,
    /// The retry tiers' limits (`[tiers]`; a key left unset there takes the `[dispatcher]`
    /// value), resolved at load. Replay uses its endpoint concurrency too.
    #[serde(skip)]
    pub tiers: StageLimits,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub log: LogConfig,
    /// OpenTelemetry traces (`[traces]`, `traces.rs`); off by default.
    #[serde(default)]
    pub traces: traces::TracesConfig,
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
    /// The admin process: API, `/v1/events`, dashboard (`common/src/config/admin.rs`).
    #[serde(default)]
    pub admin: crate::config::admin::AdminConfig,
    /// The control plane (`[control]`, see `control_config.rs`).
    #[serde(default)]
    pub control: crate::config::control::ControlConfig,
    /// Kubernetes service-link variables (`HOOKLINE_SERVICE_HOST`, …) that were ignored, sorted;
    /// not configuration: the binary names them in one log line at startup.
    #[serde(skip)]
    pub ignored_env: Vec<String>,
}

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
            .filter(|(k, _)| k.starts_with("HOOKLINE_") && !env::is_reserved_env(k))
            .collect();
        let (mut service_links, mut overrides): (Vec<_>, Vec<_>) = ours
            .into_iter()
            .partition(|(k, _)| env::is_kubernetes_service_link(k));
        overrides.sort();
        for (key, value) in overrides {
            env::apply_env_override(&mut root, &key, &value)?;
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
        config.tiers = config.tiers_section.resolve(&config.dispatcher);
        config.validate()?;
        config.ignored_env = service_links.into_iter().map(|(k, _)| k).collect();
        Ok(config)
    }

    /// Cross-field checks that serde cannot express, section by section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        sections::validate(self)
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

#[cfg(test)]
mod tests;

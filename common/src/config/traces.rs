//! The `[traces]` section: OpenTelemetry traces of deliveries, exported over OTLP/HTTP.
//! Off by default; when off no span is made and no trace header is written or sent.

use serde::Deserialize;

use crate::config::ConfigError;

/// `[traces]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracesConfig {
    /// Make and export spans (dedupe, attempts, tier waits, dead letters, replays).
    pub enabled: bool,
    /// The collector's OTLP/HTTP traces URL (Jaeger, the OpenTelemetry Collector, Tempo…).
    pub endpoint: String,
    /// Head sampling of the traces hookline starts (events without a producer's `traceparent`),
    /// 0.0..=1.0. A producer's trace keeps the producer's sampling decision.
    pub sample_ratio: f64,
    /// `service.name` of the spans.
    pub service_name: String,
    /// Send `traceparent` on every POST to endpoints (an endpoint's `trace_context = false`
    /// turns it off for that endpoint).
    pub propagate: bool,
}

impl Default for TracesConfig {
    fn default() -> Self {
        TracesConfig {
            enabled: false,
            endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            sample_ratio: 1.0,
            service_name: "hookline".into(),
            propagate: true,
        }
    }
}

impl TracesConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(ConfigError::field(
                "traces.sample_ratio",
                format!("must be within 0.0..=1.0, not {}", self.sample_ratio),
            ));
        }
        match url::Url::parse(&self.endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(u) => {
                return Err(ConfigError::field(
                    "traces.endpoint",
                    format!("must be an http:// or https:// URL, not {}://", u.scheme()),
                ))
            }
            Err(e) => {
                return Err(ConfigError::field(
                    "traces.endpoint",
                    format!("is not a URL ({e}): {:?}", self.endpoint),
                ))
            }
        }
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::field(
                "traces.service_name",
                "must not be empty",
            ));
        }
        Ok(())
    }
}

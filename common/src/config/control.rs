//! The `[control]` section: settings of the control plane (live endpoint registry, delivery log,
//! per-endpoint health). Self-contained so that `config.rs` only names it.
//!
//! The key that encrypts endpoint secrets at rest is *not* configuration: it comes from the
//! environment only ([`SECRETS_KEY_ENV`], [`SECRETS_OLD_KEYS_ENV`]), never from a file, so it is
//! never written into a ConfigMap. Those two names are reserved: the config loader does not read
//! them as (mistyped) overrides.

use std::time::Duration;

use serde::Deserialize;

use crate::config::ConfigError;

/// The current key encrypting endpoint secrets on `<p>.endpoints`: base64 of 32 bytes.
pub const SECRETS_KEY_ENV: &str = "HOOKLINE_SECRETS_KEY";
/// Keys that only decrypt (rotation): base64 of 32 bytes each, separated by commas.
pub const SECRETS_OLD_KEYS_ENV: &str = "HOOKLINE_SECRETS_OLD_KEYS";

/// `[control]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Retention of the delivery log `<p>.attempts`.
    #[serde(default = "default_attempts_retention", with = "humantime_serde")]
    pub attempts_retention: Duration,
    /// Attempt records the delivery log's writer buffers before it drops (and counts) new ones.
    #[serde(default = "default_attempt_log_buffer")]
    pub attempt_log_buffer: usize,
    /// How long a rotated-out endpoint secret keeps signing beside the new one.
    #[serde(default = "default_rotation_grace", with = "humantime_serde")]
    pub secret_rotation_grace: Duration,
    /// Health: the recent success rate covers the attempts of this last period…
    #[serde(default = "default_health_window", with = "humantime_serde")]
    pub health_window: Duration,
    /// …and at most this many of the most recent attempts.
    #[serde(default = "default_health_window_attempts")]
    pub health_window_attempts: usize,
    /// How far back the health tracker reads the delivery log when it starts (failure streaks
    /// that began earlier are reported as starting at the lookback's edge).
    #[serde(default = "default_health_lookback", with = "humantime_serde")]
    pub health_lookback: Duration,
    /// Disable an (API-managed) endpoint whose attempts all failed for this long; off unless
    /// set (Svix uses 5 days).
    #[serde(default, with = "humantime_serde")]
    pub auto_disable_after: Option<Duration>,
    /// An enabled endpoint whose attempts have all failed for this long is marked failing
    /// (`hookline.endpoint.failing`; `hookline.endpoint.recovered` at its next success). Decided
    /// by the admin process's health tracker.
    #[serde(default = "default_failing_after", with = "humantime_serde")]
    pub failing_after: Duration,
    /// Retention of `<p>.operational` (operational events such as an auto-disable).
    #[serde(default = "default_operational_retention", with = "humantime_serde")]
    pub operational_retention: Duration,
    /// Delivery metrics carry an `endpoint` label (the endpoint id) while a process has at most
    /// this many endpoints; above it the label is `_all` (bounded series). 0: never per endpoint.
    #[serde(default = "default_metrics_endpoint_limit")]
    pub metrics_endpoint_limit: usize,
    /// Write every attempt to the delivery log `<p>.attempts` (default). `false`: nothing is
    /// written, so `hookline trace`, the API's attempts, endpoint health and the dashboard's
    /// recent attempts have no data; for measuring the log's cost, or an install that does not
    /// want it.
    #[serde(default = "default_delivery_log")]
    pub delivery_log: bool,
}

const fn default_delivery_log() -> bool {
    true
}

const fn default_metrics_endpoint_limit() -> usize {
    100
}

const fn default_attempts_retention() -> Duration {
    Duration::from_secs(7 * 86_400)
}
const fn default_attempt_log_buffer() -> usize {
    10_000
}
const fn default_rotation_grace() -> Duration {
    Duration::from_secs(86_400)
}
const fn default_health_window() -> Duration {
    Duration::from_secs(15 * 60)
}
const fn default_health_window_attempts() -> usize {
    100
}
const fn default_health_lookback() -> Duration {
    Duration::from_secs(86_400)
}
const fn default_failing_after() -> Duration {
    Duration::from_secs(5 * 60)
}
const fn default_operational_retention() -> Duration {
    Duration::from_secs(30 * 86_400)
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            attempts_retention: default_attempts_retention(),
            attempt_log_buffer: default_attempt_log_buffer(),
            secret_rotation_grace: default_rotation_grace(),
            health_window: default_health_window(),
            health_window_attempts: default_health_window_attempts(),
            health_lookback: default_health_lookback(),
            auto_disable_after: None,
            failing_after: default_failing_after(),
            operational_retention: default_operational_retention(),
            metrics_endpoint_limit: default_metrics_endpoint_limit(),
            delivery_log: default_delivery_log(),
        }
    }
}

impl ControlConfig {
    /// Checks that serde cannot express; errors name `control.<field>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let field = |f: &str, reason: &str| ConfigError::Field {
            field: format!("control.{f}"),
            reason: reason.to_string(),
        };
        if self.attempts_retention < Duration::from_secs(60) {
            return Err(field("attempts_retention", "must be at least 1m"));
        }
        if self.attempt_log_buffer == 0 {
            return Err(field("attempt_log_buffer", "must be at least 1"));
        }
        if self.health_window < Duration::from_secs(1) {
            return Err(field("health_window", "must be at least 1s"));
        }
        if self.health_window_attempts == 0 || self.health_window_attempts > 100_000 {
            return Err(field(
                "health_window_attempts",
                "must be between 1 and 100000",
            ));
        }
        if self.health_lookback < self.health_window {
            return Err(field(
                "health_lookback",
                "must be at least control.health_window",
            ));
        }
        if let Some(after) = self.auto_disable_after {
            if after < Duration::from_secs(1) {
                return Err(field("auto_disable_after", "must be at least 1s"));
            }
        }
        if self.failing_after < Duration::from_secs(1) {
            return Err(field("failing_after", "must be at least 1s"));
        }
        if self.operational_retention < Duration::from_secs(60) {
            return Err(field("operational_retention", "must be at least 1m"));
        }
        Ok(())
    }
}

/// Whether `key` is one of the control plane's reserved environment variables (not overrides).
pub fn is_reserved_env(key: &str) -> bool {
    key == SECRETS_KEY_ENV || key == SECRETS_OLD_KEYS_ENV
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const MIN: &str = "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_and_overrides() {
        let c = Config::from_toml_with_env(MIN, "t", Vec::new()).expect("config");
        assert_eq!(c.control.attempts_retention.as_secs(), 7 * 86_400);
        assert_eq!(c.control.secret_rotation_grace.as_secs(), 86_400);
        assert_eq!(c.control.auto_disable_after, None);
        let c = Config::from_toml_with_env(
            MIN,
            "t",
            env(&[("HOOKLINE_CONTROL__AUTO_DISABLE_AFTER", "5d")]),
        )
        .expect("override");
        assert_eq!(
            c.control.auto_disable_after.map(|d| d.as_secs()),
            Some(5 * 86_400)
        );
    }

    #[test]
    fn the_secrets_key_variables_are_not_overrides() {
        let vars = env(&[
            ("HOOKLINE_SECRETS_KEY", "AAAA"),
            ("HOOKLINE_SECRETS_OLD_KEYS", "BBBB,CCCC"),
        ]);
        let c = Config::from_toml_with_env(MIN, "t", vars).expect("reserved, not an error");
        assert!(c.ignored_env.is_empty(), "not service links either");
        // A near miss is still a mistyped override, named.
        let err = Config::from_toml_with_env(MIN, "t", env(&[("HOOKLINE_SECRET_KEY", "x")]))
            .expect_err("mistyped");
        assert!(err.to_string().contains("HOOKLINE_SECRET_KEY"), "{err}");
    }

    #[test]
    fn bad_values_name_the_field() {
        for (extra, field) in [
            ("attempt_log_buffer = 0\n", "control.attempt_log_buffer"),
            ("health_lookback = \"1m\"\n", "control.health_lookback"),
            (
                "auto_disable_after = \"0s\"\n",
                "control.auto_disable_after",
            ),
            (
                "attempts_retention = \"1s\"\n",
                "control.attempts_retention",
            ),
            ("nope = 1\n", "control"),
        ] {
            let err = Config::from_toml_with_env(&format!("{MIN}[control]\n{extra}"), "t", vec![])
                .expect_err(extra)
                .to_string();
            assert!(err.contains(field), "{extra}: {err}");
        }
    }
}

//! `[[endpoints]]`: the receivers of webhooks, with their URL and secrets parsed into typed
//! values at load ([`EndpointUrl`]: an absolute http(s) URL with a host and no credentials;
//! [`Secret`]: the decoded HMAC key of a `whsec_…` secret), so nothing re-parses them per attempt
//! and a bad one fails the load naming the field (`endpoints[1].secrets[0]`).

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use url::Url;

use super::ConfigError;

/// One receiver of webhooks.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub id: String,
    pub url: EndpointUrl,
    /// `whsec_…` secrets; every one signs each request (several while rotating).
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// Only events of this tenant; `None` receives every tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Globs on the event type; empty means every type.
    #[serde(default)]
    pub event_types: Vec<String>,
    #[serde(default = "enabled")]
    pub enabled: bool,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub max_concurrency: Option<usize>,
}

const fn enabled() -> bool {
    true
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

/// An endpoint URL: absolute, `http` or `https`, with a host, without credentials. Shown as
/// written. Also held as the HTTP request target every attempt sends to, converted once here.
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointUrl {
    url: Url,
    uri: http::Uri,
    text: String,
}

impl EndpointUrl {
    /// Parses and checks a URL; the error says what is wrong.
    pub fn parse(text: &str) -> Result<EndpointUrl, String> {
        let url = Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err("must be an http:// or https:// URL with a host".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("must not carry credentials (user:pass@)".into());
        }
        let uri = url
            .as_str()
            .parse()
            .map_err(|e| format!("not a valid HTTP request target: {e}"))?;
        Ok(EndpointUrl {
            url,
            uri,
            text: text.to_string(),
        })
    }

    pub fn as_url(&self) -> &Url {
        &self.url
    }

    /// The URL as the request target of every delivery attempt.
    pub fn as_uri(&self) -> &http::Uri {
        &self.uri
    }

    /// The URL as configured.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl<'de> Deserialize<'de> for EndpointUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        EndpointUrl::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The HMAC key of a `whsec_…` secret, decoded at load; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl Secret {
    /// Decodes a `whsec_…` secret; the error says what is wrong without echoing it.
    pub fn parse(text: &str) -> Result<Secret, String> {
        crate::contract::secret::decode_secret(text).map(|key| Secret { key })
    }

    /// The key bytes that sign.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The secret as a `whsec_…` text again (standard base64 of the key): what the control plane
    /// seals at rest and hands to a receiver. Never log it.
    pub fn to_text(&self) -> String {
        use base64::Engine as _;
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(&self.key)
        )
    }
}

impl AsRef<[u8]> for Secret {
    fn as_ref(&self) -> &[u8] {
        &self.key
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Secret::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Cross-endpoint and per-field checks serde cannot express.
pub(super) fn validate(endpoints: &[EndpointConfig]) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for (i, ep) in endpoints.iter().enumerate() {
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

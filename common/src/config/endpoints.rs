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
    /// Headers sent with every request (an auth token the receiver's gateway wants); not
    /// covered by the signature.
    #[serde(default)]
    pub headers: Vec<CustomHeader>,
    /// A CEL expression over the event (`id`, `type`, `tenant`, `data`) that must hold for the
    /// endpoint to receive it, besides `tenant` and `event_types`.
    #[serde(default)]
    pub filter: Option<super::filter::EventFilter>,
    /// At most this many deliveries per second to this endpoint, for the whole cluster: its
    /// deliveries then go through `<p>.throttle`, whose owner paces them.
    #[serde(default)]
    pub rate_limit: Option<f64>,
    /// Deliveries that may go out at once after an idle spell (default 1: strictly paced).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Send `traceparent` (the attempt's span) on requests to this endpoint while tracing is
    /// on; `false` keeps hookline's trace ids from this receiver.
    #[serde(default = "enabled")]
    pub trace_context: bool,
}

/// The most `rate_limit` may say (deliveries per second).
pub const RATE_LIMIT_MAX: f64 = 100_000.0;

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
            .field("headers", &self.headers)
            .field("filter", &self.filter)
            .field("rate_limit", &self.rate_limit)
            .field("burst", &self.burst)
            .field("trace_context", &self.trace_context)
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

/// The most header bytes (`name: value\r\n` each) an endpoint may add to a request.
pub const CUSTOM_HEADERS_MAX_BYTES: usize = 8 * 1024;

/// Header names an endpoint may not set: hop-by-hop headers (RFC 9110 §7.6.1 and the
/// historical ones) and `host`; `webhook-*` and `content-*` are refused by prefix.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A header an endpoint adds to every request (`headers = [{ name, value, secret }]`), parsed
/// at load. Its value is not covered by the signature. A `secret` value is sealed at rest by the
/// control plane, never shown by the API and never logged.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomHeader {
    #[serde(deserialize_with = "de_header_name")]
    pub name: http::HeaderName,
    #[serde(deserialize_with = "de_header_value")]
    pub value: http::HeaderValue,
    #[serde(default)]
    pub secret: bool,
}

impl CustomHeader {
    /// Checks a header as given; the error names the part (`name` or `value`) and what is
    /// wrong, without echoing the value.
    pub fn parse(
        name: &str,
        value: &str,
        secret: bool,
    ) -> Result<CustomHeader, (&'static str, String)> {
        Ok(CustomHeader {
            name: parse_header_name(name).map_err(|e| ("name", e))?,
            value: parse_header_value(value).map_err(|e| ("value", e))?,
            secret,
        })
    }

    /// Checks a header name alone (see [`CustomHeader::parse`]).
    pub fn parse_name(name: &str) -> Result<http::HeaderName, String> {
        parse_header_name(name)
    }

    /// The value as text (visible ASCII, checked at parse).
    pub fn value_text(&self) -> &str {
        self.value.to_str().unwrap_or_default()
    }

    /// Bytes it adds to a request: `name: value\r\n`.
    pub fn wire_len(&self) -> usize {
        self.name.as_str().len() + self.value.len() + 4
    }
}

impl fmt::Debug for CustomHeader {
    // A secret value never reaches a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value: &dyn fmt::Debug = if self.secret {
            &"redacted"
        } else {
            &self.value
        };
        f.debug_struct("CustomHeader")
            .field("name", &self.name)
            .field("value", value)
            .field("secret", &self.secret)
            .finish()
    }
}

/// A header name an endpoint may set: a valid HTTP field name, not one hookline or the
/// connection owns.
fn parse_header_name(text: &str) -> Result<http::HeaderName, String> {
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    if text.contains(['\r', '\n']) {
        return Err("must not contain CR or LF".into());
    }
    let name = http::HeaderName::from_bytes(text.as_bytes()).map_err(|_| {
        format!(
            "`{}` is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)",
            text.escape_debug()
        )
    })?;
    let lower = name.as_str();
    if lower.starts_with("webhook-") {
        return Err(format!(
            "`{text}`: webhook-* headers are hookline's own (Standard Webhooks id, timestamp, \
             signature)"
        ));
    }
    if lower.starts_with("content-") {
        return Err(format!(
            "`{text}`: content-* headers describe the body, which hookline sets"
        ));
    }
    if lower == "host" {
        return Err("`host` comes from the endpoint URL".into());
    }
    if RESERVED_HEADERS.contains(&lower) {
        return Err(format!(
            "`{text}` is a hop-by-hop header, owned by the connection"
        ));
    }
    Ok(name)
}

/// A header value an endpoint may set: visible ASCII, spaces and tabs; never CR, LF or NUL.
/// The error never echoes the value (it may be a token).
fn parse_header_value(text: &str) -> Result<http::HeaderValue, String> {
    if text.contains(['\r', '\n', '\0']) {
        return Err("must not contain CR, LF or NUL".into());
    }
    if text.len() > CUSTOM_HEADERS_MAX_BYTES {
        return Err(format!(
            "is {} bytes; all headers together may take at most {CUSTOM_HEADERS_MAX_BYTES}",
            text.len()
        ));
    }
    http::HeaderValue::from_str(text)
        .map_err(|_| "must be visible ASCII, spaces and tabs (no control characters)".into())
}

fn de_header_name<'de, D: Deserializer<'de>>(d: D) -> Result<http::HeaderName, D::Error> {
    parse_header_name(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn de_header_value<'de, D: Deserializer<'de>>(d: D) -> Result<http::HeaderValue, D::Error> {
    parse_header_value(&String::deserialize(d)?).map_err(serde::de::Error::custom)
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
        if let Some(r) = ep.rate_limit {
            if !(0.01..=RATE_LIMIT_MAX).contains(&r) {
                return Err(ConfigError::field(
                    at("rate_limit"),
                    format!("must be between 0.01 and {RATE_LIMIT_MAX} deliveries per second"),
                ));
            }
        }
        match (ep.burst, ep.rate_limit) {
            (Some(_), None) => {
                return Err(ConfigError::field(
                    at("burst"),
                    "applies only with rate_limit",
                ))
            }
            (Some(b), Some(_)) if b == 0 || b > 100_000 => {
                return Err(ConfigError::field(at("burst"), "must be 1..=100000"))
            }
            _ => {}
        }
        for (j, h) in ep.headers.iter().enumerate() {
            if ep.headers[..j].iter().any(|o| o.name == h.name) {
                return Err(ConfigError::field(
                    format!("endpoints[{i}].headers[{j}].name"),
                    format!("`{}` is given twice", h.name),
                ));
            }
        }
        let bytes: usize = ep.headers.iter().map(CustomHeader::wire_len).sum();
        if bytes > CUSTOM_HEADERS_MAX_BYTES {
            return Err(ConfigError::field(
                at("headers"),
                format!("{bytes} bytes in all; at most {CUSTOM_HEADERS_MAX_BYTES} (8 KiB)"),
            ));
        }
    }
    Ok(())
}

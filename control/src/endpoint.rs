//! An endpoint as the registry holds it (secrets opened), the set every process sees, secret
//! rotation, and the validation of a definition (the config file's rules, through the config
//! loader itself, so the file and the API can never accept different endpoints).

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use rand::RngCore as _;
use serde_json::{json, Value};

use hookline_common::config::filter::EventFilter;
use hookline_common::config::{
    Config, ConfigError, CustomHeader, EndpointConfig, EndpointUrl, Secret,
};

use crate::crypto::{CryptoError, Keyring};
use crate::record::{EndpointRecord, ManagedBy, RecordHeader, SealedSecret, SCHEMA, SCHEMA_V1};

/// A `whsec_` secret and when it stops signing (`None`: until rotated out).
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret {
    pub secret: String,
    pub expires_at_ms: Option<i64>,
}

impl fmt::Debug for SigningSecret {
    // Secrets never reach a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SigningSecret {{ secret: redacted, expires_at_ms: {:?} }}",
            self.expires_at_ms
        )
    }
}

impl SigningSecret {
    /// Signs at `t_ms`.
    pub fn active_at(&self, t_ms: i64) -> bool {
        self.expires_at_ms.is_none_or(|e| t_ms < e)
    }
}

/// One endpoint of the registry.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub id: String,
    pub url: String,
    pub tenant: Option<String>,
    pub event_types: Vec<String>,
    pub enabled: bool,
    pub timeout: Option<Duration>,
    pub max_concurrency: Option<usize>,
    /// Newest first.
    pub secrets: Vec<SigningSecret>,
    /// Custom headers, secret values opened.
    pub headers: Vec<CustomHeader>,
    /// The payload filter, compiled.
    pub filter: Option<EventFilter>,
    /// Deliveries per second for the whole cluster, and the burst.
    pub rate_limit: Option<f64>,
    pub burst: Option<u32>,
    /// Whether requests carry `traceparent` while tracing is on.
    pub trace_context: bool,
    pub managed_by: ManagedBy,
    pub disabled_reason: Option<String>,
    /// Since when it is marked failing (announced `endpoint.failing`, not yet recovered).
    pub failing_since_ms: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub version: u64,
    /// Set when a secret cannot be opened (key missing): the endpoint is then treated as
    /// disabled, never sent unsigned.
    pub problem: Option<String>,
    /// Whether some secret is sealed with a key other than the current one.
    pub needs_reencryption: bool,
}

impl Endpoint {
    /// Opens a record's secrets with `keyring`. A secret that cannot be opened leaves the
    /// endpoint with a `problem` instead of failing the whole registry.
    pub fn from_record(r: EndpointRecord, keyring: &Keyring) -> Endpoint {
        let mut problem = None;
        let mut secrets = Vec::new();
        let mut needs_reencryption = false;
        let mut headers = Vec::new();
        if r.managed_by == ManagedBy::File {
            // Its secrets and headers are in the config file, not on the topic.
            match keyring.file_endpoint(&r.id) {
                Some(file) => {
                    secrets.extend(file.secrets.iter().map(|s| SigningSecret {
                        secret: s.clone(),
                        expires_at_ms: None,
                    }));
                    headers.clone_from(&file.headers);
                }
                None => {
                    problem =
                        Some("file-managed, but this process's config file does not list it".into())
                }
            }
        }
        for (i, s) in r.secrets.iter().enumerate() {
            needs_reencryption |= !keyring.is_current(&s.sealed);
            match keyring.open(&r.id, &s.sealed) {
                Ok(secret) => secrets.push(SigningSecret {
                    secret,
                    expires_at_ms: s.expires_at_ms,
                }),
                Err(e) => {
                    problem.get_or_insert(format!("secrets[{i}]: {e}"));
                }
            }
        }
        for (i, h) in r.headers.iter().enumerate() {
            let value = match (&h.value, &h.sealed) {
                (_, Some(sealed)) => {
                    needs_reencryption |= !keyring.is_current(sealed);
                    keyring.open(&r.id, sealed).map_err(|e| e.to_string())
                }
                (Some(v), None) => Ok(v.clone()),
                (None, None) => Err("neither a value nor a sealed one".into()),
            };
            match value.and_then(|v| {
                CustomHeader::parse(&h.name, &v, h.sealed.is_some())
                    .map_err(|(part, why)| format!("{part}: {why}"))
            }) {
                Ok(header) => headers.push(header),
                // Never sent without it: the receiver's gateway would refuse every request.
                Err(e) => {
                    problem.get_or_insert(format!("headers[{i}]: {e}"));
                }
            }
        }
        let filter = match r.filter.as_deref().map(EventFilter::compile).transpose() {
            Ok(filter) => filter,
            // Never delivered past a filter it cannot evaluate.
            Err(e) => {
                problem.get_or_insert(format!("filter: {e}"));
                None
            }
        };
        Endpoint {
            id: r.id,
            url: r.url,
            tenant: r.tenant,
            event_types: r.event_types,
            enabled: r.enabled,
            timeout: r.timeout,
            max_concurrency: r.max_concurrency,
            secrets,
            headers,
            filter,
            rate_limit: r.rate_limit,
            burst: r.burst,
            trace_context: r.trace_context.unwrap_or(true),
            managed_by: r.managed_by,
            disabled_reason: r.disabled_reason,
            failing_since_ms: r.failing_since_ms,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            version: r.version,
            problem,
            needs_reencryption,
        }
    }

    /// An endpoint from a definition (the config file's, or an API/CLI create), replacing
    /// `current` (if any) at `now`: version and creation time carry on from it.
    pub fn from_definition(
        d: &EndpointConfig,
        managed_by: ManagedBy,
        current: Option<&Endpoint>,
        now: i64,
    ) -> Endpoint {
        let why_disabled = match managed_by {
            ManagedBy::File => "config file",
            _ => "manual",
        };
        Endpoint {
            id: d.id.clone(),
            url: d.url.as_str().to_string(),
            tenant: d.tenant.clone(),
            event_types: d.event_types.clone(),
            enabled: d.enabled,
            timeout: d.timeout,
            max_concurrency: d.max_concurrency,
            secrets: d
                .secrets
                .iter()
                .map(|s| SigningSecret {
                    secret: s.to_text(),
                    expires_at_ms: None,
                })
                .collect(),
            headers: d.headers.clone(),
            filter: d.filter.clone(),
            rate_limit: d.rate_limit,
            burst: d.burst,
            trace_context: d.trace_context,
            managed_by,
            disabled_reason: (!d.enabled).then(|| why_disabled.to_string()),
            // Health, not definition: a changed definition is still failing until it recovers.
            failing_since_ms: current.and_then(|c| c.failing_since_ms),
            created_at_ms: current.map_or(now, |c| c.created_at_ms),
            updated_at_ms: now,
            version: current.map_or(1, |c| c.version + 1),
            problem: None,
            needs_reencryption: false,
        }
    }

    /// The record of this endpoint, every secret (and secret header value) sealed afresh with
    /// the current key (none for a file-managed endpoint: its secrets and headers stay in the
    /// config file).
    pub fn to_record(&self, keyring: &Keyring) -> Result<EndpointRecord, CryptoError> {
        let (on_topic, headers_on_topic): (&[SigningSecret], &[CustomHeader]) =
            if self.managed_by == ManagedBy::File {
                (&[], &[])
            } else {
                (&self.secrets, &self.headers)
            };
        let headers = headers_on_topic
            .iter()
            .map(|h| {
                let (value, sealed) = if h.secret {
                    (None, Some(keyring.seal(&self.id, h.value_text())?))
                } else {
                    (Some(h.value_text().to_string()), None)
                };
                Ok(RecordHeader {
                    name: h.name.as_str().to_string(),
                    value,
                    sealed,
                })
            })
            .collect::<Result<Vec<_>, CryptoError>>()?;
        let secrets = on_topic
            .iter()
            .map(|s| {
                Ok(SealedSecret {
                    sealed: keyring.seal(&self.id, &s.secret)?,
                    expires_at_ms: s.expires_at_ms,
                })
            })
            .collect::<Result<Vec<_>, CryptoError>>()?;
        Ok(EndpointRecord {
            schema: if headers.is_empty() && self.filter.is_none() && self.rate_limit.is_none() {
                SCHEMA_V1
            } else {
                SCHEMA
            },
            id: self.id.clone(),
            url: self.url.clone(),
            tenant: self.tenant.clone(),
            event_types: self.event_types.clone(),
            enabled: self.enabled,
            timeout: self.timeout,
            max_concurrency: self.max_concurrency,
            secrets,
            headers,
            filter: self.filter.as_ref().map(|f| f.source().to_string()),
            rate_limit: self.rate_limit,
            burst: self.burst,
            // Stored only when off: a default record stays as it was.
            trace_context: (!self.trace_context).then_some(false),
            managed_by: self.managed_by,
            disabled_reason: self.disabled_reason.clone(),
            failing_since_ms: self.failing_since_ms,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            version: self.version,
        })
    }

    /// The secrets that sign a request made at `t_ms`, newest first (Standard Webhooks
    /// multi-signature: each one's signature goes into `webhook-signature`).
    pub fn signing_secrets_at(&self, t_ms: i64) -> Vec<&str> {
        self.secrets
            .iter()
            .filter(|s| s.active_at(t_ms))
            .map(|s| s.secret.as_str())
            .collect()
    }

    /// The endpoint as the delivery engine and the fan-out take it, for a request at `t_ms`:
    /// the secrets signing then; disabled while it has a problem. `None` for a URL that does not
    /// parse (every write validates it, so only a record written by hand).
    pub fn config_at(&self, t_ms: i64) -> Option<EndpointConfig> {
        Some(EndpointConfig {
            id: self.id.clone(),
            url: EndpointUrl::parse(&self.url).ok()?,
            secrets: self
                .signing_secrets_at(t_ms)
                .into_iter()
                .filter_map(|s| Secret::parse(s).ok())
                .collect(),
            tenant: self.tenant.clone(),
            event_types: self.event_types.clone(),
            enabled: self.enabled && self.problem.is_none(),
            timeout: self.timeout,
            max_concurrency: self.max_concurrency,
            headers: self.headers.clone(),
            filter: self.filter.clone(),
            rate_limit: self.rate_limit,
            burst: self.burst,
            trace_context: self.trace_context,
        })
    }

    /// The definition fields as a config entry (every secret, whatever its expiry).
    pub fn definition(&self) -> Option<EndpointConfig> {
        Some(EndpointConfig {
            secrets: self
                .secrets
                .iter()
                .filter_map(|s| Secret::parse(&s.secret).ok())
                .collect(),
            ..self.config_at(i64::MIN)?
        })
    }

    /// JSON for listings and the API: everything but secret values (count and expiries only;
    /// a secret header's name, never its value).
    pub fn to_json(&self, now_ms: i64) -> Value {
        json!({
            "id": self.id,
            "url": self.url,
            "tenant": self.tenant,
            "event_types": self.event_types,
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "failing_since_ms": self.failing_since_ms,
            "timeout": self.timeout.map(|t| humantime::format_duration(t).to_string()),
            "max_concurrency": self.max_concurrency,
            "secrets": self.secrets.iter().map(|s| json!({
                "expires_at_ms": s.expires_at_ms,
                "signing": s.active_at(now_ms),
            })).collect::<Vec<_>>(),
            "headers": self.headers.iter().map(|h| json!({
                "name": h.name.as_str(),
                "value": (!h.secret).then(|| h.value_text()),
                "secret": h.secret,
            })).collect::<Vec<_>>(),
            "filter": self.filter.as_ref().map(EventFilter::source),
            "rate_limit": self.rate_limit,
            "burst": self.burst,
            "trace_context": self.trace_context,
            "managed_by": self.managed_by.as_str(),
            "created_at_ms": self.created_at_ms,
            "updated_at_ms": self.updated_at_ms,
            "version": self.version,
            "problem": self.problem,
        })
    }
}

pub use crate::set::EndpointSet;

/// A fresh Standard Webhooks secret: `whsec_` + base64 of 32 random bytes.
pub fn generate_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The secrets after rotating in `new` at `now_ms`: `new` first; every secret that signed
/// until rotated out now stops at `now + grace` (an earlier expiry is kept); expired ones go.
pub fn rotated(
    secrets: &[SigningSecret],
    new: String,
    now_ms: i64,
    grace: Duration,
) -> Vec<SigningSecret> {
    let until = now_ms.saturating_add(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
    let mut out = vec![SigningSecret {
        secret: new,
        expires_at_ms: None,
    }];
    for s in secrets.iter().filter(|s| s.active_at(now_ms)) {
        out.push(SigningSecret {
            secret: s.secret.clone(),
            expires_at_ms: Some(s.expires_at_ms.map_or(until, |e| e.min(until))),
        });
    }
    out
}

/// A definition that breaks a config rule: `field` is the endpoint's field (`url`,
/// `secrets[0]`), the reason the config loader's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.reason)
    }
}

/// A custom header as a write (API, CLI, dashboard) gives it. `value` absent keeps the value
/// the endpoint has for that name: how a secret one, never shown again, is kept on an edit.
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderEdit {
    pub name: String,
    pub value: Option<String>,
    pub secret: bool,
}

impl fmt::Debug for HeaderEdit {
    // The value may be a token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeaderEdit")
            .field("name", &self.name)
            .field("value", &self.value.as_ref().map(|_| "redacted"))
            .field("secret", &self.secret)
            .finish()
    }
}

impl From<&CustomHeader> for HeaderEdit {
    fn from(h: &CustomHeader) -> Self {
        HeaderEdit {
            name: h.name.as_str().to_string(),
            value: Some(h.value_text().to_string()),
            secret: h.secret,
        }
    }
}

/// The headers `edits` make of an endpoint that has `current`; an error names
/// `headers[i].name` or `headers[i].value`. Duplicates and the 8 KiB total are the config
/// loader's checks ([`validate`]).
pub fn resolve_headers(
    edits: &[HeaderEdit],
    current: &[CustomHeader],
) -> Result<Vec<CustomHeader>, FieldError> {
    edits
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let bad = |part: &str, reason: String| FieldError {
                field: format!("headers[{i}].{part}"),
                reason,
            };
            let value = match &e.value {
                Some(v) => v.clone(),
                None => {
                    let name = CustomHeader::parse_name(&e.name).map_err(|r| bad("name", r))?;
                    current
                        .iter()
                        .find(|c| c.name == name)
                        .map(|c| c.value_text().to_string())
                        .ok_or_else(|| {
                            bad(
                                "value",
                                format!("required: `{}` has no current value to keep", e.name),
                            )
                        })?
                }
            };
            CustomHeader::parse(&e.name, &value, e.secret).map_err(|(part, r)| bad(part, r))
        })
        .collect()
}

/// Checks a definition with the config file's own rules (it is run through the config loader
/// as the only `[[endpoints]]` entry of a minimal file).
pub fn validate(def: &EndpointConfig) -> Result<(), FieldError> {
    let mut ep = toml::Table::new();
    ep.insert("id".into(), def.id.clone().into());
    ep.insert("url".into(), def.url.as_str().into());
    ep.insert(
        "secrets".into(),
        toml::Value::Array(def.secrets.iter().map(|s| s.to_text().into()).collect()),
    );
    if let Some(t) = &def.tenant {
        ep.insert("tenant".into(), t.clone().into());
    }
    ep.insert(
        "event_types".into(),
        toml::Value::Array(def.event_types.iter().map(|s| s.clone().into()).collect()),
    );
    ep.insert("enabled".into(), def.enabled.into());
    if let Some(t) = def.timeout {
        ep.insert(
            "timeout".into(),
            humantime::format_duration(t).to_string().into(),
        );
    }
    if let Some(n) = def.max_concurrency {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        ep.insert("max_concurrency".into(), n.into());
    }
    let headers = def.headers.iter().map(|h| {
        let mut t = toml::Table::new();
        t.insert("name".into(), h.name.as_str().into());
        t.insert("value".into(), h.value_text().into());
        t.insert("secret".into(), h.secret.into());
        toml::Value::Table(t)
    });
    ep.insert("headers".into(), toml::Value::Array(headers.collect()));
    if let Some(f) = &def.filter {
        ep.insert("filter".into(), f.source().into());
    }
    if let Some(r) = def.rate_limit {
        ep.insert("rate_limit".into(), r.into());
    }
    if let Some(b) = def.burst {
        ep.insert("burst".into(), i64::from(b).into());
    }
    ep.insert("trace_context".into(), def.trace_context.into());
    let mut kafka = toml::Table::new();
    kafka.insert("bootstrap_servers".into(), "validation:1".into());
    let mut root = toml::Table::new();
    root.insert("kafka".into(), kafka.into());
    root.insert(
        "endpoints".into(),
        toml::Value::Array(vec![toml::Value::Table(ep)]),
    );
    let text = toml::to_string(&root).map_err(|e| FieldError {
        field: "(endpoint)".into(),
        reason: e.to_string(),
    })?;
    match Config::from_toml_with_env(&text, "endpoint", Vec::new()) {
        Ok(_) => Ok(()),
        Err(ConfigError::Field { field, reason }) => Err(FieldError {
            field: field
                .strip_prefix("endpoints[0].")
                .unwrap_or(&field)
                .to_string(),
            reason,
        }),
        Err(e) => Err(FieldError {
            field: "(endpoint)".into(),
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
#[path = "endpoint_tests.rs"]
pub(crate) mod tests;

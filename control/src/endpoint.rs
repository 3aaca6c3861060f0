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
mod tests {
    use super::*;

    const A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn def() -> EndpointConfig {
        EndpointConfig {
            id: "crm".into(),
            url: EndpointUrl::parse("https://crm.example/hook").expect("url"),
            secrets: vec![Secret::parse(A).expect("secret")],
            tenant: Some("acme".into()),
            event_types: vec!["order.*".into()],
            enabled: true,
            timeout: Some(Duration::from_millis(2500)),
            max_concurrency: Some(4),
            headers: vec![],
            filter: None,
            rate_limit: None,
            burst: None,
            trace_context: true,
        }
    }

    #[test]
    fn validation_is_the_config_files() {
        assert_eq!(validate(&def()), Ok(()));
        type Edit = Box<dyn Fn(&mut EndpointConfig)>;
        let cases: Vec<(Edit, &str)> = vec![
            // URLs and secrets cannot even be built wrong (parsed at load, `EndpointUrl`,
            // `Secret`): the API and the CLI name `url` / `secret` when parsing fails.
            (Box::new(|d| d.id = "has space".into()), "id"),
            (Box::new(|d| d.tenant = Some(String::new())), "tenant"),
            (
                Box::new(|d| d.event_types = vec![String::new()]),
                "event_types[0]",
            ),
            (
                Box::new(|d| d.timeout = Some(Duration::from_secs(600))),
                "timeout",
            ),
            (Box::new(|d| d.max_concurrency = Some(0)), "max_concurrency"),
        ];
        for (change, field) in cases {
            let mut d = def();
            change(&mut d);
            let err = validate(&d).expect_err(field);
            assert_eq!(err.field, field, "{err}");
        }
        assert!(EndpointUrl::parse("ftp://x").is_err());
        assert!(EndpointUrl::parse("https://u:p@x").is_err());
        let bad = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSX!").expect_err("bad secret");
        assert!(!bad.contains("MfKQ9r8"), "{bad}");
    }

    fn header(name: &str, value: &str, secret: bool) -> CustomHeader {
        CustomHeader::parse(name, value, secret).expect("valid header")
    }

    fn edit(name: &str, value: Option<&str>, secret: bool) -> HeaderEdit {
        HeaderEdit {
            name: name.into(),
            value: value.map(str::to_string),
            secret,
        }
    }

    #[test]
    fn headers_validate_through_the_config_loader_and_keep_secret_values_on_edit() {
        let mut d = def();
        d.headers = vec![
            header("X-A", "1", false),
            header("Authorization", "tok", true),
        ];
        assert_eq!(validate(&d), Ok(()));
        d.headers.push(header("x-a", "2", false));
        assert_eq!(validate(&d).expect_err("dup").field, "headers[2].name");
        d.headers = (0..3)
            .map(|i| header(&format!("X-{i}"), &"v".repeat(3000), false))
            .collect();
        assert_eq!(validate(&d).expect_err("8 KiB").field, "headers");

        let current = vec![header("Authorization", "Bearer old", true)];
        let kept = resolve_headers(
            &[
                edit("authorization", None, true),
                edit("X-B", Some("b"), false),
            ],
            &current,
        )
        .expect("kept");
        assert_eq!(kept[0].value_text(), "Bearer old");
        assert_eq!(kept[1].value_text(), "b");
        let err = resolve_headers(
            &[edit("X-B", Some("b"), false), edit("X-New", None, true)],
            &current,
        )
        .expect_err("nothing to keep");
        assert_eq!(err.field, "headers[1].value");
        let err = resolve_headers(&[edit("Webhook-Id", Some("x"), false)], &[]).expect_err("ours");
        let mut d = def();
        d.filter = Some(EventFilter::compile("type == 'a'").expect("filter"));
        assert_eq!(
            validate(&d),
            Ok(()),
            "the filter goes through the loader too"
        );
        assert_eq!(err.field, "headers[0].name");
        let err = resolve_headers(&[edit("X-A", Some("a\nb"), false)], &[]).expect_err("crlf");
        assert_eq!(err.field, "headers[0].value");
        assert!(!format!("{:?}", edit("A", Some("tok-9"), true)).contains("tok-9"));
    }

    #[test]
    fn secret_header_values_are_sealed_in_the_record() {
        let key = Keyring::generate_key();
        let k = Keyring::from_base64(Some(&key), &[]).expect("key");
        let e = Endpoint {
            headers: vec![
                header("X-Plain", "visible", false),
                header("Authorization", "Bearer tok-7", true),
            ],
            ..endpoint()
        };
        let r = e.to_record(&k).expect("seal");
        assert_eq!(r.schema, SCHEMA, "a process from before headers skips it");
        let bytes = String::from_utf8_lossy(&r.to_bytes()).into_owned();
        assert!(
            bytes.contains("visible") && !bytes.contains("tok-7"),
            "{bytes}"
        );
        assert_eq!(Endpoint::from_record(r.clone(), &k), e);
        let json = e.to_json(0).to_string();
        assert!(
            json.contains("visible") && !json.contains("tok-7"),
            "{json}"
        );
        let blind = Endpoint::from_record(r, &Keyring::empty());
        assert!(
            blind
                .problem
                .as_deref()
                .is_some_and(|p| p.contains("headers[1]")),
            "{blind:?}"
        );
        assert!(
            !blind.config_at(0).expect("parses").enabled,
            "never sent without it"
        );
        assert_eq!(endpoint().to_record(&k).expect("plain").schema, SCHEMA_V1);
        let filtered = Endpoint {
            filter: Some(EventFilter::compile("data.amount > 5").expect("filter")),
            ..endpoint()
        };
        let r = filtered.to_record(&k).expect("record");
        assert_eq!(
            (r.schema, r.filter.as_deref()),
            (SCHEMA, Some("data.amount > 5"))
        );
        assert_eq!(Endpoint::from_record(r.clone(), &k), filtered);
        let broken = EndpointRecord {
            filter: Some("data.amount >".into()),
            ..r
        };
        let e = Endpoint::from_record(broken, &k);
        assert!(
            e.problem
                .as_deref()
                .is_some_and(|p| p.starts_with("filter:")),
            "{e:?}"
        );
        assert!(
            !e.config_at(0).expect("parses").enabled,
            "never delivered past it"
        );
    }

    #[test]
    fn rotation_keeps_the_old_secret_for_the_grace_period() {
        let grace = Duration::from_secs(86_400);
        let one = vec![SigningSecret {
            secret: "a".into(),
            expires_at_ms: None,
        }];
        let two = rotated(&one, "b".into(), 1_000, grace);
        assert_eq!(two[0].expires_at_ms, None);
        assert_eq!(two[1].expires_at_ms, Some(1_000 + 86_400_000));
        let e = Endpoint {
            secrets: two.clone(),
            ..endpoint()
        };
        assert_eq!(e.signing_secrets_at(2_000), ["b", "a"]);
        assert_eq!(e.signing_secrets_at(1_000 + 86_400_000), ["b"]);
        // Rotating again within the grace keeps the earlier expiry; expired ones are dropped.
        let three = rotated(&two, "c".into(), 5_000, grace);
        let got: Vec<(&str, Option<i64>)> = three
            .iter()
            .map(|s| (s.secret.as_str(), s.expires_at_ms))
            .collect();
        assert_eq!(
            got,
            [
                ("c", None),
                ("b", Some(5_000 + 86_400_000)),
                ("a", Some(1_000 + 86_400_000))
            ]
        );
        let later = rotated(&three, "d".into(), 1_000 + 86_400_000, grace);
        assert_eq!(later.len(), 3, "a expired: {later:?}");
    }

    fn endpoint() -> Endpoint {
        Endpoint {
            id: "crm".into(),
            url: "https://crm.example/hook".into(),
            tenant: None,
            event_types: vec![],
            enabled: true,
            timeout: None,
            max_concurrency: None,
            headers: vec![],
            filter: None,
            rate_limit: None,
            burst: None,
            trace_context: true,
            secrets: vec![],
            managed_by: ManagedBy::Api,
            disabled_reason: None,
            failing_since_ms: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            version: 1,
            problem: None,
            needs_reencryption: false,
        }
    }

    #[test]
    fn trace_context_is_stored_only_when_off() {
        let k = Keyring::empty();
        let on = endpoint();
        let r = on.to_record(&k).expect("record");
        assert_eq!((r.trace_context, r.schema), (None, SCHEMA_V1));
        let v: Value = serde_json::from_slice(&r.to_bytes()).expect("json");
        assert!(
            v.get("trace_context").is_none(),
            "a default record is unchanged: {v}"
        );
        assert!(Endpoint::from_record(r, &k).trace_context);
        assert_eq!(on.to_json(0)["trace_context"], true);

        let off = Endpoint {
            trace_context: false,
            ..endpoint()
        };
        let bytes = off.to_record(&k).expect("record").to_bytes();
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["trace_context"], false);
        let back = EndpointRecord::parse("crm", &bytes).expect("parses");
        assert_eq!(back.trace_context, Some(false));
        assert_eq!(Endpoint::from_record(back, &k), off);
        assert!(!off.config_at(0).expect("parses").trace_context);
        assert!(!off.definition().expect("parses").trace_context);
        assert_eq!(off.to_json(0)["trace_context"], false);

        let d = EndpointConfig {
            trace_context: false,
            ..def()
        };
        assert_eq!(validate(&d), Ok(()));
        let made = Endpoint::from_definition(&d, ManagedBy::Api, None, 0);
        assert!(!made.trace_context);

        // A record from before the field: on.
        let old = br#"{"schema":1,"id":"crm","url":"https://crm.example/hook","enabled":true,
            "managed_by":"api","created_at_ms":0,"updated_at_ms":0,"version":1}"#;
        let r = EndpointRecord::parse("crm", old).expect("parses");
        assert!(Endpoint::from_record(r, &k).trace_context);
    }

    #[test]
    fn records_round_trip_and_unopenable_secrets_disable() {
        let key = Keyring::generate_key();
        let k = Keyring::from_base64(Some(&key), &[]).expect("key");
        let e = Endpoint {
            secrets: vec![SigningSecret {
                secret: A.into(),
                expires_at_ms: None,
            }],
            ..endpoint()
        };
        let r = e.to_record(&k).expect("seal");
        assert!(!String::from_utf8_lossy(&r.to_bytes()).contains("MfKQ9r8"));
        assert_eq!(Endpoint::from_record(r.clone(), &k), e);
        let blind = Endpoint::from_record(r, &Keyring::empty());
        assert!(blind
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("secrets[0]")));
        assert!(
            !blind.config_at(0).expect("parses").enabled,
            "never sent unsigned"
        );
        assert!(!format!("{:?}", e).contains("MfKQ9r8"));
        assert!(generate_secret().starts_with("whsec_"));
        assert_eq!(
            hookline_common::contract::secret::decode_secret(&generate_secret()).map(|b| b.len()),
            Ok(32)
        );
    }
}

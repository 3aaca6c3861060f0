//! The registry's operations — what the admin API and `hookline endpoints` call: create, update,
//! enable/disable, delete, rotate a secret, re-encrypt. Each takes an optional expected version
//! (optimistic concurrency: a mismatch is a [`WriteError::Conflict`], HTTP 409) and refuses to
//! touch a file-managed endpoint ([`WriteError::FileManaged`]): the config file owns those.

use std::time::Duration;

use hookline_common::config::filter::EventFilter;
use hookline_common::config::EndpointConfig;

use crate::crypto::CryptoError;
use crate::endpoint::{resolve_headers, rotated, validate, Endpoint, FieldError, HeaderEdit};
use crate::operational::{self as events, OperationalEvent};
use crate::record::ManagedBy;
use crate::registry::Registry;
use crate::writer::Change;

/// Why a registry operation did nothing. [`WriteError::http_status`] maps it for the API.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("endpoint `{id}` does not exist")]
    NotFound { id: String },
    #[error("endpoint `{id}` already exists")]
    AlreadyExists { id: String },
    #[error(
        "endpoint `{id}` is at version {actual}, not the expected {expected}: it changed since \
         it was read; read it again"
    )]
    Conflict {
        id: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "endpoint `{id}` is managed by the config file ([[endpoints]]): change it there and \
         restart, or remove it from the file to manage it through the API"
    )]
    FileManaged { id: String },
    #[error("invalid endpoint: {0}")]
    Invalid(FieldError),
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error("the endpoint registry could not be written: {0:#}")]
    Kafka(anyhow::Error),
}

impl From<anyhow::Error> for WriteError {
    fn from(e: anyhow::Error) -> Self {
        WriteError::Kafka(e)
    }
}

impl WriteError {
    /// The HTTP status the admin API answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            WriteError::NotFound { .. } => 404,
            WriteError::AlreadyExists { .. }
            | WriteError::Conflict { .. }
            | WriteError::FileManaged { .. } => 409,
            WriteError::Invalid(_) => 400,
            WriteError::Crypto(CryptoError::NoKey | CryptoError::BadKey { .. }) => 500,
            WriteError::Crypto(_) => 500,
            WriteError::Kafka(_) => 503,
        }
    }
}

/// A partial change of an endpoint's definition (`None`: unchanged). Secrets change only
/// through [`Registry::rotate_secret`]; `enabled` through [`Registry::set_enabled`].
#[derive(Debug, Clone, Default)]
pub struct EndpointUpdate {
    pub url: Option<String>,
    pub tenant: Option<Option<String>>,
    pub event_types: Option<Vec<String>>,
    pub timeout: Option<Option<Duration>>,
    pub max_concurrency: Option<Option<usize>>,
    /// The whole list of custom headers (a header without a value keeps its current one).
    pub headers: Option<Vec<HeaderEdit>>,
    /// The CEL filter (`Some(None)` removes it).
    pub filter: Option<Option<String>>,
    /// Deliveries per second (`Some(None)` removes the limit, and the burst with it).
    pub rate_limit: Option<Option<f64>>,
    pub burst: Option<Option<u32>>,
    /// Whether requests carry `traceparent` while tracing is on.
    pub trace_context: Option<bool>,
}

impl EndpointUpdate {
    /// Whether it changes anything.
    pub fn is_empty(&self) -> bool {
        self.url.is_none()
            && self.tenant.is_none()
            && self.event_types.is_none()
            && self.timeout.is_none()
            && self.max_concurrency.is_none()
            && self.headers.is_none()
            && self.filter.is_none()
            && self.rate_limit.is_none()
            && self.burst.is_none()
            && self.trace_context.is_none()
    }
}

/// The existing endpoint, checked against the expected version and ownership.
fn editable<'a>(
    id: &str,
    current: Option<&'a Endpoint>,
    expected: Option<u64>,
) -> Result<&'a Endpoint, WriteError> {
    let e = current.ok_or_else(|| WriteError::NotFound { id: id.into() })?;
    if e.managed_by == ManagedBy::File {
        return Err(WriteError::FileManaged { id: id.into() });
    }
    if let Some(expected) = expected {
        if expected != e.version {
            return Err(WriteError::Conflict {
                id: id.into(),
                expected,
                actual: e.version,
            });
        }
    }
    Ok(e)
}

/// `e` changed at `now`: next version, new update time.
fn bumped(mut e: Endpoint, now: i64) -> Endpoint {
    e.version += 1;
    e.updated_at_ms = now;
    e
}

/// The `<p>.operational` event of a change by a person or a tool (`kind` from
/// [`crate::operational`]), for `e` as it is after the change.
pub(crate) fn change_event(
    config: &hookline_common::config::Config,
    kind: &str,
    e: &Endpoint,
    now: i64,
    reason: &str,
) -> OperationalEvent {
    OperationalEvent {
        kind: kind.into(),
        endpoint_id: e.id.clone(),
        url: Some(e.url.clone()),
        tenant: e.tenant.clone(),
        reason: reason.into(),
        at_ms: now,
        failing_since_ms: None,
        consecutive_failures: 0,
        last_error: None,
        instance: crate::operational::instance_name(config),
        version: Some(e.version),
    }
}

fn check(def: &EndpointConfig) -> Result<(), WriteError> {
    validate(def).map_err(WriteError::Invalid)
}

impl Registry {
    /// Creates an API-managed endpoint (secrets as given; empty = requests unsigned).
    pub async fn create(&self, def: EndpointConfig) -> Result<Endpoint, WriteError> {
        let config = &self.inner.config;
        check(&def)?;
        self.require_key(&def)?;
        let id = def.id.clone();
        let op = self
            .write(&id, |current, now| {
                if current.is_some() {
                    return Err(WriteError::AlreadyExists { id: id.clone() });
                }
                let e = Endpoint::from_definition(&def, ManagedBy::Api, None, now);
                let event = change_event(config, events::CREATED, &e, now, "created");
                Ok((Change::Put(Box::new(e)), Some(event)))
            })
            .await;
        self.counted("create", op)
    }

    /// Changes the given fields of an API-managed endpoint.
    pub async fn update(
        &self,
        id: &str,
        change: EndpointUpdate,
        expected: Option<u64>,
    ) -> Result<Endpoint, WriteError> {
        let config = &self.inner.config;
        let op = self
            .write(id, |current, now| {
                let e = editable(id, current, expected)?;
                let mut next = e.clone();
                if let Some(url) = &change.url {
                    next.url = url.clone();
                }
                if let Some(t) = &change.tenant {
                    next.tenant = t.clone();
                }
                if let Some(t) = &change.event_types {
                    next.event_types = t.clone();
                }
                if let Some(t) = change.timeout {
                    next.timeout = t;
                }
                if let Some(m) = change.max_concurrency {
                    next.max_concurrency = m;
                }
                if let Some(h) = &change.headers {
                    next.headers = resolve_headers(h, &e.headers).map_err(WriteError::Invalid)?;
                }
                if let Some(r) = change.rate_limit {
                    next.rate_limit = r;
                    if r.is_none() {
                        next.burst = None;
                    }
                }
                if let Some(b) = change.burst {
                    next.burst = b;
                }
                if let Some(t) = change.trace_context {
                    next.trace_context = t;
                }
                if let Some(f) = &change.filter {
                    next.filter =
                        f.as_deref()
                            .map(EventFilter::compile)
                            .transpose()
                            .map_err(|reason| {
                                WriteError::Invalid(FieldError {
                                    field: "filter".into(),
                                    reason,
                                })
                            })?;
                }
                let def = next.definition().ok_or_else(|| {
                    WriteError::Invalid(FieldError {
                        field: "url".into(),
                        reason: hookline_common::config::EndpointUrl::parse(&next.url)
                            .err()
                            .unwrap_or_default(),
                    })
                })?;
                check(&def)?;
                if next == *e {
                    return Ok((Change::Nothing, None));
                }
                let next = bumped(next, now);
                let event = change_event(config, events::UPDATED, &next, now, "definition changed");
                Ok((Change::Put(Box::new(next)), Some(event)))
            })
            .await;
        self.counted("update", op)
    }

    /// Creates the endpoint, or replaces its definition (`url`, `tenant`, `event_types`,
    /// `enabled`, `timeout`, `max_concurrency`, `headers`, `filter`, `rate_limit`, `burst`,
    /// `trace_context`; secrets are kept — they change through
    /// [`Registry::rotate_secret`]): the admin API's `PUT`. `expected` applies to an existing one.
    pub async fn put(
        &self,
        def: EndpointConfig,
        expected: Option<u64>,
    ) -> Result<Endpoint, WriteError> {
        check(&def)?;
        if self.get(&def.id).is_none() && expected.is_none_or(|v| v == 0) {
            match self.create(def.clone()).await {
                Err(WriteError::AlreadyExists { .. }) => {}
                other => return other,
            }
        }
        let change = EndpointUpdate {
            url: Some(def.url.as_str().to_string()),
            tenant: Some(def.tenant.clone()),
            event_types: Some(def.event_types.clone()),
            timeout: Some(def.timeout),
            max_concurrency: Some(def.max_concurrency),
            headers: Some(def.headers.iter().map(HeaderEdit::from).collect()),
            filter: Some(def.filter.as_ref().map(|f| f.source().to_string())),
            rate_limit: Some(def.rate_limit),
            burst: Some(def.burst),
            trace_context: Some(def.trace_context),
        };
        let updated = self.update(&def.id, change, expected).await?;
        if updated.enabled == def.enabled {
            return Ok(updated);
        }
        self.set_enabled(&def.id, def.enabled, Some(updated.version))
            .await
    }

    /// Enables or disables an API-managed endpoint (a no-op if it already is).
    pub async fn set_enabled(
        &self,
        id: &str,
        enabled: bool,
        expected: Option<u64>,
    ) -> Result<Endpoint, WriteError> {
        let config = &self.inner.config;
        let op = self
            .write(id, |current, now| {
                let e = editable(id, current, expected)?;
                if e.enabled == enabled {
                    return Ok((Change::Nothing, None));
                }
                let mut next = e.clone();
                next.enabled = enabled;
                next.disabled_reason = (!enabled).then(|| "manual".to_string());
                let next = bumped(next, now);
                let kind = if enabled {
                    events::ENABLED
                } else {
                    events::DISABLED
                };
                let event = change_event(config, kind, &next, now, "manual");
                Ok((Change::Put(Box::new(next)), Some(event)))
            })
            .await;
        self.counted(if enabled { "enable" } else { "disable" }, op)
    }

    /// Deletes an API-managed endpoint (a tombstone). Retries of its queued deliveries end in
    /// the DLQ as `endpoint_removed`.
    pub async fn delete(&self, id: &str, expected: Option<u64>) -> Result<(), WriteError> {
        let op = self
            .write(id, |current, now| {
                let e = editable(id, current, expected)?;
                let event = change_event(&self.inner.config, events::DELETED, e, now, "deleted");
                Ok((Change::Delete, Some(event)))
            })
            .await;
        self.count("delete", op).map(|_| ())
    }

    /// Rotates in `new` (or a generated secret): the previous ones keep signing for `grace`
    /// (default `control.secret_rotation_grace`). Returns the endpoint; its first secret is the
    /// new one.
    pub async fn rotate_secret(
        &self,
        id: &str,
        new: Option<String>,
        grace: Option<Duration>,
        expected: Option<u64>,
    ) -> Result<Endpoint, WriteError> {
        if self.keyring().current_id().is_none() {
            return Err(CryptoError::NoKey.into());
        }
        let grace = grace.unwrap_or(self.inner.config.control.secret_rotation_grace);
        let new = new.unwrap_or_else(crate::endpoint::generate_secret);
        if let Err(reason) = hookline_common::contract::secret::decode_secret(&new) {
            return Err(WriteError::Invalid(FieldError {
                field: "secret".into(),
                reason,
            }));
        }
        let op = self
            .write(id, |current, now| {
                let e = editable(id, current, expected)?;
                let mut next = e.clone();
                next.secrets = rotated(&e.secrets, new.clone(), now, grace);
                let next = bumped(next, now);
                let event = change_event(
                    &self.inner.config,
                    events::UPDATED,
                    &next,
                    now,
                    "secret rotated",
                );
                Ok((Change::Put(Box::new(next)), Some(event)))
            })
            .await;
        self.counted("rotate_secret", op)
    }

    /// Re-seals the secrets of every endpoint still sealed with an old key (file-managed ones
    /// too: their definition does not change). Returns the ids rewritten.
    pub async fn reencrypt(&self) -> Result<Vec<String>, WriteError> {
        if self.keyring().current_id().is_none() {
            return Err(CryptoError::NoKey.into());
        }
        let stale: Vec<String> = self
            .current()
            .iter()
            .filter(|e| e.needs_reencryption && e.problem.is_none())
            .map(|e| e.id.clone())
            .collect();
        let mut done = Vec::new();
        for id in stale {
            let op = self
                .write(&id, |current, now| match current {
                    Some(e) if e.needs_reencryption && e.problem.is_none() => {
                        Ok((Change::Put(Box::new(bumped(e.clone(), now))), None))
                    }
                    _ => Ok((Change::Nothing, None)),
                })
                .await;
            self.count("reencrypt", op)?;
            done.push(id);
        }
        Ok(done)
    }

    /// Disables an API-managed endpoint seen at `version` that has failed without interruption,
    /// announcing it on `<p>.operational` in the same transaction. `Ok(false)`: nothing done
    /// (another process did it, or it changed since).
    pub async fn auto_disable(
        &self,
        id: &str,
        version: u64,
        event: OperationalEvent,
    ) -> Result<bool, WriteError> {
        let mut wrote = false;
        let op = self
            .write(id, |current, now| {
                wrote = false;
                let Some(e) = current else {
                    return Ok((Change::Nothing, None));
                };
                if !e.enabled || e.version != version || e.managed_by == ManagedBy::File {
                    return Ok((Change::Nothing, None));
                }
                let mut next = e.clone();
                next.enabled = false;
                next.disabled_reason = Some(event.reason.clone());
                wrote = true;
                Ok((
                    Change::Put(Box::new(bumped(next, now))),
                    Some(event.clone()),
                ))
            })
            .await;
        self.count("auto_disable", op)?;
        Ok(wrote)
    }

    /// Marks an endpoint failing since `since` (`Some`) or recovered (`None`), announcing it on
    /// `<p>.operational` in the same transaction (`event`). `Ok(false)`: nothing done — the mark
    /// is already so (another process wrote it), or the endpoint is gone. Any endpoint, file-
    /// managed ones too: the mark is health, not definition (seeding keeps it).
    pub async fn mark_failing(
        &self,
        id: &str,
        since: Option<i64>,
        event: OperationalEvent,
    ) -> Result<bool, WriteError> {
        let mut wrote = false;
        let op = self
            .write(id, |current, now| {
                wrote = false;
                let Some(e) = current else {
                    return Ok((Change::Nothing, None));
                };
                if e.failing_since_ms.is_some() == since.is_some() {
                    return Ok((Change::Nothing, None));
                }
                let mut next = bumped(e.clone(), now);
                next.failing_since_ms = since;
                let mut event = event.clone();
                event.version = Some(next.version);
                wrote = true;
                Ok((Change::Put(Box::new(next)), Some(event)))
            })
            .await;
        self.count(
            if since.is_some() {
                "mark_failing"
            } else {
                "mark_recovered"
            },
            op,
        )?;
        Ok(wrote)
    }

    pub(crate) fn require_key(&self, def: &EndpointConfig) -> Result<(), WriteError> {
        let sealed = !def.secrets.is_empty() || def.headers.iter().any(|h| h.secret);
        if sealed && self.keyring().current_id().is_none() {
            return Err(CryptoError::NoKey.into());
        }
        Ok(())
    }

    pub(crate) fn count<T>(
        &self,
        op: &'static str,
        result: Result<T, WriteError>,
    ) -> Result<T, WriteError> {
        let outcome = match &result {
            Ok(_) => "ok",
            Err(WriteError::Conflict { .. } | WriteError::AlreadyExists { .. }) => "conflict",
            Err(WriteError::NotFound { .. }) => "not_found",
            Err(WriteError::FileManaged { .. }) => "file_managed",
            Err(WriteError::Invalid(_)) => "invalid",
            Err(_) => "error",
        };
        self.inner.metrics.write(op, outcome);
        result
    }

    /// [`Registry::count`] for operations that leave the endpoint in place.
    fn counted(
        &self,
        op: &'static str,
        result: Result<Option<Endpoint>, WriteError>,
    ) -> Result<Endpoint, WriteError> {
        self.count(op, result)?.ok_or_else(|| {
            WriteError::Kafka(anyhow::anyhow!("the endpoint vanished during the write"))
        })
    }
}

//! Many endpoints in one write: the input shape every create takes (the admin API's `POST
//! /v1/endpoints` body, a line of `hookline endpoints import`, an item of `POST
//! /v1/endpoints:batch`), and [`Registry::import`], which puts a whole list in one registry
//! transaction — all of it or nothing — and is idempotent: an endpoint already as asked is left
//! as it is.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use hookline_common::config::filter::EventFilter;
use hookline_common::config::{EndpointConfig, EndpointUrl, Secret};

use crate::endpoint::{
    generate_secret, resolve_headers, validate, Endpoint, FieldError, HeaderEdit,
};
use crate::operational as events;
use crate::ops::{change_event, WriteError};
use crate::record::ManagedBy;
use crate::registry::Registry;
use crate::writer::Change;

/// Most endpoints one `POST /v1/endpoints:batch` takes (an import file has no limit: it is
/// written in one transaction, whatever its size).
pub const MAX_BATCH: usize = 1000;

/// An endpoint as a create takes it (JSON; unknown fields are refused).
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointInput {
    /// 1–64 of `[A-Za-z0-9._-]`.
    pub id: String,
    /// `https://…` (plain `http` only for ranges in `http.allow_cidrs`).
    pub url: String,
    /// Only this tenant's events (a tenant token: its own, the default); absent: every tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Event-type globs; empty: every type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_types: Vec<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Per-attempt timeout, e.g. `5s` (default `http.timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
    /// A `whsec_…` secret; absent: one is generated (and returned once) for a new endpoint,
    /// an existing one keeps its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Headers sent with every request (not covered by the signature).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderInput>,
    /// A CEL expression over the event (`id`, `type`, `tenant`, `data`): only events it holds
    /// for are delivered, e.g. `data.amount > 100 && data.region.startsWith('eu-')`. At most
    /// 4 KiB; a bad one is refused naming `filter` and the position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// At most this many deliveries per second to the endpoint, for the whole cluster
    /// (0.01–100000); deliveries over it wait, in arrival order, without using an attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<f64>,
    /// Deliveries that may go out at once after an idle spell (default 1); needs `rate_limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Send `traceparent` (the attempt's span) on requests to this endpoint while tracing is
    /// on (default true); `false` keeps hookline's trace ids from this receiver.
    #[serde(default = "yes")]
    pub trace_context: bool,
}

/// A custom header. Refused (naming `headers[i].name` / `.value` / `headers`): names
/// `webhook-*`, `content-*`, `host`, hop-by-hop headers, a name given twice, CR/LF in a value,
/// more than 8 KiB in all.
#[derive(Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderInput {
    pub name: String,
    /// Required on create. On update, absent keeps the endpoint's current value of this
    /// header (how a secret value, never shown again, is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Seal the value at rest and never show it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
}

impl std::fmt::Debug for HeaderInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        HeaderEdit::from(self.clone()).fmt(f)
    }
}

impl From<HeaderInput> for HeaderEdit {
    fn from(h: HeaderInput) -> Self {
        HeaderEdit {
            name: h.name,
            value: h.value,
            secret: h.secret,
        }
    }
}

const fn yes() -> bool {
    true
}

fn field(field: &str, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// What a create asked for, checked: the definition, and whether its secret was generated
/// (absent in the input).
#[derive(Clone)]
pub struct Definition {
    pub def: EndpointConfig,
    /// The input gave no secret: a new endpoint gets `generated`, an existing one keeps its own.
    pub generated: Option<String>,
}

impl EndpointInput {
    /// The definition, every field checked (the first bad one named, as the API names it).
    pub fn definition(self) -> Result<Definition, FieldError> {
        let timeout = self
            .timeout
            .as_deref()
            .map(|t| {
                humantime::parse_duration(t)
                    .map_err(|e| field("timeout", format!("`{t}` is not a duration: {e}")))
            })
            .transpose()?;
        let generated = self.secret.is_none().then(generate_secret);
        let secret = self.secret.or_else(|| generated.clone());
        let url = EndpointUrl::parse(&self.url).map_err(|e| field("url", e))?;
        let secrets = secret
            .iter()
            .map(|s| Secret::parse(s))
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| field("secret", e))?;
        let edits: Vec<HeaderEdit> = self.headers.into_iter().map(HeaderEdit::from).collect();
        let headers = resolve_headers(&edits, &[])?;
        let filter = self
            .filter
            .as_deref()
            .map(EventFilter::compile)
            .transpose()
            .map_err(|e| field("filter", e))?;
        let def = EndpointConfig {
            id: self.id,
            url,
            secrets,
            tenant: self.tenant,
            event_types: self.event_types,
            enabled: self.enabled,
            timeout,
            max_concurrency: self.max_concurrency,
            headers,
            filter,
            rate_limit: self.rate_limit,
            burst: self.burst,
            trace_context: self.trace_context,
        };
        validate(&def)?;
        Ok(Definition { def, generated })
    }

    /// The input that makes `e` (with its newest secret and secret header values when
    /// `with_secrets`; otherwise without them, so an import keeps the target's own).
    pub fn of(e: &Endpoint, with_secrets: bool) -> EndpointInput {
        EndpointInput {
            id: e.id.clone(),
            url: e.url.clone(),
            tenant: e.tenant.clone(),
            event_types: e.event_types.clone(),
            enabled: e.enabled,
            timeout: e.timeout.map(|t| humantime::format_duration(t).to_string()),
            max_concurrency: e.max_concurrency,
            secret: with_secrets
                .then(|| e.secrets.first().map(|s| s.secret.clone()))
                .flatten(),
            headers: e
                .headers
                .iter()
                .map(|h| HeaderInput {
                    name: h.name.to_string(),
                    value: (with_secrets || !h.secret)
                        .then(|| String::from_utf8_lossy(h.value.as_bytes()).into_owned()),
                    secret: h.secret,
                })
                .collect(),
            filter: e.filter.as_ref().map(|f| f.source().to_string()),
            rate_limit: e.rate_limit,
            burst: e.burst,
            trace_context: e.trace_context,
        }
    }
}

/// What an import did to one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Created,
    Updated,
    Unchanged,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Updated => "updated",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// One endpoint of an import, after it.
#[derive(Debug, Clone)]
pub struct Imported {
    pub outcome: Outcome,
    pub endpoint: Endpoint,
    /// The secret generated for a new endpoint (shown once).
    pub secret: Option<String>,
}

/// `current` after putting `d` into it: `None` if it already is that (API-managed; a
/// definition without a secret keeps the endpoint's own).
fn imported(d: &Definition, current: &Endpoint, now: i64) -> Option<Endpoint> {
    let mut def = d.def.clone();
    let keep_secrets = d.generated.is_some()
        || current
            .secrets
            .iter()
            .map(|s| s.secret.clone())
            .eq(def.secrets.iter().map(|s| s.to_text()));
    if keep_secrets {
        def.secrets.clear();
    }
    let mut next = Endpoint::from_definition(&def, ManagedBy::Api, Some(current), now);
    if keep_secrets {
        next.secrets = current.secrets.clone();
    }
    if next.enabled == current.enabled {
        next.disabled_reason = current.disabled_reason.clone();
    }
    let same = Endpoint {
        version: current.version,
        updated_at_ms: current.updated_at_ms,
        problem: current.problem.clone(),
        needs_reencryption: current.needs_reencryption,
        ..next.clone()
    } == *current;
    (!same).then_some(next)
}

impl Registry {
    /// Puts every definition in one transaction: a new id is created, an API-managed one
    /// changed to the definition (its secrets kept unless the definition gives others), one
    /// already so left alone. A file-managed id, or an id given twice, refuses the whole list;
    /// nothing is written then.
    pub async fn import(&self, defs: Vec<Definition>) -> Result<Vec<Imported>, WriteError> {
        let config = &self.inner.config;
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, d) in defs.iter().enumerate() {
            if let Some(first) = seen.insert(&d.def.id, i) {
                return Err(WriteError::Invalid(field(
                    "id",
                    format!("`{}` is given twice (items {first} and {i})", d.def.id),
                )));
            }
            self.require_key(&d.def)?;
        }
        let ids: Vec<String> = defs.iter().map(|d| d.def.id.clone()).collect();
        let mut outcomes = vec![Outcome::Unchanged; defs.len()];
        let written = self
            .write_many(&ids, |view, now| {
                let mut changes = Vec::new();
                let mut evs = Vec::new();
                for (i, d) in defs.iter().enumerate() {
                    let id = &d.def.id;
                    match view(id) {
                        None => {
                            let e = Endpoint::from_definition(&d.def, ManagedBy::Api, None, now);
                            evs.push(change_event(config, events::CREATED, &e, now, "created"));
                            changes.push((id.clone(), Change::Put(Box::new(e))));
                            outcomes[i] = Outcome::Created;
                        }
                        Some(c) if c.managed_by == ManagedBy::File => {
                            return Err(WriteError::FileManaged { id: id.clone() });
                        }
                        Some(c) => match imported(d, c, now) {
                            None => outcomes[i] = Outcome::Unchanged,
                            Some(next) => {
                                let kind = match (c.enabled, next.enabled) {
                                    (true, false) => events::DISABLED,
                                    (false, true) => events::ENABLED,
                                    _ => events::UPDATED,
                                };
                                evs.push(change_event(config, kind, &next, now, "imported"));
                                changes.push((id.clone(), Change::Put(Box::new(next))));
                                outcomes[i] = Outcome::Updated;
                            }
                        },
                    }
                }
                Ok((changes, evs))
            })
            .await;
        let written = self.count("import", written)?;
        defs.iter()
            .zip(written)
            .zip(outcomes)
            .map(|((d, e), outcome)| {
                let endpoint = e.ok_or_else(|| {
                    WriteError::Kafka(anyhow::anyhow!(
                        "endpoint `{}` vanished during the import",
                        d.def.id
                    ))
                })?;
                Ok(Imported {
                    outcome,
                    secret: (outcome == Outcome::Created)
                        .then(|| d.generated.clone())
                        .flatten(),
                    endpoint,
                })
            })
            .collect()
    }
}

/// The definitions of a JSON-lines file (one [`EndpointInput`] per line; blank lines and lines
/// starting with `#` skipped). The first bad line is the error, naming its number and field.
pub fn parse_lines(text: &str) -> Result<Vec<Definition>, String> {
    let mut defs = Vec::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let input: EndpointInput =
            serde_json::from_str(line).map_err(|e| format!("line {n}: {e}"))?;
        let d = input
            .definition()
            .map_err(|e| format!("line {n}: field `{}`: {}", e.field, e.reason))?;
        if let Some(first) = first_line.insert(d.def.id.clone(), n) {
            return Err(format!(
                "line {n}: field `id`: `{}` is on line {first} already",
                d.def.id
            ));
        }
        defs.push(d);
    }
    Ok(defs)
}

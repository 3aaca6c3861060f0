//! Seeding the registry from the config file's `[[endpoints]]`, so the file and the topic never
//! silently disagree. The rule (docs/control-plane.md):
//!
//! - Every endpoint in the file is **file-managed**: at start, a seeding process writes it to
//!   `<p>.endpoints` unless the topic already holds exactly that definition as file-managed —
//!   whatever the topic had (an API-made endpoint with the same id is taken over; a file-managed
//!   one is overwritten with the file's definition, secrets and `enabled` included).
//! - A file-managed endpoint on the topic that the file no longer lists is deleted (tombstone).
//! - The API and the CLI refuse to change file-managed endpoints ([`crate::ops::WriteError::FileManaged`]).
//! - Endpoints created through the API are never touched by seeding (unless the file takes their id).
//!
//! - A file-managed endpoint's **secrets stay in the file**: its record carries none, every
//!   process signs with the secrets of its own config file (no key needed for them).
//!
//! Every seeding process runs with the same file (one ConfigMap), so they all write the same
//! thing; the transactional writer makes concurrent starts write it once. During a rolling
//! update the last process to start wins, i.e. the new file once the rollout is done.

use hookline_common::config::EndpointConfig;

use crate::endpoint::{validate, Endpoint};
use crate::ops::WriteError;
use crate::record::ManagedBy;
use crate::registry::Registry;
use crate::writer::Change;

/// Whether `e` is exactly the file's definition `d`, file-managed. Secrets and headers are not
/// compared: a file-managed endpoint's never go to the topic, every process takes them from its
/// own config file.
fn same(e: &Endpoint, d: &EndpointConfig) -> bool {
    e.managed_by == ManagedBy::File
        && e.problem.is_none()
        && e.url == d.url.as_str()
        && e.tenant == d.tenant
        && e.event_types == d.event_types
        && e.enabled == d.enabled
        && e.timeout == d.timeout
        && e.max_concurrency == d.max_concurrency
        && e.filter == d.filter
        && e.rate_limit == d.rate_limit
        && e.burst == d.burst
        && e.trace_context == d.trace_context
}

/// The file's endpoint as the registry holds it, replacing `current` (if any) at `now`.
fn from_file(d: &EndpointConfig, current: Option<&Endpoint>, now: i64) -> Endpoint {
    Endpoint::from_definition(d, ManagedBy::File, current, now)
}

/// Writes the file's endpoints where the topic differs; deletes file-managed endpoints the file
/// dropped. Returns the ids written or deleted.
pub async fn seed(registry: &Registry, file: &[EndpointConfig]) -> Result<Vec<String>, WriteError> {
    let mut changed = Vec::new();
    for d in file {
        validate(d).map_err(WriteError::Invalid)?;
        if registry.get(&d.id).is_some_and(|e| same(&e, d)) {
            continue;
        }
        let mut wrote = false;
        registry
            .write(&d.id, |current, now| {
                wrote = false;
                if current.is_some_and(|e| same(e, d)) {
                    return Ok::<_, WriteError>((Change::Nothing, None));
                }
                wrote = true;
                Ok((Change::Put(Box::new(from_file(d, current, now))), None))
            })
            .await?;
        if wrote {
            tracing::info!(endpoint = %d.id, "seeded endpoint from the config file");
            changed.push(d.id.clone());
        }
    }
    let dropped: Vec<String> = registry
        .current()
        .iter()
        .filter(|e| e.managed_by == ManagedBy::File && !file.iter().any(|d| d.id == e.id))
        .map(|e| e.id.clone())
        .collect();
    for id in dropped {
        registry
            .write(&id, |current, _| match current {
                Some(e) if e.managed_by == ManagedBy::File => {
                    Ok::<_, WriteError>((Change::Delete, None))
                }
                _ => Ok((Change::Nothing, None)),
            })
            .await?;
        tracing::info!(endpoint = %id, "deleted file-managed endpoint no longer in the config file");
        changed.push(id);
    }
    Ok(changed)
}

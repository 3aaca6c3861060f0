//! Operational events on `<p>.operational` (key = endpoint id, value = JSON): what happened to
//! endpoints, each written in the same transaction as the registry change itself, so an event
//! exists exactly when its change happened — once, whichever pod made it (the registry writer's
//! fencing lets one writer commit). Kinds: `endpoint.created`, `endpoint.updated` (a changed
//! definition, a rotated secret), `endpoint.disabled` / `endpoint.enabled` (by a person),
//! `endpoint.deleted`, `endpoint_auto_disabled` (after a period of uninterrupted failure),
//! `endpoint.failing` / `endpoint.recovered` (the health tracker's marks, see
//! [`crate::tracker`]). A secrets-key re-encryption changes nothing an operator sees and writes
//! none; nor does seeding the config file's endpoints (the file is the record of those).
//!
//! [`crate::relay`] turns each into an operational webhook (`hookline.endpoint.*`).

use serde::{Deserialize, Serialize};

/// One operational event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationalEvent {
    /// One of the kinds below.
    pub kind: String,
    pub endpoint_id: String,
    /// The endpoint's URL after the change (its last one for a delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    /// A sentence for people (also the endpoint's `disabled_reason`).
    pub reason: String,
    pub at_ms: i64,
    /// When the failure streak began, and how many attempts it holds.
    #[serde(default)]
    pub failing_since_ms: Option<i64>,
    #[serde(default)]
    pub consecutive_failures: u64,
    #[serde(default)]
    pub last_error: Option<String>,
    /// The process that decided it.
    pub instance: String,
    /// The endpoint's registry version after the change (its last one for a delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// `kind` of an automatic disable.
pub const AUTO_DISABLED: &str = "endpoint_auto_disabled";
/// `kind`s of the registry's own changes.
pub const CREATED: &str = "endpoint.created";
pub const UPDATED: &str = "endpoint.updated";
pub const DISABLED: &str = "endpoint.disabled";
pub const ENABLED: &str = "endpoint.enabled";
pub const DELETED: &str = "endpoint.deleted";
/// `kind`s of the health tracker's marks.
pub const FAILING: &str = "endpoint.failing";
pub const RECOVERED: &str = "endpoint.recovered";

impl OperationalEvent {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| unreachable!("plain data serializes"))
    }
}

/// This process's name in records it writes: `kafka.instance_id`, else the host name.
pub fn instance_name(config: &hookline_common::config::Config) -> String {
    if let Some(id) = &config.kafka.instance_id {
        return id.clone();
    }
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

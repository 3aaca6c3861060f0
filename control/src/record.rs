//! The record contract of `<p>.endpoints`: key = endpoint id (UTF-8), value = one JSON
//! [`EndpointRecord`], a tombstone (no value) deletes. The definition fields are the config
//! file's `[[endpoints]]` fields with the same names and meaning (`id`, `url`, `tenant`,
//! `event_types`, `enabled`, `timeout`, `max_concurrency`); `secrets` are sealed
//! ([`crate::crypto`]) and may expire (rotation); `headers` carry their value in the clear or,
//! for a secret one, `sealed` like a secret; `filter` is the CEL expression as written; the rest
//! is bookkeeping.
//!
//! ```json
//! {"schema":1,"id":"crm","url":"https://crm.example/hook","tenant":"acme",
//!  "event_types":["order.*"],"enabled":true,"timeout":"5s","max_concurrency":8,
//!  "secrets":[{"kid":"1f2e3d4c","nonce":"…","ciphertext":"…"},
//!             {"kid":"1f2e3d4c","nonce":"…","ciphertext":"…","expires_at_ms":1767225600000}],
//!  "managed_by":"api","disabled_reason":null,
//!  "created_at_ms":1767139200000,"updated_at_ms":1767139260000,"version":2}
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::crypto::Sealed;

/// The newest record layout this version reads and writes; readers skip (and count) records of
/// a newer one, keeping the endpoint's previous state.
pub const SCHEMA: u32 = 2;

/// The layout of a record without custom headers, a filter or a rate limit: written as 1 so
/// that a process from before those existed reads it; one with any is written as [`SCHEMA`],
/// which such a process skips (it keeps the previous definition rather than send without the
/// headers, past the filter or over the limit).
pub const SCHEMA_V1: u32 = 1;

/// Who owns an endpoint's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ManagedBy {
    /// Listed in the config file: seeded from it at start; API edits are refused.
    File,
    /// Created through the API or the CLI.
    Api,
}

impl ManagedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            ManagedBy::File => "file",
            ManagedBy::Api => "api",
        }
    }
}

/// One sealed secret and when it stops signing (`None`: until rotated out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedSecret {
    #[serde(flatten)]
    pub sealed: Sealed,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

/// One custom header: its value in the clear, or sealed when it is secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordHeader {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Sealed>,
}

/// The value of a `<p>.endpoints` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointRecord {
    pub schema: u32,
    pub id: String,
    pub url: String,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub event_types: Vec<String>,
    pub enabled: bool,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    #[serde(default)]
    pub secrets: Vec<SealedSecret>,
    /// Custom headers (none for a file-managed endpoint: they stay in the file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<RecordHeader>,
    /// The CEL filter as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Deliveries per second, for the whole cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// `Some(false)`: requests carry no `traceparent`. Absent (`None`) means true, so records
    /// from before it read as they did and a default endpoint's record is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<bool>,
    pub managed_by: ManagedBy,
    /// Why it is disabled (`manual`, `auto: …`), when it is.
    #[serde(default)]
    pub disabled_reason: Option<String>,
    /// Since when the endpoint is marked failing (`endpoint.failing` was announced and no
    /// `endpoint.recovered` yet): health bookkeeping written by the health tracker through the
    /// registry writer, so one process announces each change. Absent: not failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since_ms: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// 1 for a new endpoint, +1 on every change: the optimistic-concurrency token.
    pub version: u64,
}

impl EndpointRecord {
    /// The record value's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| unreachable!("plain data serializes"))
    }

    /// Parses a record value read for `key`; says what is wrong otherwise.
    pub fn parse(key: &str, value: &[u8]) -> Result<EndpointRecord, String> {
        let schema = serde_json::from_slice::<serde_json::Value>(value)
            .map_err(|e| format!("not JSON: {e}"))?
            .get("schema")
            .and_then(serde_json::Value::as_u64);
        if schema.is_some_and(|s| s > u64::from(SCHEMA)) {
            return Err(format!(
                "schema {} is newer than this hookline understands ({SCHEMA})",
                schema.unwrap_or_default()
            ));
        }
        let r: EndpointRecord =
            serde_json::from_slice(value).map_err(|e| format!("not an endpoint record: {e}"))?;
        if r.id != key {
            return Err(format!("record id `{}` differs from its key `{key}`", r.id));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> EndpointRecord {
        EndpointRecord {
            schema: SCHEMA,
            id: "crm".into(),
            url: "https://crm.example/hook".into(),
            tenant: Some("acme".into()),
            event_types: vec!["order.*".into()],
            enabled: true,
            timeout: Some(Duration::from_secs(5)),
            max_concurrency: Some(8),
            secrets: vec![SealedSecret {
                sealed: Sealed {
                    kid: "1f2e3d4c".into(),
                    nonce: "bm9uY2U=".into(),
                    ciphertext: "Y3Q=".into(),
                },
                expires_at_ms: Some(5),
            }],
            headers: vec![
                RecordHeader {
                    name: "x-api-key".into(),
                    value: Some("k1".into()),
                    sealed: None,
                },
                RecordHeader {
                    name: "authorization".into(),
                    value: None,
                    sealed: Some(Sealed {
                        kid: "1f2e3d4c".into(),
                        nonce: "bm9uY2U=".into(),
                        ciphertext: "Y3Q=".into(),
                    }),
                },
            ],
            filter: Some("data.amount > 100".into()),
            rate_limit: Some(50.0),
            burst: Some(5),
            trace_context: None,
            managed_by: ManagedBy::Api,
            disabled_reason: None,
            failing_since_ms: None,
            created_at_ms: 1,
            updated_at_ms: 2,
            version: 2,
        }
    }

    #[test]
    fn round_trips_with_the_config_field_names() {
        let r = record();
        let bytes = r.to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["timeout"], "5s");
        assert_eq!(v["managed_by"], "api");
        assert_eq!(v["secrets"][0]["kid"], "1f2e3d4c");
        assert_eq!(v["secrets"][0]["expires_at_ms"], 5);
        assert_eq!(
            v["headers"][0],
            serde_json::json!({"name": "x-api-key", "value": "k1"})
        );
        assert_eq!(v["headers"][1]["sealed"]["kid"], "1f2e3d4c");
        assert!(v["headers"][1].get("value").is_none());
        assert_eq!(v["filter"], "data.amount > 100");
        assert_eq!(EndpointRecord::parse("crm", &bytes), Ok(r));
    }

    #[test]
    fn trace_context_is_written_only_when_off() {
        let r = record();
        let v: serde_json::Value = serde_json::from_slice(&r.to_bytes()).expect("json");
        assert!(v.get("trace_context").is_none(), "{v}");
        let off = EndpointRecord {
            trace_context: Some(false),
            ..record()
        };
        let bytes = off.to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["trace_context"], false);
        assert_eq!(EndpointRecord::parse("crm", &bytes), Ok(off));
    }

    #[test]
    fn unreadable_records_say_why() {
        let r = record();
        assert!(EndpointRecord::parse("other", &r.to_bytes())
            .unwrap_err()
            .contains("differs from its key"));
        assert!(EndpointRecord::parse("crm", b"nope")
            .unwrap_err()
            .contains("not JSON"));
        let mut v: serde_json::Value = serde_json::from_slice(&r.to_bytes()).expect("json");
        v["schema"] = (SCHEMA + 1).into();
        let newer = serde_json::to_vec(&v).expect("json");
        assert!(EndpointRecord::parse("crm", &newer)
            .unwrap_err()
            .contains("newer"));
    }
}

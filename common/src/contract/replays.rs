//! The replay record: what a finished replay leaves on the compacted `<p>.replays`, keyed by its
//! replay key `dlq:<partition>:<offset>`, so that running the same replay twice sends once. A
//! tombstone releases the key. Written and read through [`ReplayRecord`] only.
//!
//! Value (JSON): `replay_key`, `position` (`<partition>:<offset>`), `endpoint_id`, `event_id`,
//! `attempt` (the `webhook-attempt` sent), `result` (`delivered` | `failed`), `attempt_record`
//! (as in the delivery history), `returned_to` (where a failure went, or `null`),
//! `with_retries`, `finished_at_ms`.

use serde::{Deserialize, Serialize};

use crate::contract::delivery::AttemptRecord;

/// `result` of a replay that delivered.
pub const DELIVERED: &str = "delivered";
/// `result` of a replay whose attempt failed.
pub const FAILED: &str = "failed";

/// One finished replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReplayRecord {
    pub replay_key: String,
    pub position: String,
    pub endpoint_id: String,
    pub event_id: String,
    pub attempt: u32,
    /// [`DELIVERED`] or [`FAILED`]; empty when the record could not be read.
    pub result: String,
    pub attempt_record: Option<AttemptRecord>,
    pub returned_to: Option<String>,
    pub with_retries: bool,
    pub finished_at_ms: i64,
}

impl ReplayRecord {
    /// Whether the replay delivered.
    pub fn delivered(&self) -> bool {
        self.result == DELIVERED
    }

    /// The record's value.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a record's value; one that is not a replay record still marks its key as
    /// replayed (with an empty `result`).
    pub fn from_bytes(value: &[u8]) -> ReplayRecord {
        serde_json::from_slice(value).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_field_names() {
        let r = ReplayRecord {
            replay_key: "dlq:0:5".into(),
            position: "0:5".into(),
            endpoint_id: "ep".into(),
            event_id: "evt".into(),
            attempt: 8,
            result: FAILED.into(),
            attempt_record: Some(AttemptRecord {
                n: 8,
                at_ms: 1,
                duration_ms: 2,
                status: Some(500),
                class: "http_status".into(),
                snippet: String::new(),
            }),
            returned_to: None,
            with_retries: false,
            finished_at_ms: 3,
        };
        let json: serde_json::Value = serde_json::from_slice(&r.to_bytes()).expect("json");
        assert_eq!(json["replay_key"], "dlq:0:5");
        assert_eq!(json["result"], "failed");
        assert_eq!(json["attempt_record"]["status"], 500);
        assert!(json["returned_to"].is_null());
        assert_eq!(ReplayRecord::from_bytes(&r.to_bytes()), r);
        assert!(!ReplayRecord::from_bytes(b"not json").delivered());
    }
}

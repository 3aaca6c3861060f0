//! The delivery record: what travels on the retry tiers and the dead-letter topic.
//!
//! Value = the producer's original event bytes (unchanged forever); key = the original record
//! key; Kafka headers carry the delivery metadata so any Kafka tool can read it:
//!
//! | header | meaning |
//! |---|---|
//! | `hookline-endpoint-id` | the one endpoint this delivery is for |
//! | `hookline-event-id`, `hookline-event-type`, `hookline-tenant` | from the envelope |
//! | `hookline-attempt` | number of the next attempt (1-based; 2 on the first tier) |
//! | `hookline-deferrals` | schedule slots skipped without an attempt because the endpoint was saturated (absent = 0) |
//! | `hookline-first-attempt-ms` | unix ms of attempt 1; every due time is an offset from it |
//! | `hookline-due-ms` | unix ms when the next attempt is due |
//! | `hookline-history` | JSON array of past attempts (bounded, see [`MAX_HISTORY`]) |
//! | `hookline-dead-reason` | on `<p>.dlq`: `exhausted`, `endpoint_removed`, `endpoint_disabled`, `endpoint_unsubscribed` |
//! | `hookline-dead-at-ms` | on `<p>.dlq`: when it was declared dead |
//! | `hookline-replay-key` | on a replayed delivery: `dlq:<partition>:<offset>` |

use rdkafka::message::{Header, Message, OwnedHeaders};
use serde::{Deserialize, Serialize};

use crate::contract::headers as h;

pub const ENDPOINT_ID: &str = "hookline-endpoint-id";
pub const ATTEMPT: &str = "hookline-attempt";
pub const DEFERRALS: &str = "hookline-deferrals";
pub const FIRST_ATTEMPT_MS: &str = "hookline-first-attempt-ms";
pub const DUE_MS: &str = "hookline-due-ms";
pub const HISTORY: &str = "hookline-history";
pub const DEAD_REASON: &str = "hookline-dead-reason";
pub const DEAD_AT_MS: &str = "hookline-dead-at-ms";
pub const REPLAY_KEY: &str = "hookline-replay-key";
/// W3C `traceparent` of the span the next hop's span continues (`runtime::traces`).
pub const TRACE: &str = crate::runtime::traces::TRACE_HEADER;

/// `class` of a history entry that records a deferral (no attempt made: the endpoint was
/// saturated); its `n` is the number of the attempt that was not made.
pub const DEFERRED: &str = "deferred";

/// Attempts kept in the history header: the first one and the most recent ones.
pub const MAX_HISTORY: usize = 16;
/// Bytes of response body kept per attempt in the history.
pub const MAX_SNIPPET: usize = 512;
/// Longest `hookline-history` header, in bytes of JSON. Sixteen attempts with 512-byte snippets
/// are ~10 KiB; snippets full of characters JSON must escape could reach ~50 KiB, so older
/// attempts are dropped (the first and the last are always kept, the attempt number still
/// counts every attempt) until the history fits. Part of the room stage A reserves for headers.
pub const MAX_HISTORY_BYTES: usize = 16 * 1024;

/// One past attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Attempt number, 1-based.
    pub n: u32,
    /// Unix ms when it started.
    pub at_ms: i64,
    pub duration_ms: u64,
    /// HTTP status, when a response arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// `ok` or the failure class (`http_status`, `timeout`, `connect`, `tls`, `io`, `blocked`, …).
    pub class: String,
    /// Start of the response body or the error text (bounded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub snippet: String,
}

/// Why a delivery ended in the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// Every attempt of the schedule failed.
    Exhausted,
    /// The endpoint was removed from the configuration between attempts.
    EndpointRemoved,
    /// The endpoint is disabled.
    EndpointDisabled,
    /// The endpoint no longer subscribes to the event (its tenant, event types or payload
    /// filter changed between attempts, or its filter cannot be evaluated on the event):
    /// sending would reach a receiver that did not ask for it.
    EndpointUnsubscribed,
    /// The delivery record no longer fits the next tier's topic (its `max.message.bytes` was
    /// lowered after the event was admitted); the DLQ keeps it whole.
    RecordTooLarge,
}

impl DeadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Exhausted => "exhausted",
            DeadReason::EndpointRemoved => "endpoint_removed",
            DeadReason::EndpointDisabled => "endpoint_disabled",
            DeadReason::EndpointUnsubscribed => "endpoint_unsubscribed",
            DeadReason::RecordTooLarge => "record_too_large",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "exhausted" => Some(DeadReason::Exhausted),
            "endpoint_removed" => Some(DeadReason::EndpointRemoved),
            "endpoint_disabled" => Some(DeadReason::EndpointDisabled),
            "endpoint_unsubscribed" => Some(DeadReason::EndpointUnsubscribed),
            "record_too_large" => Some(DeadReason::RecordTooLarge),
            _ => None,
        }
    }
}

/// Metadata of one (event, endpoint) delivery, decoded from / encoded to Kafka headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryMeta {
    pub endpoint_id: String,
    pub event_id: String,
    pub event_type: String,
    pub tenant: Option<String>,
    /// The next attempt's number (1-based).
    pub attempt: u32,
    /// Schedule slots this delivery gave up without an attempt because its endpoint was
    /// saturated (deferred). The next attempt takes slot `attempt - 1 + deferrals` of the
    /// schedule, so deferrals move a delivery along the schedule without consuming attempts and
    /// never past its end.
    pub deferrals: u32,
    pub first_attempt_ms: i64,
    pub due_ms: i64,
    pub history: Vec<AttemptRecord>,
    pub dead_reason: Option<DeadReason>,
    pub dead_at_ms: Option<i64>,
    pub replay_key: Option<String>,
    /// The trace context for the next hop's span (`hookline-trace`); only while tracing is on.
    pub trace: Option<String>,
}

/// A header that is missing or malformed on a delivery record.
#[derive(Debug, thiserror::Error)]
#[error("delivery record header `{header}`: {reason}")]
pub struct MetaError {
    pub header: &'static str,
    pub reason: String,
}

impl DeliveryMeta {
    /// A new delivery of one event to one endpoint whose first attempt starts at
    /// `first_attempt_ms`: attempt 1, due then, no history.
    pub fn new(
        endpoint_id: &str,
        event_id: &str,
        event_type: &str,
        tenant: Option<&str>,
        first_attempt_ms: i64,
    ) -> Self {
        DeliveryMeta {
            endpoint_id: endpoint_id.to_string(),
            event_id: event_id.to_string(),
            event_type: event_type.to_string(),
            tenant: tenant.map(str::to_string),
            attempt: 1,
            deferrals: 0,
            first_attempt_ms,
            due_ms: first_attempt_ms,
            history: Vec::new(),
            dead_reason: None,
            dead_at_ms: None,
            replay_key: None,
            trace: None,
        }
    }

    /// Appends an attempt, keeping the first and the most recent ones within [`MAX_HISTORY`]
    /// entries and [`MAX_HISTORY_BYTES`], and each snippet within [`MAX_SNIPPET`] bytes.
    pub fn push_attempt(&mut self, mut a: AttemptRecord) {
        a.snippet = truncate(&a.snippet, MAX_SNIPPET);
        self.history.push(a);
        if self.history.len() > MAX_HISTORY {
            self.history.remove(1);
        }
        self.shrink_history(MAX_HISTORY_BYTES);
    }

    /// Bytes of the `hookline-history` header.
    pub fn history_bytes(&self) -> usize {
        serde_json::to_string(&self.history).map_or(2, |s| s.len())
    }

    /// Shrinks the history until its JSON is at most `budget` bytes: drops the oldest attempts
    /// after the first, then empties snippets (oldest first), then keeps only the last attempt,
    /// then nothing. Returns whether it fits. Used on every append and, with a smaller budget,
    /// by a hand-off whose record would not fit its topic.
    pub fn shrink_history(&mut self, budget: usize) -> bool {
        while self.history_bytes() > budget && self.history.len() > 2 {
            self.history.remove(1);
        }
        for i in 0..self.history.len() {
            if self.history_bytes() <= budget {
                break;
            }
            self.history[i].snippet.clear();
        }
        if self.history_bytes() > budget && self.history.len() > 1 {
            self.history.drain(..self.history.len() - 1);
        }
        if self.history_bytes() > budget {
            self.history.clear();
        }
        self.history_bytes() <= budget
    }

    /// Headers for this delivery (name, value) in a stable order.
    pub fn to_headers(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (ENDPOINT_ID, self.endpoint_id.clone()),
            (h::EVENT_ID, self.event_id.clone()),
            (h::EVENT_TYPE, self.event_type.clone()),
        ];
        if let Some(t) = &self.tenant {
            out.push((h::TENANT, t.clone()));
        }
        out.push((ATTEMPT, self.attempt.to_string()));
        if self.deferrals > 0 {
            out.push((DEFERRALS, self.deferrals.to_string()));
        }
        out.push((FIRST_ATTEMPT_MS, self.first_attempt_ms.to_string()));
        out.push((DUE_MS, self.due_ms.to_string()));
        out.push((
            HISTORY,
            serde_json::to_string(&self.history).unwrap_or_else(|_| "[]".into()),
        ));
        if let Some(r) = self.dead_reason {
            out.push((DEAD_REASON, r.as_str().to_string()));
        }
        if let Some(t) = self.dead_at_ms {
            out.push((DEAD_AT_MS, t.to_string()));
        }
        if let Some(k) = &self.replay_key {
            out.push((REPLAY_KEY, k.clone()));
        }
        if let Some(t) = &self.trace {
            out.push((TRACE, t.clone()));
        }
        out
    }

    /// The Kafka headers of a delivery record: the metadata plus the event's dedupe key when
    /// known.
    pub fn kafka_headers(&self, dedupe_key: Option<&str>) -> OwnedHeaders {
        let mut out = OwnedHeaders::new_with_capacity(12);
        for (k, v) in self.to_headers() {
            out = out.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        if let Some(key) = dedupe_key {
            out = out.insert(Header {
                key: h::DEDUPE_KEY,
                value: Some(key.as_bytes()),
            });
        }
        out
    }

    /// Decodes a delivery record's headers.
    pub fn from_message<M: Message>(m: &M) -> Result<Self, MetaError> {
        DeliveryMeta::from_headers(|name| h::get(m, name))
    }

    /// The event's dedupe key carried on a delivery record.
    pub fn dedupe_key_of<M: Message>(m: &M) -> Option<String> {
        h::get(m, h::DEDUPE_KEY).map(str::to_string)
    }

    /// Decodes from headers given as a lookup function (`name -> value`).
    pub fn from_headers<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Self, MetaError> {
        let req = |name: &'static str| {
            get(name).map(str::to_string).ok_or(MetaError {
                header: name,
                reason: "missing".into(),
            })
        };
        let num = |name: &'static str| -> Result<i64, MetaError> {
            req(name)?.parse::<i64>().map_err(|e| MetaError {
                header: name,
                reason: format!("not an integer: {e}"),
            })
        };
        let attempt = num(ATTEMPT)?;
        if !(1..=1000).contains(&attempt) {
            return Err(MetaError {
                header: ATTEMPT,
                reason: format!("{attempt} is out of range"),
            });
        }
        let deferrals = match get(DEFERRALS) {
            None => 0,
            Some(_) => {
                let n = num(DEFERRALS)?;
                u32::try_from(n)
                    .ok()
                    .filter(|n| *n <= 1000)
                    .ok_or(MetaError {
                        header: DEFERRALS,
                        reason: format!("{n} is out of range"),
                    })?
            }
        };
        let history = match get(HISTORY) {
            None => Vec::new(),
            Some(s) => serde_json::from_str(s).map_err(|e| MetaError {
                header: HISTORY,
                reason: format!("not a JSON attempt list: {e}"),
            })?,
        };
        let dead_reason = match get(DEAD_REASON) {
            None => None,
            Some(s) => Some(DeadReason::parse(s).ok_or(MetaError {
                header: DEAD_REASON,
                reason: format!("unknown reason `{s}`"),
            })?),
        };
        let dead_at_ms = match get(DEAD_AT_MS) {
            None => None,
            Some(_) => Some(num(DEAD_AT_MS)?),
        };
        Ok(DeliveryMeta {
            endpoint_id: req(ENDPOINT_ID)?,
            event_id: req(h::EVENT_ID)?,
            event_type: req(h::EVENT_TYPE)?,
            tenant: get(h::TENANT).map(str::to_string),
            attempt: attempt as u32,
            deferrals,
            first_attempt_ms: num(FIRST_ATTEMPT_MS)?,
            due_ms: num(DUE_MS)?,
            history,
            dead_reason,
            dead_at_ms,
            replay_key: get(REPLAY_KEY).map(str::to_string),
            trace: get(TRACE).map(str::to_string),
        })
    }
}

/// Truncates to at most `max` bytes on a char boundary.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Current unix time in ms (the one clock helper, [`crate::runtime::clock`]).
pub use crate::runtime::clock::now_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn sample() -> DeliveryMeta {
        DeliveryMeta {
            endpoint_id: "ep1".into(),
            event_id: "evt_1".into(),
            event_type: "message.created".into(),
            tenant: Some("acme".into()),
            attempt: 2,
            deferrals: 0,
            first_attempt_ms: 1_000,
            due_ms: 61_000,
            history: vec![AttemptRecord {
                n: 1,
                at_ms: 1_000,
                duration_ms: 12,
                status: Some(500),
                class: "http_status".into(),
                snippet: "oops".into(),
            }],
            dead_reason: None,
            dead_at_ms: None,
            replay_key: None,
            trace: None,
        }
    }

    #[test]
    fn dead_reasons_round_trip() {
        for r in [
            DeadReason::Exhausted,
            DeadReason::EndpointRemoved,
            DeadReason::EndpointDisabled,
            DeadReason::EndpointUnsubscribed,
        ] {
            assert_eq!(DeadReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(
            DeadReason::EndpointUnsubscribed.as_str(),
            "endpoint_unsubscribed"
        );
    }

    #[test]
    fn headers_round_trip() {
        let mut m = sample();
        m.dead_reason = Some(DeadReason::Exhausted);
        m.dead_at_ms = Some(5);
        m.replay_key = Some("dlq:0:7".into());
        m.deferrals = 2;
        let hs: HashMap<&str, String> = m.to_headers().into_iter().collect();
        let back = DeliveryMeta::from_headers(|k| hs.get(k).map(|s| s.as_str())).expect("decode");
        assert_eq!(back, m);
    }

    #[test]
    fn missing_header_is_named() {
        let m = sample();
        let hs: HashMap<&str, String> = m
            .to_headers()
            .into_iter()
            .filter(|(k, _)| *k != DUE_MS)
            .collect();
        let err = DeliveryMeta::from_headers(|k| hs.get(k).map(|s| s.as_str())).unwrap_err();
        assert_eq!(err.header, DUE_MS);
    }

    #[test]
    fn history_is_bounded_and_keeps_first() {
        let mut m = sample();
        for n in 2..40 {
            m.push_attempt(AttemptRecord {
                n,
                at_ms: n as i64,
                duration_ms: 1,
                status: None,
                class: "timeout".into(),
                snippet: "x".repeat(2000),
            });
        }
        assert_eq!(m.history.len(), MAX_HISTORY);
        assert_eq!(m.history[0].n, 1);
        assert_eq!(m.history.last().map(|a| a.n), Some(39));
        assert!(m.history.iter().all(|a| a.snippet.len() <= MAX_SNIPPET));
    }

    #[test]
    fn history_bytes_are_bounded_even_when_every_snippet_must_be_escaped() {
        let mut m = sample();
        for n in 2..40 {
            m.push_attempt(AttemptRecord {
                n,
                at_ms: n as i64,
                duration_ms: 1,
                status: Some(500),
                class: "http_status".into(),
                // Control characters are escaped as \u0001: six bytes each in JSON.
                snippet: "\u{1}".repeat(2000),
            });
            assert!(
                m.history_bytes() <= MAX_HISTORY_BYTES,
                "{}",
                m.history_bytes()
            );
        }
        assert_eq!(m.history[0].n, 1, "the first attempt is kept");
        assert_eq!(m.history.last().map(|a| a.n), Some(39), "the last too");
    }

    #[test]
    fn shrinking_drops_middle_attempts_then_snippets_then_all_but_the_last() {
        let mut m = sample();
        for n in 2..10 {
            m.push_attempt(AttemptRecord {
                n,
                at_ms: n as i64,
                duration_ms: 1,
                status: None,
                class: "timeout".into(),
                snippet: "s".repeat(400),
            });
        }
        assert!(m.shrink_history(1_000));
        assert_eq!(
            m.history.iter().map(|a| a.n).collect::<Vec<_>>(),
            [1, 9],
            "first and last kept"
        );
        assert!(m.shrink_history(200));
        assert!(m.history.iter().all(|a| a.snippet.is_empty()));
        assert!(m.shrink_history(100));
        assert_eq!(m.history.iter().map(|a| a.n).collect::<Vec<_>>(), [9]);
        assert!(m.shrink_history(2));
        assert!(m.history.is_empty());
        assert!(!m.shrink_history(1), "an empty list is 2 bytes of JSON");
    }
}

//! Record size arithmetic and the size limits of the topics hookline writes.
//!
//! Two limits apply to every record hookline produces:
//! - the producer's `message.max.bytes` ([`crate::contract::topics::MAX_MESSAGE_BYTES`]), which librdkafka
//!   checks against the *uncompressed* key + value + headers when the record is enqueued;
//! - the target topic's `max.message.bytes`, which the broker checks against the compressed
//!   batch. Read from the broker (DescribeConfigs) when a stage starts and again after a produce
//!   fails with a size error (an operator may change it at any time).
//!
//! Sizes here are uncompressed plus framing and a margin for compression that expands
//! incompressible data, so a record that "fits" is accepted by both checks.
//!
//! Stage A admits an event only if its key, value and producer headers plus [`HEADER_RESERVE`]
//! (room for every header hookline may add on any later hop, a full attempt history included)
//! fit under the smallest limit of every topic it may travel to: every later hop then fits by
//! construction. The hand-off paths still check (and trim the history) as a second line of
//! defence, for records admitted before a limit was lowered.

use std::collections::BTreeMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use crate::config::Config;
use crate::contract::delivery::MAX_HISTORY_BYTES;
use crate::contract::envelope::{Invalid, InvalidReason};
use crate::contract::topics::MAX_MESSAGE_BYTES;
use crate::kafka::base_config;

/// Record batch header (61 bytes in format v2) + one record's varint framing (≤ 36 bytes), with
/// room to spare.
pub const RECORD_OVERHEAD: usize = 512;
/// Framing of one header (varint lengths) beyond its name and value bytes.
pub const HEADER_OVERHEAD: usize = 10;

/// Room kept for the headers hookline adds on any hop after stage A, beyond the producer's own:
/// the attempt history (bounded by [`MAX_HISTORY_BYTES`]) plus 16 KiB for the rest (event id,
/// type and tenant ≤ 256 bytes each, the dedupe key ≤ 4 KiB, endpoint id ≤ 128 bytes, numbers,
/// reasons, replay key, quarantine reason and detail, header names and framing).
pub const HEADER_RESERVE: usize = MAX_HISTORY_BYTES + 16 * 1024;

/// Bytes the headers count: names, values and framing.
pub fn headers_bytes<'a>(headers: impl IntoIterator<Item = (&'a str, usize)>) -> usize {
    headers
        .into_iter()
        .map(|(name, value_len)| name.len() + value_len + HEADER_OVERHEAD)
        .sum()
}

/// Bytes a record counts against a limit: key + value + headers, framing, and 1/128 for
/// compression of incompressible data (lz4 and zstd expand by less than that).
pub fn record_bytes(key_len: usize, value_len: usize, headers_len: usize) -> usize {
    let raw = key_len
        .saturating_add(value_len)
        .saturating_add(headers_len);
    raw.saturating_add(raw / 128)
        .saturating_add(RECORD_OVERHEAD)
}

/// Stage A's admission: the key is at most `max_key_bytes`, and the record with
/// [`HEADER_RESERVE`] fits `limit` (the smallest limit on its way). Otherwise the reason is
/// `record_too_large` with a detail naming the sizes.
pub fn admit(
    key_len: usize,
    value_len: usize,
    headers_len: usize,
    max_key_bytes: usize,
    limit: usize,
) -> Result<(), Invalid> {
    if key_len > max_key_bytes {
        return Err(Invalid {
            reason: InvalidReason::RecordTooLarge,
            detail: format!(
                "record key is {key_len} bytes, limit is {max_key_bytes} (input.max_key_bytes)"
            ),
        });
    }
    let size = record_bytes(key_len, value_len, headers_len).saturating_add(HEADER_RESERVE);
    if size > limit {
        return Err(Invalid {
            reason: InvalidReason::RecordTooLarge,
            detail: format!(
                "record is {size} bytes with room for hookline's headers (key {key_len}, value \
                 {value_len}, headers {headers_len}), limit is {limit} (the smallest \
                 max.message.bytes of the topics it may travel to)"
            ),
        });
    }
    Ok(())
}

/// How long a refresh of the limits is skipped after the previous one (size errors come in
/// bursts: one describe is enough).
const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// The producer's limit and the `max.message.bytes` of the topics a stage writes.
pub struct Limits {
    producer: usize,
    topics: RwLock<BTreeMap<String, usize>>,
    /// Set when limits are read from a broker: how to read them again.
    source: Option<(AdminClient<DefaultClientContext>, Vec<String>)>,
    refreshed: Mutex<Option<Instant>>,
}

impl Limits {
    /// Fixed limits (tests, tools).
    pub fn fixed(producer: usize, topics: impl IntoIterator<Item = (String, usize)>) -> Self {
        Limits {
            producer,
            topics: RwLock::new(topics.into_iter().collect()),
            source: None,
            refreshed: Mutex::new(None),
        }
    }

    /// Reads the `max.message.bytes` of `topics` from the broker. A topic whose config cannot be
    /// read (no DescribeConfigs permission…) counts with the producer's limit, with a warning.
    pub async fn fetch(config: &Config, topics: Vec<String>) -> anyhow::Result<Self> {
        let admin: AdminClient<DefaultClientContext> = base_config(config).create()?;
        let limits = Limits {
            producer: MAX_MESSAGE_BYTES,
            topics: RwLock::new(BTreeMap::new()),
            source: Some((admin, topics)),
            refreshed: Mutex::new(None),
        };
        limits.read().await;
        Ok(limits)
    }

    /// Reads the limits again, at most once per [`REFRESH_EVERY`]; called after a size error.
    pub async fn refresh(&self) {
        {
            let mut last = self.refreshed.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        self.read().await;
    }

    /// Reads the limits again now, whatever the time since the last read: for callers whose
    /// size errors are rare and costly (stage B aborts a whole transaction on one).
    pub async fn refresh_now(&self) {
        if let Ok(mut last) = self.refreshed.lock() {
            *last = Some(Instant::now());
        }
        self.read().await;
    }

    async fn read(&self) {
        let Some((admin, names)) = &self.source else {
            return;
        };
        let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
        let resources: Vec<ResourceSpecifier<'_>> = names
            .iter()
            .map(|n| ResourceSpecifier::Topic(n.as_str()))
            .collect();
        let described = match admin.describe_configs(resources.iter(), &opts).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "reading topic size limits failed; keeping the last known ones");
                return;
            }
        };
        let mut found = BTreeMap::new();
        for (name, result) in names.iter().zip(described) {
            let limit = result.ok().and_then(|r| {
                r.entries
                    .iter()
                    .find(|e| e.name == "max.message.bytes")
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse::<usize>().ok())
            });
            match limit {
                Some(l) => {
                    found.insert(name.clone(), l);
                }
                None => tracing::warn!(
                    topic = %name,
                    "max.message.bytes of the topic cannot be read; assuming the producer's limit"
                ),
            }
        }
        tracing::info!(limits = ?found, producer = self.producer, "topic size limits read");
        let mut topics = self.topics.write().unwrap_or_else(|e| e.into_inner());
        topics.extend(found);
    }

    /// The largest record (as counted by [`record_bytes`]) that may be written to `topic`.
    pub fn limit(&self, topic: &str) -> usize {
        let topics = self.topics.read().unwrap_or_else(|e| e.into_inner());
        topics
            .get(topic)
            .copied()
            .map_or(self.producer, |t| t.min(self.producer))
    }

    /// The smallest limit over `topics` (one read of the table for all of them: stage A asks
    /// for every downstream topic on every record).
    pub fn min_limit<'a>(&self, topics: impl IntoIterator<Item = &'a str>) -> usize {
        let known = self.topics.read().unwrap_or_else(|e| e.into_inner());
        topics
            .into_iter()
            .filter_map(|t| known.get(t).copied())
            .fold(self.producer, usize::min)
    }

    pub fn fits(&self, topic: &str, size: usize) -> bool {
        size <= self.limit(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_counts_its_parts_framing_and_a_compression_margin() {
        assert_eq!(record_bytes(0, 0, 0), RECORD_OVERHEAD);
        assert_eq!(record_bytes(10, 100, 18), 128 + 1 + RECORD_OVERHEAD);
        assert_eq!(
            record_bytes(1 << 20, 0, 0),
            (1 << 20) + (1 << 13) + RECORD_OVERHEAD
        );
        assert_eq!(record_bytes(usize::MAX, 1, 1), usize::MAX, "saturates");
        assert_eq!(
            headers_bytes([("a", 3), ("hookline-x", 0)]),
            1 + 3 + 10 + 10 + 10
        );
    }

    #[test]
    fn admission_keeps_room_for_every_later_header() {
        let limit = 1_000_000;
        // Largest value that is admitted with a 10-byte key and no headers.
        let room = limit - HEADER_RESERVE - RECORD_OVERHEAD;
        let value = room * 128 / 129 - 10;
        assert!(admit(10, value, 0, 16_384, limit).is_ok());
        let err = admit(10, value + 200, 0, 16_384, limit).expect_err("too large");
        assert_eq!(err.reason, InvalidReason::RecordTooLarge);
        assert!(err.detail.contains("limit is 1000000"), "{}", err.detail);
        // Producer headers count too.
        assert!(admit(10, value, 200, 16_384, limit).is_err());
    }

    #[test]
    fn a_key_over_its_limit_is_too_large_whatever_the_room() {
        let err = admit(3_000_000, 10, 0, 16_384, usize::MAX).expect_err("key");
        assert_eq!(err.reason, InvalidReason::RecordTooLarge);
        assert!(err.detail.contains("input.max_key_bytes"), "{}", err.detail);
        assert!(admit(16_384, 10, 0, 16_384, usize::MAX).is_ok());
    }

    #[test]
    fn the_limit_of_a_topic_is_capped_by_the_producer() {
        let l = Limits::fixed(5_000, [("a".to_string(), 1_000), ("b".to_string(), 9_000)]);
        assert_eq!(l.limit("a"), 1_000);
        assert_eq!(l.limit("b"), 5_000);
        assert_eq!(l.limit("unknown"), 5_000);
        assert_eq!(l.min_limit(["b", "a"]), 1_000);
        assert!(l.fits("a", 1_000));
        assert!(!l.fits("a", 1_001));
    }
}

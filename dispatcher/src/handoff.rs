//! What happens after a failed attempt: the delivery's next hop on the fixed schedule.
//!
//! Attempts happen at offsets from the first attempt (`retry.schedule`, the spec's
//! +0, +1m, +5m, +30m, +2h, +6h, +24h). After attempt `n` fails, attempt `n + 1` is due at
//! `first_attempt + schedule[n]` on the tier topic named after that offset; after the last
//! attempt the delivery is dead and goes to `<p>.dlq`. Used by the dispatcher (attempt 1) and the
//! retry tiers (attempts 2..).

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};

use hookline_common::delivery::{now_ms, AttemptRecord, DeadReason, DeliveryMeta};
use hookline_common::headers as h;
use hookline_common::topics::Topics;

use crate::engine::{AttemptOutcome, AttemptResult};

/// Where a delivery goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hop {
    /// Wait on this tier topic until `due_ms`.
    Retry { topic: String, due_ms: i64 },
    /// Dead letter.
    Dead { topic: String },
}

/// The attempt record kept in the delivery's history.
pub fn attempt_record(outcome: &AttemptOutcome) -> AttemptRecord {
    let (status, class, snippet) = match &outcome.result {
        AttemptResult::Delivered { status } => (Some(*status), "ok".to_string(), String::new()),
        AttemptResult::Failed {
            class,
            status,
            snippet,
        } => (*status, class.as_str().to_string(), snippet.clone()),
    };
    AttemptRecord {
        n: outcome.attempt,
        at_ms: outcome.started_at_ms,
        duration_ms: outcome.duration.as_millis() as u64,
        status,
        class,
        snippet,
    }
}

/// Records a failed attempt on `meta` and moves it to its next hop: the next tier, or dead
/// (`exhausted`) after the schedule's last attempt.
pub fn after_failure(
    meta: &mut DeliveryMeta,
    outcome: &AttemptOutcome,
    topics: &Topics,
    schedule: &[Duration],
) -> Hop {
    meta.push_attempt(attempt_record(outcome));
    meta.attempt = outcome.attempt + 1;
    next_hop(meta, topics, schedule)
}

/// The hop for `meta.attempt` (the next attempt's number); sets the due time or the dead fields.
pub fn next_hop(meta: &mut DeliveryMeta, topics: &Topics, schedule: &[Duration]) -> Hop {
    let n = meta.attempt as usize;
    if n == 0 || n > schedule.len() {
        mark_dead(meta, DeadReason::Exhausted);
        return Hop::Dead {
            topic: topics.dlq(),
        };
    }
    let offset = schedule[n - 1];
    meta.due_ms = meta.first_attempt_ms + offset.as_millis() as i64;
    Hop::Retry {
        topic: topics.retry(offset),
        due_ms: meta.due_ms,
    }
}

/// Marks a delivery dead now with `reason`.
pub fn mark_dead(meta: &mut DeliveryMeta, reason: DeadReason) {
    meta.dead_reason = Some(reason);
    meta.dead_at_ms = Some(now_ms());
}

/// Kafka headers of a delivery record: the metadata plus the dedupe key when known.
pub fn headers(meta: &DeliveryMeta, dedupe_key: Option<&str>) -> OwnedHeaders {
    let mut out = OwnedHeaders::new_with_capacity(12);
    for (k, v) in meta.to_headers() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::FailureClass;

    fn meta() -> DeliveryMeta {
        DeliveryMeta::new("ep", "e1", "t", None, 1_000_000)
    }

    fn failed(attempt: u32) -> AttemptOutcome {
        AttemptOutcome {
            attempt,
            started_at_ms: 1_000_000,
            duration: Duration::from_millis(5),
            result: AttemptResult::Failed {
                class: FailureClass::HttpStatus,
                status: Some(503),
                snippet: "busy".into(),
            },
        }
    }

    #[test]
    fn walks_the_spec_schedule_then_dies() {
        let topics = Topics::new("p");
        let schedule = hookline_common::config::default_schedule();
        let mut m = meta();
        let mut hops = Vec::new();
        for attempt in 1..=7 {
            hops.push(after_failure(&mut m, &failed(attempt), &topics, &schedule));
        }
        let expected = [
            ("p.retry.1m", 60_000),
            ("p.retry.5m", 300_000),
            ("p.retry.30m", 1_800_000),
            ("p.retry.2h", 7_200_000),
            ("p.retry.6h", 21_600_000),
            ("p.retry.24h", 86_400_000),
        ];
        for (hop, (topic, offset)) in hops.iter().zip(expected) {
            assert_eq!(
                hop,
                &Hop::Retry {
                    topic: topic.into(),
                    due_ms: 1_000_000 + offset
                }
            );
        }
        assert_eq!(
            hops[6],
            Hop::Dead {
                topic: "p.dlq".into()
            }
        );
        assert_eq!(m.history.len(), 7);
        assert_eq!(m.dead_reason, Some(DeadReason::Exhausted));
    }

    #[test]
    fn single_attempt_schedule_goes_straight_to_dlq() {
        let mut m = meta();
        let hop = after_failure(&mut m, &failed(1), &Topics::new("p"), &[Duration::ZERO]);
        assert_eq!(
            hop,
            Hop::Dead {
                topic: "p.dlq".into()
            }
        );
    }
}

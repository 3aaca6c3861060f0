//! What happens after a failed attempt: the delivery's next hop on the fixed schedule.
//!
//! Attempts happen at offsets from the first attempt (`retry.schedule`, the spec's
//! +0, +1m, +5m, +30m, +2h, +6h, +24h). After attempt `n` fails, attempt `n + 1` is due at
//! `first_attempt + schedule[n]` on the tier topic named after that offset; after the last
//! attempt the delivery is dead and goes to `<p>.dlq`. Pure decisions on [`DeliveryMeta`], made
//! by the delivery path ([`crate::attempt`]) for the dispatcher, the tiers and replay.
//!
//! Deferral: when an endpoint is saturated (every concurrency slot busy and no slot freed within
//! the engine's short permit wait), a delivery that still has a later slot in the schedule is not
//! attempted now: it moves to the next slot's tier with its attempt number unchanged, a history
//! entry of class `deferred` and `hookline-deferrals` + 1. Slot = `attempt - 1 + deferrals`, due
//! = first attempt + that slot's offset, so deferrals never stretch a delivery past the
//! schedule's end (24 h by default); on the last slot there is nothing to defer to and the
//! attempt waits for a concurrency slot.

use std::time::Duration;

use hookline_common::contract::delivery::{self, AttemptRecord, DeadReason, DeliveryMeta};
use hookline_common::contract::topics::Topics;
use hookline_common::runtime::clock::now_ms;

use crate::outcome::{attempt_record, AttemptOutcome};

/// Where a delivery goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hop {
    /// Wait on this tier topic until `due_ms`.
    Retry { topic: String, due_ms: i64 },
    /// Dead letter.
    Dead { topic: String },
    /// `<p>.throttle`: the delivery waits there for its rate-limited endpoint's budget (no
    /// attempt made, the attempt number unchanged).
    Throttle { topic: String },
}

impl Hop {
    /// The hop as the delivery log and traces name it: `retry.<tier>` or `dlq` (the topic
    /// without the `<p>.` prefix).
    pub fn label<'a>(&'a self, topics: &Topics) -> &'a str {
        let topic = self.topic();
        topic
            .strip_prefix(topics.prefix.as_str())
            .and_then(|t| t.strip_prefix('.'))
            .unwrap_or(topic)
    }

    /// The topic the delivery record goes to.
    pub fn topic(&self) -> &str {
        match self {
            Hop::Retry { topic, .. } | Hop::Dead { topic } | Hop::Throttle { topic } => topic,
        }
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

/// Records a failed replay attempt on `meta` and moves it on: back to the DLQ (`exhausted`), or,
/// `with_retries`, to a fresh schedule started by this attempt (its first tier; the history keeps
/// the earlier attempts).
pub fn after_replay(
    meta: &mut DeliveryMeta,
    outcome: &AttemptOutcome,
    with_retries: bool,
    topics: &Topics,
    schedule: &[Duration],
) -> Hop {
    if with_retries {
        meta.dead_reason = None;
        meta.dead_at_ms = None;
        meta.first_attempt_ms = outcome.started_at_ms;
        meta.deferrals = 0;
        return after_failure(meta, outcome, topics, schedule);
    }
    meta.push_attempt(attempt_record(outcome));
    meta.attempt = outcome.attempt + 1;
    mark_dead(meta, DeadReason::Exhausted);
    Hop::Dead {
        topic: topics.dlq(),
    }
}

/// Whether the schedule still has a slot for the delivery's next attempt (a record written under
/// a longer schedule may have none left under the current one).
pub fn has_slot(meta: &DeliveryMeta, schedule: &[Duration]) -> bool {
    slot(meta).is_some_and(|s| s < schedule.len())
}

/// Whether a delivery whose next attempt is `meta.attempt` can be deferred: a later slot of the
/// schedule is left for it.
pub fn can_defer(meta: &DeliveryMeta, schedule: &[Duration]) -> bool {
    slot(meta).is_some_and(|s| s + 1 < schedule.len())
}

/// Defers the next attempt to the next slot of the schedule without making it (the endpoint is
/// saturated: `in_flight` requests busy): attempt number unchanged, a `deferred` history entry,
/// `deferrals` + 1. Call only when [`can_defer`]; returns the hop (a tier).
pub fn defer(
    meta: &mut DeliveryMeta,
    in_flight: usize,
    topics: &Topics,
    schedule: &[Duration],
) -> Hop {
    meta.push_attempt(AttemptRecord {
        n: meta.attempt,
        at_ms: now_ms(),
        duration_ms: 0,
        status: None,
        class: delivery::DEFERRED.to_string(),
        snippet: format!("endpoint saturated: {in_flight} requests in flight, attempt not made"),
    });
    meta.deferrals += 1;
    next_hop(meta, topics, schedule)
}

/// Index in the schedule of the next attempt: `attempt - 1 + deferrals`.
fn slot(meta: &DeliveryMeta) -> Option<usize> {
    let attempt = usize::try_from(meta.attempt).ok()?.checked_sub(1)?;
    attempt.checked_add(usize::try_from(meta.deferrals).ok()?)
}

/// The hop for the next attempt (`meta.attempt`, in slot `attempt - 1 + deferrals`); sets the
/// due time or the dead fields.
pub fn next_hop(meta: &mut DeliveryMeta, topics: &Topics, schedule: &[Duration]) -> Hop {
    let Some(slot) = slot(meta).filter(|s| *s < schedule.len()) else {
        mark_dead(meta, DeadReason::Exhausted);
        return Hop::Dead {
            topic: topics.dlq(),
        };
    };
    let offset = schedule[slot];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{AttemptResult, FailureClass};

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
            retry_after: None,
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
    fn deferrals_take_slots_without_attempts_and_never_pass_the_end() {
        let topics = Topics::new("p");
        let schedule = hookline_common::config::default_schedule();
        let mut m = meta();
        // Attempt 1 deferred at once (the dispatcher): first tier, attempt still 1.
        assert!(can_defer(&m, &schedule));
        let hop = defer(&mut m, 4, &topics, &schedule);
        assert_eq!(
            hop,
            Hop::Retry {
                topic: "p.retry.1m".into(),
                due_ms: 1_000_000 + 60_000
            }
        );
        assert_eq!((m.attempt, m.deferrals), (1, 1));
        assert_eq!(m.history[0].class, "deferred");
        assert_eq!(m.history[0].n, 1);
        // Attempt 1 made on the 1m tier and failed: attempt 2 in the 5m slot, not back to back.
        let hop = after_failure(&mut m, &failed(1), &topics, &schedule);
        assert_eq!(
            hop,
            Hop::Retry {
                topic: "p.retry.5m".into(),
                due_ms: 1_000_000 + 300_000
            }
        );
        // Deferred at every later slot: attempt 2 ends up in the last slot and cannot defer.
        while can_defer(&m, &schedule) {
            defer(&mut m, 4, &topics, &schedule);
        }
        assert_eq!(m.attempt, 2);
        assert_eq!(m.due_ms, 1_000_000 + 86_400_000, "the 24h slot, not later");
        let hop = after_failure(&mut m, &failed(2), &topics, &schedule);
        assert!(matches!(hop, Hop::Dead { .. }), "the schedule's end");
    }

    #[test]
    fn a_failed_replay_goes_back_to_the_dlq_or_starts_a_fresh_schedule() {
        let topics = Topics::new("p");
        let schedule = hookline_common::config::default_schedule();
        let mut dead = meta();
        for attempt in 1..=7 {
            after_failure(&mut dead, &failed(attempt), &topics, &schedule);
        }
        let mut again = dead.clone();
        let mut replayed = failed(8);
        replayed.started_at_ms = 9_000_000;
        let hop = after_replay(&mut again, &replayed, false, &topics, &schedule);
        assert_eq!(hop.topic(), "p.dlq");
        assert_eq!((again.attempt, again.history.len()), (9, 8));
        assert_eq!(again.dead_reason, Some(DeadReason::Exhausted));

        let mut fresh = dead;
        let mut first = failed(1);
        first.started_at_ms = 9_000_000;
        let hop = after_replay(&mut fresh, &first, true, &topics, &schedule);
        assert_eq!(
            hop,
            Hop::Retry {
                topic: "p.retry.1m".into(),
                due_ms: 9_000_000 + 60_000
            }
        );
        assert_eq!((fresh.attempt, fresh.dead_reason), (2, None));
    }

    #[test]
    fn single_attempt_schedule_cannot_defer() {
        let m = meta();
        assert!(!can_defer(&m, &[Duration::ZERO]));
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

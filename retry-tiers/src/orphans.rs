//! Orphan tiers: `<p>.retry.<tier>` topics that exist on the broker but are no longer in
//! `retry.schedule` (the schedule changed). Records waiting there were written under the old
//! schedule; without a worker they would expire unseen.
//!
//! Each orphan tier gets an ordinary tier worker (its old consumer group
//! `<group_prefix>.retry.<tier>`, so it resumes where the old worker stopped). A record is
//! attempted at its recorded due time (capped by the orphan's own offset, see `crate::due`), and
//! a failure moves on by the *current* schedule: the record says which attempt it waits for
//! (`hookline-attempt` = n); after attempt n fails, attempt n + 1 is the current schedule's
//! (due = first attempt + `schedule[n]`, on that tier), or the delivery is dead (`exhausted`)
//! when the current schedule has no attempt n + 1. A record waiting for an attempt the current
//! schedule does not have at all (n > its length) is dead-lettered at once, without an attempt.
//!
//! Discovery runs when the tiers start and again every [`RESCAN`] (a tier topic created later,
//! e.g. by an older `topics apply` during a rolling change, is picked up). Both ride out a broker
//! that is away for a while (the metadata request goes through `retry_transient`); the rescan
//! does so on a task of its own ([`rescans`]), so an outage never holds up the tiers' loop or a
//! shutdown. A worker keeps
//! running for the life of the process: processes with the old schedule may still write to the
//! tier. Nothing is deleted: `hookline topics describe` shows what is left on each orphan tier.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use hookline_common::config::Config;
use hookline_common::kafka;
use hookline_common::runtime::shutdown::Shutdown;

use crate::due::DueBound;
use crate::tier::Tier;

/// How often the broker's topics are scanned for new orphan tiers.
pub(crate) const RESCAN: Duration = Duration::from_secs(60);

/// The orphan tiers on the broker now, as tier workers to run.
pub(crate) async fn discover(config: &Config) -> anyhow::Result<Vec<Tier>> {
    let found = kafka::find_orphan_tiers(config, Duration::from_secs(10)).await?;
    Ok(found
        .into_iter()
        .map(|o| Tier {
            bound: DueBound::of_orphan(&config.retry.schedule, o.offset),
            name: o.name,
            topic: o.topic,
            orphan: true,
            pacer: None,
        })
        .collect())
}

/// Rescans every [`RESCAN`] on a task of its own, sending what each finds, until `stop`. A
/// failed rescan (the broker away for longer than the retry budget) is logged and tried again
/// at the next one.
pub(crate) fn rescans(config: Arc<Config>, mut stop: Shutdown) -> mpsc::Receiver<Vec<Tier>> {
    let (found_tx, found_rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + RESCAN, RESCAN);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.wait() => return,
            }
            let found = tokio::select! {
                found = discover(&config) => found,
                _ = stop.wait() => return,
            };
            match found {
                Ok(found) => {
                    if found_tx.send(found).await.is_err() {
                        return;
                    }
                }
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "looking for new orphan retry tiers failed; trying again later"
                ),
            }
        }
    });
    found_rx
}

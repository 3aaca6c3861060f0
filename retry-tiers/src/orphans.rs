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
//! e.g. by an older `topics apply` during a rolling change, is picked up). A worker keeps
//! running for the life of the process: processes with the old schedule may still write to the
//! tier. Nothing is deleted: `hookline topics describe` shows what is left on each orphan tier.

use std::time::Duration;

use hookline_common::config::Config;
use hookline_common::kafka;

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

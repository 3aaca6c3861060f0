//! A neighbour beside a rate-limited drain: what an endpoint's rate limit costs the endpoints
//! that share the pipeline with it.
//!
//! The stages run one more endpoint, `limited-0` (tenant `limited`, `rate_limit = 50`). Each pair
//! of runs goes in ABBA order (odd pairs alone first, even pairs beside first), so that a drift
//! on the box over the section falls on both sides alike:
//!
//! - `nb-alone-<i>`: a backlog of `--neighbour-events` events for the main endpoint, drained as
//!   fast as possible (the same kind of run as `max`);
//! - `nb-beside-<i>`: a backlog for `limited-0` sized to outlast the run (50/s for three times
//!   the previous neighbour run's time plus 5 s) is produced first; once a first delivery of it
//!   arrives (the dispatcher has handed the rest to `<p>.throttle`, where the rate limiter holds
//!   them), the same neighbour backlog is drained again; then the rest of the drain is awaited.
//!
//! Reported: each pair's beside/alone deliveries/s and their median, whether each beside run
//! ended while the drain still had deliveries waiting (else the pair measured nothing and is
//! marked so), and the most deliveries `limited-0` received in any 1 s window over all drains.

use std::time::{Duration, Instant};

use serde::Serialize;

use hookline_common::contract::keyhash::Placement;
use hookline_common::contract::topics::Topics;

use crate::load::{self, Mix, Planned};
use crate::phases::{self, Ctx, RunSpec};
use crate::report::RunResult;

/// Sink endpoint index of the rate-limited endpoint `limited-0`.
pub const LIMITED: u16 = 400;
/// Its rate limit, deliveries/s.
pub const LIMIT_PER_S: f64 = 50.0;
/// Its tenant (its events go to it alone).
pub const TENANT: &str = "limited";

#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    /// The neighbour's deliveries/s alone and beside the drain.
    pub alone_per_s: f64,
    pub beside_per_s: f64,
    pub ratio: f64,
    /// Deliveries of the limited endpoint's backlog, and how many were still waiting when the
    /// beside run's last delivery arrived (0: the drain did not cover the run).
    pub limited_backlog: usize,
    pub limited_waiting_at_end: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Neighbour {
    pub limit_per_s: f64,
    pub pairs: Vec<Pair>,
    /// Median over the pairs whose drain covered the beside run of beside/alone (None when
    /// none did).
    pub ratio_median: Option<f64>,
    /// Most deliveries `limited-0` received in any sliding 1 s window, over all drains.
    pub limited_max_per_s: usize,
    /// Every limited delivery arrived exactly once.
    pub limited_complete: bool,
    /// Every run balanced its ledger and every limited delivery arrived.
    pub valid: bool,
}

/// The most timestamps (ns) in any sliding 1 s window.
pub fn max_per_second(mut at: Vec<u64>) -> usize {
    at.sort_unstable();
    let mut best = 0;
    let mut from = 0;
    for to in 0..at.len() {
        while at[to] - at[from] >= 1_000_000_000 {
            from += 1;
        }
        best = best.max(to - from + 1);
    }
    best
}

/// Arrival times (unix ns) of the limited backlog `tag` (ids `<tag>-0..n`) at `limited-0`.
fn limited_arrivals(ctx: &Ctx<'_>, tag: &str, n: usize) -> Vec<u64> {
    let book = ctx.sink.book();
    (0..n)
        .filter_map(|k| book.by_id.get(&format!("{tag}-{k}")))
        .flat_map(|rs| {
            rs.iter()
                .filter(|r| r.endpoint == LIMITED)
                .map(|r| r.recv_ns)
        })
        .collect()
}

/// Waits until `want` of the backlog `tag` (`n` deliveries) arrived or `within` passed; returns
/// the arrivals.
async fn wait_limited(
    ctx: &Ctx<'_>,
    tag: &str,
    n: usize,
    want: usize,
    within: Duration,
) -> Vec<u64> {
    let until = Instant::now() + within;
    loop {
        let got = limited_arrivals(ctx, tag, n);
        if got.len() >= want || Instant::now() >= until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Events of the warm-up before an alone run.
const WARM_UP: usize = 200;

/// Before an alone run, the pipeline is made as busy as before a beside run (where the limited
/// backlog has just gone through the dispatcher): `WARM_UP` events for the main endpoint, until
/// they arrived. Without it an alone run starts on a pipeline idle for seconds and measured up to
/// a third slower than the beside run that follows activity.
async fn warm_up(ctx: &Ctx<'_>, topic: &str, tag: &str, quiet: &Mix) -> anyhow::Result<()> {
    let plan = load::plan(tag, WARM_UP, 1, quiet, 7);
    load::produce(
        ctx.producer,
        topic,
        &plan,
        &["main".to_string()],
        None,
        quiet.payload_bytes,
        Placement::new(ctx.config).as_ref(),
    )
    .await?;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let arrived = {
            let book = ctx.sink.book();
            (0..WARM_UP)
                .filter(|k| book.by_id.contains_key(&format!("{tag}-{k}")))
                .count()
        };
        if arrived == WARM_UP {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < until,
            "the warm-up's {WARM_UP} events did not arrive within 60 s ({arrived} did)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `pairs` alternating pairs; `spec(name, tag, plan)` makes a neighbour run's spec. Returns
/// the runs (for the table and the ledgers) and the summary.
pub async fn run(
    ctx: &mut Ctx<'_>,
    pairs: usize,
    events: usize,
    mix: &Mix,
    spec: &dyn Fn(&str, &str, Vec<Planned>) -> RunSpec,
) -> anyhow::Result<(Vec<RunResult>, Neighbour)> {
    let quiet = Mix {
        duplicate_ratio: 0.0,
        failing_fraction: 0.0,
        invalid_fraction: 0.0,
        ..mix.clone()
    };
    let events_topic = Topics::new(&ctx.config.topics.prefix).events();
    let mut runs = Vec::new();
    let mut out = Vec::new();
    let mut all_limited = Vec::new();
    let mut complete = true;
    for i in 1..=pairs {
        let seed = 100 + 2 * i as u64;
        // ABBA: odd pairs measure alone first, even pairs beside first, so a drift over the
        // section falls on both sides alike.
        let alone_first = i % 2 == 1;
        let mut alone = None;
        if alone_first {
            warm_up(ctx, &events_topic, &format!("nw{i}"), &quiet).await?;
            let tag = format!("na{i}");
            let plan = load::plan(&tag, events, 1, mix, seed);
            alone = Some(phases::run(ctx, &spec(&format!("nb-alone-{i}"), &tag, plan)).await?);
        }

        // The limited backlog: enough to outlast a beside run three times as slow as the last
        // neighbour run.
        let reference_s = alone
            .as_ref()
            .or(runs.last())
            .map_or(10.0, |r: &RunResult| r.elapsed_s);
        let backlog = (LIMIT_PER_S * (3.0 * reference_s + 5.0)).ceil() as usize;
        let ltag = format!("nl{i}");
        let plan = load::plan(&ltag, backlog, 1, &quiet, seed + 1);
        load::produce(
            ctx.producer,
            &events_topic,
            &plan,
            &[TENANT.to_string()],
            None,
            mix.payload_bytes,
            Placement::new(ctx.config).as_ref(),
        )
        .await?;
        let first = wait_limited(ctx, &ltag, backlog, 1, Duration::from_secs(60)).await;
        anyhow::ensure!(
            !first.is_empty(),
            "the rate-limited endpoint received nothing within 60 s"
        );

        let tag = format!("nb{i}");
        let plan = load::plan(&tag, events, 1, mix, seed);
        let beside = phases::run(ctx, &spec(&format!("nb-beside-{i}"), &tag, plan)).await?;
        // Arrivals of the limited backlog before the beside run's last delivery.
        let end_ns = (beside.elapsed_s * 1e9) as u64 + beside.first_sched_ns;
        let arrived_by_end = limited_arrivals(ctx, &ltag, backlog)
            .iter()
            .filter(|&&t| t <= end_ns)
            .count();
        let waiting_at_end = backlog.saturating_sub(arrived_by_end);

        // The rest of the drain, at the limit: the next run starts on a quiet pipeline.
        let left = waiting_at_end as f64 / LIMIT_PER_S;
        let within = Duration::from_secs_f64(left * 1.5 + 30.0);
        let got = wait_limited(ctx, &ltag, backlog, backlog, within).await;
        complete &= got.len() == backlog;
        all_limited.extend(got);

        let alone = match alone {
            Some(a) => a,
            None => {
                warm_up(ctx, &events_topic, &format!("nw{i}"), &quiet).await?;
                let tag = format!("na{i}");
                let plan = load::plan(&tag, events, 1, mix, seed);
                phases::run(ctx, &spec(&format!("nb-alone-{i}"), &tag, plan)).await?
            }
        };
        let ratio = if alone.sustained_per_s > 0.0 {
            beside.sustained_per_s / alone.sustained_per_s
        } else {
            0.0
        };
        out.push(Pair {
            alone_per_s: alone.sustained_per_s,
            beside_per_s: beside.sustained_per_s,
            ratio,
            limited_backlog: backlog,
            limited_waiting_at_end: waiting_at_end,
        });
        if alone_first {
            runs.push(alone);
            runs.push(beside);
        } else {
            runs.push(beside);
            runs.push(alone);
        }
    }
    let mut ratios: Vec<f64> = out
        .iter()
        .filter(|p| p.limited_waiting_at_end > 0)
        .map(|p| p.ratio)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let valid = runs.iter().all(|r| r.ledger.balanced) && complete;
    Ok((
        runs,
        Neighbour {
            limit_per_s: LIMIT_PER_S,
            ratio_median: ratios.get(ratios.len() / 2).copied(),
            pairs: out,
            limited_max_per_s: max_per_second(all_limited),
            limited_complete: complete,
            valid,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_busiest_second() {
        let s = 1_000_000_000;
        assert_eq!(max_per_second(vec![]), 0);
        // Windows are half-open: 0 and s are not in the same second.
        assert_eq!(max_per_second(vec![0, s / 2, s - 1, s, 3 * s]), 3);
        assert_eq!(max_per_second(vec![5 * s, 0, 2 * s]), 1);
    }
}

//! One measured run through the running pipeline: produce a plan on its schedule, wait until the
//! ledger can settle (every expected delivery received or dead, every duplicate and invalid record
//! counted), then compute throughput, latency, CPU per stage and the ledger.
//!
//! Runs follow each other on the same stage processes, so per-run figures are deltas (CPU
//! seconds, metric counters) and every run's event ids carry the run's tag.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use rdkafka::producer::FutureProducer;

use hookline_common::config::Config;
use hookline_common::contract::keyhash::Placement;
use hookline_common::contract::topics::Topics;

use crate::hops;
use crate::lag::LagWatch;
use crate::ledger::{self, Expect, StageCounts};
use crate::load::{self, Planned};
use crate::report::{Latency, MachineCpu, RunResult, StageCpu};
use crate::sink::Sink;
use crate::stages::{cpu_seconds, machine_busy_seconds, Stages, STAGES};

/// What a run sends and what it expects.
pub struct RunSpec {
    pub name: String,
    /// Prefix of the run's event ids (`<tag>-<n>`).
    pub tag: String,
    pub plan: Vec<Planned>,
    pub tenants: Vec<String>,
    /// Records/s; None: as fast as possible.
    pub rate: Option<f64>,
    pub payload_bytes: usize,
    pub expect: Box<dyn Fn(&Planned) -> Expect + Send + Sync>,
    /// Endpoint left out of `healthy_per_s` (the isolation runs' hanging endpoint).
    pub exclude_from_healthy: Option<u16>,
    /// Read the run's records back from the pipeline topics for per-hop latency ([`crate::hops`]).
    pub hops: bool,
}

/// What every run uses.
pub struct Ctx<'a> {
    pub config: &'a Config,
    pub producer: &'a FutureProducer,
    pub sink: &'a Sink,
    pub stages: &'a mut Stages,
    pub lag: &'a LagWatch,
    pub progress: &'a MultiProgress,
    /// How long after the last record was produced the run may take to settle.
    pub settle_within: Duration,
    /// Partitions of the pipeline topics.
    pub partitions: i32,
}

/// Counters read from the stages' `/metrics` at a point in time.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    duplicates: f64,
    invalid: f64,
    dead: f64,
}

async fn counters(stages: &Stages) -> anyhow::Result<Counters> {
    Ok(Counters {
        duplicates: stages
            .metric("deduper", "hookline_deduper_duplicates_total", None)
            .await?,
        invalid: stages
            .metric("deduper", "hookline_deduper_invalid_events_total", None)
            .await?,
        dead: stages
            .metric(
                "retry-tiers",
                "hookline_retry_records_total",
                Some(("outcome", "dead_exhausted")),
            )
            .await?,
    })
}

pub async fn run(ctx: &mut Ctx<'_>, spec: &RunSpec) -> anyhow::Result<RunResult> {
    ctx.stages.check_alive()?;
    ctx.lag.take_max();
    let run_start = Instant::now();
    let cpu0 = ctx.stages.cpu_seconds()?;
    let (bench0, machine0) = (cpu_seconds(std::process::id())?, machine_busy_seconds()?);
    let c0 = counters(ctx.stages).await?;
    let marks0 = if spec.hops {
        let (config, n) = (ctx.config.clone(), ctx.partitions);
        Some(
            tokio::task::spawn_blocking(move || hops::marks(&config, n))
                .await
                .context("hop marks panicked")??,
        )
    } else {
        None
    };
    let planned_dups_invalid = spec
        .plan
        .iter()
        .filter(|r| !matches!(r, Planned::Fresh { .. }))
        .count() as f64;
    let (_, expected) = ledger::progress(&ctx.sink.book(), &spec.plan, &*spec.expect);
    let bar = ctx.progress.add(ProgressBar::new(expected));
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>9} [{bar:32}] {pos}/{len} deliveries {per_sec:>12} {msg}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(spec.name.clone());
    bar.set_message(match spec.rate {
        Some(r) => format!("producing at {r:.0}/s"),
        None => "producing as fast as possible".into(),
    });
    let base = ctx.sink.delivered_total();

    let sink = ctx.sink;
    let events = Topics::new(&ctx.config.topics.prefix).events();
    let placement = Placement::new(ctx.config);
    let producing = load::produce(
        ctx.producer,
        &events,
        &spec.plan,
        &spec.tenants,
        spec.rate,
        spec.payload_bytes,
        placement.as_ref(),
    );
    let ticker = async {
        loop {
            bar.set_position(sink.delivered_total().saturating_sub(base));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let produced = tokio::select! {
        p = producing => p?,
        _ = ticker => unreachable!("the ticker never ends"),
    };

    // Settle: every expected delivery received or dead, every duplicate / invalid counted.
    bar.set_message("settling");
    let deadline = Instant::now() + ctx.settle_within;
    let expected_dead: u64 = spec.plan.iter().map(|r| (spec.expect)(r).dead as u64).sum();
    loop {
        ctx.stages.check_alive()?;
        // Cheap check first: the full scan and the metric scrapes cost CPU on the box being
        // measured, so they wait until the sink has answered enough requests to be done.
        let answered = ctx.sink.delivered_total().saturating_sub(base);
        if answered + expected_dead < expected && Instant::now() < deadline {
            bar.set_position(answered);
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let (received, expected) = ledger::progress(&ctx.sink.book(), &spec.plan, &*spec.expect);
        let c = counters(ctx.stages).await?;
        bar.set_position(received);
        let dead = (c.dead - c0.dead).max(0.0) as u64;
        let dropped = (c.duplicates - c0.duplicates) + (c.invalid - c0.invalid);
        if received + dead >= expected && dropped >= planned_dups_invalid {
            break;
        }
        if Instant::now() > deadline {
            bar.set_message("did not settle");
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let cpu1 = ctx.stages.cpu_seconds()?;
    let run_wall = run_start.elapsed();
    let (bench1, machine1) = (cpu_seconds(std::process::id())?, machine_busy_seconds()?);
    let c1 = counters(ctx.stages).await?;
    let dead_letters = {
        let (config, tag) = (ctx.config.clone(), spec.tag.clone());
        let dlq = Topics::new(&config.topics.prefix).dlq();
        tokio::task::spawn_blocking(move || ledger::read_dead_letters(&config, &dlq, &tag))
            .await
            .context("dlq reader panicked")??
    };
    // The sink's book is a std mutex: read everything from it in this block, before any await.
    let (ledger, mut receipts, firsts) = {
        let book = ctx.sink.book();
        let ledger = ledger::settle(
            &spec.plan,
            &*spec.expect,
            &book,
            &dead_letters,
            StageCounts {
                deduplicated: (c1.duplicates - c0.duplicates).max(0.0) as u64,
                invalid: (c1.invalid - c0.invalid).max(0.0) as u64,
            },
        );

        // Healthy receipts of this run: (receipt ns, scheduled ns, endpoint).
        let mut receipts: Vec<(u64, u64, u16)> = Vec::new();
        for rec in &spec.plan {
            if let Planned::Fresh { id, .. } = rec {
                let e = (spec.expect)(rec);
                if let Some(rs) = book.by_id.get(id) {
                    receipts.extend(
                        rs.iter()
                            .filter(|r| e.healthy.contains(&r.endpoint))
                            .map(|r| (r.recv_ns, r.sched_ns, r.endpoint)),
                    );
                }
            }
        }
        // First healthy receipt per fresh event, for the per-hop split.
        let firsts: Vec<(String, u64, u64)> = if spec.hops {
            spec.plan
                .iter()
                .filter_map(|rec| match rec {
                    Planned::Fresh { id, .. } => {
                        let e = (spec.expect)(rec);
                        let rs = book.by_id.get(id)?;
                        rs.iter()
                            .filter(|r| e.healthy.contains(&r.endpoint))
                            .map(|r| (r.sched_ns, r.recv_ns))
                            .min_by_key(|r| r.1)
                            .map(|(s, r)| (id.clone(), s, r))
                    }
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        (ledger, receipts, firsts)
    };
    let hop_latency = match marks0 {
        Some(from) => {
            let (config, n, tag) = (ctx.config.clone(), ctx.partitions, spec.tag.clone());
            tokio::task::spawn_blocking(move || {
                let to = hops::marks(&config, n)?;
                hops::measure(&config, &from, &to, &tag, &firsts)
            })
            .await
            .context("hop reader panicked")??
        }
        None => Vec::new(),
    };
    receipts.sort_unstable();
    let deliveries = receipts.len() as u64;
    let first = produced.first_sched_ns;
    let rate_over = |rs: &[(u64, u64, u16)]| -> f64 {
        match rs.last() {
            Some(last) if last.0 > first => rs.len() as f64 / ((last.0 - first) as f64 / 1e9),
            _ => 0.0,
        }
    };
    let steady_per_s = if receipts.len() >= 10 {
        let (a, b) = (receipts.len() / 10, receipts.len() * 9 / 10);
        let span = (receipts[b].0.saturating_sub(receipts[a].0)) as f64 / 1e9;
        if span > 0.0 {
            (b - a) as f64 / span
        } else {
            0.0
        }
    } else {
        0.0
    };
    // An open-model run kept up when the deliveries came at (nearly) the rate they were due:
    // whole-run figures include the last events' latency, hence the 10% margin.
    let kept_up = spec.rate.map(|r| {
        let due_per_s = r * deliveries as f64 / produced.records.max(1) as f64;
        rate_over(&receipts) >= 0.9 * due_per_s
    });
    let healthy_per_s = spec.exclude_from_healthy.map(|h| {
        let healthy: Vec<_> = receipts.iter().copied().filter(|r| r.2 != h).collect();
        rate_over(&healthy)
    });
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    for (recv, sched, _) in &receipts {
        if *sched > 0 {
            hist.saturating_record(recv.saturating_sub(*sched).max(1) / 1_000);
        }
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1_000.0;
    let latency = Latency {
        samples: hist.len(),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: hist.max() as f64 / 1_000.0,
    };
    let cpu = STAGES
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            let s = cpu1.get(i).copied().unwrap_or(0.0) - cpu0.get(i).copied().unwrap_or(0.0);
            let units = if i == 0 {
                produced.records as u64
            } else {
                deliveries
            };
            let per = if units > 0 { s / units as f64 } else { 0.0 };
            StageCpu {
                stage: stage.to_string(),
                cpu_s: s,
                us_per_unit: per * 1e6,
                cpu_s_per_1000: per * 1_000.0,
            }
        })
        .collect();
    bar.finish_with_message(if ledger.balanced {
        "ledger balanced".to_string()
    } else {
        "ledger INVALID".to_string()
    });
    Ok(RunResult {
        name: spec.name.clone(),
        target_rate: spec.rate,
        produced: produced.records as u64,
        deliveries,
        first_sched_ns: first,
        elapsed_s: receipts
            .last()
            .map(|l| l.0.saturating_sub(first) as f64 / 1e9)
            .unwrap_or(0.0),
        sustained_per_s: rate_over(&receipts),
        steady_per_s,
        healthy_per_s,
        latency,
        hops: hop_latency,
        cpu,
        max_lag: ctx.lag.take_max().into_iter().collect::<BTreeMap<_, _>>(),
        producer_max_behind_ms: produced.max_behind.as_secs_f64() * 1e3,
        kept_up,
        machine_cpu: {
            let stages: f64 = cpu1.iter().sum::<f64>() - cpu0.iter().sum::<f64>();
            let busy = machine1 - machine0;
            let bench = bench1 - bench0;
            MachineCpu {
                wall_s: run_wall.as_secs_f64(),
                busy_s: busy,
                stages_s: stages,
                bench_s: bench,
                rest_s: (busy - stages - bench).max(0.0),
            }
        },
        ledger,
    })
}

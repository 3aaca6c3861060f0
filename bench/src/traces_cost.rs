//! What traces cost at 100% sampling (issue 34): the same backlog drained twice, first by the
//! stages as they ran the rest of the bench (traces off, the default), then by the same stages
//! restarted with `[traces] enabled = true` and `sample_ratio = 1.0`, every span exported over
//! OTLP/HTTP to the sink's `/v1/traces`. Reported: each run's CPU per delivery per stage and the
//! difference, and the OTLP bytes exported per delivery. The "off" run is also what tracing
//! costs when it is off: the same code path the other runs measure; and the span sites a
//! delivery passes, timed alone with tracing off ([`off_path_ns`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::load::{self, Mix, Planned};
use crate::phases::{self, Ctx, RunSpec};
use crate::report::RunResult;

#[derive(Debug, Clone, Serialize)]
pub struct TraceCost {
    pub events: usize,
    /// Stage CPU µs per delivery (the deduper: per produced record), traces off and on.
    pub off_us: BTreeMap<String, f64>,
    pub on_us: BTreeMap<String, f64>,
    /// on − off, per stage.
    pub delta_us: BTreeMap<String, f64>,
    /// Deliveries/s of both drains.
    pub off_per_s: f64,
    pub on_per_s: f64,
    /// OTLP exports the sink received during the traced run, and bytes per delivery.
    pub otlp_requests: u64,
    pub otlp_bytes_per_delivery: f64,
    /// ns per delivery of its span sites (a dedupe span, an attempt span and its header) while
    /// tracing is off, timed in the bench process.
    pub off_path_ns: f64,
}

/// What the span sites of one delivery cost while tracing is off (this process never enables
/// it): a dedupe span, an attempt span with its attributes, and the context for the next hop,
/// `n` times; ns per delivery.
pub fn off_path_ns(n: usize) -> f64 {
    use hookline_common::runtime::traces::{enabled, Kind, Span};
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let start = Instant::now();
    for i in 0..n {
        if enabled() {
            unreachable!("the bench process never turns tracing on");
        }
        let dedupe = Span::start("hookline.dedupe", Kind::Consumer, Some(PARENT), None);
        std::hint::black_box(dedupe.traceparent());
        let mut attempt = Span::start("hookline.attempt", Kind::Client, Some(PARENT), None);
        if attempt.is_live() {
            attempt.int("hookline.attempt", i as i64);
        }
        std::hint::black_box(attempt.traceparent());
    }
    start.elapsed().as_nanos() as f64 / n.max(1) as f64
}

fn per_stage(r: &RunResult) -> BTreeMap<String, f64> {
    r.cpu
        .iter()
        .map(|c| (c.stage.clone(), c.us_per_unit))
        .collect()
}

/// The two drains (the stages restarted in between with `traced_config`, logs in `dir`).
pub async fn run(
    ctx: &mut Ctx<'_>,
    hookline: &Path,
    traced_config: &Path,
    dir: &Path,
    events: usize,
    mix: &Mix,
    spec: &dyn Fn(&str, &str, Vec<Planned>) -> RunSpec,
) -> anyhow::Result<(Vec<RunResult>, TraceCost)> {
    let off_path = off_path_ns(1_000_000);
    let off = phases::run(
        ctx,
        &spec(
            "trace-off",
            "troff",
            load::plan("troff", events, 1, mix, 11),
        ),
    )
    .await?;
    std::fs::create_dir_all(dir)?;
    ctx.stages
        .restart(hookline, traced_config, dir, Duration::from_secs(40))
        .await?;
    ctx.stages.wait_ready(Duration::from_secs(120)).await?;
    let (requests_before, bytes_before) = ctx.sink.otlp_received();
    let on = phases::run(
        ctx,
        &spec("trace-on", "tron", load::plan("tron", events, 1, mix, 12)),
    )
    .await?;
    // The exporter batches every 5 s: wait for the run's last spans.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (requests, bytes) = ctx.sink.otlp_received();
    let (off_us, on_us) = (per_stage(&off), per_stage(&on));
    let delta_us = on_us
        .iter()
        .map(|(k, v)| (k.clone(), v - off_us.get(k).copied().unwrap_or(0.0)))
        .collect();
    let cost = TraceCost {
        events,
        off_us,
        on_us,
        delta_us,
        off_per_s: off.sustained_per_s,
        on_per_s: on.sustained_per_s,
        otlp_requests: requests - requests_before,
        otlp_bytes_per_delivery: (bytes - bytes_before) as f64
            / on.ledger.deliveries_received.max(1) as f64,
        off_path_ns: off_path,
    };
    anyhow::ensure!(
        cost.otlp_requests > 0,
        "the traced run exported no spans to the sink (see the stage logs in {})",
        dir.display()
    );
    Ok((vec![off, on], cost))
}

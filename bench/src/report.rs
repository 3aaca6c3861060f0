//! What a benchmark run reports: the JSON document (written under `target/bench/`) and the table
//! printed at the end. A run whose ledger does not balance prints INVALID in place of its numbers,
//! and the ratios built on it print INVALID too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::ceilings::{HttpCeiling, KafkaCeiling};
use crate::hops::HopLatency;
use crate::ledger::Ledger;
use crate::options::Options;

#[derive(Debug, Clone, Serialize, Default)]
pub struct Latency {
    pub samples: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// CPU one stage used during a run.
#[derive(Debug, Clone, Serialize)]
pub struct StageCpu {
    pub stage: String,
    pub cpu_s: f64,
    /// Per delivery (the deduper: per produced record), in µs.
    pub us_per_unit: f64,
    /// CPU seconds per 1,000 deliveries (the deduper: per 1,000 produced records).
    pub cpu_s_per_1000: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub name: String,
    /// Records/s the producer was scheduled at (None: as fast as possible).
    pub target_rate: Option<f64>,
    pub produced: u64,
    /// Healthy deliveries booked by the sink.
    pub deliveries: u64,
    /// Unix ns of the first scheduled send.
    pub first_sched_ns: u64,
    /// From the first scheduled send to the last healthy receipt.
    pub elapsed_s: f64,
    /// Deliveries/s over the whole run: first scheduled send to last healthy receipt. The
    /// headline figure (ratios and the latency runs' rates derive from it): it includes start-up
    /// and tail, so it never flatters.
    pub sustained_per_s: f64,
    /// Deliveries/s between the 10th and the 90th percentile receipt. Bursty on small runs
    /// (a committed transaction releases a batch at once): indicative only.
    pub steady_per_s: f64,
    /// Isolation runs: deliveries/s to every endpoint but the hanging one, whole run.
    pub healthy_per_s: Option<f64>,
    pub latency: Latency,
    /// Open-model runs: the latency split by hop (see [`crate::hops`]); empty otherwise.
    pub hops: Vec<HopLatency>,
    pub cpu: Vec<StageCpu>,
    pub max_lag: BTreeMap<String, i64>,
    pub producer_max_behind_ms: f64,
    /// Open-model runs: whether deliveries kept pace with the schedule (≥ 90% of the due rate).
    pub kept_up: Option<bool>,
    pub machine_cpu: MachineCpu,
    pub ledger: Ledger,
}

/// Where the machine's CPU went during a run (core-seconds). `rest` is the broker plus anyone
/// else on the box: on a shared machine it says how noisy the run was.
#[derive(Debug, Clone, Serialize, Default)]
pub struct MachineCpu {
    pub wall_s: f64,
    pub busy_s: f64,
    pub stages_s: f64,
    pub bench_s: f64,
    pub rest_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub mem_total: String,
    pub kernel: String,
    pub loadavg_at_start: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    /// Deliveries/s of the fastest search probe that kept up, over the HTTP ceiling (None when
    /// no probe kept up).
    pub sustainable_over_http: Option<f64>,
    /// Backlog drain (the `max` run) over the HTTP ceiling: an upper bound, not sustainable.
    pub pipeline_over_http: Option<f64>,
    pub pipeline_over_kafka: Option<f64>,
    /// Backlog drain over the bare relay (one consumer POSTing each record).
    pub pipeline_over_bare_relay: Option<f64>,
    /// Backlog drain over the same-shape relay (two bare hops, then the bare relay).
    pub pipeline_over_same_shape_relay: Option<f64>,
    /// `pipeline_over_same_shape_relay` split into its two factors.
    pub same_shape_split: Option<RatioSplit>,
    /// `pipeline_over_bare_relay` split into its two factors.
    pub bare_split: Option<RatioSplit>,
    /// Healthy deliveries/s with 1 of 100 endpoints hanging, over the same without.
    pub isolation: Option<f64>,
}

/// A rate ratio (hookline's drain over a reference) as the product of two factors, so that a
/// ratio below target says whether the path costs too much CPU or leaves the machine idle:
/// `ratio = cpu × busy`. Each side's machine CPU per delivery is the whole box's busy time
/// (stages or relay clients, broker, bench producer and sink) over its deliveries, and its
/// utilisation is `rate × CPU per delivery / cores` (hookline's busy time includes its run's
/// settle tail, a slight overstatement of its CPU).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RatioSplit {
    /// Machine CPU per delivery of the reference over hookline's (< 1: hookline costs more).
    pub cpu: f64,
    /// hookline's utilisation of the machine over the reference's (< 1: hookline waits more).
    pub busy: f64,
    /// hookline's machine CPU per delivery, µs.
    pub pipeline_cpu_us: f64,
    /// hookline's utilisation of the machine (0..1).
    pub pipeline_busy: f64,
    /// The reference's utilisation of the machine (0..1).
    pub reference_busy: f64,
}

impl RatioSplit {
    /// `None` when either side has no CPU or rate to compare.
    pub fn new(
        pipeline_per_s: f64,
        pipeline_cpu_us: f64,
        reference_per_s: f64,
        reference_cpu_us: f64,
        cores: usize,
    ) -> Option<RatioSplit> {
        let cores = cores.max(1) as f64;
        let busy = |per_s: f64, cpu_us: f64| per_s * cpu_us / 1e6 / cores;
        let (p, r) = (
            busy(pipeline_per_s, pipeline_cpu_us),
            busy(reference_per_s, reference_cpu_us),
        );
        (pipeline_cpu_us > 0.0 && r > 0.0).then(|| RatioSplit {
            cpu: reference_cpu_us / pipeline_cpu_us,
            busy: p / r,
            pipeline_cpu_us,
            pipeline_busy: p,
            reference_busy: r,
        })
    }
}

/// The in-flight run: the dispatcher holding many deliveries open at once (the sink holds each
/// request), sampled every 100 ms.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Inflight {
    /// Deliveries the run meant to hold open at once.
    pub target: usize,
    pub hold_s: f64,
    /// Highest `hookline_delivery_inflight_requests{stage="dispatcher"}` sampled.
    pub peak_inflight: u64,
    /// Requests the sink was holding at that sample.
    pub sink_open_at_peak: u64,
    /// Dispatcher VmRSS at that sample and before the run, MiB.
    pub rss_at_peak_mib: f64,
    pub rss_before_mib: f64,
    /// Highest dispatcher VmRSS sampled during the run, MiB.
    pub rss_max_mib: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub date: String,
    pub command_line: String,
    pub machine: Machine,
    pub options: Options,
    pub prefix: String,
    pub http_ceiling: HttpCeiling,
    pub kafka_ceiling: KafkaCeiling,
    /// The references of issue 24 ([`crate::relays`]).
    pub bare_relay: crate::relays::Relay,
    pub same_shape_relay: crate::relays::Relay,
    /// What a payload filter costs per evaluation (measured on this box in this run).
    pub filter_cost: crate::filter_cost::FilterCost,
    pub runs: Vec<RunResult>,
    pub ratios: Ratios,
    /// The bisection for the max sustainable rate.
    pub sustainable: crate::search::Found,
    /// The in-flight run (None when skipped).
    pub inflight: Option<Inflight>,
    /// A neighbour beside a rate-limited drain (None when skipped).
    pub neighbour: Option<crate::neighbour::Neighbour>,
    /// What traces cost at 100% sampling (None when skipped).
    pub trace_cost: Option<crate::traces_cost::TraceCost>,
    /// The many-endpoints phase (None when skipped: `--endpoints 0`).
    pub fleet: Option<crate::fleet::Fleet>,
    /// VmHWM of each stage process at the end, bytes.
    pub peak_rss: BTreeMap<String, u64>,
    /// (id, endpoint) pairs the sink received more than once (at-least-once re-sends).
    pub redelivered: u64,
    /// True when every run's ledger balanced.
    pub valid: bool,
    pub json_path: Option<PathBuf>,
}

impl Machine {
    pub fn read() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        Machine {
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
                .unwrap_or_default(),
            mem_total: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .map(|v| v.trim().to_string())
                .unwrap_or_default(),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            loadavg_at_start: read("/proc/loadavg").trim().to_string(),
        }
    }
}

fn num(v: f64) -> String {
    if v >= 100.0 {
        let s = format!("{:.0}", v);
        // Thousands separators for readability.
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio(v: Option<f64>, valid: bool) -> String {
    match (v, valid) {
        (_, false) => "INVALID".into(),
        (Some(r), true) => format!("{r:.2}"),
        (None, true) => "-".into(),
    }
}

/// " = CPU 0.46 × busy 0.87 (…)" after a ratio, or nothing.
fn split(v: Option<RatioSplit>, valid: bool) -> String {
    match (v, valid) {
        (Some(s), true) => format!(
            " = CPU per delivery {:.2} × machine busy {:.2}  (hookline {} µs machine CPU/delivery, {:.0}% busy; the relay {:.0}%)",
            s.cpu,
            s.busy,
            num(s.pipeline_cpu_us),
            s.pipeline_busy * 100.0,
            s.reference_busy * 100.0
        ),
        _ => String::new(),
    }
}

impl Report {
    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let m = &self.machine;
        let _ = writeln!(
            t,
            "hookline-bench {}  prefix {}  {} cores ({})  load at start: {}",
            self.date, self.prefix, m.cores, m.cpu_model, m.loadavg_at_start
        );
        let h = &self.http_ceiling;
        let _ = writeln!(
            t,
            "HTTP ceiling : {} POST/s  ({} requests, concurrency {}, client+sink {} µs CPU/request)",
            num(h.per_s),
            h.requests,
            h.concurrency,
            num(h.bench_cpu_us_per_request)
        );
        let k = &self.kafka_ceiling;
        let _ = writeln!(
            t,
            "Kafka ceiling: {} records/s  (produce + consume, {} records, {} partitions, client {} µs CPU/record)",
            num(k.per_s),
            k.records,
            self.options.partitions,
            num(k.bench_cpu_us_per_record)
        );
        for (label, r) in [
            ("Bare relay   ", &self.bare_relay),
            ("Same-shape   ", &self.same_shape_relay),
        ] {
            let _ = writeln!(
                t,
                "{label}: {} POST/s  ({} records, {} bare consume→produce hop(s), then one consumer POSTing each record; bench {} µs CPU/record, machine {} µs)",
                num(r.per_s),
                r.records,
                r.hops,
                num(r.bench_cpu_us_per_record),
                num(r.machine_cpu_us_per_record)
            );
        }
        let f = &self.filter_cost;
        let _ = writeln!(
            t,
            "Filter cost  : {} µs on type only, {} µs on data (body parsed, {} B), +{} µs per further filtered endpoint of the event  ({} evaluations each)",
            num(f.type_only_us),
            num(f.data_first_us),
            f.payload_bytes,
            num(f.data_more_us),
            f.evaluations
        );
        let _ = writeln!(
            t,
            "\n{:<9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}  ledger",
            "run",
            "target/s",
            "produced",
            "deliv.",
            "sust. d/s",
            "healthy/s",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max lag",
        );
        for r in &self.runs {
            let target = match (r.target_rate, r.kept_up) {
                (Some(t), Some(false)) => format!("{}!", num(t)),
                (Some(t), _) => num(t),
                (None, _) => "max".into(),
            };
            if !r.ledger.balanced {
                let _ = writeln!(
                    t,
                    "{:<9} {:>9} {:>8} INVALID: {}",
                    r.name,
                    target,
                    r.produced,
                    r.ledger.problems.join("; ")
                );
                continue;
            }
            let lag = r.max_lag.values().copied().max().unwrap_or(0);
            let _ = writeln!(
                t,
                "{:<9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}  ok",
                r.name,
                target,
                r.produced,
                r.deliveries,
                num(r.sustained_per_s),
                r.healthy_per_s.map(num).unwrap_or_else(|| "-".into()),
                num(r.latency.p50_ms),
                num(r.latency.p99_ms),
                num(r.latency.p999_ms),
                lag
            );
        }
        if self.runs.iter().any(|r| r.kept_up == Some(false)) {
            let _ = writeln!(
                t,
                "  ! deliveries fell behind the schedule: the rate is above what was sustainable"
            );
        }
        if self.runs.iter().any(|r| !r.hops.is_empty()) {
            let _ = writeln!(
                t,
                "\nlatency by hop, p50 / p99 ms (produce: schedule → <p>.events; validate: → <p>.dedupe; dedupe: → <p>.dispatch, from <p>.events for an event read in place; dispatch: → receipt)"
            );
            for r in self.runs.iter().filter(|r| !r.hops.is_empty()) {
                let _ = write!(t, "  {:<9}", r.name);
                for h in &r.hops {
                    if h.samples == 0 {
                        // `validate` with every event read in place (`dedupe.direct`).
                        let _ = write!(t, "  {} -", h.hop);
                        continue;
                    }
                    let _ = write!(t, "  {} {} / {}", h.hop, num(h.p50_ms), num(h.p99_ms));
                }
                let _ = writeln!(t);
            }
        }
        let _ = writeln!(
            t,
            "\nmachine CPU per run, core-seconds (wall x {} cores available): busy = stages + bench (sink, producer) + rest (broker, other users)",
            self.machine.cores
        );
        for r in &self.runs {
            let c = &r.machine_cpu;
            let _ = writeln!(
                t,
                "  {:<9} wall {:>6} s  busy {:>7} of {:>7}  stages {:>7}  bench {:>6}  rest {:>6}",
                r.name,
                num(c.wall_s),
                num(c.busy_s),
                num(c.wall_s * self.machine.cores as f64),
                num(c.stages_s),
                num(c.bench_s),
                num(c.rest_s)
            );
        }
        let _ = writeln!(
            t,
            "\nper stage CPU (deduper per produced record, others per delivery), peak RSS:"
        );
        let _ = write!(t, "{:<12} {:>8}", "stage", "RSS MiB");
        for r in &self.runs {
            let _ = write!(t, " {:>16}", format!("{} µs", r.name));
        }
        let _ = writeln!(t);
        for (i, stage) in crate::stages::STAGES.iter().enumerate() {
            let rss = self.peak_rss.get(*stage).copied().unwrap_or(0) as f64 / 1048576.0;
            let _ = write!(t, "{:<12} {:>8}", stage, num(rss));
            for r in &self.runs {
                let cell = match (r.ledger.balanced, r.cpu.get(i)) {
                    (true, Some(c)) => num(c.us_per_unit),
                    (false, _) => "INVALID".into(),
                    (true, None) => "-".into(),
                };
                let _ = write!(t, " {cell:>16}");
            }
            let _ = writeln!(t);
        }
        let max_valid = self.runs.first().is_some_and(|r| r.ledger.balanced);
        let search_valid = self
            .runs
            .iter()
            .filter(|r| r.name.starts_with("search-"))
            .all(|r| r.ledger.balanced);
        let iso_valid = self
            .runs
            .iter()
            .filter(|r| r.name.starts_with("iso"))
            .all(|r| r.ledger.balanced);
        let _ = writeln!(
            t,
            "\nmax sustainable rate    : {} records/s{} (backlog drain {} records/s; probes: {})\nsustainable / HTTP ceiling: {}\npipeline (drain) / HTTP ceiling : {}\npipeline (drain) / Kafka ceiling: {}\npipeline (drain) / same-shape relay: {}  (issue 24's target ≥ 0.8){}\npipeline (drain) / bare relay      : {}  (target ≥ 0.5){}\nisolation (99 healthy endpoints, 1 hanging vs none): {}",
            num(self.sustainable.rate),
            if self.sustainable.verified { "" } else { " (UNVERIFIED: no probe kept up)" },
            num(self.sustainable.drain_rate),
            self.sustainable
                .probes
                .iter()
                .map(|p| format!("{}{}", num(p.rate), if p.sustained { " ok" } else { " behind" }))
                .collect::<Vec<_>>()
                .join(", "),
            ratio(self.ratios.sustainable_over_http, search_valid),
            ratio(self.ratios.pipeline_over_http, max_valid),
            ratio(self.ratios.pipeline_over_kafka, max_valid),
            ratio(self.ratios.pipeline_over_same_shape_relay, max_valid),
            split(self.ratios.same_shape_split, max_valid),
            ratio(self.ratios.pipeline_over_bare_relay, max_valid),
            split(self.ratios.bare_split, max_valid),
            ratio(self.ratios.isolation, iso_valid)
        );
        if let Some(n) = &self.neighbour {
            let pairs: Vec<String> = n
                .pairs
                .iter()
                .map(|p| {
                    format!(
                        "{}/{} = {:.2}{}",
                        num(p.beside_per_s),
                        num(p.alone_per_s),
                        p.ratio,
                        if p.limited_waiting_at_end == 0 {
                            " (drain over: not counted)"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            let _ = writeln!(
                t,
                "neighbour beside a {}/s rate-limited drain / alone: {} (median of pairs; beside/alone deliveries/s: {}); limited endpoint: at most {} in any 1 s{}",
                num(n.limit_per_s),
                match n.ratio_median {
                    Some(_) => ratio(n.ratio_median, n.valid),
                    None => "- (no drain outlasted its beside run)".into(),
                },
                pairs.join(", "),
                n.limited_max_per_s,
                if n.limited_complete { "" } else { ", NOT every delivery arrived" }
            );
        }
        if let Some(f) = &self.fleet {
            t.push_str(&f.table());
        }
        if let Some(c) = &self.trace_cost {
            let stages: Vec<String> = c
                .on_us
                .keys()
                .map(|k| {
                    format!(
                        "{k} {:.1} -> {:.1} µs ({:+.1})",
                        c.off_us.get(k).copied().unwrap_or(0.0),
                        c.on_us[k],
                        c.delta_us.get(k).copied().unwrap_or(0.0)
                    )
                })
                .collect();
            let _ = writeln!(
                t,
                "traces at 100% sampling ({} events, off -> on per delivery): {}; {} -> {} deliveries/s; {} OTLP exports, {:.0} B per delivery; span sites while off: {:.1} ns per delivery",
                c.events,
                stages.join(", "),
                num(c.off_per_s),
                num(c.on_per_s),
                c.otlp_requests,
                c.otlp_bytes_per_delivery,
                c.off_path_ns
            );
        }
        if let Some(i) = &self.inflight {
            let valid = self
                .runs
                .iter()
                .filter(|r| r.name == "inflight")
                .all(|r| r.ledger.balanced);
            let _ = writeln!(
                t,
                "in flight (sink holds each request {:.1} s): {}",
                i.hold_s,
                if valid {
                    format!(
                        "peak {} deliveries in flight (target {}, sink holding {}); dispatcher RSS {:.1} MiB at the peak, {:.1} MiB max, {:.1} MiB before",
                        num(i.peak_inflight as f64),
                        num(i.target as f64),
                        num(i.sink_open_at_peak as f64),
                        i.rss_at_peak_mib,
                        i.rss_max_mib,
                        i.rss_before_mib
                    )
                } else {
                    "INVALID".into()
                }
            );
        }
        let _ = writeln!(
            t,
            "\nledger: produced = delivered + deduplicated + dead + invalid"
        );
        for r in &self.runs {
            let l = &r.ledger;
            let _ = writeln!(
                t,
                "  {:<9} {} = {} + {} + {} + {}  {}",
                r.name,
                l.produced,
                l.delivered,
                l.deduplicated,
                l.dead,
                l.invalid,
                if l.balanced { "balanced" } else { "INVALID" }
            );
        }
        if self.redelivered > 0 {
            let _ = writeln!(
                t,
                "  the sink received {} (event, endpoint) pairs more than once",
                self.redelivered
            );
        }
        if let Some(p) = &self.json_path {
            let _ = writeln!(t, "\nJSON: {}", p.display());
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(num(1234567.4), "1,234,567");
        assert_eq!(num(123.0), "123");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(ratio(Some(0.456), true), "0.46");
        assert_eq!(ratio(Some(0.456), false), "INVALID");
    }
}

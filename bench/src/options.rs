//! Command-line options of `hookline-bench`, and the smoke profile.
//!
//! Every knob of the event mix and of each phase is an option so a run can be reproduced from its
//! JSON file (which records them). `--smoke` swaps in a seconds-long profile for the test command:
//! it checks that every ledger balances and every number comes out, never a speed.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

#[derive(Parser, Debug, Clone, Serialize)]
#[command(
    name = "hookline-bench",
    about = "End-to-end benchmark of hookline against a local Kafka and a local HTTP sink"
)]
pub struct Options {
    /// Kafka bootstrap servers (the local broker; every run uses its own topic prefix).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// The `hookline` binary to run (one process per stage). Build it with
    /// `cargo build --release --bin hookline`.
    #[arg(long, default_value = "target/release/hookline")]
    pub hookline: PathBuf,
    /// Where the JSON result, stage configs and stage logs go.
    #[arg(long, default_value = "target/bench")]
    pub out_dir: PathBuf,
    /// Records produced in the max-rate pipeline run (and requests / records of each ceiling).
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    /// Partitions of every pipeline topic and of the Kafka-ceiling topic.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Fraction of produced records that re-send an earlier event id (with different bytes).
    #[arg(long, default_value_t = 0.1)]
    pub duplicate_ratio: f64,
    /// Healthy endpoints each event is delivered to.
    #[arg(long, default_value_t = 1)]
    pub endpoints_per_event: u16,
    /// Size of each event's JSON body in bytes (padded).
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Fraction of unique events that also go to an endpoint answering 500 (they end dead).
    #[arg(long, default_value_t = 0.001)]
    pub failing_fraction: f64,
    /// Fraction of produced records that are not JSON (quarantined on `<p>.invalid`).
    #[arg(long, default_value_t = 0.001)]
    pub invalid_fraction: f64,
    /// Length of each latency run (at 50% and 90% of the max rate).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    #[serde(with = "secs")]
    pub latency_duration: Duration,
    /// Probes of the bisection for the max sustainable open-model rate (0: take the backlog-drain
    /// rate as the max, unverified).
    #[arg(long, default_value_t = 4)]
    pub search_steps: u8,
    /// Length of each search probe.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    #[serde(with = "secs")]
    pub search_duration: Duration,
    /// Skip the search: take this many records/s as the max sustainable rate (for comparing
    /// stage settings at one fixed load; reported as unverified).
    #[arg(long)]
    pub max_rate: Option<f64>,
    /// Skip the two isolation runs.
    #[arg(long)]
    pub no_isolation: bool,
    /// A librdkafka property for every stage client, `key=value` (repeatable): goes into the
    /// stages' `[kafka.options]`, to measure a client setting without rebuilding.
    #[arg(long = "stage-kafka-option", value_parser = parse_key_value)]
    pub stage_kafka_options: Vec<(String, String)>,
    /// The stages' `dedupe.batch_interval` (default: the config default).
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "opt_secs")]
    pub batch_interval: Option<Duration>,
    /// Run the stages with `dedupe.direct = false` (stage A re-partitions every event onto
    /// `<p>.dedupe`), to measure the hop `dedupe.direct` saves.
    #[arg(long)]
    pub split_deduper: bool,
    /// Run the stages with `control.delivery_log = false`, to measure the delivery log's cost.
    #[arg(long)]
    pub no_delivery_log: bool,
    /// Records produced in each isolation run (spread over 100 endpoints). 50,000: at ~20k
    /// deliveries/s the base run lasts ~2.5 s, long enough that one stall does not set the ratio.
    #[arg(long, default_value_t = 50_000)]
    pub isolation_events: usize,
    /// Timeout of the isolation endpoints; the hanging one answers never, so each attempt takes it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    #[serde(with = "secs")]
    pub hang_timeout: Duration,
    /// Deliveries the in-flight run holds open at once (0: skip it): events fanned out to 100
    /// endpoints whose sink holds every request for `--inflight-hold`, to read the dispatcher's
    /// RSS with that many deliveries in flight.
    #[arg(long, default_value_t = 10_000)]
    pub inflight: usize,
    /// How long the sink holds each request of the in-flight run (below the 10 s timeout).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    #[serde(with = "secs")]
    pub inflight_hold: Duration,
    /// Concurrent requests of the HTTP ceiling client (default: what the dispatcher may have in
    /// flight to the pipeline's endpoints: endpoint_concurrency x endpoints per event).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Alternating pairs of neighbour runs alone and beside a rate-limited drain (0: skipped).
    #[arg(long, default_value_t = 4)]
    pub neighbour_pairs: usize,
    /// Events of each neighbour run.
    #[arg(long, default_value_t = 50_000)]
    pub neighbour_events: usize,
    /// Events of each of the two traces-cost drains (traces off, then on at 100% sampling;
    /// 0: skipped).
    #[arg(long, default_value_t = 30_000)]
    pub trace_events: usize,
    /// Registry endpoints of the many-endpoints phase ([`crate::fleet`]; 0: skipped): imported over
    /// N/10 tenants, 1% of them hanging, on a registry and processes of the phase's own. A
    /// multiple of 100.
    #[arg(long, default_value_t = 0)]
    pub endpoints: usize,
    /// Run only the many-endpoints phase (with `--endpoints`): no ceilings, relays or pipeline runs.
    #[arg(long)]
    pub endpoints_only: bool,
    /// Events of each many-endpoints drain (each fanned out to its tenant's 10 endpoints).
    #[arg(long, default_value_t = 10_000)]
    pub fleet_events: usize,
    /// `POST /v1/endpoints` of the many-endpoints phase, from 8 clients into the full registry.
    #[arg(long, default_value_t = 4_000)]
    pub fleet_creates: usize,
    /// Keep the run's topics on the broker (default: delete them at the end).
    #[arg(long)]
    pub keep_topics: bool,
    /// A seconds-long run for the test command: 2,000 events, one short search probe, short latency and
    /// isolation runs.
    #[arg(long)]
    pub smoke: bool,
}

/// `dispatcher.endpoint_concurrency` the stages run with (the config default).
pub const ENDPOINT_CONCURRENCY: usize = 64;

impl Options {
    /// Applies the smoke profile over the defaults (explicit values given with `--smoke` are
    /// overridden too: a smoke run is always the same small run).
    pub fn resolved(mut self) -> Options {
        if self.smoke {
            self.events = 2_000;
            self.failing_fraction = 0.01;
            self.invalid_fraction = 0.005;
            self.latency_duration = Duration::from_secs(2);
            self.search_steps = 1;
            self.search_duration = Duration::from_secs(2);
            self.isolation_events = 500;
            self.hang_timeout = Duration::from_secs(1);
            self.inflight = 500;
            self.inflight_hold = Duration::from_secs(1);
            self.neighbour_pairs = 1;
            self.neighbour_events = 1_000;
            self.trace_events = 1_000;
            self.endpoints = self.endpoints.min(1_000);
            self.fleet_events = 500;
            self.fleet_creates = 200;
        }
        self
    }

    /// Concurrency of the HTTP ceiling client.
    pub fn ceiling_concurrency(&self) -> usize {
        self.concurrency
            .unwrap_or(ENDPOINT_CONCURRENCY * usize::from(self.endpoints_per_event.max(1)))
    }

    /// Cross-field checks, naming the bad option.
    pub fn validate(&self) -> anyhow::Result<()> {
        let fraction = |name: &str, v: f64| {
            if (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err(anyhow::anyhow!("--{name} must be in [0, 1), got {v}"))
            }
        };
        fraction("duplicate-ratio", self.duplicate_ratio)?;
        fraction("failing-fraction", self.failing_fraction)?;
        fraction("invalid-fraction", self.invalid_fraction)?;
        anyhow::ensure!(
            self.duplicate_ratio + self.invalid_fraction < 0.9,
            "--duplicate-ratio + --invalid-fraction must leave most records fresh"
        );
        anyhow::ensure!(self.events >= 100, "--events must be at least 100");
        anyhow::ensure!(
            self.isolation_events >= 100,
            "--isolation-events must be at least 100 (one per endpoint)"
        );
        anyhow::ensure!(
            (1..=50).contains(&self.endpoints_per_event),
            "--endpoints-per-event must be 1..=50"
        );
        anyhow::ensure!(
            self.payload_bytes >= 200 && self.payload_bytes <= 512 * 1024,
            "--payload-bytes must be 200..=524288"
        );
        anyhow::ensure!(
            self.neighbour_pairs == 0 || self.neighbour_events >= 100,
            "--neighbour-events must be at least 100"
        );
        anyhow::ensure!(
            self.endpoints.is_multiple_of(100),
            "--endpoints must be a multiple of 100 (10 per tenant, 1% hanging), got {}",
            self.endpoints
        );
        anyhow::ensure!(
            !self.endpoints_only || self.endpoints > 0,
            "--endpoints-only needs --endpoints N"
        );
        anyhow::ensure!(
            self.fleet_events >= 100,
            "--fleet-events must be at least 100"
        );
        anyhow::ensure!(self.partitions >= 1, "--partitions must be at least 1");
        anyhow::ensure!(
            self.inflight <= 50_000,
            "--inflight must be at most 50000 (each is an open socket on both sides)"
        );
        anyhow::ensure!(
            self.inflight_hold < Duration::from_secs(10),
            "--inflight-hold must stay below the endpoints' 10 s timeout"
        );
        anyhow::ensure!(
            self.hookline.exists(),
            "--hookline {} does not exist: build it with `cargo build --release --bin hookline`",
            self.hookline.display()
        );
        Ok(())
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("--stage-kafka-option wants key=value, got {s:?}")),
    }
}

/// Optional durations in the JSON as seconds (null when unset).
mod opt_secs {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// Durations in the JSON as seconds.
mod secs {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

//! `hookline-bench`: the end-to-end benchmark. Drives the real `hookline` binary (one process per
//! stage) against a local Kafka and a local HTTP sink and reports every pipeline figure as a ratio
//! to ceilings measured in the same run, because the machines are shared and absolute numbers
//! drift. One run, in order:
//!
//! 1. HTTP ceiling and Kafka ceiling ([`ceilings`]), then the two reference relays ([`relays`]:
//!    bare Kafka clients doing no work on hookline's path), before the stages start;
//! 2. the stages start ([`stages`]) with a config written for the run (short retry schedule so
//!    failures reach the DLQ within the run; the sink's loopback address allowed);
//! 3. pipeline runs ([`phases`]): the backlog drain (as fast as possible), then a bisection for
//!    the max *sustainable* open-model rate ([`search`]), then open-model runs at 50% and 90% of
//!    that rate for latency, split by hop ([`hops`]);
//! 4. isolation: 100 endpoints, once all healthy and once with one hanging until its timeout;
//!    then many deliveries held in flight at once;
//! 5. a neighbour beside a rate-limited endpoint's drain, in alternating pairs ([`neighbour`]);
//! 6. every run balances its [`ledger`] or prints INVALID;
//! 7. the [`report`]: a table, a JSON file under `target/bench/`, the ratios.
//!
//! Modules: [`options`] (CLI), [`sink`] (the HTTP sink), [`load`] (the event mix and the
//! open-model producer), [`lag`] (consumer lag sampling).

pub mod ceilings;
pub mod filter_cost;
pub mod fleet;
pub mod hops;
pub mod lag;
pub mod ledger;
pub mod load;
pub mod neighbour;
pub mod options;
pub mod phases;
pub mod relays;
pub mod report;
pub mod search;
pub mod sink;
pub mod stages;
pub mod traces_cost;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use indicatif::{MultiProgress, ProgressBar};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureProducer;

use hookline_common::config::Config;
use hookline_common::contract::secret::decode_secret;
use hookline_common::contract::topics::{self, Topics};
use hookline_common::kafka::{apply_topics, base_config, producer_config};

pub use options::Options;
use report::{Machine, RatioSplit, Ratios, Report};

/// The endpoints' signing secret (any valid `whsec_`; the sink does not verify).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Sink endpoint index of isolation endpoint `iso-0` (`iso-j` is `ISO_BASE + j`).
const ISO_BASE: u16 = 100;
const ISO_ENDPOINTS: u16 = 100;
/// Sink endpoint index of in-flight endpoint `slow-0` (`slow-j` is `SLOW_BASE + j`).
const SLOW_BASE: u16 = 300;
const SLOW_ENDPOINTS: u16 = 100;
/// The retry schedule of the bench: failures reach the DLQ within seconds.
pub(crate) const SCHEDULE: &str = r#"["0s", "1s", "2s"]"#;

/// Runs the whole benchmark and returns its report (also printed and written as JSON).
pub async fn run(opts: Options) -> anyhow::Result<Report> {
    let opts = opts.resolved();
    opts.validate()?;
    let machine = Machine::read();
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let prefix = run_prefix();
    let dir = opts.out_dir.join(&prefix);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sink = sink::Sink::start().await?;
    let config_text = stage_config(&opts, &prefix, &sink);
    let config_path = dir.join("hookline.toml");
    std::fs::write(&config_path, &config_text)?;
    let config = Config::from_toml_with_env(&config_text, "bench config", Vec::new())
        .context("the bench's stage config")?;
    let report = apply_topics(&config, Duration::from_secs(30)).await?;
    anyhow::ensure!(report.drift.is_empty(), "topic drift: {:?}", report.drift);

    let progress = MultiProgress::new();
    let mix = load::Mix {
        duplicate_ratio: opts.duplicate_ratio,
        failing_fraction: opts.failing_fraction,
        invalid_fraction: opts.invalid_fraction,
        payload_bytes: opts.payload_bytes,
    };
    let main_plan = load::plan("max", opts.events, 1, &mix, 1);

    // 1. Ceilings, on a box where the stages are not running yet.
    let spinner = progress.add(ProgressBar::new_spinner());
    spinner.enable_steady_tick(Duration::from_millis(200));
    spinner.set_message("HTTP ceiling");
    let keys = vec![decode_secret(SECRET).map_err(anyhow::Error::msg)?];
    let http = ceilings::http(
        &sink.url("e/0"),
        &keys,
        opts.events,
        opts.ceiling_concurrency(),
        opts.payload_bytes,
    )
    .await?;
    spinner.set_message("Kafka ceiling");
    let ceiling_topic = format!("{prefix}.kafka-ceiling");
    let kafka = ceilings::kafka(&config, &ceiling_topic, &main_plan, opts.payload_bytes).await?;
    spinner.set_message("bare relay");
    let bare_relay = relays::measure(
        &config,
        &sink,
        relays::BARE,
        0,
        &main_plan,
        opts.payload_bytes,
    )
    .await?;
    spinner.set_message("same-shape relay");
    let same_shape_relay = relays::measure(
        &config,
        &sink,
        relays::SAME_SHAPE,
        relays::SAME_SHAPE_HOPS,
        &main_plan,
        opts.payload_bytes,
    )
    .await?;
    spinner.set_message("filter cost");
    let filter_cost = filter_cost::measure(20_000, opts.payload_bytes)?;
    spinner.set_message("starting the stages");

    // 2. The stages.
    let mut stages = stages::Stages::spawn(&opts.hookline, &config_path, &dir)?;
    stages.wait_ready(Duration::from_secs(120)).await?;
    spinner.finish_and_clear();
    let t = Topics::new(&prefix);
    let hops = vec![
        lag::Hop {
            // `dedupe.direct`: stage B reads `<p>.events` and commits its offsets.
            group: config.group_id(if config.dedupe.direct {
                "deduper.dedupe"
            } else {
                "deduper.validate"
            }),
            topic: t.events(),
        },
        lag::Hop {
            group: config.group_id("deduper.dedupe"),
            topic: t.dedupe(),
        },
        lag::Hop {
            group: config.group_id("dispatcher"),
            topic: t.dispatch(),
        },
    ];
    let lag = lag::LagWatch::start(&config, hops, opts.partitions)?;
    let producer: FutureProducer = producer_config(&config).create()?;
    let mut ctx = phases::Ctx {
        config: &config,
        producer: &producer,
        sink: &sink,
        stages: &mut stages,
        lag: &lag,
        progress: &progress,
        settle_within: Duration::from_secs(if opts.smoke { 45 } else { 180 })
            + opts.hang_timeout * 3,
        partitions: opts.partitions,
    };

    // 3. Pipeline: max rate, then latency at 50% and 90% of it.
    let k = opts.endpoints_per_event;
    let main_expect = move |r: &load::Planned| match r {
        load::Planned::Fresh { failing, .. } => ledger::Expect {
            healthy: (0..k).collect(),
            dead: usize::from(*failing),
        },
        _ => ledger::Expect::default(),
    };
    let main_spec =
        |name: &str, tag: &str, plan: Vec<load::Planned>, rate: Option<f64>, hops: bool| {
            phases::RunSpec {
                name: name.into(),
                tag: tag.into(),
                plan,
                tenants: vec!["main".into()],
                rate,
                payload_bytes: opts.payload_bytes,
                expect: Box::new(main_expect),
                exclude_from_healthy: None,
                hops,
            }
        };
    let mut runs = Vec::new();
    let max = phases::run(&mut ctx, &main_spec("max", "max", main_plan, None, false)).await?;
    // The input rate (records/s) the backlog drain reached: the search's upper bound only. A
    // drain batches better than records trickling in, so it overstates what can be sustained.
    let drain_rate = if max.deliveries > 0 && max.sustained_per_s > 0.0 {
        max.sustained_per_s * max.produced as f64 / max.deliveries as f64
    } else {
        100.0
    };
    runs.push(max);
    // Bisection over open-model rates in (0, drain rate]: each probe is a short scheduled run;
    // it passes when it kept up (see `search::sustained`).
    let mut search = search::Bisection::new(drain_rate);
    let steps = if opts.max_rate.is_some() {
        0
    } else {
        opts.search_steps
    };
    for step in 1..=steps {
        let rate = search.next_rate();
        let n = ((rate * opts.search_duration.as_secs_f64()) as usize).max(100);
        let tag = format!("s{step}");
        let plan = load::plan(&tag, n, 1, &mix, 10 + u64::from(step));
        let name = format!("search-{step}");
        let r = phases::run(&mut ctx, &main_spec(&name, &tag, plan, Some(rate), false)).await?;
        search.record(rate, search::sustained(&r, rate));
        runs.push(r);
    }
    let mut found = search.result();
    if let Some(r) = opts.max_rate {
        found.rate = r;
    }
    for (name, tag, share, seed) in [("lat-50%", "l50", 0.5, 2), ("lat-90%", "l90", 0.9, 3)] {
        let rate = found.rate * share;
        let n = ((rate * opts.latency_duration.as_secs_f64()) as usize).max(100);
        let plan = load::plan(tag, n, 1, &mix, seed);
        runs.push(phases::run(&mut ctx, &main_spec(name, tag, plan, Some(rate), true)).await?);
    }

    // 4. Isolation: one event per endpoint round-robin over 100 endpoints, `iso-0` hanging or not.
    let iso_mix = load::Mix {
        failing_fraction: 0.0,
        ..mix.clone()
    };
    let tenants: Vec<String> = (0..ISO_ENDPOINTS).map(|j| format!("iso-{j}")).collect();
    let iso_runs: &[(&str, &str, bool, u64)] = if opts.no_isolation {
        &[]
    } else {
        &[("iso-base", "ib", false, 4), ("iso-hang", "ih", true, 5)]
    };
    for &(name, tag, hanging, seed) in iso_runs {
        sink.set_hanging(hanging);
        let expect = move |r: &load::Planned| match r {
            load::Planned::Fresh { tenant, .. } if hanging && *tenant == 0 => ledger::Expect {
                healthy: vec![],
                dead: 1,
            },
            load::Planned::Fresh { tenant, .. } => ledger::Expect {
                healthy: vec![ISO_BASE + *tenant as u16],
                dead: 0,
            },
            _ => ledger::Expect::default(),
        };
        let spec = phases::RunSpec {
            name: name.into(),
            tag: tag.into(),
            plan: load::plan(
                tag,
                opts.isolation_events,
                usize::from(ISO_ENDPOINTS),
                &iso_mix,
                seed,
            ),
            tenants: tenants.clone(),
            rate: None,
            payload_bytes: opts.payload_bytes,
            expect: Box::new(expect),
            exclude_from_healthy: Some(ISO_BASE),
            hops: false,
        };
        runs.push(phases::run(&mut ctx, &spec).await?);
    }
    sink.set_hanging(false);

    // 5. In flight: events fanned out to 100 endpoints whose requests the sink holds, so the
    // dispatcher has `--inflight` deliveries open at once; its RSS sampled meanwhile.
    let inflight = if opts.inflight > 0 {
        sink.set_slow_delay(opts.inflight_hold);
        let quiet = load::Mix {
            duplicate_ratio: 0.0,
            failing_fraction: 0.0,
            invalid_fraction: 0.0,
            ..mix.clone()
        };
        let spec = phases::RunSpec {
            name: "inflight".into(),
            tag: "if".into(),
            plan: load::plan("if", inflight_events(&opts), 1, &quiet, 6),
            tenants: vec!["slow".into()],
            rate: None,
            payload_bytes: opts.payload_bytes,
            expect: Box::new(|r: &load::Planned| match r {
                load::Planned::Fresh { .. } => ledger::Expect {
                    healthy: (SLOW_BASE..SLOW_BASE + SLOW_ENDPOINTS).collect(),
                    dead: 0,
                },
                _ => ledger::Expect::default(),
            }),
            exclude_from_healthy: None,
            hops: false,
        };
        let (result, probe) = inflight_run(&mut ctx, &spec, &opts).await?;
        runs.push(result);
        Some(probe)
    } else {
        None
    };

    // 6. A neighbour beside a rate-limited endpoint's drain, in alternating pairs (after
    // the in-flight run, whose RSS figures stay comparable with the runs before this section).
    let neighbour = if opts.neighbour_pairs > 0 {
        let spec = |name: &str, tag: &str, plan: Vec<load::Planned>| {
            main_spec(name, tag, plan, None, false)
        };
        let (nb_runs, summary) = neighbour::run(
            &mut ctx,
            opts.neighbour_pairs,
            opts.neighbour_events,
            &mix,
            &spec,
        )
        .await?;
        runs.extend(nb_runs);
        Some(summary)
    } else {
        None
    };

    // Peak RSS of the stages that ran everything so far (the traces-cost section restarts them).
    let peak_rss: BTreeMap<String, u64> = stages::STAGES
        .iter()
        .map(|s| s.to_string())
        .zip(ctx.stages.peak_rss()?)
        .collect();

    // 7. What traces cost at 100% sampling: a drain with traces off, the stages restarted with
    // every span exported to the sink over OTLP/HTTP, the same drain again.
    let trace_cost = if opts.trace_events > 0 {
        let traced = format!(
            "{config_text}
[traces]
enabled = true
sample_ratio = 1.0
endpoint = \"{}\"
",
            sink.url("v1/traces")
        );
        let traced_path = dir.join("hookline-traced.toml");
        std::fs::write(&traced_path, &traced)?;
        let spec = |name: &str, tag: &str, plan: Vec<load::Planned>| {
            main_spec(name, tag, plan, None, false)
        };
        let (tr_runs, cost) = traces_cost::run(
            &mut ctx,
            &opts.hookline,
            &traced_path,
            &dir.join("traced"),
            opts.trace_events,
            &mix,
            &spec,
        )
        .await?;
        runs.extend(tr_runs);
        Some(cost)
    } else {
        None
    };
    // A graceful stop.
    stages.stop(Duration::from_secs(40)).await?;
    drop(lag);
    // 8. Many endpoints, on a registry and processes of its own.
    let fleet = if opts.endpoints > 0 {
        Some(fleet::run(&fleet_setup(&opts, &prefix, &dir), &sink).await?)
    } else {
        None
    };
    if !opts.keep_topics {
        delete_topics(&config, &ceiling_topic).await;
        if fleet.is_some() {
            delete_fleet_topics(&config, &prefix).await;
        }
    }

    let by_name = |n: &str| runs.iter().find(|r| r.name == n);
    let healthy = |n: &str| by_name(n).and_then(|r| r.healthy_per_s);
    let pipeline = runs.first().map(|r| r.sustained_per_s);
    // The drain's machine CPU per delivery, for the ratios' split.
    let pipeline_cpu_us = runs
        .first()
        .map(|r| r.machine_cpu.busy_s * 1e6 / (r.ledger.deliveries_received.max(1) as f64));
    let split_over = |relay: &relays::Relay| match (pipeline, pipeline_cpu_us) {
        (Some(p), Some(c)) => RatioSplit::new(
            p,
            c,
            relay.per_s,
            relay.machine_cpu_us_per_record,
            machine.cores,
        ),
        _ => None,
    };
    // Deliveries/s of the fastest probe that kept up, over the same run's ceilings.
    let sustainable = runs
        .iter()
        .filter(|r| r.name.starts_with("search-") && r.target_rate == Some(found.rate))
        .map(|r| r.sustained_per_s)
        .next()
        .filter(|_| found.verified);
    let ratios = Ratios {
        sustainable_over_http: sustainable.map(|p| p / http.per_s),
        pipeline_over_http: pipeline.map(|p| p / http.per_s),
        pipeline_over_kafka: pipeline.map(|p| p / kafka.per_s),
        pipeline_over_bare_relay: pipeline.map(|p| p / bare_relay.per_s),
        pipeline_over_same_shape_relay: pipeline.map(|p| p / same_shape_relay.per_s),
        same_shape_split: split_over(&same_shape_relay),
        bare_split: split_over(&bare_relay),
        isolation: match (healthy("iso-hang"), healthy("iso-base")) {
            (Some(h), Some(b)) if b > 0.0 => Some(h / b),
            _ => None,
        },
    };
    let valid =
        runs.iter().all(|r| r.ledger.balanced) && neighbour.as_ref().is_none_or(|n| n.valid);
    let redelivered = sink.book().redelivered;
    let mut report = Report {
        date,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        machine,
        options: opts.clone(),
        prefix: prefix.clone(),
        http_ceiling: http,
        kafka_ceiling: kafka,
        bare_relay,
        same_shape_relay,
        filter_cost,
        runs,
        ratios,
        sustainable: found,
        inflight,
        neighbour,
        trace_cost,
        fleet,
        peak_rss,
        redelivered,
        valid,
        json_path: None,
    };
    let json_path = opts.out_dir.join(format!("{prefix}.json"));
    report.json_path = Some(json_path.clone());
    std::fs::write(&json_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    Ok(report)
}

/// The topic prefix (and output directory name) of one run.
fn run_prefix() -> String {
    format!(
        "bench-{:x}-{}",
        (sink::unix_ns() / 1_000_000) & 0xff_ffff,
        std::process::id()
    )
}

/// `--endpoints-only`: the many-endpoints phase alone (printed, and written as JSON beside the
/// other reports).
pub async fn run_endpoints_only(opts: Options) -> anyhow::Result<fleet::Fleet> {
    let opts = opts.resolved();
    opts.validate()?;
    let prefix = run_prefix();
    let dir = opts.out_dir.join(&prefix);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sink = sink::Sink::start().await?;
    let result = fleet::run(&fleet_setup(&opts, &prefix, &dir), &sink).await;
    if !opts.keep_topics {
        let text = format!(
            "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nprefix = \"{prefix}\"\n",
            opts.bootstrap
        );
        if let Ok(config) = Config::from_toml_with_env(&text, "bench config", Vec::new()) {
            delete_fleet_topics(&config, &prefix).await;
        }
    }
    let out = result?;
    let json_path = opts.out_dir.join(format!("{prefix}-endpoints.json"));
    let json = serde_json::json!({
        "date": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        "command_line": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": Machine::read(),
        "options": &opts,
        "fleet": &out,
    });
    std::fs::write(&json_path, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    Ok(out)
}

fn fleet_setup<'a>(opts: &'a Options, prefix: &str, dir: &std::path::Path) -> fleet::Setup<'a> {
    fleet::Setup {
        hookline: &opts.hookline,
        bootstrap: &opts.bootstrap,
        partitions: opts.partitions,
        prefix: fleet::topic_prefix(prefix),
        dir: dir.join("fleet"),
        endpoints: opts.endpoints,
        events: opts.fleet_events,
        payload_bytes: opts.payload_bytes,
        creates: opts.fleet_creates,
    }
}

/// Removes the many-endpoints phase's topics (best effort).
async fn delete_fleet_topics(config: &Config, prefix: &str) {
    let mut fleet_config = config.clone();
    fleet_config.topics.prefix = fleet::topic_prefix(prefix);
    let Ok(admin) = base_config(config).create::<AdminClient<DefaultClientContext>>() else {
        return;
    };
    let names: Vec<String> = topics::plan(&fleet_config)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let _ = admin.delete_topics(&refs, &opts).await;
}

/// Events of the in-flight run: each is delivered to all 100 slow endpoints.
fn inflight_events(opts: &Options) -> usize {
    opts.inflight.div_ceil(usize::from(SLOW_ENDPOINTS)).max(1)
}

/// Runs `spec` while sampling the dispatcher's in-flight gauge and RSS every 100 ms.
async fn inflight_run(
    ctx: &mut phases::Ctx<'_>,
    spec: &phases::RunSpec,
    opts: &Options,
) -> anyhow::Result<(report::RunResult, report::Inflight)> {
    let dispatcher = ctx
        .stages
        .procs
        .iter()
        .find(|p| p.name == "dispatcher")
        .context("no dispatcher stage")?;
    let (pid, metrics_url) = (dispatcher.pid, format!("http://{}/metrics", dispatcher.ops));
    let sink = ctx.sink;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut probe = report::Inflight {
        target: opts.inflight,
        hold_s: opts.inflight_hold.as_secs_f64(),
        rss_before_mib: mib(stages::current_rss(pid)?),
        ..Default::default()
    };
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let run = phases::run(ctx, spec);
    tokio::pin!(run);
    let result = loop {
        tokio::select! {
            r = &mut run => break r?,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                let Ok(resp) = http.get(&metrics_url).send().await else { continue };
                let Ok(text) = resp.text().await else { continue };
                let now = stages::sum_metric(
                    &text,
                    "hookline_delivery_inflight_requests",
                    Some(("stage", "dispatcher")),
                ) as u64;
                let rss = mib(stages::current_rss(pid)?);
                probe.rss_max_mib = probe.rss_max_mib.max(rss);
                if now > probe.peak_inflight {
                    probe.peak_inflight = now;
                    probe.sink_open_at_peak = sink.slow_open();
                    probe.rss_at_peak_mib = rss;
                }
            }
        }
    };
    Ok((result, probe))
}

/// The config every stage process runs with (`server.listen` is set per process).
fn stage_config(opts: &Options, prefix: &str, sink: &sink::Sink) -> String {
    let mut t = format!(
        "[kafka]\nbootstrap_servers = \"{bs}\"\n\n[topics]\nprefix = \"{prefix}\"\npartitions = {p}\n\n\
         [server]\nlisten = \"127.0.0.1:0\"\n\n\
         # The sink is on loopback, which the SSRF guard blocks unless allowed.\n\
         [http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
         # Short schedule: failing deliveries reach the DLQ within the run.\n\
         [retry]\nschedule = {SCHEDULE}\n\n[log]\nlevel = \"info\"\n",
        bs = opts.bootstrap,
        p = opts.partitions,
    );
    if opts.no_delivery_log {
        t.push_str("\n[control]\ndelivery_log = false\n");
    }
    if opts.batch_interval.is_some() || opts.split_deduper {
        t.push_str("\n[dedupe]\n");
    }
    if let Some(d) = opts.batch_interval {
        let _ = writeln!(t, "batch_interval = \"{}ms\"", d.as_millis());
    }
    if opts.split_deduper {
        t.push_str("direct = false\n");
    }
    if !opts.stage_kafka_options.is_empty() {
        t.push_str("\n[kafka.options]\n");
        for (k, v) in &opts.stage_kafka_options {
            let _ = writeln!(t, "{k:?} = {v:?}");
        }
    }
    let mut endpoint = |id: &str,
                        path: &str,
                        tenant: &str,
                        types: &str,
                        timeout: Option<Duration>,
                        max_concurrency: Option<usize>| {
        let _ = write!(
            t,
            "\n[[endpoints]]\nid = \"{id}\"\nurl = \"{}\"\nsecrets = [\"{SECRET}\"]\ntenant = \"{tenant}\"\nevent_types = [\"{types}\"]\n",
            sink.url(path)
        );
        if let Some(d) = timeout {
            let _ = writeln!(t, "timeout = \"{}ms\"", d.as_millis());
        }
        if let Some(n) = max_concurrency {
            let _ = writeln!(t, "max_concurrency = {n}");
        }
    };
    for i in 0..opts.endpoints_per_event {
        endpoint(
            &format!("main-{i}"),
            &format!("e/{i}"),
            "main",
            "bench.*",
            None,
            None,
        );
    }
    endpoint("main-fail", "fail/0", "main", load::FAIL_TYPE, None, None);
    for j in 0..ISO_ENDPOINTS {
        let path = if j == 0 {
            format!("hang/{ISO_BASE}")
        } else {
            format!("e/{}", ISO_BASE + j)
        };
        let tenant = format!("iso-{j}");
        endpoint(
            &format!("iso-{j}"),
            &path,
            &tenant,
            "bench.*",
            Some(opts.hang_timeout),
            None,
        );
    }
    // Enough slots that the in-flight run's deliveries never queue (a queue would be deferred).
    let slots = inflight_events(opts) + 16;
    for j in 0..SLOW_ENDPOINTS {
        endpoint(
            &format!("slow-{j}"),
            &format!("slow/{}", SLOW_BASE + j),
            "slow",
            "bench.*",
            None,
            Some(slots),
        );
    }
    // The neighbour runs' rate-limited endpoint (last: the limit is its table's last line).
    endpoint(
        "limited-0",
        &format!("e/{}", neighbour::LIMITED),
        neighbour::TENANT,
        "bench.*",
        None,
        None,
    );
    let _ = writeln!(t, "rate_limit = {}", neighbour::LIMIT_PER_S);
    t
}

/// Removes the run's topics (best effort: a leftover topic only costs disk on a local broker).
async fn delete_topics(config: &Config, ceiling_topic: &str) {
    let Ok(admin) = base_config(config).create::<AdminClient<DefaultClientContext>>() else {
        return;
    };
    let mut names: Vec<String> = topics::plan(config).into_iter().map(|t| t.name).collect();
    names.push(ceiling_topic.to_string());
    names.extend(relays::topic_names(&config.topics.prefix));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let _ = admin.delete_topics(&refs, &opts).await;
}

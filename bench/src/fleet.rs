//! Many endpoints (issue 35, `--endpoints N`): what N registry endpoints cost each pod and how
//! the pipeline delivers with them. Runs on a registry of its own (its own topic prefix, no
//! `[[endpoints]]` in the file) with its own processes: `run deduper`, `run dispatcher`,
//! `run retry-tiers` and `run admin` (which holds the health tracker). In order:
//!
//! 1. RSS of the dispatcher and the admin with an empty registry;
//! 2. `hookline endpoints import` of the first `N/10` endpoints (10 per tenant, 1% of them
//!    hanging: their requests never answer and end at the endpoint's 2 s timeout), then a drain of
//!    tenant events over those tenants (each event fanned out to its tenant's 10 endpoints);
//! 3. the import of the other 90%, timed to the CLI's exit and to the dispatcher's registry
//!    gauge counting all N (load time in a running pod); RSS of both again;
//! 4. the same drain over all N/10 tenants: healthy deliveries/s, set against step 2's in the
//!    same run (the ratio is what N endpoints cost the hot path); the admin's RSS after it (the
//!    health tracker now holds attempts of every endpoint);
//! 5. a new dispatcher pod started on the full registry: time to `/readyz` and its RSS;
//! 6. `POST /v1/endpoints` from [`CREATE_CLIENTS`] concurrent clients into the full registry:
//!    creates/s and latency (each answer comes once the endpoint is durable and read back).
//!
//! Bytes per endpoint per pod are `(RSS at N − RSS at N/10) / (0.9 N)`: the drains' buffers are
//! in both readings and cancel out. "Above empty" is `RSS at N − RSS empty`, the target.
//! Each reading is taken [`SETTLE`] after its load; the new pod's peak (VmHWM) is reported too,
//! since a pod's memory limit has to hold the peak.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::producer::FutureProducer;
use serde::Serialize;

use hookline_common::config::Config;
use hookline_common::contract::keyhash::Placement;
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::{apply_topics, producer_config};

use crate::load::{self, Mix, Planned};
use crate::sink::Sink;
use crate::stages::{self, Stages};

/// Endpoints per tenant.
pub const PER_TENANT: usize = 10;
/// Endpoint `i` hangs when `i % HANG_EVERY == HANG_AT` (1%: one endpoint in every tenth tenant).
const HANG_EVERY: usize = 100;
const HANG_AT: usize = 7;
/// Concurrent API clients of step 6, and the creates each makes.
pub const CREATE_CLIENTS: usize = 8;
/// The hanging endpoints' timeout (each of their attempts takes it).
const HANG_TIMEOUT: &str = "2s";
const MIB: f64 = 1024.0 * 1024.0;
/// How long after a load RSS is read: jemalloc hands freed pages back after its 10 s decay, so
/// a reading right after a load counts what the load's garbage left (the peak is read apart).
const SETTLE: Duration = Duration::from_secs(12);

fn hangs(i: usize) -> bool {
    i % HANG_EVERY == HANG_AT
}

/// What the phase measured.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Fleet {
    pub endpoints: usize,
    pub tenants: usize,
    pub hanging: usize,
    /// Events of each drain (each fanned out to its tenant's endpoints).
    pub events_per_drain: usize,
    /// The first import (N/10), and the rest: seconds until the CLI exited.
    pub first_import_s: f64,
    pub import_s: f64,
    pub import_per_s: f64,
    /// From the second import's start until the running dispatcher's registry held all N.
    pub dispatcher_loaded_s: f64,
    pub dispatcher_rss_empty_mib: f64,
    pub dispatcher_rss_tenth_mib: f64,
    pub dispatcher_rss_full_mib: f64,
    pub dispatcher_bytes_per_endpoint: f64,
    pub dispatcher_above_empty_mib: f64,
    pub admin_rss_empty_mib: f64,
    pub admin_rss_tenth_mib: f64,
    pub admin_rss_full_mib: f64,
    pub admin_bytes_per_endpoint: f64,
    /// The admin's RSS after the full drain, and its growth over the drain (the health tracker
    /// taking in attempts of every endpoint).
    pub admin_rss_after_drain_mib: f64,
    pub admin_drain_growth_mib: f64,
    /// Healthy deliveries/s of the drain over the first N/10 endpoints and over all N.
    pub small_healthy_per_s: f64,
    pub full_healthy_per_s: f64,
    /// full / small.
    pub throughput_ratio: f64,
    /// Requests the hanging endpoints held during the full drain (each to its timeout).
    pub hung_requests: u64,
    /// Re-sends of a delivery the sink had already answered (at-least-once, normally 0).
    pub redelivered: u64,
    /// A new dispatcher on the full registry: seconds from spawn to `/readyz`, RSS at ready.
    pub new_pod_ready_s: f64,
    pub new_pod_rss_mib: f64,
    /// Its RSS settled (after [`SETTLE`]) and its peak (VmHWM) by then.
    pub new_pod_settled_rss_mib: f64,
    pub new_pod_peak_rss_mib: f64,
    /// `POST /v1/endpoints` into the full registry from [`CREATE_CLIENTS`] clients.
    pub creates: usize,
    pub creates_per_s: f64,
    pub create_p50_ms: f64,
    pub create_p99_ms: f64,
    pub create_max_ms: f64,
    /// Where the admin's registry writes spent their time (`hookline_control_registry_write_seconds`
    /// over the whole phase: the creates, and the two imports' single writes).
    pub write_steps: Vec<WriteStep>,
}

/// One step of `hookline_control_registry_write_seconds`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct WriteStep {
    pub step: String,
    pub count: u64,
    pub mean_ms: f64,
    /// Upper bound of the bucket holding the 99th percentile.
    pub p99_le_ms: f64,
}

impl Fleet {
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "many endpoints: {} endpoints over {} tenants ({} hanging), {} events per drain x {} endpoints",
            self.endpoints, self.tenants, self.hanging, self.events_per_drain, PER_TENANT
        );
        let _ = writeln!(
            t,
            "  import of {}: {:.2} s ({:.0}/s); running dispatcher had all {} after {:.2} s (first {} took {:.2} s)",
            self.endpoints - self.endpoints / 10,
            self.import_s,
            self.import_per_s,
            self.endpoints,
            self.dispatcher_loaded_s,
            self.endpoints / 10,
            self.first_import_s
        );
        let _ = writeln!(
            t,
            "  dispatcher RSS: empty {:.0} MiB, N/10 {:.0} MiB, N {:.0} MiB -> {:.0} bytes/endpoint, {:.0} MiB above empty (target <= 300)",
            self.dispatcher_rss_empty_mib,
            self.dispatcher_rss_tenth_mib,
            self.dispatcher_rss_full_mib,
            self.dispatcher_bytes_per_endpoint,
            self.dispatcher_above_empty_mib
        );
        let _ = writeln!(
            t,
            "  admin RSS: empty {:.0} MiB, N/10 {:.0} MiB, N {:.0} MiB -> {:.0} bytes/endpoint; after the full drain {:.0} MiB (+{:.0} MiB: health tracker)",
            self.admin_rss_empty_mib,
            self.admin_rss_tenth_mib,
            self.admin_rss_full_mib,
            self.admin_bytes_per_endpoint,
            self.admin_rss_after_drain_mib,
            self.admin_drain_growth_mib
        );
        let _ = writeln!(
            t,
            "  healthy deliveries/s: {:.0} over N/10 endpoints, {:.0} over N ({:.2}x); {} requests hung, {} redelivered",
            self.small_healthy_per_s,
            self.full_healthy_per_s,
            self.throughput_ratio,
            self.hung_requests,
            self.redelivered
        );
        let _ = writeln!(
            t,
            "  new dispatcher pod: ready in {:.2} s (target <= 10), RSS {:.0} MiB at ready, {:.0} MiB settled, peak {:.0} MiB ({:.0} MiB above the empty dispatcher)",
            self.new_pod_ready_s,
            self.new_pod_rss_mib,
            self.new_pod_settled_rss_mib,
            self.new_pod_peak_rss_mib,
            self.new_pod_peak_rss_mib - self.dispatcher_rss_empty_mib
        );
        let _ = writeln!(
            t,
            "  POST /v1/endpoints into the full registry, {} clients: {} creates at {:.0}/s, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            CREATE_CLIENTS,
            self.creates,
            self.creates_per_s,
            self.create_p50_ms,
            self.create_p99_ms,
            self.create_max_ms
        );
        let steps: Vec<String> = self
            .write_steps
            .iter()
            .map(|s| {
                format!(
                    "{} {:.1} ms mean, p99 <= {:.0} ms",
                    s.step, s.mean_ms, s.p99_le_ms
                )
            })
            .collect();
        let _ = writeln!(t, "  registry write steps: {}", steps.join("; "));
        t
    }
}

/// What the phase needs from the bench.
pub struct Setup<'a> {
    pub hookline: &'a Path,
    pub bootstrap: &'a str,
    pub partitions: i32,
    pub prefix: String,
    pub dir: PathBuf,
    pub endpoints: usize,
    pub events: usize,
    pub payload_bytes: usize,
    /// Creates of step 6 (over all clients).
    pub creates: usize,
}

/// Runs the phase (its topics are left for the caller to delete: [`topic_prefix`]).
pub async fn run(setup: &Setup<'_>, sink: &Sink) -> anyhow::Result<Fleet> {
    let n = setup.endpoints;
    anyhow::ensure!(
        n >= 100 && n.is_multiple_of(100),
        "--endpoints must be a multiple of 100, got {n}"
    );
    std::fs::create_dir_all(&setup.dir)?;
    let key = secrets_key();
    let token = format!("hlk_bench_{}", secrets_key().replace(['+', '/', '='], ""));
    let text = config_text(setup, &token);
    let config_path = setup.dir.join("hookline.toml");
    std::fs::write(&config_path, &text)?;
    let config = Config::from_toml_with_env(&text, "fleet config", Vec::new())
        .context("the many-endpoints config")?;
    let report = apply_topics(&config, Duration::from_secs(30)).await?;
    anyhow::ensure!(report.drift.is_empty(), "topic drift: {:?}", report.drift);
    let admin_listen = stages::free_port()?.to_string();
    let env = [
        (
            hookline_common::config::control::SECRETS_KEY_ENV,
            key.as_str(),
        ),
        ("HOOKLINE_ADMIN__LISTEN", admin_listen.as_str()),
    ];
    let mut procs = Stages::spawn_with(
        setup.hookline,
        &config_path,
        &setup.dir,
        &["deduper", "dispatcher", "retry-tiers", "admin"],
        &env,
    )?;
    procs.wait_ready(Duration::from_secs(120)).await?;
    let pid = |name: &str| {
        procs
            .procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.pid)
            .with_context(|| format!("no {name} process"))
    };
    let (dispatcher, admin) = (pid("dispatcher")?, pid("admin")?);
    let rss = |pid: u32| -> anyhow::Result<f64> { Ok(stages::current_rss(pid)? as f64 / MIB) };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut out = Fleet {
        endpoints: n,
        tenants: n / PER_TENANT,
        hanging: (0..n).filter(|i| hangs(*i)).count(),
        events_per_drain: setup.events,
        dispatcher_rss_empty_mib: rss(dispatcher)?,
        admin_rss_empty_mib: rss(admin)?,
        ..Default::default()
    };
    sink.set_hanging(true);
    let producer: FutureProducer = producer_config(&config).create()?;
    let tenth = n / 10;

    // 2. The first tenth, and a drain over its tenants.
    let file = setup.dir.join("endpoints-tenth.jsonl");
    write_endpoints(&file, 0..tenth, sink)?;
    let start = Instant::now();
    import(setup.hookline, &config_path, &file, &key, &setup.dir).await?;
    out.first_import_s = start.elapsed().as_secs_f64();
    wait_registry(&procs, tenth, Duration::from_secs(120)).await?;
    let small = drain(
        &config,
        &producer,
        sink,
        &mut procs,
        0..tenth / PER_TENANT,
        setup,
        "fs",
    )
    .await?;
    out.small_healthy_per_s = small.per_s;
    tokio::time::sleep(SETTLE).await;
    out.dispatcher_rss_tenth_mib = rss(dispatcher)?;
    out.admin_rss_tenth_mib = rss(admin)?;

    // 3. The rest.
    let file = setup.dir.join("endpoints-rest.jsonl");
    write_endpoints(&file, tenth..n, sink)?;
    let start = Instant::now();
    import(setup.hookline, &config_path, &file, &key, &setup.dir).await?;
    out.import_s = start.elapsed().as_secs_f64();
    out.import_per_s = (n - tenth) as f64 / out.import_s.max(1e-9);
    wait_registry(&procs, n, Duration::from_secs(300)).await?;
    out.dispatcher_loaded_s = start.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    out.dispatcher_rss_full_mib = rss(dispatcher)?;
    out.admin_rss_full_mib = rss(admin)?;
    let per_endpoint = |full: f64, part: f64| (full - part) * MIB / (n - tenth) as f64;
    out.dispatcher_bytes_per_endpoint =
        per_endpoint(out.dispatcher_rss_full_mib, out.dispatcher_rss_tenth_mib);
    out.admin_bytes_per_endpoint = per_endpoint(out.admin_rss_full_mib, out.admin_rss_tenth_mib);
    out.dispatcher_above_empty_mib = out.dispatcher_rss_full_mib - out.dispatcher_rss_empty_mib;

    // 4. The same drain over every tenant.
    let hung_before = sink.hung_total();
    let full = drain(
        &config,
        &producer,
        sink,
        &mut procs,
        0..out.tenants,
        setup,
        "ff",
    )
    .await?;
    out.full_healthy_per_s = full.per_s;
    out.throughput_ratio = out.full_healthy_per_s / out.small_healthy_per_s.max(1e-9);
    out.hung_requests = sink.hung_total() - hung_before;
    // Let the health tracker read the drain's attempts.
    tokio::time::sleep(Duration::from_secs(5)).await;
    out.admin_rss_after_drain_mib = rss(admin)?;
    out.admin_drain_growth_mib = out.admin_rss_after_drain_mib - out.admin_rss_full_mib;
    out.redelivered = sink.fleet_received().1;

    // 5. A new dispatcher pod on the full registry.
    let pod_dir = setup.dir.join("new-pod");
    std::fs::create_dir_all(&pod_dir)?;
    let start = Instant::now();
    let mut pod = Stages::spawn_with(
        setup.hookline,
        &config_path,
        &pod_dir,
        &["dispatcher"],
        &env,
    )?;
    pod.wait_ready(Duration::from_secs(120)).await?;
    out.new_pod_ready_s = start.elapsed().as_secs_f64();
    out.new_pod_rss_mib = rss(pod.procs[0].pid)?;
    tokio::time::sleep(SETTLE).await;
    out.new_pod_settled_rss_mib = rss(pod.procs[0].pid)?;
    out.new_pod_peak_rss_mib = stages::peak_rss(pod.procs[0].pid)? as f64 / MIB;
    pod.stop(Duration::from_secs(20)).await?;

    // 6. Creates over HTTP into the full registry.
    let api = format!("http://{admin_listen}");
    let created = creates(&api, &token, setup.creates, sink).await?;
    out.creates = setup.creates;
    out.creates_per_s = created.0;
    (out.create_p50_ms, out.create_p99_ms, out.create_max_ms) = created.1;
    let text = procs.metrics_text("admin").await?;
    const WRITE: &str = "hookline_control_registry_write_seconds";
    for step in ["join", "transaction", "read_back", "acks", "commit"] {
        let label = Some(("step", step));
        let count = stages::sum_metric(&text, &format!("{WRITE}_count"), label);
        let sum = stages::sum_metric(&text, &format!("{WRITE}_sum"), label);
        out.write_steps.push(WriteStep {
            step: step.into(),
            count: count as u64,
            mean_ms: sum * 1e3 / count.max(1.0),
            p99_le_ms: stages::histogram_quantile(&text, WRITE, ("step", step), 0.99)
                .unwrap_or(0.0)
                * 1e3,
        });
    }
    procs.stop(Duration::from_secs(40)).await?;
    sink.set_hanging(false);
    Ok(out)
}

/// The prefix of the phase's topics, from the bench's.
pub fn topic_prefix(bench_prefix: &str) -> String {
    format!("{bench_prefix}-fleet")
}

/// A fresh `HOOKLINE_SECRETS_KEY` for the run (base64 of 32 random bytes).
fn secrets_key() -> String {
    use base64::Engine as _;
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn config_text(setup: &Setup<'_>, token: &str) -> String {
    use sha2::Digest as _;
    let hash: String = sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "[kafka]\nbootstrap_servers = \"{bs}\"\n\n[topics]\nprefix = \"{prefix}\"\npartitions = {p}\n\n\
         [server]\nlisten = \"127.0.0.1:0\"\n\n[http]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
         [retry]\nschedule = {schedule}\n\n[log]\nlevel = \"info\"\n\n\
         [[admin.tokens]]\nname = \"bench\"\nsha256 = \"{hash}\"\nscope = \"admin\"\n",
        bs = setup.bootstrap,
        prefix = setup.prefix,
        p = setup.partitions,
        schedule = crate::SCHEDULE,
    )
}

/// Endpoints `range` as import lines: endpoint `i` is `fl-<i>` of tenant `ft-<i / 10>`, posting
/// to the sink's `/fleet/<i>`, or to `/hang/0` with a 2 s timeout when it hangs.
fn write_endpoints(path: &Path, range: std::ops::Range<usize>, sink: &Sink) -> anyhow::Result<()> {
    let mut text = String::with_capacity(range.len() * 160);
    for i in range {
        let tenant = i / PER_TENANT;
        let line = if hangs(i) {
            serde_json::json!({
                "id": format!("fl-{i}"),
                "url": sink.url("hang/0"),
                "tenant": format!("ft-{tenant}"),
                "event_types": ["bench.*"],
                "timeout": HANG_TIMEOUT,
            })
        } else {
            serde_json::json!({
                "id": format!("fl-{i}"),
                "url": sink.url(&format!("fleet/{i}")),
                "tenant": format!("ft-{tenant}"),
                "event_types": ["bench.*"],
            })
        };
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

async fn import(
    hookline: &Path,
    config: &Path,
    file: &Path,
    key: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let log = dir.join("import.log");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    let status = tokio::process::Command::from(stages::hookline_command(hookline))
        .arg("--config")
        .arg(config)
        .args(["endpoints", "import"])
        .arg(file)
        .env(hookline_common::config::control::SECRETS_KEY_ENV, key)
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .await
        .context("running hookline endpoints import")?;
    anyhow::ensure!(
        status.success(),
        "hookline endpoints import {} failed ({status}); see {}",
        file.display(),
        log.display()
    );
    Ok(())
}

/// Waits until the dispatcher's registry gauge counts `n` enabled endpoints.
async fn wait_registry(procs: &Stages, n: usize, within: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let have = procs
            .metric(
                "dispatcher",
                "hookline_control_endpoints",
                Some(("state", "enabled")),
            )
            .await
            .unwrap_or(0.0) as usize;
        if have >= n {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < within,
            "the dispatcher's registry held {have} of {n} endpoints after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` creates spread over [`CREATE_CLIENTS`] clients, each in a loop: (creates/s, (p50, p99,
/// max) ms).
async fn creates(
    api: &str,
    token: &str,
    n: usize,
    sink: &Sink,
) -> anyhow::Result<(f64, (f64, f64, f64))> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CREATE_CLIENTS {
        let (http, api, token) = (http.clone(), api.to_string(), token.to_string());
        let url = sink.url("fleet/4000000000");
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            for k in (c..n).step_by(CREATE_CLIENTS) {
                let body = serde_json::json!({
                    "id": format!("fc-{k}"),
                    "url": url,
                    "tenant": format!("fc-{}", k / PER_TENANT),
                    "event_types": ["bench.created"],
                });
                let t0 = Instant::now();
                let r = http
                    .post(format!("{api}/v1/endpoints"))
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                    .context("POST /v1/endpoints")?;
                let status = r.status();
                anyhow::ensure!(
                    status.as_u16() == 201,
                    "POST /v1/endpoints answered {status}: {}",
                    r.text().await.unwrap_or_default()
                );
                took.push(t0.elapsed());
            }
            Ok::<_, anyhow::Error>(took)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.context("a create client panicked")??);
    }
    let per_s = n as f64 / start.elapsed().as_secs_f64();
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Ok((per_s, (at(0.5), at(0.99), at(1.0))))
}

struct Drain {
    per_s: f64,
}

/// One event per tenant of `tenants` round-robin until `setup.events`, as fast as possible;
/// waits until the sink answered every healthy (event, endpoint) pair once.
async fn drain(
    config: &Config,
    producer: &FutureProducer,
    sink: &Sink,
    procs: &mut Stages,
    tenants: std::ops::Range<usize>,
    setup: &Setup<'_>,
    tag: &str,
) -> anyhow::Result<Drain> {
    let names: Vec<String> = tenants.clone().map(|t| format!("ft-{t}")).collect();
    let quiet = Mix {
        duplicate_ratio: 0.0,
        failing_fraction: 0.0,
        invalid_fraction: 0.0,
        payload_bytes: setup.payload_bytes,
    };
    let plan = load::plan(tag, setup.events, names.len(), &quiet, 21);
    let healthy_of = |t: usize| {
        let first = (tenants.start + t) * PER_TENANT;
        (first..first + PER_TENANT).filter(|i| !hangs(*i)).count() as u64
    };
    let expected: u64 = plan
        .iter()
        .map(|r| match r {
            Planned::Fresh { tenant, .. } => healthy_of(*tenant),
            _ => 0,
        })
        .sum();
    let before = sink.fleet_received().0;
    let placement = Placement::new(config);
    let start = Instant::now();
    load::produce(
        producer,
        &Topics::new(&config.topics.prefix).events(),
        &plan,
        &names,
        None,
        setup.payload_bytes,
        placement.as_ref(),
    )
    .await?;
    let deadline = Duration::from_secs(300);
    loop {
        let got = sink.fleet_received().0 - before;
        if got >= expected {
            break;
        }
        procs.check_alive()?;
        anyhow::ensure!(
            start.elapsed() < deadline,
            "many-endpoints drain {tag}: {got} of {expected} healthy deliveries after {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Drain {
        per_s: expected as f64 / start.elapsed().as_secs_f64(),
    })
}

//! `hookline endpoints list|add|update|disable|enable|delete|rotate-secret|health|reencrypt` and
//! `hookline trace EVENT_ID`, working against Kafka directly (the same registry, delivery log
//! and health tracker as every process; no admin API needed). Output: a table, or `--json`
//! (`--format json`): one JSON object per line. Secret values are printed only when they are
//! new (`add` without `--secret`, `rotate-secret`), once, for the receiver's configuration.

use anyhow::Context as _;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use hookline_common::config::{Config, EndpointConfig};
use hookline_common::contract::delivery::now_ms;

use crate::crypto::Keyring;
use crate::endpoint::{generate_secret, resolve_headers, Endpoint, HeaderEdit};
use crate::health::HealthReport;
use crate::ops::EndpointUpdate;
use crate::registry::{Registry, CATCH_UP_WAIT};
use crate::table::{time, write_table};
use crate::tracker::Health;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// `--format table|json`, or `--json`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OutputArgs {
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Same as `--format json`.
    #[arg(long)]
    pub json: bool,
}

impl OutputArgs {
    pub fn json(&self) -> bool {
        self.json || self.format == Format::Json
    }
}

/// The definition fields of `add`.
#[derive(Debug, Clone, clap::Args)]
pub struct AddArgs {
    /// Endpoint id: 1..=128 of [a-zA-Z0-9_.:-].
    pub id: String,
    #[arg(long)]
    pub url: String,
    /// Only events of this tenant (default: every tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Event-type glob (repeat for several; none: every type).
    #[arg(long = "event-type", value_name = "GLOB")]
    pub event_types: Vec<String>,
    /// A `whsec_…` secret (repeat for several). Default: one is generated and printed once.
    #[arg(long = "secret", value_name = "WHSEC")]
    pub secrets: Vec<String>,
    /// Send unsigned (no secret).
    #[arg(long, conflicts_with = "secrets")]
    pub no_secret: bool,
    /// Create it disabled.
    #[arg(long)]
    pub disabled: bool,
    /// Request timeout (e.g. `5s`; default `http.timeout`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    #[command(flatten)]
    pub headers: HeaderArgs,
    /// Deliver only events this CEL expression holds for (over `id`, `type`, `tenant`, `data`),
    /// e.g. `data.amount > 100`.
    #[arg(long, value_name = "CEL")]
    pub filter: Option<String>,
    /// At most this many deliveries per second, for the whole cluster.
    #[arg(long, value_name = "PER_SECOND")]
    pub rate_limit: Option<f64>,
    /// Deliveries that may go out at once after an idle spell (default 1).
    #[arg(long, requires = "rate_limit")]
    pub burst: Option<u32>,
    /// Send no `traceparent` to it (hookline's trace ids stay out of its requests).
    #[arg(long)]
    pub no_trace_context: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Custom headers sent with every request (not covered by the signature).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HeaderArgs {
    /// A header sent with every request, `NAME: VALUE` (repeat for several). On `update`, any
    /// header option replaces the whole list.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// A header whose value is secret: sealed at rest, never shown again. On `update`, a bare
    /// `NAME` keeps its current value.
    #[arg(long = "secret-header", value_name = "NAME: VALUE")]
    pub secret_headers: Vec<String>,
}

impl HeaderArgs {
    /// The header list given (`--header` ones, then `--secret-header` ones); `None` if no
    /// header option was given.
    pub fn edits(&self) -> Option<Vec<HeaderEdit>> {
        let split = |text: &String, secret: bool| match text.split_once(':') {
            Some((name, value)) => HeaderEdit {
                name: name.trim().to_string(),
                value: Some(value.trim_start().to_string()),
                secret,
            },
            None => HeaderEdit {
                name: text.trim().to_string(),
                value: None,
                secret,
            },
        };
        let all: Vec<HeaderEdit> = (self.headers.iter().map(|h| split(h, false)))
            .chain(self.secret_headers.iter().map(|h| split(h, true)))
            .collect();
        (!all.is_empty()).then_some(all)
    }
}

/// The fields `update` can change.
#[derive(Debug, Clone, clap::Args)]
pub struct UpdateArgs {
    pub id: String,
    #[arg(long)]
    pub url: Option<String>,
    #[arg(long, conflicts_with = "any_tenant")]
    pub tenant: Option<String>,
    /// Receive every tenant (clears `tenant`).
    #[arg(long)]
    pub any_tenant: bool,
    /// Replaces the event-type globs (repeat for several).
    #[arg(
        long = "event-type",
        value_name = "GLOB",
        conflicts_with = "all_event_types"
    )]
    pub event_types: Vec<String>,
    /// Receive every event type (clears the globs).
    #[arg(long)]
    pub all_event_types: bool,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    #[command(flatten)]
    pub headers: HeaderArgs,
    /// Remove every custom header.
    #[arg(long, conflicts_with_all = ["headers", "secret_headers"])]
    pub no_headers: bool,
    /// Replaces the payload filter (a CEL expression).
    #[arg(long, value_name = "CEL", conflicts_with = "no_filter")]
    pub filter: Option<String>,
    /// Remove the payload filter.
    #[arg(long)]
    pub no_filter: bool,
    /// Sets the rate limit (deliveries per second, whole cluster).
    #[arg(long, value_name = "PER_SECOND", conflicts_with = "no_rate_limit")]
    pub rate_limit: Option<f64>,
    /// Sets the burst of the rate limit.
    #[arg(long)]
    pub burst: Option<u32>,
    /// Removes the rate limit.
    #[arg(long)]
    pub no_rate_limit: bool,
    /// Send `traceparent` to it again while tracing is on.
    #[arg(long, conflicts_with = "no_trace_context")]
    pub trace_context: bool,
    /// Send no `traceparent` to it.
    #[arg(long)]
    pub no_trace_context: bool,
    /// Refuse (exit 1) unless the endpoint is at this version (optimistic concurrency).
    #[arg(long, value_name = "VERSION")]
    pub if_version: Option<u64>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `hookline endpoints …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum EndpointsCommand {
    /// List endpoints (secret values never shown).
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Create an endpoint (API-managed).
    Add(AddArgs),
    /// Change an endpoint's definition.
    Update(UpdateArgs),
    /// Disable an endpoint: no new deliveries; queued retries end in the DLQ (`endpoint_disabled`).
    Disable {
        id: String,
        #[arg(long, value_name = "VERSION")]
        if_version: Option<u64>,
    },
    /// Enable an endpoint.
    Enable {
        id: String,
        #[arg(long, value_name = "VERSION")]
        if_version: Option<u64>,
    },
    /// Delete an endpoint (a tombstone on `<p>.endpoints`).
    Delete {
        id: String,
        #[arg(long, value_name = "VERSION")]
        if_version: Option<u64>,
    },
    /// Rotate in a new secret; the old ones keep signing for the grace period.
    RotateSecret {
        id: String,
        /// The new `whsec_…` secret (default: generated).
        #[arg(long, value_name = "WHSEC")]
        secret: Option<String>,
        /// How long the old secrets keep signing (default `control.secret_rotation_grace`, 24h).
        #[arg(long, value_parser = humantime::parse_duration)]
        grace: Option<Duration>,
        #[arg(long, value_name = "VERSION")]
        if_version: Option<u64>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Per-endpoint health from the delivery log and the DLQ.
    Health {
        /// One endpoint (default: every endpoint).
        id: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Re-seal every secret still sealed with an old key (after changing HOOKLINE_SECRETS_KEY).
    Reencrypt,
    /// Put every endpoint of a JSON-lines file (the `POST /v1/endpoints` shape, one per line)
    /// in one transaction: new ids created, changed ones updated, the rest left alone; a bad
    /// line names its number and field and nothing is written. Re-running it changes nothing.
    Import {
        /// The file (`-`: standard input).
        file: std::path::PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Print every endpoint as a JSON line in the shape `import` takes.
    Export {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        /// Include each endpoint's newest signing secret and its secret header values (in
        /// clear: keep the output as you keep the secrets key).
        #[arg(long)]
        with_secrets: bool,
    },
    /// Send a signed `hookline.test` event to an endpoint once and print the outcome (exit code
    /// 4 when it was not delivered). Sent whether or not the endpoint is enabled; never retried.
    Test {
        id: String,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `hookline trace EVENT_ID`.
#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    pub event_id: String,
    /// Only attempts of the last period (e.g. `2h`); default: the whole delivery log.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
    #[command(flatten)]
    pub output: OutputArgs,
}

async fn open_registry(config: &Config) -> anyhow::Result<Registry> {
    let keyring = Keyring::from_env()?;
    Registry::start(config, keyring, &prometheus::Registry::new(), false).await
}

/// Runs `hookline endpoints …`, printing to stdout.
pub async fn endpoints(config: Arc<Config>, command: EndpointsCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    run(&config, command, &mut out).await
}

/// [`endpoints`] writing to `out`.
pub async fn run(
    config: &Config,
    command: EndpointsCommand,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if let EndpointsCommand::Test { .. } = command {
        // It attempts through the delivery engine, which this crate does not build.
        anyhow::bail!("`endpoints test` is run by the hookline binary (hookline_tools::test_send)");
    }
    if let EndpointsCommand::Health { id, output } = command {
        let registry = open_registry(config).await?;
        let health = Health::start(config, None, &prometheus::Registry::new()).await?;
        health.wait_caught_up(CATCH_UP_WAIT).await?;
        let mut reports = health.reports();
        for e in registry.current().iter() {
            reports
                .entry(e.id.clone())
                .or_insert_with(|| health.report(&e.id));
        }
        if let Some(id) = &id {
            reports.retain(|k, _| k == id);
            if reports.is_empty() {
                reports.insert(id.clone(), health.report(id));
            }
        }
        return print_health(out, &reports, output.json());
    }
    let registry = open_registry(config).await?;
    match command {
        EndpointsCommand::List { tenant, output } => {
            let set = registry.current();
            let shown: Vec<&Endpoint> = set
                .iter()
                .filter(|e| tenant.is_none() || e.tenant == tenant)
                .collect();
            print_endpoints(out, &shown, output.json())?;
        }
        EndpointsCommand::Add(a) => {
            let generated = a.secrets.is_empty() && !a.no_secret;
            let secrets = if generated {
                vec![generate_secret()]
            } else {
                a.secrets.clone()
            };
            let url = hookline_common::config::EndpointUrl::parse(&a.url)
                .map_err(|e| anyhow::anyhow!("--url: {e}"))?;
            let parsed = secrets
                .iter()
                .map(|s| hookline_common::config::Secret::parse(s))
                .collect::<Result<Vec<_>, String>>()
                .map_err(|e| anyhow::anyhow!("--secret: {e}"))?;
            let headers = resolve_headers(&a.headers.edits().unwrap_or_default(), &[])
                .map_err(|e| anyhow::anyhow!("--header: {e}"))?;
            let filter = a
                .filter
                .as_deref()
                .map(hookline_common::config::filter::EventFilter::compile)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--filter: {e}"))?;
            let e = registry
                .create(EndpointConfig {
                    id: a.id.clone(),
                    url,
                    secrets: parsed,
                    tenant: a.tenant.clone(),
                    event_types: a.event_types.clone(),
                    enabled: !a.disabled,
                    timeout: a.timeout,
                    max_concurrency: a.max_concurrency,
                    headers,
                    filter,
                    rate_limit: a.rate_limit,
                    burst: a.burst,
                    trace_context: !a.no_trace_context,
                })
                .await?;
            let shown = generated.then(|| secrets[0].clone());
            print_written(out, "created", &e, shown.as_deref(), a.output.json())?;
        }
        EndpointsCommand::Update(u) => {
            let change = EndpointUpdate {
                url: u.url.clone(),
                tenant: if u.any_tenant {
                    Some(None)
                } else {
                    u.tenant.clone().map(Some)
                },
                event_types: if u.all_event_types {
                    Some(Vec::new())
                } else {
                    (!u.event_types.is_empty()).then(|| u.event_types.clone())
                },
                timeout: u.timeout.map(Some),
                max_concurrency: u.max_concurrency.map(Some),
                headers: if u.no_headers {
                    Some(Vec::new())
                } else {
                    u.headers.edits()
                },
                filter: if u.no_filter {
                    Some(None)
                } else {
                    u.filter.clone().map(Some)
                },
                rate_limit: if u.no_rate_limit {
                    Some(None)
                } else {
                    u.rate_limit.map(Some)
                },
                burst: u.burst.map(Some),
                trace_context: if u.no_trace_context {
                    Some(false)
                } else {
                    u.trace_context.then_some(true)
                },
            };
            let e = registry.update(&u.id, change, u.if_version).await?;
            print_written(out, "updated", &e, None, u.output.json())?;
        }
        EndpointsCommand::Disable { id, if_version } => {
            let e = registry.set_enabled(&id, false, if_version).await?;
            writeln!(out, "disabled {} (version {})", e.id, e.version)?;
        }
        EndpointsCommand::Enable { id, if_version } => {
            let e = registry.set_enabled(&id, true, if_version).await?;
            writeln!(out, "enabled {} (version {})", e.id, e.version)?;
        }
        EndpointsCommand::Delete { id, if_version } => {
            registry.delete(&id, if_version).await?;
            writeln!(out, "deleted {id}")?;
        }
        EndpointsCommand::RotateSecret {
            id,
            secret,
            grace,
            if_version,
            output,
        } => {
            let given = secret.is_some();
            let e = registry
                .rotate_secret(&id, secret, grace, if_version)
                .await?;
            let new = (!given).then(|| e.secrets[0].secret.clone());
            print_written(out, "rotated", &e, new.as_deref(), output.json())?;
        }
        EndpointsCommand::Reencrypt => {
            let done = registry.reencrypt().await?;
            writeln!(
                out,
                "re-encrypted {} endpoint(s): {}",
                done.len(),
                done.join(", ")
            )?;
        }
        EndpointsCommand::Import { file, output } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading standard input")?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?
            };
            let defs = crate::import::parse_lines(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}; nothing imported", file.display()))?;
            let done = registry.import(defs).await?;
            print_imported(out, &done, output.json())?;
        }
        EndpointsCommand::Export {
            tenant,
            with_secrets,
        } => {
            for e in registry
                .current()
                .iter()
                .filter(|e| tenant.is_none() || e.tenant == tenant)
                .filter(|e| e.managed_by != crate::record::ManagedBy::File)
            {
                let line =
                    serde_json::to_string(&crate::import::EndpointInput::of(e, with_secrets))?;
                writeln!(out, "{line}")?;
            }
        }
        EndpointsCommand::Health { .. } | EndpointsCommand::Test { .. } => {
            unreachable!("handled above")
        }
    }
    Ok(())
}

fn print_imported(
    out: &mut dyn Write,
    done: &[crate::import::Imported],
    json: bool,
) -> anyhow::Result<()> {
    use crate::import::Outcome;
    if json {
        for d in done {
            let line = serde_json::json!({
                "id": d.endpoint.id,
                "outcome": d.outcome.as_str(),
                "version": d.endpoint.version,
                "secret": d.secret,
            });
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    for d in done.iter().filter(|d| d.secret.is_some()) {
        // Shown once, as `endpoints add` shows a generated secret.
        writeln!(
            out,
            "secret {} {}",
            d.endpoint.id,
            d.secret.as_deref().unwrap_or_default()
        )?;
    }
    let count = |o: Outcome| done.iter().filter(|d| d.outcome == o).count();
    writeln!(
        out,
        "imported {} endpoint(s): {} created, {} updated, {} unchanged",
        done.len(),
        count(Outcome::Created),
        count(Outcome::Updated),
        count(Outcome::Unchanged)
    )?;
    Ok(())
}

/// Runs `hookline trace`, printing to stdout.
pub async fn trace(config: Arc<Config>, args: TraceArgs) -> anyhow::Result<()> {
    let since = args
        .since
        .map(|d| now_ms().saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
    let attempts = crate::trace::trace(&config, &args.event_id, since).await?;
    let mut out = std::io::stdout();
    crate::trace::print(&mut out, &args.event_id, &attempts, args.output.json())?;
    Ok(())
}

fn print_endpoints(out: &mut dyn Write, endpoints: &[&Endpoint], json: bool) -> anyhow::Result<()> {
    let now = now_ms();
    if json {
        for e in endpoints {
            writeln!(out, "{}", e.to_json(now))?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = endpoints
        .iter()
        .map(|e| {
            vec![
                e.id.clone(),
                e.url.clone(),
                e.tenant.clone().unwrap_or_else(|| "*".into()),
                if e.event_types.is_empty() {
                    "*".into()
                } else {
                    e.event_types.join(",")
                },
                match (&e.problem, e.enabled) {
                    (Some(_), _) => "unusable".into(),
                    (None, true) => "enabled".into(),
                    (None, false) => "disabled".into(),
                },
                e.signing_secrets_at(now).len().to_string(),
                e.managed_by.as_str().into(),
                e.version.to_string(),
                time(Some(e.updated_at_ms)),
            ]
        })
        .collect();
    write_table(
        out,
        &[
            "ID", "URL", "TENANT", "TYPES", "STATE", "SECRETS", "MANAGED", "VERSION", "UPDATED",
        ],
        &rows,
    )?;
    writeln!(out, "{} endpoint(s)", endpoints.len())?;
    for e in endpoints {
        if let Some(p) = &e.problem {
            writeln!(out, "unusable {}: {p}", e.id)?;
        }
        if !e.trace_context {
            writeln!(out, "{}: trace context: off", e.id)?;
        }
    }
    Ok(())
}

fn print_written(
    out: &mut dyn Write,
    what: &str,
    e: &Endpoint,
    new_secret: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        let mut v = e.to_json(now_ms());
        if let (Some(s), Some(obj)) = (new_secret, v.as_object_mut()) {
            obj.insert("new_secret".into(), json!(s));
        }
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(out, "{what} {} (version {})", e.id, e.version)?;
    for h in &e.headers {
        let value = if h.secret { "(secret)" } else { h.value_text() };
        writeln!(out, "header {}: {value}", h.name)?;
    }
    if let Some(f) = &e.filter {
        writeln!(out, "filter: {}", f.source())?;
    }
    if let Some(r) = e.rate_limit {
        writeln!(out, "rate limit: {r}/s, burst {}", e.burst.unwrap_or(1))?;
    }
    if !e.trace_context {
        writeln!(out, "trace context: off")?;
    }
    if let Some(s) = new_secret {
        writeln!(out, "secret: {s}")?;
        writeln!(out, "(shown once: configure it on the receiver)")?;
    }
    for s in &e.secrets {
        if let Some(until) = s.expires_at_ms {
            writeln!(
                out,
                "a previous secret keeps signing until {}",
                time(Some(until))
            )?;
        }
    }
    Ok(())
}

fn print_health(
    out: &mut dyn Write,
    reports: &std::collections::BTreeMap<String, HealthReport>,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        for r in reports.values() {
            writeln!(out, "{}", serde_json::to_string(r)?)?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = reports
        .values()
        .map(|r| {
            vec![
                r.endpoint_id.clone(),
                r.status.into(),
                r.success_rate
                    .map_or_else(|| "-".into(), |x| format!("{:.1}%", x * 100.0)),
                format!("{}/{}", r.successes_in_window, r.attempts_in_window),
                r.last_attempt.as_ref().map_or_else(
                    || "-".into(),
                    |l| match l.status {
                        Some(s) => format!("{} {s}", l.class),
                        None => l.class.clone(),
                    },
                ),
                r.consecutive_failures.to_string(),
                time(r.failing_since_ms),
                time(r.last_success_at_ms),
                r.pending_retries.to_string(),
                time(r.oldest_pending_retry_ms),
                r.dead.to_string(),
            ]
        })
        .collect();
    write_table(
        out,
        &[
            "ENDPOINT",
            "STATUS",
            "SUCCESS",
            "OK/ATTEMPTS",
            "LAST",
            "FAILURES",
            "FAILING SINCE",
            "LAST SUCCESS",
            "WAITING",
            "OLDEST WAITING",
            "DEAD",
        ],
        &rows,
    )?;
    Ok(())
}

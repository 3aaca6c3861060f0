//! The `hookline` binary: parses arguments and wires stages together. Every stage lives in its
//! own crate and exposes `run(config, registry, readiness, shutdown)`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use hookline_common::config::Config;
use hookline_common::contract::topics;
use hookline_common::kafka;
use hookline_common::runtime::ops::{self, Readiness};
use hookline_common::runtime::shutdown;

mod demo;
mod malloc;
mod telemetry;
mod traces;

#[derive(Parser)]
#[command(
    name = "hookline",
    version,
    about = "Webhook dispatcher on Apache Kafka"
)]
struct Cli {
    /// Configuration file (TOML); `HOOKLINE_…` environment variables override it.
    #[arg(
        short,
        long,
        env = "HOOKLINE_CONFIG",
        default_value = "config/hookline.toml",
        global = true
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one pipeline stage, or all of them in one process.
    Run {
        #[arg(value_enum)]
        stage: Stage,
        /// With `retry-tier`: the tier(s) to run, by name (`5m`); repeat for several.
        #[arg(long = "tier", value_name = "TIER")]
        tiers: Vec<String>,
        /// With `admin`: when `admin.tokens` is empty, make a random admin token and print it
        /// (loopback only). `run all` does this by itself.
        #[arg(long)]
        dev: bool,
    },
    /// Admin API tools.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Send dead deliveries again (one fresh attempt each; idempotent by DLQ position).
    Replay(hookline_tools::cli::ReplayArgs),
    /// Browse dead deliveries.
    Dead {
        #[command(subcommand)]
        command: hookline_tools::cli::DeadCommand,
    },
    /// Live endpoints on `<p>.endpoints` (against Kafka directly): list, add, update, disable,
    /// enable, delete, rotate-secret, health, reencrypt.
    Endpoints {
        #[command(subcommand)]
        command: hookline_control::cli::EndpointsCommand,
    },
    /// Every attempt of one event, from the delivery log `<p>.attempts` (all processes).
    Trace(hookline_control::cli::TraceArgs),
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Kafka topics implied by the configuration.
    Topics {
        #[command(subcommand)]
        command: TopicsCommand,
    },
    /// A reference webhook receiver (verifies signatures, dedupes by `webhook-id`); no config.
    Receiver(demo::ReceiverArgs),
    /// The demo: produce demo events to `<p>.events`.
    Demo {
        #[command(subcommand)]
        command: demo::DemoCommand,
    },
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Print a new random API token and the `[[admin.tokens]]` entry (its SHA-256) to configure.
    Token {
        /// Who will hold it (shown in logs).
        #[arg(long, default_value = "ops")]
        name: String,
        /// `admin` (every tenant) or `tenant:<id>`.
        #[arg(long, default_value = "admin")]
        scope: String,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a configuration file (with env overrides) without starting anything.
    Check { file: PathBuf },
}

#[derive(Subcommand)]
enum TopicsCommand {
    /// Create missing topics; report drift on existing ones (exit 3 if any) and list orphan
    /// retry tiers (not drift).
    Apply {
        /// Exit 0 even if existing topics drift from the plan.
        #[arg(long)]
        allow_drift: bool,
    },
    /// Print the topic plan, and the orphan retry tiers found on the broker (tier topics no
    /// longer in `retry.schedule`, being drained).
    Describe,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Stage {
    /// Validation and dedupe (stage A and B).
    Deduper,
    /// Fan-out and first delivery attempts from `<p>.dispatch`; failures go to the retry tiers.
    Dispatcher,
    /// Every retry tier's worker (delayed re-attempts; the last failure goes to `<p>.dlq`).
    RetryTiers,
    /// The worker of the tier(s) named with `--tier` (e.g. `--tier 5m`).
    RetryTier,
    /// The admin API, `POST /v1/events` and the dashboard (`admin.listen`).
    Admin,
    /// Every stage in one process, with the admin API (small installs, the demo).
    All,
}

/// Longest the process waits, once its command returned, for leftover blocking tasks.
const RUNTIME_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Config {
            command: ConfigCommand::Check { file },
        } => match Config::load(&file) {
            Ok(c) => {
                if !c.ignored_env.is_empty() {
                    eprintln!(
                        "note: ignored Kubernetes service link variables (not hookline overrides): {}",
                        c.ignored_env.join(", ")
                    );
                }
                println!(
                    "{}: ok ({} endpoints, {} retry tiers, prefix `{}`)",
                    file.display(),
                    c.endpoints.len(),
                    c.retry.schedule.len().saturating_sub(1),
                    c.topics.prefix
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                ExitCode::from(2)
            }
        },
        Command::Receiver(args) => demo::receiver_main(args),
        Command::Admin {
            command: AdminCommand::Token { name, scope },
        } => {
            if hookline_common::config::admin::TokenScope::parse(&scope).is_none() {
                eprintln!("--scope must be `admin` or `tenant:<id>`, not `{scope}`");
                return ExitCode::from(2);
            }
            let token = hookline_admin::auth::generate();
            let hash = hookline_admin::auth::hex(&hookline_admin::auth::sha256(&token));
            println!("token (give it to {name}; it is not stored anywhere): {token}\n");
            println!(
                "[[admin.tokens]]\nname = \"{name}\"\nsha256 = \"{hash}\"\nscope = \"{scope}\""
            );
            ExitCode::SUCCESS
        }
        command => {
            let config = match Config::load(&cli.config) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    eprintln!("{}: {e}", cli.config.display());
                    return ExitCode::from(2);
                }
            };
            telemetry::init(&config.log);
            let process = match &command {
                Command::Run { stage, .. } => stage
                    .to_possible_value()
                    .map_or("run".to_string(), |v| format!("run {}", v.get_name())),
                Command::Replay(_) => "replay".into(),
                Command::Endpoints { .. } => "endpoints".into(),
                _ => "tool".into(),
            };
            // Kept until the end: flushes the last spans.
            let _export = match traces::init(&config.traces, &process) {
                Ok(export) => export,
                Err(e) => {
                    eprintln!("{}: {e:#}", cli.config.display());
                    return ExitCode::from(2);
                }
            };
            if !config.ignored_env.is_empty() {
                // A Service named `hookline…` in the namespace: harmless, said once.
                tracing::info!(
                    variables = %config.ignored_env.join(","),
                    "ignoring kubernetes service link variables (not hookline overrides)"
                );
            }
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(run_command(command, config, &cli.config));
            // Dropping a runtime waits for its blocking tasks without limit; a Kafka call stuck
            // on an unreachable cluster must not keep the process from exiting.
            runtime.shutdown_timeout(RUNTIME_SHUTDOWN_WAIT);
            match result {
                Ok(code) => code,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "hookline failed");
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run_command(
    command: Command,
    config: Arc<Config>,
    config_path: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    // `topics describe` prints the plan without a broker; every other command needs one.
    let describe = matches!(
        command,
        Command::Topics {
            command: TopicsCommand::Describe
        }
    );
    if !describe {
        if let Some(code) = check_kafka_access(&config, config_path).await? {
            return Ok(code);
        }
    }
    match command {
        Command::Topics {
            command: TopicsCommand::Describe,
        } => {
            for t in topics::plan(&config) {
                let configs: Vec<String> =
                    t.configs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{:<40} partitions={:<4} rf={} {}\n    {}",
                    t.name,
                    t.partitions,
                    t.replication_factor,
                    configs.join(" "),
                    t.purpose
                );
            }
            // Orphan tiers need the broker; the plan above does not, so an unreachable broker
            // only leaves them unchecked.
            match kafka::describe_orphans(&config, Duration::from_secs(10)).await {
                Ok(orphans) => {
                    for o in &orphans {
                        println!("ORPHAN    {o}");
                    }
                }
                Err(e) => println!("orphan retry tiers not checked: {e:#}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Topics {
            command: TopicsCommand::Apply { allow_drift },
        } => {
            let report = kafka::apply_topics(&config, Duration::from_secs(30)).await?;
            for t in &report.created {
                println!("created   {t}");
            }
            for t in &report.unchanged {
                println!("unchanged {t}");
            }
            for d in &report.drift {
                println!("DRIFT     {d}");
            }
            // Not drift: the schedule changed; the tier workers drain them, nothing is deleted.
            for o in &report.orphans {
                println!("ORPHAN    {o}");
            }
            if !report.drift.is_empty() && !allow_drift {
                eprintln!(
                    "{} drift(s) found; hookline never alters existing topics: fix them by hand \
                     (or pass --allow-drift)",
                    report.drift.len()
                );
                return Ok(ExitCode::from(3));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { stage, tiers, dev } => run_stages(stage, tiers, dev, config)
            .await
            .map(|()| ExitCode::SUCCESS),
        // Exit 0 only when everything selected was delivered or already replayed; the summary's
        // last line says why not.
        Command::Replay(args) => hookline_tools::cli::replay(config, args)
            .await
            .map(|summary| {
                if summary.all_done() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(hookline_tools::replay::EXIT_NOT_ALL_DELIVERED)
                }
            }),
        Command::Dead { command } => hookline_tools::cli::dead(config, command)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Endpoints {
            command: hookline_control::cli::EndpointsCommand::Test { id, output },
        } => endpoint_test(config, &id, output.json()).await,
        Command::Endpoints { command } => hookline_control::cli::endpoints(config, command)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Trace(args) => hookline_control::cli::trace(config, args)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Demo { command } => demo::run(command, config, config_path)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Config { .. } | Command::Receiver(_) | Command::Admin { .. } => {
            unreachable!("handled before the runtime starts")
        }
    }
}

async fn run_stages(
    stage: Stage,
    tiers: Vec<String>,
    dev: bool,
    config: Arc<Config>,
) -> anyhow::Result<()> {
    match (stage, tiers.is_empty()) {
        (Stage::RetryTier, true) => anyhow::bail!("`run retry-tier` needs --tier <name> (e.g. 5m)"),
        (Stage::RetryTier, false) => {}
        (_, false) => anyhow::bail!("--tier applies to `run retry-tier` only"),
        (_, true) => {}
    }
    if dev && stage != Stage::Admin {
        anyhow::bail!("--dev applies to `run admin` only (`run all` makes a dev token by itself)");
    }
    let (trigger, shutdown) = shutdown::channel();
    shutdown::on_signals(trigger.clone());
    let registry = prometheus::Registry::new();
    let readiness = Readiness::new(config.server.liveness_bound);
    let (_addr, ops_task) = ops::serve(
        config.server.listen,
        registry.clone(),
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;

    // What every stage's `run` takes.
    let ctx = || {
        (
            config.clone(),
            registry.clone(),
            readiness.clone(),
            shutdown.clone(),
        )
    };
    // One control plane (live endpoints, delivery log) for every stage of the process that
    // delivers or administers; the deduper needs none.
    let plane = if stage == Stage::Deduper {
        None
    } else {
        Some(hookline_control::Plane::from_env(&config, &registry).await?)
    };
    let mut tasks = tokio::task::JoinSet::new();
    if matches!(stage, Stage::Deduper | Stage::All) {
        let (c, r, rd, s) = ctx();
        tasks.spawn(async move { ("deduper", hookline_deduper::run(c, r, rd, s).await) });
    }
    if let Some(plane) = &plane {
        if matches!(stage, Stage::Dispatcher | Stage::All) {
            let ((c, r, rd, s), p) = (ctx(), plane.clone());
            tasks.spawn(async move {
                let result = hookline_dispatcher::run_with(c, r, rd, s, p).await;
                ("dispatcher", result)
            });
            // Operational webhooks: every dispatcher process is a member of the relay's group.
            let (c, r, rd, s) = ctx();
            tasks.spawn(async move {
                let result = hookline_control::relay::run(c, r, rd, s).await;
                (hookline_control::relay::STAGE, result)
            });
        }
        if matches!(stage, Stage::RetryTiers | Stage::RetryTier | Stage::All) {
            let ((c, r, rd, s), p) = (ctx(), plane.clone());
            let only = (stage == Stage::RetryTier).then_some(tiers);
            tasks.spawn(async move {
                let result = hookline_retry_tiers::run_with(c, r, rd, s, only, p).await;
                ("retry-tiers", result)
            });
        }
        if matches!(stage, Stage::Admin | Stage::All) {
            let ((c, r, rd, s), p) = (ctx(), plane.clone());
            let dev = dev || stage == Stage::All;
            tasks.spawn(
                async move { ("admin", hookline_admin::run_with(c, r, rd, s, dev, p).await) },
            );
        }
    }
    let mut failed = None;
    while let Some(joined) = tasks.join_next().await {
        let (name, result) = joined.context("a stage task panicked")?;
        if let Err(e) = result {
            tracing::error!(
                stage = name,
                error = format!("{e:#}"),
                "stage failed; stopping the process"
            );
            failed.get_or_insert(e.context(format!("stage {name}")));
            // Stop the other stages too: the orchestrator restarts the whole process.
            trigger.trigger();
        }
    }
    if let Some(plane) = plane {
        plane.close().await;
    }
    ops_task.abort();
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The login check of `kafka::access` before any Kafka client starts: a refused login (SASL,
/// TLS) stops the command within seconds with its own exit code (10–16) and a line naming the
/// listener, the mechanism and the fix; options librdkafka rejects are a config error (2). An
/// unreachable cluster is not decided here: the stages wait for it.
async fn check_kafka_access(
    config: &Arc<Config>,
    config_path: &std::path::Path,
) -> anyhow::Result<Option<ExitCode>> {
    use kafka::access::CheckError;
    let c = config.clone();
    let checked = tokio::task::spawn_blocking(move || kafka::access::check(&c))
        .await
        .context("the kafka access check panicked")?;
    Ok(match checked {
        Ok(()) => None,
        Err(CheckError::Refused(e)) => {
            tracing::error!(
                refusal = ?e.refusal,
                listener = %e.listener,
                mechanism = %e.mechanism,
                fix = %e.fix,
                cause = %e.cause,
                exit_code = e.exit_code(),
                "kafka refused access; stopping"
            );
            eprintln!("error: {e}");
            Some(ExitCode::from(e.exit_code()))
        }
        Err(CheckError::Options(msg)) => {
            tracing::error!(error = %msg, "kafka.options rejected by librdkafka");
            eprintln!("{}: {msg}", config_path.display());
            Some(ExitCode::from(2))
        }
    })
}

/// `hookline endpoints test ID`: one signed `hookline.test` event through the delivery engine,
/// logged in the endpoint's delivery log; exits 4 when it was not delivered.
async fn endpoint_test(config: Arc<Config>, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let plane = hookline_control::Plane::for_tool(&config).await?;
    let replays =
        hookline_tools::replay::Replays::new(config, &prometheus::Registry::new(), plane.clone())?;
    let sent = replays.test_send(id).await;
    plane.close().await;
    let Some(sent) = sent else {
        anyhow::bail!("no endpoint {id:?} in the registry (hookline endpoints list)");
    };
    if json {
        println!("{}", sent.to_json());
    } else {
        println!("{}", sent.line());
    }
    Ok(if sent.delivered {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(hookline_tools::replay::EXIT_NOT_ALL_DELIVERED)
    })
}

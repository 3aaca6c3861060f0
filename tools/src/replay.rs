//! `hookline replay`: sends dead deliveries again, by filter.
//!
//! It reads `<p>.dlq` from the beginning (or the given offsets) up to the end it had at start,
//! keeps the records matching the filters, and gives each one fresh immediate attempt with the
//! delivery engine and the endpoint's current config: `webhook-attempt` = previous attempts + 1,
//! `webhook-id` = the same event id, the same body. Replays go straight to the endpoint (no event
//! dedupe: they are intentional). On failure the delivery returns to the DLQ as a new record with
//! the attempt appended and `hookline-replay-key` set.
//!
//! `--with-retries` gives it a fresh full schedule instead: the immediate attempt is attempt 1 of
//! a new schedule (`webhook-attempt` counts from 1 again, the history keeps the earlier attempts)
//! and a failure goes to the first tier, then through the tiers as usual.
//!
//! A dead letter is replayed only to an endpoint that is configured, enabled and still subscribes
//! to the event's tenant and type (the dispatcher's fan-out rule): an endpoint whose tenant or
//! event types changed since may now belong to someone else. Others are skipped, counted and
//! reported (nothing is sent, nothing is written, so a later replay can still send them).
//!
//! Outcome: [`ReplaySummary::all_done`] is true only when every selected dead letter was
//! delivered or had already been replayed; the binary exits [`EXIT_NOT_ALL_DELIVERED`] otherwise,
//! and the summary's last line says why.
//!
//! Idempotence: each record's replay is named by its intent, `dlq:<partition>:<offset>`. When its
//! attempt has finished (and a failure's new record is acknowledged), the key is recorded on the
//! compacted `<p>.replays` with the outcome as JSON. A replay first reads `<p>.replays` and skips
//! the keys already there, so running the same replay twice sends once, and a replay that crashed
//! sends again only what was in flight (at most `--concurrency` records, 1 by default).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::util::Timeout;
use tokio::task::JoinSet;

use bytes::Bytes;
use prometheus::Registry;

use crate::dead::{attempts_made, DeadFilter, DeadRecord};
use crate::read::{Range, TopicReader};
use hookline_common::config::Config;
use hookline_common::contract::delivery::DeadReason;
use hookline_common::contract::quarantine::Source;
use hookline_common::contract::replays::{self, ReplayRecord};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::{self, OwnedRecord, ProduceErrors, Ungated};
use hookline_common::kafka::producer_config;
use hookline_common::runtime::clock::now_ms;
use hookline_delivery::filter::EventView;
use hookline_delivery::outcome::attempt_record;
use hookline_delivery::{
    AttemptMetrics, AttemptOutcome, AttemptResult, Delivery, DeliveryPath, Engine, HopWriter, Next,
    Origin, Turn, Written,
};

/// What to replay and how.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub filter: DeadFilter,
    /// List what would be replayed; send and write nothing.
    pub dry_run: bool,
    /// Deliveries started per second, at most.
    pub rate: Option<f64>,
    /// A fresh full schedule instead of one immediate attempt.
    pub with_retries: bool,
    /// Replays in flight at once (≥ 1).
    pub concurrency: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            filter: DeadFilter::default(),
            dry_run: false,
            rate: None,
            with_retries: false,
            concurrency: 1,
        }
    }
}

/// What a replay run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Dead letters matching the filters.
    pub selected: usize,
    /// Selected, but their replay key is already on `<p>.replays`.
    pub already_replayed: usize,
    /// Listed by a dry run.
    pub would_replay: usize,
    pub delivered: usize,
    /// Attempted and failed: back on the DLQ (or the first tier with `--with-retries`).
    pub failed: usize,
    /// Not attempted: unreadable metadata, the endpoint is not configured or disabled, or it no
    /// longer subscribes to the event (counted in `unsubscribed` too).
    pub skipped: usize,
    /// Skipped because the endpoint no longer subscribes to the event (tenant, types or filter).
    pub unsubscribed: usize,
}

/// Exit code of `hookline replay` when it ran but not every selected dead letter was delivered
/// (or, in a dry run, would be attempted): some failed or were skipped.
pub const EXIT_NOT_ALL_DELIVERED: u8 = 4;

impl ReplaySummary {
    /// Every selected dead letter was delivered now or replayed before (nothing selected counts
    /// as done); in a dry run: every one would be attempted or was replayed before.
    pub fn all_done(&self) -> bool {
        self.failed == 0 && self.skipped == 0
    }

    /// The last line of the summary: the outcome and, when not everything was done, why.
    pub fn verdict(&self, dry_run: bool) -> String {
        if self.all_done() {
            return if dry_run {
                "result: ok (every selected dead delivery would be attempted or was already replayed)".into()
            } else {
                "result: ok (every selected dead delivery was delivered or already replayed)".into()
            };
        }
        let mut why = Vec::new();
        if self.failed > 0 {
            why.push(format!(
                "{} failed again (back on the dead-letter topic or the first tier)",
                self.failed
            ));
        }
        if self.skipped > 0 {
            let mut skipped = format!("{} skipped", self.skipped);
            if self.unsubscribed > 0 {
                skipped.push_str(&format!(
                    " ({} to an endpoint that no longer subscribes to the event)",
                    self.unsubscribed
                ));
            }
            why.push(skipped);
        }
        format!(
            "result: not everything selected was {}: {}; exit code {EXIT_NOT_ALL_DELIVERED}",
            if dry_run { "replayable" } else { "delivered" },
            why.join(", ")
        )
    }
}

/// What replays of one process share: the delivery engine (its per-endpoint caps) and the
/// attempt series (`hookline_delivery_*{stage="replay"}`), registered once. The admin process
/// keeps one for every replay it runs; the command line makes one per run.
pub struct Replays {
    config: Arc<Config>,
    engine: Engine,
    attempts: AttemptMetrics,
    /// The live endpoints replays go to, and the delivery log they are written to.
    plane: hookline_control::Plane,
}

/// Everything a replay task needs.
struct Replayer {
    topics: Topics,
    /// Attempts and writes a failure's new record (DLQ or first tier).
    path: DeliveryPath,
    attempts: AttemptMetrics,
    with_retries: bool,
    /// Keeps the writer's shutdown signal from ever firing (see `run_with`).
    _never: hookline_common::runtime::shutdown::ShutdownTrigger,
}

/// How one replay ended.
struct Replayed {
    position: String,
    endpoint_id: String,
    event_id: String,
    attempt: u32,
    /// `Err`: not attempted, the endpoint may not receive the event (any more).
    outcome: Result<AttemptOutcome, DeadReason>,
    /// Where a failure went (`<p>.dlq` or the first tier).
    returned_to: Option<String>,
}

/// Runs a replay with replays of its own (the command line: no metrics endpoint), writing one
/// line per record and a summary to `out`.
pub async fn run(
    config: Arc<Config>,
    options: ReplayOptions,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<ReplaySummary> {
    let plane = hookline_control::Plane::for_tool(&config).await?;
    let summary = Replays::new(config, &Registry::new(), plane.clone())?
        .run(options, out)
        .await;
    plane.close().await;
    summary
}

impl Replays {
    /// Registers the replay series on `registry` (once per process and registry). Replays go
    /// to the endpoints of `plane`'s registry as they are now, and every attempt is written to
    /// its delivery log.
    pub fn new(
        config: Arc<Config>,
        registry: &Registry,
        plane: hookline_control::Plane,
    ) -> anyhow::Result<Replays> {
        let engine = Engine::new(
            &config.http,
            config.tiers.endpoint_concurrency,
            registry,
            "replay",
        )
        .context("building the delivery engine")?;
        let attempts =
            AttemptMetrics::register(registry, "replay").context("registering replay metrics")?;
        Ok(Replays {
            config,
            engine,
            attempts,
            plane,
        })
    }

    /// The live endpoints and delivery log replays (and test sends) use.
    pub(crate) fn plane(&self) -> &hookline_control::Plane {
        &self.plane
    }

    /// The delivery engine replays (and test sends) attempt through.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs a replay, writing one line per record and a summary to `out`.
    pub async fn run(
        &self,
        options: ReplayOptions,
        out: &mut (dyn Write + Send),
    ) -> anyhow::Result<ReplaySummary> {
        run_with(self, options, out).await
    }
}

async fn run_with(
    replays: &Replays,
    options: ReplayOptions,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<ReplaySummary> {
    let config = &replays.config;
    let topics = Topics::new(&config.topics.prefix);
    let finished = finished(config).await?;
    let endpoints = replays.plane.live_endpoints();
    let replayer = if options.dry_run {
        None
    } else {
        let producer: FutureProducer = producer_config(config)
            .create()
            .context("creating the replay producer")?;
        // A replay has no shutdown signal of its own: transient errors are retried until they
        // pass or the operator interrupts the command. The trigger lives as long as the
        // replayer (a dropped one would stop the retries at once).
        let (never, shutdown) = hookline_common::runtime::shutdown::channel();
        let errors = ProduceErrors::unregistered();
        let writer = HopWriter::connect(config, producer, errors, shutdown).await?;
        let path = DeliveryPath::new(
            replays.engine.clone(),
            endpoints.clone(),
            writer,
            &config.retry.schedule,
        )
        .with_observer(replays.plane.observer())
        .with_endpoint_label_limit(config.control.metrics_endpoint_limit);
        Some(Arc::new(Replayer {
            topics: topics.clone(),
            path,
            attempts: replays.attempts.clone(),
            with_retries: options.with_retries,
            _never: never,
        }))
    };
    let mut pace = options.rate.filter(|r| *r > 0.0).map(|rate| {
        let mut i = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let concurrency = options.concurrency.max(1);

    let mut summary = ReplaySummary::default();
    let mut tasks: JoinSet<anyhow::Result<Replayed>> = JoinSet::new();
    let mut reader = TopicReader::open(config, &topics.dlq(), &options.filter.range()).await?;
    while let Some(m) = reader.next().await? {
        let record = DeadRecord::from_message(&m);
        if !options.filter.matches(&record) {
            continue;
        }
        summary.selected += 1;
        if finished.contains_key(&record.replay_key()) {
            summary.already_replayed += 1;
            continue;
        }
        let meta = match &record.meta {
            Ok(meta) => meta,
            Err(e) => {
                summary.skipped += 1;
                writeln!(
                    out,
                    "skipped {}: unreadable delivery metadata ({e})",
                    record.position()
                )?;
                continue;
            }
        };
        // The filter is part of the subscription (the attempt checks it again, and counts).
        let usable = endpoints.current().usable_for(meta).and_then(|e| {
            if EventView::of_delivery(meta, &record.value).admitted_by(&e) {
                Ok(e)
            } else {
                Err(DeadReason::EndpointUnsubscribed)
            }
        });
        if let Err(reason) = usable {
            skipped(&mut summary, out, &record.position(), meta, reason)?;
            continue;
        }
        let Some(replayer) = &replayer else {
            summary.would_replay += 1;
            writeln!(
                out,
                "would replay {} endpoint={} event={} type={} reason={} attempts={}",
                record.position(),
                meta.endpoint_id,
                meta.event_id,
                meta.event_type,
                meta.dead_reason.map_or("-", |d| d.as_str()),
                attempts_made(meta)
            )?;
            continue;
        };
        while tasks.len() >= concurrency {
            if let Some(joined) = tasks.join_next().await {
                report(joined, &mut summary, out)?;
            }
        }
        if let Some(pace) = &mut pace {
            pace.tick().await;
        }
        let replayer = replayer.clone();
        tasks.spawn(async move { replayer.replay(record).await });
    }
    while let Some(joined) = tasks.join_next().await {
        report(joined, &mut summary, out)?;
    }
    if let Some(replayer) = replayer {
        let producer = replayer.path.writer().producer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            producer.flush(Timeout::After(Duration::from_secs(10)))
        })
        .await;
    }
    if options.dry_run {
        writeln!(
            out,
            "dry run: {} selected, {} would be replayed, {} already replayed, {} skipped ({} unsubscribed)",
            summary.selected,
            summary.would_replay,
            summary.already_replayed,
            summary.skipped,
            summary.unsubscribed
        )?;
    } else {
        writeln!(
            out,
            "replay: {} selected, {} delivered, {} failed, {} already replayed, {} skipped ({} unsubscribed)",
            summary.selected,
            summary.delivered,
            summary.failed,
            summary.already_replayed,
            summary.skipped,
            summary.unsubscribed
        )?;
    }
    writeln!(out, "{}", summary.verdict(options.dry_run))?;
    Ok(summary)
}

/// Prints and counts one finished replay; a Kafka write failure stops the run.
fn report(
    joined: Result<anyhow::Result<Replayed>, tokio::task::JoinError>,
    summary: &mut ReplaySummary,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let r = joined.context("a replay task panicked")??;
    let outcome = match &r.outcome {
        Ok(outcome) => outcome,
        // The endpoint changed between the selection and the attempt.
        Err(reason) => {
            summary.skipped += 1;
            summary.unsubscribed += usize::from(*reason == DeadReason::EndpointUnsubscribed);
            writeln!(
                out,
                "skipped {}: endpoint {} may no longer receive the event ({})",
                r.position,
                r.endpoint_id,
                reason.as_str()
            )?;
            return Ok(());
        }
    };
    let line = format!(
        "replayed {} endpoint={} event={} attempt={}",
        r.position, r.endpoint_id, r.event_id, r.attempt
    );
    match &outcome.result {
        AttemptResult::Delivered { status } => {
            summary.delivered += 1;
            writeln!(out, "{line} result=delivered status={status}")?;
        }
        AttemptResult::Failed { class, status, .. } => {
            summary.failed += 1;
            let status = status.map(|s| format!(" status={s}")).unwrap_or_default();
            writeln!(
                out,
                "{line} result=failed class={class}{status} returned_to={}",
                r.returned_to.as_deref().unwrap_or("-")
            )?;
        }
    }
    Ok(())
}

/// Counts and prints a dead letter whose endpoint may not receive it.
fn skipped(
    summary: &mut ReplaySummary,
    out: &mut (dyn Write + Send),
    position: &str,
    meta: &hookline_common::contract::delivery::DeliveryMeta,
    reason: DeadReason,
) -> std::io::Result<()> {
    summary.skipped += 1;
    match reason {
        DeadReason::EndpointUnsubscribed => {
            summary.unsubscribed += 1;
            writeln!(
                out,
                "skipped {position}: endpoint {} no longer subscribes to this event (tenant={} type={})",
                meta.endpoint_id,
                meta.tenant.as_deref().unwrap_or("-"),
                meta.event_type
            )
        }
        DeadReason::EndpointDisabled => writeln!(
            out,
            "skipped {position}: endpoint {} is disabled",
            meta.endpoint_id
        ),
        _ => writeln!(
            out,
            "skipped {position}: endpoint {} is not configured",
            meta.endpoint_id
        ),
    }
}

impl Replayer {
    /// One replay: the attempt and a failure's new record (the delivery path), then the replay
    /// key on `<p>.replays`.
    async fn replay(&self, record: DeadRecord) -> anyhow::Result<Replayed> {
        let key = record.replay_key();
        let mut meta = record
            .meta
            .map_err(|e| anyhow::anyhow!("unreadable metadata: {e}"))?;
        meta.attempt = if self.with_retries {
            1
        } else {
            // `attempt` is the next attempt's number; the history may hold a larger one if the
            // record was written by an older schedule.
            meta.attempt.max(attempts_made(&meta) + 1)
        };
        let attempt = meta.attempt;
        let delivery = Delivery {
            meta,
            key: record.key.map(Bytes::from),
            body: record.value,
            dedupe_key: record.dedupe_key,
        };
        let dlq = self.topics.dlq();
        let origin = Origin {
            source: Source {
                topic: &dlq,
                partition: record.partition,
                offset: record.offset,
            },
            gate: &Ungated,
            cutoff: None,
        };
        let turn = Turn::Replay {
            replay_key: key.clone(),
            with_retries: self.with_retries,
        };
        let report = self
            .path
            .attempt(&self.attempts, delivery, turn, origin)
            .await?;
        let position = format!("{}:{}", record.partition, record.offset);
        let (outcome, returned_to) = match (report.outcome, &report.next) {
            // Skipped: nothing sent, nothing written, the key not recorded (a later replay may
            // send it).
            (_, Next::Skipped(reason)) => {
                return Ok(Replayed {
                    position,
                    endpoint_id: report.meta.endpoint_id,
                    event_id: report.meta.event_id,
                    attempt,
                    outcome: Err(*reason),
                    returned_to: None,
                })
            }
            (Some(outcome), Next::Delivered) => (outcome, None),
            (Some(outcome), Next::Handed { hop, written, .. }) => {
                let returned_to = match written {
                    Written::AsPlanned => Some(hop.topic().to_string()),
                    Written::DeadTooLarge => Some(self.topics.dlq()),
                    Written::Quarantined => Some(self.topics.invalid()),
                    Written::Dropped => None,
                };
                (outcome, returned_to)
            }
            (None, next) => anyhow::bail!("replay {key} ended without an attempt: {next:?}"),
        };
        let meta = report.meta;
        let done = ReplayRecord {
            replay_key: key.clone(),
            position: record_position(&key).to_string(),
            endpoint_id: meta.endpoint_id.clone(),
            event_id: meta.event_id.clone(),
            attempt,
            result: if outcome.result.is_delivered() {
                replays::DELIVERED
            } else {
                replays::FAILED
            }
            .to_string(),
            attempt_record: Some(attempt_record(&outcome)),
            returned_to: returned_to.clone(),
            with_retries: self.with_retries,
            finished_at_ms: now_ms(),
        };
        let finished = OwnedRecord {
            topic: self.topics.replays(),
            partition: None,
            key: Some(key.as_bytes().to_vec()),
            value: Some(done.to_bytes()),
            headers: OwnedHeaders::new(),
        };
        let writer = self.path.writer();
        produce::send_acked(
            &writer.producer,
            &finished,
            &writer.errors,
            &writer.shutdown,
        )
        .await
        .with_context(|| format!("recording replay {key} on {}", self.topics.replays()))?;
        Ok(Replayed {
            position,
            endpoint_id: meta.endpoint_id,
            event_id: meta.event_id,
            attempt,
            outcome: Ok(outcome),
            returned_to,
        })
    }
}

/// `dlq:0:5` → `0:5`.
fn record_position(key: &str) -> &str {
    key.strip_prefix("dlq:").unwrap_or(key)
}

/// Every finished replay on `<p>.replays`: replay key → its record.
pub async fn finished(config: &Config) -> anyhow::Result<HashMap<String, ReplayRecord>> {
    let topic = Topics::new(&config.topics.prefix).replays();
    let mut reader = TopicReader::open(config, &topic, &Range::default()).await?;
    let mut done = HashMap::new();
    while let Some(m) = reader.next().await? {
        let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
            continue;
        };
        match m.payload() {
            // A tombstone: the replay key was released by an operator.
            None => {
                done.remove(key);
            }
            Some(v) => {
                done.insert(key.to_string(), ReplayRecord::from_bytes(v));
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_delivered_or_already_replayed_is_all_done() {
        let done = ReplaySummary {
            selected: 3,
            delivered: 2,
            already_replayed: 1,
            ..ReplaySummary::default()
        };
        assert!(done.all_done());
        assert!(done.verdict(false).starts_with("result: ok"));
        assert!(ReplaySummary::default().all_done(), "nothing selected");
        let failed = ReplaySummary {
            failed: 1,
            ..done.clone()
        };
        assert!(!failed.all_done());
        assert!(failed.verdict(false).contains("1 failed again"));
        let skipped = ReplaySummary {
            skipped: 2,
            unsubscribed: 1,
            ..done
        };
        assert!(!skipped.all_done());
        let v = skipped.verdict(false);
        assert!(
            v.contains("2 skipped (1 to an endpoint that no longer subscribes"),
            "{v}"
        );
        assert!(v.ends_with("exit code 4"), "{v}");
    }

    #[test]
    fn replay_keys_name_the_dlq_position() {
        assert_eq!(crate::dead::replay_key(4, 17), "dlq:4:17");
        assert_eq!(record_position("dlq:4:17"), "4:17");
    }
}

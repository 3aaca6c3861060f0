//! The dispatcher stage: consume `<p>.dispatch`, fan each event out to its endpoints, make the
//! first attempt of every (event, endpoint) delivery, hand failures to the first retry tier, and
//! store offsets only for the contiguous prefix of events that are completely done.
//!
//! Flow of one record:
//! 1. the consumer loop reads it, checks the envelope headers the deduper wrote (a record
//!    without them is parked on `<p>.invalid` as `bad_delivery_record`, never skipped silently),
//!    picks the matching endpoints ([`Endpoints::matching`]) and spawns one task per endpoint;
//! 2. each task makes attempt 1 through the shared delivery path ([`DeliveryPath::attempt`]); a
//!    failure becomes a delivery record on the first tier (or `<p>.dlq` for a single-attempt
//!    schedule) and the task waits for Kafka's acknowledgement. When the endpoint is saturated
//!    (its concurrency slots all busy with requests that do not finish quickly: a slow or
//!    hanging endpoint), attempt 1 is not made: the delivery is *deferred* to the first tier at
//!    once (attempt number unchanged), so a slow endpoint holds up only its own deliveries;
//! 3. the task that finishes the event's last delivery completes its offset in `Partitions`,
//!    which stores `offset + 1` of the contiguous completed prefix.
//!
//! At-least-once, per partition, with at most `dispatcher.max_in_flight_per_partition`
//! *unfinished* events in flight, and at most a larger span of tracked events from the oldest
//! unfinished one (see [`crate::window`]): an event stuck behind a hanging delivery takes one
//! place, finished events behind it none. Flow control when a record arrives for a full
//! partition — the record is held (never skipped: nothing of its partition begins before it) and:
//! - reading stops until the partition has room: with healthy endpoints that is milliseconds,
//!   and nothing else happens;
//! - if that stall reaches `FULL_STALL` (100 ms; a stuck head, e.g. a hanging endpoint), or the
//!   partition already held reading up for `STALL_BUDGET` in all while another partition may
//!   have records queued behind its batch (a slow endpoint), the partition is paused and the
//!   others read on; it resumes, held record first, once half its window has drained.
//!
//! Pausing is the exception because a librdkafka pause drops the partition's prefetched records
//! and a resume only fetches again at the broker thread's next fetch decision (up to
//! `fetch.wait.max.ms`, or ~1 s when idle): pausing at every full window cut backlog throughput
//! from ~13k to ~1.7k deliveries/s in tests. Stalling alone lets one slow partition set the pace
//! of all (librdkafka's single consumer queue holds its batch ahead of the others'): hence the
//! budget.
//!
//! The delivery tasks complete offsets and store them themselves, so completions never wait for
//! the consumer loop — which lets a revoke (a librdkafka callback that runs inside the loop's
//! `recv`) wait for the revoked partitions' deliveries.
//!
//! Rebalances never fork a retry chain: every hand-off is enqueued through the partition's
//! ownership gate ([`Ownership`]). A revoke waits (bounded) for the partition's deliveries, then
//! cuts the ones still running short (handed off as `timeout`), then closes the gate (no write of
//! the old owner can appear after that), waits for the enqueued hand-offs to be acknowledged, and
//! commits: every acknowledged hand-off is covered by the committed offset, so the new owner does
//! not send those events again.
//!
//! Duplicates: SIGTERM drains (every delivery finishes or is handed off, then a synchronous
//! commit), so a restart re-sends nothing. A crash (`kill -9`), a lost assignment, or a revoke
//! whose hand-offs outlast its bounded waits, leaves the events after the stored prefix to be
//! sent again by the next owner: receivers dedupe by `webhook-id`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::util::Timeout;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use hookline_common::config::Config;
use hookline_common::contract::event_headers::EventHeaders;
use hookline_common::contract::quarantine::{self, Quarantine, Source};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::{OwnedRecord, ProduceErrors};
use hookline_common::kafka::rebalance::{self, Rebalanced};
use hookline_common::kafka::{pipeline_consumer_config, producer_config};
use hookline_common::runtime::ops::StageProbe;
use hookline_common::runtime::shutdown::Shutdown;

use hookline_delivery::filter::EventView;
use hookline_delivery::{AttemptMetrics, DeliveryPath, Engine, HopWriter};

use crate::deliveries::Event;
use crate::metrics::ConsumerMetrics;
use crate::partitions::Partitions;
use crate::rebalance::{DispatchContext, REVOKE_WAIT_CAP};
use crate::window::Begin;

/// The consumer group of the dispatcher (`<group_prefix>.dispatcher`) and its readiness name.
pub const STAGE: &str = "dispatcher";

/// `hookline-invalid-reason` of a dispatch record that cannot be delivered (no event headers, no
/// value): the retry tiers' reason for a record whose delivery headers cannot be read.
pub const BAD_DELIVERY_RECORD: &str = "bad_delivery_record";

/// After the shutdown grace, how long interrupted deliveries get to be acknowledged on their
/// retry tier before the process gives up on them (their events are then re-sent by the next
/// owner: at-least-once).
const HANDOFF_DRAIN: Duration = Duration::from_secs(10);

/// How long reading stops for a record whose partition's window is full before that partition is
/// paused (and the others read again). Long enough for a healthy endpoint to free room, short
/// enough that one stuck partition barely delays the others.
const FULL_STALL: Duration = Duration::from_millis(100);

/// How much reading time, in all, a full partition may hold up (short stalls, each ended by room
/// appearing) between two pauses while other partitions may be waiting behind it. A partition
/// whose endpoints are slow but not stuck frees room often enough never to hit `FULL_STALL`;
/// this keeps it from setting everyone's pace.
const STALL_BUDGET: Duration = Duration::from_millis(100);

/// Runs the dispatcher until shutdown. Returns an error (process exits non-zero) only on a fatal
/// produce error (fenced, not authorised, topic gone): no offset is ever stored past that event.
/// A hand-off that can never be written as planned is rerouted (`hookline_delivery::write`),
/// never fatal.
pub async fn run(
    config: Arc<Config>,
    registry: prometheus::Registry,
    probe: StageProbe,
    mut shutdown: Shutdown,
    plane: &hookline_control::Plane,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let dispatch_topic = topics.dispatch();
    let metrics = ConsumerMetrics::register(&registry).context("registering consumer metrics")?;
    let engine = Engine::new(
        &config.http,
        config.dispatcher.endpoint_concurrency,
        &registry,
        STAGE,
    )
    .context("building the HTTP delivery engine")?;
    let attempts =
        AttemptMetrics::register(&registry, STAGE).context("registering attempt metrics")?;
    let partitions = Arc::new(Partitions::new(
        dispatch_topic.clone(),
        config.dispatcher.max_in_flight_per_partition,
    ));
    let context = DispatchContext {
        partitions: partitions.clone(),
        inbox: Default::default(),
        revoke_wait: config.dispatcher.shutdown_grace.min(REVOKE_WAIT_CAP),
        probe: probe.clone(),
    };
    let consumer: StreamConsumer<DispatchContext> = pipeline_consumer_config(&config, STAGE)
        .create_with_context(context)
        .context("creating the dispatcher consumer")?;
    let producer: FutureProducer = producer_config(&config)
        .create()
        .context("creating the dispatcher producer")?;

    let first_hop = match config.retry.schedule.get(1) {
        Some(offset) => topics.retry(*offset),
        None => topics.dlq(),
    };
    // Hand-offs to a missing tier would be auto-created with broker defaults or fail every
    // delivery: insist on the topics first.
    hookline_common::kafka::require_topics(
        &config,
        vec![dispatch_topic.clone(), first_hop.clone()],
        hookline_common::kafka::TOPICS_WAIT,
    )
    .await?;
    let errors = ProduceErrors::register(&registry, "dispatcher")
        .context("registering produce error metrics")?;
    let writer = HopWriter::connect(&config, producer.clone(), errors, shutdown.clone()).await?;
    consumer
        .subscribe(&[&dispatch_topic])
        .with_context(|| format!("subscribing to {dispatch_topic}"))?;

    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let path = DeliveryPath::new(
        engine,
        plane.live_endpoints(),
        writer,
        &config.retry.schedule,
    )
    .with_observer(plane.observer())
    .with_endpoint_label_limit(config.control.metrics_endpoint_limit);
    let dispatcher = Arc::new(Dispatcher {
        consumer,
        producer,
        partitions,
        path,
        attempts,
        metrics,
        fatal: fatal_tx,
    });
    info!(
        topic = %dispatch_topic,
        endpoints = dispatcher.path.endpoints().current().len(),
        first_hop = %first_hop,
        "dispatcher started"
    );

    let mut tasks: JoinSet<()> = JoinSet::new();
    let result = async {
        consume(
            &dispatcher,
            &probe,
            &mut tasks,
            &mut fatal_rx,
            &mut shutdown,
        )
        .await?;
        drain(&config, &dispatcher, &mut tasks, &mut fatal_rx).await
    }
    .await;

    // Nothing may touch the consumer after it is closed: stop whatever is left (only after a
    // fatal error or an unacknowledged hand-off), then close from a blocking thread (a close
    // polls librdkafka until the group is left and runs the revoke callback).
    tasks.shutdown().await;
    dispatcher.partitions.closing.store(true, Ordering::Relaxed);
    close(dispatcher, result.is_ok()).await;
    if result.is_ok() {
        info!("dispatcher stopped");
    }
    result
}

/// The consumer loop: reads records and spawns their deliveries until shutdown.
async fn consume(
    d: &Arc<Dispatcher>,
    probe: &StageProbe,
    tasks: &mut JoinSet<()>,
    fatal: &mut mpsc::UnboundedReceiver<anyhow::Error>,
    shutdown: &mut Shutdown,
) -> anyhow::Result<()> {
    // A record is held for this full partition, not paused (yet): reading stops until it has
    // room, or until the stall is over and it gets paused.
    let mut stalled: Option<(i32, tokio::time::Instant)> = None;
    // Reading time each partition held up since it was last paused.
    let mut spent: HashMap<i32, Duration> = HashMap::new();
    // The loop turns at least once a second, so its heartbeat means "not stuck" even when idle.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let inbox = &d.consumer.context().inbox;
    loop {
        probe.beat();
        let stall_over = async {
            match stalled {
                Some((_, since)) => tokio::time::sleep_until(since + FULL_STALL).await,
                None => std::future::pending().await,
            }
        };
        let wake = tokio::select! {
            biased;
            _ = shutdown.wait() => return Ok(()),
            Some(err) = fatal.recv() => return Err(err),
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => Wake::Reaped(joined),
            _ = tick.tick() => Wake::Recheck,
            () = inbox.posted() => Wake::Recheck,
            () = d.partitions.room.notified() => Wake::Room,
            () = stall_over => Wake::StallOver,
            msg = d.consumer.recv(), if stalled.is_none() => Wake::Received(msg),
        };
        // Callbacks ran inside `recv()`: apply them before acting on anything.
        for change in inbox.take() {
            match change {
                Rebalanced::Assigned(assigned) => d.partitions.assign(&assigned),
                Rebalanced::Revoked(ids) => {
                    d.partitions.forget(&ids);
                    for p in &ids {
                        spent.remove(p);
                    }
                    stalled = stalled.filter(|(p, _)| !ids.contains(p));
                }
            }
        }
        match wake {
            Wake::Reaped(joined) => reap(joined)?,
            Wake::Recheck => {}
            Wake::Room => {
                for held in d.partitions.release_held(&d.consumer) {
                    // Taken in order; one that finds the window full again is held again.
                    if let Some(partition) = d.take(&held, tasks) {
                        if stalled.is_none() {
                            stalled = d.on_full(partition, &mut spent);
                        }
                    }
                }
                if let Some((p, since)) = stalled {
                    if !d.partitions.holds(p) {
                        *spent.entry(p).or_default() += since.elapsed();
                        stalled = None;
                    }
                }
            }
            Wake::StallOver => {
                if let Some((partition, _)) = stalled.take() {
                    d.partitions.pause(&d.consumer, partition);
                    spent.remove(&partition);
                }
            }
            Wake::Received(Ok(msg)) => {
                if let Some(partition) = d.take(&msg, tasks) {
                    stalled = d.on_full(partition, &mut spent);
                }
            }
            Wake::Received(Err(e)) => warn!(error = %e, "consumer error on the dispatch topic"),
        }
    }
}

/// What woke the consumer loop.
enum Wake<'a> {
    Reaped(Result<(), tokio::task::JoinError>),
    /// The tick or a rebalance: look again.
    Recheck,
    /// A partition holding a record has room for it.
    Room,
    /// The stalled partition's stall is over: pause it.
    StallOver,
    Received(rdkafka::error::KafkaResult<BorrowedMessage<'a>>),
}

/// Graceful stop: wait for in-flight deliveries (finish, or fail and be handed off) within the
/// grace; then cut the remaining attempts short and hand them off; then commit what is stored.
async fn drain(
    config: &Config,
    d: &Arc<Dispatcher>,
    tasks: &mut JoinSet<()>,
    fatal: &mut mpsc::UnboundedReceiver<anyhow::Error>,
) -> anyhow::Result<()> {
    let grace = config.dispatcher.shutdown_grace;
    info!(
        deliveries = tasks.len(),
        grace_ms = grace.as_millis() as u64,
        "dispatcher stopped fetching, draining in-flight deliveries"
    );
    wait_for_tasks(tasks, fatal, grace).await?;
    if !tasks.is_empty() {
        warn!(
            deliveries = tasks.len(),
            "shutdown grace over, handing unfinished deliveries to the retry tier"
        );
        d.partitions.ownership.cut_all();
        wait_for_tasks(tasks, fatal, HANDOFF_DRAIN).await?;
        if !tasks.is_empty() {
            warn!(
                deliveries = tasks.len(),
                "hand-offs not acknowledged in time; their events stay uncommitted and will be \
                 sent again by the next owner"
            );
        }
    }
    // The final commit happens in `close`, off the runtime and bounded.
    Ok(())
}

/// Reaps finished delivery tasks until none is left or `limit` passes.
async fn wait_for_tasks(
    tasks: &mut JoinSet<()>,
    fatal: &mut mpsc::UnboundedReceiver<anyhow::Error>,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    while !tasks.is_empty() {
        tokio::select! {
            biased;
            Some(err) = fatal.recv() => return Err(err),
            Some(joined) = tasks.join_next() => reap(joined)?,
            _ = &mut deadline => break,
        }
    }
    Ok(())
}

/// A delivery task that panicked left its event incomplete forever: the partition could never
/// move on, so the process stops and its successor resumes from the committed offset.
fn reap(joined: Result<(), tokio::task::JoinError>) -> anyhow::Result<()> {
    match joined {
        Err(e) if e.is_panic() => bail!("a delivery task panicked: {e}"),
        _ => Ok(()),
    }
}

/// The final offset commit (after a clean drain), the producer flush and the consumer close, on a
/// thread of their own and bounded in time.
async fn close(dispatcher: Arc<Dispatcher>, clean: bool) {
    hookline_common::kafka::closing::close("the dispatcher's consumer and producer", move || {
        if clean {
            match rebalance::commit(&dispatcher.consumer) {
                Ok(()) => info!("offsets committed"),
                Err(e) => {
                    warn!(error = %e, "final offset commit failed; auto-commit retries on close")
                }
            }
            let _ = dispatcher
                .producer
                .flush(Timeout::After(Duration::from_secs(5)));
        }
        drop(dispatcher);
    })
    .await;
}

/// Everything a delivery task needs, shared by the loop and the tasks.
pub(crate) struct Dispatcher {
    pub(crate) consumer: StreamConsumer<DispatchContext>,
    producer: FutureProducer,
    pub(crate) partitions: Arc<Partitions>,
    /// Attempts, next hops and hand-off writes (shared with the tiers and replay).
    pub(crate) path: DeliveryPath,
    /// `hookline_delivery_attempts_total{stage="dispatcher"}`.
    pub(crate) attempts: AttemptMetrics,
    pub(crate) metrics: ConsumerMetrics,
    /// A hand-off Kafka refused: the loop returns it and the process exits non-zero.
    pub(crate) fatal: mpsc::UnboundedSender<anyhow::Error>,
}

/// A record the loop can take: one just received, or one it held while its partition was full.
trait Record: Message {
    fn detach_owned(&self) -> OwnedMessage;
}

impl Record for BorrowedMessage<'_> {
    fn detach_owned(&self) -> OwnedMessage {
        self.detach()
    }
}

impl Record for OwnedMessage {
    fn detach_owned(&self) -> OwnedMessage {
        self.clone()
    }
}

impl Dispatcher {
    /// A dispatch record without the event headers (or value) as parked on `<p>.invalid`:
    /// whole, with the headers rust-rdkafka can read and the quarantine headers
    /// (`bad_delivery_record`, the problem, the source position).
    fn quarantined<M: Record>(&self, msg: &M, problem: &str) -> OwnedRecord {
        let headers = quarantine::header_pairs(msg.headers());
        let quarantine = Quarantine {
            reason: BAD_DELIVERY_RECORD,
            detail: problem,
            source: Source {
                topic: &self.partitions.topic,
                partition: msg.partition(),
                offset: msg.offset(),
            },
        };
        quarantine.whole(
            &self.path.topics().invalid(),
            msg.key(),
            msg.payload(),
            &headers,
        )
    }

    /// A record is held for a full partition: stop reading for a moment (room usually appears
    /// within milliseconds; see `FULL_STALL`), or pause the partition at once when it already
    /// held up reading for its `STALL_BUDGET` and other partitions may be waiting behind it.
    fn on_full(
        &self,
        partition: i32,
        spent: &mut HashMap<i32, Duration>,
    ) -> Option<(i32, tokio::time::Instant)> {
        let over_budget = spent.get(&partition).is_some_and(|s| *s >= STALL_BUDGET);
        if over_budget && self.partitions.others_may_wait(partition) {
            self.partitions.pause(&self.consumer, partition);
            spent.remove(&partition);
            None
        } else {
            Some((partition, tokio::time::Instant::now()))
        }
    }

    /// Takes one record: completes it at once (no endpoint), spawns its quarantine (malformed:
    /// completed once parked on `<p>.invalid`) or spawns its deliveries;
    /// or, when its partition's window is full, holds it and returns the partition (the loop
    /// stops reading). Never awaits, so every record the loop received is accounted for when the
    /// loop stops (a held record was not begun: its offset is never stored).
    fn take<M: Record>(self: &Arc<Self>, msg: &M, tasks: &mut JoinSet<()>) -> Option<i32> {
        let (partition, offset) = (msg.partition(), msg.offset());
        let generation = match self.partitions.begin(partition, offset) {
            Begin::Started(generation) => generation,
            Begin::Full => {
                self.partitions.hold(partition, msg.detach_owned());
                return Some(partition);
            }
            Begin::NotOwned => {
                debug!(partition, offset, "record of a revoked partition skipped");
                return None;
            }
        };
        let envelope = match (EventHeaders::from_message(msg), msg.payload()) {
            (Ok(envelope), Some(_)) => Ok(envelope),
            (Err(problem), _) => Err(problem),
            (Ok(_), None) => Err("the record has no value"),
        };
        let envelope = match envelope {
            Ok(envelope) => envelope,
            // Parked on `<p>.invalid`, completed once Kafka acknowledged it (see `park`).
            Err(problem) => {
                self.metrics.emit_malformed(partition, offset, problem);
                let record = self.quarantined(msg, problem);
                tasks.spawn(
                    self.clone()
                        .park(record, problem, partition, offset, generation),
                );
                return None;
            }
        };
        let view = EventView::new(
            &envelope.id,
            &envelope.event_type,
            envelope.tenant.as_deref(),
            msg.payload().unwrap_or_default(),
        );
        let endpoints = self.path.fan_out(
            &self.attempts,
            &view,
            envelope.tenant.as_deref(),
            &envelope.event_type,
        );
        drop(view);
        if endpoints.is_empty() {
            self.metrics
                .emit_no_endpoint(partition, offset, &envelope.event_type);
            self.partitions
                .complete(&self.consumer, partition, generation, offset);
            return None;
        }
        self.metrics
            .emit_fanned_out(partition, offset, endpoints.len());
        // The loop is the only one that handles revokes (inside `recv`), so the partition is still
        // owned in this generation; a dead receiver (never cut) is only a fallback.
        let cutoff = self
            .partitions
            .ownership
            .cutoff(partition, generation)
            .unwrap_or_else(|| watch::channel(false).1);
        let event = Arc::new(Event {
            partition,
            offset,
            generation,
            cutoff,
            id: envelope.id,
            event_type: envelope.event_type,
            tenant: envelope.tenant,
            dedupe_key: envelope.dedupe_key,
            trace: if hookline_common::runtime::traces::enabled() {
                hookline_common::contract::headers::get(
                    msg,
                    hookline_common::runtime::traces::TRACE_HEADER,
                )
                .map(str::to_string)
            } else {
                None
            },
            key: msg.key().map(Bytes::copy_from_slice),
            body: Bytes::copy_from_slice(msg.payload().unwrap_or_default()),
            pending: AtomicUsize::new(endpoints.len()),
        });
        for endpoint in endpoints {
            tasks.spawn(self.clone().deliver(event.clone(), endpoint));
        }
        None
    }
}

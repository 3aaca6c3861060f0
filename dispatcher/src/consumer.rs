//! The dispatcher stage: consume `<p>.dispatch`, fan each event out to its endpoints, make the
//! first attempt of every (event, endpoint) delivery, hand failures to the first retry tier, and
//! store offsets only for the contiguous prefix of events that are completely done.
//!
//! Flow of one record:
//! 1. the consumer loop reads it, checks the envelope headers the deduper wrote, picks the
//!    matching endpoints ([`Endpoints::matching`]) and spawns one task per endpoint;
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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use hookline_common::clock::now_ms;
use hookline_common::config::{Config, EndpointConfig};
use hookline_common::delivery::DeliveryMeta;
use hookline_common::headers as h;
use hookline_common::kafka::{consumer_config, producer_config};
use hookline_common::ops::StageProbe;
use hookline_common::ownership::{can_block_here, Claim, Ownership};
use hookline_common::produce::ProduceErrors;
use hookline_common::progress::Progress;
use hookline_common::quarantine::Source;
use hookline_common::shutdown::Shutdown;
use hookline_common::topics::Topics;

use hookline_delivery::{
    AttemptMetrics, Delivery, DeliveryPath, Engine, Hop, HopError, HopWriter, Next, Origin, Report,
    Turn, Why, Written,
};

use crate::metrics::{ConsumerMetrics, HandoffTarget};
use crate::window::Window;

/// The consumer group of the dispatcher (`<group_prefix>.dispatcher`) and its readiness name.
pub const STAGE: &str = "dispatcher";

/// Longest a revoke waits for the revoked partitions' deliveries (also bounded by
/// `dispatcher.shutdown_grace`). Well below the default session timeout (45 s); the group's
/// other members wait for this member during a rebalance.
const REVOKE_WAIT_CAP: Duration = Duration::from_secs(10);

/// At a revoke, after the wait for deliveries: how long the ones cut short get to be handed off
/// before the partition's gate closes.
const REVOKE_CUT_WAIT: Duration = Duration::from_secs(5);

/// At a revoke, after the gate closed: how long enqueued hand-offs get to be acknowledged before
/// the offsets are committed anyway.
const REVOKE_ACK_WAIT: Duration = Duration::from_secs(10);

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

/// A partition that received a record (or was assigned) this recently may have more records
/// queued behind a full partition's batch in librdkafka's single consumer queue.
const RECENTLY_ACTIVE: Duration = Duration::from_secs(2);

/// Runs the dispatcher until shutdown. Returns an error (process exits non-zero) only on a fatal
/// produce error (fenced, not authorised, topic gone): no offset is ever stored past that event.
/// A hand-off that can never be written as planned is rerouted (`handoff_write`), never fatal.
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
        revoke_wait: config.dispatcher.shutdown_grace.min(REVOKE_WAIT_CAP),
        probe: probe.clone(),
    };
    let consumer: StreamConsumer<DispatchContext> = consumer_config(&config, STAGE)
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
    loop {
        probe.beat();
        let stall_over = async {
            match stalled {
                Some((_, since)) => tokio::time::sleep_until(since + FULL_STALL).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = shutdown.wait() => return Ok(()),
            Some(err) = fatal.recv() => return Err(err),
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => reap(joined)?,
            _ = tick.tick() => {}
            () = d.partitions.room.notified() => {
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
            () = stall_over => {
                if let Some((partition, _)) = stalled.take() {
                    d.partitions.pause(&d.consumer, partition);
                    spent.remove(&partition);
                }
            }
            msg = d.consumer.recv(), if stalled.is_none() => match msg {
                Ok(msg) => {
                    if let Some(partition) = d.take(&msg, tasks) {
                        stalled = d.on_full(partition, &mut spent);
                    }
                }
                Err(e) => warn!(error = %e, "consumer error on the dispatch topic"),
            },
        }
    }
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
    hookline_common::closing::close("the dispatcher's consumer and producer", move || {
        if clean {
            match dispatcher.consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) => info!("offsets committed"),
                Err(e) if is_no_offset(&e) => debug!("nothing new to commit"),
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

fn is_no_offset(e: &KafkaError) -> bool {
    matches!(e, KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset))
}

/// Everything a delivery task needs, shared by the loop and the tasks.
struct Dispatcher {
    consumer: StreamConsumer<DispatchContext>,
    producer: FutureProducer,
    partitions: Arc<Partitions>,
    /// Attempts, next hops and hand-off writes (shared with the tiers and replay).
    path: DeliveryPath,
    /// `hookline_delivery_attempts_total{stage="dispatcher"}`.
    attempts: AttemptMetrics,
    metrics: ConsumerMetrics,
    /// A hand-off Kafka refused: the loop returns it and the process exits non-zero.
    fatal: mpsc::UnboundedSender<anyhow::Error>,
}

/// One event read from `<p>.dispatch`, shared by its deliveries.
struct Event {
    partition: i32,
    offset: i64,
    /// The partition's assignment generation when the event was read (see [`Ownership`]).
    generation: u64,
    /// Set when the shutdown grace is over or the partition is being revoked: attempts still
    /// running are cut short and handed off.
    cutoff: watch::Receiver<bool>,
    id: String,
    event_type: String,
    tenant: Option<String>,
    dedupe_key: Option<String>,
    key: Option<Bytes>,
    /// The producer's exact bytes, sent unchanged.
    body: Bytes,
    /// Deliveries neither delivered nor handed off yet.
    pending: AtomicUsize,
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

/// The envelope facts the deduper put in the record's headers.
struct Envelope {
    id: String,
    event_type: String,
    tenant: Option<String>,
    dedupe_key: Option<String>,
}

impl Envelope {
    fn from_message<M: Message>(msg: &M) -> Result<Envelope, &'static str> {
        let mut id = None;
        let mut event_type = None;
        let mut tenant = None;
        let mut dedupe_key = None;
        if let Some(headers) = msg.headers() {
            for header in headers.iter() {
                let slot = match header.key {
                    h::EVENT_ID => &mut id,
                    h::EVENT_TYPE => &mut event_type,
                    h::TENANT => &mut tenant,
                    h::DEDUPE_KEY => &mut dedupe_key,
                    _ => continue,
                };
                let value = header.value.map(std::str::from_utf8);
                *slot = match value {
                    Some(Ok(s)) => Some(s.to_string()),
                    Some(Err(_)) => return Err("a hookline header is not UTF-8"),
                    None => None,
                };
            }
        }
        let id = id
            .filter(|s| !s.is_empty())
            .ok_or("missing hookline-event-id header")?;
        let event_type = event_type
            .filter(|s| !s.is_empty())
            .ok_or("missing hookline-event-type header")?;
        Ok(Envelope {
            id,
            event_type,
            tenant,
            dedupe_key,
        })
    }
}

impl Dispatcher {
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

    /// Takes one record: completes it at once (malformed, no endpoint) or spawns its deliveries;
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
        let envelope = match (Envelope::from_message(msg), msg.payload()) {
            (Ok(envelope), Some(_)) => envelope,
            (Err(problem), _) => {
                self.metrics.emit_malformed(partition, offset, problem);
                self.partitions
                    .complete(&self.consumer, partition, generation, offset);
                return None;
            }
            (Ok(_), None) => {
                self.metrics
                    .emit_malformed(partition, offset, "the record has no value");
                self.partitions
                    .complete(&self.consumer, partition, generation, offset);
                return None;
            }
        };
        let endpoints = self
            .path
            .endpoints()
            .current()
            .matching(envelope.tenant.as_deref(), &envelope.event_type);
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
            key: msg.key().map(Bytes::copy_from_slice),
            body: Bytes::copy_from_slice(msg.payload().unwrap_or_default()),
            pending: AtomicUsize::new(endpoints.len()),
        });
        for endpoint in endpoints {
            tasks.spawn(self.clone().deliver(event.clone(), endpoint));
        }
        None
    }

    /// One (event, endpoint) delivery: attempt 1 (or its deferral) and the hand-off of a failure
    /// or deferral, through the delivery path; the last delivery of the event to finish
    /// completes its offset.
    async fn deliver(self: Arc<Self>, event: Arc<Event>, endpoint: Arc<EndpointConfig>) {
        let delivery = Delivery {
            // The delivery path starts the schedule when attempt 1 starts (or is deferred).
            meta: DeliveryMeta::new(
                &endpoint.id,
                &event.id,
                &event.event_type,
                event.tenant.as_deref(),
                now_ms(),
            ),
            key: event.key.clone(),
            body: event.body.clone(),
            dedupe_key: event.dedupe_key.clone(),
        };
        let claim = Claim {
            ownership: &self.partitions.ownership,
            partition: event.partition,
            generation: event.generation,
        };
        let origin = Origin {
            source: Source {
                topic: &self.partitions.topic,
                partition: event.partition,
                offset: event.offset,
            },
            gate: &claim,
            cutoff: Some(event.cutoff.clone()),
        };
        let turn = self
            .path
            .attempt(&self.attempts, delivery, Turn::Scheduled, origin)
            .await;
        match turn {
            Ok(report) => self.count(&report),
            // The partition was revoked meanwhile: the new owner sends the event again.
            Err(HopError::Revoked(_)) => {
                debug!(
                    endpoint = %endpoint.id,
                    event = %event.id,
                    partition = event.partition,
                    "partition revoked before the hand-off, left to the new owner"
                );
                return;
            }
            // Shutdown while retrying a transient error: the event never completes, so no
            // offset is stored past it and the next owner delivers it again.
            Err(HopError::Abandoned(topic)) => {
                warn!(event = %event.id, endpoint = %endpoint.id, topic, "hand-off abandoned at shutdown");
                return;
            }
            Err(e @ HopError::Fatal { .. }) => {
                // The event never completes, so no offset is stored past it.
                let _ = self.fatal.send(anyhow!(
                    "the hand-off of event {} for endpoint {} (dispatch {}@{}) failed: {e}",
                    event.id,
                    endpoint.id,
                    event.partition,
                    event.offset
                ));
                return;
            }
        }
        if event.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.metrics.emit_event_done();
            self.partitions.complete(
                &self.consumer,
                event.partition,
                event.generation,
                event.offset,
            );
        }
    }

    /// Logs and counts where a delivery went after attempt 1.
    fn count(&self, report: &Report) {
        let meta = &report.meta;
        let Next::Handed { why, hop, written } = &report.next else {
            return;
        };
        let target = match (written, hop) {
            (Written::AsPlanned, Hop::Retry { .. }) => HandoffTarget::Retry,
            (Written::AsPlanned, Hop::Dead { .. }) => HandoffTarget::Dlq,
            (Written::DeadTooLarge, _) => HandoffTarget::DlqRecordTooLarge,
            (Written::Quarantined, _) => HandoffTarget::InvalidRecordTooLarge,
            (Written::Dropped, _) => HandoffTarget::Dropped,
        };
        match why {
            Why::Deferred { busy } => {
                self.metrics
                    .emit_deferred(&meta.endpoint_id, &meta.event_id, *busy)
            }
            Why::Failed => {
                let (attempt, class) = report.outcome.as_ref().map_or((1, "-"), |o| {
                    (
                        o.attempt,
                        o.result.failure_class().map_or("ok", |c| c.as_str()),
                    )
                });
                self.metrics.emit_handed_off(
                    &meta.endpoint_id,
                    &meta.event_id,
                    attempt,
                    class,
                    target,
                )
            }
            Why::Dead(reason) => self.metrics.emit_handed_off(
                &meta.endpoint_id,
                &meta.event_id,
                meta.attempt,
                reason.as_str(),
                target,
            ),
        }
    }
}

/// Progress, held records and pause state of the `<p>.dispatch` partitions this member owns.
/// Shared by the consumer loop (begins events, holds, pauses, resumes), the delivery tasks
/// (complete events and store offsets) and the rebalance callbacks (assign, revoke).
///
/// Each assignment of a partition gets a new generation ([`Ownership`]); a completion from an
/// older generation (a delivery that outlived a revoke) is ignored, so it can never store an
/// offset for the new owner's turn, and its hand-off is refused by the ownership gate.
struct Partitions {
    topic: String,
    /// How many events per partition may be unfinished / tracked before it takes no more.
    window: Window,
    /// Generations, hand-off gates and cut signals of the owned partitions.
    ownership: Ownership<()>,
    state: Mutex<State>,
    /// Notified on every completion, so a revoke can wait for its partitions to drain.
    changed: Condvar,
    /// Notified when a partition holding a record has room for it again.
    room: tokio::sync::Notify,
    /// Set once the delivery tasks are gone (closing): a revoke has nothing left to wait for.
    closing: AtomicBool,
}

#[derive(Default)]
struct State {
    progress: Progress,
    owned: HashMap<i32, Owned>,
}

struct Owned {
    generation: u64,
    paused: bool,
    /// When it last received a record (or was assigned).
    last_seen: Instant,
    /// The record that found the window full (in practice at most one: a pause drops the
    /// partition's later fetched records), taken before any later record of the partition.
    held: VecDeque<OwnedMessage>,
}

/// Whether the loop may start an event.
#[derive(Debug, PartialEq, Eq)]
enum Begin {
    Started(u64),
    Full,
    NotOwned,
}

impl Partitions {
    fn new(topic: String, window: usize) -> Self {
        Partitions {
            topic,
            window: Window::new(window),
            ownership: Ownership::default(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            room: tokio::sync::Notify::new(),
            closing: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Our partitions in a rebalance list.
    fn ids(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect()
    }

    fn assign(&self, ids: &[i32]) {
        let mut st = self.lock();
        for &p in ids {
            let generation = self.ownership.assign(p);
            st.progress.remove(p);
            st.owned.insert(
                p,
                Owned {
                    generation,
                    paused: false,
                    last_seen: Instant::now(),
                    held: VecDeque::new(),
                },
            );
        }
    }

    /// Starts tracking an event, unless its partition is not ours, or its window is full, or it
    /// holds earlier records (which must begin first: an offset never begun could otherwise be
    /// skipped by the stored prefix).
    fn begin(&self, partition: i32, offset: i64) -> Begin {
        let mut st = self.lock();
        let Some(owned) = st.owned.get_mut(&partition) else {
            return Begin::NotOwned;
        };
        owned.last_seen = Instant::now();
        let (generation, holding) = (owned.generation, !owned.held.is_empty());
        if holding || !self.window.has_room(st.progress.get(partition)) {
            return Begin::Full;
        }
        st.progress.begin(partition, offset);
        Begin::Started(generation)
    }

    /// Keeps a record that found its partition full, to be taken when there is room.
    fn hold(&self, partition: i32, record: OwnedMessage) {
        let ready = {
            let mut guard = self.lock();
            let st = &mut *guard;
            st.owned.get_mut(&partition).is_some_and(|owned| {
                owned.held.push_back(record);
                self.ready(owned, &st.progress, partition)
            })
        };
        if ready {
            // Room appeared between `begin` and now: make sure the loop looks again.
            self.room.notify_one();
        }
    }

    fn holds(&self, partition: i32) -> bool {
        self.lock()
            .owned
            .get(&partition)
            .is_some_and(|o| !o.held.is_empty())
    }

    /// Whether a partition's held record may be taken now: room in the window, or, when paused,
    /// half of the window drained.
    fn ready(&self, owned: &Owned, progress: &Progress, partition: i32) -> bool {
        let progress = progress.get(partition);
        !owned.held.is_empty()
            && if owned.paused {
                self.window.may_resume(progress)
            } else {
                self.window.has_room(progress)
            }
    }

    /// Takes the held records whose partitions have room again, in offset order, resuming the
    /// paused partitions.
    fn release_held<C: Consumer<DispatchContext>>(&self, consumer: &C) -> Vec<OwnedMessage> {
        let mut st = self.lock();
        let st = &mut *st;
        let mut out = Vec::new();
        for (&p, owned) in st.owned.iter_mut() {
            if !self.ready(owned, &st.progress, p) {
                continue;
            }
            if owned.paused {
                owned.paused = false;
                self.set_paused(consumer, p, false);
            }
            out.extend(owned.held.drain(..));
        }
        out
    }

    /// Whether another partition may have records queued behind this full one's: it is not
    /// paused, has room, and was active lately. Then pausing the full one lets them through;
    /// otherwise holding its record for a moment costs nobody anything.
    fn others_may_wait(&self, partition: i32) -> bool {
        let st = self.lock();
        st.owned.iter().any(|(&q, o)| {
            q != partition
                && !o.paused
                && o.held.is_empty()
                && self.window.has_room(st.progress.get(q))
                && o.last_seen.elapsed() < RECENTLY_ACTIVE
        })
    }

    /// Pauses a full partition: the others are read again meanwhile.
    fn pause<C: Consumer<DispatchContext>>(&self, consumer: &C, partition: i32) {
        let mut st = self.lock();
        let in_flight = st.progress.unfinished(partition);
        if let Some(owned) = st.owned.get_mut(&partition) {
            if !owned.paused {
                owned.paused = true;
                self.set_paused(consumer, partition, true);
                debug!(
                    partition,
                    unfinished = in_flight,
                    "partition window full, paused"
                );
            }
        }
    }

    /// Marks an event done and stores the new prefix end. Ignored when the partition was
    /// revoked since the event began.
    fn complete<C: Consumer<DispatchContext>>(
        &self,
        consumer: &C,
        partition: i32,
        generation: u64,
        offset: i64,
    ) {
        let mut st = self.lock();
        let mut room = false;
        if st.owned.get(&partition).map(|o| o.generation) == Some(generation) {
            if let Some(next) = st.progress.complete(partition, offset) {
                // Under the lock, so stores of one partition never go backwards.
                self.store(consumer, partition, next);
            }
            room = st
                .owned
                .get(&partition)
                .is_some_and(|o| self.ready(o, &st.progress, partition));
        }
        drop(st);
        self.changed.notify_all();
        if room {
            self.room.notify_one();
        }
    }

    /// Revokes partitions so that no hand-off of theirs can appear afterwards and every
    /// acknowledged one is covered by the stored offsets:
    /// 1. waits up to `wait` for their unfinished events (deliveries finish or hand off);
    /// 2. cuts the attempts still running short (handed off as `timeout`) and waits up to
    ///    [`REVOKE_CUT_WAIT`] for those hand-offs;
    /// 3. closes their ownership gates: from now on their deliveries write nothing;
    /// 4. waits up to [`REVOKE_ACK_WAIT`] for the hand-offs already enqueued to be acknowledged
    ///    (their events complete and their offsets are stored meanwhile);
    /// 5. forgets them (and their held records).
    ///
    /// With `wait` zero (a lost assignment, a closing stage) the gates close at once.
    fn revoke(&self, ids: &[i32], wait: Duration) -> Revoked {
        let wait = if self.closing.load(Ordering::Relaxed) {
            Duration::ZERO
        } else {
            wait
        };
        let mut cut = false;
        if !wait.is_zero() && !self.wait_unfinished(ids, wait) {
            cut = true;
            self.ownership.cut(ids);
            self.wait_unfinished(ids, REVOKE_CUT_WAIT.min(wait));
        }
        self.ownership.close(ids);
        let unacked = if wait.is_zero() {
            0
        } else {
            self.ownership.wait_acked(ids, REVOKE_ACK_WAIT)
        };
        self.ownership.remove(ids);
        let mut st = self.lock();
        let mut abandoned = 0;
        for p in ids {
            abandoned += st.progress.unfinished(*p);
            st.progress.remove(*p);
            st.owned.remove(p);
        }
        Revoked {
            abandoned,
            cut,
            unacked,
        }
    }

    /// Waits up to `wait` until these partitions have no unfinished event; returns whether so.
    fn wait_unfinished(&self, ids: &[i32], wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut st = self.lock();
        loop {
            let busy: usize = ids.iter().map(|p| st.progress.unfinished(*p)).sum();
            let now = Instant::now();
            if busy == 0 {
                return true;
            }
            if now >= deadline {
                return false;
            }
            st = match self.changed.wait_timeout(st, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    #[cfg(test)]
    fn in_flight_of(&self, ids: &[i32]) -> usize {
        let st = self.lock();
        ids.iter().map(|p| st.progress.unfinished(*p)).sum()
    }

    fn store<C: Consumer<DispatchContext>>(&self, consumer: &C, partition: i32, next: i64) {
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl.add_partition_offset(&self.topic, partition, Offset::Offset(next)) {
            warn!(partition, error = %e, "cannot build an offset list");
            return;
        }
        if let Err(e) = consumer.store_offsets(&tpl) {
            // ERR__STATE: the partition is being revoked; its new owner reads from the commit.
            debug!(partition, offset = next, error = %e, "offset not stored");
        }
    }

    fn set_paused<C: Consumer<DispatchContext>>(&self, consumer: &C, partition: i32, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        let result = if pause {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        if let Err(e) = result {
            warn!(partition, pause, error = %e, "cannot pause/resume a partition");
        }
    }
}

/// What a revoke left behind.
#[derive(Debug, PartialEq, Eq)]
struct Revoked {
    /// Events not finished (their offsets are not stored: the new owner sends them again).
    abandoned: usize,
    /// Whether attempts had to be cut short.
    cut: bool,
    /// Hand-offs enqueued but not acknowledged when the wait ended.
    unacked: usize,
}

/// librdkafka callbacks of the dispatcher's consumer. They run inside the consumer loop's
/// `recv` (on its thread), so they stay short; a revoke blocks for at most `revoke_wait`, and
/// only after moving off the async runtime's worker slot (`block_in_place`).
struct DispatchContext {
    partitions: Arc<Partitions>,
    revoke_wait: Duration,
    /// Ready once the group gave this member its assignment (an empty one too: a standby);
    /// unready when the assignment is lost.
    probe: StageProbe,
}

impl ClientContext for DispatchContext {}

impl ConsumerContext for DispatchContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.partitions.assign(&self.partitions.ids(tpl)),
            Rebalance::Revoke(tpl) => self.on_revoke(consumer, tpl),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.probe.set_ready(true);
            let ids = self.partitions.ids(tpl);
            if ids.is_empty() {
                return;
            }
            // Pause state survives an unassign/assign in librdkafka: a partition paused under a
            // previous assignment would otherwise stay silent forever.
            if let Err(e) = consumer.resume(tpl) {
                warn!(error = %e, "cannot resume newly assigned partitions");
            }
            info!(partitions = ?ids, "partitions assigned");
        }
    }
}

impl DispatchContext {
    /// Stops taking work for the revoked partitions (the loop is inside this callback, and
    /// librdkafka drops their remaining fetched records), waits a bounded time for their
    /// deliveries, commits what is stored, and forgets them.
    fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let ids = self.partitions.ids(tpl);
        if ids.is_empty() {
            return;
        }
        // A lost assignment (session timeout, eviction) is already someone else's: close the
        // gates at once, wait for nothing, commit nothing.
        let lost = consumer.assignment_lost();
        if lost {
            self.probe.set_ready(false);
        }
        let wait = if lost || !can_block_here() {
            Duration::ZERO
        } else {
            self.revoke_wait
        };
        let revoked = if wait.is_zero() {
            self.partitions.revoke(&ids, Duration::ZERO)
        } else {
            tokio::task::block_in_place(|| self.partitions.revoke(&ids, wait))
        };
        if revoked.abandoned > 0 || revoked.unacked > 0 {
            warn!(
                partitions = ?ids,
                lost,
                abandoned = revoked.abandoned,
                unacknowledged = revoked.unacked,
                "partitions revoked with deliveries unfinished; their events will be sent again \
                 by the new owner"
            );
        } else {
            info!(partitions = ?ids, cut_short = revoked.cut, "partitions revoked");
        }
        if lost {
            return;
        }
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) => {}
            Err(e) if is_no_offset(&e) => {}
            Err(e) => warn!(error = %e, "commit on revoke failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::config::ClientConfig;
    use rdkafka::Timestamp;

    /// A consumer that never talks to a broker (no group): pause/resume/store calls fail and are
    /// logged, which is enough to exercise the bookkeeping.
    fn consumer(partitions: Arc<Partitions>) -> BaseConsumer<DispatchContext> {
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create_with_context(DispatchContext {
                partitions,
                revoke_wait: Duration::ZERO,
                probe: StageProbe::detached("test"),
            })
            .expect("consumer")
    }

    fn record(partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"{}".to_vec()),
            None,
            "t".into(),
            Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    fn paused(p: &Partitions, partition: i32) -> bool {
        p.lock().owned.get(&partition).is_some_and(|o| o.paused)
    }

    fn started(b: Begin) -> u64 {
        match b {
            Begin::Started(generation) => generation,
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[test]
    fn records_of_unowned_partitions_are_not_taken() {
        let p = Partitions::new("t".into(), 4);
        assert_eq!(p.begin(0, 10), Begin::NotOwned);
        p.assign(&[0]);
        started(p.begin(0, 10));
        assert_eq!(p.in_flight_of(&[0]), 1);
    }

    #[test]
    fn full_window_holds_the_record_until_there_is_room() {
        let p = Arc::new(Partitions::new("t".into(), 2));
        let c = consumer(p.clone());
        p.assign(&[0, 1]);
        let generation = started(p.begin(0, 0));
        started(p.begin(0, 1));
        assert_eq!(p.begin(0, 2), Begin::Full);
        started(p.begin(1, 0));
        p.hold(0, record(0, 2));
        assert!(p.holds(0));
        assert_eq!(
            p.begin(0, 3),
            Begin::Full,
            "nothing overtakes a held record"
        );
        assert!(p.release_held(&c).is_empty(), "still full");
        // The head completes: room for the held record, not paused, so no resume needed.
        p.complete(&c, 0, generation, 0);
        let released = p.release_held(&c);
        assert_eq!(released.iter().map(|m| m.offset()).collect::<Vec<_>>(), [2]);
        assert!(!p.holds(0));
        started(p.begin(0, 2));
    }

    #[test]
    fn paused_partition_resumes_at_half_its_window() {
        let p = Arc::new(Partitions::new("t".into(), 4));
        let c = consumer(p.clone());
        p.assign(&[0]);
        let generations: Vec<u64> = (0..4).map(|o| started(p.begin(0, o))).collect();
        let generation = generations[3];
        assert_eq!(p.begin(0, 4), Begin::Full);
        p.hold(0, record(0, 4));
        p.pause(&c, 0);
        assert!(paused(&p, 0));
        // Out of order: 3 done while the head (0) still runs: 3 unfinished.
        p.complete(&c, 0, generation, 3);
        assert_eq!(p.in_flight_of(&[0]), 3, "0, 1 and 2 unfinished");
        assert!(
            p.release_held(&c).is_empty(),
            "3 > half the window: stays paused"
        );
        assert!(paused(&p, 0));
        // 1 done behind the still running head: only unfinished events count.
        p.complete(&c, 0, generation, 1);
        assert_eq!(p.in_flight_of(&[0]), 2);
        assert_eq!(p.release_held(&c).len(), 1, "resumed at half the window");
        assert!(!paused(&p, 0));
        assert_eq!(p.lock().progress.in_flight(0), 4, "0..=3 still tracked");
        p.complete(&c, 0, generation, 0);
        p.complete(&c, 0, generation, 2);
        assert_eq!(
            p.lock().progress.in_flight(0),
            0,
            "the head released the rest"
        );
    }

    #[test]
    fn a_stuck_event_takes_one_place_in_the_window() {
        let p = Arc::new(Partitions::new("t".into(), 2));
        let c = consumer(p.clone());
        p.assign(&[0]);
        let generation = started(p.begin(0, 0));
        for o in 1..50 {
            started(p.begin(0, o));
            p.complete(&c, 0, generation, o);
        }
        assert_eq!(p.in_flight_of(&[0]), 1);
        started(p.begin(0, 50));
        assert_eq!(p.begin(0, 51), Begin::Full, "two unfinished");
    }

    #[test]
    fn only_an_active_partition_with_room_counts_as_waiting() {
        let p = Arc::new(Partitions::new("t".into(), 1));
        let c = consumer(p.clone());
        p.assign(&[0]);
        assert!(!p.others_may_wait(0), "alone: nobody to let through");
        p.assign(&[1]);
        assert!(p.others_may_wait(0), "1 was just assigned and has room");
        started(p.begin(1, 0));
        assert!(!p.others_may_wait(0), "1 is full");
        assert_eq!(p.begin(1, 1), Begin::Full);
        p.hold(1, record(1, 1));
        p.pause(&c, 1);
        p.lock().progress.remove(1);
        assert!(!p.others_may_wait(0), "1 is paused");
        p.assign(&[2]);
        let long_ago = Instant::now().checked_sub(RECENTLY_ACTIVE).expect("uptime");
        p.lock().owned.get_mut(&2).expect("owned").last_seen = long_ago;
        assert!(!p.others_may_wait(0), "2 has been idle");
    }

    #[test]
    fn completions_from_before_a_revoke_are_ignored() {
        let p = Arc::new(Partitions::new("t".into(), 8));
        let c = consumer(p.clone());
        p.assign(&[0]);
        let old = started(p.begin(0, 5));
        p.hold(0, record(0, 6));
        assert_eq!(
            p.revoke(&[0], Duration::ZERO).abandoned,
            1,
            "one event abandoned"
        );
        p.assign(&[0]);
        assert!(!p.holds(0), "held records go with the revoke");
        let new = started(p.begin(0, 5));
        assert_ne!(old, new);
        p.complete(&c, 0, old, 5);
        assert_eq!(
            p.in_flight_of(&[0]),
            1,
            "the stale completion changed nothing"
        );
        p.complete(&c, 0, new, 5);
        assert_eq!(p.in_flight_of(&[0]), 0);
    }

    #[test]
    fn a_revoked_partition_hands_off_nothing_and_waits_for_enqueued_hand_offs() {
        let p = Arc::new(Partitions::new("t".into(), 8));
        p.assign(&[0]);
        let generation = started(p.begin(0, 1));
        let cutoff = p.ownership.cutoff(0, generation).expect("owned");
        // A hand-off enqueued before the revoke, acknowledged 100 ms into it.
        assert_eq!(p.ownership.enqueue(0, generation, || ()), Some(()));
        let acker = {
            let p = p.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                p.ownership.acked(0, generation);
            })
        };
        let revoked = p.revoke(&[0], Duration::from_millis(50));
        acker.join().expect("acker");
        assert_eq!(revoked.unacked, 0, "the enqueued hand-off was waited for");
        assert!(
            revoked.cut && *cutoff.borrow(),
            "the running attempt was cut short"
        );
        assert_eq!(
            p.ownership.enqueue(0, generation, || ()),
            None,
            "no hand-off after"
        );
        p.assign(&[0]);
        assert_eq!(
            p.ownership.enqueue(0, generation, || ()),
            None,
            "nor under a new owner"
        );
    }

    #[test]
    fn revoke_waits_for_in_flight_events_up_to_its_bound() {
        let p = Arc::new(Partitions::new("t".into(), 8));
        let c = Arc::new(consumer(p.clone()));
        p.assign(&[0]);
        let generation = started(p.begin(0, 1));
        let finisher = {
            let (p, c) = (p.clone(), c.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                p.complete(&*c, 0, generation, 1);
            })
        };
        let start = Instant::now();
        assert_eq!(
            p.revoke(&[0], Duration::from_secs(10)),
            Revoked {
                abandoned: 0,
                cut: false,
                unacked: 0
            },
            "drained"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        finisher.join().expect("finisher");

        p.assign(&[0]);
        started(p.begin(0, 2));
        let start = Instant::now();
        let revoked = p.revoke(&[0], Duration::from_millis(200));
        assert_eq!(
            (revoked.abandoned, revoked.cut),
            (1, true),
            "cut short, then gave up"
        );
        assert!(
            start.elapsed() >= Duration::from_millis(400),
            "waited, then waited after the cut"
        );
    }

    #[test]
    fn out_of_order_completion_waits_for_the_head() {
        let p = Arc::new(Partitions::new("t".into(), 8));
        let c = consumer(p.clone());
        p.assign(&[0]);
        let generation = started(p.begin(0, 1));
        started(p.begin(0, 2));
        p.complete(&c, 0, generation, 2);
        assert_eq!(p.in_flight_of(&[0]), 1, "1 unfinished");
        assert_eq!(p.lock().progress.in_flight(0), 2, "2 waits behind 1");
        p.complete(&c, 0, generation, 1);
        assert_eq!(p.lock().progress.in_flight(0), 0);
    }
}

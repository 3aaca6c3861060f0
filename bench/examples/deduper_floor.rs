//! The Kafka client work the deduper's contract needs, without any of hookline's own code: how
//! low can the deduper's CPU per record go with librdkafka at a given rate? Runs, against the
//! local broker, a bare relay whose clients are built by the stages' own functions
//! (`pipeline_consumer_config`, `producer_config`: fetch and linger tuning, idempotence, lz4,
//! `read_committed`) with stage B's transaction settings and its interval (`dedupe.batch_interval`, 25 ms):
//!
//! - `split`: the deduper's four clients. Hop 1: a consumer of `events` and an idempotent producer
//!   to `dedupe` (partition by key hash), offsets stored when acknowledged. Hop 2: a
//!   `read_committed` consumer of `dedupe` and a transactional producer writing each record to
//!   `out` and a 20-byte changelog record to `state`, committing outputs and input offsets
//!   together every 25 ms (`FLOOR_TXN_MS` to change it).
//! - `split-async`: the same, with hop 1 run the way stage A runs it (tokio, `StreamConsumer`,
//!   `FutureProducer`, delivery futures in a `FuturesOrdered`): what that machinery costs.
//! - `merged`: two clients. One consumer (one group) over `events` and `dedupe`, one
//!   transactional producer writing both hops' outputs and both hops' offsets every 25 ms (hop 1's
//!   output then becomes visible at commit, not at acknowledgement).
//! - `direct`: issue 24 part 3's hop removal. The loader puts each record on the partition its
//!   key hashes to (as a producer keying by the dedupe key would), and `merged`'s two clients
//!   write a record read from `events` straight to `out` (and its changelog record) when it is
//!   already on its key's partition; only a record on the wrong partition is forwarded through
//!   `dedupe`. With every record well keyed, one produce and one consume fewer per record.
//!
//! No validation, no seen-set, no headers unless `headers` is given (then stage A's four event
//! headers travel through both hops): only the Kafka work. A child process (this binary,
//! mode `load`) produces 1 KiB records at an open-model rate and reads `out` (`read_committed`),
//! printing latency from scheduled send to receipt. The numbers are the relay process's CPU per
//! relayed record over the run, and the whole machine's (`/proc/stat`: the relay, the loader and
//! the broker), which is where a hop's broker work shows. Run:
//!
//! ```sh
//! cargo run --release -p hookline-bench --example deduper_floor -- split|split-async|merged|direct [rate] [secs] [headers]
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use futures::stream::{FuturesOrdered, StreamExt as _};
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, FutureProducer, FutureRecord, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use hookline_common::config::Config;
use hookline_common::contract::keyhash::{key_hash, partition_for};
use hookline_common::kafka::produce::flush_acked;
use hookline_common::kafka::{base_config, pipeline_consumer_config, producer_config};

const PARTITIONS: i32 = 6;

/// A relay thread's body; it sets the flag once its consumer has its assignment.
type Relay = Box<dyn FnOnce(&AtomicBool) -> anyhow::Result<()> + Send>;

/// Stage B's transaction interval: `FLOOR_TXN_MS`, else the stage's own default
/// (`dedupe.batch_interval` of the probe's config).
fn txn_interval(config: &Config) -> Duration {
    std::env::var("FLOOR_TXN_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(config.dedupe.batch_interval, Duration::from_millis)
}
const CALL: Duration = Duration::from_secs(30);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn bootstrap() -> String {
    std::env::var("HOOKLINE_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

struct Names {
    events: String,
    dedupe: String,
    out: String,
    state: String,
}

impl Names {
    fn new(prefix: &str) -> Self {
        Names {
            events: format!("{prefix}.events"),
            dedupe: format!("{prefix}.dedupe"),
            out: format!("{prefix}.out"),
            state: format!("{prefix}.state"),
        }
    }
}

/// The stages' configuration for this run's prefix: every client below is built by the
/// stages' own functions, so it has their settings.
fn config(prefix: &str) -> anyhow::Result<Config> {
    let text = format!(
        "[kafka]\nbootstrap_servers = {:?}\n\n[topics]\nprefix = {prefix:?}\n",
        bootstrap()
    );
    Ok(Config::from_toml_with_env(
        &text,
        "deduper_floor config",
        Vec::new(),
    )?)
}

/// A hot-path consumer as the stages make it (group `<prefix>.<stage>`); offsets auto-committed
/// once stored (hop 1) or committed by the transaction (`auto_commit` false).
fn consumer(config: &Config, stage: &str, auto_commit: bool) -> anyhow::Result<BaseConsumer> {
    let mut c = pipeline_consumer_config(config, stage);
    if !auto_commit {
        c.set("enable.auto.commit", "false");
    }
    Ok(c.create()?)
}

/// The stages' idempotent producer; transactional as stage B's when `transactional_id` is given.
fn producer(config: &Config, transactional_id: Option<&str>) -> ClientConfig {
    let mut c = producer_config(config);
    if let Some(id) = transactional_id {
        c.set("transactional.id", id)
            .set("transaction.timeout.ms", "10000")
            .set("delivery.report.only.error", "true");
    }
    c
}

/// With `headers` on the command line, hop 1 attaches the four headers stage A gives every
/// event (id, type, tenant, dedupe key; the bench's sizes) and hop 2 copies them on, as stage B
/// does: what carrying them costs.
static HEADERS: AtomicBool = AtomicBool::new(false);

/// `direct`: a record read from `events` on its key's partition skips `dedupe`.
static DIRECT: AtomicBool = AtomicBool::new(false);

/// Stage A's event headers for a record with `key` (the event id), if `headers` was asked for.
fn event_headers(key: &[u8]) -> Option<OwnedHeaders> {
    if !HEADERS.load(Ordering::Relaxed) {
        return None;
    }
    let id = String::from_utf8_lossy(key);
    let dedupe_key = format!("id|4:main|{}:{id}", id.len());
    let pairs: [(&str, &[u8]); 4] = [
        ("hookline-event-id", key),
        ("hookline-event-type", b"bench.ok"),
        ("hookline-dedupe-key", dedupe_key.as_bytes()),
        ("hookline-tenant", b"main"),
    ];
    Some(pairs.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k,
            value: Some(*v),
        })
    }))
}

/// The input record's headers, copied onto its output (stage B's forwarding).
fn copied_headers<M: Message>(m: &M) -> Option<OwnedHeaders> {
    let src = m.headers()?;
    Some(src.iter().fold(OwnedHeaders::new(), |h, hd| {
        h.insert(Header {
            key: hd.key,
            value: hd.value,
        })
    }))
}

/// Sends, waiting while librdkafka's queue is full.
fn send<C: ProducerContext>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8], C::DeliveryOpaque>,
) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

fn wait_assigned(consumer: &BaseConsumer, partitions: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while consumer.assignment()?.count() < partitions {
        anyhow::ensure!(Instant::now() < deadline, "no assignment after 60 s");
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
            return Err(e.into());
        }
    }
    Ok(())
}

/// Hop 1 of `split`: offsets stored when the output is acknowledged.
struct StoreOnAck {
    consumer: Arc<BaseConsumer>,
    events: String,
}

impl ClientContext for StoreOnAck {}

impl ProducerContext for StoreOnAck {
    type DeliveryOpaque = Box<(i32, i64)>;
    fn delivery(&self, result: &DeliveryResult<'_>, input: Self::DeliveryOpaque) {
        if result.is_ok() {
            let _ = self
                .consumer
                .store_offset(&self.events, input.0, input.1 + 1);
        }
    }
}

fn hop1(
    config: &Config,
    names: &Names,
    stop: &AtomicBool,
    ready: &AtomicBool,
) -> anyhow::Result<()> {
    let consumer = Arc::new(consumer(config, "a", true)?);
    consumer.subscribe(&[&names.events])?;
    let producer: ThreadedProducer<StoreOnAck> =
        producer(config, None).create_with_context(StoreOnAck {
            consumer: consumer.clone(),
            events: names.events.clone(),
        })?;
    wait_assigned(&consumer, PARTITIONS as usize)?;
    ready.store(true, Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key = m.key().unwrap_or_default();
                let p = partition_for(key_hash(std::str::from_utf8(key)?), PARTITIONS);
                let mut r = BaseRecord::with_opaque_to(
                    &names.dedupe,
                    Box::new((m.partition(), m.offset())),
                )
                .key(key)
                .payload(m.payload().unwrap_or_default())
                .partition(p);
                if let Some(ts) = m.timestamp().to_millis() {
                    r = r.timestamp(ts);
                }
                if let Some(h) = event_headers(key) {
                    r = r.headers(h);
                }
                send(&producer, r)?;
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    producer.flush(CALL)?;
    Ok(())
}

/// Hop 1 the way stage A runs it (`deduper/src/validate.rs`), without validation or headers: on
/// tokio (two workers), a `StreamConsumer` and a `FutureProducer`, each record copied into its
/// own buffers and its delivery future kept in a `FuturesOrdered`, offsets stored in input order
/// as the acknowledgements complete, in a `select!` loop with a tick.
fn hop1_async(
    config: &Config,
    names: &Names,
    stop: &AtomicBool,
    ready: &AtomicBool,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut cc = pipeline_consumer_config(config, "a");
        cc.set("enable.auto.commit", "true");
        let consumer: StreamConsumer = cc.create()?;
        consumer.subscribe(&[&names.events])?;
        let producer: FutureProducer = producer(config, None).create()?;
        // The group join is served while the consumer is polled.
        while consumer.assignment()?.count() < PARTITIONS as usize {
            if let Ok(Err(e)) =
                tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await
            {
                return Err(e.into());
            }
        }
        ready.store(true, Ordering::Relaxed);
        let mut pending = FuturesOrdered::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while !stop.load(Ordering::Relaxed) {
            tokio::select! {
                biased;
                _ = tick.tick() => {}
                Some((p, o, acked)) = pending.next(), if !pending.is_empty() => {
                    let acked: Result<(), String> = acked;
                    acked.map_err(|e| anyhow::anyhow!("produce failed: {e}"))?;
                    consumer.store_offset(&names.events, p, o + 1)?;
                }
                msg = consumer.recv(), if pending.len() < 10_000 => {
                    let m = msg?;
                    let key = m.key().unwrap_or_default().to_vec();
                    let payload = m.payload().unwrap_or_default().to_vec();
                    let out = partition_for(key_hash(std::str::from_utf8(&key)?), PARTITIONS);
                    let mut r = FutureRecord::to(&names.dedupe)
                        .key(&key)
                        .payload(&payload)
                        .partition(out);
                    if let Some(ts) = m.timestamp().to_millis() {
                        r = r.timestamp(ts);
                    }
                    if let Some(h) = event_headers(&key) {
                        r = r.headers(h);
                    }
                    let delivery = producer.send_result(r).map_err(|(e, _)| e)?;
                    let (p, o) = (m.partition(), m.offset());
                    pending.push_back(async move {
                        let acked: Result<(), String> = match delivery.await {
                            Ok(Ok(_)) => Ok(()),
                            Ok(Err((e, _))) => Err(e.to_string()),
                            Err(_) => Err("delivery future cancelled".into()),
                        };
                        (p, o, acked)
                    });
                }
            }
        }
        producer.flush(CALL)?;
        Ok(())
    })
}

/// The transactional relay: hop 2 (and, in `merged`, hop 1 too) with outputs and input offsets
/// committed together every [`txn_interval`].
fn txn_relay(
    config: &Config,
    names: &Names,
    stage: &str,
    topics: &[&str],
    stop: &AtomicBool,
    ready: &AtomicBool,
    relayed: &AtomicU64,
) -> anyhow::Result<()> {
    let consumer = consumer(config, stage, false)?;
    consumer.subscribe(topics)?;
    let producer: ThreadedProducer<DefaultProducerContext> =
        producer(config, Some(&config.group_id(&format!("{stage}.tx")))).create()?;
    producer.init_transactions(CALL)?;
    wait_assigned(&consumer, PARTITIONS as usize * topics.len())?;
    ready.store(true, Ordering::Relaxed);
    let mut offsets: HashMap<(String, i32), i64> = HashMap::new();
    let mut started: Option<Instant> = None;
    let interval = txn_interval(config);
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if let Some(at) = started {
            if stopping || at.elapsed() >= interval {
                let mut tpl = TopicPartitionList::new();
                for ((t, p), o) in offsets.drain() {
                    tpl.add_partition_offset(&t, p, Offset::Offset(o + 1))?;
                }
                let cgm = consumer.group_metadata().context("no group metadata")?;
                producer.send_offsets_to_transaction(&tpl, &cgm, CALL)?;
                flush_acked(producer.client(), CALL)?;
                producer.commit_transaction(CALL)?;
                started = None;
            }
        }
        if stopping {
            return Ok(());
        }
        let wait = started.map_or(Duration::from_millis(100), |at| {
            interval.saturating_sub(at.elapsed())
        });
        match consumer.poll(wait) {
            Some(Ok(m)) => {
                if started.is_none() {
                    producer.begin_transaction()?;
                    started = Some(Instant::now());
                }
                let key = m.key().unwrap_or_default();
                let payload = m.payload().unwrap_or_default();
                let hash = key_hash(std::str::from_utf8(key)?);
                let ts = m.timestamp().to_millis();
                let p = partition_for(hash, PARTITIONS);
                let skip = DIRECT.load(Ordering::Relaxed) && p == m.partition();
                if m.topic() == names.events && !skip {
                    let mut r = BaseRecord::to(&names.dedupe)
                        .key(key)
                        .payload(payload)
                        .partition(p);
                    if let Some(ts) = ts {
                        r = r.timestamp(ts);
                    }
                    if let Some(h) = event_headers(key) {
                        r = r.headers(h);
                    }
                    send(&producer, r)?;
                } else {
                    // On its key's partition (read from `dedupe`, or from `events` in `direct`).
                    let mut r = BaseRecord::to(&names.out)
                        .key(key)
                        .payload(payload)
                        .partition(m.partition());
                    if let Some(ts) = ts {
                        r = r.timestamp(ts);
                    }
                    if let Some(h) = copied_headers(&m) {
                        r = r.headers(h);
                    }
                    send(&producer, r)?;
                    let hash_bytes = hash.to_be_bytes();
                    let seen = (now_us() / 1_000_000) as u32;
                    send(
                        &producer,
                        BaseRecord::to(&names.state)
                            .key(&hash_bytes[..])
                            .payload(&seen.to_be_bytes()[..])
                            .partition(m.partition()),
                    )?;
                    relayed.fetch_add(1, Ordering::Relaxed);
                }
                offsets.insert((m.topic().to_string(), m.partition()), m.offset());
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
}

/// The child: produces `rate` records/s for `secs` seconds to `events`, reads `out`, prints the
/// latency from scheduled send to receipt.
fn load(prefix: &str, rate: f64, secs: u64, keyed: bool) -> anyhow::Result<()> {
    let names = Names::new(prefix);
    let config = Arc::new(config(prefix)?);
    let n = (rate * secs as f64) as u64;
    let reading = Arc::new(AtomicBool::new(false));
    let reader = {
        let out = names.out.clone();
        let (config, reading) = (config.clone(), reading.clone());
        std::thread::spawn(move || -> anyhow::Result<(u64, Histogram<u64>)> {
            let c = consumer(&config, "reader", false)?;
            c.subscribe(&[&out])?;
            // Produce only once the reader has its partitions: its group join is not latency.
            wait_assigned(&c, PARTITIONS as usize)?;
            reading.store(true, Ordering::Relaxed);
            let mut h = Histogram::<u64>::new(3)?;
            let mut got = 0;
            let deadline = Instant::now() + Duration::from_secs(secs + 60);
            while got < n && Instant::now() < deadline {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                    let at = now_us();
                    let text = std::str::from_utf8(&m.payload().unwrap_or_default()[..20])?;
                    let sent: u64 = text.trim().parse()?;
                    h.record(at.saturating_sub(sent))?;
                    got += 1;
                }
            }
            Ok((got, h))
        })
    };
    let producer: ThreadedProducer<DefaultProducerContext> = producer(&config, None).create()?;
    while !reading.load(Ordering::Relaxed) {
        anyhow::ensure!(
            !reader.is_finished(),
            "the reader stopped before its assignment"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pad = "x".repeat(1024 - 21);
    let start = Instant::now();
    let t0 = now_us();
    for i in 0..n {
        let due = Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let scheduled = t0 + due.as_micros() as u64;
        let payload = format!("{scheduled:>20},{pad}");
        let key = format!("e-{i}");
        let mut r = BaseRecord::to(&names.events)
            .key(key.as_bytes())
            .payload(payload.as_bytes());
        if keyed {
            r = r.partition(partition_for(key_hash(&key), PARTITIONS));
        }
        send(&producer, r)?;
    }
    producer.flush(CALL)?;
    let (got, h) = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "load: sent {n}, received {got}; scheduled send -> receipt p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms(0.5),
        ms(0.99),
        h.max() as f64 / 1000.0
    );
    anyhow::ensure!(got == n, "received {got} of {n}");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("split", String::as_str);
    if mode == "load" {
        return load(
            &args[1],
            args[2].parse()?,
            args[3].parse()?,
            args[4] == "keyed",
        );
    }
    anyhow::ensure!(
        ["split", "split-async", "merged", "direct"].contains(&mode),
        "mode must be split, split-async, merged or direct, not {mode}"
    );
    DIRECT.store(mode == "direct", Ordering::Relaxed);
    let rate: f64 = args.get(1).map_or(Ok(8000.0), |s| s.parse())?;
    let secs: u64 = args.get(2).map_or(Ok(15), |s| s.parse())?;
    let with_headers = args.get(3).is_some_and(|a| a == "headers");
    HEADERS.store(with_headers, Ordering::Relaxed);
    let prefix = format!("floor-{}", now_us());
    let names = Arc::new(Names::new(&prefix));
    let config = Arc::new(config(&prefix)?);

    let admin: AdminClient<DefaultClientContext> = base_config(&config).create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let new: Vec<NewTopic> = [&names.events, &names.dedupe, &names.out, &names.state]
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    for r in rt.block_on(admin.create_topics(&new, &AdminOptions::new()))? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    std::thread::sleep(Duration::from_secs(2));

    let stop = Arc::new(AtomicBool::new(false));
    let relayed = Arc::new(AtomicU64::new(0));
    let mut ready = Vec::new();
    let mut threads = Vec::new();
    let mut spawn = |f: Relay| {
        let r = Arc::new(AtomicBool::new(false));
        ready.push(r.clone());
        threads.push(std::thread::spawn(move || f(&r)));
    };
    if mode.starts_with("split") {
        let (cf, n, s) = (config.clone(), names.clone(), stop.clone());
        if mode == "split" {
            spawn(Box::new(move |r| hop1(&cf, &n, &s, r)));
        } else {
            spawn(Box::new(move |r| hop1_async(&cf, &n, &s, r)));
        }
        let (cf, n, s, c) = (config.clone(), names.clone(), stop.clone(), relayed.clone());
        spawn(Box::new(move |r| {
            txn_relay(&cf, &n, "b", &[n.dedupe.as_str()], &s, r, &c)
        }));
    } else {
        let (cf, n, s, c) = (config.clone(), names.clone(), stop.clone(), relayed.clone());
        spawn(Box::new(move |r| {
            let topics = [n.events.as_str(), n.dedupe.as_str()];
            txn_relay(&cf, &n, "m", &topics, &s, r, &c)
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.iter().all(|r| r.load(Ordering::Relaxed)) {
        anyhow::ensure!(
            Instant::now() < deadline && threads.iter().all(|t| !t.is_finished()),
            "relay not ready after 60 s (or a relay thread failed)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let cpu0 = hookline_bench::stages::cpu_seconds(std::process::id())?;
    let busy0 = hookline_bench::stages::machine_busy_seconds()?;
    let keyed = if mode == "direct" { "keyed" } else { "any" };
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["load", &prefix, &rate.to_string(), &secs.to_string(), keyed])
        .status()?;
    let cpu = hookline_bench::stages::cpu_seconds(std::process::id())? - cpu0;
    let busy = hookline_bench::stages::machine_busy_seconds()? - busy0;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("relay thread panicked"))??;
    }
    let n = relayed.load(Ordering::Relaxed);
    println!(
        "{mode}{} at {rate} records/s for {secs} s: relayed {n}, relay CPU {cpu:.2} s = {:.1} µs per record; machine {busy:.2} s = {:.1} µs per record",
        if with_headers { " with headers" } else { "" },
        cpu * 1e6 / n.max(1) as f64,
        busy * 1e6 / n.max(1) as f64
    );
    anyhow::ensure!(status.success(), "load failed: {status}");
    for t in [&names.events, &names.dedupe, &names.out, &names.state] {
        let _ = rt.block_on(admin.delete_topics(&[t.as_str()], &AdminOptions::new()));
    }
    Ok(())
}

//! The two references of issue 24: what bare Kafka clients doing no work at all achieve on
//! hookline's path, measured in the same run on the same box, before the stages start. Each gets
//! the run's records (the `max` run's plan: same count, sizes, keys, duplicates and invalid
//! records) produced as fast as possible to a fresh topic of the run's partition count, and is
//! timed from the first send to the sink's answer to the last POST.
//!
//! - **Bare relay**: one consumer (its own group; librdkafka's defaults: auto-commit every 5 s of
//!   offsets stored as each record is handed over, read_uncommitted, default fetch sizes) on a
//!   tokio task; each record's value is POSTed as is to the sink (`/relay/0`, answers 204) by the
//!   HTTP ceiling's client (hyper-util, pooled, TCP_NODELAY), at most
//!   [`crate::options::ENDPOINT_CONCURRENCY`] requests in flight (the dispatcher's cap per
//!   endpoint). No parsing, no signing, no retry, no offset discipline.
//! - **Same-shape relay**: hookline's hops without its logic — `events → dedupe → dispatch → POST`.
//!   Two bare consume→produce hops, each one consumer and one producer (librdkafka's defaults:
//!   `acks=all`, `linger.ms` 5, no idempotence, no transaction) on a plain thread, forwarding each
//!   record's key and value to the next topic (the default partitioner keeps a key's records on
//!   one partition, as stage A's re-keying does), then the bare relay reading the second.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::ThreadedProducer;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, FutureProducer, Producer as _};
use rdkafka::{ClientConfig, Message};
use serde::Serialize;

use hookline_common::config::Config;
use hookline_common::kafka::{base_config, producer_config};

use crate::load::{self, Planned};
use crate::options::ENDPOINT_CONCURRENCY;
use crate::sink::Sink;
use crate::stages::{cpu_seconds, machine_busy_seconds};

/// One reference's result.
#[derive(Debug, Clone, Serialize)]
pub struct Relay {
    /// Records produced, and POSTs the sink answered.
    pub records: usize,
    pub posts: usize,
    /// First send → the sink's last answer.
    pub elapsed_s: f64,
    /// POSTs/s over `elapsed_s`.
    pub per_s: f64,
    /// Consume→produce hops before the POSTing consumer (0: the bare relay).
    pub hops: usize,
    /// CPU of the bench process (producer, relay clients, sink) per record.
    pub bench_cpu_us_per_record: f64,
    /// The whole machine's busy CPU (bench, broker, anyone else) per record over `elapsed_s`.
    pub machine_cpu_us_per_record: f64,
}

/// How long a reference may take before the bench gives up on it.
const WITHIN: Duration = Duration::from_secs(300);

/// Measures a relay with `hops` consume→produce hops in front of the POSTing consumer.
pub async fn measure(
    config: &Config,
    sink: &Sink,
    name: &str,
    hops: usize,
    plan: &[Planned],
    payload_bytes: usize,
) -> anyhow::Result<Relay> {
    let prefix = &config.topics.prefix;
    let topics: Vec<String> = (0..=hops).map(|i| format!("{prefix}.{name}-{i}")).collect();
    crate::ceilings::create_topics(config, &topics).await?;
    let n = plan.len();
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu_seconds(std::process::id())?;
    let base = sink.relayed_total();

    // The hops, each on its own thread: topics[i] → topics[i + 1].
    let mut threads = Vec::new();
    let mut joining: Vec<Arc<BaseConsumer>> = Vec::new();
    for i in 0..hops {
        let consumer: Arc<BaseConsumer> = Arc::new(
            bare_consumer(config, &format!("{prefix}-{name}-hop{i}"))
                .create()
                .context("a relay hop's consumer")?,
        );
        consumer.subscribe(&[topics[i].as_str()])?;
        let producer: ThreadedProducer<DefaultProducerContext> = base_config(config)
            .create()
            .context("a relay hop's producer")?;
        let (to, stop, c) = (topics[i + 1].clone(), stop.clone(), consumer.clone());
        threads.push(std::thread::spawn(move || {
            forward(&c, &producer, &to, n, &stop)
        }));
        joining.push(consumer);
    }

    // The POSTing consumer on the last topic.
    let consumer: Arc<StreamConsumer> = Arc::new(
        bare_consumer(config, &format!("{prefix}-{name}-post"))
            .create()
            .context("the relay's consumer")?,
    );
    consumer.subscribe(&[topics[hops].as_str()])?;
    let poster = tokio::spawn(post_each(
        consumer.clone(),
        sink.url("relay/0"),
        n,
        stop.clone(),
    ));
    // Every consumer has joined its group before the clock starts (hookline's stages are
    // running already when a run starts, too).
    let joined_by = Instant::now() + Duration::from_secs(60);
    loop {
        let full = |n: usize| n >= config.topics.partitions as usize;
        let all = joining.iter().all(|c| full(assigned(&**c))) && full(assigned(&*consumer));
        if all {
            break;
        }
        anyhow::ensure!(
            Instant::now() < joined_by,
            "{name}: the relay's consumers did not join their groups within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let producer: FutureProducer = producer_config(config).create()?;
    let machine0 = machine_busy_seconds()?;
    let start = Instant::now();
    load::produce(
        &producer,
        &topics[0],
        plan,
        &["main".to_string()],
        None,
        payload_bytes,
        None,
    )
    .await?;
    let deadline = start + WITHIN;
    let result = loop {
        let posts = sink.relayed_total().saturating_sub(base) as usize;
        if posts >= n {
            break Ok(posts);
        }
        if Instant::now() >= deadline || poster.is_finished() {
            break Err(anyhow::anyhow!(
                "{name}: the sink answered {posts} of {n} POSTs"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elapsed = start.elapsed().as_secs_f64();
    let machine = machine_busy_seconds()? - machine0;
    stop.store(true, Ordering::SeqCst);
    let posted = poster.await.context("the relay's consumer panicked")?;
    for t in threads {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    let posts = result?;
    posted?;
    let cpu = cpu_seconds(std::process::id())? - cpu0;
    Ok(Relay {
        records: n,
        posts,
        elapsed_s: elapsed,
        per_s: posts as f64 / elapsed,
        hops,
        bench_cpu_us_per_record: cpu * 1e6 / n.max(1) as f64,
        machine_cpu_us_per_record: machine * 1e6 / n.max(1) as f64,
    })
}

/// Partitions assigned to `consumer` now.
fn assigned<C: Consumer>(consumer: &C) -> usize {
    consumer.assignment().map_or(0, |a| a.count())
}

/// A consumer with librdkafka's defaults but for the group and reading from the start.
fn bare_consumer(config: &Config, group: &str) -> ClientConfig {
    let mut c = base_config(config);
    c.set("group.id", group)
        .set("auto.offset.reset", "earliest");
    c
}

/// Forwards each record's key and value from `consumer` to `to` until `stop` or `n` records.
fn forward(
    consumer: &BaseConsumer,
    producer: &ThreadedProducer<DefaultProducerContext>,
    to: &str,
    n: usize,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut forwarded = 0;
    while forwarded < n && !stop.load(Ordering::Relaxed) {
        let Some(msg) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let msg = msg.context("a relay hop's consumer")?;
        let mut record = BaseRecord::<[u8], [u8]>::to(to).payload(msg.payload().unwrap_or(&[]));
        if let Some(key) = msg.key() {
            record = record.key(key);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(e).context("a relay hop's producer"),
            }
        }
        forwarded += 1;
    }
    producer
        .flush(Duration::from_secs(30))
        .context("flushing a relay hop")?;
    Ok(())
}

/// POSTs each record's value to `url`, at most `ENDPOINT_CONCURRENCY` at once, until `stop` or
/// `n` records.
async fn post_each(
    consumer: Arc<StreamConsumer>,
    url: String,
    n: usize,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(ENDPOINT_CONCURRENCY)
        .build::<_, Full<Bytes>>(connector);
    let slots = Arc::new(tokio::sync::Semaphore::new(ENDPOINT_CONCURRENCY));
    let failed = Arc::new(AtomicUsize::new(0));
    let uri: hyper::Uri = url.parse()?;
    let mut read = 0;
    while read < n && !stop.load(Ordering::Relaxed) {
        let msg = match tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await {
            Ok(m) => m.context("the relay's consumer")?,
            Err(_) => continue,
        };
        let body = Bytes::copy_from_slice(msg.payload().unwrap_or(&[]));
        drop(msg);
        read += 1;
        let permit = slots.clone().acquire_owned().await?;
        let (client, uri, failed) = (client.clone(), uri.clone(), failed.clone());
        tokio::spawn(async move {
            let req = hyper::Request::post(uri)
                .header("content-type", "application/json")
                .body(Full::new(body));
            let ok = match req {
                Ok(req) => match client.request(req).await {
                    Ok(resp) => resp.into_body().collect().await.is_ok(),
                    Err(_) => false,
                },
                Err(_) => false,
            };
            if !ok {
                failed.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
    }
    // Every POST answered (all slots back) before the relay says it is done.
    let _all = slots.acquire_many(ENDPOINT_CONCURRENCY as u32).await?;
    let failed = failed.load(Ordering::Relaxed);
    anyhow::ensure!(failed == 0, "{failed} relay POSTs failed");
    Ok(())
}

/// The reference topics of a run, to delete at the end.
pub fn topic_names(prefix: &str) -> Vec<String> {
    let mut v = vec![format!("{prefix}.{BARE}-0")];
    v.extend((0..=SAME_SHAPE_HOPS).map(|i| format!("{prefix}.{SAME_SHAPE}-{i}")));
    v
}

/// Names of the two references (in topic names and the report).
pub const BARE: &str = "bare-relay";
pub const SAME_SHAPE: &str = "same-shape-relay";
/// Consume→produce hops of the same-shape relay (events → dedupe → dispatch).
pub const SAME_SHAPE_HOPS: usize = 2;

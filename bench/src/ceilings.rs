//! The two ceilings every pipeline number is divided by, measured in the same run on the same box:
//!
//! - **HTTP**: a bare Rust client (hyper-util's, the delivery engine's client: pooled, no
//!   redirects, no proxy, TCP_NODELAY) with the dispatcher's concurrency POSTs the same 1 KiB
//!   bodies, signed per request with the same `signing::sign`, to the same sink. No Kafka.
//! - **Kafka**: the same records produced to and consumed from one topic with the stages' client
//!   settings (`kafka::producer_config`, `kafka::pipeline_consumer_config`: idempotent producer, lz4,
//!   linger 10 ms; read_committed consumer), timed from the first send to the last record read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use hookline_common::config::Config;
use hookline_common::kafka::{base_config, pipeline_consumer_config, producer_config};
use hookline_delivery::signing;

use crate::load::{self, Planned};
use crate::stages::cpu_seconds;

#[derive(Debug, Clone, Serialize)]
pub struct HttpCeiling {
    pub requests: usize,
    pub errors: usize,
    pub concurrency: usize,
    pub elapsed_s: f64,
    pub per_s: f64,
    /// CPU of the bench process (client and sink together) per request.
    pub bench_cpu_us_per_request: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct KafkaCeiling {
    pub records: usize,
    pub elapsed_s: f64,
    pub per_s: f64,
    /// CPU of the bench process (building and producing the records, consuming them) per record:
    /// what one Kafka hop costs a client at best, the floor under a stage's CPU per hop.
    pub bench_cpu_us_per_record: f64,
}

/// POSTs `n` signed bodies to `url` with `concurrency` requests in flight.
pub async fn http(
    url: &str,
    keys: &[Vec<u8>],
    n: usize,
    concurrency: usize,
    payload_bytes: usize,
) -> anyhow::Result<HttpCeiling> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .build::<_, Full<Bytes>>(connector);
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let keys = Arc::new(keys.to_vec());
    let cpu0 = cpu_seconds(std::process::id())?;
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, next, errors, keys, url) = (
            client.clone(),
            next.clone(),
            errors.clone(),
            keys.clone(),
            url.to_string(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let id = format!("c-{i}");
                let body = load::event_body(&id, load::OK_TYPE, "main", 0, 0, payload_bytes);
                let ts = hookline_common::runtime::clock::now_secs();
                let sig = signing::sign(&keys, &id, ts, &body);
                let request = hyper::Request::post(url.as_str())
                    .header("content-type", "application/json")
                    .header("webhook-id", &id)
                    .header("webhook-timestamp", ts)
                    .header("webhook-signature", sig)
                    .header("webhook-attempt", 1)
                    .body(Full::new(Bytes::from(body)));
                let Ok(request) = request else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let sent =
                    tokio::time::timeout(Duration::from_secs(10), client.request(request)).await;
                match sent {
                    // Read the (empty) body so the connection goes back to the pool.
                    Ok(Ok(r)) if r.status().is_success() => {
                        let _ = r.into_body().collect().await;
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("http ceiling task panicked")?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(std::process::id())? - cpu0;
    let errors = errors.load(Ordering::Relaxed);
    anyhow::ensure!(
        errors < n / 100 + 1,
        "http ceiling: {errors} of {n} requests failed"
    );
    Ok(HttpCeiling {
        requests: n,
        errors,
        concurrency,
        elapsed_s: elapsed,
        per_s: (n - errors) as f64 / elapsed,
        bench_cpu_us_per_request: cpu * 1e6 / n as f64,
    })
}

/// Produces `plan`'s records (as fast as possible) to a new `topic` and reads them back.
pub async fn kafka(
    config: &Config,
    topic: &str,
    plan: &[Planned],
    payload_bytes: usize,
) -> anyhow::Result<KafkaCeiling> {
    let partitions = config.topics.partitions;
    create_topics(config, &[topic.to_string()]).await?;
    let consumer: BaseConsumer =
        pipeline_consumer_config(config, "bench-kafka-ceiling").create()?;
    wait_for_topic(&consumer, topic, partitions)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let producer: FutureProducer = producer_config(config).create()?;

    let n = plan.len();
    let cpu0 = cpu_seconds(std::process::id())?;
    let reader = std::thread::spawn(move || -> anyhow::Result<Instant> {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut read = 0;
        while read < n {
            anyhow::ensure!(
                Instant::now() < deadline,
                "kafka ceiling: read {read} of {n} records in 300 s"
            );
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(_)) => read += 1,
                Some(Err(e)) => return Err(e).context("kafka ceiling consumer"),
                None => {}
            }
        }
        Ok(Instant::now())
    });
    let start = Instant::now();
    load::produce(
        &producer,
        topic,
        plan,
        &["main".to_string()],
        None,
        payload_bytes,
        None,
    )
    .await?;
    let end = tokio::task::spawn_blocking(move || reader.join())
        .await?
        .map_err(|_| anyhow::anyhow!("kafka ceiling reader panicked"))??;
    let elapsed = end.duration_since(start).as_secs_f64();
    let cpu = cpu_seconds(std::process::id())? - cpu0;
    Ok(KafkaCeiling {
        records: n,
        elapsed_s: elapsed,
        per_s: n as f64 / elapsed,
        bench_cpu_us_per_record: cpu * 1e6 / n.max(1) as f64,
    })
}

/// Creates `names` with the run's partition count, one replica each (the bench's own topics).
pub(crate) async fn create_topics(config: &Config, names: &[String]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = base_config(config).create()?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let new: Vec<NewTopic> = names
        .iter()
        .map(|t| NewTopic::new(t, config.topics.partitions, TopicReplication::Fixed(1)))
        .collect();
    for r in admin.create_topics(&new, &opts).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

/// Waits until the new topic's partitions show in metadata (CreateTopics returns before that).
fn wait_for_topic(consumer: &BaseConsumer, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(md) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            if md
                .topics()
                .iter()
                .any(|t| t.error().is_none() && t.partitions().len() == partitions as usize)
            {
                return Ok(());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "topic {topic} not visible after 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

//! Where the dispatch hop's fixed latency goes: a transactional producer that commits on an
//! interval (like stage B) and a `read_committed` consumer (like the dispatcher), against the
//! local broker, at a low fixed rate. Prints, per record:
//!
//! - `in txn`: send → the commit call starting (the batch interval's wait),
//! - `commit`: the `send_offsets`-less `commit_transaction` call,
//! - `visible`: commit returned → the consumer got the record,
//! - `end to end`: send → received,
//!
//! as p50 / p99 / max in ms, for the settings given. Run:
//!
//! ```sh
//! cargo run --release -p hookline-bench --example txn_latency -- [interval_ms] [rate] [secs] [key=value ...]
//! ```
//!
//! The `key=value` pairs go into both clients (e.g. `fetch.wait.max.ms=50`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};

/// Prints librdkafka's log lines (with `debug=...` among the options) with a time in ms.
struct Printing;

impl ClientContext for Printing {
    fn log(&self, _level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        eprintln!(
            "{:.1} {fac} {log_message}",
            now_us() as f64 / 1000.0 % 100_000.0
        );
    }
}

impl ProducerContext for Printing {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let interval = Duration::from_millis(args.first().map_or(Ok(100), |s| s.parse())?);
    let rate: f64 = args.get(1).map_or(Ok(200.0), |s| s.parse())?;
    let secs: u64 = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let extra: Vec<(String, String)> = args
        .iter()
        .skip(3)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let bootstrap =
        std::env::var("HOOKLINE_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let topic = format!("txnprobe-{}", now_us());
    let base = |c: &mut ClientConfig| {
        c.set("bootstrap.servers", &bootstrap);
        for (k, v) in &extra {
            c.set(k, v);
        }
    };

    let mut ac = ClientConfig::new();
    base(&mut ac);
    let admin: AdminClient<DefaultClientContext> = ac.create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(admin.create_topics(
        &[NewTopic::new(&topic, 6, TopicReplication::Fixed(1))],
        &AdminOptions::new(),
    ))?;

    let mut cc = ClientConfig::new();
    cc.set("group.id", format!("{topic}.g"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false");
    base(&mut cc);
    let consumer: BaseConsumer = cc.create()?;
    consumer.subscribe(&[&topic])?;

    let mut pc = ClientConfig::new();
    pc.set("transactional.id", format!("{topic}.tx"))
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("compression.type", "lz4");
    base(&mut pc);
    pc.set_log_level(RDKafkaLogLevel::Debug);
    let producer: ThreadedProducer<Printing> = pc.create_with_context(Printing)?;
    producer.init_transactions(Duration::from_secs(30))?;

    // seq -> commit returned (us)
    let committed: Arc<Mutex<HashMap<u64, (u64, u64)>>> = Arc::default();
    let received: Arc<Mutex<Vec<(u64, u64, u64)>>> = Arc::default(); // (seq, sent, received)
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (received, stop) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    let at = now_us();
                    let text = std::str::from_utf8(m.payload().unwrap_or_default()).unwrap_or("");
                    let mut it = text.split(',').map(|s| s.parse::<u64>().unwrap_or(0));
                    let (seq, sent) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
                    received.lock().expect("lock").push((seq, sent, at));
                }
            }
        })
    };
    // Let the consumer join before producing.
    std::thread::sleep(Duration::from_secs(4));

    let gap = Duration::from_secs_f64(1.0 / rate);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut seq = 0u64;
    let mut open: Vec<u64> = Vec::new();
    let mut txn_started: Option<Instant> = None;
    let mut next_send = Instant::now();
    let mut commits = Histogram::<u64>::new(3)?;
    while Instant::now() < end || !open.is_empty() {
        let now = Instant::now();
        if now >= next_send && now < end {
            if txn_started.is_none() {
                producer.begin_transaction()?;
                txn_started = Some(now);
            }
            seq += 1;
            let payload = format!("{seq},{}", now_us());
            let key = seq.to_string();
            producer
                .send(BaseRecord::to(&topic).payload(&payload).key(&key))
                .map_err(|(e, _)| e)?;
            open.push(seq);
            next_send += gap;
        }
        if txn_started.is_some_and(|t| t.elapsed() >= interval) || (now >= end && !open.is_empty())
        {
            let begin = now_us();
            eprintln!("{:.1} COMMIT CALL", begin as f64 / 1000.0 % 100_000.0);
            if std::env::var_os("PROBE_FLUSH").is_some() {
                // SAFETY: a live producer handle; rd_kafka_flush is thread-safe.
                unsafe {
                    rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), 30_000)
                };
            }
            producer.commit_transaction(Duration::from_secs(30))?;
            let done = now_us();
            commits.record(done - begin)?;
            let mut c = committed.lock().expect("lock");
            for s in open.drain(..) {
                c.insert(s, (begin, done));
            }
            txn_started = None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while received.lock().expect("lock").len() < seq as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reader.join().ok();

    let (mut in_txn, mut visible, mut e2e) = (
        Histogram::<u64>::new(3)?,
        Histogram::<u64>::new(3)?,
        Histogram::<u64>::new(3)?,
    );
    let c = committed.lock().expect("lock");
    let r = received.lock().expect("lock");
    for (s, sent, at) in r.iter() {
        if let Some((begin, done)) = c.get(s) {
            in_txn.record(begin.saturating_sub(*sent))?;
            visible.record(at.saturating_sub(*done))?;
            e2e.record(at.saturating_sub(*sent))?;
        }
    }
    println!(
        "interval {} ms, {rate}/s, {secs} s, options {extra:?}: {} sent, {} received",
        interval.as_millis(),
        seq,
        r.len()
    );
    for (name, h) in [
        ("in txn", &in_txn),
        ("commit", &commits),
        ("visible", &visible),
        ("end to end", &e2e),
    ] {
        println!(
            "  {name:<11} p50 {:>7.1}  p99 {:>7.1}  max {:>7.1} ms",
            ms(h, 0.5),
            ms(h, 0.99),
            h.max() as f64 / 1000.0
        );
    }
    rt.block_on(admin.delete_topics(&[&topic], &AdminOptions::new()))?;
    Ok(())
}

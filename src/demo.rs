//! The one-command demo (`make run`): a reference webhook receiver (`hookline receiver`) and a
//! producer of demo events (`hookline demo produce`).
//!
//! The receiver does what the spec advises every receiver to do: verify the Standard Webhooks
//! signature, refuse timestamps more than 5 minutes from now, and dedupe by `webhook-id` (the
//! dispatcher delivers at least once). `--fail-every N` answers 503 to every Nth fresh request so
//! retries show up. The producer re-sends some ids with different bytes and keys so the deduper
//! has something to collapse. `demo produce --watch` shows the pipeline working as a live
//! progress view read from its `/metrics` (produced, deduplicated, delivered, retrying per tier,
//! dead) and ends with a summary naming the `dead list` / `replay` commands to try.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use clap::{Args, Subcommand};
use rand::Rng as _;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

use hookline_common::config::{Config, LogConfig, LogFormat};
use hookline_common::contract::keyhash::Placement;
use hookline_common::contract::secret::decode_secret;
use hookline_common::contract::topics;
use hookline_common::kafka;
use hookline_common::runtime::clock::now_secs;
use hookline_common::runtime::shutdown;

use crate::telemetry;
use hookline_delivery::signing;

/// Largest body the receiver reads; beyond it answers 413.
const MAX_BODY_BYTES: usize = 1 << 20;
/// Timestamps further than this from now are refused (the Standard Webhooks default).
const TIMESTAMP_TOLERANCE_SECS: i64 = 5 * 60;
/// How long a `webhook-id` is remembered (the dispatcher's redelivery horizon is the same day).
const SEEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// Hard cap on remembered ids; the oldest is forgotten first.
const SEEN_CAP: usize = 1_000_000;
/// Longest `webhook-id` accepted (the input contract's id limit).
const MAX_ID_BYTES: usize = 256;
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct ReceiverArgs {
    /// Address to listen on; port 0 picks a free one. The bound address is printed on stdout's
    /// first line.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// `whsec_…` secret of the endpoint; repeat while rotating (any one verifies).
    #[arg(long = "secret", value_name = "WHSEC", required = true)]
    secrets: Vec<String>,
    /// Answer 503 to every Nth fresh request (without remembering its id), to show retries.
    #[arg(long, value_name = "N")]
    fail_every: Option<u64>,
}

#[derive(Subcommand)]
pub enum DemoCommand {
    /// Produce demo events to `<p>.events`, some ids sent twice (with different bytes and keys).
    Produce(ProduceArgs),
}

#[derive(Args)]
pub struct ProduceArgs {
    /// Distinct events to produce (re-sent duplicates come on top).
    #[arg(long, default_value_t = 100)]
    count: u64,
    /// Probability, after each event, of re-sending an earlier id.
    #[arg(long, default_value_t = 0.3)]
    duplicate_rate: f64,
    /// Records per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Show a live progress view from the running pipeline's `/metrics` until every event is
    /// delivered or dead, then a summary with commands to try.
    #[arg(long)]
    watch: bool,
    /// The pipeline's metrics page; default: `server.listen` of the configuration.
    #[arg(long, value_name = "URL")]
    metrics_url: Option<String>,
    /// With `--watch`: give up waiting for the pipeline to settle after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 180)]
    watch_timeout: u64,
}

/// `hookline receiver`: runs without a configuration file (it is the other side of the wire).
pub fn receiver_main(args: ReceiverArgs) -> std::process::ExitCode {
    telemetry::init(&LogConfig {
        format: LogFormat::Pretty,
        level: "info".into(),
    });
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
        .and_then(|rt| rt.block_on(receiver(args)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn receiver(args: ReceiverArgs) -> anyhow::Result<()> {
    let keys = args
        .secrets
        .iter()
        .enumerate()
        .map(|(i, s)| decode_secret(s).map_err(|e| anyhow::anyhow!("--secret #{}: {e}", i + 1)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.fail_every == Some(0) {
        anyhow::bail!("--fail-every must be at least 1");
    }
    let state = Arc::new(ReceiverState {
        keys,
        fail_every: args.fail_every,
        seen: Mutex::new(SeenIds::default()),
        counters: Counters::default(),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    // Tests (and scripts) read the bound address from the first line.
    println!("{addr}");
    tracing::info!(
        %addr,
        fail_every = args.fail_every,
        "receiver listening; POST webhooks to any path"
    );

    let (trigger, mut stop) = shutdown::channel();
    shutdown::on_signals(trigger.clone());
    let summary = tokio::spawn(summarize(state.clone(), trigger.subscribe()));
    let app = Router::new()
        .route("/{*path}", post(handle))
        .with_state(state.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.wait().await })
        .await
        .context("serving")?;
    summary.abort();
    state.counters.log("receiver stopped");
    Ok(())
}

struct ReceiverState {
    keys: Vec<Vec<u8>>,
    fail_every: Option<u64>,
    seen: Mutex<SeenIds>,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    fresh: AtomicU64,
    duplicates: AtomicU64,
    rejected: AtomicU64,
    failed_on_purpose: AtomicU64,
}

impl Counters {
    fn log(&self, message: &str) {
        tracing::info!(
            received = self.received.load(Ordering::Relaxed),
            fresh = self.fresh.load(Ordering::Relaxed),
            duplicates = self.duplicates.load(Ordering::Relaxed),
            rejected = self.rejected.load(Ordering::Relaxed),
            failed_on_purpose = self.failed_on_purpose.load(Ordering::Relaxed),
            "{message}"
        );
    }
}

/// Remembered `webhook-id`s: first-seen time by id, plus arrival order to forget the oldest.
/// Ids are inserted in time order, so the front of `order` is always the oldest.
#[derive(Default)]
struct SeenIds {
    by_id: HashMap<String, Instant>,
    order: VecDeque<(String, Instant)>,
}

impl SeenIds {
    fn contains(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    fn insert(&mut self, id: String, now: Instant) {
        self.expire(now);
        while self.by_id.len() >= SEEN_CAP {
            let Some((old, _)) = self.order.pop_front() else {
                break;
            };
            self.by_id.remove(&old);
        }
        self.by_id.insert(id.clone(), now);
        self.order.push_back((id, now));
    }

    /// Forgets ids first seen more than [`SEEN_TTL`] ago.
    fn expire(&mut self, now: Instant) {
        while let Some((id, at)) = self.order.front() {
            if now.saturating_duration_since(*at) < SEEN_TTL {
                break;
            }
            self.by_id.remove(id);
            self.order.pop_front();
        }
    }
}

async fn summarize(state: Arc<ReceiverState>, mut stop: shutdown::Shutdown) {
    let mut tick = tokio::time::interval(SUMMARY_EVERY);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait() => return,
        }
        if let Ok(mut seen) = state.seen.lock() {
            seen.expire(Instant::now());
        }
        state.counters.log("receiver summary");
    }
}

fn reply(status: StatusCode, body: serde_json::Value) -> Response {
    (status, Json(body)).into_response()
}

fn reject(state: &ReceiverState, status: StatusCode, reason: &'static str) -> Response {
    state.counters.rejected.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(status = status.as_u16(), reason, "request rejected");
    reply(status, json!({ "status": "rejected", "reason": reason }))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn handle(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    state.counters.received.fetch_add(1, Ordering::Relaxed);
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return reject(&state, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    };
    let (Some(id), Some(timestamp), Some(signature)) = (
        header(&headers, "webhook-id"),
        header(&headers, "webhook-timestamp"),
        header(&headers, "webhook-signature"),
    ) else {
        return reject(&state, StatusCode::BAD_REQUEST, "missing_headers");
    };
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return reject(&state, StatusCode::BAD_REQUEST, "bad_webhook_id");
    }
    let Ok(timestamp) = timestamp.parse::<i64>() else {
        return reject(&state, StatusCode::BAD_REQUEST, "bad_timestamp");
    };
    if !state
        .keys
        .iter()
        .any(|key| signing::verify(key, id, timestamp, &body, signature))
    {
        return reject(&state, StatusCode::UNAUTHORIZED, "bad_signature");
    }
    // Checked after the signature, so the timestamp is the sender's and not a forger's.
    if now_secs().abs_diff(timestamp) > TIMESTAMP_TOLERANCE_SECS.unsigned_abs() {
        return reject(&state, StatusCode::UNAUTHORIZED, "stale_timestamp");
    }
    let attempt = header(&headers, "webhook-attempt").and_then(|a| a.parse::<u32>().ok());
    let event_type = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .map(|t| t.chars().take(128).collect::<String>())
        .unwrap_or_else(|| "-".into());

    {
        let Ok(mut seen) = state.seen.lock() else {
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({ "status": "error" }),
            );
        };
        if seen.contains(id) {
            drop(seen);
            state.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            tracing::info!(webhook_id = id, r#type = %event_type, attempt, "duplicate delivery, already processed");
            return reply(StatusCode::OK, json!({ "status": "duplicate" }));
        }
        // Every fresh request counts towards --fail-every, including the ones failed on purpose.
        let nth = state.counters.fresh.load(Ordering::Relaxed)
            + state.counters.failed_on_purpose.load(Ordering::Relaxed)
            + 1;
        if state.fail_every.is_some_and(|n| nth.is_multiple_of(n)) {
            drop(seen);
            state
                .counters
                .failed_on_purpose
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(webhook_id = id, r#type = %event_type, attempt, "failing on purpose (--fail-every), expect a retry");
            return reply(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "status": "failing_on_purpose" }),
            );
        }
        seen.insert(id.to_owned(), Instant::now());
        state.counters.fresh.fetch_add(1, Ordering::Relaxed);
    }
    tracing::info!(webhook_id = id, r#type = %event_type, attempt, "webhook received");
    reply(StatusCode::OK, json!({ "status": "ok" }))
}

/// `hookline demo …`; `config_path` is only printed (in the commands the summary suggests).
pub async fn run(
    command: DemoCommand,
    config: Arc<Config>,
    config_path: &std::path::Path,
) -> anyhow::Result<()> {
    match command {
        DemoCommand::Produce(args) if args.watch => {
            let url = match &args.metrics_url {
                Some(u) => u.clone(),
                None => watch::metrics_url(config.server.listen),
            };
            let timeout = Duration::from_secs(args.watch_timeout);
            let view = watch::View::new(args.count);
            let produced = {
                let view = view.clone();
                let config = config.clone();
                tokio::spawn(async move { produce_with(args, &config, Some(view)).await })
            };
            let outcome = watch::run(&view, &url, produced, timeout).await?;
            watch::summary(&outcome, config_path, &config);
            Ok(())
        }
        DemoCommand::Produce(args) => produce_with(args, &config, None).await.map(|_| ()),
    }
}

const TYPES: [&str; 3] = ["message.created", "order.paid", "conversation.updated"];

fn demo_event(id: &str, n: u64, resend: Option<u64>) -> serde_json::Value {
    let event_type = TYPES[(n % TYPES.len() as u64) as usize];
    let mut data = match event_type {
        "message.created" => json!({
            "conversation_id": format!("conv-{}", n % 7),
            "text": format!("hello #{n}"),
        }),
        "order.paid" => json!({
            "order_id": format!("order-{n}"),
            "amount_cents": 1_000 + (n * 137) % 9_000,
            "currency": "EUR",
        }),
        _ => json!({
            "conversation_id": format!("conv-{}", n % 7),
            "status": if n.is_multiple_of(2) { "open" } else { "closed" },
        }),
    };
    if let (Some(k), Some(obj)) = (resend, data.as_object_mut()) {
        // Different bytes for the same id: the deduper must still collapse it.
        obj.insert("resend".into(), json!(k));
    }
    json!({ "id": id, "type": event_type, "tenant": "demo", "data": data })
}

/// What a demo run produced.
#[derive(Clone, Copy, Debug, Default)]
pub struct Produced {
    pub distinct: u64,
    pub resent: u64,
}

async fn produce_with(
    args: ProduceArgs,
    config: &Config,
    view: Option<watch::View>,
) -> anyhow::Result<Produced> {
    if !(0.0..=1.0).contains(&args.duplicate_rate) {
        anyhow::bail!("--duplicate-rate must be within 0..=1");
    }
    if !(args.rate.is_finite() && args.rate > 0.0) {
        anyhow::bail!("--rate must be a positive number of records per second");
    }
    let topic = topics::Topics::new(&config.topics.prefix).events();
    let placement = Placement::new(config);
    let producer: FutureProducer = kafka::producer_config(config)
        .create()
        .context("creating the Kafka producer")?;
    let run = format!("{:x}", now_secs());
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // With a live view, it reports instead of these lines.
    if view.is_none() {
        println!(
            "producing {} demo events to {topic} (run {run}, duplicate rate {}, {} records/s)",
            args.count, args.duplicate_rate, args.rate
        );
    }
    // Send (the producer runs as a task beside the live view), unlike `thread_rng`.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_entropy();
    let (mut fresh, mut duplicates) = (0u64, 0u64);
    for n in 0..args.count {
        let id = format!("demo-{run}-{n}");
        let value = demo_event(&id, n, None).to_string();
        tick.tick().await;
        send(&producer, &topic, &id, &value, placement.as_ref()).await?;
        fresh += 1;
        if let Some(v) = &view {
            v.produced(fresh, duplicates);
        }
        if rng.gen_bool(args.duplicate_rate) {
            let earlier = rng.gen_range(0..=n);
            duplicates += 1;
            let id = format!("demo-{run}-{earlier}");
            let value = demo_event(&id, earlier, Some(duplicates)).to_string();
            let key = format!("{id}-resend-{duplicates}");
            tick.tick().await;
            send(&producer, &topic, &key, &value, placement.as_ref()).await?;
            if let Some(v) = &view {
                v.produced(fresh, duplicates);
            }
        }
    }
    let produced = Produced {
        distinct: fresh,
        resent: duplicates,
    };
    if view.is_some() {
        return Ok(produced);
    }
    println!(
        "sent {} records to {topic}: {fresh} distinct events (demo-{run}-0 … demo-{run}-{}), \
         {duplicates} re-sent ids with different bytes and keys (the deduper drops them)",
        fresh + duplicates,
        args.count.saturating_sub(1)
    );
    Ok(produced)
}

async fn send(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    value: &str,
    placement: Option<&Placement>,
) -> anyhow::Result<()> {
    let mut record = FutureRecord::to(topic).key(key).payload(value);
    // On the partition the deduper owns the event's key by (`dedupe.direct`).
    if let Some(p) = placement.and_then(|p| p.partition(value.as_bytes())) {
        record = record.partition(p);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .with_context(|| format!("producing to {topic}"))?;
    Ok(())
}

mod watch;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_ids_expire_after_the_ttl() {
        let mut seen = SeenIds::default();
        let t0 = Instant::now();
        seen.insert("a".into(), t0);
        seen.insert("b".into(), t0 + Duration::from_secs(3600));
        assert!(seen.contains("a") && seen.contains("b"));
        seen.expire(t0 + SEEN_TTL);
        assert!(!seen.contains("a"));
        assert!(seen.contains("b"));
        assert_eq!(seen.order.len(), 1);
    }

    #[test]
    fn demo_events_are_valid_json_with_the_contract_fields() {
        let v = demo_event("demo-1-4", 4, Some(2));
        assert_eq!(v["id"], "demo-1-4");
        assert_eq!(v["tenant"], "demo");
        assert!(TYPES.contains(&v["type"].as_str().unwrap_or("")));
        assert_eq!(v["data"]["resend"], 2);
        assert_ne!(demo_event("demo-1-4", 4, None), v);
    }
}

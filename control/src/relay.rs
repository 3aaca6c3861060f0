//! Operational webhooks: the relay that turns what happened to hookline itself into events
//! delivered like any other — signed, retried on the schedule, dead-lettered.
//!
//! Sources, each a topic, so an event exists once whichever pod made the change:
//! - `<p>.operational`: the registry's changes and the health tracker's marks, each written in
//!   the change's own transaction ([`crate::operational`]) → `hookline.endpoint.created`,
//!   `.updated`, `.disabled` (by a person, or `automatic` after `control.auto_disable_after`),
//!   `.enabled`, `.deleted`, `.failing`, `.recovered`;
//! - `<p>.dlq`: every dead letter → `hookline.delivery.dead`, with its position and the replay
//!   command. Dead letters of hookline's own events are not announced (no loop), nor dead
//!   letters written before the relay first ran (the DLQ keeps them all; `hookline dead list`).
//!
//! The relay is one consumer group (`<group_prefix>.operational-relay`) run by every dispatcher
//! process; it writes each event straight to `<p>.dedupe` with the event headers stage A would
//! write, on the partition its key hashes to. Producers cannot make these events: an input
//! event whose type starts with `hookline.` is quarantined (`reserved_type`). The event id is
//! derived from the source record (`hl_op_<partition>_<offset>_<timestamp>`,
//! `hl_dead_<partition>_<offset>_<timestamp>`), so a record read twice (a relay restarted before
//! its commit, a rebalance) is the same event, dropped by stage B's 24 h dedupe: exactly one
//! delivery per change and subscribed endpoint.
//!
//! Fan-out: only endpoints with a `hookline.` glob of their own receive them
//! ([`hookline_delivery::endpoints::subscribes`]); an event's tenant is the endpoint's (or the
//! dead delivery's), so a tenant's endpoint subscribed to `hookline.*` receives its tenant's.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};

use hookline_common::config::Config;
use hookline_common::contract::delivery::DeliveryMeta;
use hookline_common::contract::envelope::RESERVED_TYPE_PREFIX;
use hookline_common::contract::event_headers::EventHeaders;
use hookline_common::contract::keyhash::{key_hash, partition_for};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::{await_acked, enqueue, OwnedRecord, ProduceErrors};
use hookline_common::kafka::{
    consumer_config, producer_config, retry_transient, retry_transient_known, topic_partitions,
};
use hookline_common::runtime::ops::Readiness;
use hookline_common::runtime::shutdown::Shutdown;

use crate::operational::{self as kinds, OperationalEvent};

/// The relay's stage name: its probe and its consumer group suffix.
pub const STAGE: &str = "operational-relay";

/// Most records relayed per batch (one ack wait, one offset store).
const BATCH: usize = 500;

/// One operational webhook, before it is written.
#[derive(Debug, Clone, PartialEq)]
pub struct Relayed {
    pub id: String,
    pub event_type: String,
    pub tenant: Option<String>,
    /// The envelope: `id`, `type`, `tenant`, `timestamp`, `data`.
    pub body: Value,
}

impl Relayed {
    /// Stage B's seen-set key: a namespace of its own, never a producer's.
    pub fn dedupe_key(&self) -> String {
        format!("hookline|-|{}:{}", self.id.len(), self.id)
    }

    /// The `<p>.dedupe` record: the envelope with stage A's event headers, on its key's
    /// partition.
    pub fn record(&self, config: &Config) -> OwnedRecord {
        let key = self.dedupe_key();
        let headers = EventHeaders {
            id: self.id.clone(),
            event_type: self.event_type.clone(),
            tenant: self.tenant.clone(),
            dedupe_key: Some(key.clone()),
        };
        let mut owned = OwnedHeaders::new();
        for (name, value) in headers.pairs() {
            owned = owned.insert(rdkafka::message::Header {
                key: name,
                value: Some(value),
            });
        }
        OwnedRecord {
            topic: Topics::new(&config.topics.prefix).dedupe(),
            partition: Some(partition_for(key_hash(&key), config.topics.partitions)),
            key: Some(self.id.clone().into_bytes()),
            value: Some(serde_json::to_vec(&self.body).unwrap_or_default()),
            headers: owned,
        }
    }
}

fn time(ms: i64) -> String {
    crate::table::time(Some(ms))
}

fn envelope(id: &str, event_type: &str, tenant: Option<&str>, at_ms: i64, data: Value) -> Value {
    json!({
        "id": id,
        "type": event_type,
        "tenant": tenant,
        "timestamp": time(at_ms),
        "data": data,
    })
}

/// The webhook of one `<p>.operational` record (`None`: unreadable, or a kind this version does
/// not announce).
pub fn from_operational(
    partition: i32,
    offset: i64,
    timestamp_ms: i64,
    payload: &[u8],
) -> Option<Relayed> {
    let e: OperationalEvent = serde_json::from_slice(payload).ok()?;
    let (event_type, automatic) = match e.kind.as_str() {
        kinds::AUTO_DISABLED => ("hookline.endpoint.disabled", true),
        k @ (kinds::CREATED
        | kinds::UPDATED
        | kinds::DISABLED
        | kinds::ENABLED
        | kinds::DELETED
        | kinds::FAILING
        | kinds::RECOVERED) => {
            return Some(endpoint_event(
                partition,
                offset,
                timestamp_ms,
                &format!("{RESERVED_TYPE_PREFIX}{k}"),
                false,
                &e,
            ))
        }
        _ => return None,
    };
    Some(endpoint_event(
        partition,
        offset,
        timestamp_ms,
        event_type,
        automatic,
        &e,
    ))
}

fn endpoint_event(
    partition: i32,
    offset: i64,
    timestamp_ms: i64,
    event_type: &str,
    automatic: bool,
    e: &OperationalEvent,
) -> Relayed {
    let id = format!("hl_op_{partition}_{offset}_{timestamp_ms}");
    let mut data = json!({
        "endpoint_id": e.endpoint_id,
        "url": e.url,
        "tenant": e.tenant,
        "version": e.version,
        "reason": e.reason,
        "at": time(e.at_ms),
        "instance": e.instance,
    });
    if event_type.ends_with(".disabled") {
        data["automatic"] = json!(automatic);
    }
    if e.failing_since_ms.is_some() {
        data["failing_since"] = json!(time(e.failing_since_ms.unwrap_or_default()));
        data["consecutive_failures"] = json!(e.consecutive_failures);
        data["last_error"] = json!(e.last_error);
    }
    Relayed {
        body: envelope(&id, event_type, e.tenant.as_deref(), e.at_ms, data),
        id,
        event_type: event_type.to_string(),
        tenant: e.tenant.clone(),
    }
}

/// The `hookline.delivery.dead` webhook of one `<p>.dlq` record (`None`: a dead letter of
/// hookline's own events, or one whose headers do not read).
pub fn from_dead_letter<M: Message>(m: &M) -> Option<Relayed> {
    let meta = DeliveryMeta::from_message(m).ok()?;
    if meta.event_type.starts_with(RESERVED_TYPE_PREFIX) {
        return None;
    }
    let (partition, offset) = (m.partition(), m.offset());
    let timestamp_ms = m.timestamp().to_millis().unwrap_or(0);
    let id = format!("hl_dead_{partition}_{offset}_{timestamp_ms}");
    let at_ms = meta.dead_at_ms.unwrap_or(timestamp_ms);
    let last = meta.history.last().map(|a| {
        json!({
            "attempt": a.n,
            "at": time(a.at_ms),
            "status": a.status,
            "class": a.class,
            "duration_ms": a.duration_ms,
        })
    });
    let position = format!("{partition}:{offset}");
    let data = json!({
        "endpoint_id": meta.endpoint_id,
        "event_id": meta.event_id,
        "event_type": meta.event_type,
        "tenant": meta.tenant,
        "reason": meta.dead_reason.map(|r| r.as_str()),
        "attempts": meta.history.len(),
        "first_attempt_at": time(meta.first_attempt_ms),
        "dead_at": time(at_ms),
        "last_attempt": last,
        "dead_letter": {
            "topic": m.topic(),
            "partition": partition,
            "offset": offset,
            "position": position,
        },
        "replay": {
            "command": format!(
                "hookline replay --partition {partition} --from-offset {offset} --to-offset {offset}"
            ),
            "api": format!("POST /v1/dead-letters/{position}/replay"),
        },
    });
    Some(Relayed {
        body: envelope(
            &id,
            "hookline.delivery.dead",
            meta.tenant.as_deref(),
            at_ms,
            data,
        ),
        id,
        event_type: "hookline.delivery.dead".into(),
        tenant: meta.tenant,
    })
}

/// Relayed and skipped records, by source and outcome.
struct RelayMetrics {
    records: prometheus::IntCounterVec,
}

impl RelayMetrics {
    fn register(registry: &prometheus::Registry) -> prometheus::Result<RelayMetrics> {
        let records = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "hookline_operational_relay_records_total",
                "Records of <p>.operational and <p>.dlq the operational-webhook relay read, by \
                 source (operational, dlq) and outcome (relayed; skipped: not announced)",
            ),
            &["source", "outcome"],
        )?;
        registry.register(Box::new(records.clone()))?;
        for s in ["operational", "dlq"] {
            for o in ["relayed", "skipped"] {
                records.with_label_values(&[s, o]);
            }
        }
        Ok(RelayMetrics { records })
    }
}

/// Runs the relay until shutdown (every dispatcher process runs one).
pub async fn run(
    config: Arc<Config>,
    metrics: prometheus::Registry,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let probe = readiness.register(STAGE);
    let result = relay(&config, &metrics, &probe, shutdown).await;
    probe.stopped();
    result
}

async fn relay(
    config: &Config,
    registry: &prometheus::Registry,
    probe: &hookline_common::runtime::ops::StageProbe,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let topics = Topics::new(&config.topics.prefix);
    let (operational, dlq) = (topics.operational(), topics.dlq());
    let metrics = RelayMetrics::register(registry)?;
    let errors = ProduceErrors::register(registry, "operational_relay")?;
    let consumer: StreamConsumer = consumer_config(config, STAGE)
        .create()
        .context("creating the operational-webhook relay's consumer")?;
    let producer: FutureProducer = producer_config(config)
        .create()
        .context("creating the operational-webhook relay's producer")?;
    start_dlq_at_its_end(&consumer, &dlq).await?;
    consumer
        .subscribe(&[&operational, &dlq])
        .context("subscribing the operational-webhook relay")?;
    probe.set_ready(true);
    tracing::info!(group = %config.group_id(STAGE), "operational-webhook relay running");
    loop {
        probe.beat();
        let mut batch = Vec::new();
        tokio::select! {
            _ = shutdown.wait() => break,
            first = tokio::time::timeout(Duration::from_secs(1), consumer.recv()) => match first {
                Err(_) => continue,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "operational-webhook relay: consumer error");
                    continue;
                }
                Ok(Ok(m)) => batch.push(m.detach()),
            },
        }
        while batch.len() < BATCH {
            match tokio::time::timeout(Duration::from_millis(5), consumer.recv()).await {
                Ok(Ok(m)) => batch.push(m.detach()),
                _ => break,
            }
        }
        let mut pending = Vec::new();
        for m in &batch {
            let (source, relayed) = if m.topic() == operational {
                let ts = m.timestamp().to_millis().unwrap_or(0);
                let r = m
                    .payload()
                    .and_then(|p| from_operational(m.partition(), m.offset(), ts, p));
                ("operational", r)
            } else {
                ("dlq", from_dead_letter(m))
            };
            let outcome = if relayed.is_some() {
                "relayed"
            } else {
                "skipped"
            };
            metrics.records.with_label_values(&[source, outcome]).inc();
            if let Some(r) = relayed {
                let record = r.record(config);
                let first = enqueue(&producer, &record).await;
                pending.push((record, first));
            }
        }
        for (record, first) in pending {
            await_acked(&producer, &record, first, &errors, &shutdown)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("writing an operational webhook to {}: {e:?}", record.topic)
                })?;
        }
        for m in &batch {
            let mut tpl = TopicPartitionList::new();
            let _ =
                tpl.add_partition_offset(m.topic(), m.partition(), Offset::Offset(m.offset() + 1));
            if let Err(e) = consumer.store_offsets(&tpl) {
                // Revoked meanwhile: its new owner reads it again (the same event, deduped).
                tracing::debug!(error = %e, "operational-webhook relay: offset not stored");
            }
        }
    }
    if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
        tracing::debug!(error = %e, "operational-webhook relay: final commit");
    }
    let _ = hookline_common::kafka::closing::close(STAGE, move || drop(consumer)).await;
    Ok(())
}

/// On the group's first run (no committed offset on any `<p>.dlq` partition), commits the
/// DLQ's current end: dead letters from before the relay existed are not announced (the
/// operational topic, bounded by its retention, is read from its beginning).
async fn start_dlq_at_its_end(consumer: &StreamConsumer, dlq: &str) -> anyhow::Result<()> {
    // Blocking Kafka calls, each riding out a broker's or coordinator's outage like every
    // stage's start-up calls.
    tokio::task::block_in_place(|| {
        let partitions = topic_partitions(consumer.client(), dlq, Duration::from_secs(10))
            .with_context(|| format!("reading the partitions of {dlq}"))?;
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition(dlq, *p);
        }
        let committed = retry_transient("relay committed offsets", || {
            consumer.committed_offsets(tpl.clone(), Duration::from_secs(10))
        })
        .with_context(|| format!("reading the relay's committed offsets on {dlq}"))?;
        if committed
            .elements()
            .iter()
            .any(|e| matches!(e.offset(), Offset::Offset(_)))
        {
            return Ok(());
        }
        let mut ends = TopicPartitionList::new();
        for p in &partitions {
            let (_, high) = retry_transient_known("relay dlq end", Duration::from_secs(30), || {
                consumer.fetch_watermarks(dlq, *p, Duration::from_secs(10))
            })
            .with_context(|| format!("reading the end of {dlq} [{p}]"))?;
            ends.add_partition_offset(dlq, *p, Offset::Offset(high))?;
        }
        match retry_transient("relay first-run commit", || {
            consumer.commit(&ends, CommitMode::Sync)
        }) {
            Ok(()) => tracing::info!(
                topic = dlq,
                "operational-webhook relay: first run, dead letters announced from the end of the DLQ"
            ),
            // Another pod is in the group already (it committed first), or the commit was
            // refused for good: announced from where the group starts, logged.
            Err(e) => tracing::info!(error = %e, "operational-webhook relay: first-run commit not made"),
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;

    fn op(kind: &str) -> Vec<u8> {
        OperationalEvent {
            kind: kind.into(),
            endpoint_id: "crm".into(),
            url: Some("https://crm.example/hook".into()),
            tenant: Some("acme".into()),
            reason: "manual".into(),
            at_ms: 1_767_139_200_000,
            failing_since_ms: None,
            consecutive_failures: 0,
            last_error: None,
            instance: "pod-1".into(),
            version: Some(3),
        }
        .to_bytes()
    }

    #[test]
    fn endpoint_changes_become_hookline_events() {
        let r = from_operational(0, 17, 5, &op(kinds::DISABLED)).expect("relayed");
        assert_eq!(r.id, "hl_op_0_17_5");
        assert_eq!(r.event_type, "hookline.endpoint.disabled");
        assert_eq!(r.tenant.as_deref(), Some("acme"));
        assert_eq!(r.body["data"]["automatic"], false);
        assert_eq!(r.body["data"]["version"], 3);
        assert_eq!(r.body["timestamp"], "2025-12-31T00:00:00.000Z");
        let auto = from_operational(0, 18, 5, &op(kinds::AUTO_DISABLED)).expect("relayed");
        assert_eq!(auto.event_type, "hookline.endpoint.disabled");
        assert_eq!(auto.body["data"]["automatic"], true);
        for (kind, ty) in [
            (kinds::CREATED, "hookline.endpoint.created"),
            (kinds::FAILING, "hookline.endpoint.failing"),
            (kinds::RECOVERED, "hookline.endpoint.recovered"),
        ] {
            assert_eq!(
                from_operational(0, 1, 1, &op(kind)).expect(kind).event_type,
                ty
            );
        }
        assert_eq!(from_operational(0, 1, 1, &op("something.else")), None);
        assert_eq!(from_operational(0, 1, 1, b"not json"), None);
    }

    #[test]
    fn the_record_is_what_stage_a_would_forward() {
        let config = Config::from_toml_with_env(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[topics]\nprefix = \"p\"\npartitions = 6\n",
            "test",
            Vec::new(),
        )
        .expect("config");
        let r = from_operational(0, 17, 5, &op(kinds::CREATED)).expect("relayed");
        let rec = r.record(&config);
        assert_eq!(rec.topic, "p.dedupe");
        assert_eq!(
            rec.partition,
            Some(partition_for(key_hash("hookline|-|12:hl_op_0_17_5"), 6))
        );
        let msg = OwnedMessage::new(
            rec.value.clone(),
            rec.key.clone(),
            rec.topic.clone(),
            Timestamp::NotAvailable,
            0,
            0,
            Some(rec.headers.clone()),
        );
        let h = EventHeaders::from_message(&msg).expect("event headers");
        assert_eq!(h.event_type, "hookline.endpoint.created");
        assert_eq!(h.tenant.as_deref(), Some("acme"));
        assert_eq!(
            EventHeaders::seen_key(&msg).as_deref(),
            Some("hookline|-|12:hl_op_0_17_5")
        );
    }

    fn dead(event_type: &str) -> OwnedMessage {
        let mut meta = DeliveryMeta::new("crm", "evt_1", event_type, Some("acme"), 1_000);
        meta.dead_reason = Some(hookline_common::contract::delivery::DeadReason::Exhausted);
        meta.dead_at_ms = Some(9_000);
        let headers = meta.kafka_headers(None);
        OwnedMessage::new(
            Some(b"{}".to_vec()),
            None,
            "p.dlq".into(),
            Timestamp::CreateTime(9_001),
            2,
            45,
            Some(headers),
        )
    }

    #[test]
    fn a_dead_letter_is_announced_with_its_position_and_replay() {
        let r = from_dead_letter(&dead("order.paid")).expect("relayed");
        assert_eq!(r.id, "hl_dead_2_45_9001");
        assert_eq!(r.event_type, "hookline.delivery.dead");
        let d = &r.body["data"];
        assert_eq!(d["event_id"], "evt_1");
        assert_eq!(d["reason"], "exhausted");
        assert_eq!(d["dead_letter"]["position"], "2:45");
        assert_eq!(
            d["replay"]["command"],
            "hookline replay --partition 2 --from-offset 45 --to-offset 45"
        );
        assert_eq!(from_dead_letter(&dead("hookline.delivery.dead")), None);
    }
}

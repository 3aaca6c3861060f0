//! The stream a scenario runs under: unique events (types alternating), every third id re-sent
//! with other bytes and another key, records that must be quarantined, optionally hostile ones
//! interleaved; produced at a fixed rate (open model) on a thread of its own.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::harness;

/// One record as produced to `<p>.events`.
#[derive(Clone)]
pub struct Rec {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Rec {
    pub fn new(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Rec {
        Rec {
            key: key.into(),
            value: value.into(),
            headers: Vec::new(),
        }
    }

    /// The headers as Kafka headers, to produce the record.
    pub fn kafka_headers(&self) -> rdkafka::message::OwnedHeaders {
        self.headers
            .iter()
            .fold(rdkafka::message::OwnedHeaders::new(), |out, (k, v)| {
                out.insert(rdkafka::message::Header {
                    key: k,
                    value: Some(v),
                })
            })
    }
}

pub struct Stream {
    /// The unique ids: each must reach every endpoint or be dead-lettered.
    pub ids: BTreeSet<String>,
    /// Records that must end on `<p>.invalid`.
    pub invalid: usize,
    records: Vec<Rec>,
}

impl Stream {
    /// `unique` events, every third id re-sent, and `invalid` records without a `type`.
    pub fn mixed(prefix: &str, unique: usize, invalid: usize) -> Stream {
        let mut records = Vec::new();
        let mut ids = BTreeSet::new();
        for n in 0..unique {
            let id = format!("{prefix}-evt-{n}");
            let ty = ["message.created", "order.paid"][n % 2];
            let value =
                serde_json::json!({"id": id, "type": ty, "tenant": "acme", "data": {"n": n}});
            records.push(Rec::new(id.clone(), value.to_string()));
            if n % 3 == 2 {
                let again = serde_json::json!({"id": id, "type": ty, "tenant": "acme", "data": {"n": n, "resent": true}});
                records.push(Rec::new(format!("{id}-again"), again.to_string()));
            }
            if n < invalid {
                // No `type`: quarantined as invalid, never delivered.
                let bad = serde_json::json!({"id": format!("{id}-bad"), "data": {}});
                records.push(Rec::new(format!("{id}-bad"), bad.to_string()));
            }
            ids.insert(id);
        }
        Stream {
            ids,
            invalid: invalid.min(unique),
            records,
        }
    }

    /// The mixed stream that lasts about `secs` seconds at `rate` records per second (each unique
    /// event brings a third of a re-send, plus the `invalid` ones): a scenario's stream should
    /// end with its faults, not long after them.
    pub fn for_secs(prefix: &str, secs: f64, rate: f64, invalid: usize) -> Stream {
        let records = (secs * rate) as usize;
        let unique = (records.saturating_sub(invalid) as f64 * 3.0 / 4.0) as usize;
        Stream::mixed(prefix, unique.max(invalid), invalid)
    }

    /// Spreads `extra` records (all of which must be quarantined) evenly through the stream.
    pub fn interleave_invalid(&mut self, extra: Vec<Rec>) {
        if extra.is_empty() {
            return;
        }
        self.invalid += extra.len();
        let every = (self.records.len() / extra.len()).max(1);
        let mut out = Vec::with_capacity(self.records.len() + extra.len());
        let mut extra = extra.into_iter();
        for (i, r) in std::mem::take(&mut self.records).into_iter().enumerate() {
            out.push(r);
            if i % every == every - 1 {
                if let Some(x) = extra.next() {
                    out.push(x);
                }
            }
        }
        out.extend(extra);
        self.records = out;
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Produces the records at `rate` per second to `<prefix>.events` on a thread; joining it
    /// fails if a record could not be written.
    pub fn start(self, prefix: &str, rate: f64) -> std::thread::JoinHandle<()> {
        let topic = format!("{prefix}.events");
        let records = self.records;
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                use futures::StreamExt;
                let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", harness::bootstrap())
                    .set("enable.idempotence", "true")
                    .set("acks", "all")
                    .set("linger.ms", "5")
                    .set("message.max.bytes", "16000000")
                    .set("message.timeout.ms", "300000")
                    .create()
                    .expect("producer");
                let gap = Duration::from_secs_f64(1.0 / rate);
                let start = tokio::time::Instant::now();
                let mut pending = futures::stream::FuturesUnordered::new();
                for (n, rec) in records.into_iter().enumerate() {
                    tokio::time::sleep_until(start + gap * n as u32).await;
                    let producer = producer.clone();
                    let topic = topic.clone();
                    pending.push(async move {
                        let headers = rec.kafka_headers();
                        producer
                            .send(
                                rdkafka::producer::FutureRecord::to(&topic)
                                    .key(&rec.key)
                                    .payload(&rec.value)
                                    .headers(headers),
                                Duration::from_secs(300),
                            )
                            .await
                            .map(|_| ())
                            .map_err(|(e, _)| e)
                    });
                    while let std::task::Poll::Ready(Some(r)) = futures::poll!(pending.next()) {
                        r.expect("produce");
                    }
                }
                while let Some(r) = pending.next().await {
                    r.expect("produce");
                }
            });
        })
    }
}

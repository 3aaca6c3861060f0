//! Produce errors, classified in one place for every producer path, and the one way to write a
//! record and wait for Kafka's acknowledgement.
//!
//! Records are written by stage A (`<p>.dedupe`, `<p>.invalid`), stage B (transactional
//! `<p>.dispatch`), the dispatcher's and the tiers' hand-offs and dead letters, and replay. A
//! failure falls into one of three classes, and each class has one reaction everywhere:
//!
//! - [`ProduceErrorClass::Permanent`]: *this record* can never be written as it is (too large,
//!   rejected as invalid). Retrying cannot help and must not block what is behind it: the caller
//!   reroutes it (quarantine with `record_too_large`, dead letter) and moves on.
//! - [`ProduceErrorClass::Transient`]: the cluster cannot take records for a while (leader
//!   change, timeouts, network, throttling). The same record is retried with backoff.
//! - [`ProduceErrorClass::Fatal`]: this producer can write nothing any more (fenced, not
//!   authorised, topic deleted after startup, librdkafka's own fatal state). Only these stop a
//!   stage; the orchestrator restarts it.
//!
//! An error code we do not know is treated as transient: a stage that retries with a log line
//! and a metric is visible and recovers by itself, a stage that exits on it crash-loops.

use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode as C;

use crate::runtime::shutdown::Shutdown;

/// What a produce error means for the record and the stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProduceErrorClass {
    /// This record can never be written as it is: reroute it and move on.
    Permanent,
    /// Retry the same record later.
    Transient,
    /// Nothing can be written by this producer any more: stop the stage.
    Fatal,
}

impl ProduceErrorClass {
    pub const ALL: [ProduceErrorClass; 3] = [
        ProduceErrorClass::Permanent,
        ProduceErrorClass::Transient,
        ProduceErrorClass::Fatal,
    ];

    /// The `class` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ProduceErrorClass::Permanent => "permanent",
            ProduceErrorClass::Transient => "transient",
            ProduceErrorClass::Fatal => "fatal",
        }
    }
}

/// Classifies an error returned by `send`/`send_result` or by a delivery report.
pub fn classify(e: &KafkaError) -> ProduceErrorClass {
    match e {
        KafkaError::MessageProduction(code) => classify_code(*code),
        KafkaError::Transaction(t) if t.is_fatal() => ProduceErrorClass::Fatal,
        KafkaError::Transaction(t) => classify_code(t.code()),
        // The producer was dropped under the record: the stage is going away.
        KafkaError::Canceled => ProduceErrorClass::Fatal,
        _ => ProduceErrorClass::Transient,
    }
}

/// Classifies a librdkafka / broker error code of a produce.
pub fn classify_code(code: C) -> ProduceErrorClass {
    match code {
        // The record itself: too large for the producer or the topic, or refused as invalid.
        C::MessageSizeTooLarge
        | C::MessageBatchTooLarge
        | C::InvalidMessageSize
        | C::InvalidMessage
        | C::InvalidRecord
        | C::InvalidTimestamp
        | C::BadMessage
        | C::InvalidDifferentRecord => ProduceErrorClass::Permanent,
        // Nothing will ever be written: credentials, ACLs, fencing, a topic or partition gone
        // after startup (stages check their topics before they start), librdkafka's fatal state.
        C::Fatal
        | C::Fenced
        | C::ProducerFenced
        | C::InvalidProducerEpoch
        | C::TransactionalIdAuthorizationFailed
        | C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::Authentication
        | C::SaslAuthenticationFailed
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        | C::UnknownTopic
        | C::UnknownTopicOrPartition
        | C::UnknownPartition
        | C::InvalidTopic
        | C::InvalidRequiredAcks
        | C::UnsupportedVersion
        | C::UnsupportedForMessageFormat
        | C::UnsupportedCompressionType
        | C::InvalidArgument
        | C::NotImplemented
        | C::PolicyViolation => ProduceErrorClass::Fatal,
        // Queue full, timeouts, leader changes, network, not enough replicas, throttling, and
        // anything unknown.
        _ => ProduceErrorClass::Transient,
    }
}

/// True when the error says the record (or its batch) is too large: the caller re-reads the
/// topic limits and reroutes the record as `record_too_large`.
pub fn is_size_error(e: &KafkaError) -> bool {
    let code = match e {
        KafkaError::MessageProduction(code) => *code,
        KafkaError::Transaction(t) => t.code(),
        _ => return false,
    };
    matches!(
        code,
        C::MessageSizeTooLarge | C::MessageBatchTooLarge | C::InvalidMessageSize
    )
}

/// `hookline_<stage>_produce_errors_total{class}`: one family per stage, counted and logged by
/// one `emit` so logs and metrics never drift.
#[derive(Clone)]
pub struct ProduceErrors {
    counter: IntCounterVec,
}

impl ProduceErrors {
    /// Registers `hookline_<stage>_produce_errors_total` (`stage`: `deduper`, `dispatcher`, `retry`).
    pub fn register(registry: &Registry, stage: &str) -> prometheus::Result<Self> {
        let counter = IntCounterVec::new(
            Opts::new(
                format!("hookline_{stage}_produce_errors_total"),
                "Kafka produce errors by class (permanent: the record is rerouted; transient: \
                 retried; fatal: the stage stops)",
            ),
            &["class"],
        )?;
        registry.register(Box::new(counter.clone()))?;
        for class in ProduceErrorClass::ALL {
            counter.with_label_values(&[class.as_str()]);
        }
        Ok(ProduceErrors { counter })
    }

    /// A counter that is not registered anywhere (tools and tests).
    pub fn unregistered() -> Self {
        let counter = IntCounterVec::new(Opts::new("unregistered", "unregistered"), &["class"])
            .unwrap_or_else(|_| unreachable!("static metric options are valid"));
        ProduceErrors { counter }
    }

    pub fn emit(&self, topic: &str, class: ProduceErrorClass, error: &KafkaError) {
        match class {
            ProduceErrorClass::Transient => {
                tracing::warn!(topic, class = class.as_str(), error = %error, "produce failed, retrying")
            }
            _ => tracing::error!(topic, class = class.as_str(), error = %error, "produce failed"),
        }
        self.counter.with_label_values(&[class.as_str()]).inc();
    }
}

/// A record to produce, owned so that it can be sent again after a transient failure.
#[derive(Debug, Clone)]
pub struct OwnedRecord {
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: OwnedHeaders,
}

/// Fills one of rdkafka's two record builders (they share no trait) from an [`OwnedRecord`].
macro_rules! fill_record {
    ($owned:expr, $builder:expr) => {{
        let owned = $owned;
        let mut r = $builder.headers(owned.headers.clone());
        if let Some(p) = owned.partition {
            r = r.partition(p);
        }
        if let Some(k) = &owned.key {
            r = r.key(&k[..]);
        }
        if let Some(v) = &owned.value {
            r = r.payload(&v[..]);
        }
        r
    }};
}

impl OwnedRecord {
    /// Bytes this record counts against `message.max.bytes` (see [`crate::kafka::recordsize`]).
    pub fn size(&self) -> usize {
        crate::kafka::recordsize::record_bytes(
            self.key.as_ref().map_or(0, Vec::len),
            self.value.as_ref().map_or(0, Vec::len),
            crate::kafka::recordsize::headers_bytes(
                self.headers
                    .iter()
                    .map(|h| (h.key, h.value.map_or(0, <[u8]>::len))),
            ),
        )
    }

    /// The headers as (name, value) pairs, for building another record from this one.
    pub fn header_pairs(&self) -> Vec<(String, Option<Vec<u8>>)> {
        self.headers
            .iter()
            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
            .collect()
    }

    /// The record for a `BaseProducer` / `ThreadedProducer` (e.g. a transactional one).
    pub fn base_record(&self) -> rdkafka::producer::BaseRecord<'_, [u8], [u8]> {
        fill_record!(self, rdkafka::producer::BaseRecord::to(&self.topic))
    }

    fn future_record(&self) -> FutureRecord<'_, [u8], [u8]> {
        fill_record!(self, FutureRecord::to(&self.topic))
    }
}

/// Builds [`OwnedHeaders`] from (name, value) pairs.
pub fn owned_headers<'a>(
    pairs: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> OwnedHeaders {
    pairs
        .into_iter()
        .fold(OwnedHeaders::new(), |out, (key, value)| {
            out.insert(Header { key, value })
        })
}

/// Where an acknowledged record was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    pub partition: i32,
    pub offset: i64,
}

/// Why a record was not acknowledged.
#[derive(Debug)]
pub enum SendError {
    /// This record can never be written as it is; `size` tells whether it was too large.
    Permanent { error: KafkaError, size: bool },
    /// The stage must stop.
    Fatal(KafkaError),
    /// Shutdown was requested while a transient failure was being retried; the record was not
    /// written (its input offset must not be stored).
    Stopped,
    /// The write's claim is gone (its partition was revoked): nothing written, the new owner
    /// handles the input record.
    Revoked,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Permanent { error, .. } => write!(f, "record refused for good: {error}"),
            SendError::Fatal(e) => write!(f, "fatal produce error: {e}"),
            SendError::Stopped => write!(f, "shutdown while retrying a transient produce error"),
            SendError::Revoked => write!(f, "the partition was revoked before the write"),
        }
    }
}

impl std::error::Error for SendError {}

/// Backoff between retries of a transient failure: 100 ms doubling to 5 s.
fn backoff(tries: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << tries.min(6)).min(5_000))
}

/// The claim a write is made under. A stage whose work belongs to an assigned partition writes
/// through that partition's ownership gate (`crate::kafka::ownership::Claim`), so work the partition was
/// revoked from never writes; everything else writes [`Ungated`]. Every `Some` returned by
/// [`WriteGate::enqueue`] is followed by exactly one [`WriteGate::acked`].
pub trait WriteGate: Sync {
    /// Runs `send` (a non-blocking hand-over to the producer's queue) while the claim holds,
    /// counting the write as unacknowledged; `None`: the claim is gone, nothing was enqueued.
    fn enqueue(
        &self,
        send: &mut dyn FnMut() -> Result<DeliveryFuture, KafkaError>,
    ) -> Option<Result<DeliveryFuture, KafkaError>>;
    /// The write enqueued last was acknowledged, or failed.
    fn acked(&self);
}

/// No claim: the write always happens (stage A, stage B, replay).
pub struct Ungated;

impl WriteGate for Ungated {
    fn enqueue(
        &self,
        send: &mut dyn FnMut() -> Result<DeliveryFuture, KafkaError>,
    ) -> Option<Result<DeliveryFuture, KafkaError>> {
        Some(send())
    }
    fn acked(&self) {}
}

/// Hands a record to the producer's queue through `gate`, waiting while the queue is full
/// (back-pressure, not a failure). `None`: the gate refused (the claim is gone).
async fn enqueue_through(
    producer: &FutureProducer,
    record: &OwnedRecord,
    gate: &dyn WriteGate,
) -> Option<Result<DeliveryFuture, KafkaError>> {
    loop {
        let mut send = || {
            producer
                .send_result(record.future_record())
                .map_err(|(e, _)| e)
        };
        match gate.enqueue(&mut send)? {
            Err(KafkaError::MessageProduction(C::QueueFull)) => {
                gate.acked();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return Some(other),
        }
    }
}

/// Hands a record to the producer's queue, waiting while the queue is full (back-pressure,
/// not a failure). Returns the immediate error (e.g. larger than `message.max.bytes`) if any.
pub async fn enqueue(
    producer: &FutureProducer,
    record: &OwnedRecord,
) -> Result<DeliveryFuture, KafkaError> {
    enqueue_through(producer, record, &Ungated)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

/// Waits for a record enqueued with [`enqueue`] to be acknowledged. A transient failure is
/// logged, counted and retried (enqueued again) with backoff until it succeeds or shutdown is
/// requested; a permanent or fatal one is logged, counted and returned.
pub async fn await_acked(
    producer: &FutureProducer,
    record: &OwnedRecord,
    first: Result<DeliveryFuture, KafkaError>,
    errors: &ProduceErrors,
    shutdown: &Shutdown,
) -> Result<(), SendError> {
    await_acked_through(producer, record, first, errors, shutdown, &Ungated)
        .await
        .map(|_| ())
}

async fn await_acked_through(
    producer: &FutureProducer,
    record: &OwnedRecord,
    first: Result<DeliveryFuture, KafkaError>,
    errors: &ProduceErrors,
    shutdown: &Shutdown,
    gate: &dyn WriteGate,
) -> Result<Acked, SendError> {
    let mut attempt = first;
    let mut tries = 0u32;
    loop {
        let result = match attempt {
            Ok(delivery) => match delivery.await {
                Ok(Ok(d)) => Ok(Acked {
                    partition: d.partition,
                    offset: d.offset,
                }),
                Ok(Err((e, _))) => Err(e),
                Err(_) => Err(KafkaError::Canceled),
            },
            Err(e) => Err(e),
        };
        gate.acked();
        let error = match result {
            Ok(acked) => return Ok(acked),
            Err(error) => error,
        };
        let class = classify(&error);
        errors.emit(&record.topic, class, &error);
        match class {
            ProduceErrorClass::Permanent => {
                let size = is_size_error(&error);
                return Err(SendError::Permanent { error, size });
            }
            ProduceErrorClass::Fatal => return Err(SendError::Fatal(error)),
            ProduceErrorClass::Transient => {
                if shutdown.is_triggered() {
                    return Err(SendError::Stopped);
                }
                tokio::time::sleep(backoff(tries)).await;
                tries += 1;
                attempt = match enqueue_through(producer, record, gate).await {
                    Some(attempt) => attempt,
                    None => return Err(SendError::Revoked),
                };
            }
        }
    }
}

/// [`enqueue`] then [`await_acked`].
pub async fn send_acked(
    producer: &FutureProducer,
    record: &OwnedRecord,
    errors: &ProduceErrors,
    shutdown: &Shutdown,
) -> Result<(), SendError> {
    send_acked_through(producer, record, errors, shutdown, &Ungated)
        .await
        .map(|_| ())
}

/// [`send_acked`] under a claim: every enqueue, retries included, goes through `gate`;
/// [`SendError::Revoked`] once it refuses. Returns where the record was written.
pub async fn send_acked_through(
    producer: &FutureProducer,
    record: &OwnedRecord,
    errors: &ProduceErrors,
    shutdown: &Shutdown,
    gate: &dyn WriteGate,
) -> Result<Acked, SendError> {
    let Some(first) = enqueue_through(producer, record, gate).await else {
        return Err(SendError::Revoked);
    };
    await_acked_through(producer, record, first, errors, shutdown, gate).await
}

/// Waits until every record `client`'s producer has queued is acknowledged, up to `timeout`.
///
/// Call it before `commit_transaction`. rust-rdkafka's `flush`, which its `commit_transaction`
/// runs first, sleeps in whole 100 ms polls while any record is unacknowledged (its poll waits
/// out the full timeout even after the acks are in), so every commit with a record still in
/// `linger.ms` cost 100 ms and blocked stage B's thread. librdkafka's own flush waits on a
/// condition and returns at the last ack; the producer must serve its delivery reports on
/// another thread (a `ThreadedProducer`). Measured with `bench/examples/txn_latency.rs`: commit
/// p50 101 ms → 1.3 ms (docs/performance.md, run 4).
pub fn flush_acked<X: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<X>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `client` is a live handle for the call's duration, and librdkafka's
    // `rd_kafka_flush` is thread-safe (it only waits for the in-flight count to drop).
    let code = unsafe { rdkafka::bindings::rd_kafka_flush(client.native_ptr(), ms) };
    match C::from(code) {
        C::NoError => Ok(()),
        e => Err(KafkaError::Flush(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_at_fault_for_size_and_invalid_records() {
        for code in [
            C::MessageSizeTooLarge,
            C::MessageBatchTooLarge,
            C::InvalidRecord,
            C::InvalidMessage,
            C::InvalidTimestamp,
        ] {
            let e = KafkaError::MessageProduction(code);
            assert_eq!(classify(&e), ProduceErrorClass::Permanent, "{code:?}");
        }
        assert!(is_size_error(&KafkaError::MessageProduction(
            C::MessageSizeTooLarge
        )));
        assert!(is_size_error(&KafkaError::MessageProduction(
            C::MessageBatchTooLarge
        )));
        assert!(!is_size_error(&KafkaError::MessageProduction(
            C::InvalidRecord
        )));
    }

    #[test]
    fn availability_problems_are_transient() {
        for code in [
            C::QueueFull,
            C::MessageTimedOut,
            C::RequestTimedOut,
            C::NotLeaderForPartition,
            C::LeaderNotAvailable,
            C::NetworkException,
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::NotEnoughReplicas,
            C::NotEnoughReplicasAfterAppend,
            C::KafkaStorageError,
            C::ThrottlingQuotaExceeded,
            C::Unknown,
        ] {
            let e = KafkaError::MessageProduction(code);
            assert_eq!(classify(&e), ProduceErrorClass::Transient, "{code:?}");
            assert!(!is_size_error(&e));
        }
    }

    #[test]
    fn a_producer_that_can_write_nothing_more_is_fatal() {
        for code in [
            C::Fatal,
            C::ProducerFenced,
            C::InvalidProducerEpoch,
            C::TopicAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::TransactionalIdAuthorizationFailed,
            C::SaslAuthenticationFailed,
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
            C::UnknownPartition,
        ] {
            let e = KafkaError::MessageProduction(code);
            assert_eq!(classify(&e), ProduceErrorClass::Fatal, "{code:?}");
        }
        assert_eq!(classify(&KafkaError::Canceled), ProduceErrorClass::Fatal);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(10), Duration::from_secs(5));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(5));
    }
}

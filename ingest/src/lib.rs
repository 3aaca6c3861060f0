//! REST ingest: what `POST /v1/events` does once the caller is authenticated.
//!
//! - [`body`]: complete the body into an input envelope (server-assigned `id`, the token's
//!   `tenant`) and validate it with stage A's rules, naming the bad field.
//! - [`id`]: event ids — derived from (tenant, `Idempotency-Key`), or random.
//! - [`claims`]: whether a reused `Idempotency-Key` comes with the body it was first used with.
//!
//! [`Ingest::publish`] answers only once Kafka acknowledged the record (`acks=all`, idempotent
//! producer): accepted means it is on `<p>.events`. A record is one write, so nothing is ever
//! half-written; when Kafka does not acknowledge in time the answer is "unavailable, retry", and
//! a retry with the same `Idempotency-Key` cannot create a second event (see [`id`]).

pub mod body;
pub mod claims;
pub mod http;
pub mod id;

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hookline_common::config::Config;
use hookline_common::contract::envelope::Validator;
use hookline_common::contract::keyhash::{key_hash, partition_for};
use hookline_common::contract::topics::Topics;
use hookline_common::kafka::produce::{classify, ProduceErrorClass};
use hookline_common::kafka::producer_config;
use hookline_common::runtime::traces::{Kind, Span, TRACEPARENT};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::body::{BadBody, TenantField};
use crate::claims::{Claims, Verdict};

/// How long a publish waits for Kafka's acknowledgement before answering 503.
pub const PRODUCE_TIMEOUT: Duration = Duration::from_secs(5);
/// The `Retry-After` of a 503.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// One request to publish.
pub struct Publish<'a> {
    /// The tenant a tenant-scoped token is bound to; `None` for an admin token.
    pub tenant_scope: Option<&'a str>,
    /// The `Idempotency-Key` header, if any.
    pub idempotency_key: Option<&'a str>,
    /// The request's W3C `traceparent`, if any: the `POST /v1/events` span continues it.
    pub traceparent: Option<&'a str>,
    pub body: &'a [u8],
}

/// A published event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub id: String,
    pub tenant: Option<String>,
}

/// Why a publish was refused; each maps to one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// 400: the body or a header is wrong; `field` names it.
    BadRequest { field: String, message: String },
    /// 403: a tenant token publishing for another tenant.
    Forbidden { message: String },
    /// 413: over `input.max_payload_bytes`.
    TooLarge { message: String },
    /// 422: the `Idempotency-Key` was first used with another body.
    KeyReused { message: String },
    /// 503: Kafka did not acknowledge in time; retry after `retry_after` (with the same
    /// `Idempotency-Key`).
    Unavailable {
        message: String,
        retry_after: Duration,
    },
}

impl Rejected {
    pub fn status(&self) -> u16 {
        match self {
            Rejected::BadRequest { .. } => 400,
            Rejected::Forbidden { .. } => 403,
            Rejected::TooLarge { .. } => 413,
            Rejected::KeyReused { .. } => 422,
            Rejected::Unavailable { .. } => 503,
        }
    }

    /// The stable error code of the JSON error body.
    pub fn code(&self) -> &'static str {
        match self {
            Rejected::BadRequest { .. } => "invalid_field",
            Rejected::Forbidden { .. } => "forbidden",
            Rejected::TooLarge { .. } => "payload_too_large",
            Rejected::KeyReused { .. } => "idempotency_key_reused",
            Rejected::Unavailable { .. } => "kafka_unavailable",
        }
    }

    pub fn field(&self) -> Option<&str> {
        match self {
            Rejected::BadRequest { field, .. } => Some(field),
            _ => None,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Rejected::BadRequest { message, .. }
            | Rejected::Forbidden { message }
            | Rejected::TooLarge { message }
            | Rejected::KeyReused { message }
            | Rejected::Unavailable { message, .. } => message,
        }
    }

    fn outcome(&self) -> &'static str {
        match self {
            Rejected::BadRequest { .. } => "invalid",
            Rejected::Forbidden { .. } => "forbidden",
            Rejected::TooLarge { .. } => "too_large",
            Rejected::KeyReused { .. } => "key_reused",
            Rejected::Unavailable { .. } => "unavailable",
        }
    }
}

impl From<BadBody> for Rejected {
    fn from(b: BadBody) -> Rejected {
        if b.too_large {
            Rejected::TooLarge { message: b.message }
        } else {
            Rejected::BadRequest {
                field: b.field,
                message: b.message,
            }
        }
    }
}

/// The ingest of one process: a producer to `<p>.events` and stage A's validation rules.
pub struct Ingest {
    producer: FutureProducer,
    topic: String,
    validator: Validator,
    max_body: usize,
    window: Duration,
    claims: Claims,
    requests: IntCounterVec,
    produce_seconds: HistogramVec,
    /// `dedupe.direct`: events go to the partition their dedupe key hashes to among these
    /// (`topics.partitions`; the deduper refuses to start unless `<p>.events` has as many).
    place_by_key: Option<i32>,
}

impl Ingest {
    /// Connects and reads the window's idempotency claims (see [`claims`]); `claims_cap` bounds
    /// the keys held ([`claims::DEFAULT_CAP`]).
    pub async fn start(
        config: &Config,
        registry: &Registry,
        claims_cap: usize,
    ) -> anyhow::Result<Ingest> {
        let claims = Claims::start(config, claims_cap, registry).await?;
        let producer: FutureProducer = producer_config(config)
            .set(
                "message.timeout.ms",
                PRODUCE_TIMEOUT.as_millis().to_string(),
            )
            .create()
            .context("creating the ingest producer")?;
        let requests = IntCounterVec::new(
            Opts::new(
                "hookline_ingest_requests_total",
                "POST /v1/events requests by outcome (accepted, invalid, forbidden, too_large, unavailable)",
            ),
            &["outcome"],
        )?;
        let produce_seconds = HistogramVec::new(
            HistogramOpts::new(
                "hookline_ingest_produce_seconds",
                "Time from a valid request to Kafka's acknowledgement, by result",
            )
            .buckets(vec![
                0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["result"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(produce_seconds.clone()))?;
        Ok(Ingest {
            producer,
            topic: Topics::new(&config.topics.prefix).events(),
            validator: Validator::new(&config.input, &config.dedupe.keys),
            max_body: config.input.max_payload_bytes,
            window: config.dedupe.window,
            claims,
            requests,
            produce_seconds,
            place_by_key: config.dedupe.direct.then_some(config.topics.partitions),
        })
    }

    /// Completes, validates and writes one event; answers once Kafka acknowledged it.
    pub async fn publish(&self, request: Publish<'_>) -> Result<Accepted, Rejected> {
        // The event's trace starts here unless the caller's request had one (tracing on only).
        let mut span = Span::start("POST /v1/events", Kind::Server, request.traceparent, None);
        let trace = span.traceparent();
        let result = self.publish_inner(request, trace).await;
        match &result {
            Ok(a) => span.str("hookline.event.id", a.id.as_str()),
            Err(r) => span.error(r.outcome()),
        }
        let outcome = match &result {
            Ok(_) => "accepted",
            Err(r) => r.outcome(),
        };
        self.requests.with_label_values(&[outcome]).inc();
        result
    }

    async fn publish_inner(
        &self,
        request: Publish<'_>,
        trace: Option<String>,
    ) -> Result<Accepted, Rejected> {
        if request.body.len() > self.max_body {
            return Err(Rejected::TooLarge {
                message: format!(
                    "the body is {} bytes, the limit is {} (input.max_payload_bytes)",
                    request.body.len(),
                    self.max_body
                ),
            });
        }
        if let Some(key) = request.idempotency_key {
            id::check_key(key).map_err(|message| Rejected::BadRequest {
                field: "Idempotency-Key".into(),
                message,
            })?;
        }
        let shape = body::shape(request.body)?;
        let mut fields: Vec<(&str, String)> = Vec::new();
        let tenant = match (request.tenant_scope, &shape.tenant) {
            (Some(scope), TenantField::Absent) => {
                fields.push(("tenant", scope.to_string()));
                Some(scope.to_string())
            }
            (Some(scope), TenantField::Str(t)) if t == scope => Some(t.clone()),
            (Some(scope), _) => {
                return Err(Rejected::Forbidden {
                    message: format!(
                        "this token publishes for tenant `{scope}` only: leave `tenant` out or set it to `{scope}`"
                    ),
                })
            }
            (None, TenantField::Str(t)) => Some(t.clone()),
            // No tenant, or a bad one the validation below names.
            (None, _) => None,
        };
        if !shape.has_id {
            let id = match request.idempotency_key {
                Some(key) => id::from_key(tenant.as_deref(), key),
                None => id::random(),
            };
            fields.insert(0, ("id", id));
        }
        let spliced: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let envelope = body::splice(request.body, &spliced);
        let valid = body::validate(&self.validator, &envelope)?;
        if let Some(key) = request.idempotency_key {
            let fingerprint = claims::fingerprint(request.body);
            match self.claims.claim(tenant.as_deref(), key, fingerprint).await {
                Ok(Verdict::Same) => {}
                Ok(Verdict::Reused) => {
                    return Err(Rejected::KeyReused {
                        message: format!(
                            "the Idempotency-Key `{key}` was already used with a different body \
                             within the last {:?}; use a new key for a new event",
                            self.window
                        ),
                    })
                }
                Err(e) => {
                    return Err(Rejected::Unavailable {
                        message: format!("{e}; retry with the same Idempotency-Key"),
                        retry_after: RETRY_AFTER,
                    })
                }
            }
        }
        // Written even when the key was seen before: the first request may have died between
        // its claim and its event. The deduper lets one through.
        self.produce(&valid.id, &valid.dedupe_key, &envelope, trace.as_deref())
            .await?;
        Ok(Accepted {
            id: valid.id,
            tenant: valid.tenant,
        })
    }

    async fn produce(
        &self,
        id: &str,
        dedupe_key: &str,
        envelope: &[u8],
        trace: Option<&str>,
    ) -> Result<(), Rejected> {
        let started = Instant::now();
        let mut record = FutureRecord::to(&self.topic).key(id).payload(envelope);
        // The producer's context, as any producer sends it: the dedupe span continues it.
        if let Some(t) = trace {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: TRACEPARENT,
                value: Some(t.as_bytes()),
            }));
        }
        // On the partition the deduper owns the key by, so it skips a hop (`dedupe.direct`).
        if let Some(partitions) = self.place_by_key {
            record = record.partition(partition_for(key_hash(dedupe_key), partitions));
        }
        // A full local queue answers at once rather than queueing the request.
        let sent = self
            .producer
            .send(record, Timeout::After(Duration::ZERO))
            .await;
        let result = if sent.is_ok() { "acked" } else { "failed" };
        self.produce_seconds
            .with_label_values(&[result])
            .observe(started.elapsed().as_secs_f64());
        match sent {
            Ok(_) => Ok(()),
            Err((e, _)) => match classify(&e) {
                ProduceErrorClass::Permanent => Err(Rejected::TooLarge {
                    message: format!("Kafka refused the event as too large or invalid: {e}"),
                }),
                ProduceErrorClass::Transient | ProduceErrorClass::Fatal => {
                    tracing::warn!(topic = %self.topic, error = %e, "ingest: Kafka did not acknowledge an event");
                    Err(Rejected::Unavailable {
                        message: format!(
                            "Kafka did not acknowledge the event ({e}); retry with the same Idempotency-Key"
                        ),
                        retry_after: RETRY_AFTER,
                    })
                }
            },
        }
    }
}

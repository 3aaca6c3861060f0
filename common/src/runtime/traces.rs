//! Spans of a delivery's trace, through the OpenTelemetry API. The binary installs the SDK and
//! its OTLP exporter (`src/traces.rs`) when `traces.enabled`; until then [`enabled`] is false and
//! [`Span::start`] returns an inert span at the cost of one atomic load: no span, no header.
//!
//! A delivery is one trace. Its context travels as a W3C `traceparent` value:
//! - on the input record, header `traceparent`: the producer's span (or `POST /v1/events`'s);
//! - on hookline's own records, header `hookline-trace` ([`TRACE_HEADER`]): the span the next
//!   hop's span is a child of — the dedupe span on `<p>.dispatch`, the last attempt (or tier
//!   wait, dead letter, replay) on tier records, `<p>.throttle` and `<p>.dlq`;
//! - on every POST to an endpoint, header `traceparent`: the attempt's span.
//!
//! Spans are made with explicit parents and times, not `tracing` spans: a tier wait starts when
//! the record was handed off, long before the process that ends it read it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};

/// The header of hookline's own records carrying the parent of the next hop's span.
pub const TRACE_HEADER: &str = "hookline-trace";
/// The W3C header: on input records (the producer's context) and on POSTs to endpoints.
pub const TRACEPARENT: &str = "traceparent";

static ENABLED: AtomicBool = AtomicBool::new(false);
static TRACER: OnceLock<BoxedTracer> = OnceLock::new();
static PROPAGATE: AtomicBool = AtomicBool::new(true);

/// Called once by the binary after installing the global tracer provider.
pub fn enable(propagate: bool) {
    let _ = TRACER.set(opentelemetry::global::tracer("hookline"));
    PROPAGATE.store(propagate, Ordering::Relaxed);
    ENABLED.store(true, Ordering::Release);
}

/// Whether spans are made.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether POSTs to endpoints carry `traceparent` (`traces.propagate`).
pub fn propagate() -> bool {
    PROPAGATE.load(Ordering::Relaxed)
}

/// Parses a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`) into a remote span context.
pub fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let v = value.trim();
    let mut parts = v.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let cx = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags & 1),
        true,
        TraceState::default(),
    );
    cx.is_valid().then_some(cx)
}

/// The W3C `traceparent` of a span context.
pub fn traceparent(cx: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    )
}

/// Unix milliseconds as a `SystemTime`.
pub fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// One span, ended when dropped (or at a given time by [`Span::end_at`]); inert when tracing is
/// off.
pub struct Span {
    inner: Option<BoxedSpan>,
}

/// What kind of hop a span is (OpenTelemetry's span kinds).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// hookline's own work (dedupe, a tier wait, a dead letter, a replay).
    Internal,
    /// A POST to an endpoint.
    Client,
    /// A request hookline answers (`POST /v1/events`).
    Server,
    /// Consuming a record (the dedupe decision).
    Consumer,
}

impl Span {
    /// A span named `name`, child of the span `parent` names (a `traceparent` value; `None` or
    /// unparsable: a new trace), started at `start` (now if `None`).
    pub fn start(
        name: &'static str,
        kind: Kind,
        parent: Option<&str>,
        start: Option<SystemTime>,
    ) -> Span {
        if !enabled() {
            return Span { inner: None };
        }
        let Some(tracer) = TRACER.get() else {
            return Span { inner: None };
        };
        let parent_cx = match parent.and_then(parse_traceparent) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let mut builder = tracer.span_builder(name).with_kind(match kind {
            Kind::Internal => SpanKind::Internal,
            Kind::Client => SpanKind::Client,
            Kind::Server => SpanKind::Server,
            Kind::Consumer => SpanKind::Consumer,
        });
        if let Some(t) = start {
            builder = builder.with_start_time(t);
        }
        Span {
            inner: Some(builder.start_with_context(tracer, &parent_cx)),
        }
    }

    /// Whether this span does anything (tracing on).
    pub fn is_live(&self) -> bool {
        self.inner.is_some()
    }

    /// The `traceparent` naming this span, for the next hop; `None` when inert.
    pub fn traceparent(&self) -> Option<String> {
        self.inner
            .as_ref()
            .map(|s| s.span_context())
            .filter(|cx| cx.is_valid())
            .map(traceparent)
    }

    pub fn str(&mut self, key: &'static str, value: impl Into<String>) {
        if let Some(s) = &mut self.inner {
            s.set_attribute(KeyValue::new(key, value.into()));
        }
    }

    pub fn int(&mut self, key: &'static str, value: i64) {
        if let Some(s) = &mut self.inner {
            s.set_attribute(KeyValue::new(key, value));
        }
    }

    /// Marks the span failed with `description`.
    pub fn error(&mut self, description: impl Into<String>) {
        if let Some(s) = &mut self.inner {
            s.set_status(Status::error(description.into()));
        }
    }

    /// Ends the span at `end`.
    pub fn end_at(mut self, end: SystemTime) {
        if let Some(mut s) = self.inner.take() {
            s.end_with_timestamp(end);
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(mut s) = self.inner.take() {
            s.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_rejects_malformed_values() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = parse_traceparent(tp).expect("valid");
        assert!(cx.is_sampled() && cx.is_remote());
        assert_eq!(traceparent(&cx), tp);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn spans_are_inert_while_tracing_is_off() {
        let mut s = Span::start("x", Kind::Internal, None, None);
        s.str("k", "v");
        assert!(!s.is_live());
        assert_eq!(s.traceparent(), None);
    }
}

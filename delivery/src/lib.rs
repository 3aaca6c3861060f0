//! hookline delivery: the one path by which a delivery is attempted and handed on, shared by the
//! dispatcher (attempt 1), the retry tiers (attempts 2..) and replay. No stage crate imports
//! another; they all import this one.
//!
//! Module map:
//! - [`attempt`]: [`DeliveryPath::attempt`] — endpoint check, attempt (or deferral), next hop,
//!   hand-off write; the only place that does so.
//! - [`engine`]: one signed `POST` per attempt, bounded in time and response size, returning an
//!   [`AttemptOutcome`]; [`limits`]: per-endpoint concurrency caps and saturation;
//!   [`request`](crate::request): the webhook headers; `client`: the pooled HTTP client, body
//!   reads and error classes; `conn`: what a connection has carried, so a request lost on a
//!   pooled connection the endpoint had closed goes out again on a new one.
//! - [`signing`]: Standard Webhooks v1 signatures (and their verification for tests and the
//!   reference receiver); [`ssrf`]: blocked address ranges, the allow-list, the guarded resolver.
//! - [`outcome`]: what an attempt did ([`AttemptResult`], [`FailureClass`]) and its history entry.
//! - [`endpoints`]: the endpoint set behind a swappable handle ([`LiveEndpoints`]), fan-out, and
//!   whether a delivery's endpoint may still receive it.
//! - [`hop`]: next-hop decisions on the schedule (tier, DLQ, deferral), pure.
//! - [`write`]: writing a delivery record to its hop; a record that does not fit is trimmed,
//!   dead-lettered or quarantined as `record_too_large`, never a reason to stop.
//! - [`metrics`]: `hookline_delivery_*`, one family for every attempt, labelled by stage;
//!   [`observer`]: the per-attempt hook (no-op by default).

pub mod attempt;
mod client;
mod conn;
pub mod endpoints;
pub mod engine;
pub mod filter;
pub mod hop;
pub mod limits;
pub mod metrics;
pub mod observer;
pub mod outcome;
mod request;
pub mod signing;
pub mod ssrf;
pub mod write;

pub use attempt::{Delivery, DeliveryPath, Next, Origin, Report, Turn, Why};
pub use endpoints::{Endpoints, EndpointsUpdater, LiveEndpoints};
pub use engine::Engine;
pub use hop::Hop;
pub use metrics::AttemptMetrics;
pub use observer::{AttemptEvent, AttemptObserver, NoObserver};
pub use outcome::{Admission, AttemptOutcome, AttemptResult, FailureClass};
pub use write::{HopError, HopWriter, Written};

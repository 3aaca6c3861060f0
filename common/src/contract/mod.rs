//! The record contracts between the stages and with the outside: what each topic holds and how
//! its records are read and written.
//!
//! - [`envelope`]: the input event contract, validation, dedupe keys; [`keyhash`]: the stable
//!   128-bit hash of dedupe keys and the partition it picks.
//! - [`topics`]: topic names and the topic plan.
//! - [`headers`]: Kafka header names of the record contracts; [`event_headers`]: the envelope facts
//!   stage A writes on every forwarded record.
//! - [`delivery`]: the delivery record (`<p>.retry.<tier>`, `<p>.dlq`); [`quarantine`]: what goes
//!   to `<p>.invalid`; [`replays`]: the replay record on `<p>.replays`.
//! - [`secret`]: Standard Webhooks `whsec_` signing secrets.

pub mod delivery;
pub mod envelope;
pub mod event_headers;
pub mod headers;
pub mod keyhash;
pub mod quarantine;
pub mod replays;
pub mod secret;
pub mod topics;

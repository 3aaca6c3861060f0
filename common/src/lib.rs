//! Shared pieces of hookline, used by every stage.
//!
//! - [`config`]: the TOML + env configuration, validated once at startup; [`control_config`]:
//!   its `[control]` section (control plane).
//! - [`envelope`]: the input event contract, validation, dedupe keys.
//! - [`topics`]: topic names and the topic plan; [`kafka`]: client builders and `topics apply`.
//! - [`headers`]: Kafka header names of the record contracts; [`event_headers`]: the envelope
//!   facts stage A writes on every forwarded record.
//! - [`secret`]: Standard Webhooks `whsec_` secrets.
//! - [`glob`]: event-type globs.
//! - [`progress`]: out-of-order completion, contiguous offsets to store.
//! - [`ownership`]: per-partition assignment generations and the gate every hand-off or dead
//!   letter passes, so work of a revoked partition never writes.
//! - [`rebalance`]: the one way consumer stages handle rebalances (bounded revoke protocol,
//!   changes posted to the loop).
//! - [`ops`]: `/metrics`, `/healthz`, `/readyz`; [`telemetry`]: logging; [`shutdown`]: SIGTERM.
//! - [`table`]: aligned text tables for the command line.
//! - [`clock`]: the wall clock in unix ms / s (one helper for every stage).
//! - [`keyhash`]: the stable 128-bit hash of dedupe keys and the partition it picks.
//! - [`produce`]: produce errors classified (permanent / transient / fatal) and acknowledged
//!   sends; [`recordsize`]: record sizes and topic size limits; [`quarantine`]: the
//!   quarantine contract; [`replays`]: the replay record on `<p>.replays`.

pub mod admin_config;
pub mod clock;
pub mod closing;
pub mod config;
pub mod control_config;
pub mod delivery;
pub mod envelope;
pub mod event_headers;
pub mod glob;
pub mod headers;
pub mod kafka;
pub mod keyhash;
pub mod ops;
pub mod ownership;
pub mod produce;
pub mod progress;
pub mod quarantine;
pub mod rebalance;
pub mod recordsize;
pub mod replays;
pub mod secret;
pub mod shutdown;
pub mod table;
pub mod telemetry;
pub mod topics;

pub use config::Config;

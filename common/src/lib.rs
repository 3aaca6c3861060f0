//! Shared pieces of hookline, the ground floor of every crate, split by role:
//!
//! - [`config`]: the TOML + env configuration, validated once at startup (its `[admin]` and
//!   `[control]` sections in [`config::admin`] and [`config::control`], event-type globs in
//!   [`config::glob`]).
//! - [`contract`]: the record contracts — the input event and dedupe keys, topic names, header
//!   names, the delivery, quarantine and replay records, `whsec_` secrets.
//! - [`kafka`]: Kafka plumbing — client builders and `topics apply`, transient-error retries,
//!   produce errors and acknowledged sends, record sizes, rebalances, partition ownership,
//!   contiguous offsets, bounded closes.
//! - [`runtime`]: what every process runs besides its stages — the ops server and stage probes,
//!   shutdown, the wall clock, command-line tables.

pub mod config;
pub mod contract;
pub mod kafka;
pub mod runtime;

pub use config::Config;

//! hookline's control plane, with no database: the log is the source of truth.
//!
//! - [`registry`]: the live endpoint registry — every process tails the compacted
//!   `<p>.endpoints` into an [`endpoint::EndpointSet`] ([`record`] is the record contract);
//!   [`writer`]: transactional writes with optimistic concurrency across processes; [`ops`]: the
//!   operations (create, update, enable/disable, delete, rotate a secret, re-encrypt);
//!   [`seed`]: the config file's endpoints seeded as file-managed.
//! - [`crypto`]: endpoint secrets sealed at rest (XChaCha20-Poly1305, key from the environment).
//! - [`attempts`]: the delivery log `<p>.attempts` and its non-blocking batched writer;
//!   [`trace`]: an event's attempts read back (`hookline trace`).
//! - [`health`]: per-endpoint health from the delivery log (pure); [`tracker`]: tails the log
//!   and the DLQ, marks endpoints failing / recovered, auto-disables; [`operational`]: events
//!   on `<p>.operational`; [`relay`]: those and every dead letter turned into operational
//!   webhooks (`hookline.*` events).
//! - [`tail`]: reading topics by assignment (no group) with positions to wait on.
//! - [`plane`]: what a stage takes from all this — the registry fed into the delivery path's
//!   live endpoint set, and the delivery log as the path's attempt observer.
//! - [`cli`]: `hookline endpoints …` and `hookline trace`; [`table`]: aligned output.
//! - [`metrics`]: the `hookline_control_*` families.

pub mod activity;
pub mod attempts;
pub mod cli;
pub mod crypto;
pub mod endpoint;
pub mod health;
pub mod import;
pub mod metrics;
pub mod operational;
pub mod ops;
pub mod plane;
pub mod record;
pub mod registry;
pub mod relay;
pub mod seed;
pub mod set;
pub mod table;
pub mod tail;
pub mod trace;
pub mod tracker;
pub(crate) mod writer;

pub use crypto::Keyring;
pub use endpoint::{Endpoint, EndpointSet, HeaderEdit, SigningSecret};
pub use ops::{EndpointUpdate, WriteError};
pub use plane::Plane;
pub use registry::Registry;

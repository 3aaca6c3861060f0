//! hookline operator tools: what an operator runs against the dead-letter topic, apart from the
//! running services (the tier workers), so a running service and an operator command share no
//! files. The binary's `dead` and `replay` commands and the admin process's dead-letter routes and
//! dashboard pages use them.
//!
//! Module map:
//! - [`dead`]: reading the dead-letter topic, filters, `hookline dead list/show`.
//! - [`dead_page`]: one page of dead letters, newest first, by cursor (the admin API and
//!   dashboard), and dead letters per endpoint.
//! - [`replay`]: `hookline replay` and the admin's replays, through the shared delivery path,
//!   idempotent by replay key (`dlq:<partition>:<offset>`) recorded on the compacted
//!   `<p>.replays`.
//! - [`test_send`]: a signed `hookline.test` event to one endpoint, its outcome the answer
//!   (`POST /v1/endpoints/{id}/test`, `hookline endpoints test`).
//! - [`cli`]: the command-line arguments of `replay` and `dead`.
//! - `read`: reading a topic from given offsets up to the end it had when reading started.

pub mod cli;
pub mod dead;
pub mod dead_page;
mod read;
pub mod replay;
pub mod test_send;

//! What every `hookline` process runs besides its stages.
//!
//! - [`ops`]: `/metrics`, `/healthz`, `/readyz` and the stage probes behind them.
//! - [`shutdown`]: SIGTERM / SIGINT, observed by every stage.
//! - [`clock`]: the wall clock in unix ms / s (one helper for every stage).
//! - [`table`]: aligned text tables for the command line.
//! - [`traces`]: a delivery's spans and the trace context on records and requests.

pub mod clock;
pub mod ops;
pub mod shutdown;
pub mod table;
pub mod traces;

//! Integration tests against a real Kafka broker. One binary (fast to link), one module per
//! concern; every test uses its own topic prefix so they run in parallel.

mod dedupe;
mod demo;
mod deploy;
mod dispatcher;
mod hardening;
mod harness;
mod pipeline;
mod receiver;
mod retry;
mod topics;
mod validation;

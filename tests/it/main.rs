//! Integration tests against a real Kafka broker. One binary (fast to link), one module per
//! concern; every test uses its own topic prefix so they run in parallel.

mod dedupe;
mod demo;
mod dispatcher;
mod harness;
mod oversize;
mod pipeline;
mod receiver;
mod retry;
mod topics;
mod validation;

//! Integration tests against a real Kafka broker. One binary (fast to link), one module per
//! concern; every test uses its own topic prefix so they run in parallel.

mod admin;
mod bench;
mod browser;
mod connections;
mod control;
mod controls;
mod dedupe;
mod demo;
mod deploy;
mod dispatcher;
mod fleet;
mod hardening;
mod harness;
mod ingest;
mod isolation;
mod live;
mod operational;
mod outage;
mod oversize;
mod pipeline;
mod rebalance;
mod receiver;
mod resilience;
mod retry;
mod retry_guards;
mod scripts;
mod secured;
mod topics;
mod traces;
mod validation;

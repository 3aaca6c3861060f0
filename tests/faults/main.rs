//! Fault tests on a three-broker cluster (`make test-faults`, part of `make test`): hookline's
//! promise checked where a production cluster breaks it every week — brokers killed under load,
//! the transaction coordinator and partition leaders moving — with a ledger read back from the
//! topics and the receiver after each round.
//!
//! `scripts/test-faults.sh` starts the cluster (`deploy/local/kafka-cluster`: three KRaft nodes,
//! replication 3, `min.insync.replicas` 2) and runs this binary with `HOOKLINE_TEST_KAFKA` set to
//! its bootstrap list and `HOOKLINE_TEST_CLUSTER` to the script. `HOOKLINE_TEST_FAULT_ROUNDS`
//! rounds [1] (the long variant: 10); `HOOKLINE_TEST_FAULT_EVENTS` unique events per round
//! [2400] at `HOOKLINE_TEST_FAULT_RATE` per second [80]. Not part of `cargo test --workspace`
//! (`test = false`): without a cluster it fails loudly, it never skips.
//!
//! One module per scenario (docs/reliability.md has the table of them); `scenario`, `procs`,
//! `stream` and `ledger` are what they share.

#[allow(dead_code)]
#[path = "../it/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "../it/receiver.rs"]
mod receiver;

mod cluster;
mod ledger;
mod procs;
mod proxy;
mod scenario;
mod stream;

mod clock;
mod control_plane;
mod coordinator;
mod disk;
mod failover;
mod hostile;
mod network;
mod stages;

/// Fails the test unless the broker list answers and all three brokers of the cluster run.
fn require_cluster() {
    harness::require_kafka();
    cluster::require();
}

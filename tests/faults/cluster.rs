//! The three-broker cluster the fault tests break: `HOOKLINE_TEST_CLUSTER` is its control script
//! (`deploy/local/kafka-cluster`), whose node operations these wrap.

use std::process::Command;
use std::time::Instant;

fn script() -> String {
    std::env::var("HOOKLINE_TEST_CLUSTER").unwrap_or_else(|_| {
        panic!(
            "HOOKLINE_TEST_CLUSTER is not set: the fault tests need the three-broker cluster \
             (run them with `make test-faults`, which starts it)"
        )
    })
}

fn run(args: &[&str]) -> String {
    let out = Command::new(script())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} {args:?}: {e}", script()));
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\n{}\n{}",
        script(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails the test unless all three brokers run.
pub fn require() {
    run(&["status"]);
}

/// SIGKILL of node `n` (1..=3).
pub fn kill9(n: usize) {
    run(&["kill9", &n.to_string()]);
}

/// Starts node `n` and waits until it is ready; returns the seconds that took.
pub fn start_node(n: usize) -> f64 {
    let t = Instant::now();
    run(&["start-node", &n.to_string()]);
    t.elapsed().as_secs_f64()
}

/// The node coordinating transactional id `id`, if the cluster knows it.
pub fn txn_coordinator(id: &str) -> Option<usize> {
    let out = Command::new(script())
        .args(["coordinator", "txn", id])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// What node `n` is for the round, for the log: stage B's transaction coordinator, leader of
/// partition 0 of the dedupe or dispatch topic; " (…)" or "".
pub fn roles(n: usize, prefix: &str, txn_id: &str) -> String {
    let mut led = Vec::new();
    if txn_coordinator(txn_id) == Some(n) {
        led.push("stage B's transaction coordinator".to_owned());
    }
    for topic in [format!("{prefix}.dedupe"), format!("{prefix}.dispatch")] {
        let out = Command::new(script())
            .args(["leader", &topic, "0"])
            .output();
        if let Ok(out) = out {
            if String::from_utf8_lossy(&out.stdout).trim() == n.to_string() {
                led.push(format!("leader of {topic}[0]"));
            }
        }
    }
    if led.is_empty() {
        String::new()
    } else {
        format!(" ({})", led.join(", "))
    }
}

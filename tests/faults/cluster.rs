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

/// The fault proxies the cluster expects, one per node: (port a proxy listens on, the node's
/// PROXIED port it forwards to); see "Fault proxy" in the script's header.
pub fn proxy_map() -> Vec<(u16, u16)> {
    run(&["proxy-map"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let ports: Vec<u16> = l
                .split_whitespace()
                .map(|p| {
                    p.parse()
                        .unwrap_or_else(|e| panic!("proxy-map line {l:?}: {e}"))
                })
                .collect();
            assert_eq!(ports.len(), 2, "proxy-map line {l:?}: two ports");
            (ports[0], ports[1])
        })
        .collect()
}

/// The bootstrap servers through the fault proxies (127.0.0.1:29092,…).
pub fn proxy_bootstrap() -> String {
    run(&["proxy-bootstrap"]).trim().to_owned()
}

/// Whether node `n` runs.
pub fn running(n: usize) -> bool {
    Command::new(script())
        .args(["pid", &n.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Node `n`'s log dir (also its KRaft metadata log).
pub fn data_dir(n: usize) -> std::path::PathBuf {
    run(&["data-dir", &n.to_string()]).trim().into()
}

/// Puts node `n`'s log dir on a tmpfs of `size` (e.g. "600m"), restarting the node.
pub fn small_disk(n: usize, size: &str) {
    run(&["small-disk", &n.to_string(), size]);
}

/// The node leading partition `partition` of `topic`, if it has a leader.
pub fn leader(topic: &str, partition: i32) -> Option<usize> {
    let out = Command::new(script())
        .args(["leader", topic, &partition.to_string()])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Controlled shutdown (SIGTERM) of node `n`: its partitions' leadership moves first.
pub fn stop_node(n: usize) -> f64 {
    let t = Instant::now();
    run(&["stop-node", &n.to_string()]);
    t.elapsed().as_secs_f64()
}

//! Review fixes (issue 8, items 2, 4, 10, 11): Kubernetes service-link variables through the real
//! binary, dedupe keys namespaced by rule and tenant through the real deduper, a 2xx whose body
//! trickles past the timeout through the real dispatcher, and `min.insync.replicas` in the topic
//! plan against the real broker.

use std::process::Command;

use crate::harness::*;

/// What Kubernetes injects for Services `hookline` (port 9464 named `metrics`) and
/// `hookline-admin` (port 8080 named `http-api`) in the pod's namespace.
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("HOOKLINE_SERVICE_HOST", "10.0.0.11"),
    ("HOOKLINE_SERVICE_PORT", "9464"),
    ("HOOKLINE_SERVICE_PORT_METRICS", "9464"),
    ("HOOKLINE_PORT", "tcp://10.0.0.11:9464"),
    ("HOOKLINE_PORT_9464_TCP", "tcp://10.0.0.11:9464"),
    ("HOOKLINE_PORT_9464_TCP_PROTO", "tcp"),
    ("HOOKLINE_PORT_9464_TCP_PORT", "9464"),
    ("HOOKLINE_PORT_9464_TCP_ADDR", "10.0.0.11"),
    ("HOOKLINE_ADMIN_SERVICE_HOST", "10.0.0.12"),
    ("HOOKLINE_ADMIN_SERVICE_PORT", "8080"),
    ("HOOKLINE_ADMIN_SERVICE_PORT_HTTP_API", "8080"),
    ("HOOKLINE_ADMIN_PORT", "tcp://10.0.0.12:8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP", "tcp://10.0.0.12:8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_PROTO", "tcp"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_PORT", "8080"),
    ("HOOKLINE_ADMIN_PORT_8080_TCP_ADDR", "10.0.0.12"),
];

fn hookline(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run hookline")
}

/// Item 2: a pod in a namespace with `hookline…` Services starts (config check and a command
/// that initialises logging), naming the ignored variables once; a mistyped override still fails
/// with exit 2 naming the key it meant.
#[test]
fn kubernetes_service_links_do_not_stop_the_process() {
    let prefix = unique_prefix("k8s-env");
    let config = write_config(&prefix, "");
    let config = config.to_str().expect("utf-8 path");

    let check = hookline(&["config", "check", config], SERVICE_LINKS);
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(0), "config check: {stderr}");
    for (k, _) in SERVICE_LINKS {
        assert!(stderr.contains(k), "config check must name {k}: {stderr}");
    }

    // A command that starts logging like a stage does (and needs no broker).
    let describe = hookline(&["--config", config, "topics", "describe"], SERVICE_LINKS);
    let stderr = String::from_utf8_lossy(&describe.stderr);
    assert_eq!(describe.status.code(), Some(0), "topics describe: {stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("HOOKLINE_SERVICE_HOST"))
        .collect();
    assert_eq!(lines.len(), 1, "one log line naming them: {stderr}");
    for (k, _) in SERVICE_LINKS {
        assert!(lines[0].contains(k), "the log line must name {k}: {}", lines[0]);
    }

    let mut mistyped = SERVICE_LINKS.to_vec();
    mistyped.push(("HOOKLINE_KAFKA_BOOTSTRAP_SERVERS", "10.0.0.1:9092"));
    let bad = hookline(&["config", "check", config], &mistyped);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "a mistyped override fails: {stderr}");
    assert!(
        stderr.contains("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS"),
        "the error names the intended key: {stderr}"
    );
}

//! The project's test scripts say what they need before they spend minutes building: run on a
//! machine without the deploy tools, `scripts/test-containers.sh` names every missing tool and
//! the script that installs it, and builds nothing (issue 39, defect 3).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::unique_prefix;

#[test]
fn test_containers_names_every_missing_tool_and_its_installer_before_building() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // A tools directory with nothing in it: the deploy tools' venv and kustomize are missing,
    // as on a machine where only scripts/install-container-tools.sh ran.
    let tools = std::env::temp_dir().join(unique_prefix("no-deploy-tools"));
    std::fs::create_dir_all(&tools).expect("tools dir");
    let started = Instant::now();
    let out = Command::new("timeout")
        .args(["120", "bash", "scripts/test-containers.sh"])
        .current_dir(root)
        .env("HOOKLINE_TOOLS", &tools)
        .env_remove("HOOKLINE_TEST_PYTHON")
        .env_remove("HOOKLINE_TEST_KUSTOMIZE")
        .output()
        .expect("run scripts/test-containers.sh");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        took < Duration::from_secs(30),
        "said so after {took:?}, not at once: {all}"
    );
    for needed in [
        "a Python with PyYAML for the Kubernetes step",
        "kustomize for the Kubernetes step",
        "scripts/install-deploy-tools.sh",
    ] {
        assert!(all.contains(needed), "does not name {needed:?}: {all}");
    }
    assert!(
        !stdout.contains("--- base image") && !stdout.contains("--- hookline binary"),
        "began building before checking its tools: {stdout}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some("test-containers: 0 passed, 1 failed"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&tools);
}

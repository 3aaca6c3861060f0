#!/usr/bin/env bash
# The full test suite (`make test`): format check, clippy -D warnings, unit tests, integration
# tests against a real local Kafka broker, the static deploy checks (scripts/check-deploy.sh) and
# the container tests (scripts/test-containers.sh: image built, Compose stack run) and the fault
# tests on three brokers (scripts/test-faults.sh). Starts the broker if none answers on
# HOOKLINE_TEST_KAFKA (default 127.0.0.1:9092) and stops it afterwards if it started it.
set -euo pipefail
cd "$(dirname "$0")/.."

bootstrap=${HOOKLINE_TEST_KAFKA:-127.0.0.1:9092}
host=${bootstrap%:*}
port=${bootstrap##*:}
started=0

port_open() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }

data_dir=
cleanup() {
  if [[ $started == 1 ]]; then
    echo "--- stopping the Kafka broker this run started"
    KAFKA_PORT=$port KAFKA_DATA_DIR=$data_dir deploy/local/kafka stop || true
    rm -rf "$data_dir"
  fi
}
trap cleanup EXIT

# Free disk at each phase: a run that fills the disk says where (measured on a fresh clone with
# .ci/run's settings: target/ peaks at 1.8 GB, the images add ~0.1 GB, ~2 GB in all).
disk() { echo "--- disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free $1"; }

t0=$(date +%s)
disk "at the start"
if port_open; then
  echo "--- using the Kafka broker already listening on $bootstrap"
else
  if [[ $host != 127.0.0.1 && $host != localhost ]]; then
    echo "error: no Kafka at $bootstrap and it is not local; start it or unset HOOKLINE_TEST_KAFKA" >&2
    exit 1
  fi
  # A fresh data dir per run: no topics left over from earlier runs, removed afterwards.
  data_dir=$(mktemp -d "${TMPDIR:-/tmp}/hookline-test-kafka.XXXXXX")
  echo "--- starting a local Kafka broker on port $port (data in $data_dir)"
  KAFKA_PORT=$port KAFKA_CONTROLLER_PORT=$((port + 1)) KAFKA_DATA_DIR=$data_dir deploy/local/kafka start
  started=1
fi

if cargo fmt --version >/dev/null 2>&1; then
  echo "--- cargo fmt --check"
  cargo fmt --all -- --check
else
  echo "--- rustfmt is not installed on this toolchain: skipping the format check"
fi

if cargo clippy --version >/dev/null 2>&1; then
  echo "--- cargo clippy --all-targets -- -D warnings"
  cargo clippy --workspace --all-targets -- -D warnings
  # The container and fault tests are `test = false` (their scripts run them): lint them too.
  cargo clippy --test containers --test faults -- -D warnings
else
  echo "--- clippy is not installed on this toolchain: skipping lints"
fi

echo "--- cargo test (unit + integration against Kafka at $bootstrap)"
log=$(mktemp "${TMPDIR:-/tmp}/hookline-test.XXXXXX")
status=0
# --no-fail-fast: a failing test binary does not hide the results of the ones after it.
HOOKLINE_TEST_KAFKA=$bootstrap cargo test --workspace --all-targets --no-fail-fast -- \
  --test-threads="${HOOKLINE_TEST_THREADS:-3}" 2>&1 | tee "$log" || status=$?
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '^test result: .* ([0-9]+) failed' "$log" | grep -Eo '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')
rm -f "$log"
disk "after cargo test"

# Runs a sub-suite script whose last line is "<name>: N passed, M failed" and adds its counts; a
# script that ends without that line counts as one failure.
run_counted() {
  local name=$1 script=$2 sub_log counts
  sub_log=$(mktemp "${TMPDIR:-/tmp}/hookline-$name.XXXXXX")
  bash "$script" 2>&1 | tee "$sub_log" || status=$?
  counts=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed" "$sub_log" | tail -1 || true)
  rm -f "$sub_log"
  if [[ -z $counts ]]; then
    failed=$((failed + 1))
  else
    passed=$((passed + $(echo "$counts" | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+')))
    failed=$((failed + $(echo "$counts" | grep -Eo '[0-9]+ failed' | grep -Eo '[0-9]+')))
  fi
}

# Kubernetes manifests, compose file, alert rules, dashboard (needs the tools of
# scripts/install-deploy-tools.sh; a missing tool is a failure, never a skip).
echo "--- deploy checks (scripts/check-deploy.sh)"
run_counted check-deploy scripts/check-deploy.sh

# The image built and the Compose stack run for real (needs Docker: scripts/install-container-tools.sh).
# HOOKLINE_TEST_SKIP_CONTAINERS=1 leaves them out of a local run and says so; the suite then fails.
echo "--- container tests (scripts/test-containers.sh)"
if [[ ${HOOKLINE_TEST_SKIP_CONTAINERS:-0} == 1 ]]; then
  echo "--- HOOKLINE_TEST_SKIP_CONTAINERS=1: container tests NOT run; counted as one failure"
  failed=$((failed + 1))
else
  run_counted test-containers scripts/test-containers.sh
  disk "after the container tests"
fi

# Brokers killed under load on a three-broker cluster (one round; HOOKLINE_TEST_FAULT_ROUNDS=10 for
# the long variant): scripts/test-faults.sh starts and removes the cluster itself.
echo "--- fault tests on three brokers (scripts/test-faults.sh)"
run_counted test-faults scripts/test-faults.sh
disk "after the fault tests"

echo "--- test suite finished in $(( $(date +%s) - t0 ))s"
# The whole suite's count, on the last line.
echo "hookline: $passed passed, $failed failed"
if [[ $status != 0 || $failed != 0 || $passed == 0 ]]; then
  exit 1
fi

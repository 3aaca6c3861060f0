#!/usr/bin/env bash
# The fault tests (`make test-faults`, part of `make test`): starts a three-broker KRaft cluster
# (deploy/local/kafka-cluster, fresh data dir, replication 3, min ISR 2), runs tests/faults against
# it (one scenario per test: broker failover, stage kills and stops, a network cut, a full disk,
# clock jumps, the control plane's leader killed, hostile input; the ledger checked after each),
# then stops and deletes the cluster (its tmpfs log dir unmounted). The short variants run here;
# the long one: HOOKLINE_TEST_FAULT_ROUNDS=10 HOOKLINE_TEST_FAULT_STAGE_KILLS=20 (docs/reliability.md).
# Needs root for the full-disk test's tmpfs and Debian's faketime for librdkafka's clock-step probe (.ci/run
# installs it). Bounded by HOOKLINE_TEST_FAULT_TIMEOUT seconds [1500].
# Last line: "test-faults: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

t0=$(date +%s)
passed=0
failed=0
result() {
  echo "--- fault tests finished in $(($(date +%s) - t0))s"
  echo "test-faults: $passed passed, $failed failed"
}

export KAFKA_CLUSTER_DIR=${KAFKA_CLUSTER_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/hookline-faults-cluster.XXXXXX")}
cluster=deploy/local/kafka-cluster
cleanup() {
  echo "--- stopping the three-broker cluster"
  $cluster stop >/dev/null 2>&1 || true
  $cluster reset >/dev/null 2>&1 || true
  rm -rf "$KAFKA_CLUSTER_DIR"
}
trap cleanup EXIT

echo "--- starting a three-broker cluster (data in $KAFKA_CLUSTER_DIR)"
if ! $cluster start; then
  echo "error: the three-broker cluster did not start" >&2
  failed=1
  result
  exit 1
fi

echo "--- cargo test --test faults (${HOOKLINE_TEST_FAULT_ROUNDS:-1} round(s))"
log=$(mktemp)
status=0
HOOKLINE_TEST_KAFKA=$($cluster bootstrap) HOOKLINE_TEST_CLUSTER=$PWD/$cluster \
  timeout --signal=INT "${HOOKLINE_TEST_FAULT_TIMEOUT:-1500}" \
  cargo test --test faults -- --nocapture --test-threads=1 2>&1 | tee "$log" || status=$?
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '^test result: .* ([0-9]+) failed' "$log" | grep -Eo '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')
rm -f "$log"
if [[ $status != 0 ]] && ((failed == 0)); then
  failed=1
fi
result
[[ $status == 0 && $failed == 0 && $passed -gt 0 ]]

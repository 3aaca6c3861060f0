#!/usr/bin/env bash
# The container tests (`make test-containers`, part of `make test`): builds the image
# `hookline:local` from the host's binary (Dockerfile target `prebuilt`; the dev build unless
# HOOKLINE_IMAGE_PROFILE=release) and a Kafka image
# from the Maven jars, then runs tests/containers against the Compose stack: demo delivery, the
# dashboard, kill -9 / SIGTERM of the pipeline, down/up keeping the dead letters, the stages
# scaled with a replica killed, the Kubernetes pods started from the image.
# Needs a Docker engine, `docker compose` and mmdebstrap (scripts/install-container-tools.sh), and
# for its Kubernetes step the deploy tools' Python and kustomize (scripts/install-deploy-tools.sh):
# all checked first, each missing one named with its script. Bounded by
# HOOKLINE_TEST_CONTAINER_TIMEOUT seconds [900]. Leaves nothing running (compose down -v).
# Last line: "test-containers: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

t0=$(date +%s)
passed=0
failed=0
result() {
  echo "--- container tests finished in $(($(date +%s) - t0))s"
  echo "test-containers: $passed passed, $failed failed"
}
fail() {
  echo "error: $*" >&2
  failed=$((failed + 1))
  result
  exit 1
}

# Every tool the run needs, checked before anything is built: a missing one is named at once
# with the script that installs it, not minutes later at the step that needs it.
tools=${HOOKLINE_TOOLS:-$HOME/.cache/hookline/deploy-tools}
export HOOKLINE_TEST_PYTHON=${HOOKLINE_TEST_PYTHON:-$tools/venv/bin/python}
export HOOKLINE_TEST_KUSTOMIZE=${HOOKLINE_TEST_KUSTOMIZE:-$tools/bin/kustomize}
missing=()
need() { missing+=("$1 — run $2"); }
container_tools="scripts/install-container-tools.sh (as root)"
deploy_tools="scripts/install-deploy-tools.sh"
docker info >/dev/null 2>&1 || need "a Docker engine that answers (docker info)" "$container_tools"
docker compose version >/dev/null 2>&1 || need "docker compose" "$container_tools"
if ! docker image inspect debian:bookworm-slim >/dev/null 2>&1; then
  command -v mmdebstrap >/dev/null || need "mmdebstrap (to make the base image)" "$container_tools"
fi
"$HOOKLINE_TEST_PYTHON" -c 'import yaml' >/dev/null 2>&1 ||
  need "a Python with PyYAML for the Kubernetes step ($HOOKLINE_TEST_PYTHON; or set HOOKLINE_TEST_PYTHON)" "$deploy_tools"
[[ -x $HOOKLINE_TEST_KUSTOMIZE ]] || command -v "$HOOKLINE_TEST_KUSTOMIZE" >/dev/null 2>&1 ||
  need "kustomize for the Kubernetes step ($HOOKLINE_TEST_KUSTOMIZE; or set HOOKLINE_TEST_KUSTOMIZE)" "$deploy_tools"
if ((${#missing[@]})); then
  echo "error: the container tests need tools that are not installed; nothing was built:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  fail "install them (the scripts named above), then run again"
fi

echo "--- base image (deploy/docker/base-image)"
deploy/docker/base-image || fail "the base image could not be made"

# The dev build by default: `make test` has already compiled it, while a release compile costs
# ~4.5 minutes of the suite's 30 on 2 cores. HOOKLINE_IMAGE_PROFILE=release tests the release one.
profile=${HOOKLINE_IMAGE_PROFILE:-debug}
case $profile in
  debug) build=(cargo build --bin hookline) ;;
  release) build=(cargo build --release --bin hookline) ;;
  *) fail "HOOKLINE_IMAGE_PROFILE must be debug or release, not '$profile'" ;;
esac
echo "--- hookline binary (${build[*]})"
"${build[@]}" || fail "${build[*]} failed"

echo "--- image hookline:local (docker build --target prebuilt, target/$profile/hookline)"
b0=$(date +%s)
docker build -q --target prebuilt --build-arg PROFILE="$profile" -t hookline:local . ||
  fail "docker build of hookline:local failed"
echo "built hookline:local in $(($(date +%s) - b0))s: $(docker image inspect -f '{{.Size}}' hookline:local | awk '{printf "%.1f MB", $1/1e6}')"

echo "--- image hookline/kafka:4.1.1-maven (deploy/docker/kafka/build)"
deploy/docker/kafka/build || fail "the Kafka image could not be built"

export HOOKLINE_TEST_KAFKA=127.0.0.1:9094

compose=(docker compose -p hookline -f docker-compose.yml -f deploy/compose/kafka-maven.yml
  -f deploy/compose/stages.yml -f tests/containers/service-links.yml)
cleanup() {
  "${compose[@]}" --profile all-in-one down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "--- cargo test --test containers"
log=$(mktemp)
status=0
timeout --signal=INT "${HOOKLINE_TEST_CONTAINER_TIMEOUT:-900}" \
  cargo test --test containers -- --nocapture --test-threads=1 2>&1 | tee "$log" || status=$?
passed=$((passed + $(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')))
failed=$((failed + $(grep -Eo '^test result: .* ([0-9]+) failed' "$log" | grep -Eo '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')))
rm -f "$log"
# (On a failure the test prints the stack's last log lines itself, before it takes it down.)
if [[ $status != 0 ]]; then
  ((failed > 0)) || failed=1
fi
result
[[ $status == 0 && $failed == 0 && $passed -gt 0 ]]

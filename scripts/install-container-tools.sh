#!/usr/bin/env bash
# Installs and starts what `make test-containers` needs, idempotently, from the package
# registries (no container registry is needed):
#   docker.io, mmdebstrap   Debian packages (apt-get; needs root): the engine, and the tool that
#                           makes base images from Debian's packages (deploy/docker/base-image)
#   dockerd                 started in the background when no engine answers (root only)
#   docker compose v5       the Compose plugin, built from the Go module proxy
#                           (github.com/docker/compose/v5, pinned) into the CLI plugins directory
# Run by .ci/run; developers run it once as root (or install Docker + Compose their own way).
set -euo pipefail
COMPOSE_VERSION=v5.6.0
plugins=${DOCKER_CLI_PLUGINS:-/usr/local/lib/docker/cli-plugins}

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if ((${#missing[@]})); then
  [[ $(id -u) == 0 ]] || { echo "error: install ${missing[*]} (Debian packages; needs root)" >&2; exit 1; }
  echo "--- installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q "${missing[@]}"
fi

if ! docker info >/dev/null 2>&1; then
  [[ $(id -u) == 0 ]] || { echo "error: no Docker engine answers; start dockerd" >&2; exit 1; }
  log=${DOCKERD_LOG:-/var/log/hookline-dockerd.log}
  echo "--- starting dockerd (log: $log)"
  (setsid dockerd >"$log" 2>&1 </dev/null &)
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { tail -n 30 "$log" >&2; echo "error: dockerd did not answer in 60 s" >&2; exit 1; }
fi

if ! docker compose version 2>/dev/null | grep -q "${COMPOSE_VERSION}"; then
  echo "--- building docker compose $COMPOSE_VERSION from the Go module proxy (a few minutes)"
  export PATH="$PATH:/usr/local/go/bin"
  command -v go >/dev/null || { echo "error: go is needed to build docker compose" >&2; exit 1; }
  # Built inside the module's own source tree: its go.mod has exclude/replace directives that
  # `go install pkg@version` refuses.
  src=$(go mod download -json "github.com/docker/compose/v5@$COMPOSE_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  work=$(mktemp -d)
  trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  cp -r "$src" "$work/compose"
  chmod -R u+w "$work/compose"
  mkdir -p "$plugins"
  (cd "$work/compose" && go build -trimpath \
    -ldflags "-s -w -X github.com/docker/compose/v5/internal.Version=$COMPOSE_VERSION" \
    -o "$plugins/docker-compose" ./cmd)
fi
echo "--- container tools ready: $(docker version -f 'engine {{.Server.Version}}'), $(docker compose version)"

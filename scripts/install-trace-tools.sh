#!/usr/bin/env bash
# Installs the trace collector the traces test reads spans back from, idempotently:
#   jaeger   Jaeger v2 (an OpenTelemetry Collector distribution with in-memory storage and the
#            query API), built from the Go module proxy: module github.com/jaegertracing/jaeger
#            v1.75.0 (the module version of the Jaeger v2.x binary), ~5 min and ~1 GB of module
#            cache on a fresh 2-core machine; the binary is ~120 MB
# into $HOOKLINE_TOOLS (default ~/.cache/hookline/deploy-tools)/bin. Run by .ci/run.
set -euo pipefail
JAEGER_MODULE_VERSION=v1.75.0
tools=${HOOKLINE_TOOLS:-$HOME/.cache/hookline/deploy-tools}
mkdir -p "$tools/bin"
stamp=$tools/bin/.jaeger-version

if [[ -x $tools/bin/jaeger && -f $stamp && $(<"$stamp") == "$JAEGER_MODULE_VERSION" ]]; then
  echo "--- jaeger $JAEGER_MODULE_VERSION ready in $tools/bin"
  exit 0
fi
echo "--- building jaeger (module $JAEGER_MODULE_VERSION) from the Go module proxy"
export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "error: go is needed to build jaeger" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init hookline-trace-tools >/dev/null 2>&1
go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_MODULE_VERSION"
go build -o "$tools/bin/jaeger.tmp" github.com/jaegertracing/jaeger/cmd/jaeger
mv "$tools/bin/jaeger.tmp" "$tools/bin/jaeger"
echo "$JAEGER_MODULE_VERSION" >"$stamp"
echo "--- jaeger ready in $tools/bin"

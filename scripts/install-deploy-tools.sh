#!/usr/bin/env bash
# Installs the tools scripts/check-deploy.sh needs, idempotently, from the package registries:
#   kustomize            Go module proxy (go install), pinned
#   kubernetes-validate  PyPI (pip, in a virtualenv), pinned; its Kubernetes schemas ship inside
#   promtool             Debian's `prometheus` package (apt-get; needs root)
# into $HOOKLINE_TOOLS (default ~/.cache/hookline/deploy-tools). Run by .ci/run; developers run
# it once (as root for the apt part, or install `prometheus` themselves).
set -euo pipefail
KUSTOMIZE_VERSION=v5.7.1
KUBERNETES_VALIDATE_VERSION=1.37.0
tools=${HOOKLINE_TOOLS:-$HOME/.cache/hookline/deploy-tools}
mkdir -p "$tools/bin"

if [[ ! -x $tools/bin/kustomize ]] || ! "$tools/bin/kustomize" version 2>/dev/null | grep -qx "$KUSTOMIZE_VERSION"; then
  echo "--- installing kustomize $KUSTOMIZE_VERSION (go install)"
  export PATH="$PATH:/usr/local/go/bin"
  command -v go >/dev/null || { echo "error: go is needed to install kustomize" >&2; exit 1; }
  GOBIN=$tools/bin go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
fi

if ! "$tools/venv/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE_VERSION"; then
  echo "--- installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (pip)"
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi

if ! command -v promtool >/dev/null; then
  echo "--- installing promtool (Debian package prometheus)"
  if [[ $(id -u) != 0 ]]; then
    echo "error: promtool is missing; install Debian's prometheus package (apt-get install prometheus)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends prometheus
fi
echo "--- deploy tools ready in $tools (+ $(command -v promtool))"

#!/usr/bin/env bash
# Static checks of deploy/, docker-compose.yml and the monitoring files (scripts/check_deploy.py
# says what is checked). Part of `make test`. Needs kustomize, kubernetes-validate and promtool:
# scripts/install-deploy-tools.sh installs them (.ci/run does). A missing tool fails the run,
# naming it: these checks are never skipped silently.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${HOOKLINE_TOOLS:-$HOME/.cache/hookline/deploy-tools}
export PATH="$tools/bin:$tools/venv/bin:$PATH"

missing=()
for tool in kustomize kubernetes-validate promtool; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "error: the deploy checks need ${missing[*]}, which are not installed." >&2
  echo "       run scripts/install-deploy-tools.sh (as root for promtool), then again." >&2
  echo "check-deploy: 0 passed, 1 failed"
  exit 1
fi
python=$tools/venv/bin/python
[[ -x $python ]] || python=python3

hookline=${HOOKLINE_BIN:-target/debug/hookline}
cargo build --quiet --bin hookline
"$python" scripts/check_deploy.py --hookline "$hookline" --kustomize "$(command -v kustomize)" \
  --kubernetes-validate "$(command -v kubernetes-validate)" --promtool "$(command -v promtool)"

#!/usr/bin/env bash
# Offline checks of the Helm chart (charts/gantry): makes or reuses the venv .venv-helm with
# helm-python-sdk (Helm's Go SDK, no helm binary) and kubernetes-validate, then runs
# tests/helm/check_chart.py. RBAC is checked against `$GANTRY_BIN rbac` (default
# target/x86_64-unknown-linux-gnu/debug/gantry).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-helm
PACKAGES=(helm-python-sdk==0.2.2 kubernetes-validate==1.37.0)
if ! "$VENV/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
  echo "making $VENV (${PACKAGES[*]})"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PACKAGES[@]}"
fi
exec "$VENV/bin/python" tests/helm/check_chart.py "$@"

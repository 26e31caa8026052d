#!/usr/bin/env bash
# The test command: formatting, lints, unit tests, the gateway suite on SQLite+local and on
# PostgreSQL+S3, and the end-to-end checks with the real Python client against `gantry serve`
# (functions, files, and jobs executed by a Python that has the client installed), the web
# console in headless Chromium driven by Playwright against `gantry serve`, the same
# against `gantry gateway` + `gantry controller` with the Kubernetes doubles, a 2,000-job soak
# with injected faults through those two, the Helm chart's
# offline checks, the container images built and run with podman (installed if missing),
# container-image functions run by gantry serve through podman with the real client, and the
# same in Debian 11 and in an image holding only a Python (the launcher is static).
# Needs DATABASE_URL (a PostgreSQL superuser; default postgres://postgres@127.0.0.1:5432/test)
# and GANTRY_TEST_PYTHON (a Python with qiskit-serverless 0.37.0, playwright and pytest) and
# Debian's chromium; `.ci/run` provides them.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
PYTHON=${GANTRY_TEST_PYTHON:-.venv/bin/python}

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings denied)"
cargo clippy --all-targets --quiet -- -D warnings

step "cargo test (unit tests and gateway suite on both backends)"
cargo test --quiet 2>&1 | grep -v '^test .* ok$'

step "end to end: the real qiskit-serverless client against gantry serve"
cargo build --quiet --bin gantry
DATA=$(mktemp -d)
# Jobs of a root server run as nobody: they must pass through the data dir's parent.
chmod 711 "$DATA"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
target/x86_64-unknown-linux-gnu/debug/gantry admin --data-dir "$DATA/gantry" create-provider e2e >/dev/null
target/x86_64-unknown-linux-gnu/debug/gantry admin --data-dir "$DATA/gantry" add-admin --provider e2e --user e2e-erin >/dev/null
target/x86_64-unknown-linux-gnu/debug/gantry serve --listen "127.0.0.1:$PORT" --data-dir "$DATA/gantry" --python "$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" \
  >"$DATA/serve.log" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/readiness/" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$DATA/serve.log"; exit 1; }
  sleep 0.1
done
status=0
"$PYTHON" tests/e2e/client_foundation.py "http://127.0.0.1:$PORT" || status=1
"$PYTHON" tests/e2e/client_jobs.py "http://127.0.0.1:$PORT" || status=1
if [ "$status" != 0 ]; then
  echo "--- gantry serve log ---"; tail -n 200 "$DATA/serve.log"; exit 1
fi

step "web console in headless Chromium (Playwright)"
GANTRY_BIN=target/x86_64-unknown-linux-gnu/debug/gantry GANTRY_TEST_PYTHON="$PYTHON" tests/console/run.sh

step "end to end: the real client against gateway + controller (Kubernetes doubles), with runtime_platform, and stop cancelling runtime jobs"
GANTRY_TEST_PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" \
  cargo test --quiet --test gateway -- --ignored e2e_kubernetes the_real_client_authenticates the_real_client_stops 2>&1 | grep -v '^test .* ok$'

step "traces: a function using the OpenTelemetry SDK continues its job's trace"
GANTRY_TEST_PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" \
  cargo test --quiet --test gateway -- --ignored traces::the_functions_own_span 2>&1 | grep -v '^test .* ok$'

step "soak: 2,000 jobs through gateway + controller on the Kubernetes doubles, with pod faults, API errors and two controller restarts"
SOAK_JOBS=2000 SOAK_PROFILE=debug GANTRY_TEST_PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" bench/soak.sh

step "Helm chart: strict lint, rendering, Kubernetes schemas, RBAC = gantry rbac, values table"
GANTRY_BIN=target/x86_64-unknown-linux-gnu/debug/gantry tests/helm/run.sh

step "container images: build with podman and run (gantry, the runner with the real client)"
GANTRY_BIN=target/x86_64-unknown-linux-gnu/debug/gantry tests/images.sh

step "container-image functions on gantry serve: a provider image built from the runner image, run with podman by the real client"
GANTRY_BIN=target/x86_64-unknown-linux-gnu/debug/gantry GANTRY_TEST_PYTHON="$PYTHON" tests/image_jobs.sh

step "old images on gantry serve: the static launcher in Debian 11 (glibc 2.31) and in a root filesystem holding only a Python, by the real client"
GANTRY_BIN=target/x86_64-unknown-linux-gnu/debug/gantry GANTRY_TEST_PYTHON="$PYTHON" tests/old_images.sh

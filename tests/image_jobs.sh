#!/usr/bin/env bash
# Container-image functions on `gantry serve` (issue 28), with the real client and a real
# container engine: builds a provider image FROM the runner image tests/images.sh made (the same
# local Debian base, nothing pulled) with tests/e2e/functions/image/main.py as its /runner, and
# runs tests/e2e/client_images.py, which starts `gantry serve` with podman as its engine and
# drives the client: run, status, live and final logs, result,
# events, files, stop, timeout, a missing image, isolation, and a restart by kill -9 mid-job.
# Needs root, podman and runc (installed by tests/images.sh), and GANTRY_TEST_PYTHON (a Python
# with qiskit-serverless 0.37.0). Under CI=true nothing missing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${GANTRY_TEST_PYTHON:-.venv/bin/python}
BIN=${GANTRY_BIN:-target/x86_64-unknown-linux-gnu/debug/gantry}
RUNNER_IMAGE=localhost/gantry-runner:test
IMAGE=localhost/gantry-image-e2e:test
# The embedded default: plain `podman` (with runc installed beside it, and the job containers'
# own ulimits, it runs here; GANTRY_TEST_ENGINE tries another command).
ENGINE=${GANTRY_TEST_ENGINE:-podman}

missing() {
  if [ "${CI:-}" = true ]; then echo "FAIL image jobs: $*" >&2; exit 1; fi
  echo "SKIP: image jobs: $*"; exit 0
}
command -v podman >/dev/null || missing "podman is not installed (apt-get install podman runc)"
command -v runc >/dev/null || missing "runc is not installed (apt-get install runc)"
[ "$(id -u)" = 0 ] || missing "needs root (rootful podman)"
[ -x "$BIN" ] || { echo "no gantry binary at $BIN: build it first" >&2; exit 1; }
# shellcheck disable=SC2086  # ENGINE is a command and its flags
$ENGINE image exists "$RUNNER_IMAGE" || { echo "$RUNNER_IMAGE is missing: run tests/images.sh first" >&2; exit 1; }

T=$(mktemp -d /tmp/gantry-image-jobs.XXXXXX)
trap 'rm -rf "$T"' EXIT
cp tests/e2e/functions/image/main.py "$T/main.py"
cat >"$T/Containerfile" <<CONTAINERFILE
FROM $RUNNER_IMAGE
COPY main.py /runner/main.py
CONTAINERFILE
began=$SECONDS
# shellcheck disable=SC2086
$ENGINE build -q --pull=never -t "$IMAGE" -f "$T/Containerfile" "$T" >"$T/build.log" 2>&1 ||
  { cat "$T/build.log"; echo "podman build of $IMAGE failed" >&2; exit 1; }
echo "provider image $IMAGE built from $RUNNER_IMAGE in $((SECONDS - began)) s"
"$PYTHON" tests/e2e/client_images.py "$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")" "$IMAGE" "$ENGINE"

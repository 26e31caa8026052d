#!/usr/bin/env bash
# The web console in a real browser: starts `gantry serve` on a free port with a fresh data
# directory and a provider (`console`, administered by the user `console-erin`), then drives
# Debian's Chromium with Playwright (tests/console/test_console.py). Screenshots go to
# $GANTRY_TEST_OUT (default target/console-screenshots).
#
#   GANTRY_BIN           the gantry binary (default target/x86_64-unknown-linux-gnu/debug/gantry)
#   GANTRY_TEST_PYTHON   a Python with qiskit-serverless, playwright and pytest; jobs run with it
#   GANTRY_TEST_CHROMIUM the browser (default /usr/bin/chromium); never downloaded
#   GANTRY_CONSOLE_DIR   serve the console from this folder instead of the embedded copy
#   CI=true              a missing browser, playwright or pytest fails instead of skipping
# Extra arguments go to pytest (e.g. -k stop).
set -euo pipefail
cd "$(dirname "$0")/../.."
GANTRY_BIN=${GANTRY_BIN:-target/x86_64-unknown-linux-gnu/debug/gantry}
PYTHON=${GANTRY_TEST_PYTHON:-.venv/bin/python}
CHROMIUM=${GANTRY_TEST_CHROMIUM:-/usr/bin/chromium}
OUT=${GANTRY_TEST_OUT:-target/console-screenshots}
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

absolute() { (cd "$(dirname "$1")" && printf '%s/%s\n' "$(pwd)" "$(basename "$1")"); }

missing=""
[ -x "$CHROMIUM" ] || missing="$missing chromium ($CHROMIUM; apt-get install chromium)"
[ -x "$PYTHON" ] || missing="$missing python ($PYTHON)"
if [ -x "$PYTHON" ]; then
  "$PYTHON" -c 'import playwright.sync_api' 2>/dev/null || missing="$missing playwright (pip install playwright, with PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1)"
  "$PYTHON" -c 'import pytest' 2>/dev/null || missing="$missing pytest"
  "$PYTHON" -c 'import qiskit_serverless' 2>/dev/null || missing="$missing qiskit-serverless"
fi
if [ -n "$missing" ]; then
  if [ "${CI:-}" = true ]; then
    echo "console tests: missing:$missing" >&2
    exit 1
  fi
  echo "console tests SKIPPED, missing:$missing (with CI=true this fails)"
  exit 0
fi
[ -x "$GANTRY_BIN" ] || { echo "console tests: no gantry binary at $GANTRY_BIN (cargo build)" >&2; exit 1; }
GANTRY_BIN=$(absolute "$GANTRY_BIN")
PYTHON=$(absolute "$PYTHON")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

DATA=$(mktemp -d)
# Jobs of a root server run as nobody: they must pass through the data dir's parent.
chmod 711 "$DATA"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$GANTRY_BIN" admin --data-dir "$DATA/gantry" create-provider console >/dev/null
"$GANTRY_BIN" admin --data-dir "$DATA/gantry" add-admin --provider console --user console-erin >/dev/null
"$GANTRY_BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA/gantry" --python "$PYTHON" >"$DATA/serve.log" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/readiness/" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$DATA/serve.log"; exit 1; }
  sleep 0.1
done

status=0
# GANTRY_BIN and GANTRY_TEST_PYTHON: tests that stop and start a gateway of their own;
# GANTRY_TEST_DATA_DIR: tests that set budgets with `gantry admin` on the gateway under test.
GANTRY_CONSOLE_URL="http://127.0.0.1:$PORT" GANTRY_TEST_DATA_DIR="$DATA/gantry" GANTRY_TEST_OUT="$OUT" GANTRY_TEST_CHROMIUM="$CHROMIUM" \
  GANTRY_TEST_PROVIDER=console GANTRY_TEST_PROVIDER_ADMIN=console-erin GANTRY_BIN="$GANTRY_BIN" GANTRY_TEST_PYTHON="$PYTHON" \
  "$PYTHON" -m pytest -q -p no:cacheprovider tests/console/ "$@" || status=$?
if [ "$status" != 0 ]; then
  echo "--- gantry serve log (last 100 lines) ---"
  tail -n 100 "$DATA/serve.log"
  exit "$status"
fi
echo "console screenshots: $OUT"

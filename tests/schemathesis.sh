#!/usr/bin/env bash
# Property-based checks of the published OpenAPI document against the server it describes:
# starts `gantry serve` (embedded SQLite and local storage in a temporary folder) and runs
# schemathesis on its /swagger.json as the user alice. Not part of tests/run.sh; see
# docs/testing.md for what it reports and which findings are expected.
#
#   tests/schemathesis.sh                       # after `cargo build`
#   GANTRY_BIN=target/x86_64-unknown-linux-gnu/release/gantry ST_MAX_EXAMPLES=100 tests/schemathesis.sh --phases fuzzing
#
# Extra arguments go to `st run`. `ignored_auth` is left out: with the default mock_token
# mechanism every token is a valid user, so "invalid credentials accepted" is the design.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${GANTRY_BIN:-$root/target/x86_64-unknown-linux-gnu/debug/gantry}
venv=${ST_VENV:-/var/tmp/st-venv}
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'schemathesis>=4.32,<5'
fi
data=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" --data-dir "$data" >"$data/serve.log" 2>&1 &
server=$!
cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  if grep -q panicked "$data/serve.log"; then
    echo "gantry serve panicked:" >&2
    grep -A3 panicked "$data/serve.log" >&2
  fi
  rm -rf "$data"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$port/readiness/" >/dev/null && break
  sleep 0.1
done
"$venv/bin/st" run "http://127.0.0.1:$port/swagger.json" \
  -H 'Authorization: Bearer alice' \
  --seed "${ST_SEED:-1}" --max-examples "${ST_MAX_EXAMPLES:-30}" \
  --exclude-checks ignored_auth --no-color "$@"

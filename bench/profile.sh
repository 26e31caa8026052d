#!/usr/bin/env bash
# Where a request's CPU goes: runs `gantry serve` on a fresh PostgreSQL database, drives one
# request with wrk (16 connections) and records the server with `perf record -e cpu-clock -g`,
# then prints the share of samples in the kernel and in gantry, and the top symbols.
# Not a test; needs perf (Debian's linux-perf), wrk, psql.
#
# usage: bench/profile.sh [PATH]     (default /api/v1/programs/)
# env:   DATABASE_URL (PostgreSQL superuser, default postgres://postgres@127.0.0.1:5432/test),
#        GANTRY_BIN (a binary to profile instead of this checkout's release build), SECONDS_=10
set -euo pipefail
cd "$(dirname "$0")/.."
REQUEST=${1:-/api/v1/programs/}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
for tool in perf wrk psql curl; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 2; }
done
if [ -n "${GANTRY_BIN:-}" ]; then GANTRY=$(realpath "$GANTRY_BIN"); else
  cargo build --release --quiet --bin gantry; GANTRY=$PWD/target/x86_64-unknown-linux-gnu/release/gantry; fi
WORK=$(mktemp -d)
NAME="gantry_profile_$$"
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $NAME WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
psql "$DATABASE_URL" -qc "CREATE DATABASE $NAME"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$GANTRY" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" --runner none \
  --database-url "${DATABASE_URL%/*}/$NAME" >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 200); do curl -fsS "http://127.0.0.1:$PORT/readiness/" >/dev/null 2>&1 && break; sleep 0.05; done
printf 'print("bench")\n' >"$WORK/main.py" && tar -C "$WORK" -cf "$WORK/fn.tar" main.py
curl -fsS -H "Authorization: Bearer bench" -F title=bench-fn -F entrypoint=main.py -F "artifact=@$WORK/fn.tar" \
  "http://127.0.0.1:$PORT/api/v1/programs/upload/" >/dev/null
wrk -t2 -c16 -d3s -H "Authorization: Bearer bench" "http://127.0.0.1:$PORT$REQUEST" >/dev/null
wrk -t2 -c16 -d"${SECONDS_:-10}s" -H "Authorization: Bearer bench" "http://127.0.0.1:$PORT$REQUEST" >"$WORK/wrk.txt" &
WRK=$!
perf record -q -e cpu-clock -g -p "$SERVER" -o "$WORK/perf.data" -- sleep "$(( ${SECONDS_:-10} - 1 ))" 2>/dev/null
wait "$WRK"
echo "## $REQUEST ($(grep 'Requests/sec' "$WORK/wrk.txt" | awk '{print $2}') req/s)"
echo
echo "Samples by where they ran:"
perf report -i "$WORK/perf.data" --no-children --sort dso --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -6
echo
echo "Top symbols:"
perf report -i "$WORK/perf.data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null | grep -E '^ +[0-9]' | sed -E 's/ +/ /g; s/ - - *$//' | cut -c1-110 | head -15

#!/usr/bin/env bash
# Job API benchmark on SQLite and PostgreSQL, with the standard 100,000-job seed of
# ../shared/bench/README.md, driven by the shared load.sh (wrk, 16 connections):
#   a  GET /api/v1/jobs/{id}/            b  GET /api/v1/jobs/?limit=10
#   c  GET /api/v1/jobs/?limit=10&status=SUCCEEDED&created_after=...
#   d  GET /api/v1/programs/             e  POST /api/v1/programs/run/ (16 concurrent clients)
#   f  10 MiB file upload and download, one stream (local storage, and S3 storage through
#      examples/s3_server.rs unless FILES_S3=0)
#   t  POST /api/v1/jobs/{id}/stop/ of a different QUEUED job each request: the terminal move
#      QUEUED -> STOPPED (with its usage record since issue 47); not in the default LOAD_TESTS.
#      Before it, T_RATE x (WARMUP + DURATION) queued jobs of the bench user are added (SQL, then
#      `gantry admin recount`), so every request stops a job still queued (tests after t see them)
# plus, per backend, the time from `run` to the first output line of the job's python, measured
# with the local runner on a fresh database. Prints markdown tables. Not a test: figures vary by machine.
#
# usage: bench/jobs.sh            (both backends)   BACKENDS=sqlite bench/jobs.sh
# env:   DATABASE_URL (PostgreSQL superuser, default postgres://postgres@127.0.0.1:5432/test),
#        LOAD_SH (default ../shared/bench/load.sh), DURATION/WARMUP/CONNS for load.sh,
#        LOAD_TESTS (default "a b c d e f"; t on request), T_RATE (6000: the stops a second t's
#        queued jobs allow for; a run that asks more warns), STARTS=20 (0: no run-to-start measure), GANTRY_BIN (a binary to measure instead),
#        PG_SOCKET=1 (the server reaches PostgreSQL over its Unix socket, not TCP)
# Beside req/s and p99, each test prints its cost per request: the gateway's CPU, PostgreSQL's
# CPU (all its processes) and PostgreSQL's transactions (pg_stat_database), over the warm-up and
# the run. Needs procps (pgrep).
set -euo pipefail
cd "$(dirname "$0")/.."
BACKENDS=${BACKENDS:-"sqlite postgres"}
STARTS=${STARTS:-20}
# shellcheck source=bench/common.sh
. bench/common.sh

# measure_starts PORT: run → first output line of the job's python, STARTS sequential runs.
measure_starts() {
  upload_function "$1" first-line 'import time; print(f"FIRST {time.time():.6f}", flush=True)' >/dev/null
  python3 - "$1" "$TOKEN" "$STARTS" <<'PY'
import json, sys, time, urllib.request
port, token, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = f"http://127.0.0.1:{port}/api/v1"
def call(method, path, body=None):
    request = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"null")
delays = []
for _ in range(count):
    sent = time.time()
    job = call("POST", "/programs/run/", {"title": "first-line", "arguments": "{}", "config": {}})
    while call("GET", f"/jobs/{job['id']}/?with_result=false")["status"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
        time.sleep(0.02)
    logs = call("GET", f"/jobs/{job['id']}/logs/")["logs"]
    first = float(logs.split("FIRST ")[1].split()[0])
    delays.append((first - sent) * 1000)
delays.sort()
print()
print(f"run → first output line of the job (local runner, python3, {count} sequential runs)")
print()
print("| runs | p50 ms | max ms |")
print("|---:|---:|---:|")
print(f"| {count} | {delays[len(delays) // 2]:.0f} | {delays[-1]:.0f} |")
PY
}


# queued_jobs COUNT: adds COUNT queued jobs of the bench user and function (ids be0c0001-...-<i
# in 12 hex digits>, created over the last COUNT ms), counts the kept counts again, and prints
# their ids, oldest first. On the server's database: $data/gantry.db or $pg_bench_url.
queued_jobs() {
  local count=$1 now
  now=$(date +%s%6N)
  if [ -n "$pg_bench_url" ]; then
    psql "$pg_bench_url" -qv ON_ERROR_STOP=1 <<SQL
INSERT INTO jobs (id, program_id, author_id, status, created, updated, last_activity)
SELECT 'be0c0001-0000-0000-0000-' || lpad(to_hex(i), 12, '0'), '$program',
       (SELECT id FROM users WHERE username = '$TOKEN'), 'QUEUED', c.created, c.created, c.created
FROM generate_series(0, $count - 1) AS i
CROSS JOIN LATERAL (SELECT $now::bigint - ($count - i)::bigint * 1000 AS created) c;
SQL
    "$GANTRY" admin --database-url "$pg_bench_url" recount >/dev/null
    psql "$pg_bench_url" -qc "ANALYZE jobs"
  else
    python3 - "$data/gantry.db" "$program" "$TOKEN" "$count" "$now" <<'PY'
import sqlite3, sys
path, program, user, count, now = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
db = sqlite3.connect(path, timeout=60)
author = db.execute("SELECT id FROM users WHERE username = ?", (user,)).fetchone()[0]
rows = [(f"be0c0001-0000-0000-0000-{i:012x}", program, author, now - (count - i) * 1000) for i in range(count)]
db.executemany("INSERT INTO jobs (id, program_id, author_id, status, created, updated, last_activity) VALUES (?, ?, ?, 'QUEUED', ?4, ?4, ?4)", rows)
db.commit()
PY
    "$GANTRY" admin --data-dir "$data" recount >/dev/null
  fi
  local i
  for ((i = 0; i < count; i++)); do printf 'be0c0001-0000-0000-0000-%012x\n' "$i"; done
}

# stop_test PORT OUT IDS: test t, as load.sh runs its tests (a probe request, a warm-up, the
# measured run; the same WRKRESULT lines and table row): each request stops the next queued job
# of IDS (the first one is the probe's; the warm-up and the run each have their own part of the
# rest, T_RATE a second of their duration; wrk's threads take every other id). A run that uses
# up its part stops jobs again (already stopped, a cheaper answer): it says so.
stop_test() {
  local port=$1 out=$2 ids=$3 warmup=${WARMUP:-5} duration=${DURATION:-20} conns=${CONNS:-16} threads=${THREADS:-2}
  local rate=${T_RATE:-6000} probe code
  probe=$(sed -n 1p "$ids")
  sed -n "2,$((1 + rate * warmup))p" "$ids" >"$out/t.warmup.ids"
  sed -n "$((2 + rate * warmup)),\$p" "$ids" >"$out/t.run.ids"
  code=$(curl -s -o "$out/t.probe" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    --data-binary '{}' "http://127.0.0.1:$port/api/v1/jobs/$probe/stop/")
  [ "$code" = 200 ] || echo "warning: test t: probe request returned HTTP $code: $(head -c 300 "$out/t.probe")" >&2
  local part
  for part in warmup run; do
    {
      echo 'wrk.method = "POST"'
      echo "wrk.headers[\"Authorization\"] = \"Bearer $TOKEN\""
      echo 'wrk.headers["Accept"] = "application/json"'
      echo 'wrk.headers["Content-Type"] = "application/json"'
      echo 'wrk.body = "{}"'
      echo "local path, threads = \"$out/t.$part.ids\", $threads"
      cat <<'LUA'
local all, made = {}, 0
setup = function(thread)
  made = made + 1
  thread:set("first", made - 1)
  table.insert(all, thread)
end
init = function(args)
  ids = {}
  for line in io.lines(path) do ids[#ids + 1] = line end
  n, repeats = first, 0
end
request = function()
  if n >= #ids then repeats = repeats + 1 end
  local id = ids[n % #ids + 1]
  n = n + threads
  return wrk.format(nil, "/api/v1/jobs/" .. id .. "/stop/")
end
done = function(summary, latency, requests)
  local e, again = summary.errors, 0
  for _, thread in ipairs(all) do again = again + thread:get("repeats") end
  io.write(string.format("WRKRESULT %d %d %d %d %d %d %d %d %d %d\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
  io.write(string.format("REPEATED %d\n", again))
end
LUA
    } >"$out/t.$part.lua"
  done
  wrk -t"$threads" -c"$conns" -d"${warmup}s" --timeout 30s -s "$out/t.warmup.lua" "http://127.0.0.1:$port/" >"$out/t.warmup.txt" 2>&1 || true
  wrk -t"$threads" -c"$conns" -d"${duration}s" --timeout 30s -s "$out/t.run.lua" "http://127.0.0.1:$port/" >"$out/t.txt" 2>&1 || true
  local again
  again=$(cat "$out/t.warmup.txt" "$out/t.txt" | awk '/^REPEATED/ {n += $2} END {print n + 0}')
  [ "$again" = 0 ] || echo "warning: test t: $again requests stopped a job already stopped (raise T_RATE)" >&2
  awk '/^WRKRESULT/ {
      printf "| t | POST /api/v1/jobs/{id}/stop/ (a queued job) | %.1f | %.2f | %.2f | %.1f | %d | %d | %d | - |\n",
        $2 / ($3 / 1e6), $9 / 1000, $10 / 1000, $11 / 1000, $2, $7, $4 + $5 + $6 + $8
    }' "$out/t.txt"
}

# measure_load PORT BACKEND [PG_DATABASE]: runs load.sh one test at a time and prints, beside
# its figures, what each request cost: the gateway's CPU, PostgreSQL's CPU (all its processes)
# and PostgreSQL transactions, per request (warm-up and probe requests included in the count,
# as they are in the CPU time).
measure_load() {
  local port=$1 backend=$2 database=${3:-} test out rows="" files="" hz
  hz=$(getconf CLK_TCK)
  # Whether the backends' counts have been reported since the last request (the wait after the
  # previous test): the checkpoint's own session reports when it ends, so no second wait is due.
  local settled=0
  for test in ${LOAD_TESTS:-a b c d e f}; do
    out=$(mktemp -d -p "$WORK")
    local g0 p0=0 x0=0 g1 p1=0 x1=0
    if [ "$test" = t ]; then
      queued_jobs "$(( ${T_RATE:-6000} * (${WARMUP:-5} + ${DURATION:-20}) + 1 ))" >"$out/t.ids"
      settled=0
    fi
    # A checkpoint first: one falling inside a test (and the full-page images written after
    # it) would add its cost to that test alone.
    if [ -n "$database" ]; then
      psql "$DATABASE_URL" -qc CHECKPOINT
      [ "$settled" = 1 ] || sleep 11
      # shellcheck disable=SC2046 # one argument per process
      p0=$(cpu_ticks $(pg_pids)); x0=$(pg_xacts "$database")
    fi
    g0=$(cpu_ticks "$SERVER")
    if [ "$test" = t ]; then
      stop_test "$port" "$out" "$out/t.ids" >"$out/table.md"
    else
      SERVER_PID=$SERVER OUT_DIR=$out TESTS=$test bash "$LOAD_SH" "http://127.0.0.1:$port" "$TOKEN" \
        be0c0000-0000-0000-0000-00000000c350 bench-fn >"$out/table.md"
    fi
    g1=$(cpu_ticks "$SERVER")
    # shellcheck disable=SC2046 # one argument per process
    if [ -n "$database" ]; then sleep 11; p1=$(cpu_ticks $(pg_pids)); x1=$(pg_xacts "$database"); settled=1; fi
    if [ "$test" = f ]; then
      files+=$(grep '^| f |' "$out/table.md")$'\n'
      continue
    fi
    local row requests
    row=$(grep "^| $test |" "$out/table.md" || echo "| $test | load.sh failed | | | | | | | | |")
    # Requests: the probe, the warm-up and the measured run.
    requests=$(cat "$out/$test.warmup.txt" "$out/$test.txt" 2>/dev/null | awk '/^WRKRESULT/ {n += $2} END {print n + 1}')
    rows+=$(awk -v row="$row" -v n="$requests" -v hz="$hz" -v g="$((g1 - g0))" -v p="$((p1 - p0))" -v x="$((x1 - x0))" -v pg="$database" 'BEGIN {
      split(row, f, "|")
      us = 1e6 / hz / n
      if (pg == "") printf "|%s|%s|%s|%s| %.0f | - | - |\n", f[2], f[3], f[4], f[6], g * us
      else printf "|%s|%s|%s|%s| %.0f | %.0f | %.2f |\n", f[2], f[3], f[4], f[6], g * us, p * us, x / n
    }')$'\n'
  done
  echo
  echo "Per request: CPU of the gateway and of PostgreSQL (µs, warm-up included), PostgreSQL transactions ($backend)"
  echo
  echo "| test | request | req/s | p99 ms | gantry CPU µs | PostgreSQL CPU µs | PG transactions |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  printf '%s' "$rows"
  if [ -n "$files" ]; then
    echo
    echo "| test | transfer | median MiB/s | range MiB/s | median ms | reps | peak RSS MiB |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    printf '%s' "$files"
  fi
}

# The jobs' interpreter itself, not a wrapper such as a pyenv shim (which alone costs ~100 ms);
# run as root, one that nobody (the jobs' user) can run: a pyenv under /root may not be.
JOB_PYTHON=$(python3 -c 'import sys; print(sys.executable)')
if [ "$(id -u)" = 0 ] && ! (cd / && runuser -u nobody -- "$JOB_PYTHON" -c '') >/dev/null 2>&1; then
  JOB_PYTHON=/usr/bin/python3
fi

for backend in $BACKENDS; do
  echo
  echo "## $backend"
  data=$WORK/$backend
  port=$(free_port)
  flags=(--runner none --active-jobs-per-user 100000000)
  pg_bench_url=""
  if [ "$backend" = postgres ]; then
    name="gantry_bench_$$"
    PG_DB=$name
    psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name"
    pg_bench_url="${DATABASE_URL%/*}/$name"
    if [ -n "${PG_SOCKET:-}" ]; then
      # The server reaches PostgreSQL over its Unix socket (the seed and the counters still use
      # DATABASE_URL).
      read -r socket_dir socket_port socket_user < <(psql "$DATABASE_URL" -qtAF ' ' -c \
        "SELECT split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_user")
      pg_bench_url="postgres:///$name?host=$socket_dir&port=$socket_port&user=$socket_user"
    fi
    flags+=(--database-url "$pg_bench_url")
  fi
  start_server "$data" "$port" "${flags[@]}"
  program=$(upload_function "$port" bench-fn 'print("bench")')
  if [ "$backend" = postgres ]; then seed_postgres "$pg_bench_url" "$program"; else seed_sqlite "$data/gantry.db" "$program"; fi
  measure_load "$port" "$backend" "$([ "$backend" = postgres ] && echo "$name")"
  stop_server
  if [ "$STARTS" = 0 ]; then
    if [ -n "$pg_bench_url" ]; then drop_db; fi
    continue
  fi
  # Run-to-start on a fresh database, with the local runner.
  starts_flags=(--python "$JOB_PYTHON")
  if [ -n "$pg_bench_url" ]; then
    psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" -c "CREATE DATABASE $name"
    starts_flags+=(--database-url "$pg_bench_url")
  fi
  starts_port=$(free_port)
  start_server "$data-starts" "$starts_port" "${starts_flags[@]}"
  measure_starts "$starts_port"
  stop_server
  if [ -n "$pg_bench_url" ]; then drop_db; fi
done

# Files through S3 storage (FILES_S3=0 skips it): s3s-fs, the S3 protocol server the gateway
# suite runs in-process, as a program of its own (examples/s3_server.rs), on loopback; SQLite.
if [ "${FILES_S3:-1}" = 1 ]; then
  cargo build --release --quiet --example s3_server
  mkdir -p "$WORK/s3/gantry"
  s3_port=$(free_port)
  "$ROOT/target/x86_64-unknown-linux-gnu/release/examples/s3_server" "$WORK/s3" "127.0.0.1:$s3_port" bench-key bench-secret-key >"$WORK/s3.log" 2>&1 &
  S3_SERVER=$!
  for _ in $(seq 1 100); do grep -q "listening" "$WORK/s3.log" && break; sleep 0.05; done
  port=$(free_port)
  AWS_ACCESS_KEY_ID=bench-key AWS_SECRET_ACCESS_KEY=bench-secret-key start_server "$WORK/s3-gantry" "$port" \
    --runner none --storage s3://gantry/bench --s3-endpoint "http://127.0.0.1:$s3_port" --s3-path-style
  upload_function "$port" bench-fn 'print("bench")' >/dev/null
  echo
  echo "## files on S3 storage (s3s-fs on loopback, SQLite)"
  echo
  echo "| test | transfer | median MiB/s | range MiB/s | median ms | reps | peak RSS MiB |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  SERVER_PID=$SERVER TESTS=f bash "$LOAD_SH" "http://127.0.0.1:$port" "$TOKEN" be0c0000-0000-0000-0000-00000000c350 bench-fn |
    grep '^| f |'
  stop_server
  kill "$S3_SERVER" 2>/dev/null || true
  S3_SERVER=""
fi

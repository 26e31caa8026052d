#!/usr/bin/env bash
# The scale benchmark (issue 32): how the cost of each request grows with the history. Seeds, on
# PostgreSQL with COPY, the same shape at two sizes (bench/scale_seed.py):
#   base   100,000 jobs over   1,000 users and    100 functions of  10 providers
#   scale  10,000,000 jobs over 100,000 users and 10,000 functions of 100 providers
# (a Zipf law gives users their jobs: the heaviest holds ~8 % of them; statuses as the standard
# seed; created over the two years up to yesterday; each job a size S-XL with its allocation, a
# wait and a run time, and a usage record for each finished job that ended in the ledger's
# USAGE_DAYS, summed into usage_by_day by `gantry admin recount`), then drives `gantry serve`
# (release build, no runner) with wrk and prints, per request and size, req/s, p99 and what each
# request cost: the gateway's CPU, PostgreSQL's CPU (all its processes) and PostgreSQL
# transactions, as bench/jobs.sh does. Requests, all as the heaviest user (`user1`) unless said:
#   a  GET jobs/{id}/                b  GET jobs/?limit=10 (the console's first page too)
#   c  GET jobs/?limit=10&status=SUCCEEDED&created_after=<mid-history>   c1  the same, 1 connection
#   d  GET programs/                 e  POST programs/run/ (user1's own function)
#   p  GET jobs/provider/?provider=<the heaviest provider>&limit=10 (one of its admins)
#   g  GET programs/{the heaviest function}/get_jobs/ (one of its provider's admins: 1,000 jobs)
#   l  GET files/list/?function=<user1's function>
#   q  GET jobs/queue/?limit=0 (the console's jobs page asks it with every page)
#   w  GET jobs/queue/?limit=100 (the console's queue page: the places of user1's oldest 100)
#   x  the same as the author of the newest queued job (its places sum the whole queue's hours)
#   o  GET jobs/?limit=10&offset=<the middle>   k  GET jobs/?limit=10&cursor=<the middle>
#   u  GET usage/?from=<a year ago>&to=<yesterday>&group_by=function (issue 47's usage totals)
#   u1 u, one connection             u2 the same period with group_by=day
#   up the same period, group_by=user&provider=<the heaviest provider> (one of its admins)
# Each row also gives serve's peak RSS during that test (VmHWM, reset before it).
# Then EXPLAIN (ANALYZE, BUFFERS) of the listings' statements on both sizes, the time the
# migrations take on the 10M database when they add an index (CREATE INDEX CONCURRENTLY), and
# retention: `gantry admin gc` deleting about GC_JOBS finished jobs of the 10M database (10,000
# of them with objects) while wrk drives `run`, with run's p99 per 20 s window before and during.
#
# usage: bench/scale.sh        (hold /tmp/gantry-bench.lock; needs ~25 GB free disk, wrk, psql)
# env:   DATABASE_URL (PostgreSQL superuser; default postgres://postgres@127.0.0.1:5432/test),
#        SIZES ("base scale"), SCALE_JOBS (10000000), GC_JOBS (1000000; 0 skips retention),
#        DURATION (10) WARMUP (3) CONNS (16) for wrk, TESTS ("a b c c1 d e p g l q w x o k u u1 u2 up"),
#        USAGE_DAYS (400: the usage records seeded, and the server's GANTRY_RETAIN_USAGE_DAYS),
#        GANTRY_BIN (a binary to measure), KEEP_DB=1 (keep the databases), REUSE_DB=1 (measure
#        on databases a KEEP_DB run seeded, with the same OUT), OUT (where the raw
#        outputs go; default a temporary folder, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
SIZES=${SIZES:-"base scale"}
SCALE_JOBS=${SCALE_JOBS:-10000000}
GC_JOBS=${GC_JOBS:-1000000}
USAGE_DAYS=${USAGE_DAYS:-400}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-3}
CONNS=${CONNS:-16}
TESTS=${TESTS-"a b c c1 d e p g l q w x o k u u1 u2 up"}
for tool in wrk curl python3 psql pgrep; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 2; }
done
if [ -n "${GANTRY_BIN:-}" ]; then
  GANTRY=$(realpath "$GANTRY_BIN")
else
  cargo build --release --quiet --bin gantry
  GANTRY=$ROOT/target/x86_64-unknown-linux-gnu/release/gantry
fi
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
chmod 711 "$OUT"
SERVER=""
WRK_LOOP=""
stop_server() { if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; fi; }
cleanup() {
  stop_server
  if [ -n "$WRK_LOOP" ]; then kill "$WRK_LOOP" 2>/dev/null || true; fi
  if [ -z "${KEEP_DB:-}" ]; then
    for size in base scale; do psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS gantry_$size WITH (FORCE)" 2>/dev/null || true; done
    rm -rf "$OUT"/*/objects
  fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
url_of() { echo "${DATABASE_URL%/*}/gantry_$1"; }
now_s() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now_s)" 'BEGIN {printf "%.1f", b - a}'; }

# shape SIZE -> "JOBS USERS FUNCTIONS PROVIDERS"
shape() {
  case $1 in
    base) echo "100000 1000 100 10" ;;
    scale) echo "$SCALE_JOBS $((SCALE_JOBS / 100)) $((SCALE_JOBS / 1000)) 100" ;;
  esac
}
# The seed's history ends at the start of today (UTC), so retention's cutoff is easy to place.
END_MICROS=$(( $(date -u -d "$(date -u +%F)" +%s) * 1000000 ))

start_server() { # DATA PORT URL
  GANTRY_RETAIN_USAGE_DAYS=$USAGE_DAYS "$GANTRY" serve --listen "127.0.0.1:$2" --data-dir "$1" --database-url "$3" --runner none \
    --active-jobs-per-user 100000000 >>"$1.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 600); do
    curl -fsS "http://127.0.0.1:$2/readiness/" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "gantry did not start:" >&2; tail -20 "$1.log" >&2; exit 1
}

# seed SIZE URL: COPY the users, providers, functions and jobs; the jobs' indexes are dropped
# before their COPY and built again after it (as the migrations define them), and their
# foreign-key triggers are off during it (the rows are consistent by construction); then the
# kept counts are counted and everything is vacuumed and analyzed.
seed() {
  local size=$1 url=$2 t0 t
  read -r jobs users functions providers < <(shape "$size")
  local gen="python3 $ROOT/bench/scale_seed.py"
  t0=$(now_s)
  $gen users "$jobs" "$users" "$functions" "$providers" "$END_MICROS" |
    psql "$url" -qc "COPY users (id, username, created) FROM STDIN"
  $gen providers "$jobs" "$users" "$functions" "$providers" "$END_MICROS" |
    psql "$url" -qc "COPY providers (id, name, created) FROM STDIN"
  $gen programs "$jobs" "$users" "$functions" "$providers" "$END_MICROS" |
    psql "$url" -qc "COPY programs (id, title, provider_id, author_id, entrypoint, artifact_key, created, updated) FROM STDIN"
  psql "$url" -qtAc "SELECT indexdef || ';' FROM pg_indexes WHERE tablename = 'jobs' AND indexname <> 'jobs_pkey'" >"$OUT/$size.jobs-indexes.sql"
  psql "$url" -qtAc "SELECT 'DROP INDEX ' || indexname || ';' FROM pg_indexes WHERE tablename = 'jobs' AND indexname <> 'jobs_pkey'" |
    psql "$url" -q
  psql "$url" -qc "ALTER TABLE jobs DISABLE TRIGGER ALL"
  t=$(now_s)
  $gen jobs "$jobs" "$users" "$functions" "$providers" "$END_MICROS" |
    psql "$url" -qc "COPY jobs (id, program_id, provider_id, author_id, status, result, created, updated, last_activity, function_size, running_since, compute_profile, allocated_cpu_millis, allocated_memory_mib, allocated_gpus) FROM STDIN"
  echo "- $size: COPY of $jobs jobs $(elapsed "$t") s" >>"$OUT/seed.md"
  psql "$url" -qc "ALTER TABLE jobs ENABLE TRIGGER ALL"
  t=$(now_s)
  { echo "SET maintenance_work_mem = '1GB';"; cat "$OUT/$size.jobs-indexes.sql"; } | psql "$url" -qv ON_ERROR_STOP=1
  echo "- $size: the jobs' $(wc -l <"$OUT/$size.jobs-indexes.sql") indexes built again $(elapsed "$t") s" >>"$OUT/seed.md"
  t=$(now_s)
  seed_usage "$url"
  echo "- $size: $(psql "$url" -qtAc "SELECT COUNT(*) FROM job_usage") usage records $(elapsed "$t") s" >>"$OUT/seed.md"
  t=$(now_s)
  # The kept counts, and the usage totals per day (usage_by_day) from the records.
  "$GANTRY" admin --database-url "$url" recount >/dev/null
  psql "$url" -qc "VACUUM ANALYZE"
  echo "- $size: kept counts, VACUUM ANALYZE $(elapsed "$t") s; the whole seed $(elapsed "$t0") s; database $(psql "$url" -qtAc "SELECT pg_size_pretty(pg_database_size(current_database()))")" >>"$OUT/seed.md"
}

# seed_usage URL: the usage record of every finished job (issue 47) that ended in the last
# USAGE_DAYS days (what the ledger's retention keeps: a server deletes older records, 10,000 a
# statement, when it starts and hourly), made from the job's columns the seed wrote
# (running_since, its end in updated, its allocation) with the arithmetic of
# domain::usage::Figures: wait = created to RUNNING (or to its end when it never ran), run =
# RUNNING to its end, cores, GiB and GPUs x run. The record's indexes are dropped meanwhile and
# built again after it, as the jobs' are. `gantry admin recount` then sums them into usage_by_day.
seed_usage() {
  psql "$1" -qtAc "SELECT indexdef || ';' FROM pg_indexes WHERE tablename = 'job_usage' AND indexname <> 'job_usage_pkey'" >"$OUT/usage-indexes.sql"
  psql "$1" -qtAc "SELECT 'DROP INDEX ' || indexname || ';' FROM pg_indexes WHERE tablename = 'job_usage' AND indexname <> 'job_usage_pkey'" |
    psql "$1" -q
  psql "$1" -qv ON_ERROR_STOP=1 -v since="$((END_MICROS - USAGE_DAYS * 86400000000))" <<'SQL'
SET maintenance_work_mem = '1GB';
INSERT INTO job_usage (job_id, author_id, program_id, provider_id, trial, instance, function_size, compute_profile,
  status, created, ended, wait_ms, run_ms, attempts, cpu_millis, memory_mib, gpus, gpu_model, cpu_core_ms, gib_ms, gpu_ms)
SELECT id, author_id, COALESCE(program_id, ''), provider_id, trial, instance, function_size, compute_profile,
  status, created, updated, (COALESCE(running_since, updated) - created) / 1000, r.run_ms, infrastructure_retries + 1,
  allocated_cpu_millis, allocated_memory_mib, allocated_gpus, allocated_gpu_model,
  r.run_ms * COALESCE(allocated_cpu_millis, 0) / 1000, r.run_ms * COALESCE(allocated_memory_mib, 0) / 1024,
  r.run_ms * COALESCE(allocated_gpus, 0)
FROM jobs CROSS JOIN LATERAL (SELECT COALESCE((updated - running_since) / 1000, 0) AS run_ms) r
WHERE status IN ('SUCCEEDED', 'FAILED', 'STOPPED') AND updated >= :since;
SQL
  { echo "SET maintenance_work_mem = '1GB';"; cat "$OUT/usage-indexes.sql"; } | psql "$1" -qv ON_ERROR_STOP=1
}

# Objects for the first N finished jobs (what retention deletes with their rows): an arguments
# file, a result and a log each, in the server's local storage.
seed_objects() { # DATA URL N
  psql "$2" -qtAc "SELECT id FROM jobs WHERE status IN ('SUCCEEDED', 'FAILED', 'STOPPED') ORDER BY updated LIMIT $3" |
    python3 -c '
import os, sys
root = os.path.join(sys.argv[1], "objects", "jobs")
for line in sys.stdin:
    job = line.strip()
    folder = os.path.join(root, job)
    os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
    for name, text in (("arguments.json", "{}"), ("result.json", "{\"value\": 42}"), ("logs/user.log", "hello\n" * 20)):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
' "$1"
}

cpu_ticks() {
  local total=0 pid fields
  for pid in "$@"; do
    fields=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
    # shellcheck disable=SC2086
    set -- $fields
    total=$((total + ${12} + ${13} + ${14} + ${15}))
  done
  echo "$total"
}
pg_pids() { pgrep -x postgres || true; }
pg_xacts() { psql "$DATABASE_URL" -qtAc "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$1'"; }

make_lua() { # FILE METHOD TOKEN [BODY]
  {
    echo "wrk.method = \"$2\""
    echo "wrk.headers[\"Authorization\"] = \"Bearer $3\""
    if [ -n "${4:-}" ]; then
      echo "wrk.headers[\"Content-Type\"] = \"application/json\""
      printf 'wrk.body = [==[%s]==]\n' "$4"
    fi
    cat <<'LUA'
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKRESULT %d %d %d %d %d\n", summary.requests, summary.duration,
    e.status + e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(99)))
end
LUA
  } >"$1"
}

# measure SIZE TEST LABEL METHOD PATH TOKEN [BODY]: one row of the cost table.
X_LAST=""
measure() {
  local size=$1 test=$2 label=$3 method=$4 path=$5 token=$6 body=${7:-} conns=$CONNS threads=2
  case $test in c1 | u1) conns=1; threads=1 ;; esac
  local lua="$OUT/$size.$test.lua" url="http://127.0.0.1:$PORT$path" code
  make_lua "$lua" "$method" "$token" "$body"
  if [ "$method" = POST ]; then
    code=$(curl -s -o "$OUT/$size.$test.probe" -w '%{http_code}' -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' --data-binary "$body" "$url")
  else
    code=$(curl -s -o "$OUT/$size.$test.probe" -w '%{http_code}' -H "Authorization: Bearer $token" "$url")
  fi
  [ "$code" = 200 ] || echo "warning: $size $test: HTTP $code: $(head -c 300 "$OUT/$size.$test.probe")" >&2
  local g0 p0 x0 g1 p1 x1
  x0=${X_LAST:-$(pg_xacts "gantry_$size")}
  g0=$(cpu_ticks "$SERVER")
  # shellcheck disable=SC2046 # one argument per process
  p0=$(cpu_ticks $(pg_pids))
  echo 5 >"/proc/$SERVER/clear_refs" 2>/dev/null || true # the peak RSS below is this test's
  wrk -t"$threads" -c"$conns" -d"${WARMUP}s" --timeout 30s -s "$lua" "$url" >"$OUT/$size.$test.warmup" 2>&1 || true
  wrk -t"$threads" -c"$conns" -d"${DURATION}s" --timeout 30s -s "$lua" "$url" >"$OUT/$size.$test.wrk" 2>&1 || true
  g1=$(cpu_ticks "$SERVER")
  local peak
  peak=$(awk '/^VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$SERVER/status")
  sleep 11 # a backend reports its transactions up to 10 s after it goes idle
  # shellcheck disable=SC2046 # one argument per process
  p1=$(cpu_ticks $(pg_pids)); x1=$(pg_xacts "gantry_$size"); X_LAST=$x1
  cat "$OUT/$size.$test.warmup" "$OUT/$size.$test.wrk" | awk -v test="$test" -v label="$label" -v hz="$(getconf CLK_TCK)" \
    -v g="$((g1 - g0))" -v p="$((p1 - p0))" -v x="$((x1 - x0))" -v peak="$peak" '
    /^WRKRESULT/ { n += $2; last = $0 }
    END {
      if (last == "") { printf "| %s | %s | wrk failed | | | | | | |\n", test, label; exit }
      split(last, f, " "); n += 1
      printf "| %s | %s | %.0f | %.2f | %.0f | %.0f | %.2f | %d | %s |\n", test, label, f[2] / (f[3] / 1e6), f[6] / 1000,
        g * 1e6 / hz / n, p * 1e6 / hz / n, x / n, f[4], peak
    }' >>"$OUT/$size.rows"
}

jq_field() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }

run_size() {
  local size=$1 url data
  url=$(url_of "$size"); data=$OUT/$size
  if [ -n "${REUSE_DB:-}" ] && [ "$(psql "$url" -qtAc "SELECT COUNT(*) > 0 FROM jobs" 2>/dev/null)" = t ]; then
    echo "reusing the seeded database gantry_$size" >&2
  else
    psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS gantry_$size WITH (FORCE)" -c "CREATE DATABASE gantry_$size"
    "$GANTRY" migrate --database-url "$url" >/dev/null
    echo "seeding $size ..." >&2
    seed "$size" "$url"
    seed_objects "$data" "$url" 10000
  fi
  local heavy padmin provider function job mid count cursor last_user
  heavy=5ca1e000-0000-0000-0001-000000000001
  # The heaviest function (most jobs), its provider, and an admin of that provider.
  read -r function provider < <(psql "$url" -qtAF ' ' -c \
    "SELECT p.id, pr.name FROM job_counts c JOIN programs p ON p.id = c.program_id JOIN providers pr ON pr.id = p.provider_id
     GROUP BY p.id, pr.name ORDER BY SUM(c.n) DESC LIMIT 1")
  "$GANTRY" admin --database-url "$url" --data-dir "$data" create-provider "$provider" >/dev/null
  "$GANTRY" admin --database-url "$url" --data-dir "$data" add-admin --provider "$provider" --user padmin >/dev/null
  PORT=$(free_port)
  start_server "$data" "$PORT" "$url"
  # The months' usage sums (a server with migration 0029): the server's first usage pass makes
  # those a recount did not (a database seeded by an earlier binary); the tests wait for it.
  if [ "$(psql "$url" -qtAc "SELECT to_regclass('usage_months') IS NOT NULL")" = t ]; then
    local last_month
    last_month=$(( $(date -u -d "$(date -u +%Y-%m-01) -1 month" +%s) / 86400 ))
    for _ in $(seq 1 900); do
      [ "$(psql "$url" -qtAc "SELECT through >= $last_month FROM usage_months")" = t ] && break
      sleep 1
    done
  fi
  mkdir -p "$data/fn"
  echo 'print("bench")' >"$data/fn/main.py"
  tar -C "$data/fn" -cf "$data/fn.tar" main.py
  curl -fsS -H "Authorization: Bearer user1" -F title=bench-fn -F entrypoint=main.py -F "artifact=@$data/fn.tar" \
    "http://127.0.0.1:$PORT/api/v1/programs/upload/" >/dev/null
  curl -fsS -H "Authorization: Bearer user1" -F file=@"$data/fn/main.py" \
    "http://127.0.0.1:$PORT/api/v1/files/upload/?function=bench-fn" >/dev/null
  count=$(psql "$url" -qtAc "SELECT SUM(n) FROM job_counts WHERE author_id = '$heavy'")
  # The author of the newest queued job: its places sum every hour of the queue before it.
  last_user=$(psql "$url" -qtAc "SELECT u.username FROM jobs j JOIN users u ON u.id = j.author_id WHERE j.status = 'QUEUED' ORDER BY j.created DESC, j.id DESC LIMIT 1")
  mid=$(psql "$url" -qtAc "SELECT (MIN(created) + MAX(created)) / 2 FROM jobs")
  read -r job jobcreated < <(psql "$url" -qtAF ' ' -c "SELECT id, created FROM jobs WHERE author_id = '$heavy' AND created >= $mid ORDER BY created, id LIMIT 1")
  cursor=$(printf 'o:%s:%s' "$jobcreated" "$job" | base64 -w0 | tr '+/' '-_' | tr -d '=')
  local after
  after=$(date -u -d "@$((mid / 1000000))" +%Y-%m-%dT%H:%M:%SZ)
  local offset=$(( count / 2 ))
  # The usage tests' period: a year up to yesterday (`to` is the day after the period, so the
  # period's last day is the day before yesterday; today's running jobs are not in it).
  local ufrom uto
  ufrom=$(date -u -d "$(date -u -d "@$((END_MICROS / 1000000))" +%F) -1 year" +%F)
  uto=$(date -u -d "@$((END_MICROS / 1000000 - 86400))" +%F)
  local uday0=$(( $(date -u -d "$ufrom" +%s) / 86400 )) uday1=$(( $(date -u -d "$uto" +%s) / 86400 ))
  {
    echo "- $size: user1 holds $count jobs; the heaviest function $function (provider $provider) $(psql "$url" -qtAc "SELECT SUM(n) FROM job_counts WHERE program_id = '$function'") jobs of $(psql "$url" -qtAc "SELECT COUNT(DISTINCT author_id) FROM job_counts WHERE program_id = '$function'") users; provider $provider $(psql "$url" -qtAc "SELECT SUM(c.n) FROM job_counts c JOIN programs p ON p.id = c.program_id JOIN providers pr ON pr.id = p.provider_id WHERE pr.name = '$provider'") jobs; created_after $after; offset $offset"
    echo "- $size: usage from $ufrom to $uto: user1 $(psql "$url" -qtAc "SELECT COALESCE(SUM(jobs), 0) || ' records in ' || COUNT(*) || ' rows of usage_by_day' FROM usage_by_day WHERE author_id = '$heavy' AND day >= $uday0 AND day < $uday1"); provider $provider $(psql "$url" -qtAc "SELECT COALESCE(SUM(jobs), 0) || ' records of ' || COUNT(DISTINCT author_id) || ' users in ' || COUNT(*) || ' rows' FROM usage_by_day WHERE provider_id = (SELECT id FROM providers WHERE name = '$provider') AND day >= $uday0 AND day < $uday1"); usage_by_day $(psql "$url" -qtAc "SELECT COUNT(*) FROM usage_by_day") rows in all; usage_by_month $(psql "$url" -qtAc "SELECT COUNT(*) FROM usage_by_month") rows (user1 $(psql "$url" -qtAc "SELECT COUNT(*) FROM usage_by_month WHERE author_id = '$heavy'"), $provider $(psql "$url" -qtAc "SELECT COUNT(*) FROM usage_by_month WHERE provider_id = (SELECT id FROM providers WHERE name = '$provider')")), months summed through day $(psql "$url" -qtAc "SELECT through FROM usage_months")"
  } >>"$OUT/seed.md"
  printf '%s\n' "$url $heavy $function $provider $after $offset $cursor $job $ufrom $uto" >"$OUT/$size.params"
  sleep 11 # the set-up's transactions reported before the first test counts its own
  X_LAST=$(pg_xacts "gantry_$size")
  local run_body='{"title": "bench-fn", "arguments": "{}", "config": {}}'
  for test in $TESTS; do
    case $test in
      a) measure "$size" a "GET jobs/{id}/" GET "/api/v1/jobs/$job/" user1 ;;
      b) measure "$size" b "GET jobs/?limit=10" GET "/api/v1/jobs/?limit=10" user1 ;;
      c) measure "$size" c "GET jobs/?limit=10&status=SUCCEEDED&created_after=…" GET "/api/v1/jobs/?limit=10&status=SUCCEEDED&created_after=$after" user1 ;;
      c1) measure "$size" c1 "c, one connection" GET "/api/v1/jobs/?limit=10&status=SUCCEEDED&created_after=$after" user1 ;;
      d) measure "$size" d "GET programs/" GET "/api/v1/programs/" user1 ;;
      e) measure "$size" e "POST programs/run/" POST "/api/v1/programs/run/" user1 "$run_body" ;;
      p) measure "$size" p "GET jobs/provider/?provider=…&limit=10" GET "/api/v1/jobs/provider/?provider=$provider&limit=10" padmin ;;
      g) measure "$size" g "GET programs/{id}/get_jobs/ (1,000 jobs)" GET "/api/v1/programs/$function/get_jobs/" padmin ;;
      l) measure "$size" l "GET files/list/?function=…" GET "/api/v1/files/list/?function=bench-fn" user1 ;;
      q) measure "$size" q "GET jobs/queue/?limit=0" GET "/api/v1/jobs/queue/?limit=0" user1 ;;
      w) measure "$size" w "GET jobs/queue/?limit=100" GET "/api/v1/jobs/queue/?limit=100" user1 ;;
      x) measure "$size" x "GET jobs/queue/?limit=100 (last in the queue)" GET "/api/v1/jobs/queue/?limit=100" "$last_user" ;;
      o) measure "$size" o "GET jobs/?limit=10&offset=<middle>" GET "/api/v1/jobs/?limit=10&offset=$offset" user1 ;;
      k) measure "$size" k "GET jobs/?limit=10&cursor=<middle>" GET "/api/v1/jobs/?limit=10&cursor=$cursor" user1 ;;
      u) measure "$size" u "GET usage/?from=…&to=…&group_by=function (a year)" GET "/api/v1/usage/?from=$ufrom&to=$uto&group_by=function" user1 ;;
      u1) measure "$size" u1 "u, one connection" GET "/api/v1/usage/?from=$ufrom&to=$uto&group_by=function" user1 ;;
      u2) measure "$size" u2 "GET usage/?…&group_by=day (a year)" GET "/api/v1/usage/?from=$ufrom&to=$uto&group_by=day" user1 ;;
      up) measure "$size" up "GET usage/?…&group_by=user&provider=… (a year)" GET "/api/v1/usage/?from=$ufrom&to=$uto&group_by=user&provider=$provider" padmin ;;
    esac
  done
  echo "- $size: serve's peak memory $(awk '/^VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$SERVER/status")" >>"$OUT/seed.md"
  stop_server
}

# EXPLAIN (ANALYZE, BUFFERS) of the listings' statements as the gateway sends them (db/jobs/listing.rs).
explain() {
  local size=$1 url heavy function provider after offset cursor job ufrom uto
  read -r url heavy function provider after offset cursor job ufrom uto <"$OUT/$size.params"
  local after_us day created
  after_us=$(( $(date -u -d "$after" +%s) * 1000000 ))
  day=$(( after_us / 86400000000 ))
  created=$(psql "$url" -qtAc "SELECT created FROM jobs WHERE id = '$job'")
  # As db/jobs.rs (job_columns!) and db/jobs/listing.rs (page_if_admin) write them.
  local columns="SELECT j.id, j.program_id, (SELECT p.title FROM programs p WHERE p.id = j.program_id) AS program_title, (SELECT pr.name FROM providers pr WHERE pr.id = j.provider_id) AS provider_name, j.provider_id, j.author_id, COALESCE((SELECT u.username FROM users u WHERE u.id = j.author_id), '') AS author_name, j.status, j.sub_status, j.gpu, j.function_size, j.runner, j.created, j.updated, j.last_activity, j.backend_ref, j.stop_requested, j.result, j.status_reason"
  listing() { # COUNT CHOSEN [ALLOWED]
    echo "SELECT total.n AS total, total.allowed AS allowed, page.* FROM (SELECT ${3:-TRUE} AS allowed, $1 AS n) total LEFT JOIN ($columns FROM $2) page ON total.allowed ORDER BY page.created DESC, page.id DESC"
  }
  # An admin's provider listing: the provider by name and the caller's right in the statement.
  local padmin admin_p
  padmin=$(psql "$url" -qtAc "SELECT id FROM users WHERE username = 'padmin'")
  admin_p="EXISTS (SELECT 1 FROM providers pr JOIN provider_admin_groups a ON a.provider_id = pr.id JOIN group_members m ON m.group_id = a.group_id WHERE pr.name = '$provider' AND m.user_id = '$padmin')"
  # The queue page (db/queue.rs `read`, limit 100, slots asked) as the code has it.
  local queue_sql
  queue_sql=$(python3 "$ROOT/bench/queue_statement.py" "$ROOT/src/db/queue.rs" "$heavy" 100)
  local count_b="(SELECT CAST(COALESCE(SUM(jc.n), 0) AS BIGINT) FROM job_counts jc LEFT JOIN programs p ON p.id = jc.program_id WHERE jc.author_id = '$heavy')"
  local count_c="(SELECT CAST(COALESCE(SUM(jc.n), 0) AS BIGINT) FROM job_counts_by_day jc LEFT JOIN programs p ON p.id = jc.program_id WHERE jc.author_id = '$heavy' AND jc.status = 'SUCCEEDED' AND jc.day > $day) + (SELECT COUNT(*) FROM jobs j WHERE j.author_id = '$heavy' AND j.status = 'SUCCEEDED' AND j.created >= $after_us AND j.created < $(( (day + 1) * 86400000000 )))"
  local by_name="(SELECT id FROM providers WHERE name = '$provider')"
  local count_p="(SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_provider_counts WHERE provider_id = $by_name)"
  # get_jobs as db/jobs/of_function.rs writes it: the caller's right and two guarded branches.
  local manages="COALESCE(p.provider_id IS NOT NULL AND (p.author_id = '$padmin' OR EXISTS (SELECT 1 FROM provider_admin_groups a JOIN group_members m ON m.group_id = a.group_id WHERE a.provider_id = p.provider_id AND m.user_id = '$padmin')), FALSE)"
  local branch="SELECT * FROM jobs j WHERE j.program_id = '$function'"
  local of_function="WITH f AS (SELECT $manages AS manages FROM programs p WHERE p.id = '$function') SELECT f.manages AS manages, page.* FROM f LEFT JOIN ($columns FROM (SELECT * FROM ($branch AND (SELECT manages FROM f) ORDER BY j.created DESC, j.id DESC LIMIT 1000) every_author UNION ALL SELECT * FROM ($branch AND j.author_id = '$padmin' AND NOT (SELECT manages FROM f) ORDER BY j.created DESC, j.id DESC LIMIT 1000) own) j) page ON TRUE ORDER BY page.created DESC, page.id DESC"
  # The usage totals (db/usage.rs `totals`) as they read a period before today: the running
  # jobs' branch is off (its bound flag false; FALSE here, so the planner drops it); the period's
  # whole months [umonth0, umonth1) from usage_by_month as far as they are summed, its other days
  # from usage_by_day (grouped by day: the day rows only).
  local uday0=$(( $(date -u -d "$ufrom" +%s) / 86400 )) uday1=$(( $(date -u -d "$uto" +%s) / 86400 ))
  local umonth0 umonth1
  umonth0=$(( $(date -u -d "$(date -u -d "$ufrom" +%Y-%m-01)" +%s) / 86400 ))
  [ "$umonth0" = "$uday0" ] || umonth0=$(( $(date -u -d "$(date -u -d "$ufrom" +%Y-%m-01) +1 month" +%s) / 86400 ))
  umonth1=$(( $(date -u -d "$(date -u -d "$uto" +%Y-%m-01)" +%s) / 86400 ))
  [ "$umonth0" -lt "$umonth1" ] || { umonth0=$uday1; umonth1=$uday1; }
  usage_sql() { # KEPT_KEY NAME SCOPE [BY_DAY]
    local first=$umonth0 end=$umonth1 month_key=$1
    [ -z "${4:-}" ] || { first=$uday1; end=$uday1; month_key="''"; }
    local summed="(SELECT CASE WHEN through < $first THEN $first WHEN through > $end THEN $end ELSE through END FROM usage_months)"
    local figures="jobs, wait_ms, run_ms, cpu_core_ms, gib_ms, gpu_ms"
    echo "SELECT t.kind, t.key, $2 AS name, t.jobs, t.wait_ms, t.run_ms, t.cpu_core_ms, t.gib_ms, t.gpu_ms, t.created, t.running_since, t.cpu_millis, t.memory_mib, t.gpus FROM (SELECT CAST(0 AS BIGINT) AS kind, k.key, CAST(SUM(jobs) AS BIGINT) AS jobs, CAST(SUM(wait_ms) AS BIGINT) AS wait_ms, CAST(SUM(run_ms) AS BIGINT) AS run_ms, CAST(SUM(cpu_core_ms) AS BIGINT) AS cpu_core_ms, CAST(SUM(gib_ms) AS BIGINT) AS gib_ms, CAST(SUM(gpu_ms) AS BIGINT) AS gpu_ms, CAST(NULL AS BIGINT) AS created, CAST(NULL AS BIGINT) AS running_since, CAST(NULL AS BIGINT) AS cpu_millis, CAST(NULL AS BIGINT) AS memory_mib, CAST(NULL AS BIGINT) AS gpus FROM (SELECT $month_key AS key, $figures FROM usage_by_month WHERE $3 AND month >= $first AND month < $summed UNION ALL SELECT $1 AS key, $figures FROM usage_by_day WHERE $3 AND day >= $uday0 AND day < $first UNION ALL SELECT $1 AS key, $figures FROM usage_by_day WHERE $3 AND day >= $summed AND day < $uday1) k GROUP BY k.key UNION ALL SELECT 1, '', 0, 0, 0, 0, 0, 0, created, running_since, allocated_cpu_millis, allocated_memory_mib, allocated_gpus FROM jobs WHERE status IN ('QUEUED','PENDING','RUNNING') AND status = 'RUNNING' AND $3 AND FALSE) t ORDER BY t.key"
  }
  {
    echo "### $size"
    for name in b c p g o k w run u u2 up; do
      local sql
      case $name in
        b) sql=$(listing "$count_b" "(SELECT * FROM jobs j WHERE j.author_id = '$heavy' ORDER BY j.created DESC, j.id DESC LIMIT 10 OFFSET 0) j") ;;
        c) sql=$(listing "$count_c" "(SELECT * FROM jobs j WHERE j.author_id = '$heavy' AND j.status = 'SUCCEEDED' AND j.created >= $after_us ORDER BY j.created DESC, j.id DESC LIMIT 10 OFFSET 0) j") ;;
        p) sql=$(listing "$count_p" "(SELECT * FROM jobs j WHERE j.provider_id = $by_name ORDER BY j.created DESC, j.id DESC LIMIT 10 OFFSET 0) j" "$admin_p") ;;
        w) sql=$queue_sql ;;
        g) sql="$of_function" ;;
        o) sql=$(listing "$count_b" "(SELECT j.id FROM jobs j WHERE j.author_id = '$heavy' ORDER BY j.created DESC, j.id DESC LIMIT 10 OFFSET $offset) k JOIN jobs j ON j.id = k.id") ;;
        k) sql=$(listing "$count_b" "(SELECT * FROM jobs j WHERE j.author_id = '$heavy' AND (j.created, j.id) < ($created, '$job') ORDER BY j.created DESC, j.id DESC LIMIT 11) j") ;;
        run) sql="SELECT COALESCE(SUM(n), 0) FROM job_counts WHERE author_id = '$heavy' AND status IN ('QUEUED', 'PENDING', 'RUNNING')" ;;
        u) sql=$(usage_sql program_id "(SELECT p.title FROM programs p WHERE p.id = t.key)" "author_id = '$heavy'") ;;
        u2) sql=$(usage_sql "CAST(day AS TEXT)" NULL "author_id = '$heavy'" by_day) ;;
        up) sql=$(usage_sql author_id "(SELECT u.username FROM users u WHERE u.id = t.key)" "provider_id = $by_name") ;;
      esac
      echo
      echo "#### $name"
      echo
      echo '```'
      psql "$url" -qtAc "SELECT 1" >/dev/null
      # jit off, as the gateway's connections have it (db::postgres_options): with literal
      # values a plan's estimate passes jit_above_cost, and compiling took 40-60 ms of a 3 ms query.
      psql "$url" -qAt -c "SET jit = off" -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $sql" >/dev/null # warm the cache
      psql "$url" -qAt -c "SET jit = off" -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $sql"
      echo '```'
    done
  } >>"$OUT/explain.md"
}

# The big index of migration 0022 built again on the 10M database as a pending migration would
# be (dropped, its migration unrecorded), by `gantry migrate` while wrk drives `run`: how long
# the concurrent build takes and run's latency meanwhile (20 s windows).
migrate_timing() {
  local url data
  url=$(url_of scale); data=$OUT/scale
  PORT=$(free_port)
  start_server "$data" "$PORT" "$url"
  local lua="$OUT/migrate.lua"
  make_lua "$lua" POST user1 '{"title": "bench-fn", "arguments": "{}", "config": {}}'
  echo "| window | state | run req/s | run p50 ms | run p99 ms |" >"$OUT/migrate.md"
  echo "|---|---|---:|---:|---:|" >>"$OUT/migrate.md"
  psql "$url" -qc "DROP INDEX job_counts_program_idx" -c "DELETE FROM _sqlx_migrations WHERE version = 22"
  run_window "$lua" "before the migration" "$OUT/migrate.md"
  local t0 migrate status took
  t0=$(now_s)
  { "$GANTRY" migrate --database-url "$url" >"$OUT/migrate.out" 2>&1; echo "$? $(elapsed "$t0")" >"$OUT/migrate.end"; } &
  migrate=$!
  while kill -0 "$migrate" 2>/dev/null; do run_window "$lua" "during the migration" "$OUT/migrate.md"; done
  wait "$migrate"
  read -r status took <"$OUT/migrate.end"
  [ "$status" = 0 ] || echo "migrate failed: $(tail -5 "$OUT/migrate.out")" >&2
  echo "- \`gantry migrate\` with 0022 pending on the 10M database: $took s ($(psql "$url" -qtAc "SELECT pg_size_pretty(pg_relation_size('job_counts_program_idx'))") index over $(psql "$url" -qtAc "SELECT COUNT(*) FROM job_counts") rows of job_counts), valid: $(psql "$url" -qtAc "SELECT indisvalid FROM pg_index WHERE indexrelid = 'job_counts_program_idx'::regclass")" >>"$OUT/seed.md"
  stop_server
}

# run_window LUA LABEL FILE: 20 s of `run` under wrk, one table row.
# shellcheck disable=SC2094 # the file's lines are counted before the row is appended
run_window() {
  wrk -t2 -c"$CONNS" -d20s --timeout 30s -s "$1" "http://127.0.0.1:$PORT/api/v1/programs/run/" 2>&1 |
    awk -v label="$2" -v n="$(($(wc -l <"$3") - 1))" '/^WRKRESULT/ {printf "| %d | %s | %.0f | %.2f | %.2f |\n", n, label, $2 / ($3 / 1e6), $5 / 1000, $6 / 1000}' >>"$3"
}

# Retention of about GC_JOBS finished jobs while wrk drives run (20 s windows).
retention() {
  local size=scale url data cutoff older_than
  url=$(url_of $size); data=$OUT/$size
  # The cutoff that leaves GC_JOBS finished jobs before it.
  cutoff=$(psql "$url" -qtAc "SELECT updated FROM jobs WHERE status IN ('SUCCEEDED', 'FAILED', 'STOPPED') ORDER BY updated OFFSET $GC_JOBS LIMIT 1")
  older_than=$(awk -v now="$(date +%s)" -v c="$cutoff" 'BEGIN {printf "%.6f", (now - c / 1e6) / 86400}')
  PORT=$(free_port)
  start_server "$data" "$PORT" "$url"
  local lua="$OUT/gc.lua"
  make_lua "$lua" POST user1 '{"title": "bench-fn", "arguments": "{}", "config": {}}'
  echo "| window | state | run req/s | run p50 ms | run p99 ms |" >"$OUT/gc.md"
  echo "|---|---|---:|---:|---:|" >>"$OUT/gc.md"
  run_window "$lua" "before gc" "$OUT/gc.md"
  local t0 gc status took
  t0=$(now_s)
  { "$GANTRY" admin --database-url "$url" --data-dir "$data" gc --older-than "$older_than" >"$OUT/gc.out" 2>"$OUT/gc.err"; echo "$? $(elapsed "$t0")" >"$OUT/gc.end"; } &
  gc=$!
  while kill -0 "$gc" 2>/dev/null; do run_window "$lua" "during gc" "$OUT/gc.md"; done
  wait "$gc"
  read -r status took <"$OUT/gc.end"
  [ "$status" = 0 ] || echo "gc failed: $(tail -5 "$OUT/gc.err")" >&2
  echo "- gc: $(head -1 "$OUT/gc.out") in $took s (20 s windows of run beside it); objects left under jobs/: $(find "$data/objects/jobs" -type f 2>/dev/null | wc -l)" >>"$OUT/seed.md"
  run_window "$lua" "after gc" "$OUT/gc.md"
  stop_server
  # What autovacuum would do after a million deletions (some test clusters run without it): a
  # later REUSE_DB run then measures plans on current statistics, not on the seed's.
  psql "$url" -qc "VACUUM ANALYZE"
}

: >"$OUT/seed.md"; : >"$OUT/explain.md"
for size in $SIZES; do
  : >"$OUT/$size.rows"
  run_size "$size"
  explain "$size"
done
if [[ " $SIZES " == *" scale "* ]]; then
  [ "${MIGRATE_TIMING:-1}" = 1 ] && migrate_timing
  [ "$GC_JOBS" -gt 0 ] && retention
fi

echo "## Scale benchmark — $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
cat "$OUT/seed.md"
echo
echo "Per request: req/s, p99 ms, CPU of the gateway and of PostgreSQL (µs, warm-up included), PostgreSQL transactions, non-2xx+socket errors, serve's peak RSS during the test (MiB)"
echo
header="| test | request |"; rule="|---|---|"
for size in $SIZES; do header+=" $size req/s | p99 | gantry µs | PG µs | xacts | errors | MiB |"; rule+="---:|---:|---:|---:|---:|---:|---:|"; done
echo "$header"; echo "$rule"
# shellcheck disable=SC2086 # one argument per size
python3 - "$OUT" $SIZES <<'PY'
import sys
out, sizes = sys.argv[1], sys.argv[2:]
rows = {}
order = []
for size in sizes:
    for line in open(f"{out}/{size}.rows"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key = cells[0]
        if key not in rows:
            rows[key] = [cells[1]]
            order.append(key)
        rows[key].append(cells[2:])
for key in order:
    label, *per_size = rows[key]
    print(f"| {key} | {label} | " + " | ".join(" | ".join(cells) for cells in per_size) + " |")
PY
if [ -s "$OUT/migrate.md" ]; then echo; echo "run while gantry migrate builds 0022's index concurrently:"; echo; cat "$OUT/migrate.md"; fi
if [ -s "$OUT/gc.md" ]; then echo; echo "run while gc deletes:"; echo; cat "$OUT/gc.md"; echo; echo "gc's progress:"; echo; sed 's/^/    /' "$OUT/gc.err" | grep -v "^    $" | tail -40; fi
echo
echo "EXPLAINs: $OUT/explain.md; raw outputs in $OUT"

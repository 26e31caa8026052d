#!/usr/bin/env bash
# What the API benchmarks share (sourced by bench/jobs.sh and bench/scaling.sh, after `set -euo
# pipefail` and `cd` to the checkout): the binary to measure (GANTRY_BIN, else this checkout's
# release build), a work folder removed at exit with the server and the PostgreSQL database of
# the run, starting a server, uploading a function, the standard 100,000-job seed of
# ../shared/bench/README.md on either database, and processes' CPU time.
# env: DATABASE_URL (PostgreSQL superuser, default postgres://postgres@127.0.0.1:5432/test),
#      LOAD_SH (default ../shared/bench/load.sh), GANTRY_BIN, KEEP_WORK=1 (keep the work folder)
ROOT=$PWD
LOAD_SH=${LOAD_SH:-$ROOT/../shared/bench/load.sh}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
TOKEN=bench
for tool in wrk curl python3 psql; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool (apt-get install -y $tool)" >&2; exit 2; }
done
[ -f "$LOAD_SH" ] || { echo "load.sh not found at $LOAD_SH (set LOAD_SH)" >&2; exit 2; }

# GANTRY_BIN: measure that binary instead of this checkout's release build (before/after runs).
if [ -n "${GANTRY_BIN:-}" ]; then
  GANTRY=$(realpath "$GANTRY_BIN")
else
  cargo build --release --quiet --bin gantry
  GANTRY=$ROOT/target/x86_64-unknown-linux-gnu/release/gantry
fi
WORK=$(mktemp -d)
# Run as root, gantry runs jobs as nobody, which must pass through the data dirs' parent (search
# only), as tests/run.sh does for its own.
chmod 711 "$WORK"
SERVER=""
stop_server() { if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; fi; }
S3_SERVER=""
# The PostgreSQL database of the run, dropped however the script ends.
PG_DB=""
drop_db() { if [ -n "$PG_DB" ]; then psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true; PG_DB=""; fi; }
cleanup() { stop_server; drop_db; if [ -n "$S3_SERVER" ]; then kill "$S3_SERVER" 2>/dev/null || true; fi; if [ -n "${KEEP_WORK:-}" ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_server DATA_DIR PORT [extra flags...]
start_server() {
  local data=$1 port=$2; shift 2
  "$GANTRY" serve --listen "127.0.0.1:$port" --data-dir "$data" "$@" >"$data.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 200); do
    curl -fsS "http://127.0.0.1:$port/readiness/" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "gantry did not start:" >&2; cat "$data.log" >&2; exit 1
}

# upload_function PORT TITLE MAIN_PY_TEXT -> prints the function id
upload_function() {
  local dir; dir=$(mktemp -d -p "$WORK")
  printf '%s\n' "$3" >"$dir/main.py"
  tar -C "$dir" -cf "$dir/fn.tar" main.py
  curl -fsS -H "Authorization: Bearer $TOKEN" -F "title=$2" -F entrypoint=main.py -F "artifact=@$dir/fn.tar" \
    "http://127.0.0.1:$1/api/v1/programs/upload/" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
}

SEED_STATUSES="SUCCEEDED,SUCCEEDED,STOPPED,SUCCEEDED,SUCCEEDED,STOPPED,SUCCEEDED,SUCCEEDED,RUNNING,SUCCEEDED,SUCCEEDED,RUNNING,SUCCEEDED,FAILED,QUEUED,SUCCEEDED,FAILED,PENDING,SUCCEEDED,FAILED"

seed_sqlite() { # DB_FILE PROGRAM_ID
  python3 - "$1" "$2" "$SEED_STATUSES" <<'PY'
import sqlite3, sys
path, program, statuses = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
db = sqlite3.connect(path)
author = db.execute("SELECT id FROM users WHERE username = 'bench'").fetchone()[0]
base = 1735689600 * 1_000_000
rows = []
for i in range(100_000):
    status = statuses[i % 20]
    created = base + i * 300 * 1_000_000
    rows.append((f"be0c0000-0000-0000-0000-{i:012x}", program, author, status, created, created, created,
                 '{"value": 42}' if status == "SUCCEEDED" else None))
db.executemany("INSERT INTO jobs (id, program_id, author_id, status, created, updated, last_activity, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
db.commit()
db.execute("ANALYZE")
PY
  "$GANTRY" admin --data-dir "$(dirname "$1")" recount >/dev/null
}

seed_postgres() { # URL PROGRAM_ID
  psql "$1" -qv ON_ERROR_STOP=1 <<SQL
INSERT INTO jobs (id, program_id, author_id, status, created, updated, last_activity, result)
SELECT 'be0c0000-0000-0000-0000-' || lpad(to_hex(i), 12, '0'), '$2',
       (SELECT id FROM users WHERE username = 'bench'), s.status, c.created, c.created, c.created,
       CASE WHEN s.status = 'SUCCEEDED' THEN '{"value": 42}' END
FROM generate_series(0, 99999) AS i
CROSS JOIN LATERAL (SELECT (string_to_array('$SEED_STATUSES', ','))[i % 20 + 1] AS status) s
CROSS JOIN LATERAL (SELECT 1735689600000000::bigint + i::bigint * 300000000 AS created) c;
SQL
  "$GANTRY" admin --database-url "$1" recount >/dev/null
  psql "$1" -qc "VACUUM ANALYZE"
}


# CPU ticks (user + system, 1/CLK_TCK s) of the given processes, summed, with those of their
# children that ended (PostgreSQL's parallel workers end within a query: their time is then
# the postmaster's).
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
# PostgreSQL's processes: the postmaster, its backends and background workers (all named postgres).
pg_pids() { pgrep -x postgres || true; }
# Committed and rolled-back transactions of database $1 so far. A backend reports its counts up
# to 10 s after it goes idle, so callers wait that long before reading the final figure.
pg_xacts() { psql "$DATABASE_URL" -qtAc "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$1'"; }

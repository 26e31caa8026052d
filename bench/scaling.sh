#!/usr/bin/env bash
# How the embedded default scales with the load: `gantry serve` (SQLite, --runner none) on the
# standard 100,000-job seed, with tests b, d and e of load.sh (GET jobs/?limit=10, GET programs/,
# POST programs/run/) driven at 1, 2, 4, … connections (wrk threads: the connections, up to the
# machine's cores), for each pool size asked for. Beside req/s and latency it prints, from the
# server's admin port, what the database made requests wait: the pooled connection's mean wait
# per acquisition and acquisitions per request (gantry_db_pool_acquire_seconds), SQLite's write
# lock's mean wait (gantry_db_write_lock_seconds) and the writes per group commit
# (gantry_db_write_batch_size); and the gateway's CPU per request. A pool too small shows as
# acquisition waits that grow with the connections; a serialized write path as write-lock waits.
# Not a test: figures vary by machine.
#
# usage: bench/scaling.sh
# env:   STEPS (connections, default "1 2 4 8 16 32 64"), SCALE_TESTS (default "b d e"),
#        POOLS (pool sizes, default "default": the server's own choice; e.g. "4 8 16"),
#        DURATION/WARMUP (seconds per step, default 4/1), THREADS_MAX (default: the cores),
#        PROFILE=TEST:CONNECTIONS (e.g. e:16: record that step's server with `perf record -e
#        cpu-clock -g` and print its samples by thread and its top symbols; needs perf),
#        and bench/common.sh's (GANTRY_BIN, LOAD_SH, KEEP_WORK)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
STEPS=${STEPS:-"1 2 4 8 16 32 64"}
SCALE_TESTS=${SCALE_TESTS:-"b d e"}
POOLS=${POOLS:-default}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
THREADS_MAX=${THREADS_MAX:-$(nproc)}
began=$SECONDS

# The database waits so far: acquisition seconds and count, write-lock seconds and count, batch
# writes and batches.
waits() {
  curl -fsS "http://127.0.0.1:$1/metrics" | awk '
    /^gantry_db_pool_acquire_seconds_sum/ {a = $2} /^gantry_db_pool_acquire_seconds_count/ {b = $2}
    /^gantry_db_write_lock_seconds_sum/ {c = $2} /^gantry_db_write_lock_seconds_count/ {d = $2}
    /^gantry_db_write_batch_size_sum/ {e = $2} /^gantry_db_write_batch_size_count/ {f = $2}
    END {print a + 0, b + 0, c + 0, d + 0, e + 0, f + 0}'
}

echo "# gantry serve (SQLite) under rising load: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
hz=$(getconf CLK_TCK)
for pool in $POOLS; do
  data=$WORK/pool-$pool
  port=$(free_port)
  admin=$(free_port)
  flags=(--runner none --active-jobs-per-user 100000000 --admin-listen "127.0.0.1:$admin")
  [ "$pool" = default ] || flags+=(--db-connections "$pool")
  start_server "$data" "$port" "${flags[@]}"
  program=$(upload_function "$port" bench-fn 'print("bench")')
  seed_sqlite "$data/gantry.db" "$program"
  echo
  echo "## pool: $pool ($(grep -o 'connections=[0-9]*' "$data.log" | head -1 || echo "connections: see the server's log"))"
  echo
  echo "| test | connections | threads | req/s | p50 ms | p99 ms | gantry CPU µs | acquisitions/req | acquire wait µs | write-lock wait µs | writes/commit |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for test in $SCALE_TESTS; do
    for conns in $STEPS; do
      threads=$((conns < THREADS_MAX ? conns : THREADS_MAX))
      out=$(mktemp -d -p "$WORK")
      read -r a0 n0 l0 m0 w0 c0 < <(waits "$admin")
      g0=$(cpu_ticks "$SERVER")
      if [ "${PROFILE:-}" = "$test:$conns" ]; then
        (sleep "$WARMUP"; perf record -q -e cpu-clock -g -p "$SERVER" -o "$WORK/perf.data" -- sleep "$((DURATION - 1))" 2>/dev/null) &
        recorder=$!
      fi
      CONNS=$conns THREADS=$threads DURATION=$DURATION WARMUP=$WARMUP OUT_DIR=$out TESTS=$test bash "$LOAD_SH" \
        "http://127.0.0.1:$port" "$TOKEN" be0c0000-0000-0000-0000-00000000c350 bench-fn >"$out/table.md"
      g1=$(cpu_ticks "$SERVER")
      read -r a1 n1 l1 m1 w1 c1 < <(waits "$admin")
      row=$(grep "^| $test |" "$out/table.md" || echo "| $test | load.sh failed | 0 | 0 | 0 |")
      requests=$(cat "$out/$test.warmup.txt" "$out/$test.txt" 2>/dev/null | awk '/^WRKRESULT/ {n += $2} END {print n + 1}')
      awk -v row="$row" -v c="$conns" -v t="$threads" -v n="$requests" -v hz="$hz" -v g="$((g1 - g0))" \
        -v a="$a0 $a1" -v k="$n0 $n1" -v l="$l0 $l1" -v m="$m0 $m1" -v w="$w0 $w1" -v b="$c0 $c1" 'BEGIN {
        split(row, f, "|"); split(a, A, " "); split(k, K, " "); split(l, L, " "); split(m, M, " ")
        split(w, W, " "); split(b, B, " ")
        acq = K[2] - K[1]; locks = M[2] - M[1]; batches = B[2] - B[1]
        wait = acq > 0 ? sprintf("%.1f", (A[2] - A[1]) / acq * 1e6) : "-"
        lock = locks > 0 ? sprintf("%.1f", (L[2] - L[1]) / locks * 1e6) : "-"
        per = batches > 0 ? sprintf("%.1f", (W[2] - W[1]) / batches) : "-"
        printf "|%s| %d | %d |%s|%s|%s| %.0f | %.2f | %s | %s | %s |\n", f[2], c, t, f[4], f[5], f[6],
          g * 1e6 / hz / n, acq / n, wait, lock, per
      }'
      if [ "${PROFILE:-}" = "$test:$conns" ]; then wait "$recorder"; profiled="$test at $conns connections"; fi
    done
  done
  stop_server
done
if [ -n "${profiled:-}" ]; then
  echo
  echo "## profile: $profiled (perf, cpu-clock)"
  echo
  echo "Samples by thread:"
  perf report -i "$WORK/perf.data" --no-children --sort comm --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -8
  echo
  echo "Top symbols:"
  perf report -i "$WORK/perf.data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null | grep -E '^ +[0-9]' |
    sed -E 's/ +/ /g; s/ - - *$//' | cut -c1-110 | head -20
fi
echo
echo "(bench/scaling.sh: $((SECONDS - began)) s)"

#!/usr/bin/env bash
# File transfer benchmark: uploads and downloads files of FILE_SIZES MiB through the files API
# (`files/upload/`, `files/download/`, one stream, curl on loopback) on local storage and on S3
# storage (examples/s3_server.rs, the s3s-fs server the gateway suite runs in-process), SQLite.
# For each size and storage it prints the median and range of MiB/s, whether every downloaded
# copy has the uploaded content (SHA-256), and the server's peak RSS over that size's transfers
# (VmHWM of /proc/<pid>/status, reset before each size through /proc/<pid>/clear_refs), with
# the machine's load average beside, and the server's CPU time per transfer (utime + stime of
# /proc/<pid>/stat over the timed repetitions). Not a test: figures vary by machine.
#
# usage: bench/files.sh
# env:   FILE_SIZES="10 1024" (MiB), REPS_SMALL=7 (sizes under 100 MiB), REPS_LARGE=2,
#        STORAGES="local s3", DOWNLOAD_TO=file (as load.sh; `null`: to /dev/null, all but the first), GANTRY_BIN (a binary to measure instead of this checkout's release
#        build), S3_SERVER_BIN (likewise for examples/s3_server), SERVE_FLAGS (extra `serve` flags),
#        KEEP_WORK=1
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FILE_SIZES=${FILE_SIZES:-"10 1024"}
STORAGES=${STORAGES:-"local s3"}
TOKEN=bench
for tool in curl python3 sha256sum; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 2; }
done
if [ -n "${GANTRY_BIN:-}" ]; then GANTRY=$(realpath "$GANTRY_BIN"); else
  cargo build --release --quiet --bin gantry; GANTRY=$ROOT/target/x86_64-unknown-linux-gnu/release/gantry; fi
if [ -n "${S3_SERVER_BIN:-}" ]; then S3_BIN=$(realpath "$S3_SERVER_BIN"); else
  cargo build --release --quiet --example s3_server; S3_BIN=$ROOT/target/x86_64-unknown-linux-gnu/release/examples/s3_server; fi
WORK=$(mktemp -d)
SERVER="" S3_SERVER=""
stop() { if [ -n "${!1}" ]; then kill "${!1}" 2>/dev/null || true; wait "${!1}" 2>/dev/null || true; fi; eval "$1=''"; }
cleanup() { stop SERVER; stop S3_SERVER; if [ -n "${KEEP_WORK:-}" ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

largest=0
for size in $FILE_SIZES; do [ "$size" -gt "$largest" ] && largest=$size; done
# The body limit above the largest file (its multipart framing included).
export MAX_REQUEST_BODY_SIZE_MB=$((largest + 64))

start_server() { # DATA_DIR [flags...]
  local data=$1; shift
  PORT=$(free_port)
  # shellcheck disable=SC2086
  "$GANTRY" serve --listen "127.0.0.1:$PORT" --data-dir "$data" --runner none "$@" ${SERVE_FLAGS:-} >"$data.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 200); do
    curl -fsS "http://127.0.0.1:$PORT/readiness/" >/dev/null 2>&1 && break
    sleep 0.05
  done
  curl -fsS "http://127.0.0.1:$PORT/readiness/" >/dev/null || { echo "gantry did not start:" >&2; cat "$data.log" >&2; exit 1; }
  printf 'print("bench")\n' >"$WORK/main.py" && tar -C "$WORK" -cf "$WORK/fn.tar" main.py
  curl -fsS -H "Authorization: Bearer $TOKEN" -F title=bench-fn -F entrypoint=main.py -F "artifact=@$WORK/fn.tar" \
    "http://127.0.0.1:$PORT/api/v1/programs/upload/" >/dev/null
}

vmhwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
vmrss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# cpu_ms TICKS_BEFORE TICKS_AFTER TRANSFERS -> the server's CPU ms per transfer
cpu_ms() { awk -v d="$(($2 - $1))" -v n="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", d * 1000 / hz / n}'; }

# stats FILE_OF_SECONDS SIZE_MIB -> "median min–max" MiB/s
stats() {
  sort -g "$1" | awk -v sz="$2" '{t[NR]=$1} END {
    if (NR == 0) {print "- -"; exit}
    m = (NR % 2) ? t[(NR+1)/2] : (t[NR/2] + t[NR/2+1]) / 2
    printf "%.0f %.0f–%.0f", sz/m, sz/t[NR], sz/t[1] }'
}

# measure STORAGE SIZE_MIB: prints two table rows (upload, download).
measure() {
  local storage=$1 size=$2 reps file name q i code t sums=ok rss0 hwm up down load
  reps=$([ "$size" -lt 100 ] && echo "${REPS_SMALL:-7}" || echo "${REPS_LARGE:-2}")
  name="bench${size}m.bin"
  file="$WORK/$name"
  [ -f "$file" ] || head -c $((size * 1048576)) /dev/urandom >"$file"
  local want; want=$(sha256sum "$file" | cut -d' ' -f1)
  q="function=bench-fn"
  : >"$WORK/up.times"; : >"$WORK/down.times"
  rss0=$(vmrss_kib "$SERVER")
  echo 5 >"/proc/$SERVER/clear_refs" # resets VmHWM to the current RSS
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  local c0 c1 c2
  for i in $(seq 0 "$reps"); do # rep 0 warms up
    [ "$i" = 1 ] && c0=$(cpu_ticks "$SERVER")
    read -r code t < <(curl -s -o "$WORK/up.body" -w '%{http_code} %{time_total}\n' -H "Authorization: Bearer $TOKEN" \
      -F "file=@$file;filename=$name;type=application/octet-stream" "http://127.0.0.1:$PORT/api/v1/files/upload/?$q" || echo "000 0")
    if [ "$code" != 200 ]; then echo "warning: upload answered $code: $(head -c 300 "$WORK/up.body")" >&2; sums=FAILED; continue; fi
    [ "$i" -gt 0 ] && echo "$t" >>"$WORK/up.times"
  done
  c1=$(cpu_ticks "$SERVER")
  local sink="$WORK/down.bin"
  [ "${DOWNLOAD_TO:-file}" = null ] && sink=/dev/null
  for i in $(seq 0 "$reps"); do # rep 0 (to a file) checks the content
    read -r code t < <(curl -s -o "$([ "$i" = 0 ] && echo "$WORK/down.bin" || echo "$sink")" -w '%{http_code} %{time_total}\n' \
      -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/api/v1/files/download/?file=$name&$q" || echo "000 0")
    if [ "$code" != 200 ]; then echo "warning: download answered $code" >&2; sums=FAILED; continue; fi
    [ "$i" = 0 ] && c2=$(cpu_ticks "$SERVER")
    [ "$i" -gt 0 ] && echo "$t" >>"$WORK/down.times"
    if [ "$i" = 0 ] || { [ "$i" = "$reps" ] && [ "$sink" != /dev/null ]; }; then
      [ "$(sha256sum "$WORK/down.bin" | cut -d' ' -f1)" = "$want" ] || { echo "warning: downloaded content differs" >&2; sums=DIFFER; }
    fi
  done
  local c3; c3=$(cpu_ticks "$SERVER")
  rm -f "$WORK/down.bin"
  hwm=$(vmhwm_kib "$SERVER")
  up=$(stats "$WORK/up.times" "$size"); down=$(stats "$WORK/down.times" "$size")
  local peak; peak=$(awk -v a="$rss0" -v b="$hwm" 'BEGIN {printf "%.0f → %.0f", a/1024, b/1024}')
  # shellcheck disable=SC2086
  set -- $up; echo "| $storage | upload $size MiB | $1 | $2 | $(cpu_ms "$c0" "$c1" "$reps") | $reps | $sums | $peak | $load |"
  # shellcheck disable=SC2086
  set -- $down; echo "| $storage | download $size MiB | $1 | $2 | $(cpu_ms "$c2" "$c3" "$reps") | $reps | $sums | $peak | $load |"
}

echo "- $(date -u +%Y-%m-%dT%H:%M:%SZ); $(nproc) CPUs ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)); $GANTRY"
echo
echo "| storage | transfer | median MiB/s | range MiB/s | server CPU ms each | reps | SHA-256 | server RSS MiB: before → peak | load average |"
echo "|---|---|---:|---:|---:|---:|---|---:|---|"
for storage in $STORAGES; do
  case $storage in
    local) start_server "$WORK/local" ;;
    s3)
      mkdir -p "$WORK/s3/gantry"
      s3_port=$(free_port)
      "$S3_BIN" "$WORK/s3" "127.0.0.1:$s3_port" bench-key bench-secret-key >"$WORK/s3.log" 2>&1 &
      S3_SERVER=$!
      for _ in $(seq 1 100); do grep -q listening "$WORK/s3.log" && break; sleep 0.05; done
      AWS_ACCESS_KEY_ID=bench-key AWS_SECRET_ACCESS_KEY=bench-secret-key start_server "$WORK/s3-gantry" \
        --storage s3://gantry/bench --s3-endpoint "http://127.0.0.1:$s3_port" --s3-path-style ;;
    *) echo "unknown storage $storage" >&2; exit 2 ;;
  esac
  for size in $FILE_SIZES; do measure "$storage" "$size"; done
  stop SERVER
  stop S3_SERVER
  rm -rf "$WORK/local" "$WORK/s3" "$WORK/s3-gantry"
done

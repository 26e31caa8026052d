#!/usr/bin/env bash
# Memory of streamed answers, on `gantry serve` (SQLite, local storage, local runner):
#   1. `GET jobs/{id}/logs/` of a job whose archived log is LOG_MB MB: the server's peak memory
#      during the answer, above what it held before (the answer is streamed from storage).
#   2. FOLLOWERS clients following one job's log over SSE while it prints for about 20 s: the
#      server's peak memory above what it held before, and whether every follower got every line.
# Peak memory is VmHWM, reset (clear_refs 5) before each measurement. Prints a markdown table.
# Not a test: figures vary by machine.
#
# usage: bench/streams.sh      env: PROFILE=release|debug (default release), LOG_MB=50, FOLLOWERS=200
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PROFILE=${PROFILE:-release}
LOG_MB=${LOG_MB:-50}
FOLLOWERS=${FOLLOWERS:-200}
TOKEN=bench
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 2; }
done
if [ "$PROFILE" = release ]; then cargo build --release --quiet --bin gantry; else cargo build --quiet --bin gantry; fi
GANTRY=$ROOT/target/x86_64-unknown-linux-gnu/$PROFILE/gantry
WORK=$(mktemp -d)
SERVER=""
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
"$GANTRY" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" --python python3 \
  --logs-size-limit $((LOG_MB * 1024 * 1024 + 1048576)) >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 200); do curl -fsS "$URL/readiness/" >/dev/null 2>&1 && break; sleep 0.05; done
STARTED_KIB=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$SERVER/status")

kib() { awk -v key="$2:" '$1 == key { print $2 }' "/proc/$1/status"; }
reset_peak() { echo 5 >"/proc/$SERVER/clear_refs"; }

# upload TITLE MAIN_PY_TEXT
upload() {
  local dir; dir=$(mktemp -d -p "$WORK")
  printf '%s\n' "$2" >"$dir/main.py"
  tar -C "$dir" -cf "$dir/fn.tar" main.py
  curl -fsS -H "Authorization: Bearer $TOKEN" -F "title=$1" -F entrypoint=main.py -F "artifact=@$dir/fn.tar" \
    "$URL/api/v1/programs/upload/" >/dev/null
}
# run TITLE -> job id
run() {
  curl -fsS -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d "{\"title\": \"$1\", \"arguments\": \"{}\"}" "$URL/api/v1/programs/run/" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
}
status() { curl -fsS -H "Authorization: Bearer $TOKEN" "$URL/api/v1/jobs/$1/?with_result=false" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])'; }
wait_done() {
  for _ in $(seq 1 1200); do
    case $(status "$1") in SUCCEEDED) return 0 ;; FAILED|STOPPED) echo "job $1 failed" >&2; exit 1 ;; esac
    sleep 0.25
  done
  echo "job $1 did not finish" >&2; exit 1
}

# 1. A large archived log through logs/.
upload big "import sys
line = 'x' * 99 + '\n'
for _ in range($LOG_MB * 10000):
    sys.stdout.write(line)"
JOB=$(run big)
wait_done "$JOB"
sleep 1
BEFORE=$(kib "$SERVER" VmRSS)
reset_peak
START=$(date +%s.%N)
BYTES=$(curl -fsS -H "Authorization: Bearer $TOKEN" "$URL/api/v1/jobs/$JOB/logs/" -o "$WORK/logs.json" -w '%{size_download}')
END=$(date +%s.%N)
PEAK=$(kib "$SERVER" VmHWM)
python3 -c "import json; assert len(json.load(open('$WORK/logs.json'))['logs']) == $LOG_MB * 1000000" ||
  { echo "the logs answer is not the whole log" >&2; exit 1; }
LOG_ROW="| \`GET logs/\` of a $LOG_MB MB archived log | $((BYTES / 1048576)) MiB in $(python3 -c "print(round($END - $START, 2))") s | $((BEFORE / 1024)) MiB | $(((PEAK - BEFORE) / 1024)) MiB |"

# 2. Many followers of one job's live log.
upload ticker "import time
for i in range(2000):
    print(f'tick {i:05d} ' + 'y' * 80, flush=True)
    time.sleep(0.01)"
JOB=$(run ticker)
BEFORE=$(kib "$SERVER" VmRSS)
reset_peak
cat >"$WORK/follow.py" <<'EOF'
import http.client, sys, threading
url_port, token, job, followers = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
results = [None] * followers
def follow(index):
    connection = http.client.HTTPConnection("127.0.0.1", url_port, timeout=120)
    connection.request("GET", f"/api/v1/jobs/{job}/logs/stream/",
                       headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
    response = connection.getresponse()
    lines, ended = 0, False
    for raw in response:
        line = raw.decode()
        if line.startswith("data: tick"):
            lines += 1
        elif line.startswith("event: end"):
            ended = True
    results[index] = (lines, ended)
threads = [threading.Thread(target=follow, args=(i,)) for i in range(followers)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
complete = sum(1 for r in results if r == (2000, True))
print(complete)
EOF
COMPLETE=$(python3 "$WORK/follow.py" "$PORT" "$TOKEN" "$JOB" "$FOLLOWERS")
PEAK=$(kib "$SERVER" VmHWM)
FOLLOW_ROW="| $FOLLOWERS SSE followers of one job printing 2,000 lines over ~20 s | $COMPLETE of $FOLLOWERS got all 2,000 lines and the end | $((BEFORE / 1024)) MiB | $(((PEAK - BEFORE) / 1024)) MiB |"

echo
echo "gantry serve ($PROFILE build; $((STARTED_KIB / 1024)) MiB resident after start), peak memory above what it held before each step:"
echo
echo "| what | result | server before | peak above before |"
echo "|---|---|---:|---:|"
echo "$LOG_ROW"
echo "$FOLLOW_ROW"

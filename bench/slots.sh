#!/usr/bin/env bash
# How fast `gantry serve` hands a freed slot to the next queued job: JOBS trivial jobs
# (`print`) of one user run with SLOTS CPU slots (SQLite, local storage, jobs confined as
# `serve` confines them). Prints the end-to-end rate (first run posted to last job ended) and,
# from the jobs' status events in the database, the gap between a slot freeing (a job's end)
# and the next admission (a job's PENDING) while jobs were waiting: median, p90 and max. Not a
# test: figures vary by machine.
#
# usage: bench/slots.sh
# env:   JOBS=1000, SLOTS=2, PYTHON=python3 (the jobs' interpreter), GANTRY_BIN (a binary to
#        measure instead of this checkout's release build), KEEP_WORK=1
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-1000}
SLOTS=${SLOTS:-2}
PYTHON=${PYTHON:-python3}
if [ -n "${GANTRY_BIN:-}" ]; then GANTRY=$(realpath "$GANTRY_BIN"); else
  cargo build --release --quiet --bin gantry; GANTRY=$PWD/target/x86_64-unknown-linux-gnu/release/gantry; fi
WORK=$(mktemp -d)
chmod 711 "$WORK"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$GANTRY" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/gantry" --python "$PYTHON" \
  --max-cpu-jobs "$SLOTS" --jobs-per-user "$SLOTS" --active-jobs-per-user 100000 >"$WORK/serve.log" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/readiness/" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
  sleep 0.1
done
echo "gantry: $GANTRY; $JOBS jobs, $SLOTS CPU slots, $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
python3 - "http://127.0.0.1:$PORT/api/v1" "$JOBS" "$WORK/gantry/gantry.db" <<'PY'
import io, json, sqlite3, statistics, sys, tarfile, time, urllib.request
api, jobs, database = sys.argv[1], int(sys.argv[2]), sys.argv[3]
headers = {"Authorization": "Bearer bench"}
def call(path, body=None, content_type="application/json"):
    request = urllib.request.Request(api + path, data=body, headers=dict(headers, **({"Content-Type": content_type} if body else {})))
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)
archive = io.BytesIO()
with tarfile.open(fileobj=archive, mode="w") as tar:
    code = b"print('done')\n"
    info = tarfile.TarInfo("main.py"); info.size = len(code); tar.addfile(info, io.BytesIO(code))
boundary = "benchboundary"
parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in
         [("title", "trivial"), ("entrypoint", "main.py")]]
parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="artifact"; filename="a.tar"\r\n\r\n'.encode()
             + archive.getvalue() + b"\r\n")
call("/programs/upload/", b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}")
start = time.time()
for _ in range(jobs):
    call("/programs/run/", json.dumps({"title": "trivial", "arguments": "{}"}).encode())
posted = time.time() - start
while True:
    ended = sum(call(f"/jobs/?limit=0&status={s}")["count"] for s in ("SUCCEEDED", "FAILED", "STOPPED"))
    if ended >= jobs:
        break
    if time.time() - start > 3600:
        sys.exit(f"only {ended} of {jobs} jobs ended in an hour")
    time.sleep(0.2)
failed = call("/jobs/?limit=0&status=FAILED")["count"]
rows = sqlite3.connect(database).execute(
    "SELECT created, json_extract(data, '$.status') FROM job_events WHERE event_type = 'STATUS_CHANGE'").fetchall()
moves = sorted((created / 1e6, status) for created, status in rows)
elapsed = max(t for t, s in moves if s in ("SUCCEEDED", "FAILED", "STOPPED")) - start
ends = [t for t, s in moves if s in ("SUCCEEDED", "FAILED", "STOPPED")]
admissions = [t for t, s in moves if s == "PENDING"]
runs = {}
gaps = []
for admitted in admissions:
    # The latest end before this admission, if the slot it freed was not yet taken.
    before = [t for t in ends if t <= admitted]
    if before and admitted - before[-1] < 5:
        gaps.append((admitted - before[-1]) * 1000)
gaps.sort()
p = lambda q: gaps[min(len(gaps) - 1, int(len(gaps) * q))]
print(f"posted {jobs} runs in {posted:.1f} s; all ended {elapsed:.1f} s after the first ({jobs / elapsed:.1f} jobs/s end to end, {failed} failed)")
print(f"freed slot -> next admission: median {p(0.5):.1f} ms, p90 {p(0.9):.1f} ms, max {gaps[-1]:.1f} ms over {len(gaps)} admissions")
PY

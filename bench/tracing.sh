#!/usr/bin/env bash
# The cost of tracing (issue 31): bench/jobs.sh three times with the same release binary —
#   off   the default: no OTEL_EXPORTER_OTLP_ENDPOINT, text logs
#   json  --log-format json (span ids in every line, nothing exported)
#   on    OTEL_EXPORTER_OTLP_ENDPOINT at a sink on loopback that accepts OTLP/HTTP and drops it
#         (an OpenTelemetry Collector with a nop exporter does the same), batches every 1 s
# and prints each run's tables, then what the sink received (requests and bytes), so the "on"
# figures are known to have exported. Not a test: figures vary by machine; compare runs of one
# machine, quiet.
#
# usage: bench/tracing.sh       env: BACKENDS (default sqlite), LOAD_TESTS (default "a b e"),
#        RUNS (default "off json on"), and what bench/jobs.sh reads.
set -euo pipefail
cd "$(dirname "$0")/.."
export BACKENDS=${BACKENDS:-sqlite}
export LOAD_TESTS=${LOAD_TESTS:-"a b e"}
RUNS=${RUNS:-"off json on"}
cargo build --release --quiet --bin gantry
export GANTRY_BIN=$PWD/target/x86_64-unknown-linux-gnu/release/gantry
WORK=$(mktemp -d)
SINK=""
cleanup() { if [ -n "$SINK" ]; then kill "$SINK" 2>/dev/null || true; fi; rm -rf "$WORK"; }
trap cleanup EXIT

# The sink: answers every POST with an empty ExportTraceServiceResponse (0 bytes of protobuf) and
# counts what came.
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 - "$PORT" "$WORK/sink.txt" <<'PY' &
import http.server, sys, threading
port, out = int(sys.argv[1]), sys.argv[2]
count = {"requests": 0, "bytes": 0}
lock = threading.Lock()
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with lock:
            count["requests"] += 1
            count["bytes"] += len(body)
            with open(out, "w") as f:
                f.write(f"{count['requests']} {count['bytes']}\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
PY
SINK=$!

for run in $RUNS; do
  echo "## tracing $run"
  case $run in
    off) env -u OTEL_EXPORTER_OTLP_ENDPOINT -u GANTRY_LOG_FORMAT bench/jobs.sh ;;
    json) env -u OTEL_EXPORTER_OTLP_ENDPOINT GANTRY_LOG_FORMAT=json bench/jobs.sh ;;
    on)
      echo "0 0" >"$WORK/sink.txt"
      OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$PORT OTEL_BSP_SCHEDULE_DELAY=1000 \
        env -u GANTRY_LOG_FORMAT bench/jobs.sh
      sleep 2
      read -r requests bytes <"$WORK/sink.txt"
      echo "the sink received $requests OTLP requests, $bytes bytes of spans"
      ;;
    *) echo "unknown run: $run (off, json, on)" >&2; exit 2 ;;
  esac
done

#!/usr/bin/env bash
# The soak: SOAK_JOBS jobs (default 100,000) through `gantry gateway` and `gantry controller`
# (their own processes) on a real PostgreSQL (DATABASE_URL, default the machine's) and the
# in-process S3, with the Kubernetes API server double on loopback and the kubelet double's fast
# path playing the pods (SOAK_REAL_PODS of them, default one in 1,000 between 5 and 100, run as
# real processes with GANTRY_TEST_PYTHON or python3). One job in a hundred meets a fault of the
# pod-endings table, the API double answers some requests with 409 and 500 and drops its watches,
# and the controller is killed and started again twice; at most SOAK_WINDOW jobs (default 400)
# are unfinished at once. Prints the SOAK lines (see docs/benchmarks.md, "Soak") and exits
# non-zero when a job ended otherwise than its fault should make it end, an object outlived its
# keep window, a log was lost or a status move was recorded twice. SOAK_PROFILE=debug uses the
# debug build (tests/run.sh runs SOAK_JOBS=2000 that way); the full output is kept in a file
# named at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export SOAK_JOBS=${SOAK_JOBS:-100000}
PROFILE=(--release)
if [ "${SOAK_PROFILE:-release}" = debug ]; then PROFILE=(); fi
LOG=$(mktemp --tmpdir gantry-soak.XXXXXX.log)
set +e
cargo test "${PROFILE[@]}" --quiet --test gateway benches::soak::soak_jobs_through_gateway_and_controller -- --ignored --nocapture 2>&1 \
  | tee "$LOG" | grep --line-buffered '^SOAK'
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
  echo "--- the soak failed; the end of its output (all of it in $LOG) ---"
  grep -v '^SOAK\|^kubelet double' "$LOG" | tail -n 80
else
  echo "the full output: $LOG"
fi
exit "$status"

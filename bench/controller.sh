#!/usr/bin/env bash
# The controller benchmark: pods created per second with 1,000 and 10,000 queued jobs against
# the in-process Kubernetes API double and a real PostgreSQL (DATABASE_URL, default the
# machine's), the run-to-pod latency of one job on an idle controller, and the process's peak
# memory. Prints BENCH lines per run. GANTRY_BENCH_JOBS picks the runs, each
# `queued[:history[:stale]]`: `history` finished jobs (four events each) already in the database,
# the newest `stale` of them with a FunctionJob and a Secret left to collect; such runs also print
# the objects the cluster holds once the controller caught up. Default:
# 1000,10000,1000:100000,1000:100000:1000.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
cargo test --release --quiet --test gateway benches::controller::bench_pods_created_per_second -- --ignored --nocapture 2>&1 | grep '^BENCH'

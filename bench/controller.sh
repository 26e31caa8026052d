#!/usr/bin/env bash
# The controller benchmarks, against the in-process Kubernetes API double and a real PostgreSQL
# (DATABASE_URL, default the machine's). Prints BENCH lines per run.
#
#   bench/controller.sh [pods|tenants|all]   (default: pods)
#
# pods: pods created per second with 1,000 and 10,000 queued jobs, the run-to-pod latency of one
# job on an idle controller, and the process's peak memory. GANTRY_BENCH_JOBS picks the runs, each
# `queued[:history[:stale]]`: `history` finished jobs (four events each) already in the database,
# the newest `stale` of them with a FunctionJob and a Secret left to collect; such runs also print
# the objects the cluster holds once the controller caught up. Default:
# 1000,10000,1000:100000,1000:100000:1000.
#
# tenants: admission between tenants (issue 48): 100,000 queued jobs (GANTRY_BENCH_TENANT_JOBS)
# from 1,000 users of 100 tenants, pods per second and the controller's peak memory; then a
# 536-deep queue of one tenant drained when 600 slots free at once (admissions per second).
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
mode=${1:-pods}
run() {
    cargo test --release --quiet --test gateway "benches::controller::$1" -- --ignored --nocapture --exact 2>&1 | grep '^BENCH'
}
case "$mode" in
    pods) run bench_pods_created_per_second ;;
    tenants) run bench_admission_between_tenants ;;
    all) run bench_pods_created_per_second; run bench_admission_between_tenants ;;
    *) echo "usage: bench/controller.sh [pods|tenants|all]" >&2; exit 2 ;;
esac

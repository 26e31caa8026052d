#!/usr/bin/env bash
# The cost per request in one run, to compare a change with what came before: tests a, b, d, e
# of bench/jobs.sh (the standard 100,000-job seed, wrk 16 connections) on SQLite and PostgreSQL,
# short runs (5 s after 1 s), no files and no run-to-start measure. Prints, per backend and
# request, req/s, p99 and what each request cost: the gateway's CPU µs, PostgreSQL's CPU µs and
# its transactions. Takes about a minute and a half on this project's 2-core machine. Not a test:
# compare two builds by running this with GANTRY_BIN set to each, alternated.
#
# usage: bench/cost.sh
# env:   as bench/jobs.sh (GANTRY_BIN, DATABASE_URL, BACKENDS); DURATION, WARMUP to lengthen runs
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
LOAD_TESTS="a b d e" DURATION=${DURATION:-5} WARMUP=${WARMUP:-1} STARTS=0 FILES_S3=0 bench/jobs.sh
echo
echo "(bench/cost.sh: $((SECONDS - began)) s)"

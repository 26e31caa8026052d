#!/usr/bin/env bash
# The launcher placed into job containers and pods, static (this checkout's build) against the
# same source linked dynamically (glibc and libgcc_s from the machine): the stripped binary's
# size, and its start time, the median wall time of REPS runs of `gantry --version` (exec,
# loading, the runtime's start; what every job pays once before its launcher does anything) and
# of `gantry launch --help` (the launcher's argument parsing on top). Not a test: figures vary
# by machine.
#
# usage: bench/launcher.sh
# env:   REPS=300, STATIC_BIN (default: the release build of this checkout, built if missing),
#        DYNAMIC_BIN (default: built here into target/dynamic with RUSTFLAGS=-Ctarget-feature=-crt-static)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-300}
for tool in python3 strip readelf; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 2; }
done
if [ -n "${STATIC_BIN:-}" ]; then STATIC=$(realpath "$STATIC_BIN"); else
  cargo build --release --quiet --bin gantry
  STATIC=$PWD/target/x86_64-unknown-linux-gnu/release/gantry
fi
if [ -n "${DYNAMIC_BIN:-}" ]; then DYNAMIC=$(realpath "$DYNAMIC_BIN"); else
  # RUSTFLAGS replaces the config's rustflags: the same source, linked as before issue 45.
  RUSTFLAGS="-C target-feature=-crt-static" cargo build --release --quiet --bin gantry --target-dir target/dynamic
  DYNAMIC=$PWD/target/dynamic/x86_64-unknown-linux-gnu/release/gantry
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp "$STATIC" "$WORK/static" && cp "$DYNAMIC" "$WORK/dynamic"
strip "$WORK/static" "$WORK/dynamic"
if readelf -l "$WORK/static" | grep -q 'program interpreter'; then
  echo "$STATIC is not static (it has a program interpreter)" >&2; exit 1
fi
readelf -l "$WORK/dynamic" | grep -q 'program interpreter' || { echo "$DYNAMIC is not dynamic" >&2; exit 1; }

python3 - "$WORK" "$REPS" <<'PY'
import os, statistics, subprocess, sys, time
work, reps = sys.argv[1], int(sys.argv[2])
def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return [line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line]
def median_ms(path, args):
    times = []
    for i in range(reps + 10):
        start = time.perf_counter()
        subprocess.run([path] + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if i >= 10:  # warm-up runs are not counted
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]
print(f"{'binary':<8} {'stripped MiB':>12} {'--version ms (p50/p90)':>24} {'launch --help ms (p50/p90)':>28}  needs")
for name in ["dynamic", "static"]:
    path = os.path.join(work, name)
    size = os.path.getsize(path) / 2**20
    version = median_ms(path, ["--version"])
    launch = median_ms(path, ["launch", "--help"])
    libs = ", ".join(needed(path)) or "nothing"
    print(f"{name:<8} {size:>12.1f} {version[0]:>15.2f} / {version[1]:<6.2f} {launch[0]:>19.2f} / {launch[1]:<6.2f}  {libs}")
PY

#!/usr/bin/env bash
# Two builds side by side on one machine: runs each checkout's own bench/jobs.sh (tests a, b, d
# and e on the standard seed, SQLite and PostgreSQL) with its binary, alternating A and B for
# ROUNDS rounds (A first in odd rounds, B first in even ones, so a drift of the machine falls
# on both), and prints for every figure the median of each side, the spread (lowest to
# highest) and the change of the medians. Each checkout runs its own script because the seed
# writes the schema of its own time. A figure whose ranges do not overlap changed beyond the
# noise. Not a test. Test t (a queued job's stop, bench/jobs.sh) is compared too when LOAD_TESTS
# names it; its script changes are bench/'s: to compare binaries older than the script, pass the
# same checkout twice (e.g. bench/ab.sh . /tmp/gantry-old . /tmp/gantry-new; the seed's columns
# are those of every schema since the standard seed).
#
# usage: bench/ab.sh A_CHECKOUT A_BINARY B_CHECKOUT B_BINARY
#   e.g. git worktree add /tmp/old 407aaef && (cd /tmp/old && cargo build --release)
#        bench/ab.sh /tmp/old /tmp/old/target/release/gantry . target/x86_64-unknown-linux-gnu/release/gantry
# env:   ROUNDS (default 3), DURATION/WARMUP (default 8/2 s per test), LOAD_TESTS (default "a b d e"), OUT (folder kept for
#        the raw outputs; default a temporary one, removed)
set -euo pipefail
if [ $# -ne 4 ]; then sed -n '2,17p' "$0" >&2; exit 2; fi
a_dir=$(realpath "$1"); a_bin=$(realpath "$2"); b_dir=$(realpath "$3"); b_bin=$(realpath "$4")
ROUNDS=${ROUNDS:-3}
keep=${OUT:+1}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
[ -n "$keep" ] || trap 'rm -rf "$OUT"' EXIT
began=$SECONDS

# run SIDE ROUND: one side's whole bench/jobs.sh. STARTS=1: a checkout from before STARTS=0
# existed measures one run-to-start at least (not compared).
run() {
  local dir bin
  if [ "$1" = A ]; then dir=$a_dir bin=$a_bin; else dir=$b_dir bin=$b_bin; fi
  echo "round $2, $1: $dir ($(date +%H:%M:%S))" >&2
  (cd "$dir" && GANTRY_BIN=$bin LOAD_TESTS=${LOAD_TESTS:-a b d e} DURATION=${DURATION:-8} WARMUP=${WARMUP:-2} STARTS=1 FILES_S3=0 \
    LOAD_SH=${LOAD_SH:-$(realpath "$b_dir/../shared/bench/load.sh")} bench/jobs.sh) >"$OUT/$1.$2.md" 2>"$OUT/$1.$2.log" ||
    { echo "bench/jobs.sh failed ($1, round $2):" >&2; tail -20 "$OUT/$1.$2.log" >&2; exit 1; }
}
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then run A "$round"; run B "$round"; else run B "$round"; run A "$round"; fi
done

python3 - "$OUT" "$ROUNDS" "$a_dir" "$b_dir" <<'PY'
import re, statistics, sys
out, rounds, a_dir, b_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
# figures[(backend, test, column)][side] = [value per round]
figures, labels = {}, {}
columns = ["req/s", "p99 ms", "gantry µs", "PostgreSQL µs", "transactions"]
for side in "AB":
    for r in range(1, rounds + 1):
        backend = None
        for line in open(f"{out}/{side}.{r}.md"):
            heading = re.match(r"^## (\w+)", line)
            if heading:
                backend = heading.group(1)
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if backend and len(cells) == 7 and cells[0] in "abdet" and len(cells[0]) == 1:
                labels[cells[0]] = cells[1]
                for column, cell in zip(columns, cells[2:]):
                    try:
                        value = float(cell)
                    except ValueError:
                        continue
                    figures.setdefault((backend, cells[0], column), {}).setdefault(side, []).append(value)
print(f"A: {a_dir}\nB: {b_dir}\n{rounds} rounds, alternated; median (lowest–highest)\n")
print("| backend | test | figure | A | B | B/A | beyond the spread |")
print("|---|---|---|---:|---:|---:|---|")
def show(values):
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})" if max(values) >= 10 else \
        f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"
for (backend, test, column), sides in figures.items():
    if "A" not in sides or "B" not in sides:
        continue
    a, b = sides["A"], sides["B"]
    ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else float("nan")
    apart = max(a) < min(b) or max(b) < min(a)
    better = (statistics.median(b) > statistics.median(a)) == (column == "req/s")
    verdict = ("better" if better else "worse") if apart else "-"
    print(f"| {backend} | {test} | {column} | {show(a)} | {show(b)} | {ratio:.2f} | {verdict} |")
PY
echo
echo "(bench/ab.sh: $((SECONDS - began)) s; raw outputs in $OUT${keep:+, kept})"

#!/usr/bin/env python3
"""Rows of the scale seed (bench/scale.sh) as PostgreSQL COPY text on stdout.

usage: scale_seed.py TABLE JOBS USERS FUNCTIONS PROVIDERS END_MICROS
  TABLE: users, providers, programs or jobs; the other arguments must be the same for every table.

The shape (see docs/benchmarks.md, "Scale"):
- users `user1` .. `userU` (token = name with the mock_token mechanism); jobs are given to users
  by a Zipf law (s = 1) on their rank: user1 holds about JOBS / H(U) of them (827,000 of 10 M
  over 100,000 users), user100 about 1 % of that, most users a handful;
- providers `prov0` ..; functions `fn<f>` of provider `prov<f mod P>`, written by the user of
  rank U - (f mod P) (one of the lightest users per provider: the heaviest user writes none);
- user u (rank u) runs 5 functions if u <= 10, else 1 + u mod 5, picked at random per job among
  them; function m of user u is (u * 7919 + m * 104729) mod F, so the functions of the heaviest
  users (and their providers) are the heaviest;
- job i (0 <= i < JOBS): id 5ca1e000-0000-0000-0000-<i as 12 hex digits>, status entry i mod 20 of
  the standard seed's list, result {"value": 42} when SUCCEEDED, created evenly over the two
  years ending at END_MICROS, oldest first;
- what the usage ledger (issue 47) meters, drawn per job from a generator of its own (so users,
  functions and statuses are those of the seed before it): a size S, M, L or XL (60, 25, 10 and
  5 %) whose compute profile gives what its runner allocated (SIZES below: CPU, memory, no GPU);
  a wait from creation to RUNNING of 0.2 s to 10 min and a run of 1 s to 1 h (both u^3-skewed:
  medians about 75 s and 7.5 min). SUCCEEDED, FAILED and every other STOPPED job (entry 5 of the
  list) ran: running_since = created + wait, ended = running_since + run; the other STOPPED jobs
  (entry 2) were stopped while queued: no RUNNING time, no allocation, ended = created + wait.
  RUNNING jobs have running_since and their allocation; QUEUED and PENDING jobs neither. Times
  stop 1 ms before END_MICROS. updated = last_activity = the job's end (finished), its RUNNING
  move (running), its creation (queued, pending). The usage records themselves are made from
  these columns by bench/scale.sh (INSERT ... SELECT FROM jobs), so they match the jobs exactly.
"""

import bisect
import random
import sys

STATUSES = ("SUCCEEDED,SUCCEEDED,STOPPED,SUCCEEDED,SUCCEEDED,STOPPED,SUCCEEDED,SUCCEEDED,RUNNING,SUCCEEDED,"
            "SUCCEEDED,RUNNING,SUCCEEDED,FAILED,QUEUED,SUCCEEDED,FAILED,PENDING,SUCCEEDED,FAILED").split(",")
TWO_YEARS = 730 * 86_400_000_000
# Function sizes: label, share of the jobs, compute profile, CPU (thousandths of a core), memory
# (MiB). No GPUs: the seed's jobs are CPU jobs (`jobs.gpu` false), as the slots' counts expect.
SIZES = (("S", 0.60, "cx3d-4x16", 4000, 16384), ("M", 0.25, "cx3d-8x32", 8000, 32768),
         ("L", 0.10, "cx3d-16x64", 16000, 65536), ("XL", 0.05, "cx3d-32x128", 32000, 131072))
FINISHED = ("SUCCEEDED", "FAILED", "STOPPED")


def user_id(rank):
    return f"5ca1e000-0000-0000-0001-{rank:012x}"


def program_id(f):
    return f"5ca1e000-0000-0000-0002-{f:012x}"


def provider_id(p):
    return f"5ca1e000-0000-0000-0003-{p:012x}"


def functions_of(rank, functions):
    count = 5 if rank <= 10 else 1 + rank % 5
    return [(rank * 7919 + m * 104729) % functions for m in range(count)]


def main():
    table = sys.argv[1]
    jobs, users, functions, providers, end = (int(a) for a in sys.argv[2:7])
    start = end - TWO_YEARS
    out = sys.stdout
    if table == "users":
        out.writelines(f"{user_id(r)}\tuser{r}\t{start}\n" for r in range(1, users + 1))
    elif table == "providers":
        out.writelines(f"{provider_id(p)}\tprov{p}\t{start}\n" for p in range(providers))
    elif table == "programs":
        # id, title, provider_id, author_id, entrypoint, artifact_key, created, updated
        out.writelines(
            f"{program_id(f)}\tfn{f}\t{provider_id(f % providers)}\t{user_id(users - f % providers)}\tmain.py\t"
            f"seed/fn{f}.tar\t{start}\t{start}\n"
            for f in range(functions)
        )
    elif table == "jobs":
        # The Zipf law's cumulative weights, and each user's functions.
        cumulative, total = [], 0.0
        for r in range(1, users + 1):
            total += 1.0 / r
            cumulative.append(total)
        picks = [None] + [functions_of(r, functions) for r in range(1, users + 1)]
        draw = random.Random(32).random
        # The usage figures' own generator: the draws above are those of the seed before them.
        metered = random.Random(47).random
        bounds, share = [], 0.0
        for size in SIZES:
            share += size[1]
            bounds.append(share)
        step = TWO_YEARS // jobs
        last = end - 1000
        lines = []
        for i in range(jobs):
            rank = bisect.bisect_left(cumulative, draw() * total) + 1
            mine = picks[min(rank, users)]
            f = mine[int(draw() * len(mine))]
            status = STATUSES[i % 20]
            created = start + i * step
            result = '{"value": 42}' if status == "SUCCEEDED" else "\\N"
            label, _, profile, cpu, memory = SIZES[min(bisect.bisect_left(bounds, metered()), len(SIZES) - 1)]
            wait_us = (200 + int(metered() ** 3 * 599_800)) * 1000
            run_us = (1000 + int(metered() ** 3 * 3_599_000)) * 1000
            ran = status == "RUNNING" or (status in FINISHED and i % 20 != 2)
            if ran:
                since = min(created + wait_us, last)
                updated = min(since + run_us, last) if status != "RUNNING" else since
                running = f"{since}\t{profile}\t{cpu}\t{memory}\t0"
            else:
                updated = min(created + wait_us, last) if status in FINISHED else created
                running = "\\N\t\\N\t\\N\t\\N\t\\N"
            # id, program_id, provider_id, author_id, status, result, created, updated, last_activity,
            # function_size, running_since, compute_profile, allocated_cpu_millis, allocated_memory_mib,
            # allocated_gpus
            lines.append(
                f"5ca1e000-0000-0000-0000-{i:012x}\t{program_id(f)}\t{provider_id(f % providers)}\t"
                f"{user_id(min(rank, users))}\t{status}\t{result}\t{created}\t{updated}\t{updated}\t"
                f"{label}\t{running}\n"
            )
            if len(lines) == 10_000:
                out.writelines(lines)
                lines = []
        out.writelines(lines)
    else:
        sys.exit(f"unknown table {table}")


if __name__ == "__main__":
    main()

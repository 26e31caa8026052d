"""A tiny check runner shared by the end-to-end scripts: one line per check, then
`N passed, N failed`, and a non-zero exit on any failure."""

import sys
import time
import traceback

RESULTS = {"passed": 0, "failed": 0}


def check(name):
    """Runs the decorated function at once as the check `name`."""

    def decorator(test):
        started = time.monotonic()
        try:
            test()
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            RESULTS["failed"] += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        else:
            RESULTS["passed"] += 1
            print(f"ok   {name} ({time.monotonic() - started:.1f} s)")
        return test

    return decorator


def finish():
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    sys.exit(1 if RESULTS["failed"] else 0)


def wait(job, seconds=120):
    """Polls job.status() until terminal; returns every status seen, in order."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = job.status()
        if not seen or seen[-1] != status:
            seen.append(status)
        if status in {"DONE", "ERROR", "CANCELED"}:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"job {job.job_id} not finished after {seconds} s: {seen}")

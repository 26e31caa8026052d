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

"""The console tests' function: what it does depends on the argument `mode`.

ok: sets the sub-status EXECUTING_QPU, prints `step i of n` n times, `pause` seconds apart,
then saves a result.
ticks: prints `tick i` n times, `pause` seconds apart (default 0.4: a log long enough to cut a
connection in).
sleep: prints `sleeping` and sleeps (to be stopped).
fail: sends an error event, then fails.
divide: prints `dividing`, then divides by zero (a Python failure: its reason names the exception).
"""

import sys
import time

from qiskit_serverless import get_arguments, get_provider_logger, save_result, send_error, update_status

arguments = get_arguments()
mode = arguments.get("mode", "ok")
n = int(arguments.get("n", 3))
get_provider_logger().info("provider side: job started in mode %s", mode)

if mode == "ok":
    update_status("EXECUTING_QPU")
    for i in range(1, n + 1):
        print(f"step {i} of {n}", flush=True)
        time.sleep(float(arguments.get("pause", 1.0)))
    save_result({"total": n * (n + 1) // 2, "mode": mode, "greeting": "héllo ✓"})
elif mode == "ticks":
    for i in range(n):
        print(f"tick {i}", flush=True)
        time.sleep(float(arguments.get("pause", 0.4)))
    save_result({"ticks": n})
elif mode == "sleep":
    print("sleeping", flush=True)
    time.sleep(600)
elif mode == "fail":
    print("about to fail", flush=True)
    send_error(code="E42", message="ValueError: the widget broke", exception="WidgetError", args={"widget": 7})
    print("failing now", file=sys.stderr, flush=True)
    raise SystemExit(3)
elif mode == "divide":
    print("dividing", flush=True)
    print(n / 0)

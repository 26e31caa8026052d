"""End-to-end test function: what a user's function does with the in-job helpers.

Argument `mode` picks the behaviour: ok (default), status, fail, sleep, interleave.
"""

import os
import time
import traceback

from qiskit_serverless import get_arguments, get_logger, get_provider_logger, save_result, send_error, update_status

from tools.maths import total

arguments = get_arguments()
logger = get_logger()
mode = arguments.get("mode", "ok")
print(f"stdout: mode {mode}", flush=True)
logger.info("logger: started")
get_provider_logger().info("provider logger: internal detail")

if mode == "status":
    update_status("EXECUTING_QPU")
    time.sleep(float(arguments.get("seconds", 4)))
elif mode == "fail":
    # As users commonly do: the message is a formatted exception, which ends with a newline.
    try:
        raise ValueError("the widget broke")
    except ValueError as error:
        message = "\n".join(traceback.format_exception_only(error))
    send_error(code="E42", message=message, exception="WidgetError", args={"widget": 7})
    raise ValueError("widget failure")
elif mode == "interleave":
    # The existing gateway's test_simple_function: logger (stderr) and print (stdout) lines one
    # after the other; the log must keep their order.
    for i in range(10):
        logger.info(f"logger line {i}")
        print(f"print line {i}")
    print("DELAY STARTS")
    time.sleep(0.1)
    logger.info("DELAY ENDS")
elif mode == "sleep":
    with open(os.path.join(os.environ["DATA_PATH"], "pid.txt"), "w", encoding="utf-8") as handle:
        handle.write(str(os.getpid()))
    print("sleeping", flush=True)
    time.sleep(600)

save_result({"total": total(arguments.get("values", [])), "mode": mode, "job": os.environ["ENV_JOB_ID_GATEWAY"]})

"""The function inside the provider image the image end-to-end checks build (its /runner).

Argument `mode`: ok (default), status, slow, sleep, files, spy, fail.
"""

import glob
import os
import sys
import time

from qiskit_serverless import get_arguments, get_logger, get_provider_logger, save_result, update_status

arguments = get_arguments()
mode = arguments.get("mode", "ok")
logger = get_logger()
print(f"stdout: mode {mode}", flush=True)
logger.info("logger: started")
get_provider_logger().info("provider logger: internal detail")
result = {"mode": mode, "job": os.environ["ENV_JOB_ID_GATEWAY"], "uid": os.getuid(), "cwd": os.getcwd()}

if mode == "ok":
    result["total"] = sum(arguments.get("values", []))
elif mode == "status":
    update_status("EXECUTING_QPU")
    time.sleep(float(arguments.get("seconds", 4)))
elif mode == "slow":
    # Lines a few seconds apart: the live log shows the first before the last is written.
    for i in range(int(arguments.get("lines", 6))):
        logger.info(f"slow line {i}")
        time.sleep(float(arguments.get("pause", 1)))
elif mode == "sleep":
    print("sleeping", flush=True)
    time.sleep(float(arguments.get("seconds", 600)))
elif mode == "files":
    data = os.environ["DATA_PATH"]
    with open(os.path.join(data, "input.txt"), encoding="utf-8") as handle:
        result["read"] = handle.read()
    with open(os.path.join(data, "output.txt"), "w", encoding="utf-8") as handle:
        handle.write("written by the image job")
elif mode == "spy":
    # What a curious function can reach from inside its container.
    def readable(path):
        try:
            with open(path, "rb") as handle:
                handle.read(1)
            return True
        except OSError:
            return False

    environ = dict(os.environ)
    result["environment"] = sorted(environ)
    result["server_marker_seen"] = any("server-secret-4242" in value for value in environ.values())
    result["readable"] = {path: readable(path) for path in arguments.get("paths", [])}
    others = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as handle:
                text = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "serve" in text or "postgres" in text:
            others.append(text)
        try:
            with open(cmdline.replace("cmdline", "environ"), "rb") as handle:
                if b"server-secret-4242" in handle.read():
                    result["server_marker_seen"] = True
        except OSError:
            pass
    result["server_processes"] = others
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        if os.path.exists(limit):
            with open(limit, encoding="utf-8") as handle:
                result["memory_limit"] = handle.read().strip()
            break
    result["launcher_writable"] = os.access("/gantry/bin/gantry", os.W_OK)
    result["python"] = sys.executable
elif mode == "fail":
    raise ValueError("the image function failed on purpose")

save_result(result)

"""End-to-end checks of container-image functions on `gantry serve` with the real client.

Usage: python client_images.py GANTRY_BIN IMAGE ENGINE
Starts `gantry serve` itself (twice: it is killed with -9 during a job and started again), with
ENGINE as its container engine, a provider `e2e` administered by `e2e-erin`, and a short
PROGRAM_TIMEOUT. IMAGE is a provider image (built by tests/image_jobs.sh, never pulled) whose
/runner holds tests/e2e/functions/image/main.py. Prints one line per check and
`N passed, N failed`; exits non-zero on any failure.
"""

import json
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from checks import RESULTS, check, finish, wait
from image_serve import api as api_get, admin as gantry_admin, engine as run_engine, job_containers
from qiskit_serverless import QiskitFunction, ServerlessClient

GANTRY, IMAGE, ENGINE = sys.argv[1], sys.argv[2], sys.argv[3]
TIMEOUT_SECONDS = 25
DATA = tempfile.mkdtemp(prefix="gantry-image-jobs-")
os.chmod(DATA, 0o711)
PORT = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
HOST = f"http://127.0.0.1:{PORT}"

# The engine as the server runs it, `gantry admin` on this data dir, GETs as e2e-erin, the job
# containers left (tests/e2e/image_serve.py).
engine = functools.partial(run_engine, ENGINE)
admin = functools.partial(gantry_admin, GANTRY, f"{DATA}/gantry")
api = functools.partial(api_get, HOST, token="e2e-erin")
containers = functools.partial(job_containers, ENGINE)
SERVER = {}


def start_server():
    log = open(os.path.join(DATA, "serve.log"), "a", encoding="utf-8")
    env = dict(os.environ, GANTRY_SPY_MARKER="server-secret-4242", DATABASE_URL="")
    env.pop("DATABASE_URL")
    SERVER["process"] = subprocess.Popen(
        [GANTRY, "serve", "--listen", f"127.0.0.1:{PORT}", "--data-dir", f"{DATA}/gantry",
         "--container-engine", ENGINE, "--program-timeout", f"{TIMEOUT_SECONDS}s",
         "--memory-gib-per-job", "1", "--cpu-per-job", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{HOST}/readiness/", timeout=1)
            return
        except OSError:
            assert SERVER["process"].poll() is None, open(os.path.join(DATA, "serve.log")).read()
            time.sleep(0.1)
    raise AssertionError("gantry serve did not become ready")


admin("create-provider", "e2e")
admin("add-admin", "--provider", "e2e", "--user", "e2e-erin")
start_server()
print(open(os.path.join(DATA, "serve.log")).read().strip().replace("\n", "\n     | ").join(["     | ", ""]))
erin = ServerlessClient(host=HOST, token="e2e-erin", channel="local")
function = erin.upload(QiskitFunction(title="image-e2e", provider="e2e", image=IMAGE))


@check("an image function runs in its container: DONE, result, final logs, events")
def _():
    job = function.run(values=[1, 2, 3], mode="ok")
    seen = wait(job)
    assert seen[-1] == "DONE", seen
    result = job.result(cadence=0.2)
    assert result["total"] == 6 and result["job"] == job.job_id, result
    assert result["uid"] == 65532, f"a non-root user: {result}"
    assert result["cwd"] == "/runner", f"runs from the image's code folder: {result}"
    logs = job.logs()
    assert "INFO: logger: started" in logs and "internal detail" not in logs, logs
    assert "stdout: mode ok" in job.provider_logs(), "the provider log has the untagged lines"
    statuses = [event.data.get("status") for event in job.events() if event.event_type == "STATUS_CHANGE"]
    assert statuses[0] == "SUCCEEDED" and "RUNNING" in statuses, statuses
    assert f"gantry-job-{job.job_id}" not in containers(), "the container is removed at the end"


@check("live logs while it runs, in the order written; update_status is RUNNING: EXECUTING_QPU")
def _():
    job = function.run(mode="slow", lines=6, pause=1)
    deadline = time.monotonic() + 60
    live = ""
    while "slow line 1" not in live:
        assert time.monotonic() < deadline, f"no live log: {live!r}"
        live = job.logs() or ""
        time.sleep(0.2)
    assert job.status() == "RUNNING" and "slow line 5" not in live, (job.status(), live)
    assert wait(job)[-1] == "DONE"
    lines = [line for line in job.logs().splitlines() if "slow line" in line]
    assert lines == [f"INFO: slow line {i}" for i in range(6)], lines
    job = function.run(mode="status", seconds=4)
    seen = wait(job)
    assert "RUNNING: EXECUTING_QPU" in seen and seen[-1] == "DONE", seen


@check("the job's files: DATA_PATH holds the user's files and keeps what the job writes")
def _():
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "input.txt")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("uploaded before the run")
        erin.file_upload(path, function)
        job = function.run(mode="files")
        assert wait(job)[-1] == "DONE"
        assert job.result(cadence=0.2)["read"] == "uploaded before the run"
        assert "output.txt" in erin.files(function), erin.files(function)
        erin.file_download("output.txt", function, target_name="output.txt", download_location=folder)
        with open(os.path.join(folder, "output.txt"), encoding="utf-8") as handle:
            assert handle.read() == "written by the image job"


@check("a failing image function ends ERROR with its traceback in the log")
def _():
    job = function.run(mode="fail")
    assert wait(job)[-1] == "ERROR"
    assert "the image function failed on purpose" in job.provider_logs()


@check("job.cancel(service=...) stops the container: CANCELED, container gone")
def _():
    job = function.run(mode="sleep")
    deadline = time.monotonic() + 60
    while "sleeping" not in (job.provider_logs() or ""):
        assert time.monotonic() < deadline, "the sleeping job never started"
        time.sleep(0.2)
    assert f"gantry-job-{job.job_id}" in containers()
    message = job.cancel(service={"channel": "local"})
    assert "stop" in message.lower(), message
    assert wait(job, 60)[-1] == "CANCELED"
    assert "sleeping" in job.provider_logs()
    assert f"gantry-job-{job.job_id}" not in containers(), containers()


@check(f"PROGRAM_TIMEOUT ({TIMEOUT_SECONDS} s) stops an image job")
def _():
    began = time.monotonic()
    job = function.run(mode="sleep")
    assert wait(job, TIMEOUT_SECONDS + 60)[-1] == "CANCELED"
    assert time.monotonic() - began >= TIMEOUT_SECONDS - 1
    assert f"gantry-job-{job.job_id}" not in containers()


@check("isolation: the container has the job's environment only, not the server's, its database or other jobs' files")
def _():
    other = function.run(mode="sleep", seconds=30)
    deadline = time.monotonic() + 60
    while other.status() != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    paths = [
        f"{DATA}/gantry/gantry.db",
        f"{DATA}/gantry/token.key",
        f"{DATA}/gantry/jobs/{other.job_id}/arguments.json",
        f"{DATA}/gantry/objects",
        "/proc/1/environ",  # the launcher's: it is non-dumpable, so not even the job's user reads it
    ]
    job = function.run(mode="spy", paths=paths)
    assert wait(job)[-1] == "DONE"
    other.cancel(service={"channel": "local"})
    result = job.result(cadence=0.2)
    assert not result["server_marker_seen"], "the server's environment reached the job"
    assert not result["server_processes"], result["server_processes"]
    assert result["readable"] == {path: False for path in paths}, result["readable"]
    leaked = [name for name in result["environment"] if name.startswith(("GANTRY_", "AWS_", "DATABASE", "PG"))]
    assert not leaked, f"launcher settings or credentials in the job's environment: {leaked}"
    assert "ENV_JOB_GATEWAY_TOKEN" in result["environment"], result["environment"]
    assert result["memory_limit"] == str(1 << 30), f"the size's memory is the limit: {result.get('memory_limit')}"
    assert not result["launcher_writable"], "the launcher is mounted read-only"
    assert wait(other, 60)[-1] == "CANCELED"


@check("an image that is not on this machine ends FAILED with the pod path's pull reason (never pulled)")
def _():
    missing = erin.upload(QiskitFunction(title="image-e2e-missing", provider="e2e", image="localhost/not-here:1"))
    job = missing.run()
    assert wait(job)[-1] == "ERROR"
    events = api(f"jobs/{job.job_id}/events/")
    reasons = json.dumps(events)
    assert "the container job could not start (ErrImagePull, image localhost/not-here:1)" in reasons, reasons
    assert "--image-pull never" in reasons, reasons


@check("serve killed with -9 during an image job: the restarted server finds the container, the job ends DONE with its whole log")
def _():
    job = function.run(mode="slow", lines=8, pause=1)
    deadline = time.monotonic() + 60
    while "slow line 1" not in (job.logs() or ""):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    SERVER["process"].send_signal(signal.SIGKILL)
    SERVER["process"].wait()
    time.sleep(2)
    start_server()
    assert wait(job, 90)[-1] == "DONE"
    lines = [line for line in job.logs().splitlines() if "slow line" in line]
    assert lines == [f"INFO: slow line {i}" for i in range(8)], lines
    assert f"gantry-job-{job.job_id}" not in containers()


@check("nothing is left: no job container, no job folder")
def _():
    assert containers() == [], containers()
    left = os.listdir(f"{DATA}/gantry/jobs")
    assert left == [], left


SERVER["process"].terminate()
SERVER["process"].wait(30)
if RESULTS["failed"]:
    print("--- gantry serve log (tail) ---")
    print("".join(open(os.path.join(DATA, "serve.log"), encoding="utf-8").readlines()[-80:]))
finish()

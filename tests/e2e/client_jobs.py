"""End-to-end checks of running jobs with the real qiskit-serverless client.

Usage: python client_jobs.py HOST
Expects a running `gantry serve` whose jobs run with a Python that has qiskit-serverless, and a
provider `e2e` administered by the user `e2e-erin`. Prints one line per check and
`N passed, N failed`; exits non-zero on any failure.
"""

import os
import sys
import tempfile
import time

from checks import check, finish, wait
from qiskit_serverless import QiskitFunction, ServerlessClient

HOST = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
HERE = os.path.dirname(os.path.abspath(__file__))
WORKING_DIR = os.path.join(HERE, "functions", "jobs")


alice = ServerlessClient(host=HOST, token="e2e-jobs-alice", channel="local")
erin = ServerlessClient(host=HOST, token="e2e-erin", channel="local")
function = alice.upload(QiskitFunction(title="jobs-e2e", entrypoint="main.py", working_dir=WORKING_DIR))
STATE = {}


@check("run with arguments, status goes to DONE, result and logs")
def _():
    job = function.run(values=[1, 2, 3, 4], mode="ok")
    seen = wait(job)
    assert seen[-1] == "DONE", seen
    assert set(seen) <= {"QUEUED", "INITIALIZING", "RUNNING", "DONE"}, seen
    result = job.result(cadence=0.2)
    assert result == {"total": 10, "mode": "ok", "job": job.job_id}, result
    logs = job.logs()
    assert "stdout: mode ok" in logs, logs
    assert "INFO: logger: started" in logs, logs
    STATE["done"] = job.job_id


@check("update_status shows RUNNING: EXECUTING_QPU")
def _():
    job = function.run(mode="status", seconds=5)
    seen = wait(job)
    assert "RUNNING: EXECUTING_QPU" in seen, seen
    assert seen[-1] == "DONE", seen


@check("a failing function ends ERROR with its send_error event, and result() raises")
def _():
    job = function.run(mode="fail")
    seen = wait(job)
    assert seen[-1] == "ERROR", seen
    events = job.events(type="ERROR")
    assert len(events) == 1, events
    # Text fields are trimmed as the reference's serializers trim them: no trailing newline.
    assert events[0].data["message"] == "ValueError: the widget broke", events[0].data
    expected = (
        "\n| Message: ValueError: the widget broke\n| Code: E42\n| Exception: WidgetError\n| Details:\n|   - widget: 7"
    )
    assert job.error_message() == expected, repr(job.error_message())
    try:
        job.result(cadence=0.2)
    except Exception as error:  # noqa: BLE001 - the client raises QiskitServerlessException
        text = str(error)
        assert "the widget broke" in text and "E42" in text and "WidgetError" in text, text
    else:
        raise AssertionError("result() of a failed job must raise")
    assert "widget failure" in job.logs()
    STATE["failed"] = job.job_id


@check("job.cancel(service=...) stops a sleeping job, CANCELED, process gone")
def _():
    job = function.run(mode="sleep")
    deadline = time.monotonic() + 60
    while "sleeping" not in (job.logs() or ""):
        assert time.monotonic() < deadline, "the sleeping job never started"
        time.sleep(0.2)
    # DATA_PATH is the user's file area: at once on local storage, copied back within seconds
    # where the job's folder is a copy of it (S3 storage, a pod).
    pid = None
    with tempfile.TemporaryDirectory() as folder:
        while pid is None:
            try:
                alice.file_download("pid.txt", function, target_name="pid.txt", download_location=folder)
                with open(os.path.join(folder, "pid.txt"), encoding="utf-8") as handle:
                    pid = int(handle.read())
            except Exception:  # noqa: BLE001 - not there yet
                assert time.monotonic() < deadline, "pid.txt never appeared in the user's files"
                time.sleep(0.5)
    assert os.path.exists(f"/proc/{pid}"), "the job's python process should be running"
    message = job.cancel(service={"channel": "local"})
    assert "stop" in message.lower(), message
    seen = wait(job, 60)
    assert seen[-1] == "CANCELED", seen
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z"), "process still running"
    logs = job.logs()
    assert "sleeping" in logs, repr(logs)


@check("jobs(status='DONE') filters")
def _():
    done = [job.job_id for job in alice.jobs(status="DONE", limit=50)]
    assert STATE["done"] in done, done
    assert STATE["failed"] not in done
    errored = [job.job_id for job in alice.jobs(status="ERROR", limit=50)]
    assert STATE["failed"] in errored, errored


@check("provider function: the admin reads provider_logs, the user log keeps [PUBLIC] lines only")
def _():
    provider_function = erin.upload(
        QiskitFunction(title="jobs-e2e-provider", provider="e2e", entrypoint="main.py", working_dir=WORKING_DIR)
    )
    job = provider_function.run(values=[5], mode="ok")
    assert wait(job)[-1] == "DONE"
    provider_logs = job.provider_logs()
    assert "provider logger: internal detail" in provider_logs, provider_logs
    assert "stdout: mode ok" in provider_logs, provider_logs
    user_logs = job.logs()
    assert "INFO: logger: started" in user_logs and "internal detail" not in user_logs, user_logs
    assert job.result(cadence=0.2)["total"] == 5



@check("logger and print lines keep the order they were written in, 20 runs (test_simple_function)")
def _():
    expected = []
    for i in range(10):
        expected += [f"INFO: logger line {i}", f"print line {i}"]
    expected += ["DELAY STARTS", "INFO: DELAY ENDS"]
    jobs = [function.run(mode="interleave") for _ in range(20)]
    for job in jobs:
        assert wait(job)[-1] == "DONE", job.job_id
        tail = job.logs().strip().splitlines()[-len(expected):]
        assert tail == expected, (job.job_id, tail)


@check("get_compute_profile() and get_function_size() in the job return its size's profile (both id forms)")
def _():
    sized = alice.upload(
        QiskitFunction(
            title="profile-e2e",
            entrypoint="main.py",
            working_dir=os.path.join(HERE, "functions", "profile"),
            sizes_map={"s": "1x2", "m": "cx3d-2x4"},
        )
    )
    fetched = alice.function("profile-e2e")
    assert {k.upper(): v for k, v in fetched.sizes().items()} == {"S": "1x2", "M": "cx3d-2x4"}, fetched.sizes()
    for size, profile in [("s", "1x2"), ("m", "cx3d-2x4")]:
        job = sized.run(function_size=size)
        assert wait(job)[-1] == "DONE", (job.job_id, job.logs())
        result = job.result(cadence=0.2)
        assert result == {"profile": profile, "size": size.upper()}, result
    # A profile Gantry cannot read is refused at upload, naming it.
    try:
        alice.upload(
            QiskitFunction(
                title="profile-bad", entrypoint="main.py", working_dir=os.path.join(HERE, "functions", "profile"),
                sizes_map={"s": "fast-please"},
            )
        )
    except Exception as error:  # noqa: BLE001 - the client raises QiskitServerlessException
        assert "fast-please" in str(error), str(error)
    else:
        raise AssertionError("an unreadable compute profile must be refused at upload")


finish()

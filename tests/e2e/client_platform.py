"""End-to-end checks of the real qiskit-serverless client against `gantry serve` with
SETTINGS_AUTH_MECHANISM=runtime_platform (IAM and the resource controller faked by the test):
the client's own `channel` and `instance` arguments, so the headers it really sends are the
ones checked.

Usage: python client_platform.py HOST API_KEY CRN OTHER_CRN
API_KEY is a key the fake IAM knows; CRN an instance on an entitled plan; OTHER_CRN one on a
plan that is not. Prints one line per check and `N passed, N failed`; exits non-zero on any
failure.
"""

import os
import sys
import tempfile

from checks import check, finish, wait
from qiskit_serverless import QiskitFunction, ServerlessClient

HOST, KEY, CRN, OTHER_CRN = sys.argv[1:5]
HERE = os.path.dirname(os.path.abspath(__file__))
WORKING_DIR = os.path.join(HERE, "functions", "jobs")


STATE = {}


@check("the default channel with an instance: upload, run, result, logs, update_status")
def _():
    client = ServerlessClient(host=HOST, token=KEY, instance=CRN)
    function = client.upload(QiskitFunction(title="platform-e2e", entrypoint="main.py", working_dir=WORKING_DIR))
    job = function.run(values=[2, 3], mode="status", seconds=4)
    seen = wait(job)
    # The job's own update_status call authenticated as the caller (channel and instance).
    assert "RUNNING: EXECUTING_QPU" in seen, seen
    assert seen[-1] == "DONE", seen
    result = job.result(cadence=0.2)
    assert result["total"] == 5, result
    assert "stdout: mode status" in job.logs()
    STATE["client"] = client


@check("channel ibm_cloud with the same key and instance")
def _():
    client = ServerlessClient(host=HOST, token=KEY, instance=CRN, channel="ibm_cloud")
    titles = [function.title for function in client.functions()]
    assert "platform-e2e" in titles, titles


@check("files of the function through the client")
def _():
    client = STATE["client"]
    function = client.function("platform-e2e")
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "platform-data.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"n": 1}')
    client.file_upload(path, function)
    assert "platform-data.json" in client.files(function), client.files(function)


@check("an unknown API key: the client refuses to start")
def _():
    try:
        ServerlessClient(host=HOST, token="not-a-key", instance=CRN)
    except Exception as error:  # noqa: BLE001 - the client raises a plain exception
        assert "Credentials couldn't be verified" in str(error), error
    else:
        raise AssertionError("the client started with an unknown key")


@check("an instance on a plan that is not entitled: the client refuses to start")
def _():
    try:
        ServerlessClient(host=HOST, token=KEY, instance=OTHER_CRN)
    except Exception as error:  # noqa: BLE001
        assert "Credentials couldn't be verified" in str(error), error
    else:
        raise AssertionError("the client started on a plan that is not entitled")


finish()

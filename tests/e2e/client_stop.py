"""End-to-end check of `stop` cancelling a job's quantum work, with the real qiskit-serverless
client against `gantry serve` whose IAM and runtime API are a fake run by the test
(tests/gateway/runtime_stop.rs, which also counts the calls the fake received).

The job reports its runtime jobs with the in-job client; the user stops it with
`job.stop(service=...)`, the service serialized by the client itself. The service is a real
`QiskitRuntimeService` whose account is set without the constructor: the constructor would
contact IBM Cloud (backends, instances), which the fake does not serve; what the client sends is
the account alone (`active_account()`), so it is the same.

Usage: python client_stop.py HOST API_KEY CRN
Prints one line per check and `N passed, N failed`; exits non-zero on any failure.
"""

import os
import sys
import time
import warnings

import requests
from checks import check, finish, wait
from qiskit_ibm_runtime import QiskitRuntimeService
from qiskit_ibm_runtime.accounts import Account
from qiskit_serverless import QiskitFunction, ServerlessClient

HOST, KEY, CRN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
STATE = {}


def runtime_service():
    service = QiskitRuntimeService.__new__(QiskitRuntimeService)
    service._account = Account.create_account(channel="ibm_quantum_platform", token=KEY, instance=CRN)
    return service


@check("a running job reports its runtime jobs")
def _():
    client = ServerlessClient(host=HOST, token="e2e-stopper", channel="local")
    function = client.upload(
        QiskitFunction(title="runtime-e2e", entrypoint="main.py", working_dir=os.path.join(HERE, "functions", "runtime"))
    )
    job = function.run()
    deadline = time.monotonic() + 60
    while "associated" not in job.logs():
        assert job.status() not in {"DONE", "ERROR", "CANCELED"}, job.logs()
        assert time.monotonic() < deadline, job.logs()
        time.sleep(0.2)
    assert sorted(job.runtime_jobs()) == ["e2e-rj-1", "e2e-rj-2", "e2e-rj-s", "e2e-rj-s2"], job.runtime_jobs()
    assert client.runtime_sessions(job.job_id) == ["e2e-session"]
    STATE["job"] = job


@check("job.stop(service=...) cancels each runtime job and closes the session once")
def _():
    job = STATE["job"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        message = job.stop(service=runtime_service())
    assert message == (
        f"Stop requested for job {job.job_id}; its status will show STOPPED once it has stopped."
        " Canceled runtime job [e2e-rj-1]."
        " Canceled runtime session: e2e-session and associated runtime jobs."
        " Canceled runtime job [e2e-rj-2]."
    ), message
    assert KEY not in message
    assert wait(job)[-1] == "CANCELED"


@check("the job's events and runtime jobs hold no credential")
def _():
    job = STATE["job"]
    events = str(job.events())
    assert KEY not in events, events
    assert KEY not in str(job.runtime_jobs())


@check("a stop without a service (the client's 'null'): the runtime jobs could not be stopped")
def _():
    # What the client sends when it has no service (an IBM channel whose account is invalid);
    # on the local channel it cannot serialize one and sends nothing at all.
    client = ServerlessClient(host=HOST, token="e2e-stopper", channel="local")
    job = client.function("runtime-e2e").run()
    reply = requests.post(
        f"{HOST}/api/v1/jobs/{job.job_id}/stop/",
        headers={"Authorization": "Bearer e2e-stopper"},
        json={"service": "null"},
        timeout=30,
    )
    message = reply.json()["message"]
    assert message.endswith(" QiskitRuntimeService not found, cannot stop runtime jobs."), message
    assert wait(job)[-1] == "CANCELED"


finish()

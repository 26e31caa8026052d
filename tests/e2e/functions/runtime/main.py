"""Reports runtime jobs the way a function that submits them does (the in-job client's
`associate_runtime_job_with_serverless_job`), then waits to be stopped."""

import time

from qiskit_serverless.utils.runtime_service_client import associate_runtime_job_with_serverless_job

for runtime_job, session in [
    ("e2e-rj-1", None),
    ("e2e-rj-s", "e2e-session"),
    ("e2e-rj-2", None),
    ("e2e-rj-s2", "e2e-session"),
]:
    assert associate_runtime_job_with_serverless_job(runtime_job, session), runtime_job
print("associated", flush=True)
time.sleep(300)

"""The launcher needs nothing from an image but a Python: image functions in old and bare
images on `gantry serve`, with the real client.

Usage: python client_old_images.py GANTRY_BIN ENGINE NAME=IMAGE...
Starts `gantry serve` with ENGINE as its container engine and a provider `old` administered by
`old-erin`, uploads one provider function per IMAGE (built by tests/old_images.sh, never
pulled, tests/e2e/functions/plain_image/main.py at /runner/main.py), runs each and checks it
SUCCEEDED inside that image. NAME says what the image is: `bullseye` (Debian 11, glibc 2.31)
or `python-only` (a Python, its libraries and its standard library: no /etc/os-release, no
shell, no libgcc_s, this machine's glibc). Prints one line per check and `N passed, N failed`;
exits non-zero on any failure.
"""

import atexit
import functools
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from checks import RESULTS, check, finish, wait
from image_serve import api as api_get, admin as gantry_admin, engine as run_engine, job_containers
from qiskit_serverless import QiskitFunction, ServerlessClient

GANTRY, ENGINE = sys.argv[1], sys.argv[2]
IMAGES = dict(argument.split("=", 1) for argument in sys.argv[3:])
DATA = tempfile.mkdtemp(prefix="gantry-old-images-")
os.chmod(DATA, 0o711)
PORT = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
HOST = f"http://127.0.0.1:{PORT}"

# The engine as the server runs it, `gantry admin` on this data dir, GETs as old-erin, the job
# containers left (tests/e2e/image_serve.py).
engine = functools.partial(run_engine, ENGINE)
admin = functools.partial(gantry_admin, GANTRY, f"{DATA}/gantry")
api = functools.partial(api_get, HOST, token="old-erin")
containers = functools.partial(job_containers, ENGINE)


# The Python-only image holds this machine's C library (its Python's ldd libraries).
HOST_GLIBC = list(platform.libc_ver())


def start_server():
    log = open(os.path.join(DATA, "serve.log"), "a", encoding="utf-8")
    process = subprocess.Popen(
        [GANTRY, "serve", "--listen", f"127.0.0.1:{PORT}", "--data-dir", f"{DATA}/gantry",
         "--container-engine", ENGINE, "--memory-gib-per-job", "1", "--cpu-per-job", "1",
         # Jobs call the gateway back by a host name: the static launcher resolves it inside
         # the image (its /etc/hosts), with no NSS library of the image's.
         "--public-url", f"http://localhost:{PORT}"],
        stdout=log, stderr=subprocess.STDOUT, env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{HOST}/readiness/", timeout=1)
            return process
        except OSError:
            assert process.poll() is None, open(os.path.join(DATA, "serve.log"), encoding="utf-8").read()
            time.sleep(0.1)
    raise AssertionError("gantry serve did not become ready")


def expect_bullseye(result):
    release = result["os_release"]
    assert release.get("ID") == "debian" and release.get("VERSION_ID") == "11", f"not Debian 11: {release}"
    assert result["libc"] == ["glibc", "2.31"], f"not bullseye's glibc 2.31: {result['libc']}"


def expect_python_only(result):
    assert result["os_release"] == {}, f"an /etc/os-release in the Python-only image: {result['os_release']}"
    assert not result["shell"], "a shell in the Python-only image"
    assert result["libgcc_s"] == [], f"libgcc_s in the Python-only image: {result['libgcc_s']}"
    assert result["libc"] == HOST_GLIBC, f"not this machine's glibc {HOST_GLIBC}: {result['libc']}"


EXPECT = {
    "bullseye": ("Debian 11 (bullseye) made by debootstrap: /etc/os-release 11, glibc 2.31", expect_bullseye),
    "python-only": ("a root filesystem with only a Python and its ldd libraries: no libgcc_s, no shell, no os-release",
                    expect_python_only),
}

atexit.register(shutil.rmtree, DATA, ignore_errors=True)
admin("create-provider", "old")
admin("add-admin", "--provider", "old", "--user", "old-erin")
SERVER = start_server()
atexit.register(SERVER.kill)
erin = ServerlessClient(host=HOST, token="old-erin", channel="local")

for name, image in IMAGES.items():
    what, expect = EXPECT[name]

    @check(f"{name}: an image function without the client SUCCEEDED in {what} ({image})")
    def _(name=name, image=image, expect=expect):
        function = erin.upload(QiskitFunction(title=f"old-{name}", provider="old", image=image))
        job = function.run(name=name)
        seen = wait(job, 180)
        answer = api(f"jobs/{job.job_id}/")
        provider_log = job.provider_logs() or ""
        for line in provider_log.splitlines():
            print(f"     | {line}")
        assert answer["status"] == "SUCCEEDED", (
            f"{answer['status']} ({answer.get('status_reason')}), statuses {seen}; provider log:\n{provider_log}"
        )
        assert f"plain function: hello {name}" in provider_log, f"the printed line is not in the provider log: {provider_log!r}"
        user_log = job.logs() or ""
        assert f"plain function: hello {name}, without the client" in user_log, f"no [PUBLIC] line in the user log: {user_log!r}"
        result = job.result(cadence=0.2)
        assert isinstance(result, dict) and result.get("name") == name, f"the RESULTS_PATH file is not the result: {result!r}"
        assert result["cwd"] == "/runner" and result["uid"] == 65532, result
        expect(result)
        statuses = [event.data.get("status") for event in job.events() if event.event_type == "STATUS_CHANGE"]
        assert statuses[0] == "SUCCEEDED" and "RUNNING" in statuses, statuses


@check("nothing is left: no job container, no job folder")
def _():
    deadline = time.monotonic() + 30
    while containers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers() == [], containers()
    assert os.listdir(f"{DATA}/gantry/jobs") == [], os.listdir(f"{DATA}/gantry/jobs")


SERVER.terminate()
SERVER.wait(30)
if RESULTS["failed"]:
    print("--- gantry serve log (tail) ---")
    print("".join(open(os.path.join(DATA, "serve.log"), encoding="utf-8").readlines()[-60:]))
finish()

"""End-to-end checks of the gateway foundation with the real qiskit-serverless client.

Usage: python client_foundation.py HOST
Drives a running `gantry serve` the way a user does: connect, upload a function folder, list and
read functions, and manage files. Prints one line per check and `N passed, N failed`; exits
non-zero on any failure.
"""

import os
import sys
import tempfile

from checks import check, finish
from qiskit_serverless import QiskitFunction, ServerlessClient

HOST = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
HERE = os.path.dirname(os.path.abspath(__file__))



alice = ServerlessClient(host=HOST, token="e2e-alice", channel="local")
bob = ServerlessClient(host=HOST, token="e2e-bob", channel="local")
function = QiskitFunction(
    title="hello-e2e",
    entrypoint="main.py",
    working_dir=os.path.join(HERE, "functions", "hello"),
    description="end-to-end test function",
    version="0.1.0",
)


@check("upload a function folder")
def _():
    uploaded = alice.upload(function)
    assert uploaded is not None
    assert uploaded.title == "hello-e2e", uploaded


@check("functions() lists it for its owner only")
def _():
    titles = [f.title for f in alice.functions()]
    assert "hello-e2e" in titles, titles
    assert "hello-e2e" not in [f.title for f in bob.functions()]


@check("function(title) reads it back with version and description")
def _():
    found = alice.function("hello-e2e")
    assert found is not None and found.title == "hello-e2e"
    assert found.version == "0.1.0", found.version
    assert found.description == "end-to-end test function"


@check("re-upload keeps one function")
def _():
    alice.upload(function)
    assert [f.title for f in alice.functions()].count("hello-e2e") == 1


@check("file_upload, files, file_download, file_delete")
def _():
    found = alice.function("hello-e2e")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "data.txt")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("some data\n" * 1000)
        answer = alice.file_upload(path, found)
        assert "data.txt" in answer, answer
        assert alice.files(found) == ["data.txt"], alice.files(found)
        target = os.path.join(folder, "downloads")
        os.makedirs(target)
        alice.file_download("data.txt", found, target_name="copy.txt", download_location=target)
        with open(os.path.join(target, "copy.txt"), encoding="utf-8") as handle:
            assert handle.read() == "some data\n" * 1000
        message = alice.file_delete("data.txt", found)
        assert "deleted" in message, message
        assert alice.files(found) == []


@check("dependencies_versions() returns the allow-list")
def _():
    versions = alice.dependencies_versions()
    assert isinstance(versions, list) and "mergedeep==1.3.4" in versions, versions


@check("an unknown function is an error, not a crash")
def _():
    try:
        bob.function("hello-e2e")
    except Exception as error:  # noqa: BLE001 - the client raises its own exception type
        assert "404" in str(error) or "doesn't exist" in str(error), error
    else:
        raise AssertionError("another user's function must not be found")


finish()

"""Fixtures of the console's browser tests: the gateway under test (started by run.sh, named by
GANTRY_CONSOLE_URL), headless Chromium driven by Playwright, a page per test that records every
request and response (checked for the token and the policy after each test) and saves a
screenshot, a direct API client to set up state, and a TCP proxy whose connections a test can
cut."""

import io
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from urllib.parse import urlparse

import pytest
import requests
from playwright.sync_api import expect, sync_playwright

BASE = os.environ.get("GANTRY_CONSOLE_URL", "http://127.0.0.1:8000").rstrip("/")
CHROMIUM = os.environ.get("GANTRY_TEST_CHROMIUM", "/usr/bin/chromium")
OUT = pathlib.Path(os.environ.get("GANTRY_TEST_OUT") or "target/console-screenshots")
HERE = pathlib.Path(__file__).resolve().parent
PROVIDER = os.environ.get("GANTRY_TEST_PROVIDER", "console")
PROVIDER_ADMIN = os.environ.get("GANTRY_TEST_PROVIDER_ADMIN", "console-erin")
FUNCTION = "console-demo"
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 60},
        "mode": {"enum": ["ok", "ticks", "sleep", "fail", "divide"]},
        "pause": {"type": "number", "minimum": 0},
    },
    "required": ["n"],
    "additionalProperties": False,
}
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}

expect.set_options(timeout=30_000)


def pytest_configure(config):
    config.addinivalue_line("markers", "viewport(width, height): the browser window's size for this test")


def function_tar() -> bytes:
    """The test function as the .tar an upload takes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(HERE / "function" / "main.py", arcname="main.py")
    return buffer.getvalue()


class Api:
    """The gateway's API as one user, for setting up and checking what the browser does."""

    def __init__(self, token: str, base: str = BASE):
        self.token = token
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def url(self, path: str) -> str:
        return f"{self.base}/api/v1/{path}"

    def get(self, path: str, **params):
        reply = self.session.get(self.url(path), params=params, timeout=30)
        reply.raise_for_status()
        return reply.json() if reply.content else None

    def post(self, path: str, **kwargs):
        reply = self.session.post(self.url(path), timeout=60, **kwargs)
        assert reply.ok, f"{path}: {reply.status_code} {reply.text}"
        return reply.json() if reply.content else None

    def upload_function(self, title: str = FUNCTION, **fields) -> dict:
        data = {"title": title, "entrypoint": "main.py", "arguments_schema": json.dumps(SCHEMA), **fields}
        return self.post("programs/upload/", data=data, files={"artifact": ("function.tar", function_tar())})

    def run(self, title: str = FUNCTION, provider: str | None = None, *, config: dict | None = None, **arguments) -> str:
        body = {"title": title, "arguments": json.dumps(arguments)}
        if provider:
            body["provider"] = provider
        if config is not None:
            body["config"] = config
        return self.post("programs/run/", json=body)["id"]

    def wait(self, job_id: str, statuses=TERMINAL, seconds: float = 90) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status = self.get(f"jobs/{job_id}/", with_result="false")["status"]
            if status in statuses:
                return status
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} did not reach {statuses} in {seconds} s (last {status})")


def gantry_admin(*arguments: str) -> str:
    """`gantry admin` on the gateway under test's data (run.sh names it), e.g. set-budget."""
    data = os.environ["GANTRY_TEST_DATA_DIR"]
    done = subprocess.run(
        [os.environ["GANTRY_BIN"], "admin", "--data-dir", data, *arguments], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"gantry admin {' '.join(arguments)}: {done.stdout}{done.stderr}"
    return done.stdout


# Every token a test used: no request URL may contain any of them.
TOKENS: list[str] = [PROVIDER_ADMIN]


def new_user(name: str) -> str:
    """A fresh user: with mock_token, each distinct token is its own user."""
    token = f"console-{name}-{uuid.uuid4().hex[:8]}"
    TOKENS.append(token)
    return token


@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-gpu",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()


class Recorder:
    """Every request and console response of a page, checked after its test."""

    def __init__(self):
        self.requests = []
        self.responses = []
        self.problems = []

    def attach(self, page):
        page.on("request", lambda request: self.requests.append(request))
        page.on("response", lambda response: self.responses.append(response))
        page.on("console", self.on_console)
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))

    def on_console(self, message):
        text = message.text
        if message.type == "error" and ("Content Security Policy" in text or "Refused to" in text):
            self.problems.append(f"policy violation: {text}")
        if message.type == "error" and "Uncaught" in text:
            self.problems.append(f"script error: {text}")

    def urls(self, part: str = "") -> list[str]:
        return [request.url for request in self.requests if part in request.url]


@pytest.fixture
def user(request):
    """A fresh user's token and API, with the test function uploaded."""
    token = new_user(request.node.name.removeprefix("test_")[:24].replace("_", "-"))
    api = Api(token)
    api.upload_function()
    return api


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def context(browser, request):
    """A fresh browser context at the viewport a test asks for (`@pytest.mark.viewport`)."""
    marker = request.node.get_closest_marker("viewport")
    width, height = marker.args if marker else (1180, 820)
    context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    yield context
    context.close()


@pytest.fixture
def page(context, recorder, request):
    page = context.new_page()
    recorder.attach(page)
    yield page
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        page.screenshot(path=str(OUT / f"{request.node.name}.png"), full_page=True)
    except Exception as error:  # noqa: BLE001 - a screenshot must not hide the test's own failure
        print(f"screenshot failed: {error}")
    check_requests(recorder)


def check_requests(recorder: Recorder):
    """After each test: no request carried a token in its URL; every console answer carried the
    policy; no policy violation or script error was reported."""
    for url in recorder.urls():
        for token in TOKENS:
            assert token not in url, f"a request carried the token in its URL: {url}"
        assert "authorization" not in url.lower() and "bearer" not in url.lower(), url
    for response in recorder.responses:
        if urlparse(response.url).path.startswith("/console/"):
            policy = response.headers.get("content-security-policy", "")
            assert "default-src 'none'" in policy and "script-src 'self'" in policy, (response.url, policy)
            assert response.headers.get("x-frame-options") == "DENY", response.url
    assert not recorder.problems, recorder.problems


def sign_in(page, token: str, base: str = BASE):
    """Opens the console and signs in with `token`."""
    if token not in TOKENS:
        TOKENS.append(token)
    page.goto(f"{base}/console/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def mark_page(page):
    """Marks the loaded document, so a test can tell that it was never reloaded."""
    page.evaluate("window.__gantryMarker = 'still here'")


def assert_not_reloaded(page):
    assert page.evaluate("window.__gantryMarker") == "still here", "the page was reloaded"


class CuttableProxy:
    """A TCP proxy to the gateway whose open connections `cut()` closes, as a network drop would."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.lock = threading.Lock()
        self.open = set()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                upstream = socket.create_connection(proxy.target)
                pair = (self.request, upstream)
                with proxy.lock:
                    proxy.open.add(pair)
                pump = threading.Thread(target=proxy.pump, args=(upstream, self.request), daemon=True)
                pump.start()
                proxy.pump(self.request, upstream)
                pump.join()
                with proxy.lock:
                    proxy.open.discard(pair)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def pump(source, sink):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        """Closes every open connection; returns how many there were."""
        with self.lock:
            pairs = list(self.open)
        for pair in pairs:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        return len(pairs)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy():
    match = re.match(r"https?://([^:/]+):(\d+)", BASE)
    assert match, BASE
    proxy = CuttableProxy(match.group(1), int(match.group(2)))
    yield proxy
    proxy.cut()
    proxy.close()


class OwnGateway:
    """A `gantry serve` of the test's own (the binary and job Python run.sh names), which the test
    stops (SIGTERM, as an orchestrator does) and starts again on the same port and data; `flags`
    go to `serve` (e.g. `--max-cpu-jobs 1`)."""

    def __init__(self, *flags: str):
        self.flags = list(flags)
        self.binary = os.environ["GANTRY_BIN"]
        self.python = os.environ["GANTRY_TEST_PYTHON"]
        self.dir = tempfile.mkdtemp(prefix="gantry-console-")
        # Jobs of a root server run as nobody: they must pass through the data dir's parent.
        os.chmod(self.dir, 0o711)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        # A grace longer than any wait of the tests: what ends before it ended by itself.
        self.grace = 60
        self.process = None
        self.start()

    def start(self):
        log = open(os.path.join(self.dir, "serve.log"), "ab")
        self.process = subprocess.Popen(
            [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", os.path.join(self.dir, "gantry"),
             "--python", self.python, "--shutdown-grace-seconds", str(self.grace), *self.flags],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"gantry serve exited: {self.log()}"
            try:
                if requests.get(f"{self.base}/readiness/", timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"gantry serve did not get ready: {self.log()}")

    def admin(self, *arguments: str) -> str:
        """`gantry admin` on this gateway's data (e.g. set-quota)."""
        done = subprocess.run(
            [self.binary, "admin", "--data-dir", os.path.join(self.dir, "gantry"), *arguments],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"gantry admin {' '.join(arguments)}: {done.stdout}{done.stderr}"
        return done.stdout

    def terminate(self):
        """SIGTERM, as an orchestrator sends it; `wait_stopped` waits for the end."""
        self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self):
        self.process.wait(timeout=self.grace + 10)

    def log(self) -> str:
        return pathlib.Path(self.dir, "serve.log").read_text(errors="replace")[-4000:]

    def close(self):
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        # Jobs it started that still run (their launchers outlive the server) are stopped by
        # their process groups' ends; the data goes.
        subprocess.run(["pkill", "-f", self.dir], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def own_gateway():
    gateway = OwnGateway()
    yield gateway
    gateway.close()

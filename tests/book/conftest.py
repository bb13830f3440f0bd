"""Fixtures for the built book: the README's `make book`, a local web server, headless Chromium."""
import functools
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="session")
def built_book():
    """Build the book exactly as the README says (`make book`); warnings are errors there.

    Under pytest-xdist each worker has its own session: a file lock makes the first worker build and
    the others reuse that build (one build per test run, identified by xdist's run id).
    """
    import fcntl

    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
    (ROOT / "_build").mkdir(exist_ok=True)
    marker = ROOT / "_build" / ".built-by-test-run"
    with open(ROOT / "_build" / ".book-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (marker.exists() and marker.read_text() == run_id):
            proc = subprocess.run(["make", "book"], cwd=ROOT, capture_output=True, text=True, timeout=3600)
            assert proc.returncode == 0, f"make book failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
            marker.write_text(run_id)
    return HTML


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def book_server(built_book):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(built_book)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="session")
def browser():
    exe = chromium_path()
    if not exe:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does it)")
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("PLAYWRIGHT_BROWSERS_PATH", "0")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()

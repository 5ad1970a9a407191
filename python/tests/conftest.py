"""Starts real servers in subprocesses and reads their logs."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVING = re.compile(r"serving http://[^:]+:(\d+)")


class Server:
    """A server process: its port, its pid and everything it has logged so far."""

    def __init__(self, argv, cwd=HERE, env=None, serving=SERVING):
        serving = re.compile(serving) if isinstance(serving, str) else serving
        self.proc = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        self.lines = []
        self.port = None
        self._seen = threading.Condition()
        self._serving = serving
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.time() + 30
        with self._seen:
            while self.port is None:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError("server did not start:\n" + self.log())
                self._seen.wait(0.1)
        self.base = f"http://127.0.0.1:{self.port}"

    def _read(self):
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line)
                m = self._serving.search(line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                self._seen.notify_all()

    def log(self):
        with self._seen:
            return "".join(self.lines)

    def wait_for(self, pattern, timeout=10):
        """Waits until a log line matches `pattern`; returns the match."""
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        with self._seen:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                if time.time() > deadline:
                    raise AssertionError(f"no log line matches {pattern!r}:\n" + "".join(self.lines))
                self._seen.wait(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def native():
    s = Server([sys.executable, "native_app.py", "0", "1"])
    yield s
    s.stop()


@pytest.fixture
def start_server():
    started = []

    def start(argv, **kw):
        s = Server(argv, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def canter_load(url, *args):
    """Runs `canter load URL ARGS --json` (the binary the Rust test names in CANTER_BIN) and
    returns its report."""
    import json

    binary = os.environ.get("CANTER_BIN")
    if not binary:
        pytest.fail("CANTER_BIN is not set: run these tests through cargo test")
    out = subprocess.run([binary, "load", url, "--json", "--no-progress", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def curl_h2(url):
    """GETs `url` with curl over HTTP/2 with prior knowledge; returns the body and, after a
    newline, the HTTP version curl used."""
    import shutil

    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed")
    out = subprocess.run([curl, "-s", "--http2-prior-knowledge", "-w", "\n%{http_version}", url],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout

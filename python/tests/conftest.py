"""Starts real servers in subprocesses and reads their logs."""

import os
import re
import signal
import socket
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
        self.eof = False
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
        with self._seen:
            self.eof = True
            self._seen.notify_all()

    def log(self):
        """Everything logged so far; once the process has exited, everything it logged (the
        reader thread may not have taken its last lines yet when it is reaped)."""
        deadline = time.time() + 10
        with self._seen:
            while self.proc.poll() is not None and not self.eof and time.time() < deadline:
                self._seen.wait(0.1)
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

    def wait_for_count(self, text, n, timeout=10):
        """Waits until `text` has been logged `n` times (lines are read by a thread of their
        own: what the server printed may not be here yet)."""
        deadline = time.time() + timeout
        with self._seen:
            while True:
                seen = "".join(self.lines).count(text)
                if seen >= n:
                    return seen
                if time.time() > deadline:
                    raise AssertionError(f"{text!r} logged {seen} times, not {n}")
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


def websockets_that_leave(port, path, n, rst):
    """Opens `n` WebSockets on `path` (HTTP/1.1 upgrades), sends each a text message and reads
    its echo, then leaves them without a close frame: a FIN, or an RST with `rst`."""
    import base64
    import struct

    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            piece = s.recv(4096)
            assert piece, "closed during the upgrade"
            head += piece
        assert head.startswith(b"HTTP/1.1 101"), head
        # One masked text frame ("hi"), and its echo back: the handler is in its loop.
        s.sendall(bytes([0x81, 0x82]) + b"\x00\x00\x00\x00" + b"hi")
        echo = head.split(b"\r\n\r\n", 1)[1]
        while len(echo) < 4:
            echo += s.recv(4096)
        assert echo[:4] == b"\x81\x02hi", echo
        socks.append(s)
    for s in socks:
        if rst:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def wait_until_no_websocket_is_live(port, within=10.0):
    """Polls `/ws/live` until the app counts no running echo handler; the seconds it took."""
    import json
    import urllib.request

    start = time.time()
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ws/live", timeout=10) as r:
            live = json.load(r)["live"]
        if live == 0:
            return time.time() - start
        assert time.time() - start < within, f"{live} WebSocket handler(s) still running"
        time.sleep(0.02)


def _socket_queues(local, remote):
    """(send queue, receive queue) in bytes of the IPv4 TCP socket bound to `local` and
    connected to `remote`, from /proc/net/tcp; None if there is none."""

    def proc(addr):
        host, port = addr[0], addr[1]
        word = int.from_bytes(socket.inet_aton(host), sys.byteorder)
        return f"{word:08X}:{port:04X}"

    want = (proc(local), proc(remote))
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == want:
                tx, rx = fields[4].split(":")
                return int(tx, 16), int(rx, 16)
    return None


def wait_read_by_peer(sock, within=20.0):
    """Waits until the server has read every byte sent on `sock` (our send queue and its
    socket's receive queue are empty, as the kernel counts them): the request is in its hands."""
    local, peer = sock.getsockname(), sock.getpeername()
    deadline = time.time() + within
    while True:
        ours, theirs = _socket_queues(local, peer), _socket_queues(peer, local)
        if ours is not None and theirs is not None and ours[0] == 0 and theirs[1] == 0:
            return
        assert time.time() < deadline, f"the server did not read the request: {ours} {theirs}"
        time.sleep(0.005)

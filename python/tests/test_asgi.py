"""`python -m canter serve` with a real Starlette app and a real FastAPI app, driven by httpx,
requests and curl."""

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

import httpx
import pytest
import requests


def serve(start_server, target, *args):
    return start_server([sys.executable, "-m", "canter", "serve", target, "--port", "0",
                         "--body-limit", str(256 * 1024), *args])


@pytest.fixture(scope="module")
def starlette_app():
    from conftest import Server

    s = Server([sys.executable, "-m", "canter", "serve", "asgi_app:app", "--port", "0",
                "--body-limit", str(256 * 1024)])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fastapi_app():
    from conftest import Server

    s = Server([sys.executable, "-m", "canter", "serve", "asgi_app:api", "--port", "0",
                "--workers", "2"])
    yield s
    s.stop()


def test_starlette_responses(starlette_app):
    with httpx.Client(base_url=starlette_app.base, timeout=10) as c:
        r = c.get("/")
        assert r.status_code == 200 and r.text == "Hello, World!"
        assert r.headers["content-type"] == "text/plain; charset=utf-8"
        assert r.headers["content-length"] == "13"
        assert r.headers["server"] == "canter"
        assert c.get("/json").json() == {"message": "Hello, World!"}
        assert c.get("/nope").status_code == 404
        assert c.post("/").status_code == 405


def test_lifespan_state_reaches_requests(starlette_app):
    assert requests.get(starlette_app.base + "/state", timeout=10).text == "hello from lifespan"
    starlette_app.wait_for(r"lifespan startup pid \d+")


def test_scope(starlette_app):
    r = requests.get(starlette_app.base + "/scope/a%20b/c?x=1&y=%2F", timeout=10,
                     headers={"X-Custom": "Value"})
    s = r.json()
    assert s["path"] == "/scope/a b/c"
    assert s["raw_path"] == "/scope/a%20b/c"
    assert s["query_string"] == "x=1&y=%2F"
    assert s["method"] == "GET" and s["http_version"] == "1.1" and s["scheme"] == "http"
    assert s["client"][0] == "127.0.0.1" and s["server"] == ["127.0.0.1", starlette_app.port]
    assert ["x-custom", "Value"] in s["headers"]
    assert s["asgi"]["version"] == "3.0"


def test_request_bodies(starlette_app):
    r = requests.post(starlette_app.base + "/echo", data="hello body", timeout=10)
    assert r.text == "hello body" and r.headers["x-len"] == "10"
    # Streamed in: chunked upload read with request.stream().
    pieces = [b"z" * 50_000 for _ in range(4)]
    r = requests.post(starlette_app.base + "/upload", data=iter(pieces), timeout=10)
    body = r.json()
    assert body["bytes"] == 200_000 and body["chunks"] >= 1
    # Over the limit: refused by the engine.
    r = requests.post(starlette_app.base + "/echo", data=b"x" * (256 * 1024 + 1), timeout=10)
    assert r.status_code == 413


def test_streamed_response(starlette_app):
    n = 100_000
    with requests.get(starlette_app.base + f"/stream?n={n}", timeout=30, stream=True) as r:
        assert r.headers["transfer-encoding"] == "chunked"
        text = r.content.decode()
    assert text.count("\n") == n and text.endswith(f"line {n - 1}\n")


def test_client_disconnect_is_seen_by_the_app(starlette_app):
    with socket.create_connection(("127.0.0.1", starlette_app.port), timeout=10) as s:
        s.sendall(b"GET /watch HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while len(got) < 4096:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
    starlette_app.wait_for(r"client disconnected at \d+")


def test_exceptions_answer_500_and_the_worker_keeps_serving(starlette_app):
    r = requests.get(starlette_app.base + "/boom", timeout=10)
    assert r.status_code == 500
    starlette_app.wait_for(r"RuntimeError: boom in a Starlette endpoint")
    assert requests.get(starlette_app.base + "/", timeout=10).status_code == 200


def test_sync_endpoints_and_background_tasks(starlette_app):
    assert requests.get(starlette_app.base + "/sync", timeout=10).text == "from a thread"
    assert requests.get(starlette_app.base + "/background", timeout=10).text == "queued"
    starlette_app.wait_for(r"background task ran")


def test_http2_and_curl(starlette_app):
    from conftest import curl_h2

    assert curl_h2(starlette_app.base + "/json") == '{"message":"Hello, World!"}\n2'


def test_fastapi(fastapi_app):
    with httpx.Client(base_url=fastapi_app.base, timeout=10) as c:
        r = c.post("/items", json={"name": "pen", "price": 1.5, "tags": ["a"]})
        assert r.status_code == 201
        assert r.json() == {"name": "pen", "price": 1.5, "tags": ["a"]}
        r = c.post("/items", json={"name": "pen"})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "price"]
        assert c.get("/items/5", params={"q": "x"}).json() == {"item_id": 5, "q": "x"}
        r = c.get("/items/404")
        assert r.status_code == 404 and r.json() == {"detail": "no such item"}
        assert c.get("/items/abc").status_code == 422
        assert c.get("/plaintext").text == "Hello, World!"
        schema = c.get("/openapi.json").json()
        assert "/items/{item_id}" in schema["paths"]


def test_fastapi_with_curl(fastapi_app):
    out = subprocess.run(["curl", "-s", "-X", "POST", "-H", "content-type: application/json",
                          "-d", '{"name":"cup","price":2}', fastapi_app.base + "/items"],
                         capture_output=True, text=True, timeout=20)
    assert json.loads(out.stdout) == {"name": "cup", "price": 2.0, "tags": []}


def test_sigterm_runs_lifespan_shutdown(start_server):
    s = serve(start_server, "asgi_app:app", "--workers", "2")
    assert requests.get(s.base + "/state", timeout=10).status_code == 200
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(15) == 0
    log = s.log()
    assert log.count("lifespan startup pid") == 2
    assert log.count("lifespan shutdown pid") == 2


def test_an_app_without_lifespan_still_serves(start_server, tmp_path):
    (tmp_path / "bare.py").write_text(
        "async def app(scope, receive, send):\n"
        "    assert scope['type'] == 'http'\n"
        "    await send({'type': 'http.response.start', 'status': 200,\n"
        "                'headers': [(b'content-type', b'text/plain')]})\n"
        "    await send({'type': 'http.response.body', 'body': b'bare', 'more_body': True})\n"
        "    await send({'type': 'http.response.body', 'body': b' app'})\n"
    )
    s = serve(start_server, "bare:app", "--app-dir", str(tmp_path))
    s.wait_for(r"does not support lifespan")
    r = requests.get(s.base + "/", timeout=10)
    assert r.text == "bare app"


def test_an_app_that_returns_on_the_lifespan_scope_still_serves(start_server, tmp_path):
    # The other common shape: `if scope["type"] != "http": return`, neither raising nor
    # answering lifespan.startup. The worker must not wait for a startup that never comes.
    (tmp_path / "quiet.py").write_text(
        "async def app(scope, receive, send):\n"
        "    if scope['type'] != 'http':\n"
        "        return\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
        "    await send({'type': 'http.response.body', 'body': b'quiet app'})\n"
    )
    s = serve(start_server, "quiet:app", "--app-dir", str(tmp_path))
    s.wait_for(r"returned from the lifespan scope without starting up")
    assert requests.get(s.base + "/", timeout=10).text == "quiet app"
    assert s.stop() == 0


def self_signed(tmp_path):
    """A certificate for 127.0.0.1 made by openssl; its (cert, key) paths."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def test_tls_listener_and_the_https_scheme(start_server, tmp_path):
    cert, key = self_signed(tmp_path)
    s = serve(start_server, "asgi_app:app", "--tls-port", "0", "--tls-cert", str(cert),
              "--tls-key", str(key))
    tls_port = int(s.wait_for(r"serving https://[^:]+:(\d+)").group(1))
    r = requests.get(f"https://127.0.0.1:{tls_port}/scope/x", verify=str(cert), timeout=10)
    assert r.json()["scheme"] == "https"
    assert requests.get(s.base + "/scope/x", timeout=10).json()["scheme"] == "http"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=10) as c:
        assert c.get(f"https://127.0.0.1:{tls_port}/").text == "Hello, World!"
    out = subprocess.run(["curl", "-s", "--http2", "--cacert", str(cert), "-w",
                          "\n%{http_version}", f"https://127.0.0.1:{tls_port}/json"],
                         capture_output=True, text=True, timeout=20)
    assert out.stdout == '{"message":"Hello, World!"}\n2', out.stderr


async def h3_get(port, path):
    """GET `path` over HTTP/3 with aioquic (any certificate): (headers, body)."""
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration

    class Client(QuicConnectionProtocol):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.h3 = H3Connection(self._quic)
            self.done = asyncio.get_running_loop().create_future()
            self.headers, self.body = {}, b""

        def quic_event_received(self, event):
            for ev in self.h3.handle_event(event):
                if isinstance(ev, HeadersReceived):
                    self.headers.update({k.decode(): v.decode() for k, v in ev.headers})
                elif isinstance(ev, DataReceived):
                    self.body += ev.data
                if getattr(ev, "stream_ended", False) and not self.done.done():
                    self.done.set_result(None)

    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE)
    async with connect("127.0.0.1", port, configuration=config, create_protocol=Client) as c:
        sid = c._quic.get_next_available_stream_id()
        c.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                (b":authority", b"localhost"), (b":path", path.encode())],
                          end_stream=True)
        c.transmit()
        await asyncio.wait_for(c.done, 20)
        return c.headers, c.body


def test_http3_serves_the_same_app(start_server, tmp_path):
    """--http3: the app over HTTP/3 (scope http_version "3", scheme https), advertised to
    HTTPS clients with Alt-Svc."""
    cert, key = self_signed(tmp_path)
    s = serve(start_server, "asgi_app:app", "--tls-port", "0", "--tls-cert", str(cert),
              "--tls-key", str(key), "--http3")
    tls_port = int(s.wait_for(r"serving https://[^:]+:(\d+)").group(1))
    r = requests.get(f"https://127.0.0.1:{tls_port}/", verify=str(cert), timeout=10)
    assert r.headers["alt-svc"] == f'h3=":{tls_port}"; ma=86400', r.headers
    headers, body = asyncio.run(h3_get(tls_port, "/scope/x"))
    assert headers[":status"] == "200", headers
    scope = json.loads(body)
    assert scope["http_version"] == "3" and scope["scheme"] == "https", scope
    headers, body = asyncio.run(h3_get(tls_port, "/"))
    assert body == b"Hello, World!" and "alt-svc" not in headers, headers


def test_a_client_that_does_not_read_stops_the_app(start_server):
    """Backpressure: a streamed response is pulled only as the client reads, so an app that
    could write 100 MB stops a few MB in (socket buffers and 64 KiB queued), and ends when the
    client goes."""
    s = serve(start_server, "asgi_app:app")
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(b"GET /firehose HTTP/1.1\r\nHost: x\r\n\r\n")
    # Waited for, not assumed after a fixed time: the producer stalls (the same count twice,
    # half a second apart; a busy machine may take longer to fill the buffers).
    deadline = time.time() + 30
    first = requests.get(s.base + "/produced", timeout=10).json()
    while True:
        time.sleep(0.5)
        second = requests.get(s.base + "/produced", timeout=10).json()
        if second["n"] == first["n"] and second["n"] > 0:
            break
        assert time.time() < deadline, ("still producing", first, second)
        first = second  # stalled, not still producing
    assert 0 < second["n"] < 20_000, second  # under 20 MB of the 100 MB
    assert not second["done"]
    sock.close()
    deadline = time.time() + 10
    while not requests.get(s.base + "/produced", timeout=10).json()["done"]:
        assert time.time() < deadline, "the app kept running after the client left"
        time.sleep(0.05)
    assert requests.get(s.base + "/produced", timeout=10).json()["n"] < 20_000
    # Starlette (ASGI spec 2.4) raised ClientDisconnect out of the app: a client going away
    # is no server error, so no ERROR line and no traceback.
    time.sleep(0.5)
    log = s.log()
    assert "exception in handler" not in log and "Traceback" not in log, log


def test_under_load_every_request_is_answered(starlette_app, fastapi_app):
    from conftest import canter_load

    for url, extra in ((starlette_app.base + "/", ["-c", "200"]),
                       (starlette_app.base + "/json", ["-c", "50", "--pipeline", "8"]),
                       (fastapi_app.base + "/items/7?q=x", ["-c", "100"])):
        report = canter_load(url, "-d", "2s", *extra)
        assert report["requests"] > 1000, report
        assert sum(report["errors"].values()) == 0, report
        assert not report.get("non2xx"), report
    assert requests.get(starlette_app.base + "/", timeout=10).status_code == 200


def test_engine_limits_from_the_command_line(start_server):
    s = serve(start_server, "asgi_app:app", "--max-target", "64", "--max-headers", "10",
              "--head-timeout", "0.5", "--pin")
    assert requests.get(s.base + "/", timeout=10).status_code == 200
    assert requests.get(s.base + "/" + "t" * 80, timeout=10).status_code == 414
    many = {f"x-h{i}": "1" for i in range(12)}
    assert requests.get(s.base + "/", headers=many, timeout=10).status_code == 431
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
        started = time.monotonic()
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Half")
        answer = c.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert 0.45 <= time.monotonic() - started < 2.0


def test_a_setting_out_of_range_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "canter", "serve", "asgi_app:app", "--port", "0",
                          "--max-head", "0"], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 2, out.stderr
    assert "invalid max_head" in out.stderr, out.stderr


CYCLES = """
import asyncio, gc

gc.disable()  # only the collection below, on another thread, frees the cycles


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    cycle = {"receive": receive, "send": send}
    cycle["self"] = cycle  # as Django keeps them: freed only by the cycle collector
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
    del cycle
    if scope["path"] == "/collect":
        await asyncio.to_thread(gc.collect)
"""


def test_receive_and_send_freed_on_another_thread(start_server, tmp_path):
    """An app that keeps `receive` and `send` in a reference cycle has them freed by the cycle
    collector on whatever thread runs it: safe there, nothing logged, the exchange released
    on its worker."""
    (tmp_path / "cycles.py").write_text(CYCLES)
    s = serve(start_server, "cycles:app", "--app-dir", str(tmp_path))
    pid = s.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        (worker,) = f.read().split()

    def rss_kib():
        with open(f"/proc/{worker}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

    def requests_through(c, n):
        for i in range(n):
            path = "/collect" if i % 50 == 49 else "/"
            r = c.get(s.base + path, timeout=10)
            assert r.status_code == 200 and r.text == "ok", r

    with requests.Session() as c:
        requests_through(c, 1000)
        before = rss_kib()
        # A leaked exchange cost about 0.8 KB a request: 4 MB here.
        requests_through(c, 5000)
        grown = rss_kib() - before
    assert grown < 1536, f"the worker grew {grown} KiB in 5,000 requests"
    time.sleep(0.3)
    log = s.log()
    assert "unsendable" not in log and "RuntimeError" not in log, log
    assert s.proc.poll() is None


def test_a_websocket_upgrade_to_a_path_without_a_websocket_route_gets_403(starlette_app):
    """An upgrade reaches the app as a `websocket` scope, never as an `http` one (where an app
    that ignores the scope type answers 200); Starlette closes a scope no route takes before
    accepting: 403, as uvicorn answers."""
    with socket.create_connection(("127.0.0.1", starlette_app.port), timeout=10) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        answer = c.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403 "), answer
    assert requests.get(starlette_app.base + "/", timeout=10).text == "Hello, World!"


FAILING_STARTUP = """
from contextlib import asynccontextmanager
from starlette.applications import Starlette


@asynccontextmanager
async def lifespan(app):
    raise RuntimeError("no database configured")
    yield


app = Starlette(lifespan=lifespan)
"""


def test_a_startup_failure_is_reported_once_and_exits(tmp_path):
    """A lifespan startup that raises is the app's configuration: said once with its
    traceback, never "serving", no restarts, exit status 3 (as uvicorn)."""
    (tmp_path / "failing.py").write_text(FAILING_STARTUP)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "canter", "serve", "failing:app", "--port", "0",
                          "--workers", "2", "--app-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 3, out.stderr
    assert time.monotonic() - started < 20
    err = out.stderr
    assert "serving http" not in err and "restarting" not in err, err
    assert err.count("the app failed to start in 2 of 2 worker(s)") == 1, err
    assert err.count("RuntimeError: no database configured") == 1, err
    assert len(err.splitlines()) < 60, err


def test_log_lines_to_a_pipe_are_not_coloured(start_server):
    """Log lines written to a pipe (or a file) carry no colour codes: the engine's own lines
    (its shutdown, here) as much as Python's."""
    s = serve(start_server, "asgi_app:app")
    assert requests.get(s.base + "/", timeout=10).status_code == 200
    assert s.stop() == 0
    log = s.log()
    assert "canter_rt::core::server: shutting down" in log, log
    assert "\x1b[" not in log, log

"""The native API against a real server process, with real clients (http.client, requests,
curl and raw sockets)."""

import http.client
import json
import signal
import socket
import sys
import threading
import time

import pytest
import requests


def get(server, path, **kw):
    return requests.get(server.base + path, timeout=10, **kw)


def test_plaintext_and_json(native):
    r = get(native, "/")
    assert r.status_code == 200
    assert r.text == "Hello, World!"
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.headers["server"] == "canter"
    r = get(native, "/json")
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"message": "Hello, World!", "n": 1, "pi": 3.5, "ok": True, "none": None,
                        "l": [1, "a"]}


def test_json_matches_the_json_module_on_awkward_values(native):
    payload = {"s": "quote\" back\\ nl\n tab\t ctl\x01 é 😀", "big": 2**70, "neg": -5,
               "f": 0.1, "e": 1e300, "nested": [[[{"k": []}]]], "t": [1, 2]}
    r = requests.post(native.base + "/items", json=payload, timeout=10)
    assert r.status_code == 201
    assert r.headers["x-id"] == "1"
    assert json.loads(r.content) == payload


def test_path_parameters_are_decoded_and_passed_by_name(native):
    assert get(native, "/hello/w%C3%A9rld%20x").text == "Hello, wérld x!"
    r = get(native, "/pair/one/two").json()
    assert r == {"a": "one", "b": "two", "params": {"a": "one", "b": "two"}}
    assert get(native, "/files/a/b/c.txt").text == "a/b/c.txt"


def test_request_attributes(native):
    conn = http.client.HTTPConnection("127.0.0.1", native.port, timeout=10)
    conn.putrequest("GET", "/inspect?a=1&b=x+y&a=2&c=%2F", skip_accept_encoding=True)
    conn.putheader("X-Token", "secret")
    conn.putheader("X-Many", "1")
    conn.putheader("X-Many", "2")
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 200
    body = json.loads(r.read())
    assert body == {
        "method": "GET", "path": "/inspect", "raw_path": "/inspect",
        "query_string": "a=1&b=x+y&a=2&c=%2F", "query": {"a": "1", "b": "x y", "c": "/"},
        "x_token": "secret", "has_accept": False, "many": ["1", "2"],
        "client_host": "127.0.0.1", "version": "1.1",
    }


def test_body_and_json_errors_come_from_the_engine(native):
    r = requests.post(native.base + "/items", data=b"{}", timeout=10,
                      headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert r.json()["status"] == 415
    r = requests.post(native.base + "/items", data=b"{bad", timeout=10,
                      headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "invalid JSON" in r.json()["error"]
    r = requests.post(native.base + "/echo", data=b"x" * 1000, timeout=10)
    assert r.status_code == 200 and r.headers["x-len"] == "1000" and r.content == b"x" * 1000


def test_a_body_over_the_limit_is_refused_before_python_runs(native):
    before = get(native, "/calls").json()["calls"]
    r = requests.post(native.base + "/echo", data=b"x" * (64 * 1024 + 1), timeout=10)
    assert r.status_code == 413
    # Chunked, so the size is known only while reading.
    r = requests.post(native.base + "/echo", data=iter([b"y" * 40000, b"y" * 40000]), timeout=10)
    assert r.status_code == 413
    assert get(native, "/calls").json()["calls"] == before


def test_bad_requests_are_answered_by_the_engine(native):
    before = get(native, "/calls").json()["calls"]
    with socket.create_connection(("127.0.0.1", native.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        data = s.recv(4096)
    assert data.startswith(b"HTTP/1.1 400 ")
    assert get(native, "/calls").json()["calls"] == before


def test_an_exception_answers_500_logs_the_traceback_and_the_worker_keeps_serving(native):
    r = get(native, "/boom")
    assert r.status_code == 500
    assert r.json() == {"error": "internal server error", "status": 500}
    native.wait_for(r"RuntimeError: boom from a handler")
    assert 'raise RuntimeError("boom from a handler")' in native.log()
    r = get(native, "/aboom")
    assert r.status_code == 500
    native.wait_for(r"ValueError: boom from an async handler")
    assert get(native, "/").status_code == 200


def test_return_values(native):
    r = get(native, "/teapot")
    assert r.status_code == 418 and r.json() == {"error": "short and stout", "status": 418}
    r = get(native, "/none")
    assert r.status_code == 204 and r.content == b""
    r = get(native, "/bytes")
    assert r.content == b"\x00\x01binary"
    assert r.headers["content-type"] == "application/octet-stream"
    for _ in range(3):
        r = get(native, "/prebuilt")
        assert r.text == "prebuilt\n" and r.headers["x-prebuilt"] == "yes"
    r = get(native, "/bad-return")
    assert r.status_code == 500
    native.wait_for(r"TypeError: a handler returned int")


def test_methods_and_routing(native):
    assert requests.put(native.base + "/multi", timeout=10).text == "PUT"
    assert get(native, "/multi").text == "GET"
    r = requests.delete(native.base + "/multi", timeout=10)
    assert r.status_code == 405
    assert "GET" in r.headers["allow"] and "PUT" in r.headers["allow"]
    assert get(native, "/nowhere").status_code == 404
    r = requests.head(native.base + "/", timeout=10)
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "13"


def test_async_handlers_run_concurrently_on_the_worker_loop(native):
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", get(native, "/wait")))
    t.start()
    time.sleep(0.2)
    assert "r" not in got  # still waiting for the event
    assert get(native, "/").status_code == 200  # the worker serves meanwhile
    assert get(native, "/release").text == "ok"
    t.join(10)
    assert got["r"].text == "released"
    assert get(native, "/sleep?s=0.01").json() == {"slept": True}


def test_streamed_responses(native):
    r = get(native, "/stream?n=5")
    assert r.headers["transfer-encoding"] == "chunked"
    assert r.text == "".join(f"piece {i}\n" for i in range(5))
    r = get(native, "/astream")
    assert r.text == "apiece 0\napiece 1\napiece 2\n"


def test_a_large_stream_is_pulled_while_the_client_reads(native):
    n = 200_000
    with socket.create_connection(("127.0.0.1", native.port), timeout=20) as s:
        s.sendall(f"GET /stream?n={n} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            chunk = s.recv(1 << 16)
            assert chunk
            data += chunk
    body = data.split(b"\r\n\r\n", 1)[1]
    assert body.count(b"piece ") == n


def test_file_response(native):
    r = get(native, "/file")
    assert r.text == "hello from a file\n"
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.headers["content-length"] == "18"


def test_pipelined_requests_are_answered_in_one_write(native):
    n = 16
    with socket.create_connection(("127.0.0.1", native.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * n)
        time.sleep(0.3)
        data = s.recv(1 << 20)
    assert data.count(b"HTTP/1.1 200 OK") == n
    assert data.count(b"Hello, World!") == n


def test_http2_with_prior_knowledge(native):
    from conftest import curl_h2

    assert curl_h2(native.base + "/hello/h2") == "Hello, h2!\n2"


def test_a_worker_that_dies_is_restarted(start_server):
    s = start_server([sys.executable, "native_app.py", "0", "2"])
    pids = {get(s, "/calls").json()["pid"] for _ in range(40)}
    with pytest.raises(requests.ConnectionError):
        get(s, "/die")
    s.wait_for(r"worker \d \(pid \d+\) exited with status 3: restarting it")
    deadline = time.time() + 10
    while True:
        try:
            if get(s, "/").status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.time() < deadline
        time.sleep(0.05)
    assert s.proc.poll() is None
    assert len(pids) >= 1


def test_sigterm_drains_in_flight_requests(start_server):
    from conftest import wait_read_by_peer

    s = start_server([sys.executable, "native_app.py", "0", "1"])
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
        c.sendall(b"GET /sleep?s=0.5 HTTP/1.1\r\nHost: x\r\n\r\n")
        # The request is in the server's hands before the signal (waited for, not assumed).
        wait_read_by_peer(c)
        s.proc.send_signal(signal.SIGTERM)
        data = b""
        while not data.endswith(b'{"slept":true}'):
            chunk = c.recv(4096)
            assert chunk, f"closed before the answer: {data!r}"
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 "), data
    assert s.proc.wait(10) == 0
    assert "stopped" in s.log()


def test_tls_on_the_native_api(start_server, tmp_path):
    from test_asgi import self_signed

    cert, key = self_signed(tmp_path)
    (tmp_path / "tls_app.py").write_text(
        "import sys, canter\n"
        "app = canter.App()\n"
        "@app.get('/scheme')\n"
        "def scheme(req):\n"
        "    return req.scheme\n"
        f"app.run(port=0, tls_port=0, tls_cert={str(cert)!r}, tls_key={str(key)!r})\n"
    )
    s = start_server([sys.executable, str(tmp_path / "tls_app.py")])
    tls_port = int(s.wait_for(r"serving https://[^:]+:(\d+)").group(1))
    assert requests.get(f"https://127.0.0.1:{tls_port}/scheme", verify=str(cert),
                        timeout=10).text == "https"
    assert get(s, "/scheme").text == "http"


def test_a_client_that_does_not_read_stops_the_generator(start_server):
    """A streamed body is pulled from the generator only as the client reads; when the client
    goes, the generator is closed (its `finally` runs)."""
    s = start_server([sys.executable, "native_app.py", "0", "1"])
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(b"GET /firehose HTTP/1.1\r\nHost: x\r\n\r\n")
    # Waited for, not assumed after a fixed time: the producer stalls (the same count twice,
    # half a second apart; a busy machine may take longer to fill the buffers).
    deadline = time.time() + 30
    first = get(s, "/produced").json()
    while True:
        time.sleep(0.5)
        second = get(s, "/produced").json()
        if second["n"] == first["n"] and second["n"] > 0:
            break
        assert time.time() < deadline, ("still producing", first, second)
        first = second
    assert 0 < second["n"] < 20_000, second
    assert not second["done"]
    sock.close()
    deadline = time.time() + 10
    while not get(s, "/produced").json()["done"]:
        assert time.time() < deadline, "the generator kept running after the client left"
        time.sleep(0.05)


def test_large_and_many_response_headers(native):
    # Japronto's workers crashed on large response headers (squeaky-pl/japronto#192).
    r = get(native, "/big-headers?n=60000")
    assert r.status_code == 200 and r.text == "ok"
    assert r.headers["x-big"] == "b" * 60000
    assert all(r.headers[f"x-h{i}"] == "v" * 100 for i in range(90))


def test_under_load_every_request_is_answered(native):
    from conftest import canter_load

    for path, extra in (("/", ["-c", "200"]), ("/json", ["-c", "50", "--pipeline", "16"]),
                        ("/sleep?s=0.001", ["-c", "100"])):
        report = canter_load(native.base + path, "-d", "2s", *extra)
        assert report["requests"] > 1000, report
        assert sum(report["errors"].values()) == 0, report
        assert not report.get("non2xx"), report
    assert get(native, "/").status_code == 200


def test_a_worker_that_cannot_start_stops_the_server_with_an_error(tmp_path):
    # Each worker fails at start (no such certificate): the configuration's fault, said once,
    # nothing served, no restarts, exit status 3.
    (tmp_path / "app.py").write_text(
        "import canter\n"
        "app = canter.App()\n"
        "app.run(port=0, tls_port=0, tls_cert='/nonexistent.pem', tls_key='/nonexistent.key')\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, str(tmp_path / "app.py")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert out.stderr.count("nonexistent.pem: No such file") == 1, out.stderr
    assert "failed to start in 1 of 1 worker(s); not serving" in out.stderr, out.stderr
    assert "serving http" not in out.stderr and "restarting" not in out.stderr, out.stderr


@pytest.mark.parametrize("shared", [False, True])
def test_a_taken_port_is_an_error_at_once(tmp_path, shared):
    # With SO_REUSEPORT on the other listener, a bind with it would succeed and share the
    # port's connections: refused all the same, unless reuse_port=True asks for it.
    taken = socket.socket()
    if shared:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    (tmp_path / "app.py").write_text(f"import canter\ncanter.App().run(port={port})\n")
    import subprocess

    try:
        out = subprocess.run([sys.executable, str(tmp_path / "app.py")], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode != 0, out.stderr
        assert f"127.0.0.1:{port}: Address already in use" in out.stderr, out.stderr
        if shared:
            # Asked for: the server starts beside the other listener.
            (tmp_path / "app.py").write_text(
                f"import canter\ncanter.App().run(port={port}, reuse_port=True)\n")
            proc = subprocess.Popen([sys.executable, str(tmp_path / "app.py")],
                                    stderr=subprocess.PIPE, text=True)
            try:
                for line in proc.stderr:
                    if "serving http" in line:
                        break
                else:
                    raise AssertionError("the server with reuse_port=True did not start")
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        taken.close()


@pytest.mark.parametrize("rst", [False, True])
def test_a_websocket_client_that_leaves_without_a_close_frame_ends_the_handler(native, rst):
    """A FIN or an RST without a close frame: `async for` over the socket ends at once (not
    at a keepalive timer) with close code 1006, and the handler's `finally` runs; none of 200
    such handlers is left behind."""
    from conftest import wait_until_no_websocket_is_live, websockets_that_leave

    before = native.log().count("native ws closed 1006")
    websockets_that_leave(native.port, "/ws/echo", 200, rst)
    took = wait_until_no_websocket_is_live(native.port, within=5)
    print(f"200 handlers ended {took:.2f} s after their clients left")
    assert native.wait_for_count("native ws closed 1006", before + 200) == before + 200


def test_a_client_that_leaves_cancels_its_async_handler(native):
    before = get(native, "/cancelled").json()["n"]
    with socket.create_connection(("127.0.0.1", native.port), timeout=10) as s:
        s.sendall(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
    deadline = time.time() + 10
    while get(native, "/cancelled").json()["n"] != before + 1:
        assert time.time() < deadline, "the handler's task was not cancelled"
        time.sleep(0.05)


def _raw(port, data, timeout=10):
    """Sends `data` on a new connection and returns everything read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(data)
        out = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                return out
            out += chunk


def _worker_pids(server):
    pid = server.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _allowed_cpus(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()


def test_engine_limits_and_timeouts_are_settings(start_server, tmp_path):
    (tmp_path / "limits_app.py").write_text(
        "import canter\n"
        "app = canter.App()\n"
        "@app.get('/{*rest}')\n"
        "def any_path(req, rest):\n"
        "    return 'ok'\n"
        "app.run(port=0, workers=2, pin=True, max_head=512, max_headers=10, max_target=64,\n"
        "        head_timeout=0.5, idle_timeout=1.0, server_name='py-edge')\n"
    )
    s = start_server([sys.executable, str(tmp_path / "limits_app.py")])
    r = get(s, "/short")
    assert (r.status_code, r.text, r.headers["server"]) == (200, "ok", "py-edge")
    # Each limit answered by the engine: target, field count, head size.
    assert get(s, "/" + "t" * 80).status_code == 414
    many = {f"x-h{i}": "1" for i in range(12)}
    assert get(s, "/short", headers=many).status_code == 431
    assert get(s, "/short", headers={"x-big": "b" * 600}).status_code == 431
    # A head that stalls gets 408 at the head timeout; an idle connection is closed at the
    # idle timeout (each late by at most the engine's 100 ms clock tick).
    started = time.monotonic()
    answer = _raw(s.port, b"GET /short HTTP/1.1\r\nHost: x\r\nX-Half")
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert 0.45 <= took < 2.0, took
    started = time.monotonic()
    answer = _raw(s.port, b"GET /short HTTP/1.1\r\nHost: x\r\n\r\n")
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer
    assert 0.95 <= took < 3.0, took
    # pin=True: each worker on a CPU of its own (of those the supervisor may use).
    pids = _worker_pids(s)
    assert len(pids) == 2, pids
    cpus = [_allowed_cpus(p) for p in pids]
    assert all(c.isdigit() for c in cpus), cpus
    import os

    if len(os.sched_getaffinity(0)) >= 2:
        assert len(set(cpus)) == 2, cpus


def test_bad_settings_are_refused_before_any_worker_starts(tmp_path):
    import subprocess

    for setting, message in (("max_head=0", "invalid max_head"),
                             ("head_timeout=0", "invalid head: must be above zero"),
                             ("idle_timeout=-1", "invalid idle_timeout"),
                             ("max_pipeline=0", "invalid max_pipeline"),
                             ("max_hed=1", "unknown setting 'max_hed'")):
        (tmp_path / "app.py").write_text(
            f"import canter\ncanter.App().run(port=0, {setting})\n")
        started = time.monotonic()
        out = subprocess.run([sys.executable, str(tmp_path / "app.py")], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode != 0, (setting, out.stderr)
        assert message in out.stderr, (setting, out.stderr)
        # Refused in the supervisor: no worker was started (none restarted, none given up on).
        assert "restarting" not in out.stderr and "giving up" not in out.stderr, out.stderr
        assert time.monotonic() - started < 20


def test_call_soon_on_the_driven_loop(native):
    r = get(native, "/soon")
    assert r.status_code == 200, r.text
    assert r.json() == {"ran": ["first", "caller", "after-boom"], "cancelled": True,
                        "first_cancelled": False, "handle": "canter._native.Handle"}
    native.wait_for(r"Exception in callback .*_soon_boom")
    native.wait_for(r"RuntimeError: soon-boom")
    assert get(native, "/").text == "Hello, World!"


def test_native_websocket_routes(native):
    """`App.websocket`: echo with `async for`, path parameters, the subprotocol choice, a close
    from the handler with its code, and a handler that raises (logged; closed with 1011)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{native.port}/ws/echo") as ws:
        ws.send("héllo")
        assert ws.recv() == "héllo"
        ws.send(b"\x01\x02")
        assert ws.recv() == b"\x01\x02"
        ws.close(code=4100)
    native.wait_for(r"native ws closed 4100")
    with connect(f"ws://127.0.0.1:{native.port}/ws/room/lobby",
                 subprotocols=["chat.v1", "chat.v2"]) as ws:
        assert ws.subprotocol == "chat.v2"
        assert ws.recv() == "welcome to lobby (chat.v2)"
        ws.send("hi")
        with pytest.raises(ConnectionClosed):
            ws.recv()
    assert ws.protocol.close_rcvd.code == 4002
    with connect(f"ws://127.0.0.1:{native.port}/ws/room/x") as ws:
        assert ws.subprotocol is None
        ws.recv()
        ws.send("boom")
        with pytest.raises(ConnectionClosed):
            ws.recv()
    assert ws.protocol.close_rcvd.code == 1011
    native.wait_for(r"boom from a WebSocket handler")
    # A plain GET to a WebSocket route is refused with 400, the worker unharmed.
    r = requests.get(native.base + "/ws/echo", timeout=10)
    assert r.status_code == 400
    assert requests.get(native.base + "/", timeout=10).status_code == 200

"""WebSocket routes of Starlette and FastAPI apps, unchanged, on the engine (`websocket` ASGI
scopes), against Python's `websockets` client and, over HTTP/2 (RFC 8441), python-hyper's `h2`."""

import json
import sys

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect


@pytest.fixture(scope="module")
def starlette_app():
    from conftest import Server

    s = Server([sys.executable, "-m", "canter", "serve", "asgi_app:app", "--port", "0"])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fastapi_app():
    from conftest import Server

    s = Server([sys.executable, "-m", "canter", "serve", "asgi_app:api", "--port", "0"])
    yield s
    s.stop()


def test_starlette_websocket_echo_and_the_close_code_the_app_sees(starlette_app):
    with connect(f"ws://127.0.0.1:{starlette_app.port}/ws") as ws:
        ws.send("héllo")
        assert ws.recv() == "héllo"
        ws.send(b"\x00\xff")
        assert ws.recv() == b"\x00\xff"
        for i in range(500):
            ws.send(f"m{i}")
        assert [ws.recv() for _ in range(500)] == [f"m{i}" for i in range(500)]
        big = "x" * (1 << 20)
        ws.send(big)
        assert ws.recv() == big
        ws.close(code=4321)
    starlette_app.wait_for(r"ws disconnect 4321")
    starlette_app.wait_for(r"ws echo done")


def test_an_app_that_closes_before_accepting_refuses_with_403(starlette_app):
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://127.0.0.1:{starlette_app.port}/ws/refuse")
    assert refused.value.response.status_code == 403


def test_fastapi_websocket_route_subprotocol_json_and_server_close(fastapi_app):
    url = f"ws://127.0.0.1:{fastapi_app.port}/ws/lobby"
    with connect(url, subprotocols=["chat.v1", "chat.v2"]) as ws:
        assert ws.subprotocol == "chat.v2"
        assert json.loads(ws.recv()) == {"room": "lobby", "scope": "websocket", "scheme": "ws"}
        ws.send(json.dumps({"n": 1}))
        assert json.loads(ws.recv()) == {"room": "lobby", "echo": {"n": 1}}
        ws.send(json.dumps({"say": "bye"}))
        with pytest.raises(Exception):
            ws.recv()
    assert ws.protocol.close_rcvd.code == 4001
    assert ws.protocol.close_rcvd.reason == "bye to you too"


def test_fastapi_sees_the_clients_disconnect(fastapi_app):
    with connect(f"ws://127.0.0.1:{fastapi_app.port}/ws/side") as ws:
        ws.recv()
        ws.close(code=1001)
    fastapi_app.wait_for(r"chat disconnect 1001")


def test_a_websocket_route_over_http2(fastapi_app):
    """RFC 8441's extended CONNECT reaches the same FastAPI route as a `websocket` scope."""
    import h2.events
    from wsproto.connection import Connection, ConnectionType
    from wsproto.events import TextMessage

    from test_websocket import h2_websocket

    conn, sock, stream, headers, early = h2_websocket(fastapi_app.port, path="/ws/h2room")
    assert headers[b":status"] == b"200", headers
    ws = Connection(ConnectionType.CLIENT)
    got = []
    events = early
    while not got:
        if not events:
            events = conn.receive_data(sock.recv(65536))
        for ev in events:
            if isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, stream)
                ws.receive_data(ev.data)
                got.extend(e for e in ws.events() if isinstance(e, TextMessage))
        events = []
        sock.sendall(conn.data_to_send())
    assert json.loads(got[0].data) == {"room": "h2room", "scope": "websocket", "scheme": "ws"}
    sock.close()


@pytest.mark.parametrize("rst", [False, True])
def test_a_client_that_leaves_without_a_close_frame_ends_the_apps_handler(starlette_app, rst):
    """A FIN or an RST without a close frame: the app gets `websocket.disconnect` with 1006
    at once (not at a keepalive timer), its loop ends and its `finally` runs; none of 200 such
    handlers is left behind."""
    from conftest import wait_until_no_websocket_is_live, websockets_that_leave

    before = starlette_app.log().count("ws disconnect 1006")
    websockets_that_leave(starlette_app.port, "/ws", 200, rst)
    took = wait_until_no_websocket_is_live(starlette_app.port, within=5)
    print(f"200 handlers ended {took:.2f} s after their clients left")
    assert starlette_app.wait_for_count("ws disconnect 1006", before + 200) == before + 200


def test_an_exception_after_accept_closes_with_1011_and_is_logged_once(starlette_app):
    with connect(f"ws://127.0.0.1:{starlette_app.port}/ws/boom") as ws:
        ws.send("go")
        with pytest.raises(Exception):
            ws.recv()
    assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1011
    starlette_app.wait_for(r"RuntimeError: ws boom after accept")
    assert starlette_app.log().count("RuntimeError: ws boom after accept") == 1


def test_a_denial_response_reaches_the_client(starlette_app):
    """Starlette's `send_denial_response` (ASGI's `websocket.http.response` extension): the
    client gets the app's status, header fields and body instead of a 403."""
    with pytest.raises(InvalidStatus) as denied:
        connect(f"ws://127.0.0.1:{starlette_app.port}/ws/deny")
    response = denied.value.response
    assert response.status_code == 401
    assert response.headers["x-why"] == "token"
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.body == b"no entry without a token"

"""WebSocket on the canter demo (`canter serve`, route /ws/echo) against real clients: Python's
`websockets` (with and without permessage-deflate, over TLS too) and `wsproto`, a strict sans-IO
implementation that checks every frame the server sends."""

import os
import socket
import ssl

import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import connect
import wsproto
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Ping, Pong, Request,
                            TextMessage)
from wsproto.extensions import PerMessageDeflate

from conftest import Server

DEMO = r"canter serving the demo app on http://127\.0\.0\.1:(\d+)/"
TLS = r"over TLS on https://127\.0\.0\.1:(\d+)/"


def canter_bin():
    binary = os.environ.get("CANTER_BIN")
    if not binary:
        pytest.fail("CANTER_BIN is not set: run these tests through cargo test")
    return binary


@pytest.fixture(scope="module")
def demo():
    s = Server([canter_bin(), "serve", "--addr", "127.0.0.1:0", "--workers", "1",
                "--tls-addr", "127.0.0.1:0", "--tls-self-signed"], serving=DEMO)
    s.tls_port = int(s.wait_for(TLS).group(1))
    yield s
    s.stop()


@pytest.mark.parametrize("compression", ["deflate", None])
def test_websockets_client_echo(demo, compression):
    with connect(f"ws://127.0.0.1:{demo.port}/ws/echo", compression=compression,
                 max_size=4 << 20) as ws:
        agreed = ws.response.headers.get("Sec-WebSocket-Extensions")
        if compression:
            assert agreed and agreed.startswith("permessage-deflate"), agreed
        else:
            assert agreed is None
        ws.send("héllo")
        assert ws.recv() == "héllo"
        ws.send(b"\x00\x01\x02")
        assert ws.recv() == b"\x00\x01\x02"
        big = ("{\"symbol\": \"ACME\", \"bid\": 101.25}" * 30000)[: 1 << 20]
        ws.send(big)
        assert ws.recv() == big
        # A fragmented message arrives whole.
        ws.send(iter(["frag", "men", "ted"]))
        assert ws.recv() == "fragmented"
        # Pings are answered by the server with their payload.
        pong = ws.ping(b"beat")
        assert pong.wait(5)
        ws.close()
    assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1000


def test_websockets_client_over_tls(demo):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with connect(f"wss://127.0.0.1:{demo.tls_port}/ws/echo", ssl=ctx) as ws:
        for i in range(100):
            ws.send(f"message {i}")
            assert ws.recv() == f"message {i}"


def test_a_message_over_the_clients_limit_is_the_clients_to_refuse(demo):
    # The server echoes what it received; the client's own limit refuses the echo with 1009.
    with connect(f"ws://127.0.0.1:{demo.port}/ws/echo", max_size=1024) as ws:
        ws.send("x" * 2048)
        with pytest.raises(ConnectionClosedError):
            ws.recv()
        assert ws.protocol.close_sent.code == 1009


def wsproto_session(port, extensions):
    """Opens a wsproto client connection; returns it, its socket and the accept event."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    sock.sendall(conn.send(Request(host="127.0.0.1", target="/ws/echo", extensions=extensions)))
    return conn, sock


def wsproto_events(conn, sock, want):
    """Reads until `want` events came; wsproto raises (and fails the test) on any frame that
    breaks RFC 6455."""
    events = []
    while len(events) < want:
        for ev in conn.events():
            events.append(ev)
        if len(events) >= want:
            break
        data = sock.recv(65536)
        conn.receive_data(data or None)
    return events


@pytest.mark.parametrize("deflate", [True, False])
def test_wsproto_client(demo, deflate):
    conn, sock = wsproto_session(demo.port, [PerMessageDeflate()] if deflate else [])
    [accept] = wsproto_events(conn, sock, 1)
    assert isinstance(accept, AcceptConnection)
    assert bool(accept.extensions) == deflate
    text = "the quick brown fox " * 200
    sock.sendall(conn.send(TextMessage(data=text)))
    sock.sendall(conn.send(BytesMessage(data=b"\xff" * 10)))
    sock.sendall(conn.send(Ping(payload=b"p")))
    events = wsproto_events(conn, sock, 3)
    kinds = {type(e) for e in events}
    assert kinds == {TextMessage, BytesMessage, Pong}, events
    got = {type(e): e for e in events}
    assert got[TextMessage].data == text
    assert got[BytesMessage].data == b"\xff" * 10
    assert got[Pong].payload == b"p"
    sock.sendall(conn.send(CloseConnection(code=1000, reason="done")))
    [close] = wsproto_events(conn, sock, 1)
    assert isinstance(close, CloseConnection) and close.code == 1000
    # The server closes the TCP connection after the close handshake.
    assert sock.recv(1) == b""
    sock.close()


def test_plain_http_to_the_websocket_route_is_refused(demo):
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", demo.port, timeout=5)
    c.request("GET", "/ws/echo")
    r = c.getresponse()
    assert r.status == 400
    r.read()
    c.request("GET", "/ws/echo", headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                          "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                          "Sec-WebSocket-Version": "7"})
    r = c.getresponse()
    assert r.status == 426
    assert r.getheader("Sec-WebSocket-Version") == "13"


def h2_websocket(port, extensions="", tls=False, path="/ws/echo"):
    """Opens WebSocket over HTTP/2 (RFC 8441) on h2c with prior knowledge: python-hyper's `h2`
    sends the extended CONNECT; returns the h2 connection, the socket, the stream id, the
    response headers and the events that came after them in the same read."""
    import h2.config
    import h2.connection
    import h2.events

    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(sock)
        assert sock.selected_alpn_protocol() == "h2"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    # The server's SETTINGS must allow the extended CONNECT before it is sent.
    allowed = None
    while allowed is None:
        for ev in conn.receive_data(sock.recv(65536)):
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                setting = ev.changed_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL)
                allowed = bool(setting and setting.new_value == 1)
        sock.sendall(conn.data_to_send())
    assert allowed, "the server did not send SETTINGS_ENABLE_CONNECT_PROTOCOL = 1"
    stream = conn.get_next_available_stream_id()
    headers = [(":method", "CONNECT"), (":protocol", "websocket"),
               (":scheme", "https" if tls else "http"),
               (":path", path), (":authority", f"127.0.0.1:{port}"),
               ("sec-websocket-version", "13")]
    if extensions:
        headers.append(("sec-websocket-extensions", extensions))
    conn.send_headers(stream, headers)
    sock.sendall(conn.data_to_send())
    while True:
        events = conn.receive_data(sock.recv(65536))
        for i, ev in enumerate(events):
            if isinstance(ev, h2.events.ResponseReceived):
                sock.sendall(conn.data_to_send())
                # What came in the same read (the server may speak first) is the caller's.
                return conn, sock, stream, dict(ev.headers), events[i + 1:]
        sock.sendall(conn.data_to_send())


import h2.settings  # noqa: E402


@pytest.mark.parametrize("deflate,tls", [(False, False), (True, False), (True, True)])
def test_websocket_over_http2_extended_connect(demo, deflate, tls):
    import h2.events
    from wsproto.connection import Connection, ConnectionType
    from wsproto.extensions import PerMessageDeflate

    offer = "permessage-deflate; client_max_window_bits" if deflate else ""
    conn, sock, stream, headers, early = h2_websocket(demo.tls_port if tls else demo.port, offer,
                                                      tls)
    assert not early, early  # the echo speaks only when spoken to
    assert headers[b":status"] == b"200", headers
    agreed = headers.get(b"sec-websocket-extensions", b"").decode()
    assert agreed.startswith("permessage-deflate") == deflate, headers
    exts = []
    if deflate:
        ext = PerMessageDeflate()
        ext.finalize(agreed)
        exts = [ext]
    # The frames ride in DATA frames; wsproto is the WebSocket end (no handshake of its own).
    ws = Connection(ConnectionType.CLIENT, extensions=exts)

    pending = []
    partial = []

    def take(events):
        """Whole messages from wsproto's pieces (it hands a long message over as it comes)."""
        for ev in events:
            if isinstance(ev, (TextMessage, BytesMessage)):
                partial.append(ev)
                if ev.message_finished:
                    joined = ("" if isinstance(ev, TextMessage) else b"").join(
                        p.data for p in partial)
                    pending.append(type(ev)(data=joined))
                    partial.clear()
            else:
                pending.append(ev)

    def pump():
        """Reads once: echoes go to `pending`; window updates let `send` go on."""
        for ev in conn.receive_data(sock.recv(65536)):
            if isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, stream)
                ws.receive_data(ev.data)
                take(ws.events())
            elif isinstance(ev, h2.events.StreamEnded):
                pending.append("END_STREAM")
        sock.sendall(conn.data_to_send())

    def send(event):
        """Sends the event's frames within the stream's flow-control window."""
        data = ws.send(event)
        while data:
            room = min(conn.local_flow_control_window(stream), conn.max_outbound_frame_size)
            if room == 0:
                pump()
                continue
            conn.send_data(stream, data[:room])
            sock.sendall(conn.data_to_send())
            data = data[room:]

    def receive(want):
        while len(pending) < want:
            pump()
        got = pending[:want]
        del pending[:want]
        return got

    text = "over HTTP/2 " * 500
    send(TextMessage(data=text))
    send(BytesMessage(data=b"\x01\x02"))
    got = receive(2)
    assert isinstance(got[0], TextMessage) and got[0].data == text
    assert isinstance(got[1], BytesMessage) and got[1].data == b"\x01\x02"
    # More than the stream's flow-control window (256 KiB) in both directions.
    big = b"z" * (600 * 1024)
    send(BytesMessage(data=big))
    [echo] = receive(1)
    assert echo.data == big
    send(CloseConnection(code=1000))
    got = receive(2)
    assert isinstance(got[0], CloseConnection) and got[0].code == 1000, got
    assert got[1] == "END_STREAM", got
    sock.close()


def masked_frame(opcode, payload):
    """One final client frame (masked, as RFC 6455 requires of clients)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return head + mask + (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")


@pytest.mark.parametrize("tls,opcode", [(False, 1), (True, 2)])
def test_echoes_beyond_the_clients_stream_window_over_http2_do_not_stall(demo, tls, opcode):
    """`h2` with a 16 MiB stream window, acknowledging data as it comes (it sends
    WINDOW_UPDATE once half a window is used): a 1 MiB echo, then a 16 MiB one, on one stream.
    The server stopped at exactly 16 MiB of stream data and went on only at its keepalive ping,
    30 s later, although the client's WINDOW_UPDATE had arrived."""
    import time

    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    sock = socket.create_connection(("127.0.0.1", demo.tls_port if tls else demo.port))
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(sock)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16 << 20})
    conn.initiate_connection()
    conn.increment_flow_control_window(64 << 20)
    sock.sendall(conn.data_to_send())
    got = {"head": None, "data": bytearray(), "settings": False}

    def pump(until, within):
        """Reads until `until()`; False when `within` seconds pass first."""
        deadline = time.monotonic() + within
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sock.settimeout(left)
            try:
                data = sock.recv(1 << 20)
            except socket.timeout:
                return False
            assert data, "the server closed the connection"
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RemoteSettingsChanged):
                    got["settings"] = True
                elif isinstance(ev, h2.events.ResponseReceived):
                    got["head"] = dict(ev.headers)
                elif isinstance(ev, h2.events.DataReceived):
                    got["data"] += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    raise AssertionError(ev)
            sock.sendall(conn.data_to_send())
        return True

    assert pump(lambda: got["settings"], 10)
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, [(":method", "CONNECT"), (":protocol", "websocket"),
                               (":scheme", "https" if tls else "http"), (":path", "/ws/echo"),
                               (":authority", "localhost"), ("sec-websocket-version", "13")])
    sock.sendall(conn.data_to_send())
    assert pump(lambda: got["head"] is not None, 10)
    assert got["head"][b":status"] == b"200", got["head"]
    for size in (1 << 20, 16 << 20):
        payload = os.urandom(size) if opcode == 2 else b"t" * size
        data = masked_frame(opcode, payload)
        want = len(data) - 4  # the echo is the same frame, unmasked
        got["data"].clear()
        start = time.monotonic()
        while data:
            room = min(conn.local_flow_control_window(stream), conn.max_outbound_frame_size)
            if room == 0:
                assert pump(lambda: conn.local_flow_control_window(stream) > 0, 20), \
                    "the server's window stayed shut"
                continue
            conn.send_data(stream, data[:room])
            sock.sendall(conn.data_to_send())
            data = data[room:]
        # Far less than the 30 s the stall lasted; a whole 16 MiB echo takes about a second.
        assert pump(lambda: len(got["data"]) >= want, 20), \
            f"{size}-byte echo: {len(got['data'])} of {want} bytes after {time.monotonic() - start:.1f} s"
        assert got["data"][-size:] == payload
    sock.close()


def test_our_client_against_the_websockets_server():
    """`canter load ws://` (canter-ws's engine as a client) against Python's `websockets`
    server: every message echoed, with and without permessage-deflate (which that server agrees
    to with context takeover on both sides)."""
    import json
    import subprocess
    import threading

    from websockets.sync.server import serve

    def echo(ws):
        for message in ws:
            ws.send(message)

    with serve(echo, "127.0.0.1", 0) as server:
        port = server.socket.getsockname()[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        for extra in ([], ["--ws-deflate", "--ws-size", "4096"], ["--ws-binary", "--pipeline", "8"]):
            out = subprocess.run([canter_bin(), "load", f"ws://127.0.0.1:{port}/", "-c", "4",
                                  "-n", "2000", "--json", "--no-progress", *extra],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            report = json.loads(out.stdout)
            assert report["requests"] == 2000, (extra, report, out.stderr)
            assert sum(report["errors"].values()) == 0, (extra, report, out.stderr)
        server.shutdown()

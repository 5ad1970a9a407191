"""The server against aioquic (a QUIC and HTTP/3 stack in Python, its H3Connection API) over
UDP: requests multiplexed on one connection, uploads and downloads larger than the flow
control windows, errors, trailers, the server's SETTINGS, session resumption, WebSocket over
HTTP/3 (RFC 9220: extended CONNECT, frames written by hand), and the Alt-Svc header that points
HTTP/1.1 over TLS to HTTP/3, and request streams that arrive out of order.

    python3 h3client.py TLS_PORT SITE_PACKAGES [--early-data]

With --early-data (a server started with --h3-early-data) it checks 0-RTT only.

SITE_PACKAGES is where aioquic was installed (`pip install --target`). Prints one "ok <check>"
line per passed check and "ALL OK" at the end; exits non-zero on the first failure.
"""

import asyncio
import json
import os
import socket
import ssl
import sys

TLS_PORT = int(sys.argv[1])
sys.path.insert(0, sys.argv[2])

from aioquic.asyncio.client import connect  # noqa: E402
from aioquic.asyncio.protocol import QuicConnectionProtocol  # noqa: E402
from aioquic.h3.connection import H3_ALPN, H3Connection  # noqa: E402
from aioquic.h3.events import DataReceived, HeadersReceived  # noqa: E402
from aioquic.quic.configuration import QuicConfiguration  # noqa: E402
from aioquic.quic.events import ConnectionTerminated, StreamReset  # noqa: E402

TIMEOUT = 20


def check(name):
    print("ok", name, flush=True)


class Client(QuicConnectionProtocol):
    """An HTTP/3 client on one QUIC connection: `request` sends one and waits for its answer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}  # stream -> (future, response)
        self.closed = None

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.closed = event
            for fut, _ in self.waiting.values():
                if not fut.done():
                    fut.set_exception(AssertionError(f"connection closed: {event}"))
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            fut, r = self.waiting[event.stream_id]
            r["reset"] = event.error_code
            if not fut.done():
                fut.set_result(r)
        for ev in self.h3.handle_event(event):
            if ev.stream_id not in self.waiting:
                continue
            fut, r = self.waiting[ev.stream_id]
            if isinstance(ev, HeadersReceived):
                fields = {k.decode(): v.decode() for k, v in ev.headers}
                if r["headers"] is None:
                    r["headers"] = fields
                else:
                    r["trailers"] = fields
            elif isinstance(ev, DataReceived):
                r["body"] += ev.data
            if ev.stream_ended and not fut.done():
                fut.set_result(r)

    async def request(self, method, path, body=b"", headers=(), trailers=None, sid=None):
        if sid is None:
            sid = self._quic.get_next_available_stream_id()
        fields = [(b":method", method.encode()), (b":scheme", b"https"),
                  (b":authority", b"localhost"), (b":path", path.encode())]
        fields += [(k.encode(), v.encode()) for k, v in headers]
        if body:
            fields.append((b"content-length", str(len(body)).encode()))
        fut = asyncio.get_running_loop().create_future()
        self.waiting[sid] = (fut, {"headers": None, "body": b"", "trailers": None, "reset": None})
        self.h3.send_headers(sid, fields, end_stream=not body and trailers is None)
        if body:
            self.h3.send_data(sid, body, end_stream=trailers is None)
        if trailers is not None:
            self.h3.send_headers(sid, [(k.encode(), v.encode()) for k, v in trailers],
                                 end_stream=True)
        self.transmit()
        return await asyncio.wait_for(fut, TIMEOUT)


def configuration(tickets=None):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.verify_mode = ssl.CERT_NONE
    config.server_name = "localhost"
    if tickets:
        config.session_ticket = tickets[-1]
    return config


def session(tickets=None):
    return connect("127.0.0.1", TLS_PORT, configuration=configuration(tickets),
                   create_protocol=Client,
                   session_ticket_handler=None if tickets is None else tickets.append)


async def multiplexed():
    async with session() as c:
        paths = ["/plaintext", "/json", "/hello/h3"] * 10
        res = await asyncio.gather(*(c.request("GET", p) for p in paths))
        for path, r in zip(paths, res):
            assert r["headers"][":status"] == "200", (path, r["headers"])
            if path == "/plaintext":
                assert r["body"] == b"Hello, World!", r["body"]
                assert r["headers"]["content-length"] == "13", r["headers"]
                assert r["headers"]["server"] == "canter", r["headers"]
                assert "date" in r["headers"], r["headers"]
            elif path == "/json":
                assert json.loads(r["body"]) == {"message": "Hello, World!"}, r["body"]
                assert r["headers"]["content-type"] == "application/json"
            else:
                assert b"h3" in r["body"], r["body"]
        # The server's SETTINGS came on its control stream: no QPACK dynamic table.
        settings = c.h3.received_settings
        assert settings is not None, "no SETTINGS from the server"
        assert settings.get(0x1, 0) == 0 and settings.get(0x7, 0) == 0, settings
        assert settings.get(0x6, 0) > 0, settings
    check("30 multiplexed requests")


async def out_of_order():
    """QUIC delivers streams in any order: a request on stream 8 answered before those on
    streams 0 and 4 have sent a byte, and then theirs, each answered."""
    async with session() as c:
        first = c._quic.get_next_available_stream_id()
        # aioquic takes the streams below the highest it sent on as done with: open 0 and 4
        # first, sending nothing on them (a QUIC stream is sent with its first byte).
        for sid in (first, first + 4):
            c._quic._get_or_create_stream_for_send(sid)
        late = await c.request("GET", "/hello/eight", sid=first + 8)
        assert late["headers"][":status"] == "200", late["headers"]
        assert b"eight" in late["body"], late["body"]
        four = await c.request("GET", "/hello/four", sid=first + 4)
        zero = await c.request("GET", "/hello/zero", sid=first)
        assert b"four" in four["body"] and b"zero" in zero["body"], (four, zero)
    check("requests on streams opened out of order")


async def flow_controlled():
    async with session() as c:
        # Larger than the stream windows: both directions wait for MAX_STREAM_DATA.
        bodies = [os.urandom(2_000_000), os.urandom(500_000)]
        res = await asyncio.gather(*(c.request("POST", "/echo", b) for b in bodies))
        for body, r in zip(bodies, res):
            assert r["headers"][":status"] == "200", r["headers"]
            assert r["body"] == body, (len(r["body"]), len(body))
        r = await c.request("GET", "/bytes/3000000")
        assert r["headers"][":status"] == "200", r["headers"]
        assert len(r["body"]) == 3_000_000, len(r["body"])
    check("POST /echo and a 3 MB download under flow control")


async def errors():
    async with session() as c:
        # (No HEAD here: aioquic 1.7.2 holds a HEAD response's content-length against its
        # empty body and closes the connection; RFC 9110, Section 8.6 allows the field.)
        missing, wrong = await asyncio.gather(
            c.request("GET", "/no/such/page"), c.request("DELETE", "/plaintext"))
        assert missing["headers"][":status"] == "404", missing["headers"]
        assert wrong["headers"][":status"] == "405", wrong["headers"]
        assert "GET" in wrong["headers"].get("allow", ""), wrong["headers"]
        # A header section over the server's limit: 431, and the connection goes on.
        big = await c.request("GET", "/plaintext", headers=[("x-big", "a" * 20000)])
        assert big["headers"][":status"] == "431", big["headers"]
        after = await c.request("GET", "/plaintext")
        assert after["body"] == b"Hello, World!", after
    check("404, 405 and 431")


async def trailers():
    async with session() as c:
        r = await c.request("POST", "/echo", b"with trailers", trailers=[("x-sum", "1")])
        assert r["headers"][":status"] == "200", r["headers"]
        assert r["body"] == b"with trailers", r["body"]
    check("a request with trailers")


async def resumption():
    tickets = []
    async with session(tickets) as c:
        await c.request("GET", "/plaintext")
        # The ticket arrives after the handshake; a request's round trip gives it time.
        await c.request("GET", "/plaintext")
    assert tickets, "no session ticket from the server"
    async with session(tickets) as c:
        r = await c.request("GET", "/plaintext")
        assert r["body"] == b"Hello, World!"
        assert c._quic.tls.session_resumed, "the session was not resumed"
    check("session resumption")


async def early_data(expect_accepted):
    """0-RTT. A second connection resumes the first one's session and sends a GET and a POST
    in its first flight, and then withholds its Finished, so the server's handshake cannot
    complete (as for an attacker replaying that flight). With the server's early data on, the
    GET is answered 200 from it and the POST 425 Too Early; with it off, early data is refused
    and nothing is answered before the handshake."""
    import socket as socket_mod
    import time as time_mod
    from aioquic.quic.connection import QuicConnection

    tickets = []
    async with session(tickets) as c:
        await c.request("GET", "/plaintext")
        await c.request("GET", "/plaintext")
    assert tickets, "no session ticket"
    quic = QuicConnection(configuration=configuration(tickets))
    h3 = H3Connection(quic)
    addr = ("127.0.0.1", TLS_PORT)
    sock = socket_mod.socket(socket_mod.AF_INET, socket_mod.SOCK_DGRAM)
    sock.settimeout(0.2)
    quic.connect(addr, now=time_mod.time())
    get = quic.get_next_available_stream_id()
    h3.send_headers(get, [(b":method", b"GET"), (b":scheme", b"https"),
                          (b":authority", b"localhost"), (b":path", b"/plaintext")],
                    end_stream=True)
    post = quic.get_next_available_stream_id()
    h3.send_headers(post, [(b":method", b"POST"), (b":scheme", b"https"),
                           (b":authority", b"localhost"), (b":path", b"/echo"),
                           (b"content-length", b"9")])
    h3.send_data(post, b"not twice", end_stream=True)
    for data, to in quic.datagrams_to_send(now=time_mod.time()):
        sock.sendto(data, to)
    # From here on nothing is sent: no Finished, no acknowledgment.
    status = {}
    deadline = time_mod.time() + (5 if not expect_accepted else TIMEOUT)
    while len(status) < 2 and time_mod.time() < deadline:
        try:
            data, _ = sock.recvfrom(65536)
        except socket_mod.timeout:
            continue
        quic.receive_datagram(data, addr, now=time_mod.time())
        ev = quic.next_event()
        while ev is not None:
            for h in h3.handle_event(ev):
                if isinstance(h, HeadersReceived):
                    status[h.stream_id] = dict(h.headers)[b":status"].decode()
            ev = quic.next_event()
        quic.datagrams_to_send(now=time_mod.time())  # dropped
    sock.close()
    accepted = quic.tls.early_data_accepted
    assert accepted == expect_accepted, f"early data accepted: {accepted}"
    if expect_accepted:
        assert status == {get: "200", post: "425"}, status
        check("0-RTT accepted: GET served, POST 425")
    else:
        assert status == {}, f"answered before the handshake: {status}"
        check("0-RTT refused")


def ws_frame(opcode, payload):
    """A client's WebSocket frame: FIN, masked (RFC 6455, Section 5.2)."""
    mask = os.urandom(4)
    assert len(payload) < 126
    head = bytes([0x80 | opcode, 0x80 | len(payload)]) + mask
    return head + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_parse(data):
    """The server's unmasked frames in `data`: [(opcode, payload)] and what is left."""
    frames = []
    while len(data) >= 2:
        n = data[1] & 0x7F
        at = 2
        if n == 126:
            n, at = int.from_bytes(data[2:4], "big"), 4
        if len(data) < at + n:
            break
        frames.append((data[0] & 0x0F, data[at:at + n]))
        data = data[at + n:]
    return frames, data


async def websocket():
    """RFC 9220: WebSocket over an HTTP/3 stream, by extended CONNECT, on the route the
    other protocols use."""
    async with session() as c:
        # A round trip first: the server's SETTINGS have arrived by its end.
        await c.request("GET", "/plaintext")
        settings = c.h3.received_settings
        assert settings.get(0x8) == 1, f"no SETTINGS_ENABLE_CONNECT_PROTOCOL: {settings}"
        sid = c._quic.get_next_available_stream_id()
        fut = asyncio.get_running_loop().create_future()
        r = {"headers": None, "body": b"", "trailers": None, "reset": None}
        c.waiting[sid] = (fut, r)
        c.h3.send_headers(sid, [(b":method", b"CONNECT"), (b":protocol", b"websocket"),
                                (b":scheme", b"https"), (b":authority", b"localhost"),
                                (b":path", b"/ws/echo"), (b"sec-websocket-version", b"13")])
        c.transmit()
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while r["headers"] is None:
            assert asyncio.get_running_loop().time() < deadline, "no response to CONNECT"
            await asyncio.sleep(0.01)
        assert r["headers"][":status"] == "200", r["headers"]
        c.h3.send_data(sid, ws_frame(0x1, b"hello over h3"), end_stream=False)
        c.transmit()
        frames = []
        while not frames:
            assert asyncio.get_running_loop().time() < deadline, f"no echo: {r}"
            frames, _ = ws_parse(r["body"])
            await asyncio.sleep(0.01)
        assert frames[0] == (0x1, b"hello over h3"), frames
        r["body"] = b""
        c.h3.send_data(sid, ws_frame(0x8, (1000).to_bytes(2, "big")), end_stream=False)
        c.transmit()
        await asyncio.wait_for(fut, TIMEOUT)
        frames, _ = ws_parse(r["body"])
        assert frames and frames[-1][0] == 0x8, frames
        assert int.from_bytes(frames[-1][1][:2], "big") == 1000, frames
    check("WebSocket over HTTP/3 (RFC 9220)")


def alt_svc():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    raw = socket.create_connection(("127.0.0.1", TLS_PORT), timeout=TIMEOUT)
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode().lower()
    want = f'alt-svc: h3=":{TLS_PORT}"; ma=86400'
    assert want in head.split("\r\n"), head
    check("Alt-Svc over HTTP/1.1 with TLS")


async def main():
    if "--early-data" in sys.argv:
        await early_data(True)
        print("ALL OK", flush=True)
        return
    for step in (multiplexed, out_of_order, flow_controlled, errors, trailers, resumption, websocket):
        await step()
    await early_data(False)
    alt_svc()
    print("ALL OK", flush=True)


asyncio.run(main())

"""The server against the `h2` package (python-hyper's HTTP/2 protocol stack), over plain
sockets: h2c with prior knowledge, `Upgrade: h2c` from HTTP/1.1, and h2 over TLS by ALPN.

    python3 h2client.py PORT TLS_PORT SITE_PACKAGES

SITE_PACKAGES is where `h2` was installed (`pip install --target`). Prints one "ok <check>"
line per passed check and "ALL OK" at the end; exits non-zero on the first failure.
"""

import json
import os
import socket
import ssl
import sys

PORT, TLS_PORT = int(sys.argv[1]), int(sys.argv[2])
sys.path.insert(0, sys.argv[3])

import h2.config  # noqa: E402
import h2.connection  # noqa: E402
import h2.events  # noqa: E402

TIMEOUT = 10


def check(name):
    print("ok", name, flush=True)


class Client:
    """One HTTP/2 connection; `exchange` sends requests and collects the responses."""

    def __init__(self, sock, upgraded=None):
        """`upgraded`: a connection that already called `initiate_upgrade_connection`."""
        self.sock = sock
        self.sock.settimeout(TIMEOUT)
        self.conn = upgraded or new_connection()
        if upgraded is None:
            self.conn.initiate_connection()
        self.responses = {}
        self.pending = {}  # stream -> body bytes still to send
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(self, method, path, body=b"", headers=()):
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":scheme", "http"), (":authority", "127.0.0.1"),
                (":path", path)] + list(headers)
        if body:
            hdrs.append(("content-length", str(len(body))))
        self.conn.send_headers(sid, hdrs, end_stream=not body)
        if body:
            self.pending[sid] = body
        self.responses[sid] = {"headers": None, "body": b"", "done": False}
        self.send_bodies()
        return sid

    def send_bodies(self):
        """Sends what the stream and connection windows allow of the pending bodies."""
        for sid in list(self.pending):
            body = self.pending[sid]
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            while body and room > 0:
                piece, body = body[:room], body[room:]
                self.conn.send_data(sid, piece, end_stream=not body)
                room = min(self.conn.local_flow_control_window(sid),
                           self.conn.max_outbound_frame_size)
            if body:
                self.pending[sid] = body
            else:
                del self.pending[sid]
        self.flush()

    def run(self, upgrade_stream=None):
        if upgrade_stream is not None:
            self.responses[upgrade_stream] = {"headers": None, "body": b"", "done": False}
        while not all(r["done"] for r in self.responses.values()):
            data = self.sock.recv(65536)
            assert data, "connection closed with streams open"
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    self.responses[ev.stream_id]["headers"] = dict(ev.headers)
                elif isinstance(ev, h2.events.DataReceived):
                    self.responses[ev.stream_id]["body"] += ev.data
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    self.responses[ev.stream_id]["done"] = True
                elif isinstance(ev, h2.events.StreamReset):
                    raise AssertionError(f"stream {ev.stream_id} reset: {ev.error_code}")
                elif isinstance(ev, h2.events.WindowUpdated):
                    pass
            self.send_bodies()
        return self.responses


def new_connection():
    return h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))


def plain():
    return socket.create_connection(("127.0.0.1", PORT), timeout=TIMEOUT)


def multiplexed():
    c = Client(plain())
    paths = ["/plaintext", "/json", "/hello/h2"] * 10
    sids = [c.request("GET", p) for p in paths]
    res = c.run()
    for sid, path in zip(sids, paths):
        r = res[sid]
        assert r["headers"][":status"] == "200", (path, r["headers"])
        if path == "/plaintext":
            assert r["body"] == b"Hello, World!", r["body"]
        elif path == "/json":
            assert json.loads(r["body"]) == {"message": "Hello, World!"}, r["body"]
            assert r["headers"]["content-type"] == "application/json"
        else:
            assert b"h2" in r["body"], r["body"]
    check("30 multiplexed requests")


def flow_controlled_echo():
    # Larger than the server's stream window (256 KiB) and than the client's (64 KiB): both
    # directions wait on WINDOW_UPDATEs. Two at once share the connection windows.
    bodies = [os.urandom(700_000), os.urandom(300_000)]
    c = Client(plain())
    sids = [c.request("POST", "/echo", body) for body in bodies]
    res = c.run()
    for sid, body in zip(sids, bodies):
        assert res[sid]["headers"][":status"] == "200", res[sid]["headers"]
        assert res[sid]["body"] == body, (len(res[sid]["body"]), len(body))
    check("POST /echo under flow control")


def errors():
    c = Client(plain())
    missing = c.request("GET", "/no/such/page")
    wrong = c.request("DELETE", "/plaintext")
    res = c.run()
    assert res[missing]["headers"][":status"] == "404", res[missing]["headers"]
    assert res[wrong]["headers"][":status"] == "405", res[wrong]["headers"]
    assert "GET" in res[wrong]["headers"].get("allow", ""), res[wrong]["headers"]
    check("404 and 405")


def upgrade():
    c = new_connection()
    settings = c.initiate_upgrade_connection()
    s = plain()
    s.sendall(b"GET /json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
              b"Upgrade: h2c\r\nHTTP2-Settings: " + settings + b"\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        assert chunk, "closed before the 101"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    client = Client(s, upgraded=c)
    res = client.run(upgrade_stream=1)
    assert res[1]["headers"][":status"] == "200", res[1]["headers"]
    assert json.loads(res[1]["body"]) == {"message": "Hello, World!"}
    # The same connection goes on over HTTP/2.
    sid = client.request("GET", "/plaintext")
    res = client.run()
    assert res[sid]["body"] == b"Hello, World!"
    check("Upgrade: h2c")


def tls():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    raw = socket.create_connection(("127.0.0.1", TLS_PORT), timeout=TIMEOUT)
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    assert s.selected_alpn_protocol() == "h2", s.selected_alpn_protocol()
    c = Client(s)
    sids = [c.request("GET", "/json") for _ in range(5)]
    res = c.run()
    for sid in sids:
        assert json.loads(res[sid]["body"]) == {"message": "Hello, World!"}
    check("h2 over TLS by ALPN")


for step in (multiplexed, flow_controlled_echo, errors, upgrade, tls):
    step()
print("ALL OK", flush=True)

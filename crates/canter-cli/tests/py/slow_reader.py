"""A slow reader: `python3 slow_reader.py PORT SIZE RATE [tls]` fetches /bytes/SIZE through a
4 KiB receive buffer at RATE bytes/s (a slow mobile link) and prints "body N" with the body
bytes that arrived before the server closed. With `tls`, over TLS (any certificate)."""

import socket
import ssl
import sys
import time

port, size, rate = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.settimeout(30)
s.connect(("127.0.0.1", port))
if sys.argv[4:] == ["tls"]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    s = ctx.wrap_socket(s, server_hostname="localhost")
s.sendall(b"GET /bytes/%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % size)
start = time.monotonic()
data = bytearray()
while True:
    try:
        piece = s.recv(65536)
    except (ConnectionResetError, ssl.SSLError):
        break
    if not piece:
        break
    data += piece
    ahead = len(data) / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
head, _, body = bytes(data).partition(b"\r\n\r\n")
print(head.split(b"\r\n")[0].decode(), flush=True)
print("body", len(body), flush=True)

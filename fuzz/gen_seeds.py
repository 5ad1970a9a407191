#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (layouts documented in harness.rs)."""
import os, struct

HERE = os.path.dirname(os.path.abspath(__file__))


def limits(max_head=16384, max_headers=100, max_target=8192, max_body=1 << 20,
           max_chunk_ext=1024, max_trailers=8192):
    hi, lo = (0xFF, 0) if max_body is None else (max_body >> 16, max_body & 0xFFFF)
    return (struct.pack("<H", max_head - 64) + bytes([max_headers]) + struct.pack("<H", max_target)
            + bytes([hi]) + struct.pack("<H", lo) + bytes([max_chunk_ext // 8])
            + struct.pack("<H", max_trailers))


def split(mode=0, seed=0x9E3779B9):
    return bytes([mode]) + struct.pack("<I", seed)


GET = b"GET /hi?x=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: t\r\n\r\n"
PIPE3 = (b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
         b"HEAD /b HTTP/1.1\r\nHost: h\r\n\r\n"
         b"POST /c HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
CHUNKED = (b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n")
ABSOLUTE = b"GET http://example.com:8080/p/q?r HTTP/1.1\r\nHost: example.com:8080\r\n\r\n"
ABS_ROOT = b"OPTIONS http://h?q HTTP/1.1\r\nHost: h\r\n\r\n"
HTTP10 = b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n"
CONNECT = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
EXPECT = (b"PUT /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"
          b"GET /after HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
LEADING = b"\r\n\r\nDELETE /r HTTP/1.1\r\nhost: h\r\n\r\n"
# Repeated Content-Length with the same decimal value (RFC 9110 §8.6): accepted as 2.
SAME_CL = b"POST / HTTP/1.0\r\nContent-Length:02\r\nContent-Length: 2\r\n\r\nhi"
BAD = [
    b"GET / HTTP/1.1\nHost: h\n\n",                                   # bare LF
    b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    b"GET / HTTP/2.0\r\nHost: h\r\n\r\n",                              # 505
    b"GET / HTTP/1.1\r\n\r\n",                                        # no Host
    b"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",                   # obs-fold
    b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: h\r\n\r\n",          # long target
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nExpect: nope\r\n\r\n",
    b"GET http://u@h/ HTTP/1.1\r\nHost: h\r\n\r\n",
]
GOOD = [GET, PIPE3, CHUNKED, ABSOLUTE, ABS_ROOT, HTTP10, CONNECT, EXPECT, LEADING, SAME_CL]

BODIES = [
    b"5\r\nhello\r\n0\r\n\r\n",
    b"5;a=b;c=\"d\"\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\nU: w\r\n\r\n",
    b"0\r\n\r\n",
    b"A \t;x\r\n0123456789\r\n0\r\n\r\nextra",
    b"ffffffffffffffff\r\n",                                          # too large
    b"5\r\nhelloX\r\n",                                              # data too long
    b"5\nhello\r\n",                                                 # bare LF
    b"0\r\nbad trailer\r\n\r\n",
    b"00000000000000000\r\n",                                         # 17 digits
]


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def conn_input(wire, ops=b"", read=0, lim=None, timeouts=(60, 10, 30)):
    return (lim or limits()) + bytes(timeouts) + bytes([read]) + struct.pack("<H", len(ops)) + ops + wire


def main():
    small = limits(max_head=128, max_headers=4, max_target=32, max_body=16, max_chunk_ext=8,
                   max_trailers=16)
    for i, req in enumerate(GOOD + BAD):
        write("parse_head", f"{i:02}", limits() + split(0) + req)
        write("parse_head", f"{i:02}-rand", limits() + split(4 * 7 + 1) + req)
        write("parse_head", f"{i:02}-small", small + split(0) + req)
        write("conn_machine", f"{i:02}", conn_input(req, read=0))
        write("conn_machine", f"{i:02}-bytewise", conn_input(req, read=1))
    for i, body in enumerate(BODIES):
        write("chunked", f"{i:02}", limits() + split(0) + body)
        write("chunked", f"{i:02}-small", small + split(3) + body)
    # Hand-written programs: append, poll_request, poll_body, start (Unknown / Known), data,
    # drain, finish, time passing.
    ops = bytes([0, 255, 1, 2, 2, 3, 0, 1, 0, 4, 0x10, 6, 3, 5, 1, 3, 0, 16, 0, 4, 0x08, 5,
                 6, 255, 1, 3, 1, 1, 0, 4, 0x20, 5, 7, 1, 100, 0])
    for i, req in enumerate([PIPE3, CHUNKED, EXPECT, HTTP10]):
        write("conn_machine", f"ops-{i}", conn_input(req, ops=ops, read=7))
    slow = bytes([0, 5, 1, 7, 1, 20, 0, 0, 9, 1])
    write("conn_machine", "ops-timeout", conn_input(GET, ops=slow, timeouts=(5, 5, 5)))


if __name__ == "__main__":
    main()

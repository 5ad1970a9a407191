"""Drives the canter demo server with Python's http.client (see common.py).

Usage: python3 client.py PORT
"""

import email.utils
import os

from common import check, connect, run


def keep_alive():
    conn = connect()
    sockname = None
    for i in range(50):
        path = "/plaintext" if i % 2 == 0 else "/json"
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, resp.status
        if path == "/plaintext":
            assert body == b"Hello, World!", body
        else:
            assert body == b'{"message":"Hello, World!"}', body
        assert not resp.will_close, "server asked to close"
        name = conn.sock.getsockname()
        if sockname is None:
            sockname = name
        assert name == sockname, "a new connection was opened: %r != %r" % (name, sockname)
    conn.close()
    check("keep-alive 50 requests on one connection")


def post_echo():
    conn = connect()
    body = os.urandom(100_000)
    conn.request("POST", "/echo", body=body, headers={"Content-Type": "application/octet-stream"})
    resp = conn.getresponse()
    got = resp.read()
    assert resp.status == 200, resp.status
    assert got == body, "echo differs (%d vs %d bytes)" % (len(got), len(body))
    assert resp.getheader("Content-Length") == str(len(body))
    assert resp.getheader("Content-Type") == "application/octet-stream"
    # Same connection again.
    conn.request("POST", "/echo", body=b"again")
    resp = conn.getresponse()
    assert resp.read() == b"again"
    conn.close()
    check("POST /echo")


def chunked_upload():
    pieces = [os.urandom(n) for n in (1, 10, 1000, 65536, 7, 300_000)]

    def gen():
        for p in pieces:
            yield p

    conn = connect()
    conn.request("POST", "/echo", body=gen(), encode_chunked=True)
    resp = conn.getresponse()
    got = resp.read()
    assert resp.status == 200, resp.status
    assert got == b"".join(pieces), "chunked echo differs"
    # And the connection is still usable afterwards.
    conn.request("GET", "/plaintext")
    resp = conn.getresponse()
    assert resp.read() == b"Hello, World!"
    conn.close()
    check("chunked upload")


def head():
    conn = connect()
    conn.request("HEAD", "/plaintext")
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    assert resp.read() == b""
    assert resp.getheader("Content-Length") == "13", resp.getheader("Content-Length")
    conn.request("GET", "/plaintext")
    resp = conn.getresponse()
    assert resp.read() == b"Hello, World!"
    conn.close()
    check("HEAD")


def not_found():
    conn = connect()
    conn.request("GET", "/does-not-exist")
    resp = conn.getresponse()
    assert resp.status == 404, resp.status
    assert resp.reason == "Not Found", resp.reason
    assert resp.read() == b"no such endpoint\n"
    conn.request("PUT", "/plaintext", body=b"x")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 405, resp.status
    assert resp.getheader("Allow") == "GET, HEAD", resp.getheader("Allow")
    conn.close()
    check("404 and 405")


def headers():
    conn = connect()
    conn.request("GET", "/json")
    resp = conn.getresponse()
    resp.read()
    assert resp.getheader("Server") == "canter", resp.getheader("Server")
    assert resp.getheader("Content-Type") == "application/json", resp.getheader("Content-Type")
    date = resp.getheader("Date")
    assert date is not None and len(date) == 29 and date.endswith(" GMT"), date
    parsed = email.utils.parsedate_to_datetime(date)
    assert parsed.tzinfo is not None, date
    assert email.utils.format_datetime(parsed, usegmt=True) == date, date
    assert len(resp.getheaders()) == len({k.lower() for k, _ in resp.getheaders()}), resp.getheaders()
    conn.close()
    check("response headers")


if __name__ == "__main__":
    run(
        keep_alive,
        post_echo,
        chunked_upload,
        head,
        not_found,
        headers,
    )

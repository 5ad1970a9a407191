"""Compressed static files, checked with Python's http.client and the reference decoders.

Usage: static_compress.py PORT DIR
DIR holds big.js (text, about 200 KB) served at /static/big.js by `canter serve --static DIR
--compress`. Each representation (gzip, br, zstd, identity) is fetched, decoded and compared
with the file; ETags differ per representation and each gives its own 304; HEAD has the GET's
length; a Range gets the identity bytes; a file changed on disk is compressed again.
"""

import http.client
import os
import sys
import zlib

import brotli
import zstandard

port, root = int(sys.argv[1]), sys.argv[2]
path = os.path.join(root, "big.js")


def get(method, target, headers):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request(method, target, headers=headers)
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res, body


def decode(coding, body):
    if coding == "gzip":
        return zlib.decompress(body, 31)
    if coding == "br":
        return brotli.decompress(body)
    if coding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    assert coding is None, coding
    return body


def check_all(expected):
    etags = {}
    for accept, coding in [
        ("gzip", "gzip"),
        ("br", "br"),
        ("zstd", "zstd"),
        ("br, gzip", "br"),
        ("gzip;q=0.5, br;q=0.2", "gzip"),
        ("identity", None),
        (None, None),
    ]:
        headers = {"Accept-Encoding": accept} if accept else {}
        res, body = get("GET", "/static/big.js", headers)
        assert res.status == 200, (accept, res.status)
        assert res.getheader("Content-Encoding") == coding, (accept, res.getheaders())
        assert res.getheader("Vary", "").lower() == "accept-encoding", res.getheaders()
        assert res.getheader("Content-Type").startswith("text/javascript"), res.getheaders()
        data = decode(coding, body)
        assert data == expected, (accept, len(data), len(expected))
        if coding:
            assert len(body) < len(expected) // 2, (coding, len(body))
            assert res.getheader("Accept-Ranges") is None, res.getheaders()
        etag = res.getheader("ETag")
        assert etag, res.getheaders()
        etags.setdefault(coding, etag)
        assert etags[coding] == etag, (coding, etags[coding], etag)
        # Its own ETag gives a 304 for this representation.
        h = dict(headers, **{"If-None-Match": etag})
        res304, body304 = get("GET", "/static/big.js", h)
        assert res304.status == 304, (accept, res304.status)
        assert body304 == b""
        assert res304.getheader("ETag") == etag
        # HEAD: the GET's head, no body.
        head, hbody = get("HEAD", "/static/big.js", headers)
        assert head.status == 200 and hbody == b""
        assert head.getheader("Content-Encoding") == coding
        if head.getheader("Content-Length") is not None:
            assert int(head.getheader("Content-Length")) == len(body), (accept, head.getheaders())
    assert len(set(etags.values())) == len(etags), etags
    # Another representation's ETag is no match: the full response comes.
    res, _ = get("GET", "/static/big.js", {"Accept-Encoding": "gzip", "If-None-Match": etags["br"]})
    assert res.status == 200, res.status
    # A Range gets the file as it is.
    res, body = get("GET", "/static/big.js", {"Accept-Encoding": "gzip, br", "Range": "bytes=10-19"})
    assert res.status == 206, res.status
    assert res.getheader("Content-Encoding") is None
    assert body == expected[10:20]


original = open(path, "rb").read()
check_all(original)
# Changed on disk (another size and time): never the old copy.
changed = original.replace(b"function", b"FUNCTION") + b"// changed\n"
with open(path, "wb") as f:
    f.write(changed)
st = os.stat(path)
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
check_all(changed)
print("ok")

"""Drives the streaming extractors of tests/app_extractors.rs with Python's http.client (see
common.py).

Usage: python3 extractors.py PORT
"""

import http.cookies
import json

from common import check, connect, run


def ndjson_upload():
    def lines():
        for i in range(1, 101):
            yield json.dumps({"value": i}).encode() + b"\n"

    conn = connect()
    conn.request("POST", "/ndjson/sum", body=lines(), encode_chunked=True,
                 headers={"Content-Type": "application/x-ndjson"})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 200, (resp.status, body)
    assert body == {"count": 100, "sum": 5050}, body
    conn.close()
    check("ndjson chunked upload")


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def ndjson_echo():
    conn = connect()
    conn.putrequest("POST", "/ndjson/echo")
    conn.putheader("Content-Type", "application/x-ndjson")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(chunk(b'{"n": 0}\n'))
    # The server answers before the request body ends, with Connection: close (it cannot know
    # the rest of the body is small), so http.client hands the socket to the response: keep
    # writing the body to the socket directly.
    sock = conn.sock
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    assert resp.getheader("Content-Type") == "application/x-ndjson"
    for n in range(5):
        # The item sent last comes back before the next one is sent.
        line = resp.readline()
        assert json.loads(line) == {"n": n}, line
        sock.sendall(chunk(json.dumps({"n": n + 1}).encode() + b"\n"))
    assert json.loads(resp.readline()) == {"n": 5}
    sock.sendall(b"0\r\n\r\n")
    assert resp.read() == b""
    conn.close()
    check("ndjson echo line by line")


def ndjson_422():
    conn = connect()
    conn.request("POST", "/ndjson/sum", body=b'{"value": 1}\n{"value": [2]}\n',
                 headers={"Content-Type": "application/jsonl"})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 422, (resp.status, body)
    assert body["status"] == 422 and body["error"].startswith("line 2, column "), body
    conn.close()
    check("ndjson 422")


def multipart():
    boundary = "py-boundary-7"
    data = bytes(range(256)) * 40
    parts = [
        b"--%s\r\nContent-Disposition: form-data; name=\"who\"\r\n\r\npython\r\n" % boundary.encode(),
        b"--%s\r\nContent-Disposition: form-data; name=\"blob\"; filename=\"b.bin\"\r\n"
        b"Content-Type: application/octet-stream\r\n\r\n" % boundary.encode() + data + b"\r\n",
        b"--%s--\r\n" % boundary.encode(),
    ]
    conn = connect()
    conn.request("POST", "/upload", body=b"".join(parts),
                 headers={"Content-Type": "multipart/form-data; boundary=" + boundary})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 200, (resp.status, body)
    assert body[0] == {"name": "who", "file_name": None, "content_type": None, "text": "python"}, body
    assert body[1]["file_name"] == "b.bin" and body[1]["size"] == len(data), body
    assert body[1]["sum"] == sum(data), body
    conn.close()
    check("multipart")


def cookies():
    conn = connect()
    conn.request("POST", "/cookies/login")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 201, resp.status
    jar = http.cookies.SimpleCookie()
    for field in resp.headers.get_all("Set-Cookie"):
        jar.load(field)
    assert jar["session"].value == "s3cr3t", jar
    assert jar["session"]["httponly"] is True, jar
    assert jar["session"]["path"] == "/", jar
    assert jar["theme"].value == "dark", jar
    cookie = "; ".join("%s=%s" % (k, m.value) for k, m in jar.items())
    conn.request("GET", "/cookies", headers={"Cookie": cookie + "; bogus"})
    resp = conn.getresponse()
    assert json.loads(resp.read()) == {"session": "s3cr3t", "theme": "dark"}
    conn.close()
    check("cookies")


if __name__ == "__main__":
    run(
        ndjson_upload,
        ndjson_echo,
        ndjson_422,
        multipart,
        cookies,
    )

"""granian's RSGI interface: plaintext and a JSON dict (`granian --interface rsgi rsgi_app:app`)."""
import json

PLAIN = [("content-type", "text/plain; charset=utf-8")]
JSON = [("content-type", "application/json")]


async def app(scope, proto):
    if scope.path == "/json":
        proto.response_bytes(200, JSON, json.dumps({"message": "Hello, World!"}).encode())
    else:
        proto.response_bytes(200, PLAIN, b"Hello, World!")

"""What the http.client scripts in this folder share (client.py, extractors.py).

Each script is run as `python3 SCRIPT PORT` against a server on 127.0.0.1:PORT (see
`run_python` in tests/common/mod.rs). It prints one "ok <check>" line per passed check and
"ALL OK" at the end, and exits non-zero (with a traceback) on the first failure.
"""

import http.client
import sys

PORT = int(sys.argv[1])
TIMEOUT = 10


def check(name):
    print("ok", name, flush=True)


def connect():
    return http.client.HTTPConnection("127.0.0.1", PORT, timeout=TIMEOUT)


def run(*steps):
    """Runs each step (each ends with its `check`), then prints "ALL OK"."""
    for step in steps:
        step()
    print("ALL OK", flush=True)

"""canter: Python web apps on the canter engine.

    import canter
    app = canter.App()

    @app.get("/hello/{name}")
    def hello(req, name):
        return f"Hello, {name}!"

    app.run(host="127.0.0.1", port=8080, workers=2)

Parsing, limits, timeouts, routing, pipelining and writes run in Rust; only handlers run
Python. Each worker is a process with one canter event loop, so the GIL never serializes
cores; see `App.run`.
"""

from ._native import HTTPError, Headers, Request, Response
from ._app import App, WebSocket, WebSocketClosed

__all__ = ["App", "HTTPError", "Headers", "Request", "Response", "WebSocket", "WebSocketClosed"]
__version__ = "0.1.0"

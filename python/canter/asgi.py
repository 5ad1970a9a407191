"""ASGI 3 applications (Starlette, FastAPI, ...) on the canter engine:
`python -m canter serve module:app --host H --port P --workers N`."""

import asyncio
import builtins
import importlib
import logging
import os
import sys

from . import _native
from ._app import StartupFailed, Supervisor, _configure_logging
from ._runtime import WorkerLoop, log_exception

log = logging.getLogger("canter")

ClientDisconnected = _native.ClientDisconnected
# Exception groups (Python 3.11+); an empty tuple matches nothing before.
_GROUP = getattr(builtins, "BaseExceptionGroup", ())


def _client_left(exc, depth=0):
    """Whether `exc` comes from the client going away: our `ClientDisconnected`, or what a
    framework raised because of it (Starlette's `ClientDisconnect`, raised while handling ours;
    an exception group holding one)."""
    if exc is None or depth > 16:
        return False
    if isinstance(exc, ClientDisconnected):
        return True
    if isinstance(exc, _GROUP):
        return any(_client_left(e, depth + 1) for e in exc.exceptions)
    return _client_left(exc.__cause__ or exc.__context__, depth + 1)


async def _run(app, scope, receive, send):
    """Runs one request's app call; an exception is logged (and answered 500 if no response
    was started). A client that went away is no server error: a debug line (the engine counts
    the connection's end)."""
    failed = False
    try:
        await app(scope, receive, send)
    except (asyncio.CancelledError, ClientDisconnected):
        pass
    except Exception as e:  # noqa: BLE001 - the app's failure, logged with its traceback
        if _client_left(e):
            log.debug("the client left while the app answered %s %s (%s)", scope.get("method"),
                      scope.get("path"), type(e).__name__)
        else:
            log_exception(e)
            failed = True
    finally:
        if scope["type"] == "websocket":
            send.ended(failed)  # an open WebSocket closes with 1011 after a failure
        else:
            send.ended()


class Lifespan:
    """The `lifespan` scope: startup before the worker serves, shutdown after it drained."""

    def __init__(self, app, loop):
        self.app = app
        self.loop = loop
        self.state = {}
        self.supported = True
        self.inbox = asyncio.Queue()
        self.startup_done = loop.create_future()
        self.shutdown_done = loop.create_future()
        self.task = None

    async def _receive(self):
        return await self.inbox.get()

    async def _send(self, message):
        kind = message["type"]
        if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
            if not self.startup_done.done():
                self.startup_done.set_result(message)
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            if not self.shutdown_done.done():
                self.shutdown_done.set_result(message)
        else:
            raise ValueError(f"unsupported lifespan message {kind!r}")

    async def _main(self):
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.4"},
                 "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
            if not self.startup_done.done():
                # An app that returns at once on a scope it does not serve (`if scope["type"]
                # != "http": return`) has no lifespan either.
                self.supported = False
                log.info("the ASGI app returned from the lifespan scope without starting up; "
                         "going on without lifespan")
                self.startup_done.set_result({"type": "unsupported"})
            if not self.shutdown_done.done():
                self.shutdown_done.set_result({"type": "lifespan.shutdown.complete"})
        except BaseException as e:  # noqa: BLE001
            if not self.startup_done.done():
                # An app without lifespan support raises on the unknown scope type.
                self.supported = False
                log.info("the ASGI app does not support lifespan (%s: %s); going on without it",
                         type(e).__name__, e)
                self.startup_done.set_result({"type": "unsupported"})
            elif self.startup_done.result()["type"] == "lifespan.startup.failed":
                # Said by the supervisor, once for all the workers (`startup`).
                pass
            else:
                log_exception(e)
            if not self.shutdown_done.done():
                self.shutdown_done.set_result({"type": "lifespan.shutdown.failed",
                                               "message": str(e)})

    async def startup(self):
        self.task = self.loop.create_task(self._main())
        await self.inbox.put({"type": "lifespan.startup"})
        message = await self.startup_done
        if message["type"] == "lifespan.startup.failed":
            raise StartupFailed("lifespan startup failed: " + message.get("message", ""))

    async def shutdown(self):
        if not self.supported:
            return
        await self.inbox.put({"type": "lifespan.shutdown"})
        message = await self.shutdown_done
        if message["type"] == "lifespan.shutdown.failed":
            log.error("lifespan shutdown failed: %s", message.get("message", ""))


def load(spec):
    """`module:attribute` (dots allowed in both) to the object."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{spec!r}: expected module:attribute, e.g. main:app")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def serve(app, host="127.0.0.1", port=8000, workers=1, root_path="", lifespan="auto",
          **options):
    """Serves the ASGI app with `workers` processes sharing the port, until SIGINT/SIGTERM."""
    _configure_logging()

    def worker(index, port, ready):
        wl = WorkerLoop()
        try:
            life = Lifespan(app, wl.loop) if lifespan != "off" else None
            if life is not None:
                wl.loop.run_until_complete(life.startup())
            state = life.state if life is not None and life.supported else None
            target = {"app": app, "run": _run, "state": state, "root_path": root_path}
            _native.serve(target, host, port, ready, wl, **options)
            if life is not None:
                wl.loop.run_until_complete(life.shutdown())
        finally:
            wl.close()

    sup = Supervisor(None, host, port, workers, options, serve=worker)
    options = sup.options  # with the TLS port the supervisor reserved
    sup.run()


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="python -m canter",
                                description="Serve an ASGI 3 application on the canter engine.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve module:app")
    s.add_argument("app", help="the ASGI app as module:attribute, e.g. main:app")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--workers", type=int, default=1, help="worker processes (SO_REUSEPORT)")
    s.add_argument("--root-path", default="", help="the app's mount point behind a proxy")
    s.add_argument("--lifespan", choices=("auto", "off"), default="auto")
    s.add_argument("--app-dir", default=".", help="directory put first on sys.path")
    s.add_argument("--body-limit", type=int, default=1 << 20,
                   help="largest request body in bytes (413 beyond, before the app runs)")
    s.add_argument("--max-connections", type=int, default=65536, help="per worker")
    s.add_argument("--max-head", type=int, default=None,
                   help="largest request head in bytes (431 beyond; default 16384)")
    s.add_argument("--max-headers", type=int, default=None,
                   help="most request header fields (431 beyond; default 100)")
    s.add_argument("--max-target", type=int, default=None,
                   help="longest request target in bytes (414 beyond; default 8192)")
    s.add_argument("--max-pipeline", type=int, default=None,
                   help="pipelined requests answered per connection turn (default 64)")
    s.add_argument("--min-body-rate", type=int, default=None,
                   help="slowest request body in bytes/s after a 5 s grace (default 240; 0: off)")
    for name, default in (("idle", 60), ("head", 10), ("body", 30), ("write", 30),
                          ("handler", 60)):
        s.add_argument(f"--{name}-timeout", type=float, default=None,
                       help=f"seconds (default {default})")
    s.add_argument("--drain-timeout", type=float, default=10.0, help="seconds")
    s.add_argument("--half-close", action="store_true",
                   help="answer a client that half-closes while its request runs")
    s.add_argument("--pin", action="store_true", help="pin worker i to CPU i")
    s.add_argument("--reuse-port", action="store_true",
                   help="share the port with a process already listening on it (a hand-over);"
                        " by default such a port is refused")
    s.add_argument("--server-name", default="canter")
    s.add_argument("--no-http2", action="store_true", help="HTTP/1.1 only (no h2c)")
    s.add_argument("--tls-port", type=int, default=None,
                   help="also serve HTTPS on this port (0 picks one); needs --tls-cert/--tls-key")
    s.add_argument("--tls-cert", default=None, help="certificate chain (PEM)")
    s.add_argument("--tls-key", default=None, help="private key (PEM)")
    s.add_argument("--http3", action="store_true",
                   help="also serve HTTP/3 (QUIC) on the --tls-port number over UDP")
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.abspath(a.app_dir))
    app = load(a.app)
    try:
        serve(app, host=a.host, port=a.port, workers=a.workers, root_path=a.root_path,
              lifespan=a.lifespan, body_limit=a.body_limit, max_connections=a.max_connections,
              max_head=a.max_head, max_headers=a.max_headers, max_target=a.max_target,
              max_pipeline=a.max_pipeline, min_body_rate=a.min_body_rate,
              idle_timeout=a.idle_timeout, head_timeout=a.head_timeout,
              body_timeout=a.body_timeout, write_timeout=a.write_timeout,
              handler_timeout=a.handler_timeout, drain_timeout=a.drain_timeout,
              half_close=a.half_close or None, pin=a.pin, reuse_port=a.reuse_port,
              server_name=a.server_name, http2=not a.no_http2, tls_port=a.tls_port, tls_cert=a.tls_cert, tls_key=a.tls_key,
              http3=a.http3 or None)
    except (ValueError, TypeError) as e:
        p.error(str(e))  # a setting out of range: a usage error, before any worker starts
    except OSError as e:
        sys.exit("canter: %s" % e)  # the port is taken (or the host unknown): said, no traceback

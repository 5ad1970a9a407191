"""The application object and the process supervisor behind `App.run`."""

import asyncio
import inspect
import logging
import os
import errno
import re
import signal
import socket
import sys
import time
import traceback

from . import _native
from ._runtime import WorkerLoop

log = logging.getLogger("canter")

_PARAM = re.compile(r"\{\*?([^{}]+)\}")

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

#: The exit status of a server whose app failed to start (uvicorn's too).
STARTUP_FAILED = 3


class StartupFailed(Exception):
    """The app's own start-up failed (an ASGI lifespan startup); the message says why, with
    the app's traceback when it gave one."""


class App:
    """Routes requests to handlers.

    A handler takes the request, then the route's path parameters by name, and returns str
    (text/plain), bytes, dict or list (JSON), None (204) or a `canter.Response`. A plain
    function runs inline on the worker; an `async def` runs as a task on the worker's asyncio
    loop. Raising `canter.HTTPError(status, message)` answers with that status; any other
    exception answers 500 and logs its traceback, and the worker keeps serving.
    """

    def __init__(self):
        self.routes = []

    def route(self, pattern, methods=("GET",)):
        """Registers the decorated function for `methods` at `pattern` (`/items/{id}`,
        `/files/{*rest}`)."""
        if isinstance(methods, str):
            methods = (methods,)
        names = _PARAM.findall(pattern)

        def register(func):
            params = list(inspect.signature(func).parameters.values())
            if not params:
                raise TypeError(f"{func.__qualname__} must take the request as its first argument")
            args = []
            for p in params[1:]:
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    raise TypeError(f"{func.__qualname__}: *args and **kwargs are not supported")
                if p.name not in names:
                    if p.default is p.empty:
                        raise TypeError(
                            f"{func.__qualname__}: argument {p.name!r} is not a parameter of {pattern!r}"
                        )
                    break
                args.append(p.name)
            is_async = inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)
            for m in methods:
                self.routes.append((m.upper(), pattern, func, is_async, args))
            return func

        return register

    def get(self, pattern):
        return self.route(pattern, ("GET",))

    def post(self, pattern):
        return self.route(pattern, ("POST",))

    def put(self, pattern):
        return self.route(pattern, ("PUT",))

    def delete(self, pattern):
        return self.route(pattern, ("DELETE",))

    def patch(self, pattern):
        return self.route(pattern, ("PATCH",))

    def websocket(self, pattern, subprotocols=()):
        """Registers the decorated coroutine function as the WebSocket endpoint at `pattern`:
        the upgrade is accepted (choosing the first of the client's offered subprotocols that
        is in `subprotocols`), then the function runs with a `WebSocket` and the pattern's
        parameters. Text messages arrive as `str`, binary ones as `bytes`; the connection
        closes normally (1000) when the function returns, with 1011 if it raises.

            @app.websocket("/ws/echo")
            async def echo(ws):
                async for message in ws:
                    await ws.send(message)
        """
        names = _PARAM.findall(pattern)

        def register(func):
            if not inspect.iscoroutinefunction(func):
                raise TypeError(f"{func.__qualname__} must be an async function (async def)")
            params = list(inspect.signature(func).parameters.values())
            if not params:
                raise TypeError(f"{func.__qualname__} must take the WebSocket as its first argument")
            args = [p.name for p in params[1:]]
            for a in args:
                if a not in names:
                    raise TypeError(
                        f"{func.__qualname__}: argument {a!r} is not a parameter of {pattern!r}")
            func._canter_subprotocols = tuple(subprotocols)
            self.routes.append(("WEBSOCKET", pattern, func, True, args))
            return func

        return register

    def run(self, host="127.0.0.1", port=8080, workers=1, **options):
        """Serves until SIGINT or SIGTERM with `workers` processes sharing the port
        (SO_REUSEPORT); a worker that dies is restarted. Options, the engine's limits as
        `canter serve` has them (each checked before any worker starts; a bad one raises
        ValueError): `body_limit` (bytes, default 1 MiB: larger bodies are answered 413 before
        Python runs), `max_head`, `max_headers`, `max_target` (431/414 above them),
        `max_connections` (per worker), `max_pipeline`, `min_body_rate` (bytes/s),
        `idle_timeout`, `head_timeout`, `body_timeout`, `write_timeout`, `handler_timeout`
        and `drain_timeout` (seconds), `half_close`, `server_name`, `http2` (h2c with prior
        knowledge, default on), `tls_port`, `tls_cert`, `tls_key` (PEM files) for an HTTPS
        listener beside the plain one (HTTP/2 by ALPN), `http3` (HTTP/3 over QUIC on the
        `tls_port` number, over UDP), `pin` (worker i on CPU i), and
        `reuse_port` (share the port with another process already listening on it, for a
        deliberate hand-over; by default such a port is refused: OSError "address in use")."""
        _configure_logging()
        Supervisor(self.routes, host, port, workers, options).run()


def _configure_logging():
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


class Supervisor:
    """Forks the worker processes, restarts those that die, and stops them on a signal."""

    #: A worker that dies sooner than this after its start counts as failing to start.
    MIN_LIFE = 1.0

    def __init__(self, routes, host, port, workers, options, serve=None):
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.routes = routes
        self.host = host
        self.workers = workers
        self.options = {k: v for k, v in options.items() if v is not None}
        self.pin = bool(self.options.pop("pin", False))
        self.reuse_port = bool(self.options.pop("reuse_port", False))
        # Every engine setting is checked here, once, rather than by each worker as it starts.
        _native.check_settings(**self.options)
        self.serve = serve or self._serve_native
        self.children = {}  # pid -> (index, start time)
        self.stopping = False
        self.gave_up = False
        self.reserved = []
        self.port = self._reserve(host, port)
        self.tls_port = None
        if self.options.get("tls_port") is not None:
            self.tls_port = self.options["tls_port"] = self._reserve(host, self.options["tls_port"])

    def _reserve(self, host, port):
        """Holds the port without listening on it (so it gets no connections): with port 0 the
        workers all bind the port picked here, and no other program takes it meanwhile.

        A port another process listens on is refused (OSError EADDRINUSE, "address in use"),
        as nginx refuses it, unless `reuse_port` allows sharing it for a hand-over: the workers
        share theirs through SO_REUSEPORT, and so would a second server started by mistake,
        taking some of the connections."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        if port and not self.reuse_port:
            # Without SO_REUSEPORT the bind fails beside any listener, with or without it.
            probe = socket.socket(family, socket.SOCK_STREAM)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise OSError(errno.EADDRINUSE, "%s:%d: %s (another process listens on "
                                  "it; pass reuse_port=True to share it on purpose)"
                                  % (host, port, os.strerror(errno.EADDRINUSE))) from None
                raise
            finally:
                probe.close()
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, port))
        self.reserved.append(s)
        return s.getsockname()[1]

    def _serve_native(self, index, port, ready):
        wl = WorkerLoop()
        try:
            _native.serve(self.routes, self.host, port, ready, wl, **self.options)
        finally:
            wl.close()

    def spawn(self, index):
        """Forks worker `index`; returns the read end of its start pipe (see `_started`)."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            readied = False
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if self.pin:
                    cpus = sorted(os.sched_getaffinity(0))
                    os.sched_setaffinity(0, {cpus[index % len(cpus)]})
                for s in self.reserved:
                    s.close()

                def ready(port):
                    nonlocal readied
                    readied = True
                    os.write(w, b"1")
                    os.close(w)

                self.serve(index, self.port, ready)
            except BaseException:
                if readied:
                    log.exception("worker %d failed", index)
                    code = 1
                else:
                    # The app's set-up failed (its lifespan startup, say): the supervisor
                    # reports it, once for all the workers, and exits.
                    failure = sys.exc_info()[1]
                    text = (str(failure) if isinstance(failure, StartupFailed)
                            else traceback.format_exc()).encode("utf-8", "replace")
                    try:
                        os.write(w, b"0" + text[:60000])
                    except OSError:
                        pass
                    code = STARTUP_FAILED
            finally:
                logging.shutdown()
                os._exit(code)
        os.close(w)
        self.children[pid] = (index, time.monotonic())
        return r

    @staticmethod
    def _started(r):
        """Reads a worker's start pipe to its end: None once the worker serves, else what it
        said of its failure (empty if it died without a word)."""
        said = b""
        while True:
            try:
                piece = os.read(r, 65536)
            except InterruptedError:
                continue
            if not piece:
                break
            said += piece
            if said[:1] == b"1":
                break
        os.close(r)
        if said[:1] == b"1":
            return None
        return said[1:].decode("utf-8", "replace")

    def _stop(self, signum, frame):
        if not self.stopping:
            log.info("shutting down: draining the workers")
        self.stopping = True
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def run(self):
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        pipes = [self.spawn(i) for i in range(self.workers)]
        failures = [f for f in map(self._started, pipes) if f is not None]
        if failures:
            # The app's configuration, not a passing fault: said once, nothing served.
            why = next((f for f in failures if f), "")
            log.error("the app failed to start in %d of %d worker(s); not serving%s",
                      len(failures), self.workers, ":\n" + why.rstrip() if why else "")
            self.stopping = True
            self._stop(None, None)
            while self.children:
                try:
                    pid, _ = os.wait()
                except ChildProcessError:
                    break
                except InterruptedError:
                    continue
                self.children.pop(pid, None)
            for s in self.reserved:
                s.close()
            raise SystemExit(STARTUP_FAILED)
        log.info("serving http://%s:%d with %d worker(s)", self.host, self.port, self.workers)
        if self.tls_port is not None:
            log.info("serving https://%s:%d", self.host, self.tls_port)
        failures = 0
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            index, started = self.children.pop(pid, (None, 0))
            if index is None or self.stopping:
                continue
            how = _describe(status)
            lived = time.monotonic() - started
            failures = failures + 1 if lived < self.MIN_LIFE else 0
            if failures >= 5:
                log.error("worker %d %s again at start: giving up", index, how)
                self.gave_up = True
                self._stop(None, None)
                continue
            log.warning("worker %d (pid %d) %s: restarting it", index, pid, how)
            time.sleep(min(0.1 * 2**failures, 2.0) if failures else 0)
            why = self._started(self.spawn(index))
            if why:
                log.error("worker %d failed to start:\n%s", index, why.rstrip())
        for s in self.reserved:
            s.close()
        log.info("stopped")
        if self.gave_up:
            raise SystemExit(1)


def _describe(status):
    if os.WIFSIGNALED(status):
        return f"was killed by signal {os.WTERMSIG(status)}"
    return f"exited with status {os.WEXITSTATUS(status)}"


class WebSocketClosed(Exception):
    """Raised by `WebSocket.recv` once the connection has closed: `code` is the close code the
    peer sent (1005 if none, 1006 if the connection ended without a close)."""

    def __init__(self, code, reason=""):
        super().__init__(f"WebSocket closed with {code}{': ' + reason if reason else ''}")
        self.code = code
        self.reason = reason


class WebSocket:
    """A WebSocket as a native handler (`App.websocket`) holds it: `recv`, `send`, `close`,
    and `async for` over the messages until the peer closes."""

    def __init__(self, receive, send, subprotocol, offered):
        self._receive = receive
        self._send = send
        self.subprotocol = subprotocol
        """The subprotocol chosen, or None."""
        self.offered = offered
        """The subprotocols the client offered."""
        self.close_code = None
        """The peer's close code, once it closed."""

    async def recv(self):
        """The next message: `str` (text) or `bytes` (binary). Raises `WebSocketClosed` once
        the connection has closed."""
        message = await self._receive()
        if message["type"] == "websocket.receive":
            text = message.get("text")
            return text if text is not None else message["bytes"]
        self.close_code = message.get("code", 1005)
        raise WebSocketClosed(self.close_code, message.get("reason", ""))

    async def send(self, data):
        """Sends `data`: `str` as text, `bytes` (or bytearray, memoryview) as binary. Waits while
        the peer is slow (more than 64 KiB queued)."""
        if isinstance(data, str):
            await self._send({"type": "websocket.send", "text": data})
        else:
            await self._send({"type": "websocket.send", "bytes": bytes(data)})

    async def close(self, code=1000, reason=""):
        """Sends this end's close; the connection ends when the peer answers."""
        await self._send({"type": "websocket.close", "code": code, "reason": reason})

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.recv()
        except WebSocketClosed:
            raise StopAsyncIteration from None


async def _run_websocket(func, receive, send, args, offered):
    """Accepts the upgrade, runs the native handler, and tells the engine when it ended (an
    exception is logged and closes the connection with 1011)."""
    from . import _native
    from ._runtime import log_exception

    try:
        await receive()  # websocket.connect
        wanted = getattr(func, "_canter_subprotocols", ())
        chosen = next((p for p in offered if p in wanted), None)
        await send({"type": "websocket.accept", "subprotocol": chosen})
        await func(WebSocket(receive, send, chosen, list(offered)), *args)
    except (asyncio.CancelledError, WebSocketClosed, _native.ClientDisconnected):
        pass
    except Exception as e:  # noqa: BLE001 - the handler's failure, logged with its traceback
        log_exception(e)
        try:
            await send({"type": "websocket.close", "code": 1011, "reason": ""})
        except Exception:  # noqa: BLE001 - the connection is gone already
            pass
    finally:
        send.ended()

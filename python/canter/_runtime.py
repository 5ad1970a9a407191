"""What the Rust engine calls on a worker thread: the asyncio loop it drives, and logging."""

import asyncio
import logging
import selectors
import sys
import threading

log = logging.getLogger("canter")


def log_exception(exc, tb=None):
    """Logs a handler's exception with its traceback (the request was answered 500)."""
    log.error("exception in handler", exc_info=(type(exc), exc, tb or exc.__traceback__))


class _NoWaitSelector(selectors.DefaultSelector):
    """While `nowait` is set, never blocks: the worker's canter event loop does the waiting, on
    this selector's own descriptor, and turns the asyncio loop when it becomes readable."""

    def __init__(self):
        super().__init__()
        self.events = 0
        self.nowait = False

    def select(self, timeout=None):
        ready = super().select(0 if self.nowait else timeout)
        self.events = len(ready)
        return ready


class _DrivenLoop(asyncio.SelectorEventLoop):
    """Tells the canter event loop when code outside a turn (a sync handler setting an
    asyncio.Event, say) schedules a callback or a timer, so the next turn is not missed."""

    _wake = None
    _turning = False

    def call_soon(self, callback, *args, context=None):
        handle = super().call_soon(callback, *args, context=context)
        if not self._turning and self._wake is not None:
            self._wake()
        return handle

    def call_at(self, when, callback, *args, context=None):
        handle = super().call_at(when, callback, *args, context=context)
        if not self._turning and self._wake is not None:
            self._wake()
        return handle


async def _await(awaitable):
    return await awaitable


class WorkerLoop:
    """A worker process's asyncio loop. Outside `serve` it is an ordinary loop
    (`run_until_complete` runs the ASGI lifespan on it); during `serve` the canter event loop of
    the same thread drives it one turn at a time (`attach`, `tick`, `detach`)."""

    def __init__(self):
        self.selector = _NoWaitSelector()
        self.loop = _DrivenLoop(self.selector)
        self.fd = self.selector.fileno()
        self._eager = sys.version_info >= (3, 12)
        asyncio.set_event_loop(self.loop)

    def attach(self, wake):
        """Called by the engine as it starts driving the loop."""
        self.selector.nowait = True
        self.loop._wake = wake
        # The loop counts as running on this thread: get_running_loop(), create_task() and
        # friends work in handlers, as under asyncio.run().
        self.loop._thread_id = threading.get_ident()
        asyncio.events._set_running_loop(self.loop)

    def detach(self):
        """Called by the engine when it stops driving the loop."""
        asyncio.events._set_running_loop(None)
        self.loop._thread_id = None
        self.loop._wake = None
        self.selector.nowait = False

    def start(self, awaitable):
        """Starts `awaitable` as a task; on 3.12+ eagerly (it runs now until it first waits)."""
        if not asyncio.iscoroutine(awaitable):
            awaitable = _await(awaitable)
        if self._eager:
            return asyncio.Task(awaitable, loop=self.loop, eager_start=True)
        return self.loop.create_task(awaitable)

    def tick(self):
        """One turn of the loop; returns the seconds until it wants the next one (0: at once,
        negative: only when woken)."""
        loop = self.loop
        loop._turning = True
        try:
            loop._run_once()
        finally:
            loop._turning = False
        if loop._ready or self.selector.events:
            return 0.0
        if loop._scheduled:
            return max(loop._scheduled[0].when() - loop.time(), 1e-6)
        return -1.0

    def close(self):
        """Cancels what is left and closes the loop."""
        loop = self.loop
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

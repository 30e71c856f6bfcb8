"""asyncio on the engine's event descriptor (ABI 1.3 event_fd): no thread.

``loop.add_reader`` watches the eventfd; when it turns readable the events
are taken (``poll_events``, which drains the descriptor) into the engine's
queue and every waiter re-checks.  ``await engine.aio.wait_transfer(tid)``
and ``async for ev in engine.aio.events()`` sit on top.

One event loop at a time per engine. Events taken by a synchronous
``poll_events``/``wait_event`` on another thread while a coroutine waits are
seen at its next wake-up or deadline, not at once: use one style per engine.
"""
import asyncio

from .errors import KvxTimeout, TransferFailed


class EngineAio:
    def __init__(self, engine):
        self._eng = engine
        self._fd = engine.event_fd()
        self._loop = None
        self._changed = None  # asyncio.Event, set when events arrived
        self._known = 0       # engine._ev_count the waiters were woken for

    def _attach(self):
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            if self._loop.is_running():
                raise RuntimeError("engine.aio is in use by another running "
                                   "event loop")
            self.close()  # a finished loop (asyncio.run per call): rebind
        if self._loop is None:
            self._loop = loop
            self._changed = asyncio.Event()
            loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self):
        self._eng._take_events()  # drains the eventfd
        self._wake()

    def _wake(self):
        """Wakes every waiter if events were taken since the last wake-up.
        Every take (take_event, poll_events, _take_events) drains the
        descriptor, so the reader callback does not fire for what a
        coroutine took directly: the other waiters must hear of it here or
        they sleep until their deadline with their event queued."""
        if self._eng._ev_count != self._known:
            self._known = self._eng._ev_count
            self._changed.set()

    async def _wait_change(self, seen, deadline):
        """Waits until more events than `seen` were taken from the library
        (True) or the deadline passed (False)."""
        self._eng._take_events()  # queued before the reader was attached
        self._wake()
        while self._eng._ev_count == seen:
            self._changed.clear()
            timeout = None if deadline is None \
                else deadline - self._loop.time()
            if timeout is not None and timeout <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                return False
        return True

    async def wait_transfer(self, transfer_id, timeout=60.0):
        """Awaits the terminal event of transfer_id (FINISHED_RECVING on D,
        FINISHED_SENDING on P) and returns it; raises TransferFailed on a
        FAILED event and KvxTimeout after ``timeout`` seconds (None: until
        cancelled)."""
        self._attach()
        deadline = None if timeout is None else self._loop.time() + timeout
        while True:
            ev = self._eng.take_event(transfer_id)
            self._wake()
            if ev is not None:
                if not ev.ok:
                    raise TransferFailed(ev)
                return ev
            if not await self._wait_change(self._eng._ev_count, deadline):
                raise KvxTimeout(-27, "KVX_ERR_TIMEOUT", "no event for "
                                 "transfer %s within %.3f s"
                                 % (transfer_id, timeout), "aio.wait_transfer")

    async def events(self, idle_timeout=None):
        """Async iterator over events as they arrive (oldest first). Ends
        after ``idle_timeout`` seconds without an event (None: runs until the
        consumer breaks or the task is cancelled)."""
        self._attach()
        while True:
            evs = self._eng.poll_events()
            self._wake()
            for ev in evs:
                yield ev
            with self._eng._plock:
                if self._eng._pending:  # taken while the consumer ran
                    continue
                seen = self._eng._ev_count
            deadline = None if idle_timeout is None \
                else self._loop.time() + idle_timeout
            if not await self._wait_change(seen, deadline):
                return

    def close(self):
        """Stops watching the descriptor (Engine.close calls it)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None

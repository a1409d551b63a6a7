"""Live pages: server-sent events that say "what you look at changed", as it changes.

Each open page holds one ``EventSource`` on ``/events``. The stream re-reads a small
fingerprint of what the page shows (the ids, statuses and update times of its page of runs,
the counts; or one run's head and status) whenever the store may have changed, and sends a
``changed`` event when it differs; the page then fetches its fresh fragment. "May have
changed" is one ticker per app: on PostgreSQL it waits on the store's LISTEN/NOTIFY channel
(``store.wait_for_work``), so a delivered input or a queued run shows at once; elsewhere it
ticks every ``interval`` seconds. Streams only read, in the server's thread pool, and end
when the page closes.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable

from starlette.concurrency import run_in_threadpool

from ..store import Store

KEEPALIVE = 15.0
"""Seconds between comments that keep proxies from closing an idle stream."""


class Ticker:
    """Wakes every stream of one app when the store may have changed."""

    def __init__(self, store: Store, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.generation = 0
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._listeners = 0
        # A store that can signal overrides wait_for_work; the base one only sleeps, and
        # sleeping on the event loop costs no thread.
        self._signals = type(store).wait_for_work is not Store.wait_for_work

    async def _run(self) -> None:
        while self._listeners > 0:
            if self._signals:
                try:
                    await run_in_threadpool(self.store.wait_for_work, self.interval)
                except Exception:
                    await asyncio.sleep(self.interval)
            else:
                await asyncio.sleep(self.interval)
            self.generation += 1
            event, self._changed = self._changed, asyncio.Event()
            if event is not None:
                event.set()
        self._task = None

    async def wait(self, timeout: float) -> bool:
        """Until the next tick (True) or ``timeout`` seconds (False)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def subscribe(self) -> None:
        self._listeners += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def unsubscribe(self) -> None:
        self._listeners -= 1


def digest(*parts: object) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=12).hexdigest()


async def stream(ticker: Ticker, fingerprint: Callable[[], str]) -> AsyncIterator[bytes]:
    """The SSE body: ``changed`` events whenever ``fingerprint()`` moves."""
    ticker.subscribe()
    try:
        last = await run_in_threadpool(fingerprint)
        yield f"retry: 3000\nevent: ready\ndata: {last}\n\n".encode()
        sent = time.monotonic()
        while True:
            await ticker.wait(KEEPALIVE)
            try:
                current = await run_in_threadpool(fingerprint)
            except Exception:  # a run deleted meanwhile, a store away: say so, keep going
                current = "gone"
            if current != last:
                last = current
                sent = time.monotonic()
                yield f"event: changed\ndata: {current}\n\n".encode()
            elif time.monotonic() - sent >= KEEPALIVE:
                sent = time.monotonic()
                yield b": keepalive\n\n"
    finally:
        ticker.unsubscribe()


__all__ = ["Ticker", "digest", "stream"]

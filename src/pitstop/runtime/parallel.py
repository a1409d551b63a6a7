"""``ctx.map``: one function over many items at once inside a step, each result kept.

Every item's result is recorded as an effect record keyed by the run's branch, the step's
position, the map's name and the item's index, as soon as it completes. A step that runs again
(after a crash, a retry or a wake-up) finds those records and runs only the items that have
none: at most the items that were in flight when the process died run twice.

Results are written by the one thread that waits for the items (the step's), so items that
finish together share one transaction: recording costs one round trip per batch, not per item.
For items of :data:`REPEAT_SECONDS` or more, the next items start once a batch is written, so at
any moment at most ``concurrency`` items have started without a durable result: those are what
a crash can make run again. Quicker sync items keep starting while a batch is written (the
items finishing meanwhile are the next batch: a group commit), up to about
:data:`REPEAT_SECONDS` of their work more (at most :data:`REPEAT_ITEMS` items): a commit per
few items would otherwise cost more than the items (~30 µs an item on SQLite, ~80 on
PostgreSQL, for items that return at once).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import MapItemError, SerializationError

if TYPE_CHECKING:
    from .context import StepContext
    from .host import StepHost


REPEAT_SECONDS = 0.02
"""Beyond the ``concurrency`` items in flight, a sync ``ctx.map`` lets more items start while
earlier results are being written, as many as take about this long (seconds, by the items'
mean time so far), at most :data:`REPEAT_ITEMS`: what a crash can make run again besides the
items in flight. Items of 20 ms or more wait for the write (none more); items of a few µs,
for which a commit each would cost more than the items, share one write among many."""

REPEAT_ITEMS = 256


def backlog(mean_seconds: float) -> int:
    """How many items beyond those in flight may start before earlier results are durable,
    for items taking ``mean_seconds`` on average (see :data:`REPEAT_SECONDS`)."""
    if mean_seconds * REPEAT_ITEMS <= REPEAT_SECONDS:
        return REPEAT_ITEMS
    return int(REPEAT_SECONDS / mean_seconds)


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` returns a coroutine (async def, a partial of one, an object
    with ``async def __call__``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself is what is checked
    )


class MapPlan:
    """One ``ctx.map`` call: its items, what earlier executions recorded, the recording."""

    def __init__(
        self,
        ctx: StepContext,
        host: StepHost,
        fn: Callable[..., Any],
        items: Iterable[Any],
        *,
        concurrency: int,
        name: str | None,
        return_exceptions: bool,
    ) -> None:
        where = f"run {ctx.run_id!r}, step {ctx.step!r}"
        if not callable(fn):
            raise TypeError(f"{where}: ctx.map needs a function, got {type(fn).__name__}")
        if isinstance(items, str | bytes) or not isinstance(items, Iterable):
            raise TypeError(
                f"{where}: ctx.map needs an iterable of items (a list, a range, a generator), "
                f"got {type(items).__name__}"
            )
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"{where}: ctx.map concurrency must be an int >= 1, not "
                             f"{concurrency!r}")
        self.ctx = ctx
        self.host = host
        self.fn = fn
        self.items = list(items)
        self.concurrency = concurrency
        self.return_exceptions = return_exceptions
        self.name = ctx._map_name(name, fn)
        self.prefix = ctx.idempotency_key(f"map[{self.name}]")
        self.results: dict[int, Any] = {}
        self.fatal: BaseException | None = None

    # -- what is already recorded -----------------------------------------------------------

    def load(self) -> list[int]:
        """Read the results earlier executions recorded; return the indexes still to run."""
        host = self.host
        host.flush()  # records name the step's checkpoint: it must be written first
        start = self.prefix + "["
        for key, value in host.store.effects(host.run_id).items():
            if key.startswith(start) and key.endswith("]"):
                index = key[len(start) : -1]
                if index.isdigit() and int(index) < len(self.items):
                    self.results[int(index)] = value
        return [i for i in range(len(self.items)) if i not in self.results]

    def key(self, index: int) -> str:
        return f"{self.prefix}[{index}]"

    def label(self, index: int) -> str:
        return f"map[{self.name}][{index}]"

    # -- what each finished item leaves --------------------------------------------------------

    def finished(self, index: int, outcome: asyncio.Future[Any]) -> Any:
        """The result to record for a finished task (``_FAILED`` if there is none)."""
        if outcome.cancelled():
            return _FAILED
        error = outcome.exception()
        return self.settled(index, error, None if error is not None else outcome.result())

    def settled(self, index: int, error: BaseException | None, value: Any) -> Any:
        """The result to record for an item that returned ``value`` or raised ``error``
        (``_FAILED`` if there is none)."""
        if error is None:
            return value
        if isinstance(error, Exception) and self.return_exceptions:
            self.results[index] = error  # an item's failure is never recorded: it runs again
        elif self.fatal is None:
            self.fatal = (
                MapItemError(self.ctx.run_id, self.ctx.step, self.name, index, error)
                if isinstance(error, Exception)
                else error  # a Suspend (ctx.sleep in an item), KeyboardInterrupt...
            )
        return _FAILED

    def record(self, batch: dict[int, Any]) -> None:
        """Write a batch of results in one transaction; a value that cannot be serialised is
        left out (and becomes the map's error) while the others are kept."""
        host = self.host
        while batch:
            try:
                host.store.record_effects(
                    host.run_id,
                    {self.key(i): value for i, value in batch.items()},
                    checkpoint_id=host.parent_id,
                )
            except SerializationError as exc:
                index, nested = self._culprit(exc, batch)
                if index is None:
                    raise
                del batch[index]
                if self.fatal is None:
                    self.fatal = exc.located(
                        run_id=self.ctx.run_id, path=self.label(index) + nested
                    )
                continue
            self.results.update(batch)
            return

    def _culprit(self, exc: SerializationError, batch: dict[int, Any]) -> tuple[int | None, str]:
        path = exc.path or ""
        for index in batch:
            prefix = f"effect[{self.key(index)!r}]"
            if path.startswith(prefix):
                return index, path[len(prefix) :]
        return None, ""

    def outcome(self) -> list[Any]:
        if self.fatal is not None:
            raise self.fatal
        return [self.results[i] for i in range(len(self.items))]

    # -- sync functions: a bounded thread pool -------------------------------------------------

    def run_threads(self) -> list[Any]:
        todo = iter(self.load())
        fn = self.fn
        if self.host.tracer is not None:
            from ..observe import tracing

            fn = tracing.map_item(fn, self.name, self.ctx.run_id)
        items = self.items
        clock = time.perf_counter
        # Mean seconds an item takes (moving average), measured in the worker threads.
        seconds = [math.inf]
        # An item failed (those queued behind it are not started), or the map is abandoned
        # (a failed write, an interrupt: the queued ones do not start, the running finish).
        stop = [False]
        # Worker threads of our own rather than a ThreadPoolExecutor: no Future (a Condition,
        # its locks, a callback) per item, which for items of a few µs cost more than they.
        work: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        completed: queue.SimpleQueue[tuple[int, BaseException | None, Any]] = (
            queue.SimpleQueue()
        )

        def worker() -> None:
            while (index := work.get()) is not None:
                if stop[0]:
                    completed.put((index, None, _FAILED))  # not run, not recorded: it runs
                    continue  # when the step runs again
                started = clock()
                try:
                    completed.put((index, None, fn(items[index])))
                except BaseException as exc:  # a Suspend, KeyboardInterrupt... too
                    if not (self.return_exceptions and isinstance(exc, Exception)):
                        stop[0] = True
                    completed.put((index, exc, None))
                finally:
                    took = clock() - started
                    mean = seconds[0]
                    seconds[0] = took if mean == math.inf else mean + (took - mean) / 16

        threads: list[threading.Thread] = []
        in_flight = 0  # queued or running, without an outcome read here yet

        def top_up(unwritten: int) -> None:
            # Started without a durable result: those in flight and the `unwritten`.
            nonlocal in_flight
            limit = self.concurrency - unwritten + backlog(seconds[0])
            while self.fatal is None and in_flight < limit:
                index = next(todo, None)
                if index is None:
                    return
                work.put(index)
                in_flight += 1
                if len(threads) < min(self.concurrency, in_flight):
                    thread = threading.Thread(
                        target=worker, name=f"pitstop-map_{len(threads)}", daemon=True
                    )
                    thread.start()
                    threads.append(thread)

        try:
            top_up(0)
            while in_flight:
                done = [completed.get()]  # finished since the last batch, oldest first
                while not completed.empty():
                    done.append(completed.get())
                in_flight -= len(done)
                batch = {}
                for index, error, returned in done:
                    value = self.settled(index, error, returned)
                    if value is not _FAILED:
                        batch[index] = value
                # Quick items start while this batch is written (those finishing meanwhile
                # are the next batch: one commit for many); slower ones wait for it, so
                # that at most `concurrency` of them have started without a durable result.
                top_up(len(batch))
                self.record(batch)
                top_up(0)
        except BaseException:
            stop[0] = True  # a failed write or an interrupt: the queued ones do not start
            raise
        finally:
            for _ in threads:
                work.put(None)
            for thread in threads:  # those running finish (unrecorded)
                thread.join()
        return self.outcome()

    # -- async functions: tasks on the event loop ------------------------------------------------

    async def run_tasks(self) -> list[Any]:
        todo = iter(self.load())
        pending: dict[asyncio.Future[Any], int] = {}

        def top_up() -> None:
            while self.fatal is None and len(pending) < self.concurrency:
                index = next(todo, None)
                if index is None:
                    return
                coroutine: Awaitable[Any] = self.fn(self.items[index])
                pending[asyncio.ensure_future(coroutine)] = index

        try:
            top_up()
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                batch = {}
                for task in done:
                    index = pending.pop(task)
                    value = self.finished(index, task)
                    if value is not _FAILED:
                        batch[index] = value
                if batch:
                    await asyncio.to_thread(self.record, batch)
                top_up()
        finally:
            for task in pending:  # the step was cancelled: so are its items
                task.cancel()
        return self.outcome()


class _Failed:
    def __repr__(self) -> str:
        return "<failed>"


_FAILED: Any = _Failed()


def run_map(plan: MapPlan) -> list[Any]:
    """``ctx.map`` from a sync step: threads for sync functions, an event loop for async ones
    (in a thread of its own if this thread already runs one)."""
    if not is_async_callable(plan.fn):
        return plan.run_threads()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(plan.run_tasks())
    with ThreadPoolExecutor(1, thread_name_prefix="pitstop-map-loop") as pool:
        return pool.submit(asyncio.run, plan.run_tasks()).result()


async def run_amap(plan: MapPlan) -> list[Any]:
    """``await ctx.amap`` from an async step: tasks on this loop for async functions, the
    thread pool (driven from one thread off the loop) for sync ones."""
    if is_async_callable(plan.fn):
        return await plan.run_tasks()
    return await asyncio.to_thread(plan.run_threads)


__all__ = ["MapPlan", "is_async_callable", "run_amap", "run_map"]

"""Work over the chunks of large buffers spread across threads.

Hashing a chunk (xxh3 through a hasher object, SHA-256) and reading a file into place release
the GIL, so a save's hash pass and a load's reads and checks over a 256 MiB array run on every
core instead of one: the part of a save or load that is not waiting on the disk is this
work. Small values stay on the calling thread (starting threads costs more than they save).

The calling thread takes the first share itself and the others go to a pool kept for the
process (made on first use, made again in a forked child, whose copy has no threads). On 2
cores, a 256 MiB hash pass took 8.5 ms this way against 11.5 ms with a new pool per call
whose threads did all the work while the caller waited (medians of 31 interleaved rounds):
the caller's share starts at once, and no thread is started or joined per call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, TypeVar

T = TypeVar("T")
R = TypeVar("R")

THREADS: Final = max(1, min(4, os.cpu_count() or 1))
"""Threads for one pass, the caller's included (at most 4: beyond that a pass over memory is
bandwidth-bound)."""
PARALLEL_MIN: Final = 8 << 20
"""Bytes below which a pass stays on the calling thread."""

_in_worker = threading.local()
"""Set on the pool's threads: a pass started there runs on it alone, never waiting on a pool
whose threads may all be waiting on it."""


def _mark_worker() -> None:
    _in_worker.flag = True


class _SharedPool:
    """The process's pool for the shares after the caller's, made on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    THREADS - 1, thread_name_prefix="pitstop-chunks", initializer=_mark_worker
                )
            return self._pool

    def forget(self) -> None:
        """In a forked child: the parent's threads are not there (nor is its lock's holder)."""
        self._lock = threading.Lock()
        self._pool = None


_shared = _SharedPool()
if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_shared.forget)


def each(fn: Callable[[T], R], items: Sequence[T], nbytes: int) -> list[R]:
    """``[fn(item) for item in items]``, split into one contiguous run per thread when the
    items cover at least :data:`PARALLEL_MIN` bytes. The first exception raised (in the
    items' order) is raised here, once every run has stopped."""
    if (
        THREADS < 2
        or len(items) < 2
        or nbytes < PARALLEL_MIN
        or getattr(_in_worker, "flag", False)
    ):
        return [fn(item) for item in items]
    runs = min(THREADS, len(items))
    step = -(-len(items) // runs)
    pool = _shared.get()
    futures: list[Future[list[R]]] = [
        pool.submit(lambda part: [fn(item) for item in part], items[i : i + step])
        for i in range(step, len(items), step)
    ]
    try:
        out = [fn(item) for item in items[:step]]
    finally:
        for future in futures:  # the buffers they work on must outlive them
            future.exception()
    for future in futures:
        out.extend(future.result())
    return out


__all__ = ["PARALLEL_MIN", "THREADS", "each"]

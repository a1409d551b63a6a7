"""Work over the chunks of large buffers spread across threads.

Hashing a chunk (xxh3 through a hasher object, SHA-256) and reading a file into place release
the GIL, so a save's hash pass and a load's reads and checks over a 256 MiB array run on every
core instead of one: the part of a save or load that is not waiting on the disk is this
work. Small values stay on the calling thread (starting threads costs more than they save).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

T = TypeVar("T")
R = TypeVar("R")

THREADS: Final = max(1, min(4, os.cpu_count() or 1))
"""Threads for one pass (at most 4: beyond that a pass over memory is bandwidth-bound)."""
PARALLEL_MIN: Final = 8 << 20
"""Bytes below which a pass stays on the calling thread."""


def each(fn: Callable[[T], R], items: Sequence[T], nbytes: int) -> list[R]:
    """``[fn(item) for item in items]``, split into one contiguous run per thread when the
    items cover at least :data:`PARALLEL_MIN` bytes. The first exception raised is raised
    here, once every run has stopped."""
    if THREADS < 2 or len(items) < 2 or nbytes < PARALLEL_MIN:
        return [fn(item) for item in items]
    runs = min(THREADS, len(items))
    step = -(-len(items) // runs)
    with ThreadPoolExecutor(runs) as pool:
        futures = [
            pool.submit(lambda part: [fn(item) for item in part], items[i : i + step])
            for i in range(0, len(items), step)
        ]
    out: list[R] = []
    for future in futures:
        out.extend(future.result())
    return out


__all__ = ["PARALLEL_MIN", "THREADS", "each"]

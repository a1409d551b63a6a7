"""The small bounded maps the store and the LangGraph saver keep on their hot paths."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import islice, repeat
from typing import Any, Generic, TypeVar, cast

V = TypeVar("V")


class BoundedCache(Generic[V]):
    """At most ``size`` entries; the first inserted go first, an eighth of them at a time.

    What is looked up is nearly always what was inserted moments before (the parent of the
    next checkpoint), so insertion order is as good as recency and costs nothing on a hit.
    Lock-free and safe to share between threads: each dict operation is atomic in CPython,
    and a racing eviction at worst drops an entry early, which only costs a miss.

    A plain dict, evicted in batches: a put on a full cache is one dict store, where an
    OrderedDict's store and ``popitem`` cost ~2k instructions (callgrind; the store puts
    three on every save). A dict cannot pop its first item cheaply (it rescans the slots its
    earlier deletions left behind, until it next resizes), so a full cache drops its oldest
    eighth in one pass instead.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._batch = max(1, size // 8)
        self._data: dict[str, V] = {}
        # The map's own ``get``, bound: a lookup on every save then runs no Python frame.
        # (None, which callers pass for "no parent", is never a key: it finds nothing.)
        self.get: Callable[[str | None], V | None] = cast(Any, self._data.get)

    def put(self, key: str, value: V) -> None:
        data = self._data
        data[key] = value
        if len(data) > self._size:
            self._evict()

    def _evict(self) -> None:
        data = self._data
        # The oldest keys listed in one C call (no other thread's put can interleave), then
        # dropped, by ``map`` (a loop in C); one another thread dropped meanwhile is simply
        # gone already.
        oldest = list(islice(data, self._batch))
        deque(map(data.pop, oldest, repeat(None)), maxlen=0)

    def drop(self, key: str) -> None:
        self._data.pop(key, None)


__all__ = ["BoundedCache"]

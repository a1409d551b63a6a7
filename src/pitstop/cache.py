"""The small bounded maps the store and the LangGraph saver keep on their hot paths."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

V = TypeVar("V")


class BoundedCache(Generic[V]):
    """At most ``size`` entries; the first inserted go first.

    What is looked up is nearly always what was inserted moments before (the parent of the
    next checkpoint), so insertion order is as good as recency and costs nothing on a hit.
    Lock-free and safe to share between threads: each OrderedDict operation is atomic in
    CPython, and a racing eviction at worst drops an entry early, which only costs a miss.
    (An OrderedDict, not a dict: it pops its first item in O(1), where a dict would rescan
    the slots its earlier deletions left behind.)
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[str, V] = OrderedDict()
        # The map's own ``get``, bound: a lookup on every save then runs no Python frame.
        # (None, which callers pass for "no parent", is never a key: it finds nothing.)
        self.get: Callable[[str | None], V | None] = cast(Any, self._data.get)

    def put(self, key: str, value: V) -> None:
        data = self._data
        data[key] = value
        if len(data) > self._size:
            # try/except, not contextlib.suppress: a full cache evicts on every put, and
            # the context manager object would cost more than the eviction.
            try:  # noqa: SIM105 - see above
                data.popitem(last=False)
            except KeyError:  # emptied by another thread meanwhile
                pass

    def drop(self, key: str) -> None:
        self._data.pop(key, None)


__all__ = ["BoundedCache"]

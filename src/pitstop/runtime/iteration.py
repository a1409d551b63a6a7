"""Resumable iteration: yield items, record how far the loop got, continue there after a crash.

Shared by ``ctx.iterate`` (a workflow step) and ``Checkpointer.iterate`` (a plain loop); they
differ only in where a position is recorded. A position counts the items whose loop body
finished; for a source that can say where it is (a file: ``tell()``), it also holds that
offset, so resuming seeks instead of reading the skipped items again.

How a resumed iteration reaches its position, cheapest first:

* a ``range`` is sliced, any other sequence (``len`` + indexing) is indexed from there;
* a file (``io.IOBase``) or any object with ``tell()`` and ``seek()`` is sought to the offset;
* any other iterable is advanced by the number of items, which are read and dropped.
"""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Position = dict[str, Any]
"""``{"index": items done, "offset": source offset or None, "total": items in all or None,
"at": when recorded, "since": [index, time] this process started at}``, as stored
(JSON-friendly). ``total``, ``at`` and ``since`` are what progress displays read
(:func:`pitstop.observe.progress`); resuming reads ``index`` and ``offset`` alone."""


def _positioned(source: object) -> bool:
    return callable(getattr(source, "tell", None)) and callable(getattr(source, "seek", None))


class Resumable(Generic[T]):
    """An iteration that records its position every ``every`` items or ``seconds`` seconds
    (or when ``due()`` says so) by calling ``record(position)``, and starts at ``start``.

    ``position`` is the number of items whose loop body has finished. A body that raises
    records nothing: the item runs again after a resume.
    """

    def __init__(
        self,
        source: Iterable[T],
        *,
        start: Position | None,
        every: int | None,
        seconds: float | None,
        due: Callable[[], bool] | None,
        record: Callable[[Position], None],
        done: Callable[[Position], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        total: int | None = None,
    ) -> None:
        if every is not None and every < 1:
            raise ValueError("every must be >= 1")
        if seconds is not None and seconds <= 0:
            raise ValueError("seconds must be > 0")
        self._source = source
        self._every = every
        self._seconds = seconds
        self._due = due if every is None and seconds is None else None
        self._record = record
        self._done = done
        self._clock = clock
        start = start or {}
        self.position: int = int(start.get("index", 0))
        self.resumed_from: int = self.position
        """Where this iteration started: the items a previous process already did."""
        self._offset: int | None = start.get("offset")
        self._started = False
        if total is None and isinstance(source, Sized) and not _positioned(source):
            total = len(source)
        self.total = total
        """How many items the iteration has in all, if known (``total=`` or ``len()``)."""
        self._since = [self.position, time.time()]
        self.state: Any = None
        """The caller's running value recorded with each position (``ctx.iterate``)."""

    def snapshot(self) -> Position:
        """The current position, as it would be recorded now."""
        source: Any = self._source
        offset = source.tell() if _positioned(source) else None
        return {"index": self.position, "offset": offset, "total": self.total,
                "at": time.time(), "since": self._since}

    def _open(self) -> Iterator[Any]:
        source: Any = self._source
        index = self.position
        if isinstance(source, range):
            return iter(source[index:])
        if _positioned(source):
            if self._offset is not None:
                source.seek(self._offset)
                index = 0
            if isinstance(source, io.IOBase):
                # next() on a text file disables tell(); readline() keeps it usable.
                end = "" if isinstance(source, io.TextIOBase) else b""
                return itertools.islice(iter(source.readline, end), index, None)
        if isinstance(source, Sequence):
            return (source[i] for i in range(index, len(source)))
        return itertools.islice(iter(source), index, None)

    def __iter__(self) -> Iterator[T]:
        if self._started:
            raise RuntimeError("a resumable iteration can be iterated only once")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[T]:
        clock, every, seconds, due = self._clock, self._every, self._seconds, self._due
        index = self.position
        self._since = [index, time.time()]
        next_at = index + every if every else None
        deadline = clock() + seconds if seconds else None
        for item in self._open():
            yield item
            index += 1
            self.position = index
            if next_at is not None and index >= next_at:
                next_at = index + every  # type: ignore[operator]
            elif deadline is not None and clock() >= deadline:
                deadline = None
            elif due is None or not due():
                continue
            self._record(self.snapshot())
            if seconds:
                deadline = clock() + seconds
        if self._done is not None:
            self._done(self.snapshot())


__all__ = ["Position", "Resumable"]

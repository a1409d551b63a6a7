"""Event-time windows over a partition's keyed state, with a watermark and timers.

A :class:`Windowed` job aggregates each record into the windows its event time falls in
(:class:`Tumbling` or :class:`Sliding`), per key. The partition's watermark is the largest
event time seen less ``lateness``; a window whose end the watermark passes *fires*: its
``fire`` callback gets the aggregate (and may emit), and the window is dropped. A record for
a window that already fired is *late*, handled as declared: ``"drop"`` (counted),
``"side"`` (emitted as ``{"late": ...}``) or ``"update"`` (aggregated again and fired at
once with the updated result).

Windows, the watermark and the late count are entries of the keyed state (keys starting
with ``"\\x00"``, which :meth:`Job.state <pitstop.stream.Job.state>` leaves out), so they are
in every checkpoint, written only when they change; pending timers are the open windows,
rebuilt from the state when a partition is opened.

An idle partition would hold its windows open forever: the watermark moves only with
records. With ``idle=seconds`` (like Flink's idleness), once a partition has had no record
for that long, its watermark moves on with processing time: the watermark at its last
record plus the (processing) time since, so windows fire as if event time kept pace with
the clock. A record that comes later with an older event time is late for the windows that
fired (the ``late`` policy applies).
"""

from __future__ import annotations

import heapq
import math
import time as clock
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .keyed import KeyedState
from .records import Record

LatePolicy = Literal["drop", "side", "update"]
INTERNAL = "\x00"
"""Keys of the keyed state that start with this are pitstop's (windows, watermark)."""
_WATERMARK = "\x00watermark"
_LATE = "\x00late"
_WINDOW = "\x00w|"


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Tumbling:
    """Back-to-back windows of ``size`` seconds: [0, size), [size, 2·size), …"""

    size: float

    def windows(self, t: float) -> list[Window]:
        start = math.floor(t / self.size) * self.size
        return [Window(start, start + self.size)]


@dataclass(frozen=True, slots=True)
class Sliding:
    """Windows of ``size`` seconds starting every ``slide`` seconds (overlapping when
    ``slide < size``): a record falls in ``size / slide`` of them."""

    size: float
    slide: float

    def windows(self, t: float) -> list[Window]:
        last = math.floor(t / self.slide) * self.slide
        out = []
        start = last
        while start > t - self.size:
            out.append(Window(start, start + self.size))
            start -= self.slide
        out.reverse()
        return out


Emit = Callable[[Any, Any], None]


class Windowed:
    """Windows over ``job``'s records: decorate a :meth:`reduce` (``acc, record -> acc``,
    ``acc`` None at first) and a :meth:`fire` (``key, window, acc, emit``); this becomes the
    job's handler. ``time(record)`` gives a record's event time in seconds; ``key(record)``
    its key (default: ``record.key``), which ``fire`` gets back as text."""

    def __init__(
        self,
        job: Any,
        windows: Tumbling | Sliding,
        *,
        time: Callable[[Record], float],
        lateness: float = 0.0,
        late: LatePolicy = "drop",
        key: Callable[[Record], Any] | None = None,
        idle: float | None = None,
    ) -> None:
        if late not in ("drop", "side", "update"):
            raise ValueError('late must be "drop", "side" or "update"')
        if idle is not None and idle <= 0:
            raise ValueError("idle must be above 0 seconds (or None: the watermark moves "
                             "only with records)")
        self.idle = idle
        # partition: (its state, processing time of its last record, watermark then)
        self._seen: dict[int, tuple[KeyedState, float, float]] = {}
        self.windows = windows
        self.time = time
        self.lateness = lateness
        self.late = late
        self.key = key or (lambda record: record.key)
        self._reduce: Callable[[Any, Record], Any] | None = None
        self._fire: Callable[[Any, Window, Any, Emit], None] | None = None
        self._timers: dict[int, tuple[KeyedState, list[tuple[float, str]]]] = {}
        job.handler(self._handle)
        if idle is not None:
            job._on_idle(self._advance_idle)

    def reduce(self, fn: Callable[[Any, Record], Any]) -> Callable[[Any, Record], Any]:
        self._reduce = fn
        return fn

    def fire(self, fn: Callable[[Any, Window, Any, Emit], None]
             ) -> Callable[[Any, Window, Any, Emit], None]:
        self._fire = fn
        return fn

    @staticmethod
    def _slot(window: Window, key: Any) -> str:
        return f"{_WINDOW}{window.start!r}|{window.end!r}|{key}"

    @staticmethod
    def _parse(slot: str) -> tuple[Window, str]:
        start, end, key = slot[len(_WINDOW):].split("|", 2)
        return Window(float(start), float(end)), key

    def _heap(self, partition: int, state: KeyedState) -> list[tuple[float, str]]:
        held = self._timers.get(partition)
        if held is None or held[0] is not state:  # a partition (re)opened: rebuild
            heap = [(self._parse(k)[0].end, k) for k in state
                    if isinstance(k, str) and k.startswith(_WINDOW)]
            heapq.heapify(heap)
            held = self._timers[partition] = (state, heap)
        return held[1]

    def _handle(self, state: KeyedState, record: Record, emit: Emit) -> None:
        if self._reduce is None or self._fire is None:
            raise TypeError("stream.Windowed needs a @reduce and a @fire")
        heap = self._heap(record.partition, state)
        t = float(self.time(record))
        key = self.key(record)
        watermark = state.get(_WATERMARK, -math.inf)
        for window in self.windows.windows(t):
            slot = self._slot(window, key)
            if window.end <= watermark and slot not in state:
                if self.late == "drop":
                    state[_LATE] = state.get(_LATE, 0) + 1
                    continue
                if self.late == "side":
                    emit(key, {"late": record.value, "window": [window.start, window.end]})
                    continue
                # update: aggregate into the fired window again, and fire it at once
                state[slot] = self._reduce(state.get(slot), record)
                heapq.heappush(heap, (window.end, slot))
                continue
            if slot not in state:
                heapq.heappush(heap, (window.end, slot))
            state[slot] = self._reduce(state.get(slot), record)
        new_mark = max(watermark, t - self.lateness)
        if new_mark != watermark:
            state[_WATERMARK] = new_mark
        if self.idle is not None:
            self._seen[record.partition] = (state, clock.monotonic(), new_mark)
        self._fire_until(heap, state, new_mark, emit)

    def _fire_until(self, heap: list[tuple[float, str]], state: KeyedState, mark: float,
                    emit: Emit) -> None:
        assert self._fire is not None
        while heap and heap[0][0] <= mark:
            _, slot = heapq.heappop(heap)
            if slot in state:
                window, slot_key = self._parse(slot)
                self._fire(slot_key, window, state.pop(slot), emit)

    def _advance_idle(self, state: KeyedState, partition: int, emit: Emit, now: float
                      ) -> bool:
        """Called by the job for a partition that had no record in a read: past ``idle``
        seconds since its last record, move its watermark on with processing time. True
        when windows fired."""
        assert self.idle is not None
        seen = self._seen.get(partition)
        if seen is None or seen[0] is not state:  # (re)opened: idle from now
            mark = state.get(_WATERMARK)
            if mark is not None:
                self._seen[partition] = (state, now, float(mark))
            return False
        _, since, mark = seen
        if now - since < self.idle or self._fire is None:
            return False
        new_mark = mark + (now - since)
        heap = self._heap(partition, state)
        if not heap or heap[0][0] > new_mark:
            return False  # nothing to fire: the watermark is written when something is
        state[_WATERMARK] = max(new_mark, state.get(_WATERMARK, -math.inf))
        self._fire_until(heap, state, new_mark, emit)
        return True


def watermark(state: KeyedState) -> float | None:
    """A partition's watermark (None before its first record)."""
    value = state.get(_WATERMARK)
    return None if value is None else float(value)


__all__ = ["INTERNAL", "LatePolicy", "Sliding", "Tumbling", "Window", "Windowed", "watermark"]

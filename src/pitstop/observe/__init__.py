"""What runs do: timelines, event lists, loop progress, byte accounting, traces and metrics.

Everything here reads what the store already holds (checkpoint metadata, run rows, input and
effect rows) or hooks the runtime where it already measures; nothing here costs a query or
a serialisation per save. Tracing (``pitstop[otel]``) and metrics (``pitstop[metrics]``) are
imported only when turned on. Names are imported on first use: the runtime, which imports
the tracing and metrics hooks, does not load the timeline readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_getattr

if TYPE_CHECKING:
    from .timelines import Event, Progress, Span, events, progress, timeline

__getattr__ = lazy_getattr(__name__, globals(), dict.fromkeys(
    ["Event", "Progress", "Span", "events", "progress", "timeline"], "timelines"))

__all__ = ["Event", "Progress", "Span", "events", "progress", "timeline"]

"""What runs do: timelines, event lists, loop progress, byte accounting, traces and metrics.

Everything here reads what the store already holds (checkpoint metadata, run rows, input and
effect rows) or hooks the runtime where it already measures; nothing here costs a query or
a serialisation per save. Tracing (``pitstop[otel]``) and metrics (``pitstop[metrics]``) are
imported only when turned on.
"""

from __future__ import annotations

from .timeline import Event, Progress, Span, events, progress, timeline

__all__ = ["Event", "Progress", "Span", "events", "progress", "timeline"]

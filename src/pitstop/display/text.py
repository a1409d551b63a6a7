"""Sizes, ages, durations and short ids as people read and type them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - unreachable


def age(when: datetime | None, now: datetime | None = None) -> str:
    """``42s``, ``7m``, ``3h``, ``12d``: how long ago (or, with a leading ``in``, how soon)."""
    if when is None:
        return "-"
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    ahead = seconds < 0
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            text = f"{int(seconds // size)}{unit}"
            break
    else:
        text = f"{int(seconds)}s"
    return f"in {text}" if ahead else text


def duration(seconds: float | None) -> str:
    """``850µs``, ``12ms``, ``1.24s``, ``3m07s``, ``2h05m``: a step's or a wait's length."""
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.2f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)?\s*\Z", re.IGNORECASE)
_UNIT = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``7d``, ``1w`` (a bare number is seconds)."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 30m, 2h or 7d")
    return timedelta(seconds=float(match[1]) * _UNIT[(match[2] or "s").lower()])


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A duration back from now (``2h``) or an ISO date/time (local time unless it says)."""
    try:
        return (now or datetime.now(UTC)) - parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (30m, 2h, 7d) nor an ISO date (2026-11-28)"
        ) from None
    return when if when.tzinfo else when.astimezone()


SHORT = 8
"""Characters of a checkpoint id shown in listings: the end of the id, which is random (the
start of a UUIDv7 is its timestamp, shared by checkpoints written in the same millisecond)."""


def short(checkpoint_id: str | None) -> str:
    """The short form of a checkpoint id, by the rule of ``store.contract.lookup.short_id``
    (for a LangGraph checkpoint the end of its own id, not of the thread tag)."""
    from ..store.contract.lookup import short_id

    return short_id(checkpoint_id)



__all__ = ["SHORT", "age", "duration", "human_bytes", "parse_duration", "parse_since", "short"]

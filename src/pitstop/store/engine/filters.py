"""The filters of ``runs()`` and ``count_runs()``, checked before they reach SQL.

A value the database driver cannot bind (``metadata={"k": object()}``), one it binds as
something else (``limit="5"``), or a status that no run can have would otherwise end in a
driver's ``ProgrammingError`` or in a silently empty answer; here each is a ``TypeError`` or
``ValueError`` naming the filter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ...model import RunStatus

_STATUSES = ", ".join(s.value for s in RunStatus)


def statuses(status: RunStatus | str | Iterable[RunStatus | str] | None) -> list[str]:
    """The status filter as a list of status names (empty: any status)."""
    if status is None:
        return []
    given = [status] if isinstance(status, str) else list(status)
    out = []
    for one in given:
        try:
            out.append(RunStatus(one).value)
        except ValueError:
            raise ValueError(f"status {one!r} is not a run status ({_STATUSES})") from None
    return out


def timestamp(name: str, value: datetime | float | None) -> float | None:
    """A ``since``/``until`` filter as seconds since the epoch."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a datetime or seconds since the epoch, not "
                        f"{type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite time, not {value!r}")
    return float(value)


def text(name: str, value: Any) -> None:
    """Raise ``TypeError`` unless ``value`` (a text filter) is ``None`` or a string."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {type(value).__name__}")


def count(name: str, value: Any, *, optional: bool = False) -> None:
    """Raise unless ``value`` is a whole number >= 0 (or ``None``, if ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, not {value}")


def metadata(filters: Mapping[str, Any] | None) -> None:
    """Raise unless every key is a non-empty string and every value is JSON (what a run's
    metadata can hold): finite numbers, strings, booleans, None, lists and dicts of them."""
    for key, value in (filters or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"metadata key {key!r} must be a string")
        if not key:
            raise ValueError("metadata key must not be empty")
        try:
            json.dumps(value, allow_nan=False)
        except TypeError as exc:
            raise TypeError(f"metadata filter {key!r}: value is not JSON ({exc})") from None
        except ValueError as exc:
            raise ValueError(f"metadata filter {key!r}: value is not JSON ({exc})") from None


__all__ = ["count", "metadata", "statuses", "text", "timestamp"]

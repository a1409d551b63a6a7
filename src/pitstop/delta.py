"""Updates that say what changed: append items to a list field, set keys of a dict field.

A step that returns ``{"messages": pitstop.Append([message])}`` extends the ``messages`` field
instead of replacing it, and tells the store exactly what is new: a chunked field then costs
only the new items to save, however long it has grown (nothing old is serialised, hashed or
compared). ``pitstop.Merge({"k": v})`` does the same for keys of a dict field.

They work in three places, with one meaning — *the field's previous value, with this change*:

* as a step's return value (or inside ``goto``/``finish`` updates);
* as a value in :meth:`Store.save <pitstop.Store.save>` (the parent checkpoint's value, changed);
* in a state declaration: ``messages: Annotated[list[Msg], pitstop.Append]`` makes every
  update of that field an append, so a step may return ``{"messages": [message]}``.

``Append`` promises that the earlier items are unchanged. A step that edits an earlier item
in place must return the whole list (``state["messages"]``), which is then compared chunk by
chunk by content: also stored incrementally, at serialisation speed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple


class Append:
    """Extend a list field by ``items`` (a missing field starts as an empty list)."""

    __slots__ = ("items",)
    items: list[Any]

    def __init__(self, items: Iterable[Any]) -> None:
        if isinstance(items, str | bytes | Mapping):
            raise TypeError(
                f"Append takes the items to add (a list), not a {type(items).__name__}"
            )
        self.items = list(items)

    def apply(self, base: Any, *, field: str = "?") -> list[Any]:
        """A new list: ``base`` followed by the items (``base`` itself is not changed)."""
        if base is ABSENT or base is None:
            return list(self.items)
        if type(base) is not list:
            raise TypeError(
                f"pitstop.Append on field {field!r}, which holds a {type(base).__name__}, "
                "not a list"
            )
        return base + self.items

    def then(self, later: Append) -> Append:
        """This append followed by ``later``: one Append of both item lists."""
        return Append(self.items + later.items)

    def __eq__(self, other: object) -> bool:
        return type(other) is Append and other.items == self.items

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"pitstop.Append({self.items!r})"


class Merge:
    """Set keys of a dict field (a missing field starts as an empty dict). Keys keep their
    places; new keys come last, as ``dict.update`` does."""

    __slots__ = ("entries",)
    entries: dict[Any, Any]

    def __init__(self, entries: Mapping[Any, Any] | None = None, /, **more: Any) -> None:
        if entries is not None and not isinstance(entries, Mapping):
            raise TypeError(f"Merge takes a mapping, not a {type(entries).__name__}")
        self.entries = {**(entries or {}), **more}

    def apply(self, base: Any, *, field: str = "?") -> dict[Any, Any]:
        """A new dict: ``base`` updated with the entries (``base`` itself is not changed)."""
        if base is ABSENT or base is None:
            return dict(self.entries)
        if type(base) is not dict:
            raise TypeError(
                f"pitstop.Merge on field {field!r}, which holds a {type(base).__name__}, "
                "not a dict"
            )
        out = dict(base)
        out.update(self.entries)
        return out

    def then(self, later: Merge) -> Merge:
        """This merge followed by ``later``: one Merge, ``later``'s keys winning."""
        return Merge({**self.entries, **later.entries})

    def __eq__(self, other: object) -> bool:
        return type(other) is Merge and other.entries == self.entries

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"pitstop.Merge({self.entries!r})"


Delta = Append | Merge

ABSENT: Any = object()
"""A field the state does not have (what a delta on a new field applies to)."""


def is_delta(value: object) -> bool:
    cls = type(value)
    return cls is Append or cls is Merge


def combine(first: Delta, later: Delta, *, field: str = "?") -> Delta:
    """One delta with the effect of ``first`` then ``later`` on the same field."""
    if type(first) is Append and type(later) is Append:
        return first.then(later)
    if type(first) is Merge and type(later) is Merge:
        return first.then(later)
    raise TypeError(
        f"field {field!r}: {type(first).__name__} then {type(later).__name__} — a field is "
        "either a list appended to or a dict merged into"
    )


class Applied(NamedTuple):
    """A field's full new value that is known to be its parent's value with ``delta``
    applied: the store writes only the change, and keeps ``value`` as the checkpoint's."""

    value: Any
    delta: Delta


class MergePatch(NamedTuple):
    """A field's new value as its parent's chunked dict (``manifest``, a
    :class:`pitstop.serde.chunkmanifest.Manifest`) with ``delta`` set: the store writes a patch of
    the changed entries alone (:func:`pitstop.serde.chunkpatches.patch_dict`), the parent's value
    neither read nor serialised."""

    delta: Merge
    manifest: Any


def dirty_positions(value: Any, delta: Delta, parent_items: int) -> list[int]:
    """Positions below ``parent_items`` (the parent's length) of the items ``delta`` changed
    in place in ``value``, its result; what it appended comes after and is not listed."""
    if not isinstance(delta, Merge) or type(value) is not dict:
        return []
    changed = delta.entries.keys()
    if not changed:
        return []
    if len(changed) == 1:
        (key,) = changed
        for i, existing in enumerate(value):
            if existing == key:
                return [i] if i < parent_items else []
        return []
    return [i for i, key in enumerate(value) if key in changed and i < parent_items]


__all__ = [
    "ABSENT",
    "Append",
    "Applied",
    "Delta",
    "Merge",
    "MergePatch",
    "combine",
    "dirty_positions",
    "is_delta",
]

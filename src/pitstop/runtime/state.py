"""User state types (dict, TypedDict, dataclass, pydantic model) as top-level fields.

The store keeps state as named top-level fields, each stored on its own, so the runtime turns
whatever type the user chose into a field dict and back. Steps get a fresh shallow view each
time: assigning a top-level field on it (``state["x"] = 1`` or ``state.x = 1``) counts as an
update, found by identity, at no serialisation cost. Nested in-place mutation is not seen;
return the field instead (or choose ``change_detection="content"``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, is_typeddict

from ..delta import ABSENT, Append, Applied, Delta, Merge, combine, is_delta

_MISSING = object()


def declared_deltas(state_type: Any) -> dict[str, type[Append] | type[Merge]]:
    """Fields declared ``Annotated[..., pitstop.Append]`` (or ``pitstop.Merge``): a step's
    update of such a field is applied as that delta instead of replacing the value."""
    try:
        hints = typing.get_type_hints(state_type, include_extras=True)
    except Exception:
        return {}
    out: dict[str, type[Append] | type[Merge]] = {}
    for name, hint in hints.items():
        if typing.get_origin(hint) is typing.Annotated:
            for marker in hint.__metadata__:
                if marker is Append or marker is Merge:
                    out[name] = marker
    return out


class StateAdapter:
    """Plain dicts (and TypedDicts)."""

    type: Any = dict
    deltas: dict[str, type[Append] | type[Merge]] = {}

    def declare(self, state_type: Any) -> StateAdapter:
        if state_type is not None and state_type is not dict:
            self.deltas = declared_deltas(state_type)
        return self

    def as_updates(self, updates: dict[str, Any]) -> dict[str, Any]:
        """Returned updates of fields declared as deltas, wrapped in their delta."""
        for name, kind in self.deltas.items():
            value = updates.get(name, _MISSING)
            if value is not _MISSING and not is_delta(value):
                updates[name] = kind(value)
        return updates

    def fields_of(self, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise TypeError(f"state must be a mapping, not {type(value).__name__}")
        return dict(value)

    def view(self, fields: dict[str, Any]) -> Any:
        return dict(fields)

    def changes(self, view: Any, fields: dict[str, Any]) -> dict[str, Any]:
        """Top-level fields assigned on ``view`` by a step (compared by identity)."""
        if not isinstance(view, dict):
            return {}
        out = {k: v for k, v in view.items() if fields.get(k, _MISSING) is not v}
        for k in fields.keys() - view.keys():
            out[k] = _MISSING
        return out

    def updates_from(self, value: Any, fields: dict[str, Any]) -> dict[str, Any]:
        """A step's return value as updates (a mapping, or a whole new state)."""
        if type(value) is dict or isinstance(value, Mapping):  # (the ABC check is slow)
            return self.as_updates(dict(value))
        raise TypeError(
            "a step must return None, a mapping of updated fields, pitstop.goto(...) or "
            f"pitstop.finish(...), not {type(value).__name__}"
        )


class DataclassAdapter(StateAdapter):
    def __init__(self, cls: type) -> None:
        self.type = cls
        self._names = [f.name for f in dataclasses.fields(cls)]

    def fields_of(self, value: Any) -> dict[str, Any]:
        if value is None:
            value = self.type()
        elif isinstance(value, Mapping):
            value = self.type(**value)
        if not isinstance(value, self.type):
            raise TypeError(f"state must be a {self.type.__name__}, not {type(value).__name__}")
        return {name: getattr(value, name) for name in self._names}

    def view(self, fields: dict[str, Any]) -> Any:
        obj = object.__new__(self.type)
        for name in self._names:
            if name in fields:
                object.__setattr__(obj, name, fields[name])
        return obj

    def changes(self, view: Any, fields: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(view, self.type):
            return {}
        out = {}
        for name in self._names:
            value = getattr(view, name, _MISSING)
            if value is not _MISSING and fields.get(name, _MISSING) is not value:
                out[name] = value
        return out

    def updates_from(self, value: Any, fields: dict[str, Any]) -> dict[str, Any]:
        if isinstance(value, self.type):
            return self.as_updates(self.changes(value, fields))
        return super().updates_from(value, fields)


class PydanticAdapter(DataclassAdapter):
    def __init__(self, cls: type) -> None:
        self.type = cls
        self._names = list(cls.model_fields)  # type: ignore[attr-defined]

    def fields_of(self, value: Any) -> dict[str, Any]:
        if value is None or isinstance(value, Mapping):
            value = self.type.model_validate(value or {})
        if not isinstance(value, self.type):
            raise TypeError(f"state must be a {self.type.__name__}, not {type(value).__name__}")
        return {name: getattr(value, name) for name in self._names}

    def view(self, fields: dict[str, Any]) -> Any:
        return self.type.model_construct(**fields)


def adapter_for(state_type: Any) -> StateAdapter:
    if state_type is None or state_type is dict or is_typeddict(state_type):
        return StateAdapter().declare(state_type)
    if isinstance(state_type, type) and dataclasses.is_dataclass(state_type):
        return DataclassAdapter(state_type).declare(state_type)
    if isinstance(state_type, type) and hasattr(state_type, "model_fields"):
        return PydanticAdapter(state_type).declare(state_type)
    raise TypeError(
        f"unsupported state type {state_type!r}: use dict, a TypedDict, a dataclass or a "
        "pydantic model"
    )


def merged(fields: dict[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """A new field dict with ``updates`` applied (a removed field is marked ``_MISSING``; an
    :class:`~pitstop.Append` or :class:`~pitstop.Merge` is applied to the field's value)."""
    out = {**fields, **updates}
    for name, value in updates.items():
        if value is _MISSING:
            del out[name]
        elif is_delta(value):
            out[name] = value.apply(fields.get(name, ABSENT), field=name)
    return out


def tracked(
    deltas: dict[str, Delta | None], updates: Mapping[str, Any]
) -> dict[str, Delta | None]:
    """``deltas`` (fields changed only by deltas since the last checkpoint, with their
    combined delta; None for one also replaced whole) after ``updates``. A new dict."""
    if not deltas and not any(is_delta(v) for v in updates.values()):
        return deltas
    out = dict(deltas)
    for name, value in updates.items():
        if not is_delta(value):
            out[name] = None
        elif name not in out:
            out[name] = value
        elif (earlier := out[name]) is not None:
            out[name] = combine(earlier, value, field=name)
    return out


def with_deltas(fields: dict[str, Any], deltas: Mapping[str, Delta | None]) -> dict[str, Any]:
    """The fields to save: those changed only by deltas carry them (``Applied``), so the
    store writes the change and not the value."""
    if not deltas:
        return fields
    out = dict(fields)
    for name, delta in deltas.items():
        if delta is not None and name in out:
            out[name] = Applied(out[name], delta)
    return out


__all__ = ["StateAdapter", "adapter_for", "merged", "tracked", "with_deltas"]

"""A JSON view of any checkpoint value, for showing and diffing state in the CLI.

This is for humans, not for storage: it is lossy (a tuple shows as a list, bytes as a length
and a preview) but stable, so two views can be diffed line by line. It never raises, because a
display command must not die on the one odd value in a large state.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import math
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from .base import UnknownObject, type_name_of
from .tensors import is_tensor_class

_MAX_DEPTH = 64
_BYTES_PREVIEW = 32
_ARRAY_PREVIEW = 8
_REPR_LIMIT = 200


def to_jsonable(value: object) -> object:
    """``value`` as nested dicts, lists, str, int, float (finite), bool and None."""
    return _View().convert(value, 0)


def _safe_repr(value: object) -> str:
    if type(value) is int:
        return str(_int(value))
    try:
        text = repr(value)
    except Exception:
        return f"<{type_name_of(type(value))} (repr failed)>"
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


# Python refuses to turn ints of more than 4,300 digits into decimal text (a guard against
# quadratic-time conversions), and JSON has no other form for them: show those by size, with
# their first hex digits and a digest so that two different ones never look alike in a diff.
_INT_TEXT_MAX_BITS = 14_000  # ~4,214 digits: safely under the limit


def _int(value: int) -> object:
    if value.bit_length() <= _INT_TEXT_MAX_BITS:
        return value
    digits = math.floor(value.bit_length() * math.log10(2)) + 1
    magnitude = abs(value)
    raw = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big")
    sign = "-" if value < 0 else ""
    return (
        f"<int of about {digits:,} digits: {sign}0x{raw[:8].hex()}..., "
        f"sha256 {hashlib.sha256(raw).hexdigest()[:16]}>"
    )


def _float(value: float) -> object:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _json_sort_key(item: object) -> str:
    return json.dumps(item, sort_keys=True, default=str)


class _View:
    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: set[int] = set()  # containers being converted: a cycle shows as "<cycle>"

    def convert(self, value: Any, depth: int) -> object:
        if depth > _MAX_DEPTH:
            return "..."
        try:
            return self._convert(value, depth)
        except Exception:
            return _safe_repr(value)

    def _convert(self, value: Any, depth: int) -> object:
        cls = type(value)
        if value is None or cls is bool or cls is str:
            return value
        if cls is int:
            return _int(value)
        if cls is float:
            return _float(value)
        if isinstance(value, enum.Enum):
            name = value.name
            return f"{cls.__name__}.{name}" if name is not None else _safe_repr(value)
        module = cls.__module__
        if module == "numpy" or module.startswith("numpy."):
            return self._numpy(value, depth)
        if module.startswith("torch") and is_tensor_class(cls):
            flat = value.detach().reshape(-1)[:_ARRAY_PREVIEW]
            return {
                "$tensor": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape),
                "preview": self.convert(flat.tolist(), depth + 1),
            }
        # Subclasses of the basic types, reduced through the base type so no override runs.
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return _int(int.__int__(value))
        if isinstance(value, float):
            return _float(float.__float__(value))
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
            return {"$bytes": len(data), "preview": data[:_BYTES_PREVIEW].hex()}
        if isinstance(value, datetime.date | datetime.time):
            return value.isoformat()
        if isinstance(value, datetime.timedelta):
            return value.total_seconds()
        if isinstance(value, uuid.UUID | decimal.Decimal | complex):
            return str(value)
        if id(value) in self._open:
            return "<cycle>"
        self._open.add(id(value))
        try:
            return self._container(value, depth + 1)
        finally:
            self._open.discard(id(value))

    def _container(self, value: Any, depth: int) -> object:
        fields = fields_of(value)
        if fields is not None:
            name = (
                value.type_name if isinstance(value, UnknownObject) else type_name_of(type(value))
            )
            return {"$type": name, **{k: self.convert(v, depth) for k, v in fields.items()}}
        if isinstance(value, Mapping):
            return {
                k if type(k) is str else _safe_repr(k): self.convert(v, depth)
                for k, v in value.items()
            }
        if isinstance(value, set | frozenset):
            members = [self.convert(m, depth) for m in value]
            try:
                return sorted(members)  # type: ignore[type-var]
            except TypeError:
                return sorted(members, key=_json_sort_key)
        if isinstance(value, list | tuple) or type(value).__name__ == "deque":
            return [self.convert(item, depth) for item in value]
        return _safe_repr(value)

    def _numpy(self, value: Any, depth: int) -> object:
        np = sys.modules["numpy"]
        if isinstance(value, np.ndarray):
            preview = value.ravel()[:_ARRAY_PREVIEW].tolist()
            return {
                "$ndarray": value.dtype.str,
                "shape": list(value.shape),
                "preview": self.convert(preview, depth + 1),
            }
        if isinstance(value, np.generic):
            return self.convert(value.item(), depth + 1)
        return _safe_repr(value)


def fields_of(value: Any) -> Mapping[str, Any] | None:
    """The fields of a structured object (dataclass, model, Struct, UnknownObject), if it is one."""
    if isinstance(value, UnknownObject):
        return value.fields
    cls = type(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: getattr(value, f.name)
            for f in dataclasses.fields(value)
            if hasattr(value, f.name)
        }
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return {**value.__dict__, **(value.__pydantic_extra__ or {})}
    msgspec = sys.modules.get("msgspec")
    if msgspec is not None and isinstance(value, msgspec.Struct):
        return {
            name: getattr(value, name) for name in cls.__struct_fields__ if hasattr(value, name)
        }
    return None


__all__ = ["fields_of", "to_jsonable"]

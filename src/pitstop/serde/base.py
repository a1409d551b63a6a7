"""What every serialiser shares: the protocol the store codes against, and the lenient stand-in.

Kept free of heavy imports so that the registry, the display helpers and the pickle opt-in can
use it without pulling in the msgpack codec.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import uuid
from collections.abc import Mapping
from typing import Protocol, final, runtime_checkable


@runtime_checkable
class Serializer(Protocol):
    """How the store turns one field value into bytes and back.

    ``format_id`` is written into every stored blob header, so a store can hold blobs of several
    formats at once and always picks the right serialiser to read them back.
    """

    format_id: int
    name: str

    def dumps(self, value: object) -> bytes:
        """Encode ``value``; a ``SerializationError`` names the relative path of the culprit."""
        ...

    def loads(self, data: bytes, *, strict: bool = True) -> object:
        """Decode ``data``; ``strict=False`` returns ``UnknownObject`` for unregistered classes."""
        ...


#: Exact types the msgpack codec handles without registration. Registering one of them is
#: refused, because the codec dispatches on these before it ever consults the registry.
NATIVE_TYPES: frozenset[type] = frozenset(
    {
        str,
        bytes,
        bytearray,
        int,
        float,
        bool,
        type(None),
        complex,
        list,
        tuple,
        dict,
        set,
        frozenset,
        collections.OrderedDict,
        collections.Counter,
        collections.deque,
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
        uuid.UUID,
        decimal.Decimal,
    }
)


@final
class UnknownObject:
    """A stored object whose class is not registered here, kept as data instead of rebuilt.

    Returned by ``loads(strict=False)`` so that tools without the user's classes (the CLI) can
    still show and diff a checkpoint. It is deliberately inert: nothing about it can be turned
    back into the original class by accident, and it cannot be saved again.
    """

    __slots__ = ("fields", "type_name")

    type_name: str
    fields: dict[str, object]

    def __init__(self, type_name: str, fields: Mapping[str, object]) -> None:
        object.__setattr__(self, "type_name", type_name)
        object.__setattr__(self, "fields", dict(fields))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UnknownObject):
            return NotImplemented
        return self.type_name == other.type_name and self.fields == other.fields

    # Hash by type name only: the fields may be unhashable, yet an unknown frozen dataclass may
    # have been a dict key or set member and must still be usable as one.
    def __hash__(self) -> int:
        return hash((UnknownObject, self.type_name))

    def __repr__(self) -> str:
        return f"UnknownObject({self.type_name!r}, {self.fields!r})"


def type_name_of(cls: type) -> str:
    """The name used in error messages: builtins unqualified, everything else with its module."""
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", repr(cls))
    if module in (None, "builtins"):
        return str(qualname)
    return f"{module}.{qualname}"


def defined_in_python(cls: type) -> bool:
    """Whether ``cls`` is a Python class (a heap type) rather than one implemented in C."""
    return bool(cls.__flags__ & (1 << 9))  # Py_TPFLAGS_HEAPTYPE


__all__ = ["NATIVE_TYPES", "Serializer", "UnknownObject", "defined_in_python", "type_name_of"]

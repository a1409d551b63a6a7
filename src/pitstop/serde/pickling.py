"""The opt-in pickle serialiser, for values the safe format cannot hold."""

from __future__ import annotations

import pickle

from pitstop.errors import SerializationError

from .base import type_name_of


class PickleSerializer:
    """Stores values with :mod:`pickle`. LOADING A PICKLE RUNS CODE.

    A pickle names functions to call when it is loaded, so anyone who can write to the store
    can run arbitrary code in every process that reads from it. Use this only for a store that
    is as trusted as your own source code, and only for values the default msgpack serialiser
    cannot hold. It is never chosen implicitly. There is no allowlist: ``strict`` is accepted
    for interface compatibility and ignored, and errors cannot name the path of the culprit,
    only the message pickle gives.
    """

    format_id: int = 1
    name: str = "pickle"

    def __init__(self, protocol: int = 5) -> None:
        if not 2 <= protocol <= pickle.HIGHEST_PROTOCOL:
            raise ValueError(
                f"pickle protocol must be 2..{pickle.HIGHEST_PROTOCOL}, got {protocol}"
            )
        self.protocol = protocol

    def dumps(self, value: object) -> bytes:
        """Pickle ``value`` (any picklable object)."""
        try:
            return pickle.dumps(value, protocol=self.protocol)
        except Exception as exc:
            raise SerializationError(
                f"pickle failed: {exc}", path="", type_name=type_name_of(type(value))
            ) from exc

    def loads(self, data: bytes, *, strict: bool = True) -> object:
        """Unpickle ``data``. This runs code named by the data: only for stores you trust."""
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise SerializationError(f"unpickling failed: {exc}", path="") from exc

    def __repr__(self) -> str:
        return f"PickleSerializer(protocol={self.protocol})"


__all__ = ["PickleSerializer"]

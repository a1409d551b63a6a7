"""Safe serialisation of checkpoint field values.

``MsgpackSerializer`` is the default: exact types, no code runs on load, classes only from an
allowlist (``register``). ``PickleSerializer`` is an explicit opt-in for trusted stores.
``frame``/``unframe``/``digest`` are the stored form, and ``to_jsonable`` is the display view.
See docs/serialization.md for the wire format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_getattr

# Each name is imported from its module on first use: a store that only lists runs (the
# ``pitstop runs`` command) must not pay for the codec and its type tables.
_HOMES = {
    "Serializer": "base", "UnknownObject": "base",
    "BUFFER_MIN": "buffers", "Parts": "buffers",
    "MsgpackSerializer": "codec",
    "to_jsonable": "display",
    "digest": "framing", "frame": "framing", "unframe": "framing",
    "PickleSerializer": "pickling",
    "TypeRegistry": "registry", "default_registry": "registry", "register": "registry",
}

if TYPE_CHECKING:
    from .base import Serializer, UnknownObject
    from .buffers import BUFFER_MIN, Parts
    from .codec import MsgpackSerializer
    from .display import to_jsonable
    from .framing import digest, frame, unframe
    from .pickling import PickleSerializer
    from .registry import TypeRegistry, default_registry, register


__getattr__ = lazy_getattr(__name__, globals(), _HOMES)


__all__ = [
    "BUFFER_MIN",
    "MsgpackSerializer",
    "Parts",
    "PickleSerializer",
    "Serializer",
    "TypeRegistry",
    "UnknownObject",
    "default_registry",
    "digest",
    "frame",
    "register",
    "to_jsonable",
    "unframe",
]

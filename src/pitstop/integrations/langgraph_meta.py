"""The LangGraph metadata PitstopSaver stores with a checkpoint, as the reference savers make it.

:func:`checkpoint_metadata` returns what LangGraph's own
``get_serializable_checkpoint_metadata(config, metadata)`` returns (the metadata ``SqliteSaver``
and ``PostgresSaver`` store): the checkpoint's metadata with NUL characters taken out of its
strings, plus the plain (``str``, ``int``, ``bool``, ``float``) values of the config's
``metadata`` and ``configurable`` entries that it does not have, except LangGraph's own keys
(``EXCLUDED_METADATA_KEYS``, names starting with ``__``), and without ``writes``.

It runs on every ``put``. LangGraph's function looks at every key of both config entries each
time; in a loop's configs they are nearly always the same keys (``thread_id``,
``checkpoint_ns``, ``checkpoint_id``, LangGraph's ``__pregel_...`` entries), none of which is
copied. So which keys may be copied is worked out once per sequence of keys and remembered;
only their values are looked at per call. tests/test_langgraph_compat.py checks it against
LangGraph's function.

The metadata goes through JSON, as in the reference savers; a part of it that is not JSON at
all (LangGraph's metadata, or the checkpoint's frame) is stored with LangGraph's serializer
instead, base64-encoded under :data:`TYPED` (:func:`pack_not_json`, :func:`unpack_part`).
``list(filter=...)`` matches the metadata as PostgreSQL's ``jsonb @>`` does
(:func:`json_contains`).
"""

from __future__ import annotations

import base64
import json
from collections import ChainMap
from collections.abc import Mapping
from typing import Any, Final

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import EXCLUDED_METADATA_KEYS
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..model import CheckpointSummary

_KEPT: Final = 1024
"""Key sequences remembered at most (then the others are worked out per call)."""

_COPIED: dict[tuple[Any, ...], tuple[str, ...]] = {}
"""A config entry's keys, in order -> those whose plain values go into the metadata."""


def _copied(keys: tuple[Any, ...]) -> tuple[str, ...]:
    copied = _COPIED.get(keys)
    if copied is None:
        copied = tuple(
            key for key in keys if key not in EXCLUDED_METADATA_KEYS and not key.startswith("__")
        )
        if len(_COPIED) < _KEPT:
            _COPIED[keys] = copied
    return copied


def _flat(chain: ChainMap[Any, Any]) -> Mapping[Any, Any]:
    """A dict with ``chain``'s keys in its iteration order, each with the value it looks up."""
    maps = chain.maps
    if len(maps) == 1 and type(maps[0]) is dict:
        return maps[0]
    flat: dict[Any, Any] = {}
    for mapping in reversed(maps):
        flat.update(mapping)
    return flat


def checkpoint_metadata(config: RunnableConfig, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """LangGraph's ``get_serializable_checkpoint_metadata(config, metadata)`` (module docs)."""
    # A copy with NUL characters taken out of its strings, as LangGraph's (which makes every
    # string value a str). A loop, not a comprehension: no frame of its own on every put.
    out = dict(metadata)
    for key, value in out.items():
        if isinstance(value, str):
            out[key] = value.replace("\u0000", "")
    given: Any  # (typed as a dict; LangGraph hands a ChainMap)
    for given in (config.get("metadata"), config.get("configurable")):
        # (LangGraph's config metadata is a ChainMap.) Its iteration, truth and lookups are
        # Python code; one dict of the same keys, order and values is not.
        entry = _flat(given) if type(given) is ChainMap else given
        if not entry:
            continue
        keys = tuple(entry)
        copied = _COPIED.get(keys)  # (_copied's lookup, without its call: nearly always found)
        if copied is None:
            copied = _copied(keys)
        for key in copied:
            if key in out:
                continue
            value = entry[key]
            if isinstance(value, str):
                out[key] = value.replace("\u0000", "")
            elif isinstance(value, int | bool | float):
                out[key] = value
    out.pop("writes", None)
    return out


TYPED: Final = "__pitstop_typed__"
"""The key of a metadata part stored with LangGraph's serializer (``[type, base64]``)."""


def is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def pack_not_json(lg: dict[str, Any], serde: SerializerProtocol) -> None:
    """Store the parts of ``lg`` (the checkpoint's ``langgraph`` metadata) that are not JSON
    with ``serde`` instead, in place."""
    for key in ("metadata", "checkpoint"):
        if not is_json(lg[key]):
            type_, data = serde.dumps_typed(lg[key])
            lg[key] = {TYPED: [type_, base64.b64encode(data).decode()]}


def unpack_part(part: Any, serde: SerializerProtocol) -> Any:
    """A metadata part as it was handed over: one :func:`pack_not_json` stored is loaded."""
    if isinstance(part, dict) and len(part) == 1 and TYPED in part:
        type_, data = part[TYPED]
        return serde.loads_typed((type_, base64.b64decode(data)))
    return part


def langgraph_metadata(summary: CheckpointSummary, serde: SerializerProtocol) -> Any:
    """The LangGraph metadata of a checkpoint record, as ``put`` was handed it."""
    return unpack_part(summary.metadata.get("langgraph", {}).get("metadata", {}), serde)


def json_contains(value: Any, query: Any) -> bool:
    """JSON containment, as PostgreSQL's ``jsonb @>`` (what ``PostgresSaver`` filters with)."""
    if isinstance(query, Mapping):
        return isinstance(value, Mapping) and all(
            k in value and json_contains(value[k], v) for k, v in query.items()
        )
    if isinstance(query, list | tuple):
        return isinstance(value, list | tuple) and all(
            any(json_contains(item, q) for item in value) for q in query
        )
    if isinstance(query, bool) or isinstance(value, bool):
        return value is query  # JSON true is not 1
    return bool(value == query)


__all__ = [
    "TYPED",
    "checkpoint_metadata",
    "is_json",
    "json_contains",
    "langgraph_metadata",
    "pack_not_json",
    "unpack_part",
]

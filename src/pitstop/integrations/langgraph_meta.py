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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import EXCLUDED_METADATA_KEYS

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


def checkpoint_metadata(config: RunnableConfig, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """LangGraph's ``get_serializable_checkpoint_metadata(config, metadata)`` (module docs)."""
    out = {k: v.replace("\u0000", "") if isinstance(v, str) else v for k, v in metadata.items()}
    for entry in (config.get("metadata"), config.get("configurable")):
        if not entry:
            continue
        for key in _copied(tuple(entry)):
            if key in out:
                continue
            value = entry[key]
            if isinstance(value, str):
                out[key] = value.replace("\u0000", "")
            elif isinstance(value, int | bool | float):
                out[key] = value
    out.pop("writes", None)
    return out


__all__ = ["checkpoint_metadata"]

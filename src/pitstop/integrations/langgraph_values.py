"""How PitstopSaver stores LangGraph channel values and pending writes, and how tools show them.

One place for the stored form of a LangGraph value, so the saver's readers and writers (and
anything that changes how a channel is stored) agree on it. No ``langgraph`` import: pitstop's
CLI and inspector show LangGraph threads without LangGraph installed.

* A channel value is the ``(type, bytes)`` pair of LangGraph's ``serde.dumps_typed`` packed as
  one msgpack array ``[type, bytes]``: the store serialises a byte string in one native call,
  a tuple would take its extension path (and a scan for buffers) at several times the cost.
  Earlier versions stored the pair itself; both are read.
* A pending write is the msgpack array ``[task_id, channel, type, bytes, task_path, idx]``
  (earlier versions: the tuple). The regular writes of one ``put_writes`` call are one record,
  the array of their arrays: a step's writes then cost one row (and one index entry per
  index) instead of one per write.

:func:`display_state` turns a LangGraph checkpoint's state into plain data for people:
messages show as ``{"$type": "langchain_core.messages.ai.AIMessage", "content": ...}``. It
reads LangGraph's msgpack format itself and never imports or constructs the classes a value
names, so showing a value runs no code; a ``pickle`` value is unpickled only when the store it
came from was opened with pitstop's :class:`~pitstop.PickleSerializer` (the user's opt-in),
and otherwise shows as its size.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import ormsgpack

from ..model import Checkpoint

TypedValue = tuple[str, bytes]

_SINGLE_ARG: Final = 0
_POS_ARGS: Final = 1
_KW_ARGS: Final = 2
_METHOD_SINGLE_ARG: Final = 3
_PYDANTIC_V1: Final = 4
_PYDANTIC_V2: Final = 5
_NUMPY_ARRAY: Final = 6
_DELTA_SNAPSHOT: Final = 7
"""LangGraph's msgpack extension codes (``langgraph.checkpoint.serde.jsonplus``)."""

_PLAIN_MODULES: Final = frozenset({"uuid", "decimal", "ipaddress", "zoneinfo", "datetime",
                                   "builtins", "collections", "pathlib", "re"})
"""Standard-library values shown as their plain argument (a UUID's hex, a set's items)."""


pack_typed: Final[Callable[[TypedValue], bytes]] = ormsgpack.packb
"""A ``serde.dumps_typed`` pair as stored: one msgpack array ``[type, bytes]``. (The packer
itself, not a function calling it: it runs for every changed channel of every step.)"""


def unpack_typed(stored: Any) -> TypedValue:
    """The (type, bytes) pair of a stored channel value."""
    if isinstance(stored, bytes):
        type_, data = ormsgpack.unpackb(stored)
    else:  # the pair itself, as earlier versions stored it
        type_, data = stored
    return type_, data


def pack_write(task_id: str, channel: str, typed: TypedValue, task_path: str, idx: int) -> bytes:
    """A pending write as stored."""
    return ormsgpack.packb((task_id, channel, typed[0], typed[1], task_path, idx))


pack_writes: Final[Callable[[list[tuple[str, str, str, bytes, str, int]]], bytes]] = (
    ormsgpack.packb
)
"""Several pending writes (of one task) as one stored record: the msgpack array of their
arrays. (The packer itself, as :data:`pack_typed`: it runs for every task of every step.)"""


def unpack_writes(record: Any) -> list[tuple[Any, ...]]:
    """The pending writes in one effect record, each as (task_id, channel, type, bytes,
    task_path, idx): one for a record of one write, several for a record of a task's writes
    (:func:`pack_writes`), none for an effect record that is not a LangGraph write."""
    if isinstance(record, bytes):
        try:
            record = ormsgpack.unpackb(record)
        except ormsgpack.MsgpackDecodeError:
            return []
        if not isinstance(record, list):
            return []
        if record and isinstance(record[0], list):
            return [tuple(w) for w in record if isinstance(w, list) and len(w) == 6]
        return [tuple(record)] if len(record) == 6 else []
    one = unpack_write(record)
    return [one] if one is not None else []


def unpack_write(record: Any) -> tuple[Any, ...] | None:
    """A pending write record as (task_id, channel, type, bytes, task_path, idx), or None for
    an effect record that is not one."""
    if isinstance(record, bytes):
        try:
            record = ormsgpack.unpackb(record)
        except ormsgpack.MsgpackDecodeError:
            return None
        if not isinstance(record, list):
            return None
    elif not isinstance(record, tuple):
        return None
    return tuple(record) if len(record) == 6 else None


def is_langgraph(checkpoint: Checkpoint) -> bool:
    """Whether PitstopSaver wrote this checkpoint (its state fields are LangGraph channels)."""
    return isinstance(checkpoint.metadata.get("langgraph"), Mapping)


def display_state(checkpoint: Checkpoint, *, allow_pickle: bool = False) -> Mapping[str, Any]:
    """A checkpoint's state for showing: a LangGraph checkpoint's channels decoded (see the
    module docs), any other checkpoint's state as it is."""
    if not is_langgraph(checkpoint):
        return checkpoint.state
    return {name: display_value(value, allow_pickle=allow_pickle)
            for name, value in checkpoint.state.items()}


def display_value(stored: Any, *, allow_pickle: bool = False) -> Any:
    """One stored channel value as plain data, without running code. Never raises: a value
    that cannot be read shows as its type and size. A long list channel is stored item by
    item (a list of packed pairs): shown as the list of its items."""
    if type(stored) is list:
        return [display_value(item, allow_pickle=allow_pickle) for item in stored]
    try:
        type_, data = unpack_typed(stored)
    except Exception:
        return stored
    try:
        return _decode(type_, data, allow_pickle)
    except Exception:
        return {"$type": str(type_), "$bytes": len(data)}


def _decode(type_: str, data: bytes, allow_pickle: bool) -> Any:
    if type_ == "null":
        return None
    if type_ in ("bytes", "bytearray"):
        return bytes(data)
    if type_ == "msgpack":
        return ormsgpack.unpackb(data, ext_hook=_ext, option=ormsgpack.OPT_NON_STR_KEYS)
    if type_ == "json":  # LangGraph's older format; its "lc" objects stay plain dicts
        return json.loads(data)
    if type_ == "pickle" and allow_pickle:
        return pickle.loads(data)  # the store's owner opted in to pickle
    raise ValueError(f"not shown: {type_}")  # encrypted, unknown, or pickle not opted in


def _ext(code: int, payload: bytes) -> Any:
    """A LangGraph msgpack extension as plain data: the class it names is never imported."""
    try:
        parts = ormsgpack.unpackb(payload, ext_hook=_ext, option=ormsgpack.OPT_NON_STR_KEYS)
    except Exception:
        return {"$ext": code, "$bytes": len(payload)}
    if code == _DELTA_SNAPSHOT:
        return parts
    if code == _NUMPY_ARRAY and isinstance(parts, list | tuple) and len(parts) == 4:
        return {"$ndarray": parts[0], "shape": list(parts[1])}
    if not isinstance(parts, list | tuple) or len(parts) < 3:
        return {"$ext": code, "value": parts}
    module, name, arg = parts[0], parts[1], parts[2]
    type_name = f"{module}.{name}"
    if code in (_PYDANTIC_V1, _PYDANTIC_V2, _KW_ARGS) and isinstance(arg, Mapping):
        return {"$type": type_name, **arg}
    if module in _PLAIN_MODULES:
        if module == "pathlib" and isinstance(arg, list | tuple):
            return "/".join(str(p) for p in arg).replace("//", "/")
        if code == _POS_ARGS and name == "date" and len(arg) == 3:
            return "{:04}-{:02}-{:02}".format(*arg)
        if code == _POS_ARGS and name == "timedelta" and len(arg) == 3:
            return arg[0] * 86400 + arg[1] + arg[2] / 1e6
        return arg
    if code in (_SINGLE_ARG, _METHOD_SINGLE_ARG):
        return {"$type": type_name, "value": arg}
    return {"$type": type_name, "args": arg}


__all__ = [
    "display_state",
    "display_value",
    "is_langgraph",
    "pack_typed",
    "pack_write",
    "pack_writes",
    "unpack_typed",
    "unpack_write",
    "unpack_writes",
]


_BRANCH: Final = "branch:to:"
_BRANCH_LEN: Final = len(_BRANCH)
_START: Final = "__start__"
_TASKS: Final = "__pregel_tasks"


def due_nodes(channels: Iterable[str], versions: Any, versions_seen: Any) -> list[str] | None:
    """The nodes a LangGraph checkpoint would run next (LangGraph's ``next``), or None when
    that cannot be told without the graph.

    ``channels`` are the checkpoint's available channels (those holding a value). A node is
    due when its trigger channel ``branch:to:<node>`` (``__start__`` for the input) holds a
    value whose version the node has not seen yet: the rule LangGraph's own
    ``prepare_next_tasks`` applies to graphs built with ``StateGraph``. Pending ``Send``
    tasks or channels of another layout give None, never a guess of "nothing".
    """
    # type() first: isinstance with an ABC runs Python code (three times a put).
    if not (type(versions) is dict or isinstance(versions, Mapping)) or not (
            type(versions_seen) is dict or isinstance(versions_seen, Mapping)):
        return None
    # One pass over the channels (this runs on every put): only triggers are looked at.
    due = []
    for name in channels:
        if name == _START:
            node = _START
        elif name.startswith(_BRANCH):
            node = name[_BRANCH_LEN:]
        elif name == _TASKS:
            return None
        else:
            continue
        node_seen = versions_seen.get(node)
        before = (
            node_seen.get(name)
            if type(node_seen) is dict or isinstance(node_seen, Mapping)
            else None
        )
        if _newer(versions.get(name), before):
            due.append(node)
    if not due and not any(
            str(k) == _START or str(k).startswith(_BRANCH) for k in versions):
        return None  # not a StateGraph's layout
    due.sort()
    return due


def _newer(version: Any, seen: Any) -> bool:
    """Whether a channel at ``version`` is news to a node that saw ``seen`` (versions of
    other types than the node saw count as news: "due" is the answer that hides nothing)."""
    if version is None:
        return False
    if seen is None:
        return True
    try:
        return bool(version > seen)
    except TypeError:
        return True

"""LangGraph threads as a person reads them: channels decoded, ``messages`` as a conversation.

A LangGraph thread is a run of workflow ``"langgraph"`` whose state fields are channels, each
stored as LangGraph's ``(type, bytes)`` pair packed in one msgpack array
(:mod:`pitstop.integrations.langgraph`). LangGraph's own ``loads_typed`` would rebuild the
objects by importing the modules the bytes name, or unpickle them: the inspector must never
run or import anything a store holds. So this decoder reads the same msgpack with an
extension hook that rebuilds nothing: an object comes back as a plain dict naming its class
(``{"$type": "langchain_core.messages.ai.AIMessage", "content": ..., ...}``), a pickled value
as a placeholder. It needs neither LangGraph nor langchain installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import ormsgpack

from ..integrations.langgraph_values import due_nodes

WORKFLOW = "langgraph"

# LangGraph's msgpack extension codes (langgraph.checkpoint.serde.jsonplus), a stored format.
_CONSTRUCTOR_SINGLE_ARG = 0
_CONSTRUCTOR_POS_ARGS = 1
_CONSTRUCTOR_KW_ARGS = 2
_METHOD_SINGLE_ARG = 3
_PYDANTIC_V1 = 4
_PYDANTIC_V2 = 5
_NUMPY_ARRAY = 6
_DELTA_SNAPSHOT = 7

_ROLES = {
    "HumanMessage": "user", "HumanMessageChunk": "user",
    "AIMessage": "assistant", "AIMessageChunk": "assistant",
    "SystemMessage": "system", "SystemMessageChunk": "system",
    "ToolMessage": "tool", "ToolMessageChunk": "tool",
    "FunctionMessage": "tool", "ChatMessage": "chat",
}


def is_thread(workflow: str | None) -> bool:
    return workflow == WORKFLOW


def _ext(code: int, data: bytes) -> Any:
    try:
        inner = ormsgpack.unpackb(data, ext_hook=_ext, option=ormsgpack.OPT_NON_STR_KEYS)
    except Exception:
        return {"$type": "undecodable", "bytes": len(data)}
    if code == _DELTA_SNAPSHOT:
        return inner
    if code == _NUMPY_ARRAY and isinstance(inner, list | tuple) and len(inner) >= 2:
        return {"$type": "numpy.ndarray", "dtype": inner[0], "shape": inner[1]}
    if not isinstance(inner, list | tuple) or len(inner) < 2:
        return {"$type": f"extension {code}", "value": inner}
    name = f"{inner[0]}.{inner[1]}"
    args = inner[2] if len(inner) > 2 else None
    if code == _METHOD_SINGLE_ARG and len(inner) > 3:
        args = inner[2]
    if isinstance(args, Mapping) and code in (_CONSTRUCTOR_KW_ARGS, _PYDANTIC_V1, _PYDANTIC_V2):
        return {"$type": name, **{str(k): v for k, v in args.items()}}
    if code == _CONSTRUCTOR_SINGLE_ARG:
        return {"$type": name, "value": args}
    return {"$type": name, "args": args}


def decode_channel(stored: Any) -> Any:
    """One stored channel value as plain data, whatever it held; never raises."""
    try:
        if isinstance(stored, bytes):
            type_, data = ormsgpack.unpackb(stored)
        else:
            type_, data = stored
    except Exception:
        return stored
    return decode_typed(type_, data)


def decode_typed(type_: str, data: bytes) -> Any:
    """LangGraph's ``(type, bytes)`` pair as plain data, without importing or unpickling."""
    try:
        if type_ == "null":
            return None
        if type_ == "msgpack":
            return ormsgpack.unpackb(data, ext_hook=_ext, option=ormsgpack.OPT_NON_STR_KEYS)
        if type_ == "json":
            return json.loads(data)
        if type_ in ("bytes", "bytearray"):
            return bytes(data)
        if type_ == "str":
            return bytes(data).decode("utf-8", "replace")
    except Exception:
        return {"$type": "undecodable", "format": type_, "bytes": len(data)}
    return {"$type": f"{type_} value (not loaded: the inspector never unpickles)",
            "bytes": len(data)}


def channels(state: Mapping[str, Any]) -> dict[str, Any]:
    return {name: decode_channel(value) for name, value in state.items()}


def next_nodes(metadata: Mapping[str, Any], fields: Iterable[str] | None = None
               ) -> list[str] | None:
    """LangGraph's ``next`` for a thread's checkpoint (the nodes it would run on), or None
    when that cannot be told without the graph.

    A saver that records it (``metadata["langgraph"]["next"]``) is believed. Otherwise,
    given the checkpoint's state field names (its available channels): a node is due when
    its trigger channel ``branch:to:<node>`` (``__start__`` for the input) holds a value
    whose version the node has not seen yet -- the rule LangGraph's own
    ``prepare_next_tasks`` applies to graphs built with ``StateGraph``. Pending ``Send``
    tasks or channels of another layout make the answer None, never a guess of "nothing".
    """
    block = metadata.get("langgraph")
    if not isinstance(block, Mapping):
        return None
    recorded = block.get("next")
    if isinstance(recorded, list):
        return sorted(str(n) for n in recorded)
    frame = block.get("checkpoint")
    if fields is None or not isinstance(frame, Mapping):
        return None
    return due_nodes(fields, frame.get("channel_versions"), frame.get("versions_seen"))


def idle(run_status: str, metadata: Mapping[str, Any] | None,
         fields: Iterable[str] | None = None) -> bool:
    """A thread that says ``running`` although its graph has nothing left to run: LangGraph
    savers (this one too) write no status when a graph ends, so "running" stays."""
    if run_status != "running" or metadata is None:
        return False
    return next_nodes(metadata, fields) == []


def conversation(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as chat turns: role, name, text, tool calls. Empty if it is not a list
    of messages."""
    if not isinstance(messages, list):
        return []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            turns.append({"role": "value", "text": json.dumps(message, default=str)})
            continue
        kind = str(message.get("$type", "")).rpartition(".")[2]
        role = _ROLES.get(kind) or str(message.get("type") or message.get("role") or "message")
        turns.append({
            "role": role,
            "kind": kind or role,
            "name": message.get("name") or "",
            "text": _text(message.get("content")),
            "tool_calls": [_call(c) for c in message.get("tool_calls") or () if
                           isinstance(c, Mapping)],
            "id": message.get("id") or "",
        })
    return turns


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        parts = []
        for block in content:
            if isinstance(block, Mapping) and "text" in block:
                parts.append(str(block["text"]))
            elif isinstance(block, str):
                parts.append(block)
            else:
                parts.append(json.dumps(block, default=str))
        return "\n".join(parts)
    return "" if content is None else json.dumps(content, default=str)


def _call(call: Mapping[str, Any]) -> str:
    args = call.get("args")
    return f"{call.get('name', '?')}({json.dumps(args, default=str, ensure_ascii=False)})"


__all__ = ["WORKFLOW", "channels", "conversation", "decode_channel", "decode_typed", "is_thread"]

"""State as the inspector shows it: a typed tree of nodes, and text diffs inside strings.

The tree is built from the live values a checkpoint loads to (``store.get(strict=False)``),
not from their JSON view, so a tuple still says ``tuple``, a registered dataclass its class
and a value of a class this process does not know says so. It is bounded: containers show
their first :data:`CHILDREN` entries, strings their first :data:`TEXT` characters, and the
rest is one click away (the page fetches that path from the JSON API). Nothing here executes
anything from the store: values are only inspected and turned into text.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import difflib
import enum
import math
import re
import sys
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from ..fieldpath import index_path, key_path
from ..serde.base import UnknownObject, type_name_of
from ..serde.display import fields_of

CHILDREN = 100
"""Entries of one container shown before a "more" marker."""
TEXT = 400
"""Characters of a string shown before it is shortened."""
DEPTH = 40
"""Nesting shown before a subtree is cut (deeper state is still in the JSON API)."""
OPEN_DEPTH = 2
"""Levels open when the page loads (the second only for small containers); the rest are
collapsed."""
OPEN_SMALL = 6


@dataclasses.dataclass(slots=True)
class Node:
    """One value in the state tree."""

    kind: Literal["map", "seq", "object", "text", "number", "bool", "null", "bytes", "other"]
    type: str
    """What the value is, as a person reads it: ``dict``, ``tuple``, ``Plan``, ``datetime``."""
    path: str
    """Where it is, in the syntax ``pitstop show --field`` takes (``messages[3].content``)."""
    text: str = ""
    """A leaf's value as text (shortened for long strings), or a container's summary."""
    size: int | None = None
    """Entries of a container, characters of a string, bytes of a byte string."""
    truncated: bool = False
    children: list[tuple[str, Node]] = dataclasses.field(default_factory=list)
    more: int = 0
    """Entries of the container not shown."""
    note: str = ""
    """A remark shown beside the type (``not loaded here`` for an unknown class)."""
    open: bool = False


def tree(state: Mapping[str, Any]) -> list[tuple[str, Node]]:
    """The top-level fields of a state as nodes, all of them (a state is a few fields)."""
    return [(str(name), _node(value, key_path("", str(name)), 1)) for name, value in
            state.items()]


def _label(key: Any) -> str:
    return key if isinstance(key, str) else _repr(key)


def _repr(value: Any, limit: int = TEXT) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type_name_of(type(value))}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _node(value: Any, path: str, depth: int) -> Node:
    try:
        return _build(value, path, depth)
    except Exception:  # a value whose own methods fail is still shown, as its type
        return Node("other", type_name_of(type(value)), path, text="(cannot be shown)")


def _build(value: Any, path: str, depth: int) -> Node:
    cls = type(value)
    if value is None:
        return Node("null", "None", path, text="None")
    if isinstance(value, bool):
        return Node("bool", "bool", path, text="true" if value else "false")
    if isinstance(value, enum.Enum):
        return Node("other", type_name_of(cls), path, text=f"{cls.__name__}.{value.name}")
    if isinstance(value, int):
        return Node("number", "int", path, text=str(int(value)))
    if isinstance(value, float):
        number = float(value)
        return Node("number", "float", path,
                    text=repr(number) if math.isfinite(number) else str(number))
    if isinstance(value, str):
        text = str(value)
        short = text if len(text) <= TEXT else text[:TEXT]
        return Node("text", "str", path, text=short, size=len(text), truncated=len(text) > TEXT)
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        preview = data[:48].hex(" ")
        return Node("bytes", cls.__name__, path, text=preview + (" …" if len(data) > 48 else ""),
                    size=len(data))
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return Node("other", cls.__name__, path, text=value.isoformat())
    if isinstance(value, datetime.timedelta):
        return Node("other", "timedelta", path, text=str(value))
    if isinstance(value, uuid.UUID | decimal.Decimal | complex):
        return Node("other", cls.__name__, path, text=str(value))
    module = cls.__module__
    if module == "numpy" or module.startswith("numpy."):
        return _numpy(value, path)
    if depth > DEPTH:
        return Node("other", type_name_of(cls), path, text="(nested too deep: see the JSON)")
    fields = fields_of(value)
    if fields is not None:
        unknown = isinstance(value, UnknownObject)
        name = value.type_name if unknown else type_name_of(cls)
        node = _container("object", name.rpartition(".")[2] or name, path, fields.items(), depth,
                          keyed=True)
        node.note = "class not loaded here" if unknown else name
        return node
    if isinstance(value, Mapping):
        return _container("map", cls.__name__, path, value.items(), depth, keyed=True)
    if isinstance(value, list | tuple | set | frozenset) or cls.__name__ == "deque":
        items = value
        if isinstance(value, set | frozenset):
            try:
                items = sorted(value)
            except TypeError:
                items = sorted(value, key=repr)
        return _container("seq", cls.__name__, path, enumerate(items), depth, keyed=False)
    return Node("other", type_name_of(cls), path, text=_repr(value))


def _container(kind: Literal["map", "seq", "object"], type_: str, path: str, items: Any,
               depth: int, *, keyed: bool) -> Node:
    node = Node(kind, type_, path, open=depth < OPEN_DEPTH)
    count = 0
    for key, child in items:
        count += 1
        if count > CHILDREN:
            continue
        label = _label(key)
        child_path = key_path(path, label) if keyed else index_path(path, key)
        node.children.append((label if keyed else str(key), _node(child, child_path, depth + 1)))
    node.size = count
    node.more = max(0, count - CHILDREN)
    node.open = node.open or (depth == OPEN_DEPTH and count <= OPEN_SMALL)
    unit = ("field" if kind == "object" else "key") if keyed else "item"
    node.text = f"{count} {unit}{'s' if count != 1 else ''}"
    return node


def _numpy(value: Any, path: str) -> Node:
    np = sys.modules["numpy"]
    if isinstance(value, np.ndarray):
        preview = ", ".join(_repr(v, 40) for v in value.ravel()[:8].tolist())
        more = " …" if value.size > 8 else ""
        shape = "\u00d7".join(str(n) for n in value.shape) or "scalar"
        return Node("other", f"ndarray {value.dtype} {shape}", path, text=f"[{preview}{more}]",
                    size=int(value.size))
    return Node("number", type_name_of(type(value)), path, text=_repr(value))


# -- text diffs ----------------------------------------------------------------------------------

Segment = tuple[Literal["equal", "delete", "insert"], str]

_WORDS = re.compile(r"\s+|\w+|[^\w\s]")
_DIFF_LIMIT = 20_000
"""Characters (either side) above which a text diff works line by line, not word by word."""


def text_diff(old: str, new: str) -> list[Segment]:
    """How ``old`` became ``new``, as runs of equal, deleted and inserted text.

    Word by word (whitespace and punctuation are their own tokens), so a changed word reads
    as that word struck out and its replacement; line by line for very long texts.
    """
    if max(len(old), len(new)) > _DIFF_LIMIT:
        a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    else:
        a, b = _WORDS.findall(old), _WORDS.findall(new)
    out: list[Segment] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            _add(out, "equal", "".join(a[i1:i2]))
            continue
        if op in ("delete", "replace"):
            _add(out, "delete", "".join(a[i1:i2]))
        if op in ("insert", "replace"):
            _add(out, "insert", "".join(b[j1:j2]))
    return out


def _add(out: list[Segment], op: Literal["equal", "delete", "insert"], text: str) -> None:
    if not text:
        return
    if out and out[-1][0] == op:
        out[-1] = (op, out[-1][1] + text)
    else:
        out.append((op, text))


__all__ = ["CHILDREN", "TEXT", "Node", "Segment", "text_diff", "tree"]

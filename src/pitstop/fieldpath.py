"""Field paths: one syntax for naming a value inside a state, everywhere.

``messages[3].content``, ``plan.goal``, ``meta["odd key"]``, ``messages[-1]``: printed by
``pitstop diff``, accepted by ``pitstop show --field`` and ``pitstop fork --set``, and by
:func:`pitstop.edits.apply_field_edits`. Kept apart from the CLI because the library and the
web inspector parse the same paths.
"""

from __future__ import annotations

import json
import re

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TOKEN = re.compile(r"""\.?([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]|\[("(?:[^"\\]|\\.)*")\]""")

PathPart = str | int
"""A key (field, attribute or mapping key) or a list index."""


def key_path(parent: str, key: str) -> str:
    """``parent`` extended by a key: ``a.b``, or ``a["odd key"]`` when it is no identifier."""
    if _IDENT.match(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key, ensure_ascii=False)}]"


def index_path(parent: str, index: int) -> str:
    return f"{parent}[{index}]"


def parse_path(path: str) -> list[PathPart]:
    """``messages[3].content`` -> ``["messages", 3, "content"]``; ValueError if malformed."""
    parts: list[PathPart] = []
    pos = 0
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        if match is None or (pos == 0 and path.startswith(".")):
            raise ValueError(f"malformed field path {path!r} at {path[pos:]!r}")
        name, index, quoted = match.groups()
        if name is not None:
            parts.append(name)
        elif index is not None:
            parts.append(int(index))
        else:
            parts.append(json.loads(quoted))
        pos = match.end()
    if not parts:
        raise ValueError("empty field path")
    return parts


def format_path(parts: list[PathPart]) -> str:
    """The inverse of :func:`parse_path`."""
    text = ""
    for part in parts:
        text = index_path(text, part) if isinstance(part, int) else key_path(text, part)
    return text


__all__ = ["PathPart", "format_path", "index_path", "key_path", "parse_path"]

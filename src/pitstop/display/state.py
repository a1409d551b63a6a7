"""Checkpoint state as people read it: field paths, field lookup and field-level diffs.

Everything here works on the JSON view of a state (:func:`pitstop.serde.to_jsonable`), not on
the live objects: the CLI loads states with ``strict=False``, so values of classes this
process does not know arrive as placeholders, and the view shows and compares those the same
way as everything else. Paths use one syntax everywhere (``messages[3].content``,
``meta["odd key"]``), printed by ``diff`` and accepted by ``show --field``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pitstop.fieldpath import index_path, key_path, parse_path


class PathNotFound(LookupError):
    def __init__(self, path: str, available: list[str]) -> None:
        self.path = path
        self.available = available
        hint = f" (there: {', '.join(available[:12])}{', ...' if len(available) > 12 else ''})"
        super().__init__(f"no {path!r} in this state" + (hint if available else ""))


def lookup(view: Any, path: str) -> Any:
    """The value at ``path`` in a JSON view; :class:`PathNotFound` naming what is there."""
    current = view
    walked = ""
    for part in parse_path(path):
        if isinstance(part, int) and isinstance(current, list):
            if not -len(current) <= part < len(current):
                raise PathNotFound(index_path(walked, part), [f"{len(current)} items"])
            current = current[part]
            walked = index_path(walked, part)
        elif isinstance(part, str) and isinstance(current, Mapping):
            if part not in current:
                raise PathNotFound(key_path(walked, part), sorted(map(str, current)))
            current = current[part]
            walked = key_path(walked, part)
        else:
            here = walked or "the state"
            raise PathNotFound(path, [f"{here} is a {type(current).__name__}"])
    return current


@dataclass(frozen=True, slots=True)
class Change:
    op: Literal["added", "removed", "changed"]
    path: str
    old: Any = None
    new: Any = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "path": self.path}
        if self.op != "added":
            out["old"] = self.old
        if self.op != "removed":
            out["new"] = self.new
        return out


def diff(old: Any, new: Any, path: str = "") -> list[Change]:
    """Field-level differences between two JSON views, deepest paths first reported.

    Mappings are compared key by key and lists index by index (an appended message shows as
    one added ``messages[4]``); anything else, or a change of type, is one ``changed`` entry.
    """
    changes: list[Change] = []
    _diff(old, new, path, changes)
    return changes


def _diff(old: Any, new: Any, path: str, out: list[Change]) -> None:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in old:
            if key not in new:
                out.append(Change("removed", key_path(path, key), old=old[key]))
            else:
                _diff(old[key], new[key], key_path(path, key), out)
        for key in new:
            if key not in old:
                out.append(Change("added", key_path(path, key), new=new[key]))
        return
    if isinstance(old, list) and isinstance(new, list):
        for i in range(min(len(old), len(new))):
            _diff(old[i], new[i], index_path(path, i), out)
        for i in range(len(new), len(old)):
            out.append(Change("removed", index_path(path, i), old=old[i]))
        for i in range(len(old), len(new)):
            out.append(Change("added", index_path(path, i), new=new[i]))
        return
    if type(old) is not type(new) or old != new:
        out.append(Change("changed", path or "(state)", old=old, new=new))


MAX_CHARS = 400
"""Strings longer than this are shortened by ``show`` (to their first ``KEEP_CHARS``)."""
KEEP_CHARS = 300
MAX_ITEMS = 50
"""Lists and mappings with more members are shortened to their first ``KEEP_ITEMS``."""
KEEP_ITEMS = 20


def shorten(view: Any) -> tuple[Any, int]:
    """``view`` with long strings, lists and mappings cut, each with a marker saying how much
    was left out; and how many values were cut. For reading: ``--full`` and ``--field`` show
    the whole value, and ``--json`` is never shortened."""
    count = 0

    def cut(value: Any) -> Any:
        nonlocal count
        if isinstance(value, str):
            if len(value) <= MAX_CHARS:
                return value
            count += 1
            return f"{value[:KEEP_CHARS]}… [+{len(value) - KEEP_CHARS:,} chars]"
        if isinstance(value, list):
            items = [cut(v) for v in value[:KEEP_ITEMS if len(value) > MAX_ITEMS else None]]
            if len(value) > MAX_ITEMS:
                count += 1
                items.append(f"… [+{len(value) - KEEP_ITEMS:,} more items]")
            return items
        if isinstance(value, Mapping):
            keys = list(value)
            kept = keys[:KEEP_ITEMS] if len(keys) > MAX_ITEMS else keys
            out = {k: cut(value[k]) for k in kept}
            if len(keys) > MAX_ITEMS:
                count += 1
                out["…"] = f"[+{len(keys) - KEEP_ITEMS:,} more keys]"
            return out
        return value

    return cut(view), count


def compact(value: Any, width: int = 100) -> str:
    """One-line JSON for a diff line, shortened to ``width``."""
    text = json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": "))
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["Change", "PathNotFound", "compact", "diff", "index_path", "key_path", "lookup",
           "parse_path", "shorten"]

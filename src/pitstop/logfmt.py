"""Log lines as ``key=value`` pairs, so that one grep follows a run through any log.

``event=finished run=01a2... workflow=agent status=failed step=draft attempt=3
error="ValueError: no budget"``: what pitstop's worker and runtime log. The same fields are
attached to the record (``extra``) for handlers that emit JSON.
"""

from __future__ import annotations

import json
from typing import Any


def kv(**fields: Any) -> str:
    """``a=1 b="two words"``: values without spaces or quotes bare, others JSON-quoted;
    fields that are None are left out."""
    parts = []
    for key, value in fields.items():
        if value is None:
            continue
        text = value if isinstance(value, str) else str(value)
        if not text or any(c in text for c in ' "=\n\t'):
            text = json.dumps(text, ensure_ascii=False)
        parts.append(f"{key}={text}")
    return " ".join(parts)


__all__ = ["kv"]

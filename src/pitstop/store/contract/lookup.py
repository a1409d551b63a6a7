"""Finding checkpoints by the start of their id, for tools that let people type short ids.

A UUIDv7 begins with its timestamp, so an id's first characters are what people copy from a
log; ``pitstop diff 01a2336d-86 ...`` and ``pitstop fork 01a2336d-869d`` name checkpoints that
way. One range scan of the unique index on checkpoint ids answers it. A function over a store
(not a store method): only the CLI and similar tools need it.
"""

from __future__ import annotations

from typing import Any

from .base import Store


def checkpoints_with_prefix(store: Store, prefix: str, *, limit: int = 6) -> list[tuple[str, str]]:
    """``(checkpoint id, run id)`` of up to ``limit`` checkpoints whose id starts with
    ``prefix``, in id order (empty for a store that cannot search ids)."""
    run_in_transaction: Any = getattr(store, "_tx", None)  # every SQL store has one
    if not prefix or run_in_transaction is None:
        return []
    # Ids are ASCII: [prefix, prefix with its last character incremented) is the prefix range.
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    rows = run_in_transaction(lambda tx: tx.all(
        "SELECT id, run_id FROM pitstop_checkpoints WHERE id >= ? AND id < ? ORDER BY id "
        "LIMIT ?", (prefix, upper, limit)))
    return [(str(row[0]), str(row[1])) for row in rows]


__all__ = ["checkpoints_with_prefix"]

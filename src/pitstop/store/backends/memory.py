"""An in-process store that vanishes with the process: for tests, notebooks and dry runs.

It is the SQLite engine on an in-memory database, so it behaves exactly like the default
store (same contract, same checks, same queries) without a second implementation to keep in
step. It is shared by the threads of one process and invisible to any other process.
"""

from __future__ import annotations

from ...serde import Serializer
from .sqlite import SQLiteStore


class MemoryStore(SQLiteStore):
    """A :class:`~pitstop.Store` held in memory. Nothing survives :meth:`close` or exit."""

    def __init__(
        self,
        *,
        serializer: Serializer | None = None,
        compress_threshold: int | None = 4096,
        chunk_hash: str = "xxh3",
    ) -> None:
        super().__init__(
            ":memory:",
            serializer=serializer,
            compress_threshold=compress_threshold,
            chunk_hash=chunk_hash,
            url="memory://",
        )


__all__ = ["MemoryStore"]

"""SQLite: the embedded default store. One file, no server, safe for many processes.

Durability (WAL journal; one transaction per checkpoint):

* ``normal`` (default): ``synchronous=NORMAL``. A committed checkpoint survives the process
  being killed at any instant. On power loss or an OS crash, the last commits before the
  failure may be lost (never torn: the store stays consistent, it just ends earlier).
* ``full``: ``synchronous=FULL``. Every commit is fsynced before ``save`` returns, so a
  checkpoint that was saved survives power loss too. Costs one fsync per checkpoint.

Several processes may use one file: writes take SQLite's write lock with ``BEGIN IMMEDIATE``
(so a transaction never has to upgrade a read lock and fail), wait on a busy timeout, and the
whole transaction is retried with backoff if SQLite still reports the database busy.
The file must be on a local disk: SQLite's locking over network file systems is unreliable.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import StoreError
from ..process import current_pid
from ..serde import Serializer
from .base import Durability
from .blobs import BlobStore
from .sql import Backoff, Dialect, QmarkTx, SqlStore, T, Tx


class SQLiteDialect(Dialect):
    def json_equals(self, column: str, key: str, value: Any) -> tuple[str, list[Any]]:
        path = "$." + _json_key(key)
        if value is None:
            return f"json_type({column}, ?) = 'null'", [path]
        if isinstance(value, dict | list):
            import json

            return f"json_extract({column}, ?) = json(?)", [path, json.dumps(value)]
        return f"json_extract({column}, ?) = ?", [path, value]


def _json_key(key: str) -> str:
    if not key or '"' in key or "\\" in key:
        raise ValueError(f"unsupported metadata key {key!r}")
    return f'"{key}"'


SQLITE = SQLiteDialect(
    name="sqlite",
    blob="BLOB",
    real="REAL",
    bigint="INTEGER",
    without_rowid=" WITHOUT ROWID",
    is_="IS",
)

_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}


class SQLiteStore(SqlStore):
    """A store in one SQLite file (or in memory, for :class:`~pitstop.store.MemoryStore`)."""

    dialect = SQLITE

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "normal",
        serializer: Serializer | None = None,
        compress_threshold: int | None = 4096,
        busy_timeout: float = 60.0,
        auto_migrate: bool = True,
        url: str | None = None,
        blobs: BlobStore | str | None = None,
        blob_threshold: int = 1 << 20,
    ) -> None:
        if durability not in _SYNCHRONOUS:
            raise ValueError(f"durability must be 'full' or 'normal', not {durability!r}")
        self.path = os.fspath(path)
        self.durability = durability
        self.busy_timeout = busy_timeout
        super().__init__(
            url or f"sqlite:///{self.path}",
            serializer=serializer,
            compress_threshold=compress_threshold,
            blobs=blobs,
            blob_threshold=blob_threshold,
        )
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._writer: sqlite3.Cursor | None = None  # see QmarkTx
        self._pid = 0
        self._closed = False
        self._synchronous: str = durability
        self._connection()
        self._ensure_schema(auto_migrate)

    # -- connections -------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise StoreError(f"{self.url}: directory {parent!r} does not exist")
        try:
            conn = sqlite3.connect(
                self.path, timeout=5.0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: cannot open ({exc})") from exc
        if self.path != ":memory:":
            # Switching to WAL needs a moment of exclusive access; other processes opening the
            # same new file at once may hold it, so retry like any busy transaction.
            self._retrying(lambda: conn.execute("PRAGMA journal_mode=WAL"))
        conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.durability]}")
        self._synchronous = self.durability
        conn.execute("PRAGMA fullfsync=1" if self.durability == "full" else "PRAGMA fullfsync=0")
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute("PRAGMA cache_size=-16000")
        return conn

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"{self.url}: store is closed")
        pid = current_pid()
        if self._conn is None or self._pid != pid:
            # After fork() the inherited connection must not be used (or closed) by the child.
            self._conn = self._open()
            self._writer = self._conn.cursor()
            self._pid = pid
        return self._conn

    def _tx(
        self,
        fn: Callable[[Tx], T],
        *,
        write: bool = False,
        durability: Durability | None = None,
        alone: bool = False,
    ) -> T:
        """One transaction, retried while SQLite reports the database busy.

        ``alone``: ``fn`` runs a single statement, which SQLite makes atomic by itself, so
        no BEGIN and COMMIT are sent.

        The same contract as :meth:`SqlStore._tx`, written out flat: it runs on every
        checkpoint, and its layers of closures and context managers cost more than the SQL.
        """
        backoff = None
        while True:
            with self._lock:
                conn = self._conn
                if conn is None or self._pid != current_pid():
                    conn = self._connection()
                writer = self._writer or conn.cursor()
                level = durability or self.durability
                if level != self._synchronous:
                    # Per-commit durability: SQLite only lets this change outside a transaction.
                    conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[level]}")
                    self._synchronous = level
                tx = QmarkTx(conn, SQLITE, writer)
                try:
                    if alone:  # one statement: its own (implicit) transaction
                        result = fn(tx)
                    else:
                        writer.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                        result = fn(tx)
                        writer.execute("COMMIT")
                except BaseException as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if not isinstance(exc, Exception) or not self._retryable(exc):
                        raise
                    error = exc
                else:
                    if tx.after:
                        tx.committed()
                    return result
            backoff = backoff or Backoff(self.busy_timeout, self.url)
            backoff.wait(error)  # outside the lock: other threads may commit meanwhile

    def _write_alone(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._tx(lambda tx: tx.all(sql, params), write=True, alone=True)

    def _duplicate_checkpoint(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "pitstop_checkpoints." in str(exc)

    def _retryable(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        message = str(exc).lower()
        return "locked" in message or "busy" in message

    def _read_schema_version(self, tx: Tx) -> int:
        exists = tx.one(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'pitstop_schema'"
        )
        if exists is None:
            return 0
        return int(tx.one("SELECT MAX(version) FROM pitstop_schema")[0] or 0)

    def _file_bytes(self) -> int | None:
        if self.path == ":memory:":
            return None
        return sum(
            os.path.getsize(p)
            for p in (self.path, self.path + "-wal")
            if os.path.exists(p)
        )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == current_pid():
                self._conn.close()
            self._conn = self._writer = None
            self._closed = True


__all__ = ["SQLITE", "SQLiteDialect", "SQLiteStore"]

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
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ..errors import StoreError
from ..process import current_pid
from ..serde import Serializer
from . import options
from .backend import Dialect, Tx
from .base import Durability
from .blobs import BlobStore
from .sql import SqlStore


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
    null_safe_eq="IS",
)

_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}


class QmarkTx(Tx):
    """:class:`Tx` for sqlite3, which takes ``?`` placeholders as written.

    ``cur`` is the connection (each query gets a cursor of its own, so a result is never
    cut short by the next query); ``writer`` is one cursor kept for statements that return
    no rows, which saves making a cursor per statement on every checkpoint.
    """

    __slots__ = ("writer",)

    def __init__(self, cur: Any, dialect: Dialect, writer: Any) -> None:
        self.cur = cur
        self.dialect = dialect
        self.after = None
        self.writer = writer

    def run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.writer.execute(sql, params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cur.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.cur.execute(sql, params).fetchall())

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.cur.executemany(sql, rows)


class _Transaction:
    """A SQLite transaction (what the store's ``_transaction`` hook returns): holds the store's
    lock from entry to exit, BEGINs on entry, COMMITs on a normal exit, rolls back on an
    exception. ``autocommit``: the body is a single statement, which SQLite makes atomic by
    itself, so no BEGIN and COMMIT are sent.

    A class rather than a generator, and one object per store for each usual kind, made once:
    it runs on every checkpoint. Reusing it across threads is safe because everything it
    keeps (``conn``, ``tx``) is set after the lock is taken and read before it is released,
    so only the thread holding the lock ever touches it.
    """

    __slots__ = ("autocommit", "conn", "durability", "store", "tx", "write")

    def __init__(
        self, store: SQLiteStore, write: bool, durability: Durability | None, autocommit: bool
    ) -> None:
        self.store = store
        self.write = write
        self.durability = durability
        self.autocommit = autocommit

    def __enter__(self) -> QmarkTx:
        store = self.store
        store._lock.acquire()
        try:
            conn = store._conn
            if conn is None or store._pid != current_pid():
                conn = store._connection()
            writer = store._writer or conn.cursor()
            level = self.durability or store.durability
            if level != store._synchronous:
                # Per-commit durability: SQLite only lets this change outside a transaction.
                conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[level]}")
                store._synchronous = level
            if not self.autocommit:
                writer.execute("BEGIN IMMEDIATE" if self.write else "BEGIN")
        except BaseException:
            store._lock.release()
            raise
        self.conn = conn
        tx = self.tx = QmarkTx(conn, SQLITE, writer)
        return tx

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        conn = self.conn
        try:
            if exc_type is None and not self.autocommit:
                try:
                    self.tx.writer.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            elif exc_type is not None and conn.in_transaction:
                conn.execute("ROLLBACK")
        finally:
            self.store._lock.release()


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
        options.check(url or f"sqlite:///{os.fspath(path)}", {
            "durability": durability,
            "compress_threshold": compress_threshold,
            "busy_timeout": busy_timeout,
            "blobs": blobs,
            "blob_threshold": blob_threshold,
        })
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
        self._writing = _Transaction(self, True, None, False)
        self._reading = _Transaction(self, False, None, False)
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

    def _transaction(self, write: bool, durability: Durability | None = None) -> _Transaction:
        if durability is None:  # the usual case: one object per kind, made once (see _Transaction)
            return self._writing if write else self._reading
        return _Transaction(self, write, durability, False)

    def _autocommit_write(self, sql: str, params: Sequence[Any]) -> list[Any]:
        def attempt() -> list[Any]:
            with _Transaction(self, True, None, True) as tx:
                return tx.all(sql, params)

        return self._retrying(attempt)

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
        return int(tx.scalar("SELECT MAX(version) FROM pitstop_schema") or 0)

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

"""The backend boundary: what a SQL database provides so that pitstop's store runs on it.

:class:`~pitstop.store.engine.sql.SqlStore` holds every query, written once with ``?`` placeholders
and portable SQL (``INSERT ... ON CONFLICT``, ``COALESCE``, ``RETURNING``); values always
travel as parameters, never in the SQL text. A backend is a subclass of it that supplies
connections, transactions and a few decisions, through the hooks declared in one place,
:class:`SqlBackend` below. SQLite (``sqlite.py``, its WAL checkpointer beside it) and PostgreSQL
(``postgres.py``, its pool in ``pgpool.py``) are the two there are; a third (MySQL, say)
provides:

Required (``@abstractmethod``, so a backend missing one cannot be instantiated):

``dialect``
    A class attribute: a :class:`Dialect` naming its column types (``blob``, ``real``,
    ``bigint``), its placeholder style, how to lock the rows read (``FOR UPDATE``) and skip
    rows locked by others, a table option for clustered tables, null-safe equality, and how to
    compare a key of a JSON column (:meth:`Dialect.json_equals`).
``_transaction(write, durability)``
    A context manager that opens a transaction on a connection and yields a :class:`Tx` over
    a DB-API cursor; it commits on a normal exit and rolls back on an exception. ``write``
    says whether the transaction writes (take the write lock up front where that avoids
    upgrade deadlocks, as SQLite's ``BEGIN IMMEDIATE``); ``durability`` overrides the store's
    default for this one commit. Reads of several statements must see one snapshot.
``_retryable(exc)``
    Whether an exception means "busy, run the whole transaction again" (lock timeouts,
    serialisation failures, deadlocks). :meth:`SqlBackend._tx` retries those with growing
    waits for up to ``busy_timeout`` seconds.
``_read_schema_version(tx)``
    The highest version in ``pitstop_schema``, 0 when that table does not exist yet.

Optional (a working default here, right for a database with one writer at a time):

``_store_error(exc)``
    What to raise for a database error that is not retried (default: the error itself;
    PostgreSQL makes driver errors a :class:`~pitstop.StoreError` with the password removed).
``_autocommit_read(sql, params)`` / ``_autocommit_write(sql, params)``
    One statement as its own transaction (default: a transaction around it); a backend that
    can send a lone statement without ``BEGIN``/``COMMIT`` saves round trips here.
``_write_prepared(plan, state)``
    A specialised commit of a prepared save's ``WritePlan`` (default, in ``sql.py``: one
    transaction running ``write.write_checkpoint``). PostgreSQL writes the common save as one
    statement built from the same plan and hands everything else to
    ``super()._write_prepared``.
``_write_effect_rows(rows, replace)`` (declared in ``effects.py``, next to its default)
    Insert a batch of effect records atomically (default: multi-row INSERTs); PostgreSQL
    sends any number of rows as one statement of constant text, with arrays.
``_claim_write(sql, params)``
    The claim statement (default: ``_autocommit_write``); PostgreSQL keeps its plan from
    depending on the runs table's statistics.
``_duplicate_checkpoint(exc)``
    Whether ``exc`` is the unique index refusing a second checkpoint with one id.
``_lock_values(tx)`` / ``_lock_gc(tx)``
    For databases whose writers run concurrently: keep a value from being deleted by a prune
    while a save starts referencing it (PostgreSQL: a shared and an exclusive advisory lock).
``_notify(tx, run_id)`` with :meth:`Store.wait_for_work <pitstop.Store.wait_for_work>`
    Wake waiting workers when a transaction makes a run runnable (PostgreSQL: NOTIFY).
``_prepare_migration(tx)``
    Take whatever lock makes concurrent migrations safe, create the schema if needed.
``_file_bytes()``
    The store's size on disk, when that is one number.

Besides those, a backend's ``__init__`` calls ``SqlBackend.__init__`` (the URL, serializer,
compression and blob-store options) and then ``self._ensure_schema(auto_migrate)``, and its
``close()`` releases its connections. The contract tests (``tests/test_store_contract.py``)
run on every backend; a new one is added to their fixture and must pass them all.
"""

from __future__ import annotations

import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

from ...cache import BoundedCache
from ...errors import StoreError, StoreSchemaError, UnsupportedStoreError
from ...serde import Serializer
from ..contract.base import Durability, Store
from ..encoding.blobs import BlobStore, open_blob_store
from ..encoding.records import Parent, check_chunk_hash
from . import schema

if TYPE_CHECKING:
    from ..encoding.sealed import Encryption
    from ..encoding.valuecodec import ValueCodec

T = TypeVar("T")

CHUNK = 500
"""Parameters per ``IN (...)`` list: well under every backend's limit."""


@dataclass(frozen=True)
class Dialect(ABC):
    """What differs between SQL databases, kept small and in one place."""

    name: str
    blob: str
    real: str
    bigint: str
    placeholder: str = "?"
    """The driver's parameter marker; queries are written with ``?`` and converted."""
    lock_row: str = ""
    """Appended to a SELECT to lock the rows read until commit (PostgreSQL: FOR UPDATE)."""
    skip_locked: str = ""
    """Appended to the claim query so concurrent workers skip each other's rows."""
    bounded_lock_wait: str = ""
    """A statement capping how long the rest of the transaction waits for a row lock
    (PostgreSQL: ``SET LOCAL lock_timeout``). Taking a lease uses it: a run row locked for
    longer is busy, typically by an owner cut off from the network in the middle of a
    transaction, and waiting for ``statement_timeout`` would stall the caller for nothing.
    Empty where the database locks whole files instead (SQLite: ``busy_timeout`` rules)."""
    without_rowid: str = ""
    """Table option for tables clustered on their primary key (SQLite: WITHOUT ROWID)."""
    null_safe_eq: str = "IS NOT DISTINCT FROM"
    """Null-safe equality (SQLite spells it IS, which older SQLite versions require)."""
    table_sample: str = ""
    """A clause after a table name reading about ``?`` percent of its pages, picked at random
    (PostgreSQL: TABLESAMPLE SYSTEM); empty where the database has none."""
    index_ranges: str = ""
    """A statement making the rest of the transaction read index ranges in order, so a
    ``LIMIT`` stops the scan early whatever the planner's statistics (PostgreSQL: bitmap
    scans off; unanalyzed, it reads a status's whole range into a bitmap first)."""
    table_size: str = ""
    """SQL selecting, for a table named by a ``?`` parameter, the rows and pages its last
    VACUUM or ANALYZE counted (rows < 0: never) and the pages it occupies now: with
    ``table_sample``, what ``stats(exact=False)`` estimates large counts from."""
    array_in: bool = False
    """``x IN ({in})`` over many values may be sent as ``x = ANY(?)`` with one array
    parameter: one statement of constant text (prepared once by the driver) instead of one
    per :data:`CHUNK` values, each a new text of hundreds of placeholders to parse."""

    def for_driver(self, sql: str) -> str:
        """``sql`` with its ``?`` placeholders in this driver's style."""
        return sql if self.placeholder == "?" else _convert_placeholders(sql, self.placeholder)

    def ddl(self, statement: str) -> str:
        """A migration statement with this dialect's column types and table options; ""
        for a statement marked for another dialect only (``/* postgresql only */ ...``)."""
        only = _ONLY.match(statement)
        if only is not None:
            if only.group(1) != self.name:
                return ""
            statement = statement[only.end() :]
        return statement.format(
            blob=self.blob,
            real=self.real,
            bigint=self.bigint,
            without_rowid=self.without_rowid,
        )

    @abstractmethod
    def json_equals(self, column: str, key: str, value: Any) -> tuple[str, list[Any]]:
        """SQL (and params) true when ``column``'s JSON has ``key`` equal to ``value``."""


_ONLY = re.compile(r"/\* (\w+) only \*/ ")


@lru_cache(maxsize=512)
def _convert_placeholders(sql: str, placeholder: str) -> str:
    return sql.replace("?", placeholder)


@lru_cache(maxsize=256)
def _as_any(sql: str) -> str:
    if sql.count("IN ({in})") != 1:
        raise ValueError(f"expected one 'IN ({{in}})' in {sql!r}")
    # %b: the array goes in binary (psycopg); as text each bytea would be escaped in Python.
    return sql.replace("IN ({in})", "= ANY(%b)")


def placeholders(n: int) -> str:
    """``?, ?, ?`` for ``n`` parameters."""
    return ", ".join("?" * n)


class Tx:
    """One open transaction: thin helpers over a DB-API cursor, placeholders translated."""

    __slots__ = ("after", "cur", "dialect")

    def __init__(self, cur: Any, dialect: Dialect) -> None:
        self.cur = cur
        self.dialect = dialect
        self.after: list[Callable[[], None]] | None = None

    def on_commit(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the transaction has committed (never if it rolls back)."""
        if self.after is None:
            self.after = []
        self.after.append(fn)

    def run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Execute a statement; the cursor (for ``rowcount``)."""
        return self.cur.execute(self.dialect.for_driver(sql), params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row of a query, or None."""
        return self.cur.execute(self.dialect.for_driver(sql), params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of a query."""
        return list(self.cur.execute(self.dialect.for_driver(sql), params).fetchall())

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Execute a statement once per parameter row (nothing for no rows)."""
        if rows:
            self.cur.executemany(self.dialect.for_driver(sql), rows)

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The one value a query selects (its first row's only column), or None: no row."""
        row = self.one(sql, params)
        if row is None:
            return None
        (value,) = row
        return value

    def column(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The values of a query that selects one column."""
        return [value for (value,) in self.all(sql, params)]

    def in_chunks(self, sql: str, values: Sequence[Any], *prefix: Any) -> list[Any]:
        """Run ``sql`` (containing ``IN ({in})``) over ``values`` in chunks (or, where the
        dialect takes arrays, in one statement); gather the rows."""
        if self.dialect.array_in and len(values) > 1:
            # Rows in binary too: a bytea column comes as its bytes, not hex to decode.
            query = self.dialect.for_driver(_as_any(sql))
            return list(self.cur.execute(query, [*prefix, list(values)], binary=True).fetchall())
        out: list[Any] = []
        for i in range(0, len(values), CHUNK):
            part = list(values[i : i + CHUNK])
            out.extend(self.all(sql.format(**{"in": placeholders(len(part))}), [*prefix, *part]))
        return out

    def run_chunks(self, sql: str, values: Sequence[Any], *prefix: Any) -> None:
        """Execute ``sql`` (containing ``IN ({in})``) over ``values`` in chunks (or in one
        statement, as :meth:`in_chunks`)."""
        if self.dialect.array_in and len(values) > 1:
            self.run(_as_any(sql), [*prefix, list(values)])
            return
        for i in range(0, len(values), CHUNK):
            part = list(values[i : i + CHUNK])
            self.run(sql.format(**{"in": placeholders(len(part))}), [*prefix, *part])


class Backoff:
    """Growing waits between attempts of a busy transaction, for up to ``timeout`` seconds."""

    __slots__ = ("deadline", "delay", "timeout", "url")

    def __init__(self, timeout: float, url: str) -> None:
        self.timeout = timeout
        self.url = url
        self.delay = 0.002
        self.deadline = time.monotonic() + timeout

    def wait(self, error: Exception) -> None:
        if time.monotonic() > self.deadline:
            raise StoreError(
                f"{self.url}: store stayed busy for {self.timeout:.0f}s ({error})"
            ) from error
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.1)


class SqlBackend(Store):
    """What every part of :class:`~pitstop.store.engine.sql.SqlStore` stands on: the store's shared
    state, transactions with retries, the schema check, and the hooks a backend provides
    (see the module docstring for the list)."""

    dialect: Dialect
    busy_timeout: float = 60.0
    durability: Durability = "normal"
    """The store's default durability (a backend sets it from its options)."""

    rewrites_in_place: bool = True
    """Whether an UPDATE that shrinks a row gives its space back at once (SQLite: freed pages
    are reused by the next write). If so a growing list's superseded last chunk becomes an
    alias of the chunk that extends it; if not (PostgreSQL keeps the old row version until a
    vacuum), a grown list's last chunk is sealed and a save only inserts rows."""
    prunes_in_save: bool = False
    """Whether a save's retention prune may run in the save's own transaction (see
    :meth:`SqlStore._save_and_prune`): where writers are one at a time (SQLite), nothing can
    wait on the garbage-collection lock a save already holds shared; where they run
    concurrently (PostgreSQL), taking it exclusively after that could deadlock two saves."""

    def __init__(
        self,
        url: str,
        *,
        serializer: Serializer | None = None,
        compress_threshold: int | None = 4096,
        blobs: BlobStore | str | bool | None = None,
        blob_threshold: int = 1 << 20,
        chunk_hash: str = "xxh3",
        encryption: Encryption | str | None = None,
    ) -> None:
        self.url = url
        # The codec is built on first use (checked here, so a bad option fails at open):
        # listing runs or counting them never decodes a value, and importing the codec and
        # its type tables would be most of what such a command costs.
        self._codec_options = (serializer, compress_threshold, check_chunk_hash(chunk_hash))
        self._codec: ValueCodec | None = None
        self._codec_lock = threading.Lock()
        # (SQLite resolves its default, a directory beside the file, before this.)
        self.blobs = open_blob_store(blobs) if isinstance(blobs, BlobStore | str) else None
        """Where values of at least ``blob_threshold`` stored bytes go (None: the table)."""
        if encryption is not None:
            self.blobs = _sealed(url, self.blobs, encryption)
        self.blob_threshold = blob_threshold
        # checkpoint id -> Parent (immutable, always safe to cache)
        self._fields: BoundedCache[Parent] = BoundedCache(2048)
        # run id -> head id this process last wrote (a guess)
        self._heads: BoundedCache[str] = BoundedCache(4096)
        # checkpoint id -> its small fields' serialised bytes (ValueCodec.encode_state), for
        # the last checkpoints this process wrote: bounded by entries x fields x RAW_KEEP_MAX.
        self._raws: BoundedCache[dict[str, bytes]] = BoundedCache(256)
        # checkpoint id -> the full values of its fields that a save gave as Append/Merge,
        # for the last checkpoints this process wrote: the next delta on such a field
        # applies to this value instead of loading the parent checkpoint first (#27).
        self._delta_values: BoundedCache[dict[str, Any]] = BoundedCache(64)
        self._aio: Any = None

    @property
    def _value_codec(self) -> ValueCodec:
        codec = self._codec
        if codec is None:
            with self._codec_lock:
                if self._codec is None:
                    from ..encoding.valuecodec import (
                        ValueCodec,  # the chunker, zstd: see its docstring
                    )

                    made = ValueCodec(*self._codec_options)
                    made.seal_chunks = not self.rewrites_in_place
                    # A sealed blob store's ring seals what the database keeps too.
                    encryption = getattr(self.blobs, "encryption", None)
                    if encryption is not None:
                        made.seal(encryption, self.blob_threshold)
                    self._codec = made
                codec = self._codec
        return codec

    @property
    def serializer(self) -> Serializer:
        """What new values are serialised with (``serializer=`` at open; msgpack if none)."""
        return self._value_codec.serializer

    @serializer.setter
    def serializer(self, value: Serializer) -> None:
        raise AttributeError("a store's serializer is chosen when it is opened: pass "
                             "serializer= to open_store")

    # -- backend hooks: required -----------------------------------------------------------

    @abstractmethod
    def _transaction(
        self, write: bool, durability: Durability | None = None
    ) -> AbstractContextManager[Tx]:
        """Backend hook, required: a context manager whose ``__enter__`` opens a transaction
        and returns a :class:`Tx` in it, and whose ``__exit__`` commits it on a normal exit and
        rolls it back on an exception (which it never suppresses; it may raise another one,
        say a retryable "connection lost"). ``durability`` (writes only) overrides the store's
        default for this one commit. A backend that serialises its transactions may hand out one
        reusable object (SQLite does)."""

    @abstractmethod
    def _retryable(self, exc: BaseException) -> bool:
        """Backend hook, required: whether ``exc`` means "busy, try the whole transaction
        again"."""

    @abstractmethod
    def _read_schema_version(self, tx: Tx) -> int:
        """Backend hook, required: the store's schema version (0: no pitstop tables yet)."""

    # -- backend hooks: optional -----------------------------------------------------------

    def _store_error(self, exc: Exception) -> Exception:
        """Backend hook, optional: the error to raise for ``exc``, a database error that is
        not retried. Default: ``exc`` itself."""
        return exc

    def _autocommit_read(self, sql: str, params: Sequence[Any]) -> Any:
        """Backend hook, optional: the first row of one query that needs no transaction
        around it. Default: a read transaction of that one statement."""
        return self._tx(lambda tx: tx.one(sql, params))

    def _autocommit_write(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Backend hook, optional: one writing statement as its own transaction; the rows it
        returns. Default: a write transaction of that one statement."""
        return self._tx(lambda tx: tx.all(sql, params), write=True)

    def _claim_write(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Backend hook, optional: run the claim statement (its rows). Default: as
        :meth:`_autocommit_write`. PostgreSQL pins its plan to the index-ordered scan."""
        return self._autocommit_write(sql, params)

    def _duplicate_checkpoint(self, exc: Exception) -> bool:
        """Backend hook, optional: whether ``exc`` is the database refusing a second
        checkpoint with one id (the unique index decides, so a save need not look first).
        Default: never."""
        return False

    def _lock_values(self, tx: Tx) -> None:
        """Backend hook, optional: called before a write adds references to existing values
        (see :meth:`_lock_gc`). Default: nothing (one writer at a time)."""

    def _lock_gc(self, tx: Tx) -> None:
        """Backend hook, optional: called before values are deleted. Backends whose writers
        run concurrently make this exclude :meth:`_lock_values`, so a value is never deleted
        while a concurrent write starts referencing it. Default: nothing."""

    def _notify(self, tx: Tx, run_id: str) -> None:
        """Backend hook, optional: called in a transaction that makes ``run_id`` runnable;
        stores that can wake waiting workers send a signal at commit (see
        :meth:`Store.wait_for_work`). Default: nothing (workers poll)."""

    def _prepare_migration(self, tx: Tx) -> None:
        """Backend hook, optional: take whatever lock makes concurrent migrations safe.
        Default: nothing (the write transaction is lock enough)."""

    def _file_bytes(self) -> int | None:
        """Backend hook, optional: the store's size on disk, if that is one number.
        Default: None."""
        return None

    def _integrity_problems(self, notes: list[str]) -> list[str]:
        """Backend hook, optional: damage the database engine itself finds in its files
        (indexes that disagree with their tables, broken pages), one line each, for
        ``verify``: a damaged index can hide rows from every query pitstop makes. What it
        could not check goes to ``notes``. Default: none found."""
        return []

    # -- transactions ----------------------------------------------------------------------

    def _tx(
        self,
        fn: Callable[[Tx], T],
        *,
        write: bool = False,
        durability: Durability | None = None,
    ) -> T:
        """Run ``fn`` in one transaction, retrying the whole of it while the store is busy.

        Written flat, and calling the transaction's ``__enter__``/``__exit__`` itself: it
        runs on every checkpoint, and a ``with`` statement calls them through C, which costs
        a fresh interpreter frame each (about 1.5k instructions per transaction; a SQLite
        save is ~240k). The semantics are the ``with`` statement's, for a context manager
        that never suppresses an exception (the hook's contract).
        """
        backoff = None
        while True:
            transaction = self._transaction(write, durability)
            try:
                tx = transaction.__enter__()
                try:
                    result = fn(tx)
                except BaseException as exc:
                    transaction.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                # Taken before the exit: once the transaction has ended, the backend may
                # hand the same Tx to the next one (SQLite does).
                after = tx.after
                transaction.__exit__(None, None, None)
            except Exception as exc:
                backoff = self._wait_before_retry(exc, backoff)
            else:
                if after is not None:
                    for callback in after:
                        callback()
                return result

    def _retrying(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` until it stops failing with a busy error, for up to ``busy_timeout``."""
        backoff = None
        while True:
            try:
                return fn()
            except Exception as exc:
                backoff = self._wait_before_retry(exc, backoff)

    def _lock_wait_expired(self, exc: BaseException) -> bool:
        """Backend hook: ``exc`` says a row lock was not granted within
        :attr:`Dialect.bounded_lock_wait`. Default: never (no such bound)."""
        return False

    def _wait_before_retry(self, exc: Exception, backoff: Backoff | None) -> Backoff:
        """Sleep before the next attempt after ``exc``; or raise, when ``exc`` is not worth
        retrying (as :meth:`_store_error` makes it) or the store stayed busy too long."""
        if not self._retryable(exc):
            error = self._store_error(exc)
            if error is exc:
                raise exc
            raise error from exc
        backoff = backoff or Backoff(self.busy_timeout, self.url)
        backoff.wait(exc)
        return backoff

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one read query, in its own transaction."""
        return self._tx(lambda tx: tx.all(sql, params))

    # -- schema ----------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The version of pitstop's own tables in this store (0: none yet)."""
        return self._tx(self._read_schema_version)

    def migrate(self, *, target: int | None = None) -> int:
        """Apply the migrations after the store's version up to ``target`` (default: the
        latest), in one write transaction under :meth:`_prepare_migration`; return the
        version reached."""
        latest = schema.LATEST_SCHEMA
        target = latest if target is None else target

        def apply(tx: Tx) -> int:
            self._prepare_migration(tx)
            tx.run(self.dialect.ddl(schema.SCHEMA_TABLE))
            current = tx.scalar("SELECT MAX(version) FROM pitstop_schema") or 0
            if current > latest:
                raise self._schema_too_new(current)
            for version, description, statements in schema.MIGRATIONS:
                if current < version <= target:
                    for statement in statements:
                        if sql := self.dialect.ddl(statement):
                            tx.run(sql)
                    tx.run(
                        "INSERT INTO pitstop_schema (version, description, applied_at) "
                        "VALUES (?, ?, ?)",
                        (version, description, time.time()),
                    )
                    current = version
            return int(current)

        return self._tx(apply, write=True)

    def _ensure_schema(self, auto_migrate: bool) -> None:
        """On open: refuse a store this pitstop cannot use, migrate one it may."""
        version, latest = self.schema_version(), schema.LATEST_SCHEMA
        if version > latest:
            raise self._schema_too_new(version)
        if version < latest:
            if not auto_migrate:
                raise StoreSchemaError(
                    f"{self.url}: store schema version {version}, this pitstop needs "
                    f"{latest}; run `pitstop migrate --store URL`",
                    found=version, needed=latest,
                )
            self.migrate()

    def _schema_too_new(self, version: int) -> StoreSchemaError:
        latest = schema.LATEST_SCHEMA
        return StoreSchemaError(
            f"{self.url}: store schema version {version} is newer than this pitstop "
            f"understands ({latest}); upgrade pitstop",
            found=version, needed=latest,
        )


__all__ = ["CHUNK", "Backoff", "Dialect", "SqlBackend", "Tx", "placeholders"]


def _sealed(url: str, blobs: BlobStore | None, encryption: Encryption | str) -> BlobStore:
    """``blobs`` with every value sealed (see :mod:`pitstop.store.encoding.sealed`)."""
    from ..encoding.sealed import Encryption, SealedBlobStore

    if blobs is None:
        raise UnsupportedStoreError(
            f"{url}: encryption seals the blob store's values, and this store has none "
            "(blobs=off); give it one (blobs=DIRECTORY or s3://bucket/prefix)"
        )
    if isinstance(blobs, SealedBlobStore):
        return blobs
    ring = (
        Encryption.from_env(encryption[len("env:"):]) if isinstance(encryption, str)
        else encryption
    )
    return SealedBlobStore(blobs, ring)

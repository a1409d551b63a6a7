"""The store logic shared by every SQL backend (SQLite, in-memory SQLite, PostgreSQL).

All queries are written once here, with ``?`` placeholders and portable SQL (``INSERT ... ON
CONFLICT``, ``COALESCE``). A :class:`Dialect` holds the few real differences (column types,
placeholder style, row locks, JSON access) and each backend supplies connections and decides
which errors are worth retrying. Values always travel as parameters, never in the SQL text.
"""

from __future__ import annotations

import json
import logging
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, partial
from typing import Any, Literal, NamedTuple, TypeVar

from ..cache import BoundedCache
from ..errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptCheckpointError,
    InputError,
    LeaseLostError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    StoreError,
    StoreSchemaError,
)
from ..ids import new_id
from ..model import Checkpoint, CheckpointSummary, Run, RunStatus, utc
from ..serde import Serializer
from .base import (
    UNSET,
    Durability,
    Input,
    Lease,
    PreparedSave,
    Problem,
    Progress,
    PruneReport,
    RetentionPolicy,
    Store,
    StoreStats,
    _Unset,
)
from .blobs import BlobStore, open_blob_store
from .records import (
    CheckpointRecord,
    Codec,
    FieldMap,
    NewBlob,
    decode_field_map,
    encode_field_map,
    encode_metadata,
    stored_hashes,
)
from .transfer import EffectRecord, InputRecord, RunExport, RunRecord

log = logging.getLogger("pitstop.store")

T = TypeVar("T")

# Values bigger than this are looked up before being sent, so an existing one is not shipped
# to the database again just to be discarded by ON CONFLICT.
_PROBE_BEFORE_SEND = 64 * 1024
_CHUNK = 500  # parameters per IN (...) list: well under every backend's limit
_ORPHAN_AGE = 3600.0  # seconds before an unreferenced blob-store file is surely abandoned

# --------------------------------------------------------------------------------------------
# Schema: forward-only migrations. A store records every version applied in pitstop_schema.
# {blob}, {real} and {bigint} are filled in by the dialect. Never edit a released migration.
# --------------------------------------------------------------------------------------------

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "runs, checkpoints, content-addressed values, inputs, effect records",
        [
            """CREATE TABLE pitstop_runs (
                run_id TEXT PRIMARY KEY,
                workflow TEXT,
                status TEXT NOT NULL,
                created_at {real} NOT NULL,
                updated_at {real} NOT NULL,
                metadata TEXT NOT NULL DEFAULT '{{}}',
                head_id TEXT,
                step INTEGER,
                waiting_for TEXT,
                wake_at {real},
                checkpoints INTEGER NOT NULL DEFAULT 0,
                bytes {bigint} NOT NULL DEFAULT 0,
                lease_owner TEXT,
                lease_expires {real},
                fence {bigint} NOT NULL DEFAULT 0,
                priority INTEGER NOT NULL DEFAULT 0
            )""",
            "CREATE INDEX pitstop_runs_created ON pitstop_runs (created_at)",
            # None of these indexes covers a column every checkpoint assigns (head_id, step,
            # updated_at, counters): a step's save then writes no index page of this table.
            "CREATE INDEX pitstop_runs_status ON pitstop_runs (status, created_at)",
            # What workers claim: queued runs and runs whose owner may have died, by
            # priority then age; waiting runs by the time they become due.
            "CREATE INDEX pitstop_runs_runnable ON pitstop_runs (priority DESC, created_at) "
            "WHERE status IN ('queued', 'running')",
            "CREATE INDEX pitstop_runs_waking ON pitstop_runs (wake_at) "
            "WHERE status = 'waiting'",
            """CREATE TABLE pitstop_checkpoints (
                id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                parent_id TEXT,
                step INTEGER NOT NULL,
                created_at {real} NOT NULL,
                schema_version INTEGER NOT NULL,
                metadata TEXT NOT NULL,
                fields {blob} NOT NULL,
                size {bigint} NOT NULL,
                added {bigint} NOT NULL,
                checksum TEXT NOT NULL,
                PRIMARY KEY (run_id, id)
            ){without_rowid}""",
            # Clustered by run, so a run's history is one range scan; ids are unique too.
            "CREATE UNIQUE INDEX pitstop_checkpoints_id ON pitstop_checkpoints (id)",
            """CREATE TABLE pitstop_blobs (
                hash {blob} PRIMARY KEY,
                data {blob} NOT NULL,
                size {bigint} NOT NULL,
                created_at {real} NOT NULL
            )""",
            """CREATE TABLE pitstop_blob_refs (
                run_id TEXT NOT NULL,
                hash {blob} NOT NULL,
                PRIMARY KEY (run_id, hash)
            ){without_rowid}""",
            "CREATE INDEX pitstop_blob_refs_hash ON pitstop_blob_refs (hash)",
            """CREATE TABLE pitstop_inputs (
                id TEXT PRIMARY KEY,
                run_id TEXT NOT NULL,
                name TEXT NOT NULL,
                payload {blob} NOT NULL,
                hash {blob} NOT NULL,
                created_at {real} NOT NULL,
                consumed_by TEXT
            )""",
            "CREATE INDEX pitstop_inputs_run ON pitstop_inputs (run_id, name)",
            """CREATE TABLE pitstop_effects (
                run_id TEXT NOT NULL,
                key TEXT NOT NULL,
                checkpoint_id TEXT,
                result {blob} NOT NULL,
                hash {blob} NOT NULL,
                created_at {real} NOT NULL,
                PRIMARY KEY (run_id, key)
            )""",
            "CREATE INDEX pitstop_effects_checkpoint ON pitstop_effects (run_id, checkpoint_id)",
        ],
    ),
    (
        2,
        "large values in a blob store: where a value lives when it is not in the table",
        ["ALTER TABLE pitstop_blobs ADD COLUMN location TEXT"],
    ),
]

LATEST_SCHEMA = MIGRATIONS[-1][0]

_CKPT = (
    "id, run_id, parent_id, step, created_at, schema_version, metadata, fields, size, added, "
    "checksum"
)
# A constant, not an f-string at the call: SQLite's statement cache then finds it by identity.
_INSERT_CHECKPOINT = (
    f"INSERT INTO pitstop_checkpoints ({_CKPT}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SUMMARY = (
    "id, run_id, parent_id, step, created_at, schema_version, checksum, size, metadata, "
    "added + LENGTH(fields) + LENGTH(metadata)"  # CheckpointRecord.footprint
)
_RUN = (
    "run_id, status, workflow, created_at, updated_at, metadata, head_id, step, waiting_for, "
    "wake_at, checkpoints, bytes, lease_owner, lease_expires, priority"
)
_RUN_COLUMNS = _RUN.count(",") + 1
# A run and its head checkpoint in one query (one round trip when a worker picks a run up).
_RUN_AND_HEAD = (
    "SELECT " + ", ".join(f"r.{c.strip()}" for c in _RUN.split(","))
    + ", " + ", ".join(f"c.{c.strip()}" for c in _CKPT.split(","))
    + " FROM pitstop_runs r LEFT JOIN pitstop_checkpoints c ON c.id = r.head_id"
    " WHERE r.run_id = ?"
)
_FINISHED = tuple(s.value for s in RunStatus if s.finished)


@dataclass(frozen=True)
class Dialect:
    """What differs between SQL databases, kept small and in one place."""

    name: str
    blob: str
    real: str
    bigint: str
    placeholder: str = "?"
    lock_row: str = ""
    """Appended to a SELECT to lock the rows read until commit (PostgreSQL: FOR UPDATE)."""
    skip_locked: str = ""
    """Appended to the claim query so concurrent workers skip each other's rows."""
    without_rowid: str = ""
    """Table option for tables clustered on their primary key (SQLite: WITHOUT ROWID)."""
    is_: str = "IS NOT DISTINCT FROM"
    """Null-safe equality (SQLite spells it IS, which older SQLite versions require)."""

    def q(self, sql: str) -> str:
        return sql if self.placeholder == "?" else _convert_placeholders(sql, self.placeholder)

    def ddl(self, statement: str) -> str:
        return statement.format(
            blob=self.blob,
            real=self.real,
            bigint=self.bigint,
            without_rowid=self.without_rowid,
        )

    def json_equals(self, column: str, key: str, value: Any) -> tuple[str, list[Any]]:
        """SQL (and params) true when ``column``'s JSON has ``key`` equal to ``value``."""
        raise NotImplementedError


@lru_cache(maxsize=512)
def _convert_placeholders(sql: str, placeholder: str) -> str:
    return sql.replace("?", placeholder)


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

    def committed(self) -> None:
        for fn in self.after or ():
            fn()

    def run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cur.execute(self.dialect.q(sql), params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cur.execute(self.dialect.q(sql), params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.cur.execute(self.dialect.q(sql), params).fetchall())

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.cur.executemany(self.dialect.q(sql), rows)

    def in_chunks(self, sql: str, values: Sequence[Any], *prefix: Any) -> list[Any]:
        """Run ``sql`` (containing ``({in})``) over ``values`` in chunks; gather the rows."""
        out: list[Any] = []
        for i in range(0, len(values), _CHUNK):
            part = list(values[i : i + _CHUNK])
            out.extend(self.all(sql.format(**{"in": _marks(len(part))}), [*prefix, *part]))
        return out

    def run_chunks(self, sql: str, values: Sequence[Any], *prefix: Any) -> None:
        for i in range(0, len(values), _CHUNK):
            part = list(values[i : i + _CHUNK])
            self.run(sql.format(**{"in": _marks(len(part))}), [*prefix, *part])


class QmarkTx(Tx):
    """:class:`Tx` for drivers that take ``?`` placeholders as written (SQLite).

    ``cur`` is the connection (each query gets a cursor of its own, so a result is never
    cut short by the next query); ``writer`` is one cursor kept for statements that return
    no rows, which saves making a cursor per statement on every checkpoint.
    """

    __slots__ = ("writer",)

    def __init__(self, cur: Any, dialect: Dialect, writer: Any = None) -> None:
        self.cur = cur
        self.dialect = dialect
        self.after = None
        self.writer = writer if writer is not None else cur

    def run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.writer.execute(sql, params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cur.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.cur.execute(sql, params).fetchall())

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.cur.executemany(sql, rows)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


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


class _HeadMoved(Exception):
    def __init__(self, actual: str | None) -> None:
        self.actual = actual


class _Parent(NamedTuple):
    id: str
    run_id: str
    step: int
    fields: FieldMap


@dataclass(slots=True)
class _WritePlan:
    """Everything a prepared save needs at write time (the backend payload of PreparedSave).

    Built on every checkpoint, so what most saves leave unset has a default and is assigned
    only when given."""

    record: CheckpointRecord
    fields: FieldMap
    new: dict[bytes, NewBlob]
    refs: list[bytes]
    follow_head: bool
    expected_head: str | _Unset | None
    lease: Lease | None
    release: bool
    workflow: str | None
    status: RunStatus | None
    waiting_json: str | None = None
    wake_at: float | None = None
    consumed: Sequence[str] = ()
    durability: Durability | None = None
    sets_waiting: bool = False
    """Whether the save sets the run's waiting_for/wake_at (it sets a status, or its
    metadata names them)."""


def move_head(plan: _WritePlan, is_: str) -> tuple[str, list[Any]]:
    """The conditional UPDATE that moves a run's head on a save, and its parameters.

    It assigns only what the save changes. SQLite rewrites every index on a column named in
    SET, even to the same value, so naming ``status`` or ``wake_at`` on every step would add
    an index page to every commit.
    """
    record = plan.record
    status, workflow, lease = plan.status, plan.workflow, plan.lease
    params: list[Any] = [
        record.id,
        record.step,
        record.created_at,
        record.added + len(record.metadata) + len(record.fields),
    ]
    if status is not None:
        params.append(status.value)
    if workflow is not None:
        params.append(workflow)
    if plan.sets_waiting:
        params += (plan.waiting_json, plan.wake_at)
    params.append(record.run_id)
    expected = record.parent_id if plan.follow_head else plan.expected_head
    checks_head = expected is not UNSET
    if checks_head:
        params.append(expected)
    if lease is not None:
        params += (lease.owner, lease.token)
    else:
        params.append(record.created_at)
    sql = _move_head_sql(
        is_, status is not None, workflow is not None, plan.sets_waiting, plan.release,
        checks_head, lease is not None,
    )
    return sql, params


@lru_cache(maxsize=256)
def _move_head_sql(
    is_: str,
    sets_status: bool,
    sets_workflow: bool,
    sets_waiting: bool,
    releases: bool,
    checks_head: bool,
    leased: bool,
) -> str:
    sets = ["head_id = ?", "step = ?", "updated_at = ?", "checkpoints = checkpoints + 1",
            "bytes = bytes + ?"]
    if sets_status:
        sets.append("status = ?")
    if sets_workflow:
        sets.append("workflow = ?")
    if sets_waiting:
        sets += ["waiting_for = ?", "wake_at = ?"]
    if releases:
        sets.append("lease_owner = NULL, lease_expires = NULL")
    where = ["run_id = ?"]
    if checks_head:
        where.append(f"head_id {is_} ?")
    if leased:
        where.append("lease_owner = ? AND fence = ?")
    else:
        where.append("(lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= ?)")
    return f"UPDATE pitstop_runs SET {', '.join(sets)} WHERE " + " AND ".join(where)


def _ts(value: datetime | float | None) -> float | None:
    if value is None or isinstance(value, float | int):
        return value
    return value.timestamp()


def _row_to_run(row: Sequence[Any]) -> Run:
    return Run(
        id=row[0],
        status=RunStatus(row[1]),
        workflow=row[2],
        created_at=utc(row[3]),  # type: ignore[arg-type]
        updated_at=utc(row[4]),  # type: ignore[arg-type]
        metadata=json.loads(row[5]) if row[5] else {},
        head_id=row[6],
        step=row[7],
        waiting_for=tuple(json.loads(row[8])) if row[8] else (),
        wake_at=utc(row[9]),
        checkpoints=row[10],
        bytes=row[11],
        owner=row[12],
        lease_expires_at=utc(row[13]),
        priority=row[14],
    )


def _self_contained(record: CheckpointRecord) -> bool:
    """Whether every value of the checkpoint is inline in its record."""
    try:
        return not stored_hashes(record.field_map())
    except CorruptCheckpointError:
        return False  # read the usual way, which reports it


def _row_to_record(row: Sequence[Any]) -> CheckpointRecord:
    return CheckpointRecord(
        id=row[0],
        run_id=row[1],
        parent_id=row[2],
        step=row[3],
        created_at=row[4],
        schema_version=row[5],
        metadata=row[6],
        fields=bytes(row[7]),
        size=row[8],
        added=row[9],
        checksum=row[10],
    )


def _row_to_summary(row: Sequence[Any]) -> CheckpointSummary:
    return CheckpointSummary._from_row(*row)


def _statuses(status: RunStatus | str | Iterable[RunStatus | str] | None) -> list[str]:
    if status is None:
        return []
    if isinstance(status, str):
        return [RunStatus(status).value]
    return [RunStatus(s).value for s in status]


def _check_id(kind: str, value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > 512:
        raise ValueError(f"{kind} must be a non-empty string of at most 512 characters")


class SqlStore(Store):
    """A :class:`Store` over a SQL database; backends supply connections and a dialect."""

    dialect: Dialect
    busy_timeout: float = 60.0

    def __init__(
        self,
        url: str,
        *,
        serializer: Serializer | None = None,
        compress_threshold: int | None = 4096,
        blobs: BlobStore | str | None = None,
        blob_threshold: int = 1 << 20,
    ) -> None:
        self.url = url
        self._codec = Codec(serializer, compress_threshold)
        self.serializer = self._codec.serializer
        self.blobs = open_blob_store(blobs) if blobs is not None else None
        """Where values of at least ``blob_threshold`` stored bytes go (None: the table)."""
        self.blob_threshold = blob_threshold
        # checkpoint id -> _Parent (immutable, always safe to cache)
        self._fields: BoundedCache[_Parent] = BoundedCache(2048)
        # run id -> head id this process last wrote (a guess)
        self._heads: BoundedCache[str] = BoundedCache(4096)
        # checkpoint id -> its small fields' serialised bytes (Codec.encode_state), for the
        # last checkpoints this process wrote: bounded by entries x fields x RAW_KEEP_MAX.
        self._raws: BoundedCache[dict[str, bytes]] = BoundedCache(256)
        self._aio: Any = None

    # -- what a backend supplies -----------------------------------------------------------

    def _transaction(
        self, write: bool, durability: Durability | None = None
    ) -> AbstractContextManager[Any]:
        """A cursor inside a transaction: committed on normal exit, rolled back on error.

        ``durability`` (writes only) overrides the store's default for this one commit.
        Used by :meth:`_tx`; a backend that overrides ``_tx`` itself need not supply it.
        """
        raise NotImplementedError

    @abstractmethod
    def _retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` means "busy, try the whole transaction again"."""

    def _lock_values(self, tx: Tx) -> None:
        """Called before a write adds references to existing values (see :meth:`_lock_gc`)."""

    def _lock_gc(self, tx: Tx) -> None:
        """Called before values are deleted. Backends whose writers run concurrently make
        this exclude :meth:`_lock_values`, so a value is never deleted while a concurrent
        write starts referencing it."""

    def _file_bytes(self) -> int | None:
        return None

    def _duplicate_checkpoint(self, exc: Exception) -> bool:
        """Whether ``exc`` is the database refusing a second checkpoint with one id (the
        unique index decides, so a save need not look first)."""
        return False

    @staticmethod
    def _id_taken(plan: _WritePlan) -> ConflictError:
        return ConflictError(
            f"checkpoint id {plan.record.id!r} already exists",
            run_id=plan.record.run_id,
            expected=None,
            actual=plan.record.id,
        )

    def _notify(self, tx: Tx, run_id: str) -> None:
        """Called in a transaction that makes ``run_id`` runnable; sent at commit by stores
        that can wake waiting workers (see :meth:`Store.wait_for_work`)."""

    # -- transactions ----------------------------------------------------------------------

    def _retrying(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` until it stops failing with a busy error, for up to ``busy_timeout``."""
        backoff = None
        while True:
            try:
                return fn()
            except Exception as exc:
                if not self._retryable(exc):
                    raise
                backoff = backoff or Backoff(self.busy_timeout, self.url)
                backoff.wait(exc)

    def _tx(
        self,
        fn: Callable[[Tx], T],
        *,
        write: bool = False,
        durability: Durability | None = None,
    ) -> T:
        """Run ``fn`` in one transaction, retrying the whole of it while the store is busy."""

        def attempt() -> tuple[T, Tx]:
            with self._transaction(write, durability) as cur:
                tx = Tx(cur, self.dialect)
                return fn(tx), tx

        result, tx = self._retrying(attempt)
        tx.committed()
        return result

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one read query, in its own transaction."""
        return self._tx(lambda tx: tx.all(sql, params))

    # -- schema ------------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The version of pitstop's own tables in this store (0: none yet)."""
        return self._tx(self._read_schema_version)

    def _read_schema_version(self, tx: Tx) -> int:
        raise NotImplementedError

    def _prepare_migration(self, tx: Tx) -> None:
        """Take whatever lock makes concurrent migrations safe (SQLite: the write lock)."""

    def migrate(self, *, target: int | None = None) -> int:
        target = LATEST_SCHEMA if target is None else target

        def apply(tx: Tx) -> int:
            self._prepare_migration(tx)
            tx.run(
                self.dialect.ddl(
                    "CREATE TABLE IF NOT EXISTS pitstop_schema (version INTEGER PRIMARY KEY, "
                    "description TEXT NOT NULL, applied_at {real} NOT NULL)"
                )
            )
            current = tx.one("SELECT MAX(version) FROM pitstop_schema")[0] or 0
            if current > LATEST_SCHEMA:
                raise StoreSchemaError(
                    f"{self.url}: store schema version {current} is newer than this pitstop "
                    f"understands ({LATEST_SCHEMA}); upgrade pitstop",
                    found=current, needed=LATEST_SCHEMA,
                )
            for version, description, statements in MIGRATIONS:
                if current < version <= target:
                    for statement in statements:
                        tx.run(self.dialect.ddl(statement))
                    tx.run(
                        "INSERT INTO pitstop_schema (version, description, applied_at) "
                        "VALUES (?, ?, ?)",
                        (version, description, time.time()),
                    )
                    current = version
            return current

        return self._tx(apply, write=True)

    def _ensure_schema(self, auto_migrate: bool) -> None:
        version = self.schema_version()
        if version > LATEST_SCHEMA:
            raise StoreSchemaError(
                f"{self.url}: store schema version {version} is newer than this pitstop "
                f"understands ({LATEST_SCHEMA}); upgrade pitstop",
                found=version, needed=LATEST_SCHEMA,
            )
        if version < LATEST_SCHEMA:
            if not auto_migrate:
                raise StoreSchemaError(
                    f"{self.url}: store schema version {version}, this pitstop needs "
                    f"{LATEST_SCHEMA}; run `pitstop migrate --store URL`",
                    found=version, needed=LATEST_SCHEMA,
                )
            self.migrate()

    # -- checkpoints ---------------------------------------------------------------------------

    def _parent(self, tx: Tx | None, checkpoint_id: str) -> _Parent:
        cached = self._fields.get(checkpoint_id)
        if cached is not None:
            return cached

        def read(tx: Tx) -> Any:
            return tx.one(f"SELECT {_CKPT} FROM pitstop_checkpoints WHERE id = ?", (checkpoint_id,))

        row = read(tx) if tx is not None else self._tx(read)
        if row is None:
            raise CheckpointNotFoundError(checkpoint_id)
        record = _row_to_record(row)
        record.verify()
        parent = _Parent(record.id, record.run_id, record.step, record.field_map())
        self._fields.put(checkpoint_id, parent)
        return parent

    def _head_id(self, run_id: str) -> str | None:
        row = self._tx(
            lambda tx: tx.one("SELECT head_id FROM pitstop_runs WHERE run_id = ?", (run_id,))
        )
        return row[0] if row else None

    def prepare(
        self,
        run_id: str,
        state: Mapping[str, Any],
        *,
        parent_id: str | None = None,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        changed: Iterable[str] | None = None,
        schema_version: int = 0,
        workflow: str | None = None,
        status: RunStatus | None = None,
        expected_head: str | _Unset | None = UNSET,
        lease: Lease | None = None,
        release: bool = False,
        consumed_inputs: Iterable[str] = (),
        durability: Durability | None = None,
        checkpoint_id: str | None = None,
    ) -> PreparedSave:
        if type(run_id) is not str or not 0 < len(run_id) <= 512:
            _check_id("run_id", run_id)
        follow_head = parent_id is None
        if follow_head:
            parent_id = self._heads.get(run_id)
            if parent_id is None and expected_head is not None:
                # (expected_head=None: the caller says the run has no checkpoint yet, as
                # when a run starts; the write checks that, so no read of the head first.)
                parent_id = self._head_id(run_id)
        parent = self._parent(None, parent_id) if parent_id is not None else None
        fields, new, raws = self._codec.encode_state(
            run_id,
            state,
            parent.fields if parent else None,
            changed,
            self._raws.get(parent_id) if parent_id is not None and changed is None else None,
        )
        if checkpoint_id is None:
            checkpoint_id = new_id(after=parent_id)
        else:
            _check_id("checkpoint_id", checkpoint_id)
        size = 0
        for ref in fields.values():
            size += ref.size
        added = 0
        if new:
            for blob in new.values():
                added += len(blob.data)
        # Positional: this runs on every checkpoint (see CheckpointRecord for the order).
        record = CheckpointRecord(
            checkpoint_id,
            run_id,
            parent_id,
            step if step is not None else (parent.step + 1 if parent else 0),
            time.time(),
            schema_version,
            encode_metadata(metadata, run_id) if metadata else "{}",
            encode_field_map(fields),
            size,
            added,
        )
        record.checksum = record.compute_checksum()
        if (
            parent is not None
            and parent.run_id == run_id
            and (expected_head == parent_id or self._heads.get(run_id) == parent_id)
        ):
            # Continuing from the run's head (one this process wrote, or one the write
            # will check): the run already references the parent's values (a head is never
            # pruned), so only new ones need a reference. Any other parent (a branch point,
            # a stale cache) may have lost its values to a prune: reference them all, and
            # the write checks that they still exist.
            refs = list(set(new).difference(stored_hashes(parent.fields))) if new else []
        else:
            refs = list(stored_hashes(fields))
        plan = _WritePlan(record, fields, new, refs, follow_head, expected_head, lease,
                          release and lease is not None, workflow, status)
        if metadata or status is not None:
            waiting = metadata.get("waiting_for") if metadata else None
            plan.waiting_json = json.dumps(list(waiting)) if waiting else None
            plan.wake_at = _ts(metadata.get("wake_at")) if metadata else None
            plan.sets_waiting = status is not None or bool(
                metadata and ("waiting_for" in metadata or "wake_at" in metadata)
            )
        if consumed_inputs:
            plan.consumed = list(consumed_inputs)
        plan.durability = durability
        # Known before the write, so a background writer can chain the next checkpoint on it.
        self._fields.put(checkpoint_id, _Parent(checkpoint_id, run_id, record.step, fields))
        if raws:
            self._raws.put(checkpoint_id, raws)
        return PreparedSave(record.id, run_id, parent_id, record.step, state, plan)

    def commit(self, prepared: PreparedSave) -> Checkpoint:
        try:
            return self._commit(prepared)
        except _HeadMoved as moved:
            raise ConflictError(
                "another checkpoint was written first",
                run_id=prepared.run_id,
                expected=prepared.parent_id,
                actual=moved.actual,
            ) from None

    def _commit(self, prepared: PreparedSave) -> Checkpoint:
        plan: _WritePlan = prepared.payload
        if plan.new:
            self._externalize(plan.new.values())
        try:
            self._tx(
                lambda tx: self._write_checkpoint(tx, plan), write=True, durability=plan.durability
            )
        except BaseException as exc:
            self._fields.drop(plan.record.id)
            self._raws.drop(plan.record.id)
            if isinstance(exc, Exception) and self._duplicate_checkpoint(exc):
                raise self._id_taken(plan) from None
            raise
        self._heads.put(prepared.run_id, plan.record.id)
        return plan.record.checkpoint(dict(prepared.state))

    def save(
        self,
        run_id: str,
        state: Mapping[str, Any],
        *,
        parent_id: str | None = None,
        changed: Iterable[str] | None = None,
        **options: Any,
    ) -> Checkpoint:
        while True:
            prepared = self.prepare(
                run_id, state, parent_id=parent_id, changed=changed, **options
            )
            try:
                return self._commit(prepared)
            except _HeadMoved:
                # Another writer moved the head: the `changed` hint no longer describes the
                # difference from the real parent, so compare every field by content instead.
                self._heads.drop(run_id)
                changed = None

    def _write_checkpoint(self, tx: Tx, plan: _WritePlan) -> None:
        """The write half of :meth:`save`: move the run's head, then insert the checkpoint.

        The common case is one conditional UPDATE that checks the head and the lease and
        moves the head in a single statement (and locks the run's row on PostgreSQL). Only
        when it matches no row does :meth:`_first_write_or_refusal` find out why.
        """
        record = plan.record
        run_id = record.run_id
        now = record.created_at
        expected = record.parent_id if plan.follow_head else plan.expected_head
        if plan.follow_head and plan.expected_head not in (UNSET, expected):
            # Following the head *and* expecting another one cannot both hold: the slow
            # path says which failed (ConflictError, or a moved head and a new attempt).
            moved = 0
        else:
            moved = tx.run(*move_head(plan, self.dialect.is_)).rowcount
        if not moved:
            self._first_write_or_refusal(tx, plan, record.footprint)
        if plan.refs:
            self._lock_values(tx)
            self._check_reused(tx, plan)
            self._insert_blobs(tx, plan.new, now)
            tx.many(
                "INSERT INTO pitstop_blob_refs (run_id, hash) VALUES (?, ?) "
                "ON CONFLICT (run_id, hash) DO NOTHING",
                [(run_id, h) for h in plan.refs],
            )
        tx.run(_INSERT_CHECKPOINT, record.row())
        if plan.consumed:
            tx.run_chunks(
                "UPDATE pitstop_inputs SET consumed_by = ? WHERE run_id = ? "
                "AND consumed_by IS NULL AND id IN ({in})",
                plan.consumed,
                record.id,
                run_id,
            )

    def _first_write_or_refusal(self, tx: Tx, plan: _WritePlan, grown: int) -> None:
        """The conditional UPDATE matched nothing: a new run (create it), or a refusal."""
        record = plan.record
        run_id = record.run_id
        row = tx.one(
            "SELECT head_id, fence, lease_owner, lease_expires, status FROM pitstop_runs "
            "WHERE run_id = ?" + self.dialect.lock_row,
            (run_id,),
        )
        actual = row[0] if row else None
        # The caller's expectation first: when it fails, re-reading the head (what
        # _HeadMoved leads to) cannot make it hold.
        if plan.expected_head is not UNSET and actual != plan.expected_head:
            raise ConflictError(
                "another checkpoint was written first",
                run_id=run_id,
                expected=plan.expected_head,
                actual=actual,
            )
        if plan.follow_head and actual != record.parent_id:
            raise _HeadMoved(actual)
        self._check_lease(run_id, row, plan.lease, record.created_at)
        if row is not None:  # pragma: no cover - the UPDATE would have matched
            raise _HeadMoved(actual)
        tx.run(
            "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, "
            "updated_at, metadata, head_id, step, waiting_for, wake_at, checkpoints, "
            "bytes) VALUES (?, ?, ?, ?, ?, '{}', ?, ?, ?, ?, 1, ?)",
            (
                run_id,
                plan.workflow,
                (plan.status or RunStatus.RUNNING).value,
                record.created_at,
                record.created_at,
                record.id,
                record.step,
                plan.waiting_json,
                plan.wake_at,
                grown,
            ),
        )

    def _check_reused(self, tx: Tx, plan: _WritePlan) -> None:
        """Fail if a value referenced but not sent (a fork shares its source's) is gone.

        It existed when the source was read, but a prune or delete may have removed it
        since; checked under :meth:`_lock_values`, so it cannot be removed after this.
        New values need no check: they are (re)inserted. Saves whose parent is in the same
        run reference only new values, so the check costs them nothing.
        """
        reused = [h for h in plan.refs if h not in plan.new]
        if not reused:
            return
        found = tx.in_chunks("SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", reused)
        if len(found) < len(reused):
            parent = plan.record.parent_id or "?"
            self._fields.drop(parent)
            raise CheckpointNotFoundError(parent)

    def _external(self, blob: NewBlob) -> bool:
        return self.blobs is not None and blob.size >= self.blob_threshold

    def _externalize(self, blobs: Iterable[NewBlob]) -> None:
        """Write large values to the blob store, synced, before any row references them."""
        if self.blobs is not None:
            for blob in blobs:
                if self._external(blob):
                    self.blobs.put(blob.hash, blob.data)

    def _insert_blobs(self, tx: Tx, new: Mapping[bytes, NewBlob], now: float) -> None:
        if not new:
            return
        blobs = list(new.values())
        big = [b.hash for b in blobs if b.size > _PROBE_BEFORE_SEND]
        if big:
            present = {
                bytes(r[0])
                for r in tx.in_chunks("SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", big)
            }
            blobs = [b for b in blobs if b.hash not in present]
        if self.blobs is None:
            tx.many(
                "INSERT INTO pitstop_blobs (hash, data, size, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (hash) DO NOTHING",
                [(b.hash, b.data, b.size, now) for b in blobs],
            )
            return
        location = self.blobs.url
        tx.many(
            "INSERT INTO pitstop_blobs (hash, data, size, created_at, location) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING",
            [
                (b.hash, b"", b.size, now, location)
                if self._external(b)
                else (b.hash, b.data, b.size, now, None)
                for b in blobs
            ],
        )

    def _read_values(self, tx: Tx, hashes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Stored values by hash, from the table or the blob store (absent ones left out)."""
        out: dict[bytes, bytes] = {}
        for h, data, location in tx.in_chunks(
            "SELECT hash, data, location FROM pitstop_blobs WHERE hash IN ({in})", hashes
        ):
            key = bytes(h)
            if location is None:
                out[key] = bytes(data)
            else:
                value = self._fetch_external(key, location)
                if value is not None:
                    out[key] = value
        return out

    def _fetch_external(self, key: bytes, location: str) -> bytes | None:
        if self.blobs is None:
            raise StoreError(
                f"{self.url}: value {key.hex()[:16]} is kept in the blob store {location}; "
                "open this store with blobs=... to read it"
            )
        return self.blobs.get(key)

    @staticmethod
    def _check_lease(run_id: str, row: Any, lease: Lease | None, now: float) -> None:
        if row is None:
            if lease is not None:
                raise LeaseLostError(
                    run_id, owner=lease.owner, token=lease.token, current_token=None
                )
            return
        _, fence, owner, expires = row[0], row[1], row[2], row[3]
        if lease is None:
            if owner is not None and expires is not None and expires > now:
                raise RunBusyError(run_id, owner=owner, expires_at=expires)
        elif fence != lease.token or owner != lease.owner:
            raise LeaseLostError(run_id, owner=lease.owner, token=lease.token, current_token=fence)

    def _load(self, tx: Tx, where: str, params: Sequence[Any]) -> Any:
        row = tx.one(f"SELECT {_CKPT} FROM pitstop_checkpoints {where}", params)
        if row is None:
            return None, {}
        record = _row_to_record(row)
        return record, self._load_blobs(tx, record)

    def _load_blobs(self, tx: Tx, record: CheckpointRecord) -> dict[bytes, bytes]:
        return self._read_values(tx, list(stored_hashes(record.field_map())))

    def get(self, checkpoint_id: str, *, strict: bool = True) -> Checkpoint:
        record, blobs = self._tx(lambda tx: self._load(tx, "WHERE id = ?", (checkpoint_id,)))
        if record is None:
            raise CheckpointNotFoundError(checkpoint_id)
        return self._codec.decode_checkpoint(record, blobs, strict=strict)

    def latest(
        self, run_id: str, *, fallback: bool = False, strict: bool = True
    ) -> Checkpoint | None:
        record, blobs = self._tx(
            lambda tx: self._load(
                tx,
                "WHERE id = (SELECT head_id FROM pitstop_runs WHERE run_id = ?)",
                (run_id,),
            )
        )
        return self._head(run_id, record, blobs, fallback, strict)

    def latest_with_run(
        self, run_id: str, *, fallback: bool = False, strict: bool = True
    ) -> tuple[Run, Checkpoint | None]:
        def head_of(row: Any) -> CheckpointRecord | None:
            return None if row is None or row[_RUN_COLUMNS] is None else _row_to_record(
                row[_RUN_COLUMNS:]
            )

        def read(tx: Tx) -> tuple[Any, CheckpointRecord | None, dict[bytes, Any]]:
            row = tx.one(_RUN_AND_HEAD, (run_id,))
            record = head_of(row)
            return row, record, self._load_blobs(tx, record) if record else {}

        # Small states live entirely in the record: then one statement reads everything;
        # otherwise the values are read too, from one snapshot.
        row = self._read_alone(_RUN_AND_HEAD, (run_id,))
        record = head_of(row)
        blobs: dict[bytes, Any] = {}
        if record is not None and not _self_contained(record):
            row, record, blobs = self._tx(read)
        if row is None:
            raise RunNotFoundError(run_id)
        return _row_to_run(row), self._head(run_id, record, blobs, fallback, strict)

    def _head(
        self,
        run_id: str,
        record: CheckpointRecord | None,
        blobs: Any,
        fallback: bool,
        strict: bool,
    ) -> Checkpoint | None:
        if record is None:
            return None
        try:
            found = self._codec.decode_checkpoint(record, blobs, strict=strict)
        except CorruptCheckpointError as exc:
            if not fallback:
                raise
            return self._fallback(run_id, record, exc, strict)
        # A run is usually loaded to be continued: its next save will want this field map.
        self._fields.put(record.id, _Parent(record.id, run_id, record.step, record.field_map()))
        return found

    def _fallback(
        self, run_id: str, bad: CheckpointRecord, error: Exception, strict: bool
    ) -> Checkpoint:
        """Walk back from a corrupt head along its ancestors to the newest valid checkpoint."""
        skipped = [f"{bad.id}: {error}"]
        parent_id = bad.parent_id
        while parent_id is not None:
            record, blobs = self._tx(
                partial(self._load, where="WHERE id = ? AND run_id = ?", params=(parent_id, run_id))
            )
            if record is None:
                break
            try:
                found = self._codec.decode_checkpoint(record, blobs, strict=strict)
            except CorruptCheckpointError as exc:
                skipped.append(f"{record.id}: {exc}")
                parent_id = record.parent_id
                continue
            found.skipped = tuple(skipped)
            log.warning(
                "run %r: head is corrupt, fell back to checkpoint %s (skipped %s)",
                run_id,
                found.id,
                "; ".join(skipped),
            )
            return found
        raise CorruptCheckpointError(
            "no valid checkpoint in the head's ancestry (" + "; ".join(skipped) + ")",
            run_id=run_id,
            checkpoint_id=bad.id,
        )

    def summary(self, checkpoint_id: str) -> CheckpointSummary:
        row = self._tx(
            lambda tx: tx.one(
                f"SELECT {_SUMMARY} FROM pitstop_checkpoints WHERE id = ?", (checkpoint_id,)
            )
        )
        if row is None:
            raise CheckpointNotFoundError(checkpoint_id)
        return _row_to_summary(row)

    def history(
        self, run_id: str, *, limit: int | None = 100, before: str | None = None
    ) -> list[CheckpointSummary]:
        sql = f"SELECT {_SUMMARY} FROM pitstop_checkpoints WHERE run_id = ?"
        params: list[Any] = [run_id]
        if before is not None:
            sql += " AND id < ?"
            params.append(before)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)

        def read(tx: Tx) -> tuple[list[Any], bool]:
            rows = tx.all(sql, params)
            exists = bool(rows) or (
                tx.one("SELECT 1 FROM pitstop_runs WHERE run_id = ?", (run_id,)) is not None
            )
            return rows, exists

        rows, exists = self._tx(read)
        if not exists:
            raise RunNotFoundError(run_id)
        return [_row_to_summary(r) for r in rows]

    # -- runs --------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        *,
        workflow: str | None = None,
        status: RunStatus = RunStatus.RUNNING,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
        exist_ok: bool = False,
    ) -> Run:
        _check_id("run_id", run_id)
        meta_json = encode_metadata(metadata, run_id)
        now = time.time()

        def write(tx: Tx) -> Any:
            created = tx.run(
                "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, updated_at, "
                "metadata, priority) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                (run_id, workflow, RunStatus(status).value, now, now, meta_json, priority),
            ).rowcount
            if not created and not exist_ok:
                raise RunExistsError(run_id)
            if created and RunStatus(status) is RunStatus.QUEUED:
                self._notify(tx, run_id)
            return tx.one(f"SELECT {_RUN} FROM pitstop_runs WHERE run_id = ?", (run_id,))

        return _row_to_run(self._tx(write, write=True))

    def get_run(self, run_id: str) -> Run:
        row = self._tx(
            lambda tx: tx.one(f"SELECT {_RUN} FROM pitstop_runs WHERE run_id = ?", (run_id,))
        )
        if row is None:
            raise RunNotFoundError(run_id)
        return _row_to_run(row)

    def runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        id_prefix: str | None = None,
        before: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
    ) -> list[Run]:
        where, params = self._run_filters(status, workflow, since, until, metadata, id_prefix)
        if before is not None:
            # Keyset paging: the rows after ``before`` in (created_at DESC, run_id DESC)
            # order, found through the index however deep the page is (OFFSET walks them).
            where.append(
                "(created_at < (SELECT created_at FROM pitstop_runs WHERE run_id = ?) OR "
                "(created_at = (SELECT created_at FROM pitstop_runs WHERE run_id = ?) "
                "AND run_id < ?))"
            )
            params.extend([before, before, before])
        sql = f"SELECT {_RUN} FROM pitstop_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, run_id DESC"
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            params.extend([limit, offset])
        elif offset:
            raise ValueError("offset needs a limit")
        return [_row_to_run(r) for r in self._tx(lambda tx: tx.all(sql, params))]

    def count_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        id_prefix: str | None = None,
    ) -> dict[str, int]:
        where, params = self._run_filters(status, workflow, since, until, metadata, id_prefix)
        sql = "SELECT status, COUNT(*) FROM pitstop_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " GROUP BY status"
        return {r[0]: int(r[1]) for r in self._tx(lambda tx: tx.all(sql, params))}

    def _run_filters(
        self,
        status: RunStatus | str | Iterable[RunStatus | str] | None,
        workflow: str | None,
        since: datetime | float | None,
        until: datetime | float | None,
        metadata: Mapping[str, Any] | None,
        id_prefix: str | None,
    ) -> tuple[list[str], list[Any]]:
        """The WHERE clauses (and their params) that :meth:`runs` and :meth:`count_runs`
        share."""
        where: list[str] = []
        params: list[Any] = []
        statuses = _statuses(status)
        if statuses:
            where.append(f"status IN ({_marks(len(statuses))})")
            params.extend(statuses)
        if workflow is not None:
            where.append("workflow = ?")
            params.append(workflow)
        if since is not None:
            where.append("created_at >= ?")
            params.append(_ts(since))
        if until is not None:
            where.append("created_at < ?")
            params.append(_ts(until))
        if id_prefix:
            # substr, not LIKE: no escaping of % and _, the same text on both dialects.
            where.append("substr(run_id, 1, ?) = ?")
            params.extend([len(id_prefix), id_prefix])
        for key, value in (metadata or {}).items():
            clause, values = self.dialect.json_equals("metadata", key, value)
            where.append(clause)
            params.extend(values)
        return where, params

    def update_run(
        self,
        run_id: str,
        *,
        status: RunStatus | None = None,
        metadata: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> Run:
        def write(tx: Tx) -> Any:
            row = tx.one(
                "SELECT head_id, fence, lease_owner, lease_expires, status, metadata "
                "FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row,
                (run_id,),
            )
            if row is None:
                raise RunNotFoundError(run_id)
            now = time.time()
            cancelling = status == RunStatus.CANCELLED
            if not cancelling:
                self._check_lease(run_id, row, lease, now)
            merged = json.loads(row[5]) if row[5] else {}
            merged.update(metadata or {})
            if cancelling:
                # Cancelling breaks any lease: the owner's next write is fenced off.
                tx.run(
                    "UPDATE pitstop_runs SET status = ?, metadata = ?, updated_at = ?, "
                    "lease_owner = NULL, lease_expires = NULL, fence = fence + 1, "
                    "wake_at = NULL WHERE run_id = ?",
                    (RunStatus.CANCELLED.value, encode_metadata(merged, run_id), now, run_id),
                )
            else:
                tx.run(
                    "UPDATE pitstop_runs SET status = COALESCE(?, status), metadata = ?, "
                    "updated_at = ? WHERE run_id = ?",
                    (
                        status.value if status else None,
                        encode_metadata(merged, run_id),
                        now,
                        run_id,
                    ),
                )
            return tx.one(f"SELECT {_RUN} FROM pitstop_runs WHERE run_id = ?", (run_id,))

        return _row_to_run(self._tx(write, write=True))

    def delete_run(self, run_id: str) -> PruneReport:
        report = self._tx(lambda tx: self._delete_run(tx, run_id, dry_run=False), write=True)
        if not report.runs:
            raise RunNotFoundError(run_id)
        return report

    def _delete_run(self, tx: Tx, run_id: str, *, dry_run: bool) -> PruneReport:
        report = PruneReport(dry_run=dry_run)
        run = tx.one("SELECT run_id FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row,
                     (run_id,))
        if run is None:
            return report
        ids = [r[0] for r in tx.all("SELECT id FROM pitstop_checkpoints WHERE run_id = ?",
                                    (run_id,))]
        record_bytes = tx.one(
            "SELECT COALESCE(SUM(LENGTH(fields) + LENGTH(metadata)), 0) "
            "FROM pitstop_checkpoints WHERE run_id = ?",
            (run_id,),
        )[0]
        stale = [bytes(r[0]) for r in tx.all(
            "SELECT hash FROM pitstop_blob_refs WHERE run_id = ?", (run_id,)
        )]
        freed, freed_bytes = self._unshared(tx, run_id, stale)
        report.runs.append(run_id)
        report.checkpoints.extend(ids)
        report.blobs = len(freed)
        report.bytes_reclaimed = int(record_bytes) + freed_bytes
        if dry_run:
            return report
        self._lock_gc(tx)
        for table in ("pitstop_checkpoints", "pitstop_blob_refs", "pitstop_inputs",
                      "pitstop_effects", "pitstop_runs"):
            tx.run(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        self._delete_blobs(tx, freed)
        self._fields_forget(ids)
        self._heads.drop(run_id)
        return report

    def _unshared(self, tx: Tx, run_id: str, hashes: Sequence[bytes]) -> tuple[list[bytes], int]:
        """Which of ``hashes`` no other run references, and their stored size."""
        if not hashes:
            return [], 0
        shared = {
            bytes(r[0])
            for r in tx.in_chunks(
                "SELECT DISTINCT hash FROM pitstop_blob_refs WHERE run_id <> ? AND hash IN ({in})",
                hashes,
                run_id,
            )
        }
        freed = [h for h in hashes if h not in shared]
        size = sum(
            int(r[0])
            for r in tx.in_chunks("SELECT size FROM pitstop_blobs WHERE hash IN ({in})", freed)
        )
        return freed, size

    def _delete_blobs(self, tx: Tx, hashes: Sequence[bytes]) -> None:
        unreferenced = (
            "hash IN ({in}) AND NOT EXISTS "
            "(SELECT 1 FROM pitstop_blob_refs r WHERE r.hash = pitstop_blobs.hash)"
        )
        if self.blobs is not None:
            files = [
                bytes(r[0])
                for r in tx.in_chunks(
                    f"SELECT hash FROM pitstop_blobs WHERE location IS NOT NULL AND {unreferenced}",
                    hashes,
                )
            ]
            if files:
                blobs = self.blobs
                tx.on_commit(lambda: blobs.delete(files))  # only once no row points at them
        # Re-checked under the GC lock: a concurrent writer may have started sharing one.
        tx.run_chunks("DELETE FROM pitstop_blobs WHERE " + unreferenced, hashes)

    def _fields_forget(self, ids: Iterable[str]) -> None:
        for checkpoint_id in ids:
            self._fields.drop(checkpoint_id)

    # -- retention ---------------------------------------------------------------------------

    def prune(
        self,
        policy: RetentionPolicy,
        *,
        run_id: str | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> PruneReport:
        report = PruneReport(dry_run=dry_run)
        doomed_runs: list[str] = []
        if policy.finished_age is not None:
            cutoff = time.time() - policy.finished_age
            statuses = [RunStatus(s).value for s in policy.finished_statuses]
            sql = (
                f"SELECT run_id FROM pitstop_runs WHERE status IN ({_marks(len(statuses))}) "
                "AND updated_at < ?"
            )
            params: list[Any] = [*statuses, cutoff]
            if run_id is not None:
                sql += " AND run_id = ?"
                params.append(run_id)
            doomed_runs = [r[0] for r in self._tx(lambda tx: tx.all(sql, params))]
        candidates: list[str] = []
        if policy.keep_last is not None:
            if run_id is not None:
                candidates = [run_id]
            else:
                candidates = [
                    r[0]
                    for r in self._tx(
                        lambda tx: tx.all(
                            "SELECT run_id FROM pitstop_runs WHERE checkpoints > ? "
                            "ORDER BY run_id",
                            (policy.keep_last,),
                        )
                    )
                ]
            candidates = [c for c in candidates if c not in set(doomed_runs)]
        total = len(doomed_runs) + len(candidates)
        done = 0
        for rid in doomed_runs:
            report.merge(
                self._tx(partial(self._delete_run, run_id=rid, dry_run=dry_run), write=True)
            )
            done += 1
            if progress:
                progress(done, total)
        for rid in candidates:
            report.merge(
                self._tx(
                    partial(self._prune_run, run_id=rid, policy=policy, dry_run=dry_run),
                    write=True,
                )
            )
            done += 1
            if progress:
                progress(done, total)
        if not dry_run:
            self._sweep_blob_store()
        return report

    def _prune_run(
        self, tx: Tx, run_id: str, policy: RetentionPolicy, *, dry_run: bool
    ) -> PruneReport:
        report = PruneReport(dry_run=dry_run)
        run = tx.one(
            "SELECT head_id FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row, (run_id,)
        )
        if run is None:
            return report
        rows = tx.all(
            "SELECT id, metadata, fields FROM pitstop_checkpoints WHERE run_id = ? "
            "ORDER BY id DESC",
            (run_id,),
        )
        keep = {r[0] for r in rows[: policy.keep_last]}
        if run[0] is not None:
            keep.add(run[0])
        if policy.keep_milestones:
            keep.update(r[0] for r in rows if r[0] not in keep and json.loads(r[1]).get("tags"))
        return self._drop_checkpoints(tx, run_id, rows, keep, report)

    def _drop_checkpoints(
        self, tx: Tx, run_id: str, rows: Sequence[Any], keep: set[str], report: PruneReport
    ) -> PruneReport:
        """Delete the checkpoints of ``rows`` (id, metadata, fields; the whole run, newest
        first) not in ``keep``, with their effect records and the values nothing else uses.
        The caller holds the run's row lock; the run's head is the caller's business."""
        dry_run = report.dry_run
        doomed = [r for r in rows if r[0] not in keep]
        if not doomed:
            return report
        remaining: set[bytes] = set()
        for r in rows:
            if r[0] in keep:
                remaining.update(stored_hashes(decode_field_map(bytes(r[2]))))
        refs = [bytes(r[0]) for r in tx.all(
            "SELECT hash FROM pitstop_blob_refs WHERE run_id = ?", (run_id,)
        )]
        stale = [h for h in refs if h not in remaining]
        freed, freed_bytes = self._unshared(tx, run_id, stale)
        ids = [r[0] for r in doomed]
        record_bytes = sum(len(r[1]) + len(r[2]) for r in doomed)
        report.checkpoints.extend(ids)
        report.blobs = len(freed)
        report.bytes_reclaimed = record_bytes + freed_bytes
        if dry_run:
            return report
        self._lock_gc(tx)
        tx.run_chunks("DELETE FROM pitstop_checkpoints WHERE id IN ({in})", ids)
        tx.run_chunks("DELETE FROM pitstop_effects WHERE run_id = ? AND checkpoint_id IN ({in})",
                      ids, run_id)
        tx.run_chunks("DELETE FROM pitstop_blob_refs WHERE run_id = ? AND hash IN ({in})",
                      stale, run_id)
        self._delete_blobs(tx, freed)
        tx.run(
            "UPDATE pitstop_runs SET checkpoints = checkpoints - ?, "
            "bytes = CASE WHEN bytes > ? THEN bytes - ? ELSE 0 END WHERE run_id = ?",
            (len(ids), report.bytes_reclaimed, report.bytes_reclaimed, run_id),
        )
        self._fields_forget(ids)
        return report

    def delete_checkpoints(
        self, run_id: str, checkpoint_ids: Iterable[str], *, dry_run: bool = False
    ) -> PruneReport:
        doomed_ids = set(checkpoint_ids)

        def write(tx: Tx) -> PruneReport:
            report = PruneReport(dry_run=dry_run)
            run = tx.one(
                "SELECT head_id FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row,
                (run_id,),
            )
            if run is None or not doomed_ids:
                return report
            rows = tx.all(
                "SELECT id, metadata, fields, step FROM pitstop_checkpoints WHERE run_id = ? "
                "ORDER BY id DESC",
                (run_id,),
            )
            survivors = [r for r in rows if r[0] not in doomed_ids]
            self._drop_checkpoints(tx, run_id, rows, {r[0] for r in survivors}, report)
            if not dry_run and report.checkpoints and run[0] in doomed_ids:
                # The head went: the run continues from its newest remaining checkpoint.
                head = survivors[0] if survivors else None
                tx.run(
                    "UPDATE pitstop_runs SET head_id = ?, step = ? WHERE run_id = ?",
                    (head[0] if head else None, head[3] if head else None, run_id),
                )
                self._heads.drop(run_id)
            return report

        return self._tx(write, write=True)

    # -- maintenance -------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        # Asked outside the transaction below: a backend may need a connection of its own to
        # answer, and a pool of one connection must not wait for itself.
        file_bytes = self._file_bytes()

        def read(tx: Tx) -> StoreStats:
            by_status = {
                r[0]: int(r[1])
                for r in tx.all("SELECT status, COUNT(*) FROM pitstop_runs GROUP BY status")
            }
            checkpoints, record_bytes = tx.one(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(fields) + LENGTH(metadata)), 0) "
                "FROM pitstop_checkpoints"
            )
            blobs, blob_bytes = tx.one("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM pitstop_blobs")
            return StoreStats(
                runs=sum(by_status.values()),
                checkpoints=int(checkpoints),
                blobs=int(blobs),
                bytes=int(record_bytes) + int(blob_bytes),
                runs_by_status=by_status,
                file_bytes=file_bytes,
            )

        return self._tx(read)

    def verify(self, *, progress: Progress | None = None) -> list[Problem]:
        problems: list[Problem] = []
        total = self._tx(
            lambda tx: int(tx.one("SELECT COUNT(*) FROM pitstop_checkpoints")[0])
            + int(tx.one("SELECT COUNT(*) FROM pitstop_blobs")[0])
        )
        done = 0
        referenced: dict[bytes, tuple[str, str, str]] = {}
        after = ""
        while True:
            rows = self._query(
                f"SELECT {_CKPT} FROM pitstop_checkpoints WHERE id > ? ORDER BY id LIMIT ?",
                (after, _CHUNK),
            )
            if not rows:
                break
            for row in rows:
                try:
                    record = _row_to_record(row)
                    record.verify()
                    for name, ref in record.field_map().items():
                        if ref.inline is None:
                            referenced.setdefault(ref.hash, (record.id, record.run_id, name))
                except Exception as exc:
                    problems.append(Problem("checkpoint", str(row[0]), str(exc), run_id=row[1]))
            after = rows[-1][0]
            done += len(rows)
            if progress:
                progress(done, total)
        seen: set[bytes] = set()
        after_hash = b""
        while True:
            rows = self._query(
                "SELECT hash, data, location FROM pitstop_blobs WHERE hash > ? "
                "ORDER BY hash LIMIT ?",
                (after_hash, 64),
            )
            if not rows:
                break
            for raw_hash, data, location in rows:
                h = bytes(raw_hash)
                seen.add(h)
                try:
                    value = bytes(data) if location is None else self._fetch_external(h, location)
                    self._codec.decode_value(value, h, strict=False)
                except Exception as exc:
                    owner = referenced.get(h)
                    problems.append(
                        Problem(
                            "blob",
                            h.hex()[:16],
                            f"{exc}" + (f" (field {owner[2]!r} of checkpoint {owner[0]})"
                                        if owner else ""),
                            run_id=owner[1] if owner else None,
                        )
                    )
            after_hash = bytes(rows[-1][0])
            done += len(rows)
            if progress:
                progress(done, total)
        for h, (checkpoint_id, run_id, name) in referenced.items():
            if h not in seen:
                problems.append(
                    Problem(
                        "checkpoint",
                        checkpoint_id,
                        f"field {name!r} refers to value {h.hex()[:16]} which is missing",
                        run_id=run_id,
                    )
                )
        kinds: tuple[tuple[Literal["input", "effect"], str], ...] = (
            ("input", "SELECT run_id, id, payload, hash FROM pitstop_inputs"),
            ("effect", "SELECT run_id, key, result, hash FROM pitstop_effects"),
        )
        for kind, query in kinds:
            for rid, ident, data, h in self._query(query):
                try:
                    self._codec.decode_value(bytes(data), bytes(h), strict=False)
                except Exception as exc:
                    problems.append(Problem(kind, str(ident), str(exc), run_id=rid))
        for run_id, head in self._tx(
            lambda tx: tx.all(
                "SELECT r.run_id, r.head_id FROM pitstop_runs r WHERE r.head_id IS NOT NULL "
                "AND NOT EXISTS (SELECT 1 FROM pitstop_checkpoints c WHERE c.id = r.head_id)"
            )
        ):
            problems.append(
                Problem("run", run_id, f"head checkpoint {head} is missing", run_id=run_id)
            )
        if self.blobs is not None:
            for orphan in self.blobs.keys(older_than=_ORPHAN_AGE):
                if orphan not in seen:
                    problems.append(
                        Problem("blob", orphan.hex()[:16], f"file in {self.blobs.url} that no "
                                "record references (left by a crash; `pitstop prune` removes it)")
                    )
        return problems

    def _sweep_blob_store(self) -> int:
        """Delete blob-store files no row references: what a crash between writing a large
        value and committing its checkpoint leaves behind. Only files older than an hour, so
        a save that wrote its value and is about to commit is never robbed of it."""
        if self.blobs is None:
            return 0
        candidates = list(self.blobs.keys(older_than=_ORPHAN_AGE))
        if not candidates:
            return 0
        known = {
            bytes(r[0])
            for r in self._tx(
                lambda tx: tx.in_chunks(
                    "SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", candidates
                )
            )
        }
        orphans = [key for key in candidates if key not in known]
        self.blobs.delete(orphans)
        return len(orphans)

    # -- ownership ---------------------------------------------------------------------------

    def acquire(
        self, run_id: str, owner: str, *, ttl: float = 30.0, takeover: str | None = None
    ) -> Lease:
        def write(tx: Tx) -> Lease:
            row = tx.one(
                "SELECT lease_owner, lease_expires, fence FROM pitstop_runs WHERE run_id = ?"
                + self.dialect.lock_row,
                (run_id,),
            )
            if row is None:
                raise RunNotFoundError(run_id)
            now = time.time()
            holder, expires, fence = row
            live = holder is not None and expires is not None and expires > now
            if live and holder == takeover:
                live = False
            if live and holder != owner:
                raise RunBusyError(run_id, owner=holder, expires_at=expires)
            token = fence if live else fence + 1
            tx.run(
                "UPDATE pitstop_runs SET lease_owner = ?, lease_expires = ?, fence = ? "
                "WHERE run_id = ?",
                (owner, now + ttl, token, run_id),
            )
            return Lease(run_id, owner, token, now + ttl)

        return self._tx(write, write=True)

    def renew(self, lease: Lease, *, ttl: float = 30.0) -> Lease:
        expires = time.time() + ttl

        def write(tx: Tx) -> None:
            updated = tx.run(
                "UPDATE pitstop_runs SET lease_expires = ? "
                "WHERE run_id = ? AND lease_owner = ? AND fence = ?",
                (expires, lease.run_id, lease.owner, lease.token),
            ).rowcount
            if not updated:
                row = tx.one("SELECT fence FROM pitstop_runs WHERE run_id = ?", (lease.run_id,))
                raise LeaseLostError(
                    lease.run_id,
                    owner=lease.owner,
                    token=lease.token,
                    current_token=row[0] if row else None,
                )

        self._tx(write, write=True)
        return Lease(lease.run_id, lease.owner, lease.token, expires, lease.workflow)

    def release(self, lease: Lease) -> None:
        def write(tx: Tx) -> None:
            released = tx.run(
                "UPDATE pitstop_runs SET lease_owner = NULL, lease_expires = NULL "
                "WHERE run_id = ? AND lease_owner = ? AND fence = ?",
                (lease.run_id, lease.owner, lease.token),
            ).rowcount
            if released and tx.one(
                "SELECT 1 FROM pitstop_runs WHERE run_id = ? AND status IN ('queued', 'running')",
                (lease.run_id,),
            ):
                self._notify(tx, lease.run_id)  # given back unfinished: someone may take it

        self._tx(write, write=True)

    def claim(
        self,
        owner: str,
        *,
        workflows: Iterable[str] | None = None,
        limit: int = 1,
        ttl: float = 30.0,
    ) -> list[Lease]:
        names = None if workflows is None else list(workflows)
        if names == []:
            return []

        now = time.time()
        # Two index-ordered scans (pitstop_runs_runnable, pitstop_runs_waking), so a claim
        # stays cheap however many runs are queued or waiting, merged by priority; the rows
        # picked are leased in the same statement (one round trip on PostgreSQL, where each
        # scan skips rows other workers are claiming at this moment).
        arms: list[str] = []
        params: list[Any] = []
        for where, order, first in (
            ("status IN ('queued', 'running')", "priority DESC, created_at", []),
            ("status = 'waiting' AND wake_at <= ?", "wake_at", [now]),
        ):
            arm = (
                "SELECT run_id, priority AS p, COALESCE(wake_at, created_at) AS t "
                f"FROM pitstop_runs WHERE {where} AND COALESCE(lease_expires, 0) < ?"
            )
            params += [*first, now]
            if names is None:
                arm += " AND workflow IS NOT NULL"
            else:
                arm += f" AND workflow IN ({_marks(len(names))})"
                params += names
            arms.append(f"SELECT * FROM ({arm} ORDER BY {order} LIMIT ?"
                        f"{self.dialect.skip_locked}) arm{len(arms)}")
            params.append(limit)
        rows = self._write_alone(
            "UPDATE pitstop_runs SET lease_owner = ?, lease_expires = ?, fence = fence + 1 "
            "WHERE run_id IN (SELECT run_id FROM (" + " UNION ALL ".join(arms) + ") picked "
            "ORDER BY p DESC, t LIMIT ?) "
            "RETURNING run_id, fence, workflow, priority, COALESCE(wake_at, created_at)",
            [owner, now + ttl, *params, limit],
        )
        rows.sort(key=lambda row: (-row[3], row[4]))
        return [Lease(run_id, owner, fence, now + ttl, workflow)
                for run_id, fence, workflow, _, _ in rows]

    def _read_alone(self, sql: str, params: Sequence[Any]) -> Any:
        """One query that needs no transaction around it; its first row."""
        return self._tx(lambda tx: tx.one(sql, params))

    def _write_alone(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """One writing statement as its own transaction; the rows it returns."""
        return self._tx(lambda tx: tx.all(sql, params), write=True)

    # -- inputs and effects ------------------------------------------------------------------

    def send(self, run_id: str, name: str, payload: Any) -> Input:
        _check_id("input name", name)
        blob = self._codec.encode_value(payload, run_id=run_id, path=f"input.{name}")
        input_id = new_id()
        now = time.time()

        def write(tx: Tx) -> None:
            row = tx.one(
                "SELECT status, waiting_for, wake_at FROM pitstop_runs WHERE run_id = ?"
                + self.dialect.lock_row,
                (run_id,),
            )
            if row is None:
                raise RunNotFoundError(run_id)
            status = RunStatus(row[0])
            waiting = json.loads(row[1]) if row[1] else []
            if status.finished:
                raise InputError(f"the run has finished ({status.value})", run_id=run_id,
                                 name=name)
            if status != RunStatus.WAITING or name not in waiting:
                expected = ", ".join(map(repr, waiting)) or "nothing"
                raise InputError(
                    f"the run is {status.value} and waits for {expected}", run_id=run_id,
                    name=name,
                )
            pending = {
                r[0]
                for r in tx.all(
                    "SELECT name FROM pitstop_inputs WHERE run_id = ? AND consumed_by IS NULL",
                    (run_id,),
                )
            }
            if name in pending:
                raise InputError(
                    "an input of that name was already delivered and is not consumed yet",
                    run_id=run_id,
                    name=name,
                )
            tx.run(
                "INSERT INTO pitstop_inputs (id, run_id, name, payload, hash, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (input_id, run_id, name, blob.data, blob.hash, now),
            )
            if pending.union([name]).issuperset(waiting):
                tx.run(
                    "UPDATE pitstop_runs SET wake_at = ?, updated_at = ? WHERE run_id = ?",
                    (now, now, run_id),
                )
                self._notify(tx, run_id)

        self._tx(write, write=True)
        return Input(input_id, run_id, name, payload, utc(now))  # type: ignore[arg-type]

    def inputs(self, run_id: str, *, pending: bool = True) -> dict[str, Input]:
        sql = (
            "SELECT id, name, payload, hash, created_at, consumed_by FROM pitstop_inputs "
            "WHERE run_id = ?"
        )
        if pending:
            sql += " AND consumed_by IS NULL"
        rows = self._tx(lambda tx: tx.all(sql + " ORDER BY id", (run_id,)))
        out: dict[str, Input] = {}
        for input_id, name, payload, h, created, consumed in rows:
            value = self._codec.decode_value(
                bytes(payload), bytes(h), run_id=run_id, field=f"input:{name}"
            )
            out[name] = Input(input_id, run_id, name, value, utc(created), consumed)  # type: ignore[arg-type]
        return out

    def get_effect(self, run_id: str, key: str) -> tuple[bool, Any]:
        row = self._tx(
            lambda tx: tx.one(
                "SELECT result, hash FROM pitstop_effects WHERE run_id = ? AND key = ?",
                (run_id, key),
            )
        )
        if row is None:
            return False, None
        return True, self._codec.decode_value(
            bytes(row[0]), bytes(row[1]), run_id=run_id, field=f"effect:{key}"
        )

    def record_effect(
        self, run_id: str, key: str, result: Any, *, checkpoint_id: str | None = None
    ) -> Any:
        blob = self._codec.encode_value(result, run_id=run_id, path=f"effect[{key!r}]")

        def write(tx: Tx) -> Any:
            inserted = tx.run(
                "INSERT INTO pitstop_effects (run_id, key, checkpoint_id, result, hash, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, key) DO NOTHING",
                (run_id, key, checkpoint_id, blob.data, blob.hash, time.time()),
            ).rowcount
            if inserted:
                return None
            return tx.one(
                "SELECT result, hash FROM pitstop_effects WHERE run_id = ? AND key = ?",
                (run_id, key),
            )

        existing = self._tx(write, write=True)
        if existing is None:
            return result
        return self._codec.decode_value(
            bytes(existing[0]), bytes(existing[1]), run_id=run_id, field=f"effect:{key}"
        )

    def record_effects(
        self,
        run_id: str,
        results: Mapping[str, Any],
        *,
        checkpoint_id: str | None = None,
        replace: bool = False,
    ) -> None:
        blobs = {
            key: self._codec.encode_value(value, run_id=run_id, path=f"effect[{key!r}]")
            for key, value in results.items()
        }
        conflict = (
            "DO UPDATE SET checkpoint_id = excluded.checkpoint_id, result = excluded.result, "
            "hash = excluded.hash, created_at = excluded.created_at"
            if replace
            else "DO NOTHING"
        )
        now = time.time()
        rows = [(run_id, k, checkpoint_id, b.data, b.hash, now) for k, b in blobs.items()]
        if not rows:
            return
        insert = (
            "INSERT INTO pitstop_effects (run_id, key, checkpoint_id, result, hash, created_at) "
            "VALUES {values} " + f"ON CONFLICT (run_id, key) {conflict}"
        )
        if len(rows) <= _CHUNK // 6:
            # One statement, atomic by itself: no BEGIN/COMMIT round trips.
            values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(rows))
            self._write_alone(insert.format(values=values), [p for row in rows for p in row])
            return
        self._tx(
            lambda tx: tx.many(insert.format(values="(?, ?, ?, ?, ?, ?)"), rows), write=True
        )

    def effects(self, run_id: str, *, checkpoint_id: str | None = None) -> dict[str, Any]:
        sql = "SELECT key, result, hash FROM pitstop_effects WHERE run_id = ?"
        params: list[Any] = [run_id]
        if checkpoint_id is not None:
            sql += " AND checkpoint_id = ?"
            params.append(checkpoint_id)
        # Sorted here, not with ORDER BY key: that makes SQLite walk all of the run's records
        # in key order (its primary key) instead of using the checkpoint index, which costs
        # O(effects of the run) per call; and Python's order is the same on every backend.
        rows = sorted(self._tx(lambda tx: tx.all(sql, params)), key=lambda r: str(r[0]))
        return {
            key: self._codec.decode_value(
                bytes(data), bytes(h), run_id=run_id, field=f"effect:{key}"
            )
            for key, data, h in rows
        }

    # -- records for export/import and tools --------------------------------------------------

    def export_run(self, run_id: str) -> RunExport:
        columns = (
            "run_id, workflow, status, created_at, updated_at, metadata, head_id, step, "
            "waiting_for, wake_at, checkpoints, bytes, priority"
        )

        def read(tx: Tx) -> RunExport:
            row = tx.one(f"SELECT {columns} FROM pitstop_runs WHERE run_id = ?", (run_id,))
            if row is None:
                raise RunNotFoundError(run_id)
            data = RunExport(RunRecord(*row))
            data.checkpoints = [
                _row_to_record(r)
                for r in tx.all(
                    f"SELECT {_CKPT} FROM pitstop_checkpoints WHERE run_id = ? ORDER BY id",
                    (run_id,),
                )
            ]
            data.blobs = self._read_values(tx, data.referenced)
            data.inputs = [
                InputRecord(i, r, n, bytes(p), bytes(h), c, used)
                for i, r, n, p, h, c, used in tx.all(
                    "SELECT id, run_id, name, payload, hash, created_at, consumed_by "
                    "FROM pitstop_inputs WHERE run_id = ? ORDER BY id",
                    (run_id,),
                )
            ]
            data.effects = [
                EffectRecord(r, k, c, bytes(d), bytes(h), t)
                for r, k, c, d, h, t in tx.all(
                    "SELECT run_id, key, checkpoint_id, result, hash, created_at "
                    "FROM pitstop_effects WHERE run_id = ? ORDER BY key",
                    (run_id,),
                )
            ]
            return data

        # One read transaction: a snapshot, so a concurrent prune cannot tear the export.
        return self._tx(read)

    def import_run(self, data: RunExport, *, progress: Progress | None = None) -> Run:
        data.verify()
        run = data.run
        _check_id("run_id", run.run_id)
        hashes = data.referenced
        total = len(hashes) + len(data.checkpoints)

        def write(tx: Tx) -> None:
            if tx.one("SELECT 1 FROM pitstop_runs WHERE run_id = ?", (run.run_id,)):
                raise RunExistsError(run.run_id)
            for kind, table, ids in (
                ("checkpoint", "pitstop_checkpoints", [c.id for c in data.checkpoints]),
                ("input", "pitstop_inputs", [i.id for i in data.inputs]),
            ):
                taken = tx.in_chunks(f"SELECT id, run_id FROM {table} WHERE id IN ({{in}})", ids)
                if taken:
                    raise ConflictError(
                        f"{kind} id {taken[0][0]!r} already exists in this store (run "
                        f"{taken[0][1]!r}); import the run under a new id to copy it",
                        run_id=run.run_id, expected=None, actual=taken[0][0],
                    )
            now = time.time()
            done = 0
            if hashes:
                self._lock_values(tx)
            for i in range(0, len(hashes), _CHUNK):
                part = {h: NewBlob(h, data.blobs[h]) for h in hashes[i : i + _CHUNK]}
                self._externalize(part.values())
                self._insert_blobs(tx, part, now)
                done += len(part)
                if progress:
                    progress(done, total)
            tx.many(
                "INSERT INTO pitstop_blob_refs (run_id, hash) VALUES (?, ?) "
                "ON CONFLICT (run_id, hash) DO NOTHING",
                [(run.run_id, h) for h in hashes],
            )
            for i in range(0, len(data.checkpoints), _CHUNK):
                batch = data.checkpoints[i : i + _CHUNK]
                tx.many(_INSERT_CHECKPOINT, [c.row() for c in batch])
                done += len(batch)
                if progress:
                    progress(done, total)
            tx.run(
                "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, updated_at, "
                "metadata, head_id, step, waiting_for, wake_at, checkpoints, bytes, priority) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run.run_id, run.workflow, RunStatus(run.status).value, run.created_at,
                 run.updated_at, run.metadata, run.head_id, run.step, run.waiting_for,
                 run.wake_at, run.checkpoints, run.bytes, run.priority),
            )
            tx.many(
                "INSERT INTO pitstop_inputs (id, run_id, name, payload, hash, created_at, "
                "consumed_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(i.id, run.run_id, i.name, i.payload, i.hash, i.created_at, i.consumed_by)
                 for i in data.inputs],
            )
            tx.many(
                "INSERT INTO pitstop_effects (run_id, key, checkpoint_id, result, hash, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [(run.run_id, e.key, e.checkpoint_id, e.result, e.hash, e.created_at)
                 for e in data.effects],
            )

        self._tx(write, write=True)
        return self.get_run(run.run_id)

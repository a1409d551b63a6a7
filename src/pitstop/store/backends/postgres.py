"""PostgreSQL: the shared store for many processes on many machines (psycopg 3 + psycopg_pool).

Everything the store does is the shared SQL of :class:`~pitstop.store.engine.sql.SqlStore`; this
backend only supplies connections, the dialect and the few PostgreSQL-specific decisions:

* **Connections.** A ``psycopg_pool`` pool per store. Every pooled connection is set up once
  (``search_path`` to the store's schema, ``statement_timeout``, durability) by the pool's
  ``configure`` callback, so nothing of that is paid per transaction, and no health-check
  query is run per transaction either: a connection found dead on use is replaced by the pool
  and the transaction retried (below). A connection given back is kept by the store for its
  next statement rather than returned to the pool (a step's save is one statement, and the
  pool's checkout and return cost a tenth of a step's client CPU), for a second at most and
  only while the pool has another connection to give: any thread of the store takes it, none
  waits for it.
* **Round trips.** Transactions are pipelined (libpq pipeline mode): statements are sent
  without waiting for each other, and the client waits only where it reads a result. A save
  is three round trips however many statements it runs: ``BEGIN`` with the conditional
  ``UPDATE`` that moves the run's head; all its inserts, confirmed by a Sync; ``COMMIT``.
* **Isolation.** Writes run in READ COMMITTED and serialise on the run's row (the head
  ``UPDATE``, or ``SELECT ... FOR UPDATE``), like SQLite's single writer but per run. Reads
  run in REPEATABLE READ READ ONLY so a read of several statements (a checkpoint and then its
  values) sees one snapshot, as on SQLite: a prune committing in between can never make an
  intact checkpoint look corrupt.
* **Retries.** Serialisation failures, deadlocks, lock timeouts and the one unique-key race
  that is an expected outcome of concurrency (two first saves of one run both inserting its
  ``pitstop_runs`` row) retry the whole transaction. So does a lost connection, but only when
  the transaction cannot have committed: several writes (``save`` following the head,
  ``create_run``, ``send``, ``claim``, ``delete_run``) are neither idempotent nor safely
  conditional, so replaying one whose COMMIT may have reached the server could write twice or
  report a failure for a write that happened. A connection lost *during* COMMIT of a write
  therefore raises :class:`~pitstop.StoreError` saying the outcome is unknown.
* **Durability.** ``normal`` (the default, as for SQLite): ``synchronous_commit = off``, so a
  save does not wait for the server's WAL flush; a committed checkpoint survives any crash of
  the client, and a crash of the server (or its machine) loses at most its last fraction of a
  second of commits, never tearing one. ``full``: the server's own setting (normally ``on``): a save
  returns once its commit is on the server's disk. ``durability=`` of one save overrides it.
* **Unreachable server.** Opening, or waiting for a connection, gives up after
  ``connect_timeout`` with a one-line :class:`~pitstop.StoreError` naming the server (password
  redacted); established connections use TCP keepalives so a vanished server is noticed,
  and a connection on which nothing moves for ``statement_timeout + connect_timeout`` (a
  network that stopped forwarding without closing) is dropped as lost
  (pitstop.store.backends.pgconn).
* **Large values.** Every byte of a transaction is sent before its pipeline syncs
  (:func:`~pitstop.store.backends.pgconn.flush_all`): psycopg's own sync may keep a large
  value's tail in libpq's buffer while it waits for the server, which waits for that tail.
* **Garbage collection.** Unlike SQLite, saves run concurrently with prune/delete here; the
  ``_lock_values``/``_lock_gc`` advisory locks (see there) keep a value from being deleted
  while a concurrent save starts referencing it.

URL: ``postgresql://user:password@host:port/db?schema=name&pool_max=10``. Query options read
(and removed before connecting) by pitstop: ``schema``, ``pool_min``, ``pool_max``,
``statement_timeout`` and ``connect_timeout`` (seconds), ``application_name``,
``durability``, ``busy_timeout``, ``compress_threshold``; every other query parameter goes
to libpq.

Where the code is: this module holds :class:`PostgresStore` and what it runs on its
connections: transactions, the statements it autocommits, the one-statement save, which
errors it retries, the schema's and the garbage collector's locks, waking workers and
maintenance. Where the connections come from (its options, the pool, the connections kept
between statements, a new pool after ``fork()``) is one of its parts, ``PooledConnections``
in ``pgpool.py``. Beside them: ``pgconn.py`` (connections that never wait forever, the
pipeline's cursor), ``pgurl.py`` (the URL's options), ``pgcheck.py`` (index checks),
``pgindexes.py`` (rebuilding sparse indexes), and ``vacuum.py`` (vacuuming, for both
backends).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from pitstop.errors import ConflictError, StoreError
from pitstop.model import Checkpoint, RunStatus
from pitstop.process import current_pid
from pitstop.serde import Serializer
from pitstop.store.backends.pgcheck import index_problems
from pitstop.store.backends.pgconn import GuardedConnection, PipelinedCursor
from pitstop.store.backends.pgindexes import IndexUpkeep, rebuild_sparse_indexes
from pitstop.store.backends.pgpool import Pool, PooledConnections
from pitstop.store.backends.pgurl import split_url
from pitstop.store.contract.base import UNSET, Durability, Unset
from pitstop.store.contract.options import check as check_options
from pitstop.store.contract.save import SaveRequest
from pitstop.store.contract.urls import redact
from pitstop.store.encoding.blobs import BlobStore
from pitstop.store.encoding.records import is_chunk_key
from pitstop.store.engine.backend import Dialect, Tx
from pitstop.store.engine.effects import EffectRow
from pitstop.store.engine.schema import CHECKPOINTS, UNATTACHED_COLUMNS
from pitstop.store.engine.sql import SqlStore
from pitstop.store.engine.write import WritePlan, head_update
from pitstop.store.transfer.runs import RunTransfer

if TYPE_CHECKING:
    from pitstop.store.encoding.sealed import Encryption

# The one-statement saves' texts, each kept as one object: psycopg reuses what a cursor
# learned of the parameters' types (its dumpers) only for the very query object it ran
# last, and a text built anew each step is another object (~16,000 instructions of a
# step's ~390,000 went to looking the dumpers up again). A few shapes are common; the
# bound is for the rest.
_STATEMENTS: dict[str, str] = {}
_STATEMENTS_MAX = 256

# Values up to this size travel inside the one-statement save; bigger ones take the shared
# path, which first asks whether the store already has them.
_ONE_STATEMENT_MAX = 64 * 1024


class PostgresDialect(Dialect):
    def json_equals(self, column: str, key: str, value: Any) -> tuple[str, list[Any]]:
        """Compare as ``jsonb``: ``None`` matches a present JSON null (not a missing key), like
        SQLite's ``json_type = 'null'``; numbers compare numerically (``2 == 2.0``); dicts
        and lists compare by value. The key and value travel as parameters."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"unsupported metadata key {key!r}")
        try:
            encoded = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metadata filter {key!r}: value is not JSON ({exc})") from None
        return f"({column}::jsonb -> ?::text) = ?::jsonb", [key, encoded]


POSTGRES = PostgresDialect(
    name="postgresql",
    blob="BYTEA",
    real="DOUBLE PRECISION",
    bigint="BIGINT",
    placeholder="%s",
    lock_row=" FOR UPDATE",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    bounded_lock_wait="SET LOCAL lock_timeout = '5s'",
    table_sample=" TABLESAMPLE SYSTEM (?)",
    index_ranges="SET LOCAL enable_bitmapscan TO off",
    table_size="SELECT reltuples, relpages, pg_relation_size(oid) / "
               "current_setting('block_size')::bigint FROM pg_class WHERE oid = ?::regclass",
    array_in=True,
)

# The only unique violation that is an expected race rather than a bug: two first saves of
# one run both inserting its row. The loser retries and then sees the winner's head.
_RUNS_PKEY = "pitstop_runs_pkey"
_CHECKPOINT_ID_KEY = "pitstop_checkpoints_id"
_CHECKPOINT_PKEY = "pitstop_checkpoints_pkey"
_REBUILT_SUFFIX = re.compile(r"_cc(new|old)[0-9]*$")

_INSERT_EFFECT_ARRAYS = {
    replace: "INSERT INTO pitstop_effects (run_id, key, checkpoint_id, result, hash, created_at) "
    "SELECT %s::text, e.key, %s::text, e.result, e.hash, %s::float8 "
    "FROM unnest(%b::text[], %b::bytea[], %b::bytea[]) AS e(key, result, hash) "
    "ON CONFLICT (run_id, key) " + conflict
    for replace, conflict in ((False, "DO NOTHING"), (True, "DO UPDATE SET checkpoint_id = "
        "excluded.checkpoint_id, result = excluded.result, hash = excluded.hash, "
        "created_at = excluded.created_at"))
}
"""Effect rows as column arrays (``Effects._write_effect_rows``), by ``replace``."""

_RETRY_ALWAYS = (
    pgerrors.SerializationFailure,
    pgerrors.DeadlockDetected,
    pgerrors.LockNotAvailable,
)

_IDLE = psycopg.pq.TransactionStatus.IDLE

# The last part of the one-statement save: the checkpoint row, inserted only if the head moved.
_INSERT_CHECKPOINT_IF_MOVED = (
    f" INSERT INTO pitstop_checkpoints ({CHECKPOINTS.column_list()}) "
    f"SELECT {', '.join(['%s'] * len(CHECKPOINTS.columns))} FROM moved"
)
_INSERT_UNATTACHED_IF_MOVED = (
    f" INSERT INTO pitstop_checkpoints ({', '.join(UNATTACHED_COLUMNS)}) "
    f"SELECT {', '.join(['%s'] * len(UNATTACHED_COLUMNS))} FROM moved"
)



def _advisory_key(purpose: str, schema: str) -> int:
    """A fixed signed 64-bit advisory-lock key for ``purpose`` in ``schema``.

    Advisory locks are per database, so the schema is part of the key: stores in different
    schemas of one database never wait for each other.
    """
    digest = hashlib.blake2b(f"pitstop-{purpose}\0{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _Disconnected(StoreError):
    """The connection died before the transaction could commit: safe to run it again."""


class PostgresStore(PooledConnections, SqlStore, RunTransfer):
    """A store in a PostgreSQL database (one schema of it), shared by any number of processes.

    Options given as keywords override the same options in the URL; ``None`` means "as in
    the URL, else the default". Defaults: ``pool_min=1``, ``pool_max=10``,
    ``statement_timeout=30.0`` seconds (0 disables it), ``connect_timeout=10.0`` seconds,
    ``schema``: the connection's current schema (normally ``public``),
    ``application_name="pitstop"``.
    """

    dialect = POSTGRES
    rewrites_in_place = False  # an UPDATE leaves a dead row version behind until a vacuum
    step_saves = True  # planned by store.steps, sent as the one statement below (save_step)

    def __init__(
        self,
        url: str,
        *,
        serializer: Serializer | None = None,
        compress_threshold: int | Unset | None = UNSET,
        durability: Durability | None = None,
        busy_timeout: float | None = None,
        auto_migrate: bool = True,
        pool_min: int | None = None,
        pool_max: int | None = None,
        statement_timeout: float | None = None,
        connect_timeout: float | None = None,
        schema: str | None = None,
        application_name: str | None = None,
        blobs: BlobStore | str | None = None,
        blob_threshold: int | None = None,
        chunk_hash: str | None = None,
        encryption: Encryption | str | None = None,
    ) -> None:
        safe_url = redact(url)
        conninfo, options = split_url(url, safe_url)
        given = {
            "pool_min": pool_min,
            "pool_max": pool_max,
            "statement_timeout": statement_timeout,
            "connect_timeout": connect_timeout,
            "schema": schema,
            "application_name": application_name,
            "busy_timeout": busy_timeout,
            "durability": durability,
            "blobs": blobs,
            "blob_threshold": blob_threshold,
            "chunk_hash": chunk_hash,
            "encryption": encryption,
        }
        options.update({k: v for k, v in given.items() if v is not None})
        if compress_threshold is not UNSET:
            options["compress_threshold"] = compress_threshold
        check_options(safe_url, options)
        super().__init__(
            safe_url,
            serializer=serializer,
            compress_threshold=options.get("compress_threshold", 4096),
            blobs=options.get("blobs"),
            blob_threshold=int(options.get("blob_threshold", 1 << 20)),
            chunk_hash=str(options.get("chunk_hash", "xxh3")),
            encryption=options.get("encryption"),
        )
        self.durability: Durability = options.get("durability", "normal")

        self.busy_timeout = float(options.get("busy_timeout", 60.0))
        self._set_up_connections(conninfo, safe_url, options)

        # One direct connection first: it fails fast with libpq's own reason (refused, bad
        # password, no such database) where a pool would only time out, and it resolves the
        # schema name and its quoting.
        self.schema, self._schema_sql = self._resolve_schema(options.get("schema"))
        self._schema_table = f"{self._schema_sql}.pitstop_schema"
        self._migrate_key = _advisory_key("migrate", self.schema)
        self._gc_key = _advisory_key("gc", self.schema)
        self._reindex_key = _advisory_key("reindex", self.schema)
        self._index_upkeep = IndexUpkeep(self._rebuild_sparse_indexes)
        self._channel = f"pitstop_{_advisory_key('work', self.schema) & (1 << 64) - 1:016x}"
        self._listening = threading.Lock()
        self._listen_conn: psycopg.Connection[Any] | None = None
        self._listen_pid = 0
        self._pool = self._open_pool()
        try:
            self._ensure_schema(auto_migrate)
        except BaseException:
            self.close()
            raise

    # -- transactions ------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, write: bool, durability: Durability | None = None) -> Iterator[Tx]:
        """One transaction on a pooled connection, pipelined to save round trips.

        Statements go out without waiting for each other's results; the client waits only
        where SqlStore reads a result (a row count, existence probes, queries). The
        connection is in autocommit mode and BEGIN/COMMIT are plain pipelined statements, so
        a save costs three round trips: BEGIN with the head UPDATE; every other write,
        confirmed by a Sync before COMMIT is even sent; COMMIT. A failure before that last
        step is therefore known not to have committed, and is safe to retry.
        """
        pool = self._live_pool()
        conn = self._getconn(pool)
        committing = False
        try:
            with conn.pipeline() as pipeline:
                cur = PipelinedCursor(conn, pipeline, self._stall_timeout)
                # Reads see one snapshot across their statements; writes lock rows instead.
                cur.execute("BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                if write and self._idle_limit is not None:
                    cur.execute(self._idle_limit)
                if write and durability is not None and durability != self.durability:
                    # This commit only; DEFAULT is the server's own setting (full).
                    cur.execute(
                        "SET LOCAL synchronous_commit TO "
                        + ("off" if durability == "normal" else "DEFAULT")
                    )
                try:
                    yield Tx(cur, POSTGRES)
                    if write:
                        cur.sync()
                except BaseException as exc:
                    # Never hide the error that got us here behind one from the cleanup.
                    if isinstance(exc, psycopg.Error) and not conn.closed:
                        with suppress(psycopg.Error):
                            cur.sync()  # collect what the error left behind, quietly
                    if not conn.closed:
                        with suppress(psycopg.Error):
                            cur.execute("ROLLBACK")
                    raise
                committing = write
                cur.execute("COMMIT")
        except Exception as exc:
            if not conn.closed:
                raise
            self._check_pool(pool)  # the server may have restarted: drop dead idle ones too
            if committing:
                raise StoreError(
                    f"{self.url}: the connection to {self._target} was lost while "
                    "committing; the write may or may not have been applied "
                    f"({self._clean(exc)})"
                ) from exc
            raise _Disconnected(
                f"{self.url}: connection to {self._target} lost ({self._clean(exc)})"
            ) from exc
        finally:
            if not conn.closed and conn.info.transaction_status != _IDLE:
                with suppress(psycopg.Error):  # a failure left the transaction open: end it
                    conn.execute("ROLLBACK")
            self._putconn(pool, conn)

    # -- the one-statement save -------------------------------------------------------------------

    def _write_prepared(self, plan: WritePlan, state: Mapping[str, Any]) -> Checkpoint:
        """A save in one statement and one round trip when it is the common case: a step
        continuing a run, with new values or none. Data-modifying CTEs move the head (under
        the same conditions as every backend's conditional UPDATE), insert the new values and
        their references, and insert the checkpoint only if the head moved; in autocommit
        mode the statement is its own transaction. Anything else — a run's first save, a
        refusal to explain, a fork's shared values, consumed inputs, a per-save durability,
        a caller-chosen id, a value large enough to probe for first — takes the shared path.
        """
        if not self._one_statement(plan):
            return super()._write_prepared(plan, state)
        record = plan.record
        # Views of arrays joined to their header once: the statement sends whole bytes.
        blobs = [b if b.body is None else b._replace(data=b.stored, body=None)
                 for b in plan.new.values()] if plan.new else []
        head_sql, params = head_update(plan, POSTGRES.null_safe_eq)
        chunks = [b for b in blobs if is_chunk_key(b.hash)] if blobs else []
        if chunks and plan.refs:
            # A new chunk whose key a stored chunk with other bytes has (a crafted xxh3
            # collision) leaves the head where it is: the shared path then says why. A
            # stored one not comparable here (a prefix, a blob-store file) goes there too.
            head_sql += " AND NOT EXISTS (SELECT 1 FROM clash)"
        # Arrays of bytea go as %b, in binary: as text psycopg escapes every element in Python
        # (a late save of a 2,000-turn conversation: ~50 us of its ~0.3 ms client side).
        parts = ["moved AS (" + POSTGRES.for_driver(head_sql) + " RETURNING run_id)"]
        if plan.refs:
            # The GC lock (see _lock_values) is taken when `gc` is first read, before any
            # value is inserted.
            if chunks:
                parts.insert(
                    0,
                    "clash AS (SELECT 1 FROM unnest(%b::bytea[], %b::bytea[]) AS c(hash, data) "
                    "JOIN pitstop_blobs b ON b.hash = c.hash WHERE b.alias IS NOT NULL "
                    "OR b.location IS NOT NULL OR b.data <> c.data)",
                )
                params[:0] = [[b.hash for b in chunks], [b.data for b in chunks]]
            parts.insert(0, "gc AS (SELECT pg_advisory_xact_lock_shared(%s) AS locked)")
            params.insert(0, self._gc_key)
            # The run owns the rows inserted here; a key stored already (found by ON
            # CONFLICT, after waiting for a concurrent insert of it to commit) gets a
            # reference row instead, even one the run owns: whether it still does, this
            # statement's snapshot (taken before the GC lock) cannot say.
            parts.append(
                "vals AS (INSERT INTO pitstop_blobs (hash, data, size, created_at, run_id) "
                "SELECT v.hash, v.data, v.size, %s, moved.run_id FROM gc, moved, "
                "unnest(%b::bytea[], %b::bytea[], %s::bigint[]) AS v(hash, data, size) "
                "ON CONFLICT (hash) DO NOTHING RETURNING hash)"
            )
            params += [
                record.created_at,
                [b.hash for b in blobs],
                [b.data for b in blobs],
                [b.size for b in blobs],
            ]
            parts.append(
                "refs AS (INSERT INTO pitstop_blob_refs (run_id, hash) "
                "SELECT moved.run_id, r.hash FROM gc, moved, unnest(%b::bytea[]) AS r(hash) "
                "WHERE r.hash NOT IN (SELECT hash FROM vals) "
                "ON CONFLICT (run_id, hash) DO NOTHING)"
            )
            params.append(plan.refs)
        if plan.aliases and plan.refs:
            # Superseded open chunks become prefixes of the chunks extending them (see
            # SqlStore._make_aliases), only if the head moved, and (joined with `gc`) only
            # under the GC lock: a prune deleting values must not hold rows this updates.
            keys = [a.key for a in plan.aliases]
            targets = [a.target for a in plan.aliases]
            parts.append(
                "follow AS (UPDATE pitstop_blobs b SET alias = t.target FROM gc, moved, "
                "unnest(%b::bytea[], %b::bytea[]) AS t(key, target) WHERE b.alias = t.key)"
            )
            params += [keys, targets]
            parts.append(
                "aliased AS (UPDATE pitstop_blobs b SET data = '', alias = t.target "
                "FROM gc, moved, "
                "unnest(%b::bytea[], %b::bytea[], %s::bigint[]) AS t(key, target, size) "
                "WHERE b.hash = t.key AND b.alias IS NULL AND b.location IS NULL "
                "AND b.size = t.size)"
            )
            params += [keys, targets, [a.size for a in plan.aliases]]
        if plan.effects:
            # Records that commit with the checkpoint (Store.save's `effects`), only if the
            # head moved; all of one save share its time.
            parts.append(
                "efx AS (INSERT INTO pitstop_effects (run_id, key, checkpoint_id, result, hash, "
                "created_at) SELECT moved.run_id, e.key, e.checkpoint_id, e.result, e.hash, %s "
                "FROM moved, unnest(%s::text[], %s::text[], %b::bytea[], %b::bytea[]) "
                "AS e(key, checkpoint_id, result, hash) ON CONFLICT (run_id, key) DO NOTHING)"
            )
            params += [
                record.created_at,
                [row.key for row in plan.effects],
                [row.checkpoint_id for row in plan.effects],
                [row.result for row in plan.effects],
                [row.hash for row in plan.effects],
            ]
        for n, attachment in enumerate(plan.attach):
            # Records appended to an earlier checkpoint's row (Store.save's `attach`) if the
            # head moved; effect records naming it if that row is not there.
            parts.append(
                f"att{n} AS (UPDATE pitstop_checkpoints c "
                "SET writes = COALESCE(c.writes || %s, %s) FROM moved "
                "WHERE c.run_id = moved.run_id AND c.id = %s RETURNING 1)"
            )
            rows = attachment.rows
            if len(rows) == 1:
                # One record (a LangGraph task's writes, every step): one row of scalars, not
                # three one-item arrays, which psycopg dumps in Python (~700 opcodes).
                source = "(VALUES (%s::text, %b::bytea, %b::bytea))"
                values: list[Any] = [rows[0].key, rows[0].result, rows[0].hash]
            else:
                source = "unnest(%s::text[], %b::bytea[], %b::bytea[])"
                values = [[row.key for row in rows], [row.result for row in rows],
                          [row.hash for row in rows]]
            parts.append(
                f"attx{n} AS (INSERT INTO pitstop_effects (run_id, key, checkpoint_id, result, "
                "hash, created_at) SELECT moved.run_id, e.key, %s, e.result, e.hash, %s "
                f"FROM moved, {source} AS e(key, result, hash) "
                f"WHERE NOT EXISTS (SELECT 1 FROM att{n}) ON CONFLICT (run_id, key) DO NOTHING)"
            )
            params += [
                attachment.frames,
                attachment.frames,
                attachment.checkpoint_id,
                attachment.checkpoint_id,
                record.created_at,
                *values,
            ]
        if record.writes is None:  # (see UNATTACHED_COLUMNS)
            statement = "WITH " + ", ".join(parts) + _INSERT_UNATTACHED_IF_MOVED
            params += record.row()[:-1]
        else:
            statement = "WITH " + ", ".join(parts) + _INSERT_CHECKPOINT_IF_MOVED
            params += record.row()
        if len(_STATEMENTS) < _STATEMENTS_MAX:
            statement = _STATEMENTS.setdefault(statement, statement)
        try:
            moved = bool(self._execute_autocommit(statement, params))
        except _Disconnected:
            # Lost with the statement in flight: it committed or it did not. A retry cannot
            # write it twice: the checkpoint's id is unique, and a refusal is checked.
            if not self._already_written(plan):
                try:
                    return super()._write_prepared(plan, state)
                except ConflictError:
                    if not self._already_written(plan):
                        raise
            moved = True
        except StoreError as exc:
            if self._duplicate_checkpoint(exc):
                raise self._id_taken(plan) from None
            raise
        if not moved:
            # The shared path explains why it matched nothing (or creates the run).
            return super()._write_prepared(plan, state)
        self._heads.put(record.run_id, record.id)
        return record.checkpoint(dict(state))

    def save_step(self, request: SaveRequest) -> bool:
        """A loop step planned without the value codec (:mod:`pitstop.store.engine.steps`)
        and sent as the one statement of :meth:`_write_prepared` (which hands anything else
        to the shared writer): the shared path's planning cost a LangGraph step ~280 Python
        opcodes more (see docs/benchmarks.md, "LangGraph savers")."""
        plan = self._prepare_step(request)
        if plan is None:
            return False
        # No state: the Checkpoint _write_prepared returns is not used here.
        self._write_prepared(plan, {})
        return True

    def _already_written(self, plan: WritePlan) -> bool:
        checksum = self._tx(
            lambda tx: tx.scalar(
                "SELECT checksum FROM pitstop_checkpoints WHERE id = ?", (plan.record.id,)
            )
        )
        return checksum is not None and checksum == plan.record.checksum

    def _one_statement(self, plan: WritePlan) -> bool:
        follows_and_expects_another = plan.follow_head and plan.expected_head not in (
            UNSET,
            plan.record.parent_id,
        )
        return (
            not follows_and_expects_another
            and plan.new_run is None
            and not plan.consumed
            and plan.deliver_to is None
            and plan.status is not RunStatus.QUEUED
            and not plan.wake_check
            and plan.durability in (None, self.durability)
            and (not plan.refs or all(h in plan.new for h in plan.refs))
            and (not plan.aliases or bool(plan.refs))
            and (not plan.new or all(
                b.size <= _ONE_STATEMENT_MAX and not self._external(b) for b in plan.new.values()
            ))
        )

    def _autocommit_write(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Autocommitted: one round trip, no BEGIN/COMMIT. A connection lost meanwhile is
        retried; what the lost statement may have leased is taken back when its lease expires.
        """
        statement = POSTGRES.for_driver(sql)
        return self._retrying(lambda: self._execute_autocommit(statement, params, rows=True))

    def _write_effect_rows(self, rows: Sequence[EffectRow], *, replace: bool) -> None:
        """One autocommitted statement of constant text whatever the row count: the rows go
        as arrays (psycopg re-parses a multi-row INSERT's text every time, ~4 ms for
        ``ctx.map``'s batch of 100 rows), in binary (as text, each key is scanned for quoting).
        Retried if the connection is lost: it inserts once."""
        first = rows[0]  # the run, checkpoint and time the rows share
        params = (first.run_id, first.checkpoint_id, first.created_at, [r.key for r in rows],
                  [r.result for r in rows], [r.hash for r in rows])
        statement = _INSERT_EFFECT_ARRAYS[replace]
        self._retrying(lambda: self._execute_autocommit(statement, params))

    def _claim_write(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """The claim, planned without bitmap scans, in one round trip (pipelined: the SET
        LOCAL and the statement share the implicit transaction that ends at the Sync).

        Without statistics (a burst of enqueues before autovacuum analyzes the table) the
        planner guesses a handful of runnable rows and reads all of them through a bitmap
        scan, then sorts them: 40 ms at 30,000 queued runs, growing with the queue. The
        index-ordered scan of pitstop_runs_runnable stops at the first runs it can lease
        (0.2 ms, flat); with bitmap scans off it is the plan whatever the statistics say."""
        statement = POSTGRES.for_driver(sql)

        def claim() -> list[Any]:
            pool = self._live_pool()
            conn = self._getconn(pool)
            try:
                with conn.pipeline() as pipeline:
                    conn.execute("SET LOCAL enable_bitmapscan TO off")
                    cur = conn.execute(statement, params)
                    # The Sync goes out with the statement, so the server commits the claim
                    # without waiting for this client to read the answer. Without it, a
                    # host that stopped hearing the server (a one-way partition) left the
                    # claim's transaction open on the server, its runs locked and skipped
                    # by every other worker's SKIP LOCKED for as long as the partition
                    # lasted; committed, they are this owner's until the lease expires.
                    pipeline.sync()
                    return cur.fetchall()
            except psycopg.Error as exc:
                raise self._statement_error(pool, conn, exc) from exc
            finally:
                self._putconn(pool, conn)

        return self._retrying(claim)

    def _autocommit_read(self, sql: str, params: Sequence[Any]) -> Any:
        """Autocommitted, one round trip (a lone statement sees one snapshot anyway)."""
        statement = POSTGRES.for_driver(sql)
        rows = self._retrying(lambda: self._execute_autocommit(statement, params, rows=True))
        return rows[0] if rows else None

    def _execute_autocommit(
        self, statement: str, params: Sequence[Any], *, rows: bool = False
    ) -> Any:
        """Run one autocommitted statement (already in psycopg's placeholder style): its rows
        with ``rows``, else its row count. :class:`_Disconnected` if the connection was lost:
        the statement may or may not have committed."""
        pool = self._live_pool()
        conn = self._getconn(pool)
        try:
            if not rows:
                return conn.counting_cursor().execute(statement, params).rowcount
            # A cursor of its own: the rows it fetched go with it, not kept by the pool.
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise self._statement_error(pool, conn, exc) from exc
        finally:
            self._putconn(pool, conn)

    def _statement_error(
        self, pool: Pool, conn: GuardedConnection, exc: psycopg.Error
    ) -> StoreError:
        """What a failed lone statement raises: a StoreError while the connection stands, else
        :class:`_Disconnected` (the statement may or may not have committed), after asking
        the pool to check its other connections."""
        if not conn.closed:
            return StoreError(f"{self.url}: {self._clean(exc)}")
        self._check_pool(pool)
        return _Disconnected(
            f"{self.url}: connection to {self._target} lost ({self._clean(exc)})")

    def _duplicate_checkpoint(self, exc: Exception) -> bool:
        cause = exc if isinstance(exc, pgerrors.UniqueViolation) else exc.__cause__
        if not isinstance(cause, pgerrors.UniqueViolation):
            return False
        # While REINDEX CONCURRENTLY rebuilds one (pgindexes), its copy or the old index
        # bears the name with a suffix and may be the one that reports the duplicate.
        name = _REBUILT_SUFFIX.sub("", cause.diag.constraint_name or "")
        return name in (_CHECKPOINT_ID_KEY, _CHECKPOINT_PKEY)

    def _retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, (*_RETRY_ALWAYS, _Disconnected)):
            return True
        if isinstance(exc, pgerrors.UniqueViolation):
            # Two first saves of one run: the retry sees the winner's row.
            return exc.diag.constraint_name == _RUNS_PKEY
        return False

    def _lock_wait_expired(self, exc: BaseException) -> bool:
        return isinstance(exc, pgerrors.LockNotAvailable)

    def _store_error(self, exc: Exception) -> Exception:
        """A database error left over after the retries, as a one-line StoreError (password
        removed); anything else as it is."""
        if isinstance(exc, psycopg.Error):
            return StoreError(f"{self.url}: {self._clean(exc)}")
        return exc

    # -- schema --------------------------------------------------------------------------------

    def _read_schema_version(self, tx: Tx) -> int:
        if not tx.scalar("SELECT to_regclass(?) IS NOT NULL", (self._schema_table,)):
            return 0
        return int(tx.scalar("SELECT MAX(version) FROM pitstop_schema") or 0)

    def _prepare_migration(self, tx: Tx) -> None:
        """Serialise migrations of this schema (processes opening a new database at once) on
        a transaction-scoped advisory lock, then create the schema if it is missing."""
        tx.run("SELECT pg_advisory_xact_lock(?)", (self._migrate_key,))
        if tx.one("SELECT 1 FROM pg_namespace WHERE nspname = ?", (self.schema,)) is None:
            tx.run(f"CREATE SCHEMA {self._schema_sql}")

    # -- garbage collection ----------------------------------------------------------------------
    #
    # A save that references values (new ones, or existing ones shared with another run) takes
    # the shared lock, after its run's row lock and before inserting values or references; a
    # prune or delete takes the exclusive lock after deciding what to delete and before
    # deleting anything; both hold it until commit. Either order is safe:
    # * save first: the prune waits for the save's commit, then re-checks under its lock
    #   (``_delete_blobs``: delete only values no reference points to, a statement that sees
    #   the committed save in READ COMMITTED) and keeps the value;
    # * prune first: the save waits for the prune's commit, then inserts its new values with
    #   ON CONFLICT DO NOTHING (a value deleted meanwhile is simply inserted again) and checks
    #   that the existing values it reuses without sending (a fork's) are still there.
    # Saves only share the lock with each other, so they never wait for one another on it.

    def _lock_values(self, tx: Tx) -> None:
        tx.run("SELECT pg_advisory_xact_lock_shared(?)", (self._gc_key,))

    def _lock_gc(self, tx: Tx) -> None:
        tx.run("SELECT pg_advisory_xact_lock(?)", (self._gc_key,))

    # -- waking workers --------------------------------------------------------------------------

    def _notify(self, tx: Tx, run_id: str) -> None:
        """Wake workers blocked in :meth:`wait_for_work`, in every process: PostgreSQL
        delivers the notification at commit, and never for a transaction rolled back."""
        tx.run("SELECT pg_notify(?, ?)", (self._channel, run_id))

    def wait_for_work(self, timeout: float) -> bool:
        """Block until some transaction makes a run runnable (NOTIFY) or ``timeout`` passes;
        True if a notification came.

        Listens on a connection of its own, outside the pool: a pooled connection would miss
        notifications while lent out. Without it (server away) this just sleeps, and workers
        fall back to polling, as on SQLite.
        """
        deadline = time.monotonic() + timeout
        if not self._listening.acquire(timeout=max(0.0, timeout)):
            return False  # another thread of this store is listening; it will poll again
        try:
            conn = self._listener()
            remaining = deadline - time.monotonic()
            if remaining > 0:
                for _ in conn.notifies(timeout=remaining, stop_after=1):
                    return True
        except (psycopg.Error, StoreError):
            self._drop_listener()
            time.sleep(max(0.0, deadline - time.monotonic()))
        finally:
            self._listening.release()
        return False

    def _listener(self) -> psycopg.Connection[Any]:
        conn = self._listen_conn
        if conn is None or conn.closed or self._listen_pid != current_pid():
            self._live_pool()  # refuses a closed store
            conn = self._connect()
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._listen_conn, self._listen_pid = conn, current_pid()
        return conn

    def _drop_listener(self) -> None:
        conn, self._listen_conn = self._listen_conn, None
        if conn is not None and self._listen_pid == current_pid():
            with suppress(Exception):
                conn.close()

    # -- maintenance -----------------------------------------------------------------------------

    def _integrity_problems(self, notes: list[str]) -> list[str]:
        # Its own connection, autocommitted (one damaged index must not abort the checks of
        # the others) and without the statement timeout: checking every row of a large
        # table against its index takes as long as reading it.
        try:
            with self._connect() as conn:
                conn.autocommit = True
                conn.execute("SET statement_timeout TO 0")
                return index_problems(conn, self.schema, notes)
        except psycopg.Error as exc:
            raise StoreError(f"{self.url}: index check: {self._clean(exc)}") from exc

    def _file_bytes(self) -> int | None:
        """Disk used by pitstop's tables in this schema, with their indexes and TOAST."""
        return self._tx(
            lambda tx: int(
                tx.scalar(
                    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? "
                    "AND c.relkind = 'r' AND starts_with(c.relname, 'pitstop_')",
                    (self.schema,),
                )
            )
        )

    # -- space -------------------------------------------------------------------------------

    def _give_space_back(self) -> None:
        # VACUUM makes deleted rows' space reusable, but an index page is reused only once
        # empty, and a few long-lived entries keep old pages of a time-ordered index
        # (checkpoint ids) sparse: now and then, rebuild the indexes that grew far above
        # their entries (pgindexes).
        self._index_upkeep.poke()

    def _rebuild_sparse_indexes(self) -> list[str]:
        """Rebuild the indexes far above what their entries need, now (see pgindexes);
        their names. On a connection of its own: REINDEX CONCURRENTLY cannot run in a
        transaction, and may wait for older ones."""
        with psycopg.connect(self._conninfo, **self._connect_kwargs) as conn:
            return rebuild_sparse_indexes(conn, self.schema, self._reindex_key)

    def close(self) -> None:
        self._index_upkeep.closed = True
        self._run_before_close()
        with self._lock:
            pool, self._pool = self._pool, None
            self._closed = True
            kept, self._kept = self._kept, []
        self._drop_listener()
        if pool is not None and self._pid == current_pid():
            for conn in kept:
                pool.putconn(conn)
            pool.close()


__all__ = ["POSTGRES", "PostgresDialect", "PostgresStore"]

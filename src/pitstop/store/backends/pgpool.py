"""Where a PostgreSQL store's connections come from: the options that shape them, the pool, and
the connections the store keeps between statements.

:class:`PooledConnections` is a part of :class:`~pitstop.store.backends.postgres.PostgresStore`
(a mixin over ``SqlBackend``, like the parts of ``SqlStore``), not an object the store holds:
every step's save calls ``_live_pool``, ``_getconn`` and ``_putconn``, and as the store's own
methods they are reached with no lookup of a helper object in between. It holds:

* the options that shape connections (``pool_min``, ``pool_max``, ``statement_timeout``,
  ``connect_timeout``) and what follows from them: the stall timeout, the server-side limit
  on a write transaction left idle, libpq's keyword arguments (:meth:`_set_up_connections`);
* connecting: one direct connection for what needs libpq's own reason for a failure
  (:meth:`_connect`, :meth:`_resolve_schema`), the pool and the set-up each of its
  connections gets once (:meth:`_open_pool`, :meth:`_configure`), a new pool after ``fork()``
  (:meth:`_live_pool`), and one-line errors naming the server with the password removed
  (:meth:`_clean`, :meth:`_cannot_connect`, :meth:`_unavailable`);
* lending: :meth:`_getconn` and :meth:`_putconn`, which keep the connection last given back
  for the next statement rather than return it to the pool, and :meth:`_check_pool` after a
  lost connection.

What runs on these connections stays in ``postgres.py``: the transaction (pipelined
``BEGIN`` ... ``COMMIT``), the lone autocommitted statement and the one-statement save, what
a lost connection means for each, and which errors are retried; the SQLite backend keeps its
``_transaction`` in ``sqlite.py`` in the same way, beside its connection (one per process,
``_connection``: too little to need a module). ``close`` is the store's too: it ends the pool
together with the store's listener and index upkeep. The connection class (its stall guard)
and the pipeline's cursor are in ``pgconn.py``, the URL's options in ``pgurl.py``.
"""

from __future__ import annotations

import math
import re
import threading
import time
from contextlib import suppress
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from pitstop.errors import StoreError, UnsupportedStoreError
from pitstop.process import current_pid
from pitstop.store.backends.pgconn import GuardedConnection
from pitstop.store.backends.pgurl import conninfo_params, describe_target, one_line, tcp_defaults
from pitstop.store.contract.urls import redact
from pitstop.store.engine.backend import SqlBackend

# A connection given back less than this long after it left the pool is kept by the store
# for its next statement (PooledConnections._kept); one out longer goes back to the pool.
_KEEP_SECONDS = 1.0

_IDLE = psycopg.pq.TransactionStatus.IDLE

Pool = ConnectionPool[GuardedConnection]


class PooledConnections(SqlBackend):
    """A PostgreSQL store's pool and the connections it lends (a part of ``PostgresStore``)."""

    schema: str
    """The schema the store's tables are in (set by the store, from :meth:`_resolve_schema`)."""

    def _set_up_connections(self, conninfo: str, safe_url: str, options: dict[str, Any]) -> None:
        """Read the connection options and get ready to connect (nothing is opened yet)."""
        self.pool_min = int(options.get("pool_min", 1))
        self.pool_max = int(options.get("pool_max", 10))
        self.statement_timeout = float(options.get("statement_timeout", 30.0))
        self.connect_timeout = float(options.get("connect_timeout", 10.0))
        if self.pool_max < self.pool_min:
            raise UnsupportedStoreError(
                f"{safe_url}: option 'pool_min' must be at most pool_max "
                f"(got pool_min={self.pool_min}, pool_max={self.pool_max})"
            )

        # A pooled connection silent for longer than this is taken for stalled: the server
        # ends any statement (or lock wait) itself after statement_timeout, and the network
        # has had connect_timeout on top to deliver its answer. No statement_timeout: no limit.
        self._stall_timeout: float | None = (
            self.statement_timeout + self.connect_timeout if self.statement_timeout > 0 else None
        )
        # A write transaction left open by a client the server stopped hearing from (a
        # partition after BEGIN and the run row's UPDATE) would keep that row locked for
        # as long as the partition lasts, and other workers could not take the run over
        # after its lease expired: the server ends it after the stall timeout, when this
        # client has given up on it anyway. Only writes: a read may take its time.
        self._idle_limit: str | None = (
            f"SET LOCAL idle_in_transaction_session_timeout = {round(self._stall_timeout * 1000)}"
            if self._stall_timeout is not None else None
        )
        self._conninfo = conninfo
        params = conninfo_params(conninfo, safe_url)
        password = params.get("password")
        self._password = re.compile(rf"(?<!\w){re.escape(password)}(?!\w)") if password else None
        self._target = describe_target(params)
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,  # _transaction sends BEGIN/COMMIT itself, pipelined
            # libpq counts whole seconds and treats anything under 2 as 2.
            "connect_timeout": max(2, math.ceil(self.connect_timeout)),
            "application_name": str(options.get("application_name", "pitstop")),
            **{
                k: v for k, v in tcp_defaults(self.connect_timeout).items() if k not in params
            },
        }
        self._lock = threading.Lock()
        self._pool: Pool | None = None
        self._pid = current_pid()
        self._closed = False
        self._abandoned: list[Pool] = []
        self._in_use = 0
        # Connections out of the pool and in use by no one: the last ones given back, kept
        # for the next statement (a step's save is one statement, and psycopg_pool's
        # checkout and return cost ~28,000 instructions of its ~394,000). Any thread of
        # this store takes them before asking the pool; _putconn keeps one only while the
        # pool has another to give.
        self._kept: list[GuardedConnection] = []

    # -- connections -------------------------------------------------------------------------

    def _clean(self, exc: BaseException) -> str:
        """One line describing ``exc``, with the password removed should it appear."""
        text = one_line(exc)
        if self._password is not None:
            text = self._password.sub("***", text)
        return redact(text)

    def _cannot_connect(self, exc: BaseException) -> StoreError:
        reason = self._clean(exc)
        # libpq prefixes errors the server sent back with FATAL (bad password, no such
        # database, too many clients); anything else never reached a server.
        verdict = "rejected the connection" if "FATAL" in reason else "is unreachable"
        return StoreError(f"{self.url}: PostgreSQL server {self._target} {verdict}: {reason}")

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._conninfo, **self._connect_kwargs)
        except psycopg.Error as exc:
            raise self._cannot_connect(exc) from None

    def _resolve_schema(self, schema: str | None) -> tuple[str, str]:
        with self._connect() as conn:
            try:
                if schema is None:
                    (schema,) = conn.execute("SELECT current_schema()").fetchone() or (None,)
                    if schema is None:
                        raise StoreError(
                            f"{self.url}: no schema to use (search_path names none that "
                            "exists); add ?schema=NAME to the URL"
                        )
                return schema, sql.Identifier(schema).as_string(conn)
            except psycopg.Error as exc:
                raise StoreError(f"{self.url}: {self._clean(exc)}") from exc

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Run once per new pooled connection (never per transaction): the schema, the
        statement timeout and the store's default durability ("full" keeps the server's
        own ``synchronous_commit``, normally ``on``). Pooled connections give up on a
        server silent for longer than :attr:`_stall_timeout` (see pitstop.store.backends.pgconn)."""
        if isinstance(conn, GuardedConnection):
            conn.stall_timeout = self._stall_timeout
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false)",
            (str(round(self.statement_timeout * 1000)),),
        )
        if self.durability == "normal":
            conn.execute("SET synchronous_commit TO off")

    def _open_pool(self) -> Pool:
        pool: Pool = ConnectionPool(
            self._conninfo,
            connection_class=GuardedConnection,
            kwargs=self._connect_kwargs,
            min_size=self.pool_min,
            max_size=self.pool_max,
            configure=self._configure,
            timeout=self.connect_timeout,
            name=f"pitstop:{self.schema}",
            open=False,
        )
        try:
            pool.open(wait=self.pool_min > 0, timeout=self.connect_timeout)
        except PoolTimeout as exc:
            pool.close(timeout=0)
            raise self._unavailable(exc) from None
        return pool

    def _live_pool(self) -> Pool:
        pool = self._pool
        if pool is None or self._closed:
            raise StoreError(f"{self.url}: store is closed")
        if self._pid != current_pid():
            # After fork() the parent's connections must not be used (or closed) here.
            with self._lock:
                if self._pid != current_pid() and self._pool is not None:
                    self._abandoned.append(self._pool)
                    self._kept = []  # the parent's, like its pool
                    self._pool = self._open_pool()
                    self._pid = current_pid()
                pool = self._pool
            if pool is None:
                raise StoreError(f"{self.url}: store is closed")
        return pool

    def _unavailable(self, exc: BaseException) -> StoreError:
        """Why no connection came within ``connect_timeout``: a direct attempt tells."""
        try:
            conn = psycopg.connect(self._conninfo, **{**self._connect_kwargs, "connect_timeout": 2})
        except psycopg.Error as probe:
            return self._cannot_connect(probe)
        conn.close()
        return StoreError(
            f"{self.url}: no connection to PostgreSQL server {self._target} within "
            f"{self.connect_timeout:g}s ({self._clean(exc)})"
        )

    def _getconn(self, pool: Pool) -> GuardedConnection:
        """A pooled connection; waiting up to ``connect_timeout`` for the server, or up to
        ``busy_timeout`` while every connection is simply in use by this store."""
        if self._kept:
            with self._lock:
                if self._kept:
                    self._in_use += 1
                    return self._kept.pop()  # the most recently used: its caches are warm
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                conn = pool.getconn(timeout=self.connect_timeout)
            except PoolTimeout as exc:
                saturated = self._in_use >= self.pool_max
                if saturated and time.monotonic() < deadline:
                    continue
                if saturated:
                    raise StoreError(
                        f"{self.url}: all {self.pool_max} pooled connections stayed busy for "
                        f"{self.busy_timeout:g}s; raise pool_max"
                    ) from None
                raise self._unavailable(exc) from None
            except PoolClosed:
                raise StoreError(f"{self.url}: store is closed") from None
            with self._lock:
                self._in_use += 1
            conn.lent_at = time.monotonic()
            return conn

    def _putconn(self, pool: Pool, conn: GuardedConnection) -> None:
        """Give a connection back: kept by the store for the next statement (see
        ``_kept``) when that can starve no one, else returned to the pool."""
        with self._lock:
            self._in_use -= 1
            if (
                # Back to the pool after _KEEP_SECONDS out of it, so that the pool still
                # retires it once it has lived its max_lifetime; ...
                time.monotonic() - conn.lent_at < _KEEP_SECONDS
                # ... and whenever the pool could be empty without it: a caller already
                # waiting in pool.getconn does not look here.
                and self._in_use + len(self._kept) + 1 < self.pool_max
                and not self._closed
                and not conn.closed
                and conn.pgconn.transaction_status == _IDLE
            ):
                self._kept.append(conn)
                return
        pool.putconn(conn)

    def _check_pool(self, pool: Pool) -> None:
        """After a lost connection (the server may have restarted): the pool drops its dead
        idle connections, the ones kept here included."""
        with self._lock:
            kept, self._kept = self._kept, []
        for conn in kept:
            with suppress(Exception):
                pool.putconn(conn)
        with suppress(Exception):
            pool.check()


__all__ = ["Pool", "PooledConnections"]

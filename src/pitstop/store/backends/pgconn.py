"""psycopg connections that never wait on the server forever, and a pipeline sync that always
delivers what it syncs (:class:`PipelinedCursor`, the cursor of the store's transactions).

Two ways a PostgreSQL call could block for good, both met in practice:

* **A sync that keeps part of the transaction.** ``Pipeline.sync()`` flushes libpq's output
  buffer only as far as the socket takes it without blocking, and then waits for the server's
  reply. A large value (tens of MiB) still partly in that buffer never reaches the server,
  which waits for the rest of it (``ClientRead``) while the client waits for a reply that
  cannot come. :func:`flush_all` sends every byte first, reading whatever the server says
  meanwhile so neither side can block the other.
* **A connection that stops forwarding without closing** (a partition, a stuck middlebox, a
  paused VM). The local kernel keeps acknowledging, so TCP keepalives and
  ``tcp_user_timeout`` never fire, and libpq would wait for the whole outage.
  :class:`GuardedConnection` gives up once no byte has moved either way for its
  ``stall_timeout``, closes the connection, and raises :class:`ConnectionStalled` (an
  ``OperationalError``, so callers treat it as a lost connection: retried when the
  transaction cannot have committed, reported as of unknown outcome when it may have).

The stall timeout is longer than the server's ``statement_timeout``: a statement that is
merely slow (or waiting for a lock) is ended by the server, with an error, before the client
would call it a stall.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Generator
from typing import Any, TypeVar

import psycopg

RV = TypeVar("RV")

# psycopg's generators yield what they wait for and are sent what became ready; a wait that
# timed out (psycopg wakes every ``interval`` seconds) sends 0.
_Gen = Generator[Any, Any, RV]


class ConnectionStalled(psycopg.OperationalError):
    """No byte moved between client and server for the connection's stall timeout."""


class GuardedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait on the server ends after ``stall_timeout``
    seconds without traffic (None: waits as long as psycopg would)."""

    stall_timeout: float | None = None
    lent_at = 0.0  # when the store took it from its pool (time.monotonic())
    _counting_cursor: psycopg.Cursor[Any] | None = None

    def counting_cursor(self) -> psycopg.Cursor[Any]:
        """The connection's cursor for lone statements of which only the row count is read
        (a step's one-statement save), made once: ``Connection.execute`` makes a cursor per
        statement, and a new cursor looks up every parameter's dumper again (the step's
        statement alone: 134,000 instructions a statement, 90,000 on one kept cursor given
        the same query object). It holds no rows between statements, so keeping it keeps no
        memory; the connection is lent to one thread at a time, and so is its cursor."""
        cursor = self._counting_cursor
        if cursor is None:
            cursor = self._counting_cursor = self.cursor()
        return cursor

    def wait(self, gen: _Gen[RV], *args: Any, **kwargs: Any) -> RV:
        limit = self.stall_timeout
        if limit is not None:
            gen = _guarded(gen, self, limit)
        return super().wait(gen, *args, **kwargs)


def _guarded(gen: _Gen[RV], conn: GuardedConnection, limit: float) -> _Gen[RV]:
    """``gen``, failing once nothing has become ready for ``limit`` seconds."""
    quiet_since = time.monotonic()
    try:
        waiting = next(gen)
        while True:
            ready = yield waiting
            if ready:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > limit:
                raise _stalled(conn, limit)
            waiting = gen.send(ready)
    except StopIteration as done:
        result: RV = done.value
        return result


def _stalled(conn: psycopg.Connection[Any], limit: float) -> ConnectionStalled:
    # The protocol was left mid-exchange: the connection can never be used again.
    conn.close()
    return ConnectionStalled(f"no answer from the server for {limit:g}s (connection stalled)")


def flush_all(conn: psycopg.Connection[Any], stall_timeout: float | None) -> None:
    """Send everything libpq holds for the server, reading (and keeping for libpq) what the
    server sends meanwhile; :class:`ConnectionStalled` if nothing moves for
    ``stall_timeout`` seconds."""
    pgconn = conn.pgconn
    if pgconn.flush() == 0:
        return
    quiet_since = time.monotonic()
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while True:
            wait = None if stall_timeout is None else 0.1
            events = 0
            for _, mask in selector.select(wait):
                events |= mask
            if events:
                quiet_since = time.monotonic()
            elif stall_timeout is not None and time.monotonic() - quiet_since > stall_timeout:
                raise _stalled(conn, stall_timeout)
            if events & selectors.EVENT_READ:
                pgconn.consume_input()  # results of earlier statements: libpq keeps them
            if events & selectors.EVENT_WRITE and pgconn.flush() == 0:
                return


class PipelinedCursor:
    """A cursor in pipeline mode, as a :class:`~pitstop.store.engine.backend.Tx` uses one:
    ``execute`` sends without waiting, a fetch waits for the results up to its own, and
    ``rowcount`` (known only once the result arrived) syncs first."""

    __slots__ = ("_conn", "_cur", "_pipeline", "_stall_timeout")

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        pipeline: psycopg.Pipeline,
        stall_timeout: float | None,
    ) -> None:
        self._conn = conn
        self._cur = conn.cursor()
        self._pipeline = pipeline
        self._stall_timeout = stall_timeout

    def sync(self) -> None:
        """Wait for the results of everything sent so far. Every byte goes out first:
        ``Pipeline.sync()`` alone may keep the tail of a large value in libpq's buffer and
        then wait for a server that waits for that tail (see :func:`flush_all`)."""
        flush_all(self._conn, self._stall_timeout)
        self._pipeline.sync()

    def execute(self, query: str, params: Any = (), *, binary: bool = False) -> PipelinedCursor:
        self._cur.execute(query, params, binary=binary)
        return self

    def executemany(self, query: str, rows: Any) -> None:
        self._cur.executemany(query, rows)

    def fetchone(self) -> Any:
        self.sync()
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        # Synced first: the results of an executemany still on their way otherwise
        # became this cursor's result (a read after inserting references, in a save on a
        # chunked value by a handle that had not seen its run's head: "the last operation
        # didn't produce records (command status: INSERT 0 0)").
        self.sync()
        return self._cur.fetchall()

    @property
    def rowcount(self) -> int:
        self.sync()
        return self._cur.rowcount


__all__ = ["ConnectionStalled", "GuardedConnection", "PipelinedCursor", "flush_all"]

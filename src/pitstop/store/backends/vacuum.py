"""Giving the space of deleted checkpoints back: what a prune leaves, and vacuuming it.

Deleting rows does not shrink a database by itself. A SQLite store made by pitstop uses
incremental auto-vacuum (``PRAGMA auto_vacuum=INCREMENTAL``, set when the file is created), so
every prune that deletes something gives the freed pages back at once (:func:`reclaim`: moving
the last pages into the holes and truncating the file, a fraction of a second for ~100 MiB)
and folds the write-ahead log back; a file made before that keeps freed pages on its
freelist for new checkpoints until ``VACUUM`` (``pitstop vacuum``), which also switches it
to incremental auto-vacuum. PostgreSQL's (auto)vacuum makes dead rows' space reusable
by new rows but returns to the operating system only empty pages at a table's end; ``VACUUM
FULL`` rewrites the tables and returns the rest, holding an exclusive lock on each table
while it does (every reader and writer of the store waits).

These are functions over a store rather than store methods: they run outside the store's
transactions, on a connection of their own, and only operators call them (``pitstop
vacuum``, the hint after ``pitstop prune``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...errors import StoreError
from ..contract.base import Store

if TYPE_CHECKING:
    import psycopg

Backend = Literal["sqlite", "postgresql", "other"]


@dataclass(frozen=True, slots=True)
class Space:
    """How much of a store's disk space is free for reuse inside it."""

    backend: Backend
    size: int | None
    """Bytes the store occupies (SQLite: the file and its WAL; PostgreSQL: pitstop's tables
    with their indexes and TOAST), when known."""
    free: int | None
    """Bytes inside ``size`` that hold no data and that a vacuum could return (SQLite: the
    freelist); None where the database cannot say cheaply (PostgreSQL)."""

    wal: int | None = None
    """SQLite: bytes of the write-ahead log beside the file (inside ``size``); folded into
    the file and truncated at the next checkpoint of the log."""

    @property
    def file(self) -> int | None:
        """Bytes of the store's file alone (SQLite: without the write-ahead log)."""
        if self.size is None:
            return None
        return self.size - (self.wal or 0)

    @property
    def advice(self) -> str:
        """What to run to get the space back, in one sentence."""
        if self.backend == "sqlite":
            return ("SQLite keeps freed pages inside the file for new checkpoints; "
                    "`pitstop vacuum` rewrites the file and gives them back")
        if self.backend == "postgresql":
            return ("PostgreSQL's VACUUM makes deleted rows' space reusable for new "
                    "checkpoints but does not shrink the tables' files; `pitstop vacuum "
                    "--full` (VACUUM FULL) returns it, locking each table while it runs")
        return "this store has no disk space to give back"


@dataclass(frozen=True, slots=True)
class VacuumReport:
    backend: Backend
    before: int | None
    after: int | None
    full: bool
    reindexed: tuple[str, ...] = ()
    """PostgreSQL, plain VACUUM: the indexes rebuilt (``REINDEX INDEX CONCURRENTLY``) because
    they had grown far above what their entries need (VACUUM FULL rebuilds them all)."""

    @property
    def returned(self) -> int | None:
        """Bytes given back to the file system (None when the sizes are not known)."""
        if self.before is None or self.after is None:
            return None
        return max(0, self.before - self.after)


def _backend(store: Store) -> Backend:
    name = type(store).__name__
    if name == "SQLiteStore" and getattr(store, "path", ":memory:") != ":memory:":
        return "sqlite"
    if name == "PostgresStore":
        return "postgresql"
    return "other"


def _sqlite_size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def _sqlite(path: str, timeout: float = 30.0) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(path, timeout=timeout, isolation_level=None))


def free_space(store: Store) -> Space:
    """The store's size and, where the database says, how much of it is free inside."""
    backend = _backend(store)
    if backend == "sqlite":
        path = str(getattr(store, "path"))  # noqa: B009 - SQLiteStore.path, checked above
        with _sqlite(path) as db:
            (pages,) = db.execute("PRAGMA freelist_count").fetchone()
            (page_size,) = db.execute("PRAGMA page_size").fetchone()
        wal = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
        return Space("sqlite", _sqlite_size(path), int(pages) * int(page_size), wal=wal)
    if backend == "postgresql":
        with _postgres(store) as conn:
            return Space("postgresql", _postgres_size(conn, store), None)
    return Space("other", None, None)


def free_bytes(store: Store) -> int | None:
    """Bytes free inside the store's file where the database says so cheaply (SQLite's
    freelist), else None: PostgreSQL cannot say without reading the tables, and asking
    would cost a connection of its own."""
    return free_space(store).free if _backend(store) == "sqlite" else None


def vacuum(store: Store, *, full: bool = False) -> VacuumReport:
    """Give the store's free space back to the file system.

    SQLite: ``VACUUM`` (rewrites the file; waits for other processes' writes and blocks them
    meanwhile; needs free disk space of about the file's size), then truncates the WAL.
    PostgreSQL: ``VACUUM (ANALYZE)`` of pitstop's tables, which returns only trailing empty
    pages, then rebuilds (``REINDEX INDEX CONCURRENTLY``, without blocking) the indexes that
    grew far above what their entries need; ``full=True`` runs ``VACUUM (FULL, ANALYZE)``,
    which returns everything and locks each table exclusively while it is rewritten.
    """
    backend = _backend(store)
    if backend == "sqlite":
        path = str(getattr(store, "path"))  # noqa: B009 - SQLiteStore.path, checked above
        before = _sqlite_size(path)
        try:
            with _sqlite(path) as db:
                # The rewrite also switches a file made before pitstop used incremental
                # auto-vacuum, so that later prunes give space back themselves.
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")
                db.execute("VACUUM")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:  # busy for the whole timeout, disk full, read-only file
            raise StoreError(f"{store.url}: VACUUM failed ({exc}); nothing was changed") \
                from None
        return VacuumReport("sqlite", before, _sqlite_size(path), full=True)
    if backend == "postgresql":
        from psycopg import sql

        with _postgres(store) as conn:
            before = _postgres_size(conn, store)
            options = sql.SQL("FULL, ANALYZE" if full else "ANALYZE")
            for table in _postgres_tables(conn, store):
                conn.execute(sql.SQL("VACUUM ({}) {}.{}").format(
                    options, sql.Identifier(str(getattr(store, "schema"))),  # noqa: B009
                    sql.Identifier(table)))
            # After the VACUUM: it counted each index's entries, which the estimate uses.
            rebuilt = () if full else tuple(getattr(store, "_rebuild_sparse_indexes")())  # noqa: B009
            return VacuumReport("postgresql", before, _postgres_size(conn, store), full,
                                rebuilt)
    return VacuumReport("other", None, None, full)


def reclaim(store: Store) -> None:
    """Give the pages a delete freed back to the file system, where that is cheap: SQLite
    files with incremental auto-vacuum (pitstop's since schema creation; a no-op on older
    files until a ``VACUUM``), then truncate the write-ahead log the moves went through.
    Best effort: another process holding the file for longer than a moment leaves it for the
    next prune (nothing is lost, the pages stay on the freelist for new checkpoints)."""
    if _backend(store) != "sqlite":
        return
    path = str(getattr(store, "path"))  # noqa: B009 - SQLiteStore.path, checked above
    try:
        with _sqlite(path, timeout=2.0) as db:
            # executescript steps each statement to its end: incremental_vacuum frees one
            # page per step, so execute() would free only one.
            db.executescript("PRAGMA incremental_vacuum; PRAGMA wal_checkpoint(TRUNCATE);")
    except sqlite3.Error:
        pass  # busy or read-only: the freed pages stay reusable inside the file


# -- PostgreSQL ---------------------------------------------------------------------------------


def _postgres(store: Store) -> psycopg.Connection[Any]:
    import psycopg

    # VACUUM cannot run inside a transaction: a connection of its own, in autocommit. The
    # store's connection string is what its pool uses (credentials included).
    conninfo: str = getattr(store, "_conninfo")  # noqa: B009 - PostgresStore's own
    return psycopg.connect(conninfo, autocommit=True)


def _postgres_tables(conn: psycopg.Connection[Any], store: Store) -> dict[str, int]:
    """pitstop's tables in the store's schema, with their sizes (indexes and TOAST too)."""
    rows = conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname LIKE 'pitstop%%' "
        "ORDER BY c.relname",
        (getattr(store, "schema"),),  # noqa: B009
    ).fetchall()
    return {name: int(size) for name, size in rows}


def _postgres_size(conn: psycopg.Connection[Any], store: Store) -> int:
    return sum(_postgres_tables(conn, store).values())


__all__ = ["Space", "VacuumReport", "free_bytes", "free_space", "reclaim", "vacuum"]

"""PostgreSQL: rebuilding the indexes that deletions leave sparse.

Why a store under retention needs it. Checkpoint ids are UUIDv7 (time-ordered, ``pitstop.ids``),
so ``pitstop_checkpoints_id`` only ever grows at its right edge: each new entry goes on the
newest leaf page. VACUUM removes the entries of deleted checkpoints but gives a B-tree page
back for reuse only once it is completely empty, and a page of old entries is rarely empty:
one checkpoint that outlives its neighbours (a stream partition's base, the checkpoints a run
keeps under ``keep_last``, a run that waits for days) keeps its page. So the index holds pages
for the whole time span its live entries cover, and a new high comes whenever that span
widens or the write rate rises. Measured in ``bench/soak.py`` (docs/benchmarks.md): 917 live
entries on 120 leaf pages at 9.8% average density (pgstattuple), where a fresh build needs 7;
the same table's primary key, keyed by run first, kept 48% density. A run id made by pitstop
is a UUIDv7 too, so the indexes on ``run_id`` and ``created_at`` do the same when runs live
long at different rates.

What pitstop does. After a prune or a save that pruned (``_give_space_back``), at most once a
minute per process (:data:`CHECK_EVERY`) and in a background thread, a store looks at its
indexes: pages now against what a fresh build of the index's entries takes (its entries:
``reltuples`` from the last VACUUM or ANALYZE, scaled by how its table grew since; an entry's
size: the key columns of a sample of rows). An index of :data:`REBUILD_FROM_PAGES` pages or
more and :data:`REBUILD_ABOVE` times what it needs is rebuilt with ``REINDEX INDEX
CONCURRENTLY`` (PostgreSQL 12 or later): a new copy is built beside it and swapped in, while
reads and writes go on. On a connection of its own in autocommit (it cannot run inside a
transaction), under a session advisory lock per schema, so that of several workers one
rebuilds and the others skip; the index it leaves is small, so the next look finds nothing
to do. The same runs after ``pitstop vacuum``.

Not rebuilt: a unique index that an ``INSERT ... ON CONFLICT`` may name (the values', value
references', effects', runs' and cache's keys; only the checkpoints' two are rebuilt). While
a concurrent rebuild runs, such an insert checks only the old index for a conflict and can
still fail on the new copy when another session inserts the same key at the same moment;
pitstop's own statements count on ``ON CONFLICT`` there. Most are keyed by content hashes,
which spread entries over the whole index (pages fill again); ``pitstop vacuum --full``
rebuilds them all. Their tables' other indexes are rebuilt like any.

A rebuild cut short (the server restarted, the connection dropped during it) leaves an
invalid copy named ``..._ccnew``: the next look, holding the lock, drops it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pitstop.process import current_pid

log = logging.getLogger("pitstop.store")

CHECK_EVERY = 60.0
"""Seconds between two looks at the indexes, per store handle (the first a full interval
after the store opened: a short-lived process never looks)."""
REBUILD_ABOVE = 4.0
"""An index is rebuilt when its pages exceed this many times what a fresh build needs (a
B-tree under random inserts and deletions settles at 1.3-2 times)."""
REBUILD_FROM_PAGES = 32
"""...and it has at least this many pages (256 KiB of 8 KiB pages): below, a rebuild gains
too little to be worth a look."""
UNIQUE_REBUILT = frozenset({"pitstop_checkpoints_id", "pitstop_checkpoints_pkey"})
"""The unique indexes rebuilt concurrently: no statement inserts into their table with
``ON CONFLICT``. Every other unique index may be named by one (the values', value
references', effects', runs', inputs' and cache's keys, a sink's marks) and is left alone
(see the module's docstring)."""

_LEAF_FILL = 0.90  # a B-tree build fills leaf pages to 90% (the default fillfactor)
_PAGE_OVERHEAD = 24 + 16  # page header and B-tree special space
_TUPLE_HEADER = 8  # an index entry's header (heap pointer, flags), before its key
_LINE_POINTER = 4
_SAMPLE_ROWS = 100


@dataclass(frozen=True, slots=True)
class IndexSize:
    """One index's pages against what a fresh build of its entries would take."""

    name: str
    table: str
    pages: int
    needed: int
    rebuildable: bool

    @property
    def sparse(self) -> bool:
        return self.rebuildable and self.pages >= REBUILD_FROM_PAGES \
            and self.pages > REBUILD_ABOVE * self.needed


_INDEXES = (
    "SELECT i.relname, t.relname, pg_relation_size(i.oid) / b.size, i.reltuples, "
    "t.relpages, pg_relation_size(t.oid) / b.size, b.size, "
    "ix.indisunique, pg_has_role(i.relowner, 'USAGE'), "
    "ARRAY(SELECT a.attname FROM unnest(ix.indkey::int2[]) k(attnum) "
    "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum) "
    "FROM pg_index ix JOIN pg_class i ON i.oid = ix.indexrelid "
    "JOIN pg_class t ON t.oid = ix.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
    "JOIN pg_am am ON am.oid = i.relam, "
    "(SELECT current_setting('block_size')::bigint AS size) b "
    "WHERE n.nspname = %s AND am.amname = 'btree' AND ix.indisvalid AND ix.indisready "
    "AND starts_with(t.relname, 'pitstop_') ORDER BY i.relname"
)


def index_sizes(conn: psycopg.Connection[Any], schema: str) -> list[IndexSize]:
    """Every valid B-tree index of pitstop's tables in ``schema``, with the pages a fresh
    build would need. An index whose table was never vacuumed nor analysed has no entry count
    (``reltuples`` -1) and is reported as needing what it has."""
    found: list[IndexSize] = []
    for name, table, pages, reltuples, relpages, table_pages, block, unique, owned, columns \
            in conn.execute(_INDEXES, (schema,)).fetchall():
        # REINDEX needs the owner's rights: a role that did not create the tables skips.
        rebuildable = owned and (not unique or name in UNIQUE_REBUILT)
        if reltuples < 0 or not rebuildable or pages < REBUILD_FROM_PAGES:
            found.append(IndexSize(name, table, pages, pages, rebuildable))
            continue
        # Entries grow with the table between two VACUUMs: scale as the planner does. A table
        # that shrank since keeps the count (erring towards no rebuild).
        entries = reltuples * max(1.0, table_pages / relpages) if relpages > 0 else reltuples
        width = _key_width(conn, schema, table, columns) if columns else 16.0
        entry = math.ceil((_TUPLE_HEADER + width) / 8) * 8 + _LINE_POINTER  # MAXALIGNed
        leaves = math.ceil(entries * entry / ((block - _PAGE_OVERHEAD) * _LEAF_FILL))
        needed = 1 + max(1, leaves) + math.ceil(leaves / 200)  # meta, leaves, inner pages
        found.append(IndexSize(name, table, pages, needed, rebuildable))
    return found


def _key_width(conn: psycopg.Connection[Any], schema: str, table: str,
               columns: list[str]) -> float:
    """Bytes of an index entry's key columns, averaged over the table's first rows (as
    stored: a short text's 1-byte header included). Statistics would need an ANALYZE that a
    server with autovacuum off never runs; a hundred rows cost a few pages."""
    width = sql.SQL(" + ").join(
        sql.SQL("COALESCE(pg_column_size({}), 0)").format(sql.Identifier(c)) for c in columns)
    row = conn.execute(sql.SQL("SELECT avg({}) FROM (SELECT {} FROM {} LIMIT {}) s").format(
        width, sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        sql.Identifier(schema, table), sql.Literal(_SAMPLE_ROWS))).fetchone()
    return float(row[0]) if row and row[0] is not None else 16.0


def rebuild_sparse_indexes(conn: psycopg.Connection[Any], schema: str, lock_key: int) -> list[str]:
    """Rebuild (``REINDEX INDEX CONCURRENTLY``) each index of ``schema`` that
    :attr:`IndexSize.sparse` finds far above what its entries need; the names rebuilt.

    ``conn`` is in autocommit mode. Nothing is done (and [] returned) on a server older than
    PostgreSQL 12 or while another session holds ``lock_key`` (a session advisory lock: it
    is rebuilding them). A rebuild that fails is logged and left for the next look."""
    if conn.info.server_version < 120000:
        return []
    locked = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,)).fetchone()
    if not locked or not locked[0]:
        return []
    rebuilt: list[str] = []
    try:
        _drop_leftovers(conn, schema)
        # A rebuild takes as long as the index's entries need; waiting on a lock (each
        # REINDEX CONCURRENTLY waits for the transactions older than itself) is bounded.
        conn.execute("SET statement_timeout = 0")
        conn.execute("SET lock_timeout = '60s'")
        for index in index_sizes(conn, schema):
            if not index.sparse:
                continue
            try:
                conn.execute(sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(
                    sql.Identifier(schema, index.name)))
            except psycopg.Error as exc:
                log.info("pitstop: REINDEX of %s.%s failed (%s); left for the next look",
                         schema, index.name, " ".join(str(exc).split()))
                continue
            log.info("pitstop: rebuilt index %s.%s (%d pages, its entries need about %d)",
                     schema, index.name, index.pages, index.needed)
            rebuilt.append(index.name)
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key,))
    return rebuilt


def _drop_leftovers(conn: psycopg.Connection[Any], schema: str) -> None:
    """Drop the invalid copies a rebuild cut short left behind (``..._ccnew``, or the old
    index ``..._ccold`` when it stopped after the swap). Called under the advisory lock, so
    no pitstop rebuild is running; one started by hand holds its table's lock, and the drop
    gives up after a second rather than wait for it."""
    names = conn.execute(
        "SELECT c.relname FROM pg_index ix JOIN pg_class c ON c.oid = ix.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND NOT ix.indisvalid AND c.relname ~ '^pitstop_.*_cc(new|old)[0-9]*$'",
        (schema,)).fetchall()
    if not names:
        return
    conn.execute("SET lock_timeout = '1s'")
    for (name,) in names:
        try:
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
                sql.Identifier(schema, name)))
        except psycopg.Error as exc:
            log.info("pitstop: could not drop the leftover index %s.%s (%s)",
                     schema, name, " ".join(str(exc).split()))


class IndexUpkeep:
    """When a store handle looks at its indexes: after deletions, at most once per
    :data:`CHECK_EVERY` seconds, in a daemon thread, one look at a time. ``look`` does the
    work (it opens its own connection); its exceptions are logged, never raised into the
    prune that triggered it."""

    def __init__(self, look: Callable[[], object]) -> None:
        self._look = look
        self._lock = threading.Lock()
        self._due = time.monotonic() + CHECK_EVERY
        self._thread: threading.Thread | None = None
        self._pid = current_pid()
        self.closed = False

    def poke(self) -> None:
        """Deletions happened: look at the indexes if it is time."""
        now = time.monotonic()
        if self.closed or now < self._due:
            return
        with self._lock:
            if self._pid != current_pid():  # a forked child: the parent's thread is not ours
                self._pid, self._thread = current_pid(), None
            if now < self._due or (self._thread is not None and self._thread.is_alive()):
                return
            self._due = now + CHECK_EVERY
            self._thread = threading.Thread(target=self._run, name="pitstop-index-upkeep",
                                            daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the look under way (if any) is done."""
        thread = self._thread
        if thread is not None and self._pid == current_pid():
            thread.join(timeout)

    def _run(self) -> None:
        try:
            self._look()
        except Exception as exc:  # a background look must not kill anything
            log.info("pitstop: looking at the store's indexes failed (%s)",
                     " ".join(str(exc).split()))


__all__ = ["IndexSize", "IndexUpkeep", "index_sizes", "rebuild_sparse_indexes"]

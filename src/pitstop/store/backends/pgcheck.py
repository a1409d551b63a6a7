"""``verify`` on PostgreSQL: the server's own check of pitstop's indexes (``amcheck``).

A damaged B-tree index hides rows from every query that uses it: a run's head is "not
found", a run is missing from a listing, while each table row is intact and every checksum
pitstop checks holds. SQLite's ``PRAGMA integrity_check`` finds that in a SQLite file; on
PostgreSQL the ``amcheck`` contrib extension does: ``bt_index_check(index, true)`` checks
each index's structure and that every table row has its index entry, under a lock that
lets reads and writes go on.

``amcheck`` ships with PostgreSQL but must be installed in the database
(``CREATE EXTENSION``, which needs a superuser or a role trusted with it), and its
functions are executable only by roles granted them. Where either is missing the check is
skipped and ``verify`` says so (a note, not a problem): it cannot tell an intact index from
a damaged one without it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

#: SQLSTATE class XX: the server found its own data damaged (XX001 data, XX002 index).
_DAMAGE = "XX"


def index_problems(conn: psycopg.Connection[Any], schema: str, notes: list[str]) -> list[str]:
    """One line per pitstop index of ``schema`` that ``bt_index_check`` finds damaged;
    ``notes`` gets a line when the check could not run. ``conn`` is in autocommit mode (a
    failed check must not abort the others)."""
    home = _amcheck_schema(conn, notes)
    if home is None:
        return []
    indexes = conn.execute(
        "SELECT c.relname, c.oid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_am a ON a.oid = c.relam "
        "WHERE n.nspname = %s AND a.amname = 'btree' AND i.indisvalid AND i.indisready "
        "AND starts_with(c.relname, 'pitstop_') ORDER BY c.relname",
        (schema,),
    ).fetchall()
    check = sql.SQL("SELECT {}.bt_index_check(%s::oid::regclass, true)").format(
        sql.Identifier(home)
    )
    problems: list[str] = []
    for name, oid in indexes:
        try:
            conn.execute(check, (oid,))
        except psycopg.errors.InsufficientPrivilege as exc:
            notes.append(f"index check skipped: this role may not run amcheck ({_line(exc)}); "
                         "GRANT EXECUTE ON FUNCTION bt_index_check(regclass, boolean) to it")
            return problems
        except psycopg.Error as exc:
            if conn.execute("SELECT 1 FROM pg_class WHERE oid = %s", (oid,)).fetchone() is None:
                continue  # dropped meanwhile: the old copy of an index rebuilt (pgindexes)
            if (exc.sqlstate or "").startswith(_DAMAGE):
                problems.append(f"index {name}: {_line(exc)} (REINDEX INDEX {name} rebuilds it)")
            else:
                problems.append(f"index {name}: could not be checked: {_line(exc)}")
    return problems


def _amcheck_schema(conn: psycopg.Connection[Any], notes: list[str]) -> str | None:
    """The schema ``amcheck`` is installed in, installing it if this role may."""
    found = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'amcheck'"
    ).fetchone()
    if found is not None:
        (schema,) = found
        return str(schema)
    try:
        # In `public`, not the store's schema: the extension serves every store of the
        # database, and dropping one store's schema must not take it along.
        conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck SCHEMA public")
    except psycopg.Error as exc:
        notes.append(f"index check skipped: the amcheck extension is not installed and this "
                     f"role cannot install it ({_line(exc)}); a superuser can: CREATE "
                     "EXTENSION amcheck")
        return None
    return "public"


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())

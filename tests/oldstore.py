"""Stores as an earlier pitstop left them, for the tests of the migrations that upgrade them.

Today's pitstop writes only today's rows, so an old store is made in two parts:
:func:`store_at` creates the store at an older schema version (the migrations up to it, as a
release that knew no later one ran them), and :func:`write_old` writes rows into it with plain
SQL, copied from a scratch store of the same backend that today's pitstop saved into. A column
the old schema lacks must be empty in every copied row (data that needs it could not have been
written then), except a value's owner (schema 10), which before it was a ``pitstop_blob_refs``
row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import pytest

import pitstop
from conftest import drop_pg_schema, pg_schema_url
from pitstop.store.engine import schema as store_schema

T = TypeVar("T")


@contextmanager
def store_at(url: str, version: int) -> Iterator[Any]:
    """A handle on the store at ``url``, created (if new) at schema ``version``. Read it with
    plain SQL (``store._tx``) only: today's queries name today's columns."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_schema, "LATEST_SCHEMA", version)  # the release that made it
        with pitstop.open_store(url) as store:
            assert store.schema_version() == version  # type: ignore[attr-defined]
            yield store


def write_old(url: str, version: int, write: Callable[[pitstop.Store], T]) -> T:
    """Create the store at ``url`` at schema ``version`` holding what ``write`` saves (with
    today's pitstop, into a scratch store); return what ``write`` returns."""
    with _scratch(url) as scratch_url, pitstop.open_store(scratch_url, blobs=False) as new:
        result = write(new)
        tables = {table: _columns(new, table) for table in _tables(new)}
        rows = {table: new._tx(lambda tx, t=table, c=columns: tx.all(  # type: ignore[attr-defined]
            f"SELECT {', '.join(c)} FROM {t}"
        )) for table, columns in tables.items()}
    with store_at(url, version) as old:
        old_tables = set(_tables(old))
        for table, columns in tables.items():
            if table not in old_tables:
                assert not rows[table], f"{table} does not exist at schema {version}"
                continue
            kept = _columns(old, table)
            for n, column in enumerate(columns):
                if column in kept or (table, column) == ("pitstop_blobs", "run_id"):
                    continue
                assert all(row[n] is None for row in rows[table]), (
                    f"{table}.{column} is set, and schema {version} has no such column"
                )
            picked = [columns.index(c) for c in kept]
            old._tx(lambda tx, t=table, k=kept, p=picked: tx.many(
                f"INSERT INTO {t} ({', '.join(k)}) VALUES ({', '.join('?' * len(k))})",
                [[row[i] for i in p] for row in rows[t]],
            ), write=True)
        if "run_id" not in _columns(old, "pitstop_blobs"):  # before schema 10
            owner = tables["pitstop_blobs"].index("run_id"), tables["pitstop_blobs"].index("hash")
            refs = [(row[owner[0]], row[owner[1]]) for row in rows["pitstop_blobs"]
                    if row[owner[0]] is not None]
            old._tx(lambda tx: tx.many(
                "INSERT INTO pitstop_blob_refs (run_id, hash) VALUES (?, ?) "
                "ON CONFLICT DO NOTHING", refs,
            ), write=True)
    return result


@contextmanager
def _scratch(url: str) -> Iterator[str]:
    """A fresh store URL of the same backend as ``url`` (dropped afterwards)."""
    if url.startswith("sqlite:"):
        path = url.partition("?")[0]
        yield f"{path}-scratch-{uuid.uuid4().hex[:8]}.db"  # beside it, in tmp
        return
    assert "schema" in parse_qs(urlsplit(url).query), url
    name = f"w_{uuid.uuid4().hex[:12]}"
    try:
        yield pg_schema_url(name)
    finally:
        drop_pg_schema(name)


def _tables(store: Any) -> list[str]:
    sql = (
        "SELECT name FROM sqlite_master WHERE type = 'table'"
        if store.dialect.name == "sqlite" else
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    )
    names = store._tx(lambda tx: tx.column(sql))
    return sorted(n for n in names if n.startswith("pitstop_") and n != "pitstop_schema")


def _columns(store: Any, table: str) -> list[str]:
    if store.dialect.name == "sqlite":
        return [row[1] for row in store._tx(lambda tx: tx.all(f"PRAGMA table_info({table})"))]
    return list(store._tx(lambda tx: tx.column(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = ? ORDER BY ordinal_position", (table,),
    )))

"""Migration 5: PostgreSQL stores value bytes out of line and uncompressed (STORAGE
EXTERNAL). pitstop compresses what pays itself (zstd); pglz tried again over every chunk cost
the write and, for a restored conversation, 2-3x the read. The statement is marked for
PostgreSQL only: SQLite records the migration and runs nothing.

Migration 7: rows of up to a page stay inline (``toast_tuple_target = 8160``), so a sealed
chunk of a few KiB is one row, not a TOAST pointer to two pieces of its own."""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import drop_pg_schema, pg_schema_url
from pitstop.store import schema as store_schema
from pitstop.store.sqlite import SQLITE

STATEMENT = store_schema.MIGRATIONS[4][2][0]


def test_a_statement_for_one_dialect_runs_on_it_alone() -> None:
    postgres = pytest.importorskip("pitstop.store.postgres")
    assert store_schema.MIGRATIONS[4][0] == 5
    assert SQLITE.ddl(STATEMENT) == ""
    assert postgres.POSTGRES.ddl(STATEMENT) == (
        "ALTER TABLE pitstop_blobs ALTER COLUMN data SET STORAGE EXTERNAL"
    )
    assert SQLITE.ddl("CREATE TABLE t (x {blob})") == "CREATE TABLE t (x BLOB)"


def test_sqlite_records_the_migration(tmp_path: Path) -> None:
    with pitstop.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        assert store.schema_version() == store_schema.LATEST_SCHEMA >= 5
        store.save("r", {"doc": "x" * 50_000})
        assert store.latest("r").state == {"doc": "x" * 50_000}  # type: ignore[union-attr]


@pytest.fixture
def pg_schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_pg_schema(name)


@pytest.mark.postgres
def test_postgres_keeps_value_bytes_uncompressed(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_schema_url(pg_schema)
    with monkeypatch.context() as patch:
        patch.setattr(store_schema, "LATEST_SCHEMA", 4)  # a release from before migration 5
        with pitstop.open_store(url) as old:
            old.save("r", {"doc": "y" * 100_000})
    with pitstop.open_store(url) as store:  # upgraded on open
        assert store.schema_version() == store_schema.LATEST_SCHEMA >= 5

        def storage(tx: object) -> str:
            return str(tx.scalar(  # type: ignore[attr-defined]
                "SELECT attstorage FROM pg_attribute WHERE attrelid = "
                "'pitstop_blobs'::regclass AND attname = 'data'"
            ))

        assert store._tx(storage) == "e"  # type: ignore[attr-defined]
        assert store.latest("r").state == {"doc": "y" * 100_000}  # type: ignore[union-attr]
        store.save("r", {"doc": "z" * 100_000})
        assert store.latest("r").state == {"doc": "z" * 100_000}  # type: ignore[union-attr]


def _toast_rows(tx: Any) -> int:
    toast = tx.scalar(
        "SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'pitstop_blobs'::regclass"
    )
    return int(tx.scalar(f"SELECT count(*) FROM {toast}"))


@pytest.mark.postgres
def test_postgres_keeps_rows_of_a_few_kib_inline(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 6 KiB value of random text (~4.7 KiB compressed) went to TOAST before migration 7;
    after it, a new one is a row of its own, and the old one still reads."""
    rng = random.Random(7)
    old_doc, new_doc = ("".join(rng.choices(string.ascii_letters, k=6000)) for _ in range(2))
    url = pg_schema_url(pg_schema)
    with monkeypatch.context() as patch:
        patch.setattr(store_schema, "LATEST_SCHEMA", 6)  # a release from before migration 7
        with pitstop.open_store(url) as old:
            old.save("r", {"doc": old_doc})
            toasted = old._tx(_toast_rows)  # type: ignore[attr-defined]
            assert toasted > 0
    with pitstop.open_store(url) as store:  # upgraded on open
        assert store.schema_version() == store_schema.LATEST_SCHEMA >= 7
        options = store._tx(  # type: ignore[attr-defined]
            lambda tx: tx.scalar("SELECT reloptions FROM pg_class WHERE oid = "
                                 "'pitstop_blobs'::regclass")
        )
        assert "toast_tuple_target=8160" in options
        store.save("r", {"doc": new_doc})
        assert store._tx(_toast_rows) == toasted  # type: ignore[attr-defined]
        assert store.latest("r").state == {"doc": new_doc}  # type: ignore[union-attr]
        first = store.history("r", limit=None)[-1]
        assert store.get(first.id).state == {"doc": old_doc}
        assert store.verify() == []

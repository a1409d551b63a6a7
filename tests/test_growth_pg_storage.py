"""Migration 5: PostgreSQL stores value bytes out of line and uncompressed (STORAGE
EXTERNAL). pitstop compresses what pays itself (zstd); pglz tried again over every chunk cost
the write and, for a restored conversation, 2-3x the read. The statement is marked for
PostgreSQL only: SQLite records the migration and runs nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

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

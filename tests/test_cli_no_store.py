"""A read command pointed at something that is not a pitstop store says so, naming the file
or schema, instead of advising ``pitstop migrate`` (which would create pitstop tables in the
wrong place); ``migrate`` is offered only for a pitstop store of an older version."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from clitools import one_error_line, pitstop_exe
from conftest import PG_URL, POSTGRES_SKIP, drop_pg_schema, pg_schema_url


def _schema_exists(schema: str) -> bool:
    import psycopg

    with psycopg.connect(PG_URL) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        return found.fetchone() is not None


@pytest.mark.slow
def test_a_sqlite_file_of_another_application(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE invoices (id INTEGER)")
        db.execute("CREATE TABLE users (id INTEGER)")
    for command in (["runs"], ["show", "x"], ["stats"], ["verify"]):
        line = one_error_line(pitstop_exe(*command, "--store", f"sqlite:///{path}"))
        assert f"no pitstop store in '{path}' (a SQLite database of something else, with " \
               "tables invoices, users)" in line
        assert "migrate --store" not in line
    with sqlite3.connect(path) as db:  # nothing was added to it
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    assert names == {"invoices", "users"}


def test_an_empty_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    line = one_error_line(pitstop_exe("runs", "--store", f"sqlite:///{path}"))
    assert "(an empty SQLite database)" in line
    with sqlite3.connect(path) as db:  # no pitstop tables were created in it
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


@pytest.mark.skipif(POSTGRES_SKIP is not None, reason=str(POSTGRES_SKIP))
@pytest.mark.slow
def test_a_postgresql_schema_that_holds_no_store() -> None:
    schema = f"typo_{uuid.uuid4().hex[:8]}"
    try:
        for command in (["runs"], ["show", "r"], ["stats"], ["verify"], ["cancel", "r"]):
            line = one_error_line(pitstop_exe(*command, "--store", pg_schema_url(schema)))
            assert f"no pitstop store in schema '{schema}' of postgresql://" in line
            assert "migrate --store" not in line
        assert not _schema_exists(schema)  # not even an empty schema was made
        # migrate, which exists to create one, still does
        assert pitstop_exe("migrate", "--store", pg_schema_url(schema)).code == 0
        assert pitstop_exe("runs", "--store", pg_schema_url(schema)).code == 0
    finally:
        drop_pg_schema(schema)


READ_COMMANDS = [
    ["runs"], ["runs", "--status", "queued"], ["show", "r"], ["history", "r"], ["stats"],
    ["verify"], ["diff", "r@a", "r@b"], ["export", "r", "-o", "out.pitstop"],
    ["send", "r", "go", "1"], ["cancel", "r"], ["prune", "--keep-last", "1"], ["vacuum"],
]


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
@pytest.mark.slow
def test_no_command_but_the_creating_ones_makes_a_store_file(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "nothing-here.db"
    line = one_error_line(pitstop_exe(*command, "--store", f"sqlite:///{path}", cwd=tmp_path))
    assert f"no store at '{path}'" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no .db, -wal, -shm, archive
    # nor through $PITSTOP_STORE, nor the default store in the current directory
    one_error_line(pitstop_exe(*command, store=str(path), cwd=tmp_path))
    line = one_error_line(pitstop_exe(*command, cwd=tmp_path))
    assert "no store at 'pitstop.db' (from the default store)" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_empty_file_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    for command in READ_COMMANDS:
        one_error_line(pitstop_exe(*command, "--store", str(path), cwd=tmp_path))
    assert path.stat().st_size == 0  # not made a SQLite database (WAL mode writes a header)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_a_missing_directory_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "runs.db"
    line = one_error_line(pitstop_exe("runs", "--store", f"sqlite:///{path}", cwd=tmp_path))
    assert str(path) in line
    assert not (tmp_path / "no").exists()

"""Space is given back: a prune on SQLite says the file keeps its size and what returns it,
``pitstop vacuum`` (or ``prune --vacuum``) shrinks the file, ``stats`` points at it; on
PostgreSQL the output says what VACUUM does and does not return."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import uuid
from pathlib import Path

import pytest

import pitstop
from clitools import pitstop_exe
from conftest import POSTGRES_SKIP, drop_pg_schema, pg_schema_url
from pitstop.display.text import human_bytes


def fill(url: str, runs: int = 3) -> None:
    """Finished runs holding 2 MiB of incompressible bytes each, in the database itself (not
    in a SQLite store's default blob directory: the space in question is the file's)."""
    options = {"blobs": False} if url.startswith("sqlite:") else {}
    with pitstop.open_store(url, **options) as store:
        for i in range(runs):
            store.save(f"big-{i}", {"blob": os.urandom(2 << 20)},
                       status=pitstop.RunStatus.COMPLETED)


def _legacy_file(path: Path) -> None:
    """A SQLite file as pitstop made them before incremental auto-vacuum: WAL, no
    auto-vacuum (the mode is fixed once the file's first page is written)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA auto_vacuum=NONE")
        db.execute("PRAGMA journal_mode=WAL")


def _file_named(out: str) -> str:
    found = re.search(r"the SQLite file is ([\d.]+ \w+)", out)
    assert found, out
    return found.group(1)


@pytest.mark.slow
def test_a_sqlite_prune_gives_the_space_back_itself(tmp_path: Path) -> None:
    """A file pitstop creates uses incremental auto-vacuum: the prune shrinks it with no
    `vacuum`, and says the size the file has (not the file plus its WAL, #30)."""
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    fill(url)
    before = path.stat().st_size
    pruned = pitstop_exe("prune", "--finished-older-than", "0s", store=url)
    assert pruned.code == 0, pruned
    assert "the freed space went back to the file system" in pruned.out, pruned.out
    assert path.stat().st_size < before / 4
    assert _file_named(pruned.out) == human_bytes(path.stat().st_size)
    assert pitstop_exe("stats", "--json", store=url).json["free_bytes"] == 0


@pytest.mark.slow
def test_an_older_sqlite_file_is_told_to_vacuum_and_then_shrinks_by_itself(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    _legacy_file(path)
    fill(url)
    before = path.stat().st_size
    pruned = pitstop_exe("prune", "--finished-older-than", "0s", store=url)
    assert pruned.code == 0, pruned
    assert "of it free for new checkpoints" in pruned.out and "`pitstop vacuum`" in pruned.out
    # the size named is the file's own, whatever the write-ahead log beside it holds
    assert _file_named(pruned.out) == human_bytes(path.stat().st_size), pruned.out
    stats = pitstop_exe("stats", store=url)
    assert "free (deleted checkpoints); `pitstop vacuum` gives it back" in stats.out
    assert pitstop_exe("stats", "--json", store=url).json["free_bytes"] > 5 << 20
    vacuumed = pitstop_exe("vacuum", "--json", store=url)
    assert vacuumed.code == 0, vacuumed
    assert vacuumed.json["returned"] > 5 << 20
    assert path.stat().st_size < before / 4
    assert "gives it back" not in pitstop_exe("stats", store=url).out
    # the vacuum switched the file to incremental auto-vacuum: the next prune shrinks it
    fill(url)
    grown = path.stat().st_size
    assert pitstop_exe("prune", "--finished-older-than", "0s", store=url).code == 0
    assert path.stat().st_size < grown / 4


@pytest.mark.slow
def test_prune_vacuum_does_both(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    fill(url, runs=2)
    done = pitstop_exe("prune", "--finished-older-than", "0s", "--vacuum", store=url)
    assert done.code == 0, done
    assert "vacuumed: " in done.out and "given back" in done.out
    assert path.stat().st_size < 1 << 20


@pytest.mark.skipif(POSTGRES_SKIP is not None, reason=str(POSTGRES_SKIP))
@pytest.mark.slow
def test_postgresql_vacuum_says_what_it_returns() -> None:
    schema = f"t_vac_{uuid.uuid4().hex[:8]}"
    url = pg_schema_url(schema)
    try:
        fill(url, runs=2)
        pruned = pitstop_exe("prune", "--finished-older-than", "0s", store=url)
        assert "does not shrink the tables' files; `pitstop vacuum --full`" in pruned.out
        plain = pitstop_exe("vacuum", store=url)
        assert plain.code == 0, plain
        assert "plain VACUUM keeps the tables' files at their size" in plain.out
        full = pitstop_exe("vacuum", "--full", "--json", store=url)
        assert full.code == 0, full
        assert full.json["full"] is True and full.json["after"] <= full.json["before"]
        assert full.json["reindexed"] == []  # VACUUM FULL rebuilt every index already
    finally:
        drop_pg_schema(schema)

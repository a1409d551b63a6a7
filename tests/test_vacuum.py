"""Space is given back: a prune on SQLite says the file keeps its size and what returns it,
``pitstop vacuum`` (or ``prune --vacuum``) shrinks the file, ``stats`` points at it; on
PostgreSQL the output says what VACUUM does and does not return."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

import pitstop
from clitools import pitstop_exe
from conftest import POSTGRES_SKIP, drop_pg_schema, pg_schema_url


def fill(url: str, runs: int = 3) -> None:
    """Finished runs holding 2 MiB of incompressible bytes each, in the database itself (not
    in a SQLite store's default blob directory: the space in question is the file's)."""
    options = {"blobs": False} if url.startswith("sqlite:") else {}
    with pitstop.open_store(url, **options) as store:
        for i in range(runs):
            store.save(f"big-{i}", {"blob": os.urandom(2 << 20)},
                       status=pitstop.RunStatus.COMPLETED)


def test_sqlite_prune_says_how_to_get_the_space_back_and_vacuum_does(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    fill(url)
    before = path.stat().st_size
    pruned = pitstop_exe("prune", "--finished-older-than", "0s", store=url)
    assert pruned.code == 0, pruned
    assert "the SQLite file is still" in pruned.out and "of it free for new checkpoints" in \
        pruned.out and "`pitstop vacuum`" in pruned.out
    stats = pitstop_exe("stats", store=url)
    assert "free (deleted checkpoints); `pitstop vacuum` gives it back" in stats.out
    assert pitstop_exe("stats", "--json", store=url).json["free_bytes"] > 5 << 20
    vacuumed = pitstop_exe("vacuum", "--json", store=url)
    assert vacuumed.code == 0, vacuumed
    assert vacuumed.json["returned"] > 5 << 20
    assert path.stat().st_size < before / 4
    assert "gives it back" not in pitstop_exe("stats", store=url).out


def test_prune_vacuum_does_both(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    fill(url, runs=2)
    done = pitstop_exe("prune", "--finished-older-than", "0s", "--vacuum", store=url)
    assert done.code == 0, done
    assert "vacuumed: " in done.out and "given back" in done.out
    assert path.stat().st_size < 1 << 20


@pytest.mark.skipif(POSTGRES_SKIP is not None, reason=str(POSTGRES_SKIP))
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
    finally:
        drop_pg_schema(schema)
